"""The native cores' socket path over loopback: ``transmit``/``receive_from`` carry exactly what
``datagrams_to_send``/``receive_datagram`` would (GSO runs split back into the same datagrams, GRO
super-datagrams split, ECN marks, addresses), the batching primitives themselves, and the timer slack."""
from __future__ import annotations

import select
import socket
import threading

import pytest

from netapprox.hostlib import core, wire
from netapprox.hostlib.config import AtpConfig, JobSpec, Message, pattern_bytes
from hostlib_sim import admit, retry_sender, announce

pytestmark = pytest.mark.usefixtures("native")


def udp_pair():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    tx.setblocking(False)
    return rx, tx


def drain(sock, gro=False):
    """Every datagram waiting on ``sock``, with the source address and the CE mark."""
    from netapprox.hostlib import _native
    out = []
    while select.select([sock], [], [], 0.2)[0]:
        got = _native.recv_batch(sock.fileno(), 4)
        if not got:
            break
        out += got
    return out


def test_send_batch_and_recv_batch_keep_every_datagram_in_order():
    from netapprox.hostlib import _native
    rx, tx = udp_pair()
    other_rx, _ = udp_pair()
    try:
        _native.enable_gro(rx)
        dest, other = rx.getsockname(), other_rx.getsockname()
        # runs of equal sizes (GSO), a shorter one ending a run, another destination in between, empty payloads
        sizes = [1400] * 50 + [700] + [1400] * 3 + [0, 0] + [64] * 100 + [1400] * 70
        sent = []
        for i, n in enumerate(sizes):
            addr = other if i in (20, 130) else dest
            sent.append((bytes([i % 251]) * n, addr))
        assert _native.send_batch(tx.fileno(), sent) == len(sent)
        got = drain(rx)
        assert [d for d, _, _ in got] == [d for d, a in sent if a == dest]
        assert {a for _, a, _ in got} == {tx.getsockname()} and not any(ce for _, _, ce in got)
        assert [d for d, _, _ in drain(other_rx)] == [d for d, a in sent if a == other]
    finally:
        for s in (rx, tx, other_rx):
            s.close()


def test_recv_batch_reports_ce_marks():
    from netapprox.hostlib import _native
    rx, tx = udp_pair()
    try:
        rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        for tos in (0x00, 0x03, 0x02):
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
            tx.sendto(bytes([tos]), rx.getsockname())
        assert [(d[0], ce) for d, _, ce in drain(rx)] == [(0, False), (3, True), (2, False)]
    finally:
        rx.close()
        tx.close()


def test_send_batch_refuses_bad_input_with_a_clear_error():
    from netapprox.hostlib import _native
    rx, tx = udp_pair()
    try:
        with pytest.raises(ValueError, match="numeric"):
            _native.send_batch(tx.fileno(), [(b"x", ("no-such-host.invalid", 9))])
        with pytest.raises(TypeError, match="pairs"):
            _native.send_batch(tx.fileno(), [b"x"])
    finally:
        rx.close()
        tx.close()


def test_transmit_sends_what_datagrams_to_send_returns():
    """Two identical native senders: one through datagrams_to_send, one through transmit(fd); the receiver
    socket gets the same bytes (GSO runs split at the original boundaries)."""
    rx, tx = udp_pair()
    try:
        _native_gro(rx)
        peer = rx.getsockname()
        job = JobSpec(job_id=5, messages=tuple(Message(pattern_bytes(i, 300 + 977 * (i % 5))) for i in range(60)),
                      msr=0.8)
        cfg = AtpConfig(mode="base", max_rate_bps=10e9, burst_packets=8)  # no window, 8-packet bursts (no ACK)
        a = core.NativeAtpSender(job, config=cfg, peer=peer, now=0.0, isn=1000)
        b = core.NativeAtpSender(job, config=cfg, peer=peer, now=0.0, isn=1000)
        retry_sender(a)
        retry_sender(b)
        want = []
        for t in (0.0, 0.001, 0.002, 0.003):
            want += [d for d, _ in a.datagrams_to_send(t)]
            b.transmit(tx.fileno(), t)
        assert len(want) > 16
        assert [d for d, _, _ in drain(rx)] == want
    finally:
        rx.close()
        tx.close()


