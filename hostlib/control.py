"""How a receiver learns a job: the job announce and the FIN, two reserved DATA messages.

Both are ordinary non-approximate DATA packets (no APPROX flag, so switches put them in queue 0) with a
reserved ``msg_id``; the receiver acknowledges them like any other packet.

* ``ANNOUNCE_MSG_ID`` (0xFFFFFFFF): the job manifest, split over ``pkt_cnt`` packets if needed. The sender
  sends it first and repairs it like any MSR = 1 message. Payload (all parts concatenated)::

      magic "ATPJ" | total:u32 | vector_len:u32 (0xFFFFFFFF = not a vector) | n_groups:u16 |
      n_groups x ( group_id:u16 | msr:u16 Q1.15 | count:u32 | n_ranges:u32 | n_ranges x (first:u32, last:u32) )

  The ranges (inclusive, ascending) list the group's message ids.
* ``FIN_MSG_ID`` (0xFFFFFFFE): the sender has finished; the receiver answers with DONE (lost message ids)
  and keeps answering repeated FINs for ``AtpConfig.finished_linger_s``.
"""
from __future__ import annotations

import dataclasses
import struct

from netapprox.hostlib import wire

ANNOUNCE_MSG_ID = 0xFFFFFFFF
FIN_MSG_ID = 0xFFFFFFFE
CONTROL_MSG_IDS = (ANNOUNCE_MSG_ID, FIN_MSG_ID)
NO_VECTOR = 0xFFFFFFFF
_MAGIC = b"ATPJ"
_HEAD = struct.Struct("!4sIIH")
_GROUP = struct.Struct("!HHII")
_RANGE = struct.Struct("!II")


@dataclasses.dataclass(frozen=True)
class GroupShape:
    group_id: int
    msr: float
    msg_ids: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.msg_ids)


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What the receiver knows about a job once the announce has arrived."""

    total: int
    vector_len: int | None
    groups: tuple[GroupShape, ...]

    def group_of(self) -> dict[int, int]:
        return {m: g.group_id for g in self.groups for m in g.msg_ids}

    def encode(self) -> bytes:
        out = [_HEAD.pack(_MAGIC, self.total, NO_VECTOR if self.vector_len is None else self.vector_len,
                          len(self.groups))]
        for g in self.groups:
            ranges = _ranges(g.msg_ids)
            out.append(_GROUP.pack(g.group_id, wire.tlr_to_q15(g.msr), len(g.msg_ids), len(ranges)))
            out.extend(_RANGE.pack(a, b) for a, b in ranges)
        return b"".join(out)

    @classmethod
    def decode(cls, data: bytes, *, max_messages: int) -> "Manifest":
        """Parse and check a manifest; raises MalformedPacket with reason ``bad_announce``."""
        def bad(detail: str) -> wire.MalformedPacket:
            return wire.MalformedPacket("bad_announce", detail)

        if len(data) < _HEAD.size:
            raise bad(f"{len(data)} bytes")
        magic, total, vlen, n_groups = _HEAD.unpack_from(data)
        if magic != _MAGIC:
            raise bad("wrong magic")
        if total > max_messages:
            raise bad(f"job of {total} messages exceeds this receiver's limit of {max_messages} (max_messages)")
        off = _HEAD.size
        groups = []
        seen: set[int] = set()
        for _ in range(n_groups):
            if off + _GROUP.size > len(data):
                raise bad("truncated group list")
            gid, msr_q, count, n_ranges = _GROUP.unpack_from(data, off)
            off += _GROUP.size
            if msr_q > wire.TLR_ONE or n_ranges > count or off + n_ranges * _RANGE.size > len(data):
                raise bad(f"group {gid}: inconsistent entry")
            ids: list[int] = []
            for _ in range(n_ranges):
                a, b = _RANGE.unpack_from(data, off)
                off += _RANGE.size
                if a > b or b >= total or (ids and a <= ids[-1]):
                    raise bad(f"group {gid}: bad id range ({a}, {b})")
                if len(ids) + (b - a + 1) > count:
                    raise bad(f"group {gid}: ranges exceed count {count}")
                ids.extend(range(a, b + 1))
            if len(ids) != count:
                raise bad(f"group {gid}: ranges cover {len(ids)} ids, count says {count}")
            if seen.intersection(ids) or gid in {g.group_id for g in groups}:
                raise bad(f"group {gid}: overlaps another group")
            seen.update(ids)
            groups.append(GroupShape(gid, wire.q15_to_tlr(msr_q), tuple(ids)))
        if off != len(data) or len(seen) != total:
            raise bad("groups do not cover exactly the job's messages")
        return cls(total=total, vector_len=None if vlen == NO_VECTOR else vlen, groups=tuple(groups))


def _ranges(ids) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for i in sorted(ids):
        if out and out[-1][1] + 1 == i:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out
