"""Rate control (NetApprox eq. 2/3 with the R_min floor) and the pacing token bucket. No I/O, no clock."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class EpochCounts:
    sent: int = 0
    acked: int = 0
    lost: int = 0

    @property
    def loss(self) -> float:
        """ρ = 1 - acked/sent, clamped to [0, 1]; 0 when nothing was sent."""
        if self.sent == 0:
            return 0.0
        return min(1.0, max(0.0, 1.0 - self.acked / self.sent))


class RateController:
    """Approximation-aware DCTCP-style rate control.

    Counts packets per group through the ``on_packet_*`` hooks; :meth:`end_epoch` compares each group's
    measured loss ρ_i with its TLR_i and updates the rate once for the whole sender:

    * every group that sent in the epoch has ρ < TLR (or ρ = 0): R <- (1 - m)·R + m·R_max   (eq. 2)
    * otherwise, with ρ the largest loss among groups at or above their TLR: R <- R·(1 - ρ/2)   (eq. 3)
    * never below R_min = one packet per RTT.

    ``ρ = 0`` counts as "below target" so that a job whose TLR is 0 (MSR = 1) can still speed up.
    In ``fixed`` mode (ablation ``base``) the rate stays at R_max.
    """

    def __init__(self, *, max_rate_bps: float, initial_rate_bps: float, gain: float, packet_bits: float,
                 fixed: bool = False) -> None:
        self.max_rate_bps = max_rate_bps
        self.rate_bps = max_rate_bps if fixed else initial_rate_bps
        self.gain = gain
        self.packet_bits = packet_bits
        self.fixed = fixed
        self.epoch: dict[int, EpochCounts] = {}

    def min_rate_bps(self, rtt_s: float) -> float:
        """R_min: one packet per RTT."""
        return min(self.max_rate_bps, self.packet_bits / rtt_s)

    def _counts(self, group_id: int) -> EpochCounts:
        c = self.epoch.get(group_id)
        if c is None:
            c = self.epoch[group_id] = EpochCounts()
        return c

    # Control packets (group_id None: job announce, FIN) are not counted.
    def on_packet_sent(self, *, group_id: int | None, size: int, now: float) -> None:
        if group_id is not None:
            self._counts(group_id).sent += 1

    def on_packet_acked(self, *, group_id: int | None, size: int, now: float) -> None:
        if group_id is not None:
            self._counts(group_id).acked += 1

    def on_packet_lost(self, *, group_id: int | None, size: int, now: float) -> None:
        if group_id is not None:
            self._counts(group_id).lost += 1

    def end_epoch(self, *, tlr: dict[int, float], rtt_s: float) -> dict[int, EpochCounts]:
        """Apply eq. 2 or 3 for the ended epoch; returns the epoch's counts per group and resets them."""
        counts, self.epoch = self.epoch, {}
        if self.fixed:
            return counts
        active = {g: c for g, c in counts.items() if c.sent > 0}
        if active:
            # ρ < TLR with a tolerance, so that 1 - 9/10 counts as equal to a TLR of 0.1
            over = [c.loss for g, c in active.items() if not (c.loss == 0.0 or c.loss < tlr.get(g, 0.0) - 1e-9)]
            if not over:
                self.rate_bps = (1 - self.gain) * self.rate_bps + self.gain * self.max_rate_bps
            else:
                self.rate_bps = self.rate_bps * (1 - max(over) / 2)
        self.rate_bps = min(self.max_rate_bps, max(self.rate_bps, self.min_rate_bps(rtt_s)))
        return counts


class TokenBucket:
    """Pacing: tokens in bytes fill at the current rate up to ``burst_bytes`` (a couple of packets)."""

    def __init__(self, *, burst_bytes: float, now: float) -> None:
        self.burst_bytes = burst_bytes
        self.tokens = burst_bytes
        self.stamp = now

    def refill(self, rate_bps: float, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst_bytes, self.tokens + (now - self.stamp) * rate_bps / 8)
            self.stamp = now

    def can_send(self, size: float) -> bool:
        return self.tokens >= size - 1e-6  # tolerate float rounding at ready_at()

    def consume(self, size: float) -> None:
        self.tokens -= size

    def ready_at(self, size: float, rate_bps: float) -> float:
        """Earliest time at which ``size`` bytes of tokens are available (``stamp`` if already)."""
        missing = size - self.tokens
        if missing <= 0:
            return self.stamp
        return self.stamp + missing * 8 / rate_bps
