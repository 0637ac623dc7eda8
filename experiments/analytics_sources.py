"""Fig. 15 with several sources (docs/analytics.md, Several sources): ``python -m netapprox.experiments analytics
--figures fig15 --sources 3`` (the figure ``fig15-sources``; needs root).

The paper's Fig. 15 input: three Kafka brokers (§7.2: the lab cluster's three data sources) send the job's rows to
the Spark worker at once. Per seed, the 20,000 generated trips of Fig. 15 are split at random over ``S`` sources
(``analytics.sources.split``); source ``k`` on host ``SOURCE_HOSTS[k]`` sends its part to the worker, host 1, next
to the same web-search flows (host 2 into host 1, 30 % of the link): ``atp-s1`` (every source one live ATP
analytics job at its share of the bound, on NetApprox switches; the answer the one stratified estimate over every
source's stopping sample), ``tcp-es`` (every source its rows in order over its own TCP connection, stopped once the
planned number arrived) and ``tcp-ss`` (every source a seeded uniform sample of that many rows) on the FIFO switch,
side by side in one run. What TCP sends per source is what that source's ATP job needed over the simulated link
(``SourcesJob.run``). A trial's JCT runs from the first source's start to the last source's end; every source's
first stage records its strict-priority bound as the one-source rows do (``analytics_eval.stage_link``).
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from netapprox.analytics import link
from netapprox.analytics.job import LIVE_LOOKS, Query
from netapprox.analytics.sources import PAPER_SOURCES, SourcesJob, check_sources, split
from netapprox.experiments import analytics_eval as ae
from netapprox.hostlib.config import AtpConfig

PROTOCOLS = ("atp-s1", "atp-s12", "tcp-es", "tcp-ss")
TWO_STAGE = ("atp-s12", "tcp-es", "tcp-ss")
"""As in the one-source Fig. 15 (``analytics_eval.TWO_STAGE``): these trials run S2 too, the worker (the one map
task) sending its partial aggregates of every source's strata to the reducer once the last source ended."""
WORKER = 1
FLOW_HOST = 2


def source_hosts(sources: int) -> list[int]:
    """The sources' hosts: every host of the rack but the worker (1) and the flows' sender (2); the reducer is
    the next host (``reducer_host``)."""
    return [h for h in range(sources + 2) if h not in (WORKER, FLOW_HOST)]


def reducer_host(sources: int) -> int:
    return sources + 2


def s2_workload(job: SourcesJob, seed: int):
    """The map task's partial aggregates: one ``partials.PARTIAL`` message per stratum of every source's job."""
    from netapprox.analytics.partials import PARTIAL
    from netapprox.experiments.jobs import JobWorkload
    n = sum(len(j.strata) for j in job.jobs)
    return JobWorkload(kind="partials", seed=seed, sizes=(PARTIAL.size,) * n, ready_s=(0.0,) * n)


@dataclasses.dataclass
class SourcesPlan:
    seed: int
    e_max: float
    job: SourcesJob
    truth: float
    fractions: list[float]
    """Per source, the fraction of its rows its ATP job needed over the simulated link (TCP's MSR per source)."""
    sim: dict


def plan(seed: int, e_max: float, rows, sources: int, rate_bps: float) -> SourcesPlan:
    """The job over ``sources`` random parts and what each source needs (adaptive, each over its own simulated
    link at an equal share of the rate)."""
    q = Query("avg", e_max)
    job = SourcesJob(split(rows, sources, seed), [q], seed=seed)
    r = job.run(config=AtpConfig(surplus=False, max_rate_bps=rate_bps / sources),
                forward=lambda k: link.LossyPath(loss=ae.SIM_LOSS, rate_bps=rate_bps / sources, queue_packets=64,
                                                 seed=seed * 100 + k))
    a = r.result.answer("avg")
    truth = job.truth(q)
    return SourcesPlan(seed, e_max, job, truth, [s.received / s.total for s in r.sources],
                       {"rows": r.result.received, "jct_s": r.result.jct_s, "reported_error": a.error,
                        "measured_error": ae.relative_error(a.estimate.value, truth), "met": a.met})


