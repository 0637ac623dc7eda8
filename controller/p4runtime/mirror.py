"""One P4 table's installed copy and the diff engine, plus the P4Runtime match and action encoders.

Every control class (forwarding.py, classification.py, ecn.py) turns a ``SwitchState`` into desired rules per
table (identity key -> rule value) and says how to build an entry from a rule; ``TableMirror.diff`` compares
rule values with what this controller installed (cheap) and builds protobuf entries only for what changed.
The driver sends all changes in one batched Write (deletes, then modifies, then inserts) and commits each
change to the mirror once the switch accepted it.

After a (re)connect without a pipeline push the driver reads the switch's entries back and hands them to
``TableMirror.adopt``; the next ``diff`` claims those that are wanted (same P4Runtime identity: match fields and
priority), modifies those whose action differs and deletes the rest, so a reconnect writes only the difference.
Identities compare values, not bytes (``entry_identity``), so a server that pads its bytestrings still matches.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable, Mapping, Protocol

from netapprox.controller.p4runtime.protos import p4runtime_pb2

from netapprox.controller.errors import ControllerError
from netapprox.controller.model import SwitchState
from netapprox.controller.p4runtime.p4info import ActionInfo, Field, P4Info, TableInfo, decode, encode

ENTRY_CACHE_SIZE = 1 << 16
UPDATE_ORDER = {p4runtime_pb2.Update.DELETE: 0, p4runtime_pb2.Update.MODIFY: 1, p4runtime_pb2.Update.INSERT: 2}


# --- match and action encoders (a wildcard is omitted from the entry, as the P4Runtime spec requires) ----

def exact(f: Field, value: int) -> p4runtime_pb2.FieldMatch:
    return p4runtime_pb2.FieldMatch(field_id=f.id, exact=p4runtime_pb2.FieldMatch.Exact(
        value=encode(value, f.bitwidth, f.name)))


def lpm(f: Field, value: int, prefix_len: int) -> p4runtime_pb2.FieldMatch | None:
    if prefix_len == 0:
        return None
    return p4runtime_pb2.FieldMatch(field_id=f.id, lpm=p4runtime_pb2.FieldMatch.LPM(
        value=encode(value, f.bitwidth, f.name), prefix_len=prefix_len))


def ternary(f: Field, value: int, mask: int) -> p4runtime_pb2.FieldMatch | None:
    if mask == 0:
        return None
    return p4runtime_pb2.FieldMatch(field_id=f.id, ternary=p4runtime_pb2.FieldMatch.Ternary(
        value=encode(value & mask, f.bitwidth, f.name), mask=encode(mask, f.bitwidth, f.name + " mask")))


def range_match(f: Field, lo: int, hi: int) -> p4runtime_pb2.FieldMatch | None:
    if lo == 0 and hi == (1 << f.bitwidth) - 1:
        return None
    low = encode(lo, f.bitwidth, f.name)
    if lo == 0 and hi == 0xFF and f.bitwidth > 8:
        # BMv2 1.15.5's P4Runtime server (p4lang/PI f96af95e, range_match_is_dont_care) takes the field's width
        # for its don't-care check from the length of `low` as sent, so the canonical [0x00, 0xff] of a wider field
        # reads as a whole 8-bit range and is refused: "Invalid representation of 'don't care' range match, omit
        # match field instead of using low=0 and high=2**bitwidth-1". `low` padded to the field's bytes (the
        # full-width form P4Runtime servers accept) is read right.
        low = lo.to_bytes((f.bitwidth + 7) // 8, "big")
    return p4runtime_pb2.FieldMatch(field_id=f.id, range=p4runtime_pb2.FieldMatch.Range(
        low=low, high=encode(hi, f.bitwidth, f.name)))


def action(info: ActionInfo, **params: int) -> p4runtime_pb2.TableAction:
    return p4runtime_pb2.TableAction(action=p4runtime_pb2.Action(action_id=info.id, params=[
        p4runtime_pb2.Action.Param(param_id=info.param(n).id, value=encode(v, info.param(n).bitwidth, n))
        for n, v in params.items()]))


# --- comparing entries by value ------------------------------------------------------------------------------

def _match_value(m: p4runtime_pb2.FieldMatch) -> tuple:
    kind = m.WhichOneof("field_match_type")
    if kind == "exact":
        return (m.field_id, kind, decode(m.exact.value))
    if kind == "ternary":
        return (m.field_id, kind, decode(m.ternary.value), decode(m.ternary.mask))
    if kind == "lpm":
        return (m.field_id, kind, decode(m.lpm.value), m.lpm.prefix_len)
    if kind == "range":
        return (m.field_id, kind, decode(m.range.low), decode(m.range.high))
    if kind == "optional":
        return (m.field_id, kind, decode(m.optional.value))
    return (m.field_id, kind, m.SerializeToString(deterministic=True))


def entry_identity(entry: p4runtime_pb2.TableEntry) -> tuple:
    """What makes a table entry unique on a P4Runtime switch (table, match fields, priority), as values."""
    return (entry.table_id, tuple(sorted(_match_value(m) for m in entry.match)), entry.priority)


def action_value(table_action: p4runtime_pb2.TableAction) -> tuple:
    """A direct action as values: (action id, ((param id, value), ...)); other action kinds as bytes."""
    if table_action.WhichOneof("type") == "action":
        a = table_action.action
        return (a.action_id, tuple(sorted((p.param_id, decode(p.value)) for p in a.params)))
    return (table_action.SerializeToString(deterministic=True),)


class Foreign:
    """The rule of an entry found on the switch that no desired rule claims: the next diff deletes it."""

    __slots__ = ("identity",)

    def __init__(self, identity: tuple) -> None:
        self.identity = identity

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Foreign) and other.identity == self.identity

    def __hash__(self) -> int:
        return hash(("foreign", self.identity))

    def __repr__(self) -> str:
        return f"Foreign({self.identity!r})"


# --- protobuf wire encoding of the hot path ----------------------------------------------------------------

def varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


# --- the mirror and its changes ------------------------------------------------------------------------

class TableMirror:
    """One P4 table and a copy of what this controller installed in it: identity key -> (rule, entry)."""

    def __init__(self, p4info: P4Info, name: str) -> None:
        self.info: TableInfo = p4info.table(name)
        self.name = name
        self.installed: dict[Hashable, tuple[Any, p4runtime_pb2.TableEntry]] = {}
        self._built: dict[Any, p4runtime_pb2.TableEntry] = {}  # rule -> entry (protobuf building is slow)
        self._updates: dict[tuple[int, Any], tuple[p4runtime_pb2.Update, int]] = {}  # (kind, rule) -> (update, bytes)
        self._found: dict[tuple, p4runtime_pb2.TableEntry] = {}  # identity -> entry read back, not yet claimed

    def action_of(self, p4info: P4Info, name: str) -> ActionInfo:
        """Action ``name``, checked to be one of this table's actions in the P4Info."""
        info = p4info.action(name)
        if info.id not in self.info.action_ids:
            raise ControllerError(f"action {name!r} is not an action of table {self.name!r} in the P4Info "
                                  "(the P4 program and docs/architecture.md disagree)")
        return info

    def build(self, rule: Any, build: Callable[[Any], p4runtime_pb2.TableEntry]) -> p4runtime_pb2.TableEntry:
        entry = self._built.get(rule)
        if entry is None:
            if len(self._built) >= ENTRY_CACHE_SIZE:
                self._built.clear()
            entry = self._built[rule] = build(rule)
        return entry

    def update(self, kind: int, rule: Any, entry: p4runtime_pb2.TableEntry) -> tuple[p4runtime_pb2.Update, int]:
        """The Update of ``kind`` for ``rule``'s ``entry`` and its serialized size, cached: a job moving back
        and forth between two queues costs two messages, once. (Not cached when the entry is not the rule's
        own: a rule of None or ``Foreign`` stands for an entry found on the switch.)"""
        cacheable = rule is not None and not isinstance(rule, Foreign)
        key = (kind, rule)
        hit = self._updates.get(key) if cacheable else None
        if hit is None:
            if kind == p4runtime_pb2.Update.DELETE:  # a delete names the entry by its key only
                entry = p4runtime_pb2.TableEntry(table_id=entry.table_id, match=entry.match, priority=entry.priority)
            update = p4runtime_pb2.Update(type=kind, entity=p4runtime_pb2.Entity(table_entry=entry))
            hit = (update, update.ByteSize())
            if cacheable:
                if len(self._updates) >= ENTRY_CACHE_SIZE:
                    self._updates.clear()
                self._updates[key] = hit
        return hit

    def adopt(self, entries: Iterable[p4runtime_pb2.TableEntry]) -> None:
        """Forget the installed copy and take ``entries`` (read back from the switch) instead; the next ``diff``
        sorts them into wanted, changed and unwanted."""
        self.installed.clear()
        self._found = {entry_identity(e): e for e in entries}

    @property
    def unclaimed(self) -> int:
        """Entries read back that no diff has sorted yet."""
        return len(self._found)

    def _claim(self, desired: Mapping[Hashable, Any], build: Callable[[Any], p4runtime_pb2.TableEntry]) -> None:
        found, self._found = self._found, {}
        for key, rule in desired.items():
            if key in self.installed:
                continue
            entry = self.build(rule, build)
            have = found.pop(entry_identity(entry), None)
            if have is not None:
                same = action_value(have.action) == action_value(entry.action)
                self.installed[key] = (rule if same else None, have)  # None: content differs, the diff modifies
        for identity, have in found.items():
            self.installed[Foreign(identity)] = (Foreign(identity), have)

    def entry(self, matches: Iterable[p4runtime_pb2.FieldMatch | None], table_action: p4runtime_pb2.TableAction,
              priority: int = 0) -> p4runtime_pb2.TableEntry:
        return p4runtime_pb2.TableEntry(table_id=self.info.id, match=[m for m in matches if m is not None],
                                        action=table_action, priority=priority)

    def diff(self, desired: Mapping[Hashable, Any],
             build: Callable[[Any], p4runtime_pb2.TableEntry]) -> list["Change"]:
        """Changes turning the installed copy into ``desired`` (key -> rule); ``build`` makes an entry."""
        if self._found:
            self._claim(desired, build)
        deletes, modifies, inserts = [], [], []
        for key, (rule, entry) in self.installed.items():
            if key not in desired:
                deletes.append(Change(p4runtime_pb2.Update.DELETE, self, key, rule, entry))
        for key, rule in desired.items():
            old = self.installed.get(key)
            if old is None:
                inserts.append(Change(p4runtime_pb2.Update.INSERT, self, key, rule, self.build(rule, build)))
            elif old[0] != rule:
                modifies.append(Change(p4runtime_pb2.Update.MODIFY, self, key, rule, self.build(rule, build)))
        return [c for group in (deletes, modifies, inserts) for c in sorted(group, key=lambda c: repr(c.key))]


