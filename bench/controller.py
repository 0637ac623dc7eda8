"""Controller benchmark: epoch processing time vs. number of jobs, and report-to-write latency.

``run() -> dict`` (called by ``python -m netapprox.bench``) or ``python -m netapprox.bench.controller [--quick] [--json FILE]``.
Everything is measured in one run on this machine; compare the ratios, not the absolute numbers.

1. Epoch processing for 100, 1,000 and 10,000 jobs, each reporting every epoch and 10% of them changing
   queue per epoch:
   - ``ingest``: validating and recording that epoch's reports (``ControllerCore.ingest``, one per job);
   - ``loop``: ``Runtime.epoch`` (expiry + pure policy + desired state + apply) with a recording in-memory driver;
   - ``p4runtime_diff``: the same desired state turned into P4Runtime updates by ``P4RuntimeDriver`` (table
     mirrors, protobuf encoding, diff), without the RPC.
   Reported: median and p90 ms per epoch, and the per-job cost ratio (ingest + loop + diff) of 10,000 vs
   100 jobs (1.0 = linear scaling).
   (The P4 program's queue_by_job holds 1,024 entries; 10,000 measures the controller, not a deployment.)
2. Report-to-write latency through the fake P4Runtime server: a REPORT datagram is sent to the controller's
   UDP socket while ``Runtime.run`` runs epochs of ``epoch_ms``; the latency ends when the fake server
   receives the batched Write. Also ``immediate``: the same path with the epoch stepped right after the
   report arrives (the processing share of the latency).
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from netapprox.controller.config import ControllerConfig, PolicyConfig, ReportConfig, SwitchConfig
from netapprox.controller.drivers import Driver
from netapprox.controller.model import Counters, SwitchState, WriteSummary
from netapprox.controller.p4runtime.driver import P4RuntimeDriver
from netapprox.controller.p4runtime.options import P4RuntimeOptions
from netapprox.controller.runtime import Runtime
from netapprox.hostlib.wire import Report

REPO = Path(__file__).resolve().parents[1]
P4INFO = REPO / "tests" / "controller" / "fixtures" / "p4info.txtpb"


def fake_p4runtime_server():
    """The test suite's in-process P4Runtime server (tests/support/fake_p4runtime.py): the benchmark runs from
    a checkout, like the tests."""
    support = REPO / "tests"
    if not (support / "support" / "fake_p4runtime.py").exists():
        raise RuntimeError("the report-to-write benchmark needs the repository's tests/support (run it from a checkout)")
    if str(support) not in sys.path:
        sys.path.insert(0, str(support))
    from support.fake_p4runtime import FakeP4RuntimeServer

    return FakeP4RuntimeServer()
TABLES = ("routes", "class_rules", "job_rules", "tag_rules", "tlr_rules", "ecn_rules")


class RecordingDriver(Driver):
    """In-memory driver: diffs SwitchStates as sets and records the summaries."""

    def __init__(self, name: str = "bench") -> None:
        self.name = name
        self.installed = SwitchState()
        self.summaries: list[WriteSummary] = []

    def connect(self) -> None:
        pass

    def apply(self, desired: SwitchState) -> WriteSummary:
        ins = dele = 0
        for table in TABLES:
            old, new = getattr(self.installed, table), getattr(desired, table)
            ins += len(new - old)
            dele += len(old - new)
        summary = WriteSummary(inserted=ins, deleted=dele)
        self.installed = desired
        self.summaries.append(summary)
        return summary

    def read_counters(self) -> Counters:
        return Counters(queues=())

    def close(self) -> None:
        pass


def _report(job: int, seq: int, tlr: float) -> bytes:
    return Report(job_id=job, group_id=0, seq=seq, tlr=tlr, loss=0.0, msr=0.9, rate_kbps=1000, total=100,
                  delivered=0, lost=0, epoch=seq).encode()


def _tlr(job: int, epoch: int) -> float:
    """A job's TLR in an epoch: 10% of jobs jump by half a unit each epoch (so they change queue)."""
    base = (job * 0.618) % 1.0
    return (base + 0.5) % 1.0 if (job + epoch) % 10 == 0 else base


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def bench_epochs(n_jobs: int, epochs: int) -> dict[str, Any]:
    driver = RecordingDriver()
    config = ControllerConfig(reports=ReportConfig(port=-1, rate_per_host=1e12, burst=10 ** 9),
                              policy=PolicyConfig(hysteresis=0.0, job_timeout_s=1e9), counters_every=0)
    runtime = Runtime(config, drivers={"bench": driver}, background_connect=False)
    assert runtime.connect(5)
    payloads = [[_report(j, e + 1, _tlr(j, e)) for j in range(1, n_jobs + 1)] for e in range(epochs + 1)]
    p4 = P4RuntimeDriver("bench", P4RuntimeOptions(p4info=str(P4INFO)))
    ingest_ms, loop_ms, diff_ms, updates = [], [], [], []
    try:
        for e in range(epochs + 1):
            now = float(e)
            t0 = time.perf_counter()
            for data in payloads[e]:
                runtime.ingest(data, "h", now)
            t_ingested = time.perf_counter()
            result = runtime.epoch(now)
            t1 = time.perf_counter()
            changes = p4.pending_changes(result.plan.desired["bench"])
            for c in changes:
                c.commit()  # as if the Write succeeded
            t2 = time.perf_counter()
            if e == 0:
                continue  # first epoch installs everything
            ingest_ms.append((t_ingested - t0) * 1e3)
            loop_ms.append((t1 - t_ingested) * 1e3)
            diff_ms.append((t2 - t1) * 1e3)
            updates.append(len(changes))
    finally:
        runtime.close()
    return {
        "jobs": n_jobs,
        "epochs": epochs,
        "ingest_ms_median": round(statistics.median(ingest_ms), 3),
        "loop_ms_median": round(statistics.median(loop_ms), 3),
        "loop_ms_p90": round(_pct(loop_ms, 0.9), 3),
        "p4runtime_diff_ms_median": round(statistics.median(diff_ms), 3),
        "p4runtime_diff_ms_p90": round(_pct(diff_ms, 0.9), 3),
        "updates_per_epoch_median": statistics.median(updates),
    }


