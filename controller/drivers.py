"""Driver registry: a switch's ``kind`` names its driver class; ``build_driver`` makes one from the config.

Every driver class has ``from_options(name: str, options: Mapping[str, Any]) -> Driver``. Classes are imported
lazily, so a controller for P4 switches never imports pyroute2 and vice versa.
"""
from __future__ import annotations

import importlib
from typing import Any, Mapping

from netapprox.controller.config import SwitchConfig
from netapprox.controller.errors import ConfigError, did_you_mean
from netapprox.controller.model import Driver

DRIVER_CLASSES: Mapping[str, str] = {
    "p4runtime": "netapprox.controller.p4runtime_driver:P4RuntimeDriver",
    "kernel": "netapprox.controller.kernel_driver:KernelDriver",
}


def driver_class(kind: str) -> type:
    """The driver class for ``kind`` ("p4runtime" | "kernel")."""
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


def build_driver(switch: SwitchConfig) -> Driver:
    """``<DriverClass>.from_options(switch.name, switch.options)``."""
    cls = driver_class(switch.kind)
    return cls.from_options(switch.name, dict(switch.options))


def option(options: Mapping[str, Any], key: str, default: Any, kind: type, where: str) -> Any:
    """Typed lookup in a driver's options table, with an actionable error."""
    value = options.get(key, default)
    if value is None or kind is object:
        return value
    try:
        if kind is tuple:
            return tuple(value)
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: option {key!r} must be {kind.__name__}, got {value!r}") from None
