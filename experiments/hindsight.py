"""A policy held against the best of every fixed configuration a run contains, in hindsight.

The shifting workload (``figures.exp_shift``) runs the same jobs under several policy settings
(``figures.SHIFT_SETTINGS``). A setting is **fixed** when nothing in it moves online: its resolved ``[policy]``
is not mode ``adaptive`` (no tuned thresholds, buffers or remaining-work placement). The **baseline pool** of a
run is every fixed setting it contains, whatever its name: threshold sets with and without the finishing rule,
the default, and any other fixed knob. A policy's JCT is then held against

- **per seed**: the best pool member *of that seed* (a different one may win each seed), and
- **on the mean**: the pool member with the lowest mean over the seeds,

overall and per phase (each phase against that phase's best). The bar (``Bar``): the policy's mean JCT at most
``jct`` (0.9) of the best fixed, no phase more than ``phase`` (1.05) of that phase's best, every job meeting
its MSR. A criterion counts as met only when it holds on the mean **and** in every seed; when the mean says met
and a seed does not, the verdict says the per-seed ratios disagree, never "met". A run whose pool lacks one of
the fixed grid's configurations (``grid_missing``), lacks a pool member in a seed, or whose seeds include a
design seed (``DESIGN_SEEDS``: used while the policies were built) is reported as such and not judged "met".

The bar's other branch, the default being the best fixed configuration, is checked the same way
(``default_is_best``: best on the mean, and in how many seeds).

What a tuner that *picks among* the pool could reach at most (``selection_oracle``): in every seed and phase the
pool member best in that phase, known in advance and switched to at no cost, each phase's mean weighted by its
jobs. When that is above the bar's 0.9, no selection among these configurations (a bandit per phase, say) can
meet the bar; only a policy outside the pool could.

``python -m netapprox.experiments.hindsight results/sim/shift/result.json`` prints the table and the verdicts.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from netapprox.controller.config import PolicyConfig, with_policy

DESIGN_SEEDS: tuple[int, ...] = tuple(range(1, 13))
"""Seeds of the shifting workload spent before the last judgement: 1-9 used to design or choose the policies
(the finishing rule, the tuner, the default thresholds, the SRPT-like and finishing-horizon variants), 10-12 to
judge an earlier design. A judgement on any of them is not a held-out one. (Seeds 13-15 and 16-18 judged the
design frozen at the commits docs/results.md names, nothing was chosen on them; a design change made after them
needs seeds from 19 on.)"""
PHASE_KEYS: tuple[str, ...] = ("jct_fbkv_heavy_s", "jct_fbhd_heavy_s", "jct_mix_web_s")
"""The shifting workload's per-phase mean JCT metrics (``figures.SHIFT_PHASES``, in order)."""
KEYS: tuple[str, ...] = ("jct_mean_s", *PHASE_KEYS)
PHASE_JOBS: tuple[str, ...] = tuple(f"jobs_{k[4:-2]}" for k in PHASE_KEYS)
"""Per phase, the jobs that finished in it (``jobs_fbkv_heavy`` ...): what its mean JCT is over."""


@dataclasses.dataclass(frozen=True)
class Bar:
    """What a tuned policy must reach against the best fixed configuration in hindsight."""

    jct: float = 0.9
    """Mean JCT over the best fixed configuration's, at most."""
    phase: float = 1.05
    """Each phase's mean JCT over that phase's best fixed configuration's, at most."""


def resolved(overrides: Iterable[tuple[str, Any]]) -> PolicyConfig:
    """The ``[policy]`` a setting runs (the trial's base, mode ``netapprox``, with the setting's keys)."""
    return with_policy(PolicyConfig(mode="netapprox"), tuple(overrides), "setting")


def is_fixed(policy: PolicyConfig) -> bool:
    """Nothing in ``policy`` moves online (mode ``adaptive`` tunes thresholds, buffers and placement)."""
    return policy.mode != "adaptive"


