"""The C decision loop (controller/_decide.c) against ``ControllerCore._decide_all``'s own loop: two cores fed the
same reports, one deciding in C, one in Python, agree on every job's state, table, delta and decision."""
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
    need_extension(core_module.NATIVE, "the C decision loop (controller/_decide.c)")


REPORTS = ReportConfig(port=-1, rate_per_host=1e9, burst=10 ** 9)
SWITCHES = (SwitchConfig("s1", job_sources=("10.0.1.0/24",)), SwitchConfig("s2", job_sources=("10.0.2.0/24",)),
            SwitchConfig("s3"))
STATE = ("min_tlr", "min_group", "qid", "streak", "value")

reports = st.tuples(st.integers(1, 8), st.integers(0, 2), st.floats(0, 1), st.sampled_from([0.0, 0.0, 0.2, 0.9]),
                    st.integers(0, 60), st.sampled_from([1, 1_000, 100_000]), st.sampled_from([1, 2]))


def pair(finish_epochs: float, promote_after: int) -> list[ControllerCore]:
    cfg = PolicyConfig(job_timeout_s=0.5, promote_after_epochs=promote_after, finish_epochs=finish_epochs)
    cores = [ControllerCore(ControllerConfig(switches=SWITCHES, policy=cfg, reports=REPORTS, epoch_s=0.01))
             for _ in range(2)]
    cores[1].native_decide = False
    return cores


def assert_same(native: ControllerCore, python: ControllerCore) -> None:
    assert native._assignments == python._assignments and native._tables == python._tables
    assert native._losing == python._losing
    for job_id, job in python._jobs.items():
        assert [getattr(native._jobs[job_id], a) for a in STATE] == [getattr(job, a) for a in STATE], job_id


@settings(max_examples=150, deadline=None)
@given(epochs=st.lists(st.lists(reports, max_size=6), min_size=1, max_size=20),
       gaps=st.lists(st.sampled_from([0.01, 0.01, 0.3, 0.7]), min_size=20, max_size=20),
       finish_epochs=st.sampled_from([0.0, 1.0, 64.0]), promote_after=st.sampled_from([1, 2, 3]))
def test_the_c_loop_decides_as_the_python_loop(epochs, gaps, finish_epochs, promote_after):
    """Random reports (several groups a job, losing jobs, messages resolved at a rate so the finishing rule acts,
    jobs of two racks and of every switch, silence that expires groups): every epoch's plan and every job's
    state are the same from both loops."""
    cores = pair(finish_epochs, promote_after)
    now, seq = 0.0, 0
    for batch, gap in zip(epochs, gaps):
        for job, group, tlr, loss, delivered, rate, rack in batch:
            seq += 1
            data = Report(job_id=job, group_id=group, seq=seq, tlr=tlr, loss=loss, msr=0.5, rate_kbps=rate,
                          total=100, delivered=delivered, lost=0, epoch=seq).encode()
            for core in cores:
                assert core.ingest(data, f"10.0.{rack}.{job}", now) is not None
        native, python = (core.step(now) for core in cores)
        assert native.changes == python.changes
        assert {n: (dict(u.jobs), u.urgent) for n, u in native.updates.items()} == \
            {n: (dict(u.jobs), u.urgent) for n, u in python.updates.items()}
        assert_same(*cores)
        now += gap


@pytest.mark.parametrize("finish_epochs", [0.0, 64.0])
def test_a_retune_places_every_job_afresh_in_both_loops(finish_epochs):
    """``retuned`` (every job placed afresh; a losing job does not move down; placement by TLR alone ignores it, as
    the Python loop does): the same decisions."""
    cores = pair(finish_epochs, 3)
    for seq, (job, tlr, loss) in enumerate([(1, 0.1, 0.0), (2, 0.5, 0.9), (3, 0.9, 0.0), (4, 0.3, 0.5)], 1):
        data = Report(job_id=job, group_id=0, seq=seq, tlr=tlr, loss=loss, msr=0.5, rate_kbps=1000, total=100,
                      delivered=10, lost=0, epoch=seq).encode()
        for core in cores:
            core.ingest(data, "10.0.1.1", 0.0)
    for core in cores:
        core.step(0.0)
        for job in core._jobs.values():
            job.qid = 7 - job.job_id  # as if placed by other thresholds
    out = []
    for core in cores:
        deltas, changes, urgent = {n: {} for n in core.switches}, [], set()
        core._decide_all(sorted(core._jobs), {}, deltas, changes, urgent, retuned=True)
        out.append((deltas, changes, urgent))
    assert out[0] == out[1]
    assert {c.reason for c in out[0][1]} >= {"tuned" if finish_epochs else "moved"}  # a retune: by value only
    assert_same(*cores)


def test_bad_state_is_a_clear_error_not_a_crash():
    """A group report that is not a ``GroupReport`` (a core's state broken by a caller) raises TypeError."""
    core = pair(0.0, 3)[0]
    core.ingest(Report(job_id=1, group_id=0, seq=1, tlr=0.2, loss=0.0, msr=0.5, rate_kbps=1, total=1, delivered=0,
                       lost=0, epoch=1).encode(), "10.0.1.1", 0.0)
    core._jobs[1].groups[0] = "not a report"
    with pytest.raises(TypeError, match="GroupReport"):
        core._decide_all([1], {}, {n: {} for n in core.switches}, [], set())


@pytest.mark.parametrize("rate_bps", [7999.0, 8000.0, 8001.0])
def test_the_finishing_rule_at_its_boundary(rate_bps):
    """Work x 8 exactly the rate times the horizon (1 s here) finishes; a bit per second less does not."""
    from netapprox.controller.policy import FINISH_VALUE, GroupReport
    cores = pair(100.0, 3)  # 100 epochs of 0.01 s: a horizon of 1.0 s
    values = []
    for core in cores:
        core.ingest(Report(job_id=1, group_id=0, seq=1, tlr=0.6, loss=0.0, msr=0.5, rate_kbps=1, total=1,
                           delivered=0, lost=0, epoch=1).encode(), "10.0.1.1", 0.0)
        core._jobs[1].groups[0] = GroupReport(0.6, 0.0, 0.0, rate_bps, 2, 0, 0.0, 500.0)  # 1,000 bytes left
        core._decide_all([1], {}, {n: {} for n in core.switches}, [], set())
        values.append(core._jobs[1].value)
    assert values[0] == values[1] == (FINISH_VALUE if rate_bps >= 8000.0 else 0.6)
