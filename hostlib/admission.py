"""Who gets receiver state, and how much: admission tokens, job slots, the memory budget. Sans-I/O, no clock.

* **Tokens** (stateless, models: QUIC Retry, TCP SYN cookies). A receiver answers an announce for a job it
  does not know with a RETRY carrying a token, and keeps nothing. The sender echoes the token in its
  announce; only then does the receiver create the job. A token is ``issued_ms:u32 | mac:12``, the MAC a
  keyed BLAKE2s over ``issued_ms | job_id | sender address`` under a secret that never leaves the receiver,
  so it is valid for one job from one address for ``token_lifetime_s``. An off-path host cannot see the
  RETRY sent to an address it forges, so it cannot make the receiver hold state for that address.
* **Address-validation tokens** (model: QUIC's NEW_TOKEN, RFC 9000 §8.1.3). A job that proved its address (a
  valid admission token, or the echo of its ACK token) gets a NEW_TOKEN: ``expires_ms:u32 | key_id:u8 |
  mac:11``, the MAC a keyed BLAKE2s over ``expires_ms | key_id | host`` under a receiver key replaced every
  ``address_token_lifetime_s`` (each key a one-way hash of the one before, so a key once dropped cannot be
  recomputed from what the receiver holds; the current and the previous key are kept, nothing per token). The
  sender's next job to this receiver presents it in its announce and is admitted at once, validated, even
  under pressure. Nothing else vouches for an address: no source address is trusted for having been validated.
* **Accounts.** A job without a valid token is *unvalidated*; slots and manifest CPU are accounted per source
  host and, separately, per unvalidated source host (:func:`account_of`), so announces forged in a host's name
  share only that host's unvalidated account and never take what its validated jobs are given.
* **Slots.** ``AtpConfig.max_jobs`` jobs at once, at most ``max_jobs_per_source`` from one source host. When
  every slot is taken, a new job takes the slot of a stalled job (no new data for ``stall_timeout_s``;
  jobs that never took any data go first), or else of the source holding the most slots if that is more
  than its fair share (``max_jobs`` over the number of sources, the newcomer's included).
* **Manifest CPU.** Decoding an announce's manifest is the one CPU cost that follows what a sender declares:
  each source host may have ``manifest_bytes_per_s`` decoded per second (:class:`SourceRate`), checked before
  any decoding; decoding itself checks the cheap things (sizes, counts) before the ranges.
* **Budget.** One byte count for everything the receiver holds (what each structure is charged is listed
  in hostlib/receiver.py), its outgoing queue included: half of it guaranteed to the slots in equal parts, a
  reserve for the replies not yet sent, the rest a shared pool, so a job admitted during a flood can always
  buffer its guarantee and replies always have room (:class:`MemoryBudget`).

The data structures are plain counters, a dict and fixed-size records, so the C receiver can keep them.
"""
from __future__ import annotations

import collections
import hashlib
import hmac
import os
import struct
from typing import Any, Iterable, Protocol

from netapprox.hostlib import wire

_ISSUED = struct.Struct("!I")
_MAC_INPUT = struct.Struct("!II")
_MAC_LEN = wire.TOKEN_LEN - _ISSUED.size
_ADDRESS_HEAD = struct.Struct("!IB")  # expires_ms, key_id
_ADDRESS_MAC_LEN = wire.TOKEN_LEN - _ADDRESS_HEAD.size


def address_bytes(addr: Any) -> bytes:
    """A stable byte form of a socket address as the I/O layer reports it (``(host, port, ...)``)."""
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}|{addr[1]}".encode()
    return repr(addr).encode()


def source_of(addr: Any) -> Any:
    """The host part of an address: slots are shared per host, whatever port it sends from."""
    if isinstance(addr, tuple) and addr:
        return addr[0]
    return addr


def account_of(source: Any, validated: bool) -> Any:
    """The account a job's slot and manifest CPU are charged to: its source host when the job proved its address,
    else ``("unvalidated", host)``, so what is sent in a host's name without proof never uses the host's own."""
    return source if validated else ("unvalidated", source)


