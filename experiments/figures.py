"""The figures: one definition each, run on either back end. docs/experiments.md and docs/simulation.md map
every figure to the paper figure it reproduces, with its parameters.

    sweep = Sweep(EmulatedBackend(Scale()))                  # or Sweep(SimBackend(SimScale(TopologyConfig(k=8))), workers=2)
    EXPERIMENTS["alltoall"](seeds=[1, 2, 3], out=Path("results"), sweep=sweep)   # results/alltoall/result.json

A figure lists its trials as plans (experiments/plans.py), runs them through the sweep (experiments/sweep.py)
and plots the result file's summary. What it takes from the back end is the ``Backend`` protocol of
experiments/backend.py (``TestbedBackend`` for ddnn and boundedloss, whose trials are not plans). The keyword arguments of an ``exp_*`` function are its sweep
(``--set NAME=V1,V2``); their defaults are the emulated testbed's, and ``Figure.defaults`` holds, per back
end, those that differ (a data center's baselines and times).

Where the paper compares ATP with TCP, the runs also hold per-seed ratios (protocol ``atp/<baseline>``, metric
``jct_ratio``: ATP's mean JCT over the baseline's, same seed, same jobs).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from netapprox.controller.model import ClassRule, queue_for_tlr
from netapprox.experiments import ddnn, hindsight
from netapprox.experiments import results as R
from netapprox.experiments.metrics import flow_fct_stats, job_summary
from netapprox.experiments.plans import Background, JobPlan, TrialPlan, is_atp
from netapprox.experiments.sweep import Sweep, as_sweep
from netapprox.experiments.workloads import (JobWorkload, bursty_arrivals, make_job, pick_receivers, poisson_arrivals,
                                             rng_for, web_search_flows)
from netapprox.hostlib import wire


def result_file(name: str, out: Path, seeds: Sequence[int], backend: Any, config: Mapping[str, Any],
                protocols: Sequence[str] = ()) -> R.ResultFile:
    """A figure's result file, with the back end's description in its config."""
    experiment, out_dir = backend.result_dir(out, name)
    return R.ResultFile(experiment, {**backend.describe(protocols), **config}, seeds, out_dir)


def add_ratios(rf: R.ResultFile, keys: Sequence[str], pairs: Sequence[tuple[str, str]],
               metric: str = "jct_mean_s") -> None:
    """Per seed: ATP's ``metric`` over the baseline's at the same other params (protocol ``atp/<baseline>``)."""
    index = {}
    for run in rf.runs:
        p = run["params"]
        index[(run["seed"], p.get("protocol"), tuple(p.get(k) for k in keys))] = run["metrics"]
    for (seed, proto, rest), m in list(index.items()):
        for a, b in pairs:
            if proto != a:
                continue
            other = index.get((seed, b, rest))
            if other is None or m.get(metric) is None or not other.get(metric):
                continue
            params = {**dict(zip(keys, rest)), "protocol": f"{a}/{b}"}
            rf.add(seed, params, {"jct_ratio" if metric == "jct_mean_s" else f"{metric}_ratio":
                                  m[metric] / other[metric]}, progress=False)


def plot_rows(summary: Sequence[dict], backend: Any) -> list[dict]:
    """Summary rows of the protocols themselves (not the per-seed ratio rows), for plots; times in the back
    end's unit."""
    scale = backend.time_unit[1]
    out = []
    for r in summary:
        if "/" in str(r["params"].get("protocol", "")):
            continue
        if scale != 1.0 and (r["metric"].endswith("_s") or r["metric"].startswith("fct_")):
            r = {**r, **{k: r[k] * scale for k in ("mean", "median", "min", "max", "std") if r.get(k) is not None}}
        out.append(r)
    return out


def _tlr_mid(q: int) -> float:
    """A TLR in the middle of queue ``q``'s range."""
    return (q + 0.5) / 8


def job_against_background(backend: Any, seed: int, msr: float, job_scale: int, bg_load: float, *, span: float,
                           queues: Sequence[int]) -> tuple[JobPlan, tuple[Background, ...]]:
    """One FBKV job (``job_scale`` x N) from the back end's far sender to its receiver, ``lead_s`` after paced
    background at ``bg_load`` of the link starts from the other sender: ``span`` x the job's line time plus
    ``slack_s`` of it, split evenly over ``queues`` (a TLR in the middle of each queue, in turn)."""
    scale = backend.scale
    src, bg_src, dst = backend.far_hosts()
    wl = scale.job("fbkv", seed, job_scale)
    seg = (span * wl.total_bytes * 8 / scale.rate_bps + scale.slack_s) / len(queues)
    bg = tuple(Background(bg_src, dst, bg_load * scale.rate_bps, i * seg, seg, tlr=_tlr_mid(q))
               for i, q in enumerate(queues))
    return JobPlan(1, src, dst, wl, msr, start_s=scale.lead_s), bg


def _baseline_pairs(backend: Any, protocols: Sequence[str]) -> list[tuple[str, str]]:
    return [("atp", b) for b in backend.baselines if "atp" in protocols and b in protocols]


# --------------------------------------------------------------------------------------------------
# Fig. 5-8: all-to-all JCT vs MSR and queue length


def alltoall_jobs(backend: Any, seed: int, workload: str, msr: float) -> tuple[JobPlan, ...]:
    """Every host (or ``senders`` of them) sends one bulk job to a random other host, all at once (the same
    jobs for every protocol of a seed)."""
    scale, hosts = backend.scale, backend.hosts
    senders = scale.senders_of(seed, hosts)
    dst_of = pick_receivers(seed, senders, hosts)
    return tuple(JobPlan(1 + h, h, dst_of[h], scale.job(workload, scale.job_seed(seed, h)), msr) for h in senders)


def incast_jobs(backend: Any, seed: int, msr: float) -> tuple[JobPlan, ...]:
    """Every other host (or ``senders`` of them) sends one FBKV job to host 0, all at once."""
    scale = backend.scale
    return tuple(JobPlan(1 + h, h, 0, scale.job("fbkv", scale.job_seed(seed, h)), msr)
                 for h in scale.senders_of(seed, backend.hosts, exclude=(0,)))


