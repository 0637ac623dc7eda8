"""P4Runtime driver for the NetApprox P4 program on BMv2 ``simple_switch_grpc`` and Tofino.

The controller mirrors the P4 program: one class per P4 control, each owning its tables and a copy of what
it installed (``Forwarding`` <-> ``NetApproxIngress.forwarding``, ``Classification`` <->
``NetApproxIngress.classification``, ``Ecn`` <-> ``NetApproxEgress.ecn``). ``P4RuntimeDriver.apply`` asks
each control for its desired entries, diffs them against the installed copies and sends all changes in one
batched Write (deletes, then modifies, then inserts). An unchanged state sends nothing.

Session: StreamChannel arbitration as primary (election id from the options), SetForwardingPipelineConfig
(VERIFY_AND_COMMIT: BMv2 JSON, or the Tofino device config), per-queue buffers (BMv2 Thrift CLI or Tofino
BfRt), then the last applied state. Packet-in frames are queued for ``drain_packet_in``. A broken stream or an
UNAVAILABLE/FAILED_PRECONDITION/PERMISSION_DENIED answer raises ``SwitchUnavailable``: the controller
re-arms the switch (``connect`` again: pipeline, queues, entries).
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import queue
import struct
import threading
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Mapping

import grpc
from google.protobuf import text_format
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from netapprox.controller.bmv2_queues import set_queue_depths
from netapprox.controller.errors import (
    ConfigError,
    ControllerError,
    NotPrimaryError,
    P4RuntimeWriteError,
    PipelineError,
    QueueConfigError,
    UpdateError,
    did_you_mean,
)
from netapprox.controller.model import (
    NUM_QUEUES,
    ClassRule,
    Counters,
    Driver,
    EcnRule,
    JobRule,
    QueueStats,
    Route,
    SwitchState,
    SwitchUnavailable,
    TagRule,
    TlrRule,
    WriteSummary,
)
from netapprox.controller.p4info import ActionInfo, Field, P4Info, TableInfo, decode, encode, ipv4_to_int, mac_to_int

log = logging.getLogger("controller.p4runtime")

# P4Info contract (docs/architecture.md)
ROUTES_V4 = "NetApproxIngress.forwarding.routes_v4"
ROUTE = "NetApproxIngress.forwarding.route"
QUEUE_BY_CLASS = "NetApproxIngress.classification.queue_by_class"
QUEUE_BY_JOB = "NetApproxIngress.classification.queue_by_job"
QUEUE_BY_TAG = "NetApproxIngress.classification.queue_by_tag"
QUEUE_BY_TLR = "NetApproxIngress.classification.queue_by_tlr"
SET_QUEUE = "NetApproxIngress.classification.set_queue"
JOB_PACKETS = "NetApproxIngress.classification.job_packets"
ECN_THRESHOLDS = "NetApproxEgress.ecn.ecn_thresholds"
MARK_ECN = "NetApproxEgress.ecn.mark_ecn"
ENQUEUED_PACKETS = "NetApproxIngress.enqueued_packets"
TRANSMITTED_PACKETS = "NetApproxEgress.transmitted_packets"

TLR_RULE_PRIORITY = 1
ENTRY_CACHE_SIZE = 1 << 16
UNAVAILABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED,
                     grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED)


# --- options --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class P4RuntimeOptions:
    """Options of a ``kind = "p4runtime"`` switch (the ``[switch.options]`` table)."""

    address: str = "127.0.0.1:9559"
    """host:port of the P4Runtime server."""
    device_id: int = 1
    """P4Runtime device id (simple_switch_grpc: ``--device-id``, default 1 in its docs' examples)."""
    election_id: tuple[int, int] = (0, 1)
    """(high, low) election id; the controller must hold the highest to be primary."""
    target: str = "bmv2"
    """``bmv2`` or ``tofino``: selects the pipeline artifacts, the queue-buffer path and ECN units."""
    p4info: str = "build/v1model/p4info.txtpb"
    """P4Info file (text or binary)."""
    bmv2_json: str = "build/v1model/bmv2.json"
    """BMv2 JSON (``target = "bmv2"``)."""
    device_config: str | None = None
    """Tofino: a ready ``p4_device_config`` file (e.g. Stratum's BfPipelineConfig from bf_pipeline_builder)."""
    tofino_bin: str | None = None
    """Tofino: ``tofino.bin``; with ``tofino_context``, packed the PI way (name, bin, context, length-prefixed)."""
    tofino_context: str | None = None
    """Tofino: ``context.json``."""
    prog_name: str = "netapprox"
    """P4 program name (Tofino packing, BfRt)."""
    push_pipeline: bool = True
    """Push the pipeline on every (re)connect. Turn off only when another tool owns the pipeline."""
    ports: tuple[int, ...] = ()
    """Data-plane ports: their queue buffers are configured and their counters read (empty: read all)."""
    buffer_packets: int = 64
    """Per-port buffer to share out: queue k >= 1 gets 8 - k packets, queue 0 the rest."""
    thrift_port: int | None = None
    """BMv2 Thrift port for ``set_queue_depth`` (None: leave BMv2's default of 64 packets per queue)."""
    cli: str | None = None
    """Size BMv2 queues through this runtime CLI (e.g. ``simple_switch_CLI``) instead of speaking Thrift directly."""
    bfrt_address: str | None = None
    """Tofino BfRt gRPC address (e.g. ``127.0.0.1:50052``) for traffic-manager configuration (None: skip)."""
    tm_prefix: str = "tf1"
    """BfRt TM table prefix: ``tf1`` (Tofino 1) or ``tf2``."""
    tm_pool: str = "EG_APP_POOL_0"
    """Tofino egress application pool the queues draw from (``tm.queue.buffer`` ``pool_id``)."""
    cells_per_packet: int = 19
    """Tofino buffer cells per 1500-byte packet (80-byte cells on Tofino 1); also scales the ECN threshold."""
    connect_timeout_s: float = 3.0
    """How long to wait for the server and the arbitration answer."""
    rpc_timeout_s: float = 10.0
    """Deadline of each unary RPC."""

    def __post_init__(self) -> None:
        if self.target not in ("bmv2", "tofino"):
            raise ConfigError(f"option target={self.target!r}: use 'bmv2' or 'tofino'")


def _coerce_options(name: str, options: Mapping[str, Any]) -> P4RuntimeOptions:
    fields = {f.name: f for f in dataclasses.fields(P4RuntimeOptions)}
    kwargs: dict[str, Any] = {}
    for key, value in options.items():
        if key not in fields:
            raise ConfigError(f"switch {name!r}: unknown p4runtime option {key!r}.{did_you_mean(key, fields)}"
                              f" Known: {', '.join(fields)}")
        if key == "election_id":
            value = (0, int(value)) if isinstance(value, int) else tuple(int(v) for v in value)
        elif key == "ports":
            value = tuple(int(v) for v in value)
        elif key in ("device_id", "buffer_packets", "cells_per_packet") or (key == "thrift_port" and value is not None):
            value = int(value)
        elif key in ("connect_timeout_s", "rpc_timeout_s"):
            value = float(value)
        kwargs[key] = value
    return P4RuntimeOptions(**kwargs)


# --- table mirrors and the controls ---------------------------------------------------------------------


def _exact(f: Field, value: int) -> p4runtime_pb2.FieldMatch:
    return p4runtime_pb2.FieldMatch(field_id=f.id, exact=p4runtime_pb2.FieldMatch.Exact(
        value=encode(value, f.bitwidth, f.name)))


def _lpm(f: Field, value: int, prefix_len: int) -> p4runtime_pb2.FieldMatch | None:
    if prefix_len == 0:
        return None  # wildcard: omitted (P4Runtime spec)
    return p4runtime_pb2.FieldMatch(field_id=f.id, lpm=p4runtime_pb2.FieldMatch.LPM(
        value=encode(value, f.bitwidth, f.name), prefix_len=prefix_len))


def _ternary(f: Field, value: int, mask: int) -> p4runtime_pb2.FieldMatch | None:
    if mask == 0:
        return None
    return p4runtime_pb2.FieldMatch(field_id=f.id, ternary=p4runtime_pb2.FieldMatch.Ternary(
        value=encode(value & mask, f.bitwidth, f.name), mask=encode(mask, f.bitwidth, f.name + " mask")))


def _range(f: Field, lo: int, hi: int) -> p4runtime_pb2.FieldMatch | None:
    if lo == 0 and hi == (1 << f.bitwidth) - 1:
        return None
    return p4runtime_pb2.FieldMatch(field_id=f.id, range=p4runtime_pb2.FieldMatch.Range(
        low=encode(lo, f.bitwidth, f.name), high=encode(hi, f.bitwidth, f.name)))


def _action(info: ActionInfo, **params: int) -> p4runtime_pb2.TableAction:
    return p4runtime_pb2.TableAction(action=p4runtime_pb2.Action(action_id=info.id, params=[
        p4runtime_pb2.Action.Param(param_id=info.param(n).id, value=encode(v, info.param(n).bitwidth, n))
        for n, v in params.items()]))


class TableMirror:
    """One P4 table and a copy of what this controller installed in it: identity key -> (rule, entry).

    Diffs compare rule values (cheap); protobuf entries are built only for what changed."""

    def __init__(self, p4info: P4Info, name: str) -> None:
        self.info: TableInfo = p4info.table(name)
        self.name = name
        self.installed: dict[Hashable, tuple[Any, p4runtime_pb2.TableEntry]] = {}
        self._built: dict[Any, p4runtime_pb2.TableEntry] = {}  # rule -> entry (pure-Python protobuf is slow)

    def build(self, rule: Any, build: Callable[[Any], p4runtime_pb2.TableEntry]) -> p4runtime_pb2.TableEntry:
        entry = self._built.get(rule)
        if entry is None:
            if len(self._built) >= ENTRY_CACHE_SIZE:
                self._built.clear()
            entry = self._built[rule] = build(rule)
        return entry

    def entry(self, matches: Iterable[p4runtime_pb2.FieldMatch | None], action: p4runtime_pb2.TableAction,
              priority: int = 0) -> p4runtime_pb2.TableEntry:
        return p4runtime_pb2.TableEntry(table_id=self.info.id, match=[m for m in matches if m is not None],
                                        action=action, priority=priority)

    def diff(self, desired: Mapping[Hashable, Any],
             build: Callable[[Any], p4runtime_pb2.TableEntry]) -> list["Change"]:
        """Changes turning the installed copy into ``desired`` (key -> rule); ``build`` makes an entry."""
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


@dataclasses.dataclass(frozen=True)
class Change:
    kind: int  # p4runtime_pb2.Update.Type
    table: TableMirror
    key: Hashable
    rule: Any
    entry: p4runtime_pb2.TableEntry

    def update(self) -> p4runtime_pb2.Update:
        entry = self.entry
        if self.kind == p4runtime_pb2.Update.DELETE:  # a delete names the entry by its key only
            entry = p4runtime_pb2.TableEntry(table_id=entry.table_id, match=entry.match, priority=entry.priority)
        return p4runtime_pb2.Update(type=self.kind, entity=p4runtime_pb2.Entity(table_entry=entry))

    def commit(self) -> None:
        if self.kind == p4runtime_pb2.Update.DELETE:
            self.table.installed.pop(self.key, None)
        else:
            self.table.installed[self.key] = (self.rule, self.entry)


def _unique(rules: Iterable, key: Callable, table: str) -> dict:
    """key -> rule; two rules with one P4Runtime identity (same match and priority) are an error."""
    out: dict = {}
    for rule in rules:
        k = key(rule)
        if k in out:
            a, b = sorted((out[k], rule))
            raise ControllerError(f"two entries with the same key {k!r} in {table}: {a} and {b}")
        out[k] = rule
    return out


class Forwarding:
    """Mirrors ``NetApproxIngress.forwarding``: ``routes_v4`` (IPv4 LPM -> port + MAC rewrite)."""

    def __init__(self, p4info: P4Info) -> None:
        self.routes_v4 = TableMirror(p4info, ROUTES_V4)
        self._dst = self.routes_v4.info.field("dst_addr")
        self._route = p4info.action(ROUTE)
        for p in ("port", "src_mac", "dst_mac"):
            self._route.param(p)

    @property
    def tables(self) -> tuple[TableMirror, ...]:
        return (self.routes_v4,)

    def desired(self, state: SwitchState) -> dict[TableMirror, tuple[dict, Callable]]:
        routes = _unique(state.routes, lambda r: (r.prefix, r.prefix_len), ROUTES_V4)
        return {self.routes_v4: (routes, self._entry)}

    def _entry(self, r: Route) -> p4runtime_pb2.TableEntry:
        return self.routes_v4.entry([_lpm(self._dst, ipv4_to_int(r.prefix), r.prefix_len)],
                                    _action(self._route, port=r.port, src_mac=mac_to_int(r.src_mac),
                                            dst_mac=mac_to_int(r.dst_mac)))


class Classification:
    """Mirrors ``NetApproxIngress.classification``: queue_by_class, queue_by_job, queue_by_tag, queue_by_tlr,
    each with its ``qid`` action (``set_queue``; ``set_job_queue`` for queue_by_job on TNA)."""

    def __init__(self, p4info: P4Info) -> None:
        self.queue_by_class = TableMirror(p4info, QUEUE_BY_CLASS)
        self.queue_by_job = TableMirror(p4info, QUEUE_BY_JOB)
        self.queue_by_tag = TableMirror(p4info, QUEUE_BY_TAG)
        self.queue_by_tlr = TableMirror(p4info, QUEUE_BY_TLR)
        self._set_queue = p4info.action(SET_QUEUE)
        self._set_queue.param("qid")
        # Each table's own qid action from its action_refs: set_queue everywhere on BMv2; on TNA queue_by_job
        # has set_job_queue(qid) (a direct counter counts only in its table's actions; docs/dataplane.md).
        self._queue_action = {t.name: p4info.table_action(t.info, frozenset({"qid"}), prefer="set_queue")
                              for t in (self.queue_by_class, self.queue_by_job, self.queue_by_tag, self.queue_by_tlr)}
        self._set_queue_actions: dict[tuple[str, int], p4runtime_pb2.TableAction] = {}
        c, j, t, r = (self.queue_by_class.info, self.queue_by_job.info, self.queue_by_tag.info, self.queue_by_tlr.info)
        self._ip_proto, self._l4_dport = c.field("ip_proto"), c.field("l4_dport")
        self._job_id = j.field("job_id")
        self._priority, self._deadline = t.field("priority"), t.field("deadline_us")
        self._tlr = r.field("tlr")

    @property
    def tables(self) -> tuple[TableMirror, ...]:
        return (self.queue_by_class, self.queue_by_job, self.queue_by_tag, self.queue_by_tlr)

    def set_queue(self, qid: int, table: str = QUEUE_BY_TLR) -> p4runtime_pb2.TableAction:
        """The TableAction setting ``qid`` with ``table``'s queue action."""
        action = self._set_queue_actions.get((table, qid))
        if action is None:
            action = self._set_queue_actions[table, qid] = _action(self._queue_action[table], qid=qid)
        return action

    def desired(self, state: SwitchState) -> dict[TableMirror, tuple[dict, Callable]]:
        classes = _unique(state.class_rules, lambda r: (r.rank, r.ip_proto & r.ip_proto_mask, r.ip_proto_mask,
                                                        r.l4_dport & r.l4_dport_mask, r.l4_dport_mask), QUEUE_BY_CLASS)
        tags = _unique(state.tag_rules, lambda r: (r.rank, r.priority_lo, r.priority_hi, r.deadline_lo_us,
                                                   r.deadline_hi_us), QUEUE_BY_TAG)
        tlrs = _unique(state.tlr_rules, lambda r: (r.tlr_lo, r.tlr_hi), QUEUE_BY_TLR)
        return {
            self.queue_by_class: (classes, self._class_entry),
            self.queue_by_job: ({r.job_id: r for r in state.job_rules}, self._job_entry),
            self.queue_by_tag: (tags, self._tag_entry),
            self.queue_by_tlr: (tlrs, self._tlr_entry),
        }

    def _class_entry(self, r: ClassRule) -> p4runtime_pb2.TableEntry:
        return self.queue_by_class.entry([_ternary(self._ip_proto, r.ip_proto, r.ip_proto_mask),
                                          _ternary(self._l4_dport, r.l4_dport, r.l4_dport_mask)],
                                         self.set_queue(r.qid, QUEUE_BY_CLASS), priority=r.rank)

    def _job_entry(self, r: JobRule) -> p4runtime_pb2.TableEntry:
        return self.queue_by_job.entry([_exact(self._job_id, r.job_id)], self.set_queue(r.qid, QUEUE_BY_JOB))

    def _tag_entry(self, r: TagRule) -> p4runtime_pb2.TableEntry:
        return self.queue_by_tag.entry([_range(self._priority, r.priority_lo, r.priority_hi),
                                        _range(self._deadline, r.deadline_lo_us, r.deadline_hi_us)],
                                       self.set_queue(r.qid, QUEUE_BY_TAG), priority=r.rank)

    def _tlr_entry(self, r: TlrRule) -> p4runtime_pb2.TableEntry:
        return self.queue_by_tlr.entry([_range(self._tlr, r.tlr_lo, r.tlr_hi)], self.set_queue(r.qid, QUEUE_BY_TLR),
                                       priority=TLR_RULE_PRIORITY)


class Ecn:
    """Mirrors ``NetApproxEgress.ecn``: ``ecn_thresholds`` (per logical queue: ``mark_ecn(threshold)``).
    Thresholds are in packets in ``SwitchState``; ``depth_unit`` converts (Tofino: cells per packet)."""

    def __init__(self, p4info: P4Info, depth_unit: int = 1) -> None:
        self.ecn_thresholds = TableMirror(p4info, ECN_THRESHOLDS)
        self._qid = self.ecn_thresholds.info.field("qid")
        self._mark = p4info.action(MARK_ECN)
        self._threshold = self._mark.param("threshold")
        self.depth_unit = depth_unit

    @property
    def tables(self) -> tuple[TableMirror, ...]:
        return (self.ecn_thresholds,)

    def desired(self, state: SwitchState) -> dict[TableMirror, tuple[dict, Callable]]:
        rules = _unique(state.ecn_rules, lambda r: r.qid, ECN_THRESHOLDS)
        return {self.ecn_thresholds: (rules, self._entry)}

    def _entry(self, r: EcnRule) -> p4runtime_pb2.TableEntry:
        return self.ecn_thresholds.entry([_exact(self._qid, r.qid)],
                                         _action(self._mark, threshold=r.depth_pkts * self.depth_unit))


# --- the driver -----------------------------------------------------------------------------------------


def _update_errors(e: grpc.RpcError, updates: list[p4runtime_pb2.Update]) -> list[UpdateError] | None:
    """Per-update errors from the ``grpc-status-details-bin`` trailer (p4.v1.Error per update), or None."""
    for key, value in (e.trailing_metadata() or ()):
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status()
        status.ParseFromString(value)
        errors = []
        for index, detail in enumerate(status.details):
            err = p4runtime_pb2.Error()
            if not detail.Unpack(err) or err.canonical_code == code_pb2.OK:
                continue
            update = text_format.MessageToString(updates[index], as_one_line=True) if index < len(updates) else ""
            errors.append(UpdateError(index, code_pb2.Code.Name(err.canonical_code), err.message, update))
        return errors
    return None


def build_tofino_device_config(prog_name: str, tofino_bin: bytes, context_json: bytes) -> bytes:
    """PI/Stratum-bf packing: each of program name, tofino.bin and context.json prefixed by its length
    (little-endian int32). Stratum-bfrt wants its BfPipelineConfig instead: pass it as ``device_config``."""
    name = prog_name.encode()
    return b"".join(struct.pack("<i", len(part)) + part for part in (name, tofino_bin, context_json))


class P4RuntimeDriver(Driver):
    """A NetApprox switch over P4Runtime (BMv2 simple_switch_grpc, Tofino)."""

    def __init__(self, name: str, options: P4RuntimeOptions, *, p4info: P4Info | None = None) -> None:
        self.name = name
        self.options = options
        try:
            self.p4info = p4info or P4Info.load(options.p4info)
        except FileNotFoundError:
            raise ConfigError(f"switch {name!r}: P4Info {options.p4info!r} not found (run `make p4`, or set the "
                              "switch option p4info)") from None
        tofino = options.target == "tofino"
        self.forwarding = Forwarding(self.p4info)
        self.classification = Classification(self.p4info)
        self.ecn = Ecn(self.p4info, depth_unit=options.cells_per_packet if tofino else 1)
        self._enqueued_id = self.p4info.counter_id(ENQUEUED_PACKETS)
        self._transmitted_id = self.p4info.counter_id(TRANSMITTED_PACKETS)
        self._job_counter_id = self.p4info.direct_counter_id(JOB_PACKETS)
        self._lock = threading.RLock()
        self._channel: grpc.Channel | None = None
        self._stub: p4runtime_pb2_grpc.P4RuntimeStub | None = None
        self._requests: queue.Queue | None = None
        self._stream: Any = None
        self._stream_thread: threading.Thread | None = None
        self._arbitration: queue.Queue = queue.Queue()
        self._packets_in: collections.deque[bytes] = collections.deque(maxlen=10000)
        self._broken: str | None = None
        self._connected = False
        self._desired: SwitchState | None = None
        self.pipeline_pushes = 0
        self.tm_client_factory: Callable[[], Any] | None = None  # tests inject a fake BfRt client

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> "P4RuntimeDriver":
        return cls(name, _coerce_options(name, options))

    @property
    def controls(self) -> tuple[Forwarding | Classification | Ecn, ...]:
        return (self.forwarding, self.classification, self.ecn)

    @property
    def election_id(self) -> p4runtime_pb2.Uint128:
        high, low = self.options.election_id
        return p4runtime_pb2.Uint128(high=high, low=low)

    # --- session ---

    def connect(self) -> None:
        with self._lock:
            self._teardown()
            opts = self.options
            self._channel = grpc.insecure_channel(opts.address)
            try:
                grpc.channel_ready_future(self._channel).result(timeout=opts.connect_timeout_s)
            except grpc.FutureTimeoutError:
                self._teardown()
                raise SwitchUnavailable(self.name, f"no P4Runtime server at {opts.address} "
                                                   f"after {opts.connect_timeout_s}s") from None
            self._stub = p4runtime_pb2_grpc.P4RuntimeStub(self._channel)
            try:
                self._open_stream()
                if opts.push_pipeline:
                    self._push_pipeline()
                self._configure_queues()
                for control in self.controls:
                    for table in control.tables:
                        table.installed.clear()
                self._connected = True
                if self._desired is not None:
                    self._write(self._desired)
            except BaseException:
                self._teardown()
                raise
            log.info("switch %r: connected to %s as primary (election id %s)", self.name, opts.address,
                     opts.election_id)

    def _open_stream(self) -> None:
        requests: queue.Queue = queue.Queue()
        self._requests = requests
        self._arbitration = queue.Queue()
        self._broken = None

        def request_iter():
            while True:
                item = requests.get()
                if item is None:
                    return
                yield item

        stream = self._stub.StreamChannel(request_iter())
        self._stream = stream
        thread = threading.Thread(target=self._read_stream, args=(stream,), name=f"p4rt-stream-{self.name}",
                                  daemon=True)
        self._stream_thread = thread
        thread.start()
        requests.put(p4runtime_pb2.StreamMessageRequest(arbitration=p4runtime_pb2.MasterArbitrationUpdate(
            device_id=self.options.device_id, election_id=self.election_id)))
        try:
            answer = self._arbitration.get(timeout=self.options.connect_timeout_s)
        except queue.Empty:
            raise SwitchUnavailable(self.name, "no arbitration answer on the stream channel") from None
        if isinstance(answer, str):
            raise SwitchUnavailable(self.name, f"stream channel closed during arbitration: {answer}")
        if answer.status.code != code_pb2.OK:
            raise NotPrimaryError(self.name, self.options.election_id,
                                  f"{code_pb2.Code.Name(answer.status.code)}: {answer.status.message}")

    def _read_stream(self, stream: Any) -> None:
        try:
            for message in stream:
                kind = message.WhichOneof("update")
                if kind == "arbitration":
                    if self._arbitration is not None:
                        self._arbitration.put(message.arbitration)
                    if self._connected and message.arbitration.status.code != code_pb2.OK:
                        self._broken = "lost primary: " + message.arbitration.status.message
                elif kind == "packet":
                    self._packets_in.append(bytes(message.packet.payload))
                elif kind == "error":
                    log.warning("switch %r: stream error: %s", self.name, message.error.message)
            reason = "stream channel closed by the switch"
        except grpc.RpcError as e:
            reason = f"stream channel: {e.code().name}: {e.details()}"
        except Exception as e:  # noqa: BLE001
            reason = f"stream channel: {e}"
        if self._stream is stream:
            self._broken = reason
            self._arbitration.put(reason)

    def _pipeline_config(self) -> p4runtime_pb2.ForwardingPipelineConfig:
        opts = self.options
        try:
            if opts.target == "bmv2":
                device = Path(opts.bmv2_json).read_bytes()
            elif opts.device_config:
                device = Path(opts.device_config).read_bytes()
            elif opts.tofino_bin and opts.tofino_context:
                device = build_tofino_device_config(opts.prog_name, Path(opts.tofino_bin).read_bytes(),
                                                    Path(opts.tofino_context).read_bytes())
            else:
                raise PipelineError(f"switch {self.name!r}: target tofino needs the option device_config, or "
                                    "tofino_bin and tofino_context (from `make p4-tna`)")
        except FileNotFoundError as e:
            raise PipelineError(f"switch {self.name!r}: pipeline artifact {e.filename!r} not found "
                                "(run `make p4`, or fix the switch options)") from None
        cookie = int.from_bytes(hashlib.sha256(self.p4info.message.SerializeToString(deterministic=True)
                                               + device).digest()[:8], "big")
        return p4runtime_pb2.ForwardingPipelineConfig(p4info=self.p4info.message, p4_device_config=device,
                                                      cookie=p4runtime_pb2.ForwardingPipelineConfig.Cookie(
                                                          cookie=cookie))

    def _push_pipeline(self) -> None:
        request = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.options.device_id, election_id=self.election_id,
            action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
            config=self._pipeline_config())
        try:
            self._stub.SetForwardingPipelineConfig(request, timeout=self.options.rpc_timeout_s)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                raise SwitchUnavailable(self.name, f"SetForwardingPipelineConfig: {e.details()}") from None
            raise PipelineError(f"switch {self.name!r}: SetForwardingPipelineConfig refused: "
                                f"{e.code().name}: {e.details()}") from None
        self.pipeline_pushes += 1

    def _configure_queues(self) -> None:
        opts = self.options
        try:
            if opts.target == "bmv2" and opts.thrift_port is not None and opts.ports:
                set_queue_depths(opts.ports, opts.buffer_packets, opts.thrift_port,
                                 host=opts.address.rsplit(":", 1)[0], cli=opts.cli)
            elif opts.target == "tofino" and (opts.bfrt_address or self.tm_client_factory) and opts.ports:
                from netapprox.controller.tofino_tm import BfrtTmClient, configure_queues

                client = (self.tm_client_factory() if self.tm_client_factory else
                          BfrtTmClient(opts.bfrt_address, opts.prog_name, prefix=opts.tm_prefix))
                try:
                    configure_queues(client, opts.ports, opts.buffer_packets, prefix=opts.tm_prefix,
                                     cells_per_packet=opts.cells_per_packet, pool=opts.tm_pool)
                finally:
                    client.close()
        except QueueConfigError as e:
            # Forwarding works without it (queues keep the target's default size); say so loudly.
            log.error("switch %r: queue buffers not configured: %s", self.name, e)
            self.queue_config_error = str(e)
        else:
            self.queue_config_error = None

    # --- writes ---

    def apply(self, desired: SwitchState) -> WriteSummary:
        with self._lock:
            self._check_up()
            self._desired = desired
            return self._write(desired)

    def pending_changes(self, desired: SwitchState) -> list[Change]:
        """The updates ``apply(desired)`` would send, in order: deletes, modifies, inserts."""
        changes: list[Change] = []
        for control in self.controls:
            for table, (rules, build) in control.desired(desired).items():
                changes.extend(table.diff(rules, build))
        order = {p4runtime_pb2.Update.DELETE: 0, p4runtime_pb2.Update.MODIFY: 1, p4runtime_pb2.Update.INSERT: 2}
        return sorted(changes, key=lambda c: order[c.kind])  # stable: table order, then key order

    def _write(self, desired: SwitchState) -> WriteSummary:
        changes = self.pending_changes(desired)
        if not changes:
            return WriteSummary()
        updates = [c.update() for c in changes]
        request = p4runtime_pb2.WriteRequest(device_id=self.options.device_id, election_id=self.election_id,
                                             updates=updates)
        try:
            self._stub.Write(request, timeout=self.options.rpc_timeout_s)
        except grpc.RpcError as e:
            if e.code() in UNAVAILABLE_CODES:
                self._connected = False
                raise SwitchUnavailable(self.name, f"Write: {e.code().name}: {e.details()}") from None
            errors = _update_errors(e, updates)
            if errors is None:
                raise P4RuntimeWriteError(self.name, [UpdateError(-1, e.code().name, e.details() or "", "")],
                                          len(updates)) from None
            failed = {err.index: err for err in errors}
            for index, change in enumerate(changes):
                err = failed.get(index)
                if err is None:
                    change.commit()
                else:
                    self._heal(change, err)
            raise P4RuntimeWriteError(self.name, errors, len(updates), e.details() or "") from None
        for change in changes:
            change.commit()
        return _summary(changes)

    @staticmethod
    def _heal(change: Change, err: UpdateError) -> None:
        """Make the next diff repair the disagreement behind ``err`` instead of repeating it."""
        if change.kind == p4runtime_pb2.Update.INSERT and err.code == "ALREADY_EXISTS":
            change.table.installed[change.key] = (None, change.entry)  # unknown content: next epoch sends MODIFY
        elif err.code == "NOT_FOUND":
            change.table.installed.pop(change.key, None)  # next epoch re-inserts it if still wanted

    def _check_up(self) -> None:
        if not self._connected or self._stub is None:
            raise SwitchUnavailable(self.name, "not connected")
        if self._broken:
            self._connected = False
            raise SwitchUnavailable(self.name, self._broken)

    # --- reads ---

    def read_counters(self) -> Counters:
        with self._lock:
            self._check_up()
            entities = []
            for counter_id in (self._enqueued_id, self._transmitted_id):
                if self.options.ports:
                    for port in sorted(self.options.ports):
                        for qid in range(NUM_QUEUES):
                            entities.append(p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(
                                counter_id=counter_id, index=p4runtime_pb2.Index(index=port * NUM_QUEUES + qid))))
                else:
                    entities.append(p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry(
                        counter_id=counter_id)))
            entities.append(p4runtime_pb2.Entity(direct_counter_entry=p4runtime_pb2.DirectCounterEntry(
                table_entry=p4runtime_pb2.TableEntry(table_id=self.classification.queue_by_job.info.id))))
            request = p4runtime_pb2.ReadRequest(device_id=self.options.device_id, entities=entities)
            enq: dict[int, int] = {}
            tx: dict[int, int] = {}
            jobs: dict[int, int] = {}
            try:
                for response in self._stub.Read(request, timeout=self.options.rpc_timeout_s):
                    for entity in response.entities:
                        kind = entity.WhichOneof("entity")
                        if kind == "counter_entry":
                            c = entity.counter_entry
                            target = enq if c.counter_id == self._enqueued_id else tx
                            target[c.index.index] = c.data.packet_count
                        elif kind == "direct_counter_entry":
                            d = entity.direct_counter_entry
                            for m in d.table_entry.match:
                                jobs[decode(m.exact.value)] = d.data.packet_count
            except grpc.RpcError as e:
                if e.code() in UNAVAILABLE_CODES:
                    self._connected = False
                    raise SwitchUnavailable(self.name, f"Read: {e.code().name}: {e.details()}") from None
                raise ControllerError(f"switch {self.name!r}: reading counters failed: {e.code().name}: "
                                      f"{e.details()}") from None
            queues = []
            for index in sorted(set(enq) | set(tx)):
                e_count, t_count = enq.get(index, 0), tx.get(index, 0)
                port, qid = divmod(index, NUM_QUEUES)
                if not self.options.ports and e_count == 0 and t_count == 0:
                    continue
                queues.append(QueueStats(port=port, qid=qid, enqueued=e_count, transmitted=t_count,
                                         dropped=max(0, e_count - t_count)))
            return Counters(queues=tuple(queues), job_packets=jobs)

    def drain_packet_in(self) -> list[bytes]:
        out = []
        while self._packets_in:
            out.append(self._packets_in.popleft())
        return out

    # --- teardown ---

    def _teardown(self) -> None:
        self._connected = False
        stream, self._stream = self._stream, None
        if self._requests is not None:
            self._requests.put(None)
            self._requests = None
        if stream is not None:
            stream.cancel()
        if self._stream_thread is not None:
            self._stream_thread.join(timeout=5)
            self._stream_thread = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        self._stub = None

    def close(self) -> None:
        with self._lock:
            self._teardown()


def _summary(changes: list[Change]) -> WriteSummary:
    kinds = collections.Counter(c.kind for c in changes)
    return WriteSummary(inserted=kinds[p4runtime_pb2.Update.INSERT], modified=kinds[p4runtime_pb2.Update.MODIFY],
                        deleted=kinds[p4runtime_pb2.Update.DELETE])
