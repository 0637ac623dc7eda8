"""Reconnects without an outage, against the fake P4Runtime server (controller/p4runtime/fake_server.py): a controller
killed and restarted, a switch restarted, ``push_pipeline = false``, reconciling exactly the difference, and
persistent write errors (refused entries, a full queue_by_job) that never loop."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from google.protobuf import text_format
from netapprox.controller.p4runtime.protos import p4info_pb2, p4runtime_pb2

from netapprox.controller.config import ControllerConfig, ReportConfig, SwitchConfig
from netapprox.controller.errors import P4RuntimeWriteError, PipelineError
from netapprox.controller.model import (
    ClassRule,
    EcnRule,
    JobRule,
    Route,
    SwitchState,
    TableUpdates,
    TagRule,
    TlrRule,
)
from netapprox.controller.p4runtime import bmv2_thrift
from netapprox.controller.p4runtime.bmv2_thrift import Bmv2VersionError
from netapprox.controller.p4runtime.classification import TagEntry, tag_entries
from netapprox.controller.p4runtime.driver import P4RuntimeDriver
from netapprox.controller.p4runtime.options import P4RuntimeOptions
from netapprox.controller.p4runtime.p4info import P4Info
from netapprox.controller.runtime import Runtime
from netapprox.controller.p4runtime.fake_server import _entry_key
from support.paper_policy import PolicyConfig

from ctl_fixtures import (
    P4INFO,
    Hosts,
    controller_toml,
    free_udp_port,
    job_entries,
    report,
    start_controller,
    stop_process,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]
ROUTES_V4, QUEUE_BY_JOB, QUEUE_BY_TAG = 33554433, 33554435, 33554436
ROUTE = Route("10.0.0.1", 32, 1, "02:00:00:00:01:00", "02:00:00:00:00:01")
STATE = SwitchState(
    routes=frozenset({ROUTE, Route("10.0.0.2", 32, 2, "02:00:00:00:01:00", "02:00:00:00:00:02")}),
    class_rules=frozenset({ClassRule(1, 6, 0xFF, 5001, 0xFFFF, 0)}),
    job_rules=frozenset({JobRule(5, 2), JobRule(9, 4)}),
    tag_rules=frozenset({TagRule(2, 0, 9, 0, 999, 1)}),
    tlr_rules=frozenset({TlrRule(0, 4095, 1)}),
    ecn_rules=frozenset({EcnRule(0, 20)}),
)


def updates_of(write: p4runtime_pb2.WriteRequest, table_id: int | None = None) -> list[tuple[int, int]]:
    """(update type, table id) of a Write's table updates."""
    return [(u.type, u.entity.table_entry.table_id) for u in write.updates if u.entity.HasField("table_entry")
            and table_id in (None, u.entity.table_entry.table_id)]


# --- a controller killed and restarted ---------------------------------------------------------------------


