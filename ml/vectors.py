"""Gradient vectors as ATP jobs: a float32 vector cut into one-packet segments (hostlib's range-indexed float
packets, ``wire.encode_float_range``), each segment in the group its gradient policy chose, and the vector
rebuilt from what arrived. numpy only; ``hostlib.exchange.AtpExchange`` carries the jobs."""
from __future__ import annotations

import struct

import numpy as np

from netapprox.hostlib.config import ConfigError, JobSpec, Message, Tags
from netapprox.hostlib.exchange import ReceivedJob

RANGE = struct.Struct("!II")
"""A float packet's header: ``first_index:u32, count:u32`` (then ``count`` big-endian float32 values)."""


def vector_job(job_id: int, values: np.ndarray, *, group_of_segment: np.ndarray | None, group_msr: dict[int, float],
               floats_per_packet: int, tags: Tags | None = None, msr: float = 1.0, rotate: int = 0) -> JobSpec:
    """A float-vector job whose segment ``i`` (``floats_per_packet`` values, one packet) is in group
    ``group_of_segment[i]``; payloads are hostlib's range-indexed float packets
    (``wire.encode_float_range``). Messages are ordered by group, most demanding MSR first, so every group's
    message ids are one contiguous range (a short job announce). ``rotate`` (e.g. the iteration) shifts where
    each group's segments start, so the messages a sender that stops at its MSR leaves unsent are not the same
    values every time."""
    vals = np.ascontiguousarray(values, dtype=np.float32).ravel()
    n = len(vals)
    if n == 0:
        raise ConfigError("a vector job needs at least one value")
    segs = -(-n // floats_per_packet)
    groups = np.zeros(segs, dtype=np.uint16) if group_of_segment is None else np.asarray(group_of_segment)
    if len(groups) != segs:
        raise ConfigError(f"{len(groups)} group ids for {segs} segments")
    big = vals.astype(">f4")
    shift = int(rotate * 0.6180339887 * segs) % segs if rotate else 0
    order = sorted(range(segs), key=lambda s: (-group_msr.get(int(groups[s]), msr), int(groups[s]),
                                               (s - shift) % segs))
    msgs = []
    for s in order:
        lo = s * floats_per_packet
        hi = min(n, lo + floats_per_packet)
        msgs.append(Message(RANGE.pack(lo, hi - lo) + big[lo:hi].tobytes(), int(groups[s])))
    present = {int(g) for g in np.unique(groups)}
    return JobSpec(job_id=job_id, messages=tuple(msgs), msr=msr,
                   group_msr={g: m for g, m in group_msr.items() if g in present}, tags=tags, vector_len=n)


def received_vector(job: ReceivedJob, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The float32 vector of ``length`` values a received job carried, lost ranges zero-filled, and a boolean
    mask of the values that arrived. Ranges outside ``length`` are ignored."""
    values = np.zeros(length, dtype=np.float32)
    have = np.zeros(length, dtype=bool)
    for payload in job.messages.values():
        if len(payload) < RANGE.size:
            continue
        first, count = RANGE.unpack_from(payload)
        if len(payload) != RANGE.size + 4 * count or first >= length:
            continue
        stop = min(length, first + count)
        values[first:stop] = np.frombuffer(payload, dtype=">f4", count=stop - first, offset=RANGE.size)
        have[first:stop] = True
    return values, have
