"""``make bench``: a fixed suite of comparisons measured side by side in one run (needs root for the network part).

Every number is a ratio of two things measured in this run, on this machine, with the same seeds:

1. the papers' comparisons on the emulated rack (``bench.network``): ATP on NetApprox switches against
   TCP-EarlySend / TCP-SampleSend on a network-oblivious FIFO switch with the same buffer, in contention among
   approximate jobs (all-to-all FBKV/FBHD, incast), next to approximate background, and next to
   non-approximate web-search flows (approximate JCT and the flows' FCT); ATP alone against the physical
   bound; two extra rows from the first benchmark, named for what they measure;
2. hostlib on loopback: ATP sender + receiver packets/s next to a raw Python UDP loop (``bench.hostlib``);
3. the controller: epoch cost at 10,000 jobs, report ingest rate, report-to-write latency (``bench.controller``);
4. the ns-3 data-center scale row, when ``bench.sim`` and ns-3 are installed: ATP against DCTCP and against the
   best of every peer transport (pFabric, Homa, Aeolus, ExpressPass) on a k=4 fat-tree;
5. loss recovery: one job through a lossy relay on loopback at random loss 0.3 / 0.6 / 0.9 and in bursts, its JCT
   over the ideal (``bench.loss``);
6. approximate analytics: the paper's Fig. 15 on the emulated testbed, ATP-S1&2 (and ATP-S1) against TCP-ES / TCP-SS
   per e_max (``bench.analytics``);
7. streaming analytics: the paper's Fig. 17 (window averages) on the emulated testbed, ATP-S1's goodput against
   TCP-ES's (``bench.analytics_stream``).
8. analytics with several sources: Fig. 15's input split over three sources sending to the worker at once, ATP-S1
   against TCP-ES / TCP-SS per e_max (``bench.analytics_sources``).

Writes ``results/bench.json`` (its ``headline`` object keeps the same keys across versions; a value is null
when it was not measured), ``results/bench.md`` and ``results/bench.csv`` (one row per trial), and prints a
line per trial while it runs. ``--sections`` runs a subset, ``--seeds`` changes the seeds. ``--headline-doc FILE``
(``make bench``: docs/bench-headline.json, committed) merges the headline into FILE with each key's bar
(``HEADLINE_BARS``) and description (``HEADLINE_ABOUT``); README's results table is generated from it
(experiments/headline.py). A new headline key needs only its entry in ``HEADLINE_KEYS`` (and, for the table, in
those two dicts).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from netapprox.bench import analytics as bench_analytics
from netapprox.bench import analytics_sources as bench_analytics_sources
from netapprox.bench import analytics_stream as bench_analytics_stream
from netapprox.bench import controller as bench_controller
from netapprox.bench import hostlib as bench_hostlib
from netapprox.bench import loss as bench_loss
from netapprox.bench import network as N
from netapprox.bench import sim as bench_sim
from netapprox.experiments import headline as headline_doc
from netapprox.experiments.emulated import Scale
from netapprox.hostlib import checks as C
from netapprox.experiments.results import Progress, environment, git_commit, now_utc, write_csv
from netapprox.topo.netns import stop_on_signals

NETWORK_SECTIONS = N.SECTIONS
OTHER_SECTIONS = ("hostlib", "controller", "sim", "loss", "analytics", "analytics-stream", "analytics-sources")
HEADLINE_KEYS = (
    "atp_over_tcp_es_fifo", "atp_over_tcp_ss_fifo", "atp_over_tcp_es_background", "atp_over_bound_idle",
    "msr_met_fraction", "nonapprox_fct_netapprox_over_fifo", "hostlib_pps_over_raw_udp", "hostlib_loopback_gbps",
    "controller_epoch_ms_10k", "controller_reports_per_s", "sim_atp_over_dctcp_es", "sim_atp_over_dctcp_ss",
    "sim_atp_p99_over_dctcp_es", "sim_atp_network_drop_frac", "sim_atp_over_best_peer", "sim_atp_p99_over_best_peer",
    "hostlib_jct_under_flood_over_alone", "hostlib_jct_under_receiver_attacks_over_alone",
    "leafspine_atp_over_tcp_es", "leafspine_spray_over_flowhash",
    "atp_jct_under_loss_over_ideal",
    "analytics_jct_over_tcp_es", "analytics_error_over_emax",
    "analytics_stream_goodput_over_tcp_es",
    "analytics_sources_jct_over_tcp_es",
)
HEADLINE_ABOUT = {
    "atp_over_tcp_es_fifo": "all-to-all FBKV, ATP JCT / TCP-ES JCT on a FIFO switch, per MSR",
    "atp_over_tcp_ss_fifo": "the same against TCP-SS",
    "atp_over_tcp_es_background": "one job next to 70 % approximate background, ATP / TCP-ES",
    "atp_over_bound_idle": "ATP alone on an idle link, JCT / physical bound, per Mbit/s and MSR",
    "msr_met_fraction": "ATP jobs that met their MSR",
    "nonapprox_fct_netapprox_over_fifo": "web-search flows' FCT next to ATP on NetApprox / next to TCP-ES on FIFO",
    "hostlib_pps_over_raw_udp": "ATP sender + receiver packets/s / a raw UDP loop's",
    "hostlib_loopback_gbps": "ATP goodput over loopback, Gbit/s",
    "controller_epoch_ms_10k": "controller epoch at 10,000 jobs, ms",
    "controller_reports_per_s": "reports/s the controller accepts of 120,000 offered",
    "sim_atp_over_dctcp_es": "ns-3 k=4 fat-tree, all-to-all FBKV, ATP / DCTCP-ES mean JCT",
    "sim_atp_over_dctcp_ss": "the same against DCTCP-SS",
    "sim_atp_p99_over_dctcp_es": "the same, p99 JCT",
    "sim_atp_network_drop_frac": "ns-3: ATP payloads the network dropped or trimmed",
    "sim_atp_over_best_peer": "ns-3 k=4 fat-tree, all-to-all FBKV, ATP mean JCT / the fastest peer's (DCTCP, pFabric, "
                              "Homa, Aeolus, ExpressPass, each ES/SS/SmallestSend), per MSR",
    "sim_atp_p99_over_best_peer": "the same, p99 JCT / the peer with the least p99",
    "hostlib_jct_under_flood_over_alone": "a job's JCT under a forged flood / alone",
    "hostlib_jct_under_receiver_attacks_over_alone": "a job's JCT under receiver attacks / alone",
    "leafspine_atp_over_tcp_es": "emulated 2x2 leaf-spine, all-to-all FBKV, ATP (spraying) / TCP-ES JCT, per MSR",
    "leafspine_spray_over_flowhash": "the same, ATP with spraying / ATP with flow hashing, per MSR",
    "atp_jct_under_loss_over_ideal": "one job through a lossy relay, JCT / ideal, per loss pattern, the worse core "
                                     "(bars: <= 2 at random loss up to 0.6, <= 3 at 0.9 and in bursts: bench.json's "
                                     "bars)",
    "analytics_jct_over_tcp_es": "Avg of generated TLC trips within e_max next to web-search flows (Fig. 15), "
                                 "ATP-S1&2 / TCP-ES JCT (both stages, input and map->reduce), per e_max",
    "analytics_error_over_emax": "the same, ATP-S1&2's largest measured error / e_max, per e_max",
    "analytics_stream_goodput_over_tcp_es": "hourly windows of a generated TLC day, Avg within e_max next to "
                                            "web-search flows (Fig. 17), ATP-S1 / TCP-ES goodput, per e_max",
    "analytics_sources_jct_over_tcp_es": "Fig. 15's input split over three sources into one worker (the paper's "
                                         "three brokers), ATP-S1&2 / TCP-ES JCT (both stages), per e_max",
}
"""What each headline key measures, in a few words (README's table; a key without one shows its name only)."""
HEADLINE_BARS = {
    "atp_over_tcp_es_fifo": "<= 0.5", "atp_over_tcp_es_background": "<= 0.5", "atp_over_bound_idle": "<= 1.10",
    "msr_met_fraction": "== 1", "nonapprox_fct_netapprox_over_fifo": "<= 0.3",
    "controller_epoch_ms_10k": "median < 10, p99 < 20", "controller_reports_per_s": ">= 100000",
    "hostlib_pps_over_raw_udp": ">= 0.8", "hostlib_loopback_gbps": ">= 1",
    "sim_atp_over_dctcp_es": "< 0.7", "sim_atp_p99_over_dctcp_es": "<= 1", "sim_atp_network_drop_frac": "<= 0.05",
    "sim_atp_over_best_peer": "< 1",
    "hostlib_jct_under_flood_over_alone": "<= 2", "hostlib_jct_under_receiver_attacks_over_alone": "<= 2",
    "leafspine_atp_over_tcp_es": "<= 0.5", "leafspine_spray_over_flowhash": "<= 0.9",
    "analytics_jct_over_tcp_es": "<= 0.7", "analytics_error_over_emax": "<= 1",
    "analytics_stream_goodput_over_tcp_es": ">= 1.3",
    "analytics_sources_jct_over_tcp_es": "<= 0.7",
}
"""Each headline key's bar, ``[leaf] op limit`` (every number of the value, or its leaves named ``leaf``, must
meet it), or several such parts separated by commas, each to be met; experiments/headline.py checks it for README's
table. A key without a bar has none to meet."""


def _mean(xs: Iterable[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _jcts(rows: Sequence[dict]) -> list[float | None]:
    return [j for r in rows for j in (r.get("jcts_s") or [None])]


def _mean_jct(rows: Sequence[dict]) -> float | None:
    """Mean JCT over every job of ``rows`` (a job that did not complete makes the mean unknown)."""
    jcts = _jcts(rows)
    return None if not jcts or any(j is None for j in jcts) else sum(jcts) / len(jcts)


def _per_seed(rows: Sequence[dict], a: str, b: str) -> list[float | None]:
    seeds = sorted({r["seed"] for r in rows})
    return [_ratio(_mean_jct([r for r in rows if r["seed"] == s and r["protocol"] == a]),
                   _mean_jct([r for r in rows if r["seed"] == s and r["protocol"] == b])) for s in seeds]


def _pick(rows: Sequence[dict], **match: Any) -> list[dict]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items()) and not r.get("error")]


def summarize(rows: Sequence[dict]) -> dict:
    """Per-section summaries of the network rows (means over seeds and jobs, ratios, per-seed ratios)."""
    s: dict[str, Any] = {}
    contention: dict[str, Any] = {}
    for pattern in N.CONTENTION_PATTERNS:
        for msr in N.MSRS:
            rs = _pick(rows, section="contention", pattern=pattern, msr=msr)
            if not rs:
                continue
            by = {p: [r for r in rs if r["protocol"] == p] for p in N.CONTENTION_PROTOCOLS}
            jct = {p: _mean_jct(v) for p, v in by.items()}
            contention[f"{pattern}/{msr}"] = {
                "pattern": pattern, "msr": msr, "jct_mean_s": jct,
                "atp_over_tcp_es": _ratio(jct["atp"], jct["tcp-es"]),
                "atp_over_tcp_ss": _ratio(jct["atp"], jct["tcp-ss"]),
                "atp_over_tcp_es_per_seed": _per_seed(rs, "atp", "tcp-es"),
                "atp_over_tcp_ss_per_seed": _per_seed(rs, "atp", "tcp-ss"),
                "delivered_bytes_frac": {p: _mean(r.get("delivered_bytes_frac") for r in v) for p, v in by.items()},
                "jobs_done": {p: sum(1 for j in _jcts(v) if j is not None) for p, v in by.items()},
                "jobs": {p: len(_jcts(v)) for p, v in by.items()},
            }
    s["contention"] = contention
    for section in ("background", "background-same-queue"):
        background = {}
        for msr in N.MSRS:
            rs = _pick(rows, section=section, msr=msr)
            if rs:
                a, t = _mean_jct(_pick(rs, protocol="atp")), _mean_jct(_pick(rs, protocol="tcp-es"))
                background[str(msr)] = {"atp_jct_s": a, "tcp_es_jct_s": t, "atp_over_tcp_es": _ratio(a, t),
                                        "per_seed": _per_seed(rs, "atp", "tcp-es")}
        s[section] = background
    s["coexist"] = _fct_compare(_pick(rows, section="coexist"), "protocol", "atp", "tcp-es")
    s["queues"] = _fct_compare(_pick(rows, section="queues"), "switch", "netapprox", "fifo")
    idle = {}
    for rate in N.IDLE_RATES_MBIT:
        for msr in N.MSRS:
            rs = _pick(rows, section="idle", rate_mbit=rate, msr=msr)
            if rs:
                idle.setdefault(f"{rate:g}", {})[str(msr)] = {
                    "jct_over_wire_bound": _mean(r.get("jct_over_wire_bound") for r in rs),
                    "jct_over_bound": _mean(r.get("jct_over_bound") for r in rs),
                    "jct_mean_s": _mean_jct(rs), "runs": len(rs)}
    s["idle"] = idle
    yld = {}
    for msr in N.YIELD_MSRS:
        rs = _pick(rows, section="yield", msr=msr)
        if rs:
            a, t = _mean_jct(_pick(rs, protocol="atp")), _mean_jct(_pick(rs, protocol="tcp-es"))
            yld[str(msr)] = {"atp_jct_s": a, "tcp_es_in_queue0_jct_s": t, "atp_over_tcp_es": _ratio(a, t)}
    s["yield"] = yld
    leafspine = {}
    for msr in N.LEAFSPINE_MSRS:
        rs = _pick(rows, section="leafspine", msr=msr)
        if rs:
            jct = {p: _mean_jct(_pick(rs, protocol=p)) for p in N.LEAFSPINE_PROTOCOLS}
            leafspine[str(msr)] = {
                "jct_mean_s": jct, "atp_over_tcp_es": _ratio(jct["atp"], jct["tcp-es"]),
                "spray_over_flowhash": _ratio(jct["atp"], jct["atp-flowhash"]),
                "atp_over_tcp_es_per_seed": _per_seed(rs, "atp", "tcp-es"),
                "spray_over_flowhash_per_seed": _per_seed(rs, "atp", "atp-flowhash"),
                "delivered_bytes_frac": {p: _mean(r.get("delivered_bytes_frac") for r in _pick(rs, protocol=p))
                                         for p in N.LEAFSPINE_PROTOCOLS},
                "jobs_done": {p: sum(1 for j in _jcts(_pick(rs, protocol=p)) if j is not None)
                              for p in N.LEAFSPINE_PROTOCOLS},
                "runs": {p: len(_pick(rs, protocol=p)) for p in N.LEAFSPINE_PROTOCOLS}}
    s["leafspine"] = leafspine
    atp_jobs = [m for r in rows if r.get("protocol", "").startswith("atp") for m in (r.get("msr_met") or [])]
    s["msr_met"] = {"jobs": len(atp_jobs), "met": sum(atp_jobs),
                    "fraction": sum(atp_jobs) / len(atp_jobs) if atp_jobs else None}
    s["errors"] = [{"section": r["section"], "protocol": r["protocol"], "seed": r["seed"], "error": r["error"]}
                   for r in rows if r.get("error")]
    return s


def _fct_compare(rows: Sequence[dict], key: str, a: str, b: str) -> dict:
    """Non-approximate flows' FCT and the approximate jobs' JCT for ``key`` = a vs b."""
    if not rows:
        return {}
    out: dict[str, Any] = {}
    for side in (a, b):
        rs = [r for r in rows if r.get(key) == side]
        out[side] = {"fct_mean_s": _mean(r.get("fct_all_mean") for r in rs),
                     "fct_p99_s": _mean(r.get("fct_all_p99") for r in rs),
                     "fct_small_mean_s": _mean(r.get("fct_small_mean") for r in rs),
                     "flows_unfinished": sum(r.get("flows_all_unfinished") or 0 for r in rs),
                     "approx_jct_mean_s": _mean_jct(rs),
                     "approx_delivered_bytes_frac": _mean(r.get("delivered_bytes_frac") for r in rs)}
    out["fct_mean_ratio"] = _ratio(out[a]["fct_mean_s"], out[b]["fct_mean_s"])
    out["fct_p99_ratio"] = _ratio(out[a]["fct_p99_s"], out[b]["fct_p99_s"])
    out["approx_jct_ratio"] = _ratio(out[a]["approx_jct_mean_s"], out[b]["approx_jct_mean_s"])
    out["compared"] = f"{a} / {b}"
    return out


def headline(summary: dict | None, parts: dict) -> dict:
    """The stable ``headline`` object: every key always present, null where not measured."""
    h: dict[str, Any] = {k: None for k in HEADLINE_KEYS}
    if summary:
        c = summary["contention"]
        h["atp_over_tcp_es_fifo"] = {str(m): c.get(f"alltoall-fbkv/{m}", {}).get("atp_over_tcp_es") for m in N.MSRS}
        h["atp_over_tcp_ss_fifo"] = {str(m): c.get(f"alltoall-fbkv/{m}", {}).get("atp_over_tcp_ss") for m in N.MSRS}
        h["atp_over_tcp_es_background"] = {m: v["atp_over_tcp_es"] for m, v in summary["background"].items()} or None
        h["atp_over_bound_idle"] = {r: {m: v["jct_over_wire_bound"] for m, v in by.items()}
                                    for r, by in summary["idle"].items()} or None
        h["msr_met_fraction"] = summary["msr_met"]["fraction"]
        co = summary["coexist"]
        if co:
            h["nonapprox_fct_netapprox_over_fifo"] = {"mean": co["fct_mean_ratio"], "p99": co["fct_p99_ratio"]}
        ls = summary.get("leafspine") or {}
        if ls:
            h["leafspine_atp_over_tcp_es"] = {m: v["atp_over_tcp_es"] for m, v in ls.items()}
            h["leafspine_spray_over_flowhash"] = {m: v["spray_over_flowhash"] for m, v in ls.items()}
    for part in parts.values():
        for k, v in ((part or {}).get("headline") or {}).items():
            if k in h:
                h[k] = v
    return h


def bars(h: dict, summary: dict | None) -> dict:
    """The issues' bars, checked against this run (None: not measured here)."""
    def all_le(d, limit):
        vals = [v for v in (d or {}).values() if v is not None] if isinstance(d, dict) else []
        return None if not vals else all(v <= limit for v in vals)
    out: dict[str, Any] = {}
    if summary:
        c = summary["contention"]
        for pattern in N.CONTENTION_PATTERNS:
            vals = {k: v["atp_over_tcp_es"] for k, v in c.items() if v["pattern"] == pattern}
            out[f"atp_over_tcp_es_{pattern}_le_0.5"] = all_le(vals, 0.5)
        out["atp_over_tcp_es_background_le_0.5"] = all_le(h["atp_over_tcp_es_background"], 0.5)
        idle = h["atp_over_bound_idle"] or {}
        out["atp_over_bound_idle_le_1.10"] = all_le({f"{r}/{m}": v for r, by in idle.items() for m, v in by.items()},
                                                     1.10)
        out["msr_met_fraction_is_1"] = None if h["msr_met_fraction"] is None else h["msr_met_fraction"] == 1.0
        out["nonapprox_fct_le_0.3_of_tcp_es_fifo"] = all_le(h["nonapprox_fct_netapprox_over_fifo"], 0.3)
        out["leafspine_atp_over_tcp_es_le_0.5"] = all_le(h["leafspine_atp_over_tcp_es"], 0.5)
        out["leafspine_spray_over_flowhash_le_0.9"] = all_le(h["leafspine_spray_over_flowhash"], 0.9)
    for key in ("hostlib_jct_under_flood_over_alone", "hostlib_jct_under_receiver_attacks_over_alone"):
        out[f"{key}_le_2"] = None if h.get(key) is None else h[key] <= 2.0
    loss = h.get("atp_jct_under_loss_over_ideal")
    if loss:  # 2 at random loss up to 0.6, 3 beyond and under bursts (a pattern that failed is None: not met)
        out["atp_jct_under_loss_over_ideal_le_2_le_3"] = all(
            v is not None and v <= (2.0 if "burst" not in k and bench_loss.PATTERNS[k][1] <= 0.6 else 3.0)
            for k, v in loss.items())
    best = h.get("sim_atp_over_best_peer")
    if best:  # the goal: ATP ahead of the fastest peer at every MSR (bench.sim's k=4 row)
        out["sim_atp_over_best_peer_lt_1"] = all(v is not None and v < 1.0 for v in best.values())
    for key, limit in (("analytics_jct_over_tcp_es", 0.7), ("analytics_error_over_emax", 1.0),
                       ("analytics_sources_jct_over_tcp_es", 0.7)):
        v = h.get(key)
        if v:
            out[f"{key}_le_{limit:g}"] = all(x is not None and x <= limit for x in v.values())
    v = h.get("analytics_stream_goodput_over_tcp_es")
    if v:
        out["analytics_stream_goodput_over_tcp_es_ge_1.3"] = all(x is not None and x >= 1.3 for x in v.values())
    return out


def _part(name: str, fn: Callable[[], dict]) -> dict:
    try:
        return fn()
    except Exception as exc:  # a part that breaks is reported, the others still run
        return {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=4)}


