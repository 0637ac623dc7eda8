"""An in-process fake P4Runtime server, for tests and benchmarks (no switch needed).

It behaves like a P4Runtime target where the controller can tell: arbitration (highest election id is
primary), SetForwardingPipelineConfig (required before writes; clears the tables, meters and counters) and
GetForwardingPipelineConfig (``COOKIE_ONLY`` too; FAILED_PRECONDITION without a pipeline, as BMv2's PI
server answers), Writes with per-update errors reported in the ``grpc-status-details-bin`` trailer as
``p4.v1.Error``, Reads of table entries, meter configs, indirect counters (values set by the test) and direct
counters, and packet-in on the StreamChannel. It records every request. ``restart()`` stops it and starts a
fresh one on the same port, like a switch reboot.

Writes are checked against the pushed P4Info the way the P4Runtime spec (1.4, §8.4, §9.1) asks, so an encoding
bug fails here without BMv2:

- values are canonical bytestrings (big-endian, no leading zero byte, at least one byte) that fit the field's
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
"""
from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from typing import Callable, Iterator

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from netapprox.controller.p4runtime.protos import p4info_pb2, p4runtime_pb2, p4runtime_pb2_grpc

MT = p4info_pb2.MatchField


def _entry_key(entry: p4runtime_pb2.TableEntry) -> tuple:
    matches = tuple(sorted(m.SerializeToString(deterministic=True) for m in entry.match))
    return (entry.table_id, matches, entry.priority)


class _Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _value(data: bytes, bitwidth: int, what: str) -> int:
    """The integer of a canonical bytestring of a ``bitwidth``-bit field, or _Refused."""
    if not data:
        raise _Refused(code_pb2.INVALID_ARGUMENT, f"{what}: empty bytestring")
    if len(data) > 1 and data[0] == 0:
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
    """See the module docstring. Attributes tests read: ``pipelines``, ``writes``, ``reads``, ``tables``,
    ``meters``, ``packets_out``; tests set ``counters[(counter_id, index)] = (packets, bytes)``,
    ``direct_counts[table_entry_key] = packets``, ``capacity[table_id] = entries`` and ``refuse``."""

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
        self._streams: list[tuple[queue.Queue, tuple[int, int]]] = []
        self._primary: tuple[int, int] | None = None

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
            streams, self._streams = self._streams, []
        for out, _ in streams:
            out.put(None)
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
        """Send a packet-in to every connected stream (metadata id 1: ingress_port, canonical bytes)."""
        port = ingress_port.to_bytes(max(1, (ingress_port.bit_length() + 7) // 8), "big")
        msg = p4runtime_pb2.StreamMessageResponse(packet=p4runtime_pb2.PacketIn(
            payload=payload, metadata=[p4runtime_pb2.PacketMetadata(metadata_id=1, value=port)]))
        with self.lock:
            for out, _ in self._streams:
                out.put(msg)

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

    def _check_primary(self, election_id: p4runtime_pb2.Uint128, context) -> None:
        if self._primary is None or (election_id.high, election_id.low) != self._primary:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "not primary")

    def _set_pipeline(self, request, context):
        with self.lock:
            if request.device_id != self.device_id:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no device {request.device_id}")
            self._check_primary(request.election_id, context)
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
            self._check_primary(request.election_id, context)
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
        slot = [out, (0, 0)]

        def reader() -> None:
            try:
                for request in request_iterator:
                    kind = request.WhichOneof("update")
                    if kind == "arbitration":
                        self._arbitrate(request.arbitration, slot)
                    elif kind == "packet":
                        with self.lock:
                            self.packets_out.append(request.packet)
            except Exception:  # noqa: BLE001 - the client went away
                pass
            finally:
                out.put(None)

        threading.Thread(target=reader, daemon=True).start()
        context.add_callback(lambda: out.put(None))
        try:
            while True:
                item = out.get()
                if item is None:
                    return
                yield item
        finally:
            with self.lock:
                self._streams = [s for s in self._streams if s[0] is not out]
                if self._primary == slot[1] and not any(s[1] == slot[1] for s in self._streams):
                    self._primary = max((s[1] for s in self._streams), default=None)

    def _arbitrate(self, update: p4runtime_pb2.MasterArbitrationUpdate, slot: list) -> None:
        election = (update.election_id.high, update.election_id.low)
        with self.lock:
            self.arbitrations.append(update)
            if update.device_id != self.device_id:
                slot[0].put(p4runtime_pb2.StreamMessageResponse(arbitration=p4runtime_pb2.MasterArbitrationUpdate(
                    device_id=update.device_id, status=status_pb2.Status(code=code_pb2.NOT_FOUND,
                                                                          message="unknown device"))))
                return
            slot[1] = election
            if not any(s[0] is slot[0] for s in self._streams):
                self._streams.append((slot[0], election))
            else:
                self._streams = [(q, election if q is slot[0] else e) for q, e in self._streams]
            if self._primary is None or election >= self._primary:
                self._primary = election
            primary = self._primary
            for q, e in self._streams:
                ok = e == primary
                q.put(p4runtime_pb2.StreamMessageResponse(arbitration=p4runtime_pb2.MasterArbitrationUpdate(
                    device_id=self.device_id,
                    election_id=p4runtime_pb2.Uint128(high=primary[0], low=primary[1]),
                    status=status_pb2.Status(code=code_pb2.OK if ok else code_pb2.ALREADY_EXISTS,
                                             message="primary" if ok else "backup"))))
