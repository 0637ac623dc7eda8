"""The scale row of ``make bench``: ATP against DCTCP-EarlySend and DCTCP-SampleSend in ns-3, side by side.

A k=4 fat-tree (16 hosts, 20 switches) at 40 Gbit/s, all-to-all FBKV (every host sends one 1000-message job
to a random other host at time 0), MSR 0.5 and 0.9, seeds 1-3, every protocol on the same jobs: ATP (hostlib's
default sender through ``hostlib.sim``, NetApprox switches, the controller's runtime in the loop) and
DCTCP-ES/SS (ns-3 ``TcpDctcp`` on network-oblivious switches with ECN at K = 65), as
``python -m netapprox.experiments sim alltoall`` runs them (docs/simulation.md).

``run(progress=print) -> dict``; the headline is

    {"sim_atp_over_dctcp_es": {"0.5": x, "0.9": y}, "sim_atp_over_dctcp_ss": {"0.5": .., "0.9": ..},
     "sim_atp_p99_over_dctcp_es": {"0.5": .., "0.9": ..}, "sim_atp_network_drop_frac": {"0.5": .., "0.9": ..}}

the first two the ratio of mean JCTs over the seeds (ATP / baseline; below 1 = ATP faster), the third the ratio
of the 99th-percentile JCTs (each trial's p99, averaged over the seeds), the last the share of ATP's DATA
packets whose payload the network lost (dropped or trimmed by a switch), over the seeds; with per-seed ratios, the
fraction of ATP jobs that met their MSR, the simulator's speed (simulated packets per wall-clock second:
packets leaving switch queues, i.e. packet-hops, and packets leaving hosts, over all the trials), and where
the ATP trials' wall-clock time went (``atp_wall_share``: hostlib's cores, ns-3's send path, the adapter, the
controller, and the rest of ns-3).
``python -m netapprox.bench.sim [--seeds 1 2 3] [--json FILE]``. About 3-5 minutes on two shared cores.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

from netapprox.controller.sim import native as switch_native
from netapprox.experiments.figures import alltoall_jobs
from netapprox.experiments.metrics import job_summary
from netapprox.experiments.sim import native
from netapprox.experiments.sim.backend import SimBackend, SimScale
from netapprox.experiments.sim.topology import TopologyConfig
from netapprox.experiments.sim.trial import run_trial

MSRS = (0.5, 0.9)
PROTOCOLS = ("atp", "dctcp-es", "dctcp-ss")


def run(progress: Callable[[str], None] = print, seeds: tuple[int, ...] = (1, 2, 3), k: int = 4) -> dict:
    if not switch_native.available():
        return {"name": "sim", "error": "ns-3 is not installed: pip install -e '.[sim]'", "headline": {}}
    t0 = time.perf_counter()
    progress("bench sim: loading ns-3 ...")
    native.load()
    scale = SimScale(TopologyConfig(k=k))
    backend = SimBackend(scale)
    settings = backend.settings
    rows: list[dict[str, Any]] = []
    switch_pkts = host_pkts = 0
    wall = 0.0
    profile: dict[str, float] = {}
    profile_calls: dict[str, int] = {}
    for seed in seeds:
        for msr in MSRS:
            jobs = alltoall_jobs(backend, seed, "fbkv", msr)  # as `experiments sim alltoall` runs them
            for proto in PROTOCOLS:
                trial = run_trial(settings, proto, jobs, seed=seed, profile=proto == "atp")
                m = job_summary(trial)
                perf = trial["perf"]
                switch_pkts += perf["switch_packets"]
                host_pkts += perf["host_packets"]
                wall += perf["run_wall_s"]
                for key, sec in perf.get("profile", {}).get("seconds", {}).items():
                    profile[key] = profile.get(key, 0.0) + sec
                for key, n in perf.get("profile", {}).get("calls", {}).items():
                    profile_calls[key] = profile_calls.get(key, 0) + n
                rows.append({"seed": seed, "msr": msr, "protocol": proto, "jct_mean_s": m["jct_mean_s"],
                             "jct_p99_s": m["jct_p99_s"], "network_loss_frac": m.get("network_loss_frac"),
                             "msr_met_frac": m["msr_met_frac"], "queue_mean_pkts": m["queue_mean_pkts"],
                             "wall_s": perf["run_wall_s"]})
                progress(f"bench sim: seed {seed} MSR {msr} {proto}: mean JCT {m['jct_mean_s'] * 1e6:.1f} µs, "
                         f"MSR met {m['msr_met_frac']:.2f} ({perf['run_wall_s']:.1f} s)")

    def mean_of(proto: str, msr: float, key: str) -> float | None:
        vals = [r[key] for r in rows if r["protocol"] == proto and r["msr"] == msr and r[key] is not None]
        return statistics.fmean(vals) if len(vals) == len(seeds) else None

    def mean_jct(proto: str, msr: float) -> float | None:
        return mean_of(proto, msr, "jct_mean_s")

    headline: dict[str, dict[str, float | None]] = {"sim_atp_over_dctcp_es": {}, "sim_atp_over_dctcp_ss": {},
                                                     "sim_atp_p99_over_dctcp_es": {}, "sim_atp_network_drop_frac": {}}
    per_seed: dict[str, dict[str, list]] = {"sim_atp_over_dctcp_es": {}, "sim_atp_over_dctcp_ss": {}}
    for msr in MSRS:
        atp = mean_jct("atp", msr)
        for key, base in (("sim_atp_over_dctcp_es", "dctcp-es"), ("sim_atp_over_dctcp_ss", "dctcp-ss")):
            b = mean_jct(base, msr)
            headline[key][str(msr)] = atp / b if atp is not None and b else None
            per_seed[key][str(msr)] = [
                next(r["jct_mean_s"] for r in rows if r["seed"] == s and r["msr"] == msr and r["protocol"] == "atp")
                / next(r["jct_mean_s"] for r in rows if r["seed"] == s and r["msr"] == msr and r["protocol"] == base)
                for s in seeds]
        p99, p99_es = mean_of("atp", msr, "jct_p99_s"), mean_of("dctcp-es", msr, "jct_p99_s")
        headline["sim_atp_p99_over_dctcp_es"][str(msr)] = p99 / p99_es if p99 is not None and p99_es else None
        headline["sim_atp_network_drop_frac"][str(msr)] = mean_of("atp", msr, "network_loss_frac")
    atp_met = [r["msr_met_frac"] for r in rows if r["protocol"] == "atp" and r["msr_met_frac"] is not None]
    return {
        "name": "sim", "headline": headline, "per_seed": per_seed,
        "setup": f"{scale.topology().describe()}; all-to-all FBKV ({scale.fbkv_n} messages per job), MSR "
                 f"{', '.join(map(str, MSRS))}, seeds {list(seeds)}",
        "atp_msr_met_frac": statistics.fmean(atp_met) if atp_met else None,
        "mean_jct_s": {f"{p}@{msr}": mean_jct(p, msr) for p in PROTOCOLS for msr in MSRS},
        "sim_switch_packets_per_wall_s": switch_pkts / wall if wall else None,
        "sim_host_packets_per_wall_s": host_pkts / wall if wall else None,
        "atp_wall_share": {k: v / sum(profile.values()) for k, v in profile.items()} if profile else {},
        "atp_wall_us_per_datagram": {k: v / max(1, profile_calls.get("received", 0)) * 1e6 for k, v in profile.items()},
        "atp_calls": profile_calls,
        "rows": rows, "settings": settings.to_dict(), "wall_s": time.perf_counter() - t0,
    }


def format_table(result: dict) -> str:
    if "error" in result:
        return f"sim: {result['error']}"
    lines = [f"Setup: {result['setup']}.", "",
             "| MSR | ATP / DCTCP-ES JCT | ATP / DCTCP-SS JCT | p99 ATP / DCTCP-ES | ATP payloads lost in the network "
             "| ATP | DCTCP-ES | DCTCP-SS |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    h, mj = result["headline"], result["mean_jct_s"]

    def us(v: float | None) -> str:
        return "n/a" if v is None else f"{v * 1e6:.1f} µs"

    def r(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    for msr in MSRS:
        es, ss = h["sim_atp_over_dctcp_es"][str(msr)], h["sim_atp_over_dctcp_ss"][str(msr)]
        p99, drop = h["sim_atp_p99_over_dctcp_es"][str(msr)], h["sim_atp_network_drop_frac"][str(msr)]
        lines.append(f"| {msr} | {r(es)} | {r(ss)} | {r(p99)} | {r(drop)} | {us(mj[f'atp@{msr}'])} | {us(mj[f'dctcp-es@{msr}'])} | "
                     f"{us(mj[f'dctcp-ss@{msr}'])} |")
    lines += ["", f"ATP jobs that met their MSR: {r(result['atp_msr_met_frac'])}. Simulator speed: "
              f"{result['sim_switch_packets_per_wall_s']:.0f} packet-hops and "
              f"{result['sim_host_packets_per_wall_s']:.0f} host packets per wall-clock second (all trials)."]
    if result.get("atp_wall_share"):
        share = result["atp_wall_share"]
        per = result["atp_wall_us_per_datagram"]
        lines += ["", "Where the ATP trials' wall-clock time went (hostlib.sim.ProfiledEndpoint; per datagram "
                  "received):", "", "| step | share | µs per datagram |", "|---|---:|---:|"]
        lines += [f"| {k} | {share[k]:.3f} | {per[k]:.1f} |" for k in sorted(share, key=share.get, reverse=True)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netapprox.bench.sim", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--json", default=None, help="write the result here")
    args = p.parse_args(argv)
    result = run(seeds=tuple(args.seeds))
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if "error" not in result else 2


if __name__ == "__main__":
    sys.exit(main())
