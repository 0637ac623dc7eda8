"""Tofino traffic-manager configuration through BfRt gRPC (strict priority + NetApprox buffer sizes).

Tofino's TM is not reachable over P4Runtime, and its defaults are not what NetApprox needs (all queues at
the same priority with DWRR, dynamic buffer sharing). For every configured port and logical queue ``k`` we
write, in the order given by ``tm_plan``:

- ``<prefix>.tm.queue.sched_cfg`` key (``pg_id``, ``pg_queue``): ``min_priority = max_priority = 7 - k``
  (Tofino priority 7 is served first; logical queue 0 is the highest), so the queues are strictly ordered.
- ``<prefix>.tm.queue.buffer`` key (``pg_id``, ``pg_queue``): ``pool_max_cells`` = packets x 19 (a 1500-byte
  packet takes 19 80-byte cells on Tofino 1) in the shared egress pool ``pool_id`` (option ``tm_pool``,
  default ``EG_APP_POOL_0``), ``guaranteed_cells = 0``, ``dynamic_baf = "DISABLE"``, so queue
  ``k >= 1`` holds (8 - k) packets and queue 0 the rest of ``buffer_packets``.

The port's ``pg_id`` and the ``pg_queue`` of each queue id come from ``<prefix>.tm.port.cfg``
(``pg_id``, ``egress_qid_queues``); the pipe is ``dev_port >> 7``. ``prefix`` is ``tf1`` on Tofino 1 and
``tf2`` on Tofino 2 (set the switch option ``tm_prefix``; Tofino 2 cell size differs: set ``cells_per_packet``).

``BfrtTmClient`` wraps ``bfrt_grpc.client`` (shipped with the Intel SDE / open-p4studio, imported only when a
Tofino switch is configured). Anything with the same three methods works; the tests use a fake.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Protocol

from netapprox.controller.errors import QueueConfigError
from netapprox.controller.model import NUM_QUEUES, queue_buffer_packets

CELLS_PER_1500B_PACKET = 19


@dataclasses.dataclass(frozen=True)
class TmWrite:
    """One BfRt ``entry_mod``: table, key fields, data fields (name, value) in order."""

    table: str
    pipe: int
    key: tuple[tuple[str, Any], ...]
    data: tuple[tuple[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class PortQueues:
    """Where a port's queues live in the TM: pipe, port group, and ``pg_queue`` per queue id."""

    dev_port: int
    pipe: int
    pg_id: int
    pg_queues: tuple[int, ...]


class TmClient(Protocol):
    def port_queues(self, dev_port: int) -> PortQueues: ...

    def write(self, op: TmWrite) -> None: ...

    def close(self) -> None: ...


def tm_priority(qid: int) -> int:
    """Tofino scheduling priority of logical queue ``qid`` (7 is served first)."""
    return NUM_QUEUES - 1 - qid


def tm_plan(ports: Iterable[PortQueues], buffer_packets: int, *, prefix: str = "tf1",
            cells_per_packet: int = CELLS_PER_1500B_PACKET, pool: str = "EG_APP_POOL_0") -> list[TmWrite]:
    """The TM writes for ``ports``: per queue, scheduling priority then buffer."""
    ops = []
    for pq in sorted(ports, key=lambda p: p.dev_port):
        if len(pq.pg_queues) < NUM_QUEUES:
            raise QueueConfigError(f"dev_port {pq.dev_port} has {len(pq.pg_queues)} egress queues; NetApprox "
                                   f"needs {NUM_QUEUES} (configure the port with 8 queues in tm.port.cfg)")
        for qid in range(NUM_QUEUES):
            key = (("pg_id", pq.pg_id), ("pg_queue", pq.pg_queues[qid]))
            prio = tm_priority(qid)
            ops.append(TmWrite(f"{prefix}.tm.queue.sched_cfg", pq.pipe, key,
                               (("min_priority", prio), ("max_priority", prio))))
            cells = queue_buffer_packets(qid, buffer_packets) * cells_per_packet
            ops.append(TmWrite(f"{prefix}.tm.queue.buffer", pq.pipe, key,
                               (("pool_id", pool), ("pool_max_cells", cells), ("guaranteed_cells", 0),
                                ("dynamic_baf", "DISABLE"))))
    return ops


def configure_queues(client: TmClient, dev_ports: Iterable[int], buffer_packets: int, *, prefix: str = "tf1",
                     cells_per_packet: int = CELLS_PER_1500B_PACKET, pool: str = "EG_APP_POOL_0") -> list[TmWrite]:
    """Look up each port's queues, then write the plan. Returns what was written."""
    ops = tm_plan([client.port_queues(p) for p in dev_ports], buffer_packets, prefix=prefix,
                  cells_per_packet=cells_per_packet, pool=pool)
    for op in ops:
        try:
            client.write(op)
        except Exception as e:  # noqa: BLE001 - re-raised with context
            raise QueueConfigError(f"BfRt write to {op.table} {dict(op.key)} failed: {e}") from e
    return ops


class BfrtTmClient:
    """``TmClient`` over ``bfrt_grpc.client`` (BfRt gRPC, port 50052 by default)."""

    def __init__(self, address: str, p4_name: str, *, device_id: int = 0, client_id: int = 1,
                 prefix: str = "tf1") -> None:
        try:
            import bfrt_grpc.client as gc  # type: ignore[import-not-found]
        except ImportError as e:
            raise QueueConfigError("Tofino TM configuration needs the SDE's bfrt_grpc Python package on "
                                   "PYTHONPATH (source set_sde.bash), or drop bfrt_address from the options") from e
        self._gc = gc
        self._device_id = device_id
        self._prefix = prefix
        self._interface = gc.ClientInterface(address, client_id=client_id, device_id=device_id)
        self._info = self._interface.bfrt_info_get(p4_name)

    def _target(self, pipe: int) -> Any:
        return self._gc.Target(device_id=self._device_id, pipe_id=pipe)

    def port_queues(self, dev_port: int) -> PortQueues:
        gc = self._gc
        table = self._info.table_get(f"{self._prefix}.tm.port.cfg")
        key = table.make_key([gc.KeyTuple("dev_port", dev_port)])
        for data, _ in table.entry_get(self._target(0xFFFF), [key], {"from_hw": False}):
            d = data.to_dict()
            return PortQueues(dev_port, dev_port >> 7, int(d["pg_id"]), tuple(int(q) for q in d["egress_qid_queues"]))
        raise QueueConfigError(f"dev_port {dev_port} not found in {self._prefix}.tm.port.cfg (is the port added?)")

    def write(self, op: TmWrite) -> None:
        gc = self._gc
        table = self._info.table_get(op.table)
        key = table.make_key([gc.KeyTuple(k, v) for k, v in op.key])
        data = table.make_data([gc.DataTuple(k, str_val=v) if isinstance(v, str) else gc.DataTuple(k, val=v)
                                for k, v in op.data])
        table.entry_mod(self._target(op.pipe), [key], [data])

    def close(self) -> None:
        self._interface.tear_down_stream()
