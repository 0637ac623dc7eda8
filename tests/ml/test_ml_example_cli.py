"""``python -m netapprox.ml.example`` as README shows it: its default is ``bounded(0.7)``, it prints a few summary
lines (accuracy and time, replicas identical, bounds held) and JSON only with ``--json``."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the example needs the [torch] extra (make setup installs it)")

SMALL = ["--iterations", "4", "--hidden", "16", "--eval-every", "2"]


def example(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "netapprox.ml.example", *args], capture_output=True, text=True,
                          timeout=300)


def test_default_run_prints_a_summary_of_readme_s_bounded_hook():
    res = example(*SMALL)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 4, res.stdout
    assert lines[0].startswith("3 workers, hook atp bounded(0.7), 4 iterations")
    assert lines[1].startswith("test accuracy ") and " s (" in lines[1]
    assert lines[2] == "replicas identical after every iteration"
    assert lines[3].startswith("bounds held: ")


def test_json_only_when_asked(tmp_path):
    res = example(*SMALL, "--bounded", "none", "--policy", "msr:0.5", "--json", str(tmp_path / "r.json"))
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.strip().splitlines()) == 4 and "hook atp policy msr:0.5" in res.stdout.splitlines()[0]
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["config"]["bounded"] is None and len(result["ranks"]) == 3 and result["replicas_identical"]


def test_the_whole_hook_and_one_of_its_options_is_one_line():
    res = example("--bounded", "0.7", "--policy", "paper")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "--policy" in res.stderr


def test_an_atp_port_in_use_is_one_line_and_exit_status_2():
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("0.0.0.0", 0))
        res = example(*SMALL, "--atp-port", str(taken.getsockname()[1]))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "cannot bind UDP" in lines[0], res.stderr
    assert lines[0].startswith("python -m netapprox.ml.example: error: worker ")