def _hostlib(progress: Callable[[str], None]) -> dict:
    return bench_hostlib.run(quick=True, progress=progress)


def _controller(progress: Callable[[str], None]) -> dict:
    res = bench_controller.run(progress=progress)
    return {**res, "headline": {k: res.get(k) for k in ("controller_epoch_ms_10k", "controller_reports_per_s")}}


def _sim(progress: Callable[[str], None]) -> dict:
    return bench_sim.run(progress=progress)


def _loss(progress: Callable[[str], None]) -> dict:
    return bench_loss.run(progress=progress)


def _analytics(progress: Callable[[str], None], seeds: Sequence[int]) -> dict:
    if os.geteuid() != 0:
        return {"skipped": "the analytics section runs on the emulated testbed: it needs root"}
    return bench_analytics.run(seeds, progress=progress)


def _analytics_stream(progress: Callable[[str], None], seeds: Sequence[int]) -> dict:
    if os.geteuid() != 0:
        return {"skipped": "the analytics-stream section runs on the emulated testbed: it needs root"}
    return bench_analytics_stream.run(seeds, progress=progress)


def _analytics_sources(progress: Callable[[str], None], seeds: Sequence[int]) -> dict:
    if os.geteuid() != 0:
        return {"skipped": "the analytics-sources section runs on the emulated testbed: it needs root"}
    return bench_analytics_sources.run(seeds, progress=progress)


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "**no**"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    if isinstance(x, list):
        return "[" + ", ".join(_fmt(v, 2) for v in x) + "]"
    return str(x)


