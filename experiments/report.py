"""Write docs/results.md from the latest results/ (result.json files, bench.json) and copy the plots.

``python -m netapprox.experiments.report [--results results] [--doc docs/results.md] [--img docs/img]``.
Every number in the page comes from a result file; each section names the command that produced it.
Plots larger than 200 KB are not copied. Simulation results (``results/sim/<name>``, ``python -m
netapprox.experiments sim``) get their own section, "At data-center scale (ns-3)", with plots as
``docs/img/sim_<name>_<plot>.png``.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from netapprox.experiments import headline
from netapprox.hostlib import checks as C

MAX_PNG_BYTES = 200_000

SHIFT_METRICS = ("jct_mean_s", "jct_fbkv_heavy_s", "jct_fbhd_heavy_s", "jct_mix_web_s", "jct_mean_ratio",
                 "jct_fbkv_heavy_ratio", "jct_fbhd_heavy_ratio", "jct_mix_web_ratio", "msr_met_frac", "tuning_changes")
"""The shifting workload (experiments.figures.exp_shift): mean JCT overall and per phase, and in the
``default/best-fixed`` and ``adaptive/best-fixed`` rows the default and the tuned policy's over the best fixed
setting's in hindsight."""

# experiment -> (metrics shown, params that form a row, in order)
TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "alltoall": (("jct_mean_s", "jct_over_bound", "msr_met_frac", "pkt_loss", "delivered_bytes_frac", "queue_mean_pkts"),
                 ("workload", "msr", "protocol")),
    "incast": (("jct_max_s", "jct_mean_s", "msr_met_frac", "pkt_loss", "queue_mean_pkts"), ("msr", "protocol")),
    "dynamic": (("jct_mean_s", "msr_met_frac", "pkt_loss"), ("msr", "protocol")),
    "ablation": (("jct_mean_s", "msr_met_frac", "pkt_loss"), ("msr", "protocol")),
    "coexist": (("fct_all_mean", "fct_all_p99", "fct_small_mean", "fct_small_p99", "flows_all_unfinished", "jct_mean_s",
                 "delivered_bytes_frac"), ("msr", "flow_load", "protocol")),
    "fairness": (("fbkv_jct_s", "fbhd1_jct_s", "fbhd2_jct_s", "fbkv_msr_met", "jct_mean_s"), ("scheme",)),
    "shift": (SHIFT_METRICS, ("setting",)),
    "ddnn": (("fct_small_mean_change_pct", "fct_large_mean_change_pct", "fct_all_mean_change_pct",
              "iteration_mean_s_change_pct", "iteration_mean_s", "fct_small_mean"), ("ratio", "flow_load", "priority")),
    "boundedloss": (("rel_l2_error", "packet_loss", "msg_loss", "within_bound", "jct_s", "tcp_over_atp_jct"),
                    ("part", "bound", "bg_load", "loss", "protocol")),
}

TITLES = {
    "alltoall": "All-to-all JCT vs MSR and queue length (NetApprox Fig. 5–8)",
    "incast": "All-to-one / incast (Fig. 9)",
    "dynamic": "Dynamic TLR and priority (Fig. 10–11)",
    "ablation": "ATP technique ablation (Fig. 12)",
    "coexist": "Co-running non-approximate traffic (Fig. 13)",
    "fairness": "Job-level fairness (Fig. 14)",
    "shift": "A workload that changes: the tuned policy against fixed thresholds (issue #27)",
    "ddnn": "DNN ring-allreduce at low vs equal priority next to web-search flows (thesis)",
    "boundedloss": "Bounded-loss ML: vector error vs loss, ATP vs TCP (bounded-loss paper)",
}


def fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != 0 and abs(v) < 0.001:
            return f"{v:.2e}"
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)


def cell(row: dict | None) -> str:
    if row is None or row.get("n", 0) == 0:
        return "–"
    if row["n"] == 1 or row["min"] == row["max"]:
        return fmt(row["mean"]) + (f" (n={row['n']})" if row["n"] > 1 else "")
    return f"{fmt(row['mean'])} [{fmt(row['min'])}, {fmt(row['max'])}]"


SPLIT_BY = {"boundedloss": "part", "ddnn": "priority"}
"""Experiments whose rows of different kinds get one table each (by this parameter)."""


