"""The approximate-analytics evaluation (the paper's Fig. 15-16; docs/analytics.md, Evaluation):
``python -m netapprox.experiments analytics [--seeds 1 2 3] [--figures fig15 fig16] [--out results]``.

- **Fig. 15**: the average trip distance of generated TLC trips (``analytics.tlc.generate``, seeded) within
  ``e_max`` 1 / 2 / 5 / 10 %, on the emulated testbed next to background traffic as the paper's (web-search TCP
  flows, non-approximate, 30 % of the link into the job's receiver), all transports in one run. The job's rows (one
  trip record per message) go from host 0 to host 1 as ``atp-s1``, the analytics job itself (``atp_job send
  --analytics``: ``AnalyticsJob.send``, its MSR from the paper's heuristic following its running estimate until the
  bound holds, MRDF off), ``tcp-es`` (kernel TCP, in order, stopped once enough arrived) and ``tcp-ss`` (kernel TCP,
  a seeded uniform sample of that many rows), each on the switch its users run (ATP on NetApprox, TCP on FIFO).
  How many rows are enough for TCP (the paper's DCTCP-ES "only sends the exact amount") is what the same job needed
  run first over the simulated link in virtual time (``AnalyticsJob.run(adapt=True)``). ATP-S1's answer and error
  are its own (the sample of the look that stopped it; ``delivered_error``: every row the receiver got); a TCP's
  error is that of the estimate from the rows it delivered (TCP-ES: the first rows in send order; TCP-SS: its
  sample, drawn from the receiver's job id as the sender draws it) against the exact average.
- **Fig. 16**: two keys as per-key strata (trips from or to an airport, the rest: 5-10 % and 90-95 % of the rows),
  Avg within 5 % per key: the job with the keys as groups (a bound per key, the MSR per key) and without (one
  bound over all rows), over the simulated link; per key, the reported and the measured error.

- **Fig. 16 on the testbed** (``fig16-testbed``, needs root): the same jobs sent by the live ATP sender next to
  Fig. 15's flows; per key, the error of the answer read from the sample the job stopped at.

``atp-s12`` (ATP-S1&2) adds the map->reduce stage: once the first stage ended, host 1 (the map task) sends its
partial aggregates (one 36-byte message per stratum, ``analytics.partials``) to host 3 (the reduce task) over ATP at
MSR 1, and TCP-ES / TCP-SS send them over TCP; a job's JCT is then from its first stage's start to its last
partial at the reducer. The partials' bytes on the testbed are their sizes (the programs move workloads, not
Spark's values); the reducer's answer is computed from the rows the map task's host received, which is what its
partials carry when all of them arrive (each trial's S2 ``msr_met``; the Spark port moves the real partials).
``plot_fig15`` / ``plot_fig16`` draw the figures (``run`` writes them beside ``result.json``). ``FIGURES`` is the registry: a figure is a
function ``(seeds, out_dir, progress) -> dict``; the streaming evaluation adds ``fig17`` with :func:`register`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from netapprox.analytics import link
from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.job import AnalyticsJob, Query, Row
from netapprox.hostlib.config import AtpConfig

E_MAXES = (0.01, 0.02, 0.05, 0.10)
TRIPS = 20_000
FIG15_PROTOCOLS = ("atp-s1", "atp-s12", "tcp-es", "tcp-ss")
TWO_STAGE = ("atp-s12", "tcp-es", "tcp-ss")
"""Trials that run the job's second stage (S2) too: the map task on the first stage's receiver (host 1) sends its
partial aggregates to the reduce task (host 3) once the first stage ended, over the trial's transport (ATP-S1&2:
ATP at S2's MSR, every partial; TCP-ES / TCP-SS: TCP). ``atp-s1`` is the first stage alone (the paper's ATP-S1
moves S2 over TCP; here its column is the stage it changes, compared with the TCP trials' first stage)."""
S2_HOSTS = (1, 3)
FLOW_LOAD = 0.3
"""Background: web-search TCP flows (non-approximate) into the job's receiver at this share of the link, as the
paper's Fig. 15 runs next to production-like traffic (``make bench``'s coexist section's load)."""
FLOW_LEAD_S = 0.3
"""The job starts this long after the flows."""
FIG16_E_MAX = 0.05
FIG16_TRIPS = 20_000
SIM_LOSS = 0.01
"""Random loss of the simulated link the adaptive run sees (the testbed's background makes its own)."""

Figure = Callable[[Sequence[int], Path, Callable[[str], None]], dict]
FIGURES: dict[str, Figure] = {}


