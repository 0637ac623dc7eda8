"""Run one ATP job of an experiment workload through hostlib's blocking API (``hostlib.api``).

hostlib's own CLI sends uniform jobs; the experiments need jobs whose messages have the FBKV/FBHD sizes
of a ``JobWorkload`` file, float-vector jobs, and several jobs per receiver, so this wrapper builds the
``JobSpec`` and calls ``hostlib.api.send_job`` / ``receive_job``. It implements nothing of ATP itself.

    python -m netapprox.experiments.atp_job send HOST:PORT --job FILE --job-id J --msr 0.9 [--mode adaptive|paper|fixtlr|base]
        [--no-mrdf] [--completion early|all_sent] [--rate 20M] [--report-to HOST:PORT] [--report-key-file FILE]
        [--json FILE] [--timeline FILE]
    python -m netapprox.experiments.atp_job send HOST:PORT --analytics FILE --job-id J [--no-adapt --msr M] ...
    python -m netapprox.experiments.atp_job send-vector HOST:PORT --vector FILE.npy --msr 0.85 ...
    python -m netapprox.experiments.atp_job recv ADDR:PORT --jobs K --timeout S --json FILE [--vector-out DIR]
        [--rate 20M] [--grants on|off] [--grant-window N]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from netapprox.experiments.hostprog import (add_start_after, add_start_at, address, emit_summary, mark_done,
                                            wait_for_file, wait_for_start)
from netapprox.experiments.jobs import JobWorkload
from netapprox.hostlib import api
from netapprox.hostlib.config import (
    COMPLETION_POLICIES, MODE_ALIASES, MODES, AtpConfig, ConfigError, JobSpec, Message, parse_queue_packets, parse_rate,
    pattern_bytes)
from netapprox.hostlib.reporting import read_report_key
from netapprox.hostlib.wire import DEFAULT_ATP_PORT, DEFAULT_REPORT_PORT



def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "as_dict"):
        return obj.as_dict()
    if dataclasses.is_dataclass(obj):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not isinstance(getattr(obj, f.name), (bytes, bytearray))}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items() if not isinstance(v, (bytes, bytearray))}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return obj


def build_config(args: argparse.Namespace) -> AtpConfig:
    kw: dict[str, Any] = {"mode": args.mode, "mrdf": not args.no_mrdf, "completion": args.completion}
    if args.rate:
        kw["max_rate_bps"] = parse_rate(args.rate)
    if args.queue_packets:
        kw["queue_packets"] = parse_queue_packets(args.queue_packets)
    if args.report_key_file:
        kw["report_key"] = read_report_key(args.report_key_file, "--report-key-file")
    if getattr(args, "path_reorders", False):
        kw["path_reorders"] = True
    return AtpConfig(**kw)


def receiver_config(args: argparse.Namespace) -> AtpConfig:
    """hostlib's default receiver, told its link's rate (``--rate``: a granting receiver's budget is one
    bandwidth-delay product at it; not told, it measures the rate its link delivers), granting or not as a named
    variant says (``--grants on|off``)."""
    kw: dict[str, Any] = {"max_rate_bps": parse_rate(args.rate) if args.rate else None}
    if args.grants is not None:
        kw["receiver_grants"] = args.grants == "on"
    if getattr(args, "grant_window", None) is not None:
        kw["grant_window_packets"] = args.grant_window
    return AtpConfig(**kw)


def job_spec(workload: JobWorkload, job_id: int, msr: float) -> JobSpec:
    msgs = tuple(Message(pattern_bytes(i, s)) for i, s in enumerate(workload.sizes))
    return JobSpec(job_id=job_id, messages=msgs, msr=msr)


def send(args: argparse.Namespace) -> dict:
    if getattr(args, "analytics", None):
        return send_analytics(args)
    if args.cmd == "send-vector":
        import numpy as np  # noqa: PLC0415 - only vector jobs need it; every other start stays light

        values = np.load(args.vector).astype("float32").tolist()
        job = JobSpec.from_vector(args.job_id, values, msr=args.msr)
    else:
        workload = JobWorkload.from_dict(json.loads(Path(args.job).read_text()))
        job = job_spec(workload, args.job_id, args.msr)
    kw = _send_kwargs(args)
    late = wait_for_start(args.start_at)
    start_wall = time.time()
    summary = api.send_job(address(args.dest, DEFAULT_ATP_PORT), job, **kw)
    mark_done(args.done_file)
    out = _jsonable(summary)
    out.update(protocol="atp", start_wall=start_wall, late_start_s=late, n=len(job.messages), msr=args.msr,
               end_wall=start_wall + float(out.get("jct_s") or 0.0))
    return out


def _send_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """What every sender here passes on: its config, where it reports, its timeline file."""
    kw: dict[str, Any] = {"config": build_config(args)}
    if args.report_to:
        kw["report_to"] = address(args.report_to, DEFAULT_REPORT_PORT)
    if args.timeline:
        kw["timeline"] = args.timeline
    return kw


def send_analytics(args: argparse.Namespace) -> dict:
    """An analytics job (``--analytics FILE``, ``AnalyticsJob.save``): its rows, one ATP group per stratum, its MSR
    from the paper's heuristic following its running estimate until every bound holds (``--no-adapt``: fixed at
    ``--msr``). The summary holds the sender's and the job's answers (``analytics``)."""
    from netapprox.analytics.job import AnalyticsJob  # noqa: PLC0415 - only analytics jobs need it
    job = AnalyticsJob.load(args.analytics)
    job.job_id = args.job_id
    kw = _send_kwargs(args)
    late = wait_for_start(args.start_at)
    res = job.send(address(args.dest, DEFAULT_ATP_PORT), msr=None if args.msr is None else args.msr,
                   adapt=not args.no_adapt, on_sent=lambda: mark_done(args.done_file), **kw)
    start_wall = res.phases["start_wall"]  # the ATP job's start: the job's spec (its 20,000 rows) is built before
    out = _jsonable(res.summary)
    out.update(protocol="atp", start_wall=start_wall, late_start_s=late, n=len(job.rows), msr=args.msr,
               end_wall=start_wall + float(out.get("jct_s") or 0.0),
               analytics={**res.as_dict(), "sample_ids": list(res.sample_ids)})
    return out


def recv(args: argparse.Namespace) -> dict:
    try:
        got = api.receive_jobs(address(args.bind, DEFAULT_ATP_PORT), count=args.jobs, timeout=args.timeout,
                               config=receiver_config(args))
        error = None
    except Exception as exc:  # a timeout or an abandoned job still writes a summary
        got, error = [], f"{type(exc).__name__}: {exc}"
    results = []
    for res in got:
        d = _jsonable(res)
        vec = res.vector
        if vec is not None and args.vector_out:
            import numpy as np  # noqa: PLC0415 - only vector jobs need it

            path = Path(args.vector_out) / f"job{res.job_id}.npy"
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, np.asarray(vec, dtype="float32"))
            d["vector_file"] = str(path)
        d.pop("lost_ranges", None)
        results.append(d)
    return {"protocol": "atp-recv", "jobs": results, "error": error}


def parser() -> argparse.ArgumentParser:
    """The command line of ``send``, ``send-vector`` and ``recv``."""
    p = argparse.ArgumentParser(prog="python -m netapprox.experiments.atp_job", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("send", "send-vector"):
        s = sub.add_parser(name)
        s.add_argument("dest")
        if name == "send":
            s.add_argument("--job", help="JobWorkload JSON")
            s.add_argument("--analytics", default=None, metavar="FILE",
                           help="an analytics job (AnalyticsJob.save): its MSR follows its estimate (instead of --job)")
            s.add_argument("--no-adapt", action="store_true", help="--analytics at the fixed --msr")
        else:
            s.add_argument("--vector", required=True, help=".npy file of float32 values")
        s.add_argument("--job-id", type=int, required=True)
        s.add_argument("--msr", type=float, default=None, help="required but with --analytics")
        s.add_argument("--mode", default="adaptive", choices=[*MODES, *MODE_ALIASES])
        s.add_argument("--no-mrdf", action="store_true")
        s.add_argument("--completion", default="early", choices=list(COMPLETION_POLICIES))
        s.add_argument("--rate", default=None, help="R_max, e.g. 20M")
        s.add_argument("--queue-packets", default=None,
                       help="the switch queues' buffers in MTUs, 8 comma-separated sizes from queue 0 (default: hostlib's)")
        s.add_argument("--path-reorders", action="store_true",
                       help="the network sprays this job's packets over equal-cost paths (AtpConfig.path_reorders)")
        s.add_argument("--report-to", default=None)
        s.add_argument("--report-key-file", default=None, help="the controller's report key (default: unsigned)")
        s.add_argument("--timeline", default=None)
        s.add_argument("--json")
        add_start_at(s)
        add_start_after(s)
    r = sub.add_parser("recv")
    r.add_argument("bind")
    r.add_argument("--jobs", type=int, default=1)
    r.add_argument("--timeout", type=float, default=120.0)
    r.add_argument("--vector-out", default=None)
    r.add_argument("--rate", default=None, help="the receiver's link rate, e.g. 20M: sizes its grant budget "
                   "(without it a granting receiver measures the rate its link delivers)")
    r.add_argument("--grants", choices=("on", "off"), default=None,
                   help="receiver grants (default: hostlib's AtpConfig.receiver_grants)")
    r.add_argument("--grant-window", type=int, default=None,
                   help="a granting receiver's budget, packets in flight (default: one BDP at --rate)")
    r.add_argument("--json")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.cmd != "recv" and not getattr(args, "analytics", None):
        if args.cmd == "send" and not args.job:
            p.error("send needs --job FILE or --analytics FILE")
        if args.msr is None:
            p.error("--msr is required (but with --analytics)")
    if getattr(args, "no_adapt", False) and args.msr is None:
        p.error("--no-adapt needs --msr")
    if getattr(args, "queue_packets", None):
        try:
            parse_queue_packets(args.queue_packets)
        except ConfigError as exc:
            p.error(str(exc))
    if args.cmd != "recv":
        wait_for_file(args.start_after)
    out = recv(args) if args.cmd == "recv" else send(args)
    emit_summary(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
