"""``ddp``: PyTorch data-parallel training over ATP (netapprox.ml) against stock gloo allreduce over TCP, the
comparison a practitioner would run: time to a test accuracy, side by side, same seeds, same machine.

Part ``network`` (emulated rack, kernel switch with NetApprox queues, static TLR policy): three workers (hosts
0-2) run ``python -m netapprox.ml.example`` (the digits MLP, one worker per host, a TCP rendezvous at host 0) in
each scenario:

| scenario | what else happens |
|---|---|
| ``idle`` | nothing: the workers have the rack to themselves |
| ``ws20``, ``ws50`` | host 3 sends web-search TCP flows to the workers at 20 % / 50 % of the line rate |
| ``straggler`` | one worker's link (host 2's switch port, the HTB rate) runs at ``straggler_rate`` x the line rate |
| ``straggler-both`` | the same, and the host's own interface too (a ``tbf``): both directions slow |

and with each variant:

| variant | gradients | queue of the training traffic |
|---|---|---|
| ``gloo`` | DDP's own allreduce (gloo's ring over TCP), stock settings | queue 0, with the flows |
| ``atp`` | the ATP hook with both phases bounded at ``msr`` (``netapprox.ml.hook.bounded``: the smallest ``1 - msr`` of each contribution's packets at MSR 0, the largest ``msr`` of each reduced chunk gathered, what it left out read as its prediction, early completion, error feedback) | reliable packets in queue 0 with the flows, the MSR-0 ones as surplus in queue 7 |
| ``atp-spread`` | both phases at one MSR ``msr`` for every packet, the loss spread by the Hadamard transform, the workers agreeing on what the all-gather lost (``gather_mode="msr"``), early completion, error feedback | approximate packets by TLR (queues 1-7) |
| ``atp-tail`` | ``atp`` with the tail-adaptive bound (``msr_floor``, ml/tail.py): a worker whose jobs to one peer take persistently longer per packet than to its fastest peer (from 2x, until below 1.5x) sends what crosses that path, its contribution to that peer and its all-gather, at MSR ``msr_floor`` | as ``atp`` |
| ``atp-exact`` | the ATP hook's defaults (paper group policy, reliable all-gather, every packet sent) | by TLR, the reliable all-gather in queue 0 |
| ``gloo-low``, ``atp-low`` | as ``gloo`` / ``atp`` with all training traffic in queue 1 (class rules) | queue 1 |

Per run: time to reach ``target`` test accuracy (wall clock from the first iteration, evaluated every
``eval_every`` iterations on rank 0), final test and training accuracy, mean iteration time, whether the
replicas' parameters were identical after every iteration (a digest per iteration, compared across workers at
the end), and for ATP: the share of gradient values the reduce-scatter lost and the all-gather left out
(``gather_zeroed_frac``: zeroed, or read as predictions), whether every group of every job kept its bound
(lost <= N - ceil(MSR N)), and the jobs each session started without an admission round trip. Per seed and
scenario, ratios against ``gloo``.

The web-search flows are scheduled for ``flow_s`` seconds and stopped when training ends (their completion
times are not part of this experiment). A straggler's downlink is its switch port's HTB rate, its uplink a
``tbf`` on the host's interface (this kernel has no netem).

Part ``fill`` (loopback, no namespaces): the same example with 3 local workers, ``fill_loss`` of every datagram
dropped, a single-MSR policy so that losses reach the gradients, for each fill mode (zero, previous,
error_feedback): final test accuracy and loss.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from pyroute2 import IPRoute

from netapprox.controller.kernel import tc
from netapprox.controller.model import ClassRule
from netapprox.experiments import results as R
from netapprox.experiments.emulated import Scale, queue_packets_arg
from netapprox.experiments.sweep import Sweep, as_sweep
from netapprox.experiments.workloads import web_search_flows
from netapprox.topo.testbed import Testbed, read_json

VARIANTS = ("gloo", "gloo-low", "atp", "atp-low", "atp-spread", "atp-exact", "atp-tail")
SCENARIOS = ("idle", "ws20", "ws50", "straggler", "straggler-both")
RENDEZVOUS_PORT = 29500
ATP_PORT = 7600
FLOW_PORT = 5800
LOW_QUEUE = 1
STRAGGLER_HOST = 2


def class_rules(variant: str) -> list:
    """queue_by_class rules that put the variant's training traffic in the low-priority queue."""
    if variant == "gloo-low":
        return [ClassRule(rank=20, ip_proto=6, ip_proto_mask=0xFF, l4_dport=FLOW_PORT, l4_dport_mask=0xFFFF, qid=0),
                ClassRule(rank=10, ip_proto=6, ip_proto_mask=0xFF, l4_dport=0, l4_dport_mask=0, qid=LOW_QUEUE)]
    if variant == "atp-low":
        return [ClassRule(rank=10, ip_proto=17, ip_proto_mask=0xFF, l4_dport=ATP_PORT, l4_dport_mask=0xFFFF,
                          qid=LOW_QUEUE)]
    return []


