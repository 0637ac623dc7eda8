"""An analytics job: rows in, the aggregates a user asked for out, each with its error, over one ATP job.

The sender side turns rows into ATP messages (one row per message), in a seeded random order of message ids, one
ATP group per *stratum*: a user group crossed with a message size class (its packet count). The receiver side
estimates every aggregate from what arrived, stratified by those strata. Why this gives unbiased estimates when a
row's size and value are related is in docs/analytics.md (Unbiased samples).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import random
import struct
import time
from typing import Callable, Hashable, Iterable, Mapping, Sequence

from netapprox.analytics import accuracy, estimators, link
from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.estimators import Estimate, RankEstimate, Stratum
from netapprox.hostlib.config import AtpConfig, JobSpec, Message

_ROW = struct.Struct("!dqH")
LIVE_LOOKS = 4
"""A job whose MSR follows its estimate stops at one of at most this many looks (:class:`_LiveMsr`)."""
AGGREGATES = ("avg", "sum", "count", "rank")
MIN_STRATUM_ROWS = 20
"""A packet count with fewer rows in a group is sent whole (MSR 1)."""
SIZE_CLASS_ROWS = 50
MAX_SIZE_CLASSES = 3
"""A packet count's rows of a group are split by their bytes into at most this many classes of at least
``SIZE_CLASS_ROWS`` rows: packing gives a short one-packet row a different fate from a long one (docs/analytics.md,
Unbiased samples; 3 measured best, 8 classes leave too few sampled rows per stratum)."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One record: the value aggregated, a key (rank), a user group, and the rest of the record (its bytes)."""

    value: float
    key: int = 0
    group: int = 0
    extra: bytes = b""

    def encode(self) -> bytes:
        return _ROW.pack(self.value, self.key, self.group) + self.extra

    @classmethod
    def decode(cls, data: bytes) -> "Row":
        if len(data) < _ROW.size:
            raise AnalyticsError(f"a row message of {len(data)} bytes; rows are at least {_ROW.size}")
        value, key, group = _ROW.unpack_from(data)
        return cls(value, key, group, bytes(data[_ROW.size:]))


@dataclasses.dataclass(frozen=True)
class Query:
    """One aggregate and its bound: relative error ``e_max`` at ``confidence``, over all rows and, with
    ``per_group``, within every group (``group_e_max`` gives some groups their own)."""

    aggregate: str
    e_max: float
    confidence: float = 0.95
    per_group: bool = False
    group_e_max: tuple[tuple[int, float], ...] = ()
    k: int = 15
    """``rank``: how many keys."""
    above: float | None = None
    """``count``: count the rows whose value is above this."""

    def __post_init__(self) -> None:
        if isinstance(self.group_e_max, Mapping):
            object.__setattr__(self, "group_e_max", tuple(sorted(self.group_e_max.items())))
        if self.aggregate not in AGGREGATES:
            raise AnalyticsError(f"aggregate {self.aggregate!r}: one of {', '.join(AGGREGATES)}")
        accuracy.check_e_max(self.e_max)
        for g, e in self.group_e_max:
            accuracy.check_e_max(e, f"e_max of group {g}")
        estimators.z_of(self.confidence)
        if self.aggregate == "count" and self.above is None:
            raise AnalyticsError("count needs a predicate: Query('count', e_max, above=X) counts rows with value > X")
        if self.aggregate == "rank" and not (isinstance(self.k, int) and self.k >= 1):
            raise AnalyticsError(f"rank k={self.k!r}: must be an integer >= 1")

    @property
    def name(self) -> str:
        if self.aggregate == "count":
            return f"count(value > {self.above:g})"
        return f"top{self.k}" if self.aggregate == "rank" else self.aggregate

    def bounds(self, groups: Iterable[int]) -> list[tuple[int | None, float]]:
        """(group or ``None`` for all rows, e_max) of every bound this query states."""
        own = dict(self.group_e_max)
        out: list[tuple[int | None, float]] = [(None, self.e_max)]
        for g in groups:
            if self.per_group or g in own:
                out.append((g, own.get(g, self.e_max)))
        return out


@dataclasses.dataclass(frozen=True)
class StratumPlan:
    atp_group: int
    group: int
    packets: int
    """Packets per message of its rows."""
    rows: tuple[int, ...]
    """Indices into the job's rows."""
    whole: bool
    """Sent whole (MSR 1): too few rows to sample."""

    def msr(self, wanted: float) -> float:
        """The MSR this stratum asks ATP for when its bounds want ``wanted``: 1 when sent whole, and enough for
        two rows (a variance) otherwise."""
        if self.whole:
            return 1.0
        return min(1.0, max(wanted, estimators.MIN_SAMPLE_PER_STRATUM / len(self.rows)))


