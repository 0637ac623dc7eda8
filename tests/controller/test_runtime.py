"""The runtime with scripted drivers and a virtual clock (no threads, no sleeps): backoff, re-arming, one apply
per epoch, the per-epoch callback, the report socket."""
from __future__ import annotations

import socket

from netapprox.controller.config import ReportConfig, SwitchConfig
from netapprox.controller.drivers import Driver
from netapprox.controller.errors import SwitchUnavailable
from netapprox.controller.model import Counters, QueueStats, SwitchState, WriteSummary
from netapprox.controller.runtime import Runtime
from netapprox.hostlib.wire import Report
from support.paper_policy import ControllerConfig, PolicyConfig


class ScriptedDriver(Driver):
    def __init__(self, name="s1", connect_failures=0):
        self.name = name
        self.connect_failures = connect_failures
        self.connect_calls: list[float] = []
        self.applied: list[SwitchState] = []
        self.apply_times: list[float] = []
        self.fail_apply: Exception | None = None
        self.clock = None
        self.closed = False
        self.counter_reads = 0

    def connect(self):
        self.connect_calls.append(self.clock())
        if len(self.connect_calls) <= self.connect_failures:
            raise SwitchUnavailable(self.name, "connection refused")

    def apply(self, desired):
        if self.fail_apply is not None:
            e, self.fail_apply = self.fail_apply, None
            raise e
        self.applied.append(desired)
        self.apply_times.append(self.clock())
        return WriteSummary(inserted=1)

    def read_counters(self):
        self.counter_reads += 1
        return Counters(queues=(QueueStats(port=1, qid=0, enqueued=5, transmitted=4, dropped=1),))

    def close(self):
        self.closed = True


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def make(driver, clock, on_epoch=None, report_socket=None, **kw):
    driver.clock = clock
    kw.setdefault("reports", ReportConfig(port=-1))
    config = ControllerConfig(switches=(SwitchConfig("s1"),), reconnect_initial_s=0.1, reconnect_max_s=0.4, **kw)
    return Runtime(config, drivers={"s1": driver}, clock=clock, connect_clock=clock, background_connect=False,
                   on_epoch=on_epoch, report_socket=report_socket)


def report(job: int, seq: int, tlr: float, loss: float = 0.0) -> bytes:
    return Report(job_id=job, group_id=0, seq=seq, tlr=tlr, loss=loss, msr=1, rate_kbps=1, total=1, delivered=0,
                  lost=0, epoch=seq).encode()


def test_reconnect_backoff_doubles_up_to_the_ceiling():
    clock, driver = Clock(), ScriptedDriver(connect_failures=4)
    with make(driver, clock) as ctl:
        for t in [0.0, 0.05, 0.1, 0.2, 0.31, 0.6, 0.72, 1.0, 1.1, 1.13, 1.2]:
            clock.t = t
            ctl.epoch()
        # failures at 0.0 (retry after 0.1), 0.1 (0.2), 0.31 (0.4), 0.72 (0.4, the ceiling); success at 1.13
        assert driver.connect_calls == [0.0, 0.1, 0.31, 0.72, 1.13]
        assert ctl.switch_up("s1")
        assert driver.apply_times and min(driver.apply_times) >= 1.13  # nothing applied while down
    assert driver.closed


def test_an_unexpected_driver_error_re_arms_the_switch_and_the_loop_continues():
    clock, driver = Clock(), ScriptedDriver()
    with make(driver, clock) as ctl:
        assert ctl.connect(5)
        ctl.epoch()
        assert len(driver.applied) == 1
        driver.fail_apply = OSError("netlink went away")
        clock.t = 1.0
        ctl.ingest(report(1, 1, 0.5), "h")  # a change, so the epoch writes
        r = ctl.epoch()
        assert "netlink went away" in r.errors["s1"] and not ctl.switch_up("s1")
        clock.t = 1.05
        ctl.epoch()
        assert len(driver.connect_calls) == 1  # backoff 0.1 s not over yet
        clock.t = 1.2
        r = ctl.epoch()  # backoff over: reconnected, and the whole state applied in the same epoch
        assert ctl.switch_up("s1") and r.writes["s1"].inserted == 1
        assert len(driver.connect_calls) == 2
        assert {(r.job_id, r.qid) for r in driver.applied[-1].job_rules} == {(1, 4)}
        applied = len(driver.applied)
        clock.t = 1.3
        r = ctl.epoch()  # nothing changed: nothing to write, the driver is not called
        assert len(driver.applied) == applied and r.writes["s1"].writes == 0


def test_one_apply_per_switch_per_changed_epoch_with_the_full_desired_state():
    clock, driver = Clock(), ScriptedDriver()
    with make(driver, clock) as ctl:
        assert ctl.connect(5)
        for seq in range(1, 4):
            for job in (1, 2):
                ctl.ingest(report(job, seq, 0.1 * job * seq), "h")
            ctl.epoch()
        assert len(driver.applied) == 3
        assert {(r.job_id, r.qid) for r in driver.applied[-1].job_rules} == {(1, 2), (2, 4)}
        assert len(driver.applied[-1].tlr_rules) == 8 and len(driver.applied[-1].ecn_rules) == 1


