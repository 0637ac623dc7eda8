"""The TNA tree through a real Tofino back end (`make p4-tna`: bf-p4c from the Intel SDE / open-p4studio, or
p4c built with the open-source Tofino back end, `p4c --target tofino --arch tna`), and its P4Info against the
v1model program's: the same tables, keys, actions, parameters, counters, meters and packet metadata (ids may
differ; bf-p4c may prefix names with the pipe, ``pipe.``)."""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import google.protobuf.text_format
import pytest
from netapprox.controller.p4runtime.protos import p4info_pb2

REPO = pathlib.Path(__file__).resolve().parents[2]
def _tofino_compiler() -> str | None:
    """What `make p4-tna` uses: bf-p4c, else the p4c driver beside p4c-barefoot."""
    if shutil.which("bf-p4c"):
        return shutil.which("bf-p4c")
    backend = shutil.which("p4c-barefoot")
    driver = pathlib.Path(backend).parent / "p4c" if backend else None
    return str(driver) if driver is not None and driver.exists() else None


TOFINO_COMPILER = _tofino_compiler()
NO_TOFINO = ("needs a Tofino compiler on PATH: bf-p4c (Intel Tofino SDE or open-p4studio), or p4c with the "
             "open-source Tofino back end (p4c-barefoot: p4lang/p4c configured with -DENABLE_TOFINO=ON)")

pytestmark = [pytest.mark.p4, pytest.mark.skipif(TOFINO_COMPILER is None, reason=NO_TOFINO), pytest.mark.timeout(900)]


def _load(path: pathlib.Path) -> p4info_pb2.P4Info:
    info = p4info_pb2.P4Info()
    google.protobuf.text_format.Merge(path.read_text(), info)
    return info


def contract(info: p4info_pb2.P4Info) -> dict:
    """Everything the controller relies on, by name (``pipe.`` stripped), without ids."""
    def name(preamble) -> str:
        return preamble.name.removeprefix("pipe.")

    actions = {a.preamble.id: name(a.preamble) for a in info.actions}
    out: dict = {}
    for t in info.tables:
        refs = sorted(actions[r.id] for r in t.action_refs if r.scope != p4info_pb2.ActionRef.DEFAULT_ONLY)
        out["table " + name(t.preamble)] = ([(f.name, f.match_type, f.bitwidth) for f in t.match_fields], refs,
                                            t.size, len(t.direct_resource_ids))
    for a in info.actions:
        if not name(a.preamble).startswith("NetApprox"):
            continue  # NoAction and other architecture-provided actions
        out["action " + name(a.preamble)] = [(p.name, p.bitwidth) for p in a.params]
    for c in info.counters:
        out["counter " + name(c.preamble)] = (c.spec.unit, c.size)
    for c in info.direct_counters:
        out["direct counter " + name(c.preamble)] = c.spec.unit
    for m in info.meters:
        out["meter " + name(m.preamble)] = (m.spec.unit, m.size)
    for c in info.controller_packet_metadata:
        out["packet metadata " + c.preamble.name] = [(m.id, m.name, m.bitwidth) for m in c.metadata]
    return out


TOFINO1_STAGES = 12  # match-action stages per gress on Tofino 1
PIPE = REPO / "build" / "tna" / "pipe"


@pytest.fixture(scope="module")
def tna_p4info() -> p4info_pb2.P4Info:
    (PIPE / "tofino.bin").unlink(missing_ok=True)  # so the test below sees this run's binary, not an old one
    res = subprocess.run(["make", "-C", str(REPO), "p4-tna"], capture_output=True, text=True, timeout=840)
    assert res.returncode == 0, f"make p4-tna failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return _load(REPO / "build" / "tna" / "p4info.txtpb")


def test_the_tna_program_compiles_with_the_tofino_back_end(tna_p4info):
    names = {t.preamble.name.removeprefix("pipe.") for t in tna_p4info.tables}
    assert "NetApproxIngress.classification.queue_by_tag" in names


def test_the_tna_program_assembles_for_tofino_1(tna_p4info):
    """`make p4-tna` asks for the assembler (ENABLE_BF_ASM=1): the program must fit Tofino 1's stages and leave a
    binary, not only compile."""
    assert (PIPE / "tofino.bin").stat().st_size > 0
    bfa = (PIPE / "netapprox.bfa").read_text()
    for gress in ("ingress", "egress"):
        used = [int(n) for n in re.findall(rf"^stage (\d+) {gress}:", bfa, re.M)]
        assert used and max(used) < TOFINO1_STAGES, f"{gress} uses stages {used}"


@pytest.mark.skipif(shutil.which("p4c-bm2-ss") is None, reason="needs p4c-bm2-ss (p4c) for the v1model P4Info")
def test_both_architectures_produce_the_same_p4info(tna_p4info):
    subprocess.run(["make", "-C", str(REPO), "p4"], check=True, capture_output=True, timeout=600)
    v1model = contract(_load(REPO / "build" / "v1model" / "p4info.txtpb"))
    tna = contract(tna_p4info)
    assert sorted(set(v1model) ^ set(tna)) == [], "entities in one P4Info only"
    assert {k: v for k, v in tna.items() if v1model[k] != v} == {}, "entities that differ"
