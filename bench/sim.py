"""The scale row of ``make bench``: ATP against DCTCP and every peer transport in ns-3, side by side.

A k=4 fat-tree (16 hosts, 20 switches) at 40 Gbit/s, all-to-all FBKV (every host sends one 1000-message job
to a random other host at time 0), MSR 0.5 and 0.9, seeds 1-3, every protocol on the same jobs: ATP (hostlib's
default sender through ``hostlib.sim``, NetApprox switches, the controller's runtime in the loop),
DCTCP-ES/SS/SM (ns-3 ``TcpDctcp`` on network-oblivious switches with ECN at K = 65) and the peers, each on its
own switches: pFabric, Homa, Aeolus and ExpressPass, each as EarlySend, SampleSend and SmallestSend (``PEERS``;
docs/simulation.md, Peer transports), as ``python -m netapprox.experiments sim alltoall`` runs them.

``run(progress=print) -> dict``; the headline is

    {"sim_atp_over_dctcp_es": {"0.5": x, "0.9": y}, "sim_atp_over_dctcp_ss": {"0.5": .., "0.9": ..},
     "sim_atp_p99_over_dctcp_es": {"0.5": .., "0.9": ..}, "sim_atp_network_drop_frac": {"0.5": .., "0.9": ..},
     "sim_atp_over_best_peer": {"0.5": .., "0.9": ..}, "sim_atp_p99_over_best_peer": {"0.5": .., "0.9": ..}}

the first two the ratio of mean JCTs over the seeds (ATP / baseline; below 1 = ATP faster), the third the ratio
of the 99th-percentile JCTs (each trial's p99, averaged over the seeds), the fourth the share of ATP's DATA
packets whose payload the network lost (dropped or trimmed by a switch), over the seeds; the last two ATP's
mean (p99) JCT over the best peer's at that MSR: the least mean (p99) over the seeds of every peer configuration
the run holds (``best_peer``; ``best_peer`` in the result names it). With per-seed ratios, the
fraction of ATP jobs that met their MSR, the simulator's speed (simulated packets per wall-clock second:
packets leaving switch queues, i.e. packet-hops, and packets leaving hosts, over all the trials), and where
the ATP trials' wall-clock time went (``atp_wall_share``: hostlib's cores, ns-3's send path, the adapter, the
controller, and the rest of ns-3).
``python -m netapprox.bench.sim [--seeds 1 2 3] [--json FILE]``; ``--result RESULT_JSON`` prints the same peer
table for a ``sim alltoall`` run (the k=12 comparison of docs/results.md). About 5-8 minutes on two shared cores.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

from netapprox.controller.sim import native as switch_native
from netapprox.experiments import results as R
from netapprox.experiments.figures import alltoall_jobs
from netapprox.experiments.metrics import job_summary
from netapprox.experiments.sim import native
from netapprox.experiments.sim.backend import SimBackend, SimScale
from netapprox.experiments.sim.topology import TopologyConfig
from netapprox.experiments.sim.trial import PEER_PROTOCOLS, TCP_PROTOCOLS, run_trial
from netapprox.hostlib.config import required_messages

MSRS = (0.5, 0.9)
PEERS = TCP_PROTOCOLS + PEER_PROTOCOLS
"""Every transport a user would pick instead of ATP, each as EarlySend, SampleSend and SmallestSend: DCTCP, pFabric,
Homa, Aeolus and its base, ExpressPass (experiments/sim/trial.py)."""
PROTOCOLS = ("atp",) + PEERS
ROW_KEYS = ("jct_mean_s", "jct_p99_s", "network_loss_frac", "msr_met_frac", "queue_mean_pkts", "delivered_bytes_frac",
            "jobs_failed")


def _row(seed: int, msr: float, proto: str, m: dict) -> dict:
    return {"seed": seed, "msr": msr, "protocol": proto, **{k: m.get(k) for k in ROW_KEYS}}


def _run_trials(settings: Any, backend: SimBackend, seeds: tuple[int, ...], progress: Callable[[str], None]) -> dict:
    """Every protocol on the same jobs per seed and MSR: the rows, and the simulator's speed and ATP's profile."""
    rows: list[dict[str, Any]] = []
    perf_sum = {"switch": 0, "host": 0, "wall": 0.0}
    profile: dict[str, float] = {}
    profile_calls: dict[str, int] = {}
    for seed in seeds:
        for msr in MSRS:
            jobs = alltoall_jobs(backend, seed, "fbkv", msr)  # as `experiments sim alltoall` runs them
            for proto in PROTOCOLS:
                trial = run_trial(settings, proto, jobs, seed=seed, profile=proto == "atp")
                m = job_summary(trial)
                perf = trial["perf"]
                perf_sum["switch"] += perf["switch_packets"]
                perf_sum["host"] += perf["host_packets"]
                perf_sum["wall"] += perf["run_wall_s"]
                for key, sec in perf.get("profile", {}).get("seconds", {}).items():
                    profile[key] = profile.get(key, 0.0) + sec
                for key, n in perf.get("profile", {}).get("calls", {}).items():
                    profile_calls[key] = profile_calls.get(key, 0) + n
                rows.append({**_row(seed, msr, proto, m), "wall_s": perf["run_wall_s"]})
                progress(f"bench sim: seed {seed} MSR {msr} {proto}: mean JCT {_us(m['jct_mean_s'])} µs, "
                         f"MSR met {_r(m['msr_met_frac'])} ({perf['run_wall_s']:.1f} s)")
    return {"rows": rows, "perf": perf_sum, "profile": profile, "profile_calls": profile_calls}


def mean_over_seeds(rows: list[dict], proto: str, msr: float, key: str) -> float | None:
    """The mean of ``key`` over the seeds of ``rows``, None unless every seed measured it for ``proto`` at ``msr``."""
    seeds = {r["seed"] for r in rows}
    vals = [r[key] for r in rows if r["protocol"] == proto and r["msr"] == msr and r.get(key) is not None]
    return statistics.fmean(vals) if vals and len(vals) == len(seeds) else None


def best_peer(rows: list[dict], msr: float, key: str = "jct_mean_s") -> tuple[str, float] | None:
    """The fastest peer at ``msr``: of every protocol ``rows`` hold other than ATP (the pool is whatever the run
    contains), the one with the least mean of ``key`` over the seeds; None when none measured it on every seed."""
    pool = sorted({r["protocol"] for r in rows} - {"atp"})
    means = [(v, p) for p in pool if (v := mean_over_seeds(rows, p, msr, key)) is not None]
    return (min(means)[1], min(means)[0]) if means else None


def compare(rows: list[dict], msrs: tuple[float, ...] = MSRS) -> dict:
    """ATP against DCTCP-ES/SS and against the best peer, per MSR, from the rows of one run (every protocol on the
    same jobs per seed): the headline, the best peers' names and the per-seed ratios."""
    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    def seed_ratios(base: str, msr: float) -> list[float | None]:
        def jct(proto: str, s: int) -> float | None:
            return next((r["jct_mean_s"] for r in rows if (r["seed"], r["msr"], r["protocol"]) == (s, msr, proto)),
                        None)
        return [ratio(jct("atp", s), jct(base, s)) for s in sorted({r["seed"] for r in rows})]

    keys = ("sim_atp_over_dctcp_es", "sim_atp_over_dctcp_ss", "sim_atp_p99_over_dctcp_es", "sim_atp_network_drop_frac",
            "sim_atp_over_best_peer", "sim_atp_p99_over_best_peer")
    h: dict[str, dict[str, float | None]] = {k: {} for k in keys}
    per_seed: dict[str, dict[str, list]] = {k: {} for k in ("sim_atp_over_dctcp_es", "sim_atp_over_dctcp_ss",
                                                             "sim_atp_over_best_peer")}
    best: dict[str, dict[str, str | None]] = {}
    for msr in msrs:
        m = str(msr)
        atp, atp_p99 = mean_over_seeds(rows, "atp", msr, "jct_mean_s"), mean_over_seeds(rows, "atp", msr, "jct_p99_s")
        for key, base in (("sim_atp_over_dctcp_es", "dctcp-es"), ("sim_atp_over_dctcp_ss", "dctcp-ss")):
            h[key][m] = ratio(atp, mean_over_seeds(rows, base, msr, "jct_mean_s"))
            per_seed[key][m] = seed_ratios(base, msr)
        h["sim_atp_p99_over_dctcp_es"][m] = ratio(atp_p99, mean_over_seeds(rows, "dctcp-es", msr, "jct_p99_s"))
        h["sim_atp_network_drop_frac"][m] = mean_over_seeds(rows, "atp", msr, "network_loss_frac")
        b_mean, b_p99 = best_peer(rows, msr), best_peer(rows, msr, "jct_p99_s")
        h["sim_atp_over_best_peer"][m] = ratio(atp, b_mean[1]) if b_mean else None
        h["sim_atp_p99_over_best_peer"][m] = ratio(atp_p99, b_p99[1]) if b_p99 else None
        per_seed["sim_atp_over_best_peer"][m] = seed_ratios(b_mean[0], msr) if b_mean else []
        best[m] = {"mean": b_mean[0] if b_mean else None, "p99": b_p99[0] if b_p99 else None}
    return {"headline": h, "per_seed": per_seed, "best_peer": best,
            "peer_pool": sorted({r["protocol"] for r in rows} - {"atp"})}


