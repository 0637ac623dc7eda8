"""The hand-written P4Info the controller tests run on (controller/p4runtime/p4info.txtpb) against the P4Info contract of
docs/architecture.md, in every run: no p4c needed. The compiled program is held to the same contract
(tests/dataplane/test_p4info_contract.py) where p4c is, and its sizes are read from p4src/shared/sizes.p4 here,
so a fixture that drifts from the program fails in CI too. The mutation tests show the check is not vacuous:
a copy of the fixture with any one width, match kind, size or name changed breaks it."""
from __future__ import annotations

import pytest

from ctl_fixtures import P4INFO
from support import p4info_contract as contract


def test_the_p4info_fixture_keeps_the_contract():
    assert contract.violations(contract.load(P4INFO)) == []


def test_the_contract_sizes_come_from_the_program():
    sizes = contract.program_sizes()
    wanted = {size for _, _, size in contract.TABLES.values()} | {size for _, size in contract.COUNTERS.values()} \
        | {size for _, size in contract.METERS.values()}
    assert wanted <= set(sizes), sorted(wanted - set(sizes))
    assert sizes["QUEUE_BY_JOB_TABLE_SIZE"] == 1024 and sizes["PORT_QUEUE_COUNTER_SIZE"] == 4096


def _mutations():
    """(id, mutate(info), what the violation must name) for every width, match kind, size and name of the
    fixture."""
    info = contract.load(P4INFO)
    out = []
    for ti, t in enumerate(info.tables):
        name = t.preamble.name
        for ki, k in enumerate(t.match_fields):
            out.append((f"{t.preamble.alias}.{k.name}.width",
                        lambda i, ti=ti, ki=ki: setattr(i.tables[ti].match_fields[ki], "bitwidth",
                                                         i.tables[ti].match_fields[ki].bitwidth + 1), name))
            out.append((f"{t.preamble.alias}.{k.name}.match_type",
                        lambda i, ti=ti, ki=ki: setattr(i.tables[ti].match_fields[ki], "match_type",
                                                         contract.MT.EXACT if i.tables[ti].match_fields[ki].match_type
                                                         != contract.MT.EXACT else contract.MT.TERNARY), name))
            out.append((f"{t.preamble.alias}.{k.name}.name",
                        lambda i, ti=ti, ki=ki: setattr(i.tables[ti].match_fields[ki], "name", "renamed"), name))
        out.append((f"{t.preamble.alias}.size", lambda i, ti=ti: setattr(i.tables[ti], "size", i.tables[ti].size // 2),
                    name))
    for ai, a in enumerate(info.actions):
        for pi, p in enumerate(a.params):
            out.append((f"{a.preamble.alias}.{p.name}.width",
                        lambda i, ai=ai, pi=pi: setattr(i.actions[ai].params[pi], "bitwidth",
                                                         i.actions[ai].params[pi].bitwidth - 1), a.preamble.name))
    for ci, c in enumerate(info.counters):
        out.append((f"{c.preamble.alias}.size", lambda i, ci=ci: setattr(i.counters[ci], "size", 8), c.preamble.name))
    for mi, m in enumerate(info.meters):
        out.append((f"{m.preamble.alias}.size", lambda i, mi=mi: setattr(i.meters[mi], "size", 256), m.preamble.name))
    for ci, c in enumerate(info.controller_packet_metadata):
        for fi, f in enumerate(c.metadata):
            out.append((f"{c.preamble.name}.{f.name}.width",
                        lambda i, ci=ci, fi=fi: setattr(i.controller_packet_metadata[ci].metadata[fi], "bitwidth",
                                                         i.controller_packet_metadata[ci].metadata[fi].bitwidth + 2),
                        "packet metadata"))
    return out


MUTATIONS = _mutations()


@pytest.mark.parametrize("what,mutate,names", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_a_fixture_with_one_field_changed_breaks_the_contract(what, mutate, names):
    info = contract.load(P4INFO)
    mutate(info)
    found = contract.violations(info)
    assert found, f"{what} changed and the contract check did not notice"
    assert any(names in v for v in found), found

