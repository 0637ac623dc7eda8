"""Controller replicas on P4Runtime's client arbitration: the switch is the arbiter (no consensus of our own).

P4Runtime (1.4, "Client Arbitration and Controller Replication") makes primary the client whose election id is
at least the highest the device has ever received for the role (``election_id_past``), accepts Writes only from
it, and tells every client when the primary changes: status OK to the primary, ALREADY_EXISTS to the backups
while there is one, NOT_FOUND when there is none, each time with ``election_id_past``. When a primary's stream
breaks, the specification leaves the device without a primary until a client arbitrates again with an id >=
``election_id_past`` (BMv2's PI server instead promotes the highest remaining client at once, with OK).

A replica set is N controller processes with one configuration, replica k = 1..N. Replica k's election ids are
``(term, k)``: the high word a term, the low word its rank, so ids are unique per device while replicas have
distinct ranks, and the highest live rank wins. ``claim`` is all a replica decides, from each arbitration update:

- OK: it is primary; nothing to ask;
- ALREADY_EXISTS, the primary's id ``(t, i)``: a replica of a higher rank (k > i) asks ``(t, k)`` and takes over
  (a replica that returns with a higher rank replaces a lower one); the others stay backups;
- NOT_FOUND (no primary), past id ``(t, i)``: every backup asks for the smallest id of its own >= the past one,
  ``(t, k)`` if k >= i, else ``(t + 1, k)``; the switch makes each such request primary in turn, so the highest
  rank among them is primary last, and every lower one steps down on the update that follows;
- NOT_FOUND without an id (nobody has ever been primary): ``(0, k)``.

A replica never asks again for the id it holds, so updates do not loop. Two processes given the same rank cannot
both hold an id: the switch refuses the second one's (INVALID_ARGUMENT ends its stream).
"""
from __future__ import annotations

import dataclasses

from google.rpc import code_pb2

ElectionId = tuple[int, int]
"""(high, low) of a P4Runtime ``Uint128`` election id."""


@dataclasses.dataclass
class Arbitration:
    """Who is primary for one switch, as its arbitration updates said (the metrics and logs show it)."""

    primary: bool = False
    """This controller is the primary: the switch accepts its Writes."""
    terms: int = 0
    """Times this controller became primary (a driver armed in an earlier term knows it must arm again)."""
    primary_id: ElectionId | None = None
    """The primary's election id (None while there is none)."""
    changes: int = 0
    """Times the primary changed (another id, or none), as this controller saw it."""
    since: float = 0.0
    """Unix time of the last change."""
    vacancies: int = 0
    """Times the switch said a primary had gone and there was none (NOT_FOUND after a primary): how a backup
    detects the primary's crash (its stream to the switch broke)."""

MAX_TERM = (1 << 64) - 1


def initial_id(replica: int) -> ElectionId:
    """The id replica ``replica`` arbitrates with when it (re)connects: the lowest of its own."""
    return (0, replica)


def claim(replica: int, current: ElectionId, status: int, past: ElectionId | None) -> ElectionId | None:
    """The election id replica ``replica`` (holding ``current``) asks for after an arbitration update with
    ``status`` (a google.rpc code) and ``past`` (the update's election id, None when unset), or None to keep
    what it holds."""
    if status == code_pb2.OK:
        return None
    if past is None:
        want = initial_id(replica)
    elif status == code_pb2.ALREADY_EXISTS:
        term, rank = past
        if replica <= rank:
            return None  # a replica of a higher (or the same) rank is primary
        want = (term, replica)
    else:
        term, rank = past
        want = (term, replica) if replica >= rank else (min(term + 1, MAX_TERM), replica)
    return None if want == current else want


def rank_of(election_id: ElectionId | None) -> int:
    """The replica (low word) of a primary's election id; 0 for none."""
    return 0 if election_id is None else election_id[1]
