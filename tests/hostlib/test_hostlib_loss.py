"""Loss recovery at every loss rate, in simulated time: one job over a link of known rate whose packets die on the
wire (after the bottleneck, so the link carries what dies too), each run held to a bound of the ideal, the time
the bytes the MSRs need take at the link's rate when a fraction ``loss`` of what is sent dies:
needed wire bytes / (1 - loss) / rate. Hypothesis draws the pattern (random, Gilbert-Elliott bursts, periodic,
ACK-path loss, reordering) and its rate; the virtual clock of hostlib_sim makes each run exact and fast (no
wall-clock anywhere). Both cores (the ``cores`` fixture)."""
from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hostlib_sim import Path, run_job
from netapprox.hostlib import wire
from netapprox.hostlib.config import AtpConfig, JobSpec, Message
from netapprox.hostlib.recovery import LossRecovery, SentPacket
from test_hostlib_transfer import assert_guarantee

pytestmark = pytest.mark.usefixtures("cores")

RATE_BPS = 20e6
DELAY_S = 0.005  # one way: a 10 ms RTT, a bandwidth-delay product of ~23 packets
SIZE = 1000
CONFIG = AtpConfig(max_rate_bps=RATE_BPS, initial_rtt_s=0.01, receiver_grants=False)
"""Without receiver grants; ``GRANTED`` with them (the receiver told the link's rate)."""
SLACK_RTTS = 10
"""Added to every bound: the first window's round trip, the FIN's, and the last repairs' rounds ..."""
UNANSWERED_S = 0.03 + 0.06 + 0.12
"""... and the start's probes before anything is acknowledged: until then nothing tells the sender whether packets
die or its receiver is away, and the probe timeout backs off as RFC 9002's does (3 x the 10 ms initial RTT,
doubling twice); then every overdue packet goes again (docs/hostlib.md, "Loss recovery at each loss rate")."""


def job(messages: int = 300) -> JobSpec:
    """Two groups, MSR 1.0 and 0.5 (the approximate one may lose half)."""
    return JobSpec(job_id=7, messages=tuple(Message(bytes([i % 251]) * SIZE, group_id=i % 2) for i in range(messages)),
                   group_msr=((0, 1.0), (1, 0.5)))


def ideal_s(j: JobSpec, loss: float) -> float:
    """The needed messages' packets on the wire (header and IPv4/UDP/Ethernet included) at RATE_BPS, over 1 - loss."""
    need = sum(math.ceil(round(j.msr_of(g) * n, 9)) for g, n in j.group_sizes().items())
    return need * (SIZE + wire.HEADER_LEN + CONFIG.overhead_bytes) * 8 / RATE_BPS / (1 - loss)


@dataclasses.dataclass
class LossyLink(Path):
    """A 20 Mbit/s link with a 64-packet queue whose packets die after it by ``pattern`` (time sent -> dead?)."""

    pattern: object = None

    def transit(self, data: bytes, now: float) -> list[tuple[float, bytes]]:
        out = super().transit(data, now)
        return [] if out and self.pattern is not None and self.pattern(now) else out


SLOT_S = (SIZE + wire.HEADER_LEN + CONFIG.overhead_bytes) * 8 / RATE_BPS
"""One packet's time on the link: the Gilbert-Elliott chain's step."""


def random_loss(p: float, seed: int):
    rng = random.Random(seed)
    return lambda now: rng.random() < p


def gilbert_elliott(p_gb: float, p_bg: float, seed: int):
    """Two states, good (nothing dies) and bad (everything dies), stepped once per packet time on the link
    (``SLOT_S``), so that a burst lasts as long on the wire whether packets go back to back or one every 20 ms (a
    FIN's retries): bursts of 1 / p_bg packets while the link is busy; mean loss p_gb / (p_gb + p_bg). A chain
    stepped per packet sent instead turns a burst into an outage of seconds once the job has ended (86 FIN retries
    in a row lost, the receiver never confirms: an outage, not a burst)."""
    rng = random.Random(seed)
    state = {"bad": False, "t": None}

    def dead(now: float) -> bool:
        steps = 1 if state["t"] is None else max(1, min(10_000, round((now - state["t"]) / SLOT_S)))
        state["t"] = now
        for _ in range(steps):
            state["bad"] = rng.random() >= p_bg if state["bad"] else rng.random() < p_gb
        return state["bad"]
    return dead


