"""SmallestSend's streams (experiments/sim/trial.py) without running ns-3."""
from __future__ import annotations


def test_peer_smallest_send_streams_only_the_smallest_messages():
    from netapprox.experiments.baselines import TCP_JOB_HEADER, TCP_MSG_HEADER
    from netapprox.experiments.jobs import JobWorkload
    from netapprox.experiments.sim import trial as T
    wl = JobWorkload("x", 1, (500, 100, 900, 100, 300), (0.0,) * 5)
    assert T.smallest_messages(wl.sizes, 0.5) == [1, 3, 4]  # ceil(2.5) = 3, ties by id, smallest first
    assert list(T.stream_order(wl, 0.5, "homa-sm", 7)) == [1, 3, 4]
    total, target = T.tcp_stream(wl, 0.5, "pfabric-sm", 7)
    assert total == target == TCP_JOB_HEADER + 3 * TCP_MSG_HEADER + 500
    es_total, es_target = T.tcp_stream(wl, 0.5, "dctcp-es", 7)
    assert es_total == TCP_JOB_HEADER + 5 * TCP_MSG_HEADER + 1900 and es_target == TCP_JOB_HEADER + 3 * TCP_MSG_HEADER + 1500
    # the messages a receiver holds after a prefix of the stream: counted in the stream's order
    assert T._messages_in_stream(wl, TCP_JOB_HEADER + 2 * TCP_MSG_HEADER + 200, "dctcp-sm", 7, 0.5) == 2
