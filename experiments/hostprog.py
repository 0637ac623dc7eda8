"""What every program run on an emulated host shares: its address arguments and the trial's start line.

A trial starts all its senders, background sources and flow clients *together*: the harness launches each
program with ``--start-at WALL`` (a ``time.time()`` value a little in the future) and the program does its
start-up work (imports, building the job) before waiting for that instant. Without it, programs would start
one process start-up (~0.3 s of CPU on two shared cores) after another, and "all at once" patterns such as
all-to-all and incast would not overlap. Every emulated host shares one kernel clock, so wall-clock instants
mean the same everywhere. A program that reaches the line late starts at once and records how late it was.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Sequence


def address(text: str, default_port: int) -> tuple[str, int]:
    """``"HOST"`` or ``"HOST:PORT"`` -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        return text, default_port
    try:
        return host, int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST or HOST:PORT") from None


def add_start_at(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--start-at", type=float, default=None, metavar="WALL",
                        help="wait until this time.time() instant before starting (the trial's start line)")


def add_start_after(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--start-after", default=None, metavar="FILE", nargs="+",
                        help="start once every FILE exists (other senders' --done-file: a stage that follows others)")
    parser.add_argument("--done-file", default=None, metavar="FILE",
                        help="create FILE the moment the transfer ended, before the summary is computed and written")


def mark_done(path: str | None) -> None:
    """Create ``path`` (None: nothing): a following stage's ``--start-after`` starts on it."""
    if path is not None:
        Path(path).write_bytes(b"")


def wait_for_file(path: str | Sequence[str] | None, timeout: float = 300.0, poll_s: float = 0.001) -> None:
    """Poll every ``poll_s`` until ``path`` exists, or every path of a list (None: return at once); one line after
    ``timeout`` s."""
    if path is None:
        return
    deadline = time.monotonic() + timeout
    for one in ([path] if isinstance(path, str) else path):
        while not os.path.exists(one):
            if time.monotonic() > deadline:
                raise SystemExit(f"--start-after {one}: not there after {timeout:g} s")
            time.sleep(poll_s)


def wait_for_start(start_at: float | None) -> float:
    """Sleep until ``start_at`` (wall clock; None: now). Returns how late the program reached the line (s)."""
    if start_at is None:
        return 0.0
    delay = start_at - time.time()
    if delay > 0:
        time.sleep(delay)
        return 0.0
    return -delay


def emit_summary(out: Any, path: str | None) -> None:
    """A program's JSON summary: to ``path`` when given, else to stdout."""
    text = json.dumps(out, indent=1, default=str)
    if path:
        Path(path).write_text(text + "\n")
    else:
        print(text)