def exp_alltoall(seeds: Sequence[int], out: Path, sweep: Sweep, *, msrs=(0.5, 0.7, 0.9), workloads=("fbkv", "fbhd"),
                 protocols=("atp", "tcp-es", "tcp-ss", "udp")) -> R.ResultFile:
    """Every host (or ``senders`` of them) sends one bulk job to a random other host, all at once."""
    sweep = as_sweep(sweep)
    backend = sweep.backend
    plans = []
    for seed in seeds:
        for wl in workloads:
            for msr in msrs:
                jobs = alltoall_jobs(backend, seed, wl, msr)
                for proto in protocols:
                    plans.append(TrialPlan({"workload": wl, "msr": msr, "protocol": proto}, seed, proto, jobs,
                                           sample_queues=True))
    rf = result_file("alltoall", out, seeds, backend, {
        "msrs": list(msrs), "workloads": list(workloads), "protocols": list(protocols),
        "pattern": f"{len(plans[-1].jobs) if plans else 0} of {len(backend.hosts)} hosts each send one bulk job to a "
                   "random other host, all at once"}, protocols)
    sweep.run(rf, plans)
    add_ratios(rf, ("workload", "msr"), _baseline_pairs(backend, protocols))
    rf.write()
    s = plot_rows(rf.to_dict()["summary"], backend)
    unit = backend.time_unit[0]
    for wl in workloads:
        fig = 5 if wl == "fbkv" else 6
        R.plot_lines(s, metric="jct_mean_s", x="msr", series="protocol", fixed={"workload": wl},
                     path=rf.out_dir / f"jct_{wl}.png", title=f"All-to-all JCT, {wl.upper()}{backend.where} (cf. Fig. {fig})",
                     xlabel="MSR", ylabel=f"mean JCT ({unit})")
        R.plot_bars(s, metric="queue_mean_pkts", group="msr", series="protocol", fixed={"workload": wl},
                    path=rf.out_dir / f"queue_{wl}.png",
                    title=f"Receiver-port queue, {wl.upper()}{backend.where} (cf. Fig. {fig + 2})",
                    ylabel="mean backlog (packets)")
    return rf


# --------------------------------------------------------------------------------------------------
# Fig. 9: incast


def exp_incast(seeds: Sequence[int], out: Path, sweep: Sweep, *, msrs=(0.5, 0.7, 0.9),
               protocols=("atp", "tcp-es", "tcp-ss")) -> R.ResultFile:
    """Every other host (or ``senders`` of them) sends one FBKV job to host 0, all at once."""
    sweep = as_sweep(sweep)
    backend = sweep.backend
    plans = []
    for seed in seeds:
        for msr in msrs:
            jobs = incast_jobs(backend, seed, msr)
            for proto in protocols:
                plans.append(TrialPlan({"msr": msr, "protocol": proto}, seed, proto, jobs, sample_queues=True))
    rf = result_file("incast", out, seeds, backend, {
        "msrs": list(msrs), "protocols": list(protocols), "workload": "fbkv",
        "pattern": f"{len(plans[-1].jobs) if plans else 0} hosts each send one FBKV job to host 0, all at once"},
        protocols)
    sweep.run(rf, plans)
    add_ratios(rf, ("msr",), _baseline_pairs(backend, protocols), metric="jct_max_s")
    rf.write()
    R.plot_lines(plot_rows(rf.to_dict()["summary"], backend), metric="jct_max_s", x="msr", series="protocol",
                 path=rf.out_dir / "jct.png", title=f"Incast JCT, FBKV{backend.where} (cf. Fig. 9)", xlabel="MSR",
                 ylabel=f"JCT of the last job ({backend.time_unit[0]})")
    return rf


# --------------------------------------------------------------------------------------------------
# Fig. 10-12: dynamic TLR and priority, ATP techniques


def exp_dynamic(seeds: Sequence[int], out: Path, sweep: Sweep, *, msrs=(0.5, 0.75, 0.9),
                protocols=("tcp-es", "atp-fixtlr", "atp-fixprio", "atp-full"), bg_load: float = 0.7,
                job_scale: int = 4) -> R.ResultFile:
    """Fig. 11: one FBKV job (``job_scale`` x N) against paced background that starts in the job's initial
    queue and moves one queue up halfway. Fig. 10 (timeline, first seed, ``atp-full`` or the first ATP
    protocol): MSR 0.5, background in queue 4, then 3, then 2."""
    sweep = as_sweep(sweep)
    backend = sweep.backend
    src, bg_src, dst = backend.far_hosts()
    plans = []
    for seed in seeds:
        for msr in msrs:
            q0 = queue_for_tlr(1 - msr)
            job, bg = job_against_background(backend, seed, msr, job_scale, bg_load, span=2.0, queues=(q0, max(1, q0 - 1)))
            plans += [TrialPlan({"msr": msr, "protocol": proto}, seed, proto, (job,), bg) for proto in protocols]
    atps = [p for p in protocols if is_atp(p)]
    timeline_proto = "atp-full" if "atp-full" in protocols else (atps[0] if atps else None)
    tl_bg: tuple[Background, ...] = ()
    if timeline_proto is not None:
        # the job takes about MSR x its bytes over what the background leaves; the background lasts 1.5 x that
        job, tl_bg = job_against_background(backend, seeds[0], 0.5, job_scale * 2, bg_load,
                                            span=1.5 * 0.5 / (1 - bg_load), queues=(4, 3, 2))
        plans.append(TrialPlan({"msr": 0.5, "protocol": timeline_proto, "run": "timeline"}, seeds[0], timeline_proto,
                               (job,), tl_bg, timeline_job=job.job_id))
    rf = result_file("dynamic", out, seeds, backend, {
        "msrs": list(msrs), "protocols": list(protocols), "bg_load": bg_load, "workload": f"fbkv x {job_scale}",
        "hosts": {"job": [src, dst], "background": [bg_src, dst]},
        "background": "paced UDP to the receiver's second address, APPROX with a TLR in the job's initial queue, "
                      "moved one queue up halfway (the TCP baseline: the same packets in the oblivious switch's "
                      "one queue)"}, protocols)

    def metrics(plan: TrialPlan, trial: dict) -> dict | None:
        if plan.params.get("run") != "timeline":
            return job_summary(trial)
        job = next(j for j in trial["jobs"] if j["job_id"] == plan.timeline_job)
        start = trial["timeline_start"]
        rows = timeline_rows(trial.get("timeline", []), trial["queue_changes"], plan.timeline_job, start,
                             rate_unit=backend.rate_unit)
        shifts = [t - start for t in trial["background_starts"][1:] if t is not None]
        rf.notes.append({"timeline_job": plan.timeline_job, "protocol": plan.protocol,
                         "timeline": trial.get("timeline", []), "rows": rows,
                         "queue_changes": trial["queue_changes"], "job_start": start,
                         "background_starts": trial["background_starts"], "background_tlrs": [b.tlr for b in tl_bg],
                         "job": job})
        rate_field = {"mbps": "rate_mbps", "gbps": "rate_gbps"}[backend.rate_unit]
        R.plot_timeline(rows, fields=[f for f in ("loss_avg10", "tlr", rate_field, "queue") if any(f in r for r in rows)],
                        path=rf.out_dir / "timeline.png",
                        title=f"{plan.protocol}, MSR 0.5, background q4 -> q3 -> q2 (cf. Fig. 10)",
                        events=[(t, "bg shift") for t in shifts])
        return None

    sweep.run(rf, plans, metrics=metrics)
    add_ratios(rf, ("msr",), [(p, backend.baselines[0]) for p in atps if backend.baselines[0] in protocols])
    rf.write()
    R.plot_bars(plot_rows(rf.to_dict()["summary"], backend), metric="jct_mean_s", group="msr", series="protocol",
                path=rf.out_dir / "jct.png", title=f"Dynamic mechanisms, FBKV with shifting background{backend.where} "
                                                   "(cf. Fig. 11)", ylabel=f"JCT ({backend.time_unit[0]})")
    return rf


