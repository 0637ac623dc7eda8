"""Shared constants and skip markers for the controller tests (a uniquely named module, so test files can
import it whatever other conftest.py files the test run has loaded)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
P4INFO = FIXTURES / "p4info.txtpb"
BMV2_JSON_BYTES = b'{"program": "netapprox-test"}'


def _shared_markers():
    """tests/conftest.py's skip markers, loaded by path (its module name, conftest, is ambiguous)."""
    spec = importlib.util.spec_from_file_location("netapprox_tests_conftest", Path(__file__).parents[1] / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_shared = _shared_markers()
requires_p4 = _shared.requires_p4
requires_root = _shared.requires_root
