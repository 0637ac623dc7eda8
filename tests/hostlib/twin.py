"""The Python and native cores in lockstep: every call goes to both, every output must be equal.

``TwinSender``/``TwinReceiver`` have the sans-I/O interface of one core; each call runs on the reference
(hostlib/sender.py, hostlib/receiver.py) and on the native core (hostlib/native/) and raises
``Divergence`` at the first output that differs (datagrams byte for byte, addresses, timer deadlines, events
and summaries field for field, exact floats). Exceptions must match too (type and message).
"""
from __future__ import annotations

import dataclasses
import os
import random
from typing import Any

from netapprox.hostlib import core


class Divergence(AssertionError):
    """The two implementations disagreed."""


def comparable(value: Any) -> Any:
    """A value that compares exactly: dataclasses (events, summaries) and named tuples (reports) as (type name,
    fields)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, tuple((f.name, comparable(getattr(value, f.name)))
                                            for f in dataclasses.fields(value)))
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return (type(value).__name__, tuple((f, comparable(getattr(value, f))) for f in value._fields))
    if isinstance(value, (list, tuple)):
        return type(value)(comparable(v) for v in value)
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()}
    if isinstance(value, float):
        return ("float", value.hex())
    return value


class _Twin:
    def __init__(self, py: Any, native: Any, log: list | None) -> None:
        self.py = py
        self.native = native
        self.log = log if log is not None else []
        self.calls = 0

    def _both(self, name: str, *args: Any, **kw: Any) -> Any:
        self.calls += 1
        results = []
        for impl in (self.py, self.native):
            try:
                results.append(("ok", getattr(impl, name)(*args, **kw)))
            except Exception as err:  # compared below
                results.append(("raised", f"{type(err).__name__}: {err}"))
        (kp, vp), (kn, vn) = results
        if (kp, comparable(vp)) != (kn, comparable(vn)):
            raise Divergence(f"call {self.calls} {name}{args!r}: python gave {kp} {vp!r}\n  native gave {kn} {vn!r}\n"
                             f"  last calls: {self.log[-5:]!r}")
        self.log.append((name, args))
        if kp == "raised":
            raise RuntimeError(vp)
        return vp

    def compare(self, *names: str) -> None:
        for name in names:
            a, b = getattr(self.py, name), getattr(self.native, name)
            if comparable(a) != comparable(b):
                raise Divergence(f"attribute {name}: python {a!r}, native {b!r}")

    def datagrams_to_send(self, now):
        return self._both("datagrams_to_send", now)

    def get_timer(self):
        return self._both("get_timer")

    def handle_timer(self, now):
        return self._both("handle_timer", now)

    def next_event(self):
        return self._both("next_event")


class TwinSender(_Twin):
    def __init__(self, job, *, config, peer, now, isn=None, log=None, address_token=None):
        isn = random.randrange(1 << 31) if isn is None else isn  # both draw the same first sequence number
        kw = {"config": config, "peer": peer, "now": now, "isn": isn, "address_token": address_token}
        super().__init__(core.PyAtpSender(job, **kw), core.NativeAtpSender(job, **kw), log)

    def receive_datagram(self, data, addr, now):
        return self._both("receive_datagram", data, addr, now)

    def set_msr(self, group_id, msr, now):
        return self._both("set_msr", group_id, msr, now)

    def tlr(self, group_id):
        return self._both("tlr", group_id)

    def check_state(self):
        self.compare("state", "summary", "failure", "packets_sent", "retransmissions", "datagrams_ignored", "epoch",
                     "done", "start_time", "packets_surplus", "rejected", "new_token")
        for name in ("reordering", "reorder_window", "spurious_losses", "late_acks", "largest_acked", "missed_answers"):
            a, b = getattr(self.py.recovery, name), getattr(self.native.recovery, name)
            if a != b:
                raise Divergence(f"recovery.{name}: python {a}, native {b}")
        if self.py.recovery.answer_loss() != self.native.recovery.answer_loss:
            raise Divergence(f"recovery.answer_loss: python {self.py.recovery.answer_loss()}, "
                             f"native {self.native.recovery.answer_loss}")

    @property
    def done(self):
        self.check_state()
        return self.py.done

    @property
    def state(self):
        return self.py.state

    @property
    def summary(self):
        self.check_state()
        return self.py.summary

    @property
    def failure(self):
        return self.py.failure


class TwinReceiver(_Twin):
    def __init__(self, *, config, now=0.0, accept_jobs=None, collect_messages=False, token_secret=None, log=None):
        kw = {"config": config, "now": now, "accept_jobs": accept_jobs, "collect_messages": collect_messages,
              "token_secret": token_secret or os.urandom(32)}  # the same admission tokens on both sides
        super().__init__(core.PyAtpReceiver(**kw), core.NativeAtpReceiver(**kw), log)

    def stats(self):
        return self._both("stats")

    @property
    def admission(self):
        self.compare("admission")
        return self.py.admission

    @property
    def tokens(self):
        return self.py.tokens

    def receive_datagram(self, data, addr, now, *, ce=False):
        return self._both("receive_datagram", data, addr, now, ce=ce)

    def take_messages(self, job_id):
        return self._both("take_messages", job_id)

    @property
    def collect_messages(self):
        self.compare("collect_messages")
        return self.py.collect_messages

    @collect_messages.setter
    def collect_messages(self, value):
        self.py.collect_messages = self.native.collect_messages = value

    def check_state(self):
        self.compare("buffered", "datagrams", "malformed", "dropped", "jobs_seen", "admission", "grant_budget",
                     "grant_rate_bps")
        for name in ("used", "pool", "peak", "limit", "guarantee", "pool_limit", "reserve", "out"):
            a, b = getattr(self.py.memory, name), getattr(self.native.memory, name)
            if a != b:
                raise Divergence(f"memory.{name}: python {a}, native {b}")
        if list(self.py._finished) != list(self.native._finished):
            raise Divergence(f"finished: python {list(self.py._finished)}, native {list(self.native._finished)}")
        if dict(self.py.slots.per_source) != dict(self.native.slots.per_source):
            raise Divergence(f"slots: python {self.py.slots.per_source}, native {self.native.slots.per_source}")
        py_jobs, nat_jobs = self.py.jobs, self.native.jobs
        if list(py_jobs) != list(nat_jobs):
            raise Divergence(f"jobs: python {list(py_jobs)}, native {list(nat_jobs)}")
        for job_id, pj in py_jobs.items():
            nj = nat_jobs[job_id]
            for name in ("packets", "duplicates", "rejected", "peer", "charged", "finished_at", "progressed",
                         "progress_at", "manifest", "validated"):
                if comparable(getattr(pj, name)) != comparable(getattr(nj, name)):
                    raise Divergence(f"job {job_id} {name}: python {getattr(pj, name)!r}, native {getattr(nj, name)!r}")

    @property
    def jobs(self):
        self.check_state()
        return self.py.jobs

    @property
    def buffered(self):
        return self.py.buffered