def register(name: str, fn: Figure) -> None:
    """Add a figure to ``python -m netapprox.experiments analytics`` (e.g. the streaming evaluation's ``fig17``)."""
    if name in FIGURES and FIGURES[name] is not fn:
        raise ValueError(f"analytics figure {name!r} is already registered")
    FIGURES[name] = fn


def trips(n: int, seed: int, *, key: str = "none") -> list[Row]:
    """``n`` generated TLC trips as rows (value: the distance; group: 0, or with ``key="airport"`` 1 for a trip from
    or to an airport); the row's bytes are the whole record as text."""
    from netapprox.analytics import tlc
    table = tlc.generate(n, seed=seed)
    rows = tlc.read_table_rows(table, group_by="none")
    if key == "none":
        return rows
    pu = table.column("PULocationID").to_pylist()
    do = table.column("DOLocationID").to_pylist()
    dist = table.column("trip_distance").to_pylist()
    kept = [i for i, d in enumerate(dist) if d is not None and d > 0]  # read_table_rows skips the same trips
    if len(kept) != len(rows):
        raise AnalyticsError("generated trips and their rows disagree")
    return [dataclasses.replace(r, group=int(pu[i] in tlc.AIRPORTS or do[i] in tlc.AIRPORTS))
            for r, i in zip(rows, kept)]


def relative_error(estimate: float, truth: float) -> float:
    return abs(estimate - truth) / abs(truth)


def _received(job: AnalyticsJob, ids: Sequence[int]) -> dict[int, bytes]:
    spec = job.job_spec(1.0)
    return {i: spec.messages[i].data for i in ids}


# --- Fig. 15 -----------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Fig15Job:
    seed: int
    e_max: float
    job: AnalyticsJob
    truth: float
    fraction: float
    """The fraction of rows the adaptive job needed (every transport's MSR on the testbed)."""
    sim: dict


def plan_fig15(seed: int, e_max: float, rows: list[Row], rate_bps: float) -> Fig15Job:
    """The analytics job and the fraction of its rows it needs (adaptive, over the simulated link)."""
    q = Query("avg", e_max)
    job = AnalyticsJob(rows, [q], seed=seed, max_payload=AtpConfig().max_payload)
    r = job.run(adapt=True, config=AtpConfig(surplus=False, max_rate_bps=rate_bps),
                forward=link.LossyPath(loss=SIM_LOSS, rate_bps=rate_bps, queue_packets=64, seed=seed))
    truth = job.truth(q)
    a = r.answer("avg")
    fraction = r.received / r.total
    return Fig15Job(seed, e_max, job, truth, fraction,
                    {"rows": r.received, "jct_s": r.jct_s, "reported_error": a.error,
                     "measured_error": relative_error(a.estimate.value, truth), "met": a.met})


def workload(job: AnalyticsJob, seed: int):
    from netapprox.experiments.jobs import JobWorkload
    sizes = tuple(len(m.data) for m in job.job_spec(1.0).messages)
    return JobWorkload(kind="tlc", seed=seed, sizes=sizes, ready_s=(0.0,) * len(sizes))


def s2_workload(job: AnalyticsJob, seed: int):
    """The map task's partial aggregates as a workload: one message of ``partials.PARTIAL.size`` bytes per stratum
    of the job (one map task: the first stage's one receiver)."""
    from netapprox.analytics.partials import PARTIAL
    from netapprox.experiments.jobs import JobWorkload
    n = len(job.strata)
    return JobWorkload(kind="partials", seed=seed, sizes=(PARTIAL.size,) * n, ready_s=(0.0,) * n)


def delivered_ids(protocol: str, n: int, msr: float, rx: dict | None) -> list[int] | None:
    """The message ids a transport delivered, from its summary (ATP: the sender's, whose ``lost_ids`` are every
    message not delivered; TCP: the receiver's; ``None`` when unknown)."""
    from netapprox.experiments.baselines import msr_target, sample_messages
    if rx is None:
        return None
    if protocol == "tcp-es":
        got = rx.get("delivered")
        return list(range(min(n, int(got)))) if got is not None else None
    if protocol == "tcp-ss":
        return sample_messages(n, msr, int(rx["job_id"])) if rx.get("job_id") is not None else None
    lost = _find(rx, "lost_ids")
    return None if lost is None else sorted(set(range(n)) - set(lost))


def _find(d: Any, key: str) -> Any:
    if isinstance(d, dict):
        if key in d:
            return d[key]
        d = list(d.values())
    if isinstance(d, list):
        for v in d:
            if (x := _find(v, key)) is not None:
                return x
    return None