def test_a_killed_controller_restarts_without_touching_the_switch(fake_server, bmv2_json, tmp_path):
    """SIGKILL the controller process mid-run and start it again: the pipeline is not pushed again, routes and
    job entries are never deleted, counters are not reset, and the new process writes nothing because nothing
    differs (same routes, same jobs reported)."""
    report_port = free_udp_port()
    config = tmp_path / "controller.toml"
    config.write_text(controller_toml(
        address=fake_server.address, p4info=P4INFO, bmv2_json=bmv2_json, report_port=report_port,
        decision_log=tmp_path / "decisions.jsonl",
        routes=[("10.0.0.1/32", 1, "02:00:00:00:00:01"), ("10.0.0.2/32", 2, "02:00:00:00:00:02")],
        controller="counters_every = 5", policy="job_timeout_s = 2.0",
        options="connect_timeout_s = 3.0\nadopt_jobs_s = 3.0"))
    log = tmp_path / "controller.log"
    removed: list[str] = []
    route_counts: list[int] = []

    def on_write(request, stamp):  # every moment a route or a job entry is missing would be an outage
        for u in request.updates:
            e = u.entity.table_entry
            if u.type == p4runtime_pb2.Update.DELETE and e.table_id in (ROUTES_V4, QUEUE_BY_JOB):
                removed.append(text_format.MessageToString(e, as_one_line=True))
        route_counts.append(len(fake_server.entries(ROUTES_V4)))

    first = second = None
    try:
        with Hosts(report_port):
            first = start_controller(config, log)
            assert wait_until(lambda: job_entries(fake_server) == {5: 2, 6: 6}, 15), log.read_text()[-2000:]
            assert len(fake_server.entries(ROUTES_V4)) == 2
            fake_server.on_write = on_write
            # traffic so far, as the switch counted it
            job5 = next(e for e in fake_server.entries(QUEUE_BY_JOB) if e.match[0].exact.value == b"\x05")
            fake_server.direct_counts[_entry_key(job5)] = 1000
            fake_server.counters[(301989889, 2 * 8 + 2)] = (1000, 1_500_000)
            writes_before = len(fake_server.writes)
            arbitrations = len(fake_server.arbitrations)

            first.send_signal(signal.SIGKILL)
            first.wait(10)
            time.sleep(0.3)  # the switch goes on forwarding on its own
            second = start_controller(config, log)
            assert wait_until(lambda: len(fake_server.arbitrations) > arbitrations, 15), log.read_text()[-2000:]
            time.sleep(1.5)  # epochs with reports: nothing to change
            assert second.poll() is None, log.read_text()[-2000:]
            assert len(fake_server.pipelines) == 1  # not pushed again
            assert removed == []
            assert job_entries(fake_server) == {5: 2, 6: 6}
            assert len(fake_server.entries(ROUTES_V4)) == 2 and min(route_counts, default=2) == 2
            assert fake_server.direct_counts[_entry_key(job5)] == 1000  # the entry (and its counter) lived on
            assert fake_server.counters[(301989889, 2 * 8 + 2)] == (1000, 1_500_000)
            new_writes = fake_server.writes[writes_before:]
            assert [updates_of(w) for w in new_writes if updates_of(w)] == [], "the restart rewrote entries"
    finally:
        for proc in (first, second):
            if proc is not None:
                stop_process(proc)
    text = log.read_text()
    assert "runs our pipeline already" in text and "entries read back to reconcile" in text, text[-2000:]


def runtime_for(fake_server, bmv2_json, tmp_path, **options) -> Runtime:
    opts = {"address": fake_server.address, "p4info": str(P4INFO), "bmv2_json": str(bmv2_json),
            "connect_timeout_s": 2.0, **options}
    config = ControllerConfig(
        switches=(SwitchConfig(name="s1", options=opts, routes=(ROUTE,)),),
        policy=PolicyConfig(job_timeout_s=5.0), reports=ReportConfig(bind="127.0.0.1", port=0),
        decision_log=str(tmp_path / "decisions.jsonl"), epoch_s=0.02, reconnect_initial_s=0.05, reconnect_max_s=0.5)
    return Runtime(config)


def test_a_restarted_controller_keeps_jobs_it_has_no_report_for_yet(fake_server, bmv2_json, tmp_path):
    """In one process, for exact control: the second controller adopts the first one's job entries, moves the
    one whose host reports a new TLR (MODIFY: the counter stays), and deletes the silent one only after
    ``adopt_jobs_s``."""
    with runtime_for(fake_server, bmv2_json, tmp_path) as ctl:
        assert ctl.connect(5)
        ctl.ingest(report(5, 1, 0.30), "h")
        ctl.ingest(report(9, 1, 0.55), "h")
        ctl.epoch()
        assert job_entries(fake_server) == {5: 2, 9: 4}
    job5 = next(e for e in fake_server.entries(QUEUE_BY_JOB) if e.match[0].exact.value == b"\x05")
    fake_server.direct_counts[_entry_key(job5)] = 77
    writes = len(fake_server.writes)
    with runtime_for(fake_server, bmv2_json, tmp_path, adopt_jobs_s=0.5) as ctl:
        assert ctl.connect(5)
        assert ctl.driver("s1").entries_read_back == 1 + 8 + 1 + 2  # route, TLR ranges, ECN, jobs
        r = ctl.epoch()
        assert r.writes["s1"].writes == 0 and job_entries(fake_server) == {5: 2, 9: 4}
        ctl.ingest(report(5, 1, 0.80), "h")  # job 5 now wants queue 6; job 9 is silent
        r = ctl.epoch()
        assert (r.writes["s1"].modified, r.writes["s1"].deleted) == (1, 0)
        assert job_entries(fake_server) == {5: 6, 9: 4}
        time.sleep(0.6)
        r = ctl.epoch()
        assert r.writes["s1"].deleted == 1 and job_entries(fake_server) == {5: 6}
    assert len(fake_server.pipelines) == 1
    assert fake_server.direct_counts[_entry_key(job5)] == 77  # modified in place, never deleted
    kinds = [updates_of(w, QUEUE_BY_JOB) for w in fake_server.writes[writes:]]
    assert [k for k in kinds if k] == [[(p4runtime_pb2.Update.MODIFY, QUEUE_BY_JOB)],
                                       [(p4runtime_pb2.Update.DELETE, QUEUE_BY_JOB)]]