def timeline_rows(timeline: Sequence[dict], changes: Sequence[dict], jid: int, t0: float, *,
                  rate_unit: str = "mbps") -> list[dict]:
    """Sender epochs (hostlib EpochEnded: ``time`` is seconds since the job started) as plot rows: loss, its
    moving average over 10 epochs (per-epoch loss is a ratio of a few packets), TLR, rate, and the queue most
    ACKs of the epoch echoed (the switch's stamp); when no ACK carried a stamp, the queue of the controller's
    decisions (``changes``: ``{"wall": t, "assignments": {job: queue}}``, ``t`` on the clock of ``t0``, the
    job's start)."""
    per_bit = {"mbps": 1e-6, "gbps": 1e-9}[rate_unit]
    rows = []
    for r in timeline:
        t = r.get("time")
        if t is None:
            continue
        row = {"time": float(t)}
        for src, dst in (("loss", "loss"), ("measured_loss", "loss"), ("tlr", "tlr"), ("queue", "queue")):
            if src in r and r[src] is not None:
                row[dst] = r[src]
        for key in ("rate_bps", "rate"):
            if key in r and r[key] is not None:
                row[f"rate_{rate_unit}"] = float(r[key]) * per_bit
        seen = {int(q): c for q, c in (r.get("queues") or {}).items() if int(q) != wire.QUEUE_UNSET}
        if seen:
            row["queue"] = max(seen, key=lambda q: (seen[q], -q))
        rows.append(row)
    window: list[float] = []
    for row in rows:
        if "loss" in row:
            window = (window + [float(row["loss"])])[-10:]
            row["loss_avg10"] = sum(window) / len(window)
    if rows and not any("queue" in r for r in rows):
        q_changes = sorted((c["wall"] - t0, c["assignments"].get(str(jid))) for c in changes
                           if str(jid) in c["assignments"])
        for row in rows:
            q = None
            for t, qq in q_changes:
                if t <= row["time"]:
                    q = qq
            if q is not None:
                row["queue"] = q
    return rows


def exp_ablation(seeds: Sequence[int], out: Path, sweep: Sweep, *, msrs=(0.5, 0.7, 0.9),
                 variants=("atp-base", "atp-rc", "atp-mrdf", "atp-fixprio", "atp-full"), bg_load: float = 0.5,
                 job_scale: int = 2) -> R.ResultFile:
    """Fig. 12: one FBKV job (``job_scale`` x N) against paced background in its initial queue, by each step of
    ATP's techniques."""
    sweep = as_sweep(sweep)
    backend = sweep.backend
    plans = []
    for seed in seeds:
        for msr in msrs:
            job, bg = job_against_background(backend, seed, msr, job_scale, bg_load, span=3.0,
                                             queues=(queue_for_tlr(1 - msr),))
            plans += [TrialPlan({"msr": msr, "protocol": v}, seed, v, (job,), bg) for v in variants]
    rf = result_file("ablation", out, seeds, backend, {
        "msrs": list(msrs), "variants": list(variants), "bg_load": bg_load, "workload": f"fbkv x {job_scale}",
        "variants_meaning": {"atp-base": "UDP at R_max, then repairs until MSR",
                             "atp-rc": "+ rate control (paper eq. 2/3), static TLR = 1 - MSR",
                             "atp-mrdf": "+ MRDF scheduling",
                             "atp-fixprio": "dynamic TLR, job pinned to its initial queue",
                             "atp-full": "dynamic TLR and dynamic queue (controller)",
                             "atp": "hostlib's default sender (adaptive) with the controller"},
        "background": "paced UDP to the receiver's second address, APPROX, TLR in the job's initial queue"}, variants)
    sweep.run(rf, plans)
    R.plot_bars(plot_rows(rf.to_dict()["summary"], backend), metric="jct_mean_s", group="msr", series="protocol",
                path=rf.out_dir / "jct.png", title=f"ATP techniques, FBKV with background{backend.where} (cf. Fig. 12)",
                ylabel=f"JCT ({backend.time_unit[0]})")
    return rf


# --------------------------------------------------------------------------------------------------
# Fig. 13: co-running non-approximate traffic


def coexist_plan(backend: Any, seed: int, protocol: str, msr: float, flow_load: float, *, window_ms: float,
                 job_scale: int = 5, switch: str | None = None) -> TrialPlan:
    """The ``rack`` pattern of Fig. 13: two FBHD approximate jobs (hosts 0 and 2, ``job_scale`` x N messages each)
    and web-search flows from host 3 for ``window_ms``, all into host 1; the jobs start just after the flows."""
    scale = backend.scale
    rate = scale.rate_bps
    window = window_ms * 1e-3
    flows = tuple(web_search_flows(seed, load=flow_load, link_bps=rate, duration_s=window, senders=[3], receivers=[1],
                                   size_scale=scale.flow_size_scale))
    jobs = tuple(JobPlan(i + 1, h, 1, scale.job("fbhd", scale.job_seed(seed, h), job_scale), msr,
                         start_s=scale.lead_s / 2) for i, h in enumerate((0, 2)))
    return TrialPlan({"msr": msr, "flow_load": flow_load, "protocol": protocol}, seed, protocol, jobs, flows=flows,
                     switch=switch)


def _poisson_jobs(scale: Any, seed: int, hosts: Sequence[int], load: float, window: float) -> list[JobPlan]:
    """FBKV jobs from every host to random others, Poisson, ``load`` of each host's link, for ``window``."""
    rng = rng_for(seed * 104729 + 3)
    mean_bytes = float(np.mean(make_job("fbkv", seed, 4000).sizes)) * scale.fbkv_n
    per_host_rate = load * scale.rate_bps / 8 / mean_bytes
    jobs, jid = [], 1
    for h in hosts:
        for t in poisson_arrivals(rng, per_host_rate, window):
            dst = int(rng.choice([x for x in hosts if x != h]))
            jobs.append(JobPlan(jid, h, dst, scale.job("fbkv", seed * 100000 + jid), 0.5, start_s=float(t)))
            jid += 1
    return jobs


COEXIST_PATTERNS = ("rack", "fabric")


