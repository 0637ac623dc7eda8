"""The network part of ``make bench``: the papers' comparisons on the emulated rack, side by side in one run.

Every comparison gives each side the setup its own users would run, as the NetApprox paper does: ATP runs on
NetApprox switches (8 strict-priority queues, the controller re-mapping jobs every epoch), the baselines
(TCP-EarlySend, TCP-SampleSend) on a network-oblivious switch, one FIFO queue per port with the same total
buffer (``experiments.plans.switch_for``). Each trial is a plan (experiments/plans.py) run by the emulated back end
(experiments/emulated.py). Sections:

- ``contention`` (Fig. 5-9): approximate jobs against each other. All-to-all FBKV and FBHD (every host sends
  one job to a random other host) and incast (hosts 1..3 send an FBKV job to host 0), MSR 0.5/0.7/0.9:
  ATP vs TCP-ES and TCP-SS.
- ``background`` (Fig. 11): one FBKV job next to approximate background, a paced UDP blast at 70 % of the
  link marked as an approximate job of MSR 0.5 would be (TLR 0.5, queue 4), so that foreground jobs of
  different MSRs start in different queues relative to it, as in the paper: ATP vs TCP-ES, which shares its
  FIFO with the blast. ``background-same-queue`` (extra row): the blast always in the job's initial queue,
  the adversarial case where only the controller's promotion (Fig. 10) separates them, and at MSR 0.9 (queue
  1, the top approximate queue) nothing can.
- ``coexist`` (Fig. 13): two FBHD approximate jobs next to web-search TCP flows (non-approximate) into one
  host: the approximate JCT *and* the flows' FCT, NetApprox vs TCP-ES on the FIFO switch, never one without
  the other.
- ``idle``: one ATP job of full-packet messages alone on an idle link at 20 and 100 Mbit/s: JCT / the
  physical bound, the line time of its MSR·N messages as ATP packets on the wire (headers included,
  ``experiments.metrics.wire_bound_s``); also JCT / MSR·N·size·8 / rate (payload only).
- ``yield`` (extra row, the first benchmark's setup): one job next to web-search flows on the NetApprox
  switch, ATP in an approximate queue and TCP-ES in queue 0 with strict priority above it. It measures how
  much ATP yields to non-approximate traffic, not a race.
- ``queues`` (extra row): web-search flows next to ATP jobs on NetApprox queues vs next to the same ATP jobs
  on the FIFO switch: what the queues alone do for non-approximate traffic.
- ``leafspine`` (multi-path): all-to-all FBKV on an emulated leaf-spine of kernel switches (2 leaves with 2
  hosts each, 2 spines, leaf-spine links at half the host rate: 2:1 oversubscribed, as leaf-spine fabrics are
  built), MSR 0.5/0.7: ATP with the fabric spraying its approximate DATA (the design) vs ATP on the same fabric
  hashing flows (``atp-flowhash``) vs TCP-ES on FIFO switches (flow hashing, as any ECMP fabric); ATP's two
  settings run each seed ``LEAFSPINE_RUNS`` times (a run draws one flow-hash placement).

``trials(...)`` lists every trial up front (so progress can say what remains); ``run(...)`` runs them, one
testbed per (switch kind, link rate), and returns one row per trial.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable, Sequence

from netapprox.controller.model import queue_for_tlr
from netapprox.experiments.emulated import EmulatedBackend, Scale, sprays
from netapprox.experiments.figures import alltoall_jobs, coexist_plan, incast_jobs
from netapprox.experiments.jobs import JobWorkload
from netapprox.experiments.metrics import flow_fct_stats, job_summary
from netapprox.experiments.plans import Background, JobPlan, TrialPlan, switch_for
from netapprox.experiments.results import Progress
from netapprox.experiments.workloads import web_search_flows

SECTIONS = ("contention", "background", "coexist", "idle", "background-same-queue", "yield", "queues", "leafspine")
MSRS = (0.5, 0.7, 0.9)
CONTENTION_PATTERNS = ("alltoall-fbkv", "alltoall-fbhd", "incast-fbkv")
CONTENTION_PROTOCOLS = ("atp", "tcp-es", "tcp-ss")
BACKGROUND_LOAD = 0.7
BACKGROUND_TLR = 0.5
COEXIST_MSR = 0.9
COEXIST_FLOW_LOAD = 0.3
COEXIST_DURATION_S = 3.0
IDLE_RATES_MBIT = (20.0, 100.0)
IDLE_SIZE = 1368
"""One full ATP packet (1400-byte datagrams) per message."""
IDLE_MESSAGES_AT_20M = 500
"""Equal-size messages of the idle-link job at 20 Mbit/s; scaled with the rate, so the bound is the same time."""
YIELD_MSRS = (0.5, 0.9)
YIELD_FLOW_LOAD = 0.3
YIELD_START_S = 0.3
"""The job starts this long after the flows."""
LEAFSPINE_MSRS = (0.5, 0.7)
LEAFSPINE_PROTOCOLS = ("atp", "atp-flowhash", "tcp-es")
LEAFSPINE_RUNS = {"atp": 3, "atp-flowhash": 3, "tcp-es": 1}
"""Runs of each (MSR, seed) trial per protocol. One run draws one flow-hash placement per flow (the ports change
from run to run) and one schedule of the 2-core host, and with 4 jobs per seed that alone moved the row's spray /
flow hash ratio over 0.76-0.92 between runs of the same code (one seed's 0.6-1.2): ATP's two fabric settings, the
ratio whose spread spans its bar, run three times each and the ratios are of the means over every job of every run.
TCP-ES runs once (its ratio, 0.3-0.4 against a bar of 0.5, is not within its spread of the bar)."""
LEAFSPINE_HOSTS = 4
LEAFSPINE_OVERSUBSCRIPTION = 2.0
"""Host links / leaf-spine links: each leaf's 2 hosts can send twice what its 2 uplinks carry."""


def leafspine_scale(scale: Scale) -> Scale:
    """The leaf-spine's scale: ``scale``'s rates and jobs on 2 leaves x 2 spines (``LEAFSPINE_HOSTS`` hosts)."""
    return dataclasses.replace(scale, topology="leafspine", hosts=LEAFSPINE_HOSTS, leaves=2, spines=2,
                               uplink_mbit=scale.rate_mbit / LEAFSPINE_OVERSUBSCRIPTION)


@dataclasses.dataclass(frozen=True)
class Trial:
    section: str
    params: dict
    protocol: str
    seed: int
    kind: str
    """The switch it runs on (``experiments.plans.SWITCHES``)."""
    rate_mbit: float
    plan: TrialPlan
    metrics: Callable[[dict], dict]
    """Trial record -> the row's metrics."""
    topology: str = "rack"
    """``rack`` or ``leafspine`` (``leafspine_scale``)."""

    @property
    def label(self) -> str:
        params = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.section} {params} {self.protocol} seed={self.seed}"


