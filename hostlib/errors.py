"""hostlib's runtime errors: one hierarchy under ``AtpError`` (configuration mistakes are ``config.ConfigError``)."""
from __future__ import annotations

from typing import Any


class AtpError(RuntimeError):
    """Base class of hostlib's runtime errors. Errors raised while serving several jobs carry the jobs
    that did finish in ``partial`` (``api.ReceiveResult``s)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.partial: list[Any] = []


class BindError(AtpError):
    """A socket could not be bound to the address asked for (the port is in use, the address is not this
    host's): ``cannot bind UDP HOST:PORT: REASON``."""


class JobFailedError(AtpError):
    """The sender gave up on the job; the message says why."""


class PeerUnreachableError(JobFailedError):
    """The destination answered the job's first datagrams with ICMP port unreachable (nothing listens on that
    UDP port): ``cannot reach UDP HOST:PORT: Connection refused``."""


class ReceiveTimeout(AtpError, TimeoutError):
    """No job finished within the timeout."""


class JobAbandonedError(AtpError):
    """The job being received went silent before its FIN."""


class JobRejectedError(AtpError):
    """The receiver refused a job (malformed announce, or over ``max_messages``)."""


class ExchangeError(AtpError):
    """An ``exchange.AtpExchange`` job could not be sent or received; the message says which and why."""
