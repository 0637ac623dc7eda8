"""P4Runtime driver and runtime against the in-process fake P4Runtime server (controller/p4runtime/fake_server.py).

Protobufs are compared as text: the exact pipeline push, the exact batched write of an epoch.
"""
from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.request

import google.protobuf
import pytest
from google.protobuf import text_format
from google.protobuf.internal import api_implementation
from hypothesis import given, settings
from hypothesis import strategies as st
from netapprox.controller.p4runtime.protos import p4info_pb2, p4runtime_pb2

from netapprox.controller.config import ReportConfig, SwitchConfig
from netapprox.controller.errors import (
    NotPrimaryError,
    P4InfoError,
    P4RuntimeWriteError,
    PipelineError,
    SwitchUnavailable,
)
from netapprox.controller.runtime import Runtime
from netapprox.controller.model import ClassRule, EcnRule, JobRule, Route, SwitchState, TableUpdates, TagRule, TlrRule
from netapprox.controller.p4runtime import protos
from netapprox.controller.p4runtime.bmv2_thrift import queue_depth_commands, queue_depths
from netapprox.controller.p4runtime.connection import build_tofino_device_config
from netapprox.controller.p4runtime.driver import P4RuntimeDriver
from netapprox.controller.p4runtime.options import P4RuntimeOptions
from netapprox.controller.p4runtime.p4info import P4Info
from netapprox.controller.reference import reference_queue, tag_order
from netapprox.hostlib import wire
from netapprox.hostlib.wire import Report
from support.paper_policy import ControllerConfig, PolicyConfig
from support.fake_bfrt import FakeBfrtServer
from netapprox.controller.p4runtime.fake_server import _entry_key

from ctl_fixtures import BMV2_JSON_BYTES, P4INFO
from test_ctl_reports import frame


def as_text(message) -> str:
    return text_format.MessageToString(message)


def parse(kind, text: str):
    return text_format.Parse(text, kind())


STATE = SwitchState(
    routes=frozenset({Route("10.0.0.1", 32, 1, "02:00:00:00:01:00", "02:00:00:00:00:01")}),
    class_rules=frozenset({ClassRule(1, 6, 0xFF, 5001, 0xFFFF, 0)}),
    job_rules=frozenset({JobRule(5, 2), JobRule(9, 4)}),
    tag_rules=frozenset({TagRule(2, 0, 9, 0, 0xFFFFFFFF, 1)}),
    tlr_rules=frozenset({TlrRule(0, 4095, 1)}),
    ecn_rules=frozenset({EcnRule(0, 20)}),
)

SET_QUEUE = 'action { action { action_id: 16777219 params { param_id: 1 value: "%s" } } }'
SET_JOB_QUEUE = 'action { action { action_id: 16777230 params { param_id: 1 value: "%s" } } }'

FIRST_WRITE = """
device_id: 1
election_id { low: 1 }
updates { type: INSERT entity { table_entry {
  table_id: 33554433
  match { field_id: 1 lpm { value: "\\n\\000\\000\\001" prefix_len: 32 } }
  action { action { action_id: 16777217
    params { param_id: 1 value: "\\001" }
    params { param_id: 2 value: "\\002\\000\\000\\000\\001\\000" }
    params { param_id: 3 value: "\\002\\000\\000\\000\\000\\001" } } } } } }
updates { type: INSERT entity { table_entry {
  table_id: 33554434
  match { field_id: 1 ternary { value: "\\006" mask: "\\377" } }
  match { field_id: 2 ternary { value: "\\023\\211" mask: "\\377\\377" } }
  %(q0)s
  priority: 1 } } }
updates { type: INSERT entity { table_entry {
  table_id: 33554435 match { field_id: 1 exact { value: "\\005" } } %(q2)s } } }
updates { type: INSERT entity { table_entry {
  table_id: 33554435 match { field_id: 1 exact { value: "\\t" } } %(q4)s } } }
updates { type: INSERT entity { table_entry {
  table_id: 33554436
  match { field_id: 1 range { low: "\\000" high: "\\t" } }
  %(q1)s
  priority: 2 } } }
updates { type: INSERT entity { table_entry {
  table_id: 33554437
  match { field_id: 1 range { low: "\\000" high: "\\017\\377" } }
  %(q1)s
  priority: 1 } } }
updates { type: INSERT entity { table_entry {
  table_id: 33554438
  match { field_id: 1 exact { value: "\\000" } }
  action { action { action_id: 16777220 params { param_id: 1 value: "\\024" } } } } } }
""" % {"q0": SET_QUEUE % "\\000", "q1": SET_QUEUE % "\\001", "q2": SET_JOB_QUEUE % "\\002",
       "q4": SET_JOB_QUEUE % "\\004"}

# job 9 expired, job 5 moved to queue 6, job 7 new in queue 3: deletes, then modifies, then inserts
EPOCH_WRITE = """
device_id: 1
election_id { low: 1 }
updates { type: DELETE entity { table_entry { table_id: 33554435 match { field_id: 1 exact { value: "\\t" } } } } }
updates { type: MODIFY entity { table_entry {
  table_id: 33554435 match { field_id: 1 exact { value: "\\005" } } %(q6)s } } }
updates { type: INSERT entity { table_entry {
  table_id: 33554435 match { field_id: 1 exact { value: "\\007" } } %(q3)s } } }
""" % {"q6": SET_JOB_QUEUE % "\\006", "q3": SET_JOB_QUEUE % "\\003"}


