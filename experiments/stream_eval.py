"""The streaming evaluation (the paper's Fig. 17, window averages: goodput and error; docs/analytics.md, Fig. 17):
``python -m netapprox.experiments analytics --figures fig17``.

The stream: one day of generated TLC trips per seed (``analytics.tlc.generate``), in pickup order, cut into
time-based windows of one hour of pickups (the paper's one-minute windows of the real trace; the generated day's
hourly profile makes the windows' sizes change through the day). The window job is the Avg of the trip distance
within ``e_max`` at 95 %. Every window's MSR is planned before it starts, from the windows before it
(:class:`netapprox.analytics.stream.StreamPlanner`: its N from the arrival rates, its needed fraction from the
previous window's sample); the plan is made once per seed and ``e_max`` over the simulated link (the windows run
there one after another, each planned from what arrived of the ones before), and is every transport's MSR on the
testbed.

On the emulated rack at 20 Mbit/s, host 0 sends the windows of hours ``TESTBED_HOURS`` one after another to
host 1 (window ``k`` starts once window ``k - 1`` has had three times its line time) while web-search TCP flows
(non-approximate, 30 % of the link) go from host 2 into host 1, as Fig. 15: ``atp-s1`` (ATP, MRDF off) on
NetApprox switches, ``tcp-es`` (kernel TCP, the window's rows in order, stopped once the planned number arrived)
and ``tcp-ss`` (kernel TCP, a seeded uniform sample of that many) on a FIFO switch, side by side in one run.

Goodput: the windows' rows (the stream the answers stand for) over the time their jobs took, ``sum N_k / sum
JCT_k`` per seed; error: each window's estimate from the rows its transport delivered against the window's exact
average. Not built: ATP in Flink's processing stage (the paper's second NetApprox curve), the live MSR inside a
window on the testbed.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import statistics
from pathlib import Path
from typing import Callable, Sequence

from netapprox.analytics import stream
from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.job import AnalyticsJob, Query, Row
from netapprox.experiments import analytics_eval as A

E_MAXES = (0.05, 0.10)
STREAM_TRIPS = 48_000
"""Trips of the generated day (hourly windows of ~480 to ~3,000 rows)."""
WINDOW_S = 3600.0
TESTBED_HOURS = tuple(range(6, 18))
"""The windows run on the testbed: the morning ramp and the day (the plan runs over all 24)."""
PROTOCOLS = ("atp-s1", "tcp-es", "tcp-ss")
RUNS = tuple((p, p, None) for p in PROTOCOLS)
"""Fig. 17's transports: (label, protocol, switch; ``None``: the switch its users run, ``plans.switch_for``)."""
FIFO_CONTROL = (("atp-s1", "atp-s1", None), ("atp-s1-fifo", "atp-s1", "fifo"), ("tcp-es", "tcp-es", None))
"""``fig17-fifo``: ATP-S1 on the FIFO switch too, beside ATP-S1 on NetApprox switches and TCP-ES (which part of the
difference is the switches' queues, which the transport)."""
SPACING = 3.0
"""Window ``k + 1`` starts this many line times of window ``k``'s planned rows after it (plus ``GAP_S``)."""
GAP_S = 0.2


def stream_of(seed: int, trips: int = STREAM_TRIPS) -> tuple[list[Row], list[float]]:
    """One generated day of trips as rows in pickup order, and each one's pickup time (s from midnight)."""
    from netapprox.analytics import tlc
    table = tlc.generate(trips, seed=seed, days=1)
    rows = tlc.read_table_rows(table, group_by="none")
    dist = table.column("trip_distance").to_pylist()
    pickup = table.column("tpep_pickup_datetime").to_pylist()
    kept = [i for i, d in enumerate(dist) if d is not None and d > 0]  # read_table_rows skips the same trips
    if len(kept) != len(rows):
        raise AnalyticsError("generated trips and their rows disagree")
    midnight = dt.datetime.combine(pickup[kept[0]].date(), dt.time())
    timed = sorted(((pickup[i] - midnight).total_seconds(), j) for j, i in enumerate(kept))
    return [rows[j] for _, j in timed], [t for t, _ in timed]


