"""What every program run on an emulated host shares: its address arguments and the trial's start line.

A trial starts all its senders, background sources and flow clients *together*: the harness launches each
program with ``--start-at`` and the program does its start-up work (imports, building the job) before waiting
for the trial's start line. Without it, programs would start one process start-up (~0.3 s of CPU on two shared
cores) after another, and "all at once" patterns such as all-to-all and incast would not overlap. The line is
either a ``time.time()`` instant given at launch (``--start-at WALL``) or a file the harness writes once every
program is ready (``--start-at @FILE+OFFSET``: the program creates ``FILE.<token>.ready`` when it reaches the line,
then waits for FILE to hold the instant, and starts OFFSET seconds after it). Every emulated host shares one
kernel clock, so wall-clock instants mean the same everywhere. A program that reaches the line late starts at
once and records how late it was.
"""
from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple, Sequence


def address(text: str, default_port: int) -> tuple[str, int]:
    """``"HOST"`` or ``"HOST:PORT"`` -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        return text, default_port
    try:
        return host, int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST or HOST:PORT") from None


class StartFile(NamedTuple):
    """``--start-at @FILE+OFFSET``: the start line is the instant the harness writes to ``path``, plus ``offset``."""

    path: str
    offset: float


def start_line(text: str) -> float | StartFile:
    """``--start-at``'s value: ``WALL`` (a ``time.time()`` instant) or ``@FILE+OFFSET`` (:class:`StartFile`)."""
    if text.startswith("@"):
        path, sep, offset = text[1:].rpartition("+")
        try:
            if sep and path:
                return StartFile(path, float(offset))
        except ValueError:
            pass
        raise argparse.ArgumentTypeError(f"{text!r}: expected @FILE+OFFSET (seconds after the instant FILE holds)")
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a time.time() instant or @FILE+OFFSET") from None


def add_start_at(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--start-at", type=start_line, default=None, metavar="WALL|@FILE+OFFSET",
                        help="wait until this time.time() instant before starting (the trial's start line), or "
                             "until OFFSET s after the instant the harness writes to FILE once every program is ready")


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


def ready_marks(start_file: str | Path) -> list[Path]:
    """The ready marks of the programs waiting on ``start_file`` (``FILE.<token>.ready``)."""
    path = Path(start_file)
    return sorted(path.parent.glob(f"{path.name}.*.ready"))


def write_start(start_file: str | Path, instant: float) -> None:
    """Open the start line: write ``instant`` to ``start_file`` whole (a rename), never half a number."""
    path = Path(start_file)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(repr(instant))
    os.replace(tmp, path)


def await_start_file(line: StartFile, timeout: float = 300.0, poll_s: float = 0.002) -> float:
    """Mark this program ready at ``line`` and poll every ``poll_s`` until the harness has written the instant;
    returns it plus the offset (one line after ``timeout`` s)."""
    Path(f"{line.path}.{os.getpid()}-{uuid.uuid4().hex[:8]}.ready").write_bytes(b"")
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = Path(line.path).read_text()
        except FileNotFoundError:
            text = ""
        if text:
            return float(text) + line.offset
        if time.monotonic() > deadline:
            raise SystemExit(f"--start-at @{line.path}: no start line written after {timeout:g} s")
        time.sleep(poll_s)


def wait_for_start(start_at: float | StartFile | None) -> float:
    """Sleep until ``start_at`` (wall clock, or :class:`StartFile`; None: now). Returns how late the program
    reached the line (s)."""
    if start_at is None:
        return 0.0
    if isinstance(start_at, StartFile):
        start_at = await_start_file(start_at)
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