class TokenMinter:
    """Mints and checks admission tokens and address-validation tokens (see the module docstring)."""

    def __init__(self, *, lifetime_s: float, secret: bytes | None = None, address_lifetime_s: float = 3600.0,
                 now: float = 0.0) -> None:
        self._key = secret if secret is not None else os.urandom(32)
        if not 1 <= len(self._key) <= 32:
            raise ValueError("token secret must be 1..32 bytes")
        self.lifetime_ms = int(lifetime_s * 1000)
        self.address_lifetime_s = address_lifetime_s
        self.address_lifetime_ms = int(address_lifetime_s * 1000)
        self.key_id = 0
        """Rotations of the address-token key so far (tokens carry its low byte)."""
        self._address_key = hashlib.blake2s(b"address-validation token key", key=self._key).digest()
        self._previous_key: bytes | None = None
        self._rotate_at = now + address_lifetime_s

    def rotate(self) -> None:
        """Replace the address-token key by a one-way hash of it; the one before is dropped, so tokens signed
        under it are refused from now on (an operator may call this to revoke every outstanding token at once,
        twice)."""
        self._previous_key = self._address_key
        self._address_key = hashlib.blake2s(b"rotate", key=self._address_key).digest()
        self.key_id += 1

    def _advance(self, now: float) -> None:
        """Rotate once per ``address_lifetime_s`` passed (one hash each, however the time passed was cut up)."""
        if now < self._rotate_at:
            return
        n = int((now - self._rotate_at) // self.address_lifetime_s) + 1
        if n <= 64:
            for _ in range(n):
                self.rotate()
        else:  # a long idle: every token out there has expired; one hash, not n (both cores see the same jump)
            self._address_key = hashlib.blake2s(b"skip %d" % n, key=self._address_key).digest()
            self._previous_key = None
            self.key_id += n
        self._rotate_at += n * self.address_lifetime_s

    def _address_mac(self, key: bytes, expires: int, key_id: int, addr: Any) -> bytes:
        data = _ADDRESS_HEAD.pack(expires, key_id) + str(source_of(addr)).encode()
        return hashlib.blake2s(data, key=key, digest_size=_ADDRESS_MAC_LEN).digest()

    def mint_address(self, addr: Any, now: float) -> bytes:
        """An address-validation token for the host of ``addr``, valid for ``address_lifetime_s``."""
        self._advance(now)
        expires = (int(now * 1000) + self.address_lifetime_ms) & 0xFFFFFFFF
        kid = self.key_id & 0xFF
        return _ADDRESS_HEAD.pack(expires, kid) + self._address_mac(self._address_key, expires, kid, addr)

    def check_address(self, token: bytes, addr: Any, now: float) -> str | None:
        """``None`` if ``token`` is a valid address-validation token for the host of ``addr`` now, else why not
        (``bad_token``: not one of ours for this host, or signed under a key rotated out; ``expired_token``)."""
        self._advance(now)
        expires, kid = _ADDRESS_HEAD.unpack_from(token)
        if kid == self.key_id & 0xFF:
            key = self._address_key
        elif kid == (self.key_id - 1) & 0xFF and self._previous_key is not None:
            key = self._previous_key
        else:
            return "bad_token"
        if not hmac.compare_digest(token[_ADDRESS_HEAD.size:], self._address_mac(key, expires, kid, addr)):
            return "bad_token"
        if (expires - int(now * 1000)) & 0xFFFFFFFF > self.address_lifetime_ms:
            return "expired_token"
        return None

    def check_announce(self, token: bytes, job_id: int, addr: Any, now: float) -> str:
        """What a non-zero token on an announce for a job not held proves: ``"job"`` (an admission token for this
        job and address), ``"address"`` (an address-validation token for its host), else the reason it is refused
        (``bad_token``, ``expired_token``). At most two keyed hashes, nothing kept."""
        bad = self.check(token, job_id, addr, now)
        if bad is None:
            return "job"
        if bad == "expired_token":
            return bad
        return self.check_address(token, addr, now) or "address"

    def _mac(self, issued: int, job_id: int, addr: Any) -> bytes:
        data = _MAC_INPUT.pack(issued, job_id) + address_bytes(addr)
        return hashlib.blake2s(data, key=self._key, digest_size=_MAC_LEN).digest()

    def mint(self, job_id: int, addr: Any, now: float) -> bytes:
        issued = int(now * 1000) & 0xFFFFFFFF
        return _ISSUED.pack(issued) + self._mac(issued, job_id, addr)

    def check(self, token: bytes, job_id: int, addr: Any, now: float) -> str | None:
        """``None`` if ``token`` admits ``job_id`` from ``addr`` now, else the reason it does not."""
        (issued,) = _ISSUED.unpack_from(token)
        if not hmac.compare_digest(token[_ISSUED.size:], self._mac(issued, job_id, addr)):
            return "bad_token"
        if (int(now * 1000) - issued) & 0xFFFFFFFF > self.lifetime_ms:
            return "expired_token"
        return None


class SourceRate:
    """Bytes per second per source host, and in all: token buckets one second deep that may go into debt (a
    request of any size passes while its buckets hold tokens, and the next waits until the debt is repaid). The
    receiver-wide bucket fills at ``total_rate`` and takes only requests above ``small`` bytes, so a flood of
    large ones from many sources cannot hold back the small ones every ordinary job makes. Entries are kept for
    at most ``max_sources`` sources: beyond that, sources whose bucket is full again are forgotten (they are
    the same as new), then the least recently charged."""

    def __init__(self, rate: float, max_sources: int, total_rate: float | None = None, small: int = 0) -> None:
        self.rate = rate
        self.max_sources = max_sources
        self.total_rate = total_rate
        self.small = small
        self.buckets: dict[Any, list[float]] = {}  # source -> [tokens, time], least recently charged first
        self.total: list[float] = [total_rate or 0.0, 0.0]

    def take(self, source: Any, n: int, now: float) -> bool:
        b = self.buckets.pop(source, None)
        tokens = self.rate if b is None else min(self.rate, b[0] + (now - b[1]) * self.rate)
        total = self.total_rate is not None and n > self.small
        if total:
            self.total = [min(self.total_rate, self.total[0] + (now - self.total[1]) * self.total_rate), now]
        ok = tokens > 0 and (not total or self.total[0] > 0)
        if ok:
            tokens -= n
            if total:
                self.total[0] -= n
        self.buckets[source] = [tokens, now]
        if len(self.buckets) > self.max_sources:
            self._forget(now)
        return ok

    def _forget(self, now: float) -> None:
        for s, (tokens, t) in list(self.buckets.items()):
            if tokens + (now - t) * self.rate >= self.rate:
                del self.buckets[s]
        while len(self.buckets) > self.max_sources:
            del self.buckets[next(iter(self.buckets))]


class SlotHolder(Protocol):
    source: Any
    progressed: bool
    progress_at: float


class SlotTable:
    """Which jobs hold a slot, counted per source; picks the slot a newcomer may take."""

    def __init__(self, *, max_jobs: int, max_per_source: int, stall_s: float) -> None:
        self.max_jobs = max_jobs
        self.max_per_source = max_per_source
        self.stall_s = stall_s
        self.holders: dict[SlotHolder, None] = {}
        """In the order the jobs got their slots: among equally stalled jobs the oldest goes first, the same
        choice in the C receiver (a set's order would depend on memory addresses)."""
        self.per_source: collections.Counter[Any] = collections.Counter()

    def __len__(self) -> int:
        return len(self.holders)

    def add(self, job: SlotHolder) -> None:
        self.holders[job] = None
        self.per_source[job.source] += 1

    def remove(self, job: SlotHolder) -> None:
        if job in self.holders:
            del self.holders[job]
            self.per_source[job.source] -= 1
            if not self.per_source[job.source]:
                del self.per_source[job.source]

    def rekey(self, job: SlotHolder, account: Any) -> None:
        """``job`` is charged to ``account`` from now on (it proved its address: :func:`account_of`); it keeps its
        place among the holders."""
        if job in self.holders:
            self.per_source[job.source] -= 1
            if not self.per_source[job.source]:
                del self.per_source[job.source]
            self.per_source[account] += 1
        job.source = account

    def choose(self, source: Any, now: float) -> tuple[str | None, SlotHolder | None, str]:
        """``(refusal, victim, why)`` for a new job from ``source``: ``refusal`` is a drop reason when it gets
        no slot; otherwise ``victim`` (or ``None`` for a free slot) is the job whose slot it takes, ``why``
        ``"stalled"`` or ``"share"``. Costs O(1) while slots are free, O(slots) when one must be taken."""
        mine = self.per_source.get(source, 0)
        if mine >= self.max_per_source:
            victim = self._stalled((j for j in self.holders if j.source == source), now)
            return (None, victim, "stalled") if victim is not None else ("source_share", None, "")
        if len(self.holders) < self.max_jobs:
            return None, None, ""
        victim = self._stalled(self.holders, now)
        if victim is not None:
            return None, victim, "stalled"
        sources = len(self.per_source) + (source not in self.per_source)
        share = max(1, self.max_jobs // sources)
        big, held = max(self.per_source.items(), key=lambda kv: kv[1])
        if held > share and held > mine + 1:
            victim = min((j for j in self.holders if j.source == big), key=_progress_key)
            return None, victim, "share"
        return "no_slot", None, ""

    def _stalled(self, jobs: Iterable[SlotHolder], now: float) -> SlotHolder | None:
        """The job longest without progress if that is ``stall_s`` or more; never-progressed jobs first."""
        best = None
        for j in jobs:
            if now - j.progress_at >= self.stall_s and (best is None or _progress_key(j) < _progress_key(best)):
                best = j
        return best


def _progress_key(job: SlotHolder) -> tuple[bool, float]:
    return (job.progressed, job.progress_at)


class MemoryBudget:
    """Bytes charged against one limit, shared fairly between job slots, the outgoing queue included.

    Half the budget is a guarantee split evenly over the slots (``guarantee`` bytes each); ``reserve`` bytes
    are for the replies waiting to be sent (:meth:`out_charge`); the rest is a pool anyone may use. A job holding a slot is charged against its guarantee first and the pool
    for the rest; records without a slot (finished jobs keeping their DONE) only use the pool. So one job
    or one source can take at most the pool plus its own guarantees, and every admitted job can always
    buffer ``guarantee`` bytes, however full the pool is. ``used`` never exceeds ``limit``."""

    __slots__ = ("limit", "guarantee", "reserve", "pool_limit", "used", "pool", "out", "peak")

    def __init__(self, limit: int, slots: int, reserve: int = 0) -> None:
        self.limit = limit
        self.guarantee = limit // (2 * slots)
        self.reserve = reserve
        self.pool_limit = limit - slots * self.guarantee - reserve
        if self.pool_limit < 0:
            raise ValueError(f"a reserve of {reserve} bytes does not fit a budget of {limit}")
        self.used = 0
        self.pool = 0
        self.out = 0
        self.peak = 0

    def _over(self, charged: int, slot: bool) -> int:
        return charged - self.guarantee if slot and charged > self.guarantee else 0 if slot else charged

    def fits(self, charged: int, slot: bool, n: int) -> bool:
        """Whether a job with ``charged`` bytes (holding a slot or not) may be charged ``n`` more."""
        return self.pool - self._over(charged, slot) + self._over(charged + n, slot) <= self.pool_limit

    def charge(self, charged: int, slot: bool, n: int) -> None:
        """Charge ``n`` bytes (negative: release) to a job that had ``charged``; callers check ``fits``."""
        self.pool += self._over(charged + n, slot) - self._over(charged, slot)
        self.used += n
        if self.used > self.peak:
            self.peak = self.used

    def out_charge(self, n: int) -> bool:
        """Charge a reply of ``n`` bytes waiting to be sent, if the reserve has room (else it is not queued)."""
        if self.out + n > self.reserve:
            return False
        self.out += n
        self.used += n
        if self.used > self.peak:
            self.peak = self.used
        return True

    def out_release(self) -> None:
        """The waiting replies went to the socket."""
        self.used -= self.out
        self.out = 0

    def leave_slot(self, charged: int) -> None:
        """A job with ``charged`` bytes gives up its slot: all of it is pool from now on."""
        self.pool += charged - self._over(charged, True)

    @property
    def pool_overdrawn(self) -> bool:
        return self.pool > self.pool_limit

    def as_dict(self) -> dict[str, int]:
        return {"used": self.used, "peak": self.peak, "budget": self.limit, "guarantee_per_job": self.guarantee,
                "replies_queued": self.out, "replies_reserve": self.reserve}
