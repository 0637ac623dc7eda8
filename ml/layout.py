"""Which worker reduces which part of a bucket, and in what order: the layout of gloo's ring allreduce.

Gloo's ring allreduce (gloo/allreduce.cc, the algorithm ``ProcessGroupGloo`` runs for dense CPU tensors)
cuts a buffer of ``n`` elements into ``S`` segments, ``S`` = the number of ``MAX_SEGMENT_BYTES`` pieces
rounded up to a multiple of the world size ``W`` and at least ``2 W``, each ``ceil(n / S)`` elements; worker
``j`` finishes the reduction of chunk ``j`` (segments ``j·S/W .. (j+1)·S/W - 1``). The partial sum of a chunk
travels from worker ``j-1`` to ``j-2`` ... to ``j``, each adding its own values, so element ``i`` of chunk
``j`` is ``((x[j-1] + x[j-2]) + ... + x[j+1]) + x[j]`` in float arithmetic.

The ATP hook reduces the same chunks in the same order (the owner of a chunk adds the contributions it
received in that order, its own last), so without loss its result is bit-for-bit the process group's.
tests/ml checks both this layout and that equality against a real gloo process group.
"""
from __future__ import annotations

MAX_SEGMENT_BYTES = 1 << 20
"""gloo's ``AllreduceOptions::maxSegmentSize`` default (1 MiB)."""


def chunk_bounds(n: int, world: int, element_size: int = 4) -> list[tuple[int, int]]:
    """``[(start, stop)]`` of the chunk each worker reduces, worker order; empty chunks are ``(n, n)``."""
    if world < 1 or n < 0:
        raise ValueError("need world >= 1 and n >= 0")
    if world == 1:
        return [(0, n)]
    total = n * element_size
    max_seg = element_size * max(1, MAX_SEGMENT_BYTES // element_size)
    segments = max(-(-total // max_seg), 2 * world)
    segments = -(-segments // world) * world
    per_rank = segments // world
    seg_elems = -(-(-(-total // segments)) // element_size) if total else 0  # roundUp(ceil(total/S), size)
    chunk = per_rank * seg_elems
    return [(min(n, j * chunk), min(n, (j + 1) * chunk)) for j in range(world)]


def reduction_order(owner: int, world: int) -> list[int]:
    """Ranks in the order their values are added for ``owner``'s chunk: ``owner-1, owner-2, ..., owner``."""
    return [(owner - k) % world for k in range(1, world)] + [owner]