def fig15_sources(seeds: Sequence[int], out: Path, progress: Callable[[str], None],
                  sources: int = PAPER_SOURCES) -> dict:
    """Fig. 15 with ``sources`` sources on the emulated testbed (needs root); one row per (seed, e_max,
    transport)."""
    from netapprox.experiments.emulated import EmulatedBackend, Scale
    from netapprox.experiments.plans import JobPlan, TrialPlan, switch_for
    from netapprox.experiments.workloads import web_search_flows
    check_sources(sources)
    scale = Scale(hosts=max(4, sources + 3))
    hosts = source_hosts(sources)
    plans = []
    for seed in seeds:
        data = ae.trips(ae.TRIPS, seed)
        for e in ae.E_MAXES:
            p = plan(seed, e, data, sources, scale.rate_bps)
            progress(f"fig15-sources seed {seed} e_max {e:g}: the sources need {[round(f, 3) for f in p.fractions]}"
                     f" of their rows (simulated: error {p.sim['measured_error']:.4f}, reported "
                     f"{p.sim['reported_error']:.4f})")
            plans.append(p)
    (out / "jobs").mkdir(parents=True, exist_ok=True)
    by_kind: dict[str, list] = {}
    for p in plans:
        jobs, total = [], 0.0
        for k, (job, f) in enumerate(zip(p.job.jobs, p.fractions)):
            wl = ae.workload(job, p.seed)
            msr = min(0.999, math.ceil(f * 1000) / 1000)
            job_file = out / "jobs" / f"s{p.seed}-e{p.e_max:g}-src{k}.job"
            job.save(job_file)
            total += wl.total_bytes * msr
            jobs.append((k, wl, msr, job_file))
        dur = 4.0 * total * 8 / scale.rate_bps + ae.FLOW_LEAD_S + scale.slack_s
        flows = tuple(web_search_flows(p.seed, load=ae.FLOW_LOAD, link_bps=scale.rate_bps, duration_s=dur,
                                       senders=[FLOW_HOST], receivers=[WORKER], size_scale=scale.flow_size_scale))
        for proto in PROTOCOLS:
            plan_jobs = tuple(JobPlan(1 + k, hosts[k], WORKER, wl, msr, start_s=ae.FLOW_LEAD_S,
                                      analytics=str(jf) if proto.startswith("atp") else None)
                              for k, wl, msr, jf in jobs)
            if proto in TWO_STAGE:
                plan_jobs += (JobPlan(sources + 1, WORKER, reducer_host(sources), s2_workload(p.job, p.seed), 1.0,
                                      after=tuple(range(1, sources + 1))),)
            tp = TrialPlan({"figure": "fig15-sources", "e_max": p.e_max, "sources": sources}, p.seed, proto,
                           plan_jobs, flows=flows, stop_with_jobs=True)
            kind = switch_for(proto)
            by_kind.setdefault(kind, []).append((p, dataclasses.replace(tp, switch=kind)))
    rows_out: list[dict] = []
    for kind, trials in by_kind.items():
        with EmulatedBackend(scale) as backend:
            for p, tp in trials:
                wd = out / "testbed-sources" / kind
                row = {"figure": "fig15-sources", "sources": sources, "seed": p.seed, "e_max": p.e_max,
                       "protocol": tp.protocol, "msr": [j.msr for j in tp.jobs], "sim": p.sim}
                try:
                    row.update(measure(p, tp, backend.run_trial(tp, wd), wd, scale.rate_bps))
                except Exception as exc:  # one broken trial is a row with its error
                    row["error"] = f"{type(exc).__name__}: {exc}"
                rows_out.append(row)
                progress(f"fig15-sources seed {p.seed} e_max {p.e_max:g} {tp.protocol}: JCT {row.get('jct_s')} s, "
                         f"error {row.get('measured_error')}" + (f" ERROR {row['error']}" if 'error' in row else ""))
    return {"sources": sources, "hosts": hosts, "rows": rows_out, "summary": summarize(rows_out)}


def _summary(wd: Path, tp, name: str) -> dict | None:
    cands = sorted(Path(wd).glob(f"**/{tp.name}/{name}"))
    return json.loads(cands[0].read_text()) if cands else None


