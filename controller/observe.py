"""Observation outputs: the JSON-lines decision log and the Prometheus metrics (prometheus_client).

Metrics are read from the runtime when Prometheus scrapes (a custom collector), so the epoch loop pays nothing
for them but the epoch-duration histogram. Names (docs/controller.md lists them; tools/grafana/ has a
dashboard built on them): counters end in ``_total``; jobs are labelled ``atp_job`` (never ``job``, which
Prometheus itself sets on every scraped series).
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Iterator

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:  # pragma: no cover
    from netapprox.controller.runtime import Runtime

EPOCH_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)

DRIVER_STATS: dict[str, tuple[str, str, str]] = {
    "pipeline_pushes": ("netapprox_pipeline_pushes", "counter",
                        "Pipelines pushed to the switch (a reconnect to a switch running ours pushes none)."),
    "entries_read_back": ("netapprox_entries_read_back", "gauge",
                          "Entries read back from the switch at the last connect without a pipeline push."),
    "entries_refused": ("netapprox_entries_refused", "gauge",
                        "Table entries the switch refused, held back until they change."),
    "jobs_without_entry": ("netapprox_jobs_without_entry", "gauge",
                           "Jobs without a queue_by_job entry because the table is full (classified by their TLR)."),
    "queue_config_ok": ("netapprox_queue_config_ok", "gauge",
                        "1 if the queue buffers/priorities were configured (and, on Tofino, read back) as asked."),
    "report_meter_ok": ("netapprox_report_meter_ok", "gauge", "1 if the REPORT punt meter is configured."),
    "queue0_guard_packets": ("netapprox_queue0_guard_packets", "counter",
                             "Approximate packets the data plane moved out of queue 0 (a table said queue 0)."),
    "primary": ("netapprox_switch_primary", "gauge",
                "1 if this controller is the switch's primary (its Writes are accepted), 0 if a backup."),
    "primary_replica": ("netapprox_switch_primary_replica", "gauge",
                        "The replica the switch says is primary (the low word of its election id); 0: none."),
    "primary_changes": ("netapprox_switch_primary_changes", "counter",
                        "Times the switch's primary changed (another one, or none), as this controller saw it."),
    "primary_since_seconds": ("netapprox_switch_primary_since_seconds", "gauge",
                              "Unix time of the last change of the switch's primary."),
    "primary_vacancies": ("netapprox_switch_primary_vacancies", "counter",
                          "Times the switch said its primary had gone (a crash detected; replicas only)."),
}
"""Driver.stats() key -> (metric, kind, help); a switch whose driver does not report a key has no sample."""


class DecisionLog:
    """Appends one JSON object per line. ``path=None`` discards everything."""

    def __init__(self, path: str | None) -> None:
        self._file: IO[str] | None = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """False when everything is discarded (callers may skip building the fields)."""
        return self._file is not None

    def write(self, event: str, **fields: Any) -> None:
        if self._file is None:
            return
        line = json.dumps({"ts": round(time.time(), 6), "event": event, **fields}, sort_keys=True)
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class RuntimeCollector(Collector):
    """Everything but the epoch histogram, read from a ``Runtime`` at scrape time."""

    def __init__(self, runtime: "Runtime") -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        snap = self.runtime.snapshot()
        yield _counter("netapprox_epochs", "Epochs run.", [((), snap["epochs"])])
        yield _counter("netapprox_reports_accepted", "Host reports accepted.", [((), snap["reports_accepted"])])
        yield _counter("netapprox_reports_dropped", "Host reports dropped, by reason.",
                       [((r,), n) for r, n in sorted(snap["reports_dropped"].items())], ["reason"])
        yield _gauge("netapprox_jobs", "Jobs with a live report.", [((), len(snap["jobs"]))])
        tuned = self.runtime.core.tuned  # one reference read: a consistent state even while an epoch runs
        yield _gauge("netapprox_tlr_threshold", "TLR threshold T_k of queue_by_tlr (queue k from T_k); mode "
                     "adaptive: as tuned.", [((str(q),), t) for q, t in enumerate(tuned.thresholds) if q >= 1],
                     ["queue"])
        yield _gauge("netapprox_placement_cutoff", "Placement cutoff T_k (a job's TLR shifted by its remaining "
                     "work places it; mode adaptive).", [((str(q),), t) for q, t in enumerate(tuned.cutoffs)
                                                         if q >= 2], ["queue"])
        yield _gauge("netapprox_queue_buffer_packets", "Buffer of approximate queue k as tuned, in units of "
                     "the switch's approx_buffer_unit (mode adaptive; no sample: the target's k-MTU buffers).",
                     [((str(q + 1),), b) for q, b in enumerate(tuned.buffers)], ["queue"])
        for name, help_text, key in (("netapprox_job_queue", "Logical queue assigned to the job.", "queue"),
                                     ("netapprox_job_tlr", "TLR the job reported last (its lowest group).", "tlr"),
                                     ("netapprox_job_loss", "Loss the job reported last (deciding group).", "loss"),
                                     ("netapprox_job_rate_bps", "Sending rate the job reported last, bit/s.",
                                      "rate_bps")):
            yield _gauge(name, help_text, [((str(j),), v[key]) for j, v in sorted(snap["jobs"].items())
                                           if v.get(key) is not None], ["atp_job"])
        switches = snap["switches"]
        yield _gauge("netapprox_switch_up", "1 if the controller is connected to the switch.",
                     [((n,), int(s["up"])) for n, s in switches.items()], ["switch"])
        yield _counter("netapprox_switch_reconnects", "Successful reconnections after a loss.",
                       [((n,), s["reconnects"]) for n, s in switches.items()], ["switch"])
        yield _counter("netapprox_table_updates", "Table updates written by epochs (re-installs after a "
                       "reconnect not included).", [((n, op), s[op]) for n, s in switches.items()
                                                     for op in ("insert", "modify", "delete")], ["switch", "op"])
        yield _counter("netapprox_write_errors", "Failed table updates.",
                       [((n,), s["write_errors"]) for n, s in switches.items()], ["switch"])
        for key, (name, kind, help_text) in DRIVER_STATS.items():
            samples = [((n,), s["stats"][key]) for n, s in switches.items() if key in s.get("stats", {})]
            yield (_counter if kind == "counter" else _gauge)(name, help_text, samples, ["switch"])
        yield _gauge("netapprox_write_backlog", "Table updates waiting for the switch (write budget or Writes in "
                     "flight); they go out at their newest value.",
                     [((n,), s["backlog"]) for n, s in switches.items()], ["switch"])
        yield _gauge("netapprox_write_backlog_urgent", "Of the waiting table updates, those of jobs whose loss "
                     "exceeds their TLR (sent first when the switch cannot take everything).",
                     [((n,), s.get("backlog_urgent", 0)) for n, s in switches.items()], ["switch"])
        yield _counter("netapprox_write_prioritised", "Updates of jobs whose loss exceeds their TLR sent ahead of "
                       "older waiting updates because the switch could not take everything.",
                       [((n,), s.get("write_stats", {}).get("prioritised", 0)) for n, s in switches.items()],
                       ["switch"])
        yield _counter("netapprox_write_coalesced", "Table updates superseded by a newer value of the same entry "
                       "before they were sent (never sent).",
                       [((n,), s.get("write_stats", {}).get("coalesced", 0)) for n, s in switches.items()],
                       ["switch"])
        queues = [(n, q) for n, s in switches.items() if s["counters"] is not None for q in s["counters"].queues]
        labels = ["switch", "port", "queue"]
        for name, help_text, attr in (
                ("netapprox_queue_enqueued_packets", "Packets classified into the queue.", "enqueued"),
                ("netapprox_queue_transmitted_packets", "Packets that left the queue.", "transmitted"),
                ("netapprox_queue_dropped_packets", "Tail drops of the queue.", "dropped"),
                ("netapprox_queue_transmitted_bytes", "Bytes that left the queue.", "transmitted_bytes")):
            yield _counter(name, help_text, [((n, str(q.port), str(q.qid)), getattr(q, attr)) for n, q in queues],
                           labels)
        yield _gauge("netapprox_queue_depth_packets", "Packets in the queue when counters were last read.",
                     [((n, str(q.port), str(q.qid)), q.backlog) for n, q in queues if q.backlog is not None], labels)
        yield _counter("netapprox_job_packets", "Packets that hit the job's queue_by_job entry.",
                       [((n, str(j)), c) for n, s in switches.items() if s["counters"] is not None
                        for j, c in sorted(s["counters"].job_packets.items())], ["switch", "atp_job"])
        yield _counter("netapprox_malformed_packets", "Packets the data plane dropped as malformed, by reason.",
                       [((n, r), c) for n, s in switches.items() if s["counters"] is not None
                        for r, c in sorted(s["counters"].malformed.items())], ["switch", "reason"])


def _counter(name: str, help_text: str, samples, labels=()) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_text, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def _gauge(name: str, help_text: str, samples, labels=()) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


class Metrics:
    """The runtime's Prometheus registry; ``serve(bind, port)`` exposes it on ``/metrics``."""

    def __init__(self, runtime: "Runtime") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.epoch_seconds = Histogram("netapprox_epoch_duration_seconds", "Processing time of one epoch.",
                                       buckets=EPOCH_BUCKETS, registry=self.registry)
        self.registry.register(RuntimeCollector(runtime))
        self._server = None
        self._thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None

    def serve(self, bind: str, port: int) -> None:
        self._server, self._thread = start_http_server(port, addr=bind, registry=self.registry)
        self.address = (bind, self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None
