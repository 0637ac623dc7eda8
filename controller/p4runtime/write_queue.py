"""``WriteQueue``: every Write to one switch, and the flow-controlled queue of ``queue_by_job`` updates.

Two paths, one bookkeeping:

- **Whole state** (``write(full=True)``: the first apply, a static change, every reconnect): each control's
  desired entries are diffed against its installed copy (``mirror.pending_changes``) and sent with the waiting
  ``queue_by_job`` updates, synchronously: one Write when everything fits (deletes, modifies, inserts in that
  order within it), otherwise the deletes complete before the rest.
- **An epoch's job moves** (``apply_jobs``): only the ``queue_by_job`` entries that changed are compared with
  what is installed and sent without waiting for the switch, at most ``max_inflight_writes`` Writes
  outstanding; what does not fit waits in the order it was asked for (a dict as an ordered set: a job changed
  again keeps its place) and goes out at its newest value once the switch has answered (``send``), within the
  ``max_updates_per_s`` budget, jobs whose loss exceeds their TLR first when not everything fits.

Each Write's result is recorded as it comes back (``settle``): what the switch took is committed to the
controls' installed copies (queue_by_job through ``Classification``'s job methods); what the next write
repairs is healed (ALREADY_EXISTS, NOT_FOUND); any other refusal is reported once and held back until the
wanted entry changes (``refused``). ``queue_by_job`` is capped at the table size (the P4Info's, or the lower one
where the switch said RESOURCE_EXHAUSTED): jobs beyond it get no entry, are classified by the TLR their packets
carry, and wait for room (``jobs_without_entry``, one log line when the table fills up and one when it has room
again). A controller that has just started adopts the jobs it finds on the switch for ``adopt_jobs_s``.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Any, Sequence

from netapprox.controller.p4runtime.protos import p4runtime_pb2

from netapprox.controller.errors import P4RuntimeWriteError, UpdateError
from netapprox.controller.model import JobRule, SwitchState, TableUpdates, WriteSummary
from netapprox.controller.p4runtime.classification import Classification
from netapprox.controller.p4runtime.mirror import (
    ENTRY_CACHE_SIZE,
    UPDATE_ORDER,
    Change,
    Control,
    batches,
    pending_changes,
)
from netapprox.controller.p4runtime.options import P4RuntimeOptions
from netapprox.controller.p4runtime.session import P4RuntimeSession

try:
    from netapprox.controller.p4runtime import _jobwrites as _native
except ImportError:  # not built (no compiler at install time): the Python loops of WriteQueue
    _native = None

log = logging.getLogger("netapprox.controller.p4runtime")

NATIVE = _native is not None
"""True when the C loops over queue_by_job (controller/p4runtime/_jobwrites.c) are built: ``WriteQueue`` runs
them (``WriteQueue.native``)."""

INSERT, MODIFY, DELETE = p4runtime_pb2.Update.INSERT, p4runtime_pb2.Update.MODIFY, p4runtime_pb2.Update.DELETE
_KINDS = (INSERT, MODIFY, DELETE)  # _jobwrites.c's order
_UNSET = object()
HEALABLE = frozenset({"ALREADY_EXISTS", "NOT_FOUND"})
"""Update errors the next write repairs (MODIFY instead of INSERT, INSERT instead of MODIFY). Every other code
is held back until the wanted entry changes (reported once, never retried as it was)."""


def _summary(changes: Sequence[Change]) -> WriteSummary:
    kinds = collections.Counter(c.kind for c in changes)
    return WriteSummary(inserted=kinds[INSERT], modified=kinds[MODIFY], deleted=kinds[DELETE])


class WriteQueue:
    """The Writes of one switch through its session and its controls (see the module docstring)."""

    def __init__(self, name: str, options: P4RuntimeOptions, session: P4RuntimeSession,
                 controls: Sequence[Control], classification: Classification) -> None:
        self.name = name
        self.options = options
        self.session = session
        self.controls = tuple(controls)
        self.classification = classification
        self._jobs_table = classification.queue_by_job
        self.static: SwitchState | None = None
        """The last asked state without queue_by_job (None: nothing asked yet) ..."""
        self._jobs: dict[int, int] = {}  # ... and its queue_by_job entries
        # Jobs whose entry may differ from what is installed, oldest first (a dict as an ordered set: a job
        # changed again keeps its place in line and goes out at its newest value).
        self._dirty: dict[int, None] = {}
        self._urgent: set[int] = set()  # jobs whose loss exceeds their TLR: written first
        self.inflight: collections.deque = collections.deque()
        """Writes sent and not answered yet: (future, changes, serialized batch), oldest first."""
        self._inflight_jobs: set[int] = set()
        self._inflight_inserts = 0  # queue_by_job INSERTs sent and not answered yet
        self._encoded: dict[int, tuple[JobRule | None, bytes]] = {}  # job*32 + kind*8 + qid -> (rule, Update bytes)
        self.tokens = 0.0
        """The ``max_updates_per_s`` budget built up (updates that may go out now)."""
        self._token_stamp = time.monotonic()
        self.deferred_updates = 0
        """queue_by_job updates waiting for the switch (write budget, or Writes in flight); they go out at their
        newest value."""
        self.deferred_urgent = 0
        """... of which for jobs whose loss exceeds their TLR."""
        self.write_stats = {"prioritised": 0, "coalesced": 0}
        """Cumulative: ``prioritised``: updates of losing jobs sent ahead of older waiting updates when the
        switch could not take everything; ``coalesced``: updates superseded before they were sent (never sent)."""
        self._refused: dict[tuple[str, Any], Any] = {}  # (table, key) -> the rule the switch refused
        self._job_capacity: int | None = classification.job_table_size
        self._no_room: dict[int, None] = {}  # jobs waiting for room in queue_by_job, oldest first
        self._adopted: set[int] = set()  # jobs found on the switch by a fresh controller, kept for a while
        self._adopted_until = 0.0
        self.native = NATIVE
        """queue_by_job's two hot loops in C (``NATIVE``); False: the Python loops (the differential test)."""

    @property
    def entries_refused(self) -> int:
        return len(self._refused)

    @property
    def jobs_without_entry(self) -> int:
        return len(self._no_room)

    # --- a new session ---

    def new_session(self) -> None:
        """Forget the Writes of the old session (the reconcile that follows covers their entries); a new
        session tries a refused entry once more."""
        self.inflight.clear()
        self._inflight_jobs.clear()
        self._inflight_inserts = 0
        self._refused.clear()

    def forget(self) -> None:
        """Forget what was asked and sent (another controller writes to the switch now): a later term as primary
        starts from what the switch holds, as a controller that has just started does."""
        self.new_session()
        self.static = None
        self._jobs.clear()
        self._dirty.clear()
        self._urgent.clear()
        self._no_room.clear()
        self._adopted.clear()
        self.deferred_updates = self.deferred_urgent = 0

    def adopt_jobs(self, entries: list[p4runtime_pb2.TableEntry]) -> None:
        """queue_by_job entries read back (none after a pipeline push). A controller that has no state yet
        (just started) keeps the jobs it finds for ``adopt_jobs_s``, so their packets keep their queue and their
        counters until their hosts report to it."""
        self.classification.adopt_jobs(entries, self.name)
        installed = self.classification.installed_jobs()
        if self.static is None and installed:
            self._adopted = set(installed)
            self._adopted_until = time.monotonic() + self.options.adopt_jobs_s
        else:
            self._adopted = set()

    def release_adopted(self) -> None:
        """After ``adopt_jobs_s``, adopted jobs nobody reported are deleted like any expired job."""
        if self._adopted and time.monotonic() >= self._adopted_until:
            for job in sorted(self._adopted):
                if job not in self._jobs:
                    self._dirty[job] = None
            self._adopted.clear()

    def rewrite(self) -> None:
        """After a (re)connect: the last asked state, whole, against what the switch holds (nothing before the
        first apply). Raises P4RuntimeWriteError for what the switch refused (held back, not retried)."""
        if self.static is not None:
            self._dirty = dict.fromkeys(sorted(set(self._jobs) | set(self.classification.installed_jobs())))
            self.write(full=True)

    # --- what is asked ---

    def set_desired(self, state: SwitchState) -> None:
        """The whole desired state of the switch (its queue_by_job entries become wanted and dirty)."""
        self.static = dataclasses.replace(state, job_rules=frozenset())
        self._jobs = {r.job_id: r.qid for r in state.job_rules}
        self._adopted -= set(self._jobs)
        self._no_room = {job: None for job in self._no_room if job in self._jobs}
        self._dirty = dict.fromkeys(sorted((set(self._jobs) - set(self._no_room))
                                           | set(self.classification.installed_jobs())))

    def urge(self, jobs: frozenset[int]) -> None:
        """Jobs whose loss exceeds their TLR: their updates go first when not everything fits."""
        self._urgent |= jobs

    def _take(self, updates: TableUpdates) -> None:
        """Record the epoch's queue_by_job changes as wanted and dirty (a job already waiting keeps its place)."""
        jobs, dirty = self._jobs, self._dirty
        coalesced = 0
        no_room, adopted = self._no_room, self._adopted
        for job, qid in updates.jobs.items():
            if qid is None:
                jobs.pop(job, None)
                if no_room:
                    no_room.pop(job, None)
            else:
                jobs[job] = qid
                if adopted:
                    adopted.discard(job)
            if job in dirty:
                coalesced += 1
            else:
                dirty[job] = None
        self.write_stats["coalesced"] += coalesced
        self._urgent |= updates.urgent

    # --- the asynchronous path: an epoch's job moves ---

    def apply_jobs(self, updates: TableUpdates) -> WriteSummary:
        """Take an epoch's queue_by_job changes and send what the in-flight window and the budget allow, without
        waiting for the switch. Results of earlier Writes are recorded here; their errors are raised here."""
        self._take(updates)
        return self.send()

    def pending(self) -> bool:
        """Updates wait for room in the in-flight window (``send`` sends them once Writes complete)."""
        return bool(self._dirty) and bool(self.inflight)

    def send(self) -> WriteSummary:
        """Record the Writes the switch has answered and send waiting updates into the room they leave. Raises
        the answered Writes' errors (P4RuntimeWriteError)."""
        errors = self.settle(block=False)
        summary = self._send_job_changes() if self._dirty else WriteSummary()
        if errors:
            raise P4RuntimeWriteError(self.name, errors, len(errors))
        return summary

    def flush(self) -> None:
        """Wait for every Write in flight and record its result (raises its errors)."""
        errors = self.settle(block=True)
        if errors:
            raise P4RuntimeWriteError(self.name, errors, len(errors))

    def _send_job_changes(self) -> WriteSummary:
        opts = self.options
        room = max(0, opts.max_inflight_writes - len(self.inflight))
        if room == 0:
            self.deferred_updates = len(self._dirty)
            self.deferred_urgent = len(self._urgent & self._dirty.keys())
            return WriteSummary()
        changes = self._job_changes(limit=room * opts.max_batch_updates)
        if not changes:
            return WriteSummary()
        updates = [c.payload for c in changes]  # queue_by_job changes are encoded directly
        dirty, inflight_jobs = self._dirty, self._inflight_jobs
        for part in batches([len(u) for u in updates], opts.max_batch_updates, opts.max_write_bytes)[:room]:
            batch = [updates[i] for i in part]
            sent = [changes[i] for i in part]
            self.inflight.append((self.session.write_future(batch), sent, batch))
            for change in sent:
                dirty.pop(change.key, None)
                inflight_jobs.add(change.key)
                self._inflight_inserts += change.kind == INSERT
        return _summary(changes)

    def _job_changes(self, limit: int | None = None) -> list[Change]:
        """queue_by_job updates for the dirty jobs (not in flight) within the write budget and ``limit``: in the
        order they became dirty, except that when not all fit, the urgent ones (loss above TLR) go first."""
        opts = self.options
        dirty, jobs, inflight = self._dirty, self._jobs, self._inflight_jobs
        budget = len(dirty) if limit is None else min(limit, len(dirty))
        if opts.max_updates_per_s > 0:
            now = time.monotonic()
            self.tokens = min(opts.max_updates_per_s, self.tokens + (now - self._token_stamp) * opts.max_updates_per_s)
            self._token_stamp = now
            budget = min(budget, int(self.tokens))
        urgent = self._urgent
        if budget >= len(dirty) - len(inflight) or not urgent:
            order = list(dirty)
        else:
            first = [job for job in dirty if job in urgent]
            order = first + [job for job in dirty if job not in urgent]
            self.write_stats["prioritised"] += min(budget, len(first))
        if self.native and not self._refused:  # _job_changes_of's loop in C (controller/p4runtime/_jobwrites.c)
            room = (self._job_capacity, len(self.classification.installed_jobs()) + self._inflight_inserts)
            changes = _native.job_changes(order, dirty, jobs, self.classification.job_entries, inflight, self._adopted,
                                          self._encoded, budget, room, self._no_room_add, self._encode_job, Change,
                                          self._jobs_table, _KINDS)
        else:
            changes = self._job_changes_of(order, budget)
        if opts.max_updates_per_s > 0:
            self.tokens -= len(changes)
        self.deferred_updates = len(dirty) - len(changes)
        self.deferred_urgent = (len(urgent & dirty.keys()) - sum(1 for c in changes if c.key in urgent)
                                if urgent and self.deferred_updates else 0)
        return changes

    def _job_changes_of(self, order: list[int], budget: int) -> list[Change]:
        """``_job_changes``' loop: at most ``budget`` changes for the dirty jobs in ``order``; jobs whose entry is
        already what is wanted (or refused as it is) leave the dirty set, jobs without room wait for it."""
        table = self._jobs_table
        installed_job = self.classification.installed_job
        dirty, jobs, inflight, encoded = self._dirty, self._jobs, self._inflight_jobs, self._encoded
        refused, adopted, inserts = self._refused, self._adopted, 0
        changes: list[Change] = []
        for job in order:
            if job in inflight:
                continue  # sent at its newest value once the switch has answered the earlier Write
            want = jobs.get(job)
            have = installed_job(job)
            if have is not None and want is not None and have[0] is not None and have[0].qid == want:
                del dirty[job]
                continue
            if len(changes) >= budget:
                break
            if refused and refused.get((table.name, job), _UNSET) == want:
                del dirty[job]  # refused as it is; sent again once it changes
                continue
            if want is None:
                if have is None or job in adopted:  # adopted: kept until adopt_jobs_s is over
                    del dirty[job]
                    continue
                kind, want = DELETE, 0
            else:
                if have is None:
                    if not self._room_for_insert(inserts):
                        self._no_room_add(job)
                        continue
                    inserts += 1
                kind = INSERT if have is None else MODIFY
            hit = encoded.get(job * 32 + kind * 8 + want)
            if hit is None:
                hit = self._encode_job(kind, job, want)
            changes.append(Change(kind, table, job, have[0] if kind == DELETE else hit[0], None, hit[1]))
        return changes

    def _encode_job(self, kind: int, job: int, qid: int) -> tuple[JobRule | None, bytes]:
        """(rule, serialized Update) of a queue_by_job change, cached (a job moving between queues costs one
        encoding per queue, not one per move)."""
        encoded = self._encoded
        if len(encoded) >= ENTRY_CACHE_SIZE:
            encoded.clear()
        hit = encoded[job * 32 + kind * 8 + qid] = (None if kind == DELETE else JobRule(job, qid),
                                                    self.classification.job_update(kind, job, qid))
        return hit

    # --- the synchronous path: the whole state ---

    def write(self, full: bool) -> WriteSummary:
        """Write synchronously: the static tables (``full``) and the dirty jobs, after every Write in flight."""
        errors = self.settle(block=True)
        changes = pending_changes(self.controls, self.static, skip=frozenset({self._jobs_table})) if full else []
        if self._refused:
            changes = [c for c in changes if not self._is_refused(c)]
        changes += self._job_changes()
        if not changes:
            if errors:
                raise P4RuntimeWriteError(self.name, errors, len(errors))
            return WriteSummary()
        table_order = {t: i for i, t in enumerate(t for c in self.controls for t in c.tables)}
        changes.sort(key=lambda c: (UPDATE_ORDER[c.kind], table_order[c.table]))
        updates = [c.serialized() for c in changes]
        sizes = [len(u) for u in updates]
        opts = self.options
        for change in changes:
            if change.table is self._jobs_table:
                self._dirty.pop(change.key, None)
        # One Write when everything fits (deletes, modifies, inserts in that order within it); otherwise the
        # deletes complete first, so that no insert races the delete of an overlapping entry in another Write.
        if len(batches(sizes, opts.max_batch_updates, opts.max_write_bytes)) == 1:
            groups = [list(range(len(changes)))]
        else:
            split = next((i for i, c in enumerate(changes) if c.kind != DELETE), len(changes))
            groups = [list(range(0, split)), list(range(split, len(changes)))]
        for group in groups:
            parts = [[group[i] for i in part]
                     for part in batches([sizes[i] for i in group], opts.max_batch_updates, opts.max_write_bytes)]
            results = self.session.write_pipelined([[updates[i] for i in part] for part in parts],
                                                   opts.max_inflight_writes)
            for part, result in zip(parts, results):
                for err in self._record([changes[i] for i in part], result):
                    errors.append(UpdateError(part[err.index], err.code, err.message, err.update))
        if errors:
            raise P4RuntimeWriteError(self.name, errors, len(changes))
        return _summary(changes)

    # --- results ---

    def settle(self, block: bool) -> list[UpdateError]:
        """Record the results of Writes in flight, oldest first: all of them (``block``) or those done."""
        errors: list[UpdateError] = []
        while self.inflight and (block or self.inflight[0][0].done()):
            future, changes, batch = self.inflight.popleft()
            self._inflight_inserts -= sum(c.kind == INSERT for c in changes)
            errors += self._record(changes, self.session.write_result(future, batch))
        return errors

    def _record(self, changes: list[Change], result: P4RuntimeWriteError | None) -> list[UpdateError]:
        """Commit what the switch took; heal what the next write can repair (ALREADY_EXISTS, NOT_FOUND); hold
        back the rest (``_refuse``). A job whose entry is not (or no longer) what is wanted goes back to the
        dirty set, unless the switch refused it."""
        if result is None:
            self._record_accepted(changes)
            return []
        failed = {e.index: e for e in result.errors}
        errors = []
        jobs = self._jobs_table
        for position, change in enumerate(changes):
            err = failed.get(position, failed.get(-1))
            if err is None:
                change.commit()
                if self._refused:
                    self._refused.pop((change.table.name, change.key), None)
                if change.table is jobs:
                    self._urgent.discard(change.key)
                    if change.kind == DELETE and self._no_room:
                        self._make_room()
            else:
                if err.code in HEALABLE:
                    if -1 not in failed:
                        change.heal(err.code)
                else:
                    self._refuse(change, err.code)
                errors.append(UpdateError(position, err.code, err.message, err.update))
            if change.table is jobs:
                self._inflight_jobs.discard(change.key)
                installed = self.classification.installed_job(change.key)
                want = self._jobs.get(change.key)
                if err is not None and err.code not in HEALABLE:
                    continue
                if err is not None or (installed[0].qid if installed and installed[0] else None) != want:
                    self._dirty[change.key] = None
        return errors

    def _record_accepted(self, changes: list[Change]) -> None:
        """``_record`` of a Write the switch took whole (the hot path)."""
        jobs_table, commit_job = self._jobs_table, self.classification.commit_job
        want, dirty, urgent, inflight = self._jobs, self._dirty, self._urgent, self._inflight_jobs
        if self.native:  # the loop below in C (controller/p4runtime/_jobwrites.c)
            _native.record_accepted(changes, jobs_table, self.classification.job_entries, want, dirty, urgent,
                                    inflight, self._no_room, self._make_room, _KINDS)
        else:
            for change in changes:
                if change.table is not jobs_table:
                    change.commit()
                    continue
                job = change.key
                if change.kind == DELETE:
                    commit_job(job, None, None)
                    have = None
                    if self._no_room:
                        self._make_room()
                else:
                    commit_job(job, change.rule, change.entry)
                    have = change.rule.qid
                urgent.discard(job)
                inflight.discard(job)
                if want.get(job) != have and job not in dirty:
                    dirty[job] = None  # changed again while in flight: its newest value goes next
        if self._refused:
            for change in changes:
                self._refused.pop((change.table.name, change.key), None)

    # --- persistent write errors: refused entries, a full queue_by_job ---

    @staticmethod
    def _refused_value(change: Change) -> Any:
        """What was asked of a key: the queue of a job entry (None: deleted), or a rule (``"delete"``)."""
        if change.kind == DELETE:
            return None if isinstance(change.key, int) else "delete"
        return change.rule.qid if isinstance(change.rule, JobRule) else change.rule

    def _refuse(self, change: Change, code: str) -> None:
        """The switch refused ``change`` with a code no retry repairs: keep it from being sent again until what is
        wanted of its key changes (or the switch reconnects). A queue_by_job INSERT refused with
        RESOURCE_EXHAUSTED caps the table where it is instead."""
        if code == "RESOURCE_EXHAUSTED" and change.table is self._jobs_table and change.kind == INSERT:
            have = len(self.classification.installed_jobs())
            if self._job_capacity is None or have < self._job_capacity:
                log.warning("switch %r: queue_by_job refused an insert with RESOURCE_EXHAUSTED at %d entries (the "
                            "P4Info says %s): capping it there", self.name, have,
                            self.classification.job_table_size or "nothing")
                self._job_capacity = have
            self._no_room_add(change.key)
            return
        self._refused[(change.table.name, change.key)] = self._refused_value(change)

    def _is_refused(self, change: Change) -> bool:
        return self._refused.get((change.table.name, change.key), _UNSET) == self._refused_value(change)

    def _room_for_insert(self, planned: int) -> bool:
        """Room in queue_by_job for one more entry, with ``planned`` inserts already in this batch."""
        cap = self._job_capacity
        return cap is None or len(self.classification.installed_jobs()) + self._inflight_inserts + planned < cap

    def _no_room_add(self, job: int) -> None:
        if not self._no_room:
            log.warning("switch %r: queue_by_job is full (%d entries): jobs beyond it get no entry and are classified "
                        "by the TLR their packets carry until a job ends (raise QUEUE_BY_JOB_TABLE_SIZE in "
                        "p4src/shared/sizes.p4 for more)", self.name, self._job_capacity or 0)
        self._no_room[job] = None
        self._dirty.pop(job, None)

    def _make_room(self) -> None:
        """An entry was deleted: the longest-waiting job without one may have it."""
        job = next(iter(self._no_room))
        del self._no_room[job]
        self._dirty[job] = None
        if not self._no_room:
            log.info("switch %r: queue_by_job has room for every job again", self.name)
