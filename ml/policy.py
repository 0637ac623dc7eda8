"""Gradient group policies: which ATP group (and so which MSR) each gradient segment goes in.

A bucket's gradients travel as range-indexed float packets (bounded-loss paper §3.2): segment ``i`` is one
packet holding ``floats_per_packet`` consecutive values. A policy looks at the largest magnitude in each
segment and puts the segment in a group, as the NetApprox PyTorch port marks a ring-allreduce segment with
the group of its gradients (paper §6, Fig. 18):

- :func:`paper_policy`: |g| < 0.001 -> MSR 0 (all may be dropped), 0.001 <= |g| < 0.0025 -> MSR 0.125, the
  rest -> MSR 0.925; the thresholds and MSRs are arguments.
- :func:`single_msr`: every segment in one group with one MSR (the paper's "simpler policy" with one band is
  ``GroupPolicy.bands((0.003,), (0.0, 1.0))``).
- :func:`smallest`: bands by rank instead of magnitude: the given fraction of the segments with the smallest
  magnitude in one group (e.g. MSR 0), the rest in another.

Pure numpy: no torch, no I/O.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from netapprox.hostlib.config import ConfigError


@dataclasses.dataclass(frozen=True)
class GroupPolicy:
    """Bands of segment magnitude, each with an ATP group id and an MSR.

    Segment magnitude = max |g| over the segment's values. Band ``k`` holds magnitudes in
    ``[thresholds[k-1], thresholds[k])`` (band 0 from 0, the last band to infinity) and goes in group
    ``k + 1`` with MSR ``msrs[k]``. Group ids start at 1 (group 0 is ATP's global group)."""

    thresholds: tuple[float, ...] = ()
    """Ascending magnitude boundaries, one fewer than ``msrs``."""

    msrs: tuple[float, ...] = (1.0,)
    """MSR of each band, smallest magnitudes first."""

    relative: bool = False
    """Thresholds are fractions (0..1) of the vector's segments, smallest first, instead of magnitudes: with
    ``(0.2,)`` the fifth of the segments with the smallest magnitude go in band 0, whatever their scale."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "thresholds", tuple(float(t) for t in self.thresholds))
        object.__setattr__(self, "msrs", tuple(float(m) for m in self.msrs))
        if len(self.msrs) != len(self.thresholds) + 1:
            raise ConfigError(f"a policy with {len(self.thresholds)} thresholds needs {len(self.thresholds) + 1} "
                              f"MSRs, got {len(self.msrs)}")
        if any(not (t >= 0 and np.isfinite(t)) for t in self.thresholds) or \
                list(self.thresholds) != sorted(set(self.thresholds)):
            raise ConfigError(f"thresholds {self.thresholds}: must be finite, >= 0 and strictly ascending")
        if self.relative and any(t > 1 for t in self.thresholds):
            raise ConfigError(f"thresholds {self.thresholds}: relative thresholds are fractions, at most 1")
        if any(not 0.0 <= m <= 1.0 for m in self.msrs):
            raise ConfigError(f"MSRs {self.msrs}: each must be in [0, 1]")
        if len(self.msrs) > 0xFFFE:
            raise ConfigError("too many bands")

    @classmethod
    def bands(cls, thresholds: Sequence[float], msrs: Sequence[float]) -> "GroupPolicy":
        return cls(tuple(thresholds), tuple(msrs))

    @property
    def group_ids(self) -> tuple[int, ...]:
        return tuple(range(1, len(self.msrs) + 1))

    def group_msr(self) -> dict[int, float]:
        """ATP ``JobSpec.group_msr``: group id -> MSR."""
        return {k + 1: m for k, m in enumerate(self.msrs)}

    def classify(self, values: np.ndarray, floats_per_packet: int) -> np.ndarray:
        """Group id (uint16) of every segment of ``values`` (1-D), ``ceil(len / floats_per_packet)`` of them."""
        v = np.abs(np.asarray(values, dtype=np.float32).ravel())
        n = len(v)
        if floats_per_packet < 1:
            raise ConfigError("floats_per_packet must be >= 1")
        segs = -(-n // floats_per_packet)
        if segs == 0:
            return np.zeros(0, dtype=np.uint16)
        pad = segs * floats_per_packet - n
        if pad:
            v = np.concatenate([v, np.zeros(pad, dtype=np.float32)])
        mags = v.reshape(segs, floats_per_packet).max(axis=1)
        mags = np.where(np.isnan(mags), np.inf, mags)  # a NaN gradient is never "small"
        if self.relative:
            # by rank: the first floor(t * segs) segments in magnitude order (stable, so ties go by position)
            rank = np.empty(segs, dtype=np.int64)
            rank[np.argsort(mags, kind="stable")] = np.arange(segs)
            cuts = np.floor(np.asarray(self.thresholds) * segs)
            band = np.searchsorted(cuts, rank, side="right")
        else:
            band = np.searchsorted(np.asarray(self.thresholds, dtype=np.float64), mags, side="right")
        return (band + 1).astype(np.uint16)

    def describe(self) -> str:
        if self.relative:
            edges = (0.0,) + self.thresholds + (1.0,)
            return ", ".join(f"segments {edges[k]:.0%}-{edges[k + 1]:.0%} by magnitude: MSR {m:g}"
                             for k, m in enumerate(self.msrs))
        edges = (0.0,) + self.thresholds + (float("inf"),)
        return ", ".join(f"|g| in [{edges[k]:g}, {edges[k + 1]:g}): MSR {m:g}" for k, m in enumerate(self.msrs))


def paper_policy(low: float = 0.001, high: float = 0.0025, msrs: Sequence[float] = (0.0, 0.125, 0.925)) -> GroupPolicy:
    """The NetApprox paper's PyTorch policy (§7.2.3): below ``low`` MSR 0, up to ``high`` MSR 0.125, else 0.925."""
    return GroupPolicy((low, high), tuple(msrs))


def single_msr(msr: float) -> GroupPolicy:
    """Every segment in one group with MSR ``msr`` (1.0: reliable)."""
    return GroupPolicy((), (msr,))


def smallest(fraction: float, msr: float = 0.0, rest: float = 1.0) -> GroupPolicy:
    """The ``fraction`` of a vector's segments with the smallest magnitude at MSR ``msr``, the rest at
    ``rest``: what the network may drop is always the least significant part, whatever the gradients' scale
    (the paper's fixed thresholds put ~97 % of the example's packets in one group)."""
    return GroupPolicy((fraction,), (msr, rest), relative=True)


def top_packets(values: np.ndarray, fraction: float, floats_per_packet: int) -> np.ndarray:
    """A mask over the packets of ``values`` (1-D, not empty): the ``ceil(fraction N)`` with the largest
    magnitude, what a bounded ``top`` all-gather sends."""
    segs = -(-len(values) // floats_per_packet)
    dropped = segs - math.ceil(fraction * segs - 1e-9)
    return smallest(dropped / segs).classify(values, floats_per_packet) == 2


def parse_policy(text: str) -> GroupPolicy:
    """``paper``, ``msr:0.9``, ``bands:T1,T2:M0,M1,M2`` (thresholds, then MSRs) or ``smallest:F:M0,M1`` (the
    fraction F of the segments with the smallest magnitude at M0, the rest at M1): a policy from the command
    line."""
    t = text.strip()
    if t == "paper":
        return paper_policy()
    kind, _, rest = t.partition(":")
    try:
        if kind == "msr":
            return single_msr(float(rest))
        if kind in ("bands", "smallest"):
            th, _, ms = rest.partition(":")
            return GroupPolicy(tuple(float(x) for x in th.split(",") if x), tuple(float(x) for x in ms.split(",")),
                               relative=kind == "smallest")
    except ValueError:
        pass
    raise ConfigError(f"policy {text!r}: expected 'paper', 'msr:X', 'bands:T1,T2:M0,M1,M2' or 'smallest:F:M0,M1'")
