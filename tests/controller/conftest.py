"""Fixtures for the controller tests: a fake P4Runtime server and P4Runtime drivers connected to it."""
from __future__ import annotations

from pathlib import Path

import pytest

from netapprox.controller.p4runtime.driver import P4RuntimeDriver
from netapprox.controller.p4runtime.options import P4RuntimeOptions
from netapprox.controller.p4runtime.fake_server import FakeP4RuntimeServer
from ctl_fixtures import BMV2_JSON_BYTES, P4INFO


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
