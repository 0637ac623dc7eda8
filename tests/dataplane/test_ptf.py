"""Build the v1model program, start BMv2 in a private namespace and run the whole PTF suite (ptf/tests).
Fails if any PTF test fails; the PTF output is in the failure message."""
from __future__ import annotations

import pathlib
import re
import sys
import tempfile

import pytest

from support.skips import requires_p4, requires_root

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "ptf"))
import run_ptf  # noqa: E402  (ptf/run_ptf.py)

pytestmark = [requires_p4, requires_root, pytest.mark.p4, pytest.mark.root, pytest.mark.slow,
              pytest.mark.timeout(420)]


def test_ptf_suite_passes_on_bmv2():
    run_ptf.build()
    with tempfile.TemporaryDirectory(prefix="netapprox-ptf-") as tmp:
        with run_ptf.Bmv2Namespace(pathlib.Path(tmp)) as ns:
            res = run_ptf.run_ptf(ns, [], timeout=330)
            switch_log = ns.log_tail(40)
    assert res.returncode == 0, f"PTF suite failed (exit {res.returncode}):\n{res.stdout}\n--- BMv2 ---\n{switch_log}"
    ran = re.search(r"^Ran (\d+) tests? ", res.stdout, flags=re.M)
    assert ran and int(ran.group(1)) >= 21 and re.search(r"^OK$", res.stdout, flags=re.M), res.stdout