def periodic(lose: int, every: int):
    """The first ``lose`` packets of every ``every`` die."""
    n = [0]

    def dead(now: float) -> bool:
        n[0] += 1
        return (n[0] - 1) % every < lose
    return dead


def run(pattern, loss: float, *, reverse: Path | None = None, jitter: float = 0.0, stamped: bool = False,
        j: JobSpec | None = None, seed: int = 1, config: AtpConfig = CONFIG):
    j = j or job()
    fwd = LossyLink(delay=DELAY_S, jitter=jitter, rate_bps=RATE_BPS, queue_packets=64,
                    queue_byte=0 if stamped else None, seed=seed, pattern=pattern)
    r = run_job(j, config, forward=fwd, reverse=reverse or Path(delay=DELAY_S, seed=seed + 1), until=600)
    assert_guarantee(r, j)
    return r, ideal_s(j, loss)


BOUND = {"random": 2.0, "heavy": 3.0, "burst": 3.0, "periodic": 3.0, "reorder": 3.0, "ack": 5.0, "extreme": 4.0}
"""Each pattern's bound, in ideals, plus ``SLACK_RTTS`` and ``UNANSWERED_S``: the benchmark's bars (2x up to 60 % random loss, 3x
beyond and under bursts) where it has them; ACK-path loss is not in the ideal (nor in the benchmark), and
losing most ACKs slows the start, when nothing tells the sender yet whether its receiver is there."""


def within(r, ideal: float, factor: float) -> None:
    limit = factor * ideal + SLACK_RTTS * 2 * DELAY_S + UNANSWERED_S
    assert r.summary.jct_s <= limit, (f"JCT {r.summary.jct_s:.3f} s > {factor} x ideal {ideal:.3f} s + "
                                      f"{SLACK_RTTS} RTTs + {UNANSWERED_S:g} s ({r.summary.losses_found_by}, "
                                      f"{r.summary.retransmissions} retransmissions)")


SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(loss=st.floats(0.0, 0.6), seed=st.integers(1, 10_000), stamped=st.booleans())
def test_random_loss_finishes_near_the_ideal(loss, seed, stamped):
    r, ideal = run(random_loss(loss, seed), loss, stamped=stamped, seed=seed)
    within(r, ideal, BOUND["random"])


@SETTINGS
@given(loss=st.floats(0.6, 0.9), seed=st.integers(1, 10_000), stamped=st.booleans())
def test_heavy_random_loss_finishes_near_the_ideal(loss, seed, stamped):
    r, ideal = run(random_loss(loss, seed), loss, stamped=stamped, seed=seed)
    within(r, ideal, BOUND["heavy"])


@SETTINGS
@given(p_gb=st.floats(0.01, 0.2), burst=st.floats(2.0, 20.0), seed=st.integers(1, 10_000))
def test_loss_bursts_finish_near_the_ideal(p_gb, burst, seed):
    """Gilbert-Elliott: bursts of ``burst`` packets on average (the benchmark's are 10), mean loss up to 0.6."""
    p_bg = 1 / burst
    assume(p_gb / (p_gb + p_bg) <= 0.6)
    r, ideal = run(gilbert_elliott(p_gb, p_bg, seed), p_gb / (p_gb + p_bg), seed=seed)
    within(r, ideal, BOUND["burst"])


@SETTINGS
@given(every=st.integers(2, 20), data=st.data())
def test_periodic_loss_finishes_near_the_ideal(every, data):
    lose = data.draw(st.integers(1, max(1, int(every * 0.9))), label="lose")
    loss = lose / every
    r, ideal = run(periodic(lose, every), loss)
    within(r, ideal, BOUND["periodic"] if loss <= 0.6 else BOUND["heavy"])


@SETTINGS
@given(ack_loss=st.floats(0.0, 0.9), loss=st.floats(0.0, 0.6), seed=st.integers(1, 10_000))
def test_ack_path_loss_finishes_near_the_ideal(ack_loss, loss, seed):
    """ACKs die too: SACK blocks cover the lost ones. Only the data's loss counts in the ideal, and losing most ACKs
    slows the start: the bound is 5x."""
    reverse = Path(delay=DELAY_S, loss=ack_loss, seed=seed + 1)
    r, ideal = run(random_loss(loss, seed), loss, reverse=reverse, seed=seed)
    within(r, ideal, BOUND["ack"])


