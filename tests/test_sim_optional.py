"""ns-3 is an optional extra: nothing imports it until a simulation actually runs."""
from __future__ import annotations

import subprocess
import sys


def test_importing_the_sim_modules_does_not_load_ns3():
    code = ("import sys\n"
            "import netapprox.hostlib, netapprox.hostlib.api, netapprox.hostlib.sim\n"
            "import netapprox.controller.sim.driver, netapprox.controller.drivers\n"
            "import netapprox.experiments.sim.trial, netapprox.experiments.sim.backend, netapprox.experiments.figures\n"
            "loaded = sorted(m for m in ('ns', 'ns3', 'cppyy') if m in sys.modules)\n"
            "assert not loaded, loaded\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_sim_driver_is_a_registered_kind():
    from netapprox.controller.drivers import DRIVER_CLASSES, driver_class
    assert "sim" in DRIVER_CLASSES
    assert driver_class("sim").__name__ == "SimDriver"


def test_sim_driver_needs_a_simulated_switch():
    import pytest
    from netapprox.controller.errors import ConfigError
    from netapprox.controller.sim.driver import SimDriver
    with pytest.raises(ConfigError, match="kind 'sim' needs option 'switch'"):
        SimDriver.from_options("s1", {})