def scenario_flow_load(scenario: str) -> float:
    return {"ws20": 0.2, "ws50": 0.5}.get(scenario, 0.0)


def time_to_accuracy(curve: Sequence[dict], target: float, key: str = "test_acc") -> float | None:
    """Wall-clock seconds at the first evaluation with ``key`` >= ``target`` (None: never reached)."""
    for point in curve:
        if point.get(key) is not None and point[key] >= target:
            return float(point["time_s"])
    return None


def slow_link(tb: Testbed, host: int, rate_mbit: float, *, uplink: bool = False) -> None:
    """Make ``host``'s link a straggler: its switch port's HTB classes at ``rate_mbit`` (queues and filters
    stay as the controller installed them), and with ``uplink`` a token bucket at that rate on the host's own
    interface too."""
    rate = f"{int(round(rate_mbit * 1000))}kbit"
    mtu = tc.PortShape(rate_mbit=rate_mbit).mtu_bytes
    ipr = IPRoute(netns=tb.lab.switch_ns)
    try:
        idx = ipr.link_lookup(ifname=tb.port_of(host))[0]
        ipr.tc("change-class", "htb", idx, tc.LINK_CLASSID, parent=tc.ROOT_HANDLE, rate=rate, ceil=rate,
               burst=2 * mtu, cburst=2 * mtu, quantum=mtu)
        for q in range(tc.NUM_QUEUES):
            for classid, parent in ((tc.stamp_classid(q), tc.LINK_CLASSID), (tc.queue_classid(q), tc.stamp_classid(q))):
                ipr.tc("change-class", "htb", idx, classid, parent=parent, rate="8kbit", ceil=rate, prio=q,
                       quantum=mtu, burst=mtu, cburst=mtu)
    finally:
        ipr.close()
    if not uplink:
        return
    # the host's uplink: a token bucket holding ~20 ms at the slow rate
    limit = max(3 * mtu, int(rate_mbit * 1e6 / 8 * 0.02))
    tb.lab.run(host, ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst", str(2 * mtu),
                      "limit", str(limit)])


def _frac(part: int, sent: int) -> float | None:
    """Dropped over offered (sent + dropped)."""
    return part / (part + sent) if part + sent else None