def test_pipeline_push_is_exact(make_driver, fake_server):
    driver = make_driver(election_id=(0, 5))
    driver.connect()
    (push,) = fake_server.pipelines
    expected = p4runtime_pb2.SetForwardingPipelineConfigRequest(
        device_id=1, election_id=p4runtime_pb2.Uint128(high=0, low=5),
        action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
        config=p4runtime_pb2.ForwardingPipelineConfig(
            p4info=text_format.Parse(P4INFO.read_text(), p4info_pb2.P4Info()), p4_device_config=BMV2_JSON_BYTES))
    assert push.config.cookie.cookie != 0
    got = p4runtime_pb2.SetForwardingPipelineConfigRequest()
    got.CopyFrom(push)
    got.config.ClearField("cookie")
    assert as_text(got) == as_text(expected)
    # arbitration came first, on the stream, with the same election id
    assert as_text(fake_server.arbitrations[0]) == as_text(parse(
        p4runtime_pb2.MasterArbitrationUpdate, "device_id: 1 election_id { low: 5 }"))


def test_batched_writes_are_exact_and_an_unchanged_state_writes_nothing(make_driver, fake_server):
    driver = make_driver()
    driver.connect()
    summary = driver.apply(STATE)
    assert (summary.inserted, summary.modified, summary.deleted) == (7, 0, 0)
    assert as_text(fake_server.writes[-1]) == as_text(parse(p4runtime_pb2.WriteRequest, FIRST_WRITE))

    writes = len(fake_server.writes)
    assert driver.apply(STATE).writes == 0
    assert len(fake_server.writes) == writes  # nothing sent at all

    moved = SwitchState(routes=STATE.routes, class_rules=STATE.class_rules, tag_rules=STATE.tag_rules,
                        tlr_rules=STATE.tlr_rules, ecn_rules=STATE.ecn_rules,
                        job_rules=frozenset({JobRule(5, 6), JobRule(7, 3)}))
    summary = driver.apply(moved)
    assert (summary.inserted, summary.modified, summary.deleted) == (1, 1, 1)
    assert len(fake_server.writes) == writes + 1
    assert as_text(fake_server.writes[-1]) == as_text(parse(p4runtime_pb2.WriteRequest, EPOCH_WRITE))
    # the switch now holds exactly the desired entries
    assert len(fake_server.entries()) == 7


def test_per_update_errors_are_unpacked_and_the_rest_applied(make_driver, fake_server):
    driver = make_driver()
    driver.connect()
    # someone else installed job 9 behind our back: our INSERT of it fails, the others succeed
    foreign = driver.classification.job_entry(JobRule(9, 1))
    with fake_server.lock:
        fake_server.writes.clear()
    fake_server.tables[_entry_key(foreign)] = foreign
    with pytest.raises(P4RuntimeWriteError) as info:
        driver.apply(STATE)
    err = info.value
    assert [(e.index, e.code) for e in err.errors] == [(3, "ALREADY_EXISTS")]
    assert "At index 3: ALREADY_EXISTS, 'Match entry exists" in str(err)
    assert "exact { value: \"\\t\" }" in str(err)  # the failing update, as text
    assert err.total == 7
    # next epoch repairs it with a MODIFY instead of repeating the failing INSERT
    summary = driver.apply(STATE)
    assert (summary.inserted, summary.modified, summary.deleted) == (0, 1, 0)
    assert driver.apply(STATE).writes == 0


def test_unknown_p4info_name_says_did_you_mean(tmp_path, bmv2_json):
    info = text_format.Parse(P4INFO.read_text(), p4info_pb2.P4Info())
    for t in info.tables:
        if t.preamble.name.endswith("queue_by_job"):
            t.preamble.name = "NetApproxIngress.classification.queue_by_jobs"
    bad = tmp_path / "p4info.txtpb"
    bad.write_text(text_format.MessageToString(info))
    with pytest.raises(P4InfoError, match="no table named 'NetApproxIngress.classification.queue_by_job'. "
                                          "Did you mean 'NetApproxIngress.classification.queue_by_jobs'"):
        P4RuntimeDriver("s1", P4RuntimeOptions(p4info=str(bad), bmv2_json=str(bmv2_json)))
    with pytest.raises(P4InfoError, match="Did you mean 'qid'"):
        P4Info.load(P4INFO).action("NetApproxIngress.classification.set_queue").param("qdi")


def test_counters_are_read_per_port_queue_and_per_job(make_driver, fake_server):
    driver = make_driver(ports=(1, 2))
    driver.connect()
    driver.apply(STATE)
    enq, tx = driver.counters.enqueued_id, driver.counters.transmitted_id
    fake_server.counters[(enq, 1 * 8 + 2)] = (100, 150000)
    fake_server.counters[(tx, 1 * 8 + 2)] = (93, 139500)
    fake_server.counters[(enq, 2 * 8 + 0)] = (10, 1000)
    fake_server.counters[(tx, 2 * 8 + 0)] = (10, 1000)
    job5 = driver.classification.job_entry(JobRule(5, 2))
    fake_server.direct_counts[_entry_key(job5)] = 42
    reads = len(fake_server.reads)
    counters = driver.read_counters()
    by_queue = {(q.port, q.qid): (q.enqueued, q.transmitted, q.dropped) for q in counters.queues}
    assert len(by_queue) == 16  # every configured (port, queue), zeros included
    assert by_queue[(1, 2)] == (100, 93, 7)
    assert by_queue[(2, 0)] == (10, 10, 0)
    assert by_queue[(1, 7)] == (0, 0, 0)
    assert dict(counters.job_packets) == {5: 42, 9: 0}
    # one Read per call
    assert len(fake_server.reads) == reads + 1


def test_not_primary_is_a_typed_error(make_driver, fake_server):
    first = make_driver(election_id=(0, 10))
    first.connect()
    second = make_driver(election_id=(0, 3))
    with pytest.raises(NotPrimaryError, match="raise election_id"):
        second.connect()


def test_missing_pipeline_artifact_is_actionable(make_driver, tmp_path):
    driver = make_driver(bmv2_json=str(tmp_path / "missing.json"))
    with pytest.raises(PipelineError, match="make p4"):
        driver.connect()


def test_no_server_raises_switch_unavailable(bmv2_json):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    driver = P4RuntimeDriver("s1", P4RuntimeOptions(address=f"127.0.0.1:{port}", p4info=str(P4INFO),
                                                    bmv2_json=str(bmv2_json), connect_timeout_s=0.3))
    with pytest.raises(SwitchUnavailable, match="no P4Runtime server"):
        driver.connect()
    with pytest.raises(SwitchUnavailable, match="not connected"):
        driver.apply(STATE)
    driver.close()


