"""Example: data-parallel training of a small MLP on scikit-learn's bundled digits, gradients over ATP or gloo.

The data set ships with scikit-learn (1797 8x8 images, 10 classes; nothing is downloaded). 80 % trains,
20 % tests (a fixed split); each worker trains on its share of the training set. The model is an MLP
64 -> hidden -> hidden -> 10 (hidden 256: 85k parameters, 340 kB of gradients per iteration) in
DistributedDataParallel with small buckets, so a step has several buckets of different layers.
``--hook atp`` (default) adds the one line ``netapprox.ml.register(model, **netapprox.ml.hook.bounded(0.7))``,
both phases bounded at MSR 0.7 as README shows (``--bounded none`` and ``--policy``, ``--fill``, ... for the
per-option hook); ``--hook gloo`` is stock DDP.

Three workers on this machine (loopback), gradients over ATP with 10 % of the packets dropped::

    python -m netapprox.ml.example --workers 3 --loss 0.1 --iterations 200

One worker per host (the experiments' testbed): ``--rank R --world W --init tcp://HOST:PORT``
(``--ifname`` names the interface gloo uses). Rank 0 prints a few summary lines: final accuracy, time,
whether the replicas stayed identical, whether every ATP group's loss stayed within its bound. ``--json FILE``
(or ``-`` for stdout) writes the whole result: the accuracy curve against wall-clock time, per-group ATP loss.
"""
import argparse
import dataclasses
import datetime
import gzip
import hashlib
import importlib.util
import json
import os
import queue as queue_mod
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import netapprox.ml
from netapprox.hostlib import checks as C
from netapprox.hostlib.config import AtpConfig, parse_queue_packets
from netapprox.hostlib.errors import AtpError
from netapprox.hostlib.reporting import read_report_key
from netapprox.ml.hook import bounded
from netapprox.ml.policy import parse_policy


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    hook: str = "atp"
    """``atp`` (netapprox.ml.register) or ``gloo`` (DDP's own allreduce over the process group)."""
    policy: str = "paper"
    """ATP group policy (``ml.policy.parse_policy``)."""
    fill: str = "zero"
    gather_msr: float = 1.0
    """MSR of the all-gather (1: reliable)."""
    completion: str = "all_sent"
    """ATP completion policy (``early``: a job ends once its MSRs are met)."""
    gather_mode: str = "top"
    """Shape of a bounded all-gather (``netapprox.ml.hook.HookConfig.gather_mode``)."""
    gather_fill: str | None = None
    """What a value the bounded all-gather left out reads as (``HookConfig.gather_fill``: ``zero`` or
    ``predicted``); None: ``predicted`` with ``bounded``, else ``zero``."""
    transform: str = "none"
    """``none`` or ``hadamard`` (``ml/transform.py``)."""
    bounded: float | None = None
    """Both phases bounded at this MSR (``netapprox.ml.hook.bounded``); overrides every other hook option but
    ``msr_floor`` and ``gather_fill``."""
    msr_floor: float | None = None
    """The tail-adaptive bound (``netapprox.ml.hook.HookConfig.msr_floor``; with ``bounded``)."""
    loss: float = 0.0
    """Injected loss of the ATP hook (fraction of the datagrams each worker sends)."""
    iterations: int = 200
    batch: int = 32
    hidden: int = 256
    lr: float = 1e-3
    eval_every: int = 10
    seed: int = 1
    bucket_cap_mb: float = 0.1
    rate_mbit: float | None = None
    """ATP sender's R_max (None: hostlib's default)."""
    queue_packets: str | None = None
    """Each switch queue's buffer in MTUs, 8 comma-separated sizes from queue 0 (``AtpConfig.queue_packets``;
    None: hostlib's default). On the emulated rack: what its switch installs (``TestbedConfig.queue_packets``)."""
    atp_port: int = 0
    report_to: str | None = None
    report_key_file: str | None = None
    """The controller's report key file (a controller beyond loopback drops unsigned REPORTs)."""


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as (pixels 0..16, labels). Read straight from the file scikit-learn ships
    (``sklearn/datasets/data/digits.csv.gz``, what ``load_digits`` reads): importing scikit-learn costs
    seconds per worker process."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the example's data set comes with scikit-learn: pip install 'netapprox[torch]'",
                                  name="sklearn")
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
    if not path.exists():
        from sklearn.datasets import load_digits  # noqa: PLC0415 - seconds to import: only when the file moved
        d = load_digits()
        return d.data, d.target
    with gzip.open(path, "rt") as fh:
        raw = np.loadtxt(fh, delimiter=",")
    return raw[:, :-1], raw[:, -1]


