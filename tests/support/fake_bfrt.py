"""An in-process fake of ``bf_switchd``'s BfRt gRPC server: the traffic-manager tables NetApprox configures.

It speaks the BfRuntime service with messages it decodes and encodes itself (tests/support/bfrt_wire.py: a
protobuf wire codec over field numbers transcribed from the SDE's ``bfruntime.proto``), never with the client's
(``controller.p4runtime.bfrt``): an encoding mistake in the client fails here instead of agreeing with itself.
A request that is not a valid ``bfrt_proto`` message (a field number the proto does not declare, a wrong wire
type) is answered INVALID_ARGUMENT with what was wrong. It behaves as the SDE's server does where the controller
can tell: a client must subscribe on the stream channel and BIND to a program
before Read and Write (FAILED_PRECONDITION otherwise); GetForwardingPipelineConfig returns the program's and the
fixed-function blocks' BfRt info JSON; entries are keyed by (pipe, key fields); string fields take only their
declared choices, fields only their declared ids (INVALID_ARGUMENT otherwise).

The BfRt info below describes the four ``tf1.tm.*`` tables the controller uses with the names, types, choices
and actions of the SDE's ``bf_rt_tm_tf1.json`` (its ids are arbitrary here: clients resolve names). Tests set
``ports[dev_port] = (pg_id, egress_qid_queues)``, ``drops[(pipe, pg_id, pg_queue)] = packets``, and
``max_pool_cells`` (the "hardware" keeps at most that many cells, so a read-back differs from what was asked).
"""
from __future__ import annotations

import concurrent.futures
import json
import threading
from typing import Any

import grpc

from support.bfrt_wire import Message, WireError, as_dict, decode, encode

SERVICE = "bfrt_proto.BfRuntime"
OK, NOT_FOUND = 0, 5  # google.rpc.Code
MODIFY = 2  # bfrt_proto.Update.Type

PRIORITIES = ["LOW", "0", "1", "2", "3", "4", "5", "6", "7", "HIGH"]
BAFS = ["1.5%", "3%", "6%", "11%", "20%", "33%", "50%", "66%", "80%", "DISABLE"]
POOLS = ["EG_APP_POOL_0", "EG_APP_POOL_1", "EG_APP_POOL_2", "EG_APP_POOL_3"]


def _field(fid: int, name: str, kind: str, repeated: bool = False, choices: list[str] | None = None) -> dict:
    t: dict[str, Any] = {"type": kind}
    if choices:
        t["choices"] = choices
    return {"mandatory": False, "read_only": False,
            "singleton": {"id": fid, "name": name, "repeated": repeated, "type": t}}


def _key(fid: int, name: str, kind: str) -> dict:
    return {"id": fid, "name": name, "match_type": "Exact", "type": {"type": kind}}


