"""The compiled P4Info against the P4Info contract of docs/architecture.md: every table, key, action,
parameter, counter and packet metadata the controller uses exists with the documented width and kind."""
from __future__ import annotations

import pathlib
import subprocess

import google.protobuf.text_format
import pytest
from netapprox.controller.p4runtime.protos import p4info_pb2

from support.skips import requires_p4

REPO = pathlib.Path(__file__).resolve().parents[2]
P4INFO = REPO / "build" / "v1model" / "p4info.txtpb"

pytestmark = [requires_p4, pytest.mark.p4]

MT = p4info_pb2.MatchField
TABLES = {
    "NetApproxIngress.forwarding.routes_v4": [("dst_addr", MT.LPM, 32)],
    "NetApproxIngress.classification.queue_by_class": [("ip_proto", MT.TERNARY, 8), ("l4_dport", MT.TERNARY, 16)],
    "NetApproxIngress.classification.queue_by_job": [("job_id", MT.EXACT, 32)],
    "NetApproxIngress.classification.queue_by_tag": [("priority", MT.RANGE, 8), ("deadline_us", MT.TERNARY, 32)],
    "NetApproxIngress.classification.queue_by_tlr": [("tlr", MT.RANGE, 16)],
    "NetApproxEgress.ecn.ecn_thresholds": [("qid", MT.EXACT, 3)],
}
ACTIONS = {
    "NetApproxIngress.forwarding.route": [("port", 9), ("src_mac", 48), ("dst_mac", 48)],
    "NetApproxIngress.forwarding.drop": [],
    "NetApproxIngress.classification.set_queue": [("qid", 3)],
    "NetApproxIngress.classification.set_job_queue": [("qid", 3)],
    "NetApproxEgress.ecn.mark_ecn": [("threshold", 19)],
}
TABLE_ACTIONS = {
    "NetApproxIngress.forwarding.routes_v4": {"NetApproxIngress.forwarding.route", "NetApproxIngress.forwarding.drop"},
    "NetApproxIngress.classification.queue_by_class": {"NetApproxIngress.classification.set_queue"},
    "NetApproxIngress.classification.queue_by_job": {"NetApproxIngress.classification.set_job_queue"},
    "NetApproxIngress.classification.queue_by_tag": {"NetApproxIngress.classification.set_queue"},
    "NetApproxIngress.classification.queue_by_tlr": {"NetApproxIngress.classification.set_queue"},
    "NetApproxEgress.ecn.ecn_thresholds": {"NetApproxEgress.ecn.mark_ecn"},
}
COUNTERS = {
    "NetApproxIngress.enqueued_packets": p4info_pb2.CounterSpec.BOTH,
    "NetApproxEgress.transmitted_packets": p4info_pb2.CounterSpec.BOTH,
    "NetApproxIngress.malformed_packets": p4info_pb2.CounterSpec.PACKETS,
    "NetApproxIngress.classification.queue0_guard_packets": p4info_pb2.CounterSpec.PACKETS,
}
METERS = {"NetApproxIngress.report_meter": (p4info_pb2.MeterSpec.PACKETS, 512)}
PACKET_METADATA = {
    "packet_in": [("ingress_port", 9), ("_pad", 7)],
    "packet_out": [("egress_port", 9), ("_pad", 7)],
}


@pytest.fixture(scope="module")
def p4info() -> p4info_pb2.P4Info:
    subprocess.run(["make", "-C", str(REPO), "p4"], check=True, capture_output=True)
    info = p4info_pb2.P4Info()
    google.protobuf.text_format.Merge(P4INFO.read_text(), info)
    return info


def _by_name(items):
    return {x.preamble.name: x for x in items}


def test_tables_keys_and_actions(p4info):
    tables = _by_name(p4info.tables)
    actions = {a.preamble.id: a.preamble.name for a in p4info.actions}
    for name, keys in TABLES.items():
        assert name in tables, f"table {name} missing; have {sorted(tables)}"
        t = tables[name]
        assert [(m.name, m.match_type, m.bitwidth) for m in t.match_fields] == keys, name
        got = {actions[r.id] for r in t.action_refs if not r.scope == p4info_pb2.ActionRef.DEFAULT_ONLY}
        assert got == TABLE_ACTIONS[name], name


def test_action_params(p4info):
    actions = _by_name(p4info.actions)
    for name, params in ACTIONS.items():
        assert name in actions, f"action {name} missing"
        assert [(p.name, p.bitwidth) for p in actions[name].params] == params, name


def test_counters(p4info):
    counters = _by_name(p4info.counters)
    for name, unit in COUNTERS.items():
        assert name in counters, f"counter {name} missing"
        assert counters[name].spec.unit == unit, name
    assert counters["NetApproxIngress.enqueued_packets"].size >= 512 * 8
    assert counters["NetApproxEgress.transmitted_packets"].size >= 512 * 8
    assert counters["NetApproxIngress.malformed_packets"].size == 16
    assert counters["NetApproxIngress.classification.queue0_guard_packets"].size == 1
    direct = _by_name(p4info.direct_counters)
    job = direct["NetApproxIngress.classification.job_packets"]
    tables = {t.preamble.id: t.preamble.name for t in p4info.tables}
    assert tables[job.direct_table_id] == "NetApproxIngress.classification.queue_by_job"


def test_meters(p4info):
    meters = {m.preamble.name: (m.spec.unit, m.size) for m in p4info.meters}
    assert meters == METERS


def test_packet_io_metadata(p4info):
    meta = {c.preamble.name: [(m.name, m.bitwidth) for m in c.metadata] for c in p4info.controller_packet_metadata}
    assert meta == PACKET_METADATA


def _udp_transitions(bmv2_json: pathlib.Path) -> list[tuple[str, str]]:
    import json

    program = json.loads(bmv2_json.read_text())
    (state,) = [s for p in program["parsers"] for s in p["parse_states"] if s["name"] == "parse_udp"]
    return [(t["value"], t["next_state"]) for t in state["transitions"] if t["value"] not in (None, "default")]


def test_atp_port_is_a_compile_time_option(p4info, tmp_path):
    """Default 7600 (0x1db0); -DATP_UDP_PORT=7700 (0x1e14) moves both the DATA and the ACK match."""
    default = _udp_transitions(REPO / "build" / "v1model" / "bmv2.json")
    assert ("0x1db00000", "parse_atp") in default and ("0x00001db0", "parse_atp") in default, default
    out = tmp_path / "bmv2.json"
    subprocess.run(["p4c-bm2-ss", "--arch", "v1model", "--std", "p4-16", "-DATP_UDP_PORT=7700", "-I",
                    str(REPO / "p4src"), "-o", str(out), str(REPO / "p4src" / "v1model" / "netapprox.p4")],
                   check=True, capture_output=True)
    moved = _udp_transitions(out)
    assert ("0x1e140000", "parse_atp") in moved and ("0x00001e14", "parse_atp") in moved, moved
    assert not any(v.startswith("0x1db0") or v.endswith("1db0") for v, _ in moved), moved
