"""Base class of the NetApprox PTF suite: connect to the switch over P4Runtime, push the pipeline once,
record every write so tearDown can undo it, read counters, and exchange packet-in/packet-out.

Test parameters (``ptf --test-params "k='v';..."``, filled in by ptf/run_ptf.py):
    grpcaddr     P4Runtime address of simple_switch_grpc, e.g. '127.0.0.1:9559'
    device_id    P4Runtime device id (0)
    p4info       path of build/v1model/p4info.txtpb
    bmv2_json    path of build/v1model/bmv2.json (pushed if the switch runs another pipeline)
    cpu_port     the switch's CPU port (255 on BMv2)
    thrift_port  BMv2 Thrift port (queue rate/depth); tests that need it skip without it
    arch         'v1model' or 'tna'
"""
from __future__ import annotations

import hashlib
import itertools
import queue
import threading
import time

import google.protobuf.text_format
import grpc
import ptf
import ptf.testutils as testutils
from google.rpc import code_pb2, status_pb2
from netapprox.controller.p4runtime.protos import p4info_pb2, p4runtime_pb2, p4runtime_pb2_grpc
from ptf.base_tests import BaseTest
from ptf.dataplane import match_exp_pkt
from scapy.layers.l2 import Ether

# Each test takes a new, higher election id: a stream of the previous test that the server has not torn
# down yet cannot keep this test from becoming primary.
_ELECTION_IDS = itertools.count(int(time.time()))


