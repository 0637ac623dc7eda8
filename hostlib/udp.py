"""UDP sockets for hostlib's adapters (the blocking API, asyncio, the multi-job exchange): opening one, moving
datagrams between it and a sans-I/O core, and waiting for it.

A full socket buffer or an ICMP error drops a datagram (ATP sees it as loss); nothing here retries. With a native
core (hostlib/core.py) ``SocketIO`` moves datagrams in C, batched (``transmit``/``receive_from``: UDP GSO/GRO,
sendmmsg/recvmmsg); with the reference, through the socket module one datagram at a time.
"""
from __future__ import annotations

import errno
import select
import socket
import sys
import time
from typing import Any, Callable, Iterable

from netapprox.hostlib import core, wire
from netapprox.hostlib.errors import AtpError, BindError

Address = tuple[str, int]
RECV_BATCH = 256
"""Datagrams read per call at most (``recv_all``), so that timers and sends get their turn."""
SHORT_WAIT_S = 0.001
_CMSG_LEN = socket.CMSG_SPACE(4)


def parse_address(text: "str | Address | int", default_port: int = wire.DEFAULT_ATP_PORT, *,
                  any_port: bool = False) -> Address:
    """``host``, ``host:port``, ``[v6]:port``, a port number or a ``(host, port)`` tuple.
    ``any_port`` allows port 0 (let the kernel choose, for local addresses)."""
    if isinstance(text, tuple):
        return (str(text[0]), int(text[1]))
    if isinstance(text, int):
        return ("0.0.0.0", text)
    t = text.strip()
    if t.startswith("["):
        host, _, rest = t[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif t.count(":") == 1:
        host, _, port = t.partition(":")
    else:
        host, port = t, ""
    if not host:
        raise ValueError(f"address {text!r}: missing host")
    try:
        p = int(port) if port else default_port
    except ValueError:
        raise ValueError(f"address {text!r}: port {port!r} is not a number") from None
    if not (0 if any_port else 1) <= p < 65536:
        raise ValueError(f"address {text!r}: port {p} out of range")
    return (host, p)


def open_socket(addr: Address, *, bind: bool) -> tuple[socket.socket, Address]:
    """A non-blocking UDP socket of ``addr``'s family with 4 MiB buffers, and ``addr`` resolved to the numeric
    address datagrams come from. ``bind``: bound to ``addr`` with ECN marks reported, or ``BindError``. No
    ``SO_REUSEADDR``: on UDP it would let a second receiver bind a port in use and take its datagrams."""
    try:
        infos = socket.getaddrinfo(addr[0], addr[1], type=socket.SOCK_DGRAM)
    except socket.gaierror as err:
        raise AtpError(f"cannot resolve {addr[0]!r}: {err}") from None
    family, _, _, _, sockaddr = infos[0]
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        if bind:
            enable_ecn_reception(sock, family)
            try:
                sock.bind(sockaddr)
            except OSError as err:
                raise BindError(f"cannot bind UDP {addr[0]}:{addr[1]}: {err.strerror}") from None
    except BaseException:
        sock.close()
        raise
    return sock, sockaddr[:2]


def enable_ecn_reception(sock: socket.socket, family: int) -> None:
    """Ask the kernel for each datagram's TOS / traffic class, to see ECN CE marks."""
    try:
        if family == socket.AF_INET:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        elif family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVTCLASS, 1)
    except (AttributeError, OSError):
        pass  # no ECN information on this platform: ACKs never carry ECE


def _ce_marked(ancdata: list) -> bool:
    for level, kind, data in ancdata:
        if (level, kind) == (socket.IPPROTO_IP, socket.IP_TOS) and data:
            return data[0] & 0x03 == 0x03
        if (level, kind) == (socket.IPPROTO_IPV6, getattr(socket, "IPV6_TCLASS", -1)) and len(data) >= 4:
            return int.from_bytes(data[:4], "little" if sys.byteorder == "little" else "big") & 0x03 == 0x03
    return False


