"""The P4Info contract of docs/architecture.md as data, and one check of a P4Info against it.

Two things are held to it: the P4Info p4c makes of p4src/ (tests/dataplane/test_p4info_contract.py, with the
toolchain) and the hand-written controller/p4runtime/p4info.txtpb the controller tests run on
(tests/controller/test_p4info_fixture.py, in every run). So a fixture that drifts from the program fails
without p4c, and a program that drifts from the contract fails where p4c is. Table, counter and meter sizes
are read from p4src/shared/sizes.p4, the one place the program takes them from.

Checked: every table (keys: name, match kind, width, in order; its actions; size; a direct counter where there
is one), every action parameter (name, width), every counter and meter (unit, size), the packet-in/out
metadata (id, name, width). Ids are not: p4c assigns them and the controller looks names up.
"""
from __future__ import annotations

import pathlib
import re

from netapprox.controller.p4runtime.protos import p4info_pb2

REPO = pathlib.Path(__file__).resolve().parents[2]
SIZES_P4 = REPO / "p4src" / "shared" / "sizes.p4"

MT = p4info_pb2.MatchField
TABLES = {  # name -> (keys, actions, size macro in sizes.p4)
    "NetApproxIngress.forwarding.routes_v4": (
        [("dst_addr", MT.LPM, 32)],
        {"NetApproxIngress.forwarding.route", "NetApproxIngress.forwarding.set_ecmp_group",
         "NetApproxIngress.forwarding.drop"}, "ROUTES_V4_TABLE_SIZE"),
    "NetApproxIngress.forwarding.ecmp_members": (
        [("group_id", MT.EXACT, 16), ("bucket", MT.EXACT, 4)],
        {"NetApproxIngress.forwarding.route", "NetApproxIngress.forwarding.drop"}, "ECMP_MEMBERS_TABLE_SIZE"),
    "NetApproxIngress.classification.queue_by_class": (
        [("ip_proto", MT.TERNARY, 8), ("l4_dport", MT.TERNARY, 16)],
        {"NetApproxIngress.classification.set_queue"}, "QUEUE_BY_CLASS_TABLE_SIZE"),
    "NetApproxIngress.classification.queue_by_job": (
        [("job_id", MT.EXACT, 32)],
        {"NetApproxIngress.classification.set_job_queue"}, "QUEUE_BY_JOB_TABLE_SIZE"),
    "NetApproxIngress.classification.queue_by_tag": (
        [("priority", MT.RANGE, 8), ("deadline_us", MT.TERNARY, 32)],
        {"NetApproxIngress.classification.set_queue"}, "QUEUE_BY_TAG_TABLE_SIZE"),
    "NetApproxIngress.classification.queue_by_tlr": (
        [("tlr", MT.RANGE, 16)],
        {"NetApproxIngress.classification.set_queue"}, "QUEUE_BY_TLR_TABLE_SIZE"),
    "NetApproxEgress.ecn.ecn_thresholds": (
        [("qid", MT.EXACT, 3)],
        {"NetApproxEgress.ecn.mark_ecn"}, "ECN_THRESHOLDS_TABLE_SIZE"),
}
ACTIONS = {
    "NetApproxIngress.forwarding.route": [("port", 9), ("src_mac", 48), ("dst_mac", 48)],
    "NetApproxIngress.forwarding.drop": [],
    "NetApproxIngress.forwarding.set_ecmp_group": [("group_id", 16), ("spray", 1)],
    "NetApproxIngress.classification.set_queue": [("qid", 3)],
    "NetApproxIngress.classification.set_job_queue": [("qid", 3)],
    "NetApproxEgress.ecn.mark_ecn": [("threshold", 19)],
}
COUNTERS = {  # name -> (unit, size macro)
    "NetApproxIngress.enqueued_packets": (p4info_pb2.CounterSpec.BOTH, "PORT_QUEUE_COUNTER_SIZE"),
    "NetApproxEgress.transmitted_packets": (p4info_pb2.CounterSpec.BOTH, "PORT_QUEUE_COUNTER_SIZE"),
    "NetApproxIngress.malformed_packets": (p4info_pb2.CounterSpec.PACKETS, "MALFORMED_COUNTER_SIZE"),
    "NetApproxIngress.classification.queue0_guard_packets": (p4info_pb2.CounterSpec.PACKETS,
                                                             "QUEUE0_GUARD_COUNTER_SIZE"),
}
DIRECT_COUNTERS = {  # name -> (unit, table)
    "NetApproxIngress.classification.job_packets": (p4info_pb2.CounterSpec.PACKETS,
                                                    "NetApproxIngress.classification.queue_by_job"),
}
METERS = {"NetApproxIngress.report_meter": (p4info_pb2.MeterSpec.PACKETS, "REPORT_METER_SIZE")}
PACKET_METADATA = {
    "packet_in": [(1, "ingress_port", 9), (2, "_pad", 7)],
    "packet_out": [(1, "egress_port", 9), (2, "_pad", 7)],
}


