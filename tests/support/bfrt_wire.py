"""The BfRuntime messages as the fake BfRt server (fake_bfrt.py) reads and writes them: a protobuf wire codec of
its own, over a schema transcribed here from the SDE's ``bfruntime.proto`` (package ``bfrt_proto``; open-p4studio
``pkgsrc/bf-drivers/src/bf_rt/proto/bfruntime.proto``), field number by field number.

It shares nothing with the client under test (``controller.p4runtime.bfrt``, which builds its messages from a
schema of its own with the protobuf library): a field number, a wire type or a oneof the client gets wrong
makes ``decode`` fail (or decode to another field, which the fake's checks then see), instead of both sides
agreeing by construction. Decoding is strict where the real server would be lenient: a field number the
proto does not declare for that message is an error (``WireError``), because the only client that talks to
this fake is ours, and such a field means our schema is wrong. ``tests/controller/test_ctl_tofino.py`` checks
``SCHEMA`` against a real ``bfruntime.proto`` when one is at hand, as it checks the client's.

    request = decode("WriteRequest", data)          # a Message: request.target.pipe_id, request.updates[0]...
    data = encode("ReadResponse", {"entities": [...]})
"""
from __future__ import annotations

import struct
from typing import Any

# message -> {number: (field name, type, repeated, oneof or None)}. Types: protobuf scalar names, "enum"
# (a varint), or a message name ("google.rpc.Status", "google.protobuf.Any" for the status details).
SCHEMA: dict[str, dict[int, tuple[str, str, bool, str | None]]] = {}


def _message(name: str, *fields: tuple) -> None:
    SCHEMA[name] = {}
    for spec in fields:
        number, fname, ftype = spec[:3]
        repeated = len(spec) > 3 and spec[3] == "repeated"
        oneof = spec[3] if len(spec) > 3 and spec[3] != "repeated" else None
        SCHEMA[name][number] = (fname, ftype, repeated, oneof)


_message("WriteRequest", (1, "target", "TargetDevice"), (2, "client_id", "uint32"),
         (3, "updates", "Update", "repeated"), (4, "atomicity", "enum"), (5, "p4_name", "string"))
_message("WriteResponse", (1, "status", "Error", "repeated"))
_message("ReadRequest", (1, "target", "TargetDevice"), (2, "client_id", "uint32"),
         (3, "entities", "Entity", "repeated"), (4, "p4_name", "string"))
_message("ReadResponse", (1, "entities", "Entity", "repeated"), (2, "status", "Error", "repeated"))
_message("TargetDevice", (1, "device_id", "uint32"), (2, "pipe_id", "uint32"), (3, "direction", "uint32"),
         (4, "prsr_id", "uint32"))
_message("Update", (1, "type", "enum"), (2, "entity", "Entity"))
_message("Entity", (1, "table_entry", "TableEntry", "entity"), (2, "table_usage", "bytes", "entity"),
         (3, "table_attribute", "bytes", "entity"), (4, "table_operation", "bytes", "entity"),
         (5, "object_id", "bytes", "entity"), (6, "handle", "bytes", "entity"))
_message("TableEntry", (1, "table_id", "uint32"), (2, "key", "TableKey", "value"), (7, "handle_id", "uint32", "value"),
         (3, "data", "TableData"), (4, "is_default_entry", "bool"), (5, "table_read_flag", "TableReadFlag"),
         (6, "table_mod_inc_flag", "bytes"), (8, "entry_tgt", "TargetDevice"), (9, "table_flags", "TableFlags"))
_message("TableData", (1, "action_id", "uint32"), (2, "fields", "DataField", "repeated"))
_message("DataField", (1, "field_id", "uint32"), (2, "stream", "bytes", "value"), (3, "float_val", "float", "value"),
         (4, "str_val", "string", "value"), (5, "int_arr_val", "DataField.IntArray", "value"),
         (6, "bool_arr_val", "DataField.BoolArray", "value"), (7, "container_arr_val", "bytes", "value"),
         (8, "bool_val", "bool", "value"), (9, "str_arr_val", "DataField.StrArray", "value"))
_message("DataField.IntArray", (1, "val", "uint32", "repeated"))
_message("DataField.BoolArray", (1, "val", "bool", "repeated"))
_message("DataField.StrArray", (1, "val", "string", "repeated"))
_message("TableKey", (1, "fields", "KeyField", "repeated"))
_message("KeyField", (1, "field_id", "uint32"), (2, "exact", "KeyField.Exact", "match_type"),
         (3, "ternary", "KeyField.Ternary", "match_type"), (4, "lpm", "KeyField.LPM", "match_type"),
         (5, "range", "KeyField.Range", "match_type"), (6, "optional", "KeyField.Optional", "match_type"))
