"""Options of a ``kind = "kernel"`` switch (the ``[switch.options]`` table): where the kernel switch is and how its
ports are shaped. A light module (no pyroute2): ``controller.config`` checks a file's options through it."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping

from netapprox.controller import options as O
from netapprox.controller.errors import ConfigError
from netapprox.controller.model import buffer_unit_option_error, resolve_buffer_unit
from netapprox.controller.options import option
from netapprox.hostlib import checks as C
from netapprox.hostlib.wire import DEFAULT_ATP_PORT

if TYPE_CHECKING:
    from netapprox.controller.kernel import tc

PORTS = C.either(C.sequence(C.string(), min_length=1), C.mapping(C.string(), C.integer(ge=0, le=0xFFFF)),
                 want="a list of interface names or an {interface: port} table")
RATE_MBIT = C.number(gt=0.0, le=1e6)


def _ports(value: Any) -> dict[str, int]:
    """A list of interfaces numbers them 1, 2, ... in order; a table gives the numbers."""
    return {name: i + 1 for i, name in enumerate(value)} if isinstance(value, (list, tuple)) else dict(value)


@dataclasses.dataclass(frozen=True)
class KernelDriverOptions:
    """Where the kernel switch is and how its ports are shaped."""

    ports: Mapping[str, int] = option(check=PORTS, convert=_ports)
    """Egress interfaces of the switch (inside ``netns``) -> port numbers used in counters (required)."""
    netns: str | None = option(None, C.optional(C.string()))
    """Network namespace of the switch: a name under /var/run/netns or a path such as /proc/PID/ns/net.
    ``None``: the namespace of this process."""
    rate_mbit: float = option(100.0, RATE_MBIT, convert=float)
    """Line rate of every port, Mbit/s (``port_rates_mbit`` overrides per port)."""
    port_rates_mbit: Mapping[str, float] = option(check=C.mapping(C.string(), RATE_MBIT), convert=dict,
                                                  default_factory=dict)
    """Per-interface line rates, Mbit/s."""
    buffer_packets: int = option(256, C.integer(ge=29))
    """Port buffer in MTU-sized packets: queue k >= 1 holds ``approx_buffer_unit`` x (8 - k) packets, queue 0
    the rest."""
    approx_buffer_unit: int | None = option(None, C.optional(C.integer(ge=1)))
    """Scale of the approximate queues' buffers (and of the tuner's shares), MTUs: 1 is the NetApprox paper's
    k-MTU queues; unset, every data plane's one default, ``model.half_buffer_unit(buffer_packets)``
    (docs/controller.md, Queue buffers)."""
    atp_port: int = option(DEFAULT_ATP_PORT, C.port())
    """UDP port that identifies ATP DATA (destination port)."""
    stamp_queue: bool = option(True, C.boolean())
    """Write the logical queue into the ATP queue byte of DATA packets (eBPF, needs clang and tc with BPF).
    When the stamper cannot be attached the switch still classifies and queues; the byte stays 0xFF."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "approx_buffer_unit", resolve_buffer_unit(self.approx_buffer_unit, self.buffer_packets))
        why = buffer_unit_option_error(self.approx_buffer_unit, self.buffer_packets)
        if why:
            raise ConfigError(f"option {why}")

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any], where: str = "kernel switch options") -> "KernelDriverOptions":
        """From a ``[switch.options]`` table: one-line ``ConfigError`` naming ``where`` and the option."""
        return O.parse(cls, options, where)

    def shape(self, ifname: str) -> "tc.PortShape":
        from netapprox.controller.kernel import tc  # pyroute2: only where ports are shaped
        return tc.PortShape(rate_mbit=float(self.port_rates_mbit.get(ifname, self.rate_mbit)),
                            buffer_packets=self.buffer_packets, approx_unit=self.approx_buffer_unit)
