"""What a trial is, whichever back end runs it: the protocols and ATP variants, the jobs, the background, the
flows, and the parameters a trial is filed under.

A figure (experiments/figures.py) lists its trials as ``TrialPlan`` values; a back end (the emulated testbed,
experiments/emulated.py, or the ns-3 world, experiments/sim/backend.py) runs one plan and returns its record
(experiments/metrics.py names the metrics). A plan is plain data: the same plan runs on either back end, is
the key of the trial cache, and travels to a worker process as it is.

Job ids are the plan's own (1, 2, ...): a back end that needs ids unique beyond one trial (the emulated
testbed's controller outlives a trial) maps them to fresh ids on the wire and reports the plan's.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from netapprox.experiments.jobs import Flow, JobWorkload

ATP_VARIANTS: dict[str, dict[str, Any]] = {
    "atp": {"mode": "adaptive", "mrdf": True},
    "atp-paper": {"mode": "paper", "mrdf": True},
    "atp-full": {"mode": "paper", "mrdf": True},
    "atp-fixprio": {"mode": "paper", "mrdf": True},
    "atp-fixtlr": {"mode": "fixtlr", "mrdf": True},
    "atp-base": {"mode": "base", "mrdf": False},
    "atp-rc": {"mode": "fixtlr", "mrdf": False},
    "atp-mrdf": {"mode": "fixtlr", "mrdf": True},
    "atp-early": {"mode": "paper", "mrdf": True, "completion": "early"},
    "atp-all-sent": {"mode": "adaptive", "mrdf": True, "completion": "all_sent"},
    "atp-s1": {"mode": "adaptive", "mrdf": False},
    "atp-s12": {"mode": "adaptive", "mrdf": False},
}
"""The ATP variants of the papers' figures, as hostlib ``AtpConfig`` knobs: ``atp`` is hostlib's default sender
(adaptive); ``atp-full`` (also ``atp-paper``) the paper's eq. 1-3 with dynamic TLR and the controller's dynamic
queue; ``atp-fixprio`` the same with the job pinned to the queue of 1 - MSR; ``atp-fixtlr`` a static TLR of
1 - MSR; Fig. 12's chain ``atp-base`` (line rate, then repairs) -> ``atp-rc`` (+ rate control) -> ``atp-mrdf``
(+ MRDF); ``atp-early`` / ``atp-all-sent`` the two completion policies; ``atp-s1`` the analytics job's sender (MRDF off: its
rows in their random id order, docs/analytics.md)."""

ATP_ABLATION: dict[str, dict[str, Any]] = {
    "atp-before": {"mode": "adaptive", "mrdf": True, "pack_messages": False, "initial_window": 16,
                   "open_admission_share": 0.0, "receiver_grants": False, "spray": False},
    "atp-rtt": {"mode": "adaptive", "mrdf": True, "open_admission_share": 0.0},
    "atp-nopack": {"mode": "adaptive", "mrdf": True, "pack_messages": False},
    "atp-iw16": {"mode": "adaptive", "mrdf": True, "initial_window": 16},
    "atp-flowhash": {"mode": "adaptive", "mrdf": True, "spray": False},
    "atp-nogrants": {"mode": "adaptive", "mrdf": True, "receiver_grants": False},
    "atp-flowhash-nogrants": {"mode": "adaptive", "mrdf": True, "spray": False, "receiver_grants": False},
    "atp-grants": {"mode": "adaptive", "mrdf": True, "receiver_grants": True},
    "atp-flowhash-grants": {"mode": "adaptive", "mrdf": True, "spray": False, "receiver_grants": True},
    "atp-window": {"mode": "adaptive", "mrdf": True, "grant_overrides_window": False},
    "atp-trim": {"mode": "adaptive", "mrdf": True, "trim": True},
    "atp-low": {"mode": "adaptive", "mrdf": True, "first_window_low": True},
    "atp-all": {"mode": "adaptive", "mrdf": True, "trim": True, "first_window_low": True},
    "atp-kmtu": {"mode": "adaptive", "mrdf": True, "approx_buffer_unit": 1},
    "atp-reorder64": {"mode": "adaptive", "mrdf": True, "reorder_threshold": 64, "adaptive_reorder": False},
    "atp-reorder3": {"mode": "adaptive", "mrdf": True, "adaptive_reorder": False},
    "atp-reorderseen": {"mode": "adaptive", "mrdf": True, "path_reorders": False},
    "atp-rank": {"mode": "adaptive", "mrdf": True, "job_rank_levels": 3, "job_rank_promote_s": 60e-6},
}
"""Issue 23's ablation, in the ns-3 world only (docs/simulation.md), each against the simulation's ATP (hostlib's
sender on a fabric that sprays approximate packets, with receiver grants: ``SimSettings.spray``,
``atp_receiver_grants``): ATP's start without each of its parts (``atp-before``: none of them, flow hashing, no
grants), the fabric without spraying, the receivers without grants (both: the previous release; ``atp-grants``
and ``atp-flowhash-grants`` name grants on whatever hostlib's default, for the testbed), grants that
the sender's window still bounds, the other receiver-side mechanisms (trimming, the first window in the
lowest queue), the paper's k-MTU approximate queues, and a loss detection that tolerates the reordering of a
spraying fabric with fixed thresholds (``atp-reorder64``: a packet is lost when one sent 64 later is acknowledged;
``atp-reorder3``: 3, hostlib's rule before ``adaptive_reorder``, which the default now has; ``atp-reorderseen``: the
adaptive rule only once a job has seen reordering, its first window on the threshold of 3, as before the simulated
fabric told its senders that it sprays, ``path_reorders``); ``atp-rank``: a rank between jobs from their first
packet (``job_rank_levels`` 3, promoted every 60 µs, about four base RTTs of the k=4 fabric; the controller's
policy gets ``rank_levels`` 3: ranks to queues 1-3, no per-job placement). Keys that are not ``AtpConfig``
fields are the simulated network's: ``trim`` (the switches trim approximate packets instead of dropping them),
``spray`` (per-packet load balancing of approximate ATP DATA), ``approx_buffer_unit`` (the approximate queues'
buffers: 1, the paper's)."""

SWITCHES = ("netapprox", "static", "fifo")
"""The switches a trial runs on: NetApprox queues re-mapped by the controller; the same queues with static
TLR thresholds and pinned jobs (ATP_FixPrio); a network-oblivious switch, one FIFO per port with the same
total buffer (where the papers run their baselines). The ns-3 back end also runs ``pfabric`` (``PEER_SWITCHES``)."""

PEER_SWITCHES = {"pfabric-es": "pfabric", "pfabric-ss": "pfabric", "pfabric-sm": "pfabric",
                 "homa-es": "homa", "homa-ss": "homa", "homa-sm": "homa",
                 "aeolus-es": "aeolus", "aeolus-ss": "aeolus", "aeolus-sm": "aeolus",
                 "expresspass-es": "aeolus", "expresspass-ss": "aeolus", "expresspass-sm": "aeolus"}
"""ns-3 only: the switch each peer transport runs on, its own (pFabric's priority queue; Homa's 8 priority
queues; Aeolus' credit-limited port with selective dropping, which ExpressPass runs on too)."""


def is_atp(protocol: str) -> bool:
    return protocol in ATP_VARIANTS or protocol in ATP_ABLATION


def atp_variant(protocol: str) -> dict[str, Any]:
    """The knobs of an ATP protocol (``ATP_VARIANTS`` or, ns-3 only, ``ATP_ABLATION``)."""
    return ATP_VARIANTS.get(protocol) or ATP_ABLATION[protocol]


def switch_for(protocol: str) -> str:
    """The switch a protocol runs on in a comparison, as the papers compare: ATP on NetApprox switches with the
    controller (ATP_FixPrio without it: its job pinned to its first queue), the baselines (TCP-ES, TCP-SS, the
    UDP blast) on the network-oblivious switch, each peer transport on its own (``PEER_SWITCHES``)."""
    if protocol == "atp-fixprio":
        return "static"
    if protocol in PEER_SWITCHES:
        return PEER_SWITCHES[protocol]
    return "netapprox" if is_atp(protocol) else "fifo"


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """One approximate job: ``src`` sends ``workload`` to ``dst`` with ``msr``, ``start_s`` after the trial's
    start line."""

    job_id: int
    src: int
    dst: int
    workload: JobWorkload
    msr: float
    start_s: float = 0.0
    analytics: str | None = None
    """An ATP job that is an analytics job (``AnalyticsJob.save``'s file, with ``workload`` its message sizes): its
    sender sends its rows, its MSR following its running estimate from the paper's heuristic (``msr`` is then what
    the baselines send)."""
    after: int | tuple[int, ...] | None = None
    """Start once job ``after`` (or every job of a tuple) of the trial has ended (its sender returned; the analytics
    evaluation's second stage, S2, whose sender is the first stage's receiver host), not at ``start_s``."""


@dataclasses.dataclass(frozen=True)
class Background:
    """Paced UDP from ``src`` to ``dst``'s second address (same switch port, another socket) from ``start_s``
    for ``duration_s``: ATP-format DATA, APPROX with ``tlr`` (queued by that TLR), or non-approximate."""

    src: int
    dst: int
    rate_bps: float
    start_s: float
    duration_s: float
    tlr: float | None = None

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclasses.dataclass(frozen=True)
class TrialPlan:
    """One trial of a sweep: jobs under one protocol, with optional background and non-approximate flows."""

    params: Mapping[str, Any]
    """What the trial is filed under in result.json (besides its seed)."""
    seed: int
    protocol: str
    jobs: tuple[JobPlan, ...]
    background: tuple[Background, ...] = ()
    flows: tuple[Flow, ...] = ()
    """Non-approximate TCP flows (each with its source, destination, size and start)."""
    switch: str | None = None
    """The switch (``SWITCHES``) to run on; None: ``switch_for(protocol)``."""
    policy: tuple[tuple[str, Any], ...] = ()
    """On a ``netapprox`` switch: ``[policy]`` keys for the controller, as (key, value) pairs in the TOML's
    names and shapes (``("mode", "adaptive")``, ``("thresholds", (...))``, ``("tuning", (("buffers", False),))``;
    ``controller.config.with_policy`` checks them). Empty: the default policy."""
    timeline_job: int | None = None
    """Keep this job's per-epoch sender timeline (``timeline``), its queue changes and the background's start
    times in the trial's record."""
    sample_queues: bool = False
    """Measure the backlog of the switch ports facing the receivers (the simulator always does; the emulated
    testbed samples every 20 ms when asked)."""
    stop_with_jobs: bool = False
    """True: the flows and the background end with the jobs. Once every job's sender has exited no flow starts
    (flows in flight finish) and the background senders stop (the emulated testbed's ``--stop-file``). For
    figures whose flows and background are only the jobs' surroundings, not where the flows' FCTs are measured."""

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params.items()) + f" seed={self.seed}"

    @property
    def name(self) -> str:
        """A short name for the trial's working files: ``s<seed>-<param values>``, then the protocol when no
        parameter names it (two transports of one figure never share a trial's files)."""
        values = [str(v) for v in self.params.values()]
        return "-".join([f"s{self.seed}", *values, *([] if self.protocol in values else [self.protocol])])

    @property
    def switch_kind(self) -> str:
        return self.switch or switch_for(self.protocol)

    @property
    def span_s(self) -> float:
        """When the last background segment or flow starts or ends (0 without them)."""
        return max([b.end_s for b in self.background] + [f.start_s for f in self.flows] + [0.0])

    def to_dict(self) -> dict:
        """The plan as JSON values (workloads in full): its identity in the trial cache."""
        d = dataclasses.asdict(self) | {"params": dict(self.params)}
        if not self.stop_with_jobs:  # the default: the identity of trials cached before the field existed
            del d["stop_with_jobs"]
        return d