class Bounded:
    """What an answer with an ``estimate`` (or None) and an ``e_max`` says of its bound: ``error``, the estimate's
    relative error bound (infinite without an estimate), and ``met``, whether it is within ``e_max``. A job's
    ``Answer`` and a stream window's ``WindowAnswer`` (analytics.stream) alike."""

    __slots__ = ()

    @property
    def error(self) -> float:
        return self.estimate.relative_error if self.estimate is not None else math.inf

    @property
    def met(self) -> bool:
        return self.error <= self.e_max


@dataclasses.dataclass(frozen=True)
class Answer(Bounded):
    query: Query
    group: int | None
    e_max: float
    estimate: Estimate | RankEstimate | None
    note: str = ""
    """Why there is no estimate (the sample cannot support one yet)."""

    def as_dict(self) -> dict:
        return {"aggregate": self.query.name, "group": self.group, "e_max": self.e_max, "met": self.met,
                "error": self.error if math.isfinite(self.error) else None, "note": self.note,
                "estimate": self.estimate.as_dict() if self.estimate is not None else None}


@dataclasses.dataclass(frozen=True)
class Result:
    answers: tuple[Answer, ...]
    received: int
    total: int
    jct_s: float | None = None
    msr: tuple[tuple[int, float], ...] = ()
    """The MSR of every ATP group at the end, as (atp group, MSR)."""
    looks: int = 0
    """How many looks the job made while its MSR followed its estimate (0: a fixed MSR)."""
    summary: object = dataclasses.field(default=None, compare=False, repr=False)
    """The ATP sender's ``SendSummary`` when the job went over UDP (:meth:`AnalyticsJob.send`)."""
    sample_ids: tuple[int, ...] = dataclasses.field(default=(), compare=False, repr=False)
    """:meth:`AnalyticsJob.send`: the message ids the answers were read from."""
    phases: dict | None = dataclasses.field(default=None, compare=False, repr=False)
    """:meth:`AnalyticsJob.send`: where its time went, in seconds from the start (``first_ack_s``: the first row
    acknowledged, after the announce and any RETRY; ``look_s``: each look; ``stop_s``: the look that stopped it;
    ``jct_s``; ``closed_s``; ``start_wall``: ``time.time()`` at the start), the CPU time its estimates took (``estimate_cpu_s``, over ``steps`` calls), and the
    RETRYs that made it start over (``retries``)."""

    @property
    def all_met(self) -> bool:
        return all(a.met for a in self.answers)

    def answer(self, aggregate: str, group: int | None = None) -> Answer:
        for a in self.answers:
            if a.query.aggregate == aggregate and a.group == group:
                return a
        raise KeyError((aggregate, group))

    def as_dict(self) -> dict:
        return {"received": self.received, "total": self.total, "jct_s": self.jct_s, "all_met": self.all_met,
                "msr": dict(self.msr), "looks": self.looks, "answers": [a.as_dict() for a in self.answers],
                **({"phases": self.phases} if self.phases is not None else {})}