def test_a_restarted_switch_is_fully_rearmed_within_two_seconds(fake_server, bmv2_json, tmp_path):
    with runtime_for(fake_server, bmv2_json, tmp_path) as ctl:
        assert ctl.connect(5)
        ctl.ingest(report(5, 1, 0.30), "h")
        ctl.epoch()
        want = {(e.table_id, _entry_key(e)) for e in fake_server.entries()}
        assert len(want) == 1 + 8 + 1 + 1
        ctl.start()
        try:
            fake_server.restart(down_s=0.5)  # reboot: pipeline, tables and counters gone
            t0 = time.monotonic()
            assert wait_until(lambda: {(e.table_id, _entry_key(e)) for e in fake_server.entries()} == want, 5)
            rearmed_s = time.monotonic() - t0
        finally:
            ctl.stop()
    assert len(fake_server.pipelines) == 1  # the fresh switch got the pipeline (the first push was forgotten)
    assert rearmed_s < 2.0, f"re-armed after {rearmed_s:.2f} s"
    assert len(fake_server.meters) == 512  # the REPORT meter too


def test_push_pipeline_false_reconnects_and_reconciles(fake_server, make_driver):
    """Another tool owns the pipeline: the controller never pushes, finds the entries of its earlier session on a
    reconnect and writes nothing twice (no ALREADY_EXISTS)."""
    without = make_driver(push_pipeline=False)
    with pytest.raises(PipelineError, match="runs no forwarding pipeline and push_pipeline is false"):
        without.connect()
    owner = make_driver()
    fake_server.load_pipeline(owner.connection.pipeline_config())
    driver = make_driver(push_pipeline=False)
    driver.connect()
    driver.apply(STATE)
    entries = len(fake_server.entries())
    writes = len(fake_server.writes)
    driver.session.close()  # the connection drops
    driver.connect()
    assert driver.entries_read_back == entries
    assert fake_server.pipelines == []  # never pushed
    assert fake_server.writes[writes:] == []  # nothing differs: nothing written
    assert driver.apply(STATE).writes == 0


def test_a_reconnect_writes_exactly_the_difference(fake_server, make_driver):
    """Entries changed behind the controller's back while it was away: one foreign entry deleted, one changed
    route modified, one missing TLR entry inserted; everything else untouched."""
    driver = make_driver()
    driver.connect()
    driver.apply(STATE)
    driver.session.close()
    info = P4Info.load(P4INFO)
    other = P4RuntimeDriver("s1", P4RuntimeOptions(p4info=str(P4INFO)), p4info=info)
    with fake_server.lock:
        route = next(k for k, e in fake_server.tables.items() if e.table_id == ROUTES_V4
                     and e.match[0].lpm.value == b"\n\x00\x00\x01")
        changed = other.forwarding._entry(Route("10.0.0.1", 32, 3, "02:00:00:00:01:00", "02:00:00:00:00:01"))
        fake_server.tables[route] = changed  # port 3 instead of 1
        tlr = next(k for k, e in fake_server.tables.items() if e.table_id == 33554437)
        del fake_server.tables[tlr]
        foreign = other.classification.job_entry(JobRule(77, 3))
        fake_server.tables[_entry_key(foreign)] = foreign
    writes = len(fake_server.writes)
    driver.connect()
    (write,) = fake_server.writes[writes:]
    assert updates_of(write) == [(p4runtime_pb2.Update.DELETE, QUEUE_BY_JOB), (p4runtime_pb2.Update.MODIFY, ROUTES_V4),
                                 (p4runtime_pb2.Update.INSERT, 33554437)]
    assert driver.apply(STATE).writes == 0
    tags = sum(len(tag_entries(r)) for r in STATE.tag_rules)  # [0, 999] is 6 prefixes
    assert tags == 6 and len(fake_server.entries()) == len(STATE.routes) + 1 + 2 + tags + 1 + 1


