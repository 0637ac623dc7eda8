"""Write docs/results.md from the latest results/ (result.json files, bench.json) and copy the plots.

``python -m netapprox.experiments.report [--results results] [--doc docs/results.md] [--img docs/img]``.
Every number in the page comes from a result file; each section names the command that produced it.
Plots larger than 200 KB are not copied.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

MAX_PNG_BYTES = 200_000

# experiment -> (metrics shown, params that form a row, in order)
TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "alltoall": (("jct_mean_s", "jct_over_bound", "msr_met_frac", "pkt_loss", "delivered_bytes_frac", "queue_mean_pkts"),
                 ("workload", "msr", "protocol")),
    "incast": (("jct_max_s", "jct_mean_s", "msr_met_frac", "pkt_loss", "queue_mean_pkts"), ("msr", "protocol")),
    "dynamic": (("jct_mean_s", "msr_met_frac", "pkt_loss"), ("msr", "protocol")),
    "ablation": (("jct_mean_s", "msr_met_frac", "pkt_loss"), ("msr", "protocol")),
    "coexist": (("fct_all_mean", "fct_all_p99", "fct_small_mean", "fct_small_p99", "flows_all_unfinished", "jct_mean_s",
                 "delivered_bytes_frac"), ("msr", "flow_load", "protocol")),
    "fairness": (("fbkv_jct_s", "fbkv_msr_met", "jct_mean_s"), ("scheme",)),
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
        meta = json.loads(bench_json.read_text()) if bench_json.exists() else {}
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
    text = "\n".join(lines).rstrip() + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netapprox.experiments.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default="results")
    p.add_argument("--doc", default="docs/results.md")
    p.add_argument("--img", default="docs/img")
    p.add_argument("--notes", default=None, help="markdown placed after the header (a written summary of the run)")
    args = p.parse_args(argv)
    render(Path(args.results), Path(args.doc), Path(args.img), Path(args.notes) if args.notes else None)
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
