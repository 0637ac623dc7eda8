"""Mirrors ``NetApproxIngress.classification`` (p4src/*/include/control/classification.p4).

Tables and their actions (docs/architecture.md): ``queue_by_class``, ``queue_by_tag`` and ``queue_by_tlr``
take ``set_queue(qid)``; ``queue_by_job`` takes its own ``set_job_queue(qid)`` (so its direct counter counts
on TNA too; both P4 trees declare it, so they share one P4Info).

``queue_by_tag`` matches ``deadline_us`` ternary (Tofino range keys are at most 20 bits wide): a CadentFlow rule's
deadline range [lo, hi] is written as its prefixes (``model.prefix_split``, at most 62 for 32 bits), one entry
each with the rule's priority range and rank. The prefixes of one range are disjoint, so the entries match
exactly the packets the range does (``controller.reference`` evaluates the ranges; a test compares them).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Iterable, KeysView

from netapprox.controller.p4runtime.protos import p4info_pb2, p4runtime_pb2

from netapprox.controller.errors import ControllerError
from netapprox.controller.model import NUM_QUEUES, ClassRule, JobRule, SwitchState, TagRule, TlrRule, prefix_split
from netapprox.controller.p4runtime.mirror import (
    DesiredTables,
    TableMirror,
    action,
    exact,
    field,
    range_match,
    ternary,
    unique,
    varint,
)
from netapprox.controller.p4runtime.p4info import ActionInfo, P4Info, decode

log = logging.getLogger("netapprox.controller.p4runtime")

QUEUE_BY_CLASS = "NetApproxIngress.classification.queue_by_class"
QUEUE_BY_JOB = "NetApproxIngress.classification.queue_by_job"
QUEUE_BY_TAG = "NetApproxIngress.classification.queue_by_tag"
QUEUE_BY_TLR = "NetApproxIngress.classification.queue_by_tlr"
SET_QUEUE = "NetApproxIngress.classification.set_queue"
SET_JOB_QUEUE = "NetApproxIngress.classification.set_job_queue"
JOB_PACKETS = "NetApproxIngress.classification.job_packets"

TLR_RULE_PRIORITY = 1
DEADLINE_BITS = 32


@dataclasses.dataclass(frozen=True, order=True)
class TagEntry:
    """One ``queue_by_tag`` entry: a CadentFlow rule's priority range and one prefix of its deadline range."""

    rank: int
    priority_lo: int
    priority_hi: int
    deadline_value: int
    deadline_mask: int
    qid: int


def tag_entries(rule: TagRule) -> list[TagEntry]:
    """The entries of one CadentFlow rule: its deadline range as disjoint prefixes (a full range is one entry
    whose deadline is a wildcard, mask 0)."""
    return [TagEntry(rule.rank, rule.priority_lo, rule.priority_hi, value, mask, rule.qid)
            for value, mask in prefix_split(rule.deadline_lo_us, rule.deadline_hi_us, DEADLINE_BITS)]
DELETE = p4runtime_pb2.Update.DELETE
_LEN = [bytes([n]) for n in range(128)]
_UPDATE_TYPE = {k: bytes([1 << 3, k]) for k in (p4runtime_pb2.Update.INSERT, p4runtime_pb2.Update.MODIFY, DELETE)}


