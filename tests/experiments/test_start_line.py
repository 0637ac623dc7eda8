"""The trial's start line written once every program is ready (experiments.hostprog ``--start-at @FILE+OFFSET``,
experiments.emulated ``open_start_line``): no program starts before the line or its offset, a program that dies
before the line does not hold it, and bad input is one line."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading

import pytest

from netapprox.experiments import emulated
from netapprox.experiments.hostprog import (StartFile, add_start_at, await_start_file, ready_marks, start_line,
                                            write_start)
from netapprox.topo.testbed import Proc

WAITER = """
import json, sys, time
from netapprox.experiments.hostprog import start_line, wait_for_start
late = wait_for_start(start_line(sys.argv[1]))
print(json.dumps({"started": time.time(), "late": late}))
"""


def test_start_at_takes_an_instant_or_a_start_file():
    assert start_line("1700000000.25") == 1700000000.25
    assert start_line("@/tmp/trial/start+0.2") == StartFile("/tmp/trial/start", 0.2)
    assert start_line("@/tmp/a+b/start+0.0") == StartFile("/tmp/a+b/start", 0.0)
    for bad in ("soon", "@/tmp/start", "@+0.1", "@/tmp/start+x"):
        with pytest.raises(argparse.ArgumentTypeError) as err:
            start_line(bad)
        assert "\n" not in str(err.value) and repr(bad) in str(err.value)


def test_a_bad_start_at_is_one_line_and_exit_status_2(capsys):
    parser = argparse.ArgumentParser(prog="prog")
    add_start_at(parser)
    with pytest.raises(SystemExit) as err:
        parser.parse_args(["--start-at", "@/tmp/start"])
    assert err.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("prog: error: argument --start-at")


def test_a_start_file_never_written_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="no start line written") as err:
        await_start_file(StartFile(str(tmp_path / "start"), 0.0), timeout=0.05)
    assert "\n" not in str(err.value)
    assert len(ready_marks(tmp_path / "start")) == 1  # it said it was at the line


def test_the_line_opens_once_every_program_is_ready_and_none_starts_before_it(tmp_path):
    """Three programs wait on one start file (one with an offset), one exits before the line: the harness opens
    the line once the three marked themselves ready, and each starts no earlier than the line plus its offset."""
    start = tmp_path / "start"
    offsets = (0.0, 0.0, 0.05)
    procs = [Proc(subprocess.Popen([sys.executable, "-c", WAITER, f"@{start}+{o!r}"], stdout=subprocess.PIPE,
                                   text=True), f"w{i}", tmp_path / f"w{i}.log") for i, o in enumerate(offsets)]
    procs.append(Proc(subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]), "dead", tmp_path / "d.log"))
    opened: list[float] = []
    t = threading.Thread(target=lambda: opened.append(emulated.open_start_line(start, procs)), daemon=True)
    t.start()
    t.join(emulated.START_READY_TIMEOUT_S / 2)  # the dead program did not hold the line to the timeout
    assert opened, "the start line never opened"
    assert len(ready_marks(start)) == 3
    assert float(start.read_text()) == opened[0]
    for p, off in zip(procs, offsets):
        out, _ = p.popen.communicate(timeout=30)
        got = json.loads(out)
        assert got["started"] >= opened[0] + off
    assert procs[-1].popen.wait(timeout=30) == 3


def test_writing_the_start_replaces_the_file_whole(tmp_path):
    start = tmp_path / "start"
    write_start(start, 123.5)
    write_start(start, 456.25)
    assert start.read_text() == "456.25"
    assert [p.name for p in tmp_path.iterdir()] == ["start"]
