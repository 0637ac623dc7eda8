"""The NetApprox paper's simulations (§7.1, Fig. 5-14) in ns-3: each ``exp_*`` sweeps its parameters over seeds,
runs every trial (``world.run_trial``, optionally in worker processes) and writes
``results/sim/<name>/result.json`` and PNGs with the schema and plots of the emulated experiments
(experiments/results.py). docs/simulation.md maps every experiment to its figure.

Per seed and parameter set one trial; the metrics have the emulated experiments' names (``jct_mean_s``,
``msr_met_frac``, ``queue_mean_pkts``, ``fct_all_mean``, ...). Where the paper compares ATP with DCTCP, the
runs also hold per-seed ratios (protocol ``atp/dctcp-es``, metric ``jct_ratio``: ATP's mean JCT over the
baseline's, same seed, same jobs).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from netapprox.controller.model import queue_for_tlr
from netapprox.experiments import results as R
from netapprox.experiments.sim.topology import TopologyConfig
from netapprox.experiments.sim.world import SimBackground, SimJob, SimSettings, run_trial
from netapprox.experiments.workloads import (
    JobWorkload, make_job, pick_receivers, poisson_arrivals, rng_for, web_search_flows)

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class SimScale:
    """Topology and job sizes of a sweep (recorded in every result file with every ``SimSettings`` field)."""

    kind: str = "fattree"
    """``fattree`` or ``clos``."""
    k: int = 8
    """Fat-tree arity (k=4: 16 hosts, 8: 128, 12: 432)."""
    leaves: int = 9
    spines: int = 4
    hosts_per_leaf: int = 16
    """Clos shape (the paper's 144-host 2-tier Clos)."""
    host_gbps: float = 40.0
    link_delay_us: float = 1.0
    senders: int | None = None
    """All-to-all and incast: this many hosts send a job (``None``: every host). Scales the number of jobs,
    not the topology."""
    fbkv_n: int = 1000
    """Messages per FBKV job (mean item ~365 B: ~365 KB per job)."""
    fbhd_n: int = 40
    """Messages per FBHD job."""
    fbhd_max: int = 200_000
    """Cap on one FBHD message, bytes, as in the emulated experiments (the trace's tail reaches 10 MB; every
    simulated ATP packet costs Python time)."""
    tag: str = ""
    """Files the results under results/sim/<experiment>-<tag> (a second run of an experiment, e.g. k=8)."""
    buffer_packets: int = SimSettings.buffer_packets
    ecn_threshold_pkts: int = SimSettings.ecn_threshold_pkts
    min_rto_us: float = SimSettings.min_rto_us
    epoch_us: float = SimSettings.epoch_us

    def topology(self) -> TopologyConfig:
        return TopologyConfig(kind=self.kind, k=self.k, leaves=self.leaves, spines=self.spines,
                              hosts_per_leaf=self.hosts_per_leaf, host_gbps=self.host_gbps,
                              link_delay_us=self.link_delay_us)

    def settings(self, **kw: Any) -> SimSettings:
        return SimSettings(topology=self.topology(), buffer_packets=self.buffer_packets,
                           ecn_threshold_pkts=self.ecn_threshold_pkts, min_rto_us=self.min_rto_us,
                           epoch_us=self.epoch_us, **kw)

    def job(self, kind: str, seed: int, times: int = 1) -> JobWorkload:
        if kind == "fbkv":
            return make_job("fbkv", seed, self.fbkv_n * times)
        return make_job("fbhd", seed, self.fbhd_n * times, max_size=self.fbhd_max)

    @property
    def rate_bps(self) -> float:
        return self.host_gbps * 1e9

    def senders_of(self, seed: int, hosts: Sequence[int], exclude: Sequence[int] = ()) -> list[int]:
        pool = [h for h in hosts if h not in exclude]
        if self.senders is None or self.senders >= len(pool):
            return pool
        return sorted(int(h) for h in rng_for(seed * 7919 + 1).choice(pool, self.senders, replace=False))


@dataclasses.dataclass(frozen=True)
class TrialSpec:
    """One trial of a sweep: what ``world.run_trial`` gets, and the params it is filed under."""

    params: dict
    seed: int
    settings: SimSettings
    protocol: str
    jobs: tuple
    background: tuple = ()
    flows: tuple = ()
    timeline_job: int | None = None

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params.items()) + f" seed={self.seed}"