def table(result: dict, metrics: Sequence[str], keys: Sequence[str], where: dict | None = None) -> list[str]:
    summary = [r for r in result.get("summary", [])
               if all(r["params"].get(k) == v for k, v in (where or {}).items())]
    present = [m for m in metrics if any(r["metric"] == m and r["n"] > 0 for r in summary)]
    groups: dict[str, dict] = {}
    for r in summary:
        k = json.dumps([r["params"].get(p) for p in keys])
        groups.setdefault(k, {"params": r["params"], "rows": {}})["rows"][r["metric"]] = r
    if not present or not groups:
        return ["(no data)"]
    used_keys = [k for k in keys if any(k in g["params"] for g in groups.values()) and k not in (where or {})]
    lines = ["| " + " | ".join(used_keys + present) + " |", "|" + "---|" * (len(used_keys) + len(present))]

    def order(item):
        vals = [item[1]["params"].get(k) for k in used_keys]
        return [(v is None, str(type(v)), v if v is not None else 0) for v in vals]

    for _, g in sorted(groups.items(), key=order):
        if not any(m in g["rows"] and g["rows"][m].get("n", 0) for m in present):
            continue
        lines.append("| " + " | ".join([fmt(g["params"].get(k)) for k in used_keys] +
                                       [cell(g["rows"].get(m)) for m in present]) + " |")
    return lines


def copy_plots(res_dir: Path, name: str, img_dir: Path) -> list[str]:
    out = []
    for png in sorted((res_dir / name).glob("*.png")):
        if png.stat().st_size > MAX_PNG_BYTES:
            continue
        img_dir.mkdir(parents=True, exist_ok=True)
        dest = img_dir / f"{name}_{png.name}"
        shutil.copyfile(png, dest)
        out.append(dest.name)
    return out


def render(res_dir: Path, doc: Path, img_dir: Path, notes: Path | None = None) -> str:
    lines = ["# Results", "",
             "Measured on this repository's emulated rack (docs/experiments.md: scale, workloads, baselines).",
             "Generated by `python -m netapprox.experiments.report` from `results/`; cells are mean [min, max] over seeds.",
             "Read them as trends and ratios at 20 Mbit/s with a Python ATP, not as the papers' absolute numbers.", ""]
    if notes is not None and notes.exists():
        lines += notes.read_text().rstrip().splitlines() + [""]
    bench_md = res_dir / "bench.md"
    bench_json = res_dir / "bench.json"
    if bench_md.exists():
        bench = json.loads(bench_json.read_text()) if bench_json.exists() else {}
        meta = bench.get("meta", bench)  # bench.json keeps the command and commit under "meta"
        lines += ["## `make bench`", "",
                  f"Command: `sudo make bench` (`{' '.join(meta.get('command', ['python', '-m', 'bench']))}`), "
                  f"commit `{(meta.get('git_commit') or '?')[:10]}`.", ""]
        body = bench_md.read_text().splitlines()
        lines += [ln if not ln.startswith("# ") else "" for ln in body]
        lines.append("")
    for name in TABLES:
        path = res_dir / name / "result.json"
        if not path.exists():
            continue
        result = json.loads(path.read_text())
        metrics, keys = TABLES[name]
        cmd = " ".join(result.get("command") or [])
        env = result.get("environment", {})
        lines += [f"## {TITLES[name]}", "",
                  f"`{name}`: seeds {result.get('seeds')}, {len(result.get('runs', []))} runs, finished "
                  f"{result.get('finished_utc')}, commit `{(result.get('git_commit') or '?')[:10]}`, TCP "
                  f"`{env.get('tcp_cc')}`. Command: `{cmd}`.", ""]
        split = SPLIT_BY.get(name)
        if split:
            values = sorted({r["params"].get(split) for r in result.get("summary", [])}, key=str)
            for v in values:
                lines += [f"{split} = {v}:", ""] + table(result, metrics, keys, {split: v}) + [""]
        else:
            lines += table(result, metrics, keys)
            lines.append("")
        for img in copy_plots(res_dir, name, img_dir):
            lines.append(f"![{name} {img}](img/{img})")
        lines.append("")
    lines += sim_section(res_dir, img_dir)
    text = "\n".join(lines).rstrip() + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    return text


# --------------------------------------------------------------------------------------------------
# At data-center scale (ns-3): results/sim/<name>/result.json (experiments/sim, docs/simulation.md)

SIM_TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "alltoall": (("jct_mean_s", "jct_p99_s", "jct_ratio", "msr_met_frac", "loss_within_bound_frac", "pkt_loss",
                  "tcp_timeouts_per_job", "queue_mean_pkts", "queue_max_pkts"), ("workload", "msr", "protocol")),
    "incast": (("jct_max_s", "jct_mean_s", "jct_max_s_ratio", "msr_met_frac", "pkt_loss", "tcp_timeouts_per_job",
                "queue_mean_pkts", "queue_max_pkts"), ("msr", "protocol")),
    "dynamic": (("jct_mean_s", "jct_ratio", "msr_met_frac", "pkt_loss"), ("msr", "protocol")),
    "ablation": (("jct_mean_s", "msr_met_frac", "pkt_loss"), ("msr", "protocol")),
    "coexist": (("fct_all_mean", "fct_all_p99", "fct_small_mean", "fct_small_p99", "fct_all_mean_ratio",
                 "fct_small_mean_ratio", "flows_all_unfinished", "jct_mean_s", "msr_met_frac"),
                ("msr", "flow_load", "protocol")),
    "fairness": (("fbkv_jct_s", "fbhd1_jct_s", "fbhd2_jct_s", "fbkv_msr_met", "jct_mean_s", "msr_met_frac"),
                 ("scheme",)),
    "shift": (SHIFT_METRICS, ("setting",)),
}

