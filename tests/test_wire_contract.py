"""The P4 ATP header (p4src/shared/header.p4) against hostlib.wire.HEADER_FIELDS: same fields, same order,
same widths. Runs without the P4 toolchain: it reads the P4 source text."""
from __future__ import annotations

import pathlib
import re

import pytest

from netapprox.hostlib import wire

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEADER_P4 = ROOT / "p4src" / "shared" / "header.p4"
DEFINE_P4 = ROOT / "p4src" / "shared" / "define.p4"

_FIELD = re.compile(r"^\s*bit<(\d+)>\s+([A-Za-z_]\w*)\s*;\s*(//.*)?$")


def _strip_block_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def p4_header_fields(text: str, header: str) -> list[tuple[str, int]]:
    """(name, bits) of ``header <header> { ... }`` in declaration order. Every line of the body must be
    ``bit<N> name;`` (or blank/comment): anything else is an error, so a typedef'd or computed width
    cannot slip past the comparison."""
    text = _strip_block_comments(text)
    m = re.search(r"\bheader\s+" + re.escape(header) + r"\s*\{(.*?)\}", text, flags=re.S)
    if m is None:
        raise AssertionError(f"no 'header {header} {{...}}' in the P4 source")
    fields = []
    for line in m.group(1).splitlines():
        bare = line.split("//", 1)[0].strip()
        if not bare:
            continue
        fm = _FIELD.match(line)
        if fm is None:
            raise AssertionError(f"cannot read field declaration {bare!r} in header {header}")
        fields.append((fm.group(2), int(fm.group(1))))
    return fields


def test_p4_atp_header_matches_hostlib_wire_fields():
    p4_fields = p4_header_fields(HEADER_P4.read_text(), "atp_t")
    assert p4_fields == list(wire.HEADER_FIELDS)


def test_p4_atp_header_is_32_bytes():
    assert sum(bits for _, bits in p4_header_fields(HEADER_P4.read_text(), "atp_t")) == 8 * wire.HEADER_LEN


def test_p4_constants_match_hostlib_wire():
    text = DEFINE_P4.read_text()

    def const(name: str) -> int:
        m = re.search(r"\b" + name + r"\s*=\s*(0x[0-9A-Fa-f]+|\d+)\s*;", text)
        assert m is not None, f"constant {name} not found in {DEFINE_P4.name}"
        return int(m.group(1), 0)

    def define(name: str) -> int:
        m = re.search(r"#define\s+" + name + r"\s+(\d+)", text)
        assert m is not None, f"#define {name} not found in {DEFINE_P4.name}"
        return int(m.group(1))

    assert define("ATP_UDP_PORT") == wire.DEFAULT_ATP_PORT
    assert define("ATP_REPORT_PORT") == wire.DEFAULT_REPORT_PORT
    assert const("ATP_VERSION") == wire.VERSION
    for t in wire.PacketType:
        assert const(f"ATP_TYPE_{t.name}") == t.value
    for f in wire.Flags:
        assert const(f"ATP_FLAG_{f.name}") == f.value
    assert const("ATP_TLR_ONE") == wire.TLR_ONE
    assert const("ATP_HEADER_BYTES") == wire.HEADER_LEN


# The checker itself must be able to fail: a drifted header is caught.
@pytest.mark.parametrize(
    "mutation",
    [
        lambda s: s.replace("bit<16> tlr;", "bit<8> tlr;"),  # width
        lambda s: s.replace("bit<32> msg_id;\n    bit<16> group_id;", "bit<16> group_id;\n    bit<32> msg_id;"),  # order
        lambda s: s.replace("bit<8> weight;", "bit<8> wieght;"),  # name
        lambda s: s.replace("    bit<8> count;\n", ""),  # missing field
    ],
)
def test_contract_check_detects_drift(mutation):
    original = HEADER_P4.read_text()
    mutated = mutation(original)
    assert mutated != original, "mutation did not apply; update the test with the header"
    assert p4_header_fields(mutated, "atp_t") != list(wire.HEADER_FIELDS)


def test_contract_check_rejects_unreadable_field():
    text = "header atp_t {\n    bit<4> version;\n    my_t type;\n}\n"
    with pytest.raises(AssertionError, match="cannot read"):
        p4_header_fields(text, "atp_t")
