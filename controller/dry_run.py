"""``netapprox-controller --dry-run``: the controller without a switch.

Every switch of the config becomes a P4Runtime switch served by the in-process fake server
(``controller/p4runtime/fake_server.py``, one per switch), with the config's routes, class rules and job sources,
the config's P4Info when that file exists and the shipped one (``fake_server.SHIPPED_P4INFO``) otherwise. The
epoch loop is the controller's own (``Runtime``): it ingests the reports hosts send to the report port, or a
recorded stream (``--replay FILE``: JSON lines ``{"t": seconds, "src": "10.0.0.1", "report": "<hex datagram>"}``,
``.gz`` too; the format of tests/controller/fixtures/reports-*.jsonl), and ``format_epoch`` /
``format_arrivals`` say what each epoch, and each decision taken as reports arrived between epochs, decided and
wrote.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import tempfile
from pathlib import Path
from typing import Iterator, Mapping

from netapprox.controller.config import ControllerConfig, SwitchConfig
from netapprox.controller.errors import ConfigError
from netapprox.controller.model import WriteSummary
from netapprox.controller.p4runtime.fake_server import SHIPPED_P4INFO, FakeP4RuntimeServer
from netapprox.controller.policy import JobChange
from netapprox.controller.runtime import EpochResult

BMV2_JSON_PLACEHOLDER = b'{"program": "netapprox dry run: no switch loads this"}'

# the p4runtime options that describe the pipeline's queues; the connection options are the fake server's
_KEPT_OPTIONS = ("ports", "buffer_packets", "approx_buffer_unit")


class FakeSwitches:
    """One fake P4Runtime server per switch of ``config``; ``config`` (the attribute) points every switch at
    its server. Close it when done (stops the servers, removes the placeholder pipeline file)."""

    def __init__(self, config: ControllerConfig) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="netapprox-dry-run-")
        placeholder = Path(self._tmp.name) / "bmv2.json"
        placeholder.write_bytes(BMV2_JSON_PLACEHOLDER)
        self.servers: dict[str, FakeP4RuntimeServer] = {}
        switches = []
        try:
            for sc in config.switches:
                server = FakeP4RuntimeServer().start()
                self.servers[sc.name] = server
                own = sc.options if sc.kind == "p4runtime" else {}
                p4info = own.get("p4info")
                options = {"address": server.address, "device_id": server.device_id, "target": "bmv2",
                           "p4info": str(p4info if p4info and Path(p4info).exists() else SHIPPED_P4INFO),
                           "bmv2_json": str(placeholder), "check_bmv2_version": False,
                           **{k: own[k] for k in _KEPT_OPTIONS if k in own}}
                switches.append(SwitchConfig(name=sc.name, kind="p4runtime", options=options, routes=sc.routes,
                                             class_rules=sc.class_rules, job_sources=sc.job_sources))
        except BaseException:
            self.close()
            raise
        self.config = dataclasses.replace(config, switches=tuple(switches))

    def describe(self) -> str:
        return ", ".join(f"{name} at {server.address}" for name, server in self.servers.items())

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()
        self._tmp.cleanup()

    def __enter__(self) -> "FakeSwitches":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_recorded_reports(path: str | Path) -> list[tuple[float, str, bytes]]:
    """(time, source address, datagram) of a recorded report stream, oldest first; ``ConfigError`` naming the
    line for a malformed one."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"--replay: cannot read {str(path)!r}: {e.strerror}") from None
    text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8", "replace")
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append((float(row["t"]), str(row["src"]), bytes.fromhex(row["report"])))
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"--replay: {path}:{n}: expected {{\"t\", \"src\", \"report\"}}: {e}") from None
    out.sort(key=lambda r: r[0])
    return out


def replay_epochs(stream: list[tuple[float, str, bytes]], epoch_s: float) -> Iterator[tuple[float, list]]:
    """The stream cut into epochs of ``epoch_s`` on its own clock: (epoch end, the reports before it), up to
    the epoch after the last report."""
    i, k = 0, 1
    while i < len(stream):
        now = k * epoch_s
        batch = []
        while i < len(stream) and stream[i][0] < now:
            batch.append(stream[i])
            i += 1
        yield now, batch
        k += 1


def format_epoch(result: EpochResult, t0: float = 0.0) -> str | None:
    """One line (plus one per job decision) on an epoch that had reports, decisions or writes; None for an
    idle one. ``t0``: the time shown as 0."""
    writes = {n: w for n, w in result.writes.items() if w.writes}
    if not (result.reports or result.changes or writes or result.errors or result.plan.tuning):
        return None
    head = (f"epoch {result.epoch} t={result.now - t0:.6g}s: {len(result.reports)} report(s), "
            f"{len(result.assignments)} job(s) placed")
    head += _writes(writes)
    if result.errors:
        head += "; " + ", ".join(f"{n} {e}" for n, e in result.errors.items())
    lines = [head, *(_change(c) for c in result.changes)]
    for t in result.plan.tuning:
        lines.append(f"  tuning: {t.as_log()}")
    return "\n".join(lines)


def format_arrivals(epoch: int, changes: tuple, writes: Mapping[str, WriteSummary]) -> str | None:
    """Decisions taken between epochs, as reports arrived (``Runtime.on_arrivals``); None when every one of
    them only held a job where it was."""
    moved = [c for c in changes if c.reason != "held"]
    if not moved:
        return None
    head = f"after epoch {epoch}, on arrival" + _writes(writes)
    return "\n".join([head, *(_change(c) for c in moved)])


def _writes(writes: Mapping[str, WriteSummary]) -> str:
    done = {n: w for n, w in writes.items() if w.writes}
    return ("; writes " + ", ".join(f"{n} +{w.inserted} ~{w.modified} -{w.deleted}" for n, w in done.items())
            if done else "")


def _change(c: JobChange) -> str:
    where = {"new": f"queue {c.new_qid}", "expired": f"left queue {c.old_qid}", "held": f"stays in queue {c.old_qid}"}.get(
        c.reason, f"queue {c.old_qid} -> {c.new_qid}")
    why = "" if c.tlr is None else f" (TLR {c.tlr:.3f}" + ("" if c.loss is None else f", loss {c.loss:.3f}") + ")"
    return f"  job {c.job_id}: {c.reason}, {where}{why}"
