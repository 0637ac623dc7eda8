"""``ddp``: PyTorch data-parallel training over ATP (netapprox.ml) against stock gloo allreduce over TCP, next to
web-search flows (NetApprox Fig. 18; the DDNN thesis' question of what the flows gain when training traffic
is in a low-priority queue); plus, on loopback with injected loss, which fill of lost ranges converges best.

Part ``network`` (emulated rack, kernel switch with NetApprox queues, static policy): three workers (hosts
0-2) run ``python -m netapprox.ml.example`` (the digits MLP, one worker per host, a TCP rendezvous at host 0)
while host 3 sends web-search TCP flows to them. Variants:

| variant | gradients | queue of the training traffic |
|---|---|---|
| ``gloo`` | DDP's allreduce (gloo ring over TCP) | queue 0, with the flows |
| ``gloo-low`` | the same | queue 1 (class rule: TCP other than the flows' port 5800) |
| ``atp`` | the ATP hook, paper group policy | approximate packets by TLR (queues 1-7); reliable all-gather, announces and ACKs in queue 0 |
| ``atp-low`` | the same | also the non-approximate ATP packets (UDP 7600) in queue 1 |

Per run: time to reach ``target`` test accuracy (wall clock from the first iteration), final test and
training accuracy, mean iteration time, web-search FCT (mean of all / small flows), and for ATP the share of
gradient values lost. Per seed, ratios against ``gloo``.

Part ``fill`` (loopback, no namespaces): the same example with 3 local workers, ``loss`` of every datagram
dropped, a single-MSR policy so that losses reach the gradients, for each fill mode (zero, previous,
error_feedback): final test accuracy and loss.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from netapprox.controller.model import ClassRule
from netapprox.experiments import results as R
from netapprox.experiments.emulated import Scale
from netapprox.experiments.metrics import flow_fct_stats
from netapprox.experiments.sweep import Sweep, as_sweep
from netapprox.experiments.workloads import web_search_flows
from netapprox.topo.testbed import Testbed, read_json

VARIANTS = ("gloo", "gloo-low", "atp", "atp-low")
RENDEZVOUS_PORT = 29500
ATP_PORT = 7600
FLOW_PORT = 5800
LOW_QUEUE = 1


def class_rules(variant: str) -> list:
    """queue_by_class rules that put the variant's training traffic in the low-priority queue."""
    if variant == "gloo-low":
        return [ClassRule(rank=20, ip_proto=6, ip_proto_mask=0xFF, l4_dport=FLOW_PORT, l4_dport_mask=0xFFFF, qid=0),
                ClassRule(rank=10, ip_proto=6, ip_proto_mask=0xFF, l4_dport=0, l4_dport_mask=0, qid=LOW_QUEUE)]
    if variant == "atp-low":
        return [ClassRule(rank=10, ip_proto=17, ip_proto_mask=0xFF, l4_dport=ATP_PORT, l4_dport_mask=0xFFFF,
                          qid=LOW_QUEUE)]
    return []


def time_to_accuracy(curve: Sequence[dict], target: float, key: str = "test_acc") -> float | None:
    """Wall-clock seconds at the first evaluation with ``key`` >= ``target`` (None: never reached)."""
    for point in curve:
        if point.get(key) is not None and point[key] >= target:
            return float(point["time_s"])
    return None