def bench_latency(samples: int, epoch_ms: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, fake_p4runtime_server() as server:
        bmv2_json = Path(tmp) / "bmv2.json"
        bmv2_json.write_bytes(b"{}")
        options = {"address": server.address, "p4info": str(P4INFO), "bmv2_json": str(bmv2_json)}
        config = ControllerConfig(switches=(SwitchConfig(name="s1", options=options),),
                                  reports=ReportConfig(bind="127.0.0.1", port=0), epoch_s=epoch_ms / 1000.0,
                                  policy=PolicyConfig(hysteresis=0.0), counters_every=0)
        arrived: list[float] = []
        event = threading.Event()

        def on_write(request, stamp: float) -> None:
            arrived.append(stamp)
            event.set()

        server.on_write = on_write
        runtime = Runtime(config)
        try:
            if not runtime.connect(10):
                raise RuntimeError("controller did not connect to the fake P4Runtime server")
            runtime.epoch()
            # immediate: ingest + step + write, no waiting for the epoch boundary
            immediate = []
            seq = 0
            for i in range(samples):
                seq += 1
                event.clear()
                t0 = time.perf_counter()
                runtime.ingest(_report(1, seq, 0.1 if seq % 2 else 0.9), "h")
                runtime.epoch()
                if not event.wait(5):
                    raise RuntimeError("no write after a queue-changing report")
                immediate.append((arrived[-1] - t0) * 1e3)
            # through the UDP socket while run() ticks epochs
            runtime.start()
            through_loop = []
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                for i in range(samples):
                    seq += 1
                    event.clear()
                    time.sleep(epoch_ms / 1000.0 * ((i * 0.37) % 1.0))  # land at varying epoch phases
                    t0 = time.perf_counter()
                    s.sendto(_report(1, seq, 0.1 if seq % 2 else 0.9), runtime.report_address)
                    if not event.wait(5):
                        raise RuntimeError("no write within 5 s of a queue-changing report")
                    through_loop.append((arrived[-1] - t0) * 1e3)
            runtime.stop()
        finally:
            runtime.close()
    return {
        "epoch_ms": epoch_ms,
        "samples": samples,
        "immediate_ms_median": round(statistics.median(immediate), 3),
        "immediate_ms_p90": round(_pct(immediate, 0.9), 3),
        "report_to_write_ms_median": round(statistics.median(through_loop), 3),
        "report_to_write_ms_p90": round(_pct(through_loop, 0.9), 3),
        "report_to_write_ms_max": round(max(through_loop), 3),
    }


def run(quick: bool = False) -> dict:
    """Run the controller benchmark; returns a JSON-serialisable dict."""
    sizes = (100, 1000, 10000)
    epochs = {100: 20 if quick else 100, 1000: 5 if quick else 30, 10000: 3 if quick else 10}
    epoch_results = [bench_epochs(n, epochs[n]) for n in sizes]
    by_n = {r["jobs"]: r for r in epoch_results}
    per_job = {n: (by_n[n]["ingest_ms_median"] + by_n[n]["loop_ms_median"] + by_n[n]["p4runtime_diff_ms_median"]) / n
               for n in sizes}
    latency = bench_latency(samples=20 if quick else 60, epoch_ms=20.0)
    return {
        "name": "controller",
        "epochs": epoch_results,
        "per_job_cost_ratio_10000_vs_100": round(per_job[10000] / per_job[100], 2),
        "latency": latency,
        "latency_over_epoch": round(latency["report_to_write_ms_median"] / latency["epoch_ms"], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="NetApprox controller benchmark")
    parser.add_argument("--quick", action="store_true", help="fewer epochs and samples")
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args(argv)
    result = run(quick=args.quick)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
