"""How a receiver learns a job: the job announce and the FIN, two reserved DATA messages.

Both are ordinary non-approximate DATA packets (no APPROX flag, so switches put them in queue 0) with a
reserved ``msg_id``; the receiver acknowledges them like any other packet.

* ``ANNOUNCE_MSG_ID`` (0xFFFFFFFF): the job manifest, split over ``pkt_cnt`` packets if needed. Every part's
  payload is ``token:16 | auth:16 | chunk``: the admission token the receiver handed out in a RETRY (all
  zero until the sender has one), an HMAC tag under the shared admission key (all zero without one),
  and the part's chunk of the manifest. The chunks concatenated::

      magic "ATPJ" | total:u32 | vector_len:u32 (0xFFFFFFFF = not a vector) | need_bytes:u32 | n_groups:u16 |
      n_groups x ( group_id:u16 | msr:u16 Q1.15 | count:u32 | n_ranges:u32 | n_ranges x (first:u32, last:u32) )

  ``need_bytes``: the payload bytes the sender needs delivered at least to meet every MSR (the smallest messages
  of each group; capped at 2^32 - 1), a hint for a receiver that schedules its jobs (receiver grants).

  The ranges (inclusive, ascending) list the group's message ids. The decoded manifest keeps them as
  ranges: its size follows the announce's bytes, never the N it declares.
* ``FIN_MSG_ID`` (0xFFFFFFFE): the sender has finished; the receiver answers with DONE (lost message ids)
  and keeps answering repeated FINs for ``AtpConfig.finished_linger_s``.
* ``MSR_MSG_ID`` (0xFFFFFFFC): a live MSR change of the header's group (``AtpSender.set_msr``), one packet,
  payload ``change:u32 | msr:u16 Q1.15``: ``change`` numbers the sender's changes (from 1, +1 per change of any
  group), so a receiver applies a group's change only if it is newer than the last it applied; ``msr`` < 1.
"""
from __future__ import annotations

import array
import bisect
import dataclasses
import hashlib
import heapq
import hmac
import itertools
import operator
import struct
import sys
from typing import Iterable, Iterator

from netapprox.hostlib import wire

ANNOUNCE_MSG_ID = 0xFFFFFFFF
FIN_MSG_ID = 0xFFFFFFFE
MSR_MSG_ID = 0xFFFFFFFC
CONTROL_MSG_IDS = (ANNOUNCE_MSG_ID, FIN_MSG_ID, MSR_MSG_ID)
MSR_CHANGE_LEN = 6
MSR_CHANGE = struct.Struct("!IH")
"""An MSR change's payload: change:u32 | msr:u16 (Q1.15)."""
NO_VECTOR = 0xFFFFFFFF
_MAGIC = b"ATPJ"
_HEAD = struct.Struct("!4sIIIH")
MANIFEST_HEAD_LEN = _HEAD.size
"""Bytes of a manifest before its groups (the group count is its last field)."""
_GROUP = struct.Struct("!HHII")
_RANGE = struct.Struct("!II")


AUTH_LEN = 16
NO_AUTH = bytes(AUTH_LEN)
ANNOUNCE_PREFIX_LEN = wire.TOKEN_LEN + AUTH_LEN
_AUTH_HEAD = struct.Struct("!IHH")


@dataclasses.dataclass(frozen=True)
class GroupShape:
    group_id: int
    msr: float
    firsts: array.array
    """First message id of each of the group's ranges (``array('I')``), ascending."""
    lasts: array.array
    """Last message id (inclusive) of each range; ranges are disjoint."""

    count: int = dataclasses.field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "count", sum(self.lasts) - sum(self.firsts) + len(self.firsts))

    @classmethod
    def from_ids(cls, group_id: int, msr: float, msg_ids: Iterable[int]) -> "GroupShape":
        runs = ranges_of(msg_ids)
        return cls(group_id, msr, array.array("I", (a for a, _ in runs)), array.array("I", (b for _, b in runs)))

    @property
    def ranges(self) -> Iterator[tuple[int, int]]:
        return zip(self.firsts, self.lasts)

    @property
    def msg_ids(self) -> Iterator[int]:
        for a, b in self.ranges:
            yield from range(a, b + 1)


