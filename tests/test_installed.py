"""The package as a user installs it: the wheel (not the editable install) in a fresh virtual environment, run
from an empty folder, far from the checkout.

The wheel is built from this checkout and installed with ``--no-deps``; its dependencies come from the project's
own environment (a ``.pth`` line puts that site-packages folder on the new environment's path, so nothing is
downloaded and the editable install's finder, which only that folder's own ``.pth`` files would activate, stays
off). Every import is checked to come from the new environment. Then, from an empty folder: ``atp-recv`` and
``atp-send`` over loopback with relative ``--json`` paths (written in that folder), ``netapprox-controller
--help``, and the demo's ``--dry-run`` with a relative ``--results`` (resolved in that folder, no root needed).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from support.ports import udp_port_bound

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; returns its bin/ folder."""
    root = tmp_path_factory.mktemp("installed")
    wheels = root / "wheels"
    before = {p: p.stat().st_mtime_ns for p in REPO.glob("build/*")}
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(REPO)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    # setup.py builds outside the checkout: no build/lib.*, bdist.* or temp.* copy of the modules is left in it
    assert {p: p.stat().st_mtime_ns for p in REPO.glob("build/*")} == before
    (wheel,) = wheels.glob("netapprox-*.whl")
    venv = root / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "project-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                              "--no-deps", "--no-index", "-q", str(wheel)], capture_output=True, text=True)
    if install.returncode != 0 and "no such option: --python" in install.stderr:
        pytest.skip("this pip cannot install into another environment (pip >= 22.3 has --python)")
    assert install.returncode == 0, install.stderr[-2000:]
    return venv / "bin"


def run(bin_dir: Path, cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_wheel_is_what_runs(installed, tmp_path):
    p = run(installed, tmp_path, str(installed / "python"), "-c",
            "import netapprox.hostlib, netapprox.controller, netapprox.topo.demo as d, netapprox.hostlib._native as n;"
            "print(netapprox.hostlib.__file__); print(n.__file__); print(d.__file__)")
    assert p.returncode == 0, p.stderr
    site = str(next((installed.parent / "lib").glob("python*/site-packages")))
    for path in p.stdout.split():
        assert path.startswith(site), f"{path} is not from the installed wheel"


def _wait_until_bound(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Until ``proc`` holds UDP ``port`` (read from the kernel's table: a probe's own bind would race atp-recv's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"atp-recv exited {proc.returncode}: {proc.communicate()[1]}"
        if udp_port_bound(port):
            return
        time.sleep(0.05)
    raise AssertionError(f"atp-recv did not bind UDP 127.0.0.1:{port} within {timeout:.0f} s")


def test_atp_send_and_recv_from_an_empty_folder(installed, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{installed}{os.pathsep}{env.get('PATH', '')}"
    rx = subprocess.Popen([str(installed / "atp-recv"), "--bind", "127.0.0.1", "--port", str(port), "--once",
                           "--timeout", "60", "--json", "rx.json"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    try:
        _wait_until_bound(port, rx)  # a send to a port nobody has bound yet fails at once (ICMP port unreachable)
        tx = run(installed, tmp_path, str(installed / "atp-send"), f"127.0.0.1:{port}", "--messages", "300",
                 "--msr", "0.9", "--json", "tx.json")
        out, err = rx.communicate(timeout=60)
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.communicate()
    assert tx.returncode == 0, tx.stderr
    assert rx.returncode == 0, err
    assert "R_max 10 Gbit/s (loopback)" in tx.stdout
    sent = json.loads((tmp_path / "tx.json").read_text())
    got = json.loads((tmp_path / "rx.json").read_text())
    assert sent["msr_met"] and got["job_id"] == sent["job_id"] and got["total"] == 300


def test_controller_help_from_an_empty_folder(installed, tmp_path):
    p = run(installed, tmp_path, str(installed / "netapprox-controller"), "--help")
    assert p.returncode == 0 and "--config" in p.stdout, p.stderr


def test_the_demo_resolves_a_relative_results_folder_where_it_is_run(installed, tmp_path):
    p = run(installed, tmp_path, str(installed / "python"), "-m", "netapprox.topo.demo", "--dry-run",
            "--results", "out")
    assert p.returncode == 0, p.stderr
    assert f"results in {tmp_path / 'out'}" in p.stdout
    p = run(installed, tmp_path, str(installed / "python"), "-m", "netapprox.topo.demo", "--dry-run",
            "--target", "bmv2", "--p4-build", "p4")
    assert p.returncode == 0 and f"P4 program {tmp_path / 'p4' / 'bmv2.json'}" in p.stdout, p.stderr
