"""What an experiment sends, as plain records without numpy: an approximate job (``JobWorkload``) and a
background flow (``Flow``). The programs that run on emulated hosts import only this module, so they start
fast; ``experiments.workloads`` generates these records from the traces' distributions.
"""
from __future__ import annotations

import dataclasses

SMALL_FLOW_BYTES = 100_000
"""Flows below this many bytes count as "small" and above ``LARGE_FLOW_BYTES`` as "large" (pFabric's
(0, 100 KB] and (10 MB, inf) bins; the thesis reports small and large flows the same way). Sizes are
compared *before* ``size_scale`` is applied, so the classes keep their meaning at any scale."""
LARGE_FLOW_BYTES = 10_000_000


@dataclasses.dataclass(frozen=True)
class JobWorkload:
    """One approximate job: N messages, each with a size and the time it becomes ready to send."""

    kind: str
    seed: int
    sizes: tuple[int, ...]
    ready_s: tuple[float, ...]
    """Time (s from job start) at which each message is produced; all zero = the whole job is ready."""

    @property
    def n(self) -> int:
        return len(self.sizes)

    @property
    def total_bytes(self) -> int:
        return int(sum(self.sizes))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "seed": self.seed, "n": self.n, "total_bytes": self.total_bytes,
                "sizes": list(self.sizes), "ready_s": [round(t, 9) for t in self.ready_s]}

    @classmethod
    def from_dict(cls, d: dict) -> "JobWorkload":
        return cls(kind=d["kind"], seed=int(d["seed"]), sizes=tuple(int(s) for s in d["sizes"]),
                   ready_s=tuple(float(t) for t in d["ready_s"]))


@dataclasses.dataclass(frozen=True)
class Flow:
    """One background flow: starts at ``start_s`` from ``src`` to ``dst`` with ``size`` bytes."""

    start_s: float
    src: int
    dst: int
    size: int
    trace_size: int
    """The size drawn from the CDF before ``size_scale``; decides small/large classification."""

    @property
    def size_class(self) -> str:
        if self.trace_size < SMALL_FLOW_BYTES:
            return "small"
        if self.trace_size > LARGE_FLOW_BYTES:
            return "large"
        return "medium"