SIM_TITLES = {
    "alltoall": "All-to-all JCT vs MSR and queue length (Fig. 5-8)",
    "incast": "All-to-one / incast (Fig. 9)",
    "dynamic": "Dynamic TLR and priority (Fig. 10-11)",
    "ablation": "ATP technique ablation (Fig. 12)",
    "coexist": "Co-running non-approximate traffic (Fig. 13)",
    "fairness": "Job-level fairness (Fig. 14)",
    "shift": "A workload that changes: the tuned policy against fixed thresholds (issue #27)",
}


def _us(metric: str) -> bool:
    return metric.endswith("_s") or metric.startswith("fct_") and not metric.endswith("_ratio")


def sim_cell(row: dict | None, metric: str) -> str:
    """Like ``cell``, with times in µs."""
    if row is None or row.get("n", 0) == 0:
        return "–"
    k = 1e6 if _us(metric) else 1.0
    scaled = {**row, **{f: row[f] * k for f in ("mean", "min", "max") if row.get(f) is not None}}
    return cell(scaled)


def sim_table(result: dict, metrics: Sequence[str], keys: Sequence[str]) -> list[str]:
    summary = result.get("summary", [])
    present = [m for m in metrics if any(r["metric"] == m and r["n"] > 0 for r in summary)]
    groups: dict[str, dict] = {}
    for r in summary:
        k = json.dumps([r["params"].get(p) for p in keys])
        groups.setdefault(k, {"params": r["params"], "rows": {}})["rows"][r["metric"]] = r
    if not present:
        return ["(no data)"]
    used = [k for k in keys if any(k in g["params"] for g in groups.values())]
    names = [m.replace("_s", "_us") if _us(m) and m.endswith("_s") else m + (" (µs)" if _us(m) else "")
             for m in present]
    lines = ["| " + " | ".join(used + names) + " |", "|" + "---|" * (len(used) + len(present))]
    def order(item):  # per-seed ratio rows ("atp/dctcp-es") after the protocols themselves
        return [("/" in str(item[1]["params"].get(k)), str(item[1]["params"].get(k))) for k in used]

    for _, g in sorted(groups.items(), key=order):
        if not any(m in g["rows"] and g["rows"][m].get("n", 0) for m in present):
            continue
        lines.append("| " + " | ".join([fmt(g["params"].get(k)) for k in used] +
                                       [sim_cell(g["rows"].get(m), m) for m in present]) + " |")
    return lines


def _ratio_text(result: dict, metric: str, protocol: str, **params: Any) -> str | None:
    rows = [r for r in result.get("summary", []) if r["metric"] == metric and r["params"].get("protocol") == protocol
            and all(r["params"].get(k) == v for k, v in params.items()) and r["n"] > 0]
    if not rows:
        return None
    r = rows[0]
    return f"{r['mean']:.2f} [{r['min']:.2f}, {r['max']:.2f}]"


def sim_headline(results: dict[str, dict]) -> list[str]:
    """The headline ratios in words, read from the result files (whatever they are)."""
    lines = []
    for run, a2a in results.items():
        if run.split("-")[0] != "alltoall":
            continue
        settings = a2a.get("config", {}).get("settings", {})
        topo = settings.get("topology", {}).get("description", "")
        for wl in a2a.get("config", {}).get("workloads", []):
            parts = []
            for msr in a2a["config"].get("msrs", []):
                es = _ratio_text(a2a, "jct_ratio", "atp/dctcp-es", workload=wl, msr=msr)
                ss = _ratio_text(a2a, "jct_ratio", "atp/dctcp-ss", workload=wl, msr=msr)
                if es or ss:
                    parts.append(f"MSR {msr}: {es or '–'} / {ss or '–'}")
            if parts:
                lines.append(f"- All-to-all {wl.upper()} ({topo}): ATP JCT / DCTCP-ES JCT and / DCTCP-SS JCT, mean "
                             f"[min, max] over seeds: " + "; ".join(parts) + ".")
        met = [r for r in a2a.get("summary", [])
               if r["metric"] == "msr_met_frac" and r["params"].get("protocol") == "atp" and r["n"] > 0]
        if met:
            worst = min(r["min"] for r in met)
            lines.append(f"- ATP jobs that met their MSR ({topo}): {min(r['mean'] for r in met):.3f} to "
                         f"{max(r['mean'] for r in met):.3f} of the jobs per run (lowest single run {worst:.3f}).")
    co = results.get("coexist")
    if co:
        parts = []
        for msr in co.get("config", {}).get("msrs", []):
            for load in co["config"].get("flow_loads", []):
                t = _ratio_text(co, "fct_all_mean_ratio", "atp/dctcp-es", msr=msr, flow_load=load)
                if t:
                    parts.append(f"MSR {msr}, load {load}: {t}")
        if parts:
            lines.append("- Non-approximate flows' mean FCT next to ATP / next to DCTCP-ES: " + "; ".join(parts) + ".")
    return lines


