"""What ``python -m netapprox.experiments`` (the emulated testbed) and ``python -m netapprox.experiments sim``
(ns-3) share: the options every experiment takes, the checks of ``--set NAME=V1,V2`` values and their parsing
against a figure's keyword arguments, and the loop that runs the chosen figures. Every option and ``--set``
value is checked before anything runs; a mistake is one line on stderr naming it, exit status 2.
"""
from __future__ import annotations

import argparse
import inspect
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from netapprox.experiments.cache import TrialCache
from netapprox.experiments.figures import COEXIST_PATTERNS, SHIFT_ARRIVALS, SHIFT_SETTINGS, Figure
from netapprox.experiments.results import summarize
from netapprox.experiments.sweep import SCHEDULER_ENV, Sweep
from netapprox.hostlib import checks as C

SET_CHECKS: dict[str, C.Check] = {
    "msrs": C.fraction(),
    "loads": C.fraction(),
    "flow_loads": C.fraction(),
    "bg_load": C.fraction(),
    "bg_loads": C.fraction(),
    "approx_load": C.fraction(),
    "bounds": C.fraction(),
    "ratios": C.number(gt=0.0),
    "workloads": C.choice(("fbkv", "fbhd")),
    "pattern": C.choice(COEXIST_PATTERNS),
    "workers": C.integer(ge=2),
    "model_bytes": C.integer(ge=1),
    "duration_s": C.number(gt=0.0),
    "vector_len": C.integer(ge=1),
    "offline_len": C.integer(ge=1),
    "job_scale": C.integer(ge=1),
    "window_ms": C.number(gt=0.0),
    "fbkv_delay_us": C.number(ge=0.0),
    "settings": C.choice(tuple(SHIFT_SETTINGS)),
    "phase_s": C.number(gt=0.0),
    "load": C.number(gt=0.0, le=1.0),
    "receivers": C.integer(ge=1),
    "arrivals": C.choice(SHIFT_ARRIVALS),
}
"""Checks of the sweep arguments ``--set`` may override, by name (per value; a tuple argument takes a list).
A name not listed here is checked against the type of the figure's default."""


def set_checks(protocols: Sequence[str]) -> dict[str, C.Check]:
    """``SET_CHECKS`` with the protocol names of a back end."""
    return {**SET_CHECKS, "protocols": C.choice(protocols), "variants": C.choice(protocols),
            "schemes": _scheme_check(protocols)}


def _scheme_check(protocols: Sequence[str]) -> C.Check:
    """A scheme of ``exp_fairness``: ``alone``, a protocol, ``alone-<atp protocol>`` or ``<atp protocol>+<policy
    setting>`` (a name of ``SHIFT_SETTINGS``)."""
    plain = C.choice(("alone", *protocols, *(f"alone-{p}" for p in protocols if p.startswith("atp"))))
    atp = C.choice(tuple(p for p in protocols if p.startswith("atp")))
    setting = C.choice(tuple(SHIFT_SETTINGS))

    def check(value, field):
        proto, plus, name = str(value).partition("+")
        if not plus:
            return plain(value, field)
        atp(proto, field)
        setting(name, field)
        return value
    return check


class UsageError(ValueError):
    """A bad option or ``--set`` value: one line, exit status 2."""


def _convert(text: str, like: Any) -> object:
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


def parse_overrides(items: Sequence[str], fn: Callable, checks: Mapping[str, C.Check] | None = None) -> dict:
    """``["msrs=0.5,0.9", "duration_s=5"]`` -> ``{"msrs": (0.5, 0.9), "duration_s": 5.0}``: a tuple where the
    experiment's default is a tuple, a single value otherwise, each value converted to the type of the default
    and checked (``checks``, default ``SET_CHECKS``). Unknown names and bad values raise ``UsageError`` naming
    them."""
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