def test_packet_in_frames_are_queued_with_their_ingress_port(make_driver, fake_server):
    driver = make_driver()
    driver.connect()
    fake_server.send_packet_in(b"frame-1", ingress_port=3)
    fake_server.send_packet_in(b"frame-2", ingress_port=7)
    deadline = time.monotonic() + 2
    got: list[tuple[bytes, int | None]] = []
    while len(got) < 2 and time.monotonic() < deadline:
        got += driver.drain_packet_in()
        time.sleep(0.01)
    assert got == [(b"frame-1", 3), (b"frame-2", 7)]


# --- the epoch loop on the fake server ------------------------------------------------------------------


def report(job: int, seq: int, tlr: float, group: int = 0) -> bytes:
    return Report(job_id=job, group_id=group, seq=seq, tlr=tlr, loss=0.0, msr=0.9, rate_kbps=1000, total=10,
                  delivered=0, lost=0, epoch=seq).encode()


def controller_for(fake_server, bmv2_json, tmp_path, **kw) -> Runtime:
    options = {"address": fake_server.address, "p4info": str(P4INFO), "bmv2_json": str(bmv2_json),
               "connect_timeout_s": 2.0}
    config = ControllerConfig(
        switches=(SwitchConfig(name="s1", options=options,
                               routes=(Route("10.0.0.1", 32, 1, "02:00:00:00:01:00", "02:00:00:00:00:01"),)),),
        policy=PolicyConfig(job_timeout_s=kw.pop("job_timeout_s", 1.0)),
        reports=ReportConfig(bind="127.0.0.1", port=0),
        decision_log=str(tmp_path / "decisions.jsonl"),
        reconnect_initial_s=0.05, reconnect_max_s=0.2, **kw)
    return Runtime(config)


def job_entries(fake_server) -> dict[int, int]:
    out = {}
    for e in fake_server.entries(33554435):
        out[int.from_bytes(e.match[0].exact.value, "big")] = int.from_bytes(e.action.action.params[0].value, "big")
    return out