def test_acks_after_a_run_of_lost_ones_deliver_what_the_tail_timeout_declared_lost():
    """``test_ack_path_loss_finishes_near_the_ideal``'s example that failed, 89 % of the ACKs lost, none of the data:
    the ACKs of the job's last 16 packets died, the tail timeout declared them lost one probe at a time, and the
    next ACK to arrive carried one SACK block of 300 sequence numbers. A block that long was not looked up in the
    packets declared lost (a bound on the work of a forged one), so the last message, which had arrived twice, was
    sent four more times (0.809 s against a bound of 0.793 s; now 0.629 s)."""
    reverse = Path(delay=DELAY_S, loss=0.890625, seed=373)
    r, ideal = run(random_loss(0.0, 372), 0.0, reverse=reverse, seed=372)
    within(r, ideal, BOUND["ack"])


def _sent(recovery: LossRecovery, seqs) -> None:
    for s in seqs:
        recovery.on_packet_sent(SentPacket(s, s, 0, 0, 1000, 0.0))


def _late_acked(declared: int, sent: int, block: tuple[int, int]) -> list[int]:
    """``sent`` packets, all but the newest ``sent - declared`` declared lost by the packet threshold, then one ACK
    with ``block``: the packets it acknowledges late."""
    recovery = LossRecovery(initial_rtt_s=2 * DELAY_S, reorder_threshold=3, min_loss_timeout_s=0.005)
    _sent(recovery, range(sent))
    _, lost = recovery.on_ack_received(seq=sent - 1, blocks=[(declared, sent - 1)], now=0.02)
    assert [p.seq for p in lost] == list(range(declared))
    acked, _ = recovery.on_ack_received(seq=sent - 1, blocks=[block], now=0.03)
    assert recovery.late_acks == len(acked)
    return [p.seq for p in acked]


def test_a_long_sack_block_acknowledges_the_packets_declared_lost_at_a_bounded_cost():
    """The rule of ``LossRecovery._late_in`` (the native core is held to it by the differential test): a block
    shorter than 64 sequence numbers is looked up number by number; in a longer one, each packet remembered as
    declared lost when at most 64 are, else only the block's newest 64 numbers (a forged block of 2^32 numbers
    costs no more)."""
    assert _late_acked(40, 50, (30, 49)) == list(range(30, 40))  # short: every number
    assert _late_acked(50, 100, (0, 99)) == list(range(50))  # long, 50 remembered: each of them
    assert _late_acked(150, 200, (0, 199)) == list(range(136, 150))  # long, 150 remembered: the newest 64
    assert _late_acked(150, 200, (0, 2**32 - 1)) == []  # forged: its newest 64 numbers were never sent


def _answered(acks: list[tuple[int, list[tuple[int, int]]]], sent: int = 100) -> LossRecovery:
    """``sent`` packets of group 0, then ``acks`` as (echoed seq, SACK blocks)."""
    recovery = LossRecovery(initial_rtt_s=2 * DELAY_S, reorder_threshold=3, min_loss_timeout_s=0.005)
    for s in range(sent):
        recovery.on_packet_sent(SentPacket(s, s, 0, 0, 1000, 0.0))
    for i, (seq, blocks) in enumerate(acks):
        recovery.on_ack_received(seq=seq, blocks=blocks, now=0.01 + i * 1e-3)
    return recovery


