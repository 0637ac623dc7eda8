"""An in-process fake of ``bf_switchd``'s BfRt gRPC server: the traffic-manager tables NetApprox configures.

It speaks the BfRuntime service with the messages of ``controller.p4runtime.bfrt`` and behaves as the SDE's
server does where the controller can tell: a client must subscribe on the stream channel and BIND to a program
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
from google.rpc import code_pb2, status_pb2
from netapprox.controller.p4runtime.bfrt import SERVICE, data_value, pb

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
        unary = {
            "Write": (self._write, pb.WriteRequest, pb.WriteResponse),
            "SetForwardingPipelineConfig": (self._set_pipeline, pb.SetForwardingPipelineConfigRequest,
                                            pb.SetForwardingPipelineConfigResponse),
            "GetForwardingPipelineConfig": (self._get_pipeline, pb.GetForwardingPipelineConfigRequest,
                                            pb.GetForwardingPipelineConfigResponse),
        }
        handlers = {name: grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req.FromString,
                                                              response_serializer=resp.SerializeToString)
                    for name, (fn, req, resp) in unary.items()}
        handlers["Read"] = grpc.unary_stream_rpc_method_handler(
            self._read, request_deserializer=pb.ReadRequest.FromString,
            response_serializer=pb.ReadResponse.SerializeToString)
        handlers["StreamChannel"] = grpc.stream_stream_rpc_method_handler(
            self._stream, request_deserializer=pb.StreamMessageRequest.FromString,
            response_serializer=pb.StreamMessageResponse.SerializeToString)
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

    def _stream(self, requests, context):
        for request in requests:
            with self.lock:
                self.requests.append(("StreamChannel", request))
            if request.WhichOneof("update") == "subscribe":
                ok = request.subscribe.device_id == self.device_id
                if ok:
                    self.subscribed.add(request.client_id)
                yield pb.StreamMessageResponse(subscribe=pb.Subscribe(
                    device_id=request.subscribe.device_id,
                    status=status_pb2.Status(code=code_pb2.OK if ok else code_pb2.NOT_FOUND,
                                             message="" if ok else "no such device")))

    def _set_pipeline(self, request, context):
        with self.lock:
            self.requests.append(("SetForwardingPipelineConfig", request))
        if request.action != 0:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "only BIND")
        if request.client_id not in self.subscribed:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "client is not subscribed")
        if len(request.config) != 1 or request.config[0].p4_name != self.p4_name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"no program {[c.p4_name for c in request.config]}")
        self.bound[request.client_id] = request.config[0].p4_name
        return pb.SetForwardingPipelineConfigResponse()

    def _get_pipeline(self, request, context):
        with self.lock:
            self.requests.append(("GetForwardingPipelineConfig", request))
        return pb.GetForwardingPipelineConfigResponse(
            config=[pb.ForwardingPipelineConfig(p4_name=self.p4_name, bfruntime_info=b'{"tables": []}')],
            non_p4_config=pb.NonP4Config(bfruntime_info=json.dumps(TM_INFO).encode()))

    def _check_client(self, request, context) -> None:
        if request.client_id not in self.bound:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"client {request.client_id} is not bound")

    def _schema(self, table_id: int, context) -> tuple[dict, dict[int, dict]]:
        t = self._tables.get(table_id)
        if t is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no table {table_id}")
        fields = {f["singleton"]["id"]: f["singleton"] for f in t["data"]}
        return t, fields

    def _entry_key(self, t: dict, key, context) -> tuple:
        got = {f.field_id: f.exact.value for f in key.fields}
        values = []
        for k in t["key"]:
            if k["id"] not in got:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"key field {k['name']} missing")
            raw = got[k["id"]]
            if len(raw) != WIDTHS[k["type"]["type"]]:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"key field {k['name']}: {len(raw)} bytes")
            values.append(int.from_bytes(raw, "big"))
        return tuple(values)

    def _write(self, request, context):
        with self.lock:
            self.requests.append(("Write", request))
        self._check_client(request, context)
        for update in request.updates:
            entry = update.entity.table_entry
            t, fields = self._schema(entry.table_id, context)
            if update.type != 2 or t["table_type"] in ("TmPortCfg", "TmCounterQueue"):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{t['name']}: only MODIFY of writable tables")
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
                value = data_value(f)
                choices = spec["type"].get("choices")
                if choices and value not in choices:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{spec['name']}: {value!r} not in {choices}")
                if spec["name"] == "pool_max_cells" and self.max_pool_cells is not None:
                    value = min(value, self.max_pool_cells)
                stored[f.field_id] = value
        return pb.WriteResponse()

    def _read(self, request, context):
        with self.lock:
            self.requests.append(("Read", request))
        self._check_client(request, context)
        response = pb.ReadResponse()
        for entity in request.entities:
            entry = entity.table_entry
            t, fields = self._schema(entry.table_id, context)
            values = self._entry_key(t, entry.key, context)
            pipe = request.target.pipe_id
            data: dict[int, Any] = {}
            action_id = 0
            if t["table_type"] == "TmPortCfg":
                if values[0] not in self.ports:
                    context.abort(grpc.StatusCode.NOT_FOUND, f"dev_port {values[0]} not added")
                pg_id, queues = self.ports[values[0]]
                data = {1: pg_id, 3: len(queues), 5: list(queues)}
            elif t["table_type"] == "TmCounterQueue":
                data = {1: self.drops.get((pipe, *values), 0)}
            else:
                key = (entry.table_id, pipe, values)
                data = dict(self.entries.get(key, {}))
                action_id = self.actions.get(key, 0)
            all_fields = dict(fields)
            for a in t.get("action_specs", []):
                all_fields.update({f["singleton"]["id"]: f["singleton"] for f in a["data"]})
            out = response.entities.add().table_entry
            out.table_id = entry.table_id
            out.key.CopyFrom(entry.key)
            out.data.action_id = action_id
            for fid, value in sorted(data.items()):
                spec = all_fields[fid]
                f = out.data.fields.add(field_id=fid)
                kind = spec["type"]["type"]
                if spec.get("repeated"):
                    f.int_arr_val.val.extend(value)
                elif kind == "bool":
                    f.bool_val = value
                elif kind == "string":
                    f.str_val = value
                else:
                    f.stream = int(value).to_bytes(WIDTHS[kind], "big")
        yield response
