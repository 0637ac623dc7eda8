"""Loss detection and accounting for the ATP sender (model: aioquic ``quic/recovery.py``). No I/O, no clock.

A packet is acknowledged by an ACK echoing its ``seq`` or by a selective-ack block covering it. It is
declared lost when

* a packet sent ``reorder_threshold`` sequence numbers later has been acknowledged (packet threshold; not once
  the path was seen reordering, below),
* it is older than 9/8 · max(srtt, latest RTT) (at least min_loss_timeout / 5), plus the reorder window the path
  showed, and a later packet has been acknowledged (time threshold),
* or, nothing later acknowledged yet (e.g. every packet of the tail was dropped), it is the oldest packet in
  flight that rate control counts (control packets and surplus before it are declared with it: a surplus
  packet is not sent again), older than the tail timeout T = max(min_loss_timeout, 2·srtt, srtt + 4·rttvar)
  x 2^k, and T has passed since the last packet the tail timeout declared and since the last ACK that
  acknowledged something (RFC 6298 restarts its timer so); k counts those declarations since that ACK, at most
  2 (RFC 9002's probe timeout: one packet per timeout, backing off). The announce parts older than T go with
  it (a receiver takes no data of a job before its announce). Its retransmission is the probe: when its ACK
  comes back, the packets before it that are still missing are lost by the thresholds above; when the packets
  were only queued behind a growing queue, their ACKs come first and one packet was sent twice, not the window.

The tail timeout declares one packet, not every packet past it: a queue that grows faster than the RTT
estimate (two senders into a slow port, a job starting with a window learned on an empty path) delays the
ACKs of a whole window by more than 2·srtt, and declaring the window lost then sent it twice into the same
queue (measured on the rack's slowed port: a third of the retransmissions were of packets that had arrived).

That is the rule while no loss is measured. Once packets are seen dying (``loss``: the loss rate of the counted
packets whose fate is known), one probe per timeout is not enough: a probe that dies 9 times in 10 (and the
doubling timeout after it) left the sender idle for most of a job at 90 % loss. Then a tail timeout declares as
many packets as the loss rate needs for one to arrive (``probes()``: round(1 / (1 - p))), one more per timeout
without an answer (bursts outlast the average), T does not double (a silence on this path is more loss, not a
delay) and, from p = 1/3, T is max(min_loss_timeout, srtt + 4·rttvar, the time threshold). On a ``lossy`` path
(loss measured, the latest RTT sample at the path's minimum: ``queued()``) the sender also sends copies of the
needed packets in flight when it has nothing else to send (``copies()``), and the window neither shrinks for
the loss nor grows slower for it (rate.py). When the answers die too (ACKs: ``answer_loss()``, measured once an ACK
newly acknowledges more packets than one ACK covers or a SACK block acknowledges a packet the tail timeout
declared), a probe must arrive and its ACK come back: ``probes()`` is round(1 / ((1 - p)(1 - a))), and the FIN
goes as many times (``fin_copies()``). With nothing ever acknowledged after two backed-off probes, every
overdue packet is declared (``unanswered()``). docs/hostlib.md, "Loss recovery at each loss rate", has the table.

**Reordering** (model: RACK, RFC 8985). With ``adaptive_reorder`` (on), once the path is seen reordering, a
packet is lost only by time: the packet threshold no longer applies (RACK stops counting duplicate ACKs once it
has seen reordering), and the time threshold grows by a reorder window. The path is seen reordering when an ACK
acknowledges a packet in flight sent before one already acknowledged, or a packet already declared lost: every
transmission has a sequence number of its own, so such an ACK says that this very transmission arrived, not its
retransmission (the loss was spurious; no DSACK is needed to tell). The window opens to a quarter of the min RTT
(RACK's reo_wnd), and a spurious loss widens it to how much later than the time threshold that packet's ACK came,
at most one srtt. After ``REORDER_PERSIST`` losses declared by the thresholds without a spurious one between them,
both go back to the packet threshold and no window (RACK resets its window after 16 recoveries without a DSACK).
A path that never reorders never leaves them: its losses are found exactly as with the fixed threshold. The
cost on a path that reorders: a lost packet is found 9/8 RTT plus the window after it was sent, not when the
``reorder_threshold``-th packet after it is acknowledged. A job on a path known to reorder (``path_reorders``:
the network sprays its packets) starts in that state, the window opening at its first RTT sample: its first
window is not taken for lost before the first reordered ACK comes back (on a spraying fabric, 4 packets per job
were). The ``REORDER_PERSIST`` rule applies to it alike.

An ACK arriving after its packet was declared lost still counts (the receiver has the data), its SACK blocks too,
however long (``_late_in``: at most 64 lookups a block). Listeners
(the rate controller) hear about every packet through keyword-only ``on_packet_sent/acked/lost`` hooks.
"""
from __future__ import annotations