def fig15(seeds: Sequence[int], out: Path, progress: Callable[[str], None]) -> dict:
    """Fig. 15 on the emulated testbed (needs root); one row per (seed, e_max, transport)."""
    from netapprox.experiments.emulated import EmulatedBackend, Scale
    from netapprox.experiments.plans import ATP_VARIANTS, JobPlan, TrialPlan, switch_for
    from netapprox.experiments.workloads import web_search_flows
    if "atp-s1" not in ATP_VARIANTS:
        raise RuntimeError("ATP variant atp-s1 is missing from experiments.plans.ATP_VARIANTS")
    scale = Scale()
    rows_out: list[dict] = []
    plans = []
    for seed in seeds:
        data = trips(TRIPS, seed)
        for e in E_MAXES:
            p = plan_fig15(seed, e, data, scale.rate_bps)
            progress(f"fig15 seed {seed} e_max {e:g}: the adaptive job needs {p.fraction:.3f} of the rows "
                     f"(simulated link: error {p.sim['measured_error']:.4f}, reported {p.sim['reported_error']:.4f})")
            plans.append(p)
    by_kind: dict[str, list] = {}
    (out / "jobs").mkdir(parents=True, exist_ok=True)
    for p in plans:
        wl = workload(p.job, p.seed)
        msr = min(0.999, math.ceil(p.fraction * 1000) / 1000)
        job_file = out / "jobs" / f"s{p.seed}-e{p.e_max:g}.job"
        p.job.save(job_file)
        dur = 4.0 * wl.total_bytes * msr * 8 / scale.rate_bps + FLOW_LEAD_S + scale.slack_s
        flows = tuple(web_search_flows(p.seed, load=FLOW_LOAD, link_bps=scale.rate_bps, duration_s=dur,
                                       senders=[2], receivers=[1], size_scale=scale.flow_size_scale))
        s2 = s2_workload(p.job, p.seed)
        for proto in FIG15_PROTOCOLS:
            params = {"figure": "fig15", "e_max": p.e_max}
            live = str(job_file) if proto in ("atp-s1", "atp-s12") else None
            jobs = (JobPlan(1, 0, 1, wl, msr, start_s=FLOW_LEAD_S, analytics=live),)
            if proto in TWO_STAGE:
                jobs += (JobPlan(2, S2_HOSTS[0], S2_HOSTS[1], s2, 1.0, after=1),)
            tp = TrialPlan(params, p.seed, proto, jobs, flows=flows, stop_with_jobs=True)
            kind = switch_for(proto)
            by_kind.setdefault(kind, []).append((p, msr, dataclasses.replace(tp, switch=kind)))
    for kind, trials in by_kind.items():
        with EmulatedBackend(scale) as backend:
            for p, msr, tp in trials:
                wd = out / "testbed" / kind
                row = {"figure": "fig15", "seed": p.seed, "e_max": p.e_max, "protocol": tp.protocol, "msr": msr,
                       "sim": p.sim}
                try:
                    row.update(_measure(p, tp, msr, backend.run_trial(tp, wd), wd, scale.rate_bps))
                except Exception as exc:  # one broken trial is a row with its error
                    row["error"] = f"{type(exc).__name__}: {exc}"
                rows_out.append(row)
                progress(f"fig15 seed {p.seed} e_max {p.e_max:g} {tp.protocol}: JCT {row.get('jct_s')} s, "
                         f"error {row.get('measured_error')}" + (f" ERROR {row['error']}" if 'error' in row else ""))
    return {"rows": rows_out, "summary": summarize_fig15(rows_out)}


TCP_WIRE = 1514 / 1448
"""Bytes on the wire per byte of a TCP stream (full segments, Ethernet, IP, TCP with timestamps)."""


def flow_bytes_during(flows: Sequence[dict], start_s: float, end_s: float) -> float:
    """Bytes on the wire the background flows carried between ``start_s`` and ``end_s`` (the flows' clock), each
    flow's bytes spread evenly over its measured FCT (``start_s``, ``fct_s``, ``size`` of the flow client's
    summary): exact for a flow alone above the job (strict priority), an average for one sharing a queue."""
    total = 0.0
    for f in flows:
        a, fct = f.get("start_s"), f.get("fct_s")
        if a is None or not fct or fct <= 0:
            continue
        overlap = min(end_s, a + fct) - max(start_s, a)
        if overlap > 0:
            total += f["size"] * TCP_WIRE * overlap / fct
    return total


def strict_priority_bound(job_bytes: float, flows: Sequence[dict], start_s: float, rate_bps: float) -> float:
    """The shortest first stage a job of ``job_bytes`` on the wire can have from ``start_s`` below the flows
    (strict priority, as the NetApprox switch places approximate traffic): the time ``t`` at which the link has
    carried the job and every flow byte carried meanwhile, ``t = (job_bytes + flows in [start_s, start_s + t]) /
    rate``, the fixed point from ``t = job_bytes / rate`` up."""
    t = job_bytes * 8 / rate_bps
    for _ in range(1000):
        nxt = (job_bytes + flow_bytes_during(flows, start_s, start_s + t)) * 8 / rate_bps
        if nxt - t < 1e-6:
            return nxt
        t = nxt
    return t


