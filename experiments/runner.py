"""The experiments: each function sweeps its parameters over seeds on an emulated rack and writes
``results/<name>/result.json`` and PNGs (see experiments.results). docs/experiments.md maps every
experiment to the paper figure it scales down, with its parameters.

All experiments share ``Scale`` (link rate, hosts, buffer, job sizes); ``--quick`` shrinks the sweep to
check the pipeline end to end in a minute or two.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from netapprox.controller.model import queue_for_tlr
from netapprox.experiments import results as R
from netapprox.experiments.harness import Testbed, TestbedConfig
from netapprox.experiments.trial import Background, FlowLoad, JobPlan, flow_fct_stats, run_trial
from netapprox.experiments.workloads import make_job, pick_receivers, web_search_flows

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Scale:
    """How far the papers' setups are scaled down (recorded in every result file)."""

    rate_mbit: float = 20.0
    """Line rate of every switch port."""
    buffer_packets: int = 64
    """Port buffer (MTU packets); NetApprox gives 36 to queue 0 and 7..1 to queues 1..7."""
    hosts: int = 4
    """Workload hosts on the single rack."""
    fbkv_n: int = 1000
    """Messages per FBKV job (mean item ~365 B: ~365 KB per job)."""
    fbhd_n: int = 40
    """Messages per FBHD job."""
    fbhd_max: int = 200_000
    """Cap on one FBHD message (bytes) so a job fits a few seconds at this rate."""
    flow_size_scale: float = 50.0
    """Web-search flow sizes are divided by this (mean 1.67 MB -> 33 KB)."""
    timeout_s: float = 60.0
    """Per-trial timeout."""

    def job(self, kind: str, seed: int):
        if kind == "fbkv":
            return make_job("fbkv", seed, self.fbkv_n)
        return make_job("fbhd", seed, self.fbhd_n, max_size=self.fbhd_max)

    def testbed(self, **kw) -> TestbedConfig:
        base = {"hosts": self.hosts, "rate_mbit": self.rate_mbit, "buffer_packets": self.buffer_packets}
        base.update(kw)
        return TestbedConfig(**base)


_id_counter = [int(time.time()) % 100000 * 1000]


def next_job_id() -> int:
    """Job ids unique within this process and unlikely to repeat across runs (the controller keys on them)."""
    _id_counter[0] += 1
    return _id_counter[0]


def _queue_stats(tb: Testbed, trial: dict, hosts: Sequence[int]) -> dict:
    """Mean and max total backlog (packets, all queues) on the ports facing ``hosts`` during the trial."""
    ports = [tb.port_of(h) for h in hosts]
    rows = [r for r in tb.queue_samples if trial["start_wall"] <= r["wall"] <= trial["end_wall"]]
    totals = [sum(r[p]) for r in rows for p in ports if p in r]
    approx = [sum(r[p][1:]) for r in rows for p in ports if p in r]
    if not totals:
        return {"queue_mean_pkts": None, "queue_max_pkts": None}
    return {"queue_mean_pkts": float(np.mean(totals)), "queue_max_pkts": float(np.max(totals)),
            "approx_queue_mean_pkts": float(np.mean(approx))}


def _job_summary(trial: dict) -> dict:
    jobs = trial["jobs"]
    jcts = [j["jct_s"] for j in jobs if j["jct_s"] is not None]
    ratios = [j.get("jct_over_bound") for j in jobs if j.get("jct_over_bound") is not None]
    losses = [j["pkt_loss"] for j in jobs if j.get("pkt_loss") is not None]
    met = [bool(j["msr_met"]) for j in jobs]
    return {
        "jct_mean_s": float(np.mean(jcts)) if jcts else None,
        "jct_max_s": float(np.max(jcts)) if jcts else None,
        "jct_over_bound": float(np.mean(ratios)) if ratios else None,
        "msr_met_frac": sum(met) / len(met) if met else None,
        "pkt_loss": float(np.mean(losses)) if losses else None,
        "delivered_bytes_frac": _mean_of(jobs, "delivered_bytes_frac"),
        "jobs_failed": sum(1 for j in jobs if j["jct_s"] is None),
    }