def ddp_trial(tb: Testbed, scale: Scale, seed: int, variant: str, *, iterations: int, hidden: int,
              flow_load: float, flow_s: float, policy: str, name: str) -> tuple[dict, dict]:
    wd = tb.workdir / name
    if wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    workers = 3
    src = workers
    rate = scale.rate_bps
    hook = "atp" if variant.startswith("atp") else "gloo"
    servers = []
    for d in range(workers):
        ready = wd / f"fsrv{d}.ready"
        servers.append(tb.start_py(d, "netapprox.experiments.flows",
                                   ["server", f"{tb.ip(d)}:{FLOW_PORT}", "--duration", str(flow_s + 600),
                                    "--ready-file", str(ready)], f"{name}-fsrv{d}"))
        tb.wait_file(ready)
    init = f"tcp://{tb.ip(0)}:{RENDEZVOUS_PORT}"
    train_ready = wd / "train.ready"
    procs = []
    for r in range(workers):
        args = ["--rank", str(r), "--world", str(workers), "--init", init, "--ifname", "eth0", "--hook", hook,
                "--iterations", str(iterations), "--hidden", str(hidden), "--seed", str(seed), "--policy", policy,
                "--atp-addr", tb.ip(r), "--atp-port", str(ATP_PORT), "--rate-mbit", f"{scale.rate_mbit:g}",
                "--json", str(wd / f"w{r}.json"), "--ready-file", str(train_ready)]
        procs.append(tb.start_py(r, "netapprox.ml.example", args, f"{name}-w{r}"))
    tb.wait_file(train_ready, timeout=240)
    flows = web_search_flows(seed, load=flow_load, link_bps=rate, duration_s=flow_s, senders=[src],
                             receivers=list(range(workers)), size_scale=scale.flow_size_scale)
    clients = []
    for d in range(workers):
        mine = [f for f in flows if f.dst == d]
        if not mine:
            continue
        sched = wd / f"flows{d}.json"
        sched.write_text(json.dumps([dataclasses.asdict(f) for f in mine]))
        out = wd / f"fcli{d}.json"
        clients.append((tb.start_py(src, "netapprox.experiments.flows",
                                    ["client", f"{tb.ip(d)}:{FLOW_PORT}", "--schedule", str(sched),
                                     "--timeout", str(scale.timeout_s), "--json", str(out)], f"{name}-fcli{d}"), out))
    codes = tb.wait_all(procs, 900)
    tb.wait_all([c for c, _ in clients], scale.timeout_s + flow_s)
    for s_ in servers:
        tb.stop(s_)
    ranks = [read_json(wd / f"w{r}.json") or {} for r in range(workers)]
    flow_rows = [f for _, path in clients for f in (read_json(path) or {}).get("flows", [])]
    head = ranks[0]
    m: dict[str, Any] = {"failed": any(c != 0 for c in codes) or not head.get("curve")}
    if not m["failed"]:
        curve = head["curve"]
        m.update(final_test_acc=curve[-1]["test_acc"], final_train_acc=curve[-1]["train_acc"],
                 final_test_loss=curve[-1]["test_loss"], iteration_mean_s=head["iteration_mean_s"],
                 train_s=head["elapsed_s"], replicas_identical=head.get("replicas_identical"))
        if hook == "atp":
            reduced = sum(r.get("reduced_floats", 0) for r in ranks)
            missing = sum(r.get("missing_floats", 0) for r in ranks)
            m["lost_value_frac"] = missing / reduced if reduced else None
            m["group_bound_held"] = all(g["within_bound"] for r in ranks for g in r.get("group_loss", {}).values())
    m.update(flow_fct_stats(flow_rows))
    return m, {"exit_codes": codes, "curve": head.get("curve", []), "ranks": [{k: v for k, v in r.items() if k != "curve"} for r in ranks],
               "flows": flow_rows}