class Change:
    """One update of a batched Write, and how to record it in its table's mirror once the switch took it.
    ``payload``: the serialized Update when it was encoded directly (the queue_by_job hot path; ``entry`` is
    then None). (A plain slotted class: one is made per update; the write queue's C loop, controller/p4runtime/
    _jobwrites.c, makes queue_by_job's without calling ``__init__``, which must only store its arguments.)"""

    __slots__ = ("kind", "table", "key", "rule", "entry", "payload")

    def __init__(self, kind: int, table: TableMirror, key: Hashable, rule: Any,
                 entry: p4runtime_pb2.TableEntry | None, payload: bytes | None = None) -> None:
        self.kind = kind  # p4runtime_pb2.Update.Type
        self.table = table
        self.key = key
        self.rule = rule
        self.entry = entry
        self.payload = payload

    def __repr__(self) -> str:
        return f"Change({self.kind}, {self.table.name}, {self.key!r}, {self.rule!r})"

    def update(self) -> p4runtime_pb2.Update:
        if self.payload is not None:
            return p4runtime_pb2.Update.FromString(self.payload)
        return self.table.update(self.kind, self.rule, self.entry)[0]

    def serialized(self) -> bytes:
        """The Update as it goes on the wire."""
        if self.payload is not None:
            return self.payload
        return self.table.update(self.kind, self.rule, self.entry)[0].SerializeToString()

    def commit(self) -> None:
        if self.kind == p4runtime_pb2.Update.DELETE:
            self.table.installed.pop(self.key, None)
        else:
            self.table.installed[self.key] = (self.rule, self.entry)

    def heal(self, code: str) -> None:
        """The switch refused this update with ``code``: make the next diff repair the disagreement instead of
        repeating the same update."""
        if self.kind == p4runtime_pb2.Update.INSERT and code == "ALREADY_EXISTS":
            self.table.installed[self.key] = (None, self.entry)  # content unknown: the next diff sends MODIFY
        elif code == "NOT_FOUND":
            self.table.installed.pop(self.key, None)  # the next diff re-inserts it if still wanted


