"""A driver's options: the ``[switch.options]`` table of a switch, as one frozen dataclass per driver kind.

Each field says its own check (and conversion from TOML) as field metadata, so an option is spelled once: its
name, default, documentation and check sit together in the driver's options module
(``controller/p4runtime/options.py``, ``controller/kernel/options.py``). ``parse`` reads a table into the
dataclass for the file and for code alike; the dataclass's ``__post_init__`` checks what spans fields.

    @dataclasses.dataclass(frozen=True)
    class MyOptions:
        rate_mbit: float = option(100.0, C.number(gt=0.0))
        ports: tuple[int, ...] = option((), C.sequence(C.integer(ge=0)), convert=tuple)

This module imports no data plane: ``controller.config`` checks a switch's options through it and the
registry in ``controller.drivers``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, TypeVar

from netapprox.controller.errors import ConfigError, did_you_mean
from netapprox.hostlib import checks as C

T = TypeVar("T")
SECONDS = C.number(gt=0.0, le=86400.0)
"""A timeout or interval option, seconds."""


def option(default: Any = dataclasses.MISSING, check: C.Check | None = None, *,
           convert: Callable[[Any], Any] | None = None, path: bool = False,
           default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its ``check`` (a ``hostlib.checks`` check), ``convert`` (TOML value -> field value,
    after the check) and ``path`` (a file name: a config file's relative value is taken from the file's folder)
    as metadata."""
    if check is None:
        raise TypeError("option() needs a check")
    metadata = {"check": check, "convert": convert, "path": path}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def checks(cls: type) -> dict[str, C.Check]:
    """Every option of ``cls`` and its check (a field without one is a mistake in ``cls``: TypeError)."""
    out = {}
    for f in dataclasses.fields(cls):
        if "check" not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} has no check: declare it with controller.options.option()")
        out[f.name] = f.metadata["check"]
    return out


def paths(cls: type) -> frozenset[str]:
    """The options of ``cls`` that name files."""
    return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get("path"))


def parse(cls: type[T], table: Mapping[str, Any], where: str) -> T:
    """``cls`` from a ``[switch.options]`` table: unknown keys and bad values are one-line ``ConfigError``s that
    name ``where`` and the key (``"<where>.<key>: <problem>"``); the dataclass checks what spans fields."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: expected a table, got {table!r}")
    known = checks(cls)
    for key in table:
        if key not in known:
            raise ConfigError(f"{where}: unknown option {key!r}.{did_you_mean(str(key), known)}"
                              f" Known: {', '.join(known)}")
    try:
        values = {key: known[key](value, f"{where}.{key}") for key, value in table.items()}
    except C.CheckError as e:
        raise ConfigError(str(e)) from None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        convert = fields[key].metadata.get("convert")
        kwargs[key] = convert(value) if convert is not None and value is not None else value
    for f in dataclasses.fields(cls):
        if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where}: missing option {f.name!r}")
    try:
        return cls(**kwargs)
    except ConfigError as e:  # "option <key>: <problem>" from __post_init__
        text = str(e)
        raise type(e)(f"{where}.{text[len('option '):]}" if text.startswith("option ") else f"{where}: {text}") \
            from None
