"""The one way out for a sender's REPORTs: ``ReportSink(targets, key)``.

The sender's core says when a REPORT is due (``events.ReportReady``); every adapter that runs a sender (the
blocking API, asyncio, the multi-job exchange, the simulated testbed of experiments/sim) hands that event to a
sink, and only the sink encodes it: signed with ``key``, the HMAC key the controller holds (docs/controller.md,
"Authenticated reports"; ``None``: unsigned, for a controller that listens on loopback or was told to accept
unsigned reports), one datagram per target, each controller of a replica set getting every REPORT
(docs/controller.md, "Running two controllers"). How the datagrams travel is the adapter's: a socket of the
sink's own (``send``), its own transport or a simulated link (``datagrams``).
"""
from __future__ import annotations

import os
import socket
from typing import Sequence

from netapprox.hostlib import events, wire
from netapprox.hostlib.config import ConfigError
from netapprox.hostlib.udp import Address, open_socket, parse_address, send_all

def report_addresses(report_to: "str | Address | Sequence[str | Address] | None") -> list[Address]:
    """The controllers a sender reports to: none, one address, or a list of them (every replica of a set of
    controllers takes the same reports: docs/controller.md, "Running two controllers"); port 7601 if omitted."""
    if report_to is None:
        return []
    targets = [report_to] if isinstance(report_to, (str, tuple, int)) else list(report_to)
    return [parse_address(t, wire.DEFAULT_REPORT_PORT) for t in targets]


def read_report_key(path: "str | os.PathLike", flag: str = "report key file") -> bytes:
    """The report key in the file at ``path`` (surrounding whitespace stripped), as the controller reads it;
    an unreadable or empty file is a ``ConfigError`` naming ``flag`` and the path."""
    try:
        with open(path, "rb") as f:  # type: ignore[arg-type]
            key = f.read().strip()
    except OSError as err:
        raise ConfigError(f"{flag} {path}: {err.strerror}") from None
    if not key:
        raise ConfigError(f"{flag} {path} is empty")
    return key


class ReportSink:
    """Where one sender's REPORTs go: ``targets`` (none, one address or a replica set's list; port 7601 if
    omitted), signed with ``key`` (``None``: unsigned). With no targets it takes events and sends nothing."""

    def __init__(self, targets: "str | Address | Sequence[str | Address] | None", key: bytes | None = None) -> None:
        if key is not None and not isinstance(key, bytes):
            raise ConfigError(f"report key: expected bytes, got {type(key).__name__}")
        self.targets: list[Address] = report_addresses(targets)
        self.key = key
        self.sent = 0
        """REPORT datagrams handed on (by ``send``, or taken from ``datagrams``)."""
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        """Whether there is anyone to report to."""
        return bool(self.targets)

    def encode(self, report: wire.Report) -> bytes:
        """``report`` as the datagram's payload, signed with the sink's key (the one place hostlib's adapters,
        the simulation and the controller benchmark's load encode a REPORT)."""
        return report.encode(self.key)

    def datagrams(self, event: events.Event) -> list[tuple[bytes, Address]]:
        """The datagrams of ``event`` when it is a ``ReportReady`` (the report, encoded and signed once, to each
        target); none for any other event or without targets."""
        if not self.targets or not isinstance(event, events.ReportReady):
            return []
        data = self.encode(event.report)
        self.sent += len(self.targets)
        return [(data, addr) for addr in self.targets]

    def open(self) -> "ReportSink":
        """A UDP socket of the sink's own for ``send`` (of the first target's address family, all targets must
        share it); the first target resolved to its numeric address. Idempotent; nothing without targets."""
        if self._sock is None and self.targets:
            self._sock, first = open_socket(self.targets[0], bind=False)
            self.targets = [first, *self.targets[1:]]
        return self

    def send(self, event: events.Event) -> None:
        """Send ``event``'s datagrams, if it is a REPORT, on the sink's socket (opened on first use); any other
        event: nothing. A full socket buffer drops a REPORT: the next epoch sends a newer one."""
        if self.targets and isinstance(event, events.ReportReady):
            self.open()
            send_all(self._sock, self.datagrams(event))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> "ReportSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
