"""Events the sans-I/O cores hand to their owner through ``next_event()``."""
from __future__ import annotations

import dataclasses
from typing import Any

from netapprox.hostlib import wire


class Event:
    """Base class of every hostlib event."""


# --- sender ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ReportReady(Event):
    """An epoch ended: send this REPORT to the controller (if one is configured)."""

    report: wire.Report


@dataclasses.dataclass(frozen=True)
class EpochEnded(Event):
    """One line of the sender timeline: per group, at the end of epoch ``epoch``."""

    epoch: int
    time: float
    group_id: int
    tlr: float
    """TLR for the next epoch (eq. 1, or 1 - MSR in ``fixtlr`` mode)."""
    rate_bps: float
    """Sending rate for the next epoch."""
    loss: float
    """ρ of the ended epoch, this group's packets: 1 - acked/sent (0 when nothing was sent)."""
    sent: int
    acked: int
    queues: dict[int, int]
    """Queue byte seen on this epoch's ACKs -> number of ACKs (0xFF: no switch stamped it)."""
    ece: int = 0
    """ACKs in this epoch whose DATA packet arrived CE-marked (informational; rate control uses loss)."""

    def as_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "time": round(self.time, 6), "group": self.group_id,
                "tlr": round(self.tlr, 6), "rate_bps": round(self.rate_bps), "loss": round(self.loss, 6),
                "sent": self.sent, "acked": self.acked, "queues": {str(k): v for k, v in self.queues.items()},
                "ece": self.ece}


@dataclasses.dataclass(frozen=True)
class MessageAcked(Event):
    """Every packet of a message has been acknowledged: the receiver has it."""

    msg_id: int
    group_id: int


@dataclasses.dataclass(frozen=True)
class JobCompleted(Event):
    """The job met its completion policy and the close handshake ended. ``summary`` is final."""

    summary: Any  # hostlib.sender.SendSummary


@dataclasses.dataclass(frozen=True)
class JobFailed(Event):
    """The sender gave up (``reason`` says why); nothing more will be sent."""

    reason: str


# --- receiver -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MessageReceived(Event):
    """A whole message arrived (for MSR = 1 groups: in msg_id order within the group)."""

    job_id: int
    msg_id: int
    group_id: int
    data: bytes


@dataclasses.dataclass(frozen=True)
class JobFinished(Event):
    """The sender closed the job (FIN) and the receiver answered with DONE."""

    result: Any  # hostlib.receiver.JobResult


@dataclasses.dataclass(frozen=True)
class JobAbandoned(Event):
    """A job was dropped before its FIN and its state freed: ``reason`` ``"idle"`` (silent for
    ``idle_timeout_s``), ``"stalled"`` or ``"share"`` (its slot went to a new job, hostlib/admission.py)."""

    job_id: int
    delivered: int
    reason: str = "idle"


@dataclasses.dataclass(frozen=True)
class JobRejected(Event):
    """The job's announce was malformed or over this receiver's limits; its packets are now dropped."""

    job_id: int
    reason: str