def exp_coexist(seeds: Sequence[int], out: Path, sweep: Sweep, *, msrs=(0.5, 0.9), loads=(0.1, 0.3, 0.5),
                protocols=("atp", "tcp-es"), pattern: str = "rack", window_ms: float = 4000.0, job_scale: int = 5,
                approx_load: float = 0.2) -> R.ResultFile:
    """Non-approximate web-search flows next to approximate jobs run by ATP (NetApprox switches) or the TCP
    baseline (oblivious switches): the flows' FCT and the jobs' JCT. ``pattern``: ``rack``, two FBHD jobs
    (``job_scale`` x N) and flows from a third host into one host (``coexist_plan``); ``fabric``, every host
    starts FBKV jobs (Poisson, ``approx_load`` of its link) and flows (Poisson, ``load`` of its link) to random
    hosts. Flows arrive for ``window_ms``."""
    if pattern not in COEXIST_PATTERNS:
        raise ValueError(f"pattern {pattern!r}: choose one of {', '.join(COEXIST_PATTERNS)}")
    sweep = as_sweep(sweep)
    backend, scale, hosts = sweep.backend, sweep.backend.scale, sweep.backend.hosts
    window = window_ms * 1e-3
    plans = []
    for seed in seeds:
        poisson = _poisson_jobs(scale, seed, hosts, approx_load, window) if pattern == "fabric" else []
        for msr in msrs:
            ms_jobs = tuple(dataclasses.replace(j, msr=msr) for j in poisson)
            for load in loads:
                # ``load`` of every host's link: the generator's rate is for one link, so offer n links' worth
                flows = tuple(web_search_flows(seed * 31 + int(load * 100), load=load, link_bps=scale.rate_bps * len(hosts),
                                               duration_s=window, senders=hosts, receivers=hosts,
                                               size_scale=scale.flow_size_scale)) if pattern == "fabric" else ()
                for proto in protocols:
                    plans.append(coexist_plan(backend, seed, proto, msr, load, window_ms=window_ms, job_scale=job_scale)
                                 if pattern == "rack" else
                                 TrialPlan({"msr": msr, "flow_load": load, "protocol": proto}, seed, proto, ms_jobs,
                                           flows=flows))
    rf = result_file("coexist", out, seeds, backend, {
        "msrs": list(msrs), "flow_loads": list(loads), "protocols": list(protocols), "window_ms": window_ms,
        "pattern": (f"2 FBHD approximate jobs (hosts 0, 2; {job_scale} x fbhd_n messages each) + {window_ms:g} ms of "
                    "web-search TCP flows (host 3), all into host 1") if pattern == "rack" else
                   (f"every host: FBKV approximate jobs (Poisson, {approx_load:g} of its link) and web-search TCP flows "
                    f"(Poisson, flow_load of its link) to random hosts for {window_ms:g} ms")}, protocols)

    def metrics(plan: TrialPlan, trial: dict) -> dict:
        return {**job_summary(trial), **flow_fct_stats(trial.get("flows", []))}

    sweep.run(rf, plans, metrics=metrics)
    pairs = _baseline_pairs(backend, protocols)[:1]
    add_ratios(rf, ("msr", "flow_load"), pairs, metric="fct_all_mean")
    add_ratios(rf, ("msr", "flow_load"), pairs, metric="fct_small_mean")
    rf.write()
    s = plot_rows(rf.to_dict()["summary"], backend)
    for msr in msrs:
        R.plot_lines(s, metric="fct_all_mean", x="flow_load", series="protocol", fixed={"msr": msr},
                     path=rf.out_dir / f"fct_msr{msr}.png",
                     title=f"Non-approx. FCT next to approx. jobs, MSR {msr}{backend.where} (cf. Fig. 13)",
                     xlabel="non-approximate load (fraction of link)", ylabel=f"mean FCT ({backend.time_unit[0]})")
    return rf


# --------------------------------------------------------------------------------------------------
# Fig. 14: job-level fairness


def exp_fairness(seeds: Sequence[int], out: Path, sweep: Sweep, *,
                 schemes=("alone", "atp-full", "atp-fixprio", "atp-fixtlr"), fbkv_delay_us: float = 500_000.0
                 ) -> R.ResultFile:
    """FBHD MSR 0.5 and FBHD MSR 0.75 (2 x N each), then FBKV MSR 0.875 ``fbkv_delay_us`` later, all into one
    host, under each scheme: a protocol (with the default policy), ``<protocol>+adaptive`` (the controller in
    policy mode ``adaptive``), ``alone`` (the FBKV job by itself, ``atp-full``) or ``alone-<protocol>``."""
    sweep = as_sweep(sweep)
    backend, scale = sweep.backend, sweep.backend.scale
    n = len(backend.hosts)
    a, b, c, d = 0, n // 4, n // 2, 3 * n // 4
    plans = []
    for seed in seeds:
        kv = JobPlan(3, c, d, scale.job("fbkv", seed), 0.875, start_s=fbkv_delay_us * 1e-6)
        hd = (JobPlan(1, a, d, scale.job("fbhd", seed * 10 + 1, 2), 0.5),
              JobPlan(2, b, d, scale.job("fbhd", seed * 10 + 2, 2), 0.75))
        for scheme in schemes:
            proto, alone, policy = fairness_scheme(scheme)
            plans.append(TrialPlan({"scheme": scheme}, seed, proto, (kv,) if alone else hd + (kv,), policy=policy))
    rf = result_file("fairness", out, seeds, backend, {
        "schemes": list(schemes), "hosts": {"fbhd_0.5": a, "fbhd_0.75": b, "fbkv_0.875": c, "receiver": d},
        "jobs": f"FBHD MSR 0.5 and FBHD MSR 0.75 (2 x fbhd_n messages each), then FBKV MSR 0.875 "
                f"({fbkv_delay_us:g} µs later), all into one host"},
        sorted({fairness_scheme(sc)[0] for sc in schemes}))

    def metrics(plan: TrialPlan, trial: dict) -> dict:
        kvm = next(j for j in trial["jobs"] if j["job_id"] == 3)
        hd_jcts = {j["job_id"]: j["jct_s"] for j in trial["jobs"] if j["job_id"] in (1, 2)}
        return {"fbkv_jct_s": kvm["jct_s"], "fbkv_msr_met": kvm["msr_met"],
                **{f"fbhd{jid}_jct_s": hd_jcts[jid] for jid in (1, 2) if jid in hd_jcts}, **job_summary(trial)}

    sweep.run(rf, plans, metrics=metrics)
    R.plot_bars(plot_rows(rf.to_dict()["summary"], backend), metric="fbkv_jct_s", group="scheme", series="scheme",
                path=rf.out_dir / "fbkv_jct.png", title=f"FBKV JCT next to two FBHD jobs{backend.where} (cf. Fig. 14)",
                ylabel=f"FBKV JCT ({backend.time_unit[0]})")
    return rf


def fairness_scheme(scheme: str) -> tuple[str, bool, tuple[tuple[str, Any], ...]]:
    """(protocol, FBKV alone?, policy) of a scheme of ``exp_fairness``."""
    if scheme == "alone":
        return "atp-full", True, ()
    if scheme.startswith("alone-"):
        return scheme[len("alone-"):], True, ()
    proto, plus, setting = scheme.partition("+")
    if plus:
        if setting not in SHIFT_SETTINGS:
            raise ValueError(f"fairness scheme {scheme!r}: no policy setting {setting!r} "
                             f"(one of {', '.join(SHIFT_SETTINGS)})")
        return proto, False, SHIFT_SETTINGS[setting]
    return scheme, False, ()


# --------------------------------------------------------------------------------------------------
# A workload that changes (issue #27): does the tuned policy beat the best fixed thresholds in hindsight?


SHIFT_PHASES: tuple[tuple[str, float, float], ...] = (
    ("fbkv_heavy", 0.8, 0.0), ("fbhd_heavy", 0.2, 0.0), ("mix_web", 0.5, 0.3))
