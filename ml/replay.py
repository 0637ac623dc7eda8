"""The bounded hook's arithmetic without a network: how many iterations the example needs to reach a test
accuracy, in seconds of CPU instead of minutes of rack time.

One process trains the example's three replicas (``ml/example.py``: the same data, shares, batches, model,
Adam and seed) and reduces every bucket as ``hook.bounded(msr, msr_floor=...)`` does, in numpy: gloo's chunk
layout, each contribution's smallest ``1 - msr`` packets in an MSR-0 group (arriving with probability
``1 - surplus_loss``, ``slow_surplus_loss`` across the slow path; error feedback keeps what did not), each
owner's all-gather the ``ceil(msr N)`` largest packets of its chunk, what is left out read as zero or as the
prediction (``gather_fill``), error feedback on the owner. With ``straggler`` set, ranks 0 and 1 treat the path
to rank 2 as slow from ``floor_from`` (what the tail-adaptive bound decides on the rack from iteration 4): their
contributions to rank 2 and their all-gathers go at ``msr_floor``. ``gloo`` averages the three gradients.

What it leaves out is timing: which surplus packets arrive depends on the queues, and the rack's time per
iteration is measured there (the ``ddp`` experiment, docs/ml.md). It answers one question, how much the
values a design leaves out cost in iterations::

    python -m netapprox.ml.replay --seeds 101-140 --straggler
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Sequence

import numpy as np
import torch

from netapprox.hostlib import checks as C
from netapprox.ml.example import evaluate, load_digits_split, make_model
from netapprox.ml.layout import chunk_bounds
from netapprox.ml.policy import top_packets

WORLD = 3
FPP = 340  # float32 values per 1400-byte packet (wire.floats_per_packet)
STRAGGLER = 2


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    variant: str = "bounded"
    """``gloo`` (the exact average) or ``bounded``."""
    msr: float = 0.7
    msr_floor: float | None = 0.5
    gather_fill: str = "predicted"
    gather_fill_decay: float = 0.5
    straggler: bool = True
    floor_from: int = 4
    floor_phases: str = "both"
    """Where the straggler's floor applies: ``both`` (the hook), or only ``reduce`` or ``gather`` (to see which
    phase's left-out values cost iterations)."""
    surplus_loss: float = 0.2
    slow_surplus_loss: float = 0.85
    iterations: int = 60
    eval_every: int = 5
    hidden: int = 256
    lr: float = 1e-3
    batch: int = 32
    bucket_cap_mb: float = 0.1


def _keep(values: np.ndarray, msr: float) -> np.ndarray:
    """Per value: in one of the ``ceil(msr N)`` packets with the largest magnitude (the hook's ``top``)."""
    return np.repeat(top_packets(values, msr, FPP), FPP)[:len(values)]


def _buckets(sizes: list[int], cap_mb: float) -> list[list[int]]:
    """Parameter indexes per bucket, DDP's way: reverse order, filled up to the cap."""
    cap = int(cap_mb * 1024 * 1024 / 4)
    out: list[list[int]] = [[]]
    for i in reversed(range(len(sizes))):
        if out[-1] and sum(sizes[j] for j in out[-1]) + sizes[i] > cap:
            out.append([])
        out[-1].append(i)
    return out