def _run_spec(spec: TrialSpec, verbose: bool = False) -> dict:
    return run_trial(spec.settings, spec.protocol, spec.jobs, seed=spec.seed, background=spec.background,
                     flows=spec.flows, timeline_job=spec.timeline_job, label=spec.label,
                     progress=(lambda line: print(line, flush=True)) if verbose else None)


def _init_worker() -> None:
    from netapprox.experiments.sim import native
    native.load()


def run_specs(specs: Sequence[TrialSpec], on_result: Callable[[TrialSpec, dict], None], *, workers: int = 1,
              progress: Progress = print) -> None:
    """Run every trial (in ``workers`` processes when > 1, each loading ns-3 once), calling ``on_result`` as
    they finish; a progress line per trial with the elapsed time and an estimate of what is left."""
    t0 = time.perf_counter()
    total = len(specs)
    done = 0

    def report(spec: TrialSpec, trial: dict) -> None:
        nonlocal done
        done += 1
        elapsed = time.perf_counter() - t0
        jcts = [j["jct_s"] for j in trial["jobs"] if j["jct_s"] is not None]
        met = sum(1 for j in trial["jobs"] if j["msr_met"])
        perf = trial["perf"]
        progress(f"[{done}/{total}] {spec.label}: {len(trial['jobs'])} jobs, mean JCT "
                 f"{np.mean(jcts) * 1e6 if jcts else float('nan'):.1f} µs, MSR met {met}/{len(trial['jobs'])}, "
                 f"{perf['run_wall_s']:.1f} s wall ({perf.get('run_cpu_s', 0):.1f} s CPU) for "
                 f"{perf['sim_time_s'] * 1e3:.2f} ms simulated; "
                 f"{elapsed / 60:.1f} min so far, ~{elapsed / done * (total - done) / 60:.1f} min left")
        on_result(spec, trial)

    if workers <= 1 or total <= 1:
        progress(f"{total} trials in this process (loading ns-3 ...)")
        for spec in specs:
            report(spec, _run_spec(spec, verbose=True))
        return
    progress(f"{total} trials in {workers} worker processes (each loads ns-3 once)")
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker) as pool:
        futures = {pool.submit(_run_spec, spec, True): spec for spec in specs}
        for fut in concurrent.futures.as_completed(futures):
            report(futures[fut], fut.result())


# --------------------------------------------------------------------------------------------------
# Metrics


def job_summary(trial: dict) -> dict:
    jobs = trial["jobs"]
    jcts = [j["jct_s"] for j in jobs if j["jct_s"] is not None]
    ratios = [j["jct_over_bound"] for j in jobs if j.get("jct_over_bound") is not None]
    losses = [j["pkt_loss"] for j in jobs if j.get("pkt_loss") is not None]
    met = [bool(j["msr_met"]) for j in jobs]
    within = [j["msg_loss"] <= 1 - j["msr"] + 1e-9 for j in jobs if j.get("msg_loss") is not None and j["msr_met"]]
    q = trial["queues"]
    out = {
        "jct_mean_s": float(np.mean(jcts)) if jcts else None,
        "jct_median_s": float(np.median(jcts)) if jcts else None,
        "jct_p99_s": R.percentile(jcts, 99) if jcts else None,
        "jct_max_s": float(np.max(jcts)) if jcts else None,
        "jct_over_bound": float(np.mean(ratios)) if ratios else None,
        "msr_met_frac": sum(met) / len(met) if met else None,
        "loss_within_bound_frac": sum(within) / len(within) if within else None,
        "jobs": len(jobs),
        "jobs_failed": sum(1 for j in jobs if j["jct_s"] is None),
        "pkt_loss": float(np.mean(losses)) if losses else None,
        "delivered_bytes_frac": _mean(jobs, "delivered_bytes_frac"),
        "queue_mean_pkts": q["receiver_port_mean_pkts"],
        "approx_queue_mean_pkts": q["receiver_port_approx_mean_pkts"],
        "queue_max_pkts": q["receiver_port_max_pkts"],
        "switch_drops": q["switch_drops"],
        "switch_trims": q.get("switch_trims", 0),
        "network_loss_frac": network_loss_frac(trial),
        "lost_at_receivers_frac": _lost_share(q, "host_facing"),
        "wall_s": trial["perf"]["run_wall_s"],
        "cpu_s": trial["perf"].get("run_cpu_s"),
        "sim_packets_per_wall_s": trial["perf"]["switch_packets_per_wall_s"],
    }
    if any("timeouts" in j for j in jobs):
        out["tcp_timeouts_per_job"] = _mean(jobs, "timeouts")
        out["tcp_retx_frac"] = out.pop("pkt_loss")
    return out


