"""A DistributedDataParallel communication hook that reduces gradient buckets over ATP.

One line turns it on, after the model is wrapped (``torch.distributed`` already initialised, any backend)::

    model = DistributedDataParallel(net)
    netapprox.ml.register(model)                       # paper's group policy, lost ranges read as zero

How a bucket is reduced (no root; every worker owns one chunk of every bucket, as in gloo's ring):

1. **Reduce-scatter, approximate.** The bucket (divided by the world size, as DDP does) is cut into the
   chunks of gloo's ring layout (``ml/layout.py``). A worker sends chunk ``j`` to worker ``j`` as one ATP job
   of range-indexed float packets; the group policy (``ml/policy.py``) puts each packet in a group by the
   magnitude of its gradients, each group with its own MSR, so ATP repairs only what a group's MSR needs.
   The owner sums the contributions in gloo's order; a range lost on the way is filled by ``fill``:
   ``zero`` (NetApprox: treated as 0), ``previous`` (the value the same peer sent for that range last
   time) or ``error_feedback`` (treated as 0 here, and the sender, told by the receiver's DONE which
   packets were lost, adds those values to its next contribution for that chunk).
2. **All-gather, reliable.** Each owner sends its reduced chunk to every peer with MSR 1, so every replica
   applies the same gradient and the models never drift apart.

Without loss the result is bit-for-bit the result of the process group's allreduce (gloo's summation order,
DDP's division), which tests/ml checks against a real gloo process group.

Every job carries CadentFlow tags: ``priority`` = the position of the bucket's first parameter in the model
(earlier layers are consumed first by the next forward pass, so they are more urgent) and, once the
iteration time is known, ``deadline_s`` = time until the next forward pass reaches that parameter, estimated
from the measured iteration period and forward time (:class:`IterationClock`). Workers find each other
through the process group (``all_gather_object`` of each worker's ATP address) at ``register``.
"""
import concurrent.futures
import dataclasses
import logging
import os
import socket
import threading
import time
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from netapprox.hostlib import wire
from netapprox.hostlib.config import AtpConfig, ConfigError, Tags
from netapprox.hostlib.exchange import AtpExchange, ExchangeError
from netapprox.ml.layout import chunk_bounds, reduction_order
from netapprox.ml.policy import GroupPolicy, paper_policy
from netapprox.ml.vectors import RANGE, received_vector, vector_job

log = logging.getLogger(__name__)

FILL_MODES = ("zero", "previous", "error_feedback")
ENV_ADDRESS = "NETAPPROX_ATP_ADDR"
REDUCE, GATHER = 0, 1


@dataclasses.dataclass(frozen=True)
class HookConfig:
    """What the ATP hook does; ``register`` takes the same fields as keywords."""

    policy: GroupPolicy = paper_policy()
    """Group policy of the reduce-scatter packets (``ml.policy``)."""

    fill: str = "zero"
    """How a lost range of a contribution is filled: ``zero``, ``previous`` or ``error_feedback``."""

    atp: AtpConfig = AtpConfig(completion="all_sent")
    """ATP knobs. ``all_sent`` (default here): every packet is sent at least once and only what a group's MSR
    needs is repaired; with ``early`` an MSR-0 group could finish unsent."""

    address: str | None = None
    """Local address for the ATP socket; default ``$NETAPPROX_ATP_ADDR``, else the address that reaches
    ``$MASTER_ADDR``, else 127.0.0.1."""

    port: int = 0
    """Local UDP port (0: any free port)."""

    loss: float = 0.0
    """Injected loss: this fraction of every datagram the worker sends is dropped (tests, loopback runs)."""

    seed: int | None = None
    """Seed of the injected loss (combined with the rank)."""

    tags: bool = True
    """Stamp CadentFlow priority and deadline tags on every job."""

    report_to: tuple[str, int] | None = None
    """Controller address for ATP REPORTs (None: no reports)."""

    timeout_s: float = 120.0
    """A bucket that has not been reduced after this long fails the backward pass with an error."""

    def __post_init__(self) -> None:
        if self.fill not in FILL_MODES:
            raise ConfigError(f"fill {self.fill!r}: choose one of {', '.join(FILL_MODES)}")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port {self.port}: must be 0..65535")
        if not self.timeout_s > 0:
            raise ConfigError("timeout_s must be > 0")


