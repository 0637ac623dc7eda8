"""The online tuner (policy mode ``adaptive``): cutoffs, buffers and the reference work from what jobs report
(``controller.tuning``), the remaining-work estimate and the placement it drives (``controller.policy``), the
operator's limits in the config, and the core writing the tuned tables. The recorded report streams are in
``tests/controller/test_ctl_tuning_recorded.py``."""
from __future__ import annotations


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netapprox.controller import policy, tuning
from netapprox.controller.config import (
    ReportConfig,
    SwitchConfig,
    TuningConfig,
    config_from_dict,
)
from netapprox.controller.core import ControllerCore
from netapprox.controller.errors import ConfigError
from netapprox.controller.model import DEFAULT_THRESHOLDS, check_thresholds, default_tlr_rules
from netapprox.controller.tuning import JobSample, Tuned, cutoffs, queue_of, share_buffers, tune
from netapprox.hostlib.wire import Report
from support.paper_policy import ControllerConfig, PolicyConfig

CFG = TuningConfig()
Q = tuning.VALUE_QUANTUM


def placed(values_loads) -> list:
    """Samples at given placement values (TLR only: no remaining work known)."""
    return [tuning._Placed(i + 1, v, w, v, 0.0) for i, (v, w) in enumerate(values_loads)]


def sample(job: int, tlr: float, load: float = 1e9, work: float | None = None, loss: float = 0.0,
           qid: int | None = None) -> JobSample:
    return JobSample(job, tlr, work, load, loss, qid)


# --- cutoffs ----------------------------------------------------------------------------------------------

def test_tuner_keeps_the_configured_grid_while_the_jobs_fit_it():
    cuts = cutoffs(placed([(0.1, 40e9), (0.3, 1e9), (0.55, 20e9)]), CFG)
    assert [queue_of(v, cuts) for v in (0.1, 0.3, 0.55)] == [1, 2, 4]  # k/8 as the paper places them
    assert cuts[2:] == pytest.approx(DEFAULT_THRESHOLDS[2:])


def test_tuner_splits_jobs_that_share_a_queue_of_the_grid_and_moves_a_cutoff_out_of_a_group():
    # 0.05 and 0.16 both lie in k/8's queue 1 but a gap of 1/16 and more apart: queue 1 and queue 2; the group
    # at 0.3 then goes one down, to queue 3
    cuts = cutoffs(placed([(0.05, 1e9), (0.16, 1e9), (0.3, 1e9)]), CFG)
    assert [queue_of(v, cuts) for v in (0.05, 0.16, 0.3)] == [1, 2, 3]
    # values closer than split_gap are one group, never split, even across a threshold of the grid (0.25)
    group = [(0.22, 1e9), (0.24, 1e9), (0.26, 1e9), (0.28, 1e9)]
    cuts = cutoffs(placed(group), CFG)
    assert {queue_of(v, cuts) for v, _ in group} == {queue_of(0.25, DEFAULT_THRESHOLDS)}
    assert not any(0.22 < t <= 0.28 for t in cuts)


def test_tuner_keeps_the_grid_where_many_jobs_leave_no_gap():
    # 13 jobs 0.04 apart from 0 to 0.48: neighbours closer than split_gap chain into one run of values across
    # four queues of k/8; the grid's queues part it (one group of it all would be one queue for every job)
    values = [(0.04 * i, 1e9) for i in range(13)]
    cuts = cutoffs(placed(values), CFG)
    assert [queue_of(v, cuts) for v, _ in values] == [queue_of(v, DEFAULT_THRESHOLDS) for v, _ in values]
    # a run that reaches across one cutoff of the grid only stays one group (moved out of it, as above)
    values = [(0.2 + 0.04 * i, 1e9) for i in range(4)]
    assert len({queue_of(v, cutoffs(placed(values), CFG)) for v, _ in values}) == 1


def test_tuner_merges_the_closest_groups_when_there_are_more_than_queues():
    values = [(0.0 + 0.1 * i, 1e9) for i in range(10)]  # ten groups 0.1 apart
    cuts = cutoffs(placed(values), CFG)
    qs = [queue_of(v, cuts) for v, _ in values]
    assert qs == sorted(qs) and len(set(qs)) == 7 and qs[0] == 1 and qs[-1] == 7


