"""The shifting workload's judge (experiments.hindsight): a policy is held against the best of every fixed
configuration the run contains, per seed and on the mean, and "met" needs every seed to agree."""
from __future__ import annotations

import json

import pytest

from netapprox.experiments import figures as F
from netapprox.experiments import hindsight as H
from netapprox.experiments import results as R

HELD_OUT = [max(H.DESIGN_SEEDS) + i for i in (1, 2, 3)]
"""Seeds no policy was designed on or judged with yet."""


def _is_fixed_by_hand(setting: str) -> bool:
    """Independently of the harness: a setting is fixed unless its keys ask for mode ``adaptive``."""
    return dict(F.SHIFT_SETTINGS[setting]).get("mode") != "adaptive"


def _by(jcts: dict[str, list[float]], phases: dict[str, list[float]] | None = None, msr: float = 1.0):
    """(setting, seed) -> metrics: ``jcts[setting][i]`` is seed i+1's mean JCT; each phase the same unless
    ``phases`` says."""
    out = {}
    for s, vals in jcts.items():
        for i, v in enumerate(vals):
            ph = (phases or {}).get(s, [v] * len(vals))[i]
            out[(s, i + 1)] = {"jct_mean_s": v, "msr_met_frac": msr,
                               **{k: (ph if k == "jct_fbkv_heavy_s" else v) for k in H.PHASE_KEYS}}
    return out


def test_baseline_pool_holds_every_fixed_setting_the_run_contains():
    """Every setting of the default run that moves nothing online is a baseline: the default, each threshold set
    without and with the finishing rule; only the tuner is not; and no grid configuration is missing."""
    pool = H.baseline_pool(F.SHIFT_RUN, F.SHIFT_SETTINGS)
    assert set(pool) == {s for s in F.SHIFT_RUN if _is_fixed_by_hand(s)}
    assert "default" in pool and "adaptive" not in pool
    assert {f"fixed-{n}" for n in F.FIXED_THRESHOLDS} <= set(pool)
    assert H.grid_missing(F.SHIFT_RUN, F.SHIFT_SETTINGS, F.FIXED_THRESHOLDS, F.FINISH_HORIZONS) == []
    # every finishing horizon the tuner's finish_ref moves between is a baseline (or the default)
    default = H.resolved(F.SHIFT_SETTINGS["default"])
    for name, epochs in F.FINISH_HORIZONS.items():
        for e in epochs:
            assert f"finish{e:g}-{name}" in pool or H.resolved(F.SHIFT_SETTINGS[f"finish{e:g}-{name}"]) == default
    # every finishing set is in the run, as itself or as the default it equals
    for name in F.FIXED_THRESHOLDS:
        assert f"finish-{name}" in pool or (H.resolved(F.SHIFT_SETTINGS[f"finish-{name}"])
                                            == H.resolved(F.SHIFT_SETTINGS["default"]))


def test_baseline_pool_takes_any_other_fixed_knob_and_no_online_one():
    """A fixed setting of any other knob (hysteresis, buffers of the tuner turned off) is a baseline; a tuner
    variant (mode adaptive, whatever it turns off) is not."""
    table = {**F.SHIFT_SETTINGS, "fixed-k8-wide-band": (("thresholds", F.FIXED_THRESHOLDS["k8"]), ("hysteresis", 0.1))}
    run = ("adaptive", "fixed-k8-wide-band", "k8-srpt-only", "fixed-k8")
    assert H.baseline_pool(run, table) == ("fixed-k8-wide-band", "fixed-k8")
    missing = H.grid_missing(run, table, F.FIXED_THRESHOLDS)
    assert "finish-k8" in missing and "fixed-k8" not in missing


def test_best_fixed_in_hindsight_is_a_finishing_set_when_one_wins():
    """The best fixed configuration is chosen among all of them: here a set with the finishing rule, which a
    pool of the ``fixed-*`` settings alone would miss (the tuner would look 0.8x of it instead of 1.0x)."""
    by = _by({"adaptive": [200, 200, 200], "fixed-k8": [250, 250, 250], "finish-msr-classes": [200, 210, 190],
              "default": [230, 230, 230]})
    j = H.judge(by, "adaptive", ["default", "fixed-k8", "finish-msr-classes"], [1, 2, 3])
    mean = j.criteria[0]
    assert mean.best_on_mean == "finish-msr-classes" and mean.on_mean == pytest.approx(1.0)
    assert mean.per_seed[2] == (pytest.approx(200 / 210), "finish-msr-classes")
    assert mean.state == "not met" and j.verdict.startswith("not met")


def test_best_fixed_per_seed_may_differ_from_the_best_on_the_mean():
    """Per seed, the policy is held against that seed's best pool member, not the mean's."""
    by = _by({"adaptive": [80, 80, 80], "a": [100, 100, 100], "b": [90, 120, 120]})
    c = H.judge(by, "adaptive", ["a", "b"], [1, 2, 3]).criteria[0]
    assert c.best_on_mean == "a" and c.on_mean == pytest.approx(0.8)
    assert c.per_seed[1] == (pytest.approx(80 / 90), "b") and c.per_seed[2] == (pytest.approx(0.8), "a")
    lo, hi, sd = c.spread
    assert (lo, hi) == (pytest.approx(0.8), pytest.approx(80 / 90)) and sd > 0