def exp_ddp(seeds: Sequence[int], out: Path, sweep: Sweep, *, variants=VARIANTS, iterations: int = 150,
            hidden: int = 256, flow_load: float = 0.2, policy: str = "paper", target: float = 0.9,
            fills=("zero", "previous", "error_feedback"), fill_loss: float = 0.3, fill_policy: str = "msr:0.5",
            fill_iterations: int = 80, network: bool = True) -> R.ResultFile:
    """Runs on the emulated testbed (``sweep``: its back end's scale); the ``fill`` part on loopback."""
    from netapprox.ml import example  # noqa: PLC0415 - PyTorch (the [torch] extra), only for this experiment

    scale: Scale = as_sweep(sweep).backend.scale
    rf = R.ResultFile("ddp", {"scale": dataclasses.asdict(scale), "variants": list(variants), "iterations": iterations,
                              "hidden": hidden, "flow_load": flow_load, "policy": policy, "target_test_acc": target,
                              "model": f"MLP 64-{hidden}-{hidden}-10 on scikit-learn digits, Adam 1e-3, batch 32/worker",
                              "workers": 3, "fill": {"modes": list(fills), "loss": fill_loss, "policy": fill_policy,
                                                     "iterations": fill_iterations}},
                      seeds, out / "ddp")
    if network:
        flow_s = 60.0
        with Testbed(scale.testbed(hosts=4, controller=False), out / "ddp" / "work") as tb:
            for seed in seeds:
                for variant in variants:
                    tb.pin_jobs([], class_rules=class_rules(variant))
                    m, raw = ddp_trial(tb, scale, seed, variant, iterations=iterations, hidden=hidden,
                                       flow_load=flow_load, flow_s=flow_s, policy=policy, name=f"s{seed}-{variant}")
                    if raw["curve"]:
                        m["time_to_target_s"] = time_to_accuracy(raw["curve"], target)
                    rf.add(seed, {"part": "network", "variant": variant}, m, raw)
                    rf.write()
        for seed in seeds:
            base = _find(rf, seed, "gloo")
            for variant in variants:
                run = _find(rf, seed, variant)
                if base is None or run is None or variant == "gloo":
                    continue
                ch: dict[str, Any] = {}
                for key in ("time_to_target_s", "iteration_mean_s", "fct_all_mean", "fct_small_mean"):
                    a, b = run["metrics"].get(key), base["metrics"].get(key)
                    ch[key + "_ratio"] = a / b if a is not None and b else None
                rf.add(seed, {"part": "vs-gloo", "variant": variant}, ch)
        rf.write()
        plot_accuracy(rf, path=rf.out_dir / "accuracy_vs_time.png")
    for seed in seeds:
        for fill in fills:
            cfg = example.TrainConfig(hook="atp", policy=fill_policy, fill=fill, loss=fill_loss,
                                      iterations=fill_iterations, hidden=hidden // 2, eval_every=fill_iterations,
                                      seed=seed)
            t0 = time.monotonic()
            res = example.run_local(3, cfg, timeout_s=600)
            head = res[0]
            reduced = sum(r.get("reduced_floats", 0) for r in res)
            rf.add(seed, {"part": "fill", "fill": fill},
                   {"final_test_acc": head["curve"][-1]["test_acc"], "final_test_loss": head["curve"][-1]["test_loss"],
                    "final_train_loss": head["curve"][-1]["train_loss"],
                    "lost_value_frac": sum(r.get("missing_floats", 0) for r in res) / reduced if reduced else None,
                    "wall_s": time.monotonic() - t0},
                   {"ranks": [{k: v for k, v in r.items() if k != "curve"} for r in res]})
            rf.write()
    return rf


def _find(rf: R.ResultFile, seed: int, variant: str) -> dict | None:
    return next((r for r in rf.runs if r["seed"] == seed and r["params"] == {"part": "network", "variant": variant}
                 and not r["metrics"].get("failed")), None)


