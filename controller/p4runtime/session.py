"""One P4Runtime session with one device: channel, StreamChannel arbitration, pipeline, Write, Read, packet-in.

The session knows nothing of NetApprox's tables: ``connection.SwitchConnection`` owns it and arms the pipeline
through it, ``write_queue.WriteQueue`` builds the updates. Every
RPC failure that means "the switch is not (or no longer) reachable as primary" raises
``SwitchUnavailable`` (the runtime reconnects); a refused Write raises ``P4RuntimeWriteError`` with the
per-update errors unpacked from the ``grpc-status-details-bin`` trailer ("At index N: CODE, message").

Arbitration: a single controller (``replica = 0``) arbitrates with its configured election id and must be primary
(``NotPrimaryError`` otherwise; losing primary later breaks the session). A replica (``replica`` k >= 1) keeps
its stream whatever the switch decides: ``arbitration`` follows the switch's updates, and on each one the
replica asks for the election id ``arbitration.claim`` says (controller/p4runtime/arbitration.py), at once,
from the stream's reader thread; a Write refused with PERMISSION_DENIED raises ``NotPrimaryError``.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from typing import Any, Iterator, Sequence

import grpc
from google.protobuf import text_format
from google.rpc import code_pb2, status_pb2
from netapprox.controller.p4runtime.protos import p4runtime_pb2, p4runtime_pb2_grpc

from netapprox.controller.errors import (
    ControllerError,
    NotPrimaryError,
    P4RuntimeWriteError,
    PipelineError,
    SwitchUnavailable,
    UpdateError,
)
from netapprox.controller.p4runtime.arbitration import Arbitration, ElectionId, claim, initial_id, rank_of
from netapprox.controller.p4runtime.mirror import varint as _varint
from netapprox.controller.p4runtime.options import P4RuntimeOptions
from netapprox.controller.p4runtime.p4info import P4Info, decode

log = logging.getLogger("netapprox.controller.p4runtime")

UNAVAILABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED,
                     grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED)
PACKET_IN_BACKLOG = 10000
"""Packet-in frames kept between two drains; older ones are dropped first (and counted)."""
CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000), ("grpc.max_metadata_size", 8 << 20))
"""gRPC retries a refused connection after 1 s, then up to 2 min apart by default; a switch that restarts
should be found within a second of answering again (a re-armed switch within 2 s, docs/controller.md). The
per-update errors of a large refused Write come in the trailer, beyond gRPC's default 16 KiB."""
NO_PIPELINE_CODES = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND)
"""GetForwardingPipelineConfig codes that mean "no pipeline on the device" (BMv2's PI: FAILED_PRECONDITION)."""


def update_errors(e: grpc.RpcError, updates: Sequence[p4runtime_pb2.Update]) -> list[UpdateError] | None:
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