def _mean_of(rows: Sequence[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(vals)) if vals else None


def _strip(trial: dict) -> dict:
    """Raw record kept in result.json: per-job metrics and flows, timelines shortened."""
    out = dict(trial)
    out["jobs"] = [{k: v for k, v in j.items() if k != "timeline"} for j in trial["jobs"]]
    return out


# --------------------------------------------------------------------------------------------------
# 1. all-to-all JCT vs MSR and queue length (NetApprox Fig. 5-8)


SWITCHES = {"netapprox": {"switch": "netapprox", "controller": True},
            "static": {"switch": "netapprox", "controller": False},
            "fifo": {"switch": "fifo", "controller": False}}
"""Testbed kinds: NetApprox queues re-mapped by the controller; NetApprox queues with static TLR thresholds
and pinned jobs (ATP_FixPrio); a network-oblivious switch, one FIFO queue per port with the same total
buffer (where the papers run their baselines)."""


def switch_for(protocol: str) -> str:
    """The testbed a protocol runs on in a comparison, as the papers compare: ATP on NetApprox switches with
    the controller (ATP_FixPrio without it: its job is pinned to its first queue), the baselines (TCP-ES,
    TCP-SS, the UDP blast) on the FIFO switch."""
    if protocol == "atp-fixprio":
        return "static"
    return "netapprox" if protocol.startswith("atp") else "fifo"


def testbeds(scale: Scale, protocols: Sequence[str], workdir: Path, **testbed_kw) -> Iterator[tuple[Testbed, list[str]]]:
    """One testbed per kind the ``protocols`` need (``switch_for``), each with the protocols that run on it,
    in the order they first appear; a testbed is closed before the next one starts."""
    by_kind: dict[str, list[str]] = {}
    for proto in protocols:
        by_kind.setdefault(switch_for(proto), []).append(proto)
    for kind, protos in by_kind.items():
        with Testbed(scale.testbed(**SWITCHES[kind], **testbed_kw), workdir / f"work-{kind}") as tb:
            yield tb, protos


def alltoall_plans(scale: Scale, seed: int, workload: str, msr: float) -> list[JobPlan]:
    """Every host sends one job to a receiver it picks at random (the same for every protocol of a seed)."""
    hosts = list(range(scale.hosts))
    dst_of = pick_receivers(seed, hosts, hosts)
    return [JobPlan(next_job_id(), h, dst_of[h], scale.job(workload, seed * 100 + h), msr) for h in hosts]


def incast_plans(scale: Scale, seed: int, msr: float) -> list[JobPlan]:
    """Hosts 1..N-1 each send one FBKV job to host 0."""
    return [JobPlan(next_job_id(), h, 0, scale.job("fbkv", seed * 100 + h), msr) for h in range(1, scale.hosts)]


def exp_alltoall(seeds: Sequence[int], out: Path, scale: Scale, *, msrs=(0.5, 0.7, 0.9),
                 workloads=("fbkv", "fbhd"), protocols=("atp", "tcp-es", "tcp-ss", "udp")) -> R.ResultFile:
    rf = R.ResultFile("alltoall", {"scale": dataclasses.asdict(scale), "msrs": list(msrs),
                                   "workloads": list(workloads), "protocols": list(protocols),
                                   "switches": {p: switch_for(p) for p in protocols},
                                   "pattern": "every host sends one job to a random other host, all at once"},
                      seeds, out / "alltoall", expected=len(seeds) * len(workloads) * len(msrs) * len(protocols))
    for tb, protos in testbeds(scale, protocols, out / "alltoall", sample_queues_s=0.02):
        for seed in seeds:
            for wl in workloads:
                for msr in msrs:
                    for proto in protos:
                        plans = alltoall_plans(scale, seed, wl, msr)
                        tr = run_trial(tb, proto, plans, name=f"s{seed}-{wl}-{msr}-{proto}", timeout=scale.timeout_s)
                        m = {**_job_summary(tr), **_queue_stats(tb, tr, sorted({p.dst for p in plans}))}
                        rf.add(seed, {"workload": wl, "msr": msr, "protocol": proto}, m, _strip(tr))
                        rf.write()
    s = rf.to_dict()["summary"]
    for wl in workloads:
        R.plot_lines(s, metric="jct_mean_s", x="msr", series="protocol", fixed={"workload": wl},
                     path=rf.out_dir / f"jct_{wl}.png", title=f"All-to-all JCT, {wl.upper()} (cf. Fig. {5 if wl == 'fbkv' else 6})",
                     xlabel="MSR", ylabel="mean JCT (s)")
        R.plot_bars(s, metric="queue_mean_pkts", group="msr", series="protocol", fixed={"workload": wl},
                    path=rf.out_dir / f"queue_{wl}.png", title=f"Receiver-port queue, {wl.upper()} (cf. Fig. {7 if wl == 'fbkv' else 8})",
                    ylabel="mean backlog (packets)")
    return rf


# --------------------------------------------------------------------------------------------------
# 2. incast (Fig. 9)


def exp_incast(seeds: Sequence[int], out: Path, scale: Scale, *, msrs=(0.5, 0.7, 0.9),
               protocols=("atp", "tcp-es", "tcp-ss")) -> R.ResultFile:
    rf = R.ResultFile("incast", {"scale": dataclasses.asdict(scale), "msrs": list(msrs), "protocols": list(protocols),
                                 "switches": {p: switch_for(p) for p in protocols},
                                 "workload": "fbkv", "pattern": "hosts 1..N-1 each send one job to host 0"},
                      seeds, out / "incast", expected=len(seeds) * len(msrs) * len(protocols))
    for tb, protos in testbeds(scale, protocols, out / "incast", sample_queues_s=0.02):
        for seed in seeds:
            for msr in msrs:
                for proto in protos:
                    plans = incast_plans(scale, seed, msr)
                    tr = run_trial(tb, proto, plans, name=f"s{seed}-{msr}-{proto}", timeout=scale.timeout_s)
                    rf.add(seed, {"msr": msr, "protocol": proto}, {**_job_summary(tr), **_queue_stats(tb, tr, [0])}, _strip(tr))
                    rf.write()
    s = rf.to_dict()["summary"]
    R.plot_lines(s, metric="jct_max_s", x="msr", series="protocol", path=rf.out_dir / "jct.png",
                 title="All-to-one (incast) JCT, FBKV (cf. Fig. 9)", xlabel="MSR", ylabel="JCT of the last job (s)")
    return rf


# --------------------------------------------------------------------------------------------------
# 3. dynamic TLR / priority (Fig. 10, 11)


def _job_with_background(tb: Testbed, scale: Scale, protocol: str, job, msr: float, background: Sequence[Background],
                         pin_queue: int | None, name: str) -> dict:
    """One job host 0 -> host 1 starting 0.2 s into ``background``; ``pin_queue``: ATP_FixPrio's queue."""
    jid = next_job_id()
    if pin_queue is not None:
        tb.pin_jobs([(jid, pin_queue)])
    return run_trial(tb, protocol, [JobPlan(jid, 0, 1, job, msr, delay_s=0.2)], name=name, timeout=scale.timeout_s,
                     background=background)


def _shifting_background(src: int, dst: int, rate_bps: float, duration_s: float, tlrs: Sequence[float]) -> list[Background]:
    seg = duration_s / len(tlrs)
    return [Background(src, dst, rate_bps, seg, tlr=t, delay_s=i * seg) for i, t in enumerate(tlrs)]


def exp_dynamic(seeds: Sequence[int], out: Path, scale: Scale, *, msrs=(0.5, 0.75, 0.9),
                protocols=("tcp-es", "atp-fixtlr", "atp-fixprio", "atp-full"), bg_load: float = 0.7) -> R.ResultFile:
    """Fig. 11: background starts in the job's initial queue and moves one queue up halfway.
    Fig. 10 (timeline): MSR 0.5, background in queue 4, then 3, then 2."""
    rf = R.ResultFile("dynamic", {"scale": dataclasses.asdict(scale), "msrs": list(msrs), "protocols": list(protocols),
                                  "switches": {p: switch_for(p) for p in protocols},
                                  "bg_load": bg_load, "workload": "fbkv x 4 (longer job)",
                                  "background": "paced UDP, APPROX with a TLR in the job's initial queue, moved one "
                                                "queue up halfway"},
                      seeds, out / "dynamic", expected=len(seeds) * len(msrs) * len(protocols))
    rate = scale.rate_mbit * 1e6
    n = scale.fbkv_n * 4
    for tb, protos in testbeds(scale, protocols, out / "dynamic"):
        fixprio = switch_for(protos[0]) == "static"
        for seed in seeds:
            for msr in msrs:
                job = make_job("fbkv", seed, n)
                q0 = queue_for_tlr(1 - msr)
                dur = 2.0 * job.total_bytes * 8 / rate + 1.0
                tlr_q = lambda q: (q + 0.5) / 8  # noqa: E731 - a TLR in the middle of queue q
                bg = _shifting_background(2, 1, bg_load * rate, dur, [tlr_q(q0), tlr_q(max(1, q0 - 1))])
                for proto in protos:
                    tr = _job_with_background(tb, scale, proto, job, msr, bg, q0 if fixprio else None,
                                              f"s{seed}-{msr}-{proto}")
                    rf.add(seed, {"msr": msr, "protocol": proto}, _job_summary(tr), _strip(tr))
                    rf.write()
    # Fig. 10 timeline: one run, MSR 0.5, background queue 4 -> 3 -> 2, each for a third of the
    # job's expected JCT (MSR * bytes over the bandwidth the background leaves).
    if "atp-full" in protocols:
        job = make_job("fbkv", seeds[0], n * 2)
        expected = 0.5 * job.total_bytes * 8 / (rate * (1 - bg_load))
        with Testbed(scale.testbed(controller=True), out / "dynamic" / "work-timeline") as tb:
            bg = _shifting_background(2, 1, bg_load * rate, 1.5 * expected + 0.3, [4.5 / 8, 3.5 / 8, 2.5 / 8])
            jid = next_job_id()
            tr = run_trial(tb, "atp-full", [JobPlan(jid, 0, 1, job, 0.5, delay_s=0.3)], name="timeline",
                           timeout=scale.timeout_s, background=bg)
            j = tr["jobs"][0]
            timeline = j.get("timeline") or []
            t0 = j.get("start_wall") or tr["start_wall"]
            shifts = [b.get("start_wall") for b in tr.get("background_tx", []) if b]
            rf.notes.append({"timeline_job": jid, "timeline": timeline, "controller_changes": tb.epochs,
                             "job_start_wall": t0, "background_starts_wall": shifts,
                             "background_tlrs": [b.tlr for b in bg], "job": {k: v for k, v in j.items() if k != "timeline"}})
            rows = _timeline_rows(timeline, tb.epochs, jid, t0)
            R.plot_timeline(rows, fields=[f for f in ("loss_avg10", "tlr", "rate_mbps", "queue") if any(f in r for r in rows)],
                            path=rf.out_dir / "timeline.png",
                            title="ATP, MSR 0.5, background q4 -> q3 -> q2 (cf. Fig. 10)",
                            events=[(w - t0, "bg shift") for w in shifts[1:] if w])
            rf.write()
    s = rf.to_dict()["summary"]
    R.plot_bars(s, metric="jct_mean_s", group="msr", series="protocol", path=rf.out_dir / "jct.png",
                title="Dynamic mechanisms, FBKV (cf. Fig. 11)", ylabel="JCT (s)")
    return rf


def _timeline_rows(timeline: Sequence[dict], changes: Sequence[dict], jid: int, t0_wall: float) -> list[dict]:
    """Normalise sender timeline records (hostlib EpochEnded: ``time`` is seconds since the job started)
    for plotting. The queue is the one most ACKs of the epoch echoed (the switch's stamp); when no ACK
    carried a stamp, it comes from the controller's decisions (wall clock, minus ``t0_wall``)."""
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
                row["rate_mbps"] = float(r[key]) / 1e6
        # the switch stamps the queue it chose into DATA; ACKs echo it (255: not stamped)
        seen = {int(q): c for q, c in (r.get("queues") or {}).items() if int(q) != 255}
        if seen:
            row["queue"] = max(seen, key=lambda q: (seen[q], -q))
        rows.append(row)
    # per-epoch loss is a ratio of a few packets; also give a moving average over 10 epochs
    window: list[float] = []
    for row in rows:
        if "loss" in row:
            window = (window + [float(row["loss"])])[-10:]
            row["loss_avg10"] = sum(window) / len(window)
    if rows and not any("queue" in r for r in rows):
        # queue assignments from the controller's decisions, as a step function
        q_changes = sorted((c["wall"] - t0_wall, c["assignments"].get(str(jid))) for c in changes
                           if str(jid) in c["assignments"])
        for row in rows:
            q = None
            for t, qq in q_changes:
                if t <= row["time"]:
                    q = qq
            if q is not None:
                row["queue"] = q
    return rows


# --------------------------------------------------------------------------------------------------
# 4. ATP technique ablation (Fig. 12)


def exp_ablation(seeds: Sequence[int], out: Path, scale: Scale, *, msrs=(0.5, 0.7, 0.9),
                 variants=("atp-base", "atp-rc", "atp-mrdf", "atp-fixprio", "atp-full"), bg_load: float = 0.5) -> R.ResultFile:
    rf = R.ResultFile("ablation", {"scale": dataclasses.asdict(scale), "msrs": list(msrs), "variants": list(variants),
                                   "bg_load": bg_load, "workload": "fbkv x 2",
                                   "variants_meaning": {"atp-base": "UDP at R_max, then repairs until MSR",
                                                        "atp-rc": "+ rate control, static TLR = 1 - MSR",
                                                        "atp-mrdf": "+ MRDF scheduling",
                                                        "atp-fixprio": "dynamic TLR, job pinned to its initial queue",
                                                        "atp-full": "dynamic TLR and dynamic queue (controller)"},
                                   "background": "paced UDP, APPROX, TLR in the job's initial queue"},
                      seeds, out / "ablation", expected=len(seeds) * len(msrs) * len(variants))
    rate = scale.rate_mbit * 1e6
    for tb, protos in testbeds(scale, variants, out / "ablation"):
        fixprio = switch_for(protos[0]) == "static"
        for seed in seeds:
            for msr in msrs:
                job = make_job("fbkv", seed, scale.fbkv_n * 2)
                q0 = queue_for_tlr(1 - msr)
                dur = 3.0 * job.total_bytes * 8 / rate + 1.0
                bg = [Background(2, 1, bg_load * rate, dur, tlr=(q0 + 0.5) / 8)]
                for v in protos:
                    tr = _job_with_background(tb, scale, v, job, msr, bg, q0 if fixprio else None, f"s{seed}-{msr}-{v}")
                    rf.add(seed, {"msr": msr, "protocol": v}, _job_summary(tr), _strip(tr))
                    rf.write()
    s = rf.to_dict()["summary"]
    R.plot_bars(s, metric="jct_mean_s", group="msr", series="protocol", path=rf.out_dir / "jct.png",
                title="ATP techniques, FBKV with background (cf. Fig. 12)", ylabel="JCT (s)")
    return rf


# --------------------------------------------------------------------------------------------------
# 5. co-running non-approximate traffic (Fig. 13)


COEXIST_JOB_SCALE = 5
"""coexist: each approximate job has this many times ``fbhd_n`` messages, so the approximate jobs last
about as long as the window of flows (~6 MB per job at the default scale)."""


def coexist_trial(tb: Testbed, scale: Scale, seed: int, protocol: str, msr: float, flow_load: float,
                  name: str, duration_s: float = 4.0, job_scale: int = COEXIST_JOB_SCALE) -> tuple[dict, dict]:
    """Two approximate FBHD jobs (hosts 0, 2) and web-search flows (host 3) for ``duration_s``, all into host 1."""
    rate = scale.rate_mbit * 1e6
    fl = web_search_flows(seed, load=flow_load, link_bps=rate, duration_s=duration_s, senders=[3], receivers=[1],
                          size_scale=scale.flow_size_scale)
    plans = [JobPlan(next_job_id(), h, 1, make_job("fbhd", seed * 100 + h, scale.fbhd_n * job_scale,
                                                   max_size=scale.fbhd_max), msr, delay_s=0.1) for h in (0, 2)]
    tr = run_trial(tb, protocol, plans, name=name, timeout=scale.timeout_s, flows=[FlowLoad(3, 1, tuple(fl))])
    return {**_job_summary(tr), **flow_fct_stats(tr["flows"])}, tr


def exp_coexist(seeds: Sequence[int], out: Path, scale: Scale, *, msrs=(0.5, 0.9), loads=(0.1, 0.3, 0.5),
                protocols=("atp", "tcp-es")) -> R.ResultFile:
    rf = R.ResultFile("coexist", {"scale": dataclasses.asdict(scale), "msrs": list(msrs), "flow_loads": list(loads),
                                  "protocols": list(protocols), "switches": {p: switch_for(p) for p in protocols},
                                  "pattern": "2 FBHD approximate jobs (hosts 0, 2; 5 x fbhd_n messages each) + "
                                             "4 s of web-search TCP flows (host 3), all into host 1"},
                      seeds, out / "coexist", expected=len(seeds) * len(msrs) * len(loads) * len(protocols))
    for tb, protos in testbeds(scale, protocols, out / "coexist"):
        for seed in seeds:
            for msr in msrs:
                for load in loads:
                    for proto in protos:
                        m, tr = coexist_trial(tb, scale, seed, proto, msr, load, f"s{seed}-{msr}-{load}-{proto}")
                        rf.add(seed, {"msr": msr, "flow_load": load, "protocol": proto}, m, _strip(tr))
                        rf.write()
    s = rf.to_dict()["summary"]
    for msr in msrs:
        R.plot_lines(s, metric="fct_all_mean", x="flow_load", series="protocol", fixed={"msr": msr},
                     path=rf.out_dir / f"fct_msr{msr}.png", title=f"Non-approx. FCT next to approx. jobs, MSR {msr} (cf. Fig. 13)",
                     xlabel="non-approximate load (fraction of link)", ylabel="mean FCT (s)")
    return rf


# --------------------------------------------------------------------------------------------------
# 6. job-level fairness (Fig. 14)


def exp_fairness(seeds: Sequence[int], out: Path, scale: Scale, *,
                 schemes=("alone", "atp-full", "atp-fixprio", "atp-fixtlr")) -> R.ResultFile:
    rf = R.ResultFile("fairness", {"scale": dataclasses.asdict(scale), "schemes": list(schemes),
                                   "jobs": "FBHD MSR 0.5 (host 0), FBHD MSR 0.75 (host 1), then FBKV MSR 0.875 "
                                           "(host 2, starts 0.5 s later), all into host 3"},
                      seeds, out / "fairness", expected=len(seeds) * len(schemes))
    for tb, protos in testbeds(scale, ["atp-full" if sc == "alone" else sc for sc in schemes], out / "fairness"):
        fixprio = switch_for(protos[0]) == "static"
        for seed in seeds:
            for scheme in [sc for sc in schemes if ("atp-full" if sc == "alone" else sc) in protos]:
                kv = JobPlan(next_job_id(), 2, 3, scale.job("fbkv", seed), 0.875, delay_s=0.5)
                plans = [kv] if scheme == "alone" else [
                    JobPlan(next_job_id(), 0, 3, make_job("fbhd", seed * 10 + 1, scale.fbhd_n * 2, max_size=scale.fbhd_max), 0.5),
                    JobPlan(next_job_id(), 1, 3, make_job("fbhd", seed * 10 + 2, scale.fbhd_n * 2, max_size=scale.fbhd_max), 0.75),
                    kv]
                if fixprio:
                    tb.pin_jobs([(p.job_id, queue_for_tlr(1 - p.msr)) for p in plans])
                proto = "atp-full" if scheme == "alone" else scheme
                tr = run_trial(tb, proto, plans, name=f"s{seed}-{scheme}", timeout=scale.timeout_s)
                kvm = next(j for j in tr["jobs"] if j["job_id"] == kv.job_id)
                rf.add(seed, {"scheme": scheme}, {"fbkv_jct_s": kvm["jct_s"], "fbkv_msr_met": kvm["msr_met"],
                                                  **_job_summary(tr)}, _strip(tr))
                rf.write()
    s = rf.to_dict()["summary"]
    R.plot_bars(s, metric="fbkv_jct_s", group="scheme", series="scheme", path=rf.out_dir / "fbkv_jct.png",
                title="FBKV JCT next to two FBHD jobs (cf. Fig. 14)", ylabel="FBKV JCT (s)")
    return rf


# --------------------------------------------------------------------------------------------------
# 7. DDNN ring-allreduce next to web-search flows, same vs low priority (thesis, papers/003 ch. 5)


def ddnn_trial(tb: Testbed, scale: Scale, seed: int, *, workers: int, model_bytes: int, compute_s: float,
               flow_load: float, duration_s: float, name: str) -> tuple[dict, dict]:
    from netapprox.experiments import ddnn
    from netapprox.experiments.harness import read_json
    rate = scale.rate_mbit * 1e6
    wd = tb.workdir / name
    if wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    peers = ",".join(tb.ip(h) for h in range(workers))
    src = workers  # the flow source host
    fl = web_search_flows(seed, load=flow_load, link_bps=rate, duration_s=duration_s, senders=[src],
                          receivers=list(range(workers)), size_scale=scale.flow_size_scale)
    by_dst: dict[int, list] = {}
    for f in fl:
        # the start of every flow is shifted by 1 s so that the ring is running when flows begin
        by_dst.setdefault(f.dst, []).append(dataclasses.replace(f, start_s=f.start_s + 1.0))
    servers = []
    for d in by_dst:
        ready = wd / f"fsrv{d}.ready"
        servers.append(tb.start_py(d, "netapprox.experiments.flows", ["server", f"{tb.ip(d)}:5800", "--duration",
                                                            str(duration_s + scale.timeout_s + 5), "--ready-file", str(ready)],
                                   f"{name}-fsrv{d}"))
        tb.wait_file(ready)
    procs = [tb.start_py(r, "netapprox.experiments.ddnn", ["worker", "--rank", str(r), "--peers", peers, "--model-bytes",
                                                 str(model_bytes), "--compute-s", str(compute_s), "--duration",
                                                 str(duration_s + 1.0), "--json", str(wd / f"w{r}.json")], f"{name}-w{r}")
             for r in range(workers)]
    clients = []
    for d, flows in by_dst.items():
        sched = wd / f"flows{d}.json"
        sched.write_text(json.dumps([dataclasses.asdict(f) for f in flows]))
        clients.append((tb.start_py(src, "netapprox.experiments.flows", ["client", f"{tb.ip(d)}:5800", "--schedule", str(sched),
                                                               "--timeout", str(scale.timeout_s), "--json", str(wd / f"fcli{d}.json")],
                                    f"{name}-fcli{d}"), wd / f"fcli{d}.json"))
    tb.wait_all(procs, duration_s + scale.timeout_s)
    tb.wait_all([c for c, _ in clients], scale.timeout_s + duration_s)
    for s_ in servers:
        tb.stop(s_)
    iters = []
    for r in range(workers):
        w = read_json(wd / f"w{r}.json") or {}
        iters += [it["iteration_s"] for it in w.get("iterations", [])[1:]]  # the first one warms up
    flows = [f for _, path in clients for f in (read_json(path) or {}).get("flows", [])]
    m = {"iteration_mean_s": float(np.mean(iters)) if iters else None, "iterations": len(iters),
         "network_time_s": ddnn.network_time_s(model_bytes, workers, rate), **flow_fct_stats(flows)}
    return m, {"iterations": iters, "flows": flows}


def exp_ddnn(seeds: Sequence[int], out: Path, scale: Scale, *, ratios=(2.0, 4.0), flow_loads=(0.05, 0.2),
             workers: int = 3, model_bytes: int = 400_000, duration_s: float = 8.0) -> R.ResultFile:
    from netapprox.experiments import ddnn
    from netapprox.controller.model import ClassRule
    rate = scale.rate_mbit * 1e6
    net = ddnn.network_time_s(model_bytes, workers, rate)
    rf = R.ResultFile("ddnn", {"scale": dataclasses.asdict(scale), "compute_to_network": list(ratios),
                               "flow_loads": list(flow_loads), "workers": workers, "model_bytes": model_bytes,
                               "network_time_s": net, "duration_s": duration_s,
                               "priorities": {"same": "ring traffic in queue 0 with the flows",
                                              "low": "ring traffic (TCP dport 5900) in queue 1 (7 packets)"},
                               "flows": "web-search TCP flows from an extra host to the workers"},
                      seeds, out / "ddnn", expected=len(seeds) * len(ratios) * len(flow_loads) * 3)
    low_rule = ClassRule(rank=10, ip_proto=6, ip_proto_mask=0xFF, l4_dport=ddnn.RING_PORT, l4_dport_mask=0xFFFF, qid=1)
    with Testbed(scale.testbed(hosts=workers + 1, controller=False), out / "ddnn" / "work") as tb:
        for seed in seeds:
            for ratio in ratios:
                for load in flow_loads:
                    for prio in ("same", "low"):
                        tb.pin_jobs([], class_rules=[low_rule] if prio == "low" else [])
                        m, raw = ddnn_trial(tb, scale, seed, workers=workers, model_bytes=model_bytes,
                                            compute_s=ratio * net, flow_load=load, duration_s=duration_s,
                                            name=f"s{seed}-{ratio}-{load}-{prio}")
                        rf.add(seed, {"ratio": ratio, "flow_load": load, "priority": prio}, m, raw)
                        rf.write()
    # relative change low vs same, per seed
    for seed in seeds:
        for ratio in ratios:
            for load in flow_loads:
                same = next((r for r in rf.runs if r["seed"] == seed and r["params"] == {"ratio": ratio, "flow_load": load, "priority": "same"}), None)
                low = next((r for r in rf.runs if r["seed"] == seed and r["params"] == {"ratio": ratio, "flow_load": load, "priority": "low"}), None)
                if not same or not low:
                    continue
                ch = {}
                for key in ("fct_small_mean", "fct_large_mean", "fct_all_mean", "iteration_mean_s"):
                    a, b = low["metrics"].get(key), same["metrics"].get(key)
                    ch[key + "_change_pct"] = (a - b) / b * 100 if a is not None and b else None
                rf.add(seed, {"ratio": ratio, "flow_load": load, "priority": "low-vs-same"}, ch)
    rf.write()
    s = rf.to_dict()["summary"]
    for key, label in (("fct_small_mean_change_pct", "small-flow FCT change (%)"),
                       ("fct_all_mean_change_pct", "all-flow FCT change (%)"),
                       ("iteration_mean_s_change_pct", "iteration time change (%)")):
        R.plot_lines(s, metric=key, x="flow_load", series="ratio", fixed={"priority": "low-vs-same"},
                     path=rf.out_dir / f"{key}.png", title=f"DNN at low priority: {label}",
                     xlabel="web-search load", ylabel=label)
    return rf


# --------------------------------------------------------------------------------------------------
# 8. bounded-loss ML: vector error against loss


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


def exp_boundedloss(seeds: Sequence[int], out: Path, scale: Scale, *, bounds=(0.10, 0.15, 0.35),
                    bg_loads=(0.0, 0.6, 0.9), vector_len: int = 100_000, network: bool = True,
                    offline_len: int = 1_000_000) -> R.ResultFile:
    """Part A (offline, no network): error of range-indexed vectors (``offline_len`` floats) against random
    packet loss. Part B (network): a gradient vector sent by ATP with MSR = 1 - bound next to approximate
    background in the same queue; measured loss, error of the received vector, and JCT. Part C (network,
    FIFO switch): the same-shaped job by ATP (MSR = 1 - bound) and by reliable TCP next to the same
    non-approximate background: TCP JCT / ATP JCT (the bounded-loss paper's speedup)."""
    from netapprox.hostlib import wire
    fpp = wire.floats_per_packet(1400 - wire.HEADER_LEN)
    rf = R.ResultFile("boundedloss", {"scale": dataclasses.asdict(scale), "bounds": list(bounds), "bg_loads": list(bg_loads),
                                      "vector_len": vector_len, "offline_len": offline_len, "floats_per_packet": fpp,
                                      "gradient": "Laplace(0, 1e-3) float32",
                                      "loss_bounds_source": "Xia et al. APNet'19 Table 3: RNN 0.10, MLP/CNN 0.15, MF 0.35"},
                      seeds, out / "boundedloss", expected=len(seeds) * (8 + (4 * len(bounds) * len(bg_loads) if network else 0)))
    for seed in seeds:
        vec = gradient_vector(seed, max(vector_len, offline_len))
        for loss in (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.35, 0.5):
            m = range_loss_error(vec, fpp, loss, seed)
            rf.add(seed, {"part": "offline", "loss": loss}, m)
    rf.write()
    if network:
        rate = scale.rate_mbit * 1e6
        wd = out / "boundedloss" / "work"
        with Testbed(scale.testbed(), wd) as tb:
            for seed in seeds:
                vec = gradient_vector(seed, vector_len)
                vfile = wd / f"vec{seed}.npy"
                vfile.parent.mkdir(parents=True, exist_ok=True)
                np.save(vfile, vec)
                for bound in bounds:
                    for load in bg_loads:
                        m, raw = vector_trial(tb, scale, vec, vfile, bound, load, rate, name=f"s{seed}-{bound}-{load}")
                        rf.add(seed, {"part": "network", "bound": bound, "bg_load": load}, m, raw)
                        rf.write()
        # Part C: bounded-loss ATP against reliable TCP with the same background, on a FIFO switch
        # (one queue, so both see the same congestion): a job shaped like the vector's packets.
        from netapprox.experiments.workloads import JobWorkload
        per = fpp * 4 + 8
        npk = math.ceil(vector_len / fpp)
        shaped = JobWorkload(kind="vector", seed=0, sizes=(per,) * npk, ready_s=(0.0,) * npk)
        with Testbed(scale.testbed(switch="fifo", controller=False), out / "boundedloss" / "work-fifo") as tb:
            for seed in seeds:
                for bound in bounds:
                    for load in bg_loads:
                        dur = 4.0 * shaped.total_bytes * 8 / rate + 1.0
                        bg = [Background(2, 1, load * rate, dur)] if load > 0 else []
                        for proto, msr in (("atp", round(1 - bound, 6)), ("tcp-es", 1.0)):
                            tr = run_trial(tb, proto, [JobPlan(next_job_id(), 0, 1, shaped, msr, delay_s=0.2)],
                                           name=f"s{seed}-{bound}-{load}-{proto}", timeout=scale.timeout_s, background=bg)
                            j = tr["jobs"][0]
                            rf.add(seed, {"part": "fifo", "bound": bound, "bg_load": load, "protocol": proto},
                                   {"jct_s": j["jct_s"], "msr_met": j["msr_met"], "msg_loss": j.get("msg_loss")}, _strip(tr))
                            rf.write()
        for seed in seeds:
            for bound in bounds:
                for load in bg_loads:
                    a = next((r for r in rf.runs if r["seed"] == seed and r["params"] == {"part": "fifo", "bound": bound, "bg_load": load, "protocol": "atp"}), None)
                    t = next((r for r in rf.runs if r["seed"] == seed and r["params"] == {"part": "fifo", "bound": bound, "bg_load": load, "protocol": "tcp-es"}), None)
                    if a and t and a["metrics"]["jct_s"] and t["metrics"]["jct_s"]:
                        rf.add(seed, {"part": "fifo-speedup", "bound": bound, "bg_load": load},
                               {"tcp_over_atp_jct": t["metrics"]["jct_s"] / a["metrics"]["jct_s"]})
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


def vector_trial(tb: Testbed, scale: Scale, vec: np.ndarray, vfile: Path, bound: float, load: float, rate: float,
                 name: str) -> tuple[dict, dict]:
    from netapprox.experiments.harness import read_json
    wd = tb.workdir / name
    if wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    jid = next_job_id()
    msr = round(1.0 - bound, 6)
    q0 = queue_for_tlr(bound)
    vec_dir = wd / "vectors"
    rx = tb.start_py(1, "netapprox.experiments.atp_job", ["recv", f"{tb.ip(1)}:7600", "--jobs", "1", "--timeout", str(scale.timeout_s),
                                               "--json", str(wd / "rx.json"), "--vector-out", str(vec_dir)], f"{name}-rx")
    tb.wait_bound(1, 7600)
    dur = 3.0 * vec.nbytes * 8 / rate + 1.0
    bg_procs = []
    if load > 0:
        bg_rx = tb.start_py(1, "netapprox.experiments.baselines", ["udp-recv", f"{tb.alias_ip(1)}:7600", "--timeout", str(dur + 20),
                                                         "--ready-file", str(wd / "bg.ready"), "--json", str(wd / "bgrx.json")], f"{name}-bgrx")
        tb.wait_file(wd / "bg.ready")
        bg_procs = [bg_rx, tb.start_py(2, "netapprox.experiments.baselines", ["udp-send", f"{tb.alias_ip(1)}:7600", "--rate", str(load * rate),
                                                                    "--duration", str(dur), "--n", "50", "--fixed-size", "1368",
                                                                    "--tlr", str((q0 + 0.5) / 8), "--job-id", "900100"], f"{name}-bgtx")]
        time.sleep(0.2)
    args = ["send-vector", f"{tb.ip(1)}:7600", "--vector", str(vfile), "--job-id", str(jid), "--msr", str(msr),
            "--rate", f"{rate / 1e6:g}M", "--json", str(wd / "tx.json")]
    if tb.controller is not None:
        args += ["--report-to", f"{tb.report_addr[0]}:{tb.report_addr[1]}"]
    tx = tb.start_py(0, "netapprox.experiments.atp_job", args, f"{name}-tx")
    tb.wait_all([tx], scale.timeout_s + 10)
    tb.wait_all([rx], 15)
    for p in bg_procs:
        tb.stop(p)
    txj, rxj = read_json(wd / "tx.json") or {}, read_json(wd / "rx.json") or {}
    got = None
    for j in rxj.get("jobs", []):
        if j.get("vector_file"):
            got = np.load(j["vector_file"])
    m: dict[str, Any] = {"jct_s": txj.get("jct_s"), "msr_met": txj.get("msr_met")}
    groups = txj.get("groups") or []
    if groups:
        m["msg_loss"] = sum(g.get("lost", 0) for g in groups) / max(1, sum(g.get("total", 0) for g in groups))
        m["within_bound"] = m["msg_loss"] <= bound + 1e-9
    if got is not None and got.shape == vec.shape:
        m["rel_l2_error"] = float(np.linalg.norm(vec - got) / np.linalg.norm(vec))
    else:
        m["rel_l2_error"] = None
        m["vector_missing"] = True
    return m, {"tx": txj, "rx": rxj}


# --------------------------------------------------------------------------------------------------

EXPERIMENTS: dict[str, Callable[..., R.ResultFile]] = {
    "alltoall": exp_alltoall,
    "incast": exp_incast,
    "dynamic": exp_dynamic,
    "ablation": exp_ablation,
    "coexist": exp_coexist,
    "fairness": exp_fairness,
    "boundedloss": exp_boundedloss,
    "ddnn": exp_ddnn,
}

QUICK: dict[str, dict[str, Any]] = {
    "alltoall": {"msrs": (0.5, 0.9), "workloads": ("fbkv",)},
    "incast": {"msrs": (0.5, 0.9)},
    "dynamic": {"msrs": (0.5,)},
    "ablation": {"msrs": (0.5, 0.9)},
    "coexist": {"msrs": (0.9,), "loads": (0.2,)},
    "fairness": {},
    "boundedloss": {"bounds": (0.15,), "bg_loads": (0.0, 0.8), "vector_len": 20_000},
    "ddnn": {"ratios": (2.0,), "flow_loads": (0.1,), "duration_s": 5.0},
}
