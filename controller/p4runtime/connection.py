"""``SwitchConnection``: one P4Runtime switch's connection, arbitration and pipeline, in one place.

``open`` and ``arm_pipeline`` do what production P4Runtime controllers do on every (re)connect (ONOS, Stratum's
tests, finsy): the session (channel, StreamChannel, arbitration); as primary, the pipeline's cookie
(GetForwardingPipelineConfig, COOKIE_ONLY) and the pipeline pushed (VERIFY_AND_COMMIT) only when it differs from
ours (a replica that is a backup does neither until the switch makes it primary). ``reconcile`` then makes
what the switch holds the installed copy of every table (nothing after a push: the tables are empty), so a
controller restart or a lost connection writes only the difference and keeps every route, entry and counter.
What writes through the connection (``write_queue.WriteQueue``), the traffic manager and the counters are
objects of their own (``driver.P4RuntimeDriver`` puts them together).
"""
from __future__ import annotations

import collections
import hashlib
import logging
import struct
from pathlib import Path
from typing import Iterable

from netapprox.controller.p4runtime.protos import p4runtime_pb2

from netapprox.controller.errors import PipelineError
from netapprox.controller.p4runtime.mirror import TableMirror
from netapprox.controller.p4runtime.options import P4RuntimeOptions
from netapprox.controller.p4runtime.p4info import P4Info
from netapprox.controller.p4runtime.session import P4RuntimeSession

log = logging.getLogger("netapprox.controller.p4runtime")


def build_tofino_device_config(prog_name: str, tofino_bin: bytes, context_json: bytes) -> bytes:
    """PI/Stratum-bf packing: each of program name, tofino.bin and context.json prefixed by its length
    (little-endian int32). Stratum-bfrt wants its BfPipelineConfig instead: pass it as ``device_config``."""
    name = prog_name.encode()
    return b"".join(struct.pack("<i", len(part)) + part for part in (name, tofino_bin, context_json))


class SwitchConnection:
    """The session with one switch, its pipeline and the reconciliation of its tables."""

    def __init__(self, name: str, options: P4RuntimeOptions, p4info: P4Info,
                 session: P4RuntimeSession | None = None) -> None:
        self.name = name
        self.options = options
        self.p4info = p4info
        self.session = session or P4RuntimeSession(name, options, p4info)
        self.pipeline_pushes = 0
        self.entries_read_back = 0
        """Entries found on the switch at the last connect without a pipeline push (0 after a push)."""

    def open(self) -> None:
        """Connect and arbitrate (``session.arbitration`` says whether this controller is primary). Raises
        SwitchUnavailable, or NotPrimaryError for a single controller that is not primary."""
        self.session.open()

    def close(self) -> None:
        self.session.close()

    @property
    def primary(self) -> bool:
        """The switch accepts this controller's Writes (the last arbitration update said OK)."""
        return self.session.arbitration.primary

    def arm_pipeline(self) -> bool:
        """As primary: push the pipeline unless the switch already runs it (same cookie). True when it was pushed
        (the switch's tables and counters are then empty). With ``push_pipeline`` off, never push; a switch
        without any pipeline is then an error (retried by the runtime). Raises PipelineError."""
        current = self.session.pipeline_cookie()
        if not self.options.push_pipeline:
            if current is None:
                raise PipelineError(f"switch {self.name!r}: runs no forwarding pipeline and push_pipeline is false "
                                    "(load the program with the tool that owns the pipeline, or set push_pipeline)")
            return False
        config = self.pipeline_config()
        if current == config.cookie.cookie:
            log.info("switch %r: runs our pipeline already (cookie %#x): not pushed", self.name, current)
            return False
        self.session.set_pipeline(config)
        self.pipeline_pushes += 1
        log.info("switch %r: pipeline pushed (cookie %#x; the switch had %s)", self.name, config.cookie.cookie,
                 f"{current:#x}" if current is not None else "none")
        return True

    def pipeline_config(self) -> p4runtime_pb2.ForwardingPipelineConfig:
        """Our pipeline: the P4Info, the target's device config, and a cookie hashing both."""
        opts = self.options
        try:
            if opts.target == "bmv2":
                device = Path(opts.bmv2_json).read_bytes()
            elif opts.device_config:
                device = Path(opts.device_config).read_bytes()
            elif opts.tofino_bin and opts.tofino_context:
                device = build_tofino_device_config(opts.prog_name, Path(opts.tofino_bin).read_bytes(),
                                                    Path(opts.tofino_context).read_bytes())
            else:
                raise PipelineError(f"switch {self.name!r}: target tofino needs the option device_config, or "
                                    "tofino_bin and tofino_context (from `make p4-tna`)")
        except FileNotFoundError as e:
            raise PipelineError(f"switch {self.name!r}: pipeline artifact {e.filename!r} not found "
                                "(run `make p4`, or fix the switch options)") from None
        cookie = int.from_bytes(hashlib.sha256(self.p4info.message.SerializeToString(deterministic=True)
                                               + device).digest()[:8], "big")
        return p4runtime_pb2.ForwardingPipelineConfig(p4info=self.p4info.message, p4_device_config=device,
                                                      cookie=p4runtime_pb2.ForwardingPipelineConfig.Cookie(
                                                          cookie=cookie))

    def reconcile(self, pushed: bool, tables: Iterable[TableMirror],
                  handed_over: TableMirror) -> list[p4runtime_pb2.TableEntry]:
        """Take the switch's entries as the installed copy of every table in ``tables`` (the next write diffs
        against them); after a push, none. The entries of ``handed_over`` are returned instead, for the object
        that owns that table's installed copy."""
        if pushed:
            for table in tables:
                if table is not handed_over:
                    table.adopt([])
            self.entries_read_back = 0
            return []
        by_table: dict[int, list] = collections.defaultdict(list)
        entries = self.session.read_table_entries()
        for entry in entries:
            by_table[entry.table_id].append(entry)
        out: list[p4runtime_pb2.TableEntry] = []
        for table in tables:
            found = by_table.pop(table.info.id, [])
            if table is handed_over:
                out = found
            else:
                table.adopt(found)
        if by_table:
            log.warning("switch %r: %d entries in tables this controller does not program, left alone", self.name,
                        sum(map(len, by_table.values())))
        self.entries_read_back = len(entries)
        log.info("switch %r: %d entries read back to reconcile", self.name, len(entries))
        return out
