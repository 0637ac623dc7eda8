"""Rate control (eq. 2/3, R_min) and the pacing token bucket, exact values."""
from __future__ import annotations

import pytest

from netapprox.hostlib.rate import RateController, TokenBucket

PKT_BITS = 1442 * 8


def controller(rate=40e6, gain=0.25, fixed=False):
    return RateController(max_rate_bps=100e6, initial_rate_bps=rate, gain=gain, packet_bits=PKT_BITS, fixed=fixed)


def feed(rc, group, sent, acked, lost=None):
    """``sent`` packets, ``acked`` acknowledged, the rest declared lost (or ``lost`` of them: the others stay
    in flight)."""
    for _ in range(sent):
        rc.on_packet_sent(group_id=group, size=1400, now=0.0)
    for _ in range(acked):
        rc.on_packet_acked(group_id=group, size=1400, now=0.0)
    for _ in range(sent - acked if lost is None else lost):
        rc.on_packet_lost(group_id=group, size=1400, now=0.0)


def test_loss_below_tlr_increases_rate_by_eq2():
    rc = controller()
    feed(rc, 0, sent=100, acked=95)  # rho = 0.05 < TLR 0.1
    counts = rc.end_epoch(tlr={0: 0.1}, rtt_s=0.01)
    assert counts[0].loss == pytest.approx(0.05)
    assert rc.rate_bps == pytest.approx(0.75 * 40e6 + 0.25 * 100e6)


def test_loss_at_or_above_tlr_decreases_rate_by_eq3():
    rc = controller()
    feed(rc, 0, sent=100, acked=80)  # rho = 0.2 >= TLR 0.1
    rc.end_epoch(tlr={0: 0.1}, rtt_s=0.01)
    assert rc.rate_bps == pytest.approx(40e6 * (1 - 0.2 / 2))
    rc2 = controller()
    feed(rc2, 0, sent=10, acked=9)  # rho == TLR: decrease
    rc2.end_epoch(tlr={0: 0.1}, rtt_s=0.01)
    assert rc2.rate_bps == pytest.approx(40e6 * (1 - 0.1 / 2))


def test_worst_group_over_its_tlr_decides():
    rc = controller()
    feed(rc, 1, sent=100, acked=50)   # rho 0.5 < TLR 0.6: fine
    feed(rc, 2, sent=100, acked=70)   # rho 0.3 >= TLR 0.2: decrease by 0.3
    feed(rc, 3, sent=100, acked=60)   # rho 0.4 >= TLR 0.1: decrease by 0.4 (largest)
    rc.end_epoch(tlr={1: 0.6, 2: 0.2, 3: 0.1}, rtt_s=0.01)
    assert rc.rate_bps == pytest.approx(40e6 * (1 - 0.4 / 2))


def test_packets_in_flight_are_not_epoch_loss():
    """An epoch whose packets are still unacknowledged (shorter than a round trip) is not lossy: ρ counts only
    fates that became known, so an idle link is never read as total loss."""
    rc = controller()
    feed(rc, 0, sent=20, acked=0, lost=0)
    counts = rc.end_epoch(tlr={0: 0.1}, rtt_s=0.01)
    assert counts[0].loss == 0.0
    assert rc.rate_bps > 40e6
    feed(rc, 0, sent=10, acked=6, lost=2)  # 2 of 8 known fates; 2 packets still in flight
    assert rc.end_epoch(tlr={0: 0.5}, rtt_s=0.01)[0].loss == pytest.approx(0.25)


def test_no_loss_increases_even_when_tlr_is_zero():
    rc = controller()
    feed(rc, 0, sent=10, acked=10)
    rc.end_epoch(tlr={0: 0.0}, rtt_s=0.01)
    assert rc.rate_bps > 40e6


def test_rate_never_drops_below_one_packet_per_rtt():
    rc = controller(rate=2e6)
    for _ in range(50):
        feed(rc, 0, sent=10, acked=0)  # rho = 1: halve every epoch
        rc.end_epoch(tlr={0: 0.1}, rtt_s=0.02)
    assert rc.rate_bps == pytest.approx(PKT_BITS / 0.02)
    assert rc.min_rate_bps(0.02) == pytest.approx(PKT_BITS / 0.02)