def test_the_answers_loss_is_measured_once_an_answer_is_known_to_have_died():
    """The rule of ``LossRecovery.answer_loss`` (the native core is held to it by the differential test): the share
    of acknowledged packets no ACK of their own acknowledged, once an ACK newly acknowledged more packets than one
    ACK may cover (16: ACK coalescing, docs/wire-format.md). Coalesced ACKs alone are no loss: the tail's probes and
    FINs stay one at a time; with 7 of 8 answers lost, a round is 8 probes and 8 FINs."""
    coalesced = _answered([(15, [(0, 15)]), (31, [(16, 31)])])  # two ACKs of 16 packets each: nothing died
    assert coalesced.answers.value == 30 / 32 and coalesced.answer_loss() == 0.0
    assert (coalesced.probes(), coalesced.fin_copies(), coalesced.copies()) == (1, 1, 0)
    died = _answered([(7, [(0, 7)]), (31, [(0, 31)])])  # 24 packets newly acknowledged by one ACK: an ACK died
    assert died.missed_answers == 1 and died.answer_loss() == 30 / 32
    assert died.loss.value == 0.0 and died.probes() == round(1 / (1 - 30 / 32)) == 16 == died.fin_copies()
    seven_of_eight = _answered([(s, [(0, s)]) for s in range(0, 32, 8)] + [(41, [(0, 41)])])
    assert seven_of_eight.answer_loss() == 37 / 42 and seven_of_eight.probes() == 8


def test_a_late_ack_in_a_block_of_a_packet_the_tail_timeout_declared_is_a_missed_answer():
    """A packet the tail timeout declared lost, acknowledged later by another packet's SACK block: it arrived, its
    answer did not (a packet the thresholds declared and acknowledged late was reordered: no answer is missed)."""
    recovery = _answered([(0, [(0, 0)])], sent=3)
    assert recovery.detect_lost(1.0) and recovery.missed_answers == 0
    recovery.on_ack_received(seq=2, blocks=[(1, 2)], now=1.01)
    assert recovery.late_acks == 1 and recovery.missed_answers == 1 and recovery.answer_loss() == 1 / 3


def test_the_tail_and_the_fin_are_sized_by_the_answers_loss():
    """``test_ack_path_loss_finishes_near_the_ideal``'s job at 88 % ACK loss and no data loss (seed 20055 of the
    draws in docs/results.md, "ACK-path loss"): the last message's probes went one, two, ... five at a time, nine
    rounds of 55 ms (1.124 s against a bound of 0.793 s); sized by the answers' loss, 0.779 s. And at 89 % ACK loss
    and 33 % data loss (seed 20072) no DONE came back to one FIN per tail timeout within ``fin_timeout_s``; with as
    many FINs at a time as the answers' loss needs, the receiver confirms."""
    for seed, ack_loss, loss in ((20055, 0.8831387049125576, 0.0), (20072, 0.8867261280369925, 0.33379773705741406)):
        r, ideal = run(random_loss(loss, seed), loss, reverse=Path(delay=DELAY_S, loss=ack_loss, seed=seed + 1),
                       seed=seed)
        within(r, ideal, BOUND["ack"])
        assert r.summary.receiver_confirmed and r.summary.closed_s - r.summary.jct_s < CONFIG.fin_timeout_s / 4


@SETTINGS
@given(jitter=st.floats(0.0, 0.01), loss=st.floats(0.0, 0.6), seed=st.integers(1, 10_000))
def test_reordering_with_loss_finishes_near_the_ideal(jitter, loss, seed):
    """Up to 10 ms of jitter on a 10 ms RTT: packets overtake each other by dozens."""
    r, ideal = run(random_loss(loss, seed), loss, jitter=jitter, seed=seed)
    within(r, ideal, BOUND["reorder"])


@pytest.mark.parametrize("loss", [0.93, 0.95])
def test_the_job_finishes_when_almost_everything_dies(loss):
    r, ideal = run(random_loss(loss, 5), loss, j=job(100))
    within(r, ideal, BOUND["extreme"])


GRANTED = dataclasses.replace(CONFIG, receiver_grants=True)


@pytest.mark.parametrize("loss", [0.93, 0.95])
def test_a_granted_job_finishes_when_almost_everything_dies(loss):
    """The test above with receiver grants on (the receiver told the link's rate). A granted packet declared lost
    past the newest packet the receiver had when it granted gives its place back: without that, a grant spent on
    packets that died waited for a tail timeout and its one probe (5.0 s and 13.1 s here, against bounds of 2.2 s
    and 2.9 s)."""
    r, ideal = run(random_loss(loss, 5), loss, j=job(100), config=GRANTED)
    within(r, ideal, BOUND["extreme"])


