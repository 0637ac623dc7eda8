"""Type-check the TNA program with the open p4c front end (p4test), when p4test and tna.p4 are available.

There is no Tofino compiler here; bf-p4c (`make p4-tna`) is the real check. p4test needs tna.p4 and its
tofino1_*.p4 companions: from p4test's own p4include (p4c built with the Tofino back end), or from a
directory named by NETAPPROX_TNA_P4INCLUDE (e.g. p4c's backends/tofino/bf-p4c/p4include)."""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _tna_include() -> pathlib.Path | None:
    candidates = []
    if os.environ.get("NETAPPROX_TNA_P4INCLUDE"):
        candidates.append(pathlib.Path(os.environ["NETAPPROX_TNA_P4INCLUDE"]))
    p4test = shutil.which("p4test")
    if p4test:
        real = pathlib.Path(p4test).resolve()
        for up in real.parents:
            candidates += [up / "p4include", up / "share" / "p4c" / "p4include"]
    for c in candidates:
        if (c / "tna.p4").is_file():
            return c
    return None


TNA_INCLUDE = _tna_include()

pytestmark = [
    pytest.mark.p4,
    pytest.mark.skipif(shutil.which("p4test") is None, reason="needs p4test (p4c) on PATH"),
    pytest.mark.skipif(TNA_INCLUDE is None,
                       reason="needs tna.p4: p4c built with the Tofino back end, or NETAPPROX_TNA_P4INCLUDE"),
]


def test_tna_program_passes_the_p4c_front_end():
    cmd = ["p4test", "--std", "p4-16", "-D__TARGET_TOFINO__=1", "-I", str(TNA_INCLUDE), "-I", str(REPO / "p4src"),
           str(REPO / "p4src" / "tna" / "netapprox.p4")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    # p4c's diagnostics read "<file>(<line>): [--Werror=<kind>] error: ..."; tna.p4's own warnings quote
    # `typedef error ParserError_t`, which is no error.
    assert not re.search(r"\berror:|\[--Werror", res.stderr, re.I), res.stderr
