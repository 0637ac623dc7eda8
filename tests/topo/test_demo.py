"""``make demo`` in its short form: the whole stack (Mininet, kernel switches, controller, hostlib)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from support.skips import requires_p4, requires_root

pytestmark = [requires_root, pytest.mark.mininet, pytest.mark.slow, pytest.mark.timeout(150),
              pytest.mark.skipif(shutil.which("mnexec") is None,
                                 reason="needs Mininet's mnexec (Debian package 'mininet')")]


@pytest.mark.parametrize("target", ["kernel", pytest.param("bmv2", marks=requires_p4)])
def test_quick_demo(tmp_path, target):
    from netapprox.topo.demo import REPO

    if target == "bmv2" and not (REPO / "build" / "v1model" / "bmv2.json").exists():
        pytest.skip("build/v1model/bmv2.json not built: run `make p4`")
    res = subprocess.run([sys.executable, "-m", "netapprox.topo.demo", "--quick", "--target", target, "--results", str(tmp_path)],
                         capture_output=True, text=True, timeout=140)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    out = res.stdout
    assert "network and controller up" in out and "JCT (s)" in out and "FCT" in out
    summary = json.loads((tmp_path / "demo-summary.json").read_text())
    assert summary["target"] == target
    assert summary["bulk_fct_s"] > 0
    for job in summary["jobs"]:
        assert job["delivered"] >= job["required"], job
        assert job["queues"] and all(1 <= q <= 7 for q in job["queues"]), "approximate jobs never use queue 0"
        png = tmp_path / f"demo-timeline-{job['job']}.png"
        assert png.stat().st_size > 10_000
    # The controller moved at least one job: its assignment log is not empty.
    assert summary["assignments"]