def unique(rules: Iterable, key: Callable, table: str) -> dict:
    """key -> rule; two rules with one P4Runtime identity (same match and priority) are an error."""
    out: dict = {}
    for rule in rules:
        k = key(rule)
        if k in out:
            a, b = sorted((out[k], rule))
            raise ControllerError(f"two entries with the same key {k!r} in {table}: {a} and {b}")
        out[k] = rule
    return out


DesiredTables = dict[TableMirror, tuple[dict, Callable[[Any], p4runtime_pb2.TableEntry]]]
"""What a control wants: table -> (identity key -> rule, entry builder)."""


class Control(Protocol):
    """A P4 control's mirror: its tables and the rules a ``SwitchState`` asks of them."""

    @property
    def tables(self) -> tuple[TableMirror, ...]: ...

    def desired(self, state: SwitchState) -> DesiredTables: ...


def pending_changes(controls: Iterable[Control], state: SwitchState,
                    skip: frozenset[TableMirror] = frozenset()) -> list[Change]:
    """Every update turning the controls' installed copies into ``state`` (tables in ``skip`` left out):
    deletes, modifies, inserts; within each kind in control and table order, then key order."""
    changes: list[Change] = []
    for control in controls:
        for table, (rules, build) in control.desired(state).items():
            if table not in skip:
                changes.extend(table.diff(rules, build))
    return sorted(changes, key=lambda c: UPDATE_ORDER[c.kind])


def batches(sizes: list[int], max_updates: int, max_bytes: int) -> list[list[int]]:
    """Indices of updates of serialized ``sizes`` split into Write batches of at most ``max_updates`` updates
    and ``max_bytes`` bytes (gRPC's default message limit is 4 MiB); one update never splits."""
    if not sizes:
        return []
    if len(sizes) <= max_updates and sum(sizes) + 8 * len(sizes) <= max_bytes:
        return [list(range(len(sizes)))]
    out: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, n in enumerate(sizes):
        n += 8  # field tag and length prefix in the WriteRequest
        if current and (len(current) >= max_updates or size + n > max_bytes):
            out.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        out.append(current)
    return out