class AnalyticsJob:
    """Rows, the queries on them, and the ATP job that carries them (see the module docstring)."""

    def __init__(self, rows: Sequence[Row], queries: Sequence[Query], *, job_id: int = 1, seed: int = 0,
                 max_payload: int = AtpConfig().max_payload, min_rows: int = accuracy.MIN_GROUP_ROWS) -> None:
        if not queries:
            raise AnalyticsError("no queries: state at least one aggregate and its e_max")
        self.rows = list(rows)
        self.queries = tuple(queries)
        self.job_id = job_id
        if len(self.rows) < min_rows:
            raise AnalyticsError(f"the job has {len(self.rows)} rows; an error bound needs at least {min_rows}")
        sizes: dict[int, int] = {}
        for r in self.rows:
            sizes[r.group] = sizes.get(r.group, 0) + 1
        self.groups = sorted(sizes)
        for q in self.queries:
            for g, _ in q.group_e_max:
                if g not in sizes:
                    raise AnalyticsError(f"{q.name}: group {g} has a bound but no rows")
            for g, e in q.bounds(self.groups):
                if g is not None and sizes[g] < min_rows:
                    raise AnalyticsError(f"{q.name}: group {g} has {sizes[g]} rows; a bound of e_max {e:g} needs at "
                                         f"least {min_rows} (merge it with another group, or drop its bound)")
        self._payload = [r.encode() for r in self.rows]
        self._seed, self._max_payload = seed, max_payload
        self.strata = self._plan_strata(max_payload)
        self._stratum_of = [0] * len(self.rows)
        for s in self.strata:
            for i in s.rows:
                self._stratum_of[i] = s.atp_group
        self.order = self._packed_order(random.Random(seed), max_payload)
        """Message id ``i`` carries row ``order[i]``: a random order within every stratum, so what is sent last of
        each is a random sample of it."""

    def _plan_strata(self, max_payload: int) -> list[StratumPlan]:
        """One stratum per (group, packet count, size class): every one gets its own MSR guarantee, so the sample
        of each is a random one of it whatever its loss rate. A packet count with fewer than
        ``MIN_STRATUM_ROWS`` rows of a group is sent whole (MSR 1): the large rare messages of a heavy tail would
        otherwise be the ones missing."""
        by_group: dict[int, dict[int, list[int]]] = {}
        self._packets = [max(1, -(-len(data) // max_payload)) for data in self._payload]
        for i, pkts in enumerate(self._packets):
            by_group.setdefault(self.rows[i].group, {}).setdefault(pkts, []).append(i)
        out: list[StratumPlan] = []
        for g in self.groups:
            for pkts in sorted(by_group[g]):
                rows = by_group[g][pkts]
                for part in _size_classes(rows, [len(self._payload[i]) for i in rows]):
                    out.append(StratumPlan(len(out), g, pkts, tuple(part), len(part) < MIN_STRATUM_ROWS))
        if len(out) > 0xFFFF:
            raise AnalyticsError(f"{len(out)} strata; ATP carries at most 65536 groups")
        return out

    def _packed_order(self, rng: random.Random, max_payload: int) -> list[int]:
        """The rows in message-id order: every stratum's rows in a random order, taken in runs of
        ``_LiveMsr.CHECK_FRACTION`` of the stratum (one row for rows of several packets). ATP packs consecutive
        one-packet messages of one group into one packet (rows of strata interleaved one by one went one or two
        per packet), and the job's announce lists each group's message ids as ranges, one per run: runs of one
        packet's rows made a 20,000-row job's announce 10 parts (13.5 KB), which the receiver's admission answers
        with RETRYs, where runs of the check's size make it one part. The strata take turns by their progress: the
        next run is the one whose middle is the earliest fraction of its stratum (ties at random), so every
        stratum is sent evenly over the whole job, within one run (one check)."""
        import heapq
        heap = []
        for s in self.strata:
            rows = list(s.rows)
            rng.shuffle(rows)
            run = 1 if s.packets > 1 else max(1, math.ceil(_LiveMsr.CHECK_FRACTION * len(rows)))
            heap.append((run / 2 / len(rows), rng.random(), rows, 0, run))
        heapq.heapify(heap)
        order: list[int] = []
        while heap:
            _, _, rows, at, run = heapq.heappop(heap)
            order.extend(rows[at:at + run])
            at += run
            if at < len(rows):
                heapq.heappush(heap, ((at + run / 2) / len(rows), rng.random(), rows, at, run))
        return order

    # --- the MSR ---------------------------------------------------------------------------------------------

    def _bounds_by_stratum(self) -> dict[int, list[float]]:
        out: dict[int, list[float]] = {s.atp_group: [] for s in self.strata}
        for q in self.queries:
            for g, e in q.bounds(self.groups):
                for s in self.strata:
                    if g is None or s.group == g:
                        out[s.atp_group].append(e)
        return out

    def initial_msr(self) -> dict[int, float]:
        """Per ATP group: the paper's heuristic for the tightest bound its rows serve."""
        return {s.atp_group: s.msr(accuracy.initial_msr(min(self._bounds_by_stratum()[s.atp_group])))
                for s in self.strata}

    def needed_msr(self, received: Mapping[int, bytes], *, looks: int = 1,
                   samples: dict[int, list[Row]] | None = None,
                   moments: Mapping[int, tuple[int, float, float]] | None = None) -> dict[int, float] | None:
        """Per ATP group: the MSR the sample so far says every bound needs (``None`` while it cannot tell), each
        bound at the level of one of ``looks`` looks (:meth:`estimate`). ``samples``: ``received``'s rows by ATP
        group when the caller keeps them (:class:`_LiveMsr`), else they are looked up; ``moments``: per ATP group
        the (count, sum, sum of squares) of those rows' values, which Avg and Sum then read instead of the values
        (the same fraction, in O(strata))."""
        samples = self._samples(received) if samples is None else samples
        need = {s.atp_group: 0.0 for s in self.strata}
        for q in self.queries:
            for g, e in q.bounds(self.groups):
                members = [s for s in self.strata if g is None or s.group == g]
                fractions = []
                if moments is not None and q.aggregate in ("avg", "sum"):
                    f = accuracy.needed_fraction_moments(self._post_moments(members, moments), e,
                                                         self._level(q, looks))
                    if f is None:
                        return None
                    for s in members:
                        need[s.atp_group] = max(need[s.atp_group], f)
                    continue
                sets = self._value_sets(q, members, samples)
                for values in sets:
                    f = accuracy.needed_fraction(values, e, self._level(q, len(sets) * looks))
                    if f is None:
                        return None
                    fractions.append(f)
                f = max(fractions, default=0.0)
                for s in members:
                    need[s.atp_group] = max(need[s.atp_group], f)
        return {s.atp_group: s.msr(accuracy.msr_from_fraction(need[s.atp_group])) for s in self.strata}

    @staticmethod
    def _level(q: Query, k: int) -> float:
        """The level of each of ``k`` bounds that hold together at ``q.confidence`` (Bonferroni: a rank's top-k
        keys, times the looks)."""
        return 1.0 - (1.0 - q.confidence) / k

    def _value_sets(self, q: Query, members: list[StratumPlan], samples: dict[int, list[Row]]
                    ) -> list[list[Stratum]]:
        """The strata of values a query's mean is taken over (rank: one set per top-k key of the sample)."""
        cells = self._post_strata(members, samples)
        if q.aggregate in ("avg", "sum"):
            return [[Stratum(big_n, tuple(r.value for r in rows)) for big_n, rows in cells]]
        if q.aggregate == "count":
            return [[Stratum(big_n, tuple(1.0 if r.value > q.above else 0.0 for r in rows)) for big_n, rows in cells]]
        freq: dict[int, int] = {}
        for _, rows in cells:
            for r in rows:
                freq[r.key] = freq.get(r.key, 0) + 1
        top = sorted(freq, key=lambda k: (-freq[k], k))[:q.k]
        return [[Stratum(big_n, tuple(1.0 if r.key == key else 0.0 for r in rows)) for big_n, rows in cells]
                for key in top]

    # --- ATP ---------------------------------------------------------------------------------------------------

    def job_spec(self, msr: Mapping[int, float] | float | None = None) -> JobSpec:
        """The ATP job: message ``i`` is row ``order[i]`` in its stratum's group; ``msr`` per ATP group, or one for
        all (strata sent whole keep MSR 1), by default :meth:`initial_msr`."""
        if msr is None:
            msr = self.initial_msr()
        if not isinstance(msr, Mapping):
            msr = {s.atp_group: s.msr(float(msr)) for s in self.strata}
        messages = tuple(Message(self._payload[i], group_id=self._stratum_of[i]) for i in self.order)
        return JobSpec(self.job_id, messages, msr=1.0, group_msr=dict(msr))

    @staticmethod
    def config(base: AtpConfig = AtpConfig()) -> AtpConfig:
        """ATP options for an unbiased sample: messages in (random) id order, MRDF off (docs/analytics.md)."""
        return dataclasses.replace(base, mrdf=False)

    @classmethod
    def config_for(cls, base: AtpConfig) -> Callable[["AnalyticsJob"], AtpConfig]:
        """``job -> config(base)``, for callers that build the configuration per job."""
        return lambda job: cls.config(base)

    def run(self, *, msr: Mapping[int, float] | float | None = None, config: AtpConfig = AtpConfig(),
            forward: link.LossyPath | None = None, reverse: link.LossyPath | None = None,
            adapt: bool = False) -> Result:
        """The job over a simulated lossy link in virtual time (:mod:`netapprox.analytics.link`) with
        :meth:`config`'s ordering, starting at ``msr`` (by default :meth:`initial_msr`); its answers. ``adapt``:
        the MSR follows the running estimate while the job runs, and the job ends as soon as every bound holds
        (:class:`_LiveMsr`)."""
        spec = self.job_spec(msr)
        live = self.live_msr(spec) if adapt else None
        t = link.run(spec, self.config(config), forward=forward, reverse=reverse,
                     on_step=live.step if live is not None else None)
        if t.failure is not None:
            raise AnalyticsError(f"job {self.job_id} failed: {t.failure}")
        final = {g["group_id"]: g["msr"] for g in t.summary.as_dict()["groups"]}
        if live is not None:
            return dataclasses.replace(live.result(t.received, jct_s=t.summary.jct_s, msr=final), looks=live.looks)
        return self.estimate(t.received, jct_s=t.summary.jct_s, msr=final)

    def send(self, dest: str, *, msr: Mapping[int, float] | float | None = None, config: AtpConfig = AtpConfig(),
             adapt: bool = True, on_sent: Callable[[], None] | None = None, **kw) -> Result:
        """The job over UDP to the ATP receiver at ``dest`` (``hostlib.api.send_job``; ``kw``: its ``timeout``,
        ``timeline``, ``report_to``, ``bind``), starting at ``msr`` (by default :meth:`initial_msr`). ``adapt``: the
        MSR follows the running estimate of the rows the receiver acknowledged and the job ends as soon as every
        bound holds, as :meth:`run` does over the simulated link (:class:`_LiveMsr`, ``AtpSender.set_msr`` on the
        live job). ``on_sent()`` is called the moment the ATP job ended, before the answers are computed. The answers, from the rows the receiver acknowledged (with ``adapt``: those of the look that
        stopped the job), and the sender's summary as ``Result.summary``."""
        from netapprox.hostlib import api, events
        spec = self.job_spec(msr)
        live = self.live_msr(spec) if adapt else None
        acked: dict[int, bytes] = {}
        clock = time.monotonic
        t0 = clock()
        ph = {"first_ack_s": None, "estimate_cpu_s": 0.0, "steps": 0, "look_s": [], "stop_s": None, "retries": 0,
              "start_wall": time.time()}

        def on_event(ev) -> None:
            if isinstance(ev, events.MessageAcked):
                if ph["first_ack_s"] is None:
                    ph["first_ack_s"] = clock() - t0
                acked[ev.msg_id] = spec.messages[ev.msg_id].data

        def step(now: float, sender) -> None:
            ph["retries"] = sender.retries_received
            if live is None:
                return
            looks, c = live.looks, clock()
            live.step(now, sender, acked)
            ph["estimate_cpu_s"] += clock() - c
            ph["steps"] += 1
            if live.looks != looks:
                ph["look_s"].append(c - t0)
            if live.stopped_at is not None and ph["stop_s"] is None:
                ph["stop_s"] = c - t0

        summary = api.send_job(dest, spec, config=self.config(config), on_event=on_event, on_step=step, **kw)
        if on_sent is not None:
            on_sent()
        final = {g["group_id"]: g["msr"] for g in summary.as_dict()["groups"]}
        end = {"jct_s": summary.jct_s, "msr": final}
        res = live.result(acked, **end) if live is not None else self.estimate(acked, **end)
        sample = live.stopped_at if live is not None and live.stopped_at is not None else acked
        ph.update(jct_s=summary.jct_s, closed_s=summary.closed_s, packets_sent=summary.packets_sent,
                  packets_lost=summary.packets_lost)
        return dataclasses.replace(res, summary=summary, looks=live.looks if live is not None else 0,
                                   sample_ids=tuple(sorted(sample)), phases=ph)

    def save(self, path) -> None:
        """Write the job (its rows, queries, seed, id) to ``path``, for a sender in another process
        (:meth:`load` rebuilds the same job: the same order and strata)."""
        import json
        head = {"job_id": self.job_id, "seed": self._seed, "max_payload": self._max_payload,
                "queries": [dataclasses.asdict(q) for q in self.queries]}
        with open(path, "wb") as f:
            f.write(json.dumps(head).encode() + b"\n")
            for data in self._payload:
                f.write(struct.pack("!I", len(data)) + data)

    @classmethod
    def load(cls, path) -> "AnalyticsJob":
        """The job :meth:`save` wrote; a file that is not one is an :class:`AnalyticsError`."""
        import json
        try:
            blob = open(path, "rb").read()
            line, _, body = blob.partition(b"\n")
            head = json.loads(line)
            rows, at = [], 0
            while at < len(body):
                (n,) = struct.unpack_from("!I", body, at)
                rows.append(Row.decode(body[at + 4:at + 4 + n]))
                at += 4 + n
            queries = [Query(**{**q, "group_e_max": tuple(map(tuple, q["group_e_max"]))}) for q in head["queries"]]
            return cls(rows, queries, job_id=head["job_id"], seed=head["seed"], max_payload=head["max_payload"])
        except (OSError, ValueError, KeyError, TypeError, struct.error) as err:
            raise AnalyticsError(f"{path}: not an analytics job file ({err})") from None

    def live_msr(self, spec: JobSpec) -> "_LiveMsr":
        """What adjusts the MSR of ``spec``'s sender while it runs: call ``.step(now, sender, received)`` after each
        step of the sender (``link.run``'s ``on_step``; docs/analytics.md, How the MSR follows the bound)."""
        return _LiveMsr(self, spec)

    # --- estimates ------------------------------------------------------------------------------------------

    def _samples(self, received: Mapping[int, bytes]) -> dict[int, list[Row]]:
        """The rows that arrived by ATP group."""
        out: dict[int, list[Row]] = {}
        self._add_samples(out, received.items())
        return out

    def _add_samples(self, out: dict[int, list[Row]], items: Iterable[tuple[int, bytes]]) -> None:
        for msg_id, data in items:
            if not 0 <= msg_id < len(self.order):
                raise AnalyticsError(f"message id {msg_id} is not one of this job's {len(self.order)}")
            i = self.order[msg_id]
            # the job's own bytes (a sender's acknowledged rows, or a receiver's intact copy) are its own row
            row = self.rows[i] if data is self._payload[i] or data == self._payload[i] else Row.decode(data)
            out.setdefault(self._stratum_of[i], []).append(row)

    def _post_strata(self, members: list[StratumPlan], samples: dict[int, list[Row]]
                     ) -> list[tuple[int, list[Row]]]:
        """(population, sampled rows) of the estimation strata over ``members``: the ATP groups, one per packet
        count (a message of more packets is lost more often: docs/analytics.md). Should a stratum hold fewer than
        two sampled rows (and not all of its rows; its MSR guarantees two unless the sample is read before the job
        ended), it is merged into its neighbour."""
        out: list[tuple[int, list[Row]]] = []
        for g in sorted({s.group for s in members}):
            cells: list[list] = []  # [population, rows], by packet count
            for s in (m for m in members if m.group == g):
                rows = list(samples.get(s.atp_group, ()))
                if cells and _thin(cells[-1]):
                    cells[-1][0] += len(s.rows)
                    cells[-1][1] += rows
                else:
                    cells.append([len(s.rows), rows])
            while len(cells) > 1 and _thin(cells[-1]):
                last = cells.pop()
                cells[-1][0] += last[0]
                cells[-1][1] += last[1]
            out.extend((big_n, rows) for big_n, rows in cells)
        return out

    def _post_moments(self, members: list[StratumPlan], moments: Mapping[int, tuple[int, float, float]]
                      ) -> list[estimators.Moments]:
        """:meth:`_post_strata`'s strata as moments: the same merging of a stratum with fewer than two sampled rows
        (and not all of its rows) into its neighbour."""
        out: list[estimators.Moments] = []
        for g in sorted({s.group for s in members}):
            cells: list[list] = []  # [population, n, sum, sum of squares], by packet count
            for s in (m for m in members if m.group == g):
                n, t, t2 = moments.get(s.atp_group, (0, 0.0, 0.0))
                if cells and _thin_moments(cells[-1]):
                    c = cells[-1]
                    c[0] += len(s.rows)
                    c[1] += n
                    c[2] += t
                    c[3] += t2
                else:
                    cells.append([len(s.rows), n, t, t2])
            while len(cells) > 1 and _thin_moments(cells[-1]):
                last = cells.pop()
                cells[-1] = [a + b for a, b in zip(cells[-1], last)]
            out.extend(estimators.Moments(*c) for c in cells)
        return out

    def estimate(self, received: Mapping[int, bytes], *, jct_s: float | None = None,
                 msr: Mapping[int, float] | None = None, looks: int = 1,
                 samples: dict[int, list[Row]] | None = None) -> Result:
        """Every query's answers (overall and per group) from the messages that arrived. ``looks``: the answer is
        read at one of at most this many looks whose outcome decides when the job stops (:class:`_LiveMsr`); each
        bound is then the interval at ``1 - (1 - confidence) / looks`` (Bonferroni over the looks), so it covers
        the truth at ``confidence`` whichever look stopped the job. ``samples`` as :meth:`needed_msr`'s."""
        samples = self._samples(received) if samples is None else samples
        answers = []
        for q in self.queries:
            for g, e in q.bounds(self.groups):
                members = [s for s in self.strata if g is None or s.group == g]
                try:
                    est = self._estimate(q, members, samples, looks)
                    answers.append(Answer(q, g, e, est))
                except AnalyticsError as err:
                    answers.append(Answer(q, g, e, None, str(err)))
        return Result(tuple(answers), len(received), len(self.rows), jct_s, tuple(sorted((msr or {}).items())))

    def _estimate(self, q: Query, members: list[StratumPlan], samples: dict[int, list[Row]], looks: int = 1
                  ) -> Estimate | RankEstimate:
        level = 1.0 - (1.0 - q.confidence) / looks
        if q.aggregate == "rank":
            cells = self._post_strata(members, samples)
            est = estimators.rank([(big_n, [r.key for r in rows]) for big_n, rows in cells], q.k, level)
            return dataclasses.replace(est, confidence=q.confidence)
        (values,) = self._value_sets(q, members, samples)
        fn = {"avg": estimators.avg, "sum": estimators.total, "count": estimators.count}[q.aggregate]
        return dataclasses.replace(fn(values, level, q.name), confidence=q.confidence)

    def sample_strata(self, q: Query, received: Mapping[int, bytes]) -> list[Stratum]:
        """The strata (population, sampled values) over all rows that ``q``'s overall Avg/Sum/Count is estimated
        from: what a next job of the same data plans its MSR with (:mod:`netapprox.analytics.stream`)."""
        if q.aggregate == "rank":
            raise AnalyticsError("sample_strata: avg, sum or count (rank has one set per key)")
        (values,) = self._value_sets(q, list(self.strata), self._samples(received))
        return values

    def truth(self, q: Query, group: int | None = None) -> float | dict[int, float]:
        """The exact answer over all rows (tests and the evaluation compare with it)."""
        return truth_of(self.rows, q, group)

    def post_strata(self, group: int | None, received: Mapping[int, bytes]) -> list[tuple[int, list[Row]]]:
        """(population, sampled rows) of the strata a bound over ``group`` (``None``: all rows) is estimated from,
        given the messages that arrived (:mod:`netapprox.analytics.sources` adds up several jobs' strata)."""
        members = [s for s in self.strata if group is None or s.group == group]
        return self._post_strata(members, self._samples(received)) if members else []


def truth_of(rows: Sequence[Row], q: Query, group: int | None = None) -> float | dict[int, float]:
    """The exact answer of ``q`` over ``rows`` (of ``group``, or all)."""
    rows = [r for r in rows if group is None or r.group == group]
    if q.aggregate == "avg":
        return math.fsum(r.value for r in rows) / len(rows)
    if q.aggregate == "sum":
        return math.fsum(r.value for r in rows)
    if q.aggregate == "count":
        return float(sum(1 for r in rows if r.value > q.above))
    freq: dict[int, float] = {}
    for r in rows:
        freq[r.key] = freq.get(r.key, 0.0) + 1.0
    return freq


def _size_classes(rows: list[int], sizes: list[int]) -> list[list[int]]:
    """``rows`` (one group, one packet count) split by their bytes into classes of at least ``SIZE_CLASS_ROWS``
    rows (at most ``MAX_SIZE_CLASSES``), smallest first, rows of equal size never split."""
    n = min(MAX_SIZE_CLASSES, len(rows) // SIZE_CLASS_ROWS)
    if n <= 1:
        return [list(rows)]
    ordered = sorted(range(len(rows)), key=lambda j: sizes[j])
    out: list[list[int]] = [[]]
    for rank, j in enumerate(ordered):
        if (len(out[-1]) >= len(rows) / n and len(out) < n and sizes[j] != sizes[ordered[rank - 1]]):
            out.append([])
        out[-1].append(rows[j])
    return out


def _thin_moments(cell: list) -> bool:
    big_n, n = cell[0], cell[1]
    return n < estimators.MIN_SAMPLE_PER_STRATUM and n < big_n


def _thin(cell: list) -> bool:
    big_n, rows = cell
    return len(rows) < estimators.MIN_SAMPLE_PER_STRATUM and len(rows) < big_n


class _LiveMsr:
    """The MSR at run time (docs/analytics.md, How the MSR follows the bound). Every ``CHECK_FRACTION`` of the rows
    that arrive, it sets each group's MSR to what the running sample says its bounds need
    (``AnalyticsJob.needed_msr``), but never below what it has delivered plus two checks' worth of its rows while it
    may still stop the job itself: ATP then does not complete the job before a look has seen the bounds hold (over
    UDP, one batch of acknowledgements can carry a group past that floor between two checks: the job then ends at
    ATP's completion, its answer read at the looks' level from every acknowledged row).

    Stopping when the bounds hold is a sequential test: a job that looks at its running interval after every
    check and stops at the first that is narrow enough stops more often where the running variance happens to be
    low, and its interval misses more often than its confidence says. So the job looks at most ``LOOKS`` times
    (a look: a check at which every group has delivered what its bounds need), reads every bound at the
    Bonferroni level ``1 - (1 - c) / LOOKS`` at each, and stops at the first look at which they all hold; its
    answer is the sample of that look (rows still in flight then are left out: they could widen a bound past
    ``e_max``). After ``LOOKS - 1`` looks that did not stop it, the last look is the job's end: the MSR follows the
    need and ATP completes the job. Whichever look the job ends at, its bounds cover at ``c`` (union bound over
    the at most ``LOOKS`` looks). Strata sent whole keep MSR 1."""

    CHECK_FRACTION = 0.02
    STEP = 0.01
    """A lower MSR this close to the current one is left alone (a higher one is always set)."""
    LOOKS = LIVE_LOOKS

    def __init__(self, job: AnalyticsJob, spec: JobSpec) -> None:
        self.job = job
        self.msr = {g: spec.msr_of(g) for g in spec.group_sizes()}
        self.every = max(1, int(self.CHECK_FRACTION * len(job.rows)))
        self.checked = 0
        self.changes = 0
        self.looks = 0
        self.stopped_at: dict[int, bytes] | None = None
        """The sample of the look that stopped the job (``None``: ATP ended it, or it has not ended)."""
        self._rows: dict[int, list[Row]] = {}
        self._moments: dict[int, list] = {}
        """Per ATP group: [count, sum, sum of squares] of the values of ``_rows``."""
        self._seen = 0
        self._of: int | None = None

    def _samples(self, received: Mapping[int, bytes]) -> dict[int, list[Row]]:
        """``received``'s rows by ATP group, kept between checks: a running job's received rows only grow (new
        entries at the end of the mapping), so each check looks up only the rows new since the one before (one
        look-up of every row at every check took 20-50 ms of a 17,000-row job's sender loop, 0.35-0.6 s in all,
        measured on the testbed). Another mapping, or a smaller one, is read whole."""
        if id(received) != self._of or len(received) < self._seen:
            self._rows, self._moments, self._seen, self._of = {}, {}, 0, id(received)
        new: dict[int, list[Row]] = {}
        self.job._add_samples(new, itertools.islice(received.items(), self._seen, None))
        for g, rows in new.items():
            self._rows.setdefault(g, []).extend(rows)
            m = self._moments.setdefault(g, [0, 0.0, 0.0])
            m[0] += len(rows)
            m[1] += math.fsum(r.value for r in rows)
            m[2] += math.fsum(r.value * r.value for r in rows)
        self._seen = len(received)
        return self._rows

    def step(self, now: float, sender, received: Mapping[int, bytes]) -> None:
        if len(received) - self.checked < self.every or sender.state.value != "sending" or self.stopped_at:
            return
        self.checked = len(received)
        samples = self._samples(received)
        need = self.job.needed_msr(received, looks=self.LOOKS, samples=samples,
                                   moments={g: tuple(m) for g, m in self._moments.items()})
        early = self.looks < self.LOOKS - 1
        if early and need is not None and all(
                s.whole or sender.delivered(s.atp_group) >= need[s.atp_group] * len(s.rows) for s in self.job.strata):
            self.looks += 1
            if self.job.estimate(received, looks=self.LOOKS, samples=samples).all_met:
                self.stopped_at = dict(received)
                for s in self.job.strata:
                    if not s.whole:
                        self._set(sender, s.atp_group, sender.delivered(s.atp_group) / len(s.rows), now)
                return
            early = self.looks < self.LOOKS - 1
        for s in self.job.strata:
            if s.whole:
                continue
            n = len(s.rows)
            ahead = max(2, math.ceil(2 * self.CHECK_FRACTION * n))
            floor = min(1.0, (sender.delivered(s.atp_group) + ahead) / n) if early else 0.0
            want = max(floor, accuracy.MIN_MSR) if need is None else max(need[s.atp_group], floor)
            if need is None and not early:
                continue
            want = s.msr(want)
            current = self.msr[s.atp_group]
            if want > current or current - want >= self.STEP:
                self._set(sender, s.atp_group, want, now)

    def result(self, received: Mapping[int, bytes], **kw) -> Result:
        """The job's answers: from the sample of the look that stopped it, else from everything that arrived (the
        last look), at the looks' level."""
        return self.job.estimate(self.stopped_at if self.stopped_at is not None else received, looks=self.LOOKS,
                                 **kw)

    def _set(self, sender, group: int, msr: float, now: float) -> None:
        msr = min(msr, 0.999)
        if sender.state.value == "sending" and msr != self.msr[group]:
            sender.set_msr(group, msr, now)
            self.msr[group] = msr
            self.changes += 1
