"""Native extensions; everything else about the distribution is in pyproject.toml.

Each extension is optional: when it does not build (no compiler, no Python headers), ``pip install`` still
succeeds and the code falls back to its pure-Python path (each module says which). Add an extension by
appending to ``NATIVE``.
"""
from setuptools import Extension, setup

NATIVE = [
    # controller/reports.py: the report socket drained with recvmmsg, REPORTs decoded and HMAC-checked in C.
    Extension("netapprox.controller._reportrx", ["controller/_reportrx.c"], optional=True,
              extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]),
    # hostlib/core.py: the native ATP cores (hostlib/native_*.c). -ffp-contract=off keeps their floating point
    # identical to the reference's (tests/hostlib/test_hostlib_differential.py).
    Extension("netapprox.hostlib._native",
              ["hostlib/native_module.c", "hostlib/native_wire.c", "hostlib/native_sender.c",
               "hostlib/native_receiver.c", "hostlib/native_netio.c"],
              depends=["hostlib/native_atp.h"], optional=True,
              extra_compile_args=["-O2", "-std=gnu11", "-ffp-contract=off", "-fno-fast-math", "-Wall",
                                  "-Wno-unused-parameter"]),
]

setup(ext_modules=NATIVE)