def test_tuner_never_splits_jobs_of_equal_value():
    values = [(0.2, 1e9)] * 30 + [(0.6, 1e9)] * 30 + [(0.2 + Q / 3, 1e9)]  # within the quantum: the same value
    cuts = cutoffs(placed(values), CFG)
    assert len({queue_of(v, cuts) for v, _ in values if v < 0.5}) == 1
    assert len({queue_of(v, cuts) for v, _ in values if v > 0.5}) == 1


limits = st.tuples(st.floats(-2, 0.5), st.floats(0.1, 3.0), st.sampled_from([1 / 4096, 1 / 256, 1 / 128, 1 / 32]))


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.tuples(st.floats(-3, 4), st.floats(0, 1e11)), max_size=40), lim=limits)
def test_tuner_cutoffs_stay_within_the_operators_limits(values, lim):
    lo, span, gap = lim
    cfg = TuningConfig(min_threshold=lo, max_threshold=lo + span + 6 * gap, min_gap=gap)
    vmin, vmax = tuning.value_range(cfg)
    vals = [(min(max(v, vmin), vmax), w) for v, w in values]
    cuts = cutoffs(placed(vals), cfg)
    inner = cuts[2:]
    assert all(lo < t <= cfg.max_threshold for t in inner)
    assert all(b - a >= gap - 1e-12 for a, b in zip(inner, inner[1:]))
    assert cuts[0] <= cuts[1] < cuts[2]
    check_thresholds(tuning.table_thresholds(cuts))  # always a valid queue_by_tlr table
    qs = [queue_of(v, cuts) for v, _ in sorted(vals)]
    assert qs == sorted(qs)  # a higher value never goes to a higher-priority queue


def test_tuning_table_thresholds_place_a_tlr_as_the_cutoffs_do():
    """A packet of a job the controller has not placed is queued by its TLR in queue_by_tlr: the same queue the
    cutoffs give that TLR (cutoffs below 0 or above 1 are brought just inside: the last few Q1.15 steps below 1.0
    then take the queues whose cutoffs lie above 1)."""
    cuts = (-1.0, -1.0, -0.3, 0.2, 0.45, 0.9, 1.2, 1.4)
    table = tuning.table_thresholds(cuts)
    rules = default_tlr_rules(table)
    for value in range(0, 0x8001, 5):
        tlr = value / 0x8000
        if abs(tlr - 0.2) < 2 * Q or abs(tlr - 0.45) < 2 * Q or abs(tlr - 0.9) < 2 * Q or tlr < 4 * Q \
                or tlr > 1 - 4 * Q:
            continue  # rounding to Q1.15 at a boundary
        assert next(r.qid for r in rules if r.tlr_lo <= value <= r.tlr_hi) == queue_of(tlr, cuts), tlr


def test_tuning_hysteresis_keeps_the_cutoffs_while_the_values_wobble():
    # two groups inside k/8's queue 1 (0.01 and 0.12): split, the cutoff as near k/8's T_2 (0.25) as the upper
    # group lets it (just below it)
    state, change = tune([sample(1, 0.01), sample(2, 0.12), sample(3, 0.7)], Tuned(DEFAULT_THRESHOLDS), CFG)
    assert change is not None and change.new_cutoffs == state.cutoffs
    assert 0.118 < state.cutoffs[2] < 0.12
    for wobble in (0.005, -0.01, 0.015, -0.015):  # the cutoff would move by less than the hysteresis; the jobs
        # stay in their queues (the policy's hysteresis band), so the buffers stay too
        again, change = tune([sample(1, 0.01, qid=1), sample(2, 0.12 + wobble, qid=2), sample(3, 0.7, qid=5)],
                             state, CFG)
        assert change is None and again.cutoffs == state.cutoffs
    # a job moving further (0.08 > hysteresis) keeps the cutoffs while they still part the groups: nothing to fix
    kept, change = tune([sample(1, 0.01), sample(2, 0.2), sample(3, 0.7)], state, CFG)
    assert change is None and kept.cutoffs == state.cutoffs
    # a new job at 0.09 makes one group with job 2 (0.125), which the cutoff in effect (0.119) splits: rewritten,
    # the cutoff just below the group
    moved, change = tune([sample(1, 0.01), sample(2, 0.125), sample(4, 0.09), sample(3, 0.7)], state, CFG)
    assert change is not None and 0.088 < moved.cutoffs[2] < 0.09


def test_tuning_without_live_jobs_changes_nothing():
    state = Tuned(DEFAULT_THRESHOLDS)
    assert tune([], state, CFG) == (state, None)