class GroupIndex:
    """msg_id -> position of its group in ``Manifest.groups``: every group's ranges merged in id order,
    searched by bisection. Three flat arrays, 10 bytes per range."""

    __slots__ = ("firsts", "lasts", "group")

    def __init__(self, groups: tuple[GroupShape, ...]) -> None:
        if len(groups) == 1:  # the common case: one group's ranges, already in order
            g = groups[0]
            self.firsts, self.lasts = array.array("I", g.firsts), array.array("I", g.lasts)
            self.group = array.array("H", bytes(2 * len(g.firsts)))
            return
        self.firsts = array.array("I")
        self.lasts = array.array("I")
        self.group = array.array("H")
        blocks = sorted((g.firsts[0], g.lasts[-1], k) for k, g in enumerate(groups) if len(g.firsts))
        if all(blocks[i][1] < blocks[i + 1][0] for i in range(len(blocks) - 1)):
            for _, _, k in blocks:  # each group one block of ids (per-layer groups): concatenate, at C speed
                self.firsts.extend(groups[k].firsts)
                self.lasts.extend(groups[k].lasts)
                self.group.extend(itertools.repeat(k, len(groups[k].firsts)))
            return
        try:  # here, not at the top: the extension imports this module when it loads
            from netapprox.hostlib._native import merge_ranges
        except ImportError:  # not built: the same merge in Python (~4x slower)
            for a, b, k in heapq.merge(*(zip(g.firsts, g.lasts, itertools.repeat(k))
                                         for k, g in enumerate(groups))):
                self.firsts.append(a)
                self.lasts.append(b)
                self.group.append(k)
            return
        firsts, lasts, group = merge_ranges([(g.firsts, g.lasts) for g in groups])
        self.firsts.frombytes(firsts)
        self.lasts.frombytes(lasts)
        self.group.frombytes(group)

    def find(self, msg_id: int) -> int:
        """Position of the group listing ``msg_id``, -1 if none does."""
        i = bisect.bisect_right(self.firsts, msg_id) - 1
        return self.group[i] if i >= 0 and msg_id <= self.lasts[i] else -1

    def overlapping(self) -> bool:
        return not all(map(operator.lt, self.lasts[:-1], self.firsts[1:]))


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What the receiver knows about a job once the announce has arrived."""

    total: int
    vector_len: int | None
    groups: tuple[GroupShape, ...]
    need_bytes: int = 0
    """Payload bytes the sender must have delivered at least to meet every MSR (a scheduling hint)."""

    def group_index(self) -> GroupIndex:
        index = self.__dict__.get("_index")
        if index is None:
            index = GroupIndex(self.groups)
            object.__setattr__(self, "_index", index)
        return index

    def encode(self) -> bytes:
        out = [_HEAD.pack(_MAGIC, self.total, NO_VECTOR if self.vector_len is None else self.vector_len,
                          min(self.need_bytes, 0xFFFFFFFF), len(self.groups))]
        for g in self.groups:
            out.append(_GROUP.pack(g.group_id, wire.tlr_to_q15(g.msr), g.count, len(g.firsts)))
            out.extend(_RANGE.pack(a, b) for a, b in g.ranges)
        return b"".join(out)

    @classmethod
    def decode(cls, data: bytes, *, max_messages: int) -> "Manifest":
        """Parse and check a manifest; raises MalformedPacket with reason ``bad_announce``. Time and memory
        follow the length of ``data`` (ranges stay ranges, 2-3 bytes of memory per announce byte).

        Cheap checks first: the header, then every group's fixed part (ids, MSR, counts, where its ranges
        end, that the counts add up to ``total`` and nothing trails) in O(groups) before any range is read;
        the ranges are then checked at C speed (``map`` over arrays, one sort), never one Python step per
        range, so a manifest that fails costs at most what one that passes costs."""
        def bad(detail: str) -> wire.MalformedPacket:
            return wire.MalformedPacket("bad_announce", detail)

        if len(data) < _HEAD.size:
            raise bad(f"{len(data)} bytes")
        magic, total, vlen, need_bytes, n_groups = _HEAD.unpack_from(data)
        if magic != _MAGIC:
            raise bad("wrong magic")
        if total > max_messages:
            raise bad(f"job of {total} messages exceeds this receiver's limit of {max_messages} (max_messages)")
        if _HEAD.size + n_groups * _GROUP.size > len(data):
            raise bad("truncated group list")
        # pass 1: the groups' fixed parts only
        entries = []
        group_ids: set[int] = set()
        off = _HEAD.size
        counted = 0
        for _ in range(n_groups):
            if off + _GROUP.size > len(data):
                raise bad("truncated group list")
            gid, msr_q, count, n_ranges = _GROUP.unpack_from(data, off)
            off += _GROUP.size
            if msr_q > wire.TLR_ONE or n_ranges > count or off + n_ranges * _RANGE.size > len(data):
                raise bad(f"group {gid}: inconsistent entry")
            if gid in group_ids:
                raise bad(f"group {gid}: listed twice")
            group_ids.add(gid)
            entries.append((gid, msr_q, count, off, n_ranges))
            off += n_ranges * _RANGE.size
            counted += count
        if off != len(data):
            raise bad("trailing bytes after the group list")
        if counted != total:  # with disjoint ranges below total (checked next), covering exactly total ids
            raise bad("groups do not cover exactly the job's messages")
        # pass 2: the ranges, at C speed
        groups: list[GroupShape] = []
        for gid, msr_q, count, start, n_ranges in entries:
            flat = array.array("I", data[start:start + n_ranges * _RANGE.size])
            if sys.byteorder == "little":
                flat.byteswap()
            firsts, lasts = flat[0::2], flat[1::2]
            if n_ranges and (not all(map(operator.le, firsts, lasts)) or lasts[-1] >= total
                             or not all(map(operator.lt, lasts[:-1], firsts[1:]))):
                raise bad(f"group {gid}: id ranges not ascending, disjoint and below the job's {total} messages")
            shape = GroupShape(gid, wire.q15_to_tlr(msr_q), firsts, lasts)
            if shape.count != count:
                raise bad(f"group {gid}: ranges cover {shape.count} ids, count says {count}")
            groups.append(shape)
        manifest = cls(total=total, vector_len=None if vlen == NO_VECTOR else vlen, groups=tuple(groups),
                       need_bytes=need_bytes)
        if manifest.group_index().overlapping():
            raise bad("groups overlap")
        return manifest


def ranges_of(ids: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted ids as inclusive ``(first, last)`` runs."""
    if isinstance(ids, range) and ids.step == 1:
        return [(ids.start, ids.stop - 1)] if ids else []
    out: list[tuple[int, int]] = []
    for i in sorted(ids):
        if out and out[-1][1] + 1 == i:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