def program_sizes(path: pathlib.Path = SIZES_P4) -> dict[str, int]:
    """The ``#define NAME value`` sizes of p4src/shared/sizes.p4."""
    return {m.group(1): int(m.group(2), 0)
            for m in re.finditer(r"^#define\s+(\w+_SIZE)\s+(\w+)\s*$", path.read_text(), re.M)}


def load(path: pathlib.Path) -> p4info_pb2.P4Info:
    from google.protobuf import text_format

    info = p4info_pb2.P4Info()
    text_format.Merge(path.read_text(), info)
    return info


def violations(info: p4info_pb2.P4Info, sizes: dict[str, int] | None = None) -> list[str]:
    """Every way ``info`` departs from the contract, one line each (empty: it keeps the contract)."""
    sizes = program_sizes() if sizes is None else sizes
    out: list[str] = []
    tables = {t.preamble.name: t for t in info.tables}
    actions = {a.preamble.name: a for a in info.actions}
    action_names = {a.preamble.id: a.preamble.name for a in info.actions}
    for name, (keys, acts, size) in TABLES.items():
        t = tables.get(name)
        if t is None:
            out.append(f"table {name}: missing (have {sorted(tables)})")
            continue
        got = [(m.name, m.match_type, m.bitwidth) for m in t.match_fields]
        if got != keys:
            out.append(f"table {name}: keys {_keys(got)}, contract {_keys(keys)}")
        refs = {action_names.get(r.id, r.id) for r in t.action_refs if r.scope != p4info_pb2.ActionRef.DEFAULT_ONLY}
        if refs != acts:
            out.append(f"table {name}: actions {sorted(map(str, refs))}, contract {sorted(acts)}")
        if t.size != sizes[size]:
            out.append(f"table {name}: size {t.size}, sizes.p4 {size} = {sizes[size]}")
    for name, params in ACTIONS.items():
        a = actions.get(name)
        if a is None:
            out.append(f"action {name}: missing")
        elif [(p.name, p.bitwidth) for p in a.params] != params:
            out.append(f"action {name}: params {[(p.name, p.bitwidth) for p in a.params]}, contract {params}")
    counters = {c.preamble.name: c for c in info.counters}
    for name, (unit, size) in COUNTERS.items():
        c = counters.get(name)
        if c is None:
            out.append(f"counter {name}: missing")
        elif (c.spec.unit, c.size) != (unit, sizes[size]):
            out.append(f"counter {name}: unit {c.spec.unit} size {c.size}, contract {unit} size {sizes[size]}")
    direct = {c.preamble.name: c for c in info.direct_counters}
    table_names = {t.preamble.id: t.preamble.name for t in info.tables}
    for name, (unit, table) in DIRECT_COUNTERS.items():
        c = direct.get(name)
        if c is None:
            out.append(f"direct counter {name}: missing")
            continue
        if (c.spec.unit, table_names.get(c.direct_table_id)) != (unit, table):
            out.append(f"direct counter {name}: unit {c.spec.unit} on {table_names.get(c.direct_table_id)}, "
                       f"contract {unit} on {table}")
        t = tables.get(table)
        if t is not None and list(t.direct_resource_ids) != [c.preamble.id]:
            out.append(f"table {table}: direct resources {list(t.direct_resource_ids)}, contract [{name}]")
    meters = {m.preamble.name: m for m in info.meters}
    for name, (unit, size) in METERS.items():
        m = meters.get(name)
        if m is None:
            out.append(f"meter {name}: missing")
        elif (m.spec.unit, m.size) != (unit, sizes[size]):
            out.append(f"meter {name}: unit {m.spec.unit} size {m.size}, contract {unit} size {sizes[size]}")
    metadata = {c.preamble.name: [(m.id, m.name, m.bitwidth) for m in c.metadata]
                for c in info.controller_packet_metadata}
    if metadata != PACKET_METADATA:
        out.append(f"packet metadata {metadata}, contract {PACKET_METADATA}")
    extra = sorted(set(tables) - set(TABLES))
    if extra:
        out.append(f"tables not in the contract: {extra}")
    return out


def _keys(keys) -> list[str]:
    return [f"{n} {MT.MatchType.Name(k).lower()} {w}" for n, k, w in keys]