# --- buffers ----------------------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1e11), st.floats(0, 1)), max_size=30),
       bounds=st.tuples(st.integers(1, 3), st.integers(3, 40)))
def test_tuner_buffers_add_up_and_stay_within_bounds(values, bounds):
    lo, hi = bounds
    total = min(7 * hi, max(7 * lo, 28))
    cfg = TuningConfig(buffer_min=lo, buffer_max=hi, buffer_total=total)
    samples = [tuning._Placed(i, v, w, 0.1, loss) for i, (v, w, loss) in enumerate(values)]
    cuts = cutoffs(samples, cfg)
    buffers, load, jobs = share_buffers(samples, cuts, cfg)
    assert len(buffers) == 7 and sum(buffers) == total and all(lo <= b <= hi for b in buffers)
    assert sum(jobs) == len(values)


def test_tuner_buffers_go_where_the_load_and_the_loss_are():
    samples = [tuning._Placed(1, 0.1, 30e9, 0.1, 0.3), tuning._Placed(2, 0.5, 5e9, 0.5, 0.0)]
    cuts = cutoffs(samples, CFG)
    buffers, load, jobs = share_buffers(samples, cuts, CFG)
    assert jobs == (1, 0, 0, 1, 0, 0, 0)
    # the queues with jobs keep at least their k-MTU buffers (7 and 4); what the five empty queues do not need
    # (all but one packet each: 6 + 5 + 3 + 2 + 1 - 5 = 12) goes to them, more to queue 1 (more load, loss)
    assert buffers[1:3] == (1, 1) and buffers[4:] == (1, 1, 1) and buffers[0] + buffers[3] == 7 + 4 + 12
    assert buffers[0] - 7 > buffers[3] - 4 > 0


# --- remaining work and placement ---------------------------------------------------------------------------

def test_tuning_remaining_work_is_messages_left_times_what_one_costs():
    r = policy.next_group_report(None, 0.0, tlr=0.1, loss=0.0, rate_bps=8e6, msr=0.9, total=100, delivered=0,
                                 lost=0)
    assert policy.remaining_work({0: r}) is None  # nothing resolved yet: no cost per message known
    r = policy.next_group_report(r, 0.001, tlr=0.1, loss=0.0, rate_bps=8e6, msr=0.9, total=100, delivered=10,
                                 lost=0)
    assert r.remaining == 80 and r.resolved == 10
    assert r.message_bytes == pytest.approx(100.0)  # 8 Mbit/s for 1 ms = 1,000 bytes over 10 messages
    assert policy.remaining_work({0: r}) == pytest.approx(8000.0)
    # larger messages later (MRDF sends the smallest first): the estimate follows, a quarter per sample
    r = policy.next_group_report(r, 0.002, tlr=0.1, loss=0.0, rate_bps=8e6, msr=0.9, total=100, delivered=12,
                                 lost=0)
    assert r.message_bytes == pytest.approx(100.0 + 0.25 * (500.0 - 100.0))
    # a report with nothing resolved carries the bytes over to the next resolution
    r2 = policy.next_group_report(r, 0.003, tlr=0.1, loss=0.0, rate_bps=8e6, msr=0.9, total=100, delivered=12,
                                  lost=0)
    assert r2.message_bytes == r.message_bytes and r2.unresolved_bytes == pytest.approx(1000.0)
    done = policy.next_group_report(r2, 0.004, tlr=1.0, loss=0.0, rate_bps=8e6, msr=0.9, total=100, delivered=90,
                                    lost=0)
    assert done.remaining == 0 and policy.remaining_work({0: done}) == 0.0


def test_tuning_placement_moves_a_job_up_one_step_per_halving_of_its_remaining_work():
    w, band = 0.125, 1.0
    assert tuning.placement_value(0.3, 250, 1000, w, deadband=band) == pytest.approx(0.3 - 1 * w)  # 2 halvings
    assert tuning.placement_value(0.3, 125, 1000, w, deadband=band) == pytest.approx(0.3 - 2 * w)
    assert tuning.placement_value(0.3, 600, 1000, w, deadband=band) == 0.3  # within the deadband
    assert tuning.placement_value(0.3, 4000, 1000, w, deadband=band) == 0.3  # more work left: never down
    assert tuning.placement_value(0.3, None, 1000, w) == 0.3  # unknown work: the TLR
    assert tuning.placement_value(0.3, 250, None, w) == 0.3  # no reference yet
    assert tuning.placement_value(0.3, 250, 1000, 0.0) == 0.3  # weight 0 (the default): the TLR alone
    cfg = TuningConfig(remaining_weight=w)
    lo, hi = tuning.value_range(cfg)
    assert tuning.placement_value(0.3, 1.0, 1e12, w, (lo, hi)) == lo


