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
]

setup(ext_modules=NATIVE)
