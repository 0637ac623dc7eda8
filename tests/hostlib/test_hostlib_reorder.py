"""Loss detection on a path that reorders (``AtpConfig.adaptive_reorder``, recovery.py "Reordering"), in virtual time.

A fabric that sprays packets over paths of different queues delivers them out of order; the packet threshold (3)
then takes the overtaken packets for lost and sends them again. Once the path is seen reordering (a packet in
flight acknowledged after one sent later, or a packet acknowledged after it was declared lost), losses are found by
time only, with a reorder window. These tests hold: the exact rule on hand-made ACKs (the reference; the native
core is held to it by tests/hostlib/test_hostlib_differential.py, whose "spraying" paths go through it); a
reordering path without loss costs a bounded number of retransmissions, not hundreds; and a path that does not
reorder sees exactly what the fixed threshold did, whatever its losses (both cores)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostlib_sim import Path, run_job
from netapprox.hostlib.config import AtpConfig, JobSpec
from netapprox.hostlib.recovery import REORDER_PERSIST, LossRecovery, SentPacket
from test_hostlib_transfer import assert_guarantee

RTT = 0.01


def _recovery(adaptive: bool = True) -> LossRecovery:
    return LossRecovery(initial_rtt_s=RTT, reorder_threshold=3, min_loss_timeout_s=0.005, adaptive_reorder=adaptive)


def _send(r: LossRecovery, seqs, at: float) -> None:
    for s in seqs:
        r.on_packet_sent(SentPacket(s, s, 0, 0, 1000, at))


def _seqs(packets) -> list[int]:
    return [p.seq for p in packets]


def test_a_packet_acknowledged_after_it_was_declared_lost_switches_to_time_and_opens_the_window():
    r = _recovery()
    _send(r, range(10), 0.0)
    acked, lost = r.on_ack_received(seq=5, blocks=[(5, 5)], now=RTT)
    assert _seqs(acked) == [5] and _seqs(lost) == [0, 1, 2]  # the packet threshold: 5 - 2 >= 3
    assert not r.reordering and r.reorder_window == 0.0 and r.time_threshold == pytest.approx(9 / 8 * RTT)
    acked, lost = r.on_ack_received(seq=1, blocks=[(1, 1), (5, 5)], now=RTT + 0.001)  # 1 was only late
    assert _seqs(acked) == [1] and lost == [] and r.spurious_losses == 1 and r.late_acks == 1
    assert r.reordering and r.reorder_window == pytest.approx(RTT / 4)  # RACK's min RTT / 4
    # 9 is acknowledged: 3, 4, 6, 7, 8 are 3 or more below it, but losses are now found by time only
    acked, lost = r.on_ack_received(seq=9, blocks=[(1, 1), (5, 5), (9, 9)], now=RTT + 0.0015)
    assert _seqs(acked) == [9] and lost == []
    deadline = 9 / 8 * max(r.srtt, r.latest_rtt) + RTT / 4  # sent at 0
    assert r.loss_deadline() == pytest.approx(deadline)
    assert r.detect_lost(deadline - 1e-6) == []
    assert _seqs(r.detect_lost(deadline)) == [3, 4, 6, 7, 8]
    assert r.lost_by == {"reorder": 3, "time": 5, "tail": 0, "trim": 0}


def test_the_fixed_threshold_declares_what_the_adaptive_one_waits_for():
    r = _recovery(adaptive=False)
    _send(r, range(10), 0.0)
    r.on_ack_received(seq=5, blocks=[(5, 5)], now=RTT)
    r.on_ack_received(seq=1, blocks=[(1, 1), (5, 5)], now=RTT + 0.001)
    assert r.spurious_losses == 1 and not r.reordering and r.reorder_window == 0.0
    _, lost = r.on_ack_received(seq=9, blocks=[(1, 1), (5, 5), (9, 9)], now=RTT + 0.0015)
    assert _seqs(lost) == [3, 4, 6]


def test_a_packet_in_flight_overtaken_is_reordering_too():
    """1 acknowledged after 2 (not declared lost: 2 - 1 < 3): the path reorders before any spurious loss."""
    r = _recovery()
    _send(r, range(8), 0.0)
    _, lost = r.on_ack_received(seq=2, blocks=[(0, 0), (2, 2)], now=RTT)
    assert lost == [] and not r.reordering
    r.on_ack_received(seq=1, blocks=[(0, 2)], now=RTT + 0.0005)  # 1 arrived after 2
    assert r.reordering and r.spurious_losses == 0
    _, lost = r.on_ack_received(seq=7, blocks=[(0, 2), (7, 7)], now=RTT + 0.001)
    assert lost == []  # 3 to 6 are not declared by the packet threshold


def test_a_spurious_loss_widens_the_window_to_how_late_its_ack_came_at_most_one_srtt():
    r = _recovery()
    _send(r, range(10), 0.0)
    r.on_ack_received(seq=5, blocks=[(5, 5)], now=RTT)
    r.on_ack_received(seq=0, blocks=[(0, 0), (5, 5)], now=1.5 * RTT)  # 0 came 1.5 RTT after it was sent
    assert r.reorder_window == pytest.approx(1.5 * RTT - 9 / 8 * RTT)
    r.on_ack_received(seq=1, blocks=[(0, 1), (5, 5)], now=5 * RTT)  # far later: at most srtt
    assert r.reorder_window == pytest.approx(r.srtt)


def test_the_threshold_comes_back_after_losses_with_none_spurious():
    """REORDER_PERSIST losses found by time, none of them acknowledged later: the path stopped reordering, and the
    packet threshold finds losses again (RACK resets its window after 16 recoveries without a DSACK)."""
    r = _recovery()
    _send(r, range(10), 0.0)
    r.on_ack_received(seq=5, blocks=[(5, 5)], now=RTT)
    r.on_ack_received(seq=1, blocks=[(1, 1), (5, 5)], now=RTT + 0.001)
    assert r.reordering
    seq, now = 10, 0.02
    while r.reordering:  # one packet dies, the next arrives, each round: found by time
        _send(r, [seq, seq + 1], now)
        r.on_ack_received(seq=seq + 1, blocks=[(seq + 1, seq + 1)], now=now + RTT)
        assert _seqs(r.detect_lost(now + 0.02)) == [seq]
        seq, now = seq + 2, now + 0.03
    assert r.lost_by["time"] == REORDER_PERSIST and r.reorder_window == 0.0  # 3, 4, 6, 7, 8 and one per round
    _send(r, range(seq, seq + 5), now)
    _, lost = r.on_ack_received(seq=seq + 4, blocks=[(seq + 4, seq + 4)], now=now + RTT)
    assert _seqs(lost) == [seq, seq + 1]


# --- whole jobs on both cores -------------------------------------------------------------------------------------

pytestmark_cores = pytest.mark.usefixtures("cores")

JOB = JobSpec.uniform(1, messages=400, size=1000, msr=1.0)


def _jittered(jitter: float, seed: int, **knobs):
    """``JOB`` at 50 Mbit/s over a forward path with ``jitter`` s of jitter (nothing lost), its guarantee checked."""
    run = run_job(JOB, AtpConfig(max_rate_bps=50e6, initial_rtt_s=RTT, **knobs),
                  forward=Path(delay=RTT / 2, jitter=jitter, seed=seed), reverse=Path(delay=RTT / 2, seed=seed + 1))
    assert_guarantee(run, JOB)
    return run


@pytestmark_cores
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reordering_without_loss_costs_a_bounded_number_of_retransmissions(seed):
    """Up to 4 ms of jitter on a 10 ms RTT, nothing lost: packets overtake each other by dozens. The fixed threshold
    sends ~250 of 400 packets twice; adapting, a few before the path is seen reordering."""
    runs = {}
    for adaptive in (True, False):
        runs[adaptive] = _jittered(0.004, seed, adaptive_reorder=adaptive).summary
    assert runs[False].retransmissions > 200  # the path does reorder
    assert runs[True].retransmissions <= 32
    assert runs[True].jct_s < runs[False].jct_s


@pytestmark_cores
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(loss=st.floats(0.0, 0.6), burst=st.booleans(), queue=st.sampled_from([None, 8, 64]), msr=st.sampled_from([0.5, 1.0]),
       seed=st.integers(1, 10_000))
def test_a_path_that_does_not_reorder_finds_losses_as_the_fixed_threshold_did(loss, burst, queue, msr, seed):
    """No reordering, any loss (random, or in bursts of 10; with or without a queue that drops): the adaptive rule
    never leaves the packet threshold, and the job is the same to the packet and the microsecond."""
    job = JobSpec.uniform(2, messages=200, size=1000, msr=msr)
    drop = (lambda h, i: (i // 10) % 7 < round(7 * loss)) if burst else None
    summaries = []
    for adaptive in (True, False):
        cfg = AtpConfig(max_rate_bps=20e6, initial_rtt_s=RTT, adaptive_reorder=adaptive)
        fwd = Path(delay=RTT / 2, loss=0.0 if burst else loss, drop=drop, rate_bps=20e6 if queue else None,
                   queue_packets=queue or 64, seed=seed)
        run = run_job(job, cfg, forward=fwd, reverse=Path(delay=RTT / 2, seed=seed + 1))
        assert_guarantee(run, job)
        assert not run.sender.recovery.reordering
        summaries.append(run.summary)
    a, f = summaries
    assert (a.jct_s, a.packets_sent, a.retransmissions, a.losses_found_by) == \
        (f.jct_s, f.packets_sent, f.retransmissions, f.losses_found_by)
    assert a.spurious_losses == f.spurious_losses == 0


# --- a path known to reorder (path_reorders) ------------------------------------------------------------------------

def test_a_path_known_to_reorder_finds_the_first_windows_losses_by_time():
    """``path_reorders``: the first ACKs, out of order, declare nothing by the packet threshold; the window opens at
    the first RTT sample; a packet still missing 9/8 RTT plus that window after it was sent is lost by time."""
    r = LossRecovery(initial_rtt_s=RTT, reorder_threshold=3, min_loss_timeout_s=0.005, path_reorders=True)
    assert r.reordering and r.reorder_window == 0.0  # no RTT sample yet
    _send(r, range(10), 0.0)
    acked, lost = r.on_ack_received(seq=5, blocks=[(5, 5)], now=RTT)
    assert _seqs(acked) == [5] and lost == [] and r.reorder_window == pytest.approx(RTT / 4)
    acked, lost = r.on_ack_received(seq=9, blocks=[(5, 5), (9, 9)], now=RTT + 0.001)
    assert _seqs(acked) == [9] and lost == [] and r.spurious_losses == 0
    deadline = 9 / 8 * max(r.srtt, r.latest_rtt) + RTT / 4
    assert r.detect_lost(deadline - 1e-6) == []
    assert _seqs(r.detect_lost(deadline)) == [0, 1, 2, 3, 4, 6, 7, 8]
    assert r.lost_by["reorder"] == 0 and r.lost_by["time"] == 8


def test_the_hint_does_nothing_without_the_adaptive_rule():
    r = LossRecovery(initial_rtt_s=RTT, reorder_threshold=3, min_loss_timeout_s=0.005, adaptive_reorder=False,
                     path_reorders=True)
    _send(r, range(10), 0.0)
    _, lost = r.on_ack_received(seq=5, blocks=[(5, 5)], now=RTT)
    assert _seqs(lost) == [0, 1, 2] and not r.reordering


@pytestmark_cores
def test_a_path_known_to_reorder_sends_its_first_window_once():
    """2 ms of jitter on a 10 ms RTT (packets overtake each other by less than the reorder window, min RTT / 4):
    without the hint the first window's overtaken packets are taken for lost before the first reordered ACK comes
    back (8 spurious losses over three seeds); with it none is, and no job takes longer."""
    spurious = {True: 0, False: 0}
    for seed in (1, 2, 3):
        runs = {}
        for hint in (True, False):
            run = _jittered(0.002, seed, path_reorders=hint)
            runs[hint] = run.summary
            spurious[hint] += run.summary.spurious_losses
        assert runs[True].losses_found_by["reorder"] == 0
        assert runs[True].retransmissions <= runs[False].retransmissions
        assert runs[True].jct_s <= runs[False].jct_s
    assert spurious[False] > 0 and spurious[True] == 0


@pytestmark_cores
@pytest.mark.parametrize("seed", [1, 2])
def test_a_wrong_hint_costs_only_until_the_threshold_comes_back(seed):
    """A path said to reorder that only loses packets (20 %): losses are found by time until REORDER_PERSIST of them
    came with none spurious, then by the packet threshold again; every guarantee holds."""
    job = JobSpec.uniform(2, messages=200, size=1000, msr=1.0)
    cfg = AtpConfig(max_rate_bps=20e6, initial_rtt_s=RTT, path_reorders=True)
    run = run_job(job, cfg, forward=Path(delay=RTT / 2, loss=0.2, seed=seed), reverse=Path(delay=RTT / 2, seed=seed + 1))
    assert_guarantee(run, job)
    assert not run.sender.recovery.reordering and run.summary.spurious_losses == 0
    assert run.summary.losses_found_by["reorder"] > 0  # the packet threshold came back
