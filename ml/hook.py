"""A DistributedDataParallel communication hook that reduces gradient buckets over ATP.

One line turns it on, after the model is wrapped (``torch.distributed`` already initialised, any backend)::

    model = DistributedDataParallel(net)
    netapprox.ml.register(model)                       # paper's group policy, lost ranges read as zero
    netapprox.ml.register(model, **netapprox.ml.hook.bounded(0.7))  # both phases bounded (docs/ml.md)

How a bucket is reduced (no root; every worker owns one chunk of every bucket, as in gloo's ring):

0. **Transform** (optional, ``transform="hadamard"``): the bucket is sent as its randomized Hadamard
   transform (``ml/transform.py``), the same signs on every worker, so a lost range costs a little of every
   value of its block instead of a slice; every worker transforms the reduced bucket back.
1. **Reduce-scatter, approximate.** The bucket (divided by the world size, as DDP does) is cut into the
   chunks of gloo's ring layout (``ml/layout.py``). A worker sends chunk ``j`` to worker ``j`` as one ATP job
   of range-indexed float packets; the group policy (``ml/policy.py``) puts each packet in a group by the
   magnitude of its gradients, each group with its own MSR, so ATP repairs only what a group's MSR needs.
   The owner sums the contributions in gloo's order; a range lost on the way is filled by ``fill``:
   ``zero`` (NetApprox: treated as 0), ``previous`` (the value the same peer sent for that range last
   time) or ``error_feedback`` (treated as 0 here, and the sender, told by the receiver's DONE which
   packets were lost, adds those values to its next contribution for that chunk).
2. **All-gather**, each owner's reduced chunk to every peer, with MSR ``gather_msr``. At 1 (default) it is
   reliable. Below 1 it is bounded too, and every replica still applies the same values: with
   ``gather_mode="top"`` the owner sends, reliably, only the ``ceil(MSR N)`` packets with the largest values,
   so every worker misses the same ones; with ``msr`` and ``prefix`` the network may drop some, every worker
   tells every peer which packets of which owner's chunk it missed (one small reliable job per peer, phase
   ``AGREE``), and every worker, the owner included, zeroes the union. With ``error_feedback`` the owner adds
   what was zeroed to its next all-gather of that chunk. With ``gather_fill="predicted"`` (what ``bounded``
   sets) what the all-gather left out reads as a prediction instead of zero: a moving average of the values
   every replica applied at those positions (identical on every worker, so the replicas stay identical), and
   the owner's error feedback carries the difference, so the sum of what is applied over the iterations is
   still the sum of the gradients.

Without loss and without a transform the result is bit-for-bit the result of the process group's allreduce
(gloo's summation order, DDP's division), which tests/ml checks against a real gloo process group.

The jobs run in one :class:`~netapprox.hostlib.exchange.AtpExchange` per worker: a session per peer that
outlives the jobs (RTT and window carried over), the native cores on the sockets, and a bucket's future
completes when its data is in, not when the senders' DONEs come back. Buckets are reduced as DDP hands them
over, concurrently.

Every job carries CadentFlow tags: ``priority`` = the position of the bucket's first parameter in the model
(earlier layers are consumed first by the next forward pass, so they are more urgent) and, once the
iteration time is known, ``deadline_s`` = time until the next forward pass reaches that parameter, estimated
from the measured iteration period and forward time (:class:`IterationClock`). Workers find each other
through the process group (``all_gather_object`` of each worker's ATP address and generation) at
``register``.
"""
import concurrent.futures
import dataclasses
import logging
import math
import os
import socket
import threading
import time
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from netapprox.hostlib import wire
from netapprox.hostlib.config import AtpConfig, ConfigError, JobSpec, Message, Tags
from netapprox.hostlib.exchange import AtpExchange, ExchangeError
from netapprox.ml.layout import chunk_bounds, reduction_order
from netapprox.ml.policy import GroupPolicy, paper_policy, smallest, top_packets
from netapprox.ml.tail import TailBound, TailConfig
from netapprox.ml.transform import DEFAULT_BLOCK, Hadamard
from netapprox.ml.vectors import RANGE, received_vector, vector_job

log = logging.getLogger(__name__)

