"""``make bench``: a fixed suite measured side by side in one run on the emulated rack (needs root).

Every number is a ratio of two things measured in this run, on this machine, with the same seeds:

1. approximate JCT with background traffic: ATP / TCP-ES and ATP / TCP-SS, at MSR 0.5 and 0.9
   (one job of equal-size messages, host 0 -> host 1, web-search TCP flows host 2 -> host 1 at 30 % load);
2. JCT / the physical lower bound MSR * N * size / bottleneck rate, for each transport;
3. the fraction of ATP jobs whose message loss stayed <= 1 - MSR (ATP's guarantee; reported as measured);
4. non-approximate flow completion time next to ATP jobs: NetApprox queues / one FIFO queue with the
   same total buffer;
5. the controller's own numbers, from ``bench.controller.run()`` when that module is importable.

Writes results/bench.json and results/bench.md and prints the table. ``--seeds`` changes the seeds,
``--out`` the directory. Finishes in a few minutes on two cores.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

BENCH_MSRS = (0.5, 0.9)
BENCH_PROTOCOLS = ("atp", "tcp-es", "tcp-ss", "atp-early")
"""``atp``: hostlib's default completion (every message sent once and every MSR met); ``atp-early``:
done as soon as the MSR is met, the same stopping rule as TCP-ES (reported as an extra row)."""
MSG_SIZE = 1000
MSGS = 600
FLOW_LOAD = 0.3


def _mean(xs: Sequence[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def approx_jct(seeds: Sequence[int], out: Path, scale) -> dict:
    """Part 1-3: ATP vs TCP-ES vs TCP-SS with background flows."""
    from netapprox.experiments.harness import Testbed
    from netapprox.experiments.runner import next_job_id
    from netapprox.experiments.trial import FlowLoad, JobPlan, run_trial
    from netapprox.experiments.workloads import JobWorkload, web_search_flows

    rate = scale.rate_mbit * 1e6
    job = JobWorkload(kind="fixed", seed=0, sizes=(MSG_SIZE,) * MSGS, ready_s=(0.0,) * MSGS)
    rows = []
    with Testbed(scale.testbed(hosts=3), out / "work-jct") as tb:
        for seed in seeds:
            fl = tuple(web_search_flows(seed, load=FLOW_LOAD, link_bps=rate, duration_s=3.0, senders=[2],
                                        receivers=[1], size_scale=scale.flow_size_scale))
            for msr in BENCH_MSRS:
                for proto in BENCH_PROTOCOLS:
                    plan = JobPlan(next_job_id(), 0, 1, job, msr, delay_s=0.3)
                    tr = run_trial(tb, proto, [plan], name=f"s{seed}-{msr}-{proto}", timeout=scale.timeout_s,
                                   flows=[FlowLoad(2, 1, fl)])
                    j = tr["jobs"][0]
                    rows.append({"seed": seed, "msr": msr, "protocol": proto, "jct_s": j["jct_s"],
                                 "jct_over_bound": j.get("jct_over_bound"), "msr_met": j["msr_met"],
                                 "msg_loss": j.get("msg_loss"), "pkt_loss": j.get("pkt_loss"),
                                 "error": j.get("error")})
    return {"rows": rows, "job": {"messages": MSGS, "size": MSG_SIZE}, "flow_load": FLOW_LOAD}


def fct_vs_fifo(seeds: Sequence[int], out: Path, scale) -> dict:
    """Part 4: web-search flow FCT next to two ATP jobs, NetApprox queues vs one FIFO queue."""
    from netapprox.experiments.harness import Testbed
    from netapprox.experiments.runner import coexist_trial

    rows = []
    for switch in ("netapprox", "fifo"):
        with Testbed(scale.testbed(switch=switch, controller=(switch == "netapprox")), out / f"work-fct-{switch}") as tb:
            for seed in seeds:
                m, _tr = coexist_trial(tb, scale, seed, "atp", 0.5, FLOW_LOAD, name=f"s{seed}-{switch}",
                                       duration_s=3.0)
                rows.append({"seed": seed, "switch": switch, **m})
    return {"rows": rows, "flow_load": FLOW_LOAD, "approx": "2 FBHD ATP jobs, MSR 0.5"}


def controller_numbers() -> dict:
    try:
        from netapprox.bench import controller as bc  # written by the controller's maintainers
    except ImportError as exc:
        return {"available": False, "reason": f"bench.controller not importable: {exc}"}
    try:
        return {"available": True, "numbers": bc.run()}
    except Exception as exc:
        return {"available": True, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=3)}


def summarize(jct: dict, fct: dict) -> dict:
    s: dict[str, Any] = {}
    rows = jct["rows"]
    for msr in BENCH_MSRS:
        by = {p: [r for r in rows if r["msr"] == msr and r["protocol"] == p] for p in BENCH_PROTOCOLS}
        mean = {p: _mean([r["jct_s"] for r in rs]) for p, rs in by.items()}
        per_seed = {}
        for base in ("tcp-es", "tcp-ss"):
            ratios = []
            for r in by["atp"]:
                b = next((x for x in by[base] if x["seed"] == r["seed"]), None)
                if b and r["jct_s"] is not None and b["jct_s"]:
                    ratios.append(r["jct_s"] / b["jct_s"])
            per_seed[base] = ratios
        s[f"msr{msr}"] = {
            "jct_mean_s": mean,
            "atp_over_tcp_es": _ratio(mean["atp"], mean["tcp-es"]),
            "atp_over_tcp_ss": _ratio(mean["atp"], mean["tcp-ss"]),
            "atp_early_over_tcp_es": _ratio(mean["atp-early"], mean["tcp-es"]),
            "atp_over_tcp_es_per_seed": per_seed["tcp-es"],
            "atp_over_tcp_ss_per_seed": per_seed["tcp-ss"],
            "jct_over_bound": {p: _mean([r["jct_over_bound"] for r in rs]) for p, rs in by.items()},
            "completed": {p: sum(1 for r in rs if r["jct_s"] is not None) for p, rs in by.items()},
            "runs": {p: len(rs) for p, rs in by.items()},
        }
    atp = [r for r in rows if r["protocol"] in ("atp", "atp-early")]
    within = [r for r in atp if r["msg_loss"] is not None and r["msg_loss"] <= 1 - r["msr"] + 1e-9 and r["msr_met"]]
    s["atp_loss_within_bound"] = {"jobs": len(atp), "within": len(within),
                                  "fraction": len(within) / len(atp) if atp else None}
    f = fct["rows"]
    na = [r for r in f if r["switch"] == "netapprox"]
    ff = [r for r in f if r["switch"] == "fifo"]
    s["fct"] = {}
    for key in ("fct_all_mean", "fct_all_p99", "fct_small_mean", "fct_small_p99"):
        a, b = _mean([r.get(key) for r in na]), _mean([r.get(key) for r in ff])
        s["fct"][key] = {"netapprox": a, "fifo": b, "netapprox_over_fifo": _ratio(a, b)}
    s["fct"]["unfinished"] = {"netapprox": sum(r.get("flows_all_unfinished", 0) for r in na),
                              "fifo": sum(r.get("flows_all_unfinished", 0) for r in ff)}
    s["fct"]["approx_jct_mean_s"] = {"netapprox": _mean([r.get("jct_mean_s") for r in na]),
                                     "fifo": _mean([r.get("jct_mean_s") for r in ff])}
    return s


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested dicts/lists as (dotted key, scalar) rows; a list of dicts keys its items by their 'jobs' or index."""
    rows: list[tuple[str, Any]] = []
    if isinstance(d, dict):
        for k, v in d.items():
            rows += _flatten(v, f"{prefix}{k}.")
    elif isinstance(d, list):
        for i, v in enumerate(d):
            tag = v.get("jobs", i) if isinstance(v, dict) else i
            rows += _flatten(v, f"{prefix}[{tag}].")
    else:
        rows.append((prefix.rstrip("."), d))
    return rows


