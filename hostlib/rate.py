"""How fast the sender sends: the ``paper`` rate control (NetApprox eq. 2/3 with the R_min floor), the
``adaptive`` window (``WindowController``), and the pacing token bucket. No I/O, no clock."""
from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class EpochCounts:
    sent: int = 0
    acked: int = 0
    lost: int = 0

    @property
    def loss(self) -> float:
        """ρ: the fraction lost of the packets whose fate became known in the epoch (acknowledged or declared
        lost); 0 when none did. Packets still in flight never count: an epoch shorter than a round trip, or
        one whose ACKs are still on their way, is not a lossy epoch."""
        known = self.acked + self.lost
        return self.lost / known if known else 0.0


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

    def on_packet_acked(self, *, group_id: int | None, size: int, now: float, late: bool = False) -> None:
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


class LossEstimate:
    """Loss rate of one group over its recent packets whose fate is known (acknowledged or declared lost).

    Packets in flight never count. Both counts halve whenever their sum exceeds ``memory``, so the
    estimate covers roughly the last ``memory`` to ``2 * memory`` packets; it is ``None`` until
    ``min_samples`` fates are known. An acknowledgement of a packet already counted lost moves it back.
    """

    __slots__ = ("acked", "lost", "memory", "min_samples")

    def __init__(self, *, memory: int, min_samples: int) -> None:
        self.acked = 0.0
        self.lost = 0.0
        self.memory = memory
        self.min_samples = min_samples

    def on_acked(self, late: bool = False) -> None:
        if late and self.lost >= 1.0:
            self.lost -= 1.0
        self.acked += 1.0
        if self.acked + self.lost > self.memory:
            self.acked *= 0.5
            self.lost *= 0.5

    def on_lost(self) -> None:
        self.lost += 1.0
        if self.acked + self.lost > self.memory:
            self.acked *= 0.5
            self.lost *= 0.5

    @property
    def value(self) -> float | None:
        n = self.acked + self.lost
        return self.lost / n if n >= self.min_samples else None


