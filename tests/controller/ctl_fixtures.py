"""Shared constants of the controller tests (a uniquely named module, so test files can import it whatever
other conftest.py files the test run has loaded)."""
from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
P4INFO = FIXTURES / "p4info.txtpb"
BMV2_JSON_BYTES = b'{"program": "netapprox-test"}'

