"""Each peer transport against its own paper's headline trend, in this simulator, before it is compared with ATP.

    python -m netapprox.experiments.sim.validate pfabric|homa|aeolus [--loads 0.6 0.8] [--seeds 1 2] [--ms 2] [--out results]

``pfabric``: pFabric's §5 setting (Alizadeh et al. 2013): a 144-host leaf-spine (9 leaves x 16 hosts, 4 spines,
10 Gbit/s hosts, 40 Gbit/s fabric), web-search flows with Poisson arrivals at a load of each host link,
pFabric against DCTCP; the metric is the flow completion time normalized to the flow's unloaded time (its
bytes at line rate plus its path's propagation and store-and-forward delay), mean and 99th percentile, for
small flows ((0, 100 KB]) and all flows. ``homa``: Homa against pFabric on the same setting (Homa's paper
compares short messages' 99th-percentile slowdown with pFabric's and DCTCP's at high load). ``aeolus``: Aeolus
against ExpressPass (its base credit transport) on the same setting (Aeolus' paper: the average FCT of
ExpressPass improved by 56 %). Each flow is a one-message job with MSR 1 (``pfabric-es`` /
``dctcp-es``: the same bytes on the wire). Writes ``<out>/sim/validate-<peer>/result.json`` and prints the table
of docs/simulation.md ("Peer transports: validation"). CPU-heavy: run under ``nice -n 19``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from netapprox.experiments.jobs import JobWorkload
from netapprox.experiments.plans import JobPlan
from netapprox.experiments.results import percentile
from netapprox.experiments.sim import trial as T
from netapprox.experiments.sim.topology import PPP_HEADER, TopologyConfig
from netapprox.experiments.workloads import web_search_flows

SMALL_BYTES = 100_000
PFABRIC_TOPOLOGY = TopologyConfig(kind="clos", leaves=9, spines=4, hosts_per_leaf=16, host_gbps=10.0,
                                  fabric_gbps=40.0)


def unloaded_fct_s(topo: TopologyConfig, size: int, same_switch: bool, mss: int = T.PFABRIC_MSS) -> float:
    """A flow's completion time in an empty fabric: its packets at the host rate, plus the path's propagation
    (data one way, the last ACK back) and one store-and-forward of a full packet at every switch (at the rate
    of the link it leaves on)."""
    pkts = max(1, -(-size // mss))
    wire = size + pkts * (T.MTU - mss + PPP_HEADER)
    links = 2 if same_switch else 4
    bits = 8.0 * (T.MTU + PPP_HEADER)
    fwd = bits / (topo.host_gbps * 1e9) + (links - 2) * bits / (topo.fabric_rate_gbps * 1e9)
    return wire * 8.0 / (topo.host_gbps * 1e9) + 2 * links * topo.link_delay_us * 1e-6 + fwd


def pfabric_plans(seed: int, load: float, duration_s: float, topo: TopologyConfig) -> list[JobPlan]:
    hosts = list(range(topo.n_hosts))
    flows = web_search_flows(seed, load=load, link_bps=topo.host_gbps * 1e9 * len(hosts), duration_s=duration_s,
                             senders=hosts, receivers=hosts)
    return [JobPlan(i + 1, f.src, f.dst, JobWorkload("websearch", seed, (int(f.size),), (0.0,)), 1.0, f.start_s)
            for i, f in enumerate(flows)]


def summarize(records: Sequence[dict], topo: TopologyConfig) -> dict[str, Any]:
    per_leaf = topo.hosts_per_leaf
    small, every, failed = [], [], 0
    for j in records:
        if j["jct_s"] is None:
            failed += 1
            continue
        norm = j["jct_s"] / unloaded_fct_s(topo, j["bytes"], j["src"] // per_leaf == j["dst"] // per_leaf)
        every.append(norm)
        if j["bytes"] <= SMALL_BYTES:
            small.append(norm)
    mean = lambda v: sum(v) / len(v) if v else None  # noqa: E731
    return {"flows": len(records), "failed": failed, "small_flows": len(small),
            "small_mean": mean(small), "small_p99": percentile(small, 99), "all_mean": mean(every),
            "all_p99": percentile(every, 99)}


PAIRS = {"pfabric": ("pfabric-es", "dctcp-es"), "homa": ("homa-es", "pfabric-es"),
         "aeolus": ("aeolus-es", "expresspass-es")}
"""Each peer's validation: (the peer, what its paper compares it with), both on the peer's own setting (Homa's
on pFabric's leaf-spine and web search, the closest of its W1-W5 workloads at hand; Aeolus' against its base
credit transport, ExpressPass, on the same leaf-spine and web search)."""


def validate_pfabric(loads: Sequence[float], seeds: Sequence[int], duration_s: float,
                     say: Any = print, save: Any = None, peer: str = "pfabric") -> dict[str, Any]:
    """Runs the trials of ``peer`` (``PAIRS``); ``save(partial_result)`` after each one (a long sweep keeps what
    it finished)."""
    protocols = PAIRS[peer]
    topo = PFABRIC_TOPOLOGY
    settings = T.SimSettings(topology=topo, time_limit_ms=200.0)
    rows = []
    for load in loads:
        for seed in seeds:
            plans = pfabric_plans(seed, load, duration_s, topo)
            for proto in protocols:
                t0 = time.perf_counter()
                r = T.run_trial(settings, proto, plans, seed=seed)
                s = summarize(r["jobs"], topo)
                rows.append({"load": load, "seed": seed, "protocol": proto, **s,
                             "switch_drops": r["queues"]["switch_drops"], "host_drops": r["queues"]["host_drops"],
                             "timeouts": sum(j.get("timeouts") or 0 for j in r["jobs"]),
                             "wall_s": time.perf_counter() - t0})
                say(f"load {load} seed {seed} {proto}: {s['flows']} flows ({s['failed']} unfinished), small mean "
                    f"{s['small_mean']:.2f} p99 {s['small_p99']:.2f}, all mean {s['all_mean']:.2f}, "
                    f"{time.perf_counter() - t0:.0f} s")
                if save is not None:
                    save(_result(topo, settings, duration_s, rows, peer))
    return _result(topo, settings, duration_s, rows, peer)


def _result(topo: TopologyConfig, settings: T.SimSettings, duration_s: float, rows: list[dict],
            peer: str = "pfabric") -> dict[str, Any]:
    done = [r for r in rows if sum(1 for o in rows if o["load"] == r["load"] and o["seed"] == r["seed"]) == 2]
    return {"peer": peer, "topology": topo.describe(), "settings": settings.to_dict(), "duration_s": duration_s,
            "rows": rows, "table": table(done, PAIRS[peer])}


def table(rows: Sequence[dict], protocols: Sequence[str] = PAIRS["pfabric"]) -> list[dict]:
    """Per load: each of the two protocols' metrics averaged over seeds (keyed by its name without ``-es``),
    and the second over the first for each (``dctcp_over_pfabric``)."""
    a, b = protocols
    na, nb = a.split("-")[0], b.split("-")[0]
    out: list[dict] = []
    for load in sorted({r["load"] for r in rows}):
        by = {}
        for proto in (a, b):
            rs = [r for r in rows if r["load"] == load and r["protocol"] == proto]
            by[proto] = {k: sum(r[k] for r in rs) / len(rs) for k in ("small_mean", "small_p99", "all_mean", "all_p99")}
            by[proto]["failed"] = sum(r["failed"] for r in rs)
        ratio = {k: by[b][k] / by[a][k] for k in by[a] if k != "failed"}
        out.append({"load": load, na: by[a], nb: by[b], f"{nb}_over_{na}": ratio})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netapprox.experiments.sim.validate", description=__doc__.split("\n\n")[0])
    p.add_argument("peer", choices=tuple(PAIRS))
    p.add_argument("--loads", type=float, nargs="+", default=[0.6, 0.8])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--ms", type=float, default=2.0, help="flow arrivals for this long, simulated ms")
    p.add_argument("--out", default="results")
    a = p.parse_args(argv)
    if a.ms <= 0 or any(not 0 < x < 1 for x in a.loads):
        p.error("--ms must be positive and every load in (0, 1)")
    out = Path(a.out) / "sim" / f"validate-{a.peer}"
    out.mkdir(parents=True, exist_ok=True)

    def save(res: dict) -> None:
        (out / "result.json").write_text(json.dumps(res, indent=1))

    res = validate_pfabric(a.loads, a.seeds, a.ms * 1e-3, save=save, peer=a.peer)
    save(res)
    for row in res["table"]:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
