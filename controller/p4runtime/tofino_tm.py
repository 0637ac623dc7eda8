"""The Tofino traffic manager: strict priority and NetApprox's buffer sizes, for both ways to run Tofino.

Tofino's TM is not reachable over P4Runtime, and its defaults are not what NetApprox needs (all queues at the
same priority with DWRR, dynamic buffer sharing). For every configured port and logical queue ``k`` the TM must
hold (``tm_plan``):

- scheduling: ``min_priority = max_priority = 7 - k`` (Tofino priority 7 is served first; logical queue 0 is
  the highest), so the queues are strictly ordered;
- buffer: ``pool_max_cells`` = packets x 19 (a 1500-byte packet takes 19 80-byte cells on Tofino 1) in the
  shared egress pool (option ``tm_pool``, default ``EG_APP_POOL_0``), no guaranteed cells, no dynamic burst
  absorption, so queue ``k >= 1`` holds ``unit`` x (8 - k) packets (the switch option ``approx_buffer_unit``,
  1 by default: the NetApprox paper's k-MTU queues) and queue 0 the rest of ``buffer_packets``.

(a) **Intel SDE / open-p4studio ``bf_switchd``** (P4Runtime is not usable there): ``configure_queues`` writes
the plan over BfRt gRPC (``controller.p4runtime.bfrt``: subscribe, bind to the program, then
``<prefix>.tm.queue.sched_cfg`` and ``<prefix>.tm.queue.buffer``, action ``shared_pool``), reads every entry
back from the hardware and raises ``QueueConfigError`` naming each field that is not as asked.
``queue_drops`` reads ``<prefix>.tm.counter.queue`` (``drop_count_packets``) for the metrics. A port's
``pg_id`` and the ``pg_queue`` of each queue id come from ``<prefix>.tm.port.cfg`` (``pg_id``,
``egress_qid_queues``); the pipe is ``dev_port >> 7``. ``prefix`` is ``tf1`` on Tofino 1, ``tf2`` on Tofino 2
(whose cells differ: set ``cells_per_packet``).

(b) **Stratum-bfrt** configures the TM itself from its chassis config: ``stratum_queue_config`` renders the
same plan as the ``vendor_config { tofino_config { node_id_to_qos_config ... } }`` block of a Stratum
``ChassisConfig``; ``python -m netapprox.controller.p4runtime.tofino_tm --config FILE`` prints it for every
Tofino switch of a controller config (docs/deploy-tofino.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, Iterable, Mapping, Protocol

from netapprox.controller.config import load_config
from netapprox.controller.errors import ControllerError, QueueConfigError
from netapprox.controller.model import NUM_QUEUES, queue_buffer_packets
from netapprox.controller.p4runtime.bfrt import ALL_PIPES, BfrtClient
from netapprox.controller.p4runtime.options import options_from_mapping

CELLS_PER_1500B_PACKET = 19
BUFFER_ACTION = "shared_pool"


@dataclasses.dataclass(frozen=True)
class TmWrite:
    """One BfRt MODIFY: table, pipe, key fields, data fields (name, value) in order, and the action (if any)."""

    table: str
    pipe: int
    key: tuple[tuple[str, Any], ...]
    data: tuple[tuple[str, Any], ...]
    action: str | None = None


@dataclasses.dataclass(frozen=True)
class PortQueues:
    """Where a port's queues live in the TM: pipe, port group, and ``pg_queue`` per queue id."""

    dev_port: int
    pipe: int
    pg_id: int
    pg_queues: tuple[int, ...]


class TmClient(Protocol):
    """What ``configure_queues`` and ``queue_drops`` need (``BfrtTmClient``; tests may pass a fake)."""

    def port_queues(self, dev_port: int) -> PortQueues: ...

    def write(self, op: TmWrite) -> None: ...

    def read(self, table: str, pipe: int, key: Mapping[str, int]) -> Mapping[str, Any]: ...

    def close(self) -> None: ...


def tm_priority(qid: int) -> int:
    """Tofino scheduling priority of logical queue ``qid`` (7 is served first)."""
    return NUM_QUEUES - 1 - qid


