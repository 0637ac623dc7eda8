"""The driver interface every data plane implements, and the one registry of driver kinds.

A switch's ``kind`` names its driver class; ``build_driver`` makes one from the config with
``Driver.from_options(name, options)``. Each kind's options are a frozen dataclass in a light module of its own
(``DRIVER_OPTIONS``; ``controller.options``: every option's check is field metadata), so the config checks a
switch's options without importing its driver. Classes are imported lazily, so a controller for P4 switches never
imports pyroute2 and vice versa.

| kind        | data plane                                   | driver                                          |
|-------------|----------------------------------------------|-------------------------------------------------|
| `p4runtime` | the P4 program on BMv2 or Tofino (p4src/)    | ``controller.p4runtime.driver.P4RuntimeDriver`` |
| `kernel`    | the Linux kernel switch (HTB + u32 + eBPF)   | ``controller.kernel.driver.KernelDriver``       |
| `sim`       | a simulated switch in ns-3 (controller/sim/) | ``controller.sim.driver.SimDriver``             |

Options: ``controller.p4runtime.options.P4RuntimeOptions``, ``controller.kernel.options.KernelDriverOptions``;
``sim`` has none from a file (the simulation hands its driver the switch object).
"""
from __future__ import annotations

import abc
import importlib
from typing import Any, Callable, ClassVar, Mapping

from netapprox.controller import options as O
from netapprox.controller.errors import ConfigError, did_you_mean
from netapprox.controller.model import Counters, SwitchState, TableUpdates, WriteSummary

DRIVER_CLASSES: Mapping[str, str] = {
    "p4runtime": "netapprox.controller.p4runtime.driver:P4RuntimeDriver",
    "kernel": "netapprox.controller.kernel.driver:KernelDriver",
    "sim": "netapprox.controller.sim.driver:SimDriver",
}
"""kind -> "module:class" of its driver. ``controller.config`` accepts exactly these kinds."""
DRIVER_OPTIONS: Mapping[str, str | None] = {
    "p4runtime": "netapprox.controller.p4runtime.options:P4RuntimeOptions",
    "kernel": "netapprox.controller.kernel.options:KernelDriverOptions",
    "sim": None,
}
"""kind -> "module:class" of its options dataclass (a light module: no gRPC, no pyroute2); None: no options from
a file."""
DEFAULT_KIND = "p4runtime"
"""A switch's kind when its config does not say."""
ARBITRATED_KINDS = ("p4runtime",)
"""Kinds whose switch arbitrates between controllers (P4Runtime): only they can have a replica set of
controllers (``[controller] replica``); the driver takes the option ``replica``."""