class Classification:
    """queue_by_class, queue_by_job, queue_by_tag, queue_by_tlr."""

    def __init__(self, p4info: P4Info) -> None:
        self.queue_by_class = TableMirror(p4info, QUEUE_BY_CLASS)
        self.queue_by_job = TableMirror(p4info, QUEUE_BY_JOB)
        self.queue_by_tag = TableMirror(p4info, QUEUE_BY_TAG)
        self.queue_by_tlr = TableMirror(p4info, QUEUE_BY_TLR)
        self._actions: dict[str, ActionInfo] = {
            QUEUE_BY_CLASS: self.queue_by_class.action_of(p4info, SET_QUEUE),
            QUEUE_BY_JOB: self.queue_by_job.action_of(p4info, SET_JOB_QUEUE),
            QUEUE_BY_TAG: self.queue_by_tag.action_of(p4info, SET_QUEUE),
            QUEUE_BY_TLR: self.queue_by_tlr.action_of(p4info, SET_QUEUE),
        }
        for info in self._actions.values():
            info.param("qid")
        self._queue_actions: dict[tuple[str, int], p4runtime_pb2.TableAction] = {}
        self.job_packets_id = p4info.direct_counter_id(JOB_PACKETS)
        c, j, t, r = (self.queue_by_class.info, self.queue_by_job.info, self.queue_by_tag.info, self.queue_by_tlr.info)
        self._ip_proto, self._l4_dport = c.field("ip_proto"), c.field("l4_dport")
        self._job_id = j.field("job_id")
        self._job_entry_head = varint(1 << 3) + varint(j.id)  # TableEntry.table_id (1)
        self._job_match_head = varint(1 << 3) + varint(self._job_id.id)  # FieldMatch.field_id (1)
        self._job_action_bytes = {q: field(3, self.set_queue(q, QUEUE_BY_JOB).SerializeToString())
                                  for q in range(NUM_QUEUES)}  # qid -> TableEntry.action (3), serialized
        longest = len(self._job_entry_head) + len(self._job_match_head) + 16 + max(map(len, self._job_action_bytes.values()))
        if longest >= 120 or self._job_id.bitwidth > 64:
            raise ControllerError("queue_by_job entries too long for the direct encoder; the P4Info is unexpected")
        self._priority, self._deadline = t.field("priority"), t.field("deadline_us")
        if self._deadline.match_type != p4info_pb2.MatchField.TERNARY:
            raise ControllerError(f"{QUEUE_BY_TAG}.deadline_us is not a ternary key in this P4Info (an old build of "
                                  "p4src?): rebuild the program (`make p4`) and use its P4Info")
        self._tlr = r.field("tlr")

    @property
    def tables(self) -> tuple[TableMirror, ...]:
        return (self.queue_by_class, self.queue_by_job, self.queue_by_tag, self.queue_by_tlr)

    def set_queue(self, qid: int, table: str = QUEUE_BY_TLR) -> p4runtime_pb2.TableAction:
        """The TableAction setting ``qid`` with ``table``'s queue action (cached: one per table and queue)."""
        cached = self._queue_actions.get((table, qid))
        if cached is None:
            cached = self._queue_actions[table, qid] = action(self._actions[table], qid=qid)
        return cached

    def desired(self, state: SwitchState) -> DesiredTables:
        classes = unique(state.class_rules, lambda r: (r.rank, r.ip_proto & r.ip_proto_mask, r.ip_proto_mask,
                                                       r.l4_dport & r.l4_dport_mask, r.l4_dport_mask), QUEUE_BY_CLASS)
        unique(state.tag_rules, lambda r: (r.rank, r.priority_lo, r.priority_hi, r.deadline_lo_us, r.deadline_hi_us),
               QUEUE_BY_TAG)
        tags = unique((e for r in state.tag_rules for e in tag_entries(r)),
                      lambda e: (e.rank, e.priority_lo, e.priority_hi, e.deadline_value, e.deadline_mask), QUEUE_BY_TAG)
        tlrs = unique(state.tlr_rules, lambda r: (r.tlr_lo, r.tlr_hi), QUEUE_BY_TLR)
        return {
            self.queue_by_class: (classes, self._class_entry),
            self.queue_by_job: ({r.job_id: r for r in state.job_rules}, self.job_entry),
            self.queue_by_tag: (tags, self._tag_entry),
            self.queue_by_tlr: (tlrs, self._tlr_entry),
        }

    def job_update(self, kind: int, job_id: int, qid: int) -> bytes:
        """The serialized ``Update`` of ``kind`` for queue_by_job entry ``job_id -> qid``, encoded directly:
        byte for byte what protobuf makes of the message ``job_entry`` builds (tests/controller/
        test_ctl_p4runtime.py compares them), at a fraction of the cost, for the table that changes every
        epoch. Every length here is below 128, so each fits one byte (checked in ``__init__``)."""
        value = job_id.to_bytes(max(1, (job_id.bit_length() + 7) // 8), "big")  # canonical bytestring
        exact_ = b"\x0a" + _LEN[len(value)] + value  # Exact {value (1)}
        fm = self._job_match_head + b"\x12" + _LEN[len(exact_)] + exact_  # FieldMatch {field_id, exact (2)}
        entry = self._job_entry_head + b"\x12" + _LEN[len(fm)] + fm  # TableEntry {table_id, match (2)}
        if kind != DELETE:
            entry += self._job_action_bytes[qid]  # TableEntry.action (3)
        te = b"\x12" + _LEN[len(entry)] + entry  # Entity {table_entry (2)}
        return _UPDATE_TYPE[kind] + b"\x12" + _LEN[len(te)] + te  # Update {type (1), entity (2)}

    # --- queue_by_job as the write queue sees it: job id -> (JobRule or None, entry) ---

    @property
    def job_table_size(self) -> int | None:
        """queue_by_job's size in the P4Info (None: not given)."""
        return self.queue_by_job.info.size or None

    @property
    def job_entries(self) -> dict[int, tuple[JobRule | None, Any]]:
        """job id -> (rule, entry) of every queue_by_job entry installed: the live mapping ``installed_job``
        reads, for the write queue's C loops (``commit_job``'s writes are theirs to make too)."""
        return self.queue_by_job.installed

    def installed_jobs(self) -> KeysView[int]:
        """The jobs with a queue_by_job entry on the switch (as far as this controller knows)."""
        return self.queue_by_job.installed.keys()

    def installed_job(self, job_id: int) -> tuple[JobRule | None, Any] | None:
        """(rule, entry) of ``job_id``'s entry, or None without one; rule None: an entry whose action is not
        ours (the next write modifies it)."""
        return self.queue_by_job.installed.get(job_id)

    def commit_job(self, job_id: int, rule: JobRule | None, entry: Any) -> None:
        """The switch took ``job_id``'s entry (``rule`` None: it was deleted)."""
        if rule is None:
            self.queue_by_job.installed.pop(job_id, None)
        else:
            self.queue_by_job.installed[job_id] = (rule, entry)

    def adopt_jobs(self, entries: Iterable[p4runtime_pb2.TableEntry], switch: str) -> None:
        """queue_by_job entries read back from the switch become the installed copy, by job id (an entry whose
        action is not ours gets rule None, so the next write modifies it)."""
        table = self.queue_by_job
        table.adopt([])
        action_id = self.set_queue(0, QUEUE_BY_JOB).action.action_id
        for entry in entries:
            if len(entry.match) != 1 or entry.match[0].WhichOneof("field_match_type") != "exact":
                log.warning("switch %r: unexpected queue_by_job entry %s", switch, entry)
                continue
            job = decode(entry.match[0].exact.value)
            a = entry.action.action
            qid = decode(a.params[0].value) if a.action_id == action_id and len(a.params) == 1 else None
            rule = JobRule(job, qid) if qid is not None and 0 <= qid < NUM_QUEUES and job > 0 else None
            table.installed[job] = (rule, entry)

    def _class_entry(self, r: ClassRule) -> p4runtime_pb2.TableEntry:
        return self.queue_by_class.entry([ternary(self._ip_proto, r.ip_proto, r.ip_proto_mask),
                                          ternary(self._l4_dport, r.l4_dport, r.l4_dport_mask)],
                                         self.set_queue(r.qid, QUEUE_BY_CLASS), priority=r.rank)

    def job_entry(self, r: JobRule) -> p4runtime_pb2.TableEntry:
        return self.queue_by_job.entry([exact(self._job_id, r.job_id)], self.set_queue(r.qid, QUEUE_BY_JOB))

    def _tag_entry(self, e: TagEntry) -> p4runtime_pb2.TableEntry:
        return self.queue_by_tag.entry([range_match(self._priority, e.priority_lo, e.priority_hi),
                                        ternary(self._deadline, e.deadline_value, e.deadline_mask)],
                                       self.set_queue(e.qid, QUEUE_BY_TAG), priority=e.rank)

    def _tlr_entry(self, r: TlrRule) -> p4runtime_pb2.TableEntry:
        return self.queue_by_tlr.entry([range_match(self._tlr, r.tlr_lo, r.tlr_hi)],
                                       self.set_queue(r.qid, QUEUE_BY_TLR), priority=TLR_RULE_PRIORITY)