def ddp_trial(tb: Testbed, scale: Scale, seed: int, variant: str, scenario: str, *, iterations: int, hidden: int,
              flow_s: float, msr: float, eval_every: int, name: str, atp_args: str = "",
              msr_floor: float = 0.5) -> tuple[dict, dict]:
    load_before = os.getloadavg()[0]
    wd = tb.workdir / name
    if wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    workers = 3
    src = workers
    rate = scale.rate_bps
    hook = "atp" if variant.startswith("atp") else "gloo"
    flow_load = scenario_flow_load(scenario)
    servers = []
    if flow_load:
        for d in range(workers):
            ready = wd / f"fsrv{d}.ready"
            servers.append(tb.start_py(d, "netapprox.experiments.flows",
                                       ["server", f"{tb.ip(d)}:{FLOW_PORT}", "--duration", str(flow_s + 600),
                                        "--ready-file", str(ready)], f"{name}-fsrv{d}"))
            tb.wait_file(ready)
    init = f"tcp://{tb.ip(0)}:{RENDEZVOUS_PORT}"
    train_ready = wd / "train.ready"
    hook_args = []
    if variant in ("atp", "atp-low"):
        hook_args = atp_args.split() or ["--bounded", f"{msr:g}"]
    elif variant == "atp-exact":  # the hook's own defaults, not the example's (bounded(0.7))
        hook_args = ["--bounded", "none"]
    elif variant == "atp-tail":
        hook_args = ["--bounded", f"{msr:g}", "--msr-floor", f"{msr_floor:g}"]
    elif variant == "atp-spread":
        hook_args = ["--policy", f"msr:{msr:g}", "--gather-msr", f"{msr:g}", "--gather-mode", "msr", "--transform",
                     "hadamard", "--fill", "error_feedback", "--completion", "early"]
    procs = []
    for r in range(workers):
        args = ["--rank", str(r), "--world", str(workers), "--init", init, "--ifname", "eth0", "--hook", hook,
                "--iterations", str(iterations), "--hidden", str(hidden), "--seed", str(seed),
                "--eval-every", str(eval_every), "--atp-addr", tb.ip(r), "--atp-port", str(ATP_PORT),
                "--rate-mbit", f"{scale.rate_mbit:g}",
                "--queue-packets", queue_packets_arg(tb), "--json", str(wd / f"w{r}.json"),
                "--ready-file", str(train_ready), *hook_args]
        procs.append(tb.start_py(r, "netapprox.ml.example", args, f"{name}-w{r}"))
    tb.wait_file(train_ready, timeout=240)
    before = [tb.queue_counters(d) for d in range(workers)]
    clients = []
    if flow_load:
        flows = web_search_flows(seed, load=flow_load, link_bps=rate, duration_s=flow_s, senders=[src],
                                 receivers=list(range(workers)), size_scale=scale.flow_size_scale)
        for d in range(workers):
            mine = [f for f in flows if f.dst == d]
            if not mine:
                continue
            sched = wd / f"flows{d}.json"
            sched.write_text(json.dumps([dataclasses.asdict(f) for f in mine]))
            clients.append(tb.start_py(src, "netapprox.experiments.flows",
                                       ["client", f"{tb.ip(d)}:{FLOW_PORT}", "--schedule", str(sched),
                                        "--timeout", str(scale.timeout_s)], f"{name}-fcli{d}"))
    codes = tb.wait_all(procs, 1800)
    after = [tb.queue_counters(d) for d in range(workers)]
    for p in clients + servers:
        tb.stop(p)
    # what the workers' switch ports sent and dropped during training, per queue (0: non-approximate)
    queues = [[{"sent_packets": q1["packets"] - q0["packets"], "dropped": q1["drops"] - q0["drops"]} for q0, q1 in zip(b, a)]
              for b, a in zip(before, after)]
    ranks = [read_json(wd / f"w{r}.json") or {} for r in range(workers)]
    head = ranks[0]
    # a worker that wrote its whole result finished training, whatever its exit status says (PyTorch's
    # process-group threads can abort an interpreter's exit after the result was written: exit_clean False)
    complete = all(r.get("curve") is not None and r.get("elapsed_s") is not None for r in ranks) and \
        bool(head.get("curve")) and head["curve"][-1].get("iteration") == iterations
    m: dict[str, Any] = {"failed": not complete, "exit_clean": all(c == 0 for c in codes)}
    if not m["failed"]:
        curve = head["curve"]
        m.update(final_test_acc=curve[-1]["test_acc"], final_train_acc=curve[-1]["train_acc"],
                 final_test_loss=curve[-1]["test_loss"], iteration_mean_s=head["iteration_mean_s"],
                 train_s=head["elapsed_s"], replicas_identical=all(r.get("replicas_identical") for r in ranks),
                 replicas_checked_iterations=head.get("replicas_checked_iterations"))
        if hook == "atp":
            reduced = sum(r.get("reduced_floats", 0) for r in ranks)
            m["lost_value_frac"] = sum(r.get("missing_floats", 0) for r in ranks) / reduced if reduced else None
            m["gather_zeroed_frac"] = (sum(r.get("gather_missing_floats", 0) for r in ranks) / reduced
                                       if reduced else None)
            groups = [g for r in ranks for part in ("group_loss", "gather_loss") for g in r.get(part, {}).values()]
            m["group_bound_held"] = bool(groups) and all(g["within_bound"] for g in groups)
            sessions = [s for r in ranks for s in r.get("sessions", {}).values()]
            jobs = sum(s["completed"] for s in sessions)
            m["zero_rtt_job_frac"] = sum(s["zero_rtt_jobs"] for s in sessions) / jobs if jobs else None
            tails = [r["tail"] for r in ranks if r.get("tail")]
            if tails:  # the tail-adaptive bound: share of buckets a worker sent with a slow path at the floor
                m["tail_adapted_frac"] = sum(t["buckets_adapted"] for t in tails) / max(1, sum(t["buckets"] for t in tails))
    m["load_avg_1m"] = (load_before + os.getloadavg()[0]) / 2  # of the whole machine, before and after
    approx_sent = sum(q["sent_packets"] for port in queues for q in port[1:])
    approx_dropped = sum(q["dropped"] for port in queues for q in port[1:])
    m["switch_drop_frac_q0"] = _frac(sum(p[0]["dropped"] for p in queues), sum(p[0]["sent_packets"] for p in queues))
    m["switch_drop_frac_q1_7"] = _frac(approx_dropped, approx_sent)
    return m, {"exit_codes": codes, "curve": head.get("curve", []), "queues": queues,
               "ranks": [{k: v for k, v in r.items() if k != "curve"} for r in ranks]}