def replay(seed: int, cfg: ReplayConfig) -> list[dict]:
    """The test accuracy curve (every ``eval_every`` iterations) of one run."""
    if cfg.variant not in ("gloo", "bounded") or cfg.gather_fill not in ("zero", "predicted") or \
            cfg.floor_phases not in ("both", "reduce", "gather"):
        raise ValueError(f"variant {cfg.variant!r} / gather_fill {cfg.gather_fill!r} / floor_phases "
                         f"{cfg.floor_phases!r}: gloo|bounded, zero|predicted, both|reduce|gather")
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    xtr, ytr, xte, yte = map(torch.from_numpy, load_digits_split())
    models = [make_model(cfg.hidden) for _ in range(WORLD)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    opts = [torch.optim.Adam(m.parameters(), lr=cfg.lr) for m in models]
    rngs = [np.random.default_rng(seed * 1000 + r) for r in range(WORLD)]
    shares = [np.arange(r, len(xtr), WORLD) for r in range(WORLD)]
    order = [rngs[r].permutation(shares[r]) for r in range(WORLD)]
    pos = [0] * WORLD
    arrivals = np.random.default_rng(seed + 12345)
    sizes = [p.numel() for p in models[0].parameters()]
    buckets = _buckets(sizes, cfg.bucket_cap_mb)
    res_c: dict[tuple[int, int, int], np.ndarray] = {}
    res_g: dict[tuple[int, int], np.ndarray] = {}
    pred: dict[int, np.ndarray] = {}
    d = np.float32(cfg.gather_fill_decay)
    curve = []
    for it in range(1, cfg.iterations + 1):
        grads = []
        for r in range(WORLD):
            if pos[r] + cfg.batch > len(order[r]):
                order[r], pos[r] = rngs[r].permutation(shares[r]), 0
            idx = order[r][pos[r]:pos[r] + cfg.batch]
            pos[r] += cfg.batch
            opts[r].zero_grad()
            torch.nn.functional.cross_entropy(models[r](xtr[idx]), ytr[idx]).backward()
            grads.append([p.grad.numpy().ravel().copy() for p in models[r].parameters()])
        applied: list[np.ndarray] = [np.empty(0)] * len(sizes)
        floor = cfg.straggler and cfg.msr_floor is not None and it >= cfg.floor_from
        for b, members in enumerate(buckets):
            vals = [np.concatenate([grads[r][i] for i in members]) / np.float32(WORLD) for r in range(WORLD)]
            n = len(vals[0])
            if cfg.variant == "gloo":
                out = vals[0] + vals[1] + vals[2]
            else:
                out = np.zeros(n, dtype=np.float32)
                p = pred.get(b)
                for j, (a, c) in enumerate(chunk_bounds(n, WORLD)):
                    if a == c:
                        continue
                    total = vals[j][a:c].copy()
                    for src in range(WORLD):
                        if src == j:
                            continue
                        chunk = vals[src][a:c] + res_c.get((b, src, j), np.float32(0))
                        slow = floor and j == STRAGGLER and cfg.floor_phases != "gather"
                        keep = _keep(chunk, cfg.msr_floor if slow else cfg.msr)
                        loss = cfg.slow_surplus_loss if slow else cfg.surplus_loss
                        segs = -(-(c - a) // FPP)
                        got = keep | np.repeat(arrivals.random(segs) >= loss, FPP)[:c - a]
                        res_c[(b, src, j)] = np.where(got, np.float32(0), chunk)
                        total = total + np.where(got, chunk, np.float32(0))
                    total = total + res_g.get((b, j), np.float32(0))
                    low = floor and j != STRAGGLER and cfg.floor_phases != "reduce"
                    keep = _keep(total, cfg.msr_floor if low else cfg.msr)
                    fill = p[a:c] if cfg.gather_fill == "predicted" and p is not None else np.float32(0)
                    res_g[(b, j)] = np.where(keep, np.float32(0), total - fill)
                    out[a:c] = np.where(keep, total, fill)
                if cfg.gather_fill == "predicted":
                    pred[b] = out.copy() if p is None else d * p + (np.float32(1) - d) * out
            off = 0
            for i in members:
                applied[i] = out[off:off + sizes[i]]
                off += sizes[i]
        for r in range(WORLD):
            for i, prm in enumerate(models[r].parameters()):
                prm.grad = torch.from_numpy(applied[i].reshape(prm.shape).copy())
            opts[r].step()
        if it % cfg.eval_every == 0:
            acc, loss = evaluate(models[0], xte, yte)
            curve.append({"iteration": it, "test_acc": acc, "test_loss": loss})
    return curve


def iterations_to(curve: list[dict], target: float) -> int | None:
    return next((c["iteration"] for c in curve if c["test_acc"] >= target), None)


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = C.OneLineParser(prog="python -m netapprox.ml.replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1-6", help="e.g. 1-6 or 1,3,101-140")
    p.add_argument("--msr", type=float, default=0.7, help="MSR of both bounded phases")
    p.add_argument("--msr-floor", type=float, default=0.5, help="with --straggler: the tail-adaptive floor")
    p.add_argument("--straggler", action="store_true", help="ranks 0-1 send what crosses to rank 2 at the floor")
    p.add_argument("--floor-phases", choices=("both", "reduce", "gather"), default="both",
                   help="with --straggler: the phases the floor applies to (default both, as the hook)")
    p.add_argument("--gather-fill-decay", type=float, default=0.5, help="the prediction's decay (default 0.5)")
    p.add_argument("--target", type=float, default=0.9, help="test accuracy counted to")
    p.add_argument("--iterations", type=int, default=60, help="iterations per run")
    args = p.parse_args(argv)
    try:
        seeds = _seeds(args.seeds)
    except ValueError:
        p.error(f"--seeds {args.seeds!r}: expected numbers and ranges such as 1-6 or 1,3,101-140")
    if not 0.0 <= args.gather_fill_decay < 1.0:
        p.error(f"--gather-fill-decay {args.gather_fill_decay}: must be in [0, 1)")
    base = ReplayConfig(msr=args.msr, msr_floor=args.msr_floor, straggler=args.straggler, iterations=args.iterations,
                        gather_fill_decay=args.gather_fill_decay, floor_phases=args.floor_phases)
    variants = {"gloo": dataclasses.replace(base, variant="gloo"),
                "zero": dataclasses.replace(base, gather_fill="zero"),
                "predicted": base}
    rows = {k: [] for k in variants}
    for s in seeds:
        for k, c in variants.items():
            curve = replay(s, c)
            rows[k].append((iterations_to(curve, args.target) or 10 ** 6, curve[-1]["test_loss"]))
        print(f"seed {s}: iterations to {args.target:.0%}: "
              + ", ".join(f"{k} {rows[k][-1][0]}" for k in variants), flush=True)
    g = np.array([r[0] for r in rows["gloo"]], dtype=float)
    for k in variants:
        its = np.array([r[0] for r in rows[k]], dtype=float)
        print(f"{k:10s} iterations / gloo's {np.mean(its / g):.3f}, more than gloo in {int((its > g).sum())} of "
              f"{len(seeds)} seeds, test loss at {args.iterations}: {np.mean([r[1] for r in rows[k]]):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