FILL_MODES = ("zero", "previous", "error_feedback")
GATHER_FILLS = ("zero", "predicted")
TRANSFORMS = ("none", "hadamard")
GATHER_MODES = ("top", "msr", "prefix")
ENV_ADDRESS = "NETAPPROX_ATP_ADDR"
REDUCE, GATHER, AGREE = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class HookConfig:
    """What the ATP hook does; ``register`` takes the same fields as keywords."""

    policy: GroupPolicy = paper_policy()
    """Group policy of the reduce-scatter packets (``ml.policy``)."""

    gather_msr: float = 1.0
    """MSR of the all-gather. 1: reliable. Below 1: bounded as ``gather_mode`` says, every replica applying the
    same values (module docstring)."""

    gather_mode: str = "top"
    """How a bounded all-gather (``gather_msr`` < 1) is shaped. ``top``: each owner sends, reliably, the
    ``ceil(gather_msr N)`` packets of its chunk with the largest magnitudes and not the rest; every worker then
    misses exactly the same packets (no agreement needed) and at most 1 - MSR of a chunk. ``msr``: one group
    with MSR ``gather_msr`` that the network may thin out; the workers agree on the union of what they missed,
    which can exceed 1 - MSR of a chunk (at most ``world - 1`` times it). ``prefix``: the first
    ``ceil(gather_msr N)`` packets (rotated every iteration) in a reliable group and the rest in an MSR-0 group
    sent only as surplus, with the agreement; what is zeroed never exceeds 1 - MSR of a chunk."""

    gather_fill: str = "zero"
    """What a value the bounded all-gather left out reads as, on every worker alike. ``zero``; or
    ``predicted``: the moving average (``gather_fill_decay``) of the values every replica applied at that
    position in the earlier iterations, which every worker computes from the same values, so the replicas stay
    identical. Needs ``fill="error_feedback"``: the owner carries the difference between the true value and
    the prediction to its next all-gather of that chunk, so what is applied sums to the true gradients."""

    gather_fill_decay: float = 0.5
    """``gather_fill="predicted"``: the prediction is ``decay * prediction + (1 - decay) * applied``, every
    iteration and position (0: the value applied last iteration)."""

    transform: str = "none"
    """``none`` or ``hadamard``: send each bucket as its randomized Hadamard transform (``ml/transform.py``).
    The lossless result is then gloo's to within float32 rounding, not bit for bit."""

    transform_block: int = DEFAULT_BLOCK
    """Values per Hadamard block (a power of 4)."""

    fill: str = "zero"
    """How a lost range of a contribution is filled: ``zero``, ``previous`` or ``error_feedback``."""

    atp: AtpConfig = AtpConfig(completion="all_sent")
    """ATP knobs. ``all_sent`` (default here): every packet is sent at least once and only what a group's MSR
    needs is repaired. With ``early`` a job ends once every group's MSR is acknowledged: what the MSR does not
    need may stay unsent (with ``error_feedback`` it goes with the next iteration)."""

    address: str | None = None
    """Local address for the ATP sockets; default ``$NETAPPROX_ATP_ADDR``, else the address that reaches
    ``$MASTER_ADDR``, else 127.0.0.1."""

    port: int = 0
    """Local UDP port peers send to (0: any free port)."""

    loss: float = 0.0
    """Injected loss: this fraction of every datagram the worker sends is dropped (tests, loopback runs)."""

    seed: int | None = None
    """Seed of the injected loss (combined with the rank) and of the transform's signs."""

    tags: bool = True
    """Stamp CadentFlow priority and deadline tags on every job."""

    report_to: tuple[str, int] | None = None
    """Controller address for ATP REPORTs (None: no reports)."""

    timeout_s: float = 120.0
    """A bucket that has not been reduced after this long fails the backward pass with an error."""

    msr_floor: float | None = None
    """The tail-adaptive bound (``ml/tail.py``), off when None. Each worker measures how long its jobs to each
    peer take per packet they need; to a peer whose path is persistently slower than its others (at least 2x
    the fastest, with hysteresis) it sends its reduce-scatter contribution with this MSR instead of the
    policy's, and its all-gather (one subset for every peer) too. Needs a ``smallest`` policy (MSR 0, then
    the rest) and a bounded ``top`` all-gather, as ``bounded()`` sets."""

    def __post_init__(self) -> None:
        if self.fill not in FILL_MODES:
            raise ConfigError(f"fill {self.fill!r}: choose one of {', '.join(FILL_MODES)}")
        if self.transform not in TRANSFORMS:
            raise ConfigError(f"transform {self.transform!r}: choose one of {', '.join(TRANSFORMS)}")
        if self.gather_mode not in GATHER_MODES:
            raise ConfigError(f"gather_mode {self.gather_mode!r}: choose one of {', '.join(GATHER_MODES)}")
        if not 0.0 <= self.gather_msr <= 1.0:
            raise ConfigError(f"gather_msr {self.gather_msr}: must be in [0, 1]")
        if self.gather_fill not in GATHER_FILLS:
            raise ConfigError(f"gather_fill {self.gather_fill!r}: choose one of {', '.join(GATHER_FILLS)}")
        if not 0.0 <= self.gather_fill_decay < 1.0:
            raise ConfigError(f"gather_fill_decay {self.gather_fill_decay}: must be in [0, 1)")
        if self.gather_fill == "predicted" and self.fill != "error_feedback":
            raise ConfigError("gather_fill='predicted' needs fill='error_feedback' (the owner carries what the "
                              "prediction missed to the next iteration)")
        if self.transform == "hadamard":
            Hadamard(1, block=self.transform_block)  # checks the block size
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port {self.port}: must be 0..65535")
        if not self.timeout_s > 0:
            raise ConfigError("timeout_s must be > 0")
        if self.msr_floor is not None:
            TailConfig(self.msr_floor)  # checks the floor
            p = self.policy
            if not (p.relative and len(p.msrs) == 2 and p.msrs[0] == 0.0):
                raise ConfigError("msr_floor needs a smallest(f, 0, m) policy (the packets it may leave out first)")
            if not (self.gather_msr < 1.0 and self.gather_mode == "top"):
                raise ConfigError("msr_floor needs a bounded all-gather in mode 'top' (gather_msr < 1)")


