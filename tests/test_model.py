"""controller.model: the logical tables both data planes implement."""
from __future__ import annotations

import pytest

from netapprox.controller import model
from netapprox.hostlib.wire import TLR_ONE, tlr_to_q15


def _queue_for(rules, tlr_q15):
    hits = [r.qid for r in rules if r.tlr_lo <= tlr_q15 <= r.tlr_hi]
    assert len(hits) <= 1, f"overlapping TLR rules at {tlr_q15}"
    return hits[0] if hits else model.LOWEST_QUEUE


def test_default_tlr_rules_cover_every_value_once_and_never_use_queue_0():
    rules = model.default_tlr_rules()
    covered = sorted((r.tlr_lo, r.tlr_hi) for r in rules)
    assert covered[0][0] == 0 and covered[-1][1] == TLR_ONE
    assert all(b[0] == a[1] + 1 for a, b in zip(covered, covered[1:]))
    assert all(r.qid != model.NON_APPROX_QUEUE for r in rules)


@pytest.mark.parametrize("tlr, qid", [(0.0, 1), (0.124, 1), (0.125, 1), (0.25, 2), (0.5, 4),
                                      (0.874, 6), (0.875, 7), (1.0, 7)])
def test_default_thresholds_follow_k_over_8(tlr, qid):
    assert _queue_for(model.default_tlr_rules(), tlr_to_q15(tlr)) == qid


def test_custom_thresholds_are_validated():
    with pytest.raises(ValueError, match="strictly increasing"):
        model.default_tlr_rules((0.0, 0.5, 0.4, 0.6, 0.7, 0.8, 0.9, 0.95))
    with pytest.raises(ValueError, match="below 1.0"):
        model.default_tlr_rules((0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 1.0))
    rules = model.default_tlr_rules((0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8))
    assert _queue_for(rules, tlr_to_q15(0.03)) == 2
    assert _queue_for(rules, tlr_to_q15(0.06)) == 3


def test_buffer_sizes_follow_the_paper():
    assert [model.queue_buffer_packets(k, 100) for k in range(1, 8)] == [7, 6, 5, 4, 3, 2, 1]
    assert model.queue_buffer_packets(0, 100) == 100 - 28
    with pytest.raises(ValueError, match="nothing for queue 0"):
        model.queue_buffer_packets(0, 28)


def test_a_buffer_unit_scales_the_approximate_queues_in_the_papers_proportions():
    """``unit`` u gives queue k u x (8 - k) packets (and the tuner's shares u x theirs); queue 0 keeps the rest;
    ``half_buffer_unit`` is the largest u that leaves queue 0 at least half of the port."""
    assert [model.queue_buffer_packets(k, 1000, unit=17) for k in range(8)] == [524, 119, 102, 85, 68, 51, 34, 17]
    assert [model.queue_buffer_packets(k, 1000, (12, 9, 2, 1, 1, 1, 2), unit=4) for k in range(8)] == \
        [888, 48, 36, 8, 4, 4, 4, 8]
    assert [model.half_buffer_unit(b) for b in (28, 64, 111, 112, 256, 1000)] == [1, 1, 1, 2, 4, 17]
    for b in (29, 64, 100, 256, 1000, 4096):
        u = model.half_buffer_unit(b)
        assert model.queue_buffer_packets(0, b, unit=u) >= b / 2 or u == 1
    with pytest.raises(ValueError, match="nothing for queue 0"):
        model.queue_buffer_packets(3, 64, unit=3)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="approx_buffer_unit: need an integer >= 1"):
            model.queue_buffer_packets(1, 1000, unit=bad)


def test_rules_reject_bad_values():
    with pytest.raises(ValueError, match="queue id 8"):
        model.JobRule(job_id=1, qid=8)
    with pytest.raises(ValueError, match="job id 0"):
        model.JobRule(job_id=0, qid=1)
    with pytest.raises(ValueError, match="priority range"):
        model.TagRule(rank=1, priority_lo=5, priority_hi=4, deadline_lo_us=0, deadline_hi_us=1, qid=1)
    with pytest.raises(ValueError, match="same job id"):
        model.SwitchState(job_rules=frozenset({model.JobRule(1, 1), model.JobRule(1, 2)}))