# --- announce parts: admission token and authentication --------------------------------------------

def announce_auth(key: bytes, *, job_id: int, pkt_idx: int, pkt_cnt: int, token: bytes, chunk: bytes) -> bytes:
    """HMAC-SHA256 under the shared admission key over ``job_id:u32 | pkt_idx:u16 | pkt_cnt:u16 | token |
    chunk``, first 16 bytes."""
    msg = _AUTH_HEAD.pack(job_id, pkt_idx, pkt_cnt) + token + chunk
    return hmac.new(key, msg, hashlib.sha256).digest()[:AUTH_LEN]


def encode_announce_part(chunk: bytes, *, job_id: int, pkt_idx: int, pkt_cnt: int, token: bytes = wire.NO_TOKEN,
                         key: bytes | None = None) -> bytes:
    """One announce part's payload: ``token | auth | chunk``."""
    auth = NO_AUTH if key is None else announce_auth(key, job_id=job_id, pkt_idx=pkt_idx, pkt_cnt=pkt_cnt,
                                                     token=token, chunk=chunk)
    return token + auth + chunk


def decode_announce_part(payload: bytes) -> tuple[bytes, bytes, bytes]:
    """``(token, auth, chunk)`` of one announce part. Raises MalformedPacket ``bad_announce`` when short."""
    if len(payload) < ANNOUNCE_PREFIX_LEN:
        raise wire.MalformedPacket("bad_announce", f"announce part of {len(payload)} bytes, the token and "
                                                   f"auth fields need {ANNOUNCE_PREFIX_LEN}")
    t = wire.TOKEN_LEN
    return payload[:t], payload[t:ANNOUNCE_PREFIX_LEN], payload[ANNOUNCE_PREFIX_LEN:]


def announce_auth_ok(key: bytes, header: wire.Header, token: bytes, auth: bytes, chunk: bytes) -> bool:
    want = announce_auth(key, job_id=header.job_id, pkt_idx=header.pkt_idx, pkt_cnt=header.pkt_cnt, token=token,
                         chunk=chunk)
    return hmac.compare_digest(auth, want)


def encode_msr_change(change: int, msr: float) -> bytes:
    """The payload of an MSR change: ``change:u32 | msr:u16`` (Q1.15)."""
    return MSR_CHANGE.pack(change, wire.tlr_to_q15(msr))


def decode_msr_change(payload: bytes) -> tuple[int, float]:
    """(change number, MSR) of an MSR change's payload; ``MalformedPacket("bad_msr_change")`` unless it is 6 bytes
    with a change number >= 1 and an MSR below 1."""
    if len(payload) != MSR_CHANGE_LEN:
        raise wire.MalformedPacket("bad_msr_change", f"{len(payload)} bytes, an MSR change has {MSR_CHANGE_LEN}")
    change, q = MSR_CHANGE.unpack(payload)
    if change == 0 or q >= wire.TLR_ONE:
        raise wire.MalformedPacket("bad_msr_change", f"change {change}, msr {q}/32768: change >= 1, msr < 1")
    return change, wire.q15_to_tlr(q)

