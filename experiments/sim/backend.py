"""The ns-3 back end: every trial of a figure simulated on a data-center topology (docs/simulation.md).

    backend = SimBackend(SimScale(TopologyConfig(k=8)))
    trial = backend.run_trial(plan, workdir)     # plan: experiments.plans.TrialPlan; ns-3 loads on first use

``SimScale`` is the topology and the job sizes of a sweep; the trial itself is ``experiments.sim.trial``.
Trials share nothing but the loaded ns-3 (once per process), so they run in any order and in any process:
``cluster`` is True, and a sweep may send them to Dask workers on this machine or others (experiments/sweep.py),
each loading ns-3 once (``prepare``). A trial is deterministic: the trial cache may answer it.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Sequence

from netapprox.controller.sim.native import ns_version
from netapprox.experiments.plans import TrialPlan, switch_for
from netapprox.experiments.sim import native
from netapprox.experiments.sim.topology import TopologyConfig
from netapprox.experiments.sim.trial import PROTOCOLS, SimSettings, Trial
from netapprox.experiments.workloads import JobWorkload, make_job, rng_for


@dataclasses.dataclass(frozen=True)
class SimScale:
    """Topology and job sizes of a sweep (recorded in every result file with every ``SimSettings`` field)."""

    topo: TopologyConfig = TopologyConfig(k=8)
    """The fabric: a k=8 fat-tree (128 hosts) at 40 Gbit/s unless told (k=4: 16 hosts, 12: 432; or the paper's
    144-host 2-tier Clos, ``TopologyConfig(kind="clos")``)."""
    senders: int | None = None
    """All-to-all and incast: this many hosts send a job (``None``: every host). Scales the number of jobs,
    not the topology."""
    fbkv_n: int = 1000
    """Messages per FBKV job (mean item ~365 B: ~365 KB per job)."""
    fbhd_n: int = 40
    """Messages per FBHD job."""
    fbhd_max: int = 200_000
    """Cap on one FBHD message, bytes, as in the emulated experiments (the trace's tail reaches 10 MB; every
    simulated ATP packet costs Python time)."""
    flow_size_scale: float = 1.0
    """Web-search flow sizes are divided by this (1: the trace's sizes)."""
    tag: str = ""
    """Files the results under results/sim/<experiment>-<tag> (a second run of an experiment, e.g. k=8)."""
    buffer_packets: int = SimSettings.buffer_packets
    approx_buffer_unit: int | None = SimSettings.approx_buffer_unit
    ecn_threshold_pkts: int = SimSettings.ecn_threshold_pkts
    min_rto_us: float = SimSettings.min_rto_us
    epoch_us: float = SimSettings.epoch_us
    lead_s: float = 20e-6
    """A job that meets background starts this long after the background."""
    slack_s: float = 200e-6
    """Background outlasts the job it is set against by this much beyond the job's expected span."""

    def topology(self) -> TopologyConfig:
        return self.topo

    def settings(self, **kw: Any) -> SimSettings:
        return SimSettings(topology=self.topology(), buffer_packets=self.buffer_packets,
                           approx_buffer_unit=self.approx_buffer_unit,
                           ecn_threshold_pkts=self.ecn_threshold_pkts, min_rto_us=self.min_rto_us,
                           epoch_us=self.epoch_us, **kw)

    def job(self, kind: str, seed: int, times: int = 1) -> JobWorkload:
        if kind == "fbkv":
            return make_job("fbkv", seed, self.fbkv_n * times)
        return make_job("fbhd", seed, self.fbhd_n * times, max_size=self.fbhd_max)

    def job_seed(self, seed: int, host: int) -> int:
        """The workload seed of ``host``'s job in a run of ``seed`` (fat-trees up to 1000 hosts)."""
        return seed * 1000 + host

    @property
    def rate_bps(self) -> float:
        return self.topo.host_gbps * 1e9

    def senders_of(self, seed: int, hosts: Sequence[int], exclude: Sequence[int] = ()) -> list[int]:
        """``senders`` hosts (seeded) of ``hosts`` but ``exclude``; every one of them without ``senders``."""
        pool = [h for h in hosts if h not in exclude]
        if self.senders is None or self.senders >= len(pool):
            return pool
        return sorted(int(h) for h in rng_for(seed * 7919 + 1).choice(pool, self.senders, replace=False))


class SimBackend:
    """Runs trial plans in ns-3; see the module docstring."""

    name = "sim"
    protocols = PROTOCOLS
    baselines = ("dctcp-es", "dctcp-ss")
    """Its TCP EarlySend and SampleSend: DCTCP (ns-3 ``TcpDctcp``) on network-oblivious switches."""
    time_unit = ("µs", 1e6)
    rate_unit = "gbps"
    cluster = True
    deterministic = True
    """A trial's record depends only on its plan, the scale and the code: a cached one is the result."""

    def __init__(self, scale: SimScale = SimScale(), *, progress: Callable[[str], None] | None = None) -> None:
        """``progress``: where a long trial says how far its simulated clock got (every 5 s of wall clock)."""
        self.scale = scale
        self.settings = scale.settings()
        self.progress = progress

    def __reduce__(self) -> tuple:  # to a worker process: the scale only (a callback stays here)
        return SimBackend, (self.scale,)

    @property
    def hosts(self) -> list[int]:
        return list(range(self.settings.topology.n_hosts))

    @property
    def where(self) -> str:
        return f", {self.settings.topology.short()}"

    def far_hosts(self) -> tuple[int, int, int]:
        """(sender, background sender, receiver): the receiver in another pod (leaf) than both senders."""
        return 0, 1, self.settings.topology.n_hosts - 1

    def identity(self) -> dict:
        """What, besides a plan and the code (ns-3's version among it), decides a trial's record: the scale but its
        ``tag`` (which names a results folder)."""
        return {"name": self.name, "scale": {k: v for k, v in dataclasses.asdict(self.scale).items() if k != "tag"}}

    def prepare(self) -> None:
        """Load ns-3 and the simulations' C++ into this process (once: every trial after reuses them)."""
        native.load()

    def describe(self, protocols: Sequence[str] = ()) -> dict:
        """What a result file records about where its trials ran."""
        return {"simulator": f"ns-3 {ns_version()} (PyPI wheel, cppyy)", "scale": dataclasses.asdict(self.scale),
                "settings": self.settings.to_dict(), "topology": self.settings.topology.describe(),
                "switches": {p: switch_for(p) for p in protocols}}

    def result_dir(self, out: Path, name: str) -> tuple[str, Path]:
        name = f"{name}-{self.scale.tag}" if self.scale.tag else name
        return f"sim-{name}", out / "sim" / name

    def group_of(self, plan: TrialPlan) -> tuple:
        return ()

    def close(self) -> None:
        """Nothing to stop: a trial leaves nothing running."""

    def check(self, plan: TrialPlan) -> None:
        if plan.protocol not in PROTOCOLS:
            raise ValueError(f"protocol {plan.protocol!r}: choose one of {', '.join(PROTOCOLS)}")

    def run_trial(self, plan: TrialPlan, workdir: Path | None = None) -> dict:
        """Simulate ``plan`` (nothing is written to ``workdir``) and return its record."""
        self.check(plan)
        return Trial(self.settings, plan.protocol, plan.jobs, seed=plan.seed, background=plan.background,
                     flows=plan.flows, timeline_job=plan.timeline_job, switch=plan.switch, policy=plan.policy,
                     label=plan.label,
                     progress=self.progress).run()

    def close(self) -> None:
        """Nothing to close: ns-3 stays loaded for the next trial in this process."""

    def __enter__(self) -> "SimBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