def test_reconcile_matches_values_not_bytes(fake_server, make_driver):
    """A server that pads its bytestrings on Read (older PI) still matches what the controller wants."""
    driver = make_driver()
    driver.connect()
    driver.apply(STATE)
    driver.session.close()
    with fake_server.lock:
        for key, e in list(fake_server.tables.items()):
            padded = p4runtime_pb2.TableEntry()
            padded.CopyFrom(e)
            for m in padded.match:
                if m.HasField("exact"):
                    m.exact.value = m.exact.value.rjust(4, b"\x00")
            for p in padded.action.action.params:
                p.value = p.value.rjust(2, b"\x00")
            fake_server.tables[key] = padded
    writes = len(fake_server.writes)
    driver.connect()
    assert fake_server.writes[writes:] == []


# --- persistent write errors --------------------------------------------------------------------------------


def test_a_refused_entry_is_reported_once_and_retried_only_when_it_changes(fake_server, make_driver):
    driver = make_driver()
    driver.connect()
    fake_server.refuse = lambda u: ((3, "job 9 refused by the target") if u.entity.table_entry.match
                                    and u.entity.table_entry.match[0].exact.value == b"\t"
                                    and u.type != p4runtime_pb2.Update.DELETE else None)
    with pytest.raises(P4RuntimeWriteError, match="INVALID_ARGUMENT, 'job 9 refused"):
        driver.apply(STATE)
    assert driver.stats()["entries_refused"] == 1
    writes = len(fake_server.writes)
    for _ in range(3):  # epochs: nothing is sent again
        assert driver.apply(STATE).writes == 0
        driver.apply_updates(lambda: STATE, TableUpdates(static=False, jobs={}))
        driver.apply_updates(lambda: STATE, TableUpdates(static=True, jobs={}))
    assert len(fake_server.writes) == writes
    moved = SwitchState(**{**STATE.__dict__, "job_rules": frozenset({JobRule(5, 2), JobRule(9, 6)})})
    with pytest.raises(P4RuntimeWriteError):  # a new value: tried once more
        driver.apply(moved)
    assert len(fake_server.writes) == writes + 1
    fake_server.refuse = None
    moved2 = SwitchState(**{**STATE.__dict__, "job_rules": frozenset({JobRule(5, 2), JobRule(9, 5)})})
    assert driver.apply(moved2).inserted == 1 and job_entries(fake_server) == {5: 2, 9: 5}
    assert driver.stats()["entries_refused"] == 0


def test_a_refused_static_entry_does_not_loop_in_the_runtime(fake_server, bmv2_json, tmp_path):
    fake_server.refuse = lambda u: ((3, "bad route") if u.entity.table_entry.table_id == ROUTES_V4 else None)
    with runtime_for(fake_server, bmv2_json, tmp_path) as ctl:
        assert ctl.connect(5)
        r = ctl.epoch()
        assert "INVALID_ARGUMENT, 'bad route'" in r.errors["s1"]
        writes = len(fake_server.writes)
        for _ in range(5):
            r = ctl.epoch()
            assert "s1" not in r.errors
        assert len(fake_server.writes) == writes
        assert 'netapprox_entries_refused{switch="s1"} 1.0' in ctl.metrics_text()
        assert 'netapprox_write_errors_total{switch="s1"} 1.0' in ctl.metrics_text()


def small_job_table(size: int) -> P4Info:
    info = text_format.Parse(P4INFO.read_text(), p4info_pb2.P4Info())
    for t in info.tables:
        if t.preamble.id == QUEUE_BY_JOB:
            t.size = size
    return P4Info(info)


