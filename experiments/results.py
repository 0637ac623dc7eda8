"""Result files: per-seed records, their spread, the JSON every experiment writes, and its plots.

Every experiment writes ``results/<experiment>/result.json``::

    {"experiment": ..., "command": [...], "git_commit": ..., "started_utc": ..., "finished_utc": ...,
     "config": {...}, "seeds": [...], "environment": {"tcp_cc": ..., "kernel": ..., "cpus": ...},
     "runs": [{"seed": s, "params": {...}, "metrics": {...}, "raw": {...}}, ...],
     "summary": [{"params": {...}, "metric": m, "n": k, "mean": .., "median": .., "min": .., "max": .., "std": ..}]}

and one or more PNGs next to it (matplotlib, Agg backend). Plots show the mean over seeds with min-max
error bars, so the spread is always visible.
"""
from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from netapprox.experiments.baselines import pick_congestion_control

RESULTS_DIR = Path(os.environ.get("NETAPPROX_RESULTS", "results"))
COMMAND: list[str] = list(sys.argv)
"""The command recorded in result files; ``python -m netapprox.experiments`` sets it to its own command line."""


def spread(values: Iterable[float | None]) -> dict:
    """n, mean, median, min, max, std (population) of the non-missing values; ``n_missing`` counts the rest."""
    values = list(values)
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    missing = len(values) - len(vals)
    if not vals:
        return {"n": 0, "n_missing": missing, "mean": None, "median": None, "min": None, "max": None, "std": None}
    vals.sort()
    n = len(vals)
    mean = sum(vals) / n
    mid = n // 2
    median = vals[mid] if n % 2 else (vals[mid - 1] + vals[mid]) / 2
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / n)
    return {"n": n, "n_missing": missing, "mean": mean, "median": median, "min": vals[0], "max": vals[-1], "std": std}


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear-interpolated percentile (``p`` in 0..100) of ``values``; ``None`` when empty."""
    vals = sorted(float(v) for v in values if v is not None)
    if not vals:
        return None
    if len(vals) == 1:
        return vals[0]
    k = (len(vals) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def _key(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def summarize(runs: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Group runs by ``params`` and give the spread of every metric over the seeds."""
    groups: dict[str, dict] = {}
    for r in runs:
        g = groups.setdefault(_key(r["params"]), {"params": dict(r["params"]), "metrics": {}})
        for m, v in r["metrics"].items():
            g["metrics"].setdefault(m, []).append(v)
    out = []
    for g in groups.values():
        for m, vals in g["metrics"].items():
            out.append({"params": g["params"], "metric": m, **spread(vals)})
    return out