def load_digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) of scikit-learn's digits, pixels scaled to [0, 1], a fixed split."""
    data, target = load_digits_arrays()
    x = (data / 16.0).astype(np.float32)
    y = target.astype(np.int64)
    perm = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    tr, te = perm[:cut], perm[cut:]
    return x[tr], y[tr], x[te], y[te]


def make_model(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def parameter_hash(model: torch.nn.Module) -> str:
    """A digest of every parameter's bytes: equal on two replicas only if they are identical."""
    h = hashlib.blake2b(digest_size=8)
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    out = model(x)
    return float((out.argmax(1) == y).float().mean()), float(torch.nn.functional.cross_entropy(out, y))


# over 100 lines: the training loop as the example shows it to a reader, set-up, iterations, evaluation, in order
def train(rank: int, world: int, cfg: TrainConfig, *, ready_file: str | None = None) -> dict:
    """Train on an initialised default process group; every rank returns its own view, rank 0 the curve.
    ``ready_file``: rank 0 creates it when every worker is set up and training starts."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(1)
    xtr, ytr, xte, yte = load_digits_split()
    xtr_t, ytr_t, xte_t, yte_t = map(torch.from_numpy, (xtr, ytr, xte, yte))
    mine = np.arange(rank, len(xtr), world)
    rng = np.random.default_rng(cfg.seed * 1000 + rank)
    model = DistributedDataParallel(make_model(cfg.hidden), bucket_cap_mb=cfg.bucket_cap_mb)
    state = None
    if cfg.hook == "atp":
        atp_kw: dict = {} if cfg.rate_mbit is None else {"max_rate_bps": cfg.rate_mbit * 1e6}
        if cfg.queue_packets is not None:
            atp_kw["queue_packets"] = parse_queue_packets(cfg.queue_packets)
        if cfg.report_key_file is not None:
            atp_kw["report_key"] = read_report_key(cfg.report_key_file, "--report-key-file")
        report = None
        if cfg.report_to:
            host, _, port = cfg.report_to.rpartition(":")
            report = (host, int(port))
        if cfg.bounded is not None:
            options = bounded(cfg.bounded, atp=AtpConfig(completion="early", **atp_kw), msr_floor=cfg.msr_floor,
                              gather_fill=cfg.gather_fill or "predicted")
        else:
            options = {"policy": parse_policy(cfg.policy), "fill": cfg.fill, "gather_msr": cfg.gather_msr,
                       "gather_mode": cfg.gather_mode, "gather_fill": cfg.gather_fill or "zero",
                       "transform": cfg.transform, "atp": AtpConfig(completion=cfg.completion, **atp_kw),
                       "msr_floor": cfg.msr_floor}
        state = netapprox.ml.register(model, loss=cfg.loss, seed=cfg.seed, port=cfg.atp_port, report_to=report,
                                      **options)
    elif cfg.hook != "gloo":
        raise ValueError(f"hook {cfg.hook!r}: choose 'atp' or 'gloo'")
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    curve: list[dict] = []

    def record(it: int, t: float) -> None:
        if rank != 0:
            return
        model.eval()
        tr_acc, tr_loss = evaluate(model.module, xtr_t, ytr_t)
        te_acc, te_loss = evaluate(model.module, xte_t, yte_t)
        model.train()
        curve.append({"iteration": it, "time_s": round(t, 4), "train_acc": tr_acc, "test_acc": te_acc,
                      "train_loss": tr_loss, "test_loss": te_loss})

    dist.barrier()
    t0 = time.monotonic()
    if ready_file and rank == 0:
        Path(ready_file).write_text(f"{time.time()}\n")
    record(0, 0.0)
    order = rng.permutation(mine)
    pos = 0
    hashes: list[str] = []
    for it in range(1, cfg.iterations + 1):
        if pos + cfg.batch > len(order):
            order, pos = rng.permutation(mine), 0
        idx = order[pos:pos + cfg.batch]
        pos += cfg.batch
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xtr_t[idx]), ytr_t[idx])
        loss.backward()
        opt.step()
        hashes.append(parameter_hash(model))
        if it % cfg.eval_every == 0 or it == cfg.iterations:
            record(it, time.monotonic() - t0)
    elapsed = time.monotonic() - t0
    # the replicas' parameters after every iteration, compared once at the end (no extra round trip per step)
    every: list[Any] = [None] * world
    dist.all_gather_object(every, hashes)
    diverged = [i + 1 for i in range(cfg.iterations) if len({h[i] for h in every}) > 1]
    out: dict[str, Any] = {"rank": rank, "world": world, "config": dataclasses.asdict(cfg), "elapsed_s": elapsed,
                           "iteration_mean_s": elapsed / cfg.iterations, "replicas_identical": not diverged,
                           "replicas_checked_iterations": cfg.iterations,
                           "first_divergence": diverged[0] if diverged else None, "curve": curve}
    if state is not None:
        state.settle(30.0)
        out["group_loss"] = {str(k): v for k, v in state.group_loss().items()}
        out["gather_loss"] = {str(k): v for k, v in state.group_loss("gather").items()}
        out["gather_missing_floats"] = int(sum(s["gather_missing_floats"] for s in state.stats))
        out["sessions"] = state.exchange.session_stats()
        jobs: dict[str, dict[str, float]] = {}
        for row in state.stats:
            for kind, j in row.get("jobs", {}).items():
                o = jobs.setdefault(kind, {})
                for k, v in j.items():
                    o[k] = o.get(k, 0) + v
        out["jobs"] = {kind: {k: (v / j["n"] if k != "n" else v) for k, v in j.items()} for kind, j in jobs.items()}
        out["buckets"] = {str(b): {k: float(np.mean([s[k] for s in state.stats if s["bucket"] == b]))
                                   for k in ("elapsed_s", "reduce_s", "gather_s", "agree_s", "floats")}
                          for b in sorted({s["bucket"] for s in state.stats})}
        out["bucket_mean_s"] = float(np.mean([s["elapsed_s"] for s in state.stats])) if state.stats else None
        out["missing_floats"] = int(sum(s["missing_floats"] for s in state.stats))
        out["reduced_floats"] = int(sum(s["floats"] for s in state.stats))
        out["tags"] = sorted({(s["bucket"], s["priority"]) for s in state.stats if s["priority"] is not None})
        if state.tail is not None:
            rows = [r["tail"] for r in state.stats if "tail" in r]
            out["tail"] = {"buckets": len(rows), "buckets_adapted": sum(1 for r in rows if r["slow"]),
                           "first_adapted_iteration": next((r["iteration"] for r in state.stats
                                                            if r.get("tail", {}).get("slow")), None),
                           "ratio_percentiles": _percentiles([r["ratio"] for r in rows if r["ratio"] is not None]),
                           "final": state.tail.as_dict()}
        out["exchange"] = {"sent": state.exchange.datagrams_sent, "dropped": state.exchange.datagrams_dropped,
                           "received": state.exchange.datagrams_received}
        state.close()
    return out


def _percentiles(xs: list[float]) -> dict[str, float] | None:
    """50th, 90th percentile and maximum (None for no samples)."""
    if not xs:
        return None
    return {"p50": float(np.percentile(xs, 50)), "p90": float(np.percentile(xs, 90)), "max": float(max(xs))}


def _worker(rank: int, world: int, init: str, cfg: TrainConfig, queue: Any) -> None:
    # Loopback for gloo: otherwise it resolves this host's name, which can take seconds without DNS.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        try:
            queue.put(train(rank, world, cfg))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # the parent reports it, in one line: no traceback of its own here
        queue.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}"})
        failed = True
    else:
        failed = False
    finally:
        queue.close()
        queue.join_thread()
    os._exit(1 if failed else 0)  # skip interpreter teardown (seconds with PyTorch loaded); the result is sent


def run_local(world: int, cfg: TrainConfig, *, timeout_s: float = 600.0, start_method: str = "fork") -> list[dict]:
    """Train with ``world`` worker processes on this machine (a file store in a temporary directory for the
    rendezvous); returns every rank's result, rank order. Raises RuntimeError naming a worker that failed.

    ``fork`` (default) starts the workers from this process with PyTorch and the modules DDP loads already
    imported (importing them costs ~5 s per process); use ``spawn`` from a process that has run PyTorch
    operations or started threads of its own."""
    import torch._dynamo  # noqa: F401, PLC0415 (DistributedDataParallel imports it; once here instead of per worker)
    ctx = mp.get_context(start_method)
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="netapprox-ddp-") as tmp:
        init = f"file://{Path(tmp) / 'store'}"
        procs = [ctx.Process(target=_worker, args=(r, world, init, cfg, q), daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        results: dict[int, dict] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(results) < world:
                try:
                    r = q.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
                except queue_mod.Empty:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"training did not finish within {timeout_s:g} s") from None
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead and not q.qsize():
                        raise RuntimeError(f"worker exited with status {dead[0].exitcode}") from None
                    continue
                if "error" in r:
                    raise RuntimeError(f"worker {r['rank']}: {r['error']}")
                results[r["rank"]] = r
        finally:
            for p in procs:
                p.join(5)
                if p.is_alive():
                    p.kill()  # this worker, by its own handle
                    p.join(5)
    return [results[r] for r in range(world)]


FIELD_HELP = {
    "hook": "atp (netapprox.ml.register) or gloo (stock DDP allreduce)",
    "policy": "ATP group policy of the per-option hook (ml.policy.parse_policy: paper, msr:M, bands:...)",
    "fill": "what a value the reduce-scatter left out becomes: zero, or error_feedback (the next iteration's)",
    "gather_msr": "MSR of the all-gather, 1: reliable",
    "completion": "ATP completion policy of the per-option hook: all_sent, or early (a job ends once its MSRs "
                  "are met)",
    "gather_mode": "shape of a bounded all-gather: top, msr (HookConfig.gather_mode)",
    "gather_fill": "what a value the bounded all-gather left out reads as: zero or predicted (default: "
                   "predicted with --bounded, else zero)",
    "transform": "none or hadamard (ml/transform.py)",
    "bounded": "both phases bounded at this MSR, netapprox.ml.hook.bounded(MSR) (default 0.7, what README shows, "
               "unless a per-option hook flag --policy/--fill/--gather-msr/--gather-mode/--transform/--completion "
               "is given; 'none': the per-option hook)",
    "msr_floor": "the tail-adaptive bound, with --bounded (default: none)",
    "loss": "injected loss of the ATP hook: the fraction of its datagrams each worker drops",
    "iterations": "training iterations",
    "batch": "samples per worker per iteration",
    "hidden": "width of the MLP's two hidden layers",
    "lr": "Adam learning rate",
    "eval_every": "evaluate the test accuracy every this many iterations",
    "seed": "seed of the data order and the injected loss",
    "bucket_cap_mb": "DDP bucket size, MB",
    "rate_mbit": "ATP sender's R_max, Mbit/s (default: hostlib's, the interface speed)",
    "queue_packets": "each switch queue's buffer in MTUs, 8 comma-separated sizes from queue 0 (default: "
                     "hostlib's)",
    "atp_port": "UDP port of the hook's ATP socket, 0: any free port",
    "report_to": "HOST:PORT of a controller for the ATP senders' REPORTs (default: none)",
    "report_key_file": "the controller's report key file, to sign the REPORTs with (default: unsigned)",
}
PER_OPTION_HOOK = ("policy", "fill", "gather_msr", "gather_mode", "transform", "completion")
DEFAULT_BOUNDED = 0.7
_UNSET = object()


def _optional_float(text: str) -> float | None:
    if text.lower() in ("none", "off"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number or 'none'") from None


def summary_lines(result: dict) -> list[str]:
    """A few lines on a training result: final accuracy, time, whether the replicas stayed identical and whether
    the ATP loss stayed within every group's bound."""
    cfg = result["config"]
    hook = "gloo" if cfg["hook"] == "gloo" else (f"atp bounded({cfg['bounded']:g})" if cfg["bounded"] is not None
                                                 else f"atp policy {cfg['policy']}")
    last = result["curve"][-1] if result.get("curve") else {}
    lines = [f"{result['world']} workers, hook {hook}, {cfg['iterations']} iterations, injected loss "
             f"{cfg['loss']:g}",
             f"test accuracy {last.get('test_acc', float('nan')):.3f} (train {last.get('train_acc', float('nan')):.3f})"
             f" after {result['elapsed_s']:.1f} s ({result['iteration_mean_s'] * 1e3:.1f} ms per iteration)"]
    ranks = result.get("ranks") or [result]
    same = all(r.get("replicas_identical") for r in ranks)
    lines.append("replicas identical after every iteration" if same else
                 f"replicas DIVERGED at iteration {result.get('first_divergence')}")
    if "group_loss" in result:
        groups = [(phase, gid, g) for r in ranks for phase in ("group_loss", "gather_loss")
                  for gid, g in r.get(phase, {}).items()]
        broken = [f"{'reduce' if phase == 'group_loss' else 'gather'} group {gid} (MSR {g['msr']:g}, worst loss "
                  f"{g['worst_loss']:.3f})" for phase, gid, g in groups if not g["within_bound"]]
        lines.append(f"bounds held: every ATP job of {len(ranks)} worker(s) lost at most 1 - MSR of each group"
                     if not broken else "bounds NOT held: " + "; ".join(broken))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = C.OneLineParser(prog="python -m netapprox.ml.example", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=3, help="local worker processes")
    p.add_argument("--rank", type=int,
                   help="run one worker of a multi-host job, needs --world and --init (default: --workers locally)")
    p.add_argument("--world", type=int, help="workers of a multi-host job (default: none, a local run)")
    p.add_argument("--init", help="torch.distributed init method of a multi-host job, e.g. tcp://10.0.0.1:29500 "
                                  "(default: none, a local run)")
    p.add_argument("--ifname", help="network interface for gloo, GLOO_SOCKET_IFNAME (default: gloo's choice; "
                                    "lo for a local run)")
    p.add_argument("--atp-addr", help="local address of the ATP socket (default: the one that reaches the master)")
    p.add_argument("--json", help="write the full result as JSON here, '-': to stdout (local run: rank 0's, with "
                                  "every rank's summary; one worker: its own); default: only the summary lines")
    p.add_argument("--ready-file", help="one worker: rank 0 creates this file when training starts (default: none)")
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "bounded":
            p.add_argument(flag, type=_optional_float, default=_UNSET, metavar="MSR|none", help=FIELD_HELP[f.name])
            continue
        kind = float if f.name in ("rate_mbit", "msr_floor") else (str if f.default is None else type(f.default))
        # the per-option hook's flags: None here, so that giving one is seen (it turns the default --bounded off)
        default = None if f.name in PER_OPTION_HOOK else f.default
        text = FIELD_HELP[f.name] + (f" (default {f.default})" if f.name in PER_OPTION_HOOK else "")
        p.add_argument(flag, type=kind, default=default, help=text)
    args = p.parse_args(argv)
    explicit = [n for n in PER_OPTION_HOOK if getattr(args, n) is not None]
    if args.bounded is _UNSET:
        args.bounded = None if explicit else DEFAULT_BOUNDED
    elif args.bounded is not None and explicit:
        p.error(f"--bounded sets the whole hook; it cannot be combined with --{explicit[0].replace('_', '-')} "
                "(give --bounded none for the per-option hook)")
    for n in PER_OPTION_HOOK:
        if getattr(args, n) is None:
            setattr(args, n, next(f.default for f in dataclasses.fields(TrainConfig) if f.name == n))
    if args.queue_packets is not None:
        try:
            parse_queue_packets(args.queue_packets)
        except ValueError as exc:
            p.error(str(exc))
    if args.report_key_file is not None:
        try:
            read_report_key(args.report_key_file, "--report-key-file")
        except ValueError as exc:  # checked here: a worker would fail with it after the processes started
            p.error(str(exc))
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
    try:
        results = _run(args, cfg, p)
    except (RuntimeError, AtpError) as e:  # a worker failed: one line; a port in use is exit status 2
        print(f"{p.prog}: error: {C.one_line(e)}", file=sys.stderr)
        return 2 if "cannot bind" in str(e) else 1
    out = dict(results[0])
    out["ranks"] = [{k: v for k, v in r.items() if k != "curve"} for r in results]
    text = json.dumps(out, indent=1)
    if args.json == "-":
        print(text)
        return 0
    if args.json:
        Path(args.json).write_text(text + "\n")
    if args.rank in (None, 0):
        print("\n".join(summary_lines(out)))
    return 0


def _run(args: argparse.Namespace, cfg: TrainConfig, p: argparse.ArgumentParser) -> list[dict]:
    """Every rank's result: this process's rank of a multi-host job, or ``--workers`` local processes."""
    if args.rank is None:
        return run_local(args.workers, cfg)
    if args.world is None or args.init is None:
        p.error("--rank needs --world and --init")
    if args.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    if args.atp_addr:
        os.environ["NETAPPROX_ATP_ADDR"] = args.atp_addr
    dist.init_process_group("gloo", init_method=args.init, rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        return [train(args.rank, args.world, cfg, ready_file=args.ready_file)]
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
