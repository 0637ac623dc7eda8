"""`make p4` / `make p4-tna` without their compiler fail at once and say what to install."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _make(target: str, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    return subprocess.run(["make", "--no-print-directory", "-C", str(REPO), target, *args],
                          capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_p4_without_p4c_names_p4c():
    res = _make("p4", "P4C=p4c-bm2-ss-not-installed", "-B")
    assert res.returncode != 0
    assert "p4c-bm2-ss-not-installed" in res.stderr and "Install p4c" in res.stderr, res.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_p4_tna_without_a_tofino_compiler_names_both():
    # A PATH with make and a shell but without any Tofino compiler, whatever the machine has.
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not any((pathlib.Path(d) / exe).exists() for exe in ("bf-p4c", "p4c-barefoot")))
    res = _make("p4-tna", path=path)
    assert res.returncode != 0
    assert "bf-p4c" in res.stderr and "SDE" in res.stderr and "p4c-barefoot" in res.stderr, res.stderr