def test_demote_weight_moves_a_job_with_more_work_left_down():
    """``demote_weight``: each doubling above the reference (beyond the deadband) adds it; below, only
    ``remaining_weight`` moves; both 0 (the defaults): the TLR."""
    assert tuning.placement_value(0.3, 4000, 1000, 0.0, demote=0.25) == pytest.approx(0.3 + 2 * 0.25)
    assert tuning.placement_value(0.3, 4000, 1000, 0.0, deadband=1.0, demote=0.25) == pytest.approx(0.3 + 0.25)
    assert tuning.placement_value(0.3, 250, 1000, 0.0, demote=0.25) == 0.3
    assert tuning.placement_value(0.3, 250, 1000, 0.125, demote=0.25) == pytest.approx(0.3 - 2 * 0.125)
    assert tuning.placement_value(0.3, 1e12, 1.0, 0.0, (-1.0, 1.5), demote=1.0) == 1.5
    cfg = TuningConfig(demote_weight=0.25, remaining_deadband=0.0)
    assert tuning.value_of(0.3, 2000, 1000, cfg) == pytest.approx(0.55, abs=1 / 1024)  # quantized
    assert tuning.value_of(0.3, 2000, 1000, TuningConfig()) == 0.3


def test_tuning_reference_work_is_the_load_weighted_median():
    samples = [sample(1, 0.1, 1e9, 1000.0), sample(2, 0.1, 1e9, 5000.0), sample(3, 0.1, 5e9, 9000.0),
               sample(4, 0.1, 1e9, None)]
    assert tuning.work_reference(samples) == 9000.0
    assert tuning.work_reference([sample(1, 0.1)]) is None


def test_tuner_with_remaining_work_puts_a_small_job_above_large_jobs_whatever_their_tlr():
    """Fig. 14's case: two large jobs whose TLR fell (eq. 1 after loss) and a small one at its MSR's TLR, with a
    sixteenth of their work left."""
    samples = [sample(1, 0.0, 40e9, 3.2e6, loss=0.5), sample(2, 0.05, 40e9, 4e6, loss=0.3),
               sample(3, 0.125, 40e9, 2e5)]
    cfg = TuningConfig(remaining_weight=0.125)
    state, change = tune(samples, Tuned(DEFAULT_THRESHOLDS), cfg)
    values = {s.job_id: tuning.value_of(s.tlr, s.work_bytes, state.work_ref, cfg) for s in samples}
    queues = {j: queue_of(v, state.cutoffs) for j, v in values.items()}
    assert queues[3] < queues[1] <= queues[2]
    flat, _ = tune(samples, Tuned(DEFAULT_THRESHOLDS), CFG)  # the default: the TLR alone places
    assert queue_of(0.125, flat.cutoffs) >= queue_of(0.0, flat.cutoffs)  # by TLR it is not above them


# --- configuration ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("table, message", [
    ({"min_threshold": 0.5, "max_threshold": 0.4}, "min_threshold: must be below max_threshold"),
    ({"min_threshold": 0.0, "max_threshold": 0.1, "min_gap": 0.05}, "min_gap: six cutoffs 0.05 apart"),
    ({"buffer_min": 5, "buffer_max": 4}, "buffer_min: must be <= buffer_max"),
    ({"buffer_total": 200, "buffer_max": 16}, "buffer_total: 7 queues of 1..16 packets hold 7..112, got 200"),
    ({"every_epochs": 0}, "every_epochs: expected an integer >= 1"),
    ({"remaining_weight": 2}, "remaining_weight: expected a number >= 0 and <= 1"),
    ({"demote_weight": -0.5}, "demote_weight: expected a number >= 0 and <= 1"),
    ({"max_threshold": 9}, "max_threshold: expected a number >= -4 and <= 5"),
    ({"evry_epochs": 3}, "unknown key 'evry_epochs'. Did you mean 'every_epochs'?"),
])
def test_tuning_limits_out_of_range_are_one_line_errors(table, message):
    with pytest.raises(ConfigError) as e:
        config_from_dict({"policy": {"mode": "adaptive", "tuning": table}}, source="ctl.toml")
    text = str(e.value)
    assert "\n" not in text and text.startswith("ctl.toml: [policy.tuning]") and message in text, text


