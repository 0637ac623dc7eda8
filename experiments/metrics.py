"""The metrics of a trial, with the same names on every back end, and the bounds no transport can beat.

Per job (``job_record`` starts the record, each back end fills in its transport's fields):

- ``jct_s``: job completion time (ATP: the sender's completion policy; TCP: the receiver's stop byte reached
  the sender; UDP: sender start -> the receiver held ceil(MSR*N) complete messages; ``None`` when the job did
  not complete), ``msr_met`` (bool), ``delivered`` (messages), ``msg_loss`` (ATP: messages given up / N),
- ``pkt_loss`` (ATP: packets lost / sent; UDP: 1 - received / sent; TCP: retransmitted / sent segments),
- ``delivered_bytes_frac``: payload bytes delivered / job bytes (MSR counts *messages*: with MRDF, ATP meets
  it with the smallest messages first, so with skewed sizes it moves fewer bytes than EarlySend),
- ``bound_s``: MSR x job bytes x 8 / line rate (= MSR*N*size/rate for equal sizes) and ``jct_over_bound``;
  ``strict_bound_s``: the ceil(MSR*N) smallest messages' bytes at line rate (``lower_bound_s``), a bound no
  scheme can beat even by picking the smallest messages; ``wire_bound_s``: the line time of those messages as
  ATP puts them on the wire (each packet with its ATP header and the link's per-packet overhead,
  ``wire_bound_s``): the physical bound of an ATP job, and ``jct_over_wire_bound``.

Per trial (``job_summary``): means and extremes over the jobs, the queue measurements and the back end's
performance figures when the record has them. ceil(MSR*N) is hostlib's ``required_messages`` everywhere: what
ATP guarantees is what every bound and baseline counts.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from netapprox.experiments import results as R
from netapprox.experiments.baselines import TCP_JOB_HEADER, TCP_MSG_HEADER
from netapprox.experiments.jobs import LARGE_FLOW_BYTES, SMALL_FLOW_BYTES, JobWorkload
from netapprox.experiments.plans import JobPlan
from netapprox.hostlib.config import AtpConfig, required_messages
from netapprox.hostlib.wire import HEADER_LEN


def lower_bound_s(workload: JobWorkload, msr: float, rate_bps: float) -> float:
    """Physical lower bound of a job's JCT: the ceil(MSR*N) smallest messages' payload at line rate.

    With equal message sizes this is MSR * N * size / rate. Headers are not counted, so no transport
    reaches it (the ratio JCT / bound is >= 1 by construction)."""
    k = required_messages(msr, workload.n)
    return sum(sorted(workload.sizes)[:k]) * 8 / rate_bps


def wire_bound_s(workload: JobWorkload, msr: float, rate_bps: float, overhead_bytes: int | None = None) -> float:
    """Line time of the ceil(MSR*N) smallest messages as ATP packets: every packet of a message carries at
    most ``AtpConfig().max_payload`` bytes plus its ATP header and ``overhead_bytes`` (default
    ``AtpConfig().overhead_bytes``: UDP, IPv4 and Ethernet) of headers the link carries. Acknowledgements, the
    job announce and the FIN are not counted, so no ATP job reaches it."""
    cfg = AtpConfig()
    per_packet = HEADER_LEN + (cfg.overhead_bytes if overhead_bytes is None else overhead_bytes)
    k = required_messages(msr, workload.n)
    wire = sum(s + max(1, -(-s // cfg.max_payload)) * per_packet for s in sorted(workload.sizes)[:k])
    return wire * 8 / rate_bps


def job_record(job: JobPlan, rate_bps: float, overhead_bytes: int | None = None) -> dict[str, Any]:
    """A job's metrics before its transport reports: the plan, the bounds, and nothing achieved yet."""
    wl = job.workload
    return {"job_id": job.job_id, "src": job.src, "dst": job.dst, "msr": job.msr, "n": wl.n,
            "bytes": wl.total_bytes, "start_s": job.start_s, "bound_s": job.msr * wl.total_bytes * 8 / rate_bps,
            "strict_bound_s": lower_bound_s(wl, job.msr, rate_bps),
            "wire_bound_s": wire_bound_s(wl, job.msr, rate_bps, overhead_bytes),
            "jct_s": None, "msr_met": False, "delivered": None, "msg_loss": None, "pkt_loss": None}


def finish_record(m: dict[str, Any]) -> dict[str, Any]:
    """Add the JCT's ratios to the bounds (when the job completed)."""
    if m["jct_s"] is not None and m["bound_s"] > 0:
        m["jct_over_bound"] = m["jct_s"] / m["bound_s"]
        m["jct_over_wire_bound"] = m["jct_s"] / m["wire_bound_s"]
    return m


