"""``python -m netapprox.experiments sim <name> [--k 8] [--seeds 1 2 3] [--workers 1] [--quick] [--out results]``.

Experiments (docs/simulation.md): alltoall (NetApprox Fig. 5-8), incast (Fig. 9), dynamic (Fig. 10-11),
ablation (Fig. 12), coexist (Fig. 13), fairness (Fig. 14), all. Needs the ``sim`` extra (ns-3 from PyPI),
not root. Results: results/sim/<name>/result.json and PNGs. Run long sweeps under ``nice -n 19``.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Sequence

from netapprox.experiments.sim.runner import EXPERIMENTS, QUICK, SimScale, main_progress
from netapprox.experiments.sim.world import PROTOCOLS
from netapprox.hostlib import checks as C


def set_checks() -> dict[str, C.Check]:
    """The value checks of ``--set`` for the simulated experiments."""
    return {
        "msrs": C.fraction(),
        "loads": C.fraction(),
        "bg_load": C.fraction(),
        "approx_load": C.fraction(),
        "protocols": C.choice(PROTOCOLS),
        "variants": C.choice(PROTOCOLS),
        "schemes": C.choice(("alone", *PROTOCOLS)),
        "workloads": C.choice(("fbkv", "fbhd")),
        "job_scale": C.integer(ge=1),
        "window_ms": C.number(gt=0.0),
        "fbkv_delay_us": C.number(ge=0.0),
    }


def main(argv: Sequence[str] | None = None) -> int:
    from netapprox.experiments.__main__ import parse_overrides

    p = C.OneLineParser(prog="python -m netapprox.experiments sim", description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", choices=sorted(EXPERIMENTS) + ["all"])
    p.add_argument("--seeds", type=C.arg(C.integer(ge=0)), nargs="+", default=[1, 2, 3],
                   help="one run per seed (default 1 2 3)")
    p.add_argument("--quick", action="store_true", help="a reduced sweep that checks the pipeline end to end")
    p.add_argument("--out", default="results", help="results directory (default: results/; writes results/sim/<name>)")
    p.add_argument("--tag", default="", help="write results/sim/<name>-<TAG> instead (a second run of an experiment)")
    p.add_argument("--topology", choices=("fattree", "clos"), default=SimScale.kind)
    p.add_argument("--k", type=C.arg(C.integer(ge=2, le=48)), default=SimScale.k,
                   help=f"fat-tree arity, even (default {SimScale.k})")
    p.add_argument("--rate-gbps", type=C.arg(C.number(gt=0.0, le=400.0)), default=SimScale.host_gbps,
                   help="host link rate (40 or 100)")
    p.add_argument("--senders", type=C.arg(C.integer(ge=1)), default=None,
                   help="all-to-all / incast: this many hosts send a job (default: every host)")
    p.add_argument("--buffer-packets", type=C.arg(C.integer(ge=29)), default=SimScale.buffer_packets,
                   help=f"buffer of every switch port, packets; queues 1..7 take 28 (default {SimScale.buffer_packets})")
    p.add_argument("--fbkv-n", type=C.arg(C.integer(ge=1)), default=SimScale.fbkv_n, help="messages per FBKV job")
    p.add_argument("--fbhd-n", type=C.arg(C.integer(ge=1)), default=SimScale.fbhd_n, help="messages per FBHD job")
    p.add_argument("--workers", type=C.arg(C.integer(ge=1, le=64)), default=1,
                   help="trials in parallel, one process each (default 1)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=V1,V2",
                   help="override a sweep argument, e.g. --set msrs=0.5,0.9 --set protocols=atp,dctcp-es "
                        "(the keyword arguments of the exp_* functions in experiments/sim/runner.py)")
    args = p.parse_args(argv)
    from netapprox.controller.sim import native
    from netapprox.experiments import results
    from netapprox.experiments.__main__ import UsageError

    names = sorted(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    try:
        overrides = {name: parse_overrides(args.set, EXPERIMENTS[name], set_checks()) for name in names}
    except UsageError as e:
        print(f"sim: {e}", file=sys.stderr)
        return 2
    if not native.available():
        print("the simulations need ns-3: pip install -e '.[sim]' (make setup installs it)", file=sys.stderr)
        return 2

    results.COMMAND[:] = ["python", "-m", "netapprox.experiments", "sim", *(sys.argv[2:] if argv is None else argv)]
    scale = dataclasses.replace(SimScale(), kind=args.topology, k=args.k, host_gbps=args.rate_gbps,
                                senders=args.senders, fbkv_n=args.fbkv_n, fbhd_n=args.fbhd_n,
                                buffer_packets=args.buffer_packets, tag=args.tag)
    try:
        scale.topology()
        if args.tag and not args.tag.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"--tag {args.tag!r}: letters, digits, - and _ only")
    except ValueError as e:
        print(f"sim: {e}", file=sys.stderr)
        return 2
    for name in names:
        kw = dict(QUICK.get(name, {})) if args.quick else {}
        kw.update(overrides[name])
        t0 = time.perf_counter()
        main_progress(f"sim {name}: {scale.topology().describe()}, seeds {args.seeds}")
        rf = EXPERIMENTS[name](args.seeds, Path(args.out), scale, workers=args.workers, progress=main_progress, **kw)
        path = rf.write()
        main_progress(f"sim {name}: {len(rf.runs)} runs in {(time.perf_counter() - t0) / 60:.1f} min -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