def encode_int(value: int, bitwidth: int) -> bytes:
    """P4Runtime canonical bytestring: big-endian, no leading zero bytes, at least one byte."""
    if not 0 <= value < (1 << bitwidth):
        raise ValueError(f"{value} does not fit in {bitwidth} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def decode_int(data: bytes) -> int:
    return int.from_bytes(data, "big")


def mac_to_int(mac: str) -> int:
    return int(mac.replace(":", ""), 16)


def ipv4_to_int(addr: str) -> int:
    a, b, c, d = (int(x) for x in addr.split("."))
    return (a << 24) | (b << 16) | (c << 8) | d


class P4RuntimeWriteError(Exception):
    """A Write failed; the message lists every failed update as 'At index N: CODE, message'."""

    def __init__(self, err: grpc.RpcError) -> None:
        lines = [f"P4Runtime Write failed: {err.code().name} {err.details()}"]
        for key, value in err.trailing_metadata() or ():
            if key == "grpc-status-details-bin":
                status = status_pb2.Status()
                status.ParseFromString(value)
                for i, detail in enumerate(status.details):
                    p4err = p4runtime_pb2.Error()
                    if detail.Unpack(p4err) and p4err.canonical_code != code_pb2.OK:
                        code = code_pb2.Code.Name(p4err.canonical_code)
                        lines.append(f"  At index {i}: {code}, {p4err.message}")
        super().__init__("\n".join(lines))


class P4RuntimeTest(BaseTest):
    """Connect, become primary, make sure our pipeline runs, and clean up after the test."""

    _pipeline_pushed_cookie: int | None = None  # per ptf process

    def setUp(self) -> None:
        BaseTest.setUp(self)
        self.election_id = (0, next(_ELECTION_IDS))
        self.dataplane = ptf.dataplane_instance
        self.dataplane.flush()
        self.grpc_addr = testutils.test_param_get("grpcaddr", "127.0.0.1:9559")
        self.device_id = int(testutils.test_param_get("device_id", 0))
        self.cpu_port = int(testutils.test_param_get("cpu_port", 255))
        self.arch = testutils.test_param_get("arch", "v1model")
        thrift = testutils.test_param_get("thrift_port")
        self.thrift_port = int(thrift) if thrift not in (None, "") else None
        p4info_path = testutils.test_param_get("p4info")
        if p4info_path is None:
            self.fail("test parameter p4info is not set")
        self.p4info_path = p4info_path
        self.p4info = p4info_pb2.P4Info()
        with open(p4info_path) as f:
            google.protobuf.text_format.Merge(f.read(), self.p4info)
        self._index_p4info()

        self._writes: list[p4runtime_pb2.Entity] = []  # inserted entities, undone in tearDown
        self._undo: list = []  # other cleanup callbacks (Thrift queue settings), newest last
        self.channel = grpc.insecure_channel(self.grpc_addr)
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self._stream_out: queue.Queue = queue.Queue()
        self._stream_in: queue.Queue = queue.Queue()
        self._stream = self.stub.StreamChannel(iter(self._stream_out.get, None))
        self._stream_thread = threading.Thread(target=self._receive_stream, daemon=True)
        self._stream_thread.start()
        self._arbitrate()
        self._push_pipeline_if_needed()
        self._assert_no_table_entries()

    def tearDown(self) -> None:
        try:
            errors = []
            for undo in reversed(self._undo):
                try:
                    undo()
                except Exception as e:  # keep undoing the rest
                    errors.append(e)
            if self._writes:
                self._write([self._update(p4runtime_pb2.Update.DELETE, e) for e in reversed(self._writes)])
                self._writes.clear()
            if errors:
                raise errors[0]
        finally:
            self._stream_out.put(None)
            self._stream_thread.join(timeout=5)
            self.channel.close()
            BaseTest.tearDown(self)

    # --- P4Info lookup -----------------------------------------------------------------------------
    def _index_p4info(self) -> None:
        """Objects by full name and by any unique dotted suffix ('routes_v4', 'forwarding.routes_v4'),
        so tests read the same on v1model and on TNA (where bf-p4c may prefix the pipe name)."""
        self._by_name: dict[tuple[str, str], object] = {}
        seen: dict[tuple[str, str], int] = {}
        for kind in ("tables", "actions", "counters", "direct_counters", "meters", "controller_packet_metadata"):
            for obj in getattr(self.p4info, kind):
                parts = obj.preamble.name.split(".")
                for i in range(len(parts)):
                    key = (kind, ".".join(parts[i:]))
                    seen[key] = seen.get(key, 0) + 1
                    self._by_name[key] = obj
        for key, n in seen.items():
            if n > 1:
                del self._by_name[key]

    def p4obj(self, kind: str, name: str):
        try:
            return self._by_name[(kind, name)]
        except KeyError:
            raise KeyError(f"no {kind[:-1]} named {name!r} in {self.p4info_path}") from None

    def table_action(self, table: str) -> str:
        """Full name of the one action of ``table`` that entries may use (not @defaultonly)."""
        t = self.p4obj("tables", table)
        names = {a.preamble.id: a.preamble.name for a in self.p4info.actions}
        usable = [names[r.id] for r in t.action_refs if r.scope != p4info_pb2.ActionRef.DEFAULT_ONLY]
        if len(usable) != 1:
            raise KeyError(f"table {table} has actions {usable}, expected exactly one")
        return usable[0]

    def p4id(self, kind: str, name: str) -> int:
        return self.p4obj(kind, name).preamble.id

    # --- stream ------------------------------------------------------------------------------------
    def _receive_stream(self) -> None:
        try:
            for msg in self._stream:
                self._stream_in.put(msg)
        except grpc.RpcError:
            pass  # stream closed in tearDown

    def _get_stream(self, field: str, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                msg = self._stream_in.get(timeout=remaining)
            except queue.Empty:
                return None
            if msg.HasField(field):
                return msg

    def _arbitrate(self) -> None:
        req = p4runtime_pb2.StreamMessageRequest()
        req.arbitration.device_id = self.device_id
        req.arbitration.election_id.high, req.arbitration.election_id.low = self.election_id
        self._stream_out.put(req)
        rep = self._get_stream("arbitration", timeout=5)
        if rep is None:
            self.fail(f"no arbitration answer from {self.grpc_addr}")
        if rep.arbitration.status.code != code_pb2.OK:
            self.fail(f"not primary on {self.grpc_addr}: {rep.arbitration.status.message}")

    def _push_pipeline_if_needed(self) -> None:
        json_path = testutils.test_param_get("bmv2_json")
        with open(self.p4info_path, "rb") as f:
            digest = hashlib.sha256(f.read())
        device_config = b""
        if json_path:
            with open(json_path, "rb") as f:
                device_config = f.read()
            digest.update(device_config)
        cookie = int.from_bytes(digest.digest()[:8], "big")
        req = p4runtime_pb2.GetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.COOKIE_ONLY)
        try:
            current = self.stub.GetForwardingPipelineConfig(req).config.cookie.cookie
        except grpc.RpcError:
            current = None
        if current == cookie:
            return
        if not json_path:
            self.fail("the switch runs another pipeline and no bmv2_json test parameter was given")
        set_req = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
        set_req.election_id.high, set_req.election_id.low = self.election_id
        set_req.config.p4info.CopyFrom(self.p4info)
        set_req.config.p4_device_config = device_config
        set_req.config.cookie.cookie = cookie
        self.stub.SetForwardingPipelineConfig(set_req)

    def _assert_no_table_entries(self) -> None:
        """Every test starts from empty tables: a leftover means an earlier test did not clean up."""
        entity = p4runtime_pb2.Entity()
        entity.table_entry.table_id = 0  # wildcard: all tables
        left = self._read(entity)
        if left:
            names = sorted({self.p4info_name(e.table_entry.table_id) for e in left})
            self.fail(f"{len(left)} table entries left over by an earlier test, in {names}")

    def p4info_name(self, p4id: int) -> str:
        for kind in ("tables", "actions", "counters", "direct_counters"):
            for obj in getattr(self.p4info, kind):
                if obj.preamble.id == p4id:
                    return obj.preamble.name
        return f"id {p4id}"

    # --- writes ------------------------------------------------------------------------------------
    def _update(self, kind, entity: p4runtime_pb2.Entity) -> p4runtime_pb2.Update:
        update = p4runtime_pb2.Update(type=kind)
        update.entity.CopyFrom(entity)
        return update

    def _write(self, updates) -> None:
        req = p4runtime_pb2.WriteRequest(device_id=self.device_id)
        req.election_id.high, req.election_id.low = self.election_id
        req.updates.extend(updates)
        try:
            self.stub.Write(req)
        except grpc.RpcError as e:
            raise P4RuntimeWriteError(e) from None

    def insert(self, entity: p4runtime_pb2.Entity) -> p4runtime_pb2.Entity:
        """Insert one entity; tearDown deletes it."""
        self._write([self._update(p4runtime_pb2.Update.INSERT, entity)])
        self._writes.append(entity)
        return entity

    def delete(self, entity: p4runtime_pb2.Entity) -> None:
        """Delete an entity this test inserted, now rather than in tearDown."""
        self._write([self._update(p4runtime_pb2.Update.DELETE, entity)])
        self._writes.remove(entity)

    def add_cleanup(self, undo) -> None:
        """Run ``undo()`` in tearDown (newest first), e.g. to restore a BMv2 queue setting."""
        self._undo.append(undo)

    # --- table entries -----------------------------------------------------------------------------
    def table_entry(self, table: str, match: dict, action: str | None = None, params: dict | None = None,
                    priority: int = 0) -> p4runtime_pb2.Entity:
        """Build a table entry. ``match`` maps a key name to:
        exact: int; lpm: (value, prefix_len); ternary: (value, mask); range: (low, high)."""
        t = self.p4obj("tables", table)
        entity = p4runtime_pb2.Entity()
        entry = entity.table_entry
        entry.table_id = t.preamble.id
        entry.priority = priority
        fields = {mf.name: mf for mf in t.match_fields}
        for name, value in match.items():
            if name not in fields:
                raise KeyError(f"table {table} has no key {name!r}; keys: {sorted(fields)}")
            mf = fields[name]
            kind = mf.match_type
            # P4Runtime: a don't-care ternary/range/lpm field is omitted, never sent as mask 0 /
            # [0, max] / prefix 0 (the server rejects those with INVALID_ARGUMENT).
            if kind == p4info_pb2.MatchField.TERNARY and value[1] == 0:
                continue
            if kind == p4info_pb2.MatchField.RANGE and tuple(value) == (0, (1 << mf.bitwidth) - 1):
                continue
            if kind == p4info_pb2.MatchField.LPM and value[1] == 0:
                continue
            fm = entry.match.add(field_id=mf.id)
            if kind == p4info_pb2.MatchField.EXACT:
                fm.exact.value = encode_int(value, mf.bitwidth)
            elif kind == p4info_pb2.MatchField.LPM:
                val, plen = value
                mask = ((1 << mf.bitwidth) - 1) ^ ((1 << (mf.bitwidth - plen)) - 1)
                fm.lpm.value = encode_int(val & mask, mf.bitwidth)
                fm.lpm.prefix_len = plen
            elif kind == p4info_pb2.MatchField.TERNARY:
                val, mask = value
                fm.ternary.value = encode_int(val & mask, mf.bitwidth)
                fm.ternary.mask = encode_int(mask, mf.bitwidth)
            elif kind == p4info_pb2.MatchField.RANGE:
                low, high = value
                fm.range.low = encode_int(low, mf.bitwidth)
                fm.range.high = encode_int(high, mf.bitwidth)
            else:
                raise ValueError(f"match kind {kind} of {table}.{name} not supported here")
        if action is not None:
            a = self.p4obj("actions", action)
            entry.action.action.action_id = a.preamble.id
            widths = {p.name: p for p in a.params}
            for name, value in (params or {}).items():
                p = widths[name]
                entry.action.action.params.add(param_id=p.id, value=encode_int(value, p.bitwidth))
            missing = set(widths) - set(params or {})
            if missing:
                raise KeyError(f"action {action} needs params {sorted(missing)}")
        return entity

    # --- reads -------------------------------------------------------------------------------------
    def _read(self, entity: p4runtime_pb2.Entity) -> list[p4runtime_pb2.Entity]:
        req = p4runtime_pb2.ReadRequest(device_id=self.device_id)
        req.entities.add().CopyFrom(entity)
        out = []
        for rep in self.stub.Read(req):
            out.extend(rep.entities)
        return out

    def read_counter(self, counter: str, index: int) -> tuple[int, int]:
        """(packets, bytes) of one cell of an indirect counter."""
        entity = p4runtime_pb2.Entity()
        entity.counter_entry.counter_id = self.p4id("counters", counter)
        entity.counter_entry.index.index = index
        (got,) = self._read(entity)
        data = got.counter_entry.data
        return data.packet_count, data.byte_count

    def read_direct_counter(self, table_entry: p4runtime_pb2.Entity) -> tuple[int, int]:
        """(packets, bytes) of the direct counter of an installed table entry."""
        entity = p4runtime_pb2.Entity()
        entity.direct_counter_entry.table_entry.CopyFrom(table_entry.table_entry)
        entity.direct_counter_entry.table_entry.ClearField("action")
        (got,) = self._read(entity)
        data = got.direct_counter_entry.data
        return data.packet_count, data.byte_count

    # --- packet I/O --------------------------------------------------------------------------------
    def _packet_metadata_ids(self, header: str) -> dict[str, object]:
        for cpm in self.p4info.controller_packet_metadata:
            if cpm.preamble.name == header:
                return {m.name: m for m in cpm.metadata}
        raise KeyError(f"no controller_packet_metadata {header!r} in P4Info")

    def send_packet_out(self, pkt, egress_port: int) -> None:
        meta = self._packet_metadata_ids("packet_out")
        req = p4runtime_pb2.StreamMessageRequest()
        req.packet.payload = bytes(pkt)
        for name, m in meta.items():
            value = egress_port if name == "egress_port" else 0
            req.packet.metadata.add(metadata_id=m.id, value=encode_int(value, m.bitwidth))
        self._stream_out.put(req)

    def get_packet_in(self, timeout: float = 2.0):
        """The next PacketIn as (payload bytes, {metadata name: int}), or None after ``timeout``."""
        msg = self._get_stream("packet", timeout)
        if msg is None:
            return None
        names = {m.id: name for name, m in self._packet_metadata_ids("packet_in").items()}
        return msg.packet.payload, {names[m.metadata_id]: decode_int(m.value) for m in msg.packet.metadata}

    def verify_packet_in(self, exp_pkt, ingress_port: int, timeout: float = 2.0) -> None:
        got = self.get_packet_in(timeout)
        if got is None:
            self.fail("no packet-in received")
        payload, meta = got
        self.assertEqual(meta.get("ingress_port"), ingress_port, f"packet-in metadata {meta}")
        if not match_exp_pkt(exp_pkt, Ether(payload)):
            self.fail(f"packet-in payload differs:\nexpected {Ether(bytes(exp_pkt))!r}\ngot      {Ether(payload)!r}")

    def verify_no_packet_in(self, timeout: float = 0.3) -> None:
        got = self.get_packet_in(timeout)
        if got is not None:
            self.fail(f"unexpected packet-in {Ether(got[0])!r} {got[1]}")

    # --- dataplane shortcuts -----------------------------------------------------------------------
    def send_packet(self, port: int, pkt) -> None:
        testutils.send_packet(self, port, pkt)

    def verify_packet(self, exp_pkt, port: int, timeout: float | None = None) -> None:
        testutils.verify_packet(self, exp_pkt, port, timeout=timeout)

    def verify_no_other_packets(self) -> None:
        testutils.verify_no_other_packets(self)

    def is_v1model(self) -> bool:
        return self.arch == "v1model"
