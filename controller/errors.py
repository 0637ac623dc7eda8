"""Typed, actionable controller errors.

Every error says what failed and, where we can tell, how to fix it: P4Runtime write failures are unpacked
per update ("At index N: CODE, message", as p4runtime-shell does), unknown P4Info names come with the
closest known name ("Did you mean ...?", as finsy does), config errors name the file and the key.
This is the one error hierarchy of the control plane: every data plane's driver raises these (or
subclasses of them), so embedders catch ``ControllerError``.
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Iterable, Sequence

__all__ = [
    "ControllerError",
    "ConfigError",
    "P4InfoError",
    "WriteError",
    "P4RuntimeWriteError",
    "UpdateError",
    "NotPrimaryError",
    "PipelineError",
    "QueueConfigError",
    "SwitchUnavailable",
    "KernelSwitchError",
    "did_you_mean",
]


class ControllerError(Exception):
    """Base class of the controller's own errors."""


class ConfigError(ControllerError, ValueError):
    """The configuration (TOML file, CLI flags or a driver's options) is invalid."""


class BindError(ControllerError, OSError):
    """The report or metrics socket could not be bound (the port is in use, the address is not this host's):
    ``cannot bind UDP HOST:PORT (reports): REASON``. Command lines report it in one line, exit status 2."""


class SwitchUnavailable(ControllerError, ConnectionError):
    """A driver cannot reach its switch (connection refused or lost, switch restarted).

    Drivers raise it from ``connect``/``apply``/``read_counters``; the runtime then marks the switch down,
    reconnects with backoff and calls ``connect`` again, which must re-arm the switch (pipeline, queues,
    the last applied state)."""

    def __init__(self, switch: str, detail: str) -> None:
        super().__init__(f"switch {switch!r} unavailable: {detail}")
        self.switch = switch
        self.detail = detail


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the closest known name (matching on the last dotted component too), or ''."""
    known = list(known)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    if not close:
        short = {k.rsplit(".", 1)[-1]: k for k in known}
        hit = difflib.get_close_matches(name.rsplit(".", 1)[-1], list(short), n=1, cutoff=0.5)
        close = [short[hit[0]]] if hit else []
    return f" Did you mean {close[0]!r}?" if close else ""


class P4InfoError(ControllerError, KeyError):
    """The P4Info lacks an entity or field the controller needs (the P4 program and docs/architecture.md
    disagree)."""

    def __init__(self, kind: str, name: str, known: Iterable[str], where: str = "") -> None:
        known = sorted(known)
        where = f" in {where}" if where else ""
        self.message = f"no {kind} named {name!r}{where}.{did_you_mean(name, known)}"
        super().__init__(self.message)
        self.kind = kind
        self.name = name

    def __str__(self) -> str:
        return self.message


@dataclasses.dataclass(frozen=True)
class UpdateError:
    """One failed update of a batched Write."""

    index: int
    code: str  # google.rpc.Code name, e.g. "ALREADY_EXISTS"
    message: str
    update: str  # the update, one-line protobuf text

    def __str__(self) -> str:
        return f"At index {self.index}: {self.code}, '{self.message}'"


class WriteError(ControllerError):
    """The switch refused some updates of a write; ``errors`` lists them (the others were applied, and the
    driver's installed copy says so). The switch is up: the runtime counts the errors and carries on."""

    def __init__(self, switch: str, errors: Sequence[UpdateError], total: int, message: str) -> None:
        super().__init__(message)
        self.switch = switch
        self.errors = tuple(errors)
        self.total = total


class P4RuntimeWriteError(WriteError):
    """A batched P4Runtime Write failed for some updates (P4Runtime CONTINUE_ON_ERROR semantics), unpacked from
    the ``p4.v1.Error`` list of the gRPC status details."""

    def __init__(self, switch: str, errors: Sequence[UpdateError], total: int, grpc_message: str = "") -> None:
        errors = tuple(errors)
        lines = [f"switch {switch!r}: P4Runtime Write failed for {len(errors)} of {total} updates"
                 + (f" ({grpc_message})" if grpc_message else "")]
        lines += [f"  {e}" + (f"\n    update: {e.update}" if e.update else "") for e in errors]
        super().__init__(switch, errors, total, "\n".join(lines))


class NotPrimaryError(ControllerError):
    """Another client holds a higher election id for this device, so this controller may not write."""

    def __init__(self, switch: str, election_id: tuple[int, int], detail: str) -> None:
        super().__init__(
            f"switch {switch!r}: not primary with election id {election_id} ({detail}). "
            "Stop the other controller, or raise election_id in this switch's options.")
        self.switch = switch


class PipelineError(ControllerError):
    """SetForwardingPipelineConfig was refused, or the pipeline artifacts are missing."""


class QueueConfigError(ControllerError):
    """Per-queue buffer configuration (BMv2 Thrift CLI, Tofino BfRt) failed."""


class KernelSwitchError(ControllerError):
    """A kernel switch operation (tc, pyroute2, the eBPF stamper) failed; the message says what and how to fix."""