import collections
import dataclasses
import math
from typing import Iterable, Protocol

from netapprox.hostlib.control import ANNOUNCE_MSG_ID
from netapprox.hostlib.rate import LossEstimate

K_TIME_THRESHOLD = 9 / 8
_LATE_ACK_MEMORY = 16384
_LATE_WALK = 64
"""The most sequence numbers one SACK block is looked up in the packets declared lost (``_late_in``)."""
_MAX_TAIL_BACKOFF = 2
_LOSS_MEMORY = 64
_LOSS_MIN_SAMPLES = 1
_MAX_LOSS = 0.95
ACK_COVERS = 16
"""The most packets a receiver covers with one ACK (docs/wire-format.md, ACK coalescing; ``wire.MAX_SACK_BLOCKS``):
an ACK that newly acknowledges more says that an ACK before it did not arrive."""
_MAX_COPIES = 20
"""The most copies of one packet a round of answer probes sends (``copies``), as ``probes()`` is at most 20."""
REORDER_PERSIST = 16
"""Losses declared by the packet or time threshold, none of them spurious, after which both go back to their
defaults (RACK's reo_wnd_persist)."""


@dataclasses.dataclass
class SentPacket:
    seq: int
    msg_id: int
    pkt_idx: int
    group_id: int | None
    """``None`` for control packets (announce, FIN): not counted by rate control."""
    size: int
    sent_time: float
    retransmission: bool = False
    more: tuple[int, ...] = ()
    """A packed packet: the other whole one-packet messages it carried behind ``msg_id`` (packet index 0 each)."""
    first: bool = False
    """Sent in the job's first window (before anything came back): first windows of jobs that start together
    collide at their receiver, so losing them does not end the window's ramp (rate.py)."""
    copy: bool = False
    """A copy of a needed packet still in flight, sent when there was nothing else to send on a lossy path
    (sender.py ``_copy_candidate``): not counted by rate control, its loss is nobody's concern."""
    copies: int = 0
    """Copies of this packet sent so far."""
    by_threshold: bool = False
    """Declared lost by the packet or time threshold (a later packet was acknowledged): an ACK of it after that
    says the path reordered it (``LossRecovery`` raises its thresholds)."""


class PacketListener(Protocol):
    def on_packet_sent(self, *, group_id: int | None, size: int, now: float) -> None: ...
    def on_packet_acked(self, *, group_id: int | None, size: int, now: float, late: bool = False) -> None: ...
    def on_packet_lost(self, *, group_id: int | None, size: int, now: float) -> None: ...


