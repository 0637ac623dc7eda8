"""ptf/testgen/cases.py reads p4testgen's protobuf-text cases and turns them into what BMv2's P4Runtime server
takes, without the toolchain. The case texts below are rendered by hand from p4c v1.2.5.8's template
(backends/p4tools/modules/testgen/targets/bmv2/test_backend/protobuf.cpp, getTestCaseTemplate), with its value
formatting (formatHexExpressionWithSeparators: the whole width, zero-padded, "\\x" per byte) and ids of the
controller tests' P4Info fixture (controller/p4runtime/p4info.txtpb)."""
from __future__ import annotations

import pathlib
import sys

import google.protobuf.text_format
import pytest
from netapprox.controller.p4runtime.protos import p4info_pb2, p4runtime_pb2

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "ptf" / "testgen"))
import cases  # noqa: E402  (ptf/testgen/cases.py)

FIXTURE = REPO / "controller" / "p4runtime" / "p4info.txtpb"

# A routed packet: routes_v4 (LPM, 32-bit dst_addr; route(port 9, src_mac 48, dst_mac 48)) and queue_by_tag
# (range priority 8, ternary deadline_us 32; set_queue(qid 3)), the input on port 1, the output on port 2 with
# its last byte unpredictable. A trace carries quotes and a backslash: p4testgen writes traces unescaped, and a
# quote in one would end the string early.
ROUTED = r'''
# proto-file: p4testgen.proto
# proto-message: TestCase
# A P4TestGen-generated test case for netapprox.p4
metadata: "p4testgen seed: 1"
metadata: "Date generated: 2026-11-26-13:50:00.000"
metadata: "Current node coverage: 0.42"

traces: '[Parser] NetApproxParser: start'
traces: '[Table Branch: NetApproxIngress.forwarding.routes_v4 | Chosen action: NetApproxIngress.forwarding.route | "x\d" it's]'

input_packet {
  packet: "\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x02\x08\x00\x45"
  port: 1
}

expected_output_packet {
  packet: "\x00\x00\x00\x00\x00\x0b\x00\x00\x00\x00\x00\x0a\x08\x00\x45"
  port: 2
  packet_mask: "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x00"
}

# Table NetApproxIngress.forwarding.routes_v4
entities {
  table_entry {
    table_id: 33554433
    # Match field dst_addr
    match {
      field_id: 1
      lpm {
        value: "\x0a\x00\x01\x07"
        prefix_len: 24
      }
    }
    # Action NetApproxIngress.forwarding.route
    action {
      action {
        action_id: 16777217
        # Param port
        params {
          param_id: 1
          value: "\x00\x02"
        }
        # Param src_mac
        params {
          param_id: 2
          value: "\x00\x00\x00\x00\x00\x0a"
        }
        # Param dst_mac
        params {
          param_id: 3
          value: "\x00\x00\x00\x00\x00\x0b"
        }
      }
    }
  }
}
# Table NetApproxIngress.classification.queue_by_tag
entities {
  table_entry {
    table_id: 33554436
    priority: 0
    # Match field priority
    match {
      field_id: 1
      range {
        low: "\x00"
        high: "\xff"
      }
    }
    # Match field deadline_us
    match {
      field_id: 2
      ternary {
        value: "\x00\x00\x01\xff"
        mask: "\x00\x00\x01\x00"
      }
    }
    # Action NetApproxIngress.classification.set_queue
    action {
      action {
        action_id: 16777219
        # Param qid
        params {
          param_id: 1
          value: "\x03"
        }
      }
    }
  }
}
'''

# A dropped packet entering on the CPU port (packet_out header: egress_port 9 bits = 3, _pad 7 bits = 0).
DROPPED = r'''
# proto-file: p4testgen.proto
# proto-message: TestCase
# A P4TestGen-generated test case for netapprox.p4
metadata: "p4testgen seed: 1"
metadata: "Date generated: 2026-11-26-13:50:00.000"
metadata: "Current node coverage: 0.5"

traces: '[Parser] NetApproxParser: parse_packet_out'

input_packet {
  packet: "\x01\x80\xde\xad"
  port: 255
}

'''


@pytest.fixture(scope="module")
def p4info() -> p4info_pb2.P4Info:
    info = p4info_pb2.P4Info()
    google.protobuf.text_format.Merge(FIXTURE.read_text(), info)
    return info