class P4RuntimeSession:
    """``open()`` connects and becomes primary; ``close()`` tears down. Not reusable across switches."""

    def __init__(self, switch: str, options: P4RuntimeOptions, p4info: P4Info) -> None:
        self.switch = switch
        self.options = options
        self.p4info = p4info
        self._ingress_port_id = next((f.id for f in self._packet_in_fields().values()
                                      if f.name == "ingress_port"), None)
        self._channel: grpc.Channel | None = None
        self._stub: p4runtime_pb2_grpc.P4RuntimeStub | None = None
        self._requests: queue.Queue | None = None
        self._stream: Any = None
        self._stream_thread: threading.Thread | None = None
        self._arbitration: queue.Queue = queue.Queue()
        self._packets_in: collections.deque[tuple[bytes, int | None]] = collections.deque(maxlen=PACKET_IN_BACKLOG)
        self._broken: str | None = None
        self.connected = False
        self.packets_in_dropped = 0
        self._raw_write = None
        self._write_head = b""
        self.replica = options.replica
        """This controller's rank in a replica set (0: a single controller)."""
        self.election: ElectionId = options.election_id if not self.replica else initial_id(self.replica)
        """The election id this controller holds now."""
        self.arbitration = Arbitration()
        """Who is primary, as the switch's arbitration updates said."""

    @property
    def election_id(self) -> p4runtime_pb2.Uint128:
        high, low = self.election
        return p4runtime_pb2.Uint128(high=high, low=low)

    def _hold(self, election: ElectionId) -> None:
        """Hold (and write with) ``election`` from now on."""
        self.election = election
        self._raw_write = None  # its cached request head names the election id

    def _packet_in_fields(self):
        try:
            return self.p4info.packet_metadata("packet_in")
        except ControllerError:
            return {}

    # --- lifecycle ---

    def open(self) -> None:
        """Connect, open the stream channel and win arbitration. Raises SwitchUnavailable or NotPrimaryError."""
        self.close()
        opts = self.options
        self._channel = grpc.insecure_channel(opts.address, options=CHANNEL_OPTIONS)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=opts.connect_timeout_s)
        except grpc.FutureTimeoutError:
            self.close()
            raise SwitchUnavailable(self.switch, f"no P4Runtime server at {opts.address} "
                                                 f"after {opts.connect_timeout_s}s") from None
        self._stub = p4runtime_pb2_grpc.P4RuntimeStub(self._channel)
        try:
            self._open_stream()
        except BaseException:
            self.close()
            raise
        self.connected = True

    def _open_stream(self) -> None:
        requests: queue.Queue = queue.Queue()
        self._requests = requests
        self._arbitration = queue.Queue()
        self._broken = None
        self.arbitration.primary = False
        if self.replica:
            self._hold(initial_id(self.replica))

        def request_iter():
            while True:
                item = requests.get()
                if item is None:
                    return
                yield item

        stream = self._stub.StreamChannel(request_iter())
        self._stream = stream
        thread = threading.Thread(target=self._read_stream, args=(stream,), name=f"p4rt-stream-{self.switch}",
                                  daemon=True)
        self._stream_thread = thread
        thread.start()
        requests.put(p4runtime_pb2.StreamMessageRequest(arbitration=p4runtime_pb2.MasterArbitrationUpdate(
            device_id=self.options.device_id, election_id=self.election_id)))
        try:
            answer = self._arbitration.get(timeout=self.options.connect_timeout_s)
        except queue.Empty:
            raise SwitchUnavailable(self.switch, "no arbitration answer on the stream channel") from None
        if isinstance(answer, str):
            raise SwitchUnavailable(self.switch, f"stream channel closed during arbitration: {answer}")
        if answer.status.code != code_pb2.OK and not self.replica:
            raise NotPrimaryError(self.switch, self.options.election_id,
                                  f"{code_pb2.Code.Name(answer.status.code)}: {answer.status.message}")

    def _read_stream(self, stream: Any) -> None:
        try:
            for message in stream:
                kind = message.WhichOneof("update")
                if kind == "arbitration":
                    self._on_arbitration(message.arbitration)
                    self._arbitration.put(message.arbitration)
                elif kind == "packet":
                    if len(self._packets_in) == self._packets_in.maxlen:
                        self.packets_in_dropped += 1
                    self._packets_in.append((bytes(message.packet.payload), self._ingress_port(message.packet)))
                elif kind == "error":
                    log.warning("switch %r: stream error: %s", self.switch, message.error.message)
            reason = "stream channel closed by the switch"
        except grpc.RpcError as e:
            reason = f"stream channel: {e.code().name}: {e.details()}"
        except Exception as e:  # noqa: BLE001 - whatever broke the stream, the session is gone
            reason = f"stream channel: {e}"
        if self._stream is stream:
            self._broken = reason
            self._arbitration.put(reason)

    def _on_arbitration(self, update: p4runtime_pb2.MasterArbitrationUpdate) -> None:
        """Follow an arbitration update: who is primary now; a replica asks for the id ``claim`` says, a single
        controller that is not primary any more breaks the session."""
        status = update.status.code
        past = (update.election_id.high, update.election_id.low) if update.HasField("election_id") else None
        state = self.arbitration
        primary_id = past if status != code_pb2.NOT_FOUND else None
        if primary_id is None and state.primary_id is not None:
            state.vacancies += 1
        if primary_id != state.primary_id:
            state.changes += 1
            state.since = time.time()
            log.info("switch %r: primary is %s; this controller (election id %s) is %s", self.switch,
                     f"election id {primary_id} (replica {rank_of(primary_id)})" if primary_id else "nobody",
                     self.election, "primary" if status == code_pb2.OK else "a backup")
        state.primary_id = primary_id
        if status == code_pb2.OK and not state.primary:
            state.terms += 1
        state.primary = status == code_pb2.OK
        if self.replica:
            want = claim(self.replica, self.election, status, past)
            if want is not None and self._requests is not None:
                log.info("switch %r: asking for election id %s (%s)", self.switch, want,
                         "no primary" if status == code_pb2.NOT_FOUND else f"primary {past} has a lower rank")
                self._hold(want)
                self._requests.put(p4runtime_pb2.StreamMessageRequest(arbitration=p4runtime_pb2.MasterArbitrationUpdate(
                    device_id=self.options.device_id, election_id=self.election_id)))
        elif self.connected and status != code_pb2.OK:
            self._broken = "lost primary: " + update.status.message

    def _ingress_port(self, packet: p4runtime_pb2.PacketIn) -> int | None:
        for m in packet.metadata:
            if m.metadata_id == self._ingress_port_id:
                return decode(m.value)
        return None

    def check_up(self) -> None:
        """Raise SwitchUnavailable unless the session is open and its stream alive."""
        if not self.connected or self._stub is None:
            raise SwitchUnavailable(self.switch, "not connected")
        if self._broken:
            self.connected = False
            raise SwitchUnavailable(self.switch, self._broken)

    def close(self) -> None:
        self.connected = False
        self.arbitration.primary = False
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
        self._raw_write = None

    # --- RPCs ---

    def pipeline_cookie(self) -> int | None:
        """The cookie of the pipeline the device runs (GetForwardingPipelineConfig, COOKIE_ONLY), or None when it
        runs none or one without a cookie."""
        request = p4runtime_pb2.GetForwardingPipelineConfigRequest(
            device_id=self.options.device_id,
            response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.COOKIE_ONLY)
        try:
            response = self._stub.GetForwardingPipelineConfig(request, timeout=self.options.rpc_timeout_s)
        except grpc.RpcError as e:
            if e.code() in NO_PIPELINE_CODES:
                return None
            if e.code() in UNAVAILABLE_CODES:
                raise SwitchUnavailable(self.switch, f"GetForwardingPipelineConfig: {e.code().name}: "
                                                     f"{e.details()}") from None
            raise PipelineError(f"switch {self.switch!r}: GetForwardingPipelineConfig refused: {e.code().name}: "
                                f"{e.details()}") from None
        return response.config.cookie.cookie or None

    def read_table_entries(self) -> list[p4runtime_pb2.TableEntry]:
        """Every table entry the device holds (one wildcard Read; default entries are not included)."""
        wildcard = p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry(table_id=0))
        return [e.table_entry for e in self.read([wildcard], "table entries")]

    def set_pipeline(self, config: p4runtime_pb2.ForwardingPipelineConfig) -> None:
        """SetForwardingPipelineConfig(VERIFY_AND_COMMIT)."""
        request = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.options.device_id, election_id=self.election_id,
            action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT, config=config)
        try:
            self._stub.SetForwardingPipelineConfig(request, timeout=self.options.rpc_timeout_s)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                raise SwitchUnavailable(self.switch, f"SetForwardingPipelineConfig: {e.details()}") from None
            self._check_denied(e)
            raise PipelineError(f"switch {self.switch!r}: SetForwardingPipelineConfig refused: "
                                f"{e.code().name}: {e.details()}") from None

    def write(self, updates: Sequence[p4runtime_pb2.Update]) -> None:
        """One batched Write. Raises SwitchUnavailable, or P4RuntimeWriteError listing the failed updates (the
        others were applied: P4Runtime CONTINUE_ON_ERROR semantics; index -1 when the switch did not say)."""
        request = p4runtime_pb2.WriteRequest(device_id=self.options.device_id, election_id=self.election_id,
                                             updates=updates)
        try:
            self._stub.Write(request, timeout=self.options.rpc_timeout_s)
        except grpc.RpcError as e:
            raise self._write_error(e, updates) from None

    def write_future(self, batch: Sequence[bytes]):
        """Start one Write of serialized Updates; the request is assembled from them, without building
        messages. ``write_result`` waits for it."""
        if self._raw_write is None:
            self._raw_write = self._channel.unary_unary("/p4.v1.P4Runtime/Write", request_serializer=None,
                                                        response_deserializer=p4runtime_pb2.WriteResponse.FromString)
            self._write_head = p4runtime_pb2.WriteRequest(device_id=self.options.device_id,
                                                          election_id=self.election_id).SerializeToString()
        body = b"".join(b"\x22" + _varint(len(u)) + u for u in batch)  # WriteRequest.updates (4)
        return self._raw_write.future(self._write_head + body, timeout=self.options.rpc_timeout_s)

    def write_result(self, future, batch: Sequence[bytes]) -> P4RuntimeWriteError | None:
        """None when the Write of ``batch`` succeeded, else its ``P4RuntimeWriteError``. Raises SwitchUnavailable
        when the switch is gone."""
        try:
            future.result()
        except grpc.RpcError as e:
            return self._write_error(e, [p4runtime_pb2.Update.FromString(u) for u in batch])
        return None

    def write_pipelined(self, batches: Sequence[Sequence[bytes]], max_inflight: int) -> list[P4RuntimeWriteError | None]:
        """Send ``batches`` of serialized Updates as Writes with at most ``max_inflight`` outstanding at once (the
        switch works on one while the next is on the wire) and wait for all; returns, per batch, None or its
        ``P4RuntimeWriteError``. Raises SwitchUnavailable when the switch is gone (the rest is not sent)."""
        results: list[P4RuntimeWriteError | None] = [None] * len(batches)
        inflight: list[tuple[int, object]] = []
        try:
            for index, batch in enumerate(batches):
                if len(inflight) >= max(1, max_inflight):
                    i, future = inflight.pop(0)
                    results[i] = self.write_result(future, batches[i])
                inflight.append((index, self.write_future(batch)))
            while inflight:
                i, future = inflight.pop(0)
                results[i] = self.write_result(future, batches[i])
        except (SwitchUnavailable, NotPrimaryError):
            for _, future in inflight:
                future.cancel()
            raise
        return results

    def _check_denied(self, e: grpc.RpcError) -> None:
        """A replica's request refused with PERMISSION_DENIED: another controller is primary now (the update that
        says so may still be on its way): NotPrimaryError."""
        if self.replica and e.code() == grpc.StatusCode.PERMISSION_DENIED:
            self.arbitration.primary = False
            raise NotPrimaryError(self.switch, self.election, f"PERMISSION_DENIED: {e.details()}") from None

    def _write_error(self, e: grpc.RpcError, updates: Sequence[p4runtime_pb2.Update]) -> P4RuntimeWriteError:
        self._check_denied(e)
        if e.code() in UNAVAILABLE_CODES:
            self.connected = False
            raise SwitchUnavailable(self.switch, f"Write: {e.code().name}: {e.details()}") from None
        errors = update_errors(e, updates)
        if errors is None:
            errors = [UpdateError(-1, e.code().name, e.details() or "", "")]
        return P4RuntimeWriteError(self.switch, errors, len(updates), e.details() or "")

    def read(self, entities: Sequence[p4runtime_pb2.Entity], what: str) -> Iterator[p4runtime_pb2.Entity]:
        """The entities a Read returns. ``what`` names the read in errors."""
        request = p4runtime_pb2.ReadRequest(device_id=self.options.device_id, entities=entities)
        try:
            for response in self._stub.Read(request, timeout=self.options.rpc_timeout_s):
                yield from response.entities
        except grpc.RpcError as e:
            if e.code() in UNAVAILABLE_CODES:
                self.connected = False
                raise SwitchUnavailable(self.switch, f"Read: {e.code().name}: {e.details()}") from None
            raise ControllerError(f"switch {self.switch!r}: reading {what} failed: {e.code().name}: "
                                  f"{e.details()}") from None

    def drain_packet_in(self) -> list[tuple[bytes, int | None]]:
        """(frame, ingress port) of every packet-in since the last call, oldest first."""
        out = []
        while self._packets_in:
            out.append(self._packets_in.popleft())
        return out
