"""The sans-I/O core against the straightforward policy: the same decisions, epoch by epoch, on random report
sequences; updates that add up to the desired state; work that follows the jobs crossing a switch."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from netapprox.controller import policy
from netapprox.controller.config import ReportConfig, SwitchConfig, TuningConfig
from netapprox.controller.core import ControllerCore
from netapprox.controller.model import JobRule
from netapprox.hostlib.wire import Report
from support.paper_policy import ControllerConfig, PolicyConfig

REPORTS = ReportConfig(port=-1, rate_per_host=1e9, burst=10 ** 9)


def report(job: int, group: int, seq: int, tlr: float, loss: float) -> bytes:
    return Report(job_id=job, group_id=group, seq=seq, tlr=tlr, loss=loss, msr=0.5, rate_kbps=1, total=1,
                  delivered=0, lost=0, epoch=seq).encode()


class Reference:
    """The epoch loop before it was incremental: every job re-decided by policy.decide every epoch."""

    def __init__(self, cfg: PolicyConfig) -> None:
        self.cfg = cfg
        self.jobs: dict[int, dict[int, policy.GroupReport]] = {}
        self.assignments: dict[int, int] = {}
        self.losing: dict[int, int] = {}

    def ingest(self, job: int, group: int, tlr: float, loss: float, now: float) -> None:
        q15 = lambda x: round(x * 0x8000) / 0x8000  # noqa: E731 - what the wire keeps of a TLR
        self.jobs.setdefault(job, {})[group] = policy.GroupReport(q15(tlr), now, q15(loss))

    def step(self, now: float) -> policy.Decision:
        d = policy.decide(self.jobs, self.assignments, now, self.cfg, self.losing)
        self.jobs = {j: dict(g) for j, g in d.live.items()}
        self.assignments, self.losing = dict(d.assignments), dict(d.losing)
        return d


events = st.lists(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 2), st.floats(0, 1), st.floats(0, 1)),
                           max_size=5), min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(epochs=events, gaps=st.lists(st.sampled_from([0.02, 0.02, 0.3, 0.7]), min_size=25, max_size=25),
       pinned=st.sampled_from([(), ((2, 5),)]))
def test_incremental_core_decides_exactly_as_the_policy(epochs, gaps, pinned):
    cfg = PolicyConfig(job_timeout_s=0.5, promote_after_epochs=2, pinned=pinned)
    core = ControllerCore(ControllerConfig(switches=(SwitchConfig("s1"),), policy=cfg, reports=REPORTS))
    ref = Reference(cfg)
    now, seq = 0.0, 0
    table: dict[int, int] = {}
    for reports, gap in zip(epochs, gaps):
        for job, group, tlr, loss in reports:
            seq += 1
            assert core.ingest(report(job, group, seq, tlr, loss), "10.0.0.1", now) is not None
            ref.ingest(job, group, tlr, loss, now)
        plan = core.step(now)
        want = ref.step(now)
        assert dict(plan.assignments) == dict(want.assignments)
        assert [c for c in plan.changes if c.reason != "held"] == [c for c in want.changes if c.reason != "held"]
        desired = plan.desired["s1"]
        expect = policy.switch_state(policy.static_state(SwitchConfig("s1"), cfg), {**dict(pinned), **want.assignments})
        assert desired == expect
        if plan.updates["s1"].static:  # the whole state: the consumer starts from it
            table = {r.job_id: r.qid for r in desired.job_rules}
        for job, qid in plan.updates["s1"].jobs.items():  # the updates turn last epoch's table into this one
            if qid is None:
                del table[job]
            else:
                table[job] = qid
        assert {JobRule(j, q) for j, q in table.items()} == desired.job_rules
        now += gap


def test_unchanged_reports_re_decide_nothing_and_update_nothing():
    core = ControllerCore(ControllerConfig(switches=(SwitchConfig("s1"),), reports=REPORTS))
    for seq in (1, 2, 3):
        for job in range(1, 101):
            core.ingest(report(job, 0, seq, 0.3, 0.0), "10.0.0.1", seq * 0.02)
        plan = core.step(seq * 0.02)
        if seq == 1:
            assert len(plan.updates["s1"].jobs) == 100 and plan.updates["s1"].static
        else:
            assert plan.changes == () and plan.updates["s1"].empty
    assert len(plan.reports) == 100  # still accepted (liveness), just nothing to decide


def test_a_switch_only_carries_the_jobs_of_its_sources():
    switches = (SwitchConfig("tor1", job_sources=("10.0.1.0/24",)), SwitchConfig("tor2", job_sources=("10.0.2.0/24",)),
                SwitchConfig("core"))
    core = ControllerCore(ControllerConfig(switches=switches, reports=REPORTS))
    core.ingest(report(1, 0, 1, 0.3, 0.0), "10.0.1.5", 0.0)
    core.ingest(report(2, 0, 1, 0.6, 0.0), "10.0.2.7", 0.0)
    plan = core.step(0.0)
    assert dict(plan.updates["tor1"].jobs) == {1: 2} and dict(plan.updates["tor2"].jobs) == {2: 4}
    assert dict(plan.updates["core"].jobs) == {1: 2, 2: 4}
    assert {r.job_id for r in plan.desired["tor1"].job_rules} == {1}


def test_expiry_runs_off_deadlines_and_deletes_the_entry_once():
    core = ControllerCore(ControllerConfig(switches=(SwitchConfig("s1"),), reports=REPORTS,
                                           policy=PolicyConfig(job_timeout_s=1.0)))
    core.ingest(report(7, 0, 1, 0.9, 0.0), "h", 0.0)
    assert dict(core.step(0.0).updates["s1"].jobs) == {7: 7}
    assert core.step(0.99).updates["s1"].empty  # still live
    plan = core.step(1.0)
    assert dict(plan.updates["s1"].jobs) == {7: None} and [c.reason for c in plan.changes] == ["expired"]
    assert core.step(2.0).updates["s1"].empty


def progress_report(seq: int, tlr: float, delivered: int, rate_kbps: int, job: int = 1) -> bytes:
    return Report(job_id=job, group_id=0, seq=seq, tlr=tlr, loss=0.0, msr=0.5, rate_kbps=rate_kbps, total=100,
                  delivered=delivered, lost=0, epoch=seq).encode()


def test_a_job_about_to_finish_goes_to_the_first_approximate_queue():
    """``finish_epochs`` 1: a job that would have what its MSR needs within an epoch at the rate it
    reports is placed in queue 1 whatever its TLR; with 0, its TLR (0.6: queue 4) places it all along."""
    epoch = 0.01
    for finish, want in ((1.0, [4, 4, 1]), (0.0, [4, 4, 4])):
        core = ControllerCore(ControllerConfig(switches=(SwitchConfig("s1"),), reports=REPORTS, epoch_s=epoch,
                                               policy=PolicyConfig(finish_epochs=finish)))
        got, finishing = [], []
        # 1 Gbit/s: 1.25 MB an epoch. 20 messages resolved per 1.25 MB, 30 still needed (~1.9 MB): not within an
        # epoch; then 45 resolved, 5 needed (~0.3 MB): within one.
        for seq, delivered in enumerate((0, 20, 45), start=1):
            now = (seq - 1) * epoch
            assert core.ingest(progress_report(seq, 0.6, delivered, 1_000_000), "10.0.0.1", now) is not None
            got.append(core.step(now).assignments[1])
            finishing.append(policy.finishing(core.jobs[1], finish * epoch))
        assert got == want, (finish, got)
        assert finishing == [q == 1 for q in want]
        # the reference policy decides the same from the same reports
        d = policy.decide(core.jobs, {1: 4}, now, core.config.policy, epoch_s=epoch)
        assert d.assignments[1] == want[-1]
        assert [c.reason for c in d.changes] == (["moved"] if want[-1] != 4 else [])


def test_a_faster_rate_alone_makes_a_job_finishing_and_unchanged_progress_keeps_it():
    """The core tests a job's value again only when a report moves what ``policy.finishing`` reads (rates,
    remaining messages, cost per message): a rate ten times higher with the same messages delivered makes the
    job finishing (queue 1); the same report again changes nothing (``finish_epochs`` 1)."""
    epoch = 0.01
    core = ControllerCore(ControllerConfig(switches=(SwitchConfig("s1"),), reports=REPORTS, epoch_s=epoch,
                                           policy=PolicyConfig(finish_epochs=1.0)))
    got = []
    # 20 messages resolved per 1.25 MB at 1 Gbit/s, 30 still needed (~1.9 MB): not within an epoch at 1 Gbit/s,
    # within one at 10 Gbit/s
    for seq, (delivered, kbps) in enumerate(((0, 1_000_000), (20, 1_000_000), (20, 10_000_000), (20, 10_000_000)),
                                            start=1):
        now = (seq - 1) * epoch
        assert core.ingest(progress_report(seq, 0.6, delivered, kbps), "10.0.0.1", now) is not None
        got.append(core.step(now).assignments[1])
    assert got == [4, 4, 1, 1]
    assert policy.decide(core.jobs, {1: 1}, now, core.config.policy, epoch_s=epoch).assignments[1] == 1


def test_finish_ref_puts_the_job_with_little_left_against_the_mix_first():
    """Mode ``adaptive`` with ``finish_ref`` 1/2 (and no finishing horizon): of two jobs at the same TLR (0.6:
    queue 4), the one whose remaining work is under half the live jobs' load-weighted median goes to queue 1
    once a tuning step has measured that median; with ``finish_ref`` 0 both stay in queue 4."""
    epoch = 0.01
    for ref, want in ((0.5, {1: 4, 2: 1}), (0.0, {1: 4, 2: 4})):
        tuning_cfg = TuningConfig(every_epochs=1, hysteresis=0.999, buffers=False, finish_ref=ref)
        cfg = PolicyConfig(mode="adaptive", finish_epochs=0.0, tuning=tuning_cfg)
        core = ControllerCore(ControllerConfig(switches=(SwitchConfig("s1"),), reports=REPORTS, epoch_s=epoch,
                                               policy=cfg))
        # job 1 at 3 Gbit/s (the larger load: the median is its work) needs 40 more messages, job 2 at 1 Gbit/s 5
        seq = 0
        for step, (d1, d2) in enumerate(((0, 0), (5, 40), (10, 45))):
            now = step * epoch
            for job, delivered, kbps in ((1, d1, 3_000_000), (2, d2, 1_000_000)):
                seq += 1
                assert core.ingest(progress_report(seq, 0.6, delivered, kbps, job), "10.0.0.1", now)
            plan = core.step(now)
        assert dict(plan.assignments) == want, ref
        assert policy.job_value(core.jobs[2], 0.6, None, cfg, epoch) == 0.6  # no median measured: its TLR


@settings(max_examples=100, deadline=None)
@given(epochs=st.lists(st.lists(st.tuples(st.integers(1, 4), st.floats(0, 1), st.integers(0, 60),
                                          st.sampled_from([1_000, 100_000, 1_000_000])), max_size=4),
                       min_size=1, max_size=20),
       mode=st.sampled_from(["netapprox", "adaptive"]))
def test_incremental_core_places_finishing_jobs_as_the_policy(epochs, mode):
    """The differential test above with reports that resolve messages at a rate (so the finishing rule acts):
    the core and ``policy.decide`` (with the controller's epoch) assign every job the same queue."""
    epoch = 0.01
    cfg = PolicyConfig(job_timeout_s=0.5, mode=mode, tuning=TuningConfig(every_epochs=1_000_000))
    core = ControllerCore(ControllerConfig(switches=(SwitchConfig("s1"),), policy=cfg, reports=REPORTS,
                                           epoch_s=epoch))
    jobs: dict[int, dict[int, policy.GroupReport]] = {}
    assignments: dict[int, int] = {}
    losing: dict[int, int] = {}
    now, seq = 0.0, 0
    for reports in epochs:
        for job, tlr, delivered, rate in reports:
            seq += 1
            data = progress_report(seq, tlr, delivered, rate, job)
            assert core.ingest(data, "10.0.0.1", now) is not None
            r = Report.decode(data)
            jobs.setdefault(job, {})[0] = policy.next_group_report(
                jobs.get(job, {}).get(0), now, r.tlr, r.loss, r.rate_kbps * 1000.0, r.msr, r.total, r.delivered,
                r.lost)
        plan = core.step(now)
        values = {j: policy.job_value(g, policy.job_tlr(g)[0], core.tuned.work_ref, cfg, epoch)
                  for j, g in jobs.items()}
        want = policy.decide(jobs, assignments, now, cfg, losing, values=values, cutoffs=core.tuned.cutoffs)
        assert dict(plan.assignments) == dict(want.assignments)
        jobs = {j: dict(g) for j, g in want.live.items()}
        assignments, losing = dict(want.assignments), dict(want.losing)
        now += epoch


@settings(max_examples=300, deadline=None)
@given(groups=st.dictionaries(st.integers(0, 3), st.tuples(st.integers(0, 50), st.none() | st.floats(1.0, 1e6),
                                                            st.floats(0.0, 1e10)), min_size=1, max_size=4),
       within=st.sampled_from([0.0, 1e-6, 1e-3, 0.05, 1.0]))
def test_finishing_is_the_remaining_work_within_the_rate(groups, within):
    """``policy.finishing`` (one pass, for the core) says what ``remaining_work`` and the reported rates say."""
    reports = {g: policy.GroupReport(0.3, 0.0, rate_bps=rate, remaining=left, message_bytes=cost)
               for g, (left, cost, rate) in groups.items()}
    work = policy.remaining_work(reports)
    rate = sum(r.rate_bps for r in reports.values())
    want = within > 0 and bool(work) and work * 8.0 <= rate * within * (1 + 1e-12)
    assert policy.finishing(reports, within) == want or abs(work * 8.0 - rate * within) <= 1e-9 * rate * within


def test_a_policy_that_ranks_jobs_leaves_every_job_to_its_tags():
    """``rank_levels``: no queue_by_job entry (it would override the rank the packets carry), the rank rules
    installed; without it the same reports place the jobs."""
    placed = {}
    for ranks in (0, 3):
        cfg = PolicyConfig(rank_levels=ranks)
        core = ControllerCore(ControllerConfig(switches=(SwitchConfig("s1"),), policy=cfg, reports=REPORTS))
        for seq, (job, tlr) in enumerate(((1, 0.1), (2, 0.5), (3, 0.9)), 1):
            assert core.ingest(report(job, 0, seq, tlr, 0.0), "10.0.0.1", 0.0) is not None
        plan = core.step(0.0)
        placed[ranks] = plan.desired["s1"].job_rules
        assert len([r for r in plan.desired["s1"].tag_rules if r.priority_lo < 3]) == ranks
    assert len(placed[0]) == 3 and not placed[3]