def test_a_granted_job_under_heavy_random_loss_finishes_near_the_ideal():
    """``test_heavy_random_loss_finishes_near_the_ideal``'s example that failed with grants, 84 % loss: the budget
    counted in full packets under-filled the path of 1000-byte messages (2.18 s against a bound of 2.17 s; now
    1.77 s, with the budget in the packets that arrive)."""
    r, ideal = run(random_loss(0.84375, 402), 0.84375, seed=402, config=GRANTED)
    within(r, ideal, BOUND["heavy"])


@pytest.mark.parametrize("seed", [132, 9091])
def test_a_granted_job_under_ack_path_loss_finishes_near_the_ideal(seed):
    """``test_ack_path_loss_finishes_near_the_ideal``'s two examples that failed with grants, 87.5 % of the ACKs
    lost: a budget counted in full packets (18 at 20 Mbit/s and 10 ms) left the path of 1000-byte messages (24
    fit) under-filled, and the grants the lost ACKs carried came late (seed 132: 0.97 s against a bound of 0.79 s,
    0.61 s after that fix, 0.46 s now). Seed 9091: when every ACK of a grant's packets was lost, the sender waited
    at its spent grant and sent one probe per tail timeout (0.89 s); now a tail timeout gives the overdue granted
    packets' places back, as their ACKs would have (0.69 s)."""
    reverse = Path(delay=DELAY_S, loss=0.875, seed=seed + 1)
    r, ideal = run(random_loss(0.0, seed), 0.0, reverse=reverse, seed=seed, config=GRANTED)
    within(r, ideal, BOUND["ack"])


def test_losses_on_a_path_without_a_queue_do_not_close_the_window():
    """60 % random loss on a path whose RTT stays at its minimum: no loss is congestion, so most losses are found by
    the packet threshold with the window open (cut to its floor of one packet, as it was while any loss above the TLR
    cut it, they waited for tail timeouts one at a time: 45-52x the ideal)."""
    r, _ = run(random_loss(0.6, 3), 0.6)
    assert r.summary.losses_found_by["reorder"] > 10 * r.summary.losses_found_by["tail"]
    assert r.sender.window.window >= 16


def test_a_few_losses_get_no_copy_before_a_tail_timeout():
    """A two-packet queue at 20 Mbit/s: its drops leave the RTT at its minimum, so the path looks lossy at a loss
    rate far below 1/3. With nothing else to send at the job's end, the sender sends no copy of what is in flight
    until a tail timeout says the losses outlast the average (``LossRecovery.copies``): a copy costs a packet time
    on the link for a loss that is unlikely; one of every needed packet in flight was 8 copies here, and with many
    short jobs (the DDP hook's buckets) even one copy per job was 2 % of an iteration (docs/hostlib.md)."""
    j = JobSpec.uniform(20, messages=300, size=SIZE, msr=1.0)
    record: list = []
    fwd = Path(delay=0.001, rate_bps=RATE_BPS, queue_packets=2, record=record, seed=1)
    r = run_job(j, AtpConfig(max_rate_bps=2 * RATE_BPS, initial_rtt_s=0.002, receiver_grants=False), forward=fwd,
                reverse=Path(delay=0.001, seed=2))
    assert_guarantee(r, j)
    assert r.summary.losses_found_by["time"] > 30
    copies = [h for _, h in record if h.type == wire.PacketType.DATA and h.tlr == wire.TLR_ONE]
    assert r.summary.losses_found_by["tail"] == 0 and copies == []


def test_a_granted_job_gets_no_copy_before_a_tail_timeout():
    """The same path with receiver grants (the receiver told the overstated 40 Mbit/s: a budget of 10 of these
    packets, five times what the queue holds): its drops get no copy before a tail timeout either."""
    j = JobSpec.uniform(20, messages=300, size=SIZE, msr=1.0)
    record: list = []
    fwd = Path(delay=0.001, rate_bps=RATE_BPS, queue_packets=2, record=record, seed=1)
    r = run_job(j, AtpConfig(max_rate_bps=2 * RATE_BPS, initial_rtt_s=0.002, receiver_grants=True), forward=fwd,
                reverse=Path(delay=0.001, seed=2))
    assert_guarantee(r, j)
    assert fwd.dropped > 0 and r.summary.losses_found_by["time"] > 0
    copies = [h for _, h in record if h.type == wire.PacketType.DATA and h.tlr == wire.TLR_ONE]
    assert r.summary.losses_found_by["tail"] == 0 and copies == []