def test_tuning_limits_from_toml():
    cfg = config_from_dict({"policy": {"mode": "adaptive", "tuning": {
        "every_epochs": 4, "min_threshold": 0.0, "max_threshold": 0.9, "min_gap": 0.05, "hysteresis": 0.03,
        "remaining_weight": 0.0, "buffers": False, "buffer_min": 2, "buffer_max": 10, "buffer_total": 30}}})
    t = cfg.policy.tuning
    assert (t.every_epochs, t.min_threshold, t.max_threshold, t.min_gap, t.hysteresis, t.remaining_weight,
            t.buffers, t.buffer_min, t.buffer_max, t.buffer_total) == (4, 0.0, 0.9, 0.05, 0.03, 0.0, False, 2,
                                                                       10, 30)
    assert PolicyConfig().mode == "netapprox" and PolicyConfig().tuning == TuningConfig()


# --- the core ---------------------------------------------------------------------------------------------

REPORTS = ReportConfig(port=-1, rate_per_host=1e9, burst=10 ** 9)


def report(job: int, seq: int, tlr: float, *, delivered: int, total: int = 1000, msr: float = 0.9,
           rate_kbps: int = 1_000_000, loss: float = 0.0) -> bytes:
    return Report(job_id=job, group_id=0, seq=seq, tlr=tlr, loss=loss, msr=msr, rate_kbps=rate_kbps, total=total,
                  delivered=delivered, lost=0, epoch=seq).encode()


def test_tuning_core_writes_the_tuned_thresholds_and_buffers_to_every_switch():
    cfg = ControllerConfig(switches=(SwitchConfig("s1"), SwitchConfig("s2")), reports=REPORTS, epoch_s=0.01,
                           policy=PolicyConfig(mode="adaptive", tuning=TuningConfig(every_epochs=2)))
    core = ControllerCore(cfg)
    plan = core.step(0.0)
    assert plan.desired["s1"].tlr_rules == default_tlr_rules(DEFAULT_THRESHOLDS)
    assert plan.desired["s1"].queue_buffers == ()  # the targets' own k-MTU buffers until the tuner speaks
    now, seq = 0.0, 0
    for i in range(1, 7):
        now = i * 0.01
        seq += 1
        # three jobs at TLR 0.1 (k/8: all in queue 1); job 3 has ten times the work left of job 1
        for job, per_msg in ((1, 100), (2, 300), (3, 1000)):
            core.ingest(report(job, seq, 0.1, delivered=10 * i, rate_kbps=per_msg * 80), f"10.0.0.{job}", now)
        plan = core.step(now)
    tuned = core.tuned
    assert tuned.buffers and tuned.buffers[0] > 7  # queue 1 carries all three: it gets the empty queues' buffer
    for name in ("s1", "s2"):
        assert plan.desired[name].tlr_rules == default_tlr_rules(tuned.thresholds)
        assert plan.desired[name].queue_buffers == tuned.buffers
    assert dict(plan.assignments) == {1: 1, 2: 1, 3: 1}  # one TLR, one group: the paper's queue 1
    # with the remaining-work placement, the job with a tenth of the others' work left moves up on its own
    cfg = ControllerConfig(switches=(SwitchConfig("s1"),), reports=REPORTS, epoch_s=0.01,
                           policy=PolicyConfig(mode="adaptive", tuning=TuningConfig(every_epochs=2,
                                                                                    remaining_weight=0.125)))
    core = ControllerCore(cfg)
    core.step(0.0)
    for i in range(1, 7):
        for job, per_msg in ((1, 100), (2, 1000), (3, 1000)):
            core.ingest(report(job, i, 0.1, delivered=10 * i, rate_kbps=per_msg * 80), f"10.0.0.{job}", i * 0.01)
        plan = core.step(i * 0.01)
    assert plan.assignments[1] < plan.assignments[2] == plan.assignments[3]