def markdown(s: dict, meta: dict, ctl: dict) -> str:
    lines = [f"# make bench ({meta['finished_utc']})", "",
             f"Kernel switch, {meta['scale']['rate_mbit']:g} Mbit/s ports, buffer {meta['scale']['buffer_packets']} packets, "
             f"TCP congestion control `{meta['environment']['tcp_cc']}`, seeds {meta['seeds']}, "
             f"{meta['duration_s']:.0f} s. Ratios < 1 favour the first term.", "",
             "| measurement | MSR 0.5 | MSR 0.9 |", "|---|---|---|"]
    a, b = s["msr0.5"], s["msr0.9"]
    lines.append(f"| ATP JCT / TCP-ES JCT (background flows) | {_fmt(a['atp_over_tcp_es'])} | {_fmt(b['atp_over_tcp_es'])} |")
    lines.append(f"| ATP JCT / TCP-SS JCT (background flows) | {_fmt(a['atp_over_tcp_ss'])} | {_fmt(b['atp_over_tcp_ss'])} |")
    lines.append(f"| ATP (early completion) JCT / TCP-ES JCT | {_fmt(a['atp_early_over_tcp_es'])} | {_fmt(b['atp_early_over_tcp_es'])} |")
    for p in BENCH_PROTOCOLS:
        lines.append(f"| {p} JCT / (MSR·N·size / rate) | {_fmt(a['jct_over_bound'][p])} | {_fmt(b['jct_over_bound'][p])} |")
    for p in BENCH_PROTOCOLS:
        lines.append(f"| {p} mean JCT (s) | {_fmt(a['jct_mean_s'][p])} | {_fmt(b['jct_mean_s'][p])} |")
    for p in BENCH_PROTOCOLS:
        lines.append(f"| {p} jobs completed | {a['completed'][p]}/{a['runs'][p]} | {b['completed'][p]}/{b['runs'][p]} |")
    w = s["atp_loss_within_bound"]
    lines += ["", f"ATP jobs whose message loss stayed <= 1 - MSR (and met the MSR): **{w['within']}/{w['jobs']}**"
              f" ({_fmt(w['fraction'] * 100 if w['fraction'] is not None else None, 1)} %)", "",
              "| non-approximate flows next to ATP jobs | NetApprox queues | FIFO switch | NetApprox / FIFO |", "|---|---|---|---|"]
    for key, label in (("fct_all_mean", "mean FCT, all flows (s)"), ("fct_all_p99", "p99 FCT, all flows (s)"),
                       ("fct_small_mean", "mean FCT, small flows (s)"), ("fct_small_p99", "p99 FCT, small flows (s)")):
        r = s["fct"][key]
        lines.append(f"| {label} | {_fmt(r['netapprox'], 4)} | {_fmt(r['fifo'], 4)} | {_fmt(r['netapprox_over_fifo'])} |")
    u = s["fct"]["unfinished"]
    j = s["fct"]["approx_jct_mean_s"]
    lines.append(f"| flows unfinished | {u['netapprox']} | {u['fifo']} | |")
    lines.append(f"| ATP JCT of the approximate jobs (s) | {_fmt(j['netapprox'])} | {_fmt(j['fifo'])} | |")
    lines += ["", "## Controller (bench/controller.py)", ""]
    if not ctl.get("available"):
        lines.append(f"not run: {ctl.get('reason')}")
    elif "error" in ctl:
        lines.append(f"failed: {ctl['error']}")
    else:
        lines += ["| metric | value |", "|---|---|"]
        for k, v in _flatten(ctl.get("numbers") or {}):
            lines.append(f"| {k} | {_fmt(v)} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netapprox.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--out", default="results")
    p.add_argument("--skip-network", action="store_true", help="only the controller numbers (no root needed)")
    args = p.parse_args(argv)
    from netapprox.experiments.results import environment, git_commit, now_utc
    from netapprox.experiments.runner import Scale

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scale = Scale()
    t0 = time.monotonic()
    started = now_utc()
    ctl = controller_numbers()
    if args.skip_network:
        jct, fct, s = None, None, None
    else:
        if os.geteuid() != 0:
            print("make bench needs root (network namespaces, qdiscs); use --skip-network for the controller part",
                  file=sys.stderr)
            return 2
        work = out / "bench"
        jct = approx_jct(args.seeds, work, scale)
        fct = fct_vs_fifo(args.seeds, work, scale)
        s = summarize(jct, fct)
    meta = {"started_utc": started, "finished_utc": now_utc(), "duration_s": time.monotonic() - t0,
            "seeds": args.seeds, "scale": dataclasses.asdict(scale), "environment": environment(),
            "git_commit": git_commit(), "command": ["python", "-m", "netapprox.bench", *(argv or sys.argv[1:])]}
    doc = {**meta, "summary": s, "approx_jct": jct, "fct": fct, "controller": ctl}
    (out / "bench.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    if s is not None:
        md = markdown(s, meta, ctl)
        (out / "bench.md").write_text(md)
        print(md)
    else:
        print(json.dumps(ctl, indent=1, default=str))
    print(f"wrote {out / 'bench.json'}" + (f" and {out / 'bench.md'}" if s is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