def test_on_epoch_sees_every_epoch_its_reports_and_the_counters_it_asked_for():
    clock, driver, seen = Clock(), ScriptedDriver(), []
    with make(driver, clock, on_epoch=seen.append, counters_every=2) as ctl:
        assert ctl.connect(5)
        ctl.ingest(report(7, 1, 0.6), "10.0.0.1")
        ctl.ingest(report(7, 1, 0.6), "10.0.0.1")  # stale sequence number: dropped
        for t in (0.0, 0.02, 0.04):
            clock.t = t
            ctl.epoch()
    assert [r.epoch for r in seen] == [1, 2, 3]
    assert [(rep.job_id, rep.seq) for rep in seen[0].reports] == [(7, 1)] and seen[0].plan.reports_dropped == 1
    assert seen[1].reports == () and dict(seen[0].assignments) == {7: 4}
    assert [sorted(r.counters) for r in seen] == [[], ["s1"], []] and driver.counter_reads == 1


def test_reports_arrive_on_the_socket_and_are_ingested_at_the_epoch():
    clock, driver = Clock(), ScriptedDriver()
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    with make(driver, clock, report_socket=rx) as ctl, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        assert ctl.connect(5) and ctl.report_address == rx.getsockname()
        tx.sendto(report(9, 1, 0.9), ctl.report_address)
        tx.sendto(b"garbage", ctl.report_address)
        for _ in range(200):  # loopback delivery is immediate, but not synchronous with sendto
            r = ctl.epoch()
            if r.reports:
                break
        assert [rep.job_id for rep in r.reports] == [9] and ctl.assignments == {9: 7}
        assert sum(ctl.core.ingest_stats.dropped.values()) == 1
    assert rx.fileno() == -1  # the runtime closed the socket it was given


def test_losing_job_moves_up_one_queue_and_never_down_while_it_loses():
    clock, driver = Clock(), ScriptedDriver()
    with make(driver, clock, policy=PolicyConfig(promote_after_epochs=2, loss_margin=0.0)) as ctl:
        assert ctl.connect(5)
        seq = 0

        def epoch(tlr, loss):
            nonlocal seq
            seq += 1
            clock.t += 0.02
            ctl.ingest(report(3, seq, tlr, loss), "h")
            return ctl.epoch()

        assert epoch(0.5, 0.0).assignments == {3: 4}
        assert epoch(0.7, 0.8).assignments == {3: 4}  # losing: its higher TLR may not push it down
        r = epoch(0.7, 0.8)  # second losing epoch: promoted
        assert r.assignments == {3: 3} and [c.reason for c in r.changes] == ["promoted"]
        assert epoch(0.7, 0.0).assignments == {3: 5}  # no longer losing: the TLR decides again


def test_fifo_and_static_modes_ignore_reports_for_placement():
    for mode, job_rules, tlr_qids in (("fifo", set(), set()), ("static", {(4, 2)}, {1, 2, 3, 4, 5, 6, 7})):
        clock, driver = Clock(), ScriptedDriver()
        with make(driver, clock, policy=PolicyConfig(mode=mode, pinned=((4, 2),))) as ctl:
            assert ctl.connect(5)
            ctl.ingest(report(5, 1, 0.9), "h")
            ctl.epoch()
        state = driver.applied[-1]
        assert {(r.job_id, r.qid) for r in state.job_rules} == job_rules, mode
        assert {r.qid for r in state.tlr_rules} == tlr_qids, mode
        assert state.fifo == (mode == "fifo")


def test_reconfigure_applies_at_the_next_epoch():
    clock, driver = Clock(), ScriptedDriver()
    with make(driver, clock, policy=PolicyConfig(mode="static")) as ctl:
        assert ctl.connect(5)
        ctl.epoch()
        assert driver.applied[-1].job_rules == frozenset()
        ctl.reconfigure(policy_config=PolicyConfig(mode="static", pinned=((8, 6),)))
        ctl.epoch()
        assert {(r.job_id, r.qid) for r in driver.applied[-1].job_rules} == {(8, 6)}


def test_reports_are_decided_on_arrival_between_epochs_unless_losing():
    clock, driver = Clock(), ScriptedDriver()
    with make(driver, clock) as ctl:
        assert ctl.connect(5)
        ctl.epoch()
        applied = len(driver.applied)
        ctl.ingest(report(4, 1, 0.6), "h")
        ctl.ingest(report(5, 1, 0.2, loss=0.9), "h")  # losing: its streak starts at the next epoch
        writes = ctl.decide_arrivals()
        assert writes["s1"].writes == 1 and len(driver.applied) == applied + 1
        assert {(r.job_id, r.qid) for r in driver.applied[-1].job_rules} == {(4, 4)}
        assert ctl.decide_arrivals() == {}  # nothing new
        r = ctl.epoch()
        assert dict(r.assignments) == {4: 4, 5: 1} and [c.job_id for c in r.changes] == [5]
