"""Every entry point's ``--help``: on stdout, exit status 0, every option's default stated (or none to state: a
flag, a repeatable or required option), subcommands listed. Parsers are caught as ``main(["--help"])`` builds
them, so a new option without its default in the help text fails here."""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from netapprox.hostlib.checks import states_default

MODULES = ["hostlib", "controller", "topo.demo", "topo.session", "experiments",
           "experiments.report", "bench", "ml.example", "ml.replay", "analytics"]


def _parsers(monkeypatch, module: str, argv: list[str]) -> list[argparse.ArgumentParser]:
    """The parsers (and subparsers) ``python -m netapprox.<module> <argv> --help`` builds."""
    seen: list[argparse.ArgumentParser] = []
    real = argparse.ArgumentParser.parse_known_args

    def spy(self, args=None, namespace=None):
        seen.append(self)
        return real(self, args, namespace)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", spy)
    main = importlib.import_module(f"netapprox.{module}.__main__" if module in ("hostlib", "controller", "bench",
                                   "experiments", "analytics") else f"netapprox.{module}").main
    with pytest.raises(SystemExit) as done:
        code = main([*argv, "--help"])
        raise SystemExit(code)
    assert done.value.code in (0, None)
    out = list(seen)
    for p in seen:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                out.extend(a.choices.values())
    return out


@pytest.mark.parametrize("module, argv", [
    ("hostlib", ["send"]), ("hostlib", ["recv"]), ("controller", []), ("topo.demo", []), ("topo.session", []),
    ("experiments", []), ("experiments", ["alltoall"]), ("experiments", ["sim"]), ("experiments.report", []),
    ("bench", []), ("ml.example", []), ("ml.replay", []), ("analytics", []),
])
def test_every_option_states_its_default(monkeypatch, capsys, module, argv):
    parsers = _parsers(monkeypatch, module, argv)
    assert parsers, f"{module}: no argparse parser seen"
    missing = [f"{p.prog} {'/'.join(a.option_strings)}" for p in parsers for a in p._actions
               if not states_default(a) and "default" not in (p._get_formatter()._get_help_string(a) or "").lower()]
    assert not missing, "--help does not state the default of: " + ", ".join(missing)
    bare = [f"{p.prog} {'/'.join(a.option_strings)}" for p in parsers for a in p._actions
            if a.option_strings and not a.help]
    assert not bare, "options without help text: " + ", ".join(bare)


@pytest.mark.parametrize("module", MODULES)
def test_help_goes_to_stdout_with_exit_status_0(module):
    res = subprocess.run([sys.executable, "-m", f"netapprox.{module}", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.strip() and not res.stderr.strip(), (res.returncode, res.stderr)


def test_hostlib_and_experiments_help_list_their_commands():
    out = subprocess.run([sys.executable, "-m", "netapprox.hostlib", "--help"], capture_output=True, text=True,
                         timeout=60).stdout
    assert "send" in out and "recv" in out
    out = subprocess.run([sys.executable, "-m", "netapprox.experiments", "--help"], capture_output=True,
                         text=True, timeout=60).stdout
    assert " sim " in out or "\n  sim" in out or "sim," in out, out