@dataclasses.dataclass
class StreamPlan:
    seed: int
    e_max: float
    windows: list[stream.Window]
    answers: list[stream.WindowAnswer]
    """The plan's run over the simulated link: each window's plan (N estimated, MSR) and its answer there."""


def plan_stream(seed: int, e_max: float, rows: list[Row], times: list[float], rate_bps: float) -> StreamPlan:
    windows = stream.time_windows(rows, times, WINDOW_S, start=0.0)
    sizer = stream.WindowSizer("time", WINDOW_S, first=len(rows) / 24)
    answers = stream.run_windows(windows, Query("avg", e_max), stream.simulated(loss=A.SIM_LOSS, rate_bps=rate_bps,
                                                                                  seed=seed),
                                 sizer=sizer, seed=seed)
    return StreamPlan(seed, e_max, windows, answers)


def _jobs(p: StreamPlan, rate_bps: float):
    """The testbed's window jobs: (window, its AnalyticsJob, MSR, JobPlan)."""
    from netapprox.experiments.plans import JobPlan
    out = []
    t = A.FLOW_LEAD_S
    for k, hour in enumerate(TESTBED_HOURS):
        w, a = p.windows[hour], p.answers[hour]
        job = stream.window_job(w, Query("avg", p.e_max), seed=p.seed)
        msr = min(0.999, math.ceil(a.plan.msr * 1000) / 1000)
        wl = A.workload(job, p.seed)
        out.append((w, job, msr, JobPlan(k + 1, 0, 1, wl, msr, start_s=t)))
        t += SPACING * wl.total_bytes * msr * 8 / rate_bps + GAP_S
    return out, t


def fig17(seeds: Sequence[int], out: Path, progress: Callable[[str], None],
          e_maxes: Sequence[float] = E_MAXES, runs: Sequence[tuple] = RUNS, figure: str = "fig17") -> dict:
    """Fig. 17 on the emulated testbed (needs root): one row per (seed, e_max, transport, window); ``runs``:
    (label, protocol, switch) of each transport."""
    from netapprox.experiments.emulated import EmulatedBackend, Scale
    from netapprox.experiments.plans import TrialPlan, switch_for
    from netapprox.experiments.workloads import web_search_flows
    scale = Scale()
    by_kind: dict[str, list] = {}
    plans = []
    for seed in seeds:
        rows, times = stream_of(seed)
        for e in e_maxes:
            p = plan_stream(seed, e, rows, times, scale.rate_bps)
            plans.append(p)
            tb = [p.answers[h] for h in TESTBED_HOURS]
            progress(f"fig17 seed {seed} e_max {e:g}: planned MSR {min(a.plan.msr for a in tb):.3f}-"
                     f"{max(a.plan.msr for a in tb):.3f}, N estimated within "
                     f"{max(a.size_error for a in tb[1:]):.1%}; simulated link: {sum(a.met for a in tb)} of "
                     f"{len(tb)} windows within e_max")
            jobs, span = _jobs(p, scale.rate_bps)
            flows = tuple(web_search_flows(seed, load=A.FLOW_LOAD, link_bps=scale.rate_bps, duration_s=span + 1.0,
                                           senders=[2], receivers=[1], size_scale=scale.flow_size_scale))
            for label, proto, switch in runs:
                tp = TrialPlan({"figure": figure, "e_max": e, "run": label}, seed, proto, tuple(j[3] for j in jobs),
                               flows=flows, switch=switch or switch_for(proto), stop_with_jobs=True)
                by_kind.setdefault(tp.switch, []).append((p, jobs, tp, label))
    rows_out: list[dict] = []
    for kind, trials in by_kind.items():
        with EmulatedBackend(scale) as backend:
            for p, jobs, tp, label in trials:
                rows_out.extend(_run_trial(backend, p, jobs, tp, label, out / "testbed" / kind, progress))
    summary = summarize(rows_out)
    plot(summary, out / f"{figure}_goodput_error.png")
    return {"rows": rows_out, "plan": [_plan_rows(p) for p in plans], "summary": summary}