def wire_bytes(job: AnalyticsJob, ids: Sequence[int], packets: int | None) -> float:
    """Bytes on the wire of the rows ``ids`` of ``job``: over ATP (``packets`` data packets acknowledged) each row
    with its record header and each packet with its ATP header and ``AtpConfig.overhead_bytes``; over TCP
    (``packets`` None) the rows as one stream in full segments."""
    from netapprox.hostlib.wire import HEADER_LEN, RECORD_HEADER_LEN
    messages = job.job_spec(1.0).messages
    rows = sum(len(messages[i].data) for i in ids)
    if packets is None:
        return rows * TCP_WIRE
    return rows + RECORD_HEADER_LEN * len(ids) + (HEADER_LEN + AtpConfig().overhead_bytes) * packets


def stage_link(wire: float, flows: Sequence[dict], start_s: float, jct_s: float, rate_bps: float,
               below_flows: bool) -> dict:
    """How a stage of ``wire`` bytes that ran ``jct_s`` from ``start_s`` (the flows' clock) used the link into its
    receiver: alone at the link rate (``job_wire_s``), the flows' bytes carried meanwhile (``flows_s``), their sum
    over the stage's time (``link_use``); ``below_flows`` (ATP on the NetApprox switch), the strict-priority bound
    (:func:`strict_priority_bound`) and the stage's time over it (``s1_over_bound``: 1 is every byte the flows
    left taken)."""
    carried = flow_bytes_during(flows, start_s, start_s + jct_s)
    out = {"job_wire_s": wire * 8 / rate_bps, "flows_s": carried * 8 / rate_bps,
           "link_use": (wire + carried) * 8 / rate_bps / jct_s}
    if below_flows:
        bound = strict_priority_bound(wire, flows, start_s, rate_bps)
        out.update(bound_s=bound, s1_over_bound=jct_s / bound)
    return out


def link_use(p: Fig15Job, tp, rec: dict, wd: Path, ids: Sequence[int] | None, tx: dict | None,
             rate_bps: float) -> dict:
    """:func:`stage_link` of a Fig. 15 trial's first stage (``tx``: ATP's sender summary, None for TCP)."""
    fl = _read_summary(wd, tp, "fcli0.json") or {}
    flows, job = fl.get("flows"), rec["jobs"][0]
    if not ids or flows is None or not job.get("jct_s") or not job.get("start_wall") or not fl.get("start_wall"):
        return {}
    atp = tx is not None
    wire = wire_bytes(p.job, ids, tx.get("packets_acked", 0) if atp else None)
    start = job["start_wall"] - fl["start_wall"]
    return {**stage_link(wire, flows, start, job["jct_s"], rate_bps, atp), "stage_start_s": start,
            "flow_fct_s": {str(f["id"]): [f["start_s"], f["fct_s"]] for f in flows
                           if f.get("fct_s") and f.get("id") is not None}}


def flows_next_to_atp(rs: Sequence[dict]) -> list[float]:
    """Per seed, the mean FCT of the flows that started during ATP-S1's first stage, next to ATP-S1 (NetApprox
    switch) over the same flows' next to TCP-ES (FIFO switch): what the flows gain or lose from the job's transport
    and its switch (the same seeded flows in both trials; the other side of the JCT ratio)."""
    out = []
    for seed in sorted({r["seed"] for r in rs}):
        a = next((r for r in rs if r["seed"] == seed and r["protocol"] == "atp-s1" and r.get("flow_fct_s")), None)
        b = next((r for r in rs if r["seed"] == seed and r["protocol"] == "tcp-es" and r.get("flow_fct_s")), None)
        if a is None or b is None:
            continue
        end = a["stage_start_s"] + a["s1_jct_s"]
        ids = [i for i, (st, _) in a["flow_fct_s"].items() if a["stage_start_s"] <= st <= end and i in b["flow_fct_s"]]
        if ids:
            out.append(statistics.mean(a["flow_fct_s"][i][1] for i in ids)
                       / statistics.mean(b["flow_fct_s"][i][1] for i in ids))
    return out


