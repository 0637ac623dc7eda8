"""BMv2 per-queue buffers through the Thrift runtime CLI (P4Runtime has no queue configuration entity).

BMv2's ``simple_switch`` serves priority queues from the highest ``standard_metadata.priority`` down
(queueing.h, ``QueueingLogicPriRL``: priority 0 is the lowest), while logical queue 0 is the highest. So
BMv2 priority = 7 - logical queue (``bmv2_priority``); the P4 program sets ``priority`` that way, see
docs/dataplane.md. Capacities are in packets: ``set_queue_depth <pkts> <port> <priority>``.

We drive ``simple_switch_CLI --thrift-port N`` with the commands on stdin (no ``thrift`` Python module is
needed in the controller's venv; the CLI brings its own).
"""
from __future__ import annotations

import shutil
import subprocess
from typing import Iterable

from controller.errors import QueueConfigError
from controller.model import NUM_QUEUES, queue_buffer_packets


def bmv2_priority(qid: int) -> int:
    """BMv2 ``standard_metadata.priority`` of logical queue ``qid`` (0 = highest logical = BMv2 7)."""
    return NUM_QUEUES - 1 - qid


def queue_depth_commands(ports: Iterable[int], total_packets: int) -> list[str]:
    """``set_queue_depth`` commands: queue k >= 1 gets 8 - k packets, queue 0 the rest of ``total_packets``."""
    commands = []
    for port in sorted(set(ports)):
        for qid in range(NUM_QUEUES):
            commands.append(f"set_queue_depth {queue_buffer_packets(qid, total_packets)} {port} {bmv2_priority(qid)}")
    return commands


def run_cli(commands: list[str], thrift_port: int, *, cli: str = "simple_switch_CLI", timeout: float = 20.0) -> str:
    """Run ``commands`` through the BMv2 CLI; raise ``QueueConfigError`` with the CLI's words on failure."""
    exe = shutil.which(cli)
    if exe is None:
        raise QueueConfigError(f"{cli!r} not found on PATH; it comes with BMv2 built with Thrift "
                               "(or set the switch option thrift_port to none to skip queue sizing)")
    argv = [exe, "--thrift-port", str(thrift_port)]
    try:
        proc = subprocess.run(argv, input="\n".join(commands) + "\n", capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise QueueConfigError(f"{' '.join(argv)} did not finish within {timeout}s") from None
    out = proc.stdout + proc.stderr
    bad = [line for line in out.splitlines()
           if any(w in line for w in ("Error", "Invalid", "Could not connect", "Traceback"))]
    if proc.returncode != 0 or bad:
        raise QueueConfigError(f"{' '.join(argv)} failed (exit {proc.returncode}): "
                               + ("; ".join(bad[:3]) or out.strip()[-300:]))
    return out