class WindowController:
    """The ``adaptive`` sender's pace: an ACK-clocked window of packets in flight.

    The sender may have ``window`` packets of needed data in flight (extras use only what needed data leaves
    free) and paces them at ``pacing_gain`` x R_max, so a stall of the sender is caught up without bursts
    longer than ``burst_packets``. The window aims at one queue plus one bandwidth-delay product: when ACKs
    echo the queue the switch chose and ``queue_packets`` knows its size, the window grows (by one per ACK
    at first, then by ``gain`` x the ceiling per RTT, at least one packet: eq. 3's R + m R_max) up to ``queue_packets[q]`` + ceil(R_max x min RTT / packet); otherwise
    the ceiling is learned from loss (x0.8 on a loss event, +1 per RTT).

    Loss spends slack: while a group's measured loss (``LossEstimate``: packets whose fate is known) is at
    most its TLR (eq. 1: the budget left over the messages left), losses do not slow the sender. Above it,
    the window is cut as eq. 3 cuts the rate, W <- W (1 - loss / 2), at most once per round trip (until a
    packet sent after the cut is acknowledged), never below ``min_window`` packets (R_min: one packet per RTT).
    """

    def __init__(self, *, max_rate_bps: float, pacing_gain: float, packet_bits: float, initial_window: float,
                 max_window: float, queue_packets: tuple[int, ...], loss_memory: int, min_samples: int,
                 min_window: float = 1.0, header_bytes: int = 74, gain: float = 0.0625) -> None:
        self.max_rate_bps = max_rate_bps
        self.gain = gain
        """m of eq. 3: after a cut the window grows by ``gain`` x its ceiling per RTT."""
        self.rate_bps = pacing_gain * max_rate_bps
        """Pacing rate of the token bucket."""
        self.packet_bits = packet_bits
        self.header_bytes = header_bytes
        """Bytes on the wire around a payload: the ATP header and ``overhead_bytes``."""
        self.mean_packet_bits = float(packet_bits)
        self.window = float(min(initial_window, max_window))
        self.max_window = float(max_window)
        self.min_window = float(min_window)
        self.queue_packets = queue_packets
        self.cap = float(max_window)
        """Ceiling of the window: queue + BDP when the queue is known, else learned."""
        self.cap_known = False
        self.queue: int | None = None
        self.rtt = math.inf
        self.slow_start = True
        self.recover_until = -1
        self.largest_acked = -1
        self.cuts = 0
        self.loss_memory = loss_memory
        self.min_samples = min_samples
        self.loss: dict[int, LossEstimate] = {}
        self.epoch: dict[int, EpochCounts] = {}
        self.epoch_acked_bits = 0.0
        self.delivery_rate_bps = 0.0

    def _estimate(self, group_id: int) -> LossEstimate:
        e = self.loss.get(group_id)
        if e is None:
            e = self.loss[group_id] = LossEstimate(memory=self.loss_memory, min_samples=self.min_samples)
        return e

    def _counts(self, group_id: int) -> EpochCounts:
        c = self.epoch.get(group_id)
        if c is None:
            c = self.epoch[group_id] = EpochCounts()
        return c

    def loss_rate(self, group_id: int) -> float | None:
        e = self.loss.get(group_id)
        return None if e is None else e.value

    # packet hooks (LossRecovery listeners): group_id None = not counted (control, extras, guessed losses)
    def on_packet_sent(self, *, group_id: int | None, size: int, now: float) -> None:
        if group_id is not None:
            self._counts(group_id).sent += 1
            # typical wire size of a data packet (payload + ATP header + overhead), for the BDP in packets
            self.mean_packet_bits += 0.05 * ((size + self.header_bytes) * 8 - self.mean_packet_bits)

    def on_packet_acked(self, *, group_id: int | None, size: int, now: float, late: bool = False) -> None:
        if group_id is not None:
            self._counts(group_id).acked += 1
            self._estimate(group_id).on_acked(late)
            self.epoch_acked_bits += (size + self.header_bytes) * 8

    def on_packet_lost(self, *, group_id: int | None, size: int, now: float) -> None:
        if group_id is not None:
            self._counts(group_id).lost += 1
            self._estimate(group_id).on_lost()

    # window
    def on_path(self, *, queue: int, rtt: float) -> None:
        """An ACK echoed ``queue`` (0xFF: no switch stamped it); ``rtt``: the RTT the bandwidth-delay product
        is taken over. The sender passes its smallest RTT sample plus one pacing train (``pacing_train_s``):
        the smoothed RTT would count the standing queue the window itself builds, and the bare minimum
        undersizes the pipe of a host that is woken up to a train late."""
        self.queue = queue
        self.rtt = rtt
        size = self.queue_packets[queue] if queue < len(self.queue_packets) else 0
        if size > 0:
            bdp = (math.ceil(self.max_rate_bps * self.rtt / self.mean_packet_bits)
                   if self.rtt < math.inf else 1)
            # the queue holds ``size`` MTUs of bytes: in packets of the size being sent, more when they are small
            packets = size * self.packet_bits / self.mean_packet_bits
            self.cap = float(min(self.max_window, packets + max(1, bdp)))
            self.cap_known = True
            if self.window > self.cap:
                self.window = self.cap
        elif self.cap_known:
            self.cap_known = False
            self.cap = self.max_window

    def on_ack(self, seq: int, delivery: float = 1.0) -> None:
        """A needed packet was acknowledged (not a late acknowledgement): open the window. ``delivery``: the share
        of packets that arrive on a path that loses them without a queue (``LossRecovery.delivery``): past the
        start, each ACK then stands for 1 / delivery packets sent, and the window regrows per round trip as on a
        clean path (the start's one packet per ACK is not scaled: it doubles what arrives per round trip)."""
        if seq > self.largest_acked:
            self.largest_acked = seq
        if seq < self.recover_until:
            return
        w = self.window
        if self.slow_start:
            w += 1.0
        else:
            # eq. 3's increase, R <- R + m R_max per epoch, as a window: m x the pipe per RTT (at least one
            # packet), so the window recovers from a cut in ~1/m RTTs at any bandwidth-delay product
            step = max(1.0, self.gain * self.cap) if self.cap_known else 1.0
            w += step / w / delivery
            if not self.cap_known and w > self.cap:
                self.cap += 1.0 / w
        self.window = min(w, self.cap)

    def on_loss(self, *, groups: "set[int] | list[int]", tlr: "dict[int, float]", next_seq: int,
                first: bool = False, queued: bool = True, drain: float = 0.0) -> bool:
        """Needed packets of ``groups`` were declared lost; ``next_seq`` is the next sequence number the
        sender will use; ``first``: every one of them was in the first window (sent before anything came back:
        first windows of jobs that start together collide at their receiver), so the window is cut but keeps
        ramping up (one packet per acknowledgement). Returns True when the window was cut."""
        if self.largest_acked < self.recover_until or not queued:
            return False
        worst = None
        for g in groups:
            est = self.loss_rate(g)
            if est is not None and est > tlr.get(g, 0.0) + 1e-9 and (worst is None or est > worst):
                worst = est
        if worst is not None:
            self.window = max(self.min_window, self.window * max(1.0 - worst / 2.0, drain))
        elif not self.cap_known:
            self.cap = max(2.0, self.window * 0.8)
            self.window = max(self.min_window, min(self.window, self.cap))
        else:
            return False
        self.slow_start = self.slow_start and first
        self.recover_until = next_seq
        self.cuts += 1
        return True

    def end_epoch(self, *, duration_s: float) -> dict[int, EpochCounts]:
        """The epoch's counts per group (reset), and the delivery rate measured over it."""
        counts, self.epoch = self.epoch, {}
        if duration_s > 0:
            self.delivery_rate_bps = self.epoch_acked_bits / duration_s
        self.epoch_acked_bits = 0.0
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
