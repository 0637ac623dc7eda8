"""``python -m netapprox.experiments [<back end>] <name> ...``: run an experiment on a back end of
experiments/backend.py (``BACKENDS``): the emulated testbed by default (``python -m netapprox.experiments
alltoall``; ``emulated_cli.py``), the ns-3 simulation with ``sim`` (``python -m netapprox.experiments sim
alltoall``; ``sim_cli.py``). ``--help`` after a back end's name lists its options.
``python -m netapprox.experiments analytics`` runs the analytics evaluation (Fig. 15-16 and the figures registered
there: experiments/analytics_eval.py).
"""
from __future__ import annotations

import sys
from typing import Sequence

from netapprox.experiments.backend import BACKENDS, DEFAULT_BACKEND, command


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["analytics"]:  # not a back end: it runs its own trials (the testbed's and the simulated link's)
        from netapprox.experiments import analytics_eval
        return analytics_eval.main(args[1:])
    if args[:1] and args[0] in BACKENDS:
        return command(args[0])(args[1:])
    return command(DEFAULT_BACKEND)(args)


if __name__ == "__main__":
    sys.exit(main())