_message("KeyField.Exact", (1, "value", "bytes"))
_message("KeyField.Ternary", (1, "value", "bytes"), (2, "mask", "bytes"))
_message("KeyField.LPM", (1, "value", "bytes"), (2, "prefix_len", "int32"))
_message("KeyField.Range", (1, "low", "bytes"), (2, "high", "bytes"))
_message("KeyField.Optional", (1, "value", "bytes"), (2, "is_valid", "bool"))
_message("TableReadFlag", (1, "from_hw", "bool"), (2, "key_only", "bool"))
_message("TableFlags", (1, "from_hw", "bool"), (2, "key_only", "bool"), (3, "mod_del", "bool"),
         (4, "reset_ttl", "bool"), (5, "reset_stats", "bool"))
_message("StreamMessageRequest", (1, "client_id", "uint32"), (2, "subscribe", "Subscribe", "update"),
         (3, "digest_ack", "bytes", "update"))
_message("Subscribe", (1, "is_master", "bool"), (2, "device_id", "uint32"), (3, "notifications", "Subscribe.Notifications"),
         (4, "status", "google.rpc.Status"))
_message("Subscribe.Notifications", (1, "enable_learn_notifications", "bool"),
         (2, "enable_idletimeout_notifications", "bool"), (3, "enable_port_status_change_notifications", "bool"),
         (4, "enable_entry_active_notifications", "bool"), (5, "enable_selector_update_change_notifications", "bool"))
_message("StreamMessageResponse", (1, "subscribe", "Subscribe", "update"), (2, "digest", "bytes", "update"),
         (3, "idle_timeout_notification", "bytes", "update"), (4, "port_status_change_notification", "bytes", "update"),
         (5, "set_forwarding_pipeline_config_response", "SetForwardingPipelineConfigResponse", "update"),
         (6, "selector_update_change_notification", "bytes", "update"))
_message("SetForwardingPipelineConfigRequest", (1, "device_id", "uint32"), (2, "client_id", "uint32"),
         (3, "action", "enum"), (4, "dev_init_mode", "enum"), (5, "base_path", "string"),
         (6, "config", "ForwardingPipelineConfig", "repeated"))
_message("SetForwardingPipelineConfigResponse", (1, "set_forwarding_pipeline_config_response_type", "enum"))
_message("ForwardingPipelineConfig", (1, "p4_name", "string"), (2, "bfruntime_info", "bytes"),
         (3, "profiles", "bytes", "repeated"))
_message("NonP4Config", (1, "bfruntime_info", "bytes"))
_message("GetForwardingPipelineConfigRequest", (1, "device_id", "uint32"), (2, "client_id", "uint32"))
_message("GetForwardingPipelineConfigResponse", (1, "config", "ForwardingPipelineConfig", "repeated"),
         (2, "non_p4_config", "NonP4Config"))
_message("Error", (1, "canonical_code", "int32"), (2, "message", "string"), (3, "space", "string"), (4, "code", "int32"))
_message("google.rpc.Status", (1, "code", "int32"), (2, "message", "string"), (3, "details", "google.protobuf.Any", "repeated"))
_message("google.protobuf.Any", (1, "type_url", "string"), (2, "value", "bytes"))

UPDATE_TYPES = {0: "UNSPECIFIED", 1: "INSERT", 2: "MODIFY", 3: "MODIFY_INC", 4: "DELETE", 5: "INSERT_OR_MODIFY",
                6: "RESET"}
PIPELINE_ACTIONS = {0: "BIND", 1: "VERIFY", 2: "VERIFY_AND_WARM_INIT_BEGIN", 3: "VERIFY_AND_WARM_INIT_BEGIN_AND_END",
                    4: "WARM_INIT_END", 5: "RECONCILE_AND_WARM_INIT_END"}

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
_VARINT_TYPES = {"uint32", "int32", "uint64", "int64", "bool", "enum"}
_LENGTH_SCALARS = {"string", "bytes"}


class WireError(ValueError):
    """Bytes that are not the message the schema says (the fake answers INVALID_ARGUMENT with this text)."""


class Message:
    """A decoded message: fields as attributes (proto3 defaults when absent), ``WhichOneof(name)``."""

    def __init__(self, name: str, values: dict[str, Any] | None = None) -> None:
        self._name = name
        self._values = dict(values or {})

    def __getattr__(self, field: str) -> Any:
        if field.startswith("_"):
            raise AttributeError(field)
        schema = SCHEMA[self._name]
        for fname, ftype, repeated, _ in schema.values():
            if fname == field:
                if field in self._values:
                    return self._values[field]
                return [] if repeated else _default(ftype)
        raise AttributeError(f"{self._name} has no field {field!r}")

    def WhichOneof(self, oneof: str) -> str | None:  # noqa: N802 - the protobuf name, so callers read alike
        for fname, _, _, group in SCHEMA[self._name].values():
            if group == oneof and fname in self._values:
                return fname
        return None

    def HasField(self, field: str) -> bool:  # noqa: N802
        return field in self._values

    def __repr__(self) -> str:
        return f"{self._name}({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"