def _plan_rows(p: StreamPlan) -> dict:
    return {"seed": p.seed, "e_max": p.e_max, "windows": [a.as_dict() for a in p.answers]}


def fig17_fifo(seeds: Sequence[int], out: Path, progress: Callable[[str], None]) -> dict:
    """Fig. 17 at e_max 5 % with ATP-S1 on the FIFO switch as well (``FIFO_CONTROL``)."""
    return fig17(seeds, out, progress, e_maxes=(0.05,), runs=FIFO_CONTROL, figure="fig17-fifo")


def _run_trial(backend, p: StreamPlan, jobs, tp, label: str, wd: Path, progress) -> list[dict]:
    """One transport's windows on the testbed: a row per window with its JCT and the error of its estimate."""
    out = []
    try:
        rec = backend.run_trial(tp, wd)
    except Exception as exc:  # one broken trial: its windows are rows with the error
        return [{"figure": "fig17", "seed": p.seed, "e_max": p.e_max, "protocol": label, "window": w.index,
                 "error": f"{type(exc).__name__}: {exc}"} for w, *_ in jobs]
    rx_jobs = (_summary(wd, tp, "rx1.json") or {}).get("jobs", [])
    fl = _summary(wd, tp, "fcli0.json") or {}
    for (w, job, msr, jp), m in zip(jobs, rec["jobs"]):
        row = {"figure": "fig17", "seed": p.seed, "e_max": p.e_max, "protocol": label, "window": w.index,
               "rows": len(w.rows), "msr": msr, "jct_s": m.get("jct_s"), "msr_met": m.get("msr_met")}
        tx = _summary(wd, tp, f"tx{jp.job_id}.json") or {}
        if tp.protocol == "atp-s1":
            summ = tx
        else:
            summ = next((r for r in rx_jobs if r.get("job_id") == tx.get("job_id")), None)
            if summ is not None and tp.protocol == "tcp-ss":
                summ = {"job_id": tx.get("job_id")}
        ids = A.delivered_ids(tp.protocol, len(w.rows), msr, summ)
        if ids:
            a = job.estimate(A._received(job, ids)).answers[0]
            truth = job.truth(a.query)
            row.update(received=len(ids), measured_error=A.relative_error(a.estimate.value, truth),
                       reported_error=a.error)
            row.update(_window_link(job, ids, m, tx if tp.protocol == "atp-s1" else None, fl, tp.switch))
        out.append(row)
    s = summarize(out)
    for e, v in s.items():
        progress(f"fig17 seed {p.seed} e_max {e} {label}: goodput {v['goodput_rows_s'].get(label)} "
                 f"rows/s, error mean {v['error_mean'].get(label)}")
    return out


def _window_link(job: AnalyticsJob, ids, m: dict, tx: dict | None, fl: dict, switch: str) -> dict:
    """A window's use of the link into the receiver (``analytics_eval.stage_link``; ``tx``: ATP's sender summary,
    None for TCP), with the strict-priority bound where the window went below the flows (ATP, NetApprox switch)."""
    from netapprox.experiments.emulated import Scale
    if fl.get("flows") is None or not fl.get("start_wall") or not m.get("start_wall") or not m.get("jct_s"):
        return {}
    wire = A.wire_bytes(job, ids, tx.get("packets_acked", 0) if tx is not None else None)
    return A.stage_link(wire, fl["flows"], m["start_wall"] - fl["start_wall"], m["jct_s"], Scale().rate_bps,
                        tx is not None and switch == "netapprox")


def _summary(wd: Path, tp, name: str) -> dict | None:
    cands = sorted(Path(wd).glob(f"**/{tp.name}/{name}"))
    if not cands:
        return None
    d = json.loads(cands[0].read_text())
    if name.startswith("tx") and isinstance(d, dict) and isinstance(d.get("jobs"), list) and d["jobs"]:
        return d["jobs"][0]
    return d