def test_a_case_reads_with_its_packets_masks_entities_and_traces():
    case = cases.parse_case(ROUTED, "netapprox_1.txtpb")
    assert case.input_packet.port == 1
    assert case.input_packet.packet == bytes.fromhex("000000000001" "000000000002" "0800" "45")
    [out] = case.expected_output_packet
    assert (out.port, out.packet[:6], out.packet_mask[-1]) == (2, bytes.fromhex("00000000000b"), 0)
    assert [e.table_entry.table_id for e in case.entities] == [33554433, 33554436]
    assert case.entities[0].table_entry.match[0].lpm.prefix_len == 24
    assert list(case.traces) == [
        "[Parser] NetApproxParser: start",
        r'[Table Branch: NetApproxIngress.forwarding.routes_v4 | '
        r'Chosen action: NetApproxIngress.forwarding.route | "x\d" it' "'s]"]
    assert cases.reported_coverage(ROUTED) == 0.42


def test_a_dropped_case_expects_no_packet():
    case = cases.parse_case(DROPPED)
    assert (case.input_packet.port, len(case.expected_output_packet), len(case.entities)) == (255, 0, 0)


def test_cases_load_in_the_order_p4testgen_numbered_them(tmp_path):
    for n in (10, 2, 1):
        (tmp_path / f"netapprox_{n}.txtpb").write_text(DROPPED if n == 2 else ROUTED)
    loaded = cases.load_cases(tmp_path)
    assert [name for name, _ in loaded] == ["netapprox_1", "netapprox_2", "netapprox_10"]
    assert loaded[1][1].input_packet.port == 255


def test_a_malformed_case_names_its_file():
    with pytest.raises(cases.CaseError, match=r"netapprox_7.txtpb: not a p4testgen TestCase"):
        cases.parse_case(ROUTED.replace("port: 1\n", "port: one\n"), "netapprox_7.txtpb")
    with pytest.raises(cases.CaseError, match="no input_packet"):
        cases.parse_case('metadata: "x"\n', "empty.txtpb")


def test_entities_become_canonical_p4runtime_entries(p4info):
    case = cases.parse_case(ROUTED)
    route = cases.canonical_entity(case.entities[0], p4info).table_entry
    assert route.priority == 0  # LPM table: no priority
    assert route.match[0].lpm.value == bytes([10, 0, 1, 0])  # host bits cleared
    assert [p.value for p in route.action.action.params] == [b"\x02", b"\x0a", b"\x0b"]
    tag = cases.canonical_entity(case.entities[1], p4info).table_entry
    assert tag.priority == 1  # ternary/range table: at least 1
    [deadline] = tag.match  # the whole priority range is a don't-care and left out
    assert deadline.field_id == 2
    assert (deadline.ternary.value, deadline.ternary.mask) == (b"\x01\x00", b"\x01\x00")
    assert tag.action.action.params[0].value == b"\x03"
    # the case itself is left as it was
    assert case.entities[0].table_entry.match[0].lpm.value == bytes([10, 0, 1, 7])


def test_entities_the_p4info_does_not_know_are_refused(p4info):
    entity = p4runtime_pb2.Entity()
    entity.table_entry.table_id = 1234
    with pytest.raises(cases.CaseError, match="table id 1234 is not in the P4Info"):
        cases.canonical_entity(entity, p4info)
    entity = cases.parse_case(ROUTED).entities[0]
    entity.table_entry.action.action.params[0].value = b"\x02\x00"  # 512 does not fit in 9 bits
    with pytest.raises(cases.CaseError, match="does not fit in 9 bits"):
        cases.canonical_entity(entity, p4info)


def test_mask_zero_bits_are_dont_care_runs():
    assert cases.dont_care_bits(b"", 2) == []
    assert cases.dont_care_bits(b"\xff\x0f", 2) == [(8, 4)]
    assert cases.dont_care_bits(b"\x7f\xf0\x00", 3) == [(0, 1), (12, 12)]
    assert cases.dont_care_bits(b"\x00", 2) == [(0, 8)]  # a short mask: the rest counts


def test_cpu_port_packets_map_to_packet_out_and_from_packet_in(p4info):
    out = cases.packet_out(cases.parse_case(DROPPED).input_packet.packet, p4info)
    assert out.payload == b"\xde\xad"
    assert [(m.metadata_id, m.value) for m in out.metadata] == [(1, b"\x03"), (2, b"\x00")]
    # ingress_port 3 and _pad 0 in front of the payload, as the deparser emits the packet_in header
    assert cases.packet_in_frame(b"\xbe\xef", {1: 3, 2: 0}, p4info) == b"\x01\x80\xbe\xef"
    with pytest.raises(cases.CaseError, match="shorter than the packet_out header"):
        cases.packet_out(b"\x01", p4info)