def _measure(p: Fig15Job, tp, msr: float, rec: dict, wd: Path, rate_bps: float) -> dict:
    """A Fig. 15 trial's JCT, rows and errors. ATP-S1's answer is the job's own (the sample of the look that
    stopped it, from its sender's summary); ``delivered_error`` is that of every row the receiver got. A TCP's is
    the estimate from the rows it delivered."""
    job = rec["jobs"][0]
    atp = tp.protocol in ("atp-s1", "atp-s12")
    rx = _read_summary(wd, tp, "tx1.json" if atp else "rx1.json")
    ids = delivered_ids("atp" if atp else tp.protocol, len(p.job.rows), msr, rx)
    row: dict[str, Any] = {"jct_s": job.get("jct_s"), "s1_jct_s": job.get("jct_s"), "msr_met": job.get("msr_met")}
    if tp.protocol in TWO_STAGE:
        s2 = rec["jobs"][1] if len(rec["jobs"]) > 1 else {}
        done = (s2.get("start_wall") or 0) + (s2.get("jct_s") or 0) if s2.get("jct_s") is not None else None
        row.update(s2_jct_s=s2.get("jct_s"), s2_msr_met=s2.get("msr_met"),
                   s2_wait_s=(s2["start_wall"] - job["start_wall"] - job["jct_s"])
                   if s2.get("start_wall") and job.get("start_wall") and job.get("jct_s") else None,
                   jct_s=(done - job["start_wall"]) if done and job.get("start_wall") else None)
        if not s2.get("msr_met"):
            row["error"] = f"S2 did not deliver every partial aggregate: {s2.get('error') or s2}"
    if ids:
        row.update(link_use(p, tp, rec, wd, ids, rx if atp else None, rate_bps))
        from netapprox.analytics.job import LIVE_LOOKS
        looks = LIVE_LOOKS if atp else 1
        est = p.job.estimate(_received(p.job, ids), looks=looks).answer("avg")
        row.update(rows=len(ids), measured_error=relative_error(est.estimate.value, p.truth),
                   reported_error=est.error)
    own = (rx or {}).get("analytics")
    if tp.protocol == "atp-s1" and own:
        a = next(x for x in own["answers"] if x["group"] is None)
        row.update(delivered_rows=row.get("rows"), delivered_error=row.get("measured_error"), rows=own["received"],
                   measured_error=relative_error(a["estimate"]["estimate"], p.truth), reported_error=a["error"],
                   met=a["met"], looks=own["looks"], final_msr=own["msr"], phases=own.get("phases"))
    return row


def _read_summary(wd: Path, tp, name: str) -> dict | None:
    """A trial's summary file (the ATP sender's holds ``lost_ids``; a TCP receiver's its count and job id)."""
    path = Path(wd) / f"work-{tp.switch_kind}" / tp.name / name
    if not path.exists():
        cands = sorted(Path(wd).glob(f"**/{tp.name}/{name}"))
        if not cands:
            return None
        path = cands[0]
    d = json.loads(path.read_text())
    jobs = d.get("jobs") if isinstance(d, dict) else None
    return jobs[0] if isinstance(jobs, list) and jobs else d


def tcp_ratios(rs: Sequence[dict], num: str, key_num: str, key_den: str) -> dict[str, list[float]]:
    """Per seed of ``rs``, ``num``'s ``key_num`` over each TCP's (``tcp-es``, ``tcp-ss``) ``key_den`` of the same
    seed (a seed missing either side adds nothing)."""
    r: dict[str, list[float]] = {"tcp-es": [], "tcp-ss": []}
    for seed in sorted({x["seed"] for x in rs}):
        a = [x[key_num] for x in rs if x["seed"] == seed and x["protocol"] == num and x.get(key_num)]
        for base in r:
            b = [x[key_den] for x in rs if x["seed"] == seed and x["protocol"] == base and x.get(key_den)]
            if a and b:
                r[base].append(a[0] / b[0])
    return r