def bounded(msr: float = 0.7, *, atp: AtpConfig = AtpConfig(completion="early"),
            msr_floor: float | None = None, gather_fill: str = "predicted") -> dict[str, Any]:
    """``register`` options with both phases bounded at ``msr``: in the reduce-scatter the ``1 - msr`` of each
    contribution's packets with the smallest gradients go in an MSR-0 group (sent only as surplus), the rest
    reliably; the all-gather carries the ``msr`` of each reduced chunk's packets with the largest values
    (``gather_mode="top"``); jobs end once their MSR is met (``completion="early"``), and what a phase left out
    goes with the next iteration (``error_feedback``); what the all-gather left out reads as its prediction
    (``gather_fill``, ``HookConfig.gather_fill``; ``"zero"`` for zeros). The ``ddp`` experiment (docs/ml.md)
    runs it as ``atp``. ``msr_floor``: the tail-adaptive bound (``HookConfig.msr_floor``; ``atp-tail`` in the
    experiment)."""
    return {"policy": smallest(1.0 - msr, 0.0, 1.0), "gather_msr": msr, "gather_mode": "top",
            "fill": "error_feedback", "gather_fill": gather_fill, "transform": "none", "atp": atp,
            "msr_floor": msr_floor}


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


MAX_WORLD = 45  # src * world + dst fits 11 bits


def job_id(iteration: int, bucket: int, phase: int, src: int, dst: int, world: int, generation: int = 0) -> int:
    """ATP job id of one transfer, unique per (src, dst) pair so that the controller never merges two of a
    host's jobs: 3 bits of generation (the two workers' exchange generations combined, so a restarted
    worker's ids differ from its predecessor's), 10 of iteration (never 0; ids repeat after 1023
    iterations), 6 of bucket index, 2 of phase, 11 of ``src * world + dst``."""
    it = (iteration - 1) % 0x3FF + 1
    return ((generation & 7) << 29) | (it << 19) | ((bucket & 0x3F) << 13) | ((phase & 3) << 11) | (src * world + dst)