def tm_plan(ports: Iterable[PortQueues], buffer_packets: int, *, prefix: str = "tf1",
            cells_per_packet: int = CELLS_PER_1500B_PACKET, pool: str = "EG_APP_POOL_0", unit: int = 1
            ) -> list[TmWrite]:
    """The TM writes for ``ports``: per queue, scheduling priority then buffer (``model.queue_buffer_packets``
    with ``unit``, in cells)."""
    ops = []
    for pq in sorted(ports, key=lambda p: p.dev_port):
        if len(pq.pg_queues) < NUM_QUEUES:
            raise QueueConfigError(f"dev_port {pq.dev_port} has {len(pq.pg_queues)} egress queues; NetApprox "
                                   f"needs {NUM_QUEUES} (give the port 8 queues in {prefix}.tm.port.group)")
        for qid in range(NUM_QUEUES):
            key = (("pg_id", pq.pg_id), ("pg_queue", pq.pg_queues[qid]))
            prio = str(tm_priority(qid))  # BfRt: a string choice, "0" .. "7"
            ops.append(TmWrite(f"{prefix}.tm.queue.sched_cfg", pq.pipe, key,
                               (("scheduling_enable", True), ("min_priority", prio), ("max_priority", prio))))
            cells = queue_buffer_packets(qid, buffer_packets, unit=unit) * cells_per_packet
            ops.append(TmWrite(f"{prefix}.tm.queue.buffer", pq.pipe, key,
                               (("guaranteed_cells", 0), ("pool_id", pool), ("pool_max_cells", cells),
                                ("dynamic_baf", "DISABLE")), action=BUFFER_ACTION))
    return ops


def configure_queues(client: TmClient, dev_ports: Iterable[int], buffer_packets: int, *, prefix: str = "tf1",
                     cells_per_packet: int = CELLS_PER_1500B_PACKET, pool: str = "EG_APP_POOL_0", unit: int = 1
                     ) -> list[PortQueues]:
    """Look up each port's queues, write the plan, read every entry back from the hardware. Raises
    ``QueueConfigError`` listing every field that is not as asked. Returns the ports (for ``queue_drops``)."""
    ports = [client.port_queues(p) for p in sorted(set(dev_ports))]
    ops = tm_plan(ports, buffer_packets, prefix=prefix, cells_per_packet=cells_per_packet, pool=pool, unit=unit)
    for op in ops:
        client.write(op)
    wrong = []
    for op in ops:
        got = client.read(op.table, op.pipe, dict(op.key))
        asked = dict(op.data) | ({"action_name": op.action} if op.action else {})
        for name, value in asked.items():
            if got.get(name) != value:
                wrong.append(f"{op.table} pipe {op.pipe} {dict(op.key)}: {name} is {got.get(name)!r}, "
                             f"asked {value!r}")
    if wrong:
        more = f" (and {len(wrong) - 5} more)" if len(wrong) > 5 else ""
        raise QueueConfigError("the Tofino TM is not as asked after writing it: " + "; ".join(wrong[:5]) + more)
    return ports


def queue_drops(client: TmClient, ports: Iterable[PortQueues], *, prefix: str = "tf1") -> dict[tuple[int, int], int]:
    """(dev_port, logical queue) -> packets the TM dropped (``<prefix>.tm.counter.queue``)."""
    out = {}
    for pq in ports:
        for qid in range(NUM_QUEUES):
            got = client.read(f"{prefix}.tm.counter.queue", pq.pipe, {"pg_id": pq.pg_id, "pg_queue": pq.pg_queues[qid]})
            out[(pq.dev_port, qid)] = int(got.get("drop_count_packets", 0))
    return out


class BfrtTmClient:
    """``TmClient`` over ``controller.p4runtime.bfrt.BfrtClient`` (BfRt gRPC, port 50052 by default)."""

    def __init__(self, address: str, p4_name: str, *, device_id: int = 0, client_id: int = 1,
                 prefix: str = "tf1", timeout_s: float = 5.0) -> None:
        self._prefix = prefix
        self._bfrt = BfrtClient(address, p4_name, device_id=device_id, client_id=client_id, timeout_s=timeout_s)

    def port_queues(self, dev_port: int) -> PortQueues:
        try:
            d = self._bfrt.entry_get(f"{self._prefix}.tm.port.cfg", ALL_PIPES, {"dev_port": dev_port}, from_hw=False)
        except QueueConfigError as e:
            raise QueueConfigError(f"dev_port {dev_port}: {e} (is the port added?)") from None
        return PortQueues(dev_port, dev_port >> 7, int(d["pg_id"]), tuple(int(q) for q in d["egress_qid_queues"]))

    def write(self, op: TmWrite) -> None:
        self._bfrt.entry_mod(op.table, op.pipe, dict(op.key), dict(op.data), op.action)

    def read(self, table: str, pipe: int, key: Mapping[str, int]) -> Mapping[str, Any]:
        return self._bfrt.entry_get(table, pipe, key, from_hw=True)

    def close(self) -> None:
        self._bfrt.close()


