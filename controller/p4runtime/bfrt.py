"""A small BfRt gRPC client: what the controller needs of ``bf_switchd``'s BfRuntime service (Intel Tofino SDE,
open-p4studio), spoken directly, with no SDE Python on the path.

The SDE's own client (``bfrt_grpc.client``) ships only with the SDE and is not on PyPI; like
``bmv2_thrift.py`` for BMv2's Thrift service, this module speaks the few calls it needs itself. The messages
are built at import time from ``SCHEMA`` below: the subset of ``bfrt_proto`` (``bfruntime.proto`` of the SDE,
package ``bfrt_proto``) that the calls use, with the SDE's field numbers, so it is wire-compatible with
``bf_switchd``'s BfRuntime service. ``tests/controller/test_ctl_tofino.py`` checks ``SCHEMA`` against a
``bfruntime.proto`` when one is at hand (``NETAPPROX_BFRUNTIME_PROTO``, or the SDE's sources under ``$SDE``);
``test_ctl_p4runtime.py`` drives the client against a fake server (``tests/support/fake_bfrt.py``).

    client = BfrtClient("127.0.0.1:50052", p4_name="netapprox")   # subscribe, bind to the program, get BfRt info
    client.entry_mod("tf1.tm.queue.sched_cfg", pipe, {"pg_id": 1, "pg_queue": 8}, {"max_priority": "7"})
    client.entry_get("tf1.tm.counter.queue", pipe, {"pg_id": 1, "pg_queue": 8})   # {"drop_count_packets": 0, ...}
    client.close()

Tables are looked up by name in the BfRt info JSON the switch returns (GetForwardingPipelineConfig: the
program's ``bfruntime_info`` and ``non_p4_config.bfruntime_info``, where the fixed-function tables such as the
traffic manager's ``tf1.tm.*`` live); values are encoded by the field types given there.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import queue
import threading
import types
from typing import Any, Mapping

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.rpc import status_pb2  # noqa: F401 - registers google/rpc/status.proto in the default pool

from netapprox.controller.errors import QueueConfigError, did_you_mean

log = logging.getLogger("netapprox.controller.p4runtime")

PACKAGE = "bfrt_proto"
SERVICE = "bfrt_proto.BfRuntime"
FILE_NAME = "netapprox/bfrt_subset.proto"

# message -> [(field, number, type, repeated, message type or None, oneof or None)]; types are protobuf scalar
# names or "message". Enums are carried as int32 (the same varint on the wire).
SCHEMA: dict[str, list[tuple]] = {
    "TargetDevice": [("device_id", 1, "uint32"), ("pipe_id", 2, "uint32"), ("direction", 3, "uint32"),
                     ("prsr_id", 4, "uint32")],
    "WriteRequest": [("target", 1, "TargetDevice"), ("client_id", 2, "uint32"), ("updates", 3, "Update*"),
                     ("atomicity", 4, "int32"), ("p4_name", 5, "string")],
    "WriteResponse": [("status", 1, "Error*")],
    "ReadRequest": [("target", 1, "TargetDevice"), ("client_id", 2, "uint32"), ("entities", 3, "Entity*"),
                    ("p4_name", 4, "string")],
    "ReadResponse": [("entities", 1, "Entity*"), ("status", 2, "Error*")],
    "Update": [("type", 1, "int32"), ("entity", 2, "Entity")],
    "Entity": [("table_entry", 1, "TableEntry", "entity")],
    "TableEntry": [("table_id", 1, "uint32"), ("key", 2, "TableKey", "value"), ("data", 3, "TableData"),
                   ("is_default_entry", 4, "bool"), ("entry_tgt", 8, "TargetDevice"), ("table_flags", 9, "TableFlags")],
    "TableFlags": [("from_hw", 1, "bool"), ("key_only", 2, "bool"), ("mod_del", 3, "bool"), ("reset_ttl", 4, "bool"),
                   ("reset_stats", 5, "bool")],
    "TableData": [("action_id", 1, "uint32"), ("fields", 2, "DataField*")],
    "DataField": [("field_id", 1, "uint32"), ("stream", 2, "bytes", "value"), ("float_val", 3, "float", "value"),
                  ("str_val", 4, "string", "value"), ("int_arr_val", 5, "DataField.IntArray", "value"),
                  ("bool_arr_val", 6, "DataField.BoolArray", "value"), ("bool_val", 8, "bool", "value"),
                  ("str_arr_val", 9, "DataField.StrArray", "value")],
    "DataField.IntArray": [("val", 1, "uint32*")],
    "DataField.BoolArray": [("val", 1, "bool*")],
    "DataField.StrArray": [("val", 1, "string*")],
    "TableKey": [("fields", 1, "KeyField*")],
    "KeyField": [("field_id", 1, "uint32"), ("exact", 2, "KeyField.Exact", "match_type")],
    "KeyField.Exact": [("value", 1, "bytes")],
    "StreamMessageRequest": [("client_id", 1, "uint32"), ("subscribe", 2, "Subscribe", "update")],
    "Subscribe": [("is_master", 1, "bool"), ("device_id", 2, "uint32"), ("notifications", 3, "Subscribe.Notifications"),
                  ("status", 4, ".google.rpc.Status")],
    "Subscribe.Notifications": [("enable_learn_notifications", 1, "bool"), ("enable_idletimeout_notifications", 2, "bool"),
                                ("enable_port_status_change_notifications", 3, "bool")],
    "StreamMessageResponse": [("subscribe", 1, "Subscribe", "update")],
    "SetForwardingPipelineConfigRequest": [("device_id", 1, "uint32"), ("client_id", 2, "uint32"),
                                           ("action", 3, "int32"), ("config", 6, "ForwardingPipelineConfig*")],
    "SetForwardingPipelineConfigResponse": [("set_forwarding_pipeline_config_response_type", 1, "int32")],
    "ForwardingPipelineConfig": [("p4_name", 1, "string"), ("bfruntime_info", 2, "bytes")],
    "NonP4Config": [("bfruntime_info", 1, "bytes")],
    "GetForwardingPipelineConfigRequest": [("device_id", 1, "uint32"), ("client_id", 2, "uint32")],
    "GetForwardingPipelineConfigResponse": [("config", 1, "ForwardingPipelineConfig*"), ("non_p4_config", 2, "NonP4Config")],
    "Error": [("canonical_code", 1, "int32"), ("message", 2, "string"), ("space", 3, "string"), ("code", 4, "int32")],
}
UPDATE_MODIFY = 2  # bfrt_proto.Update.Type
ACTION_BIND = 0  # bfrt_proto.SetForwardingPipelineConfigRequest.Action
ALL_PIPES = 0xFFFF

_SCALARS = {name: getattr(descriptor_pb2.FieldDescriptorProto, "TYPE_" + name.upper())
            for name in ("uint32", "int32", "uint64", "bool", "string", "bytes", "float")}


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(name=FILE_NAME, package=PACKAGE, syntax="proto3",
                                             dependency=["google/rpc/status.proto"])
    messages: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full_name in SCHEMA:  # parents are listed before their nested types
        parent, _, short = full_name.rpartition(".")
        msg = (messages[parent].nested_type.add() if parent else fdp.message_type.add())
        msg.name = short
        messages[full_name] = msg
    for full_name, fields in SCHEMA.items():
        msg = messages[full_name]
        oneofs: dict[str, int] = {}
        for spec in fields:
            name, number, ftype = spec[:3]
            oneof = spec[3] if len(spec) > 3 else None
            f = msg.field.add(name=name, number=number)
            repeated = ftype.endswith("*")
            ftype = ftype.rstrip("*")
            f.label = (descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED if repeated
                       else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
            if ftype in _SCALARS:
                f.type = _SCALARS[ftype]
            else:
                f.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
                f.type_name = ftype if ftype.startswith(".") else f".{PACKAGE}.{ftype}"
            if oneof is not None:
                if oneof not in oneofs:
                    oneofs[oneof] = len(msg.oneof_decl)
                    msg.oneof_decl.add(name=oneof)
                f.oneof_index = oneofs[oneof]
    return fdp


def _messages() -> dict[str, type]:
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(FILE_NAME)
    except KeyError:
        pool.Add(_file_descriptor())
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}")) for name in SCHEMA}


pb = types.SimpleNamespace(**{name.replace(".", "_"): cls for name, cls in _messages().items()})
"""The message classes, e.g. ``pb.WriteRequest``, ``pb.DataField_IntArray``."""


# --- BfRt info: tables and their fields -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FieldInfo:
    id: int
    name: str
    type: str  # "uint8".."uint64", "bytes", "bool", "string", "float"
    width_bytes: int
    repeated: bool = False
    choices: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class TableInfo:
    id: int
    name: str
    keys: Mapping[str, FieldInfo]
    data: Mapping[str, FieldInfo]
    actions: Mapping[str, tuple[int, Mapping[str, FieldInfo]]]


_UINT_BYTES = {"uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8}


def _field(spec: Mapping[str, Any]) -> FieldInfo:
    f = spec.get("singleton", spec)
    t = f["type"]
    kind = t["type"]
    width = _UINT_BYTES.get(kind, (int(t.get("width", 0)) + 7) // 8)
    return FieldInfo(int(f["id"]), f["name"], kind, width, bool(f.get("repeated", False)), tuple(t.get("choices", ())))


def parse_bfrt_info(*documents: bytes) -> dict[str, TableInfo]:
    """Tables by name from BfRt info JSON documents (also by the unique suffix after ``pipe.``)."""
    tables: dict[str, TableInfo] = {}
    for doc in documents:
        if not doc:
            continue
        for t in json.loads(doc).get("tables", []):
            actions = {a["name"]: (int(a["id"]), {_field(d).name: _field(d) for d in a.get("data", [])})
                       for a in t.get("action_specs", [])}
            info = TableInfo(int(t["id"]), t["name"], {_field(k).name: _field(k) for k in t.get("key", [])},
                             {_field(d).name: _field(d) for d in t.get("data", [])}, actions)
            tables[t["name"]] = info
    return tables


def encode_value(f: FieldInfo, value: Any) -> bytes:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < (1 << (8 * f.width_bytes)):
        raise QueueConfigError(f"BfRt field {f.name!r} ({f.type}): {value!r} does not fit")
    return value.to_bytes(f.width_bytes, "big")


def data_field(f: FieldInfo, value: Any):
    """A ``DataField`` of ``value`` encoded by ``f``'s type."""
    out = pb.DataField(field_id=f.id)
    if f.repeated:
        if f.type == "bool":
            out.bool_arr_val.val.extend(bool(v) for v in value)
        elif f.type == "string":
            out.str_arr_val.val.extend(str(v) for v in value)
        else:
            out.int_arr_val.val.extend(int(v) for v in value)
    elif f.type == "bool":
        out.bool_val = bool(value)
    elif f.type == "string":
        if f.choices and value not in f.choices:
            raise QueueConfigError(f"BfRt field {f.name!r}: {value!r} is not one of {', '.join(f.choices)}")
        out.str_val = str(value)
    elif f.type == "float":
        out.float_val = float(value)
    else:
        out.stream = encode_value(f, value)
    return out


