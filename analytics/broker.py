"""A broker stage: producers append a stream's rows to a Redis stream (the broker), and a feeder beside the broker
reads them back in arrival order, cuts them into windows and sends each window that closes to its consumer over
ATP (the paper's Kafka -> Flink feeding stage, with Redis Streams, the log broker Debian ships, in Kafka's place:
docs/analytics.md, A broker).

The producers' side speaks Redis over TCP to a broker on the same machine; only the feeder-to-consumer stage, the
one that crosses the network, is ATP. ``redis-server`` comes from ``tools/setup-system.sh``, the ``redis`` client
from the ``analytics`` extra; importing this module without the client raises ImportError.
"""
from __future__ import annotations

import struct
from typing import Iterable, Iterator, Sequence

import redis

from netapprox.analytics import stream
from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.job import Query, Row

_TIME = struct.Struct("!d")
BATCH = 1000
"""Entries read from the broker per request."""


def connect(address: str) -> "redis.Redis":
    """A client of the broker at ``HOST:PORT``; one line when nothing answers there."""
    host, _, port = address.rpartition(":")
    try:
        r = redis.Redis(host=host or "127.0.0.1", port=int(port), socket_timeout=10)
        r.ping()
    except (ValueError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as err:
        raise AnalyticsError(f"no broker (Redis) answers at {address}: {err}") from None
    return r


def produce(broker: "redis.Redis", topic: str, rows: Sequence[Row], times: Sequence[float]) -> int:
    """Append ``rows`` with their arrival times (s) to the broker's stream ``topic``; the entries appended."""
    if len(rows) != len(times):
        raise AnalyticsError(f"{len(rows)} rows but {len(times)} arrival times")
    pipe = broker.pipeline(transaction=False)
    for r, t in zip(rows, times):
        pipe.xadd(topic, {b"t": _TIME.pack(t), b"row": r.encode()})
    pipe.execute()
    return len(rows)


def consume(broker: "redis.Redis", topic: str, *, block_ms: int = 0, until: int | None = None
            ) -> Iterator[tuple[Row, float]]:
    """The rows of ``topic`` in arrival order with their times, from its first entry; ``until``: stop after so
    many; ``block_ms`` > 0: wait that long for new entries before ending."""
    last, seen = b"0-0", 0
    while until is None or seen < until:
        got = broker.xread({topic: last}, count=BATCH, block=block_ms or None)
        if not got:
            return
        for entry_id, fields in got[0][1]:
            last = entry_id
            yield Row.decode(fields[b"row"]), _TIME.unpack(fields[b"t"])[0]
            seen += 1
            if until is not None and seen >= until:
                return


def time_windows(entries: Iterable[tuple[Row, float]], seconds: float, start: float = 0.0
                 ) -> Iterator[stream.Window]:
    """Windows of ``seconds`` from ``start``, each yielded as soon as a row of a later window arrives (it has
    closed) and the last at the end of the entries; empty windows in between are yielded too."""
    k, rows = 0, []
    prev = start
    for row, t in entries:
        if t < prev:
            raise AnalyticsError(f"the broker gave a row of {t:g} s after one of {prev:g} s: out of arrival order")
        prev = t
        while t >= start + (k + 1) * seconds:
            yield stream.Window(k, tuple(rows), start + k * seconds, start + (k + 1) * seconds)
            k, rows = k + 1, []
        rows.append(row)
    if rows:
        yield stream.Window(k, tuple(rows), start + k * seconds, start + (k + 1) * seconds)


def feed(broker: "redis.Redis", topic: str, dest: str, query: Query, *, seconds: float, first: float,
         seed: int = 0, timeout: float = 30.0, wait_s: float = 10.0, until: int | None = None
         ) -> list[stream.WindowAnswer]:
    """The feeder: the broker's rows of ``topic`` cut into time windows of ``seconds``, each sent over ATP to the
    consumer at ``dest`` as it closes, at the MSR planned from the windows before it (its N from their arrival
    rates; the first window's N is ``first``); the sender's view of every window."""
    windows = time_windows(consume(broker, topic, until=until), seconds)
    return stream.run_windows(windows, query, stream.over_udp(dest, timeout=timeout, wait_s=wait_s),
                              sizer=stream.WindowSizer("time", seconds, first=first), seed=seed)