class IterationClock:
    """Iteration period and forward time (moving averages) from forward pre/post hooks on the model, and the
    deadline they imply for a bucket: the time until the next forward pass reaches its first parameter."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.period_s: float | None = None
        self.forward_s: float | None = None
        self.forward_start: float | None = None
        self.iterations = 0

    def _avg(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.alpha) * old + self.alpha * new

    def on_forward_start(self, now: float) -> None:
        if self.forward_start is not None:
            self.period_s = self._avg(self.period_s, now - self.forward_start)
        self.forward_start = now
        self.iterations += 1

    def on_forward_end(self, now: float) -> None:
        if self.forward_start is not None:
            self.forward_s = self._avg(self.forward_s, now - self.forward_start)

    def deadline_s(self, fraction: float, now: float) -> float | None:
        """Seconds from ``now`` until the next forward pass reaches ``fraction`` (0..1) of the model, or None
        before one full iteration was seen."""
        if self.period_s is None or self.forward_s is None or self.forward_start is None:
            return None
        return max(0.0, self.forward_start + self.period_s + fraction * self.forward_s - now)


def _default_address() -> str:
    env = os.environ.get(ENV_ADDRESS)
    if env:
        return env
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, 9))
                return s.getsockname()[0]
        except OSError:
            pass
    return "127.0.0.1"


MAX_WORLD = 90  # src * world + dst fits 13 bits


def job_id(iteration: int, bucket: int, phase: int, src: int, dst: int, world: int) -> int:
    """ATP job id of one transfer, unique per (src, dst) pair so that the controller never merges two of a
    host's jobs: 12 bits of iteration (never 0; ids repeat after 4095 iterations), 6 of bucket index, 1 of
    phase, 13 of ``src * world + dst``."""
    it = (iteration - 1) % 0xFFF + 1
    return (it << 20) | ((bucket & 0x3F) << 14) | ((phase & 1) << 13) | (src * world + dst)


class AtpHookState:
    """The hook's per-worker state: the ATP exchange, the peers' addresses, residuals and statistics."""

    def __init__(self, config: HookConfig, *, rank: int, world: int, params: Sequence[torch.nn.Parameter] = (),
                 process_group: Any = None) -> None:
        if world > MAX_WORLD:
            raise ConfigError(f"world size {world}: the ATP hook supports at most {MAX_WORLD} workers")
        self.config = config
        self.rank = rank
        self.world = world
        self.fpp = wire.floats_per_packet(config.atp.max_payload)
        seed = None if config.seed is None else config.seed * 1000 + rank
        addr = config.address or _default_address()
        self.exchange = AtpExchange((addr, config.port), config=config.atp, loss=config.loss, seed=seed,
                                    report_to=config.report_to)
        self.peers: list[tuple[str, int]] = [self.exchange.address] * world
        self.clock = IterationClock()
        self._param_pos: dict[int, tuple[int, float]] = {}
        total = sum(p.numel() for p in params) or 1
        seen = 0
        for i, p in enumerate(params):
            self._param_pos[id(p)] = (i, seen / total)
            seen += p.numel()
        self._calls: dict[int, int] = {}
        self._residual: dict[tuple[int, int], np.ndarray] = {}
        self._previous: dict[tuple[int, int], np.ndarray] = {}
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="atp-bucket")
        self.stats: list[dict] = []
        self._closed = False
        if world > 1:
            table: list[Any] = [None] * world
            dist.all_gather_object(table, self.exchange.address, group=process_group)
            self.peers = [tuple(a) for a in table]

    # -- statistics ---------------------------------------------------------------------------------------

    def group_loss(self) -> dict[int, dict[str, float]]:
        """Over every reduce-scatter job this worker sent: per group, MSR, messages, lost, worst job's loss
        fraction and whether every job kept its loss within 1 - MSR."""
        out: dict[int, dict[str, float]] = {}
        with self._lock:
            rows = list(self.stats)
        for row in rows:
            for gid, g in row["groups"].items():
                o = out.setdefault(gid, {"msr": g["msr"], "total": 0, "lost": 0, "worst_loss": 0.0,
                                         "within_bound": True})
                o["total"] += g["total"]
                o["lost"] += g["lost"]
                o["worst_loss"] = max(o["worst_loss"], g["lost"] / g["total"] if g["total"] else 0.0)
                o["within_bound"] = o["within_bound"] and g["within_bound"]
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.exchange.close()

    # -- the reduction ------------------------------------------------------------------------------------

    def _tags(self, params: Sequence[torch.Tensor], now: float) -> Tags | None:
        if not self.config.tags:
            return None
        pos = [self._param_pos[id(p)] for p in params if id(p) in self._param_pos]
        if not pos:
            return Tags(priority=255)
        index, fraction = min(pos)
        return Tags(priority=min(255, index), deadline_s=self.clock.deadline_s(fraction, now))

    def start(self, bucket: dist.GradBucket) -> torch.futures.Future:
        buf = bucket.buffer()
        fut: torch.futures.Future = torch.futures.Future()
        if buf.dtype != torch.float32 or buf.device.type != "cpu":
            fut.set_exception(ConfigError(f"the ATP hook reduces float32 CPU gradients, got {buf.dtype} on "
                                          f"{buf.device}"))
            return fut
        index = bucket.index()
        with self._lock:
            it = self._calls[index] = self._calls.get(index, 0) + 1
        tags = self._tags(bucket.parameters(), time.monotonic())
        # DDP without a hook divides while copying gradients into the bucket (by multiplying with the reciprocal
        # in float32); the same operation here keeps the lossless result identical to the process group's.
        local = buf.detach().numpy().copy()
        values = (buf * (1.0 / self.world)).detach().numpy().copy()

        def run() -> None:
            try:
                out = self._reduce(it, index, local, values, tags)
                buf.copy_(torch.from_numpy(out))
                fut.set_result(buf)
            except BaseException as exc:  # the backward pass raises it
                fut.set_exception(exc if isinstance(exc, Exception) else ExchangeError(repr(exc)))

        if self.world == 1:
            buf.copy_(torch.from_numpy(values))
            fut.set_result(buf)
            return fut
        self._pool.submit(run)
        return fut

    def _reduce(self, it: int, index: int, local: np.ndarray, values: np.ndarray, tags: Tags | None) -> np.ndarray:
        cfg = self.config
        ex = self.exchange
        rank, world = self.rank, self.world
        t0 = time.monotonic()
        n = len(values)
        bounds = chunk_bounds(n, world)
        peers = [p for p in range(world) if p != rank]
        lo, hi = bounds[rank]
        mine = hi - lo
        recv1 = {p: ex.receive(job_id(it, index, REDUCE, p, rank, world)) for p in peers if mine}
        recv2 = {j: ex.receive(job_id(it, index, GATHER, j, rank, world)) for j in peers if bounds[j][1] > bounds[j][0]}
        sent1: dict[int, tuple[concurrent.futures.Future, np.ndarray, Any]] = {}
        group_msr = cfg.policy.group_msr()
        for j in peers:
            a, b = bounds[j]
            if a == b:
                continue
            chunk = values[a:b]
            if cfg.fill == "error_feedback":
                res = self._residual.get((index, j))
                if res is not None and len(res) == b - a:
                    chunk = chunk + res
            groups = cfg.policy.classify(local[a:b], self.fpp)
            job = vector_job(job_id(it, index, REDUCE, rank, j, world), chunk, group_of_segment=groups, group_msr=group_msr,
                             floats_per_packet=self.fpp, tags=tags)
            sent1[j] = (ex.send(self.peers[j], job), chunk, job)
        reduced = np.empty(0, dtype=np.float32)
        missing_floats = 0
        if mine:
            contrib = {rank: values[lo:hi]}
            for p, fut in recv1.items():
                got = fut.result(cfg.timeout_s)
                vec, have = received_vector(got, mine)
                if not have.all():
                    missing_floats += int((~have).sum())
                    if cfg.fill == "previous":
                        prev = self._previous.get((index, p))
                        if prev is not None and len(prev) == mine:
                            vec = np.where(have, vec, prev)
                if cfg.fill == "previous":
                    self._previous[(index, p)] = vec
                contrib[p] = vec
            order = reduction_order(rank, world)
            reduced = contrib[order[0]].copy()
            for p in order[1:]:
                reduced = reduced + contrib[p]  # float32 adds, one at a time, in gloo's order
        sent2 = []
        for j in peers:
            if mine:
                job = vector_job(job_id(it, index, GATHER, rank, j, world), reduced, group_of_segment=None, group_msr={},
                                 floats_per_packet=self.fpp, tags=tags, msr=1.0)
                sent2.append(ex.send(self.peers[j], job))
        out = np.empty(n, dtype=np.float32)
        out[lo:hi] = reduced
        for j, fut in recv2.items():
            a, b = bounds[j]
            got = fut.result(cfg.timeout_s)
            vec, have = received_vector(got, b - a)
            if not have.all():
                raise ExchangeError(f"bucket {index}: the reliable all-gather from rank {j} lost "
                                    f"{int((~have).sum())} values")
            out[a:b] = vec
        groups_row: dict[int, dict[str, Any]] = {}
        for j, (fut, chunk, job) in sent1.items():
            summary = fut.result(cfg.timeout_s)
            for g in summary.groups:
                row = groups_row.setdefault(g.group_id, {"msr": g.msr, "total": 0, "lost": 0, "within_bound": True})
                row["total"] += g.total
                row["lost"] += g.lost
                row["within_bound"] = row["within_bound"] and g.lost <= g.total - g.required
            if cfg.fill == "error_feedback":
                res = np.zeros(len(chunk), dtype=np.float32)
                for msg_id in summary.lost_ids:
                    first, count = RANGE.unpack_from(job.messages[msg_id].data)
                    res[first:first + count] = chunk[first:first + count]
                self._residual[(index, j)] = res
        for fut in sent2:
            fut.result(cfg.timeout_s)
        with self._lock:
            self.stats.append({"iteration": it, "bucket": index, "floats": n, "elapsed_s": time.monotonic() - t0,
                               "missing_floats": missing_floats, "groups": groups_row,
                               "priority": None if tags is None else tags.priority,
                               "deadline_s": None if tags is None else tags.deadline_s})
            if len(self.stats) > 20000:
                del self.stats[:10000]
        return out


def atp_allreduce_hook(state: AtpHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The communication hook: ``ddp_model.register_comm_hook(state, atp_allreduce_hook)``."""
    return state.start(bucket)