def baseline_pool(settings: Iterable[str], table: Mapping[str, Sequence[tuple[str, Any]]]) -> tuple[str, ...]:
    """Every fixed setting among ``settings`` (policies from ``table``), in the run's order: the baselines a
    policy is held against."""
    return tuple(s for s in settings if is_fixed(resolved(table[s])))


def grid(thresholds: Mapping[str, Sequence[float]],
         horizons: Mapping[str, Sequence[float]] | None = None) -> dict[str, PolicyConfig]:
    """The fixed configurations a shifting-workload run must contain to be judged: every threshold set with the
    finishing rule on (the default's horizon) and off, named ``finish-<set>`` / ``fixed-<set>``, and every
    finishing horizon of ``horizons`` (threshold set -> ``finish_epochs`` values) on its set, named
    ``finish<e>-<set>``: the horizon is a knob the tuner moves (``[policy.tuning] finish_ref``)."""
    out = {}
    for name, t in thresholds.items():
        out[f"fixed-{name}"] = resolved((("thresholds", tuple(t)), ("finish_epochs", 0.0)))
        out[f"finish-{name}"] = resolved((("thresholds", tuple(t)),))
    for name, epochs in (horizons or {}).items():
        for e in epochs:
            out[f"finish{e:g}-{name}"] = resolved((("thresholds", tuple(thresholds[name])),
                                                    ("finish_epochs", float(e))))
    return out


def grid_missing(settings: Iterable[str], table: Mapping[str, Sequence[tuple[str, Any]]],
                 thresholds: Mapping[str, Sequence[float]],
                 horizons: Mapping[str, Sequence[float]] | None = None) -> list[str]:
    """The grid's configurations (``grid``) that no setting of the run resolves to (``default`` counts as the
    configuration it equals)."""
    have = [resolved(table[s]) for s in settings]
    return [name for name, cfg in grid(thresholds, horizons).items() if cfg not in have]


@dataclasses.dataclass
class Criterion:
    """One ratio of a policy against the best fixed configuration (overall or one phase)."""

    key: str
    limit: float
    on_mean: float | None
    """The policy's mean over the seeds over the best pool member's mean (that member: ``best_on_mean``)."""
    best_on_mean: str | None
    per_seed: dict[int, tuple[float, str]]
    """seed -> (the policy's JCT over that seed's best pool member's, that member)."""

    @property
    def spread(self) -> tuple[float, float, float] | None:
        """(min, max, population standard deviation) of the per-seed ratios."""
        r = [v for v, _ in self.per_seed.values()]
        return (min(r), max(r), statistics.pstdev(r)) if r else None

    @property
    def state(self) -> str:
        """``met`` (on the mean and in every seed), ``disagree`` (the mean meets it, a seed does not) or ``not
        met``."""
        if self.on_mean is None or not self.per_seed:
            return "not met"
        seeds_ok = all(v <= self.limit for v, _ in self.per_seed.values())
        if self.on_mean <= self.limit:
            return "met" if seeds_ok else "disagree"
        return "not met"


@dataclasses.dataclass
class Judgement:
    """A policy against the best fixed configurations of one run."""

    policy: str
    criteria: list[Criterion]
    msr_met: bool
    problems: list[str]
    """Why the run cannot judge (pool incomplete, design seeds, a missing trial); empty when it can."""

    @property
    def verdict(self) -> str:
        if self.problems:
            return "not judged: " + "; ".join(self.problems)
        states = {c.key: c.state for c in self.criteria}
        if all(s == "met" for s in states.values()) and self.msr_met:
            return "met"
        why = []
        for c in self.criteria:
            if c.state == "disagree":
                why.append(f"{c.key}: met on the mean ({c.on_mean:.3f}) but not in every seed")
            elif c.state == "not met":
                why.append(f"{c.key}: {c.on_mean:.3f} > {c.limit:g}" if c.on_mean is not None else f"{c.key}: no data")
        if not self.msr_met:
            why.append("a job missed its MSR")
        return "not met (" + "; ".join(why) + ")"


