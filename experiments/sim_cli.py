"""``python -m netapprox.experiments sim <name> [--k 8] [--seeds 1 2 3] [--workers 1] [--quick] [--out results]``: the
command line of the ``sim`` back end (experiments/backend.py).

Experiments (docs/simulation.md): the figures of the emulated experiments (experiments/figures.py) on the ns-3
back end: alltoall (NetApprox Fig. 5-8), incast (Fig. 9), dynamic (Fig. 10-11), ablation (Fig. 12), coexist
(Fig. 13), fairness (Fig. 14), all. Needs the ``sim`` extra (ns-3 from PyPI), not root. Results:
results/sim/<name>/result.json and PNGs. Run long sweeps under ``nice -n 19``.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Sequence

from netapprox.controller.sim import native
from netapprox.experiments import results
from netapprox.experiments.cli import UsageError, add_common_arguments, overrides_of, run_figures, sweep_of
from netapprox.experiments.cli import set_checks as _set_checks
from netapprox.experiments.figures import EXPERIMENTS, figures_for
from netapprox.experiments.sim.backend import SimBackend, SimScale
from netapprox.experiments.sim.trial import PROTOCOLS
from netapprox.hostlib import checks as C


def set_checks() -> dict[str, C.Check]:
    """The value checks of ``--set`` for the simulated experiments."""
    return _set_checks(PROTOCOLS)


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    p = C.OneLineParser(prog="python -m netapprox.experiments sim", description=__doc__.split("\n\n")[0])
    add_common_arguments(p, names=figures_for("sim"), fbkv_n=SimScale.fbkv_n, fbhd_n=SimScale.fbhd_n,
                         where="results/sim/<name>")
    p.add_argument("--tag", default="", help="write results/sim/<name>-<TAG> instead (a second run of an experiment)")
    p.add_argument("--topology", choices=("fattree", "clos"), default=SimScale.topo.kind,
                   help="fattree (k-ary fat tree) or clos (leaf-spine)")
    p.add_argument("--k", type=C.arg(C.integer(ge=2, le=48)), default=SimScale.topo.k,
                   help=f"fat-tree arity, even (default {SimScale.topo.k})")
    p.add_argument("--rate-gbps", type=C.arg(C.number(gt=0.0, le=400.0)), default=SimScale.topo.host_gbps,
                   help="host link rate (40 or 100)")
    p.add_argument("--senders", type=C.arg(C.integer(ge=1)), default=None,
                   help="all-to-all / incast: this many hosts send a job (default: every host)")
    p.add_argument("--buffer-packets", type=C.arg(C.integer(ge=29)), default=SimScale.buffer_packets,
                   help=f"buffer of every switch port, packets (default {SimScale.buffer_packets})")
    p.add_argument("--approx-buffer-unit", type=C.arg(C.integer(ge=1)), default=None,
                   help="approximate queue k holds this many times 8 - k packets (1: the paper's k-MTU buffers; "
                        "default: the most that leaves queue 0 half of the port, 17 of 1000 packets)")
    p.add_argument("--workers", type=C.arg(C.integer(ge=1, le=256)), default=os.cpu_count() or 1,
                   help="trials in parallel on a Dask LocalCluster of this many worker processes (default: one per "
                        "core, here %(default)s); 1: every trial in this process")
    args = p.parse_args(args_in)
    names = figures_for("sim") if args.experiment == "all" else [args.experiment]
    try:
        overrides = overrides_of(names, EXPERIMENTS, args.set, lambda name: set_checks())
    except UsageError as e:
        print(f"{p.prog}: error: {C.one_line(e)}", file=sys.stderr)
        return 2
    if not native.available():
        print(f"{p.prog}: error: the simulations need ns-3: pip install -e '.[sim]' (make setup installs it)",
              file=sys.stderr)
        return 2
    results.COMMAND[:] = ["python", "-m", "netapprox.experiments", "sim", *args_in]
    try:
        topo = dataclasses.replace(SimScale.topo, kind=args.topology, k=args.k, host_gbps=args.rate_gbps)
    except ValueError as e:
        print(f"{p.prog}: error: {C.one_line(e)}", file=sys.stderr)
        return 2
    scale = dataclasses.replace(SimScale(), topo=topo, senders=args.senders, fbkv_n=args.fbkv_n, fbhd_n=args.fbhd_n,
                                buffer_packets=args.buffer_packets, approx_buffer_unit=args.approx_buffer_unit,
                                tag=args.tag)
    try:
        scale.topology()
        scale.settings()
        if args.tag and not args.tag.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"--tag {args.tag!r}: letters, digits, - and _ only")
    except ValueError as e:
        print(f"{p.prog}: error: {C.one_line(e)}", file=sys.stderr)
        return 2
    try:
        sweep = sweep_of(SimBackend(scale, progress=say), args, workers=args.workers)
        if sweep.scheduler:
            sweep.cluster()  # an unreachable scheduler is one line here, not a traceback later
    except UsageError as e:
        print(f"{p.prog}: error: {C.one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{p.prog}: error: cannot reach the Dask scheduler at {sweep.scheduler}: {C.one_line(e)}", file=sys.stderr)
        return 2
    say(f"sim {', '.join(names)}: {scale.topology().describe()}, seeds {args.seeds}")
    run_figures(names, EXPERIMENTS, sweep, seeds=args.seeds, out=Path(args.out), quick=args.quick,
                overrides=overrides, say=say)
    return 0
