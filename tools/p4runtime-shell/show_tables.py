"""Read NetApprox's tables from a running switch with p4runtime-shell, as a backup client beside the controller.

p4runtime-shell pins protobuf < 3.21 and p4runtime 1.4.1, so it lives in a virtual environment of its own
(not NetApprox's)::

    python3 -m venv build/p4runtime-shell/venv
    build/p4runtime-shell/venv/bin/pip install p4runtime-shell==0.0.6
    build/p4runtime-shell/venv/bin/python tools/p4runtime-shell/show_tables.py --grpc-addr 127.0.0.1:9559

It connects with election id (0, 1), below the controller's (give the controller a higher one, e.g.
``election_id = [0, 10]``), so it is a backup: it reads, it never writes, and the controller stays primary.
It takes the P4Info from the switch (GetForwardingPipelineConfig) and prints every entry of the logical tables
of docs/architecture.md, one line each, with match fields and action parameters as numbers::

    routes_v4       dst_addr=10.0.0.1/32 -> route(port=1, src_mac=02:00:00:00:01:00, dst_mac=02:00:00:00:00:01)
    queue_by_job    job_id=5 -> set_job_queue(qid=2)
    queue_by_tlr    tlr=4096..8191  prio=1 -> set_queue(qid=1)

``--json`` prints one JSON object per entry instead (tests/controller/test_p4runtime_shell.py compares them
with what the controller wrote). The same session, interactively::

    build/p4runtime-shell/venv/bin/python -m p4runtime_sh --grpc-addr 127.0.0.1:9559 --device-id 1 --election-id 0,1
    P4Runtime sh >>> for e in TableEntry("NetApproxIngress.classification.queue_by_job").read(): print(e)
"""
from __future__ import annotations

import argparse
import json
import sys

import p4runtime_sh.shell as sh

TABLES = (
    "NetApproxIngress.forwarding.routes_v4",
    "NetApproxIngress.classification.queue_by_job",
    "NetApproxIngress.classification.queue_by_tag",
    "NetApproxIngress.classification.queue_by_tlr",
    "NetApproxIngress.classification.queue_by_class",
    "NetApproxEgress.ecn.ecn_thresholds",
)


def _int(value: bytes) -> int:
    return int.from_bytes(value, "big")


def describe(entry, p4info) -> dict:
    """One table entry (a ``p4.v1.TableEntry``) with names from the P4Info and numbers for values."""
    table = next(t for t in p4info.tables if t.preamble.id == entry.table_id)
    fields = {f.id: f.name for f in table.match_fields}
    match = {}
    for m in entry.match:
        kind = m.WhichOneof("field_match_type")
        fm = getattr(m, kind)
        if kind == "exact":
            match[fields[m.field_id]] = {"exact": _int(fm.value)}
        elif kind == "lpm":
            match[fields[m.field_id]] = {"lpm": [_int(fm.value), fm.prefix_len]}
        elif kind == "ternary":
            match[fields[m.field_id]] = {"ternary": [_int(fm.value), _int(fm.mask)]}
        elif kind == "range":
            match[fields[m.field_id]] = {"range": [_int(fm.low), _int(fm.high)]}
        else:  # optional
            match[fields[m.field_id]] = {kind: _int(fm.value)}
    action = next(a for a in p4info.actions if a.preamble.id == entry.action.action.action_id)
    params = {p.id: p.name for p in action.params}
    return {"table": table.preamble.name, "priority": entry.priority, "match": match,
            "action": action.preamble.name,
            "params": {params[p.param_id]: _int(p.value) for p in entry.action.action.params}}


def _ipv4(x: int) -> str:
    return ".".join(str((x >> s) & 0xFF) for s in (24, 16, 8, 0))


def _mac(x: int) -> str:
    return ":".join(f"{(x >> s) & 0xFF:02x}" for s in range(40, -8, -8))


def as_line(d: dict) -> str:
    def value(v: dict) -> str:
        (kind, x), = v.items()
        if kind == "lpm":
            return f"{_ipv4(x[0])}/{x[1]}"
        if kind == "ternary":
            return f"{x[0]:#x}&{x[1]:#x}"
        if kind == "range":
            return f"{x[0]}..{x[1]}"
        return str(x)

    match = "  ".join(f"{k}={value(v)}" for k, v in d["match"].items()) or "(any)"
    prio = f"  prio={d['priority']}" if d["priority"] else ""
    params = ", ".join(f"{k}={_mac(v) if k.endswith('mac') else v}" for k, v in d["params"].items())
    return f"{d['table'].rsplit('.', 1)[-1]:<15} {match}{prio} -> {d['action'].rsplit('.', 1)[-1]}({params})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grpc-addr", default="127.0.0.1:9559", help="the switch's P4Runtime address")
    ap.add_argument("--device-id", type=int, default=1)
    ap.add_argument("--election-id", default="0,1", help="HIGH,LOW; below the controller's, so this is a backup")
    ap.add_argument("--json", action="store_true", help="one JSON object per entry")
    args = ap.parse_args(argv)
    high, low = (int(x) for x in args.election_id.split(","))
    sh.setup(device_id=args.device_id, grpc_addr=args.grpc_addr, election_id=(high, low), verbose=False)
    try:
        p4info = sh.client.get_p4info()
        for name in TABLES:
            entries = []
            sh.TableEntry(name).read(lambda e: entries.append(e.msg()))
            if not args.json:
                print(f"{name}: {len(entries)} entries")
            for entry in sorted(entries, key=lambda e: e.SerializeToString(deterministic=True)):
                d = describe(entry, p4info)
                print(json.dumps(d, sort_keys=True) if args.json else "  " + as_line(d))
    finally:
        sh.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