def best_on_mean(by: Mapping[tuple[str, int], Mapping[str, Any]], pool: Sequence[str], seeds: Sequence[int],
                 key: str) -> str | None:
    """The pool member with the lowest mean of ``key`` over ``seeds`` (ties: by name); None when none has it in
    every seed."""
    means = {s: statistics.fmean([by[(s, seed)][key] for seed in seeds]) for s in pool
             if seeds and all((s, seed) in by and by[(s, seed)].get(key) for seed in seeds)}
    return min(means, key=lambda s: (means[s], s)) if means else None


def judge(by: Mapping[tuple[str, int], Mapping[str, Any]], policy: str, pool: Sequence[str], seeds: Sequence[int],
          bar: Bar = Bar(), *, problems: Sequence[str] = ()) -> Judgement:
    """``policy`` against the best of ``pool`` in ``by`` ((setting, seed) -> metrics), per seed and on the mean."""
    problems = list(problems)
    gaps = [f"{s} seed {seed}" for s in (policy, *pool) for seed in seeds if (s, seed) not in by]
    if gaps:
        problems.append("missing trials: " + ", ".join(gaps))
    criteria = []
    for key in KEYS:
        limit = bar.jct if key == "jct_mean_s" else bar.phase
        per_seed: dict[int, tuple[float, str]] = {}
        for seed in seeds:
            mine = by.get((policy, seed), {}).get(key)
            vals = {s: by[(s, seed)].get(key) for s in pool if (s, seed) in by and by[(s, seed)].get(key)}
            if mine and vals:
                best = min(vals, key=lambda s: (vals[s], s))
                per_seed[seed] = (mine / vals[best], best)
        best = best_on_mean(by, pool, seeds, key)
        mine_vals = [by.get((policy, seed), {}).get(key) for seed in seeds]
        on_mean = None
        if best is not None and all(mine_vals):
            on_mean = statistics.fmean(mine_vals) / statistics.fmean([by[(best, seed)][key] for seed in seeds])
        criteria.append(Criterion(key, limit, on_mean, best, per_seed))
    msr = [by[(policy, seed)].get("msr_met_frac") for seed in seeds if (policy, seed) in by]
    return Judgement(policy, criteria, bool(msr) and all(m == 1.0 for m in msr), problems)


def judge_run(result: Mapping[str, Any], table: Mapping[str, Sequence[tuple[str, Any]]],
              thresholds: Mapping[str, Sequence[float]], bar: Bar = Bar(),
              design_seeds: Sequence[int] = DESIGN_SEEDS,
              horizons: Mapping[str, Sequence[float]] | None = None) -> tuple[tuple[str, ...], list[Judgement]]:
    """Every policy setting of a shifting-workload result (``result.json``'s dict) against its baseline pool: the
    pool, and a judgement of each setting not in it and of ``default``."""
    runs = [r for r in result["runs"] if "/" not in str(r["params"].get("setting"))]
    settings = list(dict.fromkeys(r["params"]["setting"] for r in runs))
    seeds = sorted({r["seed"] for r in runs})
    by = _metrics_by(result, runs)
    pool = baseline_pool(settings, table)
    problems = []
    missing = grid_missing(settings, table, thresholds, horizons)
    if missing:
        problems.append("the pool lacks " + ", ".join(missing))
    design = sorted(set(seeds) & set(design_seeds))
    if design:
        problems.append(f"seeds {design} are design seeds, not held-out")
    judged = [s for s in settings if s not in pool] + (["default"] if "default" in pool else [])
    return pool, [judge(by, s, pool, seeds, bar, problems=problems) for s in judged]