def network_loss_frac(trial: dict) -> float | None:
    """ATP: payloads lost in the network (dropped or trimmed by a switch) over the DATA packets the senders sent;
    ``None`` for the baselines (their packets are counted by ns-3's TCP, not here)."""
    sent = sum(j.get("packets_sent") or 0 for j in trial["jobs"])
    if not sent:
        return None
    q = trial["queues"]
    return (q["switch_drops"] + q.get("switch_trims", 0)) / sent


def _lost_share(q: dict, where: str) -> float | None:
    """The share of the drops and trims that happened on switch ports facing a host (a receiver's downlink)."""
    lost = q.get("lost_at")
    total = sum(lost.values()) if lost else 0
    return lost[where] / total if total else None


def _mean(rows: Sequence[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(vals)) if vals else None


def _raw(trial: dict) -> dict:
    """What result.json keeps of a trial: per-job metrics, queues, controller and performance figures."""
    keep = ("protocol", "seed", "jobs", "queues", "sim_end_s", "completed_all", "controller", "perf",
            "background_rx", "timeline", "decisions", "atp_config", "tcp_attributes")
    out = {k: trial[k] for k in keep if k in trial}
    if "flows" in trial:
        out["flows"] = trial["flows"]
    return out


def add_ratios(rf: R.ResultFile, keys: Sequence[str], metric: str = "jct_mean_s",
               pairs: Sequence[tuple[str, str]] = (("atp", "dctcp-es"), ("atp", "dctcp-ss"))) -> None:
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
                                  m[metric] / other[metric]})


def _plain(summary: Sequence[dict]) -> list[dict]:
    """Summary rows of the protocols themselves (not the per-seed ratio rows), for plots; times in µs."""
    out = []
    for r in summary:
        if "/" in str(r["params"].get("protocol", "")):
            continue
        if r["metric"].endswith("_s") or r["metric"].startswith("fct_"):
            r = {**r, **{k: r[k] * 1e6 for k in ("mean", "median", "min", "max", "std") if r.get(k) is not None}}
        out.append(r)
    return out


def _result_file(name: str, out: Path, seeds: Sequence[int], scale: SimScale, config: dict) -> R.ResultFile:
    from netapprox.controller.sim.native import ns_version
    cfg = {"simulator": f"ns-3 {ns_version()} (PyPI wheel, cppyy)", "scale": dataclasses.asdict(scale),
           "settings": scale.settings().to_dict(), **config}
    name = f"{name}-{scale.tag}" if scale.tag else name
    return R.ResultFile(f"sim-{name}", cfg, seeds, out / "sim" / name)


def _sweep(rf: R.ResultFile, specs: list[TrialSpec], workers: int, progress: Progress,
           metrics: Callable[[TrialSpec, dict], dict] | None = None) -> None:
    def on_result(spec: TrialSpec, trial: dict) -> None:
        m = metrics(spec, trial) if metrics else job_summary(trial)
        rf.add(spec.seed, spec.params, m, _raw(trial))
        rf.runs.sort(key=lambda r: (r["seed"], [str(v) for v in r["params"].values()]))
        rf.write()

    run_specs(specs, on_result, workers=workers, progress=progress)


# --------------------------------------------------------------------------------------------------
# Fig. 5-8: all-to-all JCT vs MSR and queue length


