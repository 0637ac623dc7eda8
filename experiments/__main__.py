"""``python -m netapprox.experiments <name> [--seeds 1 2 3] [--quick] [--out results]``: run one experiment.

Experiments (docs/experiments.md): alltoall (Fig. 5-8), incast (Fig. 9), dynamic (Fig. 10-11),
ablation (Fig. 12), coexist (Fig. 13), fairness (Fig. 14), ddnn (thesis: DNN ring traffic at low
priority), boundedloss (bounded-loss ML), all; ddp (Fig. 18: PyTorch training over ATP vs gloo; needs the
[torch] extra, not part of ``all``).
Needs root (network namespaces). Results: results/<name>/result.json and PNGs. Every option and ``--set`` value
is checked before anything runs; a mistake is one line on stderr naming it, exit status 2.
``python -m netapprox.experiments sim <name>`` runs the data-center-scale simulations in ns-3 instead
(experiments/sim, docs/simulation.md; no root; needs the [sim] extra).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import Sequence

from netapprox.experiments.runner import EXPERIMENTS, QUICK, Scale
from netapprox.experiments.trial import PROTOCOLS
from netapprox.hostlib import checks as C

# Checks of the sweep arguments ``--set`` may override, by name (per value; a tuple argument takes a list).
# A name not listed here is checked against the type of the experiment's default.
SET_CHECKS: dict[str, C.Check] = {
    "msrs": C.fraction(),
    "loads": C.fraction(),
    "flow_loads": C.fraction(),
    "bg_load": C.fraction(),
    "bg_loads": C.fraction(),
    "bounds": C.fraction(),
    "ratios": C.number(gt=0.0),
    "protocols": C.choice(PROTOCOLS),
    "variants": C.choice(PROTOCOLS),
    "schemes": C.choice(("alone", *PROTOCOLS)),
    "workloads": C.choice(("fbkv", "fbhd")),
    "workers": C.integer(ge=2),
    "model_bytes": C.integer(ge=1),
    "duration_s": C.number(gt=0.0),
    "vector_len": C.integer(ge=1),
    "offline_len": C.integer(ge=1),
}


# Run on their own (not by ``all``): ddp trains PyTorch models (the [torch] extra) for ~15 minutes.
SEPARATE = {"ddp": ("netapprox.experiments.ddp", "exp_ddp")}
SEPARATE_QUICK = {"ddp": {"variants": ("gloo", "atp"), "iterations": 60, "fills": ("zero", "error_feedback"),
                          "fill_iterations": 40}}
SEPARATE_CHECKS: dict[str, dict[str, C.Check]] = {
    "ddp": {"variants": C.choice(("gloo", "gloo-low", "atp", "atp-low")),
            "fills": C.choice(("zero", "previous", "error_feedback")), "fill_loss": C.fraction(),
            "flow_load": C.fraction(), "target": C.fraction(), "iterations": C.integer(ge=1),
            "fill_iterations": C.integer(ge=1), "hidden": C.integer(ge=1)},
}


def _experiment(name: str):
    if name in SEPARATE:
        import importlib
        module, fn = SEPARATE[name]
        return getattr(importlib.import_module(module), fn)
    return EXPERIMENTS[name]


class UsageError(ValueError):
    """A bad option or ``--set`` value: one line, exit status 2."""


def _convert(text: str, like) -> object:
    """``text`` as the type of ``like`` (an experiment's default value)."""
    if isinstance(like, bool):
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"expected true or false, got {text!r}")
        return text.lower() in ("true", "1", "yes")
    if isinstance(like, int):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
    if isinstance(like, float):
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None
    return text