def test_tuning_rewrites_only_when_the_cutoffs_move_and_logs_each_change():
    cfg = ControllerConfig(switches=(SwitchConfig("s1"),), reports=REPORTS, epoch_s=0.01,
                           policy=PolicyConfig(mode="adaptive", tuning=TuningConfig(every_epochs=1)))
    core = ControllerCore(cfg)
    core.step(0.0)
    changes, statics = [], 0
    for i in range(1, 40):
        now = i * 0.01
        tlr = 0.3 + (0.01 if i % 2 else -0.01)  # a TLR wobbling within the hysteresis
        core.ingest(report(1, i, 0.05, delivered=i), "10.0.0.1", now)
        core.ingest(report(2, i, tlr, delivered=i), "10.0.0.2", now)
        plan = core.step(now)
        changes += plan.tuning
        statics += plan.updates["s1"].static
    assert len(changes) == 1 and statics == 1  # one retune when the jobs appeared, none while they wobble
    change = changes[0]
    assert change.new_thresholds == core.tuned.thresholds and change.old_cutoffs == DEFAULT_THRESHOLDS
    log = change.as_log()
    assert log["jobs"] == 2 and log["queue_jobs"][:2] == [1, 1] and len(log["new_thresholds"]) == 8


def test_tuning_paper_mode_keeps_the_fixed_thresholds():
    cfg = ControllerConfig(switches=(SwitchConfig("s1"),), reports=REPORTS, epoch_s=0.01,
                           policy=PolicyConfig(mode="netapprox"))
    core = ControllerCore(cfg)
    for i in range(1, 10):
        core.ingest(report(1, i, 0.05, delivered=i), "10.0.0.1", i * 0.01)
        core.ingest(report(2, i, 0.06, delivered=i), "10.0.0.2", i * 0.01)
        plan = core.step(i * 0.01)
        assert plan.tuning == ()
    assert core.tuned.thresholds == DEFAULT_THRESHOLDS
    assert plan.desired["s1"].tlr_rules == default_tlr_rules() and dict(plan.assignments) == {1: 1, 2: 1}


def test_tuning_ignores_jobs_that_went_quiet_or_met_their_msr():
    cfg = ControllerConfig(switches=(SwitchConfig("s1"),), reports=REPORTS, epoch_s=0.01,
                           policy=PolicyConfig(mode="adaptive", tuning=TuningConfig(every_epochs=1)))
    core = ControllerCore(cfg)
    for i in range(1, 3):  # job 1 reports twice, then goes silent (still placed until its timeout)
        core.ingest(report(1, i, 0.1, delivered=i), "10.0.0.1", i * 0.001)
    core.ingest(report(2, 1, 0.5, delivered=900), "10.0.0.2", 0.0)  # met its MSR: sends surplus, no load
    for i in range(1, 8):
        core.ingest(report(3, i, 0.3, delivered=i), "10.0.0.3", i * 0.01)
        plan = core.step(i * 0.01)
    assert len(core.assignments) == 3
    # only job 3 (TLR 0.3, k/8's queue 2) was read at the last step: queue 2 keeps its buffer and gets what the
    # other queues do not need, up to buffer_max; job 1 (quiet) and job 2 (done) load nothing
    assert core.tuned.buffers == (2, 16, 2, 2, 2, 2, 2)  # buffer_max 16: the rest back to the others


# --- the incremental core against the pure policy ---------------------------------------------------------

class AdaptiveReference:
    """Mode adaptive the straightforward way: every job re-decided by ``policy.decide`` every epoch, the tuner
    run over ``policy.tuning_samples`` every ``every_epochs``."""

    def __init__(self, cfg: PolicyConfig, epoch_s: float) -> None:
        self.cfg, self.epoch_s = cfg, epoch_s
        self.jobs: dict[int, dict[int, policy.GroupReport]] = {}
        self.assignments: dict[int, int] = {}
        self.losing: dict[int, int] = {}
        self.tuned = Tuned(cutoffs=cfg.thresholds, thresholds=cfg.thresholds)
        self.epoch = 0

    def ingest(self, fields, now: float) -> None:
        old = self.jobs.get(fields.job_id, {}).get(fields.group_id)
        self.jobs.setdefault(fields.job_id, {})[fields.group_id] = policy.next_group_report(
            old, now, fields.tlr, fields.loss, fields.rate_kbps * 1000.0, fields.msr, fields.total,
            fields.delivered, fields.lost)

    def step(self, now: float) -> policy.Decision:
        self.epoch += 1
        live = {j: {g: r for g, r in gs.items() if now - r.last_seen < self.cfg.job_timeout_s}
                for j, gs in self.jobs.items()}
        live = {j: gs for j, gs in live.items() if gs}
        retuned = False
        if self.epoch % self.cfg.tuning.every_epochs == 0:
            samples = policy.tuning_samples(live, [j for j, _ in self.cfg.pinned], now, self.epoch_s,
                                            self.assignments)
            self.tuned, change = tune(samples, self.tuned, self.cfg.tuning, self.cfg.thresholds)
            retuned = change is not None
        values = {j: policy.job_value(gs, policy.job_tlr(gs)[0], self.tuned.work_ref, self.cfg, self.epoch_s)
                  for j, gs in live.items()}
        d = policy.decide(self.jobs, self.assignments, now, self.cfg, self.losing, values=values,
                          cutoffs=self.tuned.cutoffs, retuned=retuned)
        self.jobs = {j: dict(g) for j, g in d.live.items()}
        self.assignments, self.losing = dict(d.assignments), dict(d.losing)
        return d