def _metrics_by(result: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> dict:
    """(setting, seed) -> metrics, each with its ``PHASE_JOBS`` (counted from the trial when it lacks them)."""
    counted = phase_jobs(result) if any(PHASE_JOBS[0] not in r["metrics"] for r in runs) else {}
    return {(r["params"]["setting"], r["seed"]): {**counted.get((r["params"]["setting"], r["seed"]), {}),
                                                   **r["metrics"]} for r in runs}


def run_oracle(result: Mapping[str, Any], pool: Sequence[str]) -> Oracle | None:
    """``selection_oracle`` over ``pool`` for a shifting-workload result (``result.json``'s dict)."""
    runs = [r for r in result["runs"] if "/" not in str(r["params"].get("setting"))]
    return selection_oracle(_metrics_by(result, runs), pool, sorted({r["seed"] for r in runs}))


def default_is_best(j: Judgement) -> str:
    """The bar's other branch for the default's judgement ``j``: is it the best fixed configuration, on the mean
    JCT and in how many seeds (a run that cannot judge says so)."""
    if j.problems:
        return f"{j.policy} as the best fixed configuration: not judged: " + "; ".join(j.problems)
    c = next(c for c in j.criteria if c.key == "jct_mean_s")
    seeds = [seed for seed, (_, best) in c.per_seed.items() if best == j.policy]
    on_mean = c.best_on_mean == j.policy
    mean = f"{c.on_mean:.3f} of {c.best_on_mean}" if c.on_mean is not None else "no data"
    state = "met" if on_mean and len(seeds) == len(c.per_seed) else "met on the mean only" if on_mean else "not met"
    return (f"{j.policy} as the best fixed configuration: {state} (best on the mean: "
            f"{'yes' if on_mean else 'no, ' + mean}; best in {len(seeds)} of {len(c.per_seed)} seeds)")


@dataclasses.dataclass(frozen=True)
class Oracle:
    """The selection oracle over a pool: its mean JCT per seed over that seed's best pool member's, and on the
    mean over the best member on the mean (``best_on_mean``)."""

    per_seed: dict[int, float]
    on_mean: float
    best_on_mean: str


def selection_oracle(by: Mapping[tuple[str, int], Mapping[str, Any]], pool: Sequence[str],
                     seeds: Sequence[int]) -> Oracle | None:
    """Each seed's mean JCT had every phase run under that phase's best pool member (the phase's jobs,
    ``PHASE_JOBS``, weighting its mean), against the best single pool member; None when a pool member, a phase's
    mean or its job count is missing in a seed (never a guess)."""
    best = best_on_mean(by, pool, seeds, "jct_mean_s")
    if best is None or not all((s, seed) in by for s in pool for seed in seeds):
        return None
    oracle, single = {}, {}
    for seed in seeds:
        rows = [by[(s, seed)] for s in pool]
        if any(r.get(k) is None for r in rows for k in (*PHASE_KEYS, *PHASE_JOBS)):
            return None
        picks = [min(rows, key=lambda r: r[k]) for k in PHASE_KEYS]  # each phase's best, with its own jobs
        n = [r[j] for r, j in zip(picks, PHASE_JOBS)]
        oracle[seed] = sum(w * r[k] for w, r, k in zip(n, picks, PHASE_KEYS)) / sum(n)
        single[seed] = min(r["jct_mean_s"] for r in rows)
    on_mean = statistics.fmean(oracle.values()) / statistics.fmean([by[(best, seed)]["jct_mean_s"] for seed in seeds])
    return Oracle({seed: oracle[seed] / single[seed] for seed in seeds}, on_mean, best)


def phase_jobs(result: Mapping[str, Any]) -> dict[tuple[str, int], dict[str, int]]:
    """(setting, seed) -> ``PHASE_JOBS`` counted from a result's trials (each finished job by the phase its start
    falls in, the result's ``config.phases``), for runs written before their metrics carried them."""
    phases = (result.get("config") or {}).get("phases") or []
    if len(phases) != len(PHASE_JOBS):
        return {}
    out = {}
    for r in result["runs"]:
        jobs = (r.get("raw") or {}).get("jobs")
        if not jobs:
            continue
        counts = dict.fromkeys(PHASE_JOBS, 0)
        for j in jobs:
            if j.get("jct_s") is None:
                continue
            p = sum(1 for ph in phases[1:] if j["start_s"] >= ph["start"])
            counts[PHASE_JOBS[p]] += 1
        out[(r["params"].get("setting"), r["seed"])] = counts
    return out


def best_fixed(result: Mapping[str, Any], pool: Sequence[str]) -> dict[str, str | None]:
    """Per metric (``KEYS``): the best pool member on the mean over the result's seeds."""
    runs = [r for r in result["runs"] if "/" not in str(r["params"].get("setting"))]
    seeds = sorted({r["seed"] for r in runs})
    by = {(r["params"]["setting"], r["seed"]): r["metrics"] for r in runs}
    return {key: best_on_mean(by, pool, seeds, key) for key in KEYS}


def render(result: Mapping[str, Any], pool: Sequence[str], judgements: Sequence[Judgement]) -> str:
    """Markdown: each judged policy's ratios per seed (with the seed's best fixed), on the mean, their spread,
    and the verdict."""
    seeds = sorted({r["seed"] for r in result["runs"]})
    lines = [f"Baseline pool ({len(pool)} fixed configurations): {', '.join(pool)}.", "",
             "| policy | metric | on the mean (best fixed) | " + " | ".join(f"seed {s}" for s in seeds)
             + " | spread [min, max] sd |", "|---|---|---|" + "---:|" * len(seeds) + "---|"]
    for j in judgements:
        for c in j.criteria:
            mean = f"{c.on_mean:.3f} ({c.best_on_mean})" if c.on_mean is not None else "–"
            cells = [f"{c.per_seed[s][0]:.3f} ({c.per_seed[s][1]})" if s in c.per_seed else "–" for s in seeds]
            sp = c.spread
            spread = f"[{sp[0]:.3f}, {sp[1]:.3f}] {sp[2]:.3f}" if sp else "–"
            lines.append(f"| {j.policy} | {c.key[4:-2]} | {mean} | " + " | ".join(cells) + f" | {spread} |")
    lines.append("")
    lines += [f"- {j.policy}: {j.verdict}" for j in judgements]
    lines += [f"- {default_is_best(j)}" for j in judgements if j.policy == "default"]
    o = run_oracle(result, pool)
    if o is not None:
        per = ", ".join(f"{v:.3f}" for _, v in sorted(o.per_seed.items()))
        lines.append(f"- selection oracle (each phase's best pool member, known in advance): {o.on_mean:.3f} of "
                     f"{o.best_on_mean} on the mean (per seed {per}): "
                     + ("no tuner that only picks among the pool can meet the bar" if o.on_mean > Bar().jct
                        else "a tuner picking among the pool could meet the bar"))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from netapprox.experiments.figures import FINISH_HORIZONS, FIXED_THRESHOLDS, SHIFT_SETTINGS
    ap = argparse.ArgumentParser(prog="python -m netapprox.experiments.hindsight", description=__doc__.split("\n")[0])
    ap.add_argument("result", type=Path, help="result.json of a shifting-workload run (python -m "
                    "netapprox.experiments sim shift)")
    ap.add_argument("--design-seeds", type=int, nargs="*", default=list(DESIGN_SEEDS),
                    help="seeds the policies were designed on (a run on any of them is not judged 'met')")
    ap.add_argument("--seeds", type=int, nargs="*", help="judge on these seeds of the result only (default: all)")
    args = ap.parse_args(argv)
    try:
        result = json.loads(args.result.read_text())
    except (OSError, ValueError) as e:
        print(f"error: {args.result}: {e}", file=sys.stderr)
        return 2
    if not re.fullmatch(r"(sim-)?shift(-.+)?", str(result.get("experiment"))):
        print(f"error: {args.result}: not a shifting-workload result (experiment "
              f"{result.get('experiment')!r})", file=sys.stderr)
        return 2
    if args.seeds:
        result = {**result, "runs": [r for r in result["runs"] if r["seed"] in args.seeds]}
    pool, judgements = judge_run(result, SHIFT_SETTINGS, FIXED_THRESHOLDS, design_seeds=args.design_seeds,
                                 horizons=FINISH_HORIZONS)
    seeds = sorted({r["seed"] for r in result["runs"]})
    print(f"{args.result}: seeds {seeds}, commit {str(result.get('git_commit'))[:10]}")
    print(render(result, pool, judgements))
    return 0


if __name__ == "__main__":
    sys.exit(main())