def _delivered(p: SourcesPlan, tp, k: int, wd: Path, rx_jobs: list[dict]) -> tuple[list[int] | None, dict | None]:
    """Source ``k``'s delivered message ids (ATP: the sample of its stopping look) and its sender's summary."""
    from netapprox.experiments.baselines import sample_messages
    tx = _summary(wd, tp, f"tx{k + 1}.json")
    if isinstance(tx, dict) and isinstance(tx.get("jobs"), list) and tx["jobs"]:
        tx = tx["jobs"][0]
    if tx is None:
        return None, None
    n = len(p.job.jobs[k].rows)
    if tp.protocol.startswith("atp"):
        own = tx.get("analytics") or {}
        return (list(own["sample_ids"]) if own.get("sample_ids") is not None else None), tx
    rx = next((r for r in rx_jobs if r.get("job_id") == tx.get("job_id")), None)
    if rx is None:
        return None, tx
    if tp.protocol == "tcp-es":
        return list(range(min(n, int(rx.get("delivered") or 0)))), tx
    return sample_messages(n, tp.jobs[k].msr, int(rx["job_id"])), tx


def measure(p: SourcesPlan, tp, rec: dict, wd: Path, rate_bps: float) -> dict:
    """A trial's first stage (``s1_jct_s``: first source's start to the last source's end), its JCT (``jct_s``: to
    S2's end for the two-stage transports), rows, the combined estimate's error, and every source's JCT, losses and
    strict-priority bound."""
    rx_jobs = (_summary(wd, tp, f"rx{WORKER}.json") or {}).get("jobs", [])
    fl = _summary(wd, tp, "fcli0.json") or {}
    atp = tp.protocol.startswith("atp")
    samples, per_source = [], []
    for k, job in enumerate(rec["jobs"][:len(p.job.jobs)]):
        ids, tx = _delivered(p, tp, k, wd, rx_jobs)
        src: dict[str, Any] = {"jct_s": job.get("jct_s"), "start_wall": job.get("start_wall"),
                               "pkt_loss": job.get("pkt_loss"), "rows": len(ids) if ids is not None else None}
        if ids and fl.get("flows") and job.get("jct_s") and job.get("start_wall") and fl.get("start_wall"):
            wire = ae.wire_bytes(p.job.jobs[k], ids, (tx or {}).get("packets_acked", 0) if atp else None)
            src.update(ae.stage_link(wire, fl["flows"], job["start_wall"] - fl["start_wall"], job["jct_s"], rate_bps,
                                     atp))
        if atp and tx and tx.get("analytics"):
            a = tx["analytics"]
            src.update(looks=a.get("looks"), own_error=next(x["error"] for x in a["answers"] if x["group"] is None),
                       phases=a.get("phases"))
        per_source.append(src)
        samples.append(ae._received(p.job.jobs[k], ids or []))
    starts = [s["start_wall"] for s in per_source if s.get("start_wall")]
    ends = [s["start_wall"] + s["jct_s"] for s in per_source if s.get("start_wall") and s.get("jct_s") is not None]
    s1 = max(ends) - min(starts) if len(ends) == len(per_source) and starts else None
    row: dict[str, Any] = {"per_source": per_source, "s1_jct_s": s1, "jct_s": s1}
    if tp.protocol in TWO_STAGE:
        s2 = rec["jobs"][len(p.job.jobs)] if len(rec["jobs"]) > len(p.job.jobs) else {}
        done = s2["start_wall"] + s2["jct_s"] if s2.get("start_wall") and s2.get("jct_s") is not None else None
        row.update(s2_jct_s=s2.get("jct_s"), s2_msr_met=s2.get("msr_met"),
                   s2_wait_s=s2["start_wall"] - max(ends) if s2.get("start_wall") and s1 is not None else None,
                   jct_s=done - min(starts) if done and starts else None)
        if not s2.get("msr_met"):
            row["error"] = f"S2 did not deliver every partial aggregate: {s2.get('error') or s2}"
    if any(s.get("rows") is None for s in per_source):
        row["error"] = "a source's delivered rows are unknown"
        return row
    est = p.job.estimate(samples, looks=LIVE_LOOKS if atp else 1).answer("avg")
    row.update(rows=sum(s["rows"] for s in per_source), measured_error=ae.relative_error(est.estimate.value, p.truth),
               reported_error=est.error, met=est.met)
    wires = [s.get("job_wire_s") for s in per_source]
    if atp and s1 and fl.get("flows") and all(wires) and starts:
        # the sources share the link into the worker: the trial's bound carries every source's bytes and the
        # flows' from the first source's start (a source's own ``bound_s`` counts only its bytes)
        start = min(starts) - fl["start_wall"]
        row["bound_s"] = ae.strict_priority_bound(sum(wires) * rate_bps / 8, fl["flows"], start, rate_bps)
        row["s1_over_bound"] = s1 / row["bound_s"]
    return row


