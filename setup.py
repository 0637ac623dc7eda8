"""Native extensions; everything else about the distribution is in pyproject.toml.

Each extension is optional: when it does not build (no compiler, no Python headers), ``pip install`` still
succeeds and the code falls back to its pure-Python path (each module says which). Add an extension by
appending to ``NATIVE``; a C file added to hostlib/native/ is built into the native cores as it is.
"""
from glob import glob

from setuptools import Extension, setup

NATIVE_DIR = "hostlib/native"
NATIVE = [
    # controller/reports.py: the report socket drained with recvmmsg, REPORTs decoded (hostlib/native/wire.c, the
    # cores' codec) and HMAC-checked in C.
    Extension("netapprox.controller._reportrx", ["controller/_reportrx.c", f"{NATIVE_DIR}/wire.c"],
              include_dirs=[NATIVE_DIR], depends=[f"{NATIVE_DIR}/wire.h"], optional=True,
              extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]),
    # hostlib/core.py: the native ATP cores (hostlib/native/, one file per concern as in hostlib/; module.c lists
    # them). -ffp-contract=off keeps their floating point identical to the reference's
    # (tests/hostlib/test_hostlib_differential.py).
    Extension("netapprox.hostlib._native", sorted(glob(f"{NATIVE_DIR}/*.c")),
              depends=sorted(glob(f"{NATIVE_DIR}/*.h")), optional=True,
              extra_compile_args=["-O2", "-std=gnu11", "-ffp-contract=off", "-fno-fast-math", "-Wall",
                                  "-Wno-unused-parameter"]),
]

setup(ext_modules=NATIVE)