def _missing_segments(have: np.ndarray, fpp: int) -> np.ndarray:
    """Indices of the packets (segments of ``fpp`` values) of a received vector that did not arrive."""
    return np.flatnonzero(~have[::fpp]).astype(np.int64)


def _agreement_payload(missing: dict[int, np.ndarray]) -> np.ndarray:
    """What one worker tells every peer after a bounded all-gather, as the float32 values a job carries: per
    owner whose part it missed packets of, ``owner, count, packet...`` (exact in float32 below 2^24); ``-1``
    when it missed nothing."""
    out: list[float] = []
    for owner, segs in sorted(missing.items()):
        out += [float(owner), float(len(segs))] + [float(s) for s in segs]
    return np.asarray(out or [-1.0], dtype=np.float32)


def _parse_agreement(values: np.ndarray, world: int) -> dict[int, np.ndarray]:
    """The inverse of :func:`_agreement_payload`; a malformed one raises ExchangeError."""
    out: dict[int, np.ndarray] = {}
    v = values
    if len(v) == 1 and v[0] == -1.0:
        return out
    i = 0
    while i < len(v):
        if i + 1 >= len(v):
            raise ExchangeError("a malformed all-gather agreement arrived")
        owner, count = int(v[i]), int(v[i + 1])
        if not 0 <= owner < world or count < 0 or i + 2 + count > len(v):
            raise ExchangeError("a malformed all-gather agreement arrived")
        out[owner] = v[i + 2:i + 2 + count].astype(np.int64)
        i += 2 + count
    return out