def summarize(rows: Sequence[dict]) -> dict:
    """Per e_max: mean JCT and first stage per transport; ATP-S1's first stage over each TCP's first stage
    (``atp_over_tcp_es``, the headline) and ATP-S1&2's whole job over each TCP's whole job (``atp_s12_over_tcp_es``),
    each the mean over seeds of the per-seed ratios, and per seed; the largest measured and reported error, the rows
    moved, ATP-S1's first stage over the trial's strict-priority bound (every source's bytes and the flows' from the
    first start) and that bound over TCP-ES's first stage per seed, and the sources' packet loss."""
    out: dict[str, Any] = {}

    def mean(v):
        return statistics.mean(v) if v else None

    for e in sorted({r["e_max"] for r in rows}):
        rs = [r for r in rows if r["e_max"] == e and not r.get("error")]
        s1, s12 = ae.tcp_ratios(rs, "atp-s1", "s1_jct_s", "s1_jct_s"), ae.tcp_ratios(rs, "atp-s12", "jct_s", "jct_s")
        by = {pr: [r for r in rs if r["protocol"] == pr] for pr in PROTOCOLS}
        out[f"{e:g}"] = {
            "jct_mean_s": {pr: mean([r["jct_s"] for r in v if r.get("jct_s")]) for pr, v in by.items()},
            "s1_jct_mean_s": {pr: mean([r["s1_jct_s"] for r in v if r.get("s1_jct_s")]) for pr, v in by.items()},
            "s2_jct_mean_s": {pr: mean([r["s2_jct_s"] for r in v if r.get("s2_jct_s") is not None])
                              for pr, v in by.items() if pr in TWO_STAGE},
            "atp_over_tcp_es": mean(s1["tcp-es"]), "atp_over_tcp_ss": mean(s1["tcp-ss"]),
            "atp_over_tcp_es_per_seed": s1["tcp-es"], "atp_over_tcp_ss_per_seed": s1["tcp-ss"],
            "atp_s12_over_tcp_es": mean(s12["tcp-es"]), "atp_s12_over_tcp_ss": mean(s12["tcp-ss"]),
            "atp_s12_over_tcp_es_per_seed": s12["tcp-es"], "atp_s12_over_tcp_ss_per_seed": s12["tcp-ss"],
            "error_max": {pr: max((r["measured_error"] for r in v), default=None) for pr, v in by.items()},
            "error_over_emax": {pr: (max((r["measured_error"] for r in v), default=0) / e if v else None)
                                for pr, v in by.items()},
            "reported_error_max": {pr: max((r["reported_error"] for r in v), default=None) for pr, v in by.items()},
            "rows_mean": {pr: mean([r["rows"] for r in v]) for pr, v in by.items()},
            "s1_over_bound": [r.get("s1_over_bound") for r in by["atp-s1"]],
            "bound_over_tcp_es_per_seed": [a["bound_s"] / b["s1_jct_s"] for a in by["atp-s1"] for b in by["tcp-es"]
                                           if a["seed"] == b["seed"] and a.get("bound_s") and b.get("s1_jct_s")],
            "pkt_loss_mean": {pr: mean([s["pkt_loss"] for r in v for s in r["per_source"]
                                        if s.get("pkt_loss") is not None]) for pr, v in by.items()},
            "trials_failed": sum(1 for r in rows if r["e_max"] == e and r.get("error")),
        }
    return out
