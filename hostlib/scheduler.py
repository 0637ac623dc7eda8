"""Which message the sender serves next: minimal-remaining-data-first (MRDF) or message-id order.

The scheduler only orders message ids; the sender decides what is sendable (new packets, or lost packets
of messages whose group's MSR needs them) and tells the scheduler whenever a message's key changes.
Keys are compared as tuples, smallest first:

=========  ==========  ===================================================================
mrdf       ``base``    key
=========  ==========  ===================================================================
on         no          (remaining bytes, retries, msg_id): new and repair traffic compete
on         yes         (is repair, retries, remaining bytes, msg_id): new data first
off        no          (not repair, retries, msg_id): repairs first, then new data in id order
off        yes         (is repair, retries, msg_id): everything new in id order, then repairs
=========  ==========  ===================================================================

"remaining" is the message's size minus the bytes the receiver has acknowledged. "retries" counts the
message's retransmissions that were lost again: a repair that fails goes behind the messages of its size not
yet retried, so repairs of equal messages rotate instead of hammering one into a queue that drops it (new
messages and first repairs have 0). With MRDF a smaller message still goes first, lost again or not: resending
a small message the group lost costs fewer bytes than the larger new ones its loss budget would otherwise need
(with loss, packing and a retries-first order, a job at MSR 0.9 ended up sending its largest messages).
"""
from __future__ import annotations

import heapq


def scheduling_key(*, mrdf: bool, repairs_last: bool, remaining: int, msg_id: int, repair: bool,
                   retries: int = 0) -> tuple:
    if mrdf:
        return (int(repair), retries, remaining, msg_id) if repairs_last else (remaining, retries, msg_id)
    return (int(repair), retries, msg_id) if repairs_last else (int(not repair), retries, msg_id)


class Scheduler:
    """A lazy priority queue of message ids. Stale entries are skipped when they reach the top."""

    def __init__(self, *, mrdf: bool, repairs_last: bool) -> None:
        self.mrdf = mrdf
        self.repairs_last = repairs_last
        self._heap: list[tuple[tuple, int]] = []
        self._key: dict[int, tuple] = {}

    def __len__(self) -> int:
        return len(self._key)

    def update(self, msg_id: int, *, remaining: int, repair: bool, retries: int = 0) -> None:
        """The message has something to send; (re)file it under its current key."""
        key = scheduling_key(mrdf=self.mrdf, repairs_last=self.repairs_last, remaining=remaining,
                             msg_id=msg_id, repair=repair, retries=retries)
        if self._key.get(msg_id) != key:
            self._key[msg_id] = key
            heapq.heappush(self._heap, (key, msg_id))

    def remove(self, msg_id: int) -> None:
        """The message has nothing to send (for now)."""
        self._key.pop(msg_id, None)

    def peek(self) -> int | None:
        """The message to serve next, or None."""
        heap = self._heap
        while heap:
            key, msg_id = heap[0]
            if self._key.get(msg_id) == key:
                return msg_id
            heapq.heappop(heap)
        return None