def summarize(rows: Sequence[dict]) -> dict:
    """Per e_max: each transport's goodput (rows of the windows over the sum of their JCTs, mean over seeds), ATP's
    over each TCP's (mean of the per-seed ratios), and the measured error per window (mean, largest, share of
    windows within e_max); ATP's goodput were each window at its strict-priority bound, over TCP-ES's
    (``bound_goodput_over_tcp_es_per_seed``: the most a transport below the flows could reach), and ATP's goodput
    over that (``atp_over_bound_goodput``)."""
    out: dict = {}
    labels = list(dict.fromkeys(r["protocol"] for r in rows))
    for e in sorted({r["e_max"] for r in rows}):
        rs = [r for r in rows if r["e_max"] == e and not r.get("error")]
        seeds = sorted({r["seed"] for r in rs})
        good: dict[str, dict[int, float]] = {pr: {} for pr in labels}
        for pr in labels:
            for s in seeds:
                w = [r for r in rs if r["protocol"] == pr and r["seed"] == s]
                if w and all(r.get("jct_s") for r in w):
                    good[pr][s] = sum(r["rows"] for r in w) / sum(r["jct_s"] for r in w)
        bound = {s: sum(r["rows"] for r in w) / sum(r["bound_s"] for r in w)
                 for s in seeds if (w := [r for r in rs if r["protocol"] == "atp-s1" and r["seed"] == s])
                 and all(r.get("bound_s") for r in w)}
        atp = good.get("atp-s1", {})
        ratio = {b: [atp[s] / good[b][s] for s in seeds if s in atp and s in good.get(b, {})]
                 for b in labels if b != "atp-s1"}
        ratio.setdefault("tcp-es", [])
        ratio.setdefault("tcp-ss", [])
        err = {pr: [r["measured_error"] for r in rs if r["protocol"] == pr and r.get("measured_error") is not None]
               for pr in labels}
        out[f"{e:g}"] = {
            "goodput_rows_s": {pr: statistics.mean(v.values()) if v else None for pr, v in good.items()},
            "atp_over_tcp_es": statistics.mean(ratio["tcp-es"]) if ratio["tcp-es"] else None,
            "atp_over_tcp_ss": statistics.mean(ratio["tcp-ss"]) if ratio["tcp-ss"] else None,
            "atp_over_tcp_es_per_seed": ratio["tcp-es"], "atp_over_tcp_ss_per_seed": ratio["tcp-ss"],
            "atp_over": {b: statistics.mean(v) if v else None for b, v in ratio.items()},
            "error_mean": {pr: statistics.mean(v) if v else None for pr, v in err.items()},
            "error_max": {pr: max(v) if v else None for pr, v in err.items()},
            "within_e_max": {pr: sum(x <= e for x in v) / len(v) if v else None for pr, v in err.items()},
            "msr_mean": statistics.mean(r["msr"] for r in rs) if rs else None,
            "bound_goodput_over_tcp_es_per_seed": [bound[s] / good["tcp-es"][s] for s in seeds
                                                   if s in bound and s in good.get("tcp-es", {})],
            "atp_over_bound_goodput": statistics.mean(atp[s] / bound[s] for s in bound if s in atp) if bound else None,
        }
    return out


def plot(summary: dict, path: Path) -> None:
    """Fig. 17 as the paper draws it: per e_max, each transport's goodput (bars) and mean measured error (dots)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    err = ax.twinx()
    es = sorted(summary, key=float)
    labels = list(next(iter(summary.values()))["goodput_rows_s"]) if summary else []
    width = 0.8 / max(1, len(labels))
    for i, pr in enumerate(labels):
        xs = [k + (i - (len(labels) - 1) / 2) * width for k in range(len(es))]
        ax.bar(xs, [(summary[e]["goodput_rows_s"][pr] or 0) / 1000 for e in es], width, label=pr)
        err.plot(xs, [100 * (summary[e]["error_mean"][pr] or 0) for e in es], "s", color="black", markersize=4)
    ax.set_xticks(range(len(es)), [f"e_max {float(e):.0%}" for e in es])
    ax.set_ylabel("goodput (thousand rows/s)")
    err.set_ylabel("mean measured error (%), squares")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("Fig. 17: window averages on the emulated testbed (3 seeds)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


A.register("fig17", fig17)
A.register("fig17-fifo", fig17_fifo)