def run(progress: Callable[[str], None] = print, seeds: tuple[int, ...] = (1, 2, 3), k: int = 4) -> dict:
    if not switch_native.available():
        return {"name": "sim", "error": "ns-3 is not installed: pip install -e '.[sim]'", "headline": {}}
    t0 = time.perf_counter()
    progress("bench sim: loading ns-3 ...")
    native.load()
    scale = SimScale(TopologyConfig(k=k))
    backend = SimBackend(scale)
    settings = backend.settings
    done = _run_trials(settings, backend, seeds, progress)
    rows, perf, profile, profile_calls = done["rows"], done["perf"], done["profile"], done["profile_calls"]
    cmp = compare(rows)
    atp_met = [r["msr_met_frac"] for r in rows if r["protocol"] == "atp" and r["msr_met_frac"] is not None]
    wall = perf["wall"]
    return {
        "name": "sim", **cmp,
        "setup": f"{scale.topology().describe()}; all-to-all FBKV ({scale.fbkv_n} messages per job), MSR "
                 f"{', '.join(map(str, MSRS))}, seeds {list(seeds)}",
        "atp_msr_met_frac": statistics.fmean(atp_met) if atp_met else None,
        "mean_jct_s": {f"{p}@{msr}": mean_over_seeds(rows, p, msr, "jct_mean_s") for p in PROTOCOLS for msr in MSRS},
        "sim_switch_packets_per_wall_s": perf["switch"] / wall if wall else None,
        "sim_host_packets_per_wall_s": perf["host"] / wall if wall else None,
        "atp_wall_share": {k: v / sum(profile.values()) for k, v in profile.items()} if profile else {},
        "atp_wall_us_per_datagram": {k: v / max(1, profile_calls.get("received", 0)) * 1e6 for k, v in profile.items()},
        "atp_calls": profile_calls,
        "rows": rows, "settings": settings.to_dict(), "wall_s": time.perf_counter() - t0,
    }