def exp_alltoall(seeds: Sequence[int], out: Path, scale: SimScale, *, msrs=(0.5, 0.7, 0.9),
                 workloads=("fbkv", "fbhd"), protocols=("atp", "dctcp-es", "dctcp-ss", "udp"), workers: int = 1,
                 progress: Progress = print) -> R.ResultFile:
    topo = scale.topology()
    hosts = list(range(topo.n_hosts))
    rf = _result_file("alltoall", out, seeds, scale, {
        "msrs": list(msrs), "workloads": list(workloads), "protocols": list(protocols),
        "pattern": f"{scale.senders or topo.n_hosts} of {topo.n_hosts} hosts each send one bulk job to a random "
                   "other host, all at time 0", "topology": topo.describe()})
    specs = []
    for seed in seeds:
        senders = scale.senders_of(seed, hosts)
        dst_of = pick_receivers(seed, senders, hosts)
        for wl in workloads:
            jobs_wl = {h: scale.job(wl, seed * 1000 + h) for h in senders}
            for msr in msrs:
                for proto in protocols:
                    jobs = tuple(SimJob(1 + h, h, dst_of[h], jobs_wl[h], msr) for h in senders)
                    specs.append(TrialSpec({"workload": wl, "msr": msr, "protocol": proto}, seed,
                                           scale.settings(), proto, jobs))
    _sweep(rf, specs, workers, progress)
    add_ratios(rf, ("workload", "msr"))
    rf.write()
    s = _plain(rf.to_dict()["summary"])
    for wl in workloads:
        fig = 5 if wl == "fbkv" else 6
        R.plot_lines(s, metric="jct_mean_s", x="msr", series="protocol", fixed={"workload": wl},
                     path=rf.out_dir / f"jct_{wl}.png",
                     title=f"All-to-all JCT, {wl.upper()}, {topo.short()} (cf. Fig. {fig})",
                     xlabel="MSR", ylabel="mean JCT (µs)")
        R.plot_bars(s, metric="queue_mean_pkts", group="msr", series="protocol", fixed={"workload": wl},
                    path=rf.out_dir / f"queue_{wl}.png",
                    title=f"Receiver-port queue, {wl.upper()}, {topo.short()} (cf. Fig. {fig + 2})",
                    ylabel="time-average backlog (packets)")
    return rf


# --------------------------------------------------------------------------------------------------
# Fig. 9: incast


def exp_incast(seeds: Sequence[int], out: Path, scale: SimScale, *, msrs=(0.5, 0.7, 0.9),
               protocols=("atp", "dctcp-es", "dctcp-ss"), workers: int = 1, progress: Progress = print) -> R.ResultFile:
    topo = scale.topology()
    hosts = list(range(topo.n_hosts))
    rf = _result_file("incast", out, seeds, scale, {
        "msrs": list(msrs), "protocols": list(protocols), "workload": "fbkv",
        "pattern": f"{scale.senders or topo.n_hosts - 1} hosts each send one FBKV job to host 0 at time 0",
        "topology": topo.describe()})
    specs = []
    for seed in seeds:
        senders = scale.senders_of(seed, hosts, exclude=(0,))
        for msr in msrs:
            for proto in protocols:
                jobs = tuple(SimJob(1 + h, h, 0, scale.job("fbkv", seed * 1000 + h), msr) for h in senders)
                specs.append(TrialSpec({"msr": msr, "protocol": proto}, seed, scale.settings(), proto, jobs))
    _sweep(rf, specs, workers, progress)
    add_ratios(rf, ("msr",), metric="jct_max_s")
    rf.write()
    R.plot_lines(_plain(rf.to_dict()["summary"]), metric="jct_max_s", x="msr", series="protocol",
                 path=rf.out_dir / "jct.png", title=f"Incast JCT, FBKV, {topo.short()} (cf. Fig. 9)", xlabel="MSR",
                 ylabel="JCT of the last job (µs)")
    return rf


# --------------------------------------------------------------------------------------------------
# Fig. 10-12: dynamic TLR and priority, ATP techniques


def _far_hosts(topo: TopologyConfig) -> tuple[int, int, int]:
    """(sender, background sender, receiver): the receiver in another pod (leaf) than both senders."""
    n = topo.n_hosts
    return 0, 1, n - 1


def _tlr_mid(q: int) -> float:
    return (q + 0.5) / 8


