"""p4runtime-shell as a backup client beside the controller (tools/p4runtime-shell/show_tables.py).

p4runtime-shell pins protobuf < 3.21 and p4runtime 1.4.1, so it cannot share NetApprox's environment: the test
keeps a venv of its own under build/p4runtime-shell/ (made with pip on first use, about a minute; reused
after), drives the controller's P4Runtime driver against the in-process fake server, then runs the example
script there as a backup and compares every entry it reads with what the controller wrote.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from netapprox.controller.model import ClassRule, EcnRule, JobRule, Route, SwitchState, TagRule, default_tlr_rules
from netapprox.controller.p4runtime.protos import p4info_pb2
from google.protobuf import text_format

from ctl_fixtures import P4INFO

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "p4runtime-shell" / "show_tables.py"
P4SH_VERSION = "0.0.6"
VENV = REPO / "build" / "p4runtime-shell" / f"venv-{P4SH_VERSION}"

STATE = SwitchState(
    routes=frozenset({Route("10.0.0.1", 32, 1, "02:00:00:00:01:00", "02:00:00:00:00:01"),
                      Route("10.0.1.0", 24, 2, "02:00:00:00:01:00", "02:00:00:00:00:02")}),
    class_rules=frozenset({ClassRule(1, 6, 0xFF, 5001, 0xFFFF, 0)}),
    job_rules=frozenset({JobRule(5, 2), JobRule(9, 4)}),
    tag_rules=frozenset({TagRule(2, 0, 9, 0, 0xFFFFFFFF, 1)}),
    tlr_rules=default_tlr_rules(),
    ecn_rules=frozenset({EcnRule(0, 20)}),
)


def p4sh_python() -> Path:
    """The Python of the p4runtime-shell venv, made on first use; skips (saying why) when pip cannot make it."""
    python = VENV / "bin" / "python"
    marker = VENV / ".installed"
    if marker.exists():
        return python
    VENV.parent.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True, capture_output=True,
                       timeout=120)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        f"p4runtime-shell=={P4SH_VERSION}"], check=True, capture_output=True, text=True,
                       timeout=600)
    except subprocess.CalledProcessError as e:
        last = (e.stderr or e.stdout or "").strip().splitlines()[-1:] or ["no output"]
        pytest.skip(f"cannot install p4runtime-shell {P4SH_VERSION} into {VENV} with pip: {last[0]}")
    except subprocess.TimeoutExpired:
        pytest.skip(f"installing p4runtime-shell {P4SH_VERSION} with pip took over 10 minutes")
    marker.write_text(f"p4runtime-shell=={P4SH_VERSION}\n")
    return python


def _entries_as_dicts(entries, p4info) -> list[dict]:
    """What the script prints for each entry, computed here from the fake server's copy of what was written."""
    def num(value: bytes) -> int:
        return int.from_bytes(value, "big")

    out = []
    for e in entries:
        table = next(t for t in p4info.tables if t.preamble.id == e.table_id)
        fields = {f.id: f.name for f in table.match_fields}
        match = {}
        for m in e.match:
            kind = m.WhichOneof("field_match_type")
            fm = getattr(m, kind)
            if kind == "exact":
                value = num(fm.value)
            elif kind == "lpm":
                value = [num(fm.value), fm.prefix_len]
            elif kind == "ternary":
                value = [num(fm.value), num(fm.mask)]
            else:
                value = [num(fm.low), num(fm.high)]
            match[fields[m.field_id]] = {kind: value}
        action = next(a for a in p4info.actions if a.preamble.id == e.action.action.action_id)
        names = {p.id: p.name for p in action.params}
        out.append({"table": table.preamble.name, "priority": e.priority, "match": match,
                    "action": action.preamble.name,
                    "params": {names[p.param_id]: num(p.value) for p in e.action.action.params}})
    return out


def _key(d: dict) -> str:
    return json.dumps(d, sort_keys=True)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_p4runtime_shell_reads_what_the_controller_wrote(make_driver, fake_server):
    python = p4sh_python()
    driver = make_driver(election_id=(0, 10))
    driver.connect()
    driver.apply(STATE)
    written = fake_server.entries()
    assert len(written) == 2 + 1 + 2 + 1 + 8 + 1  # routes, class, jobs, tag, TLR k/8 thresholds, ECN

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    res = subprocess.run([str(python), str(SCRIPT), "--grpc-addr", fake_server.address, "--device-id", "1",
                          "--election-id", "0,1", "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert "You are not the primary client" in res.stdout  # p4runtime-shell says it is a backup
    shown = sorted(_key(json.loads(line)) for line in lines if line.startswith("{"))

    p4info = text_format.Parse(P4INFO.read_text(), p4info_pb2.P4Info())
    assert shown == sorted(_key(d) for d in _entries_as_dicts(written, p4info))
    # the controller stayed primary and nothing was written by the shell
    assert len(fake_server.entries()) == len(written)
    assert {(a.election_id.high, a.election_id.low) for a in fake_server.arbitrations} == {(0, 10), (0, 1)}

    human = subprocess.run([str(python), str(SCRIPT), "--grpc-addr", fake_server.address], capture_output=True,
                           text=True, timeout=120, env=env)
    assert human.returncode == 0, human.stderr[-2000:]
    assert "NetApproxIngress.classification.queue_by_job: 2 entries" in human.stdout
    assert "queue_by_job    job_id=5 -> set_job_queue(qid=2)" in human.stdout