def _native_gro(sock):
    from netapprox.hostlib import _native
    assert _native.enable_gro(sock)


def test_receive_from_feeds_what_receive_datagram_would():
    """The same datagrams to a native receiver through the socket and to the reference by hand: the job admitted
    (announce, its ACK carrying a token, the announce echoing it, answered with a NEW_TOKEN), then the same ACKs (sent back with transmit),
    events and counters; a CE-marked packet's ACK has ECE."""
    from netapprox.hostlib import _native
    rx, tx = udp_pair()
    try:
        _native_gro(rx)
        rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        cfg = AtpConfig(ack_every=4)
        native = core.NativeAtpReceiver(config=cfg)
        ref = core.PyAtpReceiver(config=cfg)
        src, dst = tx.getsockname(), rx.getsockname()
        groups = [(0, 0.5, range(50))]
        admit(ref, 3, groups, 50, peer=src, now=1.0)
        # the native receiver admits the job over the socket at once; the echo of its ACK's token validates it
        tx.sendto(announce(3, groups, 50), dst)
        assert select.select([rx], [], [], 1.0)[0] and native.receive_from(rx.fileno(), 1.0) == 1
        assert native.transmit(rx.fileno(), 1.0) == 1
        ack, payload = wire.decode(tx.recv(2048))
        token = wire.decode_ack(payload, ack.flags)[2]
        assert ack.type == wire.PacketType.ACK and token is not None and native.admission["admitted_without_token"] == 1
        tx.sendto(announce(3, groups, 50, token=token), dst)
        assert select.select([rx], [], [], 1.0)[0] and native.receive_from(rx.fileno(), 1.0) == 1
        assert native.transmit(rx.fileno(), 1.0) == 2  # validated: a NEW_TOKEN for the next jobs, then the ACK
        assert [wire.decode(tx.recv(2048))[0].type for _ in range(2)] == [wire.PacketType.NEW_TOKEN,
                                                                         wire.PacketType.ACK]
        assert native.admission["validated"] == 1 and native.jobs[3].peer == src
        datagrams = []
        for seq in range(40):
            h = wire.Header(flags=wire.Flags.APPROX, job_id=3, msg_id=seq // 2, pkt_idx=seq % 2, pkt_cnt=2, seq=seq)
            datagrams.append(wire.encode(h, bytes([seq]) * 1000))
        datagrams.append(b"garbage")
        _native.send_batch(tx.fileno(), [(d, dst) for d in datagrams])
        tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0x03)
        ce = wire.encode(wire.Header(flags=wire.Flags.APPROX, job_id=3, msg_id=49, seq=99), b"c")
        tx.sendto(ce, dst)
        got = 0
        while got < len(datagrams) + 1 and select.select([rx], [], [], 1.0)[0]:
            got += native.receive_from(rx.fileno(), 1.0)
        assert got == len(datagrams) + 1
        for d in datagrams:
            ref.receive_datagram(d, src, 1.0)
        ref.receive_datagram(ce, src, 1.0, ce=True)
        want = ref.datagrams_to_send(1.0)
        assert native.transmit(rx.fileno(), 1.0) == len(want)
        acks = []
        while len(acks) < len(want) and select.select([tx], [], [], 0.5)[0]:
            acks.append(tx.recvfrom(2048))
        assert [d for d, _ in acks] == [d for d, _ in want]
        assert wire.decode(acks[-1][0])[0].flags & wire.Flags.ECE
        events_n = list(iter(native.next_event, None))
        events_r = list(iter(ref.next_event, None))
        assert events_n == events_r and len(events_r) == 21
        assert native.malformed == ref.malformed == {"truncated": 1}
        assert native.memory.used == ref.memory.used and native.buffered == ref.buffered == 0
    finally:
        rx.close()
        tx.close()


def test_timer_slack_is_set_for_the_block_and_restored():
    from netapprox.hostlib import _native
    before = _native.set_timer_slack(50_000)
    try:
        seen = []

        def probe():
            with core.precise_timers():
                seen.append(_native.set_timer_slack(1))
            seen.append(_native.set_timer_slack(50_000))

        t = threading.Thread(target=probe)
        t.start()
        t.join()
        assert seen == [1, 50_000]  # 1 ns inside the block, the thread's previous value after it
    finally:
        _native.set_timer_slack(before)
