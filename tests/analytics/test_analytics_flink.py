"""The streaming port on Flink (analytics/flink.py): a stream's count windows sent over ATP (loopback), each at the
MSR planned from the windows before it, averaged by a local Flink job whose source receives the ATP jobs. PyFlink
lives in its own venv (make setup: .venv-flink; docs/analytics.md, Flink), so the job runs there as a subprocess."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

FLINK_PYTHON = Path(os.environ.get("NETAPPROX_FLINK_PYTHON",
                                   Path(__file__).resolve().parents[2] / ".venv-flink" / "bin" / "python"))

pytestmark = pytest.mark.slow


def test_flink_window_averages_over_an_atp_source():
    if not FLINK_PYTHON.exists():
        pytest.skip(f"no PyFlink venv at {FLINK_PYTHON} (make setup makes .venv-flink with the 'flink' extra)")
    if shutil.which("java") is None:
        pytest.skip("no JVM on PATH (tools/setup-system.sh installs openjdk-17-jre-headless)")
    p = subprocess.run([str(FLINK_PYTHON), "-m", "netapprox.analytics.flink", "--windows", "3", "--rows", "1000",
                        "--e-max", "0.1", "--timeout", "240",
                        "--no-source-check", "2"], capture_output=True, text=True, timeout=420)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout)
    assert res["error"] is None and len(res["windows"]) == 3
    assert [w["sender"]["basis"] for w in res["windows"]] == ["heuristic", "previous window", "previous window"]
    for w in res["windows"]:
        f, s = w["flink"], w["sender"]
        assert f["sample"] == s["received"] and f["population"] == s["rows"] == 1000
        assert f["estimate"] == pytest.approx(s["estimate"], rel=1e-9)  # Flink's cells give the sender's estimate
        assert abs(f["estimate"] - w["truth"]) <= 1.5 * f["half_width"] + 1e-9
    # A source that never arrives: the Flink job fails with the source's one line.
    assert res["no_source"] is not None and "no ATP job arrived within 2 s" in res["no_source"], res["no_source"]
