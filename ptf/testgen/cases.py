"""p4testgen's protobuf-text test cases, read and made ready for BMv2's P4Runtime server (no PTF here: the unit
tests in tests/dataplane/test_testgen_cases.py check it without the toolchain).

The format, as p4c v1.2.5.8 writes it (backends/p4tools/modules/testgen/targets/bmv2/proto/p4testgen.proto and
test_backend/protobuf.cpp, ``--test-backend protobuf``): one ``p4testgen.TestCase`` per file, ``<name>_<n>.txtpb``,

    metadata: "Current node coverage: 0.83"          (the run's statement coverage so far, 2 digits)
    traces: '<one trace event>'                      (single-quoted, written unescaped)
    input_packet { packet: "\\x.." port: 1 }
    expected_output_packet { packet: "\\x.." port: 2 packet_mask: "\\x.." }     (absent: the packet is dropped)
    entities { table_entry { table_id: .. priority: .. match { field_id: .. exact { value: "\\x.." } } ...
               action { action { action_id: .. params { param_id: .. value: "\\x.." } } } } }

Every value is the whole field, zero-padded to its width in bytes (not P4Runtime's canonical form); a mask bit
0 is a bit whose value p4testgen cannot predict (it does not matter); ``priority`` is written only for tables
with a ternary, range or optional key. The trace strings are not escaped, so they are cut out before the text
is parsed. Default-action overrides, clone sessions and meter configurations are not part of this format
(docs/dataplane.md, Generated path coverage).
"""
from __future__ import annotations

import pathlib
import re

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from netapprox.controller.p4runtime.protos import p4info_pb2, p4runtime_pb2


class CaseError(ValueError):
    """A generated case that cannot be read or does not fit the program's P4Info."""


_TRACE = re.compile(r"^traces: '(.*?)'[ \t]*$\n?", re.M | re.S)
_COVERAGE = re.compile(r'^metadata: "Current node coverage: ([0-9.eE+-]+)"', re.M)


def test_case_class():
    """``p4testgen.TestCase``, built here over the P4Runtime messages already in the default pool."""
    pool = descriptor_pool.Default()
    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName("p4testgen.TestCase"))
    except KeyError:
        pass
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="netapprox_testgen/p4testgen.proto", package="p4testgen",
                                             syntax="proto3", dependency=[p4runtime_pb2.DESCRIPTOR.name])

    def field(msg, name, number, kind, repeated=False, type_name=None):
        f = msg.field.add(name=name, number=number, type=kind,
                          label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
        if type_name:
            f.type_name = type_name

    inp = fdp.message_type.add(name="InputPacketAtPort")
    field(inp, "packet", 1, F.TYPE_BYTES)
    field(inp, "port", 2, F.TYPE_INT32)
    out = fdp.message_type.add(name="OutputPacketAtPort")
    field(out, "packet", 1, F.TYPE_BYTES)
    field(out, "port", 2, F.TYPE_INT32)
    field(out, "packet_mask", 3, F.TYPE_BYTES)
    case = fdp.message_type.add(name="TestCase")
    field(case, "input_packet", 1, F.TYPE_MESSAGE, type_name=".p4testgen.InputPacketAtPort")
    field(case, "expected_output_packet", 2, F.TYPE_MESSAGE, repeated=True, type_name=".p4testgen.OutputPacketAtPort")
    field(case, "entities", 3, F.TYPE_MESSAGE, repeated=True, type_name=".p4.v1.Entity")
    field(case, "traces", 4, F.TYPE_STRING, repeated=True)
    field(case, "metadata", 5, F.TYPE_STRING, repeated=True)
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("p4testgen.TestCase"))


def parse_case(text: str, name: str = "case"):
    """One case from its text; the traces are taken verbatim (p4testgen does not escape them)."""
    traces = _TRACE.findall(text)
    case = test_case_class()()
    try:
        text_format.Parse(_TRACE.sub("", text), case)
    except text_format.ParseError as e:
        raise CaseError(f"{name}: not a p4testgen TestCase: {e}") from None
    case.traces.extend(traces)
    if not case.HasField("input_packet"):
        raise CaseError(f"{name}: no input_packet")
    return case


def load_cases(directory: pathlib.Path) -> list[tuple[str, object]]:
    """Every ``*.txtpb`` case in ``directory``, in the order p4testgen wrote them (``<name>_<n>``)."""
    def order(p: pathlib.Path):
        head, _, n = p.stem.rpartition("_")
        return (head, int(n)) if n.isdigit() else (p.stem, -1)
    return [(p.stem, parse_case(p.read_text(), p.name)) for p in sorted(directory.glob("*.txtpb"), key=order)]


def reported_coverage(text: str) -> float | None:
    """The node coverage a case file says the run had reached when it was written (2 significant digits)."""
    found = _COVERAGE.search(text)
    return float(found.group(1)) if found else None


def dont_care_bits(mask: bytes, length: int) -> list[tuple[int, int]]:
    """(first bit, bit count) of each run of 0 bits in ``mask`` over a packet of ``length`` bytes; an empty
    mask means every bit counts, a shorter one counts the rest."""
    bits = "".join(f"{b:08b}" for b in mask[:length].ljust(length, b"\xff"))
    return [(m.start(), m.end() - m.start()) for m in re.finditer("0+", bits)]