def test_hindsight_refuses_met_from_the_mean_when_seeds_disagree():
    """0.85 on the mean, but one seed at 1.02: the verdict says so and is not "met"; all seeds at 0.85 with every
    phase within 5% is met."""
    by = _by({"adaptive": [85, 85, 102], "fixed-k8": [100, 100, 100]})
    by[("adaptive", 3)]["jct_mean_s"] = 102
    by[("adaptive", 1)]["jct_mean_s"] = by[("adaptive", 2)]["jct_mean_s"] = 70  # mean 80.7 / 100
    j = H.judge(by, "adaptive", ["fixed-k8"], [1, 2, 3])
    assert j.criteria[0].state == "disagree"
    assert j.verdict != "met" and "not in every seed" in j.verdict
    ok = H.judge(_by({"adaptive": [85, 85, 85], "fixed-k8": [100, 100, 100]}), "adaptive", ["fixed-k8"], [1, 2, 3])
    assert ok.verdict == "met"
    phase_bad = _by({"adaptive": [85, 85, 85], "fixed-k8": [100, 100, 100]}, phases={"adaptive": [106, 106, 106]})
    assert "fbkv_heavy" in H.judge(phase_bad, "adaptive", ["fixed-k8"], [1, 2, 3]).verdict
    missed = _by({"adaptive": [85, 85, 85], "fixed-k8": [100, 100, 100]}, msr=0.99)
    assert "MSR" in H.judge(missed, "adaptive", ["fixed-k8"], [1, 2, 3]).verdict


def _shift_result(tmp_path, settings, seeds, jct=None):
    rf = R.ResultFile("sim-shift", {}, seeds, tmp_path)
    for seed in seeds:
        for i, s in enumerate(settings):
            v = (jct or {}).get(s, 100.0 + i)
            rf.add(seed, {"setting": s}, {"jct_mean_s": v, "msr_met_frac": 1.0, **{k: v for k in H.PHASE_KEYS}},
                   progress=False)
    return rf


def test_shift_figure_notes_the_whole_baseline_pool_and_judges_against_it(tmp_path):
    """exp_shift's ratios: the notes hold every fixed setting of the run as the pool, the best on the mean is a
    finishing set when it wins, and the default/best-fixed and adaptive/best-fixed rows are against it."""
    settings = F.SHIFT_RUN
    rf = _shift_result(tmp_path, settings, HELD_OUT, {"finish-msr-classes": 50.0, "adaptive": 60.0})
    F.best_fixed_ratios(rf, settings)
    note = rf.notes[-1]
    assert set(note["baseline_pool"]) == {s for s in settings if _is_fixed_by_hand(s)}
    assert note["best_fixed_in_hindsight"]["jct_mean_s"] == "finish-msr-classes"
    rows = {(r["params"]["setting"], r["seed"]): r["metrics"] for r in rf.runs}
    assert rows[("adaptive/best-fixed", HELD_OUT[0])]["jct_mean_ratio"] == pytest.approx(60 / 50)
    assert note["judgements"]["adaptive"]["verdict"].startswith("not met")


def test_hindsight_does_not_judge_design_seeds_or_an_incomplete_pool(tmp_path):
    """A run on design seeds, or without one of the grid's fixed configurations, is reported as such, never met."""
    settings = F.SHIFT_RUN
    good = {"adaptive": 10.0}
    for spent in ([1, 2, 3], [10, 11, 12]):  # designed on; judged an earlier design
        rf = _shift_result(tmp_path, settings, spent, good)
        _, js = H.judge_run(rf.to_dict(), F.SHIFT_SETTINGS, F.FIXED_THRESHOLDS)
        assert all(j.verdict.startswith("not judged") and "design seeds" in j.verdict for j in js)
    partial = [s for s in settings if s != "finish-k10"]
    rf = _shift_result(tmp_path, partial, HELD_OUT, good)
    _, js = H.judge_run(rf.to_dict(), F.SHIFT_SETTINGS, F.FIXED_THRESHOLDS)
    assert all("finish-k10" in j.verdict for j in js)
    horizon = next(s for s in settings if s.startswith("finish") and s[6:7].isdigit())
    partial = [s for s in settings if s != horizon]
    rf = _shift_result(tmp_path, partial, HELD_OUT, good)
    _, js = H.judge_run(rf.to_dict(), F.SHIFT_SETTINGS, F.FIXED_THRESHOLDS, horizons=F.FINISH_HORIZONS)
    assert all(horizon in j.verdict and j.verdict.startswith("not judged") for j in js)
    rf = _shift_result(tmp_path, settings, HELD_OUT, good)
    _, js = H.judge_run(rf.to_dict(), F.SHIFT_SETTINGS, F.FIXED_THRESHOLDS)
    assert {j.policy: j.verdict for j in js}["adaptive"] == "met"