class LossRecovery:
    def __init__(self, *, initial_rtt_s: float, reorder_threshold: int, min_loss_timeout_s: float,
                 adaptive_reorder: bool = True, path_reorders: bool = False,
                 listeners: Iterable[PacketListener] = ()) -> None:
        self.listeners = list(listeners)
        self.reorder_threshold = reorder_threshold
        self.adaptive_reorder = adaptive_reorder
        self.reordering = adaptive_reorder and path_reorders
        """The path was seen reordering, or is known to (``path_reorders``), with ``adaptive_reorder``: the packet
        threshold does not apply."""
        self.reorder_window = 0.0
        """Added to the time threshold once the path reorders: min RTT / 4, widened by spurious losses (at most
        srtt)."""
        self.spurious_losses = 0
        """Packets declared lost by the packet or time threshold and acknowledged after that (reordered, not lost)."""
        self._threshold_losses = 0
        """Losses declared by the packet or time threshold since the last spurious one (``REORDER_PERSIST``)."""
        self.min_loss_timeout_s = min_loss_timeout_s
        self.srtt = initial_rtt_s
        self.rttvar = initial_rtt_s / 2
        self.latest_rtt = initial_rtt_s
        self.min_rtt = float("inf")
        self.has_rtt_sample = False
        self.largest_acked = -1
        self.in_flight: "collections.OrderedDict[int, SentPacket]" = collections.OrderedDict()
        self._declared_lost: "collections.OrderedDict[int, SentPacket]" = collections.OrderedDict()
        self.packets_acked = 0
        self.packets_lost = 0
        self.late_acks = 0
        self.tail_backoff = 0
        """Packets the tail timeout declared since a packet was last acknowledged: it doubles with each (at most
        twice)."""
        self._tail_at = -math.inf
        """When the tail timeout last declared a packet or an ACK last acknowledged one, whichever is later (-inf:
        neither yet): the tail timeout counts from there, as TCP restarts its retransmission timer on every ACK
        of new data (RFC 6298, 5.3)."""
        self.spare_probes = 0
        """Probes the last tail timeout wanted (``probes()`` - 1 and one per silent timeout) beyond the overdue packets
        it found: sent as copies of packets in flight (``copies``) when nothing else is to be sent, until an ACK
        acknowledges something. So a last packet lost in a burst is sent more than once per tail timeout."""
        self.every_overdue = False
        """The last ``detect_lost`` declared every overdue packet (``unanswered``): the sender sends an announce part
        it declared twice."""
        self.answers = LossEstimate(memory=_LOSS_MEMORY, min_samples=_LOSS_MIN_SAMPLES)
        """The loss rate of the answers (``answer_loss``): of the packets acknowledged, over the last 64 to 128, the
        share acknowledged only by another packet's ACK (a SACK block), not by an ACK echoing it."""
        self.missed_answers = 0
        """ACKs that newly acknowledged more than ``ACK_COVERS`` packets, and packets the tail timeout declared lost
        that a SACK block acknowledged later, never an ACK of their own: answers that did not come back
        (``answer_loss``)."""
        self.loss = LossEstimate(memory=_LOSS_MEMORY, min_samples=_LOSS_MIN_SAMPLES)
        """The loss rate of the counted packets (not control, not surplus) whose fate is known, over the last 64 to
        128 of them: how many of the packets a tail timeout finds unacknowledged it declares lost."""
        self.lost_by = {"reorder": 0, "time": 0, "tail": 0, "trim": 0}
        """How losses were found: a packet ``reorder_threshold`` later acknowledged, the time threshold after a
        later packet was acknowledged, the tail timeout with nothing later acknowledged, or the receiver saying
        that it arrived trimmed (a switch cut its payload)."""

    # -- timing ------------------------------------------------------------------------------------

    @property
    def tail_timeout(self) -> float:
        if self.probes() > 1:  # most packets die: an ACK is late by the RTT's variation at most, no backoff
            return max(self.min_loss_timeout_s, self.srtt + 4 * self.rttvar, self.time_threshold)
        base = max(self.min_loss_timeout_s, 2 * self.srtt, self.srtt + 4 * self.rttvar)
        if self.has_rtt_sample and self.loss.value:  # packets die here: a silence is more loss, not a delay
            return base
        return base * (1 << min(self.tail_backoff, _MAX_TAIL_BACKOFF))

    def probes(self) -> int:
        """Packets a tail timeout declares lost: as many as the measured loss rates need for one of them to arrive
        and be answered, round(1 / ((1 - p) (1 - a))) with p the data's loss rate and a the answers'
        (``answer_loss``, 0 on a path that loses no answers: round(1 / (1 - p)), 1 below p = 1/3, 2 up to 0.6, 10 at
        0.9); at most 20."""
        return self._probes(self.answer_loss())

    def answer_loss(self) -> float:
        """The measured loss rate of the receiver's answers (ACKs): the share of acknowledged packets that no ACK of
        their own acknowledged (``answers``), once an answer is known to have died (``missed_answers``: an ACK that
        newly acknowledged more packets than one ACK may cover, or a packet the tail timeout declared lost that
        arrived and was never answered); else 0. Until then a packet acknowledged by a block may have shared its ACK
        with the packets that arrived with it (ACK coalescing), which is no loss."""
        return (self.answers.value or 0.0) if self.missed_answers else 0.0

    def copies(self) -> int:
        """How many copies of each needed packet in flight the sender sends when it has nothing else to send: on a
        ``lossy`` path, as many as the loss rate needs for one transmission to arrive (``probes()`` - 1: none below
        p = 1/3, 1 up to 0.6, 9 at 0.9), one more per tail timeout since the last acknowledgement (a burst of loss
        outlasts the average); else the probes the last tail timeout wanted and found no overdue packets for
        (``spare_probes``). None below p = 1/3 until a tail timeout: most packets arrive, and a copy at each job's
        end costs a packet time on the link for a loss that is unlikely; with many short jobs (a DDP all-gather's
        buckets on 20 Mbit/s links) even one copy per job was 2 % of an iteration (docs/hostlib.md)."""
        if self.answer_loss():  # answers die: the probes a tail timeout wanted beyond its packets go as copies too
            data = self._probes(0.0) - 1 + self.tail_backoff if self.lossy() else 0
            return max(data, _MAX_COPIES if self.spare_probes else 0)
        return self.probes() - 1 + self.tail_backoff if self.lossy() else self.spare_probes

    def fin_copies(self) -> int:
        """FINs the sender sends at a time: 1 on a path that loses no answers (``answer_loss``), else ``probes()``
        (one of them must arrive and its DONE come back)."""
        return self.probes() if self.answer_loss() else 1

    def _probes(self, a: float) -> int:
        """``probes()`` with the answers' loss rate ``a``; ``_probes(0.0)``: for the data's loss rate alone (copies
        make the data arrive; one answer acknowledges all)."""
        p = self.loss.value
        if (p is None and not a) or not self.has_rtt_sample:
            return 1
        arrive = (1.0 - min(p or 0.0, _MAX_LOSS)) * (1.0 - min(a, _MAX_LOSS))
        return int(min(1.0 / arrive, 1.0 / (1.0 - _MAX_LOSS)) + 0.5)

    def unanswered(self) -> bool:
        """Nothing was ever acknowledged and the tail timeout has backed off to its longest: the path loses most of
        what is sent (or the receiver is away), and what is sent again goes twice."""
        return not self.has_rtt_sample and self.tail_backoff >= _MAX_TAIL_BACKOFF

    def delivery(self) -> float:
        """The share of what is sent that arrives, as the window should see it: 1 - the measured loss rate on a
        ``lossy`` path (at least 1/20), else 1 (a loss with a queue in the path is the window's to react to)."""
        return 1.0 - min(self.loss.value, _MAX_LOSS) if self.lossy() else 1.0

    def lossy(self) -> bool:
        """Packets die on this path (the measured loss rate is above 0) and no queue stands in it (``queued``): an
        ACK that does not come within the RTT and its variation is a loss, not a delay."""
        return self.has_rtt_sample and bool(self.loss.value) and not self.queued()

    @property
    def time_threshold(self) -> float:
        """How long after a later packet was acknowledged a packet counts as lost: 9/8 of the RTT, at least a fifth
        of ``min_loss_timeout_s`` (1 ms at its default of 5 ms: the jitter of a loaded host's wake-ups; 40 µs
        with the 200 µs of a data-center simulation), plus the reorder window (0 until the path reorders)."""
        return self._base_time_threshold() + self.reorder_window

    def _base_time_threshold(self) -> float:
        return max(K_TIME_THRESHOLD * max(self.srtt, self.latest_rtt), self.min_loss_timeout_s / 5)

    def queued(self) -> bool:
        """Whether the latest RTT sample shows a queue in the path: above the smallest by more than a quarter of it
        and more than ``min_loss_timeout_s`` / 5 (a loaded host's wake-up jitter). A drop-tail queue drops only
        when full, so a loss is congestion when the packets around it waited: the ACK that shows the loss (of a
        packet sent after the lost one) comes through the same full queue. A loss on a path whose RTT stays at
        its minimum is the wire's (a lossy link, a policer, corruption): slowing down does not help."""
        return self.latest_rtt - self.min_rtt > max(self.min_rtt / 4, self.min_loss_timeout_s / 5)

    def drain(self) -> float:
        """The share of the window that leaves the queue the latest RTT sample shows: min RTT / latest RTT (0
        before a sample). A window cut need not go below it: on a path that loses packets without a queue, the
        loss rate is no measure of how far the window overshot."""
        return self.min_rtt / self.latest_rtt if self.has_rtt_sample else 0.0

    def _update_rtt(self, sample: float) -> None:
        sample = max(sample, 1e-6)
        self.latest_rtt = sample
        self.min_rtt = min(self.min_rtt, sample)
        if not self.has_rtt_sample:
            self.srtt, self.rttvar, self.has_rtt_sample = sample, sample / 2, True
            if self.reordering:  # known to reorder before any sample (path_reorders): the window opens now
                self._reordered()
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - sample)
            self.srtt = 0.875 * self.srtt + 0.125 * sample

    def loss_deadline(self) -> float | None:
        """When the oldest packet in flight will be declared lost if nothing changes."""
        if not self.in_flight:
            return None
        oldest = next(iter(self.in_flight.values()))
        if oldest.seq < self.largest_acked:
            return oldest.sent_time + self.time_threshold
        return max(oldest.sent_time, self._tail_at) + self.tail_timeout

    # -- events ------------------------------------------------------------------------------------

    def on_packet_sent(self, packet: SentPacket) -> None:
        if packet.copy and self.spare_probes and (not self.lossy() or self.answer_loss()):
            self.spare_probes -= 1
        self.in_flight[packet.seq] = packet
        for listener in self.listeners:
            listener.on_packet_sent(group_id=packet.group_id, size=packet.size, now=packet.sent_time)

    def on_ack_received(self, *, seq: int, blocks: list[tuple[int, int]], now: float, trimmed: bool = False
                        ) -> tuple[list[SentPacket], list[SentPacket]]:
        """Process one ACK: returns (newly acknowledged, newly lost) packets. ``trimmed``: the ACK says packet
        ``seq`` arrived without its payload (a switch trimmed it): lost now, no timer; its blocks acknowledge as
        usual."""
        acked: list[SentPacket] = []
        late_acked: list[SentPacket] = []
        lost: list[SentPacket] = []
        prior_largest = self.largest_acked
        pkt = self.in_flight.pop(seq, None)
        if trimmed:
            if pkt is not None:
                self.lost_by["trim"] += 1
                lost.append(pkt)
        elif pkt is not None:
            self._update_rtt(now - pkt.sent_time)
            self.answers.on_acked()
            acked.append(pkt)
            if seq < prior_largest:  # it arrived after a packet sent later
                self._reordered()
        else:
            late = self._declared_lost.pop(seq, None)
            if late is not None:
                self.late_acks += 1
                self.answers.on_acked()
                late_acked.append(late)
        largest = max([seq] + [last for _, last in blocks])
        if largest > self.largest_acked:
            self.largest_acked = largest
        echoed = len(late_acked)
        for first, last in blocks:  # late ACKs of packets already declared lost
            self._late_in(first, last, late_acked)
        for p in late_acked[echoed:]:  # acknowledged by a block, not by an ACK of their own: its answer died
            self.answers.on_lost()
            self.missed_answers += not p.by_threshold
        for p in late_acked:
            if p.by_threshold:
                self._spurious(p, now)
        # Walk the oldest packets up to the largest acknowledged: covered ones are acked, far ones lost.
        keep: list[SentPacket] = []
        thr = self.time_threshold
        while self.in_flight:
            s, p = next(iter(self.in_flight.items()))
            if s > self.largest_acked:
                break
            self.in_flight.popitem(last=False)
            if any(first <= s <= last for first, last in blocks):
                self.answers.on_lost()
                acked.append(p)
                if s < prior_largest:  # it arrived after a packet sent later: the packets after it are not lost
                    self._reordered()  # by the packet threshold (the time threshold of this ACK stays)
            elif not self.reordering and self.largest_acked - s >= self.reorder_threshold:
                self.lost_by["reorder"] += 1
                p.by_threshold = True
                lost.append(p)
            elif now - p.sent_time >= thr:
                self.lost_by["time"] += 1
                p.by_threshold = True
                lost.append(p)
            else:
                keep.append(p)
        for p in reversed(keep):
            self.in_flight[p.seq] = p
            self.in_flight.move_to_end(p.seq, last=False)
        if len(acked) + len(late_acked) > ACK_COVERS:  # more than one ACK's worth: an answer before it died
            self.missed_answers += 1
        if acked or late_acked:  # progress: the tail timeout counts from now, at its base value
            self.tail_backoff, self._tail_at, self.spare_probes = 0, now, 0
        self._account(acked, lost, now, late_acked)
        return acked + late_acked, lost

    def _late_in(self, first: int, last: int, out: list[SentPacket]) -> None:
        """Move the packets declared lost that block [first, last] acknowledges to ``out``, with at most
        ``_LATE_WALK`` lookups: every sequence number of a short block; in a longer one each packet remembered,
        oldest first, when few are; else the block's newest ``_LATE_WALK`` (a forged block of 2^32 costs as
        little as a short one). A long block is what the ACKs after a run of lost ones carry: nothing was lost on
        the way there, so the packets their tail timeout declared lost in between arrived, and their messages
        are delivered (without it, 89 % of the ACKs lost sent the same message again at every tail timeout)."""
        if not self._declared_lost:
            return
        if last - first < _LATE_WALK:
            seqs: Iterable[int] = range(first, last + 1)
        elif len(self._declared_lost) <= _LATE_WALK:
            seqs = [s for s in self._declared_lost if first <= s <= last]
        else:
            seqs = range(last - _LATE_WALK + 1, last + 1)
        for s in seqs:
            late = self._declared_lost.pop(s, None)
            if late is not None:
                self.late_acks += 1
                out.append(late)

    def detect_lost(self, now: float) -> list[SentPacket]:
        """Declare lost every packet past its time threshold, or the oldest one past the tail timeout (which
        then doubles until something is acknowledged); call from the loss timer."""
        lost: list[SentPacket] = []
        tail = self.tail_timeout
        thr = self.time_threshold
        self.every_overdue = False
        while self.in_flight:
            p = next(iter(self.in_flight.values()))
            later_acked = p.seq < self.largest_acked
            if now < (p.sent_time + thr if later_acked else max(p.sent_time, self._tail_at) + tail):
                break  # the same expressions as loss_deadline()
            self.in_flight.popitem(last=False)
            self.lost_by["time" if later_acked else "tail"] += 1
            p.by_threshold = later_acked
            lost.append(p)
            if not later_acked and p.group_id is not None:  # a probe
                # and more needed packets past it while the loss rate says one of them must arrive (probes(), one
                # more per tail timeout since the last acknowledgement: a burst of loss outlasts the average), the
                # surplus and control packets between them, and the announce parts past it (a receiver takes no
                # data of the job without them); with nothing ever acknowledged after two backed-off probes, every
                # overdue packet (the path loses most of them, or the receiver is away)
                more = self.probes() - 1 + (self.tail_backoff if self.has_rtt_sample else 0)
                every = self.every_overdue = self.unanswered()
                for q in [q for q in self.in_flight.values() if now >= max(q.sent_time, self._tail_at) + tail]:
                    if q.msg_id == ANNOUNCE_MSG_ID or every or more > 0:
                        del self.in_flight[q.seq]
                        self.lost_by["tail"] += 1
                        lost.append(q)
                        more -= q.group_id is not None and q.msg_id != ANNOUNCE_MSG_ID
                self.spare_probes = max(0, more)
                self.tail_backoff += 1
                self._tail_at = now
                break
        self._account([], lost, now)
        return lost

    def _reordered(self) -> None:
        """A packet was acknowledged after one sent later: the path reorders. From now on a packet is lost by time
        only, and the time threshold has a reorder window of at least a quarter of the min RTT (RACK's)."""
        if self.adaptive_reorder and self.has_rtt_sample:
            self.reordering = True
            self.reorder_window = max(self.reorder_window, min(self.srtt, self.min_rtt / 4))

    def _spurious(self, p: SentPacket, now: float) -> None:
        """Packet ``p``, declared lost by a threshold, was acknowledged after all: the path reordered it. The reorder
        window widens to how much later than the time threshold its ACK came (at most srtt), so that the same
        reordering is not taken for loss again."""
        self.spurious_losses += 1
        self._threshold_losses = 0
        self._reordered()
        if self.reordering:
            late = now - p.sent_time - self._base_time_threshold()
            self.reorder_window = min(self.srtt, max(self.reorder_window, late))

    def _forget_reordering(self, lost: list[SentPacket]) -> None:
        """``REORDER_PERSIST`` losses declared by the thresholds, none found spurious since the last: back to the
        default thresholds (a path that stopped reordering recovers its losses as fast as one that never did)."""
        self._threshold_losses += sum(p.by_threshold for p in lost)
        if self._threshold_losses >= REORDER_PERSIST:
            self._threshold_losses = 0
            self.reordering, self.reorder_window = False, 0.0

    def _account(self, acked: list[SentPacket], lost: list[SentPacket], now: float,
                 late_acked: list[SentPacket] = ()) -> None:
        self._forget_reordering(lost)
        for p in acked:
            self.packets_acked += 1
            if p.group_id is not None:
                self.loss.on_acked()
            for listener in self.listeners:
                listener.on_packet_acked(group_id=p.group_id, size=p.size, now=now)
        for p in late_acked:  # acknowledged after being declared lost: the receiver has it after all
            self.packets_acked += 1
            if p.group_id is not None:
                self.loss.on_acked(late=True)
            for listener in self.listeners:
                listener.on_packet_acked(group_id=p.group_id, size=p.size, now=now, late=True)
        for p in lost:
            self.packets_lost += 1
            if p.group_id is not None:
                self.loss.on_lost()
            self._declared_lost[p.seq] = p
            if len(self._declared_lost) > _LATE_ACK_MEMORY:
                self._declared_lost.popitem(last=False)
            for listener in self.listeners:
                listener.on_packet_lost(group_id=p.group_id, size=p.size, now=now)
