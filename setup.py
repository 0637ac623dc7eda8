"""Native extensions; everything else about the distribution is in pyproject.toml.

Each extension is optional: when it does not build (no compiler, no Python headers), ``pip install`` still
succeeds and the code falls back to its pure-Python path (each module says which). Add an extension by
appending to ``NATIVE``; a C file added to hostlib/native/ is built into the native cores as it is.
"""
import atexit
import importlib.util
import shutil
import tempfile
from glob import glob

from setuptools import Extension, setup

NATIVE_DIR = "hostlib/native"
_spec = importlib.util.spec_from_file_location("buildinfo", "hostlib/buildinfo.py")
buildinfo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(buildinfo)
NATIVE = [
    # controller/reports.py: the report socket drained with recvmmsg, REPORTs decoded (hostlib/native/wire.c, the
    # cores' codec) and HMAC-checked in C.
    Extension("netapprox.controller._reportrx", ["controller/_reportrx.c", f"{NATIVE_DIR}/wire.c"],
              include_dirs=[NATIVE_DIR], depends=[f"{NATIVE_DIR}/wire.h"], optional=True,
              extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]),
    # controller/core.py: the epoch's decision loop (ControllerCore._decide_all) in C. -ffp-contract=off: its
    # floating point is the Python loop's (tests/controller/test_ctl_decide_native.py).
    Extension("netapprox.controller._decide", ["controller/_decide.c"], optional=True,
              extra_compile_args=["-O2", "-ffp-contract=off", "-fno-fast-math", "-Wall", "-Wextra",
                                  "-Wno-unused-parameter"]),
    # controller/core.py: the report loop (ControllerCore.ingest_batch) in C for known groups
    # (tests/controller/test_ctl_ingest_native.py); -ffp-contract=off as for the decision loop.
    Extension("netapprox.controller._ingest", ["controller/_ingest.c"], optional=True,
              extra_compile_args=["-O2", "-ffp-contract=off", "-fno-fast-math", "-Wall", "-Wextra",
                                  "-Wno-unused-parameter"]),
    # controller/p4runtime/write_queue.py: the write queue's loops over queue_by_job entries in C
    # (tests/controller/test_ctl_writes_native.py).
    Extension("netapprox.controller.p4runtime._jobwrites", ["controller/p4runtime/_jobwrites.c"], optional=True,
              extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]),
    # hostlib/core.py: the native ATP cores (hostlib/native/, one file per concern as in hostlib/; module.c lists
    # them). -ffp-contract=off keeps their floating point identical to the reference's
    # (tests/hostlib/test_hostlib_differential.py). source_hash: what it was built from (hostlib/buildinfo.py).
    Extension("netapprox.hostlib._native", sorted(glob(f"{NATIVE_DIR}/*.c")),
              depends=sorted(glob(f"{NATIVE_DIR}/*.h")), optional=True,
              define_macros=[("NETAPPROX_SOURCE_HASH", f'"{buildinfo.source_hash(NATIVE_DIR)}"')],
              extra_compile_args=["-O2", "-std=gnu11", "-ffp-contract=off", "-fno-fast-math", "-Wall",
                                  "-Wno-unused-parameter"]),
]

# Built outside the source tree: a wheel built from a checkout (`pip wheel .`, tests/test_installed.py) leaves no
# build/ folder behind holding a second copy of every module. The folder goes when the build's process ends.
BUILD_BASE = tempfile.mkdtemp(prefix="netapprox-build-")
atexit.register(shutil.rmtree, BUILD_BASE, True)

setup(ext_modules=NATIVE, options={"build": {"build_base": BUILD_BASE}})
