"""p4testgen's tests for every path of the v1model program, run on BMv2 (ptf/testgen.py does both and says how).
Every generated case must pass; the statement coverage p4testgen reports is the one docs/dataplane.md gives."""
from __future__ import annotations

import pathlib
import sys
import tempfile

import pytest

from support.skips import requires_p4, requires_p4testgen, requires_root

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "ptf"))
import testgen  # noqa: E402  (ptf/testgen.py)

pytestmark = [requires_p4, requires_p4testgen, requires_root, pytest.mark.p4, pytest.mark.root, pytest.mark.slow,
              pytest.mark.timeout(900)]

MIN_STATEMENT_COVERAGE = 0.97
"""The statement coverage p4testgen reaches on the program: 84 of 86 (docs/dataplane.md, p4testgen 1.2.5.8);
a drop below fails."""


def test_testgen_cases_for_every_path_pass_on_bmv2():
    testgen.run_ptf.build()
    with tempfile.TemporaryDirectory(prefix="netapprox-testgen-") as tmp:
        tmp = pathlib.Path(tmp)
        # Within the 900 s this test may take: p4testgen 300 s, the cases 480 s (make test stays under 15 min).
        gen = testgen.generate(tmp / "cases", timeout=300)
        (tmp / "run").mkdir()
        ran = testgen.run_cases(tmp / "cases", tmp / "run", timeout=480)
    failed = [r for r in ran["results"] if not r["passed"]]
    assert gen["cases"] > 0, gen["log"][-3000:]
    assert len(ran["results"]) == gen["cases"], (ran["ptf"][-3000:], ran["switch_log"])
    assert not failed, "\n".join(f"{r['case']}: {r['error']}\n  trace: {r['trace']}" for r in failed[:8])
    assert ran["returncode"] == 0, ran["ptf"][-3000:]
    assert gen["coverage"] is not None and gen["coverage"] >= MIN_STATEMENT_COVERAGE, gen["log"][-2000:]
    print(f"p4testgen: {gen['cases']} cases, all passed on BMv2; statement coverage {gen['coverage']:.1%}")