def test_hindsight_cli_prints_ratios_and_rejects_bad_input(tmp_path, capsys):
    rf = _shift_result(tmp_path, F.SHIFT_RUN, HELD_OUT, {"adaptive": 10.0})
    path = rf.write()
    assert H.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert f"seed {HELD_OUT[0]}" in out and "- adaptive: met" in out and "Baseline pool" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert H.main([str(bad)]) == 2
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"experiment": "sim-alltoall", "runs": []}))
    assert H.main([str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "not a shifting-workload result" in err


def test_the_default_as_the_best_fixed_configuration_is_checked_per_seed_too():
    """The bar's other branch: the default best on the mean and in every seed is met; best on the mean but not in
    a seed says so; another configuration best on the mean is not met, naming it and the ratio."""
    pool = ["default", "finish-k8"]
    met = H.judge(_by({"default": [90, 90, 90], "finish-k8": [100, 100, 100]}), "default", pool, [1, 2, 3])
    assert H.default_is_best(met).endswith("met (best on the mean: yes; best in 3 of 3 seeds)")
    mean_only = H.judge(_by({"default": [90, 90, 105], "finish-k8": [100, 100, 100]}), "default", pool, [1, 2, 3])
    assert "met on the mean only" in H.default_is_best(mean_only) and "best in 2 of 3" in H.default_is_best(mean_only)
    other = H.judge(_by({"default": [110, 90, 110], "finish-k8": [100, 100, 100]}), "default", pool, [1, 2, 3])
    text = H.default_is_best(other)
    assert ": not met (best on the mean: no, 1.033 of finish-k8; best in 1 of 3 seeds)" in text
    spent = H.judge(_by({"default": [90, 90, 90], "finish-k8": [100, 100, 100]}), "default", pool, [1, 2, 3],
                    problems=["seeds [1, 2, 3] are design seeds, not held-out"])
    assert "not judged" in H.default_is_best(spent)


def _with_phases(by, phase_jcts: dict[str, list[tuple[float, float, float]]], jobs=(10, 20, 10)):
    """``by`` with each setting's per-seed phase means from ``phase_jcts`` and its overall mean their job-weighted
    mean (``jobs`` per phase)."""
    for s, per_seed in phase_jcts.items():
        for i, ph in enumerate(per_seed):
            m = by[(s, i + 1)]
            m.update(dict(zip(H.PHASE_KEYS, ph)), **dict(zip(H.PHASE_JOBS, jobs)))
            m["jct_mean_s"] = sum(n * v for n, v in zip(jobs, ph)) / sum(jobs)
    return by


def test_selection_oracle_takes_each_phase_best_weighted_by_its_jobs():
    """Two configurations, each best in different phases: the oracle runs every phase under its best, weighted
    by the phase's jobs; against the best single one per seed and on the mean. With one configuration best in
    every phase the oracle is that configuration (1.0)."""
    a, b = (100.0, 200.0, 100.0), (150.0, 100.0, 150.0)
    by = _with_phases(_by({"a": [0, 0], "b": [0, 0]}), {"a": [a, a], "b": [b, b]})
    o = H.selection_oracle(by, ["a", "b"], [1, 2])
    # a: (1000 + 4000 + 1000) / 40 = 150, b: (1500 + 2000 + 1500) / 40 = 125; the oracle (1000 + 2000 + 1000) / 40
    assert o.best_on_mean == "b" and o.on_mean == pytest.approx(100 / 125)
    assert o.per_seed == {1: pytest.approx(0.8), 2: pytest.approx(0.8)}
    same = _with_phases(_by({"a": [0], "b": [0]}), {"a": [a], "b": [tuple(2 * v for v in a)]})
    assert H.selection_oracle(same, ["a", "b"], [1]).on_mean == pytest.approx(1.0)
    del by[("b", 2)]["jobs_mix_web"]
    assert H.selection_oracle(by, ["a", "b"], [1, 2]) is None  # a count missing: no oracle, never a guess


def test_phase_jobs_are_counted_from_the_trials_when_the_metrics_lack_them():
    """A result written before its metrics carried per-phase job counts: each finished job counts in the phase its
    start falls in (the result's phases); an unfinished one in none."""
    phases = [{"name": n, "start": i * 1.0, "duration": 1.0} for i, n in enumerate(("fbkv_heavy", "fbhd_heavy",
                                                                                     "mix_web"))]
    jobs = [{"start_s": t, "jct_s": None if t == 2.5 else 1e-4} for t in (0.1, 0.9, 1.0, 2.2, 2.5, 3.4)]
    result = {"config": {"phases": phases}, "runs": [{"seed": 16, "params": {"setting": "a"},
                                                      "metrics": {"jct_mean_s": 1e-4}, "raw": {"jobs": jobs}}]}
    assert H.phase_jobs(result) == {("a", 16): {"jobs_fbkv_heavy": 2, "jobs_fbhd_heavy": 1, "jobs_mix_web": 2}}
    assert H.phase_jobs({"config": {}, "runs": result["runs"]}) == {}