def add_common_arguments(p: argparse.ArgumentParser, *, names: Sequence[str], fbkv_n: int, fbhd_n: int,
                         where: str) -> None:
    """The options of both commands: which experiment, seeds, ``--quick``, ``--out``, job sizes, ``--set``."""
    p.add_argument("experiment", choices=[*names, "all"])
    p.add_argument("--seeds", type=C.arg(C.integer(ge=0)), nargs="+", default=[1, 2, 3],
                   help="one run per seed (default 1 2 3)")
    p.add_argument("--quick", action="store_true", help="a reduced sweep that checks the pipeline end to end")
    p.add_argument("--out", default="results", help=f"results directory (default: results/; writes {where})")
    p.add_argument("--fbkv-n", type=C.arg(C.integer(ge=1)), default=fbkv_n, help="messages per FBKV job")
    p.add_argument("--fbhd-n", type=C.arg(C.integer(ge=1)), default=fbhd_n, help="messages per FBHD job")
    p.add_argument("--set", action="append", default=[], metavar="NAME=V1,V2",
                   help="override a sweep argument of the experiment, e.g. --set msrs=0.5,0.9 (the keyword "
                        "arguments of the exp_* functions in experiments/figures.py)")
    p.add_argument("--cache", metavar="DIR", default=None,
                   help="take finished trials from this trial cache and store new ones there (default for ns-3: "
                        "<out>/cache; the emulated testbed measures anew unless given one)")
    p.add_argument("--no-cache", action="store_true", help="run every trial, store none")
    p.add_argument("--scheduler", metavar="ADDRESS", default=None,
                   help=f"run the trials on the Dask cluster of this scheduler, e.g. tcp://10.0.0.1:8786 (default: "
                        f"${SCHEDULER_ENV} when set)")


def sweep_of(backend: Any, args: argparse.Namespace, *, workers: int = 1) -> Sweep:
    """The sweep the options ask for: where the trials run (here, a LocalCluster of ``workers`` processes, or
    ``--scheduler``'s cluster) and the trial cache (``UsageError`` when the back end cannot run there)."""
    scheduler = args.scheduler or (os.environ.get(SCHEDULER_ENV) if backend.cluster else None)
    if args.no_cache:
        cache = None
    elif args.cache:
        cache = TrialCache(Path(args.cache))
    else:
        cache = TrialCache(Path(args.out) / "cache") if backend.deterministic else None
    try:
        return Sweep(backend, workers=workers, scheduler=scheduler, cache=cache)
    except ValueError as e:
        raise UsageError(str(e)) from None


def overrides_of(names: Sequence[str], figures: Mapping[str, Figure], items: Sequence[str],
                 checks: Callable[[str], Mapping[str, C.Check]]) -> dict[str, dict]:
    """Every chosen figure's ``--set`` values, checked (``UsageError`` on the first mistake)."""
    return {name: parse_overrides(items, figures[name].run, checks(name)) for name in names}


def run_figures(names: Sequence[str], figures: Mapping[str, Figure], sweep: Sweep, *, seeds: Sequence[int],
                out: Path, quick: bool, overrides: Mapping[str, dict], say: Callable[[str], None] = print) -> None:
    """Run each figure, writing its result file, with one line per figure when it is done (and how many of its
    trials failed); the sweep's cluster, if it started one, serves them all and stops at the end."""
    with sweep:
        for name in names:
            t0, started = time.monotonic(), time.time()
            sweep.trials = 0
            rf = figures[name](seeds, out, sweep, quick=quick, **overrides[name])
            path = rf.write()
            failed = f", {len(rf.errors)} trials FAILED (result.json 'errors')" if rf.errors else ""
            count = f"{sweep.trials} trials" if sweep.trials else f"{len(rf.runs)} runs"
            say(f"{name}: {count} in {(time.monotonic() - t0) / 60:.1f} min{failed} -> {path}")
            ratios = headline_ratios(summarize(rf.runs))
            if ratios:
                say(f"  {name} headline: {ratios}")
            plots = sorted(p for p in rf.out_dir.glob("*.png") if p.stat().st_mtime >= started - 1.0)
            say(f"  {name} plots: " + (", ".join(str(p) for p in plots) if plots else "none"))


def headline_ratios(summary: Sequence[Mapping[str, Any]], most: int = 6) -> str | None:
    """A figure's headline in one line: its first ratio metric over the per-seed ratio rows (protocol
    ``a/b``), mean [min, max] over seeds per setting (below 1: the first protocol is faster); None without
    one."""
    rows = [r for r in summary if r["metric"].endswith("_ratio") and "/" in str(r["params"].get("protocol", ""))
            and r["n"] > 0]
    if not rows:
        return None
    metric = rows[0]["metric"]
    parts = []
    for r in (r for r in rows if r["metric"] == metric):
        where = " ".join(f"{k}={v}" for k, v in r["params"].items() if k != "protocol")
        parts.append(f"{r['params']['protocol']}{' ' + where if where else ''} {r['mean']:.2f} "
                     f"[{r['min']:.2f}, {r['max']:.2f}]")
    more = f"; ... ({len(parts) - most} more in result.json)" if len(parts) > most else ""
    return f"{metric} mean [min, max] over seeds: " + "; ".join(parts[:most]) + more