# --- (b) Stratum-bfrt: the chassis-config queue section -----------------------------------------------------

STRATUM_POOLS = {f"EG_APP_POOL_{i}": f"EGRESS_APP_POOL_{i}" for i in range(4)}


def stratum_queue_config(dev_ports: Iterable[int], buffer_packets: int, *, node_id: int = 1,
                         cells_per_packet: int = CELLS_PER_1500B_PACKET, pool: str = "EG_APP_POOL_0",
                         unit: int = 1) -> str:
    """The ``vendor_config`` block of a Stratum ``ChassisConfig`` (text format) that gives every port in
    ``dev_ports`` (SDK ports) the plan of ``tm_plan``: ``queue_mapping`` per logical queue with ``priority:
    PRIO_<7-k>`` (Stratum sets both scheduling priorities from it), the static buffer limit ``base_use_limit``
    in the egress pool, no guaranteed cells, ``baf: DISABLE_BAF``. Append it to the switch's chassis config."""
    if pool not in STRATUM_POOLS:
        raise QueueConfigError(f"tm_pool {pool!r}: Stratum knows the egress pools {', '.join(STRATUM_POOLS)}")
    lines = ["vendor_config {", "  tofino_config {", "    node_id_to_qos_config {", f"      key: {node_id}",
             "      value {"]
    for port in sorted(set(dev_ports)):
        lines += ["        queue_configs {", f"          sdk_port: {port}"]
        for qid in range(NUM_QUEUES):
            cells = queue_buffer_packets(qid, buffer_packets, unit=unit) * cells_per_packet
            lines += ["          queue_mapping {", f"            queue_id: {qid}",
                      f"            priority: PRIO_{tm_priority(qid)}", "            weight: 1",
                      "            minimum_guaranteed_cells: 0", f"            pool: {STRATUM_POOLS[pool]}",
                      f"            base_use_limit: {cells}", "            baf: DISABLE_BAF",
                      "            hysteresis: 0", "          }"]
        lines.append("        }")
    lines += ["      }", "    }", "  }", "}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the Stratum chassis-config queue section of every Tofino switch in a controller config."""
    ap = argparse.ArgumentParser(prog="python -m netapprox.controller.p4runtime.tofino_tm",
                                 description=main.__doc__)
    ap.add_argument("--config", "-c", required=True, help="controller TOML (e.g. controller/examples/tofino.toml)")
    ap.add_argument("--switch", help="only this switch (default: every p4runtime switch with target tofino)")
    ap.add_argument("--node-id", type=int, default=1, help="the Stratum node id of the chip (default 1)")
    args = ap.parse_args(argv)
    try:
        config = load_config(args.config)
        switches = [s for s in config.switches if s.kind == "p4runtime" and (args.switch in (None, s.name))]
        out = []
        for sw in switches:
            opts = options_from_mapping(sw.name, sw.options)
            if opts.target != "tofino":
                continue
            if not opts.ports:
                raise QueueConfigError(f"switch {sw.name!r}: set the option ports (the SDK ports to configure)")
            unit = opts.approx_buffer_unit
            out.append(f"# switch {sw.name}: {len(opts.ports)} ports, {opts.buffer_packets} packets per port"
                       + (f", approx_buffer_unit {unit}" if unit != 1 else "") + "\n"
                       + stratum_queue_config(opts.ports, opts.buffer_packets, node_id=args.node_id,
                                              cells_per_packet=opts.cells_per_packet, pool=opts.tm_pool, unit=unit))
        if not out:
            raise QueueConfigError(f"{args.config}: no p4runtime switch with target = \"tofino\""
                                   + (f" named {args.switch!r}" if args.switch else ""))
    except (ControllerError, OSError) as e:
        print(f"tofino_tm: {e}", file=sys.stderr)
        return 2
    sys.stdout.write("".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