def atp_delivered_bytes_frac(workload: JobWorkload, lost_ids: Sequence[int]) -> float:
    """Payload delivered by an ATP job that gave up ``lost_ids``."""
    lost = sum(workload.sizes[i] for i in lost_ids if 0 <= i < workload.n)
    return 1 - lost / max(1, workload.total_bytes)


def tcp_delivered_bytes_frac(workload: JobWorkload, stream_bytes: int, delivered: int) -> float:
    """Payload in the first ``stream_bytes`` of a TCP baseline's stream that held ``delivered`` complete
    messages (the stream carries a job header and a header per message, experiments/baselines.py)."""
    payload = stream_bytes - TCP_JOB_HEADER - TCP_MSG_HEADER * delivered
    return min(1.0, max(0, payload) / max(1, workload.total_bytes))


def _mean(rows: Sequence[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(vals)) if vals else None


def network_loss_frac(trial: dict) -> float | None:
    """ATP and the peer transports: packets lost in the network (dropped or trimmed by a switch) over the DATA
    packets their senders sent; Aeolus' credits, which its switches drop by design (the credit queue's bound),
    are not counted. None when no job reports what it sent (the baselines: ns-3's TCP counts their segments)."""
    sent = sum(j.get("packets_sent") or 0 for j in trial["jobs"])
    q = trial.get("queues") or {}
    if not sent or "switch_drops" not in q:
        return None
    credits = (trial.get("aeolus") or {}).get("credit_drops", 0)
    return (q["switch_drops"] - credits + q.get("switch_trims", 0)) / sent


def job_summary(trial: dict) -> dict:
    """A trial's metrics over its jobs, plus the queues and the back end's performance when measured."""
    jobs = trial["jobs"]
    jcts = [j["jct_s"] for j in jobs if j["jct_s"] is not None]
    met = [bool(j["msr_met"]) for j in jobs]
    within = [j["msg_loss"] <= 1 - j["msr"] + 1e-9 for j in jobs if j.get("msg_loss") is not None and j["msr_met"]]
    out: dict[str, Any] = {
        "jct_mean_s": float(np.mean(jcts)) if jcts else None,
        "jct_median_s": float(np.median(jcts)) if jcts else None,
        "jct_p99_s": R.percentile(jcts, 99) if jcts else None,
        "jct_max_s": float(np.max(jcts)) if jcts else None,
        "jct_over_bound": _mean(jobs, "jct_over_bound"),
        "msr_met_frac": sum(met) / len(met) if met else None,
        "loss_within_bound_frac": sum(within) / len(within) if within else None,
        "jobs": len(jobs),
        "jobs_failed": sum(1 for j in jobs if j["jct_s"] is None),
        "pkt_loss": _mean(jobs, "pkt_loss"),
        "delivered_bytes_frac": _mean(jobs, "delivered_bytes_frac"),
    }
    q = trial.get("queues")
    if q is not None:
        out.update(queue_mean_pkts=q.get("receiver_port_mean_pkts"),
                   approx_queue_mean_pkts=q.get("receiver_port_approx_mean_pkts"),
                   queue_max_pkts=q.get("receiver_port_max_pkts"))
        if "switch_drops" in q:
            out["switch_drops"] = q["switch_drops"]
            out["switch_trims"] = q.get("switch_trims", 0)
            out["network_loss_frac"] = network_loss_frac(trial)
            lost = q.get("lost_at") or {}
            total = sum(lost.values())
            out["lost_at_receivers_frac"] = lost["host_facing"] / total if total else None
    perf = trial.get("perf")
    if perf is not None:
        out.update(wall_s=perf["run_wall_s"], cpu_s=perf.get("run_cpu_s"),
                   sim_packets_per_wall_s=perf.get("switch_packets_per_wall_s"))
    if any("timeouts" in j for j in jobs):
        out["tcp_timeouts_per_job"] = _mean(jobs, "timeouts")
        out["tcp_retx_frac"] = out.pop("pkt_loss")
    return out


def flow_fct_stats(flows: Sequence[dict]) -> dict:
    """Mean and p99 FCT of all / small / large flows, and how many did not finish."""
    out: dict[str, Any] = {}
    classes = {"all": lambda f: True, "small": lambda f: f["trace_size"] < SMALL_FLOW_BYTES,
               "large": lambda f: f["trace_size"] > LARGE_FLOW_BYTES}
    for cls, pred in classes.items():
        sel = [f for f in flows if pred(f)]
        done = [f["fct_s"] for f in sel if f.get("fct_s") is not None]
        out[f"fct_{cls}_mean"] = sum(done) / len(done) if done else None
        out[f"fct_{cls}_p99"] = R.percentile(done, 99) if done else None
        out[f"flows_{cls}"] = len(sel)
        out[f"flows_{cls}_unfinished"] = len(sel) - len(done)
    return out
