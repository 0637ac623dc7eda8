"""Skip markers shared by the test suite. A skip always says why."""
from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

IS_ROOT = os.geteuid() == 0
HAVE_P4 = shutil.which("p4c-bm2-ss") is not None and shutil.which("simple_switch_grpc") is not None

requires_root = pytest.mark.skipif(not IS_ROOT, reason="needs root to create network namespaces and qdiscs")
requires_p4 = pytest.mark.skipif(
    not HAVE_P4,
    reason="needs p4c (p4c-bm2-ss) and BMv2 (simple_switch_grpc >= 1.15.1) on PATH; see docs/dataplane.md",
)

HAVE_P4TESTGEN = shutil.which("p4testgen") is not None
requires_p4testgen = pytest.mark.skipif(
    not HAVE_P4TESTGEN,
    reason="needs p4testgen on PATH (p4c built with its p4tools, -DENABLE_TEST_TOOLS=ON); see docs/dataplane.md",
)

HAVE_NS3 = importlib.util.find_spec("ns3") is not None
requires_ns3 = pytest.mark.skipif(not HAVE_NS3, reason="needs ns-3 from PyPI: pip install -e '.[sim]' (make test does)")


def need_extension(built: bool, what: str) -> None:
    """Call from a test needing the C extension ``what``: skip when it is not built, fail instead under
    NETAPPROX_REQUIRE_NATIVE=1 (``make test``), so that a build that broke cannot pass as skipped tests."""
    if built:
        return
    why = f"{what} is not built: `make setup` builds it when gcc and the Python headers are there"
    if os.environ.get("NETAPPROX_REQUIRE_NATIVE") == "1":
        pytest.fail(why + " (NETAPPROX_REQUIRE_NATIVE=1)")
    pytest.skip(why)