def exp_ddp(seeds: Sequence[int], out: Path, sweep: Sweep, *, variants=("gloo", "atp"), scenarios=SCENARIOS,
            iterations: int = 150, hidden: int = 256, msr: float = 0.7, msr_floor: float = 0.5,
            straggler_rate: float = 0.5,
            target: float = 0.9, eval_every: int = 5, flow_s: float = 240.0, atp_args: str = "",
            fills=("zero", "previous", "error_feedback"), fill_loss: float = 0.3, fill_policy: str = "msr:0.5",
            fill_iterations: int = 80, network: bool = True) -> R.ResultFile:
    """Runs on the emulated testbed (``sweep``: its back end's scale); the ``fill`` part on loopback."""
    bad = [v for v in variants if v not in VARIANTS] + [s for s in scenarios if s not in SCENARIOS]
    if bad:
        raise ValueError(f"ddp: unknown variant or scenario {', '.join(bad)}; variants {', '.join(VARIANTS)}, "
                         f"scenarios {', '.join(SCENARIOS)}")
    from netapprox.ml import example, transform  # noqa: PLC0415 - PyTorch (the [torch] extra), only for this experiment

    scale: Scale = as_sweep(sweep).backend.scale
    rf = R.ResultFile("ddp", {"scale": dataclasses.asdict(scale), "variants": list(variants),
                              "scenarios": list(scenarios), "iterations": iterations, "hidden": hidden, "msr": msr,
                              "msr_floor": msr_floor,
                              "straggler_rate": straggler_rate, "atp_args": atp_args, "straggler_host": STRAGGLER_HOST,
                              "target_test_acc": target, "eval_every": eval_every,
                              "model": f"MLP 64-{hidden}-{hidden}-10 on scikit-learn digits, Adam 1e-3, batch 32/worker",
                              "workers": 3, "transform_cost": transform.cost_per_mb(),
                              "fill": {"modes": list(fills), "loss": fill_loss, "policy": fill_policy,
                                       "iterations": fill_iterations}},
                      seeds, out / "ddp")
    if network:
        for scenario in scenarios:
            with Testbed(scale.testbed(hosts=4, controller=False), out / "ddp" / "work") as tb:
                if scenario.startswith("straggler"):
                    slow_link(tb, STRAGGLER_HOST, scale.rate_mbit * straggler_rate, uplink=scenario == "straggler-both")
                for seed in seeds:
                    for variant in variants:  # side by side: every variant of a seed before the next seed
                        tb.pin_jobs([], class_rules=class_rules(variant))
                        m, raw = ddp_trial(tb, scale, seed, variant, scenario, iterations=iterations,
                                           hidden=hidden, flow_s=flow_s, msr=msr, eval_every=eval_every,
                                           name=f"{scenario}-s{seed}-{variant}", atp_args=atp_args,
                                           msr_floor=msr_floor)
                        if raw["curve"]:
                            m["time_to_target_s"] = time_to_accuracy(raw["curve"], target)
                        rf.add(seed, {"part": "network", "scenario": scenario, "variant": variant}, m, raw)
                        rf.write()
                        print(f"ddp {scenario} seed {seed} {variant}: {_brief(m)}", flush=True)
            for seed in seeds:
                base = _find(rf, seed, scenario, "gloo")
                for variant in variants:
                    run = _find(rf, seed, scenario, variant)
                    if base is None or run is None or variant == "gloo":
                        continue
                    ch: dict[str, Any] = {}
                    for key in ("time_to_target_s", "iteration_mean_s"):
                        a, b = run["metrics"].get(key), base["metrics"].get(key)
                        ch[key + "_ratio"] = a / b if a is not None and b else None
                    a, b = run["metrics"].get("final_test_acc"), base["metrics"].get("final_test_acc")
                    ch["final_test_acc_diff"] = a - b if a is not None and b is not None else None
                    rf.add(seed, {"part": "vs-gloo", "scenario": scenario, "variant": variant}, ch)
            rf.write()
        plot_accuracy(rf, path=rf.out_dir / "accuracy_vs_time.png")
    if fills:
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
                       {"final_test_acc": head["curve"][-1]["test_acc"],
                        "final_test_loss": head["curve"][-1]["test_loss"],
                        "final_train_loss": head["curve"][-1]["train_loss"],
                        "lost_value_frac": sum(r.get("missing_floats", 0) for r in res) / reduced if reduced else None,
                        "wall_s": time.monotonic() - t0},
                       {"ranks": [{k: v for k, v in r.items() if k != "curve"} for r in res]})
                rf.write()
    return rf


