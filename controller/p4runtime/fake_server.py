"""An in-process fake P4Runtime server (no switch needed): the tests, the controller benchmark and
``netapprox-controller --dry-run`` run against it.

It behaves like a P4Runtime target where the controller can tell: client arbitration as the specification
says (below), SetForwardingPipelineConfig (required before writes; clears the tables, meters and counters) and
GetForwardingPipelineConfig (``COOKIE_ONLY`` too; FAILED_PRECONDITION without a pipeline, as BMv2's PI
server answers), Writes with per-update errors reported in the ``grpc-status-details-bin`` trailer as
``p4.v1.Error``, Reads of table entries, meter configs, indirect counters (values set by the test) and direct
counters, and packet-in on the StreamChannel. It records every request. ``restart()`` stops it and starts a
fresh one on the same port, like a switch reboot.

Client arbitration follows the P4Runtime specification (1.4, "Client Arbitration and Controller Replication"),
so a test cannot pass against a switch that would refuse it, for each (device, role):

- a StreamChannel's first MasterArbitrationUpdate names the device (another: the stream ends with NOT_FOUND) and
  an election id no other live client of that role holds (else the stream ends with INVALID_ARGUMENT); a later
  one may change the election id, not the device or the role (FAILED_PRECONDITION);
- the primary is the client whose election id is at least the highest the device has ever received for the role
  (``election_id_past``: it survives the primary's departure, only ``restart()`` resets it); an unset election id
  is lower than any and never primary. So when the primary's stream breaks there is no primary until a client
  arbitrates again with an id >= that one (a backup is not promoted by the switch);
- every change of primary (a new one, one that steps down, one that disconnects) is announced to every client of
  the role: status OK to the primary, ALREADY_EXISTS to backups while there is a primary, NOT_FOUND when there is
  none, with the highest election id seen (unset if there has never been a primary); a client that arbitrates
  without changing the primary is answered alone;
- Write and SetForwardingPipelineConfig are accepted only with the primary's (device, role, election id):
  PERMISSION_DENIED otherwise (counted in ``denied``); packet-in goes to the primary only, and a packet-out from a
  backup is answered with a stream error.

Writes are checked against the pushed P4Info the way the P4Runtime spec (1.4, §8.4, §9.1) asks, so an encoding
bug fails here without BMv2:

- values are canonical bytestrings (big-endian, no leading zero byte, at least one byte; or zero-padded to the
  field's whole bytes, which P4Runtime servers accept too) that fit the field's
  bit width (INVALID_ARGUMENT / OUT_OF_RANGE);
- every field id, match kind, action id and parameter id exists in the P4Info, exact fields are present, no
  field or parameter twice, the action is one of the table's (not a default-only one) (INVALID_ARGUMENT);
- a don't-care is omitted: ternary mask 0, a full range or LPM prefix 0 are refused, as are ternary values
  with bits outside the mask, LPM values with bits beyond the prefix, and ranges with low > high;
- tables with a ternary, range or optional key need a priority > 0, other tables priority 0;
- INSERT of an existing entry: ALREADY_EXISTS; MODIFY/DELETE of a missing one: NOT_FOUND; INSERT into a full
  table (P4Info ``size``, or ``capacity[table_id]``): RESOURCE_EXHAUSTED;
- meters are only MODIFYed, with an index below their size and ``cir <= pir``.

Tests may refuse chosen updates with ``refuse = lambda update: (code, message) | None``.

``SHIPPED_P4INFO`` is the P4Info of p4src/'s v1model program, written by hand (names, ids, widths) so that the
tests, the benchmark and ``netapprox-controller --dry-run`` need no P4 compiler; tests/controller/test_ctl_bmv2.py
checks it against p4c's wherever p4c is installed.
"""
from __future__ import annotations

import collections
import concurrent.futures
import queue
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from netapprox.controller.p4runtime.protos import p4info_pb2, p4runtime_pb2, p4runtime_pb2_grpc

MT = p4info_pb2.MatchField
SHIPPED_P4INFO = Path(__file__).with_name("p4info.txtpb")


def _entry_key(entry: p4runtime_pb2.TableEntry) -> tuple:
    matches = tuple(sorted(m.SerializeToString(deterministic=True) for m in entry.match))
    return (entry.table_id, matches, entry.priority)


