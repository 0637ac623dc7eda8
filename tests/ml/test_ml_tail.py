"""The tail-adaptive bound (ml/tail.py), sans-I/O: which peers are slow, with what MSRs, from job samples."""
from __future__ import annotations

import pytest

from netapprox.hostlib.config import ConfigError
from netapprox.ml.tail import TailBound, TailConfig


def feed(tb: TailBound, per_packet: dict[int, float], rounds: int, packets: int = 50) -> None:
    """``rounds`` jobs to every peer, each of ``packets`` packets at the given seconds per packet."""
    for _ in range(rounds):
        for peer, t in per_packet.items():
            tb.on_transfer(peer, seconds=t * packets, packets=packets)


def test_no_decision_before_every_peer_has_enough_jobs():
    tb = TailBound(TailConfig(0.5, min_jobs=4), [1, 2])
    feed(tb, {1: 1e-3, 2: 5e-3}, 3)
    assert tb.slow() == frozenset()
    assert tb.msr_to(2, 0.7) == 0.7 and tb.gather_msr(0.7) == 0.7
    feed(tb, {1: 1e-3}, 5)              # one peer's samples do not make the other's
    assert tb.slow() == frozenset()
    feed(tb, {2: 5e-3}, 1)
    assert tb.slow() == {2}


def test_a_persistently_slower_path_gets_the_floor_and_only_it():
    tb = TailBound(TailConfig(0.5), [0, 2])
    feed(tb, {0: 1e-3, 2: 2.2e-3}, 12)  # a link at less than half the rate
    assert tb.slow() == {2} and tb.ratio() == pytest.approx(2.2)
    assert tb.msr_to(2, 0.7) == 0.5
    assert tb.msr_to(0, 0.7) == 0.7     # the fast path keeps the configured MSR
    assert tb.gather_msr(0.7) == 0.5    # the all-gather is one subset for every peer
    assert tb.msr_to(2, 0.4) == 0.4     # the floor never raises an MSR


def test_equal_paths_and_small_differences_stay_neutral():
    tb = TailBound(TailConfig(0.5), [1, 2])
    feed(tb, {1: 1e-3, 2: 1.9e-3}, 20)  # below enter = 2x
    assert tb.slow() == frozenset() and tb.gather_msr(0.7) == 0.7
    same = TailBound(TailConfig(0.5), [0, 1])
    feed(same, {0: 3e-3, 1: 3e-3}, 20)  # both slow alike (this worker's own uplink): nothing to single out
    assert same.slow() == frozenset()
    alone = TailBound(TailConfig(0.5), [1])
    feed(alone, {1: 9e-3}, 20)          # one peer: nothing to compare with
    assert alone.slow() == frozenset()


def test_hysteresis_and_recovery():
    tb = TailBound(TailConfig(0.5, enter=1.5, leave=1.25, decay=0.5, min_jobs=4), [1, 2])
    feed(tb, {1: 1e-3, 2: 2e-3}, 6)
    assert tb.slow() == {2}
    feed(tb, {1: 1e-3, 2: 1.35e-3}, 10)  # between leave and enter: stays slow
    assert tb.slow() == {2}
    feed(tb, {1: 1e-3, 2: 1e-3}, 10)     # the link recovered: back to the configured MSRs
    assert tb.slow() == frozenset() and tb.msr_to(2, 0.7) == 0.7
    one = TailBound(TailConfig(0.5, decay=0.5, min_jobs=4), [1, 2])
    feed(one, {1: 1e-3, 2: 1e-3}, 10)
    one.on_transfer(2, seconds=0.5, packets=50)  # one slow job is within the decay's memory...
    assert one.slow() == {2}
    feed(one, {1: 1e-3, 2: 1e-3}, 6)             # ...and forgotten
    assert one.slow() == frozenset()


def test_samples_weigh_by_packets_and_bad_samples_are_ignored():
    tb = TailBound(TailConfig(0.5, min_jobs=1, decay=0.0), [1, 2])
    tb.on_transfer(1, seconds=0.1, packets=100)
    tb.on_transfer(2, seconds=0.1, packets=40)   # the same time for fewer packets: 2.5x per packet
    assert tb.per_packet_s(2) == pytest.approx(2.5e-3) and tb.slow() == {2}
    for bad in ({"seconds": 1.0, "packets": 0}, {"seconds": float("nan"), "packets": 10},
                {"seconds": -1.0, "packets": 10}):
        tb.on_transfer(1, **bad)
    tb.on_transfer(7, seconds=1.0, packets=10)    # not a peer
    assert tb.per_packet_s(1) == pytest.approx(1e-3) and tb.as_dict()["jobs"] == {1: 1, 2: 1}


@pytest.mark.parametrize("kwargs", [{"msr_floor": 0.0}, {"msr_floor": 1.5}, {"msr_floor": 0.5, "enter": 1.2, "leave": 1.3},
                                    {"msr_floor": 0.5, "leave": 1.0}, {"msr_floor": 0.5, "decay": 1.0},
                                    {"msr_floor": 0.5, "min_jobs": 0}])
def test_config_rejects_nonsense(kwargs):
    with pytest.raises(ConfigError):
        TailConfig(**kwargs)
