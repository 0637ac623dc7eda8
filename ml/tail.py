"""The tail-adaptive bound: one worker's view of how fast its transfers to each peer complete, and the MSR it
gives what it sends across a path that is persistently slower than its others (a straggler's link).

With both phases bounded (``hook.bounded``) the slowest path carries its share of a bucket in each synchronous
phase, so a straggler's link sets the iteration time. :class:`TailBound` lowers the MSR of the data that
must cross such a path, down to an operator-set floor (``msr_floor``), as OptiReduce's timeouts adapted to the
measured tail stop waiting for it, but within a declared bound:

- it keeps, per peer, a decaying sum of the completion times of the jobs sent to that peer and of the packets
  they needed (``on_transfer``): the peer's time per required packet;
- a peer is slow when its time per packet is at least ``enter`` (2) times the fastest peer's, and stays slow
  until it falls below ``leave`` (1.5) times it (hysteresis); no decision before every peer has ``min_jobs`` samples. With
  one peer there is nothing to compare: never slow;
- ``msr_to(peer)``: the MSR of this worker's reduce-scatter contribution to ``peer`` (the floor if it is slow);
  ``gather_msr()``: the MSR of this worker's all-gather, which goes to every peer as one subset (the floor if
  any peer is slow).

Why the workers need no agreement: each MSR is decided by the one worker that sends the data, and no other
worker's result depends on it. A reduce-scatter contribution only changes what its owner sums (what did not
arrive is zero there and goes with the sender's next contribution, error feedback); an all-gather in ``top``
mode is one reliable subset of the owner's chunk, the same for every peer, so every replica applies the same
values whatever subset the owner chose. Every job declares the MSRs it is sent with, and its groups keep
them.

Sans-I/O: no clock, no sockets; the hook feeds it the senders' summaries.
"""
from __future__ import annotations

import dataclasses

from netapprox.hostlib.config import ConfigError


@dataclasses.dataclass(frozen=True)
class TailConfig:
    """When a path counts as slow, and how far the MSR of what crosses it may go down."""

    msr_floor: float
    """The lowest MSR a slow path's data is sent with (0 < floor <= 1)."""

    enter: float = 2.0
    """A peer becomes slow when its time per required packet is at least this many times the fastest peer's:
    by default twice, a link at half the rate of the others or less. (On the emulated rack, idle, the workers'
    paths differed by up to 1.65x: the worker that evaluates the model is slower to receive.)"""

    leave: float = 1.5
    """A slow peer is fast again when its time per packet falls below this many times the fastest peer's."""

    decay: float = 0.8
    """Weight of the past in the per-peer sums, applied at each new job to that peer (0: the last job only)."""

    min_jobs: int = 12
    """Jobs every peer must have completed before any peer can be slow (12: three iterations of two buckets;
    the first iterations, with admission and warm-up, are the noisiest)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.msr_floor <= 1.0:
            raise ConfigError(f"msr_floor {self.msr_floor}: must be in (0, 1]")
        if not 1.0 < self.leave <= self.enter:
            raise ConfigError(f"tail thresholds enter {self.enter}, leave {self.leave}: need 1 < leave <= enter")
        if not 0.0 <= self.decay < 1.0:
            raise ConfigError(f"decay {self.decay}: must be in [0, 1)")
        if self.min_jobs < 1:
            raise ConfigError("min_jobs must be >= 1")


class TailBound:
    """One sender's per-peer completion-time estimates and the MSRs they imply (module docstring)."""

    def __init__(self, config: TailConfig, peers: list[int]) -> None:
        self.config = config
        self.peers = sorted(peers)
        self._seconds = {p: 0.0 for p in self.peers}
        self._packets = {p: 0.0 for p in self.peers}
        self._jobs = {p: 0 for p in self.peers}
        self._slow: set[int] = set()

    def on_transfer(self, peer: int, *, seconds: float, packets: int) -> None:
        """A job to ``peer`` completed in ``seconds`` (start to its MSR met), needing ``packets`` packets."""
        if peer not in self._seconds or packets <= 0 or not seconds >= 0.0:
            return
        d = self.config.decay
        self._seconds[peer] = d * self._seconds[peer] + seconds
        self._packets[peer] = d * self._packets[peer] + packets
        self._jobs[peer] += 1
        self._update()

    def per_packet_s(self, peer: int) -> float | None:
        """The peer's decayed seconds per required packet, or None before its first job."""
        return self._seconds[peer] / self._packets[peer] if self._jobs.get(peer) else None

    def _update(self) -> None:
        if len(self.peers) < 2 or min(self._jobs.values()) < self.config.min_jobs:
            return
        per = {p: self._seconds[p] / self._packets[p] for p in self.peers}
        fastest = min(per.values())
        if fastest <= 0.0:
            return
        for p, t in per.items():
            if p in self._slow and t < self.config.leave * fastest:
                self._slow.discard(p)
            elif p not in self._slow and t >= self.config.enter * fastest:
                self._slow.add(p)

    def ratio(self) -> float | None:
        """The slowest peer's time per packet over the fastest's (None before every peer has a sample)."""
        per = [self.per_packet_s(p) for p in self.peers]
        if len(per) < 2 or any(t is None for t in per) or min(per) <= 0.0:
            return None
        return max(per) / min(per)

    def slow(self) -> frozenset[int]:
        """The peers whose paths are slow now."""
        return frozenset(self._slow)

    def msr_to(self, peer: int, msr: float) -> float:
        """MSR of a contribution to ``peer`` whose configured MSR is ``msr``."""
        return min(msr, self.config.msr_floor) if peer in self._slow else msr

    def gather_msr(self, msr: float) -> float:
        """MSR of this worker's all-gather (one subset for every peer) whose configured MSR is ``msr``."""
        return min(msr, self.config.msr_floor) if self._slow else msr

    def as_dict(self) -> dict:
        return {"slow": sorted(self._slow), "jobs": dict(self._jobs),
                "per_packet_s": {p: self.per_packet_s(p) for p in self.peers}}
