"""SIGTERM stops an experiment or the benchmark the way Ctrl-C does, so their testbeds are torn down (every
process they started, every namespace) instead of left behind by the signal's default action."""
from __future__ import annotations

import os
import signal
import time

import pytest


@pytest.fixture
def restore_signals():
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, h in old.items():
        signal.signal(s, h)


def _terminate_self(*_a, **_k):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the handler interrupts this
    raise AssertionError("SIGTERM did not interrupt the run")


def test_sigterm_interrupts_an_experiment_like_ctrl_c(monkeypatch, tmp_path, restore_signals):
    from netapprox.experiments import emulated_cli as M
    monkeypatch.setattr(M, "run_figures", _terminate_self)
    monkeypatch.setattr(M.os, "geteuid", lambda: 0)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        M.main(["incast", "--out", str(tmp_path)])


def test_sigterm_interrupts_the_benchmark_like_ctrl_c(monkeypatch, tmp_path, restore_signals):
    from netapprox.bench import __main__ as B
    monkeypatch.setattr(B.N, "trials", lambda *a, **k: ["one trial"])
    monkeypatch.setattr(B.N, "run", _terminate_self)
    monkeypatch.setattr(B.os, "geteuid", lambda: 0)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        B.main(["--sections", "idle", "--out", str(tmp_path)])