def lookup(summary: Sequence[Mapping[str, Any]], metric: str, **params: Any) -> dict | None:
    """The summary row of ``metric`` whose params include ``params``."""
    for row in summary:
        if row["metric"] == metric and all(row["params"].get(k) == v for k, v in params.items()):
            return dict(row)
    return None


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict:
    """Where a run ran, including which ATP core (``native`` or ``python``: hostlib/core.py; a native build older
    than its sources is not used, and ``hostlib_native_error`` says why)."""
    from netapprox.hostlib import core  # noqa: PLC0415 - only when a result is written
    return {"tcp_cc": pick_congestion_control(), "kernel": platform.release(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "hostlib_core": core.implementation(),
            "hostlib_native_error": core.native_error}


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Progress:
    """A line per finished trial: how far, how long so far, about how long is left (``total`` 0: unknown)."""

    def __init__(self, total: int, emit: Callable[[str], None] | None = None) -> None:
        self.total = total
        self.done = 0
        self.t0 = time.monotonic()
        self.emit = emit or (lambda line: print(line, flush=True))

    def step(self, what: str, result: str) -> None:
        self.done += 1
        spent = time.monotonic() - self.t0
        if self.total:
            left = spent / self.done * max(0, self.total - self.done)
            head = f"[{self.done:>3}/{self.total} {_mmss(spent)} spent, ~{_mmss(left)} left]"
        else:
            head = f"[{self.done:>3} {_mmss(spent)} spent]"
        self.emit(f"{head} {what}: {result}")

    def note(self, text: str) -> None:
        total = f"/{self.total}" if self.total else ""
        self.emit(f"[{self.done:>3}{total} {_mmss(time.monotonic() - self.t0)}] {text}")


def _mmss(s: float) -> str:
    return f"{int(s) // 60}m{int(s) % 60:02d}s"


def seconds(v: float) -> str:
    """A duration with a unit that suits it: 1.234 s, 12.3 ms, 145.2 µs."""
    if abs(v) >= 1.0:
        return f"{v:.3f} s"
    if abs(v) >= 1e-3:
        return f"{v * 1e3:.2f} ms"
    return f"{v * 1e6:.1f} µs"


def brief(metrics: Mapping[str, Any]) -> str:
    """A few headline metrics of one run, for its progress line."""
    parts = []
    for key, fmt in (("jct_mean_s", "JCT mean {}"), ("fbkv_jct_s", "FBKV JCT {}"),
                     ("msr_met_frac", "MSR met {:.0%}"), ("fct_all_mean", "flow FCT mean {}"),
                     ("iteration_mean_s", "iteration {}"), ("rel_l2_error", "error {:.3f}"),
                     ("tcp_over_atp_jct", "TCP/ATP {:.2f}"), ("wall_s", "{} of wall clock")):
        v = metrics.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            parts.append(fmt.format(seconds(v) if "{}" in fmt else v))
    return ", ".join(parts) or "done"


PROGRESS: Callable[[str], None] | None = None
"""Where experiments print their progress lines (None: stdout)."""


@dataclasses.dataclass
class ResultFile:
    """Collects an experiment's runs and writes result.json (call :meth:`write` as runs arrive)."""

    experiment: str
    config: dict
    seeds: Sequence[int]
    out_dir: Path
    command: Sequence[str] = dataclasses.field(default_factory=lambda: list(COMMAND))
    runs: list = dataclasses.field(default_factory=list)
    started_utc: str = dataclasses.field(default_factory=now_utc)
    notes: list = dataclasses.field(default_factory=list)
    expected: int = 0
    """Runs the sweep will add, for the progress lines (0: unknown)."""
    errors: list = dataclasses.field(default_factory=list)
    """Trials that raised: their seed, params, plan and traceback (result.json has them when there are any)."""

    def __post_init__(self) -> None:
        self.progress = Progress(self.expected, PROGRESS)

    def add(self, seed: int, params: Mapping[str, Any], metrics: Mapping[str, Any], raw: Any = None, *,
            progress: bool = True) -> dict:
        """File one run (a progress line unless ``progress`` is off: a derived row); returns its record."""
        run = {"seed": seed, "params": dict(params), "metrics": dict(metrics), "raw": raw}
        self.runs.append(run)
        if progress:
            self.progress.step(self._what(seed, params), brief(metrics))
        return run

    def fail(self, seed: int, params: Mapping[str, Any], error: str, plan: Any = None, *,
             progress: bool = True) -> None:
        """File a trial that raised ``error`` (its traceback); its progress line says so."""
        self.errors.append({"seed": seed, "params": dict(params), "error": error, "plan": plan})
        if progress:
            self.progress.step(self._what(seed, params), "FAILED: " + error.strip().splitlines()[-1])

    def _what(self, seed: int, params: Mapping[str, Any]) -> str:
        what = " ".join(f"{k}={v}" for k, v in params.items())
        return f"{self.experiment} {what} seed={seed}"

    def to_dict(self) -> dict:
        out = {
            "experiment": self.experiment, "command": list(self.command), "git_commit": git_commit(),
            "started_utc": self.started_utc, "finished_utc": now_utc(), "config": self.config,
            "seeds": list(self.seeds), "environment": environment(), "notes": list(self.notes),
            "runs": self.runs, "summary": summarize(self.runs),
        }
        if self.errors:
            out["errors"] = self.errors
        return out

    def write(self) -> Path:
        """result.json, and result.csv beside it (one row per run: seed, parameters, scalar metrics)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / "result.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, default=json_default) + "\n")
        tmp.replace(path)
        write_csv([{"seed": r["seed"], **r["params"], **r["metrics"]} for r in self.runs], self.out_dir / "result.csv")
        return path


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """``rows`` as CSV, columns in order of first appearance; lists and dicts as JSON."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v, default=json_default) if isinstance(v, (list, dict)) else v
                        for k, v in r.items()})
    tmp.replace(path)