def jobs_metrics(tr: dict) -> dict:
    jobs = tr["jobs"]
    wire = [j.get("jct_over_wire_bound") for j in jobs]
    return {**job_summary(tr), "jcts_s": [j["jct_s"] for j in jobs], "msr_met": [bool(j["msr_met"]) for j in jobs],
            "jct_over_wire_bound": None if not wire or None in wire else sum(wire) / len(wire),
            "late_start_s": max((j.get("late_start_s") or 0.0 for j in jobs), default=0.0)}


def coexist_metrics(tr: dict) -> dict:
    return {**jobs_metrics(tr), **flow_fct_stats(tr.get("flows", []))}


def trials(seeds: Sequence[int], scale: Scale, *, sections: Sequence[str] | None = None) -> list[Trial]:
    """Every trial of the sections asked for (default: all), in the order they run."""
    want = set(sections or SECTIONS)
    backend = EmulatedBackend(scale)
    rate = scale.rate_mbit
    out: list[Trial] = []

    def add(section, params, seed, plan, metrics=jobs_metrics, kind=None, rate_mbit=rate, topology="rack"):
        kind = kind or switch_for(plan.protocol)
        out.append(Trial(section, params, plan.protocol, seed, kind, rate_mbit,
                         dataclasses.replace(plan, switch=kind), metrics, topology))

    if "contention" in want:
        for pattern in CONTENTION_PATTERNS:
            for msr in MSRS:
                for seed in seeds:
                    kind, _, wl = pattern.partition("-")
                    jobs = alltoall_jobs(backend, seed, wl, msr) if kind == "alltoall" else incast_jobs(backend, seed, msr)
                    for proto in CONTENTION_PROTOCOLS:
                        params = {"pattern": pattern, "msr": msr}
                        add("contention", params, seed, TrialPlan(params, seed, proto, jobs))
    for section in ("background", "background-same-queue"):
        if section not in want:
            continue
        for msr in MSRS:
            for seed in seeds:
                job = scale.job("fbkv", seed)
                tlr = BACKGROUND_TLR if section == "background" else (queue_for_tlr(1 - msr) + 0.5) / 8
                dur = 4.0 * job.total_bytes * 8 / scale.rate_bps + scale.slack_s
                bg = (Background(2, 1, BACKGROUND_LOAD * scale.rate_bps, 0.0, dur, tlr=tlr),)
                for proto in ("atp", "tcp-es"):
                    params = {"msr": msr, "load": BACKGROUND_LOAD}
                    add(section, params, seed, TrialPlan(params, seed, proto,
                                                         (JobPlan(1, 0, 1, job, msr, start_s=scale.lead_s),), bg,
                                                         stop_with_jobs=True))
    if "coexist" in want:
        for seed in seeds:
            for proto in ("atp", "tcp-es"):
                add("coexist", {"msr": COEXIST_MSR, "flow_load": COEXIST_FLOW_LOAD}, seed,
                    coexist_plan(backend, seed, proto, COEXIST_MSR, COEXIST_FLOW_LOAD,
                                 window_ms=COEXIST_DURATION_S * 1e3), coexist_metrics)
    if "idle" in want:
        for r in IDLE_RATES_MBIT:
            n = round(IDLE_MESSAGES_AT_20M * r / 20.0)
            job = JobWorkload(kind="fixed", seed=0, sizes=(IDLE_SIZE,) * n, ready_s=(0.0,) * n)
            for msr in MSRS:
                for seed in seeds:
                    params = {"rate_mbit": r, "msr": msr}
                    add("idle", params, seed, TrialPlan(params, seed, "atp", (JobPlan(1, 0, 1, job, msr),)),
                        rate_mbit=r)
    if "yield" in want:
        job = JobWorkload(kind="fixed", seed=0, sizes=(IDLE_SIZE,) * IDLE_MESSAGES_AT_20M,
                          ready_s=(0.0,) * IDLE_MESSAGES_AT_20M)
        for msr in YIELD_MSRS:
            for seed in seeds:
                flows = tuple(web_search_flows(seed, load=YIELD_FLOW_LOAD, link_bps=scale.rate_bps, duration_s=3.0,
                                               senders=[2], receivers=[1], size_scale=scale.flow_size_scale))
                for proto in ("atp", "tcp-es"):
                    params = {"msr": msr, "flow_load": YIELD_FLOW_LOAD}
                    add("yield", params, seed, TrialPlan(params, seed, proto,
                                                         (JobPlan(1, 0, 1, job, msr, start_s=YIELD_START_S),),
                                                         flows=flows), kind="netapprox")
    if "queues" in want:
        for seed in seeds:
            for kind in ("netapprox", "fifo"):
                add("queues", {"switch": kind, "msr": COEXIST_MSR, "flow_load": COEXIST_FLOW_LOAD}, seed,
                    coexist_plan(backend, seed, "atp", COEXIST_MSR, COEXIST_FLOW_LOAD,
                                 window_ms=COEXIST_DURATION_S * 1e3), coexist_metrics, kind=kind)
    if "leafspine" in want:
        fabric = EmulatedBackend(leafspine_scale(scale))
        for msr in LEAFSPINE_MSRS:
            for seed in seeds:
                jobs = alltoall_jobs(fabric, seed, "fbkv", msr)
                for proto in LEAFSPINE_PROTOCOLS:
                    for run in range(1, LEAFSPINE_RUNS[proto] + 1):
                        params = {"pattern": "alltoall-fbkv", "msr": msr, "run": run}
                        add("leafspine", params, seed, TrialPlan(params, seed, proto, jobs), topology="leafspine")
    return out