def test_rate_never_exceeds_rmax_and_idle_epochs_keep_it():
    rc = controller(rate=99.9e6, gain=1.0)
    feed(rc, 0, sent=5, acked=5)
    rc.end_epoch(tlr={0: 0.5}, rtt_s=0.01)
    assert rc.rate_bps == 100e6
    rc.end_epoch(tlr={0: 0.5}, rtt_s=0.01)  # nothing sent: no update
    assert rc.rate_bps == 100e6


def test_control_packets_are_not_counted_and_fixed_mode_stays_at_rmax():
    rc = controller(fixed=True)
    feed(rc, None, sent=10, acked=0)
    assert rc.epoch == {}
    feed(rc, 0, sent=10, acked=0)
    rc.end_epoch(tlr={0: 0.0}, rtt_s=0.01)
    assert rc.rate_bps == 100e6


def test_token_bucket_allows_bursts_of_at_most_two_packets():
    b = TokenBucket(burst_bytes=2 * 1442, now=0.0)
    b.refill(100e6, 10.0)  # a long idle period does not build a bigger burst
    sent = 0
    while b.can_send(1442):
        b.consume(1442)
        sent += 1
    assert sent == 2
    assert b.ready_at(1442, 100e6) == pytest.approx(10.0 + 1442 * 8 / 100e6, abs=1e-12)
    b.refill(100e6, b.ready_at(1442, 100e6))
    assert b.can_send(1442) and not b.can_send(2 * 1442)


# --- the adaptive sender's window and loss estimate ------------------------------------------------

from netapprox.hostlib.rate import LossEstimate, WindowController  # noqa: E402


def window(initial=16, queues=(64, 7, 6, 5, 4, 3, 2, 1)):
    return WindowController(max_rate_bps=20e6, pacing_gain=1.0, packet_bits=PKT_BITS, initial_window=initial,
                            max_window=1024, queue_packets=queues, loss_memory=64, min_samples=8)


def test_loss_estimate_counts_only_fates_known_and_forgives_late_acks():
    e = LossEstimate(memory=64, min_samples=8)
    for _ in range(5):
        e.on_acked()
    assert e.value is None  # too few fates known yet: packets in flight never count as lost
    for _ in range(3):
        e.on_lost()
    assert e.value == pytest.approx(3 / 8)
    e.on_acked(late=True)  # one "lost" packet was acknowledged after all
    assert e.value == pytest.approx(2 / 8)
    for _ in range(200):
        e.on_acked()
    assert e.acked + e.lost <= 64 and e.value < 0.02  # old history fades


def test_window_is_cut_only_when_measured_loss_exceeds_the_tlr():
    w = window()
    w.on_path(queue=1, rtt=0.01)  # the switch's queue is known: its size bounds the window, loss only cuts it
    for seq in range(20):
        w.on_packet_sent(group_id=0, size=1368, now=0.0)
    for seq in range(17):
        w.on_packet_acked(group_id=0, size=1368, now=0.0)
        w.on_ack(seq)
    for _ in range(3):
        w.on_packet_lost(group_id=0, size=1368, now=0.0)
    before = w.window
    assert not w.on_loss(groups={0}, tlr={0: 0.2}, next_seq=20)  # 3/20 = 0.15 <= TLR 0.2: spend the slack
    assert w.window == before
    assert w.on_loss(groups={0}, tlr={0: 0.1}, next_seq=20)  # above a TLR of 0.1: cut by eq. 3's factor
    assert w.window == pytest.approx(before * (1 - 0.15 / 2))
    assert not w.on_loss(groups={0}, tlr={0: 0.1}, next_seq=21)  # at most once per round trip


def test_without_a_known_queue_a_loss_lowers_the_learned_ceiling():
    w = window()
    for _ in range(4):
        w.on_packet_lost(group_id=0, size=1368, now=0.0)
    assert w.on_loss(groups={0}, tlr={0: 0.5}, next_seq=4)
    assert w.cap == pytest.approx(16 * 0.8) and w.window <= w.cap


def test_window_stops_at_the_queue_plus_one_bdp_of_the_queue_the_switch_chose():
    w = window(initial=2)
    for _ in range(50):
        w.on_packet_sent(group_id=0, size=1368, now=0.0)
    w.on_path(queue=3, rtt=0.002)  # 20 Mbit/s x 2 ms = 3.5 packets of 1442 bytes -> 4
    for seq in range(50):
        w.on_ack(seq)
    assert w.window == 5 + 4
    w.on_path(queue=0xFF, rtt=0.002)  # no stamp: the ceiling is left to loss
    w.on_ack(51)
    assert w.window > 9