def register(ddp_model: torch.nn.parallel.DistributedDataParallel, *, process_group: Any = None,
             **options: Any) -> AtpHookState:
    """Reduce ``ddp_model``'s gradients over ATP from now on; returns the hook's state (statistics, ``close()``).

    ``options`` are :class:`HookConfig` fields (``policy``, ``fill``, ``atp``, ``address``, ``port``, ``loss``,
    ``seed``, ``tags``, ``report_to``, ``timeout_s``). Call it on every worker after
    ``torch.distributed.init_process_group`` and before the first backward pass; it exchanges the workers'
    ATP addresses over ``process_group`` (default: the default group)."""
    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError("netapprox.ml.register needs torch.distributed initialised (init_process_group) first")
    unknown = set(options) - {f.name for f in dataclasses.fields(HookConfig)}
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(sorted(unknown))}; known: "
                          f"{', '.join(f.name for f in dataclasses.fields(HookConfig))}")
    config = HookConfig(**options)
    module = getattr(ddp_model, "module", ddp_model)
    state = AtpHookState(config, rank=dist.get_rank(process_group), world=dist.get_world_size(process_group),
                         params=[p for p in module.parameters() if p.requires_grad], process_group=process_group)
    ddp_model.register_comm_hook(state, atp_allreduce_hook)
    clock = state.clock
    ddp_model.register_forward_pre_hook(lambda _m, _a: clock.on_forward_start(time.monotonic()))
    ddp_model.register_forward_hook(lambda _m, _a, _o: clock.on_forward_end(time.monotonic()))
    return state
