"""hostlib's tests run against both implementations of the sans-I/O cores (hostlib/core.py): the pure-Python
reference and the native extension. A module opts in with ``pytestmark = pytest.mark.usefixtures("cores")``:
its own ``AtpSender``/``AtpReceiver`` names, ``hostlib.core``'s (so hostlib_sim, the blocking API and the
asyncio adapter) and, through ``NETAPPROX_PURE_PYTHON``, the CLI's in subprocesses follow the parameter."""
from __future__ import annotations

import os
import types

import pytest

from netapprox.hostlib import core as hostlib_core


def _need_native() -> None:
    """Skip when the extension is not built; fail instead under NETAPPROX_REQUIRE_NATIVE=1 (``make test``)."""
    if hostlib_core.NativeAtpSender is None:
        why = f"the native cores are not available: {hostlib_core.native_error}"
        if os.environ.get("NETAPPROX_REQUIRE_NATIVE") == "1":
            pytest.fail(why + " (NETAPPROX_REQUIRE_NATIVE=1)")
        pytest.skip(why)


@pytest.fixture
def native():
    """The test needs the native cores (tests/hostlib/test_hostlib_differential.py)."""
    _need_native()


@pytest.fixture(params=["python", "native"])
def cores(request, monkeypatch):
    native = request.param == "native"
    if native:
        _need_native()
    sender = hostlib_core.NativeAtpSender if native else hostlib_core.PyAtpSender
    receiver = hostlib_core.NativeAtpReceiver if native else hostlib_core.PyAtpReceiver
    monkeypatch.setattr(hostlib_core, "AtpSender", sender)
    monkeypatch.setattr(hostlib_core, "AtpReceiver", receiver)
    for name, cls in (("AtpSender", sender), ("AtpReceiver", receiver)):  # the test module's own imports
        if hasattr(request.module, name):
            monkeypatch.setattr(request.module, name, cls)
    if native:
        monkeypatch.delenv("NETAPPROX_PURE_PYTHON", raising=False)
    else:
        monkeypatch.setenv("NETAPPROX_PURE_PYTHON", "1")  # CLI subprocesses run the reference too
    return types.SimpleNamespace(name=request.param, AtpSender=sender, AtpReceiver=receiver)
