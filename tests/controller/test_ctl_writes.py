"""The P4Runtime write path when the switch cannot take everything at once: updates wait in the order they were
asked for (a job changed again keeps its place and goes out at its newest value), losing jobs go first and the
metrics say so, and a backlog drains as the switch answers, between epochs."""
from __future__ import annotations

import threading

import pytest

from netapprox.controller.config import ControllerConfig, PolicyConfig, ReportConfig, SwitchConfig
from netapprox.controller.drivers import Driver
from netapprox.controller.errors import SwitchUnavailable
from netapprox.controller.model import SwitchState, TableUpdates, WriteSummary
from netapprox.controller.runtime import Runtime

from ctl_fixtures import P4INFO


def _updates(jobs, static=False, urgent=()):
    return TableUpdates(static=static, jobs=jobs, urgent=frozenset(urgent))


def job_entries(fake_server) -> dict[int, int]:
    return {int.from_bytes(e.match[0].exact.value, "big"): int.from_bytes(e.action.action.params[0].value, "big")
            for e in fake_server.entries(33554435)}


def sent_jobs(fake_server, first_write: int) -> list[int]:
    return [int.from_bytes(u.entity.table_entry.match[0].exact.value, "big")
            for w in fake_server.writes[first_write:] for u in w.updates]


def test_waiting_updates_go_out_oldest_first_not_by_job_id(make_driver, fake_server):
    driver = make_driver(max_updates_per_s=10.0)
    driver.connect()
    driver.apply_updates(lambda: SwitchState(), _updates({}, static=True))
    driver.writes.tokens = 0
    driver.apply_updates(lambda: pytest.fail("unexpected"), _updates({900: 2, 901: 2}))  # no budget: both wait
    driver.apply_updates(lambda: pytest.fail("unexpected"), _updates({5: 3, 900: 4}))  # 900 changes again
    assert driver.deferred_updates == 3 and driver.write_stats["coalesced"] == 1
    first = len(fake_server.writes)
    driver.writes.tokens = 2
    driver.apply_updates(lambda: pytest.fail("unexpected"), _updates({}))
    driver.flush()
    assert sent_jobs(fake_server, first) == [900, 901]  # asked for first, though 5 has the lowest id
    assert job_entries(fake_server) == {900: 4, 901: 2}  # 900 at its newest queue; its first one never sent
    assert driver.deferred_updates == 1


def test_losing_jobs_jump_the_line_and_the_metrics_say_so(make_driver, fake_server):
    driver = make_driver(max_updates_per_s=10.0)
    driver.connect()
    driver.apply_updates(lambda: SwitchState(), _updates({}, static=True))
    driver.writes.tokens = 0
    driver.apply_updates(lambda: pytest.fail("unexpected"), _updates({j: 2 for j in range(1, 6)}, urgent={4}))
    assert driver.deferred_updates == 5 and driver.deferred_urgent == 1
    first = len(fake_server.writes)
    driver.writes.tokens = 2
    driver.apply_updates(lambda: pytest.fail("unexpected"), _updates({}))
    driver.flush()
    assert sent_jobs(fake_server, first) == [4, 1]
    assert driver.write_stats["prioritised"] == 1 and driver.deferred_urgent == 0


def test_runtime_exports_the_backlog_and_prioritised_metrics(fake_server, bmv2_json):
    options = {"address": fake_server.address, "p4info": str(P4INFO), "bmv2_json": str(bmv2_json),
               "max_updates_per_s": 10.0}
    config = ControllerConfig(switches=(SwitchConfig(name="s1", options=options),), reports=ReportConfig(port=-1),
                              policy=PolicyConfig(), counters_every=0)
    with Runtime(config, background_connect=False) as rt:
        assert rt.connect(5)
        rt.epoch(now=0.0)
        driver = rt.driver("s1")
        driver.writes.tokens = 0
        driver.apply_updates(lambda: pytest.fail("unexpected"), _updates({1: 2, 2: 3}, urgent={2}))
        text = rt.metrics_text()
        assert 'netapprox_write_backlog{switch="s1"} 2.0' in text
        assert 'netapprox_write_backlog_urgent{switch="s1"} 1.0' in text
        driver.writes.tokens = 1
        rt.epoch(now=0.02)
        text = rt.metrics_text()
        assert 'netapprox_write_prioritised_total{switch="s1"} 1.0' in text
        assert 'netapprox_write_backlog_urgent{switch="s1"} 0.0' in text


def test_a_backlog_drains_as_the_switch_answers_between_epochs(make_driver, fake_server):
    """With one Write in flight allowed, updates asked for while the switch works go out as soon as it answers
    (``send_pending``, called by the run loop between epochs), not one window per epoch."""
    driver = make_driver(max_inflight_writes=1)
    driver.connect()
    driver.apply_updates(lambda: SwitchState(), _updates({}, static=True))
    release = threading.Event()
    fake_server.on_write = lambda request, stamp: release.wait(5)
    driver.apply_updates(lambda: pytest.fail("unexpected"), _updates({1: 2}))
    driver.apply_updates(lambda: pytest.fail("unexpected"), _updates({2: 3, 3: 4}))
    assert driver.pending_writes() and driver.deferred_updates == 2
    assert driver.send_pending().writes == 0  # the switch has not answered: nothing more goes out
    fake_server.on_write = None
    release.set()
    for _ in range(500):
        if driver.send_pending().writes:
            break
        threading.Event().wait(0.01)  # the fake switch answers on its own thread
    driver.flush()
    assert job_entries(fake_server) == {1: 2, 2: 3, 3: 4} and not driver.pending_writes()


class BacklogDriver(Driver):
    """A driver double holding ``backlog`` updates back until ``send_pending`` is called ``rounds`` times."""

    def __init__(self, rounds: int, fail: Exception | None = None) -> None:
        self.rounds = rounds
        self.sent = 0
        self.fail = fail

    def connect(self):
        pass

    def apply(self, desired):
        return WriteSummary()

    def apply_updates(self, desired, updates):
        return WriteSummary()

    def read_counters(self):
        raise AssertionError("counters are off")

    def pending_writes(self):
        return self.sent < self.rounds

    def send_pending(self):
        if self.fail is not None:
            raise self.fail
        self.sent += 1
        return WriteSummary(modified=2)

    def drain_packet_in(self):
        return []

    def close(self):
        pass


def _runtime(driver) -> Runtime:
    config = ControllerConfig(reports=ReportConfig(port=-1), policy=PolicyConfig(), counters_every=0)
    rt = Runtime(config, drivers={"s1": driver}, background_connect=False)
    assert rt.connect(1)
    rt.epoch(now=0.0)  # the first, full apply
    return rt


def test_the_loop_sends_waiting_updates_between_epochs_and_counts_them():
    driver = BacklogDriver(rounds=3)
    with _runtime(driver) as rt:
        assert rt._pump_writes() is True and rt._pump_writes() is True
        assert rt._pump_writes() is False  # the third round emptied the backlog
        assert driver.sent == 3 and rt._pump_writes() is False and driver.sent == 3
        assert 'netapprox_table_updates_total{op="modify",switch="s1"} 6.0' in rt.metrics_text()


def test_a_switch_lost_while_sending_waiting_updates_is_marked_down():
    driver = BacklogDriver(rounds=5, fail=SwitchUnavailable("s1", "gone"))
    with _runtime(driver) as rt:
        assert rt._pump_writes() is False
        assert not rt.switch_up("s1")