"""(name, share of FBKV jobs, web-search flow load) of each phase, in this order."""
FIXED_THRESHOLDS: dict[str, tuple[float, ...]] = {
    "k8": tuple(k / 8 for k in range(8)),
    "k16": tuple(k / 16 for k in range(8)),
    "low-fine": (0.0, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5),
    "msr-classes": (0.0, 0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 0.95),
    "high-fine": (0.0, 0.3, 0.45, 0.6, 0.7, 0.8, 0.875, 0.95),
    "k10": tuple(k / 10 for k in range(8)),
}
"""The fixed TLR threshold sets the tuned policy is held against (policy mode ``netapprox``: the paper's
placement by TLR, k-MTU buffers): the paper's k/8; twice as fine below 1/2 (k/16); fine at the low end, where
MSR 0.9 jobs start (TLR 0.1) and where eq. 1 takes losing jobs; cut between the MSR classes this workload draws
(initial TLRs 0.1, 0.3, 0.5); fine at the high end, where eq. 1 takes jobs that deliver without loss; and k/10
(the top queue from 0.7)."""
FINISH_HORIZONS: dict[str, tuple[float, ...]] = {"high-fine": (1, 4, 16, 64, 256)}
"""Finishing horizons (``finish_epochs``) every shifting-workload run holds as fixed configurations, on the
default's threshold set (``finish<e>-high-fine``): the knob ``[policy.tuning] finish_ref`` moves online."""
SHIFT_SETTINGS: dict[str, tuple[tuple[str, Any], ...]] = {
    "default": (),
    "adaptive": (("mode", "adaptive"),),
    **{f"fixed-{name}": (("mode", "netapprox"), ("thresholds", t), ("finish_epochs", 0.0))
       for name, t in FIXED_THRESHOLDS.items()},
    **{f"finish-{name}": (("mode", "netapprox"), ("thresholds", t)) for name, t in FIXED_THRESHOLDS.items()},
    "adaptive-remaining-work": (("mode", "adaptive"), ("tuning", (("remaining_weight", 0.125),))),
    "adaptive-no-buffers": (("mode", "adaptive"), ("tuning", (("buffers", False),))),
    "k8-remaining-work": (("mode", "adaptive"), ("tuning", (("remaining_weight", 0.125), ("hysteresis", 0.999),
                                                            ("buffers", False)))),
    "k8-srpt": (("mode", "adaptive"), ("tuning", (("remaining_weight", 0.25), ("demote_weight", 0.25),
                                                  ("remaining_deadband", 0.0), ("hysteresis", 0.999),
                                                  ("buffers", False)))),
    "k8-srpt-only": (("mode", "adaptive"), ("finish_epochs", 0.0),
                     ("tuning", (("remaining_weight", 0.25), ("demote_weight", 0.25), ("remaining_deadband", 0.0),
                                 ("hysteresis", 0.999), ("buffers", False)))),
    **{f"srpt-{w:g}": (("mode", "adaptive"),
                       ("tuning", (("remaining_weight", w), ("demote_weight", w), ("remaining_deadband", 0.0),
                                   ("hysteresis", 0.999), ("buffers", False)))) for w in (0.5, 1.0)},
    **{f"finish{e:g}-{name}": (("mode", "netapprox"), ("thresholds", FIXED_THRESHOLDS[name]),
                               ("finish_epochs", float(e))) for name, es in FINISH_HORIZONS.items() for e in es},
    **{f"finish{e:g}-ref-{r:g}": (("mode", "adaptive"), ("finish_epochs", float(e)),
                                  ("tuning", (("finish_ref", r), ("hysteresis", 0.999), ("buffers", False))))
       for e in (4, 16) for r in (0.0, 0.5, 1.0, 2.0)},
    **{f"finish{e:g}-high-fine": (("mode", "netapprox"), ("thresholds", FIXED_THRESHOLDS["high-fine"]),
                                  ("finish_epochs", float(e))) for e in (2, 8, 32)},
}
"""Policy of each setting of ``exp_shift`` (``TrialPlan.policy``): the default policy (mode ``netapprox``, the
default thresholds, ``finish-high-fine``'s, a job about to finish in the first approximate queue:
``PolicyConfig.finish_epochs``); the tuned
policy (mode ``adaptive``, its defaults); every fixed threshold set as the paper places jobs (by TLR alone,
``finish_epochs`` 0) and, ``finish-<set>``, with the default's finishing rule; and variants: the tuner with the
remaining-work placement (``remaining_weight`` 1/8), the tuner without buffers, the remaining-work placement on
the default thresholds (no retuning, no buffers; the ``k8-`` names date from when the default was k/8), and
SRPT-like placement both ways on them (``remaining_weight`` and ``demote_weight`` 1/4 per doubling against
the live jobs' median remaining work, with and without the finishing rule; ``srpt-<w>``: w per doubling, with
the rule); and two fixed finishing horizons (``finish<e>-high-fine``: the default with ``finish_epochs`` e)."""


SHIFT_ARRIVALS: tuple[str, ...] = ("poisson", "bursty")
"""How jobs arrive in ``exp_shift``: a Poisson process, or in bursts (``workloads.bursty_arrivals``: four per
phase, each a third of its period at three times the rate, the same mean load)."""


