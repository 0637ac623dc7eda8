"""Config: TOML examples load, mistakes give actionable errors, CLI flags override the file."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from netapprox.controller import config as C
from netapprox.controller.__main__ import apply_flags, build_parser, main
from netapprox.controller.config import (
    ControllerConfig,
    PolicyConfig,
    ReportConfig,
    SwitchConfig,
    config_from_dict,
    load_config,
)
from netapprox.controller import options as O
from netapprox.controller.drivers import DRIVER_CLASSES, DRIVER_OPTIONS, build_driver, driver_class, options_class
from netapprox.controller.errors import ConfigError
from netapprox.controller.kernel.driver import KernelDriver
from netapprox.controller.kernel.options import KernelDriverOptions
from netapprox.controller.model import ClassRule, Route, half_buffer_unit
from netapprox.controller.p4runtime.driver import P4RuntimeDriver
from netapprox.controller.p4runtime.options import P4RuntimeOptions, options_from_mapping

from ctl_fixtures import P4INFO

EXAMPLES = Path(__file__).resolve().parents[2] / "controller" / "examples"


def test_bmv2_example_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # its report key is made in the working directory: results/report.key
    cfg = load_config(EXAMPLES / "bmv2.toml")
    assert cfg.epoch_s == pytest.approx(0.020)
    assert cfg.metrics_port == 9601 and cfg.metrics_bind == "127.0.0.1"
    assert cfg.reports.port == 7601 and cfg.reports.bind == "0.0.0.0"
    assert cfg.reports.key == (tmp_path / "results" / "report.key").read_bytes().strip()  # beyond loopback: a key
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
def test_other_examples_load(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # each makes its report key in the working directory
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
    """Refused where the switch is configured (file or code) and where a driver is built from a mapping."""
    with pytest.raises(ConfigError, match=r"^\[\[switch\]\] 's1' options: unknown option 'thirft_port'. "
                                          r"Did you mean 'thrift_port'"):
        SwitchConfig(name="s1", options={"p4info": str(P4INFO), "thirft_port": 9090})
    with pytest.raises(ConfigError, match="^switch 's1' options: unknown option 'thirft_port'. Did you mean"):
        P4RuntimeDriver.from_options("s1", {"p4info": str(P4INFO), "thirft_port": 9090})
    with pytest.raises(ConfigError, match="^switch 'k' options: unknown option 'rate_mbits'. Did you mean 'rate_mbit'"):
        KernelDriver.from_options("k", {"ports": ["a"], "rate_mbits": 10})
    with pytest.raises(ConfigError, match="^switch 'k' options: missing option 'ports'$"):
        KernelDriver.from_options("k", {})
    with pytest.raises(ConfigError, match="takes no options from a file"):
        SwitchConfig(name="n", kind="sim", options={"rate_mbit": 10})


@pytest.mark.parametrize("data, message", [
    ({"controller": {"epoch_msec": 5}}, "unknown key 'epoch_msec'. Did you mean 'epoch_ms'"),
    ({"policy": {"hysterisis": 0.1}}, "Did you mean 'hysteresis'"),
    ({"switch": [{"name": "a", "kind": "p4rt"}]}, "kind: 'p4rt' is not one of p4runtime, kernel, sim. Did you mean 'p4runtime'"),
    ({"switch": [{"name": "a"}, {"name": "a"}]}, "unique"),
    ({"switch": [{"name": "a", "routes": [{"prefix": "10.0.0.1/24", "port": 1}]}]}, "host bits set"),
    ({"cadentflow": [{"name": "x", "objective": "deadlines"}]}, "Did you mean 'deadline'"),
    ({"cadentflow": [{"name": "x", "flows": [{"queue": 0}]}]}, "queue 0 is non-approximate"),
    ({"controller": {"epoch_ms": 0}}, r"\[controller\] epoch_ms: expected a number > 0"),
])
def test_config_errors_are_actionable(data, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data, source="test.toml")


# Values that used to load and then fail in the running controller (or with a traceback): each is refused at
# load, in one line naming the source and the key.
@pytest.mark.parametrize("data, field", [
    ({"controller": {"counters_every": "x"}}, "[controller] counters_every"),
    ({"controller": {"counters_every": -1}}, "[controller] counters_every"),
    ({"controller": {"epoch_ms": "fast"}}, "[controller] epoch_ms"),
    ({"controller": {"metrics_port": 70000}}, "[controller] metrics_port"),
    ({"controller": {"metrics_bind": "not an address"}}, "[controller] metrics_bind"),
    ({"controller": {"decide_on_arrival": "yes"}}, "[controller] decide_on_arrival"),
    ({"controller": {"reconnect_initial_s": 2.0, "reconnect_max_s": 1.0}}, "[controller] reconnect_max_s"),
    ({"controller": {"decision_log": 5}}, "[controller] decision_log"),
    ({"policy": {"thresholds": [0.0, 0.5]}}, "[policy] thresholds"),
    ({"policy": {"thresholds": [0.0, 0.1, 0.2, 0.3, 0.2, 0.5, 0.6, 0.7]}}, "[policy] thresholds"),
    ({"policy": {"thresholds": [0.0, 0.1, 0.2, 0.3, "x", 0.5, 0.6, 0.7]}}, "[policy] thresholds[4]"),
    ({"policy": {"hysteresis": -0.1}}, "[policy] hysteresis"),
    ({"policy": {"job_timeout_s": 0}}, "[policy] job_timeout_s"),
    ({"policy": {"ecn_threshold_pkts": 0}}, "[policy] ecn_threshold_pkts"),
    ({"policy": {"install_tlr_rules": 1}}, "[policy] install_tlr_rules"),
    ({"policy": {"mode": "fiffo"}}, "[policy] mode"),
    ({"policy": {"pinned": [[5, 0]]}}, "[policy] pinned[0] queue"),
    ({"policy": {"pinned": [5]}}, "[policy] pinned[0]"),
    ({"policy": {"loss_margin": 2}}, "[policy] loss_margin"),
    ({"policy": {"promote_after_epochs": 0}}, "[policy] promote_after_epochs"),
    ({"reports": {"port": "7601"}}, "[reports] port"),
    ({"reports": {"rate_per_host": 0}}, "[reports] rate_per_host"),
    ({"reports": {"burst": 1.5}}, "[reports] burst"),
    ({"reports": {"rcvbuf_bytes": 10}}, "[reports] rcvbuf_bytes"),
    ({"reports": {"key_file": "/nonexistent/key"}}, "[reports] key_file"),
    ({"reports": {"key": ""}}, "[reports] key"),
    ({"cadentflow": [{"name": "x", "jobs": [0]}]}, "jobs[0]"),
    ({"cadentflow": [{"name": "x", "flows": [{"weight": "heavy"}]}]}, "flows[0] weight"),
    ({"cadentflow": [{"name": "x", "flows": [{"priority": [9, 3]}]}]}, "flows[0] priority"),
    ({"switch": [{"name": "a", "routes": [{"prefix": "10.0.0.0/24", "port": "x"}]}]}, "routes[0] port"),
    ({"switch": [{"name": "a", "routes": [{"prefix": "10.0.0.0/24", "port": 1, "dst_mac": "zz"}]}]},
     "routes[0] dst_mac"),
    ({"switch": [{"name": "a", "class_rules": [{"queue": 9}]}]}, "class_rules[0] queue"),
    ({"switch": [{"name": "a", "job_sources": ["10.0.0.0/33"]}]}, "job_sources[0]"),
    ({"switch": [{"name": "a", "options": {"thrift_port": "x"}}]}, "options.thrift_port"),
    ({"switch": [{"name": "a", "options": {"address": "nohost"}}]}, "options.address"),
    ({"switch": [{"name": "a", "options": {"election_id": [1]}}]}, "options.election_id"),
    ({"switch": [{"name": "a", "options": {"ports": [1, 600]}}]}, "options.ports[1]"),
    ({"switch": [{"name": "a", "options": {"connect_timeout_s": -1}}]}, "options.connect_timeout_s"),
    ({"switch": [{"name": "a", "options": {"target": "tofino2"}}]}, "options.target"),
    ({"switch": [{"name": "k", "kind": "kernel", "options": {"ports": ["a"], "rate_mbit": "fast"}}]},
     "options.rate_mbit"),
    ({"switch": [{"name": "k", "kind": "kernel", "options": {"ports": ["a"], "buffer_packets": 10}}]},
     "options.buffer_packets"),
    ({"switch": [{"name": "k", "kind": "kernel", "options": {"ports": "a"}}]}, "options.ports"),
    ({"switch": {"name": "a"}}, "[[switch]]"),
    ({"policy": 5}, "[policy]"),
])
def test_bad_values_are_refused_at_load_in_one_line(data, field):
    with pytest.raises(ConfigError) as e:
        config_from_dict(data, source="ctl.toml")
    message = str(e.value)
    assert message.startswith("ctl.toml: ") and field in message and "\n" not in message, message


def test_approx_buffer_unit_is_a_switch_option_checked_against_the_port_buffer():
    """``approx_buffer_unit`` (unset: every data plane's one default, ``model.half_buffer_unit``: 1, the paper's
    k-MTU queues, on a 64-packet port, 4 on the kernel driver's 256) multiplies the approximate queues' buffers of
    a P4 or kernel switch, in the drivers' options as in the file; a unit whose 28 x unit packets leave queue 0
    nothing of ``buffer_packets`` (the driver's default when unset) is refused at load in one line."""
    cfg = config_from_dict({"switch": [
        {"name": "p", "options": {"buffer_packets": 400, "approx_buffer_unit": 4}},
        {"name": "k", "kind": "kernel", "options": {"ports": ["a"], "approx_buffer_unit": 9}}]}, source="ctl.toml")
    p, k = cfg.switches
    assert options_from_mapping("p", p.options).approx_buffer_unit == 4
    shape = KernelDriverOptions.from_mapping(k.options).shape("a")  # buffer_packets 256 by default
    assert shape == O.parse(KernelDriverOptions, k.options, "k").shape("a")
    assert (shape.approx_unit, shape.buffer_packets) == (9, 256)
    assert [shape.queue_bytes(q) // shape.mtu_bytes for q in range(8)] == [256 - 9 * 28] + [9 * (8 - q)
                                                                                        for q in range(1, 8)]
    assert all(shape.queue_bytes(q) % shape.mtu_bytes == 0 for q in range(8))
    tuned = (12, 9, 2, 1, 1, 1, 2)  # the tuner's shares: 28 units, as the k-MTU buffers
    assert [shape.queue_bytes(q, tuned) // shape.mtu_bytes for q in range(8)] == [4] + [9 * b for b in tuned]
    assert P4RuntimeOptions().approx_buffer_unit == 1 == half_buffer_unit(64)
    assert KernelDriverOptions(ports={"a": 1}).approx_buffer_unit == 4 == half_buffer_unit(256)
    assert P4RuntimeOptions(buffer_packets=1000).approx_buffer_unit == 17
    assert config_from_dict({"switch": [{"name": "s1", "options": {"buffer_packets": 85, "approx_buffer_unit": 3}}]}
                            ).switches[0].options["approx_buffer_unit"] == 3  # queue 0 keeps 85 - 84 = 1
    nothing = "a total buffer of {} packets leaves nothing for queue 0 (approximate queues of {} x 28 packets)"
    for options, kind, problem in [
            ({"approx_buffer_unit": "2"}, "p4runtime", "expected an integer >= 1, got '2'"),
            ({"approx_buffer_unit": 1.5}, "p4runtime", "expected an integer >= 1, got 1.5"),
            ({"approx_buffer_unit": 0}, "kernel", "expected an integer >= 1, got 0"),
            ({"approx_buffer_unit": True}, "kernel", "expected an integer >= 1, got True"),
            ({"approx_buffer_unit": 3}, "p4runtime", nothing.format(64, 3) + "; at most 2 with buffer_packets 64"),
            ({"approx_buffer_unit": 3, "buffer_packets": 84}, "p4runtime",
             nothing.format(84, 3) + "; at most 2 with buffer_packets 84"),
            ({"approx_buffer_unit": 10}, "kernel", nothing.format(256, 10) + "; at most 9 with buffer_packets 256")]:
        options = {"ports": ["a"], **options} if kind == "kernel" else options
        with pytest.raises(ConfigError) as e:
            config_from_dict({"switch": [{"name": "s1", "kind": kind, "options": options}]}, source="ctl.toml")
        assert str(e.value) == f"ctl.toml: [[switch]] 's1' options.approx_buffer_unit: {problem}"
    # Options built in code (topo/, the drivers' own callers) are refused by the drivers the same way.
    with pytest.raises(ConfigError, match="options.approx_buffer_unit: a total buffer of 64 packets"):
        SwitchConfig(name="s1", options={"approx_buffer_unit": 3})
    with pytest.raises(ConfigError, match="^option approx_buffer_unit: a total buffer of 64 packets leaves nothing"):
        P4RuntimeOptions(approx_buffer_unit=3)
    with pytest.raises(ConfigError, match="^switch 's1' options.approx_buffer_unit: expected an integer >= 1, got 0$"):
        options_from_mapping("s1", {"approx_buffer_unit": 0})
    with pytest.raises(ConfigError, match="^option approx_buffer_unit: need an integer >= 1, got 0$"):
        P4RuntimeOptions(approx_buffer_unit=0)
    with pytest.raises(ConfigError, match="^kernel switch options.approx_buffer_unit: a total buffer of 256 packets"):
        KernelDriverOptions.from_mapping({"ports": ["a"], "approx_buffer_unit": 10})
    with pytest.raises(ConfigError, match="^option approx_buffer_unit: a total buffer of 256 packets"):
        KernelDriverOptions(ports={"a": 1}, approx_buffer_unit=10)


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_every_config_field_has_a_check():
    """A new field of a config dataclass (or a driver's options) needs its line in controller/config.py."""
    tables = {C.ControllerConfig: C.CONTROLLER_KEYS, C.PolicyConfig: C.POLICY_KEYS, C.TuningConfig: C.TUNING_KEYS,
              C.ReportConfig: C.REPORT_KEYS,
              C.SwitchConfig: C.SWITCH_KEYS, C.CadentFlow: C.CADENTFLOW_KEYS, C.TaggedFlow: C.TAGGED_FLOW_KEYS}
    for cls, table in tables.items():
        assert _fields(cls) == set(table), f"{cls.__name__}: fields without a check: " \
                                           f"{sorted(_fields(cls) - set(table))}, checks without a field: " \
                                           f"{sorted(set(table) - _fields(cls))}"
    # A driver's options carry their checks as field metadata: every field has one (O.checks refuses a field
    # without), every kind has its entry, and each driver class reads its own kind's options.
    assert set(DRIVER_OPTIONS) == set(DRIVER_CLASSES) == set(C.DRIVER_KINDS)
    for kind in DRIVER_OPTIONS:
        cls = options_class(kind)
        if cls is not None:
            assert set(O.checks(cls)) == _fields(cls)
            assert driver_class(kind).OPTIONS == kind

    @dataclasses.dataclass(frozen=True)
    class Unchecked:
        a: int = 1
    with pytest.raises(TypeError, match="Unchecked.a has no check"):
        O.checks(Unchecked)


def test_defaults_and_examples_pass_their_checks():
    cfg = ControllerConfig()
    assert cfg.policy.thresholds == (0.0, 0.3, 0.45, 0.6, 0.7, 0.8, 0.875, 0.95) and cfg.policy.finish_epochs == 64.0
    for cls, kind in ((P4RuntimeOptions, "p4runtime"), (KernelDriverOptions, "kernel")):
        defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        defaults = {k: list(v) if isinstance(v, tuple) else v for k, v in defaults.items()}
        if kind == "kernel":
            defaults["ports"] = ["eth1"]
        SwitchConfig(name="s", kind=kind, options=defaults)


def test_values_are_stored_in_their_canonical_types():
    cfg = config_from_dict({"controller": {"epoch_ms": 20, "reconnect_initial_s": 1},
                            "policy": {"thresholds": [0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875],
                                       "pinned": [[7, 3]]}})
    assert cfg.epoch_s == 0.02 and isinstance(cfg.reconnect_initial_s, float)
    assert cfg.policy.thresholds == tuple(k / 8 for k in range(8)) and cfg.policy.pinned == ((7, 3),)
    assert all(isinstance(t, float) for t in cfg.policy.thresholds)


def test_code_built_configs_are_checked_too():
    with pytest.raises(ConfigError, match=r"\[controller\] counters_every"):
        ControllerConfig(counters_every="x")
    with pytest.raises(ConfigError, match=r"\[policy\] thresholds"):
        PolicyConfig(thresholds=(0.0, 0.5))
    with pytest.raises(ConfigError, match=r"\[reports\] port"):
        ReportConfig(port=-2)


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[controller\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(bad)


def test_cli_flags_override_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
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
    bad = tmp_path / "bad.toml"
    bad.write_text("[controller]\nepoch = 5\n")
    assert main(["--config", str(bad)]) == 2
    assert "unknown key 'epoch'" in capsys.readouterr().err
