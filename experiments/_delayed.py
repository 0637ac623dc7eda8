"""``python -m netapprox.experiments._delayed SECONDS MODULE ARGS...``: sleep, then run MODULE as ``__main__``.

Used by the trial runner to start a sender or background source later without a shell.
"""
import runpy
import sys
import time

if __name__ == "__main__":
    delay, module, *rest = sys.argv[1:]
    time.sleep(float(delay))
    sys.argv = [module] + rest
    runpy.run_module(module, run_name="__main__", alter_sys=True)