def markdown(doc: dict) -> str:
    meta, s, h = doc["meta"], doc["summary"], doc["headline"]
    env = meta["environment"]
    lines = [f"# make bench ({meta['finished_utc']}, commit {meta['git_commit'] or '?'})", "",
             f"Kernel switches, {meta['scale']['rate_mbit']:g} Mbit/s ports, {meta['scale']['buffer_packets']}-packet "
             f"port buffer (NetApprox: queue 0 gets {meta['scale']['buffer_packets'] - 28}, queues 1-7 hold 7..1; "
             f"FIFO: one queue of {meta['scale']['buffer_packets']}), TCP `{env['tcp_cc']}` (ECN "
             f"{env.get('tcp_ecn')}, min RTO {env.get('tcp_rto_min_ms')} ms, initial window "
             f"{env.get('tcp_initcwnd')}), seeds {meta['seeds']}, {meta['duration_s'] / 60:.1f} min"
             + (" (" + ", ".join(f"{k} {v / 60:.1f}" for k, v in meta["wall_s"].items()) + ")"
                if meta.get("wall_s") else "") + ". Ratios below 1 favour ATP.",
             "", "## Headline", "", "```", json.dumps(h, indent=1), "```", "",
             "| bar | met |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in doc["bars"].items()]
    if s and s["contention"]:
        lines += ["", "## Contention among approximate jobs (Fig. 5-9): ATP on NetApprox vs TCP on a FIFO switch", "",
                  "| pattern | MSR | ATP JCT (s) | TCP-ES JCT (s) | TCP-SS JCT (s) | ATP/ES | ATP/SS | ATP/ES per seed "
                  "| bytes delivered ATP / ES / SS | jobs done ATP / ES / SS |", "|---|---|---|---|---|---|---|---|---|---|"]
        for v in s["contention"].values():
            j, b, d, n = v["jct_mean_s"], v["delivered_bytes_frac"], v["jobs_done"], v["jobs"]
            lines.append(f"| {v['pattern']} | {v['msr']} | {_fmt(j['atp'])} | {_fmt(j['tcp-es'])} | {_fmt(j['tcp-ss'])} "
                         f"| {_fmt(v['atp_over_tcp_es'])} | {_fmt(v['atp_over_tcp_ss'])} | "
                         f"{_fmt(v['atp_over_tcp_es_per_seed'])} | {_fmt(b['atp'], 2)} / {_fmt(b['tcp-es'], 2)} / "
                         f"{_fmt(b['tcp-ss'], 2)} | {d['atp']}/{n['atp']} / {d['tcp-es']}/{n['tcp-es']} / "
                         f"{d['tcp-ss']}/{n['tcp-ss']} |")
    if s:
        for key, title in (("background", f"One job next to approximate background ({N.BACKGROUND_LOAD:.0%} of the "
                                           f"link, TLR {N.BACKGROUND_TLR}; Fig. 11): ATP vs TCP-ES on the FIFO switch"),
                           ("background-same-queue", "Extra row: the same background always in the job's initial "
                                                     "queue (adversarial)")):
            if not s.get(key):
                continue
            lines += ["", f"## {title}", "", "| MSR | ATP JCT (s) | TCP-ES JCT (s) | ATP/ES | per seed |",
                      "|---|---|---|---|---|"]
            for m, v in s[key].items():
                lines.append(f"| {m} | {_fmt(v['atp_jct_s'])} | {_fmt(v['tcp_es_jct_s'])} | "
                             f"{_fmt(v['atp_over_tcp_es'])} | {_fmt(v['per_seed'])} |")
        for key, title in (("coexist", f"Next to non-approximate web-search flows (Fig. 13): NetApprox vs TCP-ES on "
                                        f"a FIFO switch, MSR {N.COEXIST_MSR}, flows at {N.COEXIST_FLOW_LOAD:.0%}"),
                           ("queues", "Extra row: the same ATP jobs next to the flows, NetApprox queues vs a FIFO "
                                      "switch (what the queues do for non-approximate traffic)")):
            v = s[key]
            if not v:
                continue
            a, b = v["compared"].split(" / ")
            lines += ["", f"## {title}", "", f"| | {a} | {b} | {v['compared']} |", "|---|---|---|---|"]
            for k, label in (("fct_mean_s", "flows: mean FCT (s)"), ("fct_p99_s", "flows: p99 FCT (s)"),
                             ("fct_small_mean_s", "flows < 100 KB: mean FCT (s)"),
                             ("approx_jct_mean_s", "approximate jobs: mean JCT (s)"),
                             ("approx_delivered_bytes_frac", "approximate jobs: bytes delivered")):
                ratio = {"fct_mean_s": v["fct_mean_ratio"], "fct_p99_s": v["fct_p99_ratio"],
                         "approx_jct_mean_s": v["approx_jct_ratio"]}.get(k)
                lines.append(f"| {label} | {_fmt(v[a][k], 4)} | {_fmt(v[b][k], 4)} | {_fmt(ratio)} |")
            lines.append(f"| flows unfinished | {v[a]['flows_unfinished']} | {v[b]['flows_unfinished']} | |")
        if s["idle"]:
            lines += ["", "## ATP alone on an idle link: JCT / physical bound (the MSR·N messages' packets on the wire, "
                      "headers included) and, after the slash, JCT / (MSR·N·size·8 / rate)", "",
                      "| rate | " + " | ".join(f"MSR {m}" for m in N.MSRS) + " |", "|---|" + "---|" * len(N.MSRS)]
        for r, by in s["idle"].items():
            cells = [by.get(str(m), {}) for m in N.MSRS]
            lines.append(f"| {r} Mbit/s | " + " | ".join(f"{_fmt(c.get('jct_over_wire_bound'))} / "
                                                        f"{_fmt(c.get('jct_over_bound'))}" for c in cells) + " |")
        if s["yield"]:
            lines += ["", "## Extra row: ATP below TCP-ES in queue 0 (how much ATP yields to non-approximate traffic; "
                      "not a race)", "", "| MSR | ATP JCT (s) | TCP-ES in queue 0 JCT (s) | ATP/ES |", "|---|---|---|---|"]
        for m, v in s["yield"].items():
            lines.append(f"| {m} | {_fmt(v['atp_jct_s'])} | {_fmt(v['tcp_es_in_queue0_jct_s'])} | "
                         f"{_fmt(v['atp_over_tcp_es'])} |")
        if s.get("leafspine"):
            lines += ["", "## Multi-path: all-to-all FBKV on an emulated leaf-spine (2 leaves x 2 spines, 2 hosts per "
                      f"leaf, leaf-spine links at 1/{N.LEAFSPINE_OVERSUBSCRIPTION:g} of the host rate): ATP with "
                      "spraying vs ATP with flow hashing vs TCP-ES on FIFO switches; runs of each seed: "
                      + ", ".join(f"{p} {n}" for p, n in N.LEAFSPINE_RUNS.items())
                      + " (JCT: the mean over every job of every run)", "",
                      "| MSR | ATP JCT (s) | ATP flow-hash JCT (s) | TCP-ES JCT (s) | ATP/ES | spray/flow-hash | "
                      "ATP/ES per seed | spray/flow-hash per seed |", "|---|---|---|---|---|---|---|---|"]
            for m, v in s["leafspine"].items():
                j = v["jct_mean_s"]
                lines.append(f"| {m} | {_fmt(j['atp'])} | {_fmt(j['atp-flowhash'])} | {_fmt(j['tcp-es'])} | "
                             f"{_fmt(v['atp_over_tcp_es'])} | {_fmt(v['spray_over_flowhash'])} | "
                             f"{_fmt(v['atp_over_tcp_es_per_seed'])} | {_fmt(v['spray_over_flowhash_per_seed'])} |")
        mm = s["msr_met"]
        lines += ["", f"ATP jobs that met every group's MSR: **{mm['met']}/{mm['jobs']}**."]
        if s["errors"]:
            lines += ["", "Trials that failed:", *[f"- {e}" for e in s["errors"]]]
    for name in OTHER_SECTIONS:
        part = doc.get(name)
        if part is None:
            continue
        lines += ["", f"## {name}", ""]
        if "error" in part or "skipped" in part:
            lines.append(f"not measured: {part.get('error') or part.get('skipped')}")
        else:
            lines.append(f"headline: `{json.dumps(part.get('headline'))}`; details in bench.json")
    return "\n".join(lines) + "\n"


def tcp_environment() -> dict:
    """Settings of the TCP baselines worth recording (the testbed's routes set neither RTO nor window)."""
    def read(path: str) -> str | None:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return None
    return {"tcp_ecn": read("/proc/sys/net/ipv4/tcp_ecn"), "tcp_rto_min_ms": 200, "tcp_initcwnd": 10}


def main(argv: Sequence[str] | None = None) -> int:
    p = C.OneLineParser(prog="python -m netapprox.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds of the network sections")
    p.add_argument("--out", default="results", help="directory of bench.json and bench.csv")
    p.add_argument("--sections", nargs="+", choices=NETWORK_SECTIONS + OTHER_SECTIONS,
                   default=list(NETWORK_SECTIONS + OTHER_SECTIONS),
                   help="run only these parts (default: all of them)")
    p.add_argument("--skip-network", action="store_true", help="only hostlib, controller and sim (no root needed)")
    p.add_argument("--headline-doc", default=None, metavar="FILE",
                   help="also merge this run's headline into FILE (make bench: docs/bench-headline.json, README's "
                        "table; experiments/headline.py), keeping the keys this run did not measure (default: none)")
    args = p.parse_args(argv)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"{p.prog}: error: cannot create --out {out}: {exc.strerror}", file=sys.stderr)
        return 2
    sections = [s for s in args.sections
                if not (args.skip_network and (s in NETWORK_SECTIONS
                                               or s in ("analytics", "analytics-stream", "analytics-sources")))]
    net_sections = [s for s in sections if s in NETWORK_SECTIONS]
    if net_sections and os.geteuid() != 0:
        print(f"{p.prog}: error: the network sections need root (namespaces, qdiscs); use --skip-network",
              file=sys.stderr)
        return 2
    stop_on_signals()  # SIGTERM/SIGHUP clean up like Ctrl-C: every testbed's processes and namespaces go
    scale = Scale()
    t0 = time.monotonic()
    started = now_utc()
    plan = N.trials(args.seeds, scale, sections=net_sections) if net_sections else []
    progress = Progress(len(plan) + sum(1 for s in sections if s in OTHER_SECTIONS))
    rows = N.run(plan, scale, out / "bench", progress) if plan else []
    wall = {"network": round(time.monotonic() - t0, 1)} if plan else {}
    parts: dict[str, dict] = {}
    for name, fn in (("hostlib", lambda: _hostlib(lambda line: progress.note("hostlib: " + line))),
                     ("controller", lambda: _controller(lambda line: progress.note("controller: " + line))),
                     ("sim", lambda: _sim(lambda line: progress.note("sim: " + line))),
                     ("loss", lambda: _loss(lambda line: progress.note("loss: " + line))),
                     ("analytics", lambda: _analytics(lambda line: progress.note("analytics: " + line), args.seeds)),
                     ("analytics-stream", lambda: _analytics_stream(
                         lambda line: progress.note("analytics-stream: " + line), args.seeds)),
                     ("analytics-sources", lambda: _analytics_sources(
                         lambda line: progress.note("analytics-sources: " + line), args.seeds))):
        if name in sections:
            progress.note(f"{name}: running")
            t_part = time.monotonic()
            parts[name] = _part(name, fn)
            wall[name] = round(time.monotonic() - t_part, 1)
            progress.step(name, json.dumps(parts[name].get("headline")
                                           or parts[name].get("error") or parts[name].get("skipped")))
    summary = summarize(rows) if rows else None
    h = headline(summary, parts)
    meta = {"started_utc": started, "finished_utc": now_utc(), "duration_s": time.monotonic() - t0, "wall_s": wall,
            "seeds": args.seeds, "sections": sections, "scale": dataclasses.asdict(scale),
            "environment": {**environment(), **tcp_environment()}, "git_commit": git_commit(),
            "command": ["python", "-m", "netapprox.bench", *(sys.argv[1:] if argv is None else argv)]}
    doc = {"headline": h, "bars": bars(h, summary), "meta": meta, "summary": summary, **parts, "rows": rows}
    (out / "bench.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / "bench.md").write_text(markdown(doc))
    if rows:
        write_csv(rows, out / "bench.csv")
    print(markdown(doc))
    print(f"wrote {out / 'bench.json'}, {out / 'bench.md'}" + (f", {out / 'bench.csv'}" if rows else ""))
    if args.headline_doc:
        path = Path(args.headline_doc)
        old = json.loads(path.read_text()) if path.exists() else None
        headline_doc.write_file(path, headline_doc.merge(old, h, meta, HEADLINE_BARS, HEADLINE_ABOUT))
        print(f"wrote {path} (README's table: python -m netapprox.experiments.report --readme README.md --no-doc)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