class _Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _value(data: bytes, bitwidth: int, what: str) -> int:
    """The integer of a canonical or full-width (zero-padded to the field's bytes) bytestring of a
    ``bitwidth``-bit field, or _Refused."""
    if not data:
        raise _Refused(code_pb2.INVALID_ARGUMENT, f"{what}: empty bytestring")
    if len(data) > 1 and data[0] == 0 and len(data) != (bitwidth + 7) // 8:
        raise _Refused(code_pb2.INVALID_ARGUMENT, f"{what}: bytestring {data.hex()} is not canonical (leading zero)")
    value = int.from_bytes(data, "big")
    if value >= 1 << bitwidth:
        raise _Refused(code_pb2.OUT_OF_RANGE, f"{what}: {value} does not fit in {bitwidth} bits")
    return value


_KINDS = {MT.EXACT: "exact", MT.LPM: "lpm", MT.TERNARY: "ternary", MT.RANGE: "range", MT.OPTIONAL: "optional"}


class _Table:
    """One table of the pushed P4Info as plain data (the checks run for every update)."""

    __slots__ = ("name", "size", "fields", "exact_ids", "needs_priority", "actions")

    def __init__(self, t: p4info_pb2.Table) -> None:
        self.name = t.preamble.name
        self.size = t.size
        self.fields = {f.id: (_KINDS.get(f.match_type), f.bitwidth, f.name) for f in t.match_fields}
        self.exact_ids = frozenset(f.id for f in t.match_fields if f.match_type == MT.EXACT)
        self.needs_priority = any(f.match_type in (MT.TERNARY, MT.RANGE, MT.OPTIONAL) for f in t.match_fields)
        self.actions = {r.id: r.scope == p4info_pb2.ActionRef.DEFAULT_ONLY for r in t.action_refs}


class _Pipeline:
    """The P4Info of the pushed pipeline, indexed for the checks."""

    def __init__(self, p4info: p4info_pb2.P4Info) -> None:
        self.tables = {t.preamble.id: _Table(t) for t in p4info.tables}
        self.actions = {a.preamble.id: {p.id: (p.bitwidth, p.name) for p in a.params} for a in p4info.actions}
        self.meters = {m.preamble.id: m.size for m in p4info.meters}

    def check_entry(self, entry: p4runtime_pb2.TableEntry, with_action: bool) -> None:
        table = self.tables[entry.table_id]
        seen = set()
        for m in entry.match:
            field = table.fields.get(m.field_id)
            if field is None:
                raise _Refused(code_pb2.INVALID_ARGUMENT, f"unknown field id {m.field_id} in {table.name}")
            if m.field_id in seen:
                raise _Refused(code_pb2.INVALID_ARGUMENT, f"field {field[2]} twice")
            seen.add(m.field_id)
            self._check_match(field, m)
        if not table.exact_ids <= seen:
            raise _Refused(code_pb2.INVALID_ARGUMENT, f"exact field(s) {sorted(table.exact_ids - seen)} missing")
        if table.needs_priority and entry.priority <= 0:
            raise _Refused(code_pb2.INVALID_ARGUMENT, f"{table.name} has ternary/range keys: priority > 0")
        if not table.needs_priority and entry.priority != 0:
            raise _Refused(code_pb2.INVALID_ARGUMENT, f"{table.name} has no ternary/range key: priority 0")
        if entry.is_default_action:
            raise _Refused(code_pb2.UNIMPLEMENTED, "default entries are not supported by this fake")
        if with_action:
            self._check_action(table, entry.action)

    @staticmethod
    def _check_match(field: tuple, m: p4runtime_pb2.FieldMatch) -> None:
        want, w, name = field
        kind = m.WhichOneof("field_match_type")
        if kind != want:
            raise _Refused(code_pb2.INVALID_ARGUMENT, f"field {name} is {want}, got {kind}")
        if kind == "exact":
            _value(m.exact.value, w, name)
        elif kind == "ternary":
            value, mask = _value(m.ternary.value, w, name), _value(m.ternary.mask, w, name + " mask")
            if mask == 0:
                raise _Refused(code_pb2.INVALID_ARGUMENT, f"{name}: ternary mask 0 (don't care): omit the field")
            if value & ~mask:
                raise _Refused(code_pb2.INVALID_ARGUMENT, f"{name}: value has bits outside the mask")
        elif kind == "lpm":
            value, plen = _value(m.lpm.value, w, name), m.lpm.prefix_len
            if plen == 0:
                raise _Refused(code_pb2.INVALID_ARGUMENT, f"{name}: prefix length 0 (don't care): omit the field")
            if plen > w:
                raise _Refused(code_pb2.INVALID_ARGUMENT, f"{name}: prefix length {plen} > {w}")
            if value & ((1 << (w - plen)) - 1):
                raise _Refused(code_pb2.INVALID_ARGUMENT, f"{name}: value has bits beyond the prefix")
        elif kind == "range":
            low, high = _value(m.range.low, w, name + " low"), _value(m.range.high, w, name + " high")
            if low > high:
                raise _Refused(code_pb2.INVALID_ARGUMENT, f"{name}: range low > high")
            if low == 0 and high == (1 << w) - 1:
                raise _Refused(code_pb2.INVALID_ARGUMENT, f"{name}: full range (don't care): omit the field")
        else:
            _value(m.optional.value, w, name)

    def _check_action(self, table: _Table, table_action: p4runtime_pb2.TableAction) -> None:
        if table_action.WhichOneof("type") != "action":
            raise _Refused(code_pb2.INVALID_ARGUMENT, "the entry needs a direct action")
        action = table_action.action
        default_only = table.actions.get(action.action_id)
        if default_only is None:
            raise _Refused(code_pb2.INVALID_ARGUMENT, f"action {action.action_id} is not one of {table.name}'s")
        if default_only:
            raise _Refused(code_pb2.INVALID_ARGUMENT, f"action {action.action_id} is default-only")
        params = self.actions[action.action_id]
        seen = set()
        for p in action.params:
            info = params.get(p.param_id)
            if info is None or p.param_id in seen:
                raise _Refused(code_pb2.INVALID_ARGUMENT, f"bad or repeated param id {p.param_id}")
            seen.add(p.param_id)
            _value(p.value, *info)
        if len(seen) != len(params):
            raise _Refused(code_pb2.INVALID_ARGUMENT, f"action {action.action_id}: params {sorted(set(params) - seen)} "
                                                      "missing")