def summarize_fig15(rows: Sequence[dict]) -> dict:
    """Per e_max: mean JCT per transport (the whole job: ATP-S1's is its one stage), the first stage's mean JCT,
    ATP-S1&2's JCT over each TCP's (``atp_s12_over_tcp_es`` / ``_ss``, whole jobs) and ATP-S1's first stage over
    each TCP's first stage (``atp_over_tcp_es`` / ``_ss``), each the mean over seeds of the per-seed ratios, and
    the largest measured error over e_max; how the first stage used the link (``link_use_mean``) and ATP's first
    stage over its strict-priority bound (``s1_over_bound_mean``; :func:`link_use`), and that bound over TCP-ES's
    first stage (``bound_over_tcp_es``: the fastest a first stage below the flows could be, against TCP-ES); and
    the flows' side, :func:`flows_next_to_atp` per seed."""
    out: dict[str, Any] = {}

    def mean(v):
        return statistics.mean(v) if v else None

    for e in sorted({r["e_max"] for r in rows}):
        rs = [r for r in rows if r["e_max"] == e and not r.get("error")]
        protos = [pr for pr in FIG15_PROTOCOLS if any(r["protocol"] == pr for r in rows)]
        err = {pr: [r["measured_error"] for r in rs if r["protocol"] == pr and r.get("measured_error") is not None]
               for pr in protos}
        s1 = tcp_ratios(rs, "atp-s1", "s1_jct_s", "s1_jct_s")
        s12 = tcp_ratios(rs, "atp-s12", "jct_s", "jct_s")
        bound = tcp_ratios(rs, "atp-s1", "bound_s", "s1_jct_s")
        out[f"{e:g}"] = {
            "jct_mean_s": {pr: mean([r["jct_s"] for r in rs if r["protocol"] == pr and r.get("jct_s") is not None])
                           for pr in protos},
            "s1_jct_mean_s": {pr: mean([r["s1_jct_s"] for r in rs if r["protocol"] == pr
                                        and r.get("s1_jct_s") is not None]) for pr in protos},
            "s2_jct_mean_s": {pr: mean([r["s2_jct_s"] for r in rs if r["protocol"] == pr
                                        and r.get("s2_jct_s") is not None]) for pr in protos if pr in TWO_STAGE},
            "atp_over_tcp_es": mean(s1["tcp-es"]), "atp_over_tcp_ss": mean(s1["tcp-ss"]),
            "atp_over_tcp_es_per_seed": s1["tcp-es"], "atp_over_tcp_ss_per_seed": s1["tcp-ss"],
            "atp_s12_over_tcp_es": mean(s12["tcp-es"]), "atp_s12_over_tcp_ss": mean(s12["tcp-ss"]),
            "atp_s12_over_tcp_es_per_seed": s12["tcp-es"], "atp_s12_over_tcp_ss_per_seed": s12["tcp-ss"],
            "error_max": {pr: max(v) if v else None for pr, v in err.items()},
            "error_over_emax": {pr: max(v) / e if v else None for pr, v in err.items()},
            "fraction": mean([r["msr"] for r in rs if r["protocol"] == "atp-s1"]),
            "rows_mean": {pr: mean([r["rows"] for r in rs if r["protocol"] == pr and r.get("rows") is not None])
                          for pr in protos},
            "trials_failed": sum(1 for r in rows if r["e_max"] == e and r.get("error")),
            "link_use_mean": {pr: mean([r["link_use"] for r in rs if r["protocol"] == pr and r.get("link_use")])
                              for pr in protos},
            "s1_over_bound_mean": {pr: mean([r["s1_over_bound"] for r in rs if r["protocol"] == pr
                                             and r.get("s1_over_bound")]) for pr in protos if pr.startswith("atp")},
            "bound_over_tcp_es": mean(bound["tcp-es"]), "bound_over_tcp_es_per_seed": bound["tcp-es"],
            "flows_fct_next_to_atp_over_tcp_es_per_seed": flows_next_to_atp(rs),
        }
    return out


# --- plots ---------------------------------------------------------------------------------------------------------

