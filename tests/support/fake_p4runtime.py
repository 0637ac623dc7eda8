"""An in-process fake P4Runtime server, for tests and benchmarks (no switch needed).

It behaves like a P4Runtime target where the controller can tell: arbitration (highest election id is
primary), SetForwardingPipelineConfig (required before writes; clears the tables), Writes with per-update
errors (INSERT of an existing key: ALREADY_EXISTS, MODIFY/DELETE of a missing one: NOT_FOUND, all reported
in the ``grpc-status-details-bin`` trailer as ``p4.v1.Error``), Reads of table entries, indirect counters
(values set by the test) and direct counters, and packet-in on the StreamChannel. It records every request.
``restart()`` stops it and starts a fresh one on the same port, like a switch reboot.
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
from netapprox.controller.p4runtime.protos import p4runtime_pb2, p4runtime_pb2_grpc


def _entry_key(entry: p4runtime_pb2.TableEntry) -> tuple:
    matches = tuple(sorted(m.SerializeToString(deterministic=True) for m in entry.match))
    return (entry.table_id, matches, entry.priority)


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
        fake = self.fake
        with fake.lock:
            config = fake.pipeline.config if fake.pipeline is not None else p4runtime_pb2.ForwardingPipelineConfig()
        return p4runtime_pb2.GetForwardingPipelineConfigResponse(config=config)

    def StreamChannel(self, request_iterator, context):  # noqa: N802
        return self.fake._stream(request_iterator, context)

    def Capabilities(self, request, context):  # noqa: N802
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version="1.4.1")


class FakeP4RuntimeServer:
    """See the module docstring. Attributes tests read: ``pipelines``, ``writes``, ``reads``, ``tables``,
    ``packets_out``; tests set ``counters[(counter_id, index)] = (packets, bytes)`` and
    ``direct_counts[table_entry_key] = packets`` (or ``direct_count_of(job) -> packets``)."""

    def __init__(self, address: str = "127.0.0.1:0", device_id: int = 1) -> None:
        self.device_id = device_id
        self.lock = threading.RLock()
        self._bind = address
        self.port = 0
        self._server: grpc.Server | None = None
        self.on_write: Callable[[p4runtime_pb2.WriteRequest, float], None] | None = None
        self.keep_requests = True
        """Record every Write in ``writes`` (a benchmark turns it off)."""
        self._reset_state()

    def _reset_state(self) -> None:
        self.pipelines: list[p4runtime_pb2.SetForwardingPipelineConfigRequest] = []
        self.pipeline: p4runtime_pb2.SetForwardingPipelineConfigRequest | None = None
        self.writes: list[p4runtime_pb2.WriteRequest] = []
        self.reads: list[p4runtime_pb2.ReadRequest] = []
        self.tables: dict[tuple, p4runtime_pb2.TableEntry] = {}
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

    def send_packet_in(self, payload: bytes, ingress_port: int = 1) -> None:
        """Send a packet-in to every connected stream (metadata id 1: ingress_port)."""
        msg = p4runtime_pb2.StreamMessageResponse(packet=p4runtime_pb2.PacketIn(
            payload=payload,
            metadata=[p4runtime_pb2.PacketMetadata(metadata_id=1, value=ingress_port.to_bytes(2, "big"))]))
        with self.lock:
            for out, _ in self._streams:
                out.put(msg)

    def entries(self, table_id: int | None = None) -> list[p4runtime_pb2.TableEntry]:
        with self.lock:
            return [e for e in self.tables.values() if table_id is None or e.table_id == table_id]

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
            self._table_ids = frozenset(t.preamble.id for t in request.config.p4info.tables)
            self.tables.clear()
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

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
                errors.append(self._apply(update))
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
        if update.entity.WhichOneof("entity") != "table_entry":
            return code_pb2.UNIMPLEMENTED, "only table entries"
        entry = update.entity.table_entry
        if entry.table_id not in self._table_ids:
            return code_pb2.NOT_FOUND, f"unknown table id {entry.table_id}"
        key = _entry_key(entry)
        if update.type == p4runtime_pb2.Update.INSERT:
            if key in self.tables:
                return code_pb2.ALREADY_EXISTS, "Match entry exists, use MODIFY if you wish to change action"
            self.tables[key] = entry
        elif update.type == p4runtime_pb2.Update.MODIFY:
            if key not in self.tables:
                return code_pb2.NOT_FOUND, "Cannot find match entry"
            self.tables[key] = entry
        elif update.type == p4runtime_pb2.Update.DELETE:
            if key not in self.tables:
                return code_pb2.NOT_FOUND, "Cannot find match entry"
            del self.tables[key]
            self.direct_counts.pop(key, None)
        else:
            return code_pb2.INVALID_ARGUMENT, "update type unspecified"
        return code_pb2.OK, ""

    def _read(self, request, context) -> Iterator[p4runtime_pb2.ReadResponse]:
        with self.lock:
            self.reads.append(request)
            response = p4runtime_pb2.ReadResponse()
            for entity in request.entities:
                kind = entity.WhichOneof("entity")
                if kind == "table_entry":
                    for e in self.tables.values():
                        if entity.table_entry.table_id in (0, e.table_id):
                            response.entities.add().table_entry.CopyFrom(e)
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