class _Servicer(p4runtime_pb2_grpc.P4RuntimeServicer):
    def __init__(self, fake: "FakeP4RuntimeServer") -> None:
        self.fake = fake

    def Write(self, request, context):  # noqa: N802 - gRPC API
        return self.fake._write(request, context)

    def Read(self, request, context):  # noqa: N802
        return self.fake._read(request, context)

    def SetForwardingPipelineConfig(self, request, context):  # noqa: N802
        return self.fake._set_pipeline(request, context)

    def GetForwardingPipelineConfig(self, request, context):  # noqa: N802
        return self.fake._get_pipeline(request, context)

    def StreamChannel(self, request_iterator, context):  # noqa: N802
        return self.fake._stream(request_iterator, context)

    def Capabilities(self, request, context):  # noqa: N802
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version="1.4.1")


class FakeP4RuntimeServer:
    """See the module docstring. Attributes tests read: ``pipelines``, ``writes`` (accepted), ``reads``, ``tables``,
    ``meters``, ``packets_out``, ``arbitrations`` (received), ``advisories`` (sent: (to, status code, primary id)),
    ``denied`` (election id -> Writes refused with PERMISSION_DENIED), ``primary()``; tests set
    ``counters[(counter_id, index)] = (packets, bytes)``, ``direct_counts[table_entry_key] = packets``,
    ``capacity[table_id] = entries`` and ``refuse``."""

    def __init__(self, address: str = "127.0.0.1:0", device_id: int = 1) -> None:
        self.device_id = device_id
        self.lock = threading.RLock()
        self._bind = address
        self.port = 0
        self._server: grpc.Server | None = None
        self.on_write: Callable[[p4runtime_pb2.WriteRequest, float], None] | None = None
        self.keep_requests = True
        """Record every Write in ``writes`` (a benchmark turns it off)."""
        self.refuse: Callable[[p4runtime_pb2.Update], tuple[int, str] | None] | None = None
        """Refuse an update with (google.rpc code, message) before any other check (tests of write errors)."""
        self.capacity: dict[int, int] = {}
        """table id -> entries it holds, below its P4Info size (tests of RESOURCE_EXHAUSTED)."""
        self._reset_state()

    def _reset_state(self) -> None:
        self.pipelines: list[p4runtime_pb2.SetForwardingPipelineConfigRequest] = []
        self.pipeline: p4runtime_pb2.SetForwardingPipelineConfigRequest | None = None
        self._p4: _Pipeline | None = None
        self.writes: list[p4runtime_pb2.WriteRequest] = []
        self.reads: list[p4runtime_pb2.ReadRequest] = []
        self.tables: dict[tuple, p4runtime_pb2.TableEntry] = {}
        self._counts: dict[int, int] = {}  # table id -> entries written (the size check; edits of `tables` bypass it)
        self.meters: dict[tuple[int, int], p4runtime_pb2.MeterConfig] = {}
        self.counters: dict[tuple[int, int], tuple[int, int]] = {}
        self.direct_counts: dict[tuple, int] = {}
        self.packets_out: list[p4runtime_pb2.PacketOut] = []
        self.arbitrations: list[p4runtime_pb2.MasterArbitrationUpdate] = []
        self.advisories: list[tuple[tuple[int, int] | None, int, tuple[int, int] | None]] = []
        self.denied: dict[tuple[int, int] | None, int] = collections.Counter()
        self._clients: list[_Client] = []  # live clients: StreamChannels that arbitrated successfully
        self._primary: dict[str, _Client] = {}  # role -> its primary, while there is one
        self._past: dict[str, tuple[int, int]] = {}  # role -> highest election id ever received (election_id_past)

    # --- lifecycle ---

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "FakeP4RuntimeServer":
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=16))
        p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(_Servicer(self), server)
        bind = self._bind if self.port == 0 else f"127.0.0.1:{self.port}"
        port = server.add_insecure_port(bind)
        if port == 0:
            raise OSError(f"fake P4Runtime server cannot bind {bind}")
        self.port = port
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        with self.lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.out.put(None)
        if self._server is not None:
            self._server.stop(grace=0).wait(5)
            self._server = None

    def restart(self, down_s: float = 0.0) -> None:
        """A switch reboot: stop, forget everything (pipeline, tables, counters), start on the same port."""
        self.stop()
        with self.lock:
            self._reset_state()
        if down_s:
            time.sleep(down_s)
        self.start()

    def __enter__(self) -> "FakeP4RuntimeServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- test helpers ---

    def load_pipeline(self, config: p4runtime_pb2.ForwardingPipelineConfig) -> None:
        """Install a pipeline as another tool would (for tests with ``push_pipeline = false``)."""
        with self.lock:
            self.pipeline = p4runtime_pb2.SetForwardingPipelineConfigRequest(device_id=self.device_id, config=config)
            self._p4 = _Pipeline(config.p4info)
            self.tables.clear()
            self._counts.clear()
            self.meters.clear()

    def send_packet_in(self, payload: bytes, ingress_port: int = 1) -> None:
        """Send a packet-in to the primary (metadata id 1: ingress_port, canonical bytes); dropped without one."""
        port = ingress_port.to_bytes(max(1, (ingress_port.bit_length() + 7) // 8), "big")
        msg = p4runtime_pb2.StreamMessageResponse(packet=p4runtime_pb2.PacketIn(
            payload=payload, metadata=[p4runtime_pb2.PacketMetadata(metadata_id=1, value=port)]))
        with self.lock:
            primary = self._primary.get("")
            if primary is not None:
                primary.out.put(msg)

    def primary(self, role: str = "") -> tuple[int, int] | None:
        """The election id of the role's primary, or None while there is none."""
        with self.lock:
            client = self._primary.get(role)
            return None if client is None else client.election

    def drop_client(self, election_id: tuple[int, int], role: str = "") -> None:
        """End the StreamChannel of the live client with ``election_id`` (its connection broke: a partition)."""
        with self.lock:
            for client in self._clients:
                if client.role == role and client.election == election_id:
                    client.out.put(_END)

    def entries(self, table_id: int | None = None) -> list[p4runtime_pb2.TableEntry]:
        with self.lock:
            return [e for e in self.tables.values() if table_id is None or e.table_id == table_id]

    def table_writes(self) -> list[p4runtime_pb2.WriteRequest]:
        """The recorded Writes that touch table entries (not meter configuration)."""
        with self.lock:
            return [w for w in self.writes if any(u.entity.HasField("table_entry") for u in w.updates)]

    def wait_for_writes(self, n: int, timeout: float = 5.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if len(self.writes) >= n:
                    return True
            time.sleep(0.002)
        return False

    # --- RPCs ---

    def _check_primary(self, request, context) -> None:
        """Writes come from the primary of their (device, role), named by its election id (called under the lock)."""
        if request.device_id != self.device_id:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no device {request.device_id}")
        primary = self._primary.get(request.role)
        election = _election(request)
        if primary is None or election != primary.election:
            self.denied[election] += 1
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "not primary")

    def _set_pipeline(self, request, context):
        with self.lock:
            if request.device_id != self.device_id:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no device {request.device_id}")
            self._check_primary(request, context)
            if not request.config.p4info.tables:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "P4Info has no tables")
            self.pipelines.append(request)
            self.pipeline = request
            self._p4 = _Pipeline(request.config.p4info)
            self.tables.clear()
            self._counts.clear()
            self.meters.clear()
            self.counters.clear()
            self.direct_counts.clear()
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def _get_pipeline(self, request, context):
        with self.lock:
            if self.pipeline is None:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "No forwarding pipeline config set")
            config = self.pipeline.config
            if request.response_type == p4runtime_pb2.GetForwardingPipelineConfigRequest.COOKIE_ONLY:
                config = p4runtime_pb2.ForwardingPipelineConfig(cookie=config.cookie)
        return p4runtime_pb2.GetForwardingPipelineConfigResponse(config=config)

    def _write(self, request, context):
        stamp = time.perf_counter()
        with self.lock:
            self._check_primary(request, context)
            if self.pipeline is None:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no forwarding pipeline config set")
            if self.keep_requests:
                self.writes.append(request)
            errors = []
            for update in request.updates:
                try:
                    errors.append(self._apply(update))
                except _Refused as e:
                    errors.append((e.code, e.message))
        if self.on_write is not None:
            self.on_write(request, stamp)
        if any(code != code_pb2.OK for code, _ in errors):
            status = status_pb2.Status(code=code_pb2.UNKNOWN, message="Write failure.")
            for code, message in errors:
                detail = any_pb2.Any()
                detail.Pack(p4runtime_pb2.Error(canonical_code=code, message=message, space="targetX"))
                status.details.append(detail)
            context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
            context.abort(grpc.StatusCode.UNKNOWN, "Write failure.")
        return p4runtime_pb2.WriteResponse()

    def _apply(self, update: p4runtime_pb2.Update) -> tuple[int, str]:
        if self.refuse is not None:
            refused = self.refuse(update)
            if refused is not None:
                return refused
        kind = update.entity.WhichOneof("entity")
        if kind == "meter_entry":
            return self._apply_meter(update)
        if kind != "table_entry":
            return code_pb2.UNIMPLEMENTED, f"{kind} writes are not supported by this fake"
        entry = update.entity.table_entry
        if entry.table_id not in self._p4.tables:
            return code_pb2.NOT_FOUND, f"unknown table id {entry.table_id}"
        if update.type not in (p4runtime_pb2.Update.INSERT, p4runtime_pb2.Update.MODIFY, p4runtime_pb2.Update.DELETE):
            return code_pb2.INVALID_ARGUMENT, "update type unspecified"
        self._p4.check_entry(entry, with_action=update.type != p4runtime_pb2.Update.DELETE)
        key = _entry_key(entry)
        if update.type == p4runtime_pb2.Update.INSERT:
            if key in self.tables:
                return code_pb2.ALREADY_EXISTS, "Match entry exists, use MODIFY if you wish to change action"
            room = min(self._p4.tables[entry.table_id].size or 1 << 30, self.capacity.get(entry.table_id, 1 << 30))
            if self._counts.get(entry.table_id, 0) >= room:
                return code_pb2.RESOURCE_EXHAUSTED, f"table {entry.table_id} is full ({room} entries)"
            self.tables[key] = entry
            self._counts[entry.table_id] = self._counts.get(entry.table_id, 0) + 1
        elif update.type == p4runtime_pb2.Update.MODIFY:
            if key not in self.tables:
                return code_pb2.NOT_FOUND, "Cannot find match entry"
            self.tables[key] = entry
        else:
            if key not in self.tables:
                return code_pb2.NOT_FOUND, "Cannot find match entry"
            del self.tables[key]
            self._counts[entry.table_id] = max(0, self._counts.get(entry.table_id, 0) - 1)
            self.direct_counts.pop(key, None)
        return code_pb2.OK, ""

    def _apply_meter(self, update: p4runtime_pb2.Update) -> tuple[int, str]:
        m = update.entity.meter_entry
        size = self._p4.meters.get(m.meter_id)
        if size is None:
            return code_pb2.NOT_FOUND, f"unknown meter id {m.meter_id}"
        if update.type != p4runtime_pb2.Update.MODIFY:
            return code_pb2.INVALID_ARGUMENT, "meter entries are only modified"
        if not m.HasField("index"):
            return code_pb2.UNIMPLEMENTED, "wildcard meter writes are not supported by this fake"
        if not 0 <= m.index.index < size:
            return code_pb2.OUT_OF_RANGE, f"meter index {m.index.index} >= {size}"
        c = m.config
        if c.cir > c.pir:
            return code_pb2.INVALID_ARGUMENT, "meter cir > pir"
        if m.HasField("config"):
            self.meters[(m.meter_id, m.index.index)] = c
        else:
            self.meters.pop((m.meter_id, m.index.index), None)  # back to the default (unconfigured)
        return code_pb2.OK, ""

    def _read(self, request, context) -> Iterator[p4runtime_pb2.ReadResponse]:
        with self.lock:
            self.reads.append(request)
            if self.pipeline is None:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no forwarding pipeline config set")
            response = p4runtime_pb2.ReadResponse()
            for entity in request.entities:
                kind = entity.WhichOneof("entity")
                if kind == "table_entry":
                    for e in self.tables.values():
                        if entity.table_entry.table_id in (0, e.table_id):
                            response.entities.add().table_entry.CopyFrom(e)
                elif kind == "meter_entry":
                    m = entity.meter_entry
                    for (mid, index), config in sorted(self.meters.items()):
                        if mid == m.meter_id and (not m.HasField("index") or index == m.index.index):
                            out = response.entities.add().meter_entry
                            out.meter_id, out.index.index = mid, index
                            out.config.CopyFrom(config)
                elif kind == "counter_entry":
                    c = entity.counter_entry
                    wildcard = not c.HasField("index")
                    for (cid, index), (packets, nbytes) in sorted(self.counters.items()):
                        if cid == c.counter_id and (wildcard or index == c.index.index):
                            out = response.entities.add().counter_entry
                            out.counter_id, out.index.index = cid, index
                            out.data.packet_count, out.data.byte_count = packets, nbytes
                    if not wildcard and (c.counter_id, c.index.index) not in self.counters:
                        out = response.entities.add().counter_entry
                        out.counter_id, out.index.index = c.counter_id, c.index.index
                elif kind == "direct_counter_entry":
                    table_id = entity.direct_counter_entry.table_entry.table_id
                    for key, e in self.tables.items():
                        if e.table_id == table_id:
                            out = response.entities.add().direct_counter_entry
                            out.table_entry.table_id = e.table_id
                            out.table_entry.match.extend(e.match)
                            out.table_entry.priority = e.priority
                            out.data.packet_count = self.direct_counts.get(key, 0)
        yield response

    def _stream(self, request_iterator, context) -> Iterator[p4runtime_pb2.StreamMessageResponse]:
        out: queue.Queue = queue.Queue()
        holder: list[_Client | None] = [None]  # this stream's client once it has arbitrated

        def reader() -> None:
            try:
                for request in request_iterator:
                    kind = request.WhichOneof("update")
                    if kind == "arbitration":
                        self._arbitrate(request.arbitration, out, holder)
                    elif kind == "packet":
                        with self.lock:
                            client = holder[0]
                            if client is not None and self._primary.get(client.role) is client:
                                self.packets_out.append(request.packet)
                            else:
                                out.put(p4runtime_pb2.StreamMessageResponse(error=p4runtime_pb2.StreamError(
                                    canonical_code=code_pb2.PERMISSION_DENIED, message="packet-out from a backup",
                                    packet_out=p4runtime_pb2.PacketOutError(packet_out=request.packet))))
            except Exception:  # noqa: BLE001 - the client went away
                pass
            finally:
                out.put(None)

        threading.Thread(target=reader, daemon=True).start()
        context.add_callback(lambda: out.put(None))
        try:
            while True:
                item = out.get()
                if item is None or item is _END:
                    return
                if isinstance(item, _Refusal):
                    context.abort(item.code, item.message)
                yield item
        finally:
            with self.lock:
                client = holder[0]
                if client is not None and client in self._clients:
                    self._clients.remove(client)
                    if self._primary.get(client.role) is client:
                        del self._primary[client.role]  # no primary until a client arbitrates >= the past id
                        self._announce(client.role)

    def _arbitrate(self, update: p4runtime_pb2.MasterArbitrationUpdate, out: queue.Queue,
                   holder: list) -> None:
        election = _election(update)
        role = update.role.name
        with self.lock:
            self.arbitrations.append(update)
            client = holder[0]
            used = any(c is not client and c.role == role and c.election == election for c in self._clients)
            if client is None:
                if update.device_id != self.device_id:
                    out.put(_Refusal(grpc.StatusCode.NOT_FOUND, f"unknown device {update.device_id}"))
                    return
                if election is not None and used:
                    out.put(_Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"election id {election} is in use"))
                    return
                client = holder[0] = _Client(out, role, election)
                self._clients.append(client)
            else:
                if update.device_id != self.device_id or role != client.role:
                    out.put(_Refusal(grpc.StatusCode.FAILED_PRECONDITION, "device or role changed on the stream"))
                    return
                if election is not None and used:
                    out.put(_Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"election id {election} is in use"))
                    return
                client.election = election
            was_primary = self._primary.get(role) is client
            past = self._past.get(role)
            if election is not None and (past is None or election >= past):
                self._past[role] = election
                self._primary[role] = client
                self._announce(role)  # the others first, then the new primary
            elif was_primary:
                del self._primary[role]  # it stepped down: nobody is primary
                self._announce(role)
            else:
                self._advise(client)

    def _announce(self, role: str) -> None:
        """An arbitration update to every client of ``role`` (the primary last)."""
        primary = self._primary.get(role)
        for client in self._clients:
            if client.role == role and client is not primary:
                self._advise(client)
        if primary is not None:
            self._advise(primary)

    def _advise(self, client: "_Client") -> None:
        primary = self._primary.get(client.role)
        past = self._past.get(client.role)
        code = code_pb2.OK if client is primary else code_pb2.ALREADY_EXISTS if primary else code_pb2.NOT_FOUND
        message = p4runtime_pb2.MasterArbitrationUpdate(
            device_id=self.device_id,
            status=status_pb2.Status(code=code, message={code_pb2.OK: "primary", code_pb2.ALREADY_EXISTS: "backup",
                                                         code_pb2.NOT_FOUND: "no primary"}[code]))
        if client.role:
            message.role.name = client.role
        if past is not None:
            message.election_id.high, message.election_id.low = past
        self.advisories.append((client.election, code, past))
        client.out.put(p4runtime_pb2.StreamMessageResponse(arbitration=message))


class _Client:
    """A StreamChannel that arbitrated: its role, its election id (None: unset) and its response queue."""

    __slots__ = ("out", "role", "election")

    def __init__(self, out: queue.Queue, role: str, election: tuple[int, int] | None) -> None:
        self.out = out
        self.role = role
        self.election = election


class _Refusal:
    """Ends a StreamChannel with a status (an arbitration update the specification refuses)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = message


_END = object()  # ends a StreamChannel as if its connection broke


def _election(message) -> tuple[int, int] | None:
    """(high, low) of a message's election id, None when it is unset."""
    if not message.HasField("election_id"):
        return None
    return (message.election_id.high, message.election_id.low)