def send_all(sock: socket.socket, datagrams: Iterable[tuple[bytes, Any]],
             on_refused: Callable[[], None] | None = None) -> int:
    """Send each (data, address); returns how many the kernel took. A full socket buffer or an ICMP error drops
    the datagram (ATP sees it as loss); ``on_refused()`` is called for each ICMP port unreachable reported (a
    connected socket's)."""
    n = 0
    for data, addr in datagrams:
        try:
            sock.sendto(data, addr)
            n += 1
        except BlockingIOError:
            pass
        except ConnectionRefusedError:
            if on_refused is not None:
                on_refused()
        except OSError as err:
            if err.errno not in (errno.ENOBUFS, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EPERM):
                raise
    return n


def recv_all(sock: socket.socket, feed: Callable[[bytes, Any], None],
             on_refused: Callable[[], None] | None = None) -> int:
    """``feed(data, address)`` for each datagram waiting (at most ``RECV_BATCH``); returns how many.
    ``on_refused()`` for each ICMP port unreachable reported (a connected socket's)."""
    n = 0
    while n < RECV_BATCH:
        try:
            data, addr = sock.recvfrom(65535)
        except (BlockingIOError, InterruptedError):
            break
        except ConnectionRefusedError:
            if on_refused is not None:
                on_refused()
            continue
        feed(data, addr)
        n += 1
    return n


def recv_all_ecn(sock: socket.socket, feed: Callable[[bytes, Any, bool], None]) -> int:
    """Like :func:`recv_all`, also passing whether the datagram was CE-marked."""
    n = 0
    while n < RECV_BATCH:
        try:
            data, anc, _flags, addr = sock.recvmsg(65535, _CMSG_LEN)
        except (BlockingIOError, InterruptedError):
            break
        except ConnectionRefusedError:
            continue
        feed(data, addr, _ce_marked(anc))
        n += 1
    return n


class SocketIO:
    """Moves datagrams between a UDP socket and a core: in C, batched, when the core is native (``transmit``,
    ``receive_from``); through the socket module otherwise. ``ecn``: pass each datagram's CE mark (receivers)."""

    def __init__(self, sock: socket.socket, core_obj: Any, *, ecn: bool = False) -> None:
        self.sock = sock
        self.core = core_obj
        self.fd = sock.fileno()
        self.ecn = ecn
        self.native = core.is_native(core_obj)
        self._refused = 0
        if self.native:
            core.enable_gro(sock)

    @property
    def refused(self) -> int:
        """ICMP port unreachables the socket reported so far (only a connected socket gets them)."""
        return getattr(self.core, "socket_refused", 0) if self.native else self._refused

    def _count_refused(self) -> None:
        self._refused += 1

    def send(self, now: float) -> int:
        if self.native:
            return self.core.transmit(self.fd, now)
        return send_all(self.sock, self.core.datagrams_to_send(now), self._count_refused)

    def receive(self, now: float) -> int:
        if self.native:
            return self.core.receive_from(self.fd, now)
        receive = self.core.receive_datagram
        if self.ecn:
            return recv_all_ecn(self.sock, lambda d, a, ce: receive(d, a, now, ce=ce))
        return recv_all(self.sock, lambda d, a: receive(d, a, now), self._count_refused)


def wait(socks: list[socket.socket], until: float | None, clock: Callable[[], float], cap: float
         ) -> list[socket.socket]:
    """Sleep until ``until`` (at most ``cap`` seconds) or until one of ``socks`` is readable; returns the readable
    ones (none after a plain sleep)."""
    timeout = cap if until is None else min(cap, until - clock())
    if timeout <= 0:
        return []
    if timeout <= SHORT_WAIT_S:
        # The next packet is due soon: sleep through arriving ACKs and read them in one batch afterwards.
        # Waking once per ACK would double the loop iterations per packet and cap the rate.
        time.sleep(timeout)
        return []
    return select.select(socks, [], [], timeout)[0]