def shift_workload(backend: Any, seed: int, *, phase_s: float, load: float, receivers: int,
                   msrs: Sequence[float], arrivals: str = "poisson"
                   ) -> tuple[tuple[JobPlan, ...], tuple, dict[int, tuple[str, str]]]:
    """The jobs and flows of ``exp_shift`` (the same for every setting of a seed) and each job's (phase, kind). In
    every phase, jobs arrive at each of ``receivers`` hosts as a Poisson process (``arrivals`` ``bursty``: in
    bursts, ``SHIFT_ARRIVALS``) offering ``load`` of its link
    in the bytes they need (the smallest ceil(MSR x N) messages), from random other hosts, each FBKV with the
    phase's share (else FBHD), its MSR drawn from ``msrs``; the last phase adds web-search flows into the same
    hosts."""
    if arrivals not in SHIFT_ARRIVALS:
        raise ValueError(f"shift arrivals: one of {', '.join(SHIFT_ARRIVALS)}, got {arrivals!r}")
    arrive = poisson_arrivals if arrivals == "poisson" else bursty_arrivals
    scale, hosts = backend.scale, backend.hosts
    n = len(hosts)
    dsts = [hosts[(n // receivers) * i + (n // receivers) // 2] for i in range(receivers)] if receivers < n else hosts
    srcs = [h for h in hosts if h not in dsts] or hosts
    rng = rng_for(seed * 7727 + 5)

    def needed(kind: str, i: int) -> float:
        wl = scale.job(kind, 10 ** 6 + i)
        return float(sum(sorted(wl.sizes)[:math.ceil(msrs[i % len(msrs)] * wl.n)]))
    mean_need = {k: float(np.mean([needed(k, i) for i in range(60)])) for k in ("fbkv", "fbhd")}
    jobs, flows, phase_of, jid = [], [], {}, 1
    for p, (name, kv_share, flow_load) in enumerate(SHIFT_PHASES):
        t0 = p * phase_s
        rate = load * scale.rate_bps / 8 / (kv_share * mean_need["fbkv"] + (1 - kv_share) * mean_need["fbhd"])
        for dst in dsts:
            for t in arrive(rng, rate, phase_s):
                kind = "fbkv" if rng.random() < kv_share else "fbhd"
                src = int(rng.choice([h for h in srcs if h != dst]))
                msr = float(rng.choice(list(msrs)))
                jobs.append(JobPlan(jid, src, dst, scale.job(kind, seed * 100000 + jid), msr, start_s=t0 + float(t)))
                phase_of[jid] = (name, kind)
                jid += 1
        if flow_load > 0:
            fl = web_search_flows(seed * 31 + p, load=flow_load, link_bps=scale.rate_bps * len(dsts),
                                  duration_s=phase_s, senders=[h for h in srcs if h not in dsts] or srcs,
                                  receivers=dsts, size_scale=scale.flow_size_scale)
            flows += [dataclasses.replace(f, start_s=f.start_s + t0) for f in fl]
    return tuple(jobs), tuple(flows), phase_of


def _not_default(names: Sequence[str]) -> tuple[str, ...]:
    default = hindsight.resolved(SHIFT_SETTINGS["default"])
    return tuple(n for n in names if hindsight.resolved(SHIFT_SETTINGS[n]) != default)


SHIFT_RUN = ("default", "adaptive", *(f"fixed-{name}" for name in FIXED_THRESHOLDS),
             *_not_default([f"finish-{name}" for name in FIXED_THRESHOLDS]),
             *_not_default([f"finish{e:g}-{name}" for name, es in FINISH_HORIZONS.items() for e in es]))
"""The settings ``exp_shift`` runs unless told: the two policies, every fixed set without and with the
finishing rule, and every finishing horizon of ``FINISH_HORIZONS`` (what the default equals is run once, as
``default``): the whole baseline pool (``experiments.hindsight``)."""


def exp_shift(seeds: Sequence[int], out: Path, sweep: Sweep, *, settings=SHIFT_RUN, phase_s: float = 3.0,
              load: float = 0.3, receivers: int = 1, msrs=(0.5, 0.7, 0.9), arrivals: str = "poisson") -> R.ResultFile:
    """A workload whose mix shifts mid-run, FBKV-heavy -> FBHD-heavy -> a mix with web-search flows
    (``SHIFT_PHASES``, ``phase_s`` each), under the tuned policy and under every fixed threshold set
    (``SHIFT_SETTINGS``): mean JCT per phase (jobs by the phase they start in) and overall, and per seed the
    default and the tuned policy's over the best fixed configuration's in hindsight (the best of every fixed
    setting the run contains, that seed's best per phase and overall: settings ``default/best-fixed``,
    ``adaptive/best-fixed``); the notes hold the pool, the best on the mean, each policy's verdict and the
    selection oracle (``hindsight.selection_oracle``)
    (``best_fixed_ratios``, ``experiments.hindsight``)."""
    sweep = as_sweep(sweep)
    backend = sweep.backend
    plans, phases = [], {}
    for seed in seeds:
        jobs, flows, phase_of = shift_workload(backend, seed, phase_s=phase_s, load=load, receivers=receivers,
                                               msrs=msrs, arrivals=arrivals)
        phases[seed] = phase_of
        for name in settings:
            plans.append(TrialPlan({"setting": name}, seed, "atp", jobs, flows=flows, policy=SHIFT_SETTINGS[name]))
    rf = result_file("shift", out, seeds, backend, {
        "settings": {name: [list(kv) for kv in SHIFT_SETTINGS[name]] for name in settings},
        "phases": [{"name": n, "fbkv_share": kv, "flow_load": fl, "start": i * phase_s, "duration": phase_s}
                   for i, (n, kv, fl) in enumerate(SHIFT_PHASES)],
        "load": load, "receivers": receivers, "msrs": list(msrs), "arrivals": arrivals,
        "jobs": {str(seed): len(p) for seed, p in phases.items()},
        "pattern": f"jobs arrive at {receivers} receiver(s) ({arrivals}, {load:g} of the link in needed bytes), "
                   f"from random other hosts; the mix shifts every {phase_s:g} s"},
        ["atp"])

    def metrics(plan: TrialPlan, trial: dict) -> dict:
        out = job_summary(trial)
        phase_of = phases[plan.seed]
        done = [(phase_of[j["job_id"]], j["jct_s"]) for j in trial["jobs"] if j["jct_s"] is not None]
        for name, _, _ in SHIFT_PHASES:
            jcts = [t for (phase, _), t in done if phase == name]
            out[f"jct_{name}_s"] = float(np.mean(jcts)) if jcts else None
            out[f"jobs_{name}"] = len(jcts)
        for kind in ("fbkv", "fbhd"):
            jcts = [t for (_, k), t in done if k == kind]
            out[f"jct_{kind}_s"] = float(np.mean(jcts)) if jcts else None
        out.update(flow_fct_stats(trial.get("flows", [])))
        out["tuning_changes"] = len(trial.get("tuning", []))
        return out

    sweep.run(rf, plans, metrics=metrics)
    best_fixed_ratios(rf, settings)
    rf.write()
    R.plot_bars(plot_rows([r for r in rf.to_dict()["summary"] if "/" not in str(r["params"].get("setting"))], backend),
                metric="jct_mean_s", group="setting", series="setting", path=rf.out_dir / "jct.png",
                title=f"Shifting workload: mean JCT{backend.where}", ylabel=f"mean JCT ({backend.time_unit[0]})")
    return rf


def best_fixed_ratios(rf: R.ResultFile, settings: Sequence[str]) -> None:
    """Every policy of the run against the best of its whole baseline pool in hindsight (``experiments.hindsight``:
    every fixed setting the run contains, with and without the finishing rule, the default among them): noted,
    the pool, the best pool member on the mean per phase and overall, each judged policy's per-seed ratios and
    verdict; and per seed the ``default`` and ``adaptive`` settings' JCT over that seed's best pool member (rows
    ``default/best-fixed``, ``adaptive/best-fixed``)."""
    pool, judgements = hindsight.judge_run({"runs": rf.runs}, SHIFT_SETTINGS, FIXED_THRESHOLDS,
                                           horizons=FINISH_HORIZONS)
    rf.notes.append({
        "baseline_pool": list(pool),
        "best_fixed_in_hindsight": hindsight.best_fixed({"runs": rf.runs}, pool),
        "judgements": {j.policy: {"verdict": j.verdict,
                                  **{c.key: {"on_mean": c.on_mean, "best_on_mean": c.best_on_mean,
                                             "per_seed": {str(seed): list(v) for seed, v in c.per_seed.items()}}
                                     for c in j.criteria}} for j in judgements}})
    oracle = hindsight.run_oracle({"runs": rf.runs}, pool)
    if oracle is not None:
        rf.notes[-1]["selection_oracle"] = {"on_mean": oracle.on_mean, "best_on_mean": oracle.best_on_mean,
                                            "per_seed": {str(seed): v for seed, v in oracle.per_seed.items()}}
    for j in judgements:
        if j.policy not in ("default", "adaptive"):
            continue
        for seed in sorted({seed for c in j.criteria for seed in c.per_seed}):
            ratios = {f"{c.key[:-2]}_ratio": c.per_seed[seed][0] for c in j.criteria if seed in c.per_seed}
            rf.add(seed, {"setting": f"{j.policy}/best-fixed"}, ratios, progress=False)


# --------------------------------------------------------------------------------------------------
# On the emulated testbed only: DDNN ring-allreduce next to web-search flows, same vs low priority (thesis,
# papers/003 ch. 5), and bounded-loss ML (papers/002)


def exp_ddnn(seeds: Sequence[int], out: Path, sweep: Sweep, *, ratios=(2.0, 4.0), flow_loads=(0.05, 0.2),
             workers: int = 3, model_bytes: int = 400_000, duration_s: float = 8.0) -> R.ResultFile:
    """A ring-allreduce DNN (``workers`` hosts) at a compute-to-network time ratio next to web-search flows,
    its traffic in queue 0 with the flows (``same``) or in queue 1 (``low``)."""
    scale = as_sweep(sweep).backend.scale
    rate = scale.rate_bps
    net = ddnn.network_time_s(model_bytes, workers, rate)
    rf = R.ResultFile("ddnn", {"scale": dataclasses.asdict(scale), "compute_to_network": list(ratios),
                               "flow_loads": list(flow_loads), "workers": workers, "model_bytes": model_bytes,
                               "network_time_s": net, "duration_s": duration_s,
                               "priorities": {"same": "ring traffic in queue 0 with the flows",
                                              "low": "ring traffic (TCP dport 5900) in queue 1 (7 packets)"},
                               "flows": "web-search TCP flows from an extra host to the workers"},
                      seeds, out / "ddnn", expected=len(seeds) * len(ratios) * len(flow_loads) * 2)
    low_rule = ClassRule(rank=10, ip_proto=6, ip_proto_mask=0xFF, l4_dport=ddnn.RING_PORT, l4_dport_mask=0xFFFF, qid=1)
    backend = as_sweep(sweep).backend
    try:
        for seed in seeds:
            for ratio in ratios:
                for load in flow_loads:
                    for prio in ("same", "low"):
                        m, raw = backend.ddnn_trial(seed, workers=workers, model_bytes=model_bytes,
                                                    compute_s=ratio * net, flow_load=load, duration_s=duration_s,
                                                    class_rules=[low_rule] if prio == "low" else [],
                                                    name=f"s{seed}-{ratio}-{load}-{prio}", workdir=out / "ddnn" / "work")
                        rf.add(seed, {"ratio": ratio, "flow_load": load, "priority": prio}, m, raw)
                        rf.write()
    finally:
        backend.close()
    for seed in seeds:  # relative change low vs same, per seed
        for ratio in ratios:
            for load in flow_loads:
                same = _find(rf, seed, {"ratio": ratio, "flow_load": load, "priority": "same"})
                low = _find(rf, seed, {"ratio": ratio, "flow_load": load, "priority": "low"})
                if not same or not low:
                    continue
                ch = {}
                for key in ("fct_small_mean", "fct_large_mean", "fct_all_mean", "iteration_mean_s"):
                    x, y = low["metrics"].get(key), same["metrics"].get(key)
                    ch[key + "_change_pct"] = (x - y) / y * 100 if x is not None and y else None
                rf.add(seed, {"ratio": ratio, "flow_load": load, "priority": "low-vs-same"}, ch, progress=False)
    rf.write()
    s = rf.to_dict()["summary"]
    for key, label in (("fct_small_mean_change_pct", "small-flow FCT change (%)"),
                       ("fct_all_mean_change_pct", "all-flow FCT change (%)"),
                       ("iteration_mean_s_change_pct", "iteration time change (%)")):
        R.plot_lines(s, metric=key, x="flow_load", series="ratio", fixed={"priority": "low-vs-same"},
                     path=rf.out_dir / f"{key}.png", title=f"DNN at low priority: {label}",
                     xlabel="web-search load", ylabel=label)
    return rf


def _find(rf: R.ResultFile, seed: int, params: Mapping[str, Any]) -> dict | None:
    return next((r for r in rf.runs if r["seed"] == seed and r["params"] == dict(params)), None)


def gradient_vector(seed: int, n: int) -> np.ndarray:
    """A synthetic gradient: Laplace-distributed values (heavy-tailed, most near zero), float32."""
    rng = np.random.default_rng(seed)
    return rng.laplace(0.0, 1e-3, n).astype(np.float32)


def range_loss_error(vec: np.ndarray, floats_per_packet: int, loss: float, seed: int) -> dict:
    """Drop each range-indexed packet with probability ``loss``; lost ranges read as zero.

    Returns the fraction of packets lost and the relative L2 error ||g - g_hat|| / ||g||."""
    rng = np.random.default_rng(seed)
    n_pk = math.ceil(len(vec) / floats_per_packet)
    lost = rng.random(n_pk) < loss
    rec = vec.copy()
    for i in np.nonzero(lost)[0]:
        rec[i * floats_per_packet:(i + 1) * floats_per_packet] = 0.0
    err = float(np.linalg.norm(vec - rec) / np.linalg.norm(vec))
    return {"packet_loss": float(lost.mean()), "rel_l2_error": err}


def exp_boundedloss(seeds: Sequence[int], out: Path, sweep: Sweep, *, bounds=(0.10, 0.15, 0.35),
                    bg_loads=(0.0, 0.6, 0.9), vector_len: int = 100_000, network: bool = True,
                    offline_len: int = 1_000_000) -> R.ResultFile:
    """Part A (offline, no network): error of range-indexed vectors (``offline_len`` floats) against random
    packet loss. Part B (network): a gradient vector sent by ATP with MSR = 1 - bound next to approximate
    background in the same queue; measured loss, error of the received vector, and JCT. Part C (network,
    FIFO switch): the same-shaped job by ATP (MSR = 1 - bound) and by reliable TCP next to the same
    non-approximate background: TCP JCT / ATP JCT (the bounded-loss paper's speedup)."""
    sweep = as_sweep(sweep)
    scale = sweep.backend.scale
    fpp = wire.floats_per_packet(1400 - wire.HEADER_LEN)
    rf = R.ResultFile("boundedloss", {"scale": dataclasses.asdict(scale), "bounds": list(bounds), "bg_loads": list(bg_loads),
                                      "vector_len": vector_len, "offline_len": offline_len, "floats_per_packet": fpp,
                                      "gradient": "Laplace(0, 1e-3) float32",
                                      "loss_bounds_source": "Xia et al. APNet'19 Table 3: RNN 0.10, MLP/CNN 0.15, MF 0.35"},
                      seeds, out / "boundedloss", expected=len(seeds) * (8 + (3 * len(bounds) * len(bg_loads) if network else 0)))
    for seed in seeds:
        vec = gradient_vector(seed, max(vector_len, offline_len))
        for loss in (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.35, 0.5):
            rf.add(seed, {"part": "offline", "loss": loss}, range_loss_error(vec, fpp, loss, seed))
    rf.write()
    if network:
        rate = scale.rate_bps
        wd = out / "boundedloss" / "work"
        backend = as_sweep(sweep).backend
        try:
            for seed in seeds:
                vec = gradient_vector(seed, vector_len)
                for bound in bounds:
                    for load in bg_loads:
                        m, raw = backend.vector_trial(vec, f"vec{seed}", bound, load, name=f"s{seed}-{bound}-{load}",
                                                      workdir=wd)
                        rf.add(seed, {"part": "network", "bound": bound, "bg_load": load}, m, raw)
                        rf.write()
        finally:
            backend.close()
        # Part C: bounded-loss ATP against reliable TCP with the same background, on a FIFO switch
        # (one queue, so both see the same congestion): a job shaped like the vector's packets.
        per = fpp * 4 + 8
        npk = math.ceil(vector_len / fpp)
        shaped = JobWorkload(kind="vector", seed=0, sizes=(per,) * npk, ready_s=(0.0,) * npk)
        plans = []
        for seed in seeds:
            for bound in bounds:
                for load in bg_loads:
                    dur = 4.0 * shaped.total_bytes * 8 / rate + scale.slack_s
                    bg = (Background(2, 1, load * rate, 0.0, dur),) if load > 0 else ()
                    for proto, msr in (("atp", round(1 - bound, 6)), ("tcp-es", 1.0)):
                        plans.append(TrialPlan({"part": "fifo", "bound": bound, "bg_load": load, "protocol": proto},
                                               seed, proto, (JobPlan(1, 0, 1, shaped, msr, start_s=scale.lead_s),), bg,
                                               switch="fifo"))

        def metrics(plan: TrialPlan, trial: dict) -> dict:
            j = trial["jobs"][0]
            return {"jct_s": j["jct_s"], "msr_met": j["msr_met"], "msg_loss": j.get("msg_loss")}

        sweep.run(rf, plans, metrics=metrics, workdir=out / "boundedloss")
        for seed in seeds:
            for bound in bounds:
                for load in bg_loads:
                    a = _find(rf, seed, {"part": "fifo", "bound": bound, "bg_load": load, "protocol": "atp"})
                    t = _find(rf, seed, {"part": "fifo", "bound": bound, "bg_load": load, "protocol": "tcp-es"})
                    if a and t and a["metrics"]["jct_s"] and t["metrics"]["jct_s"]:
                        rf.add(seed, {"part": "fifo-speedup", "bound": bound, "bg_load": load},
                               {"tcp_over_atp_jct": t["metrics"]["jct_s"] / a["metrics"]["jct_s"]}, progress=False)
        rf.write()
    s = rf.to_dict()["summary"]
    if network:
        R.plot_lines(s, metric="tcp_over_atp_jct", x="bg_load", series="bound", fixed={"part": "fifo-speedup"},
                     path=rf.out_dir / "speedup_vs_tcp.png", title="Bounded-loss ATP vs reliable TCP (FIFO switch)",
                     xlabel="background load", ylabel="TCP JCT / ATP JCT")
    R.plot_lines(s, metric="rel_l2_error", x="loss", series="part", fixed={"part": "offline"},
                 path=rf.out_dir / "error_vs_loss.png", title="Range-indexed vector: error vs packet loss",
                 xlabel="packet loss", ylabel="relative L2 error")
    if network:
        R.plot_lines(s, metric="rel_l2_error", x="bg_load", series="bound",
                     fixed={"part": "network"}, path=rf.out_dir / "network_error.png",
                     title="ATP vector transfer: error vs background load", xlabel="background load", ylabel="relative L2 error")
    return rf


# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Figure:
    """A figure: its sweep (``run``), the reduced sweep of ``--quick``, and per back end the keyword defaults
    that differ from ``run``'s (which are the emulated testbed's)."""

    run: Callable[..., R.ResultFile]
    quick: Mapping[str, Any]
    defaults: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """Back end name -> keyword defaults (``quick`` among them: that back end's ``--quick``)."""
    backends: tuple[str, ...] = ("emulated", "sim")

    def kwargs(self, backend: str, *, quick: bool = False) -> dict[str, Any]:
        """The keyword arguments of a run on ``backend`` that differ from ``run``'s defaults."""
        own = dict(self.defaults.get(backend, {}))
        quick_kw = own.pop("quick", self.quick)
        return {**own, **(quick_kw if quick else {})}

    def __call__(self, seeds: Sequence[int], out: Path, sweep: Any, *, quick: bool = False, **kw: Any) -> R.ResultFile:
        sweep = as_sweep(sweep)
        if sweep.backend.name not in self.backends:
            raise ValueError(f"{self.run.__name__} runs on {' or '.join(self.backends)}, not {sweep.backend.name}")
        return self.run(seeds, out, sweep, **{**self.kwargs(sweep.backend.name, quick=quick), **kw})


EXPERIMENTS: dict[str, Figure] = {
    "alltoall": Figure(exp_alltoall, {"msrs": (0.5, 0.9), "workloads": ("fbkv",)},
                       {"sim": {"protocols": ("atp", "dctcp-es", "dctcp-ss", "udp")}}),
    "incast": Figure(exp_incast, {"msrs": (0.5, 0.9)}, {"sim": {"protocols": ("atp", "dctcp-es", "dctcp-ss")}}),
    "dynamic": Figure(exp_dynamic, {"msrs": (0.5,)},
                      {"sim": {"protocols": ("dctcp-es", "atp-fixtlr", "atp-fixprio", "atp-full", "atp")}}),
    "ablation": Figure(exp_ablation, {"msrs": (0.5, 0.9)},
                       {"sim": {"variants": ("atp-base", "atp-rc", "atp-mrdf", "atp-fixprio", "atp-full", "atp")}}),
    "coexist": Figure(exp_coexist, {"msrs": (0.9,), "loads": (0.2,)},
                      {"sim": {"protocols": ("atp", "dctcp-es"), "pattern": "fabric", "window_ms": 3.0,
                               "quick": {"msrs": (0.9,), "loads": (0.3,)}}}),
    "fairness": Figure(exp_fairness, {},
                       {"sim": {"schemes": ("alone", "alone-atp", "atp-full", "atp-fixprio", "atp-fixtlr", "atp",
                                            "atp+adaptive", "atp-full+adaptive"),
                                "fbkv_delay_us": 100.0}}),
    "shift": Figure(exp_shift, {"settings": ("adaptive", "fixed-k8"), "phase_s": 1.5},
                    {"sim": {"phase_s": 0.4e-3, "load": 0.7, "receivers": 4,
                             "quick": {"settings": ("adaptive", "fixed-k8"), "phase_s": 0.1e-3}}}),
    "boundedloss": Figure(exp_boundedloss, {"bounds": (0.15,), "bg_loads": (0.0, 0.8), "vector_len": 20_000},
                          backends=("emulated",)),
    "ddnn": Figure(exp_ddnn, {"ratios": (2.0,), "flow_loads": (0.1,), "duration_s": 5.0}, backends=("emulated",)),
}
"""Every figure by name (``python -m netapprox.experiments <name>``, ``... sim <name>``)."""


def figures_for(backend: str) -> list[str]:
    return sorted(name for name, fig in EXPERIMENTS.items() if backend in fig.backends)
