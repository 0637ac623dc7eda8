"""Which implementation of the sans-I/O cores hostlib runs: the native one (C, ``hostlib/native/``, built by
``pip install``) when it is there, else the pure-Python reference (``hostlib/sender.py``, ``hostlib/receiver.py``).

Both have the same constructor, methods, attributes, events and summaries, and produce the same datagrams, timers
and events for the same inputs (tests/hostlib/test_hostlib_differential.py); the Python modules are the
specification. The native cores also move datagrams between a UDP socket and the state machine without Python
objects per packet (``transmit(fd, now)``, ``receive_from(fd, now)``: UDP GSO/GRO, sendmmsg/recvmmsg), which
``hostlib.api`` uses.

``NETAPPROX_PURE_PYTHON=1`` in the environment forces the reference. ``AtpSender`` and ``AtpReceiver`` here are
what ``hostlib.api``, ``hostlib.aio`` and the CLI construct (looked up at call time, so a test may swap them).
"""
from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Iterator

from netapprox.hostlib.buildinfo import source_hash
from netapprox.hostlib.receiver import AtpReceiver as PyAtpReceiver
from netapprox.hostlib.sender import AtpSender as PyAtpSender

native_error: str | None = None
"""Why the native cores are not in use (``None`` when they are)."""

try:
    from netapprox.hostlib import _native
except ImportError as err:  # not built (no compiler at install time): the reference runs
    _native = None
    native_error = f"the extension netapprox.hostlib._native is not built ({err})"

if _native is not None and os.environ.get("NETAPPROX_PURE_PYTHON", "") not in ("", "0"):
    native_error = "NETAPPROX_PURE_PYTHON is set"


def stale_native(module: object, native_dir: Path = Path(__file__).parent / "native") -> str | None:
    """Why ``module`` (the built extension) does not match the C sources in ``native_dir``, or ``None``: a build
    older than the sources would run code that is not the code in the tree. No sources beside the package (an
    installed wheel), or a build that does not say what it was built from: nothing to compare."""
    built, now = getattr(module, "source_hash", ""), source_hash(native_dir)
    if not built or not now or built == now:
        return None
    return f"the extension netapprox.hostlib._native was built from other sources than {native_dir} (run make setup)"


if _native is not None and native_error is None:
    native_error = stale_native(_native)
    if native_error is not None:
        _native = None  # the reference runs: what it runs is the code in the tree

NATIVE: bool = native_error is None
"""True when hostlib runs the native cores."""

NativeAtpSender = _native.AtpSender if _native is not None else None
NativeAtpReceiver = _native.AtpReceiver if _native is not None else None

AtpSender = NativeAtpSender if NATIVE else PyAtpSender
AtpReceiver = NativeAtpReceiver if NATIVE else PyAtpReceiver


def implementation() -> str:
    """``"native"`` or ``"python"``: what ``AtpSender``/``AtpReceiver`` here are now."""
    return "native" if AtpSender is NativeAtpSender and AtpSender is not None else "python"


def is_native(core: object) -> bool:
    """Whether ``core`` is a native sender or receiver, or one of their classes (the cores then have
    ``transmit``/``receive_from``)."""
    if _native is None:
        return False
    classes = (_native.AtpSender, _native.AtpReceiver)
    return core in classes if isinstance(core, type) else isinstance(core, classes)


@contextlib.contextmanager
def precise_timers(enabled: bool = True) -> Iterator[None]:
    """Within the block, this thread's timer slack is 1 ns (prctl PR_SET_TIMERSLACK; Linux defaults to 50 µs),
    so ``select``/``sleep`` wake when asked: a paced sender's wake-ups land on time. Without the extension (or
    with ``enabled`` false) nothing changes."""
    if not enabled or _native is None:
        yield
        return
    previous = _native.set_timer_slack(1)
    try:
        yield
    finally:
        _native.set_timer_slack(previous)


def enable_gro(sock: socket.socket) -> bool:
    """Ask the kernel for UDP GRO super-datagrams on ``sock`` (the native ``receive_from`` splits them)."""
    return _native is not None and _native.enable_gro(sock)
