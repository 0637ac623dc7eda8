"""The pure policy: thresholds, hysteresis, most-conservative group, expiry, CadentFlow tag rules."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netapprox.controller import policy
from netapprox.controller import config
from netapprox.controller.config import CadentFlow, SwitchConfig, TaggedFlow
from netapprox.controller.model import POLICY_THRESHOLDS, EcnRule, JobRule, Route, TagRule, default_tlr_rules
from netapprox.controller.model import queue_for_tlr
from netapprox.controller.policy import GroupReport, decide
from support.paper_policy import PolicyConfig

DEFAULT = PolicyConfig()
NO_HYST = PolicyConfig(hysteresis=0.0)


@pytest.mark.parametrize("tlr, qid", [
    (0.0, 1), (0.05, 1), (0.124, 1), (0.125, 1), (0.2499, 1), (0.25, 2), (0.374, 2), (0.375, 3),
    (0.5, 4), (0.625, 5), (0.75, 6), (0.874, 6), (0.875, 7), (1.0, 7),
])
def test_queue_for_tlr_default_thresholds(tlr, qid):
    assert queue_for_tlr(tlr, DEFAULT.thresholds) == qid


def test_queue_for_tlr_agrees_with_the_installed_tlr_table():
    """The policy and the queue_by_tlr entries must map every Q1.15 TLR to the same queue."""
    rules = default_tlr_rules()
    for value in range(0, 0x8001, 7):
        table_qid = next(r.qid for r in rules if r.tlr_lo <= value <= r.tlr_hi)
        assert queue_for_tlr(value / 0x8000, DEFAULT.thresholds) == table_qid, value


def test_default_policy_is_the_best_fixed_configuration_with_its_tlr_table():
    """The default ``[policy]``: ``POLICY_THRESHOLDS`` (finish-high-fine of the shifting workload) with the
    finishing rule, and the ``queue_by_tlr`` entries it installs map every Q1.15 TLR as it places jobs."""
    cfg = config.PolicyConfig()
    assert cfg.thresholds == POLICY_THRESHOLDS == (0.0, 0.3, 0.45, 0.6, 0.7, 0.8, 0.875, 0.95)
    assert cfg.finish_epochs == 64.0 and cfg.mode == "netapprox"
    rules = policy.static_state(SwitchConfig(name="s1"), cfg).tlr_rules
    for value in range(0, 0x8001, 7):
        table_qid = next(r.qid for r in rules if r.tlr_lo <= value <= r.tlr_hi)
        assert queue_for_tlr(value / 0x8000, cfg.thresholds) == table_qid, value
    assert queue_for_tlr(0.449, cfg.thresholds) == 1 and queue_for_tlr(0.45, cfg.thresholds) == 2
    assert queue_for_tlr(0.96, cfg.thresholds) == 7


def test_custom_thresholds():
    thresholds = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8)
    assert queue_for_tlr(0.005, thresholds) == 1
    assert queue_for_tlr(0.03, thresholds) == 2
    assert queue_for_tlr(0.05, thresholds) == 3
    assert queue_for_tlr(0.9, thresholds) == 7


def jobs_at(now: float, **tlrs: float) -> dict[int, dict[int, GroupReport]]:
    return {int(k[1:]): {0: GroupReport(v, now)} for k, v in tlrs.items()}


def test_new_job_gets_the_queue_of_its_tlr_and_is_logged_as_new():
    d = decide(jobs_at(0.0, j1=0.3, j2=0.9), {}, 0.0, DEFAULT)
    assert dict(d.assignments) == {1: 2, 2: 7}
    assert [(c.job_id, c.reason, c.new_qid) for c in d.changes] == [(1, "new", 2), (2, "new", 7)]


def test_hysteresis_holds_near_the_boundary_and_moves_beyond_it():
    cfg = PolicyConfig(hysteresis=0.02)
    # job in queue 2 ([0.25, 0.375)); TLR just above the upper boundary: held
    d = decide(jobs_at(0.0, j1=0.38), {1: 2}, 0.0, cfg)
    assert d.assignments[1] == 2
    assert [(c.reason, c.old_qid, c.new_qid) for c in d.changes] == [("held", 2, 2)]
    # beyond boundary + hysteresis: moves
    d = decide(jobs_at(0.0, j1=0.40), {1: 2}, 0.0, cfg)
    assert d.assignments[1] == 3
    assert d.changes[0].reason == "moved"
    # just below the lower boundary: held; far below: moves
    assert decide(jobs_at(0.0, j1=0.24), {1: 2}, 0.0, cfg).assignments[1] == 2
    assert decide(jobs_at(0.0, j1=0.20), {1: 1}, 0.0, cfg).assignments[1] == 1
    assert decide(jobs_at(0.0, j1=0.20), {1: 2}, 0.0, cfg).assignments[1] == 1
    # without hysteresis the same inputs move
    assert decide(jobs_at(0.0, j1=0.38), {1: 2}, 0.0, NO_HYST).assignments[1] == 3


@given(st.lists(st.floats(min_value=0.36, max_value=0.39), min_size=1, max_size=50))
def test_hysteresis_no_flapping_while_tlr_wobbles_across_a_boundary(tlrs):
    """TLR oscillating within +-hysteresis of the 0.375 boundary never changes the queue once assigned."""
    cfg = PolicyConfig(hysteresis=0.02)
    prev = {1: 2}
    for i, tlr in enumerate(tlrs):
        prev = dict(decide(jobs_at(float(i), j1=tlr), prev, float(i), cfg).assignments)
        assert prev == {1: 2}


def test_job_with_several_groups_uses_the_lowest_tlr():
    jobs = {4: {0: GroupReport(0.9, 0.0), 1: GroupReport(0.3, 0.0), 2: GroupReport(0.6, 0.0)}}
    d = decide(jobs, {}, 0.0, DEFAULT)
    assert d.assignments[4] == 2
    assert (d.changes[0].tlr, d.changes[0].group_id) == (0.3, 1)


def test_stale_group_is_forgotten_and_no_longer_pins_the_job():
    cfg = PolicyConfig(job_timeout_s=1.0, hysteresis=0.0)
    jobs = {4: {0: GroupReport(0.9, 10.0), 1: GroupReport(0.1, 8.5)}}
    d = decide(jobs, {4: 1}, 10.0, cfg)
    assert set(d.live[4]) == {0}
    assert d.assignments[4] == 7


def test_job_expires_after_timeout_and_is_reported_as_expired():
    cfg = PolicyConfig(job_timeout_s=1.0)
    jobs = {1: {0: GroupReport(0.3, 0.0)}, 2: {0: GroupReport(0.6, 0.5)}}
    d = decide(jobs, {1: 2, 2: 4}, 1.2, cfg)
    assert dict(d.assignments) == {2: 4}
    assert 1 not in d.live
    assert [(c.job_id, c.reason, c.old_qid, c.new_qid) for c in d.changes] == [(1, "expired", 2, None)]
    # exactly at the timeout the report is already too old
    assert decide({1: {0: GroupReport(0.3, 0.0)}}, {}, 1.0, cfg).assignments == {}


def test_decide_is_deterministic_and_does_not_mutate_inputs():
    jobs = jobs_at(0.0, j3=0.5, j1=0.1, j2=0.8)
    snapshot = {k: dict(v) for k, v in jobs.items()}
    a = decide(jobs, {1: 1}, 0.0, DEFAULT)
    b = decide(jobs, {1: 1}, 0.0, DEFAULT)
    assert a == b
    assert jobs == snapshot


def test_tag_rules_priority_objective_orders_by_priority_tag():
    cf = CadentFlow(name="fp", objective="priority", flows=(
        TaggedFlow(priority=(10, 19)), TaggedFlow(priority=(0, 9)), TaggedFlow(priority=(20, 255)),
    ))
    rules = sorted(policy.tag_rules((cf,)), key=lambda r: r.qid)
    assert [(r.priority_lo, r.priority_hi, r.qid) for r in rules] == [(0, 9, 1), (10, 19, 2), (20, 255, 3)]
    assert [r.rank for r in rules] == [3, 2, 1]  # more urgent wins where ranges overlap


def test_tag_rules_deadline_objective_tightest_deadline_first():
    cf = CadentFlow(name="bp", objective="deadline", flows=(
        TaggedFlow(deadline_us=(5001, 20000)), TaggedFlow(deadline_us=(0, 5000)),
    ))
    rules = {(r.deadline_lo_us, r.deadline_hi_us): r.qid for r in policy.tag_rules((cf,))}
    assert rules == {(0, 5000): 1, (5001, 20000): 2}


def test_tag_rules_weight_objective_heaviest_first_and_pinned_queue():
    cf = CadentFlow(name="graph", objective="weight", flows=(
        TaggedFlow(priority=(0, 0), weight=1), TaggedFlow(priority=(1, 1), weight=8),
        TaggedFlow(priority=(2, 2), weight=4, queue=6),
    ))
    rules = {r.priority_lo: r.qid for r in policy.tag_rules((cf,))}
    assert rules == {1: 1, 0: 2, 2: 6}


def test_tag_rules_spread_many_flows_over_the_approximate_queues():
    cf = CadentFlow(name="many", flows=tuple(TaggedFlow(priority=(p, p)) for p in range(14)))
    qids = [r.qid for r in sorted(policy.tag_rules((cf,)), key=lambda r: r.priority_lo)]
    assert qids == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]
    assert len({r.rank for r in policy.tag_rules((cf,))}) == 14


def test_static_and_switch_state():
    route = Route("10.0.0.1", 32, 1, "00:00:00:00:00:01", "00:00:00:00:01:01")
    cfg = PolicyConfig(ecn_threshold_pkts=12, cadentflows=(
        CadentFlow(name="x", flows=(TaggedFlow(priority=(0, 3)),), jobs=(9,)),))
    static = policy.static_state(SwitchConfig(name="s1", routes=(route,)), cfg)
    assert static.routes == {route}
    assert static.ecn_rules == {EcnRule(0, 12)}
    assert static.tlr_rules == default_tlr_rules()
    assert static.tag_rules == {TagRule(1, 0, 3, 0, 0xFFFFFFFF, 1)}
    state = policy.switch_state(static, {5: 3, 9: 2}, policy.tag_only_jobs(cfg))
    assert state.job_rules == {JobRule(5, 3)}  # job 9 is CadentFlow-tagged: its tags decide
    assert dataclasses.replace(state, job_rules=frozenset()) == static
    no_tlr = policy.static_state(SwitchConfig(name="s1"), PolicyConfig(install_tlr_rules=False))
    assert no_tlr.tlr_rules == frozenset()


@settings(max_examples=400, deadline=None)
@given(tlr=st.floats(0.0, 1.0), loss=st.floats(0.0, 1.0), old=st.one_of(st.none(), st.integers(0, 7)),
       streak=st.integers(0, 5), hysteresis=st.sampled_from([0.0, 0.02, 0.1]), margin=st.sampled_from([0.0, 0.02]),
       promote_after=st.integers(1, 4),
       thresholds=st.sampled_from([None, (0.0, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 0.9)]))
def test_the_placer_places_as_the_policy_does(tlr, loss, old, streak, hysteresis, margin, promote_after, thresholds):
    """``policy.Placer`` (the incremental core's per-job decision) against ``_place`` (``decide``'s)."""
    kw = {} if thresholds is None else {"thresholds": thresholds}
    cfg = PolicyConfig(hysteresis=hysteresis, loss_margin=margin, promote_after_epochs=promote_after, **kw)
    streaks: dict[int, int] = {}
    want = policy._place(1, tlr, loss, old, {1: streak}, streaks, cfg)
    assert policy.Placer(cfg).place(tlr, loss, old, streak) == (*want, streaks.get(1, 0))
    assert policy.Placer(cfg).queue_for(tlr) == queue_for_tlr(tlr, cfg.thresholds)


@given(msr=st.floats(0.0, 1.0), total=st.integers(0, 2 ** 32 - 1))
def test_the_memoised_required_count_is_required_messages(msr, total):
    from netapprox.hostlib.config import required_messages
    assert policy._required(msr, total) == required_messages(msr, total)
    assert policy._required(msr, total) == required_messages(msr, total)  # from the memo this time


def test_the_required_count_memo_stays_bounded_under_ever_new_values():
    for total in range(policy._REQUIRED_MAX * 3):
        policy._required(0.9, total)
    assert 0 < len(policy._REQUIRED) <= policy._REQUIRED_MAX
    assert policy._required(0.9, 10) == 9


def test_next_group_report_builds_the_namedtuple_its_fields_say():
    """``next_group_report`` builds its tuple by position (for speed): it must be the ``GroupReport`` the
    named fields give, defaults included."""
    first = policy.next_group_report(None, 1.0, 0.3, 0.01, 8e6, 0.9, 100, 10, 2)
    assert first == GroupReport(0.3, 1.0, 0.01, 8e6, remaining=80, resolved=12)
    assert type(first) is GroupReport and first.message_bytes is None and first.interval is None
    second = policy.next_group_report(first, 1.5, 0.4, 0.0, 4e6, 0.9, 100, 30, 2)
    # 8 Mbit/s for 0.5 s = 500,000 bytes over the 20 messages resolved since
    assert second == GroupReport(0.4, 1.5, 0.0, 4e6, remaining=60, resolved=32, unresolved_bytes=0.0,
                                 message_bytes=25_000.0, interval=0.5)
    assert second.last_seen == 1.5 and second.rate_bps == 4e6


def _tagged_packet(priority: int, job_id: int = 5, tlr: float = 0.5) -> bytes:
    from netapprox.hostlib import wire
    hdr = wire.Header(type=wire.PacketType.DATA, flags=int(wire.Flags.APPROX | wire.Flags.TAGGED), job_id=job_id,
                      priority=priority, weight=1, tlr=wire.tlr_to_q15(tlr))
    udp = (40000).to_bytes(2, "big") + wire.DEFAULT_ATP_PORT.to_bytes(2, "big") + (8 + 32).to_bytes(2, "big") + b"\0\0"
    ip = bytes([0x45, 0, 0, 60, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2])
    return ip + udp + wire.encode(hdr, b"")


def test_job_ranks_go_to_queue_one_plus_rank_below_every_cadentflow_rule():
    from netapprox.controller.reference import reference_queue
    cfg = PolicyConfig(rank_levels=3, cadentflows=(
        CadentFlow(name="x", flows=(TaggedFlow(priority=(1, 1), queue=6),), jobs=(9,)),))
    static = policy.static_state(SwitchConfig(name="s1"), cfg)
    assert static.tag_rules == {TagRule(4, 1, 1, 0, 0xFFFFFFFF, 6), TagRule(3, 0, 0, 0, 0xFFFFFFFF, 1),
                                TagRule(2, 1, 1, 0, 0xFFFFFFFF, 2), TagRule(1, 2, 2, 0, 0xFFFFFFFF, 3)}
    assert [reference_queue(static, _tagged_packet(p)) for p in (0, 1, 2)] == [1, 6, 3]
    assert reference_queue(static, _tagged_packet(3)) == queue_for_tlr(0.5, cfg.thresholds)  # no rank 3: its TLR
    plain = policy.static_state(SwitchConfig(name="s1"), PolicyConfig())
    assert not plain.tag_rules and reference_queue(plain, _tagged_packet(2)) == queue_for_tlr(0.5, cfg.thresholds)


def test_rank_levels_must_fit_the_approximate_queues():
    with pytest.raises(config.ConfigError, match="rank_levels"):
        PolicyConfig(rank_levels=8)