def plot_fig15(summary: dict, path: Path) -> Path:
    """Fig. 15 as the paper draws it: per e_max, each transport's mean JCT (circles) and largest measured error
    (squares, with e_max itself dashed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    es = sorted(summary, key=float)
    x = [100 * float(e) for e in es]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    for pr in FIG15_PROTOCOLS:
        a.plot(x, [summary[e]["jct_mean_s"].get(pr) for e in es], "o-", label=pr)
        b.plot(x, [100 * (summary[e]["error_max"].get(pr) or math.nan) for e in es], "s-", label=pr)
    b.plot(x, x, "k--", label="e_max")
    a.set(xlabel="e_max (%)", ylabel="mean JCT (s)", title="Fig. 15: JCT")
    b.set(xlabel="e_max (%)", ylabel="largest measured error (%)", title="Fig. 15: error")
    a.legend(), b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_fig16(rows: Sequence[dict], path: Path) -> Path:
    """Fig. 16: per key and seed, the reported error with the keys as groups and without, against e_max."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    seeds = sorted({r["seed"] for r in rows})
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    labels = []
    for i, (key, grouped) in enumerate((k, g) for k in ("other", "airport") for g in (True, False)):
        vals = [next((100 * r["reported_error"] for r in rows if r["seed"] == s and r["key"] == key
                      and r["groups"] == grouped), math.nan) for s in seeds]
        ax.bar([i + 0.8 * j / len(seeds) - 0.3 for j in range(len(seeds))], vals, width=0.8 / len(seeds),
               color="C0" if grouped else "C3")
        labels.append(f"{key}\n{'groups' if grouped else 'no groups'}")
    ax.axhline(100 * FIG16_E_MAX, color="k", ls="--", label="e_max")
    ax.set_xticks(range(len(labels)), labels)
    ax.set(ylabel="reported error (%)", title=f"Fig. 16: per key, seeds {', '.join(map(str, seeds))}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --- Fig. 16 -----------------------------------------------------------------------------------------------------

def fig16(seeds: Sequence[int], out: Path, progress: Callable[[str], None]) -> dict:
    """Fig. 16 over the simulated link: per key, the error with the keys as groups and without."""
    rows_out = []
    for seed in seeds:
        data = trips(FIG16_TRIPS, seed, key="airport")
        for grouped in (True, False):
            job, q = fig16_job(data, seed, grouped)
            spec = job.job_spec()
            live = job.live_msr(spec)
            t = link.run(spec, job.config(AtpConfig(surplus=False, max_rate_bps=20e6)),
                         forward=link.LossyPath(loss=SIM_LOSS, rate_bps=20e6, queue_packets=64, seed=seed),
                         on_step=live.step)
            sample = live.stopped_at if live.stopped_at is not None else t.received
            rows_out += fig16_rows(seed, job, q, grouped, sample, live.result(t.received), progress)
    return {"rows": rows_out, "summary": summarize_fig16(rows_out)}


def fig16_job(data: list[Row], seed: int, grouped: bool) -> tuple[AnalyticsJob, Query]:
    q = Query("avg", FIG16_E_MAX, per_group=grouped)
    return AnalyticsJob(data, [q], seed=seed), q


def fig16_rows(seed: int, job: AnalyticsJob, q: Query, grouped: bool, sample: dict[int, bytes], r, progress,
               where: str = "sim") -> list[dict]:
    """One job's Fig. 16 rows, per key: with groups, the job's answer for the key; without, the key's rows of the
    job's ``sample`` as a simple random sample of the key."""
    out = []
    for key in job.groups:
        truth = job.truth(q, key)
        if grouped:
            a = r.answer("avg", key)
            est, rep = a.estimate.value, a.error
        else:
            est, rep = _key_estimate(job, sample, key)
        row = {"figure": "fig16", "where": where, "seed": seed, "groups": grouped, "key": "airport" if key else "other",
               "rows_of_key": sum(1 for x in job.rows if x.group == key), "e_max": FIG16_E_MAX,
               "estimate": est, "truth": truth, "measured_error": relative_error(est, truth),
               "reported_error": rep, "rows_arrived": r.received, "met": rep <= FIG16_E_MAX}
        out.append(row)
        progress(f"fig16 ({where}) seed {seed} {'with' if grouped else 'without'} groups, key {row['key']}: "
                 f"error {row['measured_error']:.4f} (reported {rep:.4f}), {r.received} rows")
    return out


def summarize_fig16(rows: Sequence[dict]) -> dict:
    summary = {}
    for grouped in (True, False):
        rs = [r for r in rows if r["groups"] == grouped]
        summary["with_groups" if grouped else "without_groups"] = {
            k: {"measured_error_max": max(r["measured_error"] for r in rs if r["key"] == k),
                "reported_error_max": max(r["reported_error"] for r in rs if r["key"] == k),
                "met_all_seeds": all(r["met"] for r in rs if r["key"] == k)} for k in ("other", "airport")}
    return summary


def fig16_testbed(seeds: Sequence[int], out: Path, progress: Callable[[str], None]) -> dict:
    """Fig. 16 on the emulated testbed (needs root): the jobs of :func:`fig16`, sent by the live ATP sender
    (``atp-s1``) next to Fig. 15's web-search flows; per key the error of the answer read from the sample the job
    stopped at (the sender's ``sample_ids``)."""
    from netapprox.analytics.job import LIVE_LOOKS
    from netapprox.experiments.emulated import EmulatedBackend, Scale
    from netapprox.experiments.plans import JobPlan, TrialPlan
    from netapprox.experiments.workloads import web_search_flows
    scale = Scale()
    rows_out: list[dict] = []
    (out / "jobs").mkdir(parents=True, exist_ok=True)
    with EmulatedBackend(scale) as backend:
        for seed in seeds:
            data = trips(FIG16_TRIPS, seed, key="airport")
            for grouped in (True, False):
                job, q = fig16_job(data, seed, grouped)
                job_file = out / "jobs" / f"fig16-s{seed}-{'groups' if grouped else 'nogroups'}.job"
                job.save(job_file)
                wl = workload(job, seed)
                dur = 4.0 * wl.total_bytes * 0.2 * 8 / scale.rate_bps + FLOW_LEAD_S + scale.slack_s
                flows = tuple(web_search_flows(seed, load=FLOW_LOAD, link_bps=scale.rate_bps, duration_s=dur,
                                               senders=[2], receivers=[1], size_scale=scale.flow_size_scale))
                tp = TrialPlan({"figure": "fig16", "groups": grouped}, seed, "atp-s1",
                               (JobPlan(1, 0, 1, wl, 0.2, start_s=FLOW_LEAD_S, analytics=str(job_file)),), flows=flows,
                               stop_with_jobs=True)
                wd = out / "testbed" / "fig16"
                try:
                    backend.run_trial(tp, wd)
                    tx = _read_summary(wd, tp, "tx1.json")
                    sample = _received(job, tx["analytics"]["sample_ids"])
                    r = job.estimate(sample, looks=LIVE_LOOKS)
                    rows_out += fig16_rows(seed, job, q, grouped, sample, r, progress, where="testbed")
                except Exception as exc:  # one broken trial is a row with its error
                    rows_out.append({"figure": "fig16", "where": "testbed", "seed": seed, "groups": grouped,
                                     "error": f"{type(exc).__name__}: {exc}"})
                    progress(f"fig16 (testbed) seed {seed}: ERROR {rows_out[-1]['error']}")
    good = [r for r in rows_out if "error" not in r]
    return {"rows": rows_out, "summary": summarize_fig16(good) if good else {}}


def _key_estimate(job: AnalyticsJob, sample: dict[int, bytes], key: int) -> tuple[float, float]:
    """The key's mean and relative error (95 %) from the rows of the key in a job's sample, as a simple random
    sample of the key's rows: what a user of a job without groups could say about one key."""
    from netapprox.analytics.estimators import Stratum, avg
    values = tuple(v.value for v in (Row.decode(d) for d in sample.values()) if v.group == key)
    n_key = sum(1 for r in job.rows if r.group == key)
    if len(values) < 2:
        return (values[0] if values else math.nan), math.inf
    e = avg([Stratum(n_key, values)])
    return e.value, e.relative_error


# --- the command ---------------------------------------------------------------------------------------------------

register("fig15", fig15)
register("fig16", fig16)
register("fig16-testbed", fig16_testbed)


def run(figures: Sequence[str], seeds: Sequence[int], out: Path, progress: Callable[[str], None] = print,
        sources: int = 1) -> dict:
    """Run ``figures`` and write ``out/analytics/result.json``. ``sources`` > 1: ``fig15`` is the job's input
    split over that many sources (``fig15-sources``, experiments/analytics_sources.py; 1: one source, as ever)."""
    from netapprox.analytics.sources import check_sources
    check_sources(sources)
    unknown = [f for f in figures if f not in FIGURES]
    if unknown:
        raise AnalyticsError(f"unknown analytics figure {unknown[0]!r}: one of {', '.join(FIGURES)}")
    if sources > 1:
        from netapprox.experiments.analytics_sources import fig15_sources
        res = {("fig15-sources" if name == "fig15" else name):
               (fig15_sources(seeds, out / "analytics", progress, sources) if name == "fig15"
                else FIGURES[name](seeds, out / "analytics", progress)) for name in figures}
    else:
        res = {name: FIGURES[name](seeds, out / "analytics", progress) for name in figures}
    (out / "analytics").mkdir(parents=True, exist_ok=True)
    if "fig15" in res:
        plot_fig15(res["fig15"]["summary"], out / "analytics" / "fig15.png")
    for name in ("fig16", "fig16-testbed"):
        rows = [r for r in res.get(name, {}).get("rows", []) if "error" not in r]
        if rows:
            plot_fig16(rows, out / "analytics" / f"{name}.png")
    (out / "analytics" / "result.json").write_text(json.dumps({"seeds": list(seeds), **res}, indent=1,
                                                              default=str) + "\n")
    return res


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m netapprox.experiments analytics",
                                description="The analytics evaluation (Fig. 15-17; docs/analytics.md).")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--figures", nargs="+", default=list(FIGURES))
    p.add_argument("--out", type=Path, default=Path("results"))
    p.add_argument("--sources", type=int, default=1,
                   help="fig15's input split over this many sources sending to the worker at once (the paper's "
                        "three Kafka brokers: 3); 1: one source")
    args = p.parse_args(argv)
    try:
        res = run(args.figures, args.seeds, args.out, sources=args.sources)
    except AnalyticsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({k: v.get("summary") for k, v in res.items()}, indent=1, default=str))
    return 0


from netapprox.experiments import stream_eval  # noqa: E402,F401  (registers fig17, the streaming evaluation)