def sim_section(res_dir: Path, img_dir: Path) -> list[str]:
    """The "At data-center scale (ns-3)" section of docs/results.md, from ``res_dir/sim``."""
    found: dict[str, dict] = {}
    for name in SIM_TABLES:  # results/sim/<name>, then tagged runs results/sim/<name>-<tag>
        for path in sorted((res_dir / "sim").glob(f"{name}*/result.json"), key=lambda p: (p.parent.name != name, p)):
            if path.parent.name == name or path.parent.name.startswith(name + "-"):
                found[path.parent.name] = json.loads(path.read_text())
    if not found:
        return []
    lines = ["## At data-center scale (ns-3)", "",
             "Packet-level simulations in ns-3 (docs/simulation.md): the same ATP (hostlib, in simulated time), "
             "the same controller (its runtime in simulated time) programming simulated NetApprox switches, against "
             "DCTCP-EarlySend/SampleSend over ns-3's TcpDctcp on network-oblivious switches. Generated by "
             "`python -m netapprox.experiments.report` from `results/sim/`; cells are mean [min, max] over seeds, "
             "times in µs; `atp/dctcp-es` rows are per-seed ratios (below 1: ATP faster).", ""]
    lines += sim_headline(found) + [""]
    for run, result in found.items():
        name = run.split("-")[0]
        tag = run[len(name) + 1:]
        metrics, keys = SIM_TABLES[name]
        env = result.get("environment", {})
        settings = result.get("config", {}).get("settings", {})
        lines += [f"### {SIM_TITLES[name]}" + (f" — {tag}" if tag else ""), "",
                  f"`sim {run}`: {settings.get('topology', {}).get('description', '?')}; seeds {result.get('seeds')}, "
                  f"{len(result.get('runs', []))} runs, finished {result.get('finished_utc')}, commit "
                  f"`{(result.get('git_commit') or '?')[:10]}`, {result.get('config', {}).get('simulator', 'ns-3')}, "
                  f"{env.get('cpus')} CPUs. Command: `{' '.join(result.get('command') or [])}`.", ""]
        lines += sim_table(result, metrics, keys) + [""]
        for png in sorted((res_dir / "sim" / run).glob("*.png")):
            if png.stat().st_size > MAX_PNG_BYTES:
                continue
            img_dir.mkdir(parents=True, exist_ok=True)
            dest = img_dir / f"sim_{run.replace('-', '_')}_{png.name}"
            shutil.copyfile(png, dest)
            lines.append(f"![sim {run} {png.name}](img/{dest.name})")
        lines.append("")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = C.OneLineParser(prog="python -m netapprox.experiments.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default="results", help="where the experiments wrote their results")
    p.add_argument("--doc", default="docs/results.md", help="the page to write")
    p.add_argument("--img", default="docs/img", help="where the figures go")
    p.add_argument("--notes", default=None,
                   help="markdown placed after the header, a written summary of the run (default: none)")
    p.add_argument("--readme", default=None, metavar="README",
                   help="also write README's section 'What the numbers say' from --headline (default: not)")
    p.add_argument("--headline", default="docs/bench-headline.json",
                   help="the committed bench headline (python -m netapprox.bench --headline-doc writes it)")
    p.add_argument("--no-doc", action="store_true", help="do not rewrite --doc (only --readme)")
    args = p.parse_args(argv)
    if not args.no_doc:
        render(Path(args.results), Path(args.doc), Path(args.img), Path(args.notes) if args.notes else None)
        print(f"wrote {args.doc}")
    if args.readme:
        try:
            doc = json.loads(Path(args.headline).read_text())
            headline.update_readme(Path(args.readme), doc)
        except (OSError, ValueError) as e:
            p.error(f"--readme: {e}")
        print(f"wrote {args.readme} ({headline.SECTION!r} from {args.headline})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