def test_jobs_beyond_the_table_size_wait_for_room(fake_server, bmv2_json, caplog):
    driver = P4RuntimeDriver("s1", P4RuntimeOptions(address=fake_server.address, p4info=str(P4INFO),
                                                    bmv2_json=str(bmv2_json)), p4info=small_job_table(3))
    try:
        driver.connect()
        jobs = {j: 2 for j in range(1, 6)}
        with caplog.at_level("WARNING"):
            summary = driver.apply(SwitchState(job_rules=frozenset(JobRule(j, q) for j, q in jobs.items())))
            driver.apply(SwitchState(job_rules=frozenset(JobRule(j, q) for j, q in jobs.items())))
        assert summary.inserted == 3 and job_entries(fake_server) == {1: 2, 2: 2, 3: 2}
        assert driver.stats()["jobs_without_entry"] == 2
        assert caplog.text.count("queue_by_job is full (3 entries)") == 1
        updates = TableUpdates(static=False, jobs={2: None})  # job 2 ends: job 4 gets its place
        driver.apply_updates(lambda: pytest.fail("unexpected"), updates)
        driver.flush()
        driver.apply_updates(lambda: pytest.fail("unexpected"), TableUpdates(static=False, jobs={}))
        driver.flush()
        assert job_entries(fake_server) == {1: 2, 3: 2, 4: 2}
        assert driver.stats()["jobs_without_entry"] == 1
    finally:
        driver.close()


def test_resource_exhausted_caps_the_job_table_where_the_switch_is_full(fake_server, make_driver, caplog):
    fake_server.capacity[QUEUE_BY_JOB] = 2  # the switch holds fewer than its P4Info says
    driver = make_driver()
    driver.connect()
    state = SwitchState(job_rules=frozenset(JobRule(j, 3) for j in range(1, 6)))
    with caplog.at_level("WARNING"), pytest.raises(P4RuntimeWriteError, match="RESOURCE_EXHAUSTED"):
        driver.apply(state)
    assert "RESOURCE_EXHAUSTED at 2 entries" in caplog.text
    writes = len(fake_server.writes)
    assert driver.apply(state).writes == 0 and len(fake_server.writes) == writes  # no retry loop
    assert len(job_entries(fake_server)) == 2 and driver.stats()["jobs_without_entry"] == 3


# --- the REPORT meter, the BMv2 version check ----------------------------------------------------------------


def test_the_report_meter_is_configured_once(fake_server, make_driver):
    driver = make_driver(report_rate_pps=50, report_burst=10)
    driver.connect()
    assert len(fake_server.meters) == 512
    assert {(c.cir, c.cburst, c.pir, c.pburst) for c in fake_server.meters.values()} == {(50, 10, 50, 10)}
    writes = len(fake_server.writes)
    driver.session.close()
    driver.connect()
    assert fake_server.writes[writes:] == []  # read back, already right


def fake_bmv2(tmp_path: Path, version: str) -> str:
    exe = tmp_path / f"simple_switch_grpc_{version.replace('.', '_')}"
    exe.write_text(f"#!/bin/sh\necho '{version}'\n")
    exe.chmod(0o755)
    return str(exe)