def json_default(o: Any) -> Any:
    """What ``json.dumps`` cannot write as it is: dataclasses, numpy values and arrays, paths."""
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"cannot serialise {type(o).__name__}")


# --------------------------------------------------------------------------------------------------
# Plots


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# What the experiments put on their axes: parameter, metric and timeline-field names -> (words, unit). An axis
# label a caller passes keeps its words and gets the unit of its key when it has none (no parenthesis); a key
# without a label gets these words. Every name an experiment plots needs an entry (tests/experiments/
# test_results.py reads the plot calls of experiments/figures.py).
AXES: dict[str, tuple[str, str]] = {
    # sweep parameters (x axes, bar groups)
    "msr": ("MSR", "fraction of messages required"),
    "flow_load": ("non-approximate load", "fraction of link rate"),
    "bg_load": ("background load", "fraction of link rate"),
    "loss": ("packet loss", "fraction of packets dropped"),
    "scheme": ("scheme", "ATP variant, or the job alone"),
    "setting": ("policy", "tuned, or fixed thresholds"),
    # metrics (y axes)
    "jct_mean_s": ("mean JCT", "s"),
    "jct_max_s": ("JCT of the last job", "s"),
    "queue_mean_pkts": ("mean backlog", "packets"),
    "fct_all_mean": ("mean FCT", "s"),
    "fbkv_jct_s": ("FBKV JCT", "s"),
    "fct_small_mean_change_pct": ("small-flow FCT change", "%"),
    "fct_all_mean_change_pct": ("all-flow FCT change", "%"),
    "iteration_mean_s_change_pct": ("iteration time change", "%"),
    "tcp_over_atp_jct": ("TCP JCT / ATP JCT", "x, above 1: ATP faster"),
    "rel_l2_error": ("relative L2 error", "|x' - x| / |x|"),
    # timeline fields (stacked panels)
    "loss_avg10": ("measured loss", "fraction, last 10 epochs"),
    "tlr": ("TLR", "fraction"),
    "rate_mbps": ("sending rate", "Mbit/s"),
    "rate_gbps": ("sending rate", "Gbit/s"),
    "queue": ("queue", "0 = highest priority"),
}
LEGEND_TITLES: dict[str, str] = {
    "protocol": "transport (ATP or the baseline)",
    "ratio": "compute-to-network time ratio",
    "bound": "loss bound (1 - MSR)",
    "part": "part",
    "scheme": "scheme",
    "setting": "policy",
    "workload": "workload",
}
"""Legend titles by the name of the parameter whose values the legend lists."""


def axis_label(key: str, label: str | None = None) -> str:
    """``label`` (default: the words of ``key``) with the unit of ``key`` when it names none."""
    words, unit = AXES.get(key, (key, ""))
    label = label or words
    return label if "(" in label or not unit else f"{label} ({unit})"


def _legend(ax, series: str, **kw) -> None:
    ax.legend(title=LEGEND_TITLES.get(series, series), title_fontsize=8, fontsize=8, **kw)


