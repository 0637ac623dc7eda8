"""``python -m netapprox.analytics``: help on stdout with the defaults, one-line errors (exit 2) on bad input, a
job's answers (exit 0 when every bound is met, 1 when one is not)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from netapprox.analytics.__main__ import main


def test_analytics_cli_help_exits_0_on_stdout_with_defaults():
    p = subprocess.run([sys.executable, "-m", "netapprox.analytics", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and p.stderr == ""
    text = " ".join(p.stdout.split())
    assert "--e-max" in text and "(0, 1) (default: 0.05)" in text and "(default: 0.95)" in text


@pytest.mark.parametrize("argv, words", [
    (["--e-max", "1.5"], "e_max 1.5: must be in (0, 1)"),
    (["--e-max", "0"], "e_max 0.0: must be in (0, 1)"),
    (["--confidence", "1"], "confidence 1.0: must be in (0, 1)"),
    (["--rows", "12"], "the job has 12 rows; an error bound needs at least 30"),
    (["--loss", "1"], "--loss 1.0 must be in [0, 1)"),
    (["--msr", "0"], "--msr 0.0: must be in (0, 1]"),
])
def test_analytics_cli_bad_input_is_one_line(argv, words, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and words in err


def test_analytics_cli_answers_with_its_error(capsys):
    assert main(["--rows", "3000", "--aggregate", "avg", "--per-group", "--e-max", "0.05", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["all_met"] and r["total"] == 3000 and 0 < r["received"] <= 3000
    assert [a["group"] for a in r["answers"]] == [None, 0, 1]
    assert all(a["error"] <= 0.05 for a in r["answers"])
    # a tight bound at a fixed low MSR is not met: exit 1, and the table says so
    assert main(["--rows", "3000", "--aggregate", "rank", "--k", "3", "--e-max", "0.01", "--msr", "0.1"]) == 1
    assert " no" in capsys.readouterr().out