def _brief(m: dict) -> str:
    if m.get("failed"):
        return "FAILED"
    ttt = m.get("time_to_target_s")
    return (f"time to target {'not reached' if ttt is None else f'{ttt:.1f} s'}, iteration "
            f"{m['iteration_mean_s'] * 1e3:.0f} ms, final test acc {m['final_test_acc']:.3f}, replicas identical "
            f"{m['replicas_identical']}" + (f", bounds held {m['group_bound_held']}" if "group_bound_held" in m else "")
            + (f", buckets at the floor {m['tail_adapted_frac']:.0%}" if "tail_adapted_frac" in m else ""))


def _find(rf: R.ResultFile, seed: int, scenario: str, variant: str) -> dict | None:
    want = {"part": "network", "scenario": scenario, "variant": variant}
    return next((r for r in rf.runs if r["seed"] == seed and r["params"] == want
                 and not r["metrics"].get("failed")), None)


def plot_accuracy(rf: R.ResultFile, *, path: Path, key: str = "test_acc") -> Path | None:
    """Fig. 18 style, one panel per scenario: accuracy against wall-clock time, one line per variant (mean over
    seeds on a common time grid, shaded min-max)."""
    runs = [r for r in rf.runs if r["params"].get("part") == "network" and (r.get("raw") or {}).get("curve")]
    if not runs:
        return None
    scenarios = [s for s in rf.config.get("scenarios", SCENARIOS) if any(r["params"]["scenario"] == s for r in runs)]
    plt = R._plt()
    cols = min(2, len(scenarios))
    rows_n = -(-len(scenarios) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(5.2 * cols, 3.6 * rows_n), squeeze=False)
    target = rf.config.get("target_test_acc")
    for ax, scenario in zip(axes.ravel(), scenarios):
        mine = [r for r in runs if r["params"]["scenario"] == scenario]
        for variant in [v for v in rf.config.get("variants", VARIANTS) if any(r["params"]["variant"] == v for r in mine)]:
            curves = [r["raw"]["curve"] for r in mine if r["params"]["variant"] == variant]
            end = min(c[-1]["time_s"] for c in curves)
            grid = np.linspace(0.0, end, 100)
            ys = np.array([np.interp(grid, [p["time_s"] for p in c], [p[key] for p in c]) for c in curves])
            ax.plot(grid, ys.mean(axis=0), label=f"{variant} (n={len(curves)})")
            ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), alpha=0.2)
        if target:
            ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(_SCENARIO_TITLES.get(scenario, scenario), fontsize=9)
        ax.set_xlabel("wall-clock time since the first iteration (s)")
        ax.set_ylabel("test-set accuracy" if key == "test_acc" else "training-set accuracy")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    for ax in axes.ravel()[len(scenarios):]:
        ax.set_visible(False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


_SCENARIO_TITLES = {"idle": "no background", "ws20": "web-search flows at 20 % load",
                    "ws50": "web-search flows at 50 % load", "straggler": "one slowed link (straggler, downlink)",
                    "straggler-both": "one slowed link (straggler, both directions)"}


def tables(result: dict) -> str:
    """Markdown tables of a ddp result.json: per scenario and variant (mean [min, max] over seeds), the ratios
    against gloo, and the fill modes."""
    s = result["summary"]

    def cell(metric: str, fmt: str = "{:.3g}", **params: Any) -> str:
        row = R.lookup(s, metric, **params)
        if not row or not row["n"]:
            return "–"
        f = fmt.format
        return f"{f(row['mean'])} [{f(row['min'])}, {f(row['max'])}]" + ("" if row["n_missing"] == 0 else
                                                                          f" ({row['n_missing']} missing)")

    cfg = result["config"]
    variants = cfg.get("variants", [])
    out = ["| scenario | variant | time to {:.0%} test acc (s) | final test acc | iteration (s) | values lost (RS) "
           "| left out (AG) | bounds held | replicas identical |".format(cfg.get("target_test_acc", 0.9)),
           "|---|---|---|---|---|---|---|---|---|"]
    for sc in cfg.get("scenarios", []):
        for v in variants:
            p = {"part": "network", "scenario": sc, "variant": v}
            atp = v.startswith("atp")
            out.append(f"| {sc} | {v} | {cell('time_to_target_s', **p)} | {cell('final_test_acc', '{:.3f}', **p)} | "
                       f"{cell('iteration_mean_s', **p)} | {cell('lost_value_frac', '{:.3f}', **p) if atp else '0'} | "
                       f"{cell('gather_zeroed_frac', '{:.3f}', **p) if atp else '0'} | "
                       f"{cell('group_bound_held', '{:.0%}', **p) if atp else '–'} | "
                       f"{cell('replicas_identical', '{:.0%}', **p)} |")
    out += ["", "| scenario | variant / gloo (per seed) | time to target | iteration time | final test acc − gloo's |",
            "|---|---|---|---|---|"]
    for sc in cfg.get("scenarios", []):
        for v in variants:
            if v == "gloo":
                continue
            p = {"part": "vs-gloo", "scenario": sc, "variant": v}
            out.append(f"| {sc} | {v} | {cell('time_to_target_s_ratio', **p)} | {cell('iteration_mean_s_ratio', **p)} "
                       f"| {cell('final_test_acc_diff', '{:+.3f}', **p)} |")
    fills = cfg.get("fill", {})
    if any(r["params"].get("part") == "fill" for r in result.get("runs", [])):
        out += ["", f"| fill (loopback, {fills.get('loss')} injected loss, {fills.get('policy')}) | final test acc | "
                    "final test loss | gradient values lost |", "|---|---|---|---|"]
        for f in fills.get("modes", []):
            p = {"part": "fill", "fill": f}
            out.append(f"| {f} | {cell('final_test_acc', **p)} | {cell('final_test_loss', **p)} | "
                       f"{cell('lost_value_frac', '{:.3f}', **p)} |")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "table":
        print(tables(json.loads(Path(sys.argv[2]).read_text())))
        sys.exit(0)
    sys.exit("usage: python -m netapprox.experiments.ddp table results/ddp/result.json "
             "(run the experiment with: python -m netapprox.experiments ddp)")