def plot_lines(summary: Sequence[Mapping[str, Any]], *, metric: str, x: str, series: str, path: Path,
               title: str, xlabel: str, ylabel: str, fixed: Mapping[str, Any] | None = None,
               logy: bool = False) -> Path | None:
    """One line per value of ``series``: mean of ``metric`` against ``x``, min-max error bars."""
    rows = [r for r in summary if r["metric"] == metric and r["n"] > 0
            and all(r["params"].get(k) == v for k, v in (fixed or {}).items())]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    names = sorted({str(r["params"].get(series)) for r in rows})
    for name in names:
        pts = sorted((r["params"][x], r) for r in rows if str(r["params"].get(series)) == name)
        xs = [p for p, _ in pts]
        ys = [r["mean"] for _, r in pts]
        lo = [r["mean"] - r["min"] for _, r in pts]
        hi = [r["max"] - r["mean"] for _, r in pts]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=name)
    ax.set_title(title)
    ax.set_xlabel(axis_label(x, xlabel))
    ax.set_ylabel(axis_label(metric, ylabel))
    if logy:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    _legend(ax, series)
    return _save(plt, fig, path)


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_bars(summary: Sequence[Mapping[str, Any]], *, metric: str, group: str, series: str, path: Path,
              title: str, ylabel: str, fixed: Mapping[str, Any] | None = None) -> Path | None:
    """Grouped bars: groups = values of ``group``, one bar per ``series``; min-max error bars."""
    rows = [r for r in summary if r["metric"] == metric and r["n"] > 0
            and all(r["params"].get(k) == v for k, v in (fixed or {}).items())]
    if not rows:
        return None
    plt = _plt()
    groups = sorted({r["params"].get(group) for r in rows}, key=lambda v: (str(type(v)), v))
    names = sorted({str(r["params"].get(series)) for r in rows})
    same = group == series  # one bar per group, no legend offsets
    width = 0.6 if same else 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for i, name in enumerate(names):
        xs, ys, lo, hi = [], [], [], []
        for j, gv in enumerate(groups):
            r = next((r for r in rows if r["params"].get(group) == gv and str(r["params"].get(series)) == name), None)
            if r is None:
                continue
            xs.append(j + (0 if same else i * width))
            ys.append(r["mean"])
            lo.append(r["mean"] - r["min"])
            hi.append(r["max"] - r["mean"])
        ax.bar(xs, ys, width=width, yerr=[lo, hi], capsize=3, label=name)
    ax.set_xticks([j + (0 if same else width * (len(names) - 1) / 2) for j in range(len(groups))])
    ax.set_xticklabels([str(g) for g in groups])
    ax.set_xlabel(axis_label(group))
    ax.set_ylabel(axis_label(metric, ylabel))
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    if not same:
        _legend(ax, series)
    return _save(plt, fig, path)


def plot_timeline(rows: Sequence[Mapping[str, Any]], *, fields: Sequence[str], path: Path, title: str,
                  events: Sequence[tuple[float, str]] = ()) -> Path | None:
    """Stacked panels of ``fields`` against ``time`` (timeline records), with vertical event markers."""
    rows = [r for r in rows if "time" in r]
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(len(fields), 1, figsize=(6, 1.6 * len(fields)), sharex=True)
    if len(fields) == 1:
        axes = [axes]
    ts = [r["time"] for r in rows]
    for ax, f in zip(axes, fields):
        words, unit = AXES.get(f, (f, ""))
        ax.step(ts, [r.get(f) for r in rows], where="post")
        ax.set_ylabel(f"{words}\n({unit})" if unit else words, fontsize=8)
        ax.grid(True, alpha=0.3)
        if f == "queue":
            ax.set_ylim(7.5, -0.5)
            ax.set_yticks(range(0, 8))
        for i, (t, label) in enumerate(events):
            ax.axvline(t, color="grey", linestyle="--", linewidth=0.8, label=label if i == 0 else None)
    if events:
        axes[0].legend(fontsize=7, loc="upper right")  # what the dashed lines mark
    axes[0].set_title(title)
    axes[-1].set_xlabel("time since the job started (s)")
    return _save(plt, fig, path)
