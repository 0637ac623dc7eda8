"""The epoch loop with scripted drivers and a virtual clock: backoff, re-arming, one apply per epoch."""
from __future__ import annotations

import time

from netapprox.controller.config import ControllerConfig, ReportConfig, SwitchConfig
from netapprox.controller.loop import Controller
from netapprox.controller.model import Counters, Driver, SwitchState, SwitchUnavailable, WriteSummary
from netapprox.hostlib.wire import Report


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
        return Counters(queues=(), job_packets={})

    def close(self):
        self.closed = True


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def settle(ctl):
    deadline = time.monotonic() + 5
    while any(sw.connecting for sw in ctl._switches.values()) and time.monotonic() < deadline:
        time.sleep(0.001)


def make(driver, clock, **kw):
    driver.clock = clock
    config = ControllerConfig(switches=(SwitchConfig("s1"),), reports=ReportConfig(port=-1),
                              reconnect_initial_s=0.1, reconnect_max_s=0.4, **kw)
    return Controller(config, drivers={"s1": driver}, clock=clock)


def test_reconnect_backoff_doubles_up_to_the_ceiling():
    clock, driver = Clock(), ScriptedDriver(connect_failures=4)
    with make(driver, clock) as ctl:
        for t in [0.0, 0.05, 0.1, 0.2, 0.31, 0.6, 0.72, 1.0, 1.1, 1.13, 1.2]:
            clock.t = t
            ctl.step()
            settle(ctl)
        # failures at 0.0 (retry after 0.1), 0.1 (0.2), 0.31 (0.4), 0.72 (0.4, the ceiling); success at 1.13
        assert driver.connect_calls == [0.0, 0.1, 0.31, 0.72, 1.13]
        assert ctl.switch_up("s1")
        assert driver.apply_times and min(driver.apply_times) >= 1.13  # nothing applied while down
    assert driver.closed


def test_an_unexpected_driver_error_re_arms_the_switch_and_the_loop_continues():
    clock, driver = Clock(), ScriptedDriver()
    with make(driver, clock) as ctl:
        assert ctl.wait_until_up(5)
        ctl.step()
        assert len(driver.applied) == 1
        driver.fail_apply = OSError("netlink went away")
        clock.t = 1.0
        r = ctl.step()
        assert "netlink went away" in r.errors["s1"] and not ctl.switch_up("s1")
        clock.t = 1.05
        ctl.step()
        settle(ctl)
        assert len(driver.connect_calls) == 1  # backoff 0.1 s not over yet
        clock.t = 1.2
        ctl.step()
        settle(ctl)
        clock.t = 1.3
        r = ctl.step()
        assert ctl.switch_up("s1") and r.writes["s1"].inserted == 1
        assert len(driver.connect_calls) == 2


def test_one_apply_per_switch_per_epoch_with_the_full_desired_state():
    clock, driver = Clock(), ScriptedDriver()
    with make(driver, clock) as ctl:
        assert ctl.wait_until_up(5)
        for seq in range(1, 4):
            for job in (1, 2):
                ctl.ingest_report(Report(job_id=job, group_id=0, seq=seq, tlr=0.1 * job * seq, loss=0, msr=1,
                                         rate_kbps=1, total=1, delivered=0, lost=0, epoch=seq).encode(), "h")
            ctl.step()
        assert len(driver.applied) == 3
        assert {(r.job_id, r.qid) for r in driver.applied[-1].job_rules} == {(1, 2), (2, 4)}
        assert len(driver.applied[-1].tlr_rules) == 8 and len(driver.applied[-1].ecn_rules) == 1
