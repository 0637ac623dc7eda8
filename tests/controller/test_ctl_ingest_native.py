"""The C report loop (controller/_ingest.c) against ``ControllerCore.ingest_batch``'s own loop: two cores fed the
same batches, one taking them in C, one in Python, agree on what each batch accepted, every group's report (its
fields and their types), the dirty set, the reports taken, the sequence numbers, the token buckets, the drop
counters and every decision of the epochs between the batches."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netapprox.controller import core as core_module
from netapprox.controller.config import ReportConfig, SwitchConfig
from netapprox.controller.core import ControllerCore
from netapprox.hostlib.wire import Report
from support.paper_policy import ControllerConfig, PolicyConfig
from support.skips import need_extension


@pytest.fixture(autouse=True)
def _built():
    need_extension(core_module.NATIVE_INGEST, "the C report loop (controller/_ingest.c)")


SWITCHES = (SwitchConfig("s1", job_sources=("10.0.1.0/24",)), SwitchConfig("s2"))
STATE = ("min_tlr", "min_group", "qid", "streak", "value")
POLICIES = {"tlr": {}, "finishing": {"finish_epochs": 64.0}, "adaptive": {"mode": "adaptive"}}

# (job, group, seq step, tlr, loss, delivered, lost, rate_kbps, source, kind): kind 0 a decoded Report (the
# receive helper's), 1 a Report built in Python (ints where floats go: the Python loop's path), 2 a reason,
# 3 a Report with a TLR above 1, 4 job 0
items = st.tuples(st.integers(1, 5), st.integers(0, 2), st.sampled_from([1, 1, 1, 0, -3]),
                  st.sampled_from([0.0, 0.1, 0.5, 0.5, 0.9, 1.0]), st.sampled_from([0.0, 0.0, 0.3, 1.0]),
                  st.integers(0, 40), st.integers(0, 5), st.sampled_from([0, 1, 1_000, 100_000]),
                  st.sampled_from(["10.0.1.1", "10.0.1.2", "10.0.9.9"]), st.sampled_from([0, 0, 0, 0, 0, 1, 2, 3, 4]))


def pair(policy: str, rate: float, burst: int) -> list[ControllerCore]:
    reports = ReportConfig(port=-1, rate_per_host=rate, burst=burst)
    cfg = PolicyConfig(job_timeout_s=0.5, **POLICIES[policy])
    cores = [ControllerCore(ControllerConfig(switches=SWITCHES, policy=cfg, reports=reports, epoch_s=0.01))
             for _ in range(2)]
    cores[1].native_ingest = False
    return cores


def item_of(job, group, seq, tlr, loss, delivered, lost, rate, kind):
    if kind == 2:
        return "bad_mac"
    if kind == 1:
        return Report(job_id=job, group_id=group, seq=seq, tlr=int(tlr), loss=int(loss), msr=1, rate_kbps=rate,
                      total=60, delivered=delivered, lost=lost, epoch=seq)
    if kind == 3:
        return Report(job_id=job, group_id=group, seq=seq, tlr=1.5, loss=loss, msr=0.5, rate_kbps=rate, total=60,
                      delivered=delivered, lost=lost, epoch=seq)
    report = Report(job_id=0 if kind == 4 else job, group_id=group, seq=seq, tlr=tlr, loss=loss, msr=0.5,
                    rate_kbps=rate, total=60, delivered=delivered, lost=lost, epoch=seq)
    return Report.decode(report.encode())


def state(core: ControllerCore) -> tuple:
    stats = core.ingest_stats
    jobs = {job_id: ([getattr(job, a) for a in STATE],
                     {g: repr(r) for g, r in job.groups.items()}) for job_id, job in core._jobs.items()}
    return (jobs, set(core._dirty), list(core._reports), stats.accepted, dict(stats.dropped), dict(stats._last_seq),
            {h: repr(b) for h, b in stats._buckets.items()})


@settings(max_examples=200, deadline=None)
@given(batches=st.lists(st.lists(items, max_size=12), min_size=1, max_size=12),
       gaps=st.lists(st.sampled_from([0.0, 0.004, 0.01, 0.3, -0.002]), min_size=12, max_size=12),
       policy=st.sampled_from(sorted(POLICIES)), bucket=st.sampled_from([(1e9, 10 ** 9), (200.0, 3)]))
def test_the_c_loop_takes_reports_as_the_python_loop(batches, gaps, policy, bucket):
    """Random batches (known and new jobs and groups, repeated and older sequence numbers, reasons, TLRs out of
    range, job 0, Reports with ints for floats, sources out of tokens, time standing still and going back): the
    same accepted count, the same state after every batch, the same epoch after it."""
    cores = pair(policy, *bucket)
    now, seqs = 1.0, {}
    for batch, gap in zip(batches, gaps):
        entries = []
        for job, group, step, tlr, loss, delivered, lost, rate, source, kind in batch:
            seqs[job, group] = seq = max(0, seqs.get((job, group), 0) + step)
            entries.append((source, item_of(job, group, seq, tlr, loss, delivered, lost, rate, kind)))
        accepted = [core.ingest_batch(list(entries), now) for core in cores]
        assert accepted[0] == accepted[1]
        assert state(cores[0]) == state(cores[1])
        native, python = (core.step(now) for core in cores)
        assert native.changes == python.changes
        assert state(cores[0]) == state(cores[1])
        now += gap


def test_the_c_loop_counts_what_it_accepts_in_the_ingest_stats():
    """A batch of known groups' reports, all taken in C: ``accepted`` and the return value count each once, an
    older sequence number is counted as stale."""
    core, _ = pair("tlr", 1e9, 10 ** 9)
    first = [("10.0.1.1", item_of(job, 0, 1, 0.5, 0.0, 0, 0, 1000, 0)) for job in (1, 2, 3)]
    assert core.ingest_batch(first, 1.0) == 3
    again = [("10.0.1.1", item_of(job, 0, 2, 0.2, 0.0, 5, 0, 1000, 0)) for job in (1, 2, 3)]
    stale = [("10.0.1.1", item_of(1, 0, 1, 0.2, 0.0, 5, 0, 1000, 0))]
    assert core.ingest_batch(again + stale, 1.01) == 3
    assert core.ingest_stats.accepted == 6 and core.ingest_stats.dropped["stale_seq"] == 1
    assert core._jobs[2].groups[0].remaining == 25 and core._dirty == {1, 2, 3}


def test_a_batch_that_is_not_pairs_is_a_type_error_and_keeps_what_it_took():
    core, _ = pair("tlr", 1e9, 10 ** 9)
    core.ingest_batch([("10.0.1.1", item_of(1, 0, 1, 0.5, 0.0, 0, 0, 1000, 0))], 1.0)
    with pytest.raises(TypeError):
        core.ingest_batch([("10.0.1.1", item_of(1, 0, 2, 0.5, 0.0, 0, 0, 1000, 0)), "not a pair"], 1.01)
    assert core.ingest_stats.accepted == 2 and core._jobs[1].groups[0].last_seen == 1.01