def exp_dynamic(seeds: Sequence[int], out: Path, scale: SimScale, *, msrs=(0.5, 0.75, 0.9),
                protocols=("dctcp-es", "atp-fixtlr", "atp-fixprio", "atp-full", "atp"), bg_load: float = 0.7,
                job_scale: int = 4, workers: int = 1, progress: Progress = print) -> R.ResultFile:
    """Fig. 11: the job's background starts in the job's initial queue and moves one queue up halfway.
    Fig. 10 (timeline, first seed): MSR 0.5, background in queue 4, then 3, then 2."""
    topo = scale.topology()
    src, bg_src, dst = _far_hosts(topo)
    rate = scale.rate_bps
    rf = _result_file("dynamic", out, seeds, scale, {
        "msrs": list(msrs), "protocols": list(protocols), "bg_load": bg_load, "workload": f"fbkv x {job_scale}",
        "hosts": {"job": [src, dst], "background": [bg_src, dst]},
        "background": "paced UDP to the receiver's second address, APPROX with a TLR in the job's initial queue, "
                      "moved one queue up halfway (DCTCP-ES: the same packets in the oblivious switch's one queue)"})
    specs = []
    for seed in seeds:
        for msr in msrs:
            wl = scale.job("fbkv", seed, job_scale)
            q0 = queue_for_tlr(1 - msr)
            dur = 2.0 * wl.total_bytes * 8 / rate + 200e-6
            bg = tuple(SimBackground(bg_src, dst, bg_load * rate, i * dur / 2, dur / 2, tlr=_tlr_mid(q))
                       for i, q in enumerate((q0, max(1, q0 - 1))))
            for proto in protocols:
                jobs = (SimJob(1, src, dst, wl, msr, start_s=20e-6),)
                specs.append(TrialSpec({"msr": msr, "protocol": proto}, seed, scale.settings(), proto, jobs, bg))
    # Fig. 10: one timeline
    wl = scale.job("fbkv", seeds[0], job_scale * 2)
    expected = 0.5 * wl.total_bytes * 8 / (rate * (1 - bg_load))
    seg = (1.5 * expected + 100e-6) / 3
    tl_bg = tuple(SimBackground(bg_src, dst, bg_load * rate, i * seg, seg, tlr=t)
                  for i, t in enumerate((4.5 / 8, 3.5 / 8, 2.5 / 8)))
    timeline_proto = "atp-full" if "atp-full" in protocols else protocols[-1]
    specs.append(TrialSpec({"msr": 0.5, "protocol": timeline_proto, "run": "timeline"}, seeds[0], scale.settings(),
                           timeline_proto, (SimJob(1, src, dst, wl, 0.5, start_s=20e-6),), tl_bg, timeline_job=1))
    timeline: dict = {}

    def metrics(spec: TrialSpec, trial: dict) -> dict:
        if spec.params.get("run") == "timeline":
            timeline.update(rows=timeline_rows(trial.get("timeline", [])), shifts=[b.start_s for b in tl_bg[1:]],
                            decisions=trial.get("decisions", []))
            rf.notes.append({"timeline": timeline["rows"], "background_shifts_s": timeline["shifts"],
                             "background_tlrs": [b.tlr for b in tl_bg], "controller_decisions": timeline["decisions"]})
        return job_summary(trial)

    _sweep(rf, specs, workers, progress, metrics)
    rf.runs = [r for r in rf.runs if r["params"].get("run") != "timeline"]
    add_ratios(rf, ("msr",), pairs=[(p, "dctcp-es") for p in protocols if p.startswith("atp")])
    rf.write()
    s = _plain(rf.to_dict()["summary"])
    R.plot_bars(s, metric="jct_mean_s", group="msr", series="protocol", path=rf.out_dir / "jct.png",
                title="Dynamic mechanisms, FBKV with shifting background (cf. Fig. 11)", ylabel="JCT (µs)")
    if timeline.get("rows"):
        R.plot_timeline(timeline["rows"], fields=[f for f in ("loss", "tlr", "rate_gbps", "queue")
                                                  if any(f in r for r in timeline["rows"])],
                        path=rf.out_dir / "timeline.png", title="ATP, MSR 0.5, background q4 -> q3 -> q2 (cf. Fig. 10)",
                        events=[(t - 20e-6, "bg shift") for t in timeline["shifts"]])
    return rf


def timeline_rows(timeline: Sequence[dict]) -> list[dict]:
    """Sender epochs (hostlib EpochEnded) as plot rows: loss, TLR, rate, and the queue most ACKs echoed."""
    rows = []
    for r in timeline:
        row = {"time": float(r["time"]), "tlr": r.get("tlr"), "loss": r.get("loss"),
               "rate_gbps": float(r.get("rate_bps", 0)) / 1e9}
        seen = {int(q): c for q, c in (r.get("queues") or {}).items() if int(q) != 255}
        if seen:
            row["queue"] = max(seen, key=lambda q: (seen[q], -q))
        rows.append(row)
    return rows


