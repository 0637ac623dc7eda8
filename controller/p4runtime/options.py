"""Options of a ``kind = "p4runtime"`` switch: the ``[switch.options]`` table of the controller's TOML."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from netapprox.controller import options as O
from netapprox.controller.errors import ConfigError
from netapprox.controller.model import buffer_unit_option_error, resolve_buffer_unit
from netapprox.controller.options import option
from netapprox.hostlib import checks as C

TARGETS = ("bmv2", "tofino")
_PATH = C.string()
ELECTION_ID = C.either(C.integer(ge=1, le=(1 << 64) - 1), C.sequence(C.integer(ge=0, le=(1 << 64) - 1), length=2),
                       want="an integer or [high, low]")


def _election_id(value: Any) -> tuple[int, int]:
    return (0, value) if isinstance(value, int) else (int(value[0]), int(value[1]))

@dataclasses.dataclass(frozen=True)
class P4RuntimeOptions:
    """Options of a ``kind = "p4runtime"`` switch (the ``[switch.options]`` table)."""

    address: str = option("127.0.0.1:9559", C.host_port())
    """host:port of the P4Runtime server."""
    device_id: int = option(1, C.integer(ge=0, le=(1 << 64) - 1))
    """P4Runtime device id (simple_switch_grpc: ``--device-id``, default 1 in its docs' examples)."""
    election_id: tuple[int, int] = option((0, 1), ELECTION_ID, convert=_election_id)
    """(high, low) election id; the controller must hold the highest to be primary (a single controller)."""
    replica: int = option(0, C.integer(ge=0, le=(1 << 64) - 1))
    """This controller's rank in a replica set (1, 2, ...; set by ``[controller] replica``): its election ids are
    then (term, replica), ``election_id`` is not used, and it keeps its connection as a backup while another
    replica is primary (controller/p4runtime/arbitration.py). 0: a single controller."""
    target: str = option("bmv2", C.choice(TARGETS))
    """``bmv2`` or ``tofino``: selects the pipeline artifacts, the queue-buffer path and ECN units."""
    p4info: str = option("build/v1model/p4info.txtpb", _PATH, path=True)
    """P4Info file (text or binary)."""
    bmv2_json: str = option("build/v1model/bmv2.json", _PATH, path=True)
    """BMv2 JSON (``target = "bmv2"``)."""
    device_config: str | None = option(None, C.optional(_PATH), path=True)
    """Tofino: a ready ``p4_device_config`` file (e.g. Stratum's BfPipelineConfig from bf_pipeline_builder)."""
    tofino_bin: str | None = option(None, C.optional(_PATH), path=True)
    """Tofino: ``tofino.bin``; with ``tofino_context``, packed the PI way (name, bin, context, length-prefixed)."""
    tofino_context: str | None = option(None, C.optional(_PATH), path=True)
    """Tofino: ``context.json``."""
    prog_name: str = option("netapprox", C.string())
    """P4 program name (Tofino packing, BfRt)."""
    push_pipeline: bool = option(True, C.boolean())
    """Push the pipeline on a (re)connect when the switch does not run it already (its cookie differs); off: never
    push (another tool owns the pipeline), read the entries back and reconcile them."""
    adopt_jobs_s: float = option(3.0, C.number(ge=0.0), convert=float)
    """A freshly started controller keeps the queue_by_job entries it finds on the switch this long before deleting
    those it has no report for, so a controller restart changes no job's queue and resets no counter."""
    report_rate_pps: int = option(1000, C.integer(ge=1))
    """REPORTs punted to the controller per ingress port and second (``report_meter``; more are dropped and
    counted as ``report_rate_limited`` in the switch)."""
    report_burst: int = option(200, C.integer(ge=1))
    """Burst of REPORTs per ingress port above ``report_rate_pps``."""
    check_bmv2_version: bool = option(True, C.boolean())
    """BMv2 on this host (a loopback address): refuse to start when ``bmv2_binary --version`` is below 1.15.1,
    where BMv2's priority queues are numbered differently from what the program assumes."""
    bmv2_binary: str = option("simple_switch_grpc", C.string())
    """The BMv2 executable whose version is checked."""
    ports: tuple[int, ...] = option((), C.sequence(C.integer(ge=0, le=511)), convert=tuple)
    """Data-plane ports: their queue buffers are configured and their counters read (empty: read all)."""
    buffer_packets: int = option(64, C.integer(ge=29))
    """Per-port buffer to share out: queue k >= 1 gets ``approx_buffer_unit`` x (8 - k) packets, queue 0 the
    rest."""
    approx_buffer_unit: int | None = option(None, C.optional(C.integer(ge=1)))
    """Scale of the approximate queues' buffers, packets: 1 is the NetApprox paper's k-MTU queues; unset, every
    data plane's one default, ``model.half_buffer_unit(buffer_packets)`` (1 for 64-packet ports;
    docs/controller.md, Queue buffers)."""
    thrift_port: int | None = option(None, C.optional(C.port()))
    """BMv2 Thrift port for ``set_queue_depth`` (None: leave BMv2's default of 64 packets per queue)."""
    cli: str | None = option(None, C.optional(C.string()))
    """Size BMv2 queues through this runtime CLI (e.g. ``simple_switch_CLI``) instead of speaking Thrift directly."""
    bfrt_address: str | None = option(None, C.optional(C.host_port()))
    """Tofino BfRt gRPC address (e.g. ``127.0.0.1:50052``) for traffic-manager configuration (None: skip)."""
    tm_prefix: str = option("tf1", C.string())
    """BfRt TM table prefix: ``tf1`` (Tofino 1) or ``tf2``."""
    tm_pool: str = option("EG_APP_POOL_0", C.string())
    """Tofino egress application pool the queues draw from (``tm.queue.buffer`` ``pool_id``)."""
    cells_per_packet: int = option(19, C.integer(ge=1))
    """Tofino buffer cells per 1500-byte packet (80-byte cells on Tofino 1); also scales the ECN threshold."""
    max_batch_updates: int = option(2000, C.integer(ge=1))
    """Updates per Write request at most."""
    max_write_bytes: int = option(3 << 20, C.integer(ge=1024))
    """Serialized bytes per Write request at most (gRPC's default message limit is 4 MiB)."""
    max_inflight_writes: int = option(4, C.integer(ge=1))
    """Write requests outstanding at once."""
    max_updates_per_s: float = option(0.0, C.number(ge=0.0), convert=float)
    """The switch's sustained table-update rate; an epoch writes what the budget allows (jobs whose loss
    exceeds their TLR first) and the rest in later epochs, always at their newest value. 0: no limit."""
    connect_timeout_s: float = option(3.0, O.SECONDS, convert=float)
    """How long to wait for the server and the arbitration answer."""
    rpc_timeout_s: float = option(10.0, O.SECONDS, convert=float)
    """Deadline of each unary RPC."""

    def __post_init__(self) -> None:
        if self.target not in ("bmv2", "tofino"):
            raise ConfigError(f"option target={self.target!r}: use 'bmv2' or 'tofino'")
        for name in ("report_rate_pps", "report_burst"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"option {name}={value!r}: a whole number >= 1")
        if not self.adopt_jobs_s >= 0:
            raise ConfigError(f"option adopt_jobs_s={self.adopt_jobs_s!r}: seconds >= 0")
        object.__setattr__(self, "approx_buffer_unit", resolve_buffer_unit(self.approx_buffer_unit, self.buffer_packets))
        why = buffer_unit_option_error(self.approx_buffer_unit, self.buffer_packets)
        if why:
            raise ConfigError(f"option {why}")


def options_from_mapping(name: str, options: Mapping[str, Any]) -> P4RuntimeOptions:
    """``P4RuntimeOptions`` from a switch's ``[switch.options]`` table (one-line ``ConfigError`` naming the switch
    and the option)."""
    return O.parse(P4RuntimeOptions, options, f"switch {name!r} options")
