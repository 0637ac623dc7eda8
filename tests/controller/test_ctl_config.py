"""Config: TOML examples load, mistakes give actionable errors, CLI flags override the file."""
from __future__ import annotations

from pathlib import Path

import pytest

from netapprox.controller.__main__ import apply_flags, build_parser
from netapprox.controller.config import ControllerConfig, SwitchConfig, config_from_dict, load_config
from netapprox.controller.drivers import build_driver, driver_class
from netapprox.controller.errors import ConfigError
from netapprox.controller.model import ClassRule, Route
from netapprox.controller.p4runtime.driver import P4RuntimeDriver

from ctl_fixtures import P4INFO

EXAMPLES = Path(__file__).resolve().parents[2] / "controller" / "examples"


def test_bmv2_example_loads():
    cfg = load_config(EXAMPLES / "bmv2.toml")
    assert cfg.epoch_s == pytest.approx(0.020)
    assert cfg.metrics_port == 9601 and cfg.metrics_bind == "127.0.0.1"
    assert cfg.reports.port == 7601 and cfg.reports.key is None
    assert cfg.policy.thresholds == tuple(k / 8 for k in range(8))
    (s1,) = cfg.switches
    assert (s1.name, s1.kind) == ("s1", "p4runtime")
    assert s1.routes[0] == Route("10.0.0.1", 32, 1, "02:00:00:00:01:00", "02:00:00:00:00:01")
    assert s1.class_rules == (ClassRule(rank=1, ip_proto=6, ip_proto_mask=0xFF, l4_dport=5001,
                                        l4_dport_mask=0xFFFF, qid=0),)
    assert s1.options["thrift_port"] == 9090
    (cf,) = cfg.policy.cadentflows
    assert cf.objective == "deadline" and cf.jobs == (100, 101) and len(cf.flows) == 3


@pytest.mark.parametrize("name", ["tofino.toml", "kernel.toml"])
def test_other_examples_load(name):
    cfg = load_config(EXAMPLES / name)
    assert len(cfg.switches) == 1


def test_registry_builds_the_p4runtime_driver_from_options():
    sc = SwitchConfig(name="s9", kind="p4runtime", options={"p4info": str(P4INFO), "election_id": [0, 7],
                                                             "ports": [1, 2]})
    driver = build_driver(sc)
    assert isinstance(driver, P4RuntimeDriver)
    assert driver.options.election_id == (0, 7) and driver.options.ports == (1, 2)


def test_registry_maps_kernel_kind_lazily():
    assert driver_class("kernel").__name__ == "KernelDriver"
    with pytest.raises(ConfigError, match="Did you mean 'kernel'"):
        driver_class("kernal")


def test_unknown_driver_option_suggests_the_right_one():
    sc = SwitchConfig(name="s1", options={"p4info": str(P4INFO), "thirft_port": 9090})
    with pytest.raises(ConfigError, match="unknown p4runtime option 'thirft_port'. Did you mean 'thrift_port'"):
        build_driver(sc)


@pytest.mark.parametrize("data, message", [
    ({"controller": {"epoch_msec": 5}}, "unknown key 'epoch_msec'. Did you mean 'epoch_ms'"),
    ({"policy": {"hysterisis": 0.1}}, "Did you mean 'hysteresis'"),
    ({"switch": [{"name": "a", "kind": "p4rt"}]}, "kind 'p4rt' unknown"),
    ({"switch": [{"name": "a"}, {"name": "a"}]}, "unique"),
    ({"switch": [{"name": "a", "routes": [{"prefix": "10.0.0.1/24", "port": 1}]}]}, "host bits set"),
    ({"cadentflow": [{"name": "x", "objective": "deadlines"}]}, "Did you mean 'deadline'"),
    ({"cadentflow": [{"name": "x", "flows": [{"queue": 0}]}]}, "queue 0 is non-approximate"),
    ({"controller": {"epoch_ms": 0}}, "epoch_s must be positive"),
])
def test_config_errors_are_actionable(data, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data, source="test.toml")


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[controller\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(bad)


def test_cli_flags_override_the_file(tmp_path):
    key = tmp_path / "k"
    key.write_bytes(b"secret\n")
    args = build_parser().parse_args(["--config", "x.toml", "--epoch-ms", "50", "--report-port", "0",
                                      "--metrics-port", "-1", "--report-key-file", str(key),
                                      "--decision-log", "d.jsonl"])
    cfg = apply_flags(load_config(EXAMPLES / "bmv2.toml"), args)
    assert cfg.epoch_s == pytest.approx(0.05)
    assert cfg.reports.port == 0 and cfg.reports.key == b"secret" and cfg.reports.rate_per_host == 1000.0
    assert cfg.metrics_port == -1 and cfg.decision_log == "d.jsonl"
    assert isinstance(cfg, ControllerConfig)


def test_command_line_runs_the_controller_against_a_switch(fake_server, bmv2_json, tmp_path):
    from netapprox.controller.__main__ import main

    config = tmp_path / "c.toml"
    log = tmp_path / "decisions.jsonl"
    config.write_text(f"""
[controller]
epoch_ms = 10
[reports]
bind = "127.0.0.1"
port = 0
[[switch]]
name = "s1"
routes = [{{ prefix = "10.0.0.0/24", port = 3, src_mac = "02:00:00:00:00:01", dst_mac = "02:00:00:00:00:02" }}]
[switch.options]
address = "{fake_server.address}"
p4info = "{P4INFO}"
bmv2_json = "{bmv2_json}"
""")
    assert main(["--config", str(config), "--duration", "0.5", "--decision-log", str(log)]) == 0
    assert len(fake_server.pipelines) == 1
    assert len(fake_server.entries(33554433)) == 1  # the route
    assert '"event": "switch_up"' in log.read_text()


def test_command_line_reports_config_errors_without_a_traceback(tmp_path, capsys):
    from netapprox.controller.__main__ import main

    bad = tmp_path / "bad.toml"
    bad.write_text("[controller]\nepoch = 5\n")
    assert main(["--config", str(bad)]) == 2
    assert "unknown key 'epoch'" in capsys.readouterr().err