def exp_ablation(seeds: Sequence[int], out: Path, scale: SimScale, *, msrs=(0.5, 0.7, 0.9),
                 variants=("atp-base", "atp-rc", "atp-mrdf", "atp-fixprio", "atp-full", "atp"), bg_load: float = 0.5,
                 job_scale: int = 2, workers: int = 1, progress: Progress = print) -> R.ResultFile:
    topo = scale.topology()
    src, bg_src, dst = _far_hosts(topo)
    rate = scale.rate_bps
    rf = _result_file("ablation", out, seeds, scale, {
        "msrs": list(msrs), "variants": list(variants), "bg_load": bg_load, "workload": f"fbkv x {job_scale}",
        "variants_meaning": {"atp-base": "UDP at R_max, then repairs until MSR",
                             "atp-rc": "+ rate control (paper eq. 2/3), static TLR = 1 - MSR",
                             "atp-mrdf": "+ MRDF scheduling",
                             "atp-fixprio": "dynamic TLR, job pinned to its initial queue",
                             "atp-full": "dynamic TLR and dynamic queue (controller)",
                             "atp": "hostlib's default sender (adaptive) with the controller"},
        "background": "paced UDP to the receiver's second address, APPROX, TLR in the job's initial queue"})
    specs = []
    for seed in seeds:
        for msr in msrs:
            wl = scale.job("fbkv", seed, job_scale)
            q0 = queue_for_tlr(1 - msr)
            dur = 3.0 * wl.total_bytes * 8 / rate + 200e-6
            bg = (SimBackground(bg_src, dst, bg_load * rate, 0.0, dur, tlr=_tlr_mid(q0)),)
            for v in variants:
                specs.append(TrialSpec({"msr": msr, "protocol": v}, seed, scale.settings(), v,
                                       (SimJob(1, src, dst, wl, msr, start_s=20e-6),), bg))
    _sweep(rf, specs, workers, progress)
    rf.write()
    R.plot_bars(_plain(rf.to_dict()["summary"]), metric="jct_mean_s", group="msr", series="protocol",
                path=rf.out_dir / "jct.png", title="ATP techniques, FBKV with background (cf. Fig. 12)",
                ylabel="JCT (µs)")
    return rf


# --------------------------------------------------------------------------------------------------
# Fig. 13: co-running non-approximate traffic


def exp_coexist(seeds: Sequence[int], out: Path, scale: SimScale, *, msrs=(0.5, 0.9), loads=(0.1, 0.3, 0.5),
                protocols=("atp", "dctcp-es"), approx_load: float = 0.2, window_ms: float = 3.0,
                workers: int = 1, progress: Progress = print) -> R.ResultFile:
    """Every host starts FBKV approximate jobs (Poisson, ``approx_load`` of its link) to random hosts and
    web-search DCTCP flows (Poisson, ``load`` of its link, the DCTCP CDF at full size) to random hosts for
    ``window_ms``; the approximate jobs run ATP (NetApprox switches) or DCTCP-ES (oblivious switches)."""
    topo = scale.topology()
    hosts = list(range(topo.n_hosts))
    rate = scale.rate_bps
    window = window_ms * 1e-3
    rf = _result_file("coexist", out, seeds, scale, {
        "msrs": list(msrs), "flow_loads": list(loads), "protocols": list(protocols), "approx_load": approx_load,
        "window_ms": window_ms,
        "pattern": f"every host: FBKV approximate jobs (Poisson, {approx_load:g} of its link) and web-search DCTCP "
                   f"flows (Poisson, flow_load of its link) to random hosts for {window_ms:g} ms"})
    specs = []
    for seed in seeds:
        jobs = _poisson_jobs(scale, seed, hosts, approx_load, window)
        for msr in msrs:
            ms_jobs = tuple(dataclasses.replace(j, msr=msr) for j in jobs)
            for load in loads:
                # ``load`` of every host's link: the generator's rate is for one link, so offer n links' worth
                flows = tuple(web_search_flows(seed * 31 + int(load * 100), load=load, link_bps=rate * len(hosts),
                                               duration_s=window, senders=hosts, receivers=hosts))
                for proto in protocols:
                    specs.append(TrialSpec({"msr": msr, "flow_load": load, "protocol": proto}, seed,
                                           scale.settings(), proto, ms_jobs, flows=flows))

    def metrics(spec: TrialSpec, trial: dict) -> dict:
        return {**job_summary(trial), **R.flow_fct_stats(trial.get("flows", []))}

    _sweep(rf, specs, workers, progress, metrics)
    add_ratios(rf, ("msr", "flow_load"), metric="fct_all_mean", pairs=(("atp", "dctcp-es"),))
    add_ratios(rf, ("msr", "flow_load"), metric="fct_small_mean", pairs=(("atp", "dctcp-es"),))
    rf.write()
    s = _plain(rf.to_dict()["summary"])
    for msr in msrs:
        R.plot_lines(s, metric="fct_all_mean", x="flow_load", series="protocol", fixed={"msr": msr},
                     path=rf.out_dir / f"fct_msr{msr}.png",
                     title=f"Non-approx. FCT next to approx. jobs, MSR {msr} (cf. Fig. 13)",
                     xlabel="non-approximate load (fraction of link)", ylabel="mean FCT (µs)")
    return rf


