"""Authenticated reports by default: a report socket beyond loopback needs a key unless the operator opts out
(``[reports] unauthenticated``, ``--report-unauthenticated``); the key is loaded from a file or created there
(mode 0600); hosts sign with the same file (hostlib's ``ReportSink``, ``atp-send --report-key-file``) and the
controller accepts those reports and drops unsigned or forged ones before charging any host."""
from __future__ import annotations

import dataclasses
import os
import socket
import stat
import subprocess
import sys
import time

import pytest

from netapprox.controller.__main__ import apply_flags, build_parser, main
from netapprox.controller.config import (ControllerConfig, ReportConfig, check_report_listener, config_from_dict,
                                         is_loopback, load_config, report_key)
from netapprox.controller.errors import ConfigError
from netapprox.controller.runtime import Runtime
from netapprox.hostlib import events, wire
from netapprox.hostlib.exchange import AtpExchange
from netapprox.hostlib.reporting import ReportSink

from ctl_fixtures import REPO

EXAMPLES = REPO / "controller" / "examples"


def _report(seq: int, job: int = 7) -> wire.Report:
    return wire.Report(job_id=job, group_id=0, seq=seq, tlr=0.3, loss=0.0, msr=0.9, rate_kbps=1000, total=10,
                       delivered=0, lost=0, epoch=seq)


def test_report_key_required_beyond_loopback_unless_opted_out():
    wide = ReportConfig(bind="0.0.0.0", port=0)
    with pytest.raises(ConfigError, match=r"listens on 0\.0\.0\.0:\d+, beyond loopback, without a key"):
        Runtime(ControllerConfig(reports=wide))
    for ok in (dataclasses.replace(wide, key=b"k"), dataclasses.replace(wide, unauthenticated=True),
               ReportConfig(bind="127.0.0.1", port=0), ReportConfig(bind="0.0.0.0", port=-1)):
        with Runtime(ControllerConfig(reports=ok)):
            pass
    given = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # a socket made by the caller counts the same
    given.bind(("0.0.0.0", 0))
    with pytest.raises(ConfigError, match="beyond loopback"):
        Runtime(ControllerConfig(reports=ReportConfig(port=-1)), report_socket=given)
    assert given.fileno() == -1  # closed by the runtime that refused it
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("no-such-host.invalid")
    check_report_listener("127.0.0.2", 7601, ReportConfig())


def test_report_key_file_created_with_safe_permissions_then_loaded(tmp_path):
    path = tmp_path / "keys" / "report.key"
    key = report_key(path, create=True)
    assert len(key) == 64 and int(key, 16) >= 0  # 32 random bytes in hex
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert report_key(path, create=True) == key and report_key(path) == key  # kept, not made again
    assert report_key(tmp_path / "other.key", create=True) != key
    with pytest.raises(ConfigError, match="No such file"):
        report_key(tmp_path / "missing.key")
    (tmp_path / "empty.key").write_bytes(b"\n")
    with pytest.raises(ConfigError, match="is empty"):
        report_key(tmp_path / "empty.key", create=True)


def test_report_key_in_toml_and_on_the_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = config_from_dict({"reports": {"key_file": "k/report.key", "create_key_file": True}}, base_dir=tmp_path)
    assert cfg.reports.key == (tmp_path / "k" / "report.key").read_bytes().strip()
    with pytest.raises(ConfigError, match="create_key_file: needs key_file"):
        config_from_dict({"reports": {"create_key_file": True}})
    assert config_from_dict({"reports": {"unauthenticated": True}}).reports.unauthenticated
    with pytest.raises(ConfigError, match="unauthenticated"):
        config_from_dict({"reports": {"unauthenticated": "yes"}})
    example = load_config(EXAMPLES / "kernel.toml")  # the examples listen beyond loopback, with a key
    assert example.reports.bind == "0.0.0.0" and example.reports.key == (tmp_path / "results/report.key").read_bytes().strip()
    parser = build_parser()
    path = tmp_path / "cli.key"
    cfg = apply_flags(example, parser.parse_args(["-c", "x", "--report-key-file", str(path), "--create-report-key"]))
    assert cfg.reports.key == path.read_bytes().strip()
    cfg = apply_flags(example, parser.parse_args(["-c", "x", "--report-unauthenticated"]))
    assert cfg.reports.unauthenticated
    with pytest.raises(ConfigError, match="--create-report-key needs --report-key-file"):
        apply_flags(example, parser.parse_args(["-c", "x", "--create-report-key"]))


def test_report_key_missing_on_a_wide_listener_is_one_line_and_exit_2(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text('[reports]\nbind = "0.0.0.0"\nport = 0\n[[switch]]\nname = "s1"\n')
    assert main(["--config", str(config), "--dry-run", "--duration", "0.1", "--metrics-port", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "beyond loopback, without a key" in err[0] and "--report-unauthenticated" in err[0]


def test_authenticated_reports_accepted_and_unsigned_or_forged_dropped_uncharged(tmp_path):
    """A controller with a created key on a wide socket; the host signs with the same file through ReportSink.
    Its reports are accepted; unsigned ones, ones signed with another key and a replay are dropped, and none of
    them spends the host's rate budget (one token: the signed report that follows is still accepted)."""
    key = report_key(tmp_path / "report.key", create=True)
    reports = ReportConfig(bind="0.0.0.0", port=0, key=key, rate_per_host=1e-6, burst=2)
    with Runtime(ControllerConfig(reports=reports)) as runtime:
        target = ("127.0.0.1", runtime.report_address[1])
        signed = ReportSink(target, key)
        hostile = [ReportSink(target, None), ReportSink(target, b"another key")]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            def send(datagrams):
                for data, addr in datagrams:
                    s.sendto(data, addr)
            first = signed.datagrams(events.ReportReady(_report(1)))
            send(first)
            for i in range(50):
                for sink in hostile:
                    send(sink.datagrams(events.ReportReady(_report(2 + i))))
                send(first)  # replayed
            send(signed.datagrams(events.ReportReady(_report(100))))
            deadline = time.monotonic() + 10
            stats = runtime.core.ingest_stats
            while time.monotonic() < deadline and stats.accepted + sum(stats.dropped.values()) < 152:
                runtime.epoch()
                time.sleep(0.01)
        assert stats.accepted == 2, (stats.accepted, dict(stats.dropped))
        assert stats.dropped["bad_mac"] == 100 and sum(stats.dropped.values()) == 150, dict(stats.dropped)


def test_report_key_file_of_atp_send_signs_for_the_controller(tmp_path):
    """``atp-send --report-key-file``: the controller's created key file, given to the host, signs its REPORTs."""
    key_file = tmp_path / "report.key"
    key = report_key(key_file, create=True)
    ctl = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ctl.bind(("127.0.0.1", 0))
    ctl.settimeout(20)
    try:
        with AtpExchange() as rx:  # the receiver, bound before the sender starts
            res = subprocess.run([sys.executable, "-m", "netapprox.hostlib", "send", "127.0.0.1", "--port",
                                  str(rx.address[1]), "--job-id", "44", "--messages", "300", "--size", "1000",
                                  "--msr", "0.9", "--rate", "20M", "--epoch-ms", "10",
                                  "--report-to", f"127.0.0.1:{ctl.getsockname()[1]}", "--report-key-file", str(key_file)],
                                 capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
            assert res.returncode == 0, res.stderr[-2000:]
        got = wire.Report.decode(ctl.recv(2048), key)
        assert got.job_id == 44
    finally:
        ctl.close()
