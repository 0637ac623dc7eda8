"""The compiled P4Info against the P4Info contract of docs/architecture.md (tests/support/p4info_contract.py):
every table, key, action, parameter, counter, meter and packet metadata the controller uses exists with the
documented width, kind and size; the controller tests' hand-written P4Info equals it but for ids."""
from __future__ import annotations

import pathlib
import subprocess

import google.protobuf.text_format
import pytest
from netapprox.controller.p4runtime.protos import p4info_pb2

from support import p4info_contract
from support.skips import requires_p4

REPO = pathlib.Path(__file__).resolve().parents[2]
P4INFO = REPO / "build" / "v1model" / "p4info.txtpb"
FIXTURE = REPO / "controller" / "p4runtime" / "p4info.txtpb"

pytestmark = [requires_p4, pytest.mark.p4]


@pytest.fixture(scope="module")
def p4info() -> p4info_pb2.P4Info:
    subprocess.run(["make", "-C", str(REPO), "p4"], check=True, capture_output=True)
    info = p4info_pb2.P4Info()
    google.protobuf.text_format.Merge(P4INFO.read_text(), info)
    return info


def test_the_compiled_program_keeps_the_contract(p4info):
    """Names, match kinds, widths, actions, sizes (from p4src/shared/sizes.p4), counters, meters, packet metadata:
    tests/support/p4info_contract.py, the contract the controller tests' fixture is held to in every run."""
    assert p4info_contract.violations(p4info) == []


def test_the_controller_fixture_equals_the_compiled_program_but_for_ids(p4info):
    """The fixture and the program, entity by entity, ids aside (the contract check would miss an entity or an
    annotation that only one of them has)."""
    def shape(info):
        names = {x.preamble.id: x.preamble.name for kind in (info.tables, info.actions, info.direct_counters)
                 for x in kind}
        tables = {t.preamble.name: ([(m.name, m.match_type, m.bitwidth) for m in t.match_fields],
                                    sorted((names[r.id], r.scope) for r in t.action_refs), t.size,
                                    names.get(t.const_default_action_id),
                                    [names[i] for i in t.direct_resource_ids]) for t in info.tables}
        actions = {a.preamble.name: [(p.name, p.bitwidth) for p in a.params] for a in info.actions}
        counters = {c.preamble.name: (c.spec.unit, c.size) for c in info.counters}
        direct = {c.preamble.name: (c.spec.unit, names[c.direct_table_id]) for c in info.direct_counters}
        meters = {m.preamble.name: (m.spec.unit, m.size) for m in info.meters}
        meta = {c.preamble.name: [(m.id, m.name, m.bitwidth) for m in c.metadata]
                for c in info.controller_packet_metadata}
        return tables, actions, counters, direct, meters, meta

    assert shape(p4info_contract.load(FIXTURE)) == shape(p4info)


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