def _poisson_jobs(scale: SimScale, seed: int, hosts: Sequence[int], load: float, window: float) -> list[SimJob]:
    rng = rng_for(seed * 104729 + 3)
    mean_bytes = float(np.mean(make_job("fbkv", seed, 4000).sizes)) * scale.fbkv_n
    per_host_rate = load * scale.rate_bps / 8 / mean_bytes
    jobs, jid = [], 1
    for h in hosts:
        for t in poisson_arrivals(rng, per_host_rate, window):
            dst = int(rng.choice([x for x in hosts if x != h]))
            jobs.append(SimJob(jid, h, dst, scale.job("fbkv", seed * 100000 + jid), 0.5, start_s=float(t)))
            jid += 1
    return jobs


# --------------------------------------------------------------------------------------------------
# Fig. 14: job-level fairness


def exp_fairness(seeds: Sequence[int], out: Path, scale: SimScale, *,
                 schemes=("alone", "atp-full", "atp-fixprio", "atp-fixtlr", "atp"), fbkv_delay_us: float = 100.0,
                 workers: int = 1, progress: Progress = print) -> R.ResultFile:
    topo = scale.topology()
    n = topo.n_hosts
    a, b, c, d = 0, n // 4, n // 2, 3 * n // 4
    rf = _result_file("fairness", out, seeds, scale, {
        "schemes": list(schemes), "hosts": {"fbhd_0.5": a, "fbhd_0.75": b, "fbkv_0.875": c, "receiver": d},
        "jobs": f"FBHD MSR 0.5 and FBHD MSR 0.75 (2 x fbhd_n messages each), then FBKV MSR 0.875 "
                f"({fbkv_delay_us:g} µs later), all into one host"})
    specs = []
    for seed in seeds:
        kv = SimJob(3, c, d, scale.job("fbkv", seed), 0.875, start_s=fbkv_delay_us * 1e-6)
        hd = (SimJob(1, a, d, scale.job("fbhd", seed * 10 + 1, 2), 0.5),
              SimJob(2, b, d, scale.job("fbhd", seed * 10 + 2, 2), 0.75))
        for scheme in schemes:
            proto = "atp-full" if scheme == "alone" else scheme
            jobs = (kv,) if scheme == "alone" else hd + (kv,)
            specs.append(TrialSpec({"scheme": scheme}, seed, scale.settings(), proto, jobs))

    def metrics(spec: TrialSpec, trial: dict) -> dict:
        kvm = next(j for j in trial["jobs"] if j["job_id"] == 3)
        return {"fbkv_jct_s": kvm["jct_s"], "fbkv_msr_met": kvm["msr_met"], **job_summary(trial)}

    _sweep(rf, specs, workers, progress, metrics)
    rf.write()
    R.plot_bars(_plain(rf.to_dict()["summary"]), metric="fbkv_jct_s", group="scheme", series="scheme",
                path=rf.out_dir / "fbkv_jct.png", title="FBKV JCT next to two FBHD jobs (cf. Fig. 14)",
                ylabel="FBKV JCT (µs)")
    return rf


EXPERIMENTS: dict[str, Callable[..., R.ResultFile]] = {
    "alltoall": exp_alltoall,
    "incast": exp_incast,
    "dynamic": exp_dynamic,
    "ablation": exp_ablation,
    "coexist": exp_coexist,
    "fairness": exp_fairness,
}

QUICK: dict[str, dict[str, Any]] = {
    "alltoall": {"msrs": (0.5, 0.9), "workloads": ("fbkv",)},
    "incast": {"msrs": (0.5, 0.9)},
    "dynamic": {"msrs": (0.5,)},
    "ablation": {"msrs": (0.5, 0.9)},
    "coexist": {"msrs": (0.9,), "loads": (0.3,)},
    "fairness": {},
}


def main_progress(line: str) -> None:
    print(line, flush=True)
    sys.stdout.flush()