# TLRs and losses that repeat, so that reports also move a job by its remaining work alone
tuning_events = st.lists(st.lists(st.tuples(st.integers(1, 5), st.sampled_from([0.05, 0.3, 0.6]) | st.floats(0, 1),
                                            st.sampled_from([0.0, 0.1]), st.integers(0, 40),
                                            st.integers(1, 50_000)), max_size=5),
                         min_size=1, max_size=30)


@settings(max_examples=100, deadline=None)
@given(epochs=tuning_events, gaps=st.lists(st.sampled_from([0.01, 0.01, 0.02, 0.3]), min_size=30, max_size=30),
       pinned=st.sampled_from([(), ((2, 5),)]), every=st.sampled_from([1, 2, 3]))
def test_incremental_core_tunes_and_places_exactly_as_the_pure_tuner_and_policy(epochs, gaps, pinned, every):
    cfg = PolicyConfig(mode="adaptive", job_timeout_s=0.5, promote_after_epochs=2, pinned=pinned,
                       tuning=TuningConfig(every_epochs=every))
    core = ControllerCore(ControllerConfig(switches=(SwitchConfig("s1"),), policy=cfg, reports=REPORTS,
                                           epoch_s=0.01))
    ref = AdaptiveReference(cfg, 0.01)
    now, seq = 0.0, 0
    delivered: dict[int, int] = {}
    for reports, gap in zip(epochs, gaps):
        for job, tlr, loss, more, rate in reports:
            seq += 1
            delivered[job] = delivered.get(job, 0) + more
            fields = core.ingest(report(job, seq, tlr, delivered=min(delivered[job], 1000), rate_kbps=rate,
                                        loss=loss), "10.0.0.1", now)
            assert fields is not None
            ref.ingest(fields, now)
        plan = core.step(now)
        want = ref.step(now)
        assert core.tuned == ref.tuned
        assert dict(plan.assignments) == dict(want.assignments)
        assert [c for c in plan.changes if c.reason != "held"] == [c for c in want.changes if c.reason != "held"]
        now += gap


def test_tuning_retune_places_jobs_afresh_but_never_moves_a_losing_job_down():
    """A retune places every job by the new cutoffs without the hysteresis band, as a losing job (loss above its
    TLR) never moves down between retunes either: it keeps its queue, or its promotion (Fig. 10)."""
    cuts = (-1.0, -1.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)  # 0.35 goes to queue 4
    jobs = {1: {0: policy.GroupReport(0.35, 0.0, loss=0.01)},   # within its TLR: re-placed, down to queue 4
            2: {0: policy.GroupReport(0.35, 0.0, loss=0.60)},   # losing: stays in queue 2
            3: {0: policy.GroupReport(0.05, 0.0, loss=0.60)}}   # losing, placed higher: moves up to queue 1
    d = policy.decide(jobs, {1: 2, 2: 2, 3: 3}, 0.0, PolicyConfig(mode="adaptive"), cutoffs=cuts, retuned=True)
    assert dict(d.assignments) == {1: 4, 2: 2, 3: 1}
    assert {c.job_id: c.reason for c in d.changes} == {1: "tuned", 3: "tuned"}
    placer = policy.Placer(PolicyConfig(mode="adaptive"), cuts)  # the incremental core's placer: the same
    assert [placer.place(0.35, 0.01, 2, 0, retuned=True)[0], placer.place(0.35, 0.60, 2, 0, retuned=True)[0],
            placer.place(0.05, 0.60, 3, 0, retuned=True)[0]] == [4, 2, 1]