PG_KEY = [_key(1, "pg_id", "uint8"), _key(2, "pg_queue", "uint8")]
TM_INFO = {"schema_version": "1.0.0", "tables": [
    {"name": "tf1.tm.port.cfg", "id": 4278517776, "table_type": "TmPortCfg", "key": [_key(1, "dev_port", "uint32")],
     "data": [_field(1, "pg_id", "uint8"), _field(2, "pg_port_nr", "uint8"), _field(3, "port_queues_count", "uint8"),
              _field(5, "egress_qid_queues", "uint8", repeated=True)]},
    {"name": "tf1.tm.queue.sched_cfg", "id": 4278517797, "table_type": "TmQueueSchedCfg", "key": PG_KEY,
     "data": [_field(1, "min_priority", "string", choices=PRIORITIES), _field(2, "min_rate_enable", "bool"),
              _field(3, "dwrr_weight", "uint16"), _field(4, "max_priority", "string", choices=PRIORITIES),
              _field(5, "max_rate_enable", "bool"), _field(6, "scheduling_enable", "bool")]},
    {"name": "tf1.tm.queue.buffer", "id": 4278517796, "table_type": "TmQueueBuffer", "key": PG_KEY,
     "data": [_field(1, "guaranteed_cells", "uint32"), _field(2, "hysteresis_cells", "uint32"),
              _field(3, "tail_drop_enable", "bool")],
     "action_specs": [{"id": 1, "name": "shared_pool", "data": [
         _field(4, "pool_id", "string", choices=POOLS), _field(5, "pool_max_cells", "uint32"),
         _field(6, "dynamic_baf", "string", choices=BAFS)]}, {"id": 2, "name": "buffer_only", "data": []}]},
    {"name": "tf1.tm.counter.queue", "id": 4278517827, "table_type": "TmCounterQueue", "key": PG_KEY,
     "data": [_field(1, "drop_count_packets", "uint64"), _field(2, "usage_cells", "uint64"),
              _field(3, "watermark_cells", "uint64")]},
]}
WIDTHS = {"uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8}


class FakeBfrtServer:
    """See the module docstring. ``requests`` records (method, request) in order."""

    def __init__(self, p4_name: str = "netapprox", device_id: int = 0) -> None:
        self.p4_name = p4_name
        self.device_id = device_id
        self.lock = threading.Lock()
        self.requests: list[tuple[str, Any]] = []
        self.wire_errors: list[str] = []
        """Requests that were not valid bfrt_proto messages (each was refused with INVALID_ARGUMENT)."""
        self.ports: dict[int, tuple[int, list[int]]] = {}
        self.drops: dict[tuple[int, int, int], int] = {}
        self.max_pool_cells: int | None = None
        self.entries: dict[tuple[int, int, tuple], dict[int, Any]] = {}  # (table, pipe, key) -> field id -> value
        self.actions: dict[tuple[int, int, tuple], int] = {}
        self.subscribed: set[int] = set()
        self.bound: dict[int, str] = {}
        self.port = 0
        self._server: grpc.Server | None = None
        self._tables = {t["id"]: t for t in TM_INFO["tables"]}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "FakeBfrtServer":
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))

        def raw(data: bytes) -> bytes:
            return data

        unary = {"Write": self._write, "SetForwardingPipelineConfig": self._set_pipeline,
                 "GetForwardingPipelineConfig": self._get_pipeline}
        handlers = {name: grpc.unary_unary_rpc_method_handler(fn, request_deserializer=raw, response_serializer=raw)
                    for name, fn in unary.items()}
        handlers["Read"] = grpc.unary_stream_rpc_method_handler(self._read, request_deserializer=raw,
                                                                response_serializer=raw)
        handlers["StreamChannel"] = grpc.stream_stream_rpc_method_handler(self._stream, request_deserializer=raw,
                                                                          response_serializer=raw)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        self.port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0).wait(5)
            self._server = None

    def __enter__(self) -> "FakeBfrtServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def field_value(self, table: str, pipe: int, key: tuple[int, ...], name: str) -> Any:
        """What the "hardware" holds (for assertions): table name, pipe, key values in key order, field name."""
        t = next(t for t in TM_INFO["tables"] if t["name"] == table)
        fields = {f["singleton"]["name"]: f["singleton"]["id"] for f in t["data"]}
        for a in t.get("action_specs", []):
            fields.update({f["singleton"]["name"]: f["singleton"]["id"] for f in a["data"]})
        return self.entries.get((t["id"], pipe, key), {}).get(fields[name])

    # --- RPCs ---

    def _decode(self, method: str, message: str, data: bytes, context) -> Message:
        """The request as ``message``, recorded; a request that is not one is refused like a bad argument."""
        try:
            request = decode(message, data)
        except WireError as e:
            with self.lock:
                self.wire_errors.append(f"{method}: {e}")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a bfrt_proto.{message}: {e}")
        with self.lock:
            self.requests.append((method, request))
        return request

    def _stream(self, requests, context):
        for data in requests:
            request = self._decode("StreamChannel", "StreamMessageRequest", data, context)
            if request.WhichOneof("update") == "subscribe":
                ok = request.subscribe.device_id == self.device_id
                if ok:
                    self.subscribed.add(request.client_id)
                yield encode("StreamMessageResponse", {"subscribe": {
                    "device_id": request.subscribe.device_id,
                    "status": {"code": OK if ok else NOT_FOUND, "message": "" if ok else "no such device"}}})

    def _set_pipeline(self, data, context):
        request = self._decode("SetForwardingPipelineConfig", "SetForwardingPipelineConfigRequest", data, context)
        if request.action != 0:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "only BIND")
        if request.client_id not in self.subscribed:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "client is not subscribed")
        if len(request.config) != 1 or request.config[0].p4_name != self.p4_name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"no program {[c.p4_name for c in request.config]}")
        self.bound[request.client_id] = request.config[0].p4_name
        return encode("SetForwardingPipelineConfigResponse", {})

    def _get_pipeline(self, data, context):
        self._decode("GetForwardingPipelineConfig", "GetForwardingPipelineConfigRequest", data, context)
        return encode("GetForwardingPipelineConfigResponse", {
            "config": [{"p4_name": self.p4_name, "bfruntime_info": b'{"tables": []}'}],
            "non_p4_config": {"bfruntime_info": json.dumps(TM_INFO).encode()}})

    def _check_client(self, request, context) -> None:
        if request.client_id not in self.bound:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"client {request.client_id} is not bound")
        if request.p4_name and request.p4_name != self.bound[request.client_id]:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"client {request.client_id} is bound to "
                          f"{self.bound[request.client_id]!r}, not {request.p4_name!r}")

    def _schema(self, table_id: int, context) -> tuple[dict, dict[int, dict]]:
        t = self._tables.get(table_id)
        if t is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no table {table_id}")
        fields = {f["singleton"]["id"]: f["singleton"] for f in t["data"]}
        return t, fields

    def _entry_key(self, t: dict, key, context) -> tuple:
        got = {}
        for f in key.fields:
            if f.WhichOneof("match_type") != "exact":
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"key field {f.field_id}: TM keys are exact")
            got[f.field_id] = f.exact.value
        values = []
        for k in t["key"]:
            if k["id"] not in got:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"key field {k['name']} missing")
            raw = got[k["id"]]
            if len(raw) != WIDTHS[k["type"]["type"]]:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"key field {k['name']}: {len(raw)} bytes")
            values.append(int.from_bytes(raw, "big"))
        return tuple(values)

    @staticmethod
    def _value(field: Message, spec: dict, context) -> Any:
        """A DataField's value, checked against its declared type (as bf_switchd's BfRt layer does)."""
        kind, declared = field.WhichOneof("value"), spec["type"]["type"]
        if spec.get("repeated"):
            if kind != "int_arr_val":
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{spec['name']}: an int array, got {kind}")
            return list(field.int_arr_val.val)
        want = {"bool": "bool_val", "string": "str_val", "float": "float_val"}.get(declared, "stream")
        if kind != want:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{spec['name']} ({declared}): got {kind}")
        if want != "stream":
            return getattr(field, want)
        if len(field.stream) != WIDTHS[declared]:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{spec['name']} ({declared}): {len(field.stream)} bytes, not {WIDTHS[declared]}")
        return int.from_bytes(field.stream, "big")

    def _write(self, data, context):
        request = self._decode("Write", "WriteRequest", data, context)
        self._check_client(request, context)
        for update in request.updates:
            if update.entity.WhichOneof("entity") != "table_entry":
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "only table entries")
            entry = update.entity.table_entry
            t, fields = self._schema(entry.table_id, context)
            if update.type != MODIFY or t["table_type"] in ("TmPortCfg", "TmCounterQueue"):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{t['name']}: only MODIFY of writable tables")
            if entry.WhichOneof("value") != "key":
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{t['name']}: entry without a key")
            key = (entry.table_id, request.target.pipe_id, self._entry_key(t, entry.key, context))
            if entry.data.action_id:
                action = next((a for a in t.get("action_specs", []) if a["id"] == entry.data.action_id), None)
                if action is None:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{t['name']}: no action {entry.data.action_id}")
                fields = {**fields, **{f["singleton"]["id"]: f["singleton"] for f in action["data"]}}
                self.actions[key] = entry.data.action_id
            stored = self.entries.setdefault(key, {})
            for f in entry.data.fields:
                spec = fields.get(f.field_id)
                if spec is None:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{t['name']}: no data field {f.field_id}")
                value = self._value(f, spec, context)
                choices = spec["type"].get("choices")
                if choices and value not in choices:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{spec['name']}: {value!r} not in {choices}")
                if spec["name"] == "pool_max_cells" and self.max_pool_cells is not None:
                    value = min(value, self.max_pool_cells)
                stored[f.field_id] = value
        return encode("WriteResponse", {})

    def _read(self, data, context):
        request = self._decode("Read", "ReadRequest", data, context)
        self._check_client(request, context)
        entities = []
        for entity in request.entities:
            entry = entity.table_entry
            t, fields = self._schema(entry.table_id, context)
            values = self._entry_key(t, entry.key, context)
            pipe = request.target.pipe_id
            stored: dict[int, Any] = {}
            action_id = 0
            if t["table_type"] == "TmPortCfg":
                if values[0] not in self.ports:
                    context.abort(grpc.StatusCode.NOT_FOUND, f"dev_port {values[0]} not added")
                pg_id, queues = self.ports[values[0]]
                stored = {1: pg_id, 3: len(queues), 5: list(queues)}
            elif t["table_type"] == "TmCounterQueue":
                stored = {1: self.drops.get((pipe, *values), 0)}
            else:
                key = (entry.table_id, pipe, values)
                stored = dict(self.entries.get(key, {}))
                action_id = self.actions.get(key, 0)
            all_fields = dict(fields)
            for a in t.get("action_specs", []):
                all_fields.update({f["singleton"]["id"]: f["singleton"] for f in a["data"]})
            out_fields = []
            for fid, value in sorted(stored.items()):
                spec = all_fields[fid]
                kind = spec["type"]["type"]
                if spec.get("repeated"):
                    out_fields.append({"field_id": fid, "int_arr_val": {"val": list(value)}})
                elif kind == "bool":
                    out_fields.append({"field_id": fid, "bool_val": value})
                elif kind == "string":
                    out_fields.append({"field_id": fid, "str_val": value})
                else:
                    out_fields.append({"field_id": fid, "stream": int(value).to_bytes(WIDTHS[kind], "big")})
            entities.append({"table_entry": {"table_id": entry.table_id, "key": as_dict(entry.key),
                                             "data": {"action_id": action_id, "fields": out_fields}}})
        yield encode("ReadResponse", {"entities": entities})
