"""Fixtures for the controller tests: the hand-written P4Info, a fake P4Runtime server, drivers on it."""
from __future__ import annotations

from pathlib import Path

import pytest

from controller.fake_p4runtime import FakeP4RuntimeServer
from controller.p4runtime_driver import P4RuntimeDriver, P4RuntimeOptions

FIXTURES = Path(__file__).parent / "fixtures"
P4INFO = FIXTURES / "p4info.txtpb"
BMV2_JSON_BYTES = b'{"program": "netapprox-test"}'


@pytest.fixture
def bmv2_json(tmp_path: Path) -> Path:
    path = tmp_path / "bmv2.json"
    path.write_bytes(BMV2_JSON_BYTES)
    return path


@pytest.fixture
def fake_server():
    server = FakeP4RuntimeServer().start()
    yield server
    server.stop()


@pytest.fixture
def make_driver(fake_server, bmv2_json):
    drivers = []

    def make(**options) -> P4RuntimeDriver:
        opts = dict(address=fake_server.address, p4info=str(P4INFO), bmv2_json=str(bmv2_json),
                    connect_timeout_s=2.0)
        opts.update(options)
        driver = P4RuntimeDriver("s1", P4RuntimeOptions(**opts))
        drivers.append(driver)
        return driver

    yield make
    for d in drivers:
        d.close()


def _root_conftest():
    """tests/conftest.py (the shared skip markers); loaded by path since this file is also named conftest."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("netapprox_tests_conftest", Path(__file__).parents[1] / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_shared = _root_conftest()
requires_p4 = _shared.requires_p4
requires_root = _shared.requires_root