def run(plan: Sequence[Trial], scale: Scale, workdir: Path, progress: Progress) -> list[dict]:
    """Run ``plan``: one testbed per (kind, rate, topology) in order of first use, every trial of it, one row
    each (the emulated back end keeps a testbed while its trials need the same one)."""
    groups: dict[tuple[str, float, str], list[Trial]] = {}
    for t in plan:
        groups.setdefault((t.kind, t.rate_mbit, t.topology), []).append(t)
    rows: list[dict] = []
    for (kind, rate, topology), ts in groups.items():
        progress.note(f"testbed: {kind} switch, {rate:g} Mbit/s, {topology}, {len(ts)} trials")
        sc = dataclasses.replace(scale, rate_mbit=rate)
        if topology == "leafspine":
            sc = leafspine_scale(sc)
        with EmulatedBackend(sc) as backend:
            for t in sorted(ts, key=lambda t: not sprays(t.protocol)):  # stable: a testbed per spray setting
                t0 = time.monotonic()
                try:
                    where = f"{kind}-{rate:g}" if topology == "rack" else f"{kind}-{rate:g}-{topology}"
                    metrics = t.metrics(backend.run_trial(t.plan, workdir / where))
                    error = None
                except Exception as exc:  # one broken trial is a row with its error, not a lost run
                    metrics, error = {}, f"{type(exc).__name__}: {exc}"
                row = {"section": t.section, **t.params, "protocol": t.protocol, "switch": kind, "seed": t.seed,
                       "wall_s": round(time.monotonic() - t0, 3), **metrics}
                if error:
                    row["error"] = error
                rows.append(row)
                progress.step(t.label, _describe(row))
    return rows


def _describe(row: dict) -> str:
    if row.get("error"):
        return "ERROR " + row["error"]
    parts = []
    if row.get("jct_mean_s") is not None:
        parts.append(f"JCT mean {row['jct_mean_s']:.3f} s")
    met = row.get("msr_met")
    if isinstance(met, list) and met:
        parts.append(f"MSR met {sum(met)}/{len(met)}")
    if row.get("fct_all_mean") is not None:
        parts.append(f"flow FCT mean {row['fct_all_mean'] * 1e3:.1f} ms p99 {row['fct_all_p99'] * 1e3:.1f} ms")
    if row.get("late_start_s"):
        parts.append(f"(a program reached the start line {row['late_start_s']:.2f} s late)")
    return ", ".join(parts) or "no result"