def _us(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 1e6:.1f}"


def _r(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def peer_table(rows: list[dict], msrs: tuple[float, ...]) -> list[str]:
    """Every protocol of ``rows`` against ATP per MSR, means over the seeds: mean and p99 JCT (µs), the share of
    its DATA packets the network dropped (ATP and the peers; n/a for DCTCP, whose segments ns-3's TCP counts), the
    receivers' ports' mean backlog (packets), the bytes of the job it delivered, jobs not finished."""
    cmp = compare(rows, msrs)
    protos = ["atp"] + [p for p in PROTOCOLS[1:] if p in cmp["peer_pool"]] + \
        [p for p in cmp["peer_pool"] if p not in PROTOCOLS]
    head = "| protocol | " + " | ".join(f"MSR {m}: mean / p99 JCT (µs) | loss / queue / bytes" for m in msrs) + " |"
    lines = [head, "|---|" + "---:|---:|" * len(msrs)]
    for p in protos:
        cells = []
        for msr in msrs:
            def v(key: str) -> float | None:
                return mean_over_seeds(rows, p, msr, key)
            failed = sum(r.get("jobs_failed") or 0 for r in rows if r["protocol"] == p and r["msr"] == msr)
            best = "**" if p in cmp["best_peer"][str(msr)].values() else ""
            cells.append(f"{best}{_us(v('jct_mean_s'))} / {_us(v('jct_p99_s'))}{best}" +
                         (f" ({failed} jobs unfinished)" if failed else ""))
            cells.append(f"{_r(v('network_loss_frac'))} / {v('queue_mean_pkts') or 0:.1f} / "
                         f"{_r(v('delivered_bytes_frac'))}")
        lines.append(f"| `{p}` | " + " | ".join(cells) + " |")
    h = cmp["headline"]
    lines += ["", "| MSR | best peer (mean) | ATP / best peer, mean JCT | per seed | best peer (p99) | "
              "ATP / best peer, p99 JCT |", "|---|---|---:|---|---|---:|"]
    for msr in msrs:
        m, b = str(msr), cmp["best_peer"][str(msr)]
        per = ", ".join(_r(x) for x in cmp["per_seed"]["sim_atp_over_best_peer"][m])
        lines.append(f"| {msr} | `{b['mean']}` | {_r(h['sim_atp_over_best_peer'][m])} | {per} | `{b['p99']}` | "
                     f"{_r(h['sim_atp_p99_over_best_peer'][m])} |")
    return lines


def rows_from_result(doc: dict, workload: str = "fbkv") -> tuple[list[dict], tuple[float, ...]]:
    """The rows of a ``sim alltoall`` result.json (experiments/results.py) for ``workload``, and its MSRs (its
    trials only: not the runs of ratios the result adds, whose protocol reads ``atp/dctcp-es``)."""
    rows = [_row(run["seed"], run["params"]["msr"], run["params"]["protocol"], run["metrics"])
            for run in doc["runs"] if run["params"].get("workload", workload) == workload
            and "jct_mean_s" in (run.get("metrics") or {})]
    return rows, tuple(sorted({r["msr"] for r in rows}))


def slowdown_table(doc: dict, protocols: list[str], workload: str = "fbkv", buckets: int = 3) -> list[str]:
    """Homa's metric on the jobs of a ``sim alltoall`` result.json: each job's slowdown, its JCT over its unloaded
    time (``strict_bound_s``, the ceil(MSR N) smallest messages at line rate, plus the longest path's unloaded
    RTT: no transport beats it), median and p99 per job-size bucket (``buckets`` equal shares of the jobs by the
    bytes of those messages, per MSR) for ``protocols``. Per job, not per message: the trial records one
    completion time per job."""
    rtt = TopologyConfig(**doc["config"]["scale"]["topo"]).base_rtt_s()
    jobs: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for run in doc["runs"]:
        prm = run["params"]
        if prm.get("workload", workload) != workload or prm["protocol"] not in protocols or not run.get("raw"):
            continue
        for j in run["raw"]["jobs"]:
            if j.get("jct_s") is not None:
                need = j["strict_bound_s"]
                jobs.setdefault((prm["protocol"], prm["msr"]), []).append((need, j["jct_s"] / (need + rtt)))
    msrs = sorted({m for _, m in jobs})
    lines = ["| MSR | job size bucket (µs at line rate) | " + " | ".join(f"`{p}` median / p99" for p in protocols) +
             " |", "|---|---|" + "---:|" * len(protocols)]
    for msr in msrs:
        sizes = sorted(need for p in protocols for need, _ in jobs.get((p, msr), []))
        if not sizes:
            continue
        edges = [sizes[0]] + [sizes[min(len(sizes) - 1, len(sizes) * (b + 1) // buckets)] for b in range(buckets)]
        for b in range(buckets):
            lo, hi = edges[b], edges[b + 1]
            cells = []
            for p in protocols:
                sl = [x for need, x in jobs.get((p, msr), []) if lo <= need < hi or (b == buckets - 1 and need == hi)]
                cells.append(f"{statistics.median(sl):.2f} / {R.percentile(sl, 99):.2f}" if sl else "n/a")
            lines.append(f"| {msr} | {lo * 1e6:.1f}-{hi * 1e6:.1f} | " + " | ".join(cells) + " |")
    return lines


def sent_table(doc: dict, protocols: list[str], workload: str = "fbkv") -> list[str]:
    """What each job put on the wire in a ``sim alltoall`` result.json, per MSR, means over its jobs and seeds:
    DATA packets sent, of them retransmitted, packets the switches dropped (per job of the trial), messages
    delivered against the ceil(MSR N) required (ATP and the peers; DCTCP counts segments, not shown)."""
    acc: dict[tuple[str, float], dict[str, list[float]]] = {}
    for run in doc["runs"]:
        prm, raw = run["params"], run.get("raw")
        if prm.get("workload", workload) != workload or prm["protocol"] not in protocols or not raw:
            continue
        a = acc.setdefault((prm["protocol"], prm["msr"]), {"sent": [], "retx": [], "drops": [], "extra": []})
        jobs = raw["jobs"]
        a["sent"] += [j["packets_sent"] for j in jobs if j.get("packets_sent") is not None]
        a["retx"] += [j["retransmissions"] for j in jobs if j.get("retransmissions") is not None]
        q = raw.get("queues") or {}
        credits = (raw.get("aeolus") or {}).get("credit_drops", 0)
        a["drops"].append((q.get("switch_drops", 0) - credits + q.get("switch_trims", 0)) / max(1, len(jobs)))
        a["extra"] += [j["delivered"] / max(1, required_messages(j["msr"], j["n"])) for j in jobs
                       if j.get("delivered") is not None and j.get("jct_s") is not None]
    msrs = sorted({m for _, m in acc})
    lines = ["| MSR | protocol | DATA packets sent per job | retransmitted | dropped by switches | messages delivered / "
             "required |", "|---|---|---:|---:|---:|---:|"]
    for msr in msrs:
        for p in protocols:
            a = acc.get((p, msr))
            if a and a["sent"]:
                lines.append(f"| {msr} | `{p}` | {statistics.fmean(a['sent']):.1f} | "
                             f"{statistics.fmean(a['retx']) if a['retx'] else 0:.1f} | "
                             f"{statistics.fmean(a['drops']):.2f} | {statistics.fmean(a['extra']):.2f} |")
    return lines


def runs_from_cache(root: Path) -> list[dict]:
    """The trials a trial cache (experiments/cache.py) holds as the runs of a result.json: seed, params from the
    trial's label (``workload=fbkv msr=0.5 protocol=atp seed=1``), metrics (``job_summary``) and the record; the
    newest code version's only, when the cache holds several."""
    entries = []
    for path in sorted(Path(root).glob("*/*.json")):
        with open(path) as f:
            entries.append((path.stat().st_mtime, json.load(f)))
    if not entries:
        return []
    code = max(entries, key=lambda e: e[0])[1]["code"]
    runs = []
    for _, e in entries:
        if e["code"] != code:
            continue
        params = dict(tok.split("=", 1) for tok in e["label"].split() if "=" in tok)
        params = {"workload": params.get("workload", "fbkv"), "msr": float(params["msr"]), "protocol": e["protocol"]}
        runs.append({"seed": e["trial"]["seed"], "params": params, "metrics": job_summary(e["trial"]),
                     "raw": e["trial"]})
    return runs


def merged_runs(*sources: list[dict]) -> list[dict]:
    """The runs of several sources, one per (seed, workload, MSR, protocol): the first source's wins."""
    seen, out = set(), []
    for runs in sources:
        for run in runs:
            prm = run["params"]
            key = (run["seed"], prm.get("workload"), prm.get("msr"), prm.get("protocol"))
            if key not in seen:
                seen.add(key)
                out.append(run)
    return out


def format_table(result: dict) -> str:
    if "error" in result:
        return f"sim: {result['error']}"
    lines = [f"Setup: {result['setup']}.", "",
             "| MSR | ATP / DCTCP-ES JCT | ATP / DCTCP-SS JCT | p99 ATP / DCTCP-ES | ATP payloads lost in the network "
             "| ATP | DCTCP-ES | DCTCP-SS |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    h, mj = result["headline"], result["mean_jct_s"]
    for msr in MSRS:
        es, ss = h["sim_atp_over_dctcp_es"][str(msr)], h["sim_atp_over_dctcp_ss"][str(msr)]
        p99, drop = h["sim_atp_p99_over_dctcp_es"][str(msr)], h["sim_atp_network_drop_frac"][str(msr)]
        lines.append(f"| {msr} | {_r(es)} | {_r(ss)} | {_r(p99)} | {_r(drop)} | {_us(mj[f'atp@{msr}'])} µs | "
                     f"{_us(mj[f'dctcp-es@{msr}'])} µs | {_us(mj[f'dctcp-ss@{msr}'])} µs |")
    lines += ["", "Every peer (the best in bold):", "", *peer_table(result["rows"], MSRS)]
    lines += ["", f"ATP jobs that met their MSR: {_r(result['atp_msr_met_frac'])}. Simulator speed: "
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
    p.add_argument("--result", nargs="+", default=None, metavar="RESULT_JSON",
                   help="run nothing: print the peer table of `sim alltoall` result.json files (their FBKV trials; "
                        "several: the trials of all, e.g. runs of other seeds on the same scale)")
    p.add_argument("--cache", default=None, metavar="DIR",
                   help="with --result: also the trials this trial cache holds that the result files do not")
    p.add_argument("--slowdown", nargs="+", default=None, metavar="PROTOCOL",
                   help="with --result: also the per-job slowdown (JCT / unloaded) by job size, and what each job sent, "
                        "for these protocols")
    args = p.parse_args(argv)
    if args.result:
        try:
            docs = []
            for path in args.result:
                with open(path) as f:
                    docs.append(json.load(f))
            doc = {**docs[0], "runs": merged_runs(*(d["runs"] for d in docs),
                                                  runs_from_cache(Path(args.cache)) if args.cache else [])}
            rows, msrs = rows_from_result(doc)
        except (OSError, ValueError, KeyError) as exc:
            print(f"{p.prog}: error: cannot read --result {args.result}: {exc}", file=sys.stderr)
            return 2
        if not rows:
            print(f"{p.prog}: no FBKV trials in {' '.join(args.result)}", file=sys.stderr)
            return 2
        print("\n".join(peer_table(rows, msrs)))
        if args.slowdown:
            print("\n" + "\n".join(slowdown_table(doc, args.slowdown)))
            print("\n" + "\n".join(sent_table(doc, args.slowdown)))
        return 0
    result = run(seeds=tuple(args.seeds))
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if "error" not in result else 2


if __name__ == "__main__":
    sys.exit(main())
