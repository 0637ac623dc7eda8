"""Runs inside the test's network namespace (``ip netns exec NS python bmv2_failover_scenario.py ...``), where the
test made veth pairs swp1-h1 and swp2-h2: starts ``simple_switch_grpc``, two controller processes with one
configuration (``--replica 2``, then ``--replica 1``, each with its own report port), hosts reporting job 42's TLR
to both, and UDP packets streaming h1 -> h2 through the switch (non-approximate ones, and job 42's ATP DATA every
4th). Then ``kill -9`` of the primary, with a job move reported at that moment:

- takeover: from the kill to replica 1's ``primary`` decision-log event (its first epoch as primary), and to the
  move read back from the switch (which also waits for the next report);
- no non-approximate packet lost (the routes and queue_by_class never go away);
- the tables read back afterwards equal those before the kill, but for the moved job entry;
- the job moves resume (another move is written by the new primary).

Prints one JSON object; the test asserts on it. Everything started here is stopped here.
"""
from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

from netapprox.controller.p4runtime.mirror import action_value, entry_identity
from netapprox.controller.p4runtime.p4info import P4Info
from netapprox.controller.p4runtime.protos import p4runtime_pb2
from netapprox.hostlib.wire import Report
from netapprox.topo.bmv2 import Bmv2Options, Bmv2Process

from bmv2_restart_scenario import GRPC_PORT, H1_IP, H2_IP, JOB, THRIFT_PORT, Stream, mac, reader
from ctl_fixtures import controller_toml, scenario_args, start_controller, stop_process, wait_until

EPOCH_MS = 20.0
REPORT_INTERVAL_MS = 20.0
REPORT_PORTS = {1: 7611, 2: 7612}


class Reports:
    """Job 42's host: its TLR to both replicas every 20 ms (``tlr`` may change while it runs)."""

    def __init__(self, tlr: float) -> None:
        self.tlr = tlr
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        seq = 0
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            while not self.stop.wait(REPORT_INTERVAL_MS / 1000):
                seq += 1
                data = Report(job_id=JOB, group_id=0, seq=seq, tlr=self.tlr, loss=0.0, msr=0.9, rate_kbps=1000,
                              total=100, delivered=0, lost=0, epoch=seq).encode()
                for port in REPORT_PORTS.values():
                    s.sendto(data, ("127.0.0.1", port))


def events(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def main() -> int:
    args = scenario_args()
    work = args.workdir
    job_table = P4Info.load(args.p4info).table("NetApproxIngress.classification.queue_by_job").id
    config = work / "controller.toml"
    config.write_text(controller_toml(
        address=f"127.0.0.1:{GRPC_PORT}", p4info=args.p4info, bmv2_json=args.bmv2_json, report_port=0,
        decision_log=work / "decisions.jsonl", controller=f"epoch_ms = {EPOCH_MS:g}",
        routes=[(f"{H1_IP}/32", 1, mac("h1")), (f"{H2_IP}/32", 2, mac("h2"))],
        policy="job_timeout_s = 5.0\nhysteresis = 0.0",
        options=f"ports = [1, 2]\nthrift_port = {THRIFT_PORT}\nconnect_timeout_s = 5.0"))
    out: dict = {"epoch_ms": EPOCH_MS, "report_interval_ms": REPORT_INTERVAL_MS}
    switch = Bmv2Process(Bmv2Options(ports={1: "swp1", 2: "swp2"}, device_id=1, grpc_port=GRPC_PORT,
                                     thrift_port=THRIFT_PORT, log_level=None), work / "bmv2.log")
    procs: dict[int, object] = {}
    decisions = {rank: work / f"decisions-{rank}.jsonl" for rank in REPORT_PORTS}
    reports = Reports(tlr=0.30)  # queue 2
    stream = None
    channel, read, cookie = reader(f"127.0.0.1:{GRPC_PORT}")
    all_entries = p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry(table_id=0))

    def entries() -> set:
        return {(entry_identity(e.table_entry), action_value(e.table_entry.action)) for e in read(all_entries)}

    def job_queue() -> int | None:
        got = [e.table_entry for e in read(all_entries) if e.table_entry.table_id == job_table]
        return int.from_bytes(got[0].action.action.params[0].value, "big") if got else None

    try:
        switch.start(timeout=30)
        reports.thread.start()
        for rank in (2, 1):  # replica 2 arms the switch; replica 1 joins as its backup
            procs[rank] = start_controller(config, work / f"replica-{rank}.log", "--replica", str(rank),
                                           "--report-port", str(REPORT_PORTS[rank]),
                                           "--decision-log", str(decisions[rank]))
            if rank == 2 and not wait_until(lambda: job_queue() == 2, 30):
                out["armed"] = False
                print(json.dumps(out))
                return 0
        out["armed"] = True
        out["backup_ready"] = wait_until(lambda: any(e["event"] == "backup" for e in events(decisions[1])), 30)
        stream = Stream(pps=200).start()
        time.sleep(1.0)
        before = entries()
        cookie_before = cookie()
        # kill -9 of the primary, and a job move (TLR 0.30 -> 0.55: queue 2 -> 4) at that moment
        killed = time.time()
        t0 = time.monotonic()
        procs[2].send_signal(signal.SIGKILL)
        reports.tlr = 0.55
        moved = wait_until(lambda: job_queue() == 4, 10, step=0.002)
        out["move_ms"] = (time.monotonic() - t0) * 1e3 if moved else None
        primary_at = next((e["ts"] for e in events(decisions[1]) if e["event"] == "primary"), None)
        out["takeover_ms"] = (primary_at - killed) * 1e3 if primary_at is not None else None
        time.sleep(1.0)
        after = entries()
        # what the new primary wants: what replica 2 had installed, but job 42 in queue 4
        out["tables_equal_desired"] = moved and job_queue() == 4 and \
            {e for e in before if e[0][0] != job_table} == {e for e in after if e[0][0] != job_table}
        out["entries"] = len(after)
        out["cookie_unchanged"] = cookie() == cookie_before and cookie_before not in (None, 0)
        reports.tlr = 0.80  # the job moves resume: queue 6
        out["resumed"] = wait_until(lambda: job_queue() == 6, 5)
        time.sleep(0.5)
        stream.sending.clear()
        time.sleep(0.5)
        non_approx = [seq for seq in range(stream.sent) if seq % 4]
        out["sent_non_approx"] = len(non_approx)
        out["lost_non_approx"] = sum(1 for seq in non_approx if seq not in stream.received)
        out["lost_approx"] = sum(1 for seq in range(0, stream.sent, 4) if seq not in stream.received)
        out["replica1_alive"] = procs[1].poll() is None
        log1 = (work / "replica-1.log").read_text(errors="replace")
        out["replica1_refused_writes"] = log1.count("PERMISSION_DENIED") + log1.count("Write failed")
    finally:
        reports.stop.set()
        if stream is not None:
            stream.close()
        channel.close()
        for proc in procs.values():
            stop_process(proc)
        switch.stop()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