def test_an_old_bmv2_on_this_host_is_refused_at_start_up(tmp_path, monkeypatch):
    bmv2_thrift.bmv2_version.cache_clear()
    old, new = fake_bmv2(tmp_path, "1.14.0-0f5b6b6"), fake_bmv2(tmp_path, "1.15.1")
    with pytest.raises(Bmv2VersionError, match=r"switch 's1': .* is BMv2 1.14.0; NetApprox needs BMv2 >= 1.15.1"):
        P4RuntimeDriver("s1", P4RuntimeOptions(p4info=str(P4INFO), bmv2_binary=old))
    P4RuntimeDriver("s1", P4RuntimeOptions(p4info=str(P4INFO), bmv2_binary=new))
    P4RuntimeDriver("s1", P4RuntimeOptions(p4info=str(P4INFO), bmv2_binary=old, address="10.1.2.3:9559"))  # remote
    P4RuntimeDriver("s1", P4RuntimeOptions(p4info=str(P4INFO), bmv2_binary=old, check_bmv2_version=False))
    config = tmp_path / "c.toml"
    config.write_text(f'[[switch]]\nname = "s1"\n[switch.options]\np4info = "{P4INFO}"\nbmv2_binary = "{old}"\n')
    res = subprocess.run([sys.executable, "-m", "netapprox.controller", "--config", str(config)], capture_output=True,
                         text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert res.returncode == 2 and "is BMv2 1.14.0; NetApprox needs BMv2 >= 1.15.1" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


# --- the fake server itself enforces P4Runtime's encoding rules ----------------------------------------------


@pytest.mark.parametrize("mutate, code", [
    (lambda e: setattr(e.match[0].exact, "value", b"\x00\x05"), "INVALID_ARGUMENT"),   # not canonical
    (lambda e: setattr(e.match[0].exact, "value", b"\x01" + b"\x00" * 4), "OUT_OF_RANGE"),  # 40 bits in 32
    (lambda e: setattr(e, "priority", 3), "INVALID_ARGUMENT"),                           # exact table: no priority
    (lambda e: e.action.action.params[0].__setattr__("value", b"\x09"), "OUT_OF_RANGE"),  # qid 9 in 3 bits
    (lambda e: e.action.action.__setattr__("action_id", 16777219), "INVALID_ARGUMENT"),  # not this table's action
    (lambda e: e.ClearField("match"), "INVALID_ARGUMENT"),                                # exact field missing
])
def test_the_fake_server_refuses_bad_encodings(fake_server, make_driver, mutate, code):
    driver = make_driver()
    driver.connect()
    entry = p4runtime_pb2.TableEntry()
    entry.CopyFrom(driver.classification.job_entry(JobRule(5, 2)))
    mutate(entry)
    with pytest.raises(P4RuntimeWriteError, match=f"At index 0: {code}"):
        driver.session.write([p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT,
                                                   entity=p4runtime_pb2.Entity(table_entry=entry))])


def test_the_fake_server_refuses_dont_cares_and_missing_priorities(fake_server, make_driver):
    driver = make_driver()
    driver.connect()
    tag = driver.classification._tag_entry
    good = tag(TagEntry(2, 0, 9, 0, 0xFFFFFC00, 1))
    cases = []
    e = p4runtime_pb2.TableEntry()
    e.CopyFrom(good)
    e.priority = 0
    cases.append((e, "priority > 0"))
    e = p4runtime_pb2.TableEntry()
    e.CopyFrom(good)
    e.match[0].range.low, e.match[0].range.high = b"\x00", b"\xff"
    cases.append((e, "full range"))
    e = p4runtime_pb2.TableEntry()
    e.CopyFrom(good)
    e.match[1].ternary.mask = b"\x00"
    e.match[1].ternary.value = b"\x00"
    cases.append((e, "ternary mask 0"))
    e = p4runtime_pb2.TableEntry()
    e.CopyFrom(good)
    e.match[1].ternary.value = b"\x01"
    cases.append((e, "bits outside the mask"))
    for entry, message in cases:
        with pytest.raises(P4RuntimeWriteError, match=message):
            driver.session.write([p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT,
                                                       entity=p4runtime_pb2.Entity(table_entry=entry))])
    driver.session.write([p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT,
                                               entity=p4runtime_pb2.Entity(table_entry=good))])
    with pytest.raises(P4RuntimeWriteError, match="ALREADY_EXISTS"):
        driver.session.write([p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT,
                                                   entity=p4runtime_pb2.Entity(table_entry=good))])


def test_decision_log_records_reconnects(fake_server, bmv2_json, tmp_path):
    with runtime_for(fake_server, bmv2_json, tmp_path) as ctl:
        assert ctl.connect(5)
        ctl.epoch()
        assert 'netapprox_pipeline_pushes_total{switch="s1"} 1.0' in ctl.metrics_text()
    lines = [json.loads(x) for x in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    assert [x["event"] for x in lines].count("switch_up") == 1


def test_an_entry_refused_while_rearming_does_not_fail_the_connect(fake_server, make_driver):
    driver = make_driver()
    driver.connect()
    driver.apply(STATE)
    fake_server.restart()  # a fresh switch, and it now refuses job 9
    fake_server.refuse = lambda u: ((3, "no") if u.entity.table_entry.match
                                    and u.entity.table_entry.match[0].exact.value == b"\t" else None)
    driver.connect()  # re-arms everything else; job 9 is held back
    assert job_entries(fake_server) == {5: 2} and driver.stats()["entries_refused"] == 1
    writes = len(fake_server.writes)
    assert driver.apply(STATE).writes == 0 and len(fake_server.writes) == writes