def encode_int(value: int, bitwidth: int) -> bytes:
    """P4Runtime canonical bytestring: big-endian, no leading zero bytes, at least one byte."""
    if not 0 <= value < (1 << bitwidth):
        raise CaseError(f"{value:#x} does not fit in {bitwidth} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def canonical_entity(entity, p4info: p4info_pb2.P4Info):
    """``entity`` as BMv2's P4Runtime server takes it: values canonical, don't-care matches (ternary mask 0,
    the whole range, prefix length 0) left out as P4Runtime requires, ternary values and LPM prefixes without
    the bits their mask leaves out, a priority (>= 1) exactly where the table has a ternary, range or optional
    key. Ids the P4Info does not know raise CaseError."""
    entity = p4runtime_pb2.Entity.FromString(entity.SerializeToString())
    if entity.WhichOneof("entity") != "table_entry":
        raise CaseError(f"unsupported entity {entity.WhichOneof('entity')} (this program has table entries only)")
    entry = entity.table_entry
    table = next((t for t in p4info.tables if t.preamble.id == entry.table_id), None)
    if table is None:
        raise CaseError(f"table id {entry.table_id} is not in the P4Info (was p4testgen run on another program?)")
    fields = {f.id: f for f in table.match_fields}
    keep = []
    for fm in entry.match:
        if fm.field_id not in fields:
            raise CaseError(f"{table.preamble.name}: no match field id {fm.field_id}")
        width = fields[fm.field_id].bitwidth
        full = (1 << width) - 1
        kind = fm.WhichOneof("field_match_type")
        if kind == "exact":
            fm.exact.value = encode_int(int.from_bytes(fm.exact.value, "big"), width)
        elif kind == "optional":
            fm.optional.value = encode_int(int.from_bytes(fm.optional.value, "big"), width)
        elif kind == "ternary":
            mask = int.from_bytes(fm.ternary.mask, "big")
            if mask == 0:
                continue
            fm.ternary.value = encode_int(int.from_bytes(fm.ternary.value, "big") & mask, width)
            fm.ternary.mask = encode_int(mask, width)
        elif kind == "range":
            low, high = int.from_bytes(fm.range.low, "big"), int.from_bytes(fm.range.high, "big")
            if (low, high) == (0, full):
                continue
            fm.range.low, fm.range.high = encode_int(low, width), encode_int(high, width)
        elif kind == "lpm":
            plen = fm.lpm.prefix_len
            if plen == 0:
                continue
            prefix = full ^ ((1 << (width - plen)) - 1)
            fm.lpm.value = encode_int(int.from_bytes(fm.lpm.value, "big") & prefix, width)
        else:
            raise CaseError(f"{table.preamble.name}: unsupported match kind {kind}")
        keep.append(fm)
    del entry.match[:]
    entry.match.extend(keep)
    action = entry.action.action
    declared = next((a for a in p4info.actions if a.preamble.id == action.action_id), None)
    if declared is None:
        raise CaseError(f"{table.preamble.name}: action id {action.action_id} is not in the P4Info")
    params = {p.id: p for p in declared.params}
    for p in action.params:
        if p.param_id not in params:
            raise CaseError(f"{declared.preamble.name}: no parameter id {p.param_id}")
        p.value = encode_int(int.from_bytes(p.value, "big"), params[p.param_id].bitwidth)
    needs_priority = any(f.match_type not in (p4info_pb2.MatchField.EXACT, p4info_pb2.MatchField.LPM)
                         for f in table.match_fields)
    entry.priority = max(1, entry.priority) if needs_priority else 0
    return entity


def _packet_metadata(p4info: p4info_pb2.P4Info, header: str) -> list:
    for cpm in p4info.controller_packet_metadata:
        if cpm.preamble.name == header:
            return sorted(cpm.metadata, key=lambda m: m.id)
    raise CaseError(f"no controller_packet_metadata {header!r} in the P4Info")


def packet_out(packet: bytes, p4info: p4info_pb2.P4Info) -> p4runtime_pb2.PacketOut:
    """A packet p4testgen sends on the CPU port (its ``packet_out`` header in front, as the parser extracts it)
    as the P4Runtime PacketOut that makes BMv2 inject the same bytes: the header's fields as metadata, in the
    P4Info's order (the header's field order), the rest as payload."""
    meta = _packet_metadata(p4info, "packet_out")
    width = sum(m.bitwidth for m in meta)
    if width % 8:
        raise CaseError(f"packet_out header is {width} bits, not whole bytes")
    if len(packet) < width // 8:
        raise CaseError(f"a {len(packet)}-byte packet on the CPU port is shorter than the packet_out header")
    value, shift = int.from_bytes(packet[:width // 8], "big"), width
    out = p4runtime_pb2.PacketOut(payload=packet[width // 8:])
    for m in meta:
        shift -= m.bitwidth
        out.metadata.add(metadata_id=m.id, value=encode_int((value >> shift) & ((1 << m.bitwidth) - 1), m.bitwidth))
    return out


def packet_in_frame(payload: bytes, values: dict[int, int], p4info: p4info_pb2.P4Info) -> bytes:
    """A PacketIn's metadata (by id) put back in front of its payload as the deparser emits the ``packet_in``
    header: the frame p4testgen expects on the CPU port."""
    meta = _packet_metadata(p4info, "packet_in")
    header = 0
    for m in meta:
        header = (header << m.bitwidth) | values.get(m.id, 0)
    return header.to_bytes(sum(m.bitwidth for m in meta) // 8, "big") + payload