def data_value(field: Any) -> Any:
    """The Python value of a ``DataField`` (ints from byte streams)."""
    kind = field.WhichOneof("value")
    if kind == "stream":
        return int.from_bytes(field.stream, "big")
    if kind in ("int_arr_val", "bool_arr_val", "str_arr_val"):
        return list(getattr(field, kind).val)
    return getattr(field, kind) if kind else None


def _status_text(e: grpc.RpcError) -> str:
    """The gRPC error with the per-entry errors bf_switchd puts in its status details."""
    parts = [f"{e.code().name}: {e.details()}"]
    for key, value in e.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                err = pb.Error()
                if detail.Unpack(err) and err.canonical_code:
                    parts.append(err.message)
    return "; ".join(parts)


class BfrtClient:
    """One BfRt gRPC session: subscribed on the stream channel and bound to ``p4_name`` (BIND), with the tables
    of the program and of the fixed-function blocks (``tf1.tm.*`` ...) by name."""

    def __init__(self, address: str, p4_name: str, *, device_id: int = 0, client_id: int = 1,
                 timeout_s: float = 5.0) -> None:
        self.address = address
        self.p4_name = p4_name
        self.device_id = device_id
        self.client_id = client_id
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(address)
        self._requests: queue.Queue = queue.Queue()
        self._answers: queue.Queue = queue.Queue()
        self._stream = None
        self._thread: threading.Thread | None = None
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout_s)
            self._calls()
            self._subscribe()
            self._bind()
            self.tables = self._bfrt_info()
        except grpc.FutureTimeoutError:
            self.close()
            raise QueueConfigError(f"no BfRt server at {address} after {timeout_s}s (is bf_switchd running "
                                   "with its gRPC server, port 50052 by default?)") from None
        except grpc.RpcError as e:
            self.close()
            raise QueueConfigError(f"BfRt server at {address}: {_status_text(e)}") from None
        except BaseException:
            self.close()
            raise

    def _calls(self) -> None:
        c = self._channel

        def unary(method: str, request: str, response: str):
            return c.unary_unary(f"/{SERVICE}/{method}", request_serializer=getattr(pb, request).SerializeToString,
                                 response_deserializer=getattr(pb, response).FromString)

        self._write = unary("Write", "WriteRequest", "WriteResponse")
        self._set_pipeline = unary("SetForwardingPipelineConfig", "SetForwardingPipelineConfigRequest",
                                   "SetForwardingPipelineConfigResponse")
        self._get_pipeline = unary("GetForwardingPipelineConfig", "GetForwardingPipelineConfigRequest",
                                   "GetForwardingPipelineConfigResponse")
        self._read = c.unary_stream(f"/{SERVICE}/Read", request_serializer=pb.ReadRequest.SerializeToString,
                                    response_deserializer=pb.ReadResponse.FromString)
        self._stream_call = c.stream_stream(f"/{SERVICE}/StreamChannel",
                                            request_serializer=pb.StreamMessageRequest.SerializeToString,
                                            response_deserializer=pb.StreamMessageResponse.FromString)

    def _subscribe(self) -> None:
        requests = self._requests
        self._stream = self._stream_call(iter(requests.get, None))

        def read() -> None:
            try:
                for message in self._stream:
                    if message.WhichOneof("update") == "subscribe":
                        self._answers.put(message.subscribe)
            except grpc.RpcError as e:
                self._answers.put(e)

        self._thread = threading.Thread(target=read, name=f"bfrt-stream-{self.address}", daemon=True)
        self._thread.start()
        requests.put(pb.StreamMessageRequest(client_id=self.client_id, subscribe=pb.Subscribe(
            device_id=self.device_id, notifications=pb.Subscribe_Notifications())))
        try:
            answer = self._answers.get(timeout=self.timeout_s)
        except queue.Empty:
            raise QueueConfigError(f"BfRt server at {self.address}: no answer to the subscription") from None
        if isinstance(answer, grpc.RpcError):
            raise answer
        if answer.status.code != 0:
            raise QueueConfigError(f"BfRt server at {self.address} refused the subscription of client "
                                   f"{self.client_id}: {answer.status.message}")

    def _bind(self) -> None:
        self._set_pipeline(pb.SetForwardingPipelineConfigRequest(
            device_id=self.device_id, client_id=self.client_id, action=ACTION_BIND,
            config=[pb.ForwardingPipelineConfig(p4_name=self.p4_name)]), timeout=self.timeout_s)

    def _bfrt_info(self) -> dict[str, TableInfo]:
        reply = self._get_pipeline(pb.GetForwardingPipelineConfigRequest(device_id=self.device_id,
                                                                         client_id=self.client_id),
                                   timeout=self.timeout_s)
        programs = [c for c in reply.config if c.p4_name == self.p4_name]
        if not programs:
            names = [c.p4_name for c in reply.config]
            raise QueueConfigError(f"BfRt server at {self.address} runs no program {self.p4_name!r} "
                                   f"(it runs {names or 'none'}; set the switch option prog_name)")
        return parse_bfrt_info(programs[0].bfruntime_info, reply.non_p4_config.bfruntime_info)

    def table(self, name: str) -> TableInfo:
        try:
            return self.tables[name]
        except KeyError:
            raise QueueConfigError(f"BfRt: no table {name!r} on {self.address}.{did_you_mean(name, self.tables)}"
                                   ) from None

    def _key(self, table: TableInfo, key: Mapping[str, int]):
        fields = []
        for name, value in key.items():
            f = table.keys.get(name)
            if f is None:
                raise QueueConfigError(f"BfRt table {table.name!r} has no key field {name!r}")
            fields.append(pb.KeyField(field_id=f.id, exact=pb.KeyField_Exact(value=encode_value(f, value))))
        return pb.TableKey(fields=fields)

    def _data(self, table: TableInfo, data: Mapping[str, Any], action: str | None):
        known = dict(table.data)
        action_id = 0
        if action is not None:
            if action not in table.actions:
                raise QueueConfigError(f"BfRt table {table.name!r} has no action {action!r}")
            action_id, action_fields = table.actions[action]
            known.update(action_fields)
        fields = []
        for name, value in data.items():
            f = known.get(name)
            if f is None:
                raise QueueConfigError(f"BfRt table {table.name!r}: no data field {name!r}"
                                       f"{' in action ' + repr(action) if action else ''}")
            fields.append(data_field(f, value))
        return pb.TableData(action_id=action_id, fields=fields)

    def _target(self, pipe: int):
        return pb.TargetDevice(device_id=self.device_id, pipe_id=pipe, direction=0xFF, prsr_id=0xFF)

    def entry_mod(self, table_name: str, pipe: int, key: Mapping[str, int], data: Mapping[str, Any],
                  action: str | None = None) -> None:
        """MODIFY one entry (the TM tables' entries always exist: they are modified, never inserted)."""
        table = self.table(table_name)
        entry = pb.TableEntry(table_id=table.id, key=self._key(table, key), data=self._data(table, data, action))
        request = pb.WriteRequest(target=self._target(pipe), client_id=self.client_id, p4_name=self.p4_name,
                                  updates=[pb.Update(type=UPDATE_MODIFY, entity=pb.Entity(table_entry=entry))])
        try:
            self._write(request, timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise QueueConfigError(f"BfRt write to {table_name} {dict(key)}: {_status_text(e)}") from None

    def entry_get(self, table_name: str, pipe: int, key: Mapping[str, int], from_hw: bool = True) -> dict[str, Any]:
        """The data of one entry by field name (``action_name`` too, when the table has actions)."""
        table = self.table(table_name)
        entry = pb.TableEntry(table_id=table.id, key=self._key(table, key), table_flags=pb.TableFlags(from_hw=from_hw))
        request = pb.ReadRequest(target=self._target(pipe), client_id=self.client_id, p4_name=self.p4_name,
                                 entities=[pb.Entity(table_entry=entry)])
        try:
            responses = list(self._read(request, timeout=self.timeout_s))
        except grpc.RpcError as e:
            raise QueueConfigError(f"BfRt read of {table_name} {dict(key)}: {_status_text(e)}") from None
        by_id = {f.id: f.name for f in table.data.values()}
        action_names = {}
        for name, (action_id, fields) in table.actions.items():
            action_names[action_id] = name
            by_id.update({f.id: f.name for f in fields.values()})
        for response in responses:
            for entity in response.entities:
                d = entity.table_entry.data
                out = {by_id.get(f.field_id, f"field_{f.field_id}"): data_value(f) for f in d.fields}
                if d.action_id:
                    out["action_name"] = action_names.get(d.action_id, d.action_id)
                return out
        raise QueueConfigError(f"BfRt read of {table_name} {dict(key)}: no such entry")

    def close(self) -> None:
        self._requests.put(None)
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._channel.close()

