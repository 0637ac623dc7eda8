"""``python -m netapprox.experiments <name> [--seeds 1 2 3] [--quick] [--out results]``: run one experiment.

Experiments (docs/experiments.md): alltoall (Fig. 5-8), incast (Fig. 9), dynamic (Fig. 10-11),
ablation (Fig. 12), coexist (Fig. 13), fairness (Fig. 14), ddnn (thesis: DNN ring traffic at low
priority), boundedloss (bounded-loss ML), all.
Needs root (network namespaces). Results: results/<name>/result.json and PNGs.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import Sequence

from netapprox.experiments.runner import EXPERIMENTS, QUICK, Scale


def _value(text: str):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_overrides(items: Sequence[str], fn) -> dict:
    """``["msrs=0.5,0.9", "duration_s=5"]`` -> ``{"msrs": (0.5, 0.9), "duration_s": 5}``: a tuple where the
    experiment's default is a tuple, a single value otherwise. Unknown names are an error."""
    import inspect
    params = {n: prm.default for n, prm in inspect.signature(fn).parameters.items()
              if prm.kind == inspect.Parameter.KEYWORD_ONLY}
    out = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.replace("-", "_")
        if not sep or not name:
            raise SystemExit(f"--set {item!r}: expected NAME=VALUE[,VALUE...]")
        if name not in params:
            raise SystemExit(f"--set {name}: not an argument of {fn.__name__}; known: {', '.join(sorted(params))}")
        vals = tuple(_value(v) for v in values.split(",") if v != "")
        out[name] = vals if isinstance(params[name], tuple) else (vals[0] if vals else None)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netapprox.experiments", description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", choices=sorted(EXPERIMENTS) + ["all"])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="one run per seed (default 1 2 3)")
    p.add_argument("--quick", action="store_true", help="a reduced sweep that checks the pipeline end to end")
    p.add_argument("--out", default="results", help="results directory (default: results/)")
    p.add_argument("--rate-mbit", type=float, default=Scale.rate_mbit)
    p.add_argument("--hosts", type=int, default=Scale.hosts)
    p.add_argument("--fbkv-n", type=int, default=Scale.fbkv_n)
    p.add_argument("--fbhd-n", type=int, default=Scale.fbhd_n)
    p.add_argument("--set", action="append", default=[], metavar="NAME=V1,V2",
                   help="override a sweep argument of the experiment, e.g. --set msrs=0.5,0.9 "
                        "--set protocols=atp,tcp-es (see experiments/runner.py for the names)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    from netapprox.experiments import results
    results.COMMAND[:] = ["python", "-m", "netapprox.experiments", *(sys.argv[1:] if argv is None else argv)]
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if os.geteuid() != 0:
        print("experiments need root: they create network namespaces and program qdiscs", file=sys.stderr)
        return 2
    scale = dataclasses.replace(Scale(), rate_mbit=args.rate_mbit, hosts=args.hosts, fbkv_n=args.fbkv_n,
                                fbhd_n=args.fbhd_n)
    names = sorted(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    for name in names:
        kw = dict(QUICK.get(name, {})) if args.quick else {}
        kw.update(parse_overrides(args.set, EXPERIMENTS[name]))
        rf = EXPERIMENTS[name](args.seeds, Path(args.out), scale, **kw)
        path = rf.write()
        print(f"{name}: {len(rf.runs)} runs -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