def plot_accuracy(rf: R.ResultFile, *, path: Path, key: str = "test_acc") -> Path | None:
    """Fig. 18 style: accuracy against wall-clock time, one line per variant (mean over seeds on a common time
    grid, shaded min-max)."""
    runs = [r for r in rf.runs if r["params"].get("part") == "network" and (r.get("raw") or {}).get("curve")]
    if not runs:
        return None
    plt = R._plt()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for variant in sorted({r["params"]["variant"] for r in runs}):
        curves = [r["raw"]["curve"] for r in runs if r["params"]["variant"] == variant]
        end = min(c[-1]["time_s"] for c in curves)
        grid = np.linspace(0.0, end, 100)
        ys = np.array([np.interp(grid, [p["time_s"] for p in c], [p[key] for p in c]) for c in curves])
        ax.plot(grid, ys.mean(axis=0), label=f"{variant} (n={len(curves)})")
        ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), alpha=0.2)
    target = rf.config.get("target_test_acc")
    if target:
        ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("wall-clock time since the first iteration (s)")
    ax.set_ylabel("test-set accuracy (fraction)" if key == "test_acc" else "training-set accuracy (fraction)")
    ax.set_title("Data-parallel training, 3 workers, 20 Mbit/s + web-search flows")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def tables(result: dict) -> str:
    """Markdown tables of a ddp result.json: per variant (mean [min, max] over seeds), the ratios against gloo,
    and the fill modes."""
    s = result["summary"]

    def cell(metric: str, fmt: str = "{:.3g}", **params: Any) -> str:
        row = R.lookup(s, metric, **params)
        if not row or not row["n"]:
            return "–"
        f = fmt.format
        return f"{f(row['mean'])} [{f(row['min'])}, {f(row['max'])}]" + ("" if row["n_missing"] == 0 else
                                                                          f" ({row['n_missing']} missing)")

    variants = result["config"].get("variants", [])
    out = ["| variant | time to {:.0%} test acc (s) | final test acc | iteration (s) | web-search FCT, all (ms) | "
           "small flows (ms) | gradient values lost |".format(result["config"].get("target_test_acc", 0.9)),
           "|---|---|---|---|---|---|---|"]
    for v in variants:
        p = {"part": "network", "variant": v}
        out.append(f"| {v} | {cell('time_to_target_s', **p)} | {cell('final_test_acc', **p)} | "
                   f"{cell('iteration_mean_s', **p)} | {cell('fct_all_mean', '{:.0f}', **_ms(s, p, 'fct_all_mean'))} | "
                   f"{cell('fct_small_mean', '{:.1f}', **_ms(s, p, 'fct_small_mean'))} | "
                   f"{cell('lost_value_frac', '{:.3f}', **p) if v.startswith('atp') else '0'} |")
    out += ["", "| variant / gloo (per seed) | time to target | iteration time | FCT all | FCT small |",
            "|---|---|---|---|---|"]
    for v in variants:
        if v == "gloo":
            continue
        p = {"part": "vs-gloo", "variant": v}
        out.append(f"| {v} | {cell('time_to_target_s_ratio', **p)} | {cell('iteration_mean_s_ratio', **p)} | "
                   f"{cell('fct_all_mean_ratio', **p)} | {cell('fct_small_mean_ratio', **p)} |")
    fills = result["config"].get("fill", {})
    if fills:
        out += ["", f"| fill (loopback, {fills.get('loss')} injected loss, {fills.get('policy')}) | final test acc | "
                    "final test loss | gradient values lost |", "|---|---|---|---|"]
        for f in fills.get("modes", []):
            p = {"part": "fill", "fill": f}
            out.append(f"| {f} | {cell('final_test_acc', **p)} | {cell('final_test_loss', **p)} | "
                       f"{cell('lost_value_frac', '{:.3f}', **p)} |")
    return "\n".join(out)


def _ms(summary: Sequence[dict], params: dict, metric: str) -> dict:
    """Scale an FCT summary row to milliseconds in place (``tables`` prints seconds * 1000)."""
    for row in summary:
        if row["metric"] == metric and row["params"] == params and row["n"] and not row.get("_ms"):
            for k in ("mean", "min", "max"):
                row[k] *= 1000
            row["_ms"] = True
    return params


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "table":
        print(tables(json.loads(Path(sys.argv[2]).read_text())))
        sys.exit(0)
    sys.exit("usage: python -m netapprox.experiments.ddp table results/ddp/result.json "
             "(run the experiment with: python -m netapprox.experiments ddp)")