def parse_overrides(items: Sequence[str], fn, checks: dict | None = None) -> dict:
    """``["msrs=0.5,0.9", "duration_s=5"]`` -> ``{"msrs": (0.5, 0.9), "duration_s": 5.0}``: a tuple where the
    experiment's default is a tuple, a single value otherwise, each value converted to the type of the default
    and checked (``SET_CHECKS``). Unknown names and bad values raise ``UsageError`` naming them."""
    import inspect
    checks = SET_CHECKS if checks is None else checks
    params = {n: prm.default for n, prm in inspect.signature(fn).parameters.items()
              if prm.kind == inspect.Parameter.KEYWORD_ONLY}
    out = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.replace("-", "_")
        if not sep or not name:
            raise UsageError(f"--set {item!r}: expected NAME=VALUE[,VALUE...]")
        if name not in params:
            raise UsageError(f"--set {name}: not an argument of {fn.__name__}; known: {', '.join(sorted(params))}")
        default = params[name]
        texts = [v for v in values.split(",") if v != ""]
        many = isinstance(default, tuple)
        if not texts or (not many and len(texts) > 1):
            raise UsageError(f"--set {name}: expected {'one or more values' if many else 'one value'}, got {values!r}")
        like = default[0] if many and default else default
        try:
            vals = tuple(_convert(t, like) for t in texts)
            if name in checks:
                vals = tuple(checks[name](v, "") for v in vals)
        except C.CheckError as e:
            raise UsageError(f"--set {name}: {e.problem}") from None
        except ValueError as e:
            raise UsageError(f"--set {name}: {e}") from None
        out[name] = vals if many else vals[0]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["sim"]:
        from netapprox.experiments.sim.__main__ import main as sim_main
        return sim_main(args_in[1:])
    p = C.OneLineParser(prog="python -m netapprox.experiments", description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", choices=sorted(EXPERIMENTS) + sorted(SEPARATE) + ["all"])
    p.add_argument("--seeds", type=C.arg(C.integer(ge=0)), nargs="+", default=[1, 2, 3],
                   help="one run per seed (default 1 2 3)")
    p.add_argument("--quick", action="store_true", help="a reduced sweep that checks the pipeline end to end")
    p.add_argument("--out", default="results", help="results directory (default: results/)")
    p.add_argument("--rate-mbit", type=C.arg(C.number(gt=0.0, le=10000.0)), default=Scale.rate_mbit,
                   help="line rate of every switch port, Mbit/s (default %(default)s)")
    p.add_argument("--hosts", type=C.arg(C.integer(ge=2, le=64)), default=Scale.hosts,
                   help="workload hosts (default %(default)s)")
    p.add_argument("--fbkv-n", type=C.arg(C.integer(ge=1)), default=Scale.fbkv_n, help="messages per FBKV job")
    p.add_argument("--fbhd-n", type=C.arg(C.integer(ge=1)), default=Scale.fbhd_n, help="messages per FBHD job")
    p.add_argument("--set", action="append", default=[], metavar="NAME=V1,V2",
                   help="override a sweep argument of the experiment, e.g. --set msrs=0.5,0.9 "
                        "--set protocols=atp,tcp-es (see experiments/runner.py for the names)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    names = sorted(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    try:
        C.output_file(create_dirs=True)(Path(args.out) / "result.json", "--out")
        overrides = {name: parse_overrides(args.set, _experiment(name), {**SET_CHECKS, **SEPARATE_CHECKS.get(name, {})})
                     for name in names}
    except (C.CheckError, UsageError) as e:
        p.error(str(e))
    from netapprox.experiments import results
    results.COMMAND[:] = ["python", "-m", "netapprox.experiments", *(sys.argv[1:] if argv is None else argv)]
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if os.geteuid() != 0:
        print("experiments need root: they create network namespaces and program qdiscs", file=sys.stderr)
        return 2
    scale = dataclasses.replace(Scale(), rate_mbit=args.rate_mbit, hosts=args.hosts, fbkv_n=args.fbkv_n,
                                fbhd_n=args.fbhd_n)
    for name in names:
        kw = dict({**QUICK, **SEPARATE_QUICK}.get(name, {})) if args.quick else {}
        kw.update(overrides[name])
        rf = _experiment(name)(args.seeds, Path(args.out), scale, **kw)
        path = rf.write()
        print(f"{name}: {len(rf.runs)} runs -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