class Driver(abc.ABC):
    """One switch, one data plane: everything the runtime may ask of a driver is declared here (the abstract
    methods, and the others with the defaults of a driver that writes synchronously and has no packet-in).

    Errors: ``controller.errors.SwitchUnavailable`` when the switch cannot be reached (the runtime reconnects),
    ``controller.errors.WriteError`` when the switch refused some updates (the runtime counts them and carries
    on), other ``ControllerError`` subclasses for everything else."""

    name: str
    OPTIONS: ClassVar[str] = ""
    """The kind whose options (``DRIVER_OPTIONS``) this driver takes."""

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> "Driver":
        """A driver for switch ``name`` from its ``[switch.options]`` table, checked and converted by its kind's
        options dataclass (one-line ``ConfigError`` naming the switch and the option)."""
        return cls(name, parse_options(cls.OPTIONS, options, f"switch {name!r} options"))

    @abc.abstractmethod
    def connect(self) -> None:
        """(Re)connect and re-arm the switch: pipeline, queues, the last applied state. Idempotent."""

    def is_primary(self) -> bool:
        """Whether this controller may write to the switch now. False while another controller is the switch's
        primary (P4Runtime arbitration between replicas, docs/controller.md "Running two controllers"): the
        runtime then writes nothing to it, and when this turns True it hands over the whole desired state (the
        driver reconciles with what the switch holds first). A data plane without an arbiter is always True.
        Raises ``SwitchUnavailable`` when the switch is gone."""
        return True

    @abc.abstractmethod
    def apply(self, desired: SwitchState) -> WriteSummary:
        """Diff ``desired`` against the installed copy and write the difference in one batch."""

    def apply_updates(self, desired: Callable[[], SwitchState], updates: TableUpdates) -> WriteSummary:
        """One epoch's changes (``controller.core.EpochPlan.updates``): drivers that keep incremental state
        write ``updates`` directly; this default writes nothing when nothing changed, else diffs the whole
        ``desired()`` state through ``apply``."""
        if updates.empty:
            return WriteSummary()
        return self.apply(desired())

    def pending_writes(self) -> bool:
        """True while updates wait for the switch to answer earlier writes (``send_pending`` sends them); a
        driver that writes synchronously never holds any back."""
        return False

    def send_pending(self) -> WriteSummary:
        """Between epochs: send what waits, into the room the switch's answers left (``pending_writes``)."""
        return WriteSummary()

    @property
    def deferred_updates(self) -> int:
        """Table updates waiting for the switch (write budget, or writes in flight)."""
        return 0

    @property
    def deferred_urgent(self) -> int:
        """Of ``deferred_updates``, those of jobs whose loss exceeds their TLR."""
        return 0

    @property
    def write_stats(self) -> Mapping[str, int]:
        """Cumulative write-queue figures for the metrics (``prioritised``, ``coalesced``); {} when none."""
        return {}

    @abc.abstractmethod
    def read_counters(self) -> Counters:
        """Per-(port, queue) counters, and per-job and drop counters where the target has them."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection and anything this driver started."""

    def stats(self) -> Mapping[str, float]:
        """Driver figures for the metrics (``controller.observe.DRIVER_STATS`` names them); {} when none."""
        return {}

    def drain_packet_in(self) -> list[tuple[bytes, int | None]]:
        """(frame, ingress port or None) the switch punted to the controller since the last call (packet-in),
        oldest first. The runtime parses REPORT packets out of them. Data planes without packet-in return []."""
        return []


def driver_class(kind: str) -> type[Driver]:
    """The driver class for ``kind`` (a key of ``DRIVER_CLASSES``)."""
    try:
        target = DRIVER_CLASSES[kind]
    except KeyError:
        raise ConfigError(f"unknown switch kind {kind!r}.{did_you_mean(kind, DRIVER_CLASSES)}"
                          f" Known: {', '.join(DRIVER_CLASSES)}") from None
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"switch kind {kind!r} needs {module_name}, which cannot be imported: {e}") from e
    return getattr(module, class_name)


def options_class(kind: str) -> type | None:
    """The options dataclass of ``kind`` (``DRIVER_OPTIONS``), or None when it takes none from a file."""
    target = DRIVER_OPTIONS.get(kind)
    if target is None:
        return None
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def path_options(kind: str) -> frozenset[str]:
    """The options of ``kind`` that name files (``controller.options.option(path=True)``)."""
    cls = options_class(kind)
    return frozenset() if cls is None else O.paths(cls)


def parse_options(kind: str, options: Mapping[str, Any], where: str) -> Any:
    """``options`` read into ``kind``'s options dataclass (``controller.options.parse``); a kind without options
    refuses every key."""
    cls = options_class(kind)
    if cls is None:
        if options:
            raise ConfigError(f"{where}: a {kind!r} switch takes no options from a file, got {', '.join(options)}")
        return None
    return O.parse(cls, options, where)


def build_driver(switch, replica: int = 0) -> Driver:
    """``<DriverClass>.from_options(switch.name, switch.options)`` for a ``controller.config.SwitchConfig``;
    ``replica`` > 0 (this controller's rank in a replica set) is added as the option ``replica`` (the config
    allows it only for ``ARBITRATED_KINDS``)."""
    cls = driver_class(switch.kind)
    options = dict(switch.options)
    if replica:
        options["replica"] = replica
    return cls.from_options(switch.name, options)

