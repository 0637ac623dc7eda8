"""``python -m netapprox.experiments [emulated] <name> [--seeds 1 2 3] [--quick] [--out results]``: run one experiment
on the emulated testbed (the ``emulated`` back end of experiments/backend.py).

Experiments (docs/experiments.md): alltoall (Fig. 5-8), incast (Fig. 9), dynamic (Fig. 10-11),
ablation (Fig. 12), coexist (Fig. 13), fairness (Fig. 14), ddnn (thesis: DNN ring traffic at low
priority), boundedloss (bounded-loss ML), all; ddp (Fig. 18: PyTorch training over ATP vs gloo; needs the
[torch] extra, not part of ``all``).
Needs root (network namespaces). Results: results/<name>/result.json and PNGs. Every option and ``--set`` value
is checked before anything runs; a mistake is one line on stderr naming it, exit status 2.
``python -m netapprox.experiments sim <name>`` runs the same figures at data-center scale in ns-3 instead
(experiments/sim, docs/simulation.md; no root; needs the [sim] extra).
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Sequence

from netapprox.experiments import results
from netapprox.experiments.cli import (
    UsageError, add_common_arguments, overrides_of, run_figures, set_checks, sweep_of)
from netapprox.experiments.emulated import PROTOCOLS, EmulatedBackend, Scale
from netapprox.experiments.figures import EXPERIMENTS, Figure, figures_for
from netapprox.hostlib import checks as C
from netapprox.topo.netns import stop_on_signals

SET_CHECKS = set_checks(PROTOCOLS)
"""The value checks of ``--set`` for the emulated experiments."""

# Run on their own (not by ``all``): ddp trains PyTorch models (the [torch] extra) for ~40 minutes.
SEPARATE = {"ddp": ("netapprox.experiments.ddp", "exp_ddp")}
SEPARATE_QUICK = {"ddp": {"variants": ("gloo", "atp"), "scenarios": ("idle", "straggler"), "iterations": 60,
                          "fills": ("zero", "error_feedback"), "fill_iterations": 40}}
SEPARATE_CHECKS: dict[str, dict[str, C.Check]] = {
    "ddp": {"variants": C.choice(("gloo", "gloo-low", "atp", "atp-low", "atp-spread", "atp-exact", "atp-tail")),
            "scenarios": C.choice(("idle", "ws20", "ws50", "straggler", "straggler-both")),
            "fills": C.choice(("zero", "previous", "error_feedback")), "fill_loss": C.fraction(),
            "msr": C.fraction(), "msr_floor": C.number(gt=0.0, le=1.0), "straggler_rate": C.number(gt=0.0, le=1.0), "target": C.fraction(),
            "iterations": C.integer(ge=1), "eval_every": C.integer(ge=1), "flow_s": C.number(gt=0.0),
            "fill_iterations": C.integer(ge=1), "hidden": C.integer(ge=1)},
}


def figure(name: str) -> Figure:
    """A figure of the emulated testbed by name (``ddp`` is imported only when asked for: it needs PyTorch)."""
    if name in SEPARATE:
        module, fn = SEPARATE[name]
        return Figure(getattr(importlib.import_module(module), fn), SEPARATE_QUICK[name], backends=("emulated",))
    return EXPERIMENTS[name]


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    p = C.OneLineParser(prog="python -m netapprox.experiments", description=__doc__.split("\n\n")[0],
                        epilog="commands: python -m netapprox.experiments sim <name> runs the same figures at "
                               "data-center scale in ns-3 (no root; python -m netapprox.experiments sim --help)")
    add_common_arguments(p, names=figures_for("emulated") + sorted(SEPARATE), fbkv_n=Scale.fbkv_n,
                         fbhd_n=Scale.fbhd_n, where="results/<name>")
    p.add_argument("--rate-mbit", type=C.arg(C.number(gt=0.0, le=10000.0)), default=Scale.rate_mbit,
                   help="line rate of every switch port, Mbit/s (default %(default)s)")
    p.add_argument("--hosts", type=C.arg(C.integer(ge=2, le=64)), default=Scale.hosts,
                   help="workload hosts (default %(default)s)")
    p.add_argument("-v", "--verbose", action="store_true", help="log each step on stderr")
    args = p.parse_args(args_in)
    names = figures_for("emulated") if args.experiment == "all" else [args.experiment]
    scale = dataclasses.replace(Scale(), rate_mbit=args.rate_mbit, hosts=args.hosts, fbkv_n=args.fbkv_n,
                                fbhd_n=args.fbhd_n)
    try:
        C.output_file(create_dirs=True)(Path(args.out) / "result.json", "--out")
        figures = {name: figure(name) for name in names}
        overrides = overrides_of(names, figures, args.set, lambda name: {**SET_CHECKS, **SEPARATE_CHECKS.get(name, {})})
        sweep = sweep_of(EmulatedBackend(scale), args)
    except (C.CheckError, UsageError) as e:
        p.error(str(e))
    results.COMMAND[:] = ["python", "-m", "netapprox.experiments", *args_in]
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if os.geteuid() != 0:
        print(f"{p.prog}: error: experiments need root: they create network namespaces and program qdiscs",
              file=sys.stderr)
        return 2
    stop_on_signals()  # SIGTERM/SIGHUP clean up like Ctrl-C: every testbed's processes and namespaces go
    run_figures(names, figures, sweep, seeds=args.seeds, out=Path(args.out), quick=args.quick, overrides=overrides)
    return 0