def test_epoch_loop_follows_reports_and_writes_once_per_change(fake_server, bmv2_json, tmp_path):
    with controller_for(fake_server, bmv2_json, tmp_path) as ctl:
        assert ctl.connect(5)
        r = ctl.epoch(now=0.0)
        assert r.writes["s1"].inserted == 10  # route + 8 TLR ranges + ECN of queue 0
        ctl.ingest(report(5, 1, 0.30), "10.0.0.1", now=0.01)
        r = ctl.epoch(now=0.02)
        ctl.driver("s1").flush()  # epoch writes of job entries do not wait for the switch's answer
        assert dict(r.assignments) == {5: 2} and r.reports_accepted == 1
        assert job_entries(fake_server) == {5: 2}
        writes = len(fake_server.writes)
        r = ctl.epoch(now=0.04)  # nothing new: no write
        assert r.writes["s1"].writes == 0 and len(fake_server.writes) == writes
        ctl.ingest(report(5, 2, 0.80), "10.0.0.1", now=0.05)
        ctl.epoch(now=0.06)
        ctl.driver("s1").flush()
        assert job_entries(fake_server) == {5: 6} and len(fake_server.writes) == writes + 1
        r = ctl.epoch(now=1.2)  # job 5 stopped reporting: expired, entry deleted
        ctl.driver("s1").flush()  # the delete, like every job entry write, does not wait for the switch's answer
        assert dict(r.assignments) == {} and job_entries(fake_server) == {}
        assert [c.reason for c in r.changes] == ["expired"]
    lines = [json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    jobs = [(d["reason"], d["old_queue"], d["new_queue"]) for d in lines if d["event"] == "job"]
    assert jobs == [("new", None, 2), ("moved", 2, 6), ("expired", 6, None)]
    assert any(d["event"] == "switch_up" for d in lines)


def test_udp_reports_and_malformed_input_do_not_break_the_loop(fake_server, bmv2_json, tmp_path):
    with controller_for(fake_server, bmv2_json, tmp_path) as ctl:
        assert ctl.connect(5)
        ctl.epoch()
        host, port = ctl.report_address
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for junk in (b"", b"\xff" * 3, b"\x13" + b"\x00" * 60, report(0, 1, 0.5), report(8, 1, 0.5)[:-1]):
                s.sendto(junk, (host, port))
            s.sendto(report(8, 1, 0.55), (host, port))
            s.sendto(report(8, 1, 0.10), (host, port))  # replayed sequence number: dropped
        # packet-in: garbage frames, a report from a port its sender does not live behind, and one report for
        # job 12 inside Ethernet/IPv4/UDP from the port the switch routes its sender (10.0.0.1) to
        fake_server.send_packet_in(b"\x00" * 5)
        fake_server.send_packet_in(frame(b"not a report", src="10.0.0.1"))
        fake_server.send_packet_in(frame(report(13, 1, 0.9), src="10.0.0.1"), ingress_port=2)
        fake_server.send_packet_in(frame(report(14, 1, 0.9), src="10.0.0.9"), ingress_port=1)
        fake_server.send_packet_in(frame(report(12, 1, 0.9), src="10.0.0.1"), ingress_port=1)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and set(ctl.assignments) != {8, 12}:
            ctl.epoch()
            time.sleep(0.01)
        assert dict(ctl.assignments) == {8: 4, 12: 7}
        ctl.driver("s1").flush()
        assert job_entries(fake_server) == {8: 4, 12: 7}
        metrics = ctl.metrics_text()
        assert 'netapprox_reports_dropped_total{reason="stale_seq"} 1' in metrics
        assert 'netapprox_reports_dropped_total{reason="truncated"}' in metrics
        assert 'netapprox_reports_dropped_total{reason="not_udp"} 1' in metrics
        assert 'netapprox_reports_dropped_total{reason="wrong_port"} 2' in metrics  # jobs 13 and 14
        assert "netapprox_reports_accepted_total 2" in metrics


def test_reconnect_after_the_switch_restarts(fake_server, bmv2_json, tmp_path):
    with controller_for(fake_server, bmv2_json, tmp_path) as ctl:
        assert ctl.connect(5)
        ctl.ingest(report(5, 1, 0.3), "h")
        ctl.epoch()
        assert job_entries(fake_server) == {5: 2}
        fake_server.restart()  # reboot: pipeline and tables gone
        assert fake_server.entries() == []
        deadline = time.monotonic() + 5
        errors_seen = False
        while time.monotonic() < deadline:
            r = ctl.epoch()
            errors_seen |= "s1" in r.errors
            if ctl.switch_up("s1") and job_entries(fake_server) == {5: 2}:
                break
            time.sleep(0.02)
        assert errors_seen
        assert ctl.switch_up("s1")
        assert len(fake_server.pipelines) == 1  # re-pushed to the fresh server
        assert job_entries(fake_server) == {5: 2}
        assert len(fake_server.entries()) == 11  # everything re-installed
        assert 'netapprox_switch_reconnects_total{switch="s1"} 1' in ctl.metrics_text()
    events = [json.loads(line)["event"] for line in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    assert "switch_down" in events and events.count("switch_up") == 2


def test_several_switches_one_down_does_not_stall_the_other(fake_server, bmv2_json, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    common = {"p4info": str(P4INFO), "bmv2_json": str(bmv2_json)}
    config = ControllerConfig(
        switches=(SwitchConfig("s1", options={**common, "address": fake_server.address}),
                  SwitchConfig("s2", options={**common, "address": f"127.0.0.1:{dead}", "connect_timeout_s": 1.0})),
        reports=ReportConfig(port=-1), reconnect_initial_s=0.05)
    with Runtime(config) as ctl:
        assert ctl.connect(5, names=("s1",))
        ctl.ingest(report(3, 1, 0.6), "h")
        t0 = time.perf_counter()
        r = ctl.epoch()
        assert time.perf_counter() - t0 < 0.5  # the dead switch's connect attempt runs in the background
        assert r.writes["s1"].inserted >= 1 and "s2" in r.errors
        assert job_entries(fake_server) == {3: 4}


def test_metrics_endpoint_serves_prometheus_text(fake_server, bmv2_json, tmp_path):
    with controller_for(fake_server, bmv2_json, tmp_path, metrics_port=0, counters_every=1) as ctl:
        assert ctl.connect(5)
        ctl.ingest(report(5, 1, 0.3), "h")
        driver = ctl.driver("s1")
        fake_server.counters[(driver.counters.enqueued_id, 1 * 8 + 2)] = (50, 0)
        fake_server.counters[(driver.counters.transmitted_id, 1 * 8 + 2)] = (45, 0)
        r = ctl.epoch()
        assert r.counters["s1"].queues[0].dropped == 5
        host, port = ctl.metrics_address
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "# TYPE netapprox_queue_dropped_packets_total counter" in body
    assert 'netapprox_queue_dropped_packets_total{port="1",queue="2",switch="s1"} 5.0' in body
    assert 'netapprox_job_queue{atp_job="5"} 2.0' in body
    assert 'netapprox_switch_up{switch="s1"} 1.0' in body


def test_run_loop_writes_within_one_epoch_of_a_report(fake_server, bmv2_json, tmp_path):
    with controller_for(fake_server, bmv2_json, tmp_path, epoch_s=0.02) as ctl:
        assert ctl.connect(5)
        stop = threading.Event()
        runner = threading.Thread(target=ctl.run, args=(stop,))
        runner.start()
        try:
            time.sleep(0.1)
            n = len(fake_server.writes)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(report(77, 1, 0.99), ctl.report_address)
            assert fake_server.wait_for_writes(n + 1, timeout=2)
            assert job_entries(fake_server) == {77: 7}
        finally:
            stop.set()
            runner.join(5)
        assert not runner.is_alive()


# --- Tofino code path (against fakes: no Tofino here) -------------------------------------------------


@pytest.fixture
def bfrt_server():
    server = FakeBfrtServer(p4_name="netapprox").start()
    server.ports[136] = (1, list(range(8, 16)))  # dev_port 136: pipe 1, port group 1, pg_queues 8..15
    yield server
    server.stop()


def tofino_driver(make_driver, tmp_path, bfrt_server, **options):
    (tmp_path / "tofino.bin").write_bytes(b"BIN")
    (tmp_path / "context.json").write_bytes(b"{}")
    opts = dict(target="tofino", tofino_bin=str(tmp_path / "tofino.bin"), tofino_context=str(tmp_path / "context.json"),
                prog_name="netapprox", ports=(136,), buffer_packets=64, bfrt_address=bfrt_server.address)
    return make_driver(**{**opts, **options})


def test_tofino_pipeline_packing_tm_config_and_ecn_cells(make_driver, fake_server, tmp_path, bfrt_server):
    """bf_switchd over BfRt (a fake server): subscribe, bind to the program, strict priority and buffers written,
    then read back from the hardware; the TM's drop counters become the queues' drops."""
    driver = tofino_driver(make_driver, tmp_path, bfrt_server)
    driver.connect()
    assert driver.queue_config_error is None
    assert fake_server.pipelines[0].config.p4_device_config == (
        b"\x09\x00\x00\x00netapprox" b"\x03\x00\x00\x00BIN" b"\x02\x00\x00\x00{}")
    assert build_tofino_device_config("p", b"", b"") == b"\x01\x00\x00\x00p" + b"\x00" * 8
    methods = [m for m, _ in bfrt_server.requests]
    assert methods[:3] == ["StreamChannel", "SetForwardingPipelineConfig", "GetForwardingPipelineConfig"]
    bind = bfrt_server.requests[1][1]
    assert bind.action == 0 and [c.p4_name for c in bind.config] == ["netapprox"]  # BIND to the program
    writes = [r for m, r in bfrt_server.requests if m == "Write"]
    assert len(writes) == 16 and methods.index("Write") < len(methods) - 1 - methods[::-1].index("Read")
    assert all(w.target.pipe_id == 1 for w in writes)
    sched = "tf1.tm.queue.sched_cfg"
    assert [bfrt_server.field_value(sched, 1, (1, 8 + q), "max_priority") for q in range(8)] == \
        ["7", "6", "5", "4", "3", "2", "1", "0"]
    assert [bfrt_server.field_value(sched, 1, (1, 8 + q), "min_priority") for q in range(8)] == \
        ["7", "6", "5", "4", "3", "2", "1", "0"]
    buf = "tf1.tm.queue.buffer"
    assert [bfrt_server.field_value(buf, 1, (1, 8 + q), "pool_max_cells") for q in range(8)] == \
        [36 * 19] + [(8 - k) * 19 for k in range(1, 8)]
    assert {bfrt_server.field_value(buf, 1, (1, 8 + q), "pool_id") for q in range(8)} == {"EG_APP_POOL_0"}
    assert {bfrt_server.field_value(buf, 1, (1, 8 + q), "dynamic_baf") for q in range(8)} == {"DISABLE"}
    assert {bfrt_server.field_value(buf, 1, (1, 8 + q), "guaranteed_cells") for q in range(8)} == {0}
    driver.apply(SwitchState(ecn_rules=frozenset({EcnRule(0, 20)})))
    (entry,) = fake_server.entries(33554438)
    assert int.from_bytes(entry.action.action.params[0].value, "big") == 20 * 19
    # TM drops: queue 3 of port 136 is pg_queue 11
    bfrt_server.drops[(1, 1, 11)] = 17
    fake_server.counters[(driver.counters.enqueued_id, 136 * 8 + 3)] = (100, 0)
    fake_server.counters[(driver.counters.transmitted_id, 136 * 8 + 3)] = (80, 0)  # 3 still queued: not drops
    q3 = next(q for q in driver.read_counters().queues if (q.port, q.qid) == (136, 3))
    assert (q3.enqueued, q3.transmitted, q3.dropped) == (100, 80, 17)
    assert driver.stats()["queue_config_ok"] == 1.0


def test_tofino_tm_buffers_scale_with_approx_buffer_unit(make_driver, fake_server, tmp_path, bfrt_server):
    """``approx_buffer_unit`` 4 on a 400-packet port: queue k >= 1 gets 4 x (8 - k) packets' cells, queue 0 the
    rest, written over BfRt and read back as asked."""
    driver = tofino_driver(make_driver, tmp_path, bfrt_server, buffer_packets=400, approx_buffer_unit=4)
    driver.connect()
    assert driver.queue_config_error is None
    assert [bfrt_server.field_value("tf1.tm.queue.buffer", 1, (1, 8 + q), "pool_max_cells") for q in range(8)] == \
        [(400 - 4 * 28) * 19] + [4 * (8 - k) * 19 for k in range(1, 8)]


def test_tofino_tm_not_as_asked_fails_loudly(make_driver, fake_server, tmp_path, bfrt_server, caplog):
    """The hardware keeps fewer cells than asked: the read-back names the field, the log says so at ERROR, the
    metric says 0; forwarding is still programmed."""
    bfrt_server.max_pool_cells = 100
    driver = tofino_driver(make_driver, tmp_path, bfrt_server)
    with caplog.at_level("ERROR"):
        driver.connect()
    assert "pool_max_cells is 100, asked 684" in driver.queue_config_error
    assert "NOT configured" in caplog.text and "pool_max_cells is 100" in caplog.text
    assert driver.stats()["queue_config_ok"] == 0.0
    driver.apply(STATE)
    assert len(fake_server.entries()) == 7


def test_tofino_bfrt_errors_are_actionable(make_driver, fake_server, tmp_path, bfrt_server):
    bfrt_server.p4_name = "other_program"
    driver = tofino_driver(make_driver, tmp_path, bfrt_server)
    driver.connect()
    assert driver.queue_config_error.startswith(f"BfRt server at {bfrt_server.address}: INVALID_ARGUMENT")
    driver.close()  # one controller per election id on a device at a time (P4Runtime arbitration)
    bfrt_server.p4_name = "netapprox"
    driver = tofino_driver(make_driver, tmp_path, bfrt_server, ports=(7,))  # a port not added
    driver.connect()
    assert "dev_port 7" in driver.queue_config_error and "is the port added?" in driver.queue_config_error


def test_tofino_without_artifacts_says_what_to_set(make_driver):
    driver = make_driver(target="tofino")
    with pytest.raises(PipelineError, match="device_config, or tofino_bin and tofino_context"):
        driver.connect()


# --- BMv2 queue depths through the Thrift CLI (a stand-in CLI records its stdin) --------------------------


def fake_cli(tmp_path, output: str = "RuntimeCmd: ") -> tuple[str, object]:
    log = tmp_path / "cli-stdin.txt"
    script = tmp_path / "simple_switch_CLI"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/cli-args.txt\ncat > {log}\necho '{output}'\n")
    script.chmod(0o755)
    return str(script), log


def test_bmv2_queue_depths_are_set_through_the_cli(make_driver, tmp_path):
    cli, log = fake_cli(tmp_path)
    driver = make_driver(ports=(1, 2), thrift_port=9090, cli=cli, buffer_packets=64)
    driver.connect()
    assert driver.queue_config_error is None
    assert (tmp_path / "cli-args.txt").read_text().split() == ["--thrift-port", "9090"]
    lines = log.read_text().splitlines()
    assert lines[:8] == ["set_queue_depth 36 1 7", "set_queue_depth 7 1 6", "set_queue_depth 6 1 5",
                         "set_queue_depth 5 1 4", "set_queue_depth 4 1 3", "set_queue_depth 3 1 2",
                         "set_queue_depth 2 1 1", "set_queue_depth 1 1 0"]
    assert len(lines) == 16 and lines[8] == "set_queue_depth 36 2 7"


def test_bmv2_cli_failure_is_reported_but_forwarding_still_programmed(make_driver, tmp_path, fake_server):
    cli, _ = fake_cli(tmp_path, output="Error: Could not connect to thrift client on port 9090")
    driver = make_driver(ports=(1,), thrift_port=9090, cli=cli)
    driver.connect()
    assert "Could not connect" in driver.queue_config_error
    driver.apply(STATE)
    assert len(fake_server.entries()) == 7


class FakeThriftSwitch:
    """Answers simple_switch Thrift calls on loopback, recording (method, args); refuses ports > 100."""

    def __init__(self):
        self.calls = []
        self._srv = socket.socket()
        self._srv.bind(("127.0.0.1", 0))
        self._srv.listen(1)
        self.port = self._srv.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        try:
            conn, _ = self._srv.accept()
        except OSError:
            return
        with conn:
            f = conn.makefile("rb")
            while True:
                head = f.read(4)
                if len(head) < 4:
                    return
                (name_len,) = struct.unpack("!I", f.read(4))
                name = f.read(name_len).decode()
                (seq,) = struct.unpack("!i", f.read(4))
                args = []
                while True:
                    ttype = f.read(1)[0]
                    if ttype == 0:
                        break
                    f.read(2)
                    args.append(struct.unpack("!i", f.read(4))[0] if ttype == 8 else struct.unpack("!q", f.read(8))[0])
                self.calls.append((name, tuple(args)))
                reply_name = name.split(":", 1)[1].encode()
                body = b""
                if args[0] > 100:  # InvalidQueueOperation {code: 1}
                    body = struct.pack("!bh", 12, 1) + struct.pack("!bhi", 8, 1, 1) + b"\x00"
                conn.sendall(struct.pack("!iI", -2147418110, len(reply_name)) + reply_name + struct.pack("!i", seq)
                             + body + b"\x00")

    def close(self):
        self._srv.close()


def test_bmv2_queue_depths_over_thrift_directly(make_driver):
    switch = FakeThriftSwitch()
    try:
        driver = make_driver(ports=(3,), thrift_port=switch.port, buffer_packets=100)
        driver.connect()
        assert driver.queue_config_error is None
        assert switch.calls == [("simple_switch:set_egress_priority_queue_depth", (3, 7 - q, d))
                                for q, d in enumerate([72, 7, 6, 5, 4, 3, 2, 1])]
    finally:
        switch.close()


def test_bmv2_queue_depths_scale_with_approx_buffer_unit(make_driver, tmp_path):
    """``approx_buffer_unit`` 2: queue k >= 1 gets 2 x (8 - k) packets and queue 0 the rest, in the commands, over
    Thrift and through the CLI alike; unset, the paper's k-MTU queues (the tests above)."""
    assert queue_depths([1], 100, 2) == [(1, 7 - q, d) for q, d in enumerate([44, 14, 12, 10, 8, 6, 4, 2])]
    assert queue_depths([1], 100) == [(1, 7 - q, d) for q, d in enumerate([72, 7, 6, 5, 4, 3, 2, 1])]
    two = ["set_queue_depth 8 1 7", "set_queue_depth 14 1 6", "set_queue_depth 12 1 5", "set_queue_depth 10 1 4",
           "set_queue_depth 8 1 3", "set_queue_depth 6 1 2", "set_queue_depth 4 1 1", "set_queue_depth 2 1 0"]
    commands = queue_depth_commands([2, 1], 64, 2)
    assert commands[:8] == two and len(commands) == 16 and commands[8] == "set_queue_depth 8 2 7"
    assert queue_depth_commands([1], 64)[:2] == ["set_queue_depth 36 1 7", "set_queue_depth 7 1 6"]
    with pytest.raises(ValueError, match="leaves nothing for queue 0"):
        queue_depths([1], 64, 3)
    switch = FakeThriftSwitch()
    try:
        driver = make_driver(ports=(3,), thrift_port=switch.port, buffer_packets=100, approx_buffer_unit=2)
        driver.connect()
        assert driver.queue_config_error is None
        assert switch.calls == [("simple_switch:set_egress_priority_queue_depth", (3, 7 - q, d))
                                for q, d in enumerate([44, 14, 12, 10, 8, 6, 4, 2])]
        driver.close()  # one controller per election id on a device at a time
    finally:
        switch.close()
    cli, log = fake_cli(tmp_path)
    driver = make_driver(ports=(1,), thrift_port=9090, cli=cli, buffer_packets=64, approx_buffer_unit=2)
    driver.connect()
    assert driver.queue_config_error is None and log.read_text().splitlines() == two


def test_bmv2_thrift_refusal_is_reported(make_driver):
    switch = FakeThriftSwitch()
    try:
        driver = make_driver(ports=(300,), thrift_port=switch.port)
        driver.connect()
        assert "InvalidQueueOperation" in driver.queue_config_error
    finally:
        switch.close()


def test_p4info_names_resolve_through_a_pipe_prefix(tmp_path):
    info = text_format.Parse(P4INFO.read_text(), p4info_pb2.P4Info())
    for t in list(info.tables) + list(info.actions) + list(info.counters) + list(info.direct_counters):
        if t.preamble.name.startswith("NetApprox"):
            t.preamble.name = "pipe." + t.preamble.name
            t.preamble.alias = ""
    p4info = P4Info(info)
    assert p4info.table("NetApproxIngress.classification.queue_by_job").id == 33554435
    assert p4info.counter_id("NetApproxEgress.transmitted_packets") == 301989890
    P4RuntimeDriver("s1", P4RuntimeOptions(), p4info=p4info)  # every contract name resolves


def test_queue_by_job_uses_its_own_action_from_action_refs():
    """queue_by_job's action is set_job_queue(qid) in both programs (docs/architecture.md); the others set_queue.
    The driver takes each table's action from the P4Info's action_refs, not from a fixed name."""
    driver = P4RuntimeDriver("tor1", P4RuntimeOptions(target="tofino"), p4info=P4Info.load(P4INFO))
    state = SwitchState(job_rules=frozenset({JobRule(5, 2)}), tlr_rules=frozenset({TlrRule(0, 4095, 1)}))
    actions = {c.table.name.rsplit(".", 1)[-1]: c.entry.action.action.action_id
               for c in driver.pending_changes(state)}
    assert actions == {"queue_by_job": 16777230, "queue_by_tlr": 16777219}


# --- the incremental write path: epoch updates, batches, budget ----------------------------------------


def _updates(jobs, static=False, urgent=()):
    return TableUpdates(static=static, jobs=jobs, urgent=frozenset(urgent))


def test_epoch_updates_write_only_the_changed_job_entries(make_driver, fake_server):
    driver = make_driver()
    driver.connect()
    base = SwitchState(tlr_rules=frozenset({TlrRule(0, 0x8000, 1)}), job_rules=frozenset({JobRule(5, 2)}))
    driver.apply_updates(lambda: base, _updates({5: 2}, static=True))
    assert job_entries(fake_server) == {5: 2}
    writes = len(fake_server.writes)
    summary = driver.apply_updates(lambda: pytest.fail("a job update must not rebuild the whole state"),
                                   _updates({5: 4, 6: 3}))
    assert (summary.inserted, summary.modified, summary.deleted) == (1, 1, 0)
    driver.flush()  # epoch updates go out without waiting for the switch
    assert job_entries(fake_server) == {5: 4, 6: 3} and len(fake_server.writes) == writes + 1
    driver.apply_updates(lambda: pytest.fail("unexpected"), _updates({5: None}))
    driver.flush()
    assert job_entries(fake_server) == {6: 3}
    assert driver.apply_updates(lambda: pytest.fail("unexpected"), _updates({})).writes == 0
    assert len(fake_server.entries(33554437)) == 1  # queue_by_tlr untouched


def test_large_updates_split_into_batches_that_fit_a_write(make_driver, fake_server):
    driver = make_driver(max_batch_updates=40)
    driver.connect()
    jobs = {j: 1 + j % 7 for j in range(1, 101)}
    summary = driver.apply_updates(lambda: SwitchState(job_rules=frozenset(JobRule(j, q) for j, q in jobs.items())),
                                   _updates(jobs, static=True))  # a static update writes synchronously
    assert summary.inserted == 100 and job_entries(fake_server) == jobs
    assert sorted(len(w.updates) for w in fake_server.table_writes()) == [20, 40, 40]  # pipelined: any order


def test_write_budget_defers_the_rest_and_writes_losing_jobs_first(make_driver, fake_server):
    driver = make_driver(max_updates_per_s=10.0)
    driver.connect()
    driver.apply_updates(lambda: SwitchState(), _updates({}, static=True))
    driver.writes.tokens = 3  # as if 0.3 s of budget had built up
    jobs = {j: 2 for j in range(1, 9)}
    summary = driver.apply_updates(lambda: pytest.fail("unexpected"), _updates(jobs, urgent={7, 8}))
    driver.flush()
    assert summary.inserted == 3 and driver.deferred_updates == 5
    assert set(job_entries(fake_server)) == {7, 8, 1}  # the urgent ones first, then by job id
    driver.writes.tokens = 100
    driver.apply_updates(lambda: pytest.fail("unexpected"), _updates({2: 6}))  # newest value, never a stale one
    driver.flush()
    assert job_entries(fake_server) == {**jobs, 2: 6} and driver.deferred_updates == 0


def test_a_slow_switch_gets_bounded_writes_in_flight_and_only_newest_values(make_driver, fake_server):
    driver = make_driver(max_inflight_writes=1, max_batch_updates=2)
    driver.connect()
    driver.apply_updates(lambda: SwitchState(), _updates({}, static=True))
    release = threading.Event()
    fake_server.on_write = lambda request, stamp: release.wait(5)  # the switch sits on the first Write
    driver.apply_updates(lambda: pytest.fail("unexpected"), _updates({1: 2, 2: 2, 3: 2}))
    assert len(driver.writes.inflight) == 1 and driver.deferred_updates == 1  # one Write out, job 3 waits
    driver.apply_updates(lambda: pytest.fail("unexpected"), _updates({1: 5, 3: 4}))  # 1 moves again in flight
    assert len(driver.writes.inflight) == 1
    fake_server.on_write = None
    release.set()
    driver.flush()
    driver.apply_updates(lambda: pytest.fail("unexpected"), _updates({}))  # sends what waited
    driver.flush()
    driver.apply_updates(lambda: pytest.fail("unexpected"), _updates({}))
    driver.flush()
    assert job_entries(fake_server) == {1: 5, 2: 2, 3: 4}
    sent = [(int.from_bytes(u.entity.table_entry.match[0].exact.value, "big"),
             int.from_bytes(u.entity.table_entry.action.action.params[0].value, "big"))
            for w in fake_server.writes[1:] for u in w.updates]
    assert (3, 2) not in sent  # job 3's old queue was never sent: it waited and went out at its newest


def test_queue_by_job_updates_are_encoded_byte_for_byte_as_protobuf_would():
    cls = P4RuntimeDriver("s1", P4RuntimeOptions(p4info=str(P4INFO))).classification

    @settings(max_examples=300, deadline=None)
    @given(job=st.integers(1, 2 ** 32 - 1), qid=st.integers(0, 7),
           kind=st.sampled_from([p4runtime_pb2.Update.INSERT, p4runtime_pb2.Update.MODIFY, p4runtime_pb2.Update.DELETE]))
    def check(job, qid, kind):
        entry = cls.job_entry(JobRule(job, qid))
        if kind == p4runtime_pb2.Update.DELETE:
            entry = p4runtime_pb2.TableEntry(table_id=entry.table_id, match=entry.match)
        want = p4runtime_pb2.Update(type=kind, entity=p4runtime_pb2.Entity(table_entry=entry))
        assert cls.job_update(kind, job, qid) == want.SerializeToString()

    check()


def test_p4runtime_messages_use_the_fast_protobuf_runtime_when_there_is_one():
    update = protos.p4runtime_pb2.Update(type=protos.p4runtime_pb2.Update.INSERT)
    assert protos.p4runtime_pb2.Update.FromString(update.SerializeToString()) == update
    if int(google.protobuf.__version__.split(".")[0]) >= 4:
        assert api_implementation.Type() != "python", "protobuf >= 4 should run on upb: is PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION set?"


# --- queue_by_tag: a deadline range written as its prefixes matches what the range does -----------------------


def _p4_tag_queue(entries, priority: int, deadline: int) -> int | None:
    """queue_by_tag evaluated on its P4Runtime entries (range priority, ternary deadline; larger priority wins)."""
    best = None
    for e in entries:
        prio = e.match[0] if e.match and e.match[0].field_id == 1 else None
        dl = next((m for m in e.match if m.field_id == 2), None)
        if prio is not None and not (int.from_bytes(prio.range.low, "big") <= priority
                                     <= int.from_bytes(prio.range.high, "big")):
            continue
        if dl is not None and deadline & int.from_bytes(dl.ternary.mask, "big") != int.from_bytes(
                dl.ternary.value, "big"):
            continue
        if best is None or e.priority > best.priority:
            best = e
    return None if best is None else int.from_bytes(best.action.action.params[0].value, "big")


def test_tag_rules_as_prefixes_classify_like_their_ranges():
    driver = P4RuntimeDriver("s1", P4RuntimeOptions(p4info=str(P4INFO), check_bmv2_version=False))
    bounds = st.integers(0, 2 ** 32 - 1)

    @settings(max_examples=200, deadline=None)
    @given(rules=st.lists(st.tuples(st.integers(0, 255), st.integers(0, 255), bounds, bounds, st.integers(1, 7)),
                          min_size=1, max_size=3),
           priority=st.integers(0, 255), deadline=st.one_of(bounds, st.sampled_from([0, 999, 1000, 2 ** 32 - 1])))
    def check(rules, priority, deadline):
        tags = frozenset(TagRule(rank + 1, min(a, b), max(a, b), min(c, d), max(c, d), q)
                         for rank, (a, b, c, d, q) in enumerate(rules))
        changes = driver.pending_changes(SwitchState(tag_rules=tags))
        entries = [c.entry for c in changes if c.table is driver.classification.queue_by_tag]
        assert len(entries) <= 62 * len(tags)
        want = next((r.qid for r in sorted(tags, key=tag_order) if r.priority_lo <= priority <= r.priority_hi
                     and r.deadline_lo_us <= deadline <= r.deadline_hi_us), None)
        assert _p4_tag_queue(entries, priority, deadline) == want

    check()


def test_job_rank_rules_as_p4_entries():
    """The controller's job-rank rules (``[policy] rank_levels`` 3) as the P4 program's queue_by_tag entries:
    rank r to queue 1 + r at any deadline, nothing for a priority above the ranks."""
    from netapprox.controller import policy
    from netapprox.controller.config import PolicyConfig
    driver = P4RuntimeDriver("s1", P4RuntimeOptions(p4info=str(P4INFO), check_bmv2_version=False))
    state = policy.static_state(SwitchConfig(name="s1"), PolicyConfig(rank_levels=3))
    entries = [c.entry for c in driver.pending_changes(SwitchState(tag_rules=state.tag_rules))
               if c.table is driver.classification.queue_by_tag]
    for deadline in (0, 999, wire.NO_DEADLINE):
        assert [_p4_tag_queue(entries, p, deadline) for p in range(5)] == [1, 2, 3, None, None]


def test_the_reference_model_never_puts_approximate_traffic_in_queue_zero():
    hdr = wire.Header(type=wire.PacketType.DATA, flags=int(wire.Flags.APPROX), job_id=5, tlr=0x1000)
    udp = (40000).to_bytes(2, "big") + (7600).to_bytes(2, "big") + (8 + 32).to_bytes(2, "big") + b"\x00\x00"
    ip = bytes([0x45, 0, 0, 60, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2])
    packet = ip + udp + wire.encode(hdr, b"")
    assert reference_queue(SwitchState(job_rules=frozenset({JobRule(5, 0)})), packet) == 1
    assert reference_queue(SwitchState(tlr_rules=frozenset({TlrRule(0, 0x8000, 0)})), packet) == 1
    assert reference_queue(SwitchState(job_rules=frozenset({JobRule(5, 3)})), packet) == 3
    assert reference_queue(SwitchState(job_rules=frozenset({JobRule(6, 0)})), packet[:9] + b"\x06" + packet[10:]) == 0


def test_a_range_of_0_to_255_on_a_wider_field_is_sent_so_bmv2_reads_it_right():
    """BMv2 1.15.5's P4Runtime server reads the canonical [0x00, 0xff] of a 16-bit range key as an 8-bit
    don't-care and refuses it (found by tests/dataplane/test_p4_reference.py); low goes out full-width there,
    everywhere else canonical, and the value is the same."""
    from netapprox.controller.p4runtime.mirror import range_match
    from netapprox.controller.p4runtime.p4info import Field
    tlr = Field(id=1, name="tlr", bitwidth=16, match_type=p4info_pb2.MatchField.RANGE)
    assert (range_match(tlr, 0, 255).range.low, range_match(tlr, 0, 255).range.high) == (b"\x00\x00", b"\xff")
    assert (range_match(tlr, 0, 256).range.low, range_match(tlr, 1, 255).range.low) == (b"\x00", b"\x01")
    assert range_match(tlr, 0, 0xFFFF) is None
    priority = Field(id=1, name="priority", bitwidth=8, match_type=p4info_pb2.MatchField.RANGE)
    assert range_match(priority, 0, 255) is None