class AtpHookState:
    """The hook's per-worker state: the ATP exchange, the peers' addresses, residuals and statistics."""

    def __init__(self, config: HookConfig, *, rank: int, world: int, params: Sequence[torch.nn.Parameter] = (),
                 process_group: Any = None) -> None:
        if world > MAX_WORLD:
            raise ConfigError(f"world size {world}: the ATP hook supports at most {MAX_WORLD} workers")
        self.config = config
        self.rank = rank
        self.world = world
        self._group = process_group
        self.fpp = wire.floats_per_packet(config.atp.max_payload)
        seed = None if config.seed is None else config.seed * 1000 + rank
        addr = config.address or _default_address()
        # the peers' senders share every worker's switch port: each may fill 1/(world-1) of a queue
        self.exchange = AtpExchange((addr, config.port), config=config.atp, loss=config.loss, seed=seed,
                                        report_to=config.report_to, queue_share=1.0 / max(1, world - 1))
        self.peers: list[tuple[str, int]] = [self.exchange.address] * world
        self.generations: list[int] = [self.exchange.generation] * world
        self.clock = IterationClock()
        self._param_pos: dict[int, tuple[int, float]] = {}
        total = sum(p.numel() for p in params) or 1
        seen = 0
        for i, p in enumerate(params):
            self._param_pos[id(p)] = (i, seen / total)
            seen += p.numel()
        self._calls: dict[int, int] = {}
        self._transforms: dict[tuple[int, int], Hadamard] = {}
        self._residual: dict[tuple[int, int], concurrent.futures.Future] = {}
        self._gather_residual: dict[int, np.ndarray] = {}
        self._predicted: dict[int, np.ndarray] = {}  # gather_fill="predicted": per bucket, what fills a gap
        self._previous: dict[tuple[int, int], np.ndarray] = {}
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="atp-bucket")
        self._unsettled: set[concurrent.futures.Future] = set()
        self._settled = threading.Condition(self._lock)  # notified when a job's summary is folded into its row
        self.stats: list[dict] = []
        self.tail = None if config.msr_floor is None else TailBound(TailConfig(config.msr_floor),
                                                                     [p for p in range(world) if p != rank])
        self._closed = False
        if world > 1:
            table: list[Any] = [None] * world
            dist.all_gather_object(table, (self.exchange.address, self.exchange.generation), group=process_group)
            self.peers = [tuple(a) for a, _g in table]
            self.generations = [int(g) for _a, g in table]

    # -- statistics ---------------------------------------------------------------------------------------

    def settle(self, timeout: float | None = None) -> None:
        """Wait until every job sent so far is confirmed (or failed) and its bucket's row is in ``stats``, so
        ``stats`` and ``group_loss`` are complete (a future's waiters wake before its callbacks run, so waiting
        for the futures alone could read ``stats`` a row short). A collective: every worker calls it, and it
        returns once every worker's jobs settled, so no worker closes (and leaves a peer's last jobs to it
        unanswered) while a peer still waits for its DONEs."""
        with self._settled:
            self._settled.wait_for(lambda: not self._unsettled, timeout=timeout)
        if self.world > 1 and dist.is_available() and dist.is_initialized():
            dist.barrier(group=self._group)

    def group_loss(self, phase: str = "reduce") -> dict[int, dict[str, float]]:
        """Over every job of ``phase`` (``reduce`` or ``gather``) this worker sent: per group, MSR, messages,
        lost, worst job's loss fraction and whether every job kept its loss within 1 - MSR."""
        key = {"reduce": "groups", "gather": "gather_groups"}[phase]
        out: dict[int, dict[str, float]] = {}
        with self._lock:
            rows = list(self.stats)
        for row in rows:
            for gid, g in row.get(key, {}).items():
                o = out.setdefault(gid, {"msr": g["msr"], "total": 0, "lost": 0, "worst_loss": 0.0,
                                         "within_bound": True, "jobs": 0})
                o["total"] += g["total"]
                o["lost"] += g["lost"]
                o["jobs"] += g["jobs"]
                o["worst_loss"] = max(o["worst_loss"], g["worst_loss"])
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

    def _transform(self, index: int, n: int) -> Hadamard | None:
        if self.config.transform == "none":
            return None
        t = self._transforms.get((index, n))
        if t is None:
            t = self._transforms[(index, n)] = Hadamard(n, block=self.config.transform_block,
                                                        seed=(self.config.seed or 0) * 7919 + index)
        return t

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

    def _id(self, it: int, index: int, phase: int, src: int, dst: int) -> int:
        return job_id(it, index, phase, src, dst, self.world, self.generations[src] ^ self.generations[dst])

    # over 100 lines: one bucket's reduce-scatter and all-gather over shared chunk state, in the order the wire sees them
    def _reduce(self, it: int, index: int, local: np.ndarray, values: np.ndarray, tags: Tags | None) -> np.ndarray:
        cfg = self.config
        ex = self.exchange
        rank, world, fpp = self.rank, self.world, self.fpp
        t0 = time.monotonic()
        n = len(values)
        tr = self._transform(index, n)
        y = values if tr is None else tr.forward(values)
        mags = local if tr is None else y * np.float32(world)
        m = len(y)
        bounds = chunk_bounds(m, world)
        peers = [p for p in range(world) if p != rank]
        lo, hi = bounds[rank]
        mine = hi - lo
        bounded_gather = cfg.gather_msr < 1.0
        recv1 = {p: ex.receive(self._id(it, index, REDUCE, p, rank)) for p in peers if mine}
        recv2 = {j: ex.receive(self._id(it, index, GATHER, j, rank)) for j in peers if bounds[j][1] > bounds[j][0]}
        agree = bounded_gather and cfg.gather_mode != "top"
        recv3 = {p: ex.receive(self._id(it, index, AGREE, p, rank)) for p in peers} if agree else {}
        group_msr = cfg.policy.group_msr()
        sent: list[tuple[str, concurrent.futures.Future]] = []
        # the tail-adaptive bound: this bucket's MSRs, one snapshot of what this worker measured so far
        policies = {j: cfg.policy for j in peers}
        gather_msr = cfg.gather_msr
        if self.tail is not None:
            with self._lock:
                gather_msr = self.tail.gather_msr(cfg.gather_msr)
                policies = {j: _lowered(cfg.policy, self.tail.msr_to(j, 1.0 - cfg.policy.thresholds[0]))
                            for j in peers}
                slow = sorted(self.tail.slow())
                ratio = self.tail.ratio()
        # 1. reduce-scatter: my contribution to every other owner's chunk
        for j in peers:
            a, b = bounds[j]
            if a == b:
                continue
            chunk = y[a:b]
            if cfg.fill == "error_feedback":
                res = self._take_residual(index, j, b - a)
                if res is not None:
                    chunk = chunk + res
            groups = policies[j].classify(mags[a:b], fpp)
            job = vector_job(self._id(it, index, REDUCE, rank, j), chunk, group_of_segment=groups,
                             group_msr=group_msr, floats_per_packet=fpp, tags=tags, rotate=it)
            f = ex.send(self.peers[j], job)
            self._measure(f, j)
            sent.append(("reduce", f))
            if cfg.fill == "error_feedback":
                res_fut: concurrent.futures.Future = concurrent.futures.Future()
                f.add_done_callback(lambda f, r=res_fut, c=chunk, spec=job: r.set_result(_residual_of(f, c, spec)))
                self._residual[(index, j)] = res_fut
        # 2. my chunk: the contributions summed in gloo's order
        reduced = np.empty(0, dtype=np.float32)
        missing_floats = 0
        if mine:
            contrib = {rank: y[lo:hi]}
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
            if bounded_gather and cfg.fill == "error_feedback":
                res = self._gather_residual.pop(index, None)
                if res is not None and len(res) == mine:
                    reduced = reduced + res
        t_reduced = time.monotonic()
        # 3. all-gather: my chunk to every peer, theirs to me
        out = np.empty(m, dtype=np.float32)
        missed: dict[int, np.ndarray] = {}
        if mine:
            keep = self._gather_keep(reduced, gather_msr)
            for j in peers:
                job = self._gather_job(self._id(it, index, GATHER, rank, j), reduced, keep, it, tags)
                f = ex.send(self.peers[j], job)
                self._measure(f, j)
                sent.append(("gather", f))
            if keep is not None:  # "top": the packets not sent are missed by every peer, so by the owner too
                missed[rank] = np.flatnonzero(~keep).astype(np.int64)
        out[lo:hi] = reduced
        for j, fut in recv2.items():
            a, b = bounds[j]
            got = fut.result(cfg.timeout_s)
            vec, have = received_vector(got, b - a)
            if not have.all():
                if not bounded_gather:
                    raise ExchangeError(f"bucket {index}: the reliable all-gather from rank {j} lost "
                                        f"{int((~have).sum())} values")
                missed[j] = _missing_segments(have, fpp)
            out[a:b] = vec
        t_gathered = time.monotonic()
        # 4. bounded all-gather: agree on what anyone missed (unless every worker misses the same) and zero it
        gather_missing = 0
        if bounded_gather:
            pred = self._predicted.get(index) if cfg.gather_fill == "predicted" else None
            if pred is not None and len(pred) != m:
                pred = None
            payload = _agreement_payload(missed)
            for p in peers if agree else ():
                job = vector_job(self._id(it, index, AGREE, rank, p), payload, group_of_segment=None, group_msr={},
                                 floats_per_packet=fpp, tags=tags, msr=1.0)
                sent.append(("agree", ex.send(self.peers[p], job)))
            union: dict[int, set[int]] = {j: set(s.tolist()) for j, s in missed.items()}
            for p, fut in recv3.items():
                got = fut.result(cfg.timeout_s)
                vec, have = received_vector(got, got.vector_len or 0)
                if not have.all():
                    raise ExchangeError(f"bucket {index}: the agreement from rank {p} lost values")
                for j, segs in _parse_agreement(vec, world).items():
                    union.setdefault(j, set()).update(segs.tolist())
            for j, segs in union.items():
                a, b = bounds[j]
                if not segs or a == b:
                    continue
                drop = np.zeros(b - a, dtype=bool)
                for s in segs:
                    drop[s * fpp:(s + 1) * fpp] = True
                gather_missing += int(drop.sum())
                fill = np.zeros(b - a, dtype=np.float32) if pred is None else pred[a:b]
                if j == rank and cfg.fill == "error_feedback":
                    self._gather_residual[index] = np.where(drop, out[a:b] - fill, np.float32(0))
                out[a:b][drop] = fill[drop]
            if cfg.gather_fill == "predicted":  # from what every replica applies: the same on every worker
                d = np.float32(cfg.gather_fill_decay)
                self._predicted[index] = out.copy() if pred is None else d * pred + (np.float32(1) - d) * out
        result = out if tr is None else tr.inverse(out)
        t_end = time.monotonic()
        row = {"iteration": it, "bucket": index, "floats": n, "elapsed_s": t_end - t0, "started": t0,
               "reduce_s": t_reduced - t0, "gather_s": t_gathered - t_reduced, "agree_s": t_end - t_gathered,
               "missing_floats": missing_floats, "gather_missing_floats": gather_missing, "groups": {},
               "gather_groups": {}, "jobs": {}, "priority": None if tags is None else tags.priority,
               "deadline_s": None if tags is None else tags.deadline_s}
        if self.tail is not None:
            row["tail"] = {"slow": slow, "gather_msr": gather_msr, "ratio": ratio,
                           "reduce_msr": {j: 1.0 - policies[j].thresholds[0] for j in peers}}
        self._account(row, sent)
        return result

    def _tail(self, length: int, it: int) -> np.ndarray:
        """Which packets of an all-gather part of ``length`` values are outside its prefix this iteration (a
        mask over the packets; ``gather_mode="prefix"``)."""
        segs = -(-length // self.fpp)
        first = int(it * 0.6180339887 * segs) % segs
        order = (np.arange(segs) - first) % segs  # position of each packet in this iteration's order
        return order >= math.ceil(self.config.gather_msr * segs - 1e-9)

    def _measure(self, f: concurrent.futures.Future, peer: int) -> None:
        """With the tail-adaptive bound: the job's completion time and the packets its MSRs needed, once its
        summary is in, as a sample of the path to ``peer``."""
        tail = self.tail
        if tail is None:
            return

        def done(f: concurrent.futures.Future) -> None:
            if f.cancelled() or f.exception() is not None:
                return
            s = f.result()
            with self._lock:
                tail.on_transfer(peer, seconds=s.jct_s, packets=sum(g.required for g in s.groups))

        f.add_done_callback(done)

    def _gather_keep(self, reduced: np.ndarray, msr: float | None = None) -> np.ndarray | None:
        """``gather_mode="top"``: which packets of my reduced chunk the all-gather carries (a mask over the
        packets), the ``ceil(msr N)`` with the largest magnitudes (``msr``: ``gather_msr`` unless given); None
        in the other modes."""
        cfg = self.config
        msr = cfg.gather_msr if msr is None else msr
        if cfg.gather_msr >= 1.0 or cfg.gather_mode != "top":
            return None
        return top_packets(reduced, msr, self.fpp)

    def _gather_job(self, jid: int, reduced: np.ndarray, keep: np.ndarray | None, it: int, tags: Tags | None) -> Any:
        cfg = self.config
        if keep is not None:
            return _subset_job(jid, reduced, keep, self.fpp, tags)
        if cfg.gather_msr >= 1.0 or cfg.gather_mode == "msr":
            return vector_job(jid, reduced, group_of_segment=None, group_msr={}, floats_per_packet=self.fpp,
                              tags=tags, msr=cfg.gather_msr, rotate=it)
        groups = np.where(self._tail(len(reduced), it), 2, 1).astype(np.uint16)
        return vector_job(jid, reduced, group_of_segment=groups, group_msr={1: 1.0, 2: 0.0}, floats_per_packet=self.fpp,
                          tags=tags, msr=1.0, rotate=it)

    def _take_residual(self, index: int, j: int, length: int) -> np.ndarray | None:
        """What the receiver of this worker's last contribution to ``j``'s chunk of bucket ``index`` did not get
        (error feedback), once that job's DONE came back; None if there is none."""
        fut = self._residual.pop((index, j), None)
        res = None if fut is None else fut.result(self.config.timeout_s)
        return res if res is not None and len(res) == length else None

    def _account(self, row: dict, sent: list) -> None:
        """Fold the senders' summaries into ``row`` as they arrive; the row joins ``stats`` when all did."""
        futures = [f for _kind, f in sent]
        with self._lock:
            self._unsettled.update(futures)
        left = [len(futures)]

        def done(f: concurrent.futures.Future, kind: str) -> None:
            with self._lock:
                self._unsettled.discard(f)
                if not f.cancelled() and f.exception() is None:
                    summary = f.result()
                    j = row["jobs"].setdefault(kind, {"n": 0, "jct_s": 0.0, "closed_s": 0.0, "packets_sent": 0,
                                                      "retransmissions": 0, "packets_surplus": 0, "lost": 0})
                    j["n"] += 1
                    j["jct_s"] += summary.jct_s
                    j["closed_s"] += summary.closed_s
                    j["packets_sent"] += summary.packets_sent
                    j["retransmissions"] += summary.retransmissions
                    j["packets_surplus"] += summary.packets_surplus
                    j["lost"] += summary.packets_lost
                if not f.cancelled() and f.exception() is None and kind != "agree":
                    into = row["groups" if kind == "reduce" else "gather_groups"]
                    for g in summary.groups:
                        r = into.setdefault(g.group_id, {"msr": g.msr, "total": 0, "lost": 0, "jobs": 0,
                                                         "worst_loss": 0.0, "within_bound": True})
                        r["total"] += g.total
                        r["lost"] += g.lost
                        r["jobs"] += 1
                        r["worst_loss"] = max(r["worst_loss"], g.lost / g.total if g.total else 0.0)
                        r["within_bound"] = r["within_bound"] and g.lost <= g.total - g.required
                elif not f.cancelled() and f.exception() is not None:
                    row.setdefault("send_errors", []).append(str(f.exception()))
                left[0] -= 1
                if left[0] == 0:
                    self.stats.append(row)
                    if len(self.stats) > 20000:
                        del self.stats[:10000]
                self._settled.notify_all()

        if not futures:
            with self._lock:
                self.stats.append(row)
        for kind, f in sent:
            f.add_done_callback(lambda f, kind=kind: done(f, kind))


def _lowered(policy: GroupPolicy, msr: float) -> GroupPolicy:
    """A ``smallest(f, 0, m)`` policy with at most ``msr`` of the packets outside its MSR-0 band (the
    tail-adaptive bound's contribution across a slow path); the policy itself if it already has."""
    if 1.0 - msr <= policy.thresholds[0]:
        return policy
    return dataclasses.replace(policy, thresholds=(1.0 - msr,))


def _subset_job(jid: int, values: np.ndarray, keep: np.ndarray, fpp: int, tags: Tags | None) -> JobSpec:
    """A reliable job carrying the packets (segments of ``fpp`` values) of ``values`` where ``keep`` is set."""
    big = np.ascontiguousarray(values, dtype=np.float32).astype(">f4")
    msgs = []
    for s in np.flatnonzero(keep):
        lo, hi = int(s) * fpp, min(len(values), (int(s) + 1) * fpp)
        msgs.append(Message(RANGE.pack(lo, hi - lo) + big[lo:hi].tobytes(), 0))
    return JobSpec(job_id=jid, messages=tuple(msgs), msr=1.0, tags=tags, vector_len=len(values))


def _residual_of(fut: concurrent.futures.Future, chunk: np.ndarray, job: Any) -> np.ndarray | None:
    """Error feedback: the values of ``chunk`` the receiver did not get (its DONE's lost ids), zero elsewhere;
    None when the job (a done future) failed."""
    if fut.cancelled() or fut.exception() is not None:
        return None
    summary = fut.result()
    res = np.zeros(len(chunk), dtype=np.float32)
    for msg_id in summary.lost_ids:
        first, count = RANGE.unpack_from(job.messages[msg_id].data)
        res[first:first + count] = chunk[first:first + count]
    return res


def atp_allreduce_hook(state: AtpHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The communication hook: ``ddp_model.register_comm_hook(state, atp_allreduce_hook)``."""
    return state.start(bucket)


def register(ddp_model: torch.nn.parallel.DistributedDataParallel, *, process_group: Any = None,
             **options: Any) -> AtpHookState:
    """Reduce ``ddp_model``'s gradients over ATP from now on; returns the hook's state (statistics, ``close()``).

    ``options`` are :class:`HookConfig` fields (``policy``, ``gather_msr``, ``transform``, ``transform_block``,
    ``fill``, ``atp``, ``address``, ``port``, ``loss``, ``seed``, ``tags``, ``report_to``, ``timeout_s``);
    :func:`bounded` returns a set of them with both phases bounded. Call it on every worker after
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
