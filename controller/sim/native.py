"""Loads ns-3 (the ``ns3`` wheel, cppyy bindings) and the simulated switch's C++ into this process, once.

    ns = native.load()          # ~12-16 s the first time in a process (cppyy JIT), then free
    ns.Simulator.Now()          # ns-3 itself
    native.cpp().netapprox      # the C++ namespace of netapprox_switch.h

The C++ (``netapprox_switch.h`` next to this file) reads ATP fields at byte offsets it is given here from
``hostlib.wire`` (``NA_*`` macros), so the ATP header stays defined once. ns-3 is an optional extra
(``pip install -e .[sim]``): importing this module never imports ns-3; ``load()`` raises
``SimUnavailable`` with the install hint when it is missing.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import threading
from pathlib import Path
from typing import Any

from netapprox.controller.errors import ControllerError
from netapprox.hostlib import wire

HERE = Path(__file__).resolve().parent
_lock = threading.Lock()
_ns: Any = None
_loaded: set[str] = set()


class SimUnavailable(ControllerError):
    """ns-3 cannot be loaded (not installed, or its C++ failed to compile); the message says which."""


def available() -> bool:
    """Whether the ns3 wheel is installed (without importing it)."""
    return importlib.util.find_spec("ns3") is not None


def wire_macros() -> str:
    """``#define NA_*`` lines: the ATP port, header length, field offsets and flag bits from hostlib.wire."""
    off = wire.OFFSETS
    lines = {
        "NA_ATP_PORT": wire.DEFAULT_ATP_PORT,
        "NA_HEADER_LEN": wire.HEADER_LEN,
        "NA_REPORT_PORT": wire.DEFAULT_REPORT_PORT,
        "NA_VERSION": wire.VERSION,
        "NA_DATA_V1": (wire.VERSION << 4) | int(wire.PacketType.DATA),
        "NA_FLAG_APPROX": int(wire.Flags.APPROX),
        "NA_FLAG_TAGGED": int(wire.Flags.TAGGED),
        "NA_FLAG_TRIM": int(wire.Flags.TRIM),
        "NA_TLR_ONE": wire.TLR_ONE,
    }
    for field in ("type", "flags", "queue", "priority", "job_id", "msg_id", "group_id", "tlr", "pkt_idx",
                  "pkt_cnt", "deadline_us", "length"):
        lines[f"NA_OFF_{field.upper()}"] = off[field]
    return "".join(f"#ifndef {k}\n#define {k} {v}\n#endif\n" for k, v in lines.items())


def load() -> Any:
    """The ns-3 namespace (``from ns import ns``), imported once per process."""
    global _ns
    with _lock:
        if _ns is None:
            if not available():
                raise SimUnavailable("ns-3 is not installed: pip install -e '.[sim]' (the ns3 wheel from PyPI)")
            # cppyy prints harmless "Failed to materialize symbols" lines while ns-3 loads; keep them off
            # the terminal (they go to the C-level stderr, not sys.stderr).
            saved = os.dup(2)
            try:
                with open(os.devnull, "wb") as null:
                    os.dup2(null.fileno(), 2)
                    from ns import ns as ns_module  # noqa: PLC0415 - optional, slow import
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            _ns = ns_module
    return _ns


def include(header: Path, prelude: str = "") -> Any:
    """Load ``header`` (C++ for ns-3) into the process once, after ``prelude`` (macros); returns cppyy.gbl."""
    ns = load()
    import cppyy  # noqa: PLC0415 - comes with the ns3 wheel

    key = str(header)
    with _lock:
        if key not in _loaded:
            if prelude and not cppyy.cppdef(prelude):
                raise SimUnavailable(f"cannot define the macros for {header.name}")
            try:
                cppyy.include(str(header))
            except Exception as e:  # noqa: BLE001 - cppyy reports compile errors as generic exceptions
                raise SimUnavailable(f"{header.name} does not compile against ns-3 {ns_version(ns)}: {e}") from e
            _loaded.add(key)
    return cppyy.gbl


def ns_version(ns: Any = None) -> str:
    try:
        return importlib.metadata.version("ns3")
    except Exception:  # noqa: BLE001
        return "?"


def cpp() -> Any:
    """cppyy.gbl with the simulated switch loaded (``cpp().netapprox.NetApproxQueueDisc`` ...)."""
    return include(HERE / "netapprox_switch.h", wire_macros())
