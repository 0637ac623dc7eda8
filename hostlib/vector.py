"""Reassemble a float32 vector from range-indexed DATA payloads (bounded-loss paper §3.2)."""
from __future__ import annotations

import array
from typing import Iterable

from netapprox.hostlib import wire


def assemble(length: int, payloads: Iterable[bytes]) -> tuple[array.array, list[tuple[int, int]]]:
    """The vector with every missing index zero-filled, and the missing ranges as ``(start, stop)``
    half-open index pairs, ascending. Payloads are ``first_index:u32, count:u32, count x float32``."""
    values = array.array("f", bytes(4 * length))
    have = bytearray(length)
    for payload in payloads:
        first, floats = wire.decode_float_range(payload)
        stop = min(length, first + len(floats))
        if first >= stop:
            continue
        values[first:stop] = array.array("f", floats[:stop - first])
        have[first:stop] = b"\x01" * (stop - first)
    missing: list[tuple[int, int]] = []
    i = have.find(0)
    while i != -1:
        j = have.find(1, i)
        j = length if j == -1 else j
        missing.append((i, j))
        i = have.find(0, j)
    return values, missing