def _default(ftype: str) -> Any:
    if ftype in _VARINT_TYPES:
        return False if ftype == "bool" else 0
    if ftype == "float":
        return 0.0
    if ftype == "string":
        return ""
    if ftype == "bytes":
        return b""
    return Message(ftype)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def _scalar(message: str, fname: str, ftype: str, raw: int) -> Any:
    if ftype == "bool":
        if raw > 1:
            raise WireError(f"{message}.{fname}: bool {raw}")
        return bool(raw)
    if ftype in ("int32", "int64", "enum"):
        if raw >= 1 << 63:
            raw -= 1 << 64
        if ftype != "int64" and not -(1 << 31) <= raw < 1 << 31:
            raise WireError(f"{message}.{fname}: {raw} does not fit {ftype}")
        return raw
    limit = 32 if ftype == "uint32" else 64
    if raw >= 1 << limit:
        raise WireError(f"{message}.{fname}: {raw} does not fit {ftype}")
    return raw


def decode(message: str, data: bytes) -> Message:
    """``data`` as a ``message``, by ``SCHEMA``; raises ``WireError`` for anything the schema does not allow."""
    schema = SCHEMA[message]
    values: dict[str, Any] = {}
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if number not in schema:
            raise WireError(f"{message}: no field number {number} in bfruntime.proto (wire type {wire})")
        fname, ftype, repeated, oneof = schema[number]
        if wire == VARINT:
            raw, pos = _varint(data, pos)
            if ftype not in _VARINT_TYPES:
                raise WireError(f"{message}.{fname} ({ftype}) sent as a varint")
            value: Any = _scalar(message, fname, ftype, raw)
        elif wire == FIXED32:
            if ftype != "float" or pos + 4 > len(data):
                raise WireError(f"{message}.{fname} ({ftype}) sent as fixed32")
            value, = struct.unpack_from("<f", data, pos)
            pos += 4
        elif wire == LENGTH:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise WireError(f"{message}.{fname}: {size} bytes announced, {len(data) - pos} left")
            chunk = bytes(data[pos:pos + size])
            pos += size
            if ftype in _VARINT_TYPES and repeated:  # a packed repeated scalar
                items, p = [], 0
                while p < len(chunk):
                    raw, p = _varint(chunk, p)
                    items.append(_scalar(message, fname, ftype, raw))
                values.setdefault(fname, []).extend(items)
                continue
            if ftype == "string":
                try:
                    value = chunk.decode("utf-8")
                except UnicodeDecodeError:
                    raise WireError(f"{message}.{fname}: not UTF-8") from None
            elif ftype == "bytes":
                value = chunk
            elif ftype in SCHEMA:
                value = decode(ftype, chunk)
            else:
                raise WireError(f"{message}.{fname} ({ftype}) sent length-delimited")
        else:
            raise WireError(f"{message}.{fname}: wire type {wire}")
        if repeated:
            values.setdefault(fname, []).append(value)
        else:
            if oneof is not None:
                for other, _, _, group in schema.values():
                    if group == oneof:
                        values.pop(other, None)
            values[fname] = value
    return Message(message, values)


def _put_varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode(message: str, values: dict[str, Any]) -> bytes:
    """``values`` (field name -> value; messages as dicts) as a ``message``, proto3 style (defaults omitted unless
    in a oneof, repeated scalars packed)."""
    schema = SCHEMA[message]
    by_name = {fname: (number, ftype, repeated, oneof) for number, (fname, ftype, repeated, oneof) in schema.items()}
    out = bytearray()
    for fname, value in values.items():
        if fname not in by_name:
            raise KeyError(f"{message} has no field {fname!r}")
        number, ftype, repeated, oneof = by_name[fname]
        if repeated and ftype in _VARINT_TYPES:
            packed = b"".join(_put_varint(int(v)) for v in value)
            out += _put_varint(number << 3 | LENGTH) + _put_varint(len(packed)) + packed
            continue
        for v in (value if repeated else [value]):
            if ftype in _VARINT_TYPES:
                if not v and oneof is None and not repeated:
                    continue
                out += _put_varint(number << 3 | VARINT) + _put_varint(int(v))
            elif ftype == "float":
                out += _put_varint(number << 3 | FIXED32) + struct.pack("<f", v)
            else:
                body = v.encode() if ftype == "string" else bytes(v) if ftype == "bytes" else encode(ftype, v)
                if not body and oneof is None and not repeated and ftype in _LENGTH_SCALARS:
                    continue
                out += _put_varint(number << 3 | LENGTH) + _put_varint(len(body)) + body
    return bytes(out)


def as_dict(message: Message) -> dict[str, Any]:
    """A decoded message back as ``encode``'s input."""
    out: dict[str, Any] = {}
    for fname, value in message._values.items():
        if isinstance(value, Message):
            value = as_dict(value)
        elif isinstance(value, list):
            value = [as_dict(v) if isinstance(v, Message) else v for v in value]
        out[fname] = value
    return out
