"""One simulated trial in ns-3, the ns-3 back end's trial (experiments/sim/backend.py): a data-center topology,
a set of jobs under one protocol, optional background traffic and non-approximate flows; the controller's
runtime in the loop; the per-job metrics of experiments/metrics.py.

    settings = SimSettings(topology=TopologyConfig(kind="fattree", k=4))
    trial = run_trial(settings, "atp", jobs, seed=1)      # jobs: [plans.JobPlan(job_id, src, dst, workload, msr)]
    trial["jobs"][0]["jct_s"], trial["queues"], trial["perf"]

Protocols (``PROTOCOLS``; the ATP variants are experiments.plans.ATP_VARIANTS):

| protocol | hosts | switches | controller policy |
|---|---|---|---|
| ``atp`` | hostlib's default ATP (``adaptive``) through ``hostlib.sim`` | NetApprox (8 queues) | ``netapprox`` |
| ``atp-full`` / ``atp-paper`` | ATP ``paper`` (eq. 1-3) | NetApprox | ``netapprox`` |
| ``atp-fixtlr`` | ATP ``fixtlr`` (static TLR = 1 - MSR) | NetApprox | ``netapprox`` |
| ``atp-fixprio`` | ATP ``paper`` | NetApprox | ``static``, the job pinned to queue_for_tlr(1 - MSR) |
| ``atp-base``, ``atp-rc``, ``atp-mrdf`` | Fig. 12's ablation chain (``base``; ``fixtlr`` without / with MRDF) | NetApprox | ``netapprox`` |
| ``atp-early``, ``atp-all-sent`` | ATP with the completion policy ``early`` / ``all_sent`` | NetApprox | ``netapprox`` |
| ``dctcp-es``, ``dctcp-ss`` | EarlySend / SampleSend over ns-3 ``TcpDctcp`` | network-oblivious (one queue, ECN) | ``fifo`` |
| ``dctcp-sm``, ``pfabric-sm``, ``homa-sm``, ``aeolus-sm``, ``expresspass-sm`` | SmallestSend: only the smallest ceil(MSR N) messages, smallest first | the transport's own | ``fifo`` |
| ``udp`` | every message once as ATP-format DATA at line rate | network-oblivious | ``fifo`` |
| ``pfabric-es``, ``pfabric-ss`` | EarlySend / SampleSend over pFabric's host transport (``netapprox_peers.h``) | pFabric (2 BDP, least remaining first) | ``fifo`` (nothing to program) |
| ``homa-es``, ``homa-ss`` | EarlySend / SampleSend over Homa (RTTbytes unscheduled, receiver grants) | Homa (8 priority queues) | ``fifo`` (nothing to program) |
| ``aeolus-es``, ``aeolus-ss`` | EarlySend / SampleSend over Aeolus (one BDP unscheduled at line rate, the rest on receiver credits) | Aeolus (credit rate limiter, selective dropping) | ``fifo`` (nothing to program) |
| ``expresspass-es``, ``expresspass-ss`` | the same over ExpressPass-style credits alone (nothing before the first credit) | the same | ``fifo`` |

Every switch is programmed by ``controller.sim.driver.SimDriver`` through the controller's one runtime
(``controller.runtime.Runtime``), whose ``epoch(now)`` runs every ``SimSettings.epoch_us`` of simulated time;
hosts' REPORTs reach it ``report_delay_us`` after the sender emits them. docs/simulation.md lists every
setting and what is and is not modelled.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Sequence

from netapprox.controller.config import ControllerConfig, PolicyConfig, ReportConfig, SwitchConfig, with_policy
from netapprox.controller.model import check_buffer_unit, half_buffer_unit, queue_for_tlr
from netapprox.controller.observe import DecisionLog
from netapprox.controller.runtime import Runtime
from netapprox.controller.sim.driver import SimDriver
from netapprox.controller.sim.switch import queue_limits
from netapprox.experiments import metrics as M
from netapprox.experiments.baselines import TCP_JOB_HEADER, TCP_MSG_HEADER, msr_target, sample_messages
from netapprox.experiments.plans import ATP_ABLATION, ATP_VARIANTS, Background, JobPlan, atp_variant, is_atp, switch_for
from netapprox.experiments.sim import native
from netapprox.experiments.sim.peers import PFABRIC_HEADER, bdp_packets, homa_level, homa_levels, pfabric_buffer_packets
from netapprox.experiments.sim.topology import PPP_HEADER, Network, TopologyConfig
from netapprox.experiments.workloads import Flow, JobWorkload
from netapprox.hostlib import core as hostlib_core
from netapprox.hostlib import events, wire
from netapprox.hostlib import sim as host_sim
from netapprox.hostlib.config import AtpConfig, JobSpec, Message, required_messages
from netapprox.hostlib.reporting import ReportSink

TCP_PROTOCOLS = ("dctcp-es", "dctcp-ss", "dctcp-sm")
PFABRIC_PROTOCOLS = ("pfabric-es", "pfabric-ss", "pfabric-sm")
HOMA_PROTOCOLS = ("homa-es", "homa-ss", "homa-sm")
AEOLUS_PROTOCOLS = ("aeolus-es", "aeolus-ss", "aeolus-sm", "expresspass-es", "expresspass-ss", "expresspass-sm")
PEER_PROTOCOLS = PFABRIC_PROTOCOLS + HOMA_PROTOCOLS + AEOLUS_PROTOCOLS
PROTOCOLS = tuple(ATP_VARIANTS) + tuple(ATP_ABLATION) + TCP_PROTOCOLS + ("udp",) + PEER_PROTOCOLS
ATP_PORT = wire.DEFAULT_ATP_PORT
BG_PORT = ATP_PORT
TCP_JOB_PORT0 = 20000
FLOW_PORT = 5800
UDP_JOB_PORT = 7700
IP_UDP = 28
UDP_DRAIN_US = 200.0
"""UDP baseline: a job's trial waits this long after its last datagram left before counting arrivals."""
SIM_CONTROLLER = ("controller", wire.DEFAULT_REPORT_PORT)
"""The simulated controller's report target: a name the sink addresses REPORTs to, never resolved (the trial
hands each datagram to the controller's runtime after ``report_delay_us``)."""
MTU = 1500
"""IP MTU of every simulated link: ATP datagrams are at most MTU - IP - UDP bytes, as TCP's segments fill it."""
PFABRIC_MSS = MTU - IP_UDP - PFABRIC_HEADER
"""pFabric's payload per packet (1448 bytes, the TCP baselines' MSS)."""


@dataclasses.dataclass(frozen=True)
class SimSettings:
    """Everything a simulated trial is configured with besides its jobs. Recorded in every result file."""

    topology: TopologyConfig = TopologyConfig()
    buffer_packets: int = 1000
    """Buffer of every switch port, packets (1.5 MB of 1500-byte packets, the NetApprox paper's switch buffer,
    per port as in ns-2). NetApprox: queue k >= 1 holds ``approx_unit`` x (8 - k) packets, queue 0 the rest;
    the oblivious switch: one queue of all of it."""
    approx_buffer_unit: int | None = None
    """Approximate queue k >= 1 holds this many times the paper's 8 - k packets (the switch option
    ``approx_buffer_unit``; 1: the paper's k-MTU buffers). None: ``model.half_buffer_unit``, the largest that
    leaves queue 0 half of the port (17 of 1000 packets: queue 1 holds 119, queue 7 17, queue 0 524). The
    k-MTU buffers lost 12-30% of ATP's payloads at 40 Gbit/s (docs/simulation.md, "Approximate queues' buffers");
    an ATP variant may ask for another unit (``approx_buffer_unit``)."""
    ecn_threshold_pkts: int = 65
    """ECN marking threshold (packets in the queue ahead): DCTCP's K = 65 (Alizadeh et al. 2010, the NetApprox
    paper §7.1). Queue 0 of the NetApprox switch and the one queue of the oblivious switch."""
    host_queue_packets: int = 1000
    """FIFO under every host NIC (Linux txqueuelen)."""
    tcp_host_ecn: bool = True
    """TCP baselines: every host NIC's FIFO marks CE at ``ecn_threshold_pkts`` as the switch ports do (ns-2's
    queues on every link, pFabric's DCTCP setting). False: a FIFO that never marks, where a long flow's slow
    start fills all ``host_queue_packets`` and the host drops (docs/simulation.md, "Peer transports: validation")."""
    min_rto_us: float = 200.0
    """TCP minimum RTO (Vasudevan et al., SIGCOMM 2009; pFabric's DCTCP setting); ATP's ``min_loss_timeout_s``
    is set to the same."""
    initial_rto_us: float = 1000.0
    """TCP RTO before the first RTT sample (ns-3 RttEstimator InitialEstimation; RFC 6298 says 1 s, which would
    make any lost SYN or first segment dominate a µs-scale trial)."""
    initial_cwnd: int = 10
    """TCP initial window, segments (RFC 6928, Linux)."""
    segment_size: int = 1448
    """TCP MSS: 1500 - 20 (IP) - 20 (TCP) - 12 (timestamps)."""
    del_ack_count: int = 1
    """TCP: acknowledge every segment (no delayed ACKs)."""
    clock_granularity_us: float = 1.0
    """TCP RTO clock granularity."""
    tcp_buffer_bytes: int = 4 << 20
    """TCP send and receive buffers (Linux tcp_wmem/tcp_rmem maximum)."""
    dctcp_g: float = 1 / 16
    """DCTCP's alpha gain g."""
    epoch_us: float = 50.0
    """Controller epoch (simulated time)."""
    report_delay_us: float = 5.0
    """Host REPORT -> controller latency (the control channel is not simulated packet by packet)."""
    atp_idle_timeout_ms: float = 50.0
    """ATP sender gives up after this long without an acknowledgement (hostlib's 10 s suits emulation)."""
    time_limit_ms: float = 200.0
    """Simulated time after which a trial stops with whatever has not completed counted as failed."""
    check_us: float = 20.0
    """How often (simulated) the trial checks whether everything completed."""
    spray: bool = True
    """The fabric sprays approximate ATP DATA: each such packet takes the next of the equal-cost next hops in turn
    (per-packet load balancing, as NDP's fabric does); every other packet keeps flow hashing. ATP tolerates the
    reordering (docs/simulation.md, "Spraying and grants"). A protocol variant may say otherwise (``spray``)."""
    atp_receiver_grants: bool = True
    """ATP receivers schedule what their jobs send beyond the first window (hostlib's ``receiver_grants``; granted
    data is not held by the sender's window, ``grant_overrides_window``), as hostlib's default does
    (``SETTINGS_PARITY``, tests/test_parity.py)."""
    pfabric_buffer_packets: int | None = None
    """pFabric: every switch port's buffer, packets; None: two bandwidth-delay products of the topology
    (``peers.pfabric_buffer_packets``, pFabric's §4 setting)."""
    pfabric_rto_rtts: float = 3.0
    """pFabric: the fixed retransmission timeout, in unloaded RTTs of the longest path (pFabric's §4: ~3 RTTs)."""
    pfabric_probe_after: int = 5
    """pFabric: consecutive timeouts after which a flow enters probe mode (header-only probes until an ACK)."""
    homa_overcommit: int | None = None
    """Homa: messages a receiver grants to at once; None: its scheduled priority levels (8 - unscheduled)."""
    homa_resend_rtts: float = 10.0
    """Homa: a receiver asks for a granted message's missing packets after this many unloaded RTTs without
    progress; a sender without word from its receiver sends its first packet again after twice that."""
    aeolus_threshold_packets: int = 8
    """Aeolus: an unscheduled packet is dropped by a switch port holding this many packets (selective dropping)."""
    aeolus_credit_queue: int = 8
    """Aeolus / ExpressPass: credits a switch port queues (ExpressPass' small credit buffer); more are dropped."""
    aeolus_timeout_rtts: float = 10.0
    """Aeolus / ExpressPass: a sender without word from its receiver for this many unloaded RTTs resends every
    unacknowledged packet on credits (asking for credits again)."""
    atp_core: str = "native"
    """Which implementation of hostlib's cores the ATP hosts run: ``native`` (the C cores, when the extension is
    built; else, and under NETAPPROX_PURE_PYTHON=1, the reference) or ``python`` (the reference). Both produce
    the same datagrams for the same inputs (tests/hostlib/test_hostlib_differential.py), so results are the same;
    only the CPU a trial takes differs."""

    def __post_init__(self) -> None:
        if self.atp_core not in ("native", "python"):
            raise ValueError(f"atp_core {self.atp_core!r}: choose native or python")
        check_buffer_unit(self.approx_unit, self.buffer_packets)

    @property
    def approx_unit(self) -> int:
        """The approximate queues' buffer unit in use (``approx_buffer_unit``, or half the port's)."""
        if self.approx_buffer_unit is None:
            return half_buffer_unit(self.buffer_packets)
        return self.approx_buffer_unit

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["approx_unit"] = self.approx_unit
        d["topology"]["description"] = self.topology.describe()
        d["base_rtt_us"] = self.topology.base_rtt_s() * 1e6
        return d


SETTINGS_PARITY: dict[str, tuple[str, str]] = {
    "spray": ("shared", "controller PolicyConfig.spray (the kernel switch, later the P4 program), TestbedConfig.spray"),
    "approx_buffer_unit": ("shared", "every switch's approx_buffer_unit; unset: model.half_buffer_unit of the port"),
    "buffer_packets": ("scaled", "the port buffer of the switch being modelled (1.5 MB); each data plane its own"),
    "ecn_threshold_pkts": ("scaled", "DCTCP's K grows with the bandwidth-delay product; PolicyConfig's 20 suits Mbit/s ports"),
    "tcp_host_ecn": ("baseline", "the TCP baselines' host NICs mark ECN at K as the simulated switches do"),
    "host_queue_packets": ("scaled", "the hosts' NIC queue (txqueuelen); emulated hosts have the kernel's own"),
    "epoch_us": ("scaled", "the controller's epoch, a few RTTs of the network (ControllerConfig.epoch_s)"),
    "report_delay_us": ("simulator", "the control channel's latency, which real networks have by themselves"),
    "atp_idle_timeout_ms": ("scaled", "AtpConfig.idle_timeout_s at microsecond RTTs (SCALED_ATP_KNOBS)"),
    "time_limit_ms": ("simulator", "when a simulated trial gives up"),
    "check_us": ("simulator", "how often a simulated trial checks for completion"),
    "topology": ("scaled", "the fabric being modelled"),
    "atp_core": ("simulator", "which implementation of hostlib's cores runs (same datagrams either way)"),
    "atp_receiver_grants": ("shared", "hostlib's AtpConfig.receiver_grants, which every testbed runs: on "
                                      "everywhere (off: the named variant atp-nogrants)"),
    "min_rto_us": ("baseline", "TCP's minimum RTO (ATP's min_loss_timeout_s follows it: SCALED_ATP_KNOBS)"),
    "initial_rto_us": ("baseline", "TCP's first RTO"),
    "initial_cwnd": ("baseline", "TCP's initial window"),
    "segment_size": ("baseline", "TCP's MSS"),
    "del_ack_count": ("baseline", "TCP's delayed ACKs"),
    "clock_granularity_us": ("baseline", "TCP's RTO clock"),
    "tcp_buffer_bytes": ("baseline", "TCP's socket buffers"),
    "dctcp_g": ("baseline", "DCTCP's gain"),
    "pfabric_buffer_packets": ("baseline", "pFabric's own switch buffers"),
    "pfabric_rto_rtts": ("baseline", "pFabric's fixed RTO"),
    "pfabric_probe_after": ("baseline", "pFabric's probe mode"),
    "homa_overcommit": ("baseline", "Homa's overcommitment"),
    "homa_resend_rtts": ("baseline", "Homa's RESEND timer"),
    "aeolus_threshold_packets": ("baseline", "Aeolus' selective-drop threshold"),
    "aeolus_credit_queue": ("baseline", "ExpressPass' credit queue"),
    "aeolus_timeout_rtts": ("baseline", "Aeolus' sender timeout"),
}
"""Every ``SimSettings`` field and what it is elsewhere: ``shared`` — a design default every data plane has too,
with the same value (tests/test_parity.py holds them to it); ``scaled`` — a size, rate or time of the network
being modelled, which each data plane sets for its own; ``baseline`` — the TCP baselines' own settings;
``simulator`` — the simulation's own bookkeeping. A new field without an entry fails the parity test."""

SCALED_ATP_KNOBS: dict[str, str] = {
    "max_rate_bps": "the host link's rate",
    "overhead_bytes": "the links' headers (IP, UDP, PPP instead of Ethernet)",
    "packet_size": "the links' MTU",
    "initial_window": "one bandwidth-delay product of the topology",
    "initial_rtt_s": "the topology's base RTT",
    "min_epoch_s": "the topology's base RTT",
    "min_loss_timeout_s": "the TCP baselines' minimum RTO",
    "idle_timeout_s": "the simulated trial's time scale",
    "fin_timeout_s": "the simulated trial's time scale",
    "finished_linger_s": "the simulated trial's time scale",
    "queue_packets": "the switches' buffers",
    "max_jobs": "the number of hosts (an incast's receiver serves all of them)",
    "path_reorders": "whether the fabric sprays ATP's approximate packets (every data plane that sprays tells its "
                     "senders: the emulated leaf-spine too, experiments.emulated)",
}
"""The ``AtpConfig`` knobs ``atp_config`` sets from the network's sizes, rates and times and from whether it
sprays; every other knob is
hostlib's default unless a named variant (``experiments.plans``) overrides it (tests/test_parity.py)."""

def atp_config(settings: SimSettings, protocol: str) -> AtpConfig:
    """hostlib's AtpConfig for ``protocol`` at data-center scale: every knob that is a rate or a time scaled
    to the topology, everything else hostlib's default."""
    topo = settings.topology
    rtt = topo.base_rtt_s()
    wanted = dict(max_rate_bps=topo.host_gbps * 1e9, overhead_bytes=IP_UDP + PPP_HEADER,
                  packet_size=MTU - IP_UDP,
                  # the first window: one bandwidth-delay product of this network (hostlib's default trusts its
                  # RTT guess only up to 64 packets; here the RTT is known)
                  initial_window=math.ceil(topo.host_gbps * 1e9 * rtt / (MTU + PPP_HEADER) / 8),
                  initial_rtt_s=rtt, min_epoch_s=rtt, min_loss_timeout_s=settings.min_rto_us * 1e-6,
                  idle_timeout_s=settings.atp_idle_timeout_ms * 1e-3,
                  fin_timeout_s=max(20 * rtt, settings.min_rto_us * 1e-6 * 5),
                  finished_linger_s=settings.atp_idle_timeout_ms * 1e-3,
                  queue_packets=tuple(queue_limits(settings.buffer_packets,
                                                   unit=network_knobs(protocol, settings)["approx_unit"])),
                  # a receiver serves every job sent to its host at once (incast: all the other hosts')
                  max_jobs=max(AtpConfig.max_jobs, topo.n_hosts),
                  path_reorders=network_knobs(protocol, settings)["spray"])
    unscaled = set(wanted) - set(SCALED_ATP_KNOBS)
    if unscaled:
        raise ValueError(f"atp_config sets {sorted(unscaled)}, which are not scaled knobs: use a named variant")
    wanted["receiver_grants"] = settings.atp_receiver_grants  # hostlib's default unless a study turns it off
    wanted.update(atp_variant(protocol))
    known = {f.name for f in dataclasses.fields(AtpConfig)}
    return AtpConfig(**{k: v for k, v in wanted.items() if k in known})


def network_knobs(protocol: str, settings: SimSettings) -> dict[str, Any]:
    """What the simulated network does for a trial of ``protocol``: ``trim`` (NetApprox switches trim approximate
    packets instead of dropping them; an ATP variant asks for it), ``spray`` (per-packet load balancing of
    approximate ATP DATA: ``settings.spray`` unless the ATP variant says otherwise), ``approx_unit`` (the
    approximate queues' buffer unit: ``settings.approx_unit`` unless the ATP variant says otherwise)."""
    v = atp_variant(protocol) if is_atp(protocol) else {}
    return {"trim": bool(v.get("trim", False)), "spray": bool(v.get("spray", settings.spray)),
            "approx_unit": int(v.get("approx_buffer_unit", settings.approx_unit))}


def _set_tcp_defaults(ns: Any, s: SimSettings) -> None:
    def sd(key: str, value: Any) -> None:
        ns.Config.SetDefault(key, value)

    sd("ns3::TcpL4Protocol::SocketType", ns.TypeIdValue(ns.TypeId.LookupByName("ns3::TcpDctcp")))
    sd("ns3::TcpSocket::SegmentSize", ns.UintegerValue(s.segment_size))
    sd("ns3::TcpSocket::InitialCwnd", ns.UintegerValue(s.initial_cwnd))
    sd("ns3::TcpSocket::DelAckCount", ns.UintegerValue(s.del_ack_count))
    sd("ns3::TcpSocket::SndBufSize", ns.UintegerValue(s.tcp_buffer_bytes))
    sd("ns3::TcpSocket::RcvBufSize", ns.UintegerValue(s.tcp_buffer_bytes))
    sd("ns3::TcpSocket::ConnTimeout", ns.TimeValue(ns.NanoSeconds(int(s.initial_rto_us * 1000))))
    sd("ns3::TcpSocketBase::MinRto", ns.TimeValue(ns.NanoSeconds(int(s.min_rto_us * 1000))))
    sd("ns3::TcpSocketBase::ClockGranularity", ns.TimeValue(ns.NanoSeconds(int(s.clock_granularity_us * 1000))))
    sd("ns3::RttEstimator::InitialEstimation", ns.TimeValue(ns.NanoSeconds(int(s.initial_rto_us * 1000))))
    sd("ns3::TcpDctcp::DctcpShiftG", ns.DoubleValue(s.dctcp_g))


TCP_ATTRIBUTES = (
    ("ns3::TcpL4Protocol", ("SocketType", "RecoveryType", "RttEstimatorType")),
    ("ns3::TcpSocket", ("SegmentSize", "InitialCwnd", "InitialSlowStartThreshold", "DelAckCount", "DelAckTimeout",
                        "SndBufSize", "RcvBufSize", "ConnTimeout", "TcpNoDelay")),
    ("ns3::TcpSocketBase", ("MinRto", "ClockGranularity", "Sack", "Timestamp", "WindowScaling", "ReTxThreshold",
                            "LimitedTransmit", "UseEcn")),
    ("ns3::TcpDctcp", ("DctcpShiftG", "DctcpAlphaOnInit", "UseEct0")),
    ("ns3::RttEstimator", ("InitialEstimation",)),
)


def tcp_attributes(ns: Any) -> dict[str, str]:
    """The TCP settings every baseline socket starts with (ns-3's defaults after ``_set_tcp_defaults``)."""
    out = {}
    for type_name, names in TCP_ATTRIBUTES:
        tid = ns.TypeId.LookupByName(type_name)
        for i in range(tid.GetAttributeN()):
            info = tid.GetAttribute(i)
            name = info.name.decode() if isinstance(info.name, bytes) else str(info.name)
            if name in names:
                out[f"{type_name}::{name}"] = str(info.initialValue.SerializeToString(info.checker))
    return out


def smallest_messages(sizes: Sequence[int], msr: float) -> list[int]:
    """SmallestSend: the ids of the smallest ceil(MSR N) messages (ties: the lower id), smallest first: the choice
    ATP's MRDF makes, made by the sender alone."""
    k = msr_target(msr, len(sizes))
    return sorted(range(len(sizes)), key=lambda i: (sizes[i], i))[:k]


def stream_order(workload: JobWorkload, msr: float, protocol: str, seed: int) -> Sequence[int]:
    """The message ids a baseline's stream carries, in order: SampleSend (``*-ss``) a seeded sample,
    SmallestSend (``*-sm``) the smallest, EarlySend every message."""
    if protocol.endswith("-ss"):
        return sample_messages(workload.n, msr, seed)
    if protocol.endswith("-sm"):
        return smallest_messages(workload.sizes, msr)
    return range(workload.n)


def tcp_stream(workload: JobWorkload, msr: float, protocol: str, seed: int) -> tuple[int, int]:
    """(bytes the sender writes, bytes after which the receiver answers) of a baseline job's stream (the
    emulated baselines', experiments/baselines.py; pFabric's and Homa's carry the same): EarlySend every
    message, done after the first ceil(MSR N); SampleSend and SmallestSend only their messages, all needed."""
    if protocol.endswith(("-ss", "-sm")):
        chosen = stream_order(workload, msr, protocol, seed)
        total = TCP_JOB_HEADER + sum(TCP_MSG_HEADER + workload.sizes[i] for i in chosen)
        return total, total
    k = msr_target(msr, workload.n)
    total = TCP_JOB_HEADER + sum(TCP_MSG_HEADER + s for s in workload.sizes)
    target = TCP_JOB_HEADER + sum(TCP_MSG_HEADER + s for s in workload.sizes[:k])
    return total, target


class _Clock:
    def __init__(self, ns: Any) -> None:
        self._now = ns.Simulator.Now

    def __call__(self) -> float:
        return self._now().GetNanoSeconds() * 1e-9


class Trial:
    """One simulation run. ``run()`` returns the result dict; everything ns-3 is destroyed afterwards."""

    def __init__(self, settings: SimSettings, protocol: str, jobs: Sequence[JobPlan], *, seed: int,
                 background: Sequence[Background] = (), flows: Sequence[Flow] = (),
                 timeline_job: int | None = None, switch: str | None = None,
                 policy: Sequence[tuple[str, Any]] = (),
                 progress: Callable[[str], None] | None = None, label: str = "", profile: bool = False) -> None:
        """``switch``: the switch every port runs (experiments.plans.SWITCHES; None: the protocol's,
        ``switch_for``). ``policy``: ``[policy]`` keys for the controller of a ``netapprox`` switch
        (``TrialPlan.policy``). ``profile``: time every step of the ATP endpoints' loops
        (``hostlib.sim.ProfiledEndpoint``); the result then has ``perf["profile"]``, seconds per step and the
        rest of the run (ns-3 itself)."""
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol {protocol!r}: choose one of {', '.join(PROTOCOLS)}")
        self.switch = switch or switch_for(protocol)
        if self.switch not in ("netapprox", "static", "fifo", "pfabric", "homa", "aeolus"):
            raise ValueError(f"switch {self.switch!r}: choose netapprox, static, fifo, pfabric, homa or aeolus")
        self.policy_overrides = tuple(policy)
        if self.policy_overrides and self.switch != "netapprox":
            raise ValueError(f"a policy for the controller needs the netapprox switch, not {self.switch!r}")
        self.settings = settings
        self.protocol = protocol
        self.jobs = list(jobs)
        self.seed = seed
        self.background = list(background)
        self.flows = list(flows)
        self.timeline_job = timeline_job
        self.progress = progress
        self.label = label or protocol
        self.profile = profile

    # -- build --------------------------------------------------------------------------------------

    def run(self) -> dict:
        ns, g = native.load()
        self.ns, self.g = ns, g
        host_sim.reset()
        try:
            return self._run()
        finally:
            self._teardown()

    def _run(self) -> dict:
        ns, g = self.ns, self.g
        s = self.settings
        wall0 = time.perf_counter()
        ns.RngSeedManager.SetSeed(1)
        ns.RngSeedManager.SetRun(max(1, self.seed))
        _set_tcp_defaults(ns, s)
        mode = self.switch if self.switch in ("fifo", "pfabric", "homa", "aeolus") else "netapprox"
        self._keep: list[Any] = []  # ns-3 objects the trial must keep alive
        self.net = Network(ns, g, s.topology, switch_mode=mode, buffer_packets=s.buffer_packets,
                           host_queue_packets=s.host_queue_packets, seed=self.seed,
                           pfabric_packets=self.pfabric_packets,
                           aeolus=(s.aeolus_threshold_packets, s.aeolus_credit_queue),
                           host_ecn_pkts=s.ecn_threshold_pkts if s.tcp_host_ecn and self.protocol in TCP_PROTOCOLS else 0,
                           **network_knobs(self.protocol, self.settings))
        self.clock = _Clock(ns)
        self._start_controller()
        build_s = time.perf_counter() - wall0
        host_sim.ProfiledEndpoint.reset_profile()
        self._controller_s = 0.0
        self._job_state: dict[int, dict] = {}
        if is_atp(self.protocol):
            self._start_atp()
        elif self.protocol in TCP_PROTOCOLS:
            self._start_tcp()
        elif self.protocol in PFABRIC_PROTOCOLS:
            self._start_pfabric()
        elif self.protocol in HOMA_PROTOCOLS:
            self._start_homa()
        elif self.protocol in AEOLUS_PROTOCOLS:
            self._start_aeolus()
        else:
            self._start_udp()
        self._start_background()
        self._start_flows()
        self._schedule(s.epoch_us * 1e-6, self._on_epoch)
        self._schedule(s.check_us * 1e-6, self._on_check)
        ns.Simulator.Stop(ns.NanoSeconds(int(s.time_limit_ms * 1e6)))
        self._wall_run = time.perf_counter()
        cpu0 = time.process_time()
        self._last_progress = self._wall_run
        self._stopped_at: float | None = None
        ns.Simulator.Run()
        host_sim.raise_pending()
        run_s = time.perf_counter() - self._wall_run
        cpu_s = time.process_time() - cpu0
        sim_end = self.clock()
        result = self._collect(sim_end)
        result["perf"] = {**result.get("perf", {}), "build_wall_s": build_s, "run_wall_s": run_s,
                          "sim_time_s": sim_end, "run_cpu_s": cpu_s,
                          "controller_wall_s": self._controller_s}
        hops = result["perf"].get("switch_packets", 0)
        host_pkts = result["perf"].get("host_packets", 0)
        result["perf"]["switch_packets_per_wall_s"] = hops / run_s if run_s > 0 else None
        result["perf"]["host_packets_per_wall_s"] = host_pkts / run_s if run_s > 0 else None
        result["perf"]["host_packets_per_cpu_s"] = host_pkts / cpu_s if cpu_s > 0 else None
        if is_atp(self.protocol):
            sender_cls = self._cores()[0]
            result["perf"]["atp_core"] = "native" if hostlib_core.is_native(sender_cls) else "python"
        if self.profile and is_atp(self.protocol):
            sec = dict(host_sim.ProfiledEndpoint.seconds)
            sec["controller"] = self._controller_s
            sec["rest"] = max(0.0, run_s - sum(sec.values()))
            result["perf"]["profile"] = {"seconds": sec, "calls": dict(host_sim.ProfiledEndpoint.calls)}
        return result

    def _schedule(self, delay_s: float, fn: Callable[[], None]) -> None:
        host_sim.call_later(delay_s, fn)

    def _start_controller(self) -> None:
        s = self.settings
        if self.switch == "static":  # ATP_FixPrio: every job stays in the queue of 1 - MSR
            pinned = tuple(sorted((j.job_id, queue_for_tlr(1 - j.msr)) for j in self.jobs))
            policy = PolicyConfig(mode="static", pinned=pinned, ecn_threshold_pkts=s.ecn_threshold_pkts)
        else:
            policy = PolicyConfig(mode="fifo" if self.switch in ("pfabric", "homa", "aeolus") else self.switch,
                                  ecn_threshold_pkts=s.ecn_threshold_pkts)
            ranks = atp_variant(self.protocol).get("job_rank_levels", 0) if is_atp(self.protocol) else 0
            if ranks and self.switch == "netapprox":  # the hosts rank their jobs: the switches map the ranks
                policy = dataclasses.replace(policy, rank_levels=ranks)
            if self.policy_overrides:
                policy = with_policy(policy, self.policy_overrides, f"trial {self.label!r}")
        self.policy = policy
        cfg = ControllerConfig(
            switches=tuple(SwitchConfig(name=n, kind="sim") for n in self.net.switches), policy=policy,
            reports=ReportConfig(port=-1, rate_per_host=1e9, burst=1 << 20), epoch_s=s.epoch_us * 1e-6,
            counters_every=0, metrics_port=-1)
        drivers = {n: SimDriver(n, sw) for n, sw in self.net.switches.items()}
        self.runtime = Runtime(cfg, drivers, clock=self.clock, background_connect=False)
        # the decision log is the runtime's record of what it decided, at epochs and between them
        self.decisions: list[dict] = []
        self.tuning: list[dict] = []
        self.runtime.decision_log = _DecisionSink(self._on_decision_log)
        self.runtime.connect(timeout_s=0)
        self.runtime.epoch(0.0)  # every switch gets its static tables before the first packet

    def _on_decision_log(self, event: str, **fields: Any) -> None:
        if event == "tuning":  # mode adaptive: the tuner's new thresholds and buffers
            self.tuning.append({"time": self.clock(), **fields})
        if event == "job":
            self.decisions.append({"time": self.clock(), "job": fields.get("job"), "reason": fields.get("reason"),
                                   "old": fields.get("old_queue"), "new": fields.get("new_queue"),
                                   "tlr": fields.get("tlr"), "loss": fields.get("loss")})

    def _on_epoch(self) -> None:
        t0 = time.perf_counter()
        self.runtime.epoch(self.clock())
        self._controller_s += time.perf_counter() - t0
        if self._stopped_at is None:
            self._schedule(self.settings.epoch_us * 1e-6, self._on_epoch)

    # -- ATP ------------------------------------------------------------------------------------------

    def _endpoint_class(self) -> Any:
        return host_sim.ProfiledEndpoint if self.profile else host_sim.SimEndpoint

    def _cores(self) -> tuple[Any, Any]:
        """(sender class, receiver class) of ``settings.atp_core``."""
        if self.settings.atp_core == "python":
            return hostlib_core.PyAtpSender, hostlib_core.PyAtpReceiver
        return hostlib_core.AtpSender, hostlib_core.AtpReceiver

    def _start_atp(self) -> None:
        SimEndpoint = self._endpoint_class()
        AtpReceiver = self._cores()[1]

        cfg = atp_config(self.settings, self.protocol)
        self.atp_config = cfg
        self._receivers: dict[int, Any] = {}
        for dst in sorted({j.dst for j in self.jobs}):
            host = self.net.hosts[dst]
            rx = AtpReceiver(config=cfg, now=0.0)
            state = {"results": {}}
            self._receivers[dst] = (SimEndpoint(host.node, rx, port=ATP_PORT, ip=host.ip,
                                                on_event=lambda ev, st=state: self._on_rx_event(ev, st)), state)
        self._endpoints: list[Any] = []
        for job in self.jobs:
            self._job_state[job.job_id] = {"job": job, "summary": None, "failed": None, "timeline": []}
            self._schedule(job.start_s, lambda job=job: self._start_atp_job(job, cfg))

    def _on_rx_event(self, ev: events.Event, state: dict) -> None:
        if isinstance(ev, events.JobFinished):
            state["results"][ev.result.job_id] = ev.result

    def _start_atp_job(self, job: JobPlan, cfg: AtpConfig) -> None:
        SimEndpoint = self._endpoint_class()
        src, dst = self.net.hosts[job.src], self.net.hosts[job.dst]
        spec = JobSpec(job_id=job.job_id, msr=job.msr,
                       messages=tuple(Message(bytes(size)) for size in job.workload.sizes))
        st = self._job_state[job.job_id]
        st["start"] = self.clock()
        sender = self._cores()[0](spec, config=cfg, peer=(dst.ip, ATP_PORT), now=st["start"])
        timeline = st["timeline"] if job.job_id == self.timeline_job else None
        reports = ReportSink(SIM_CONTROLLER, cfg.report_key)
        source = src.ip_str

        def on_event(ev: events.Event) -> None:
            if isinstance(ev, events.ReportReady):
                for data, _controller in reports.datagrams(ev):
                    self._schedule(self.settings.report_delay_us * 1e-6,
                                   lambda data=data: self._deliver_report(data, source))
            elif isinstance(ev, events.EpochEnded):
                if timeline is not None:
                    timeline.append(ev.as_dict())
            elif isinstance(ev, events.JobCompleted):
                st["summary"] = ev.summary
                st["end"] = self.clock()
                ep.close()
            elif isinstance(ev, events.JobFailed):
                st["failed"] = ev.reason
                st["end"] = self.clock()
                ep.close()

        ep = SimEndpoint(src.node, sender, ip=src.ip, on_event=on_event)
        st["endpoint"] = ep
        self._endpoints.append(ep)
        ep.start()

    def _deliver_report(self, data: bytes, source: str) -> None:
        t0 = time.perf_counter()
        now = self.clock()
        self.runtime.ingest(data, source, now)
        if self.runtime.config.decide_on_arrival:
            self.runtime.decide_arrivals()
        self._controller_s += time.perf_counter() - t0

    # -- TCP and UDP baselines ----------------------------------------------------------------------

    def _start_tcp(self) -> None:
        ns, g = self.ns, self.g
        ports: dict[int, int] = {}
        for i, job in enumerate(self.jobs):
            total, target = tcp_stream(job.workload, job.msr, self.protocol, self.seed * 1000 + job.job_id)
            port = TCP_JOB_PORT0 + ports.setdefault(job.dst, 0)
            ports[job.dst] += 1
            rx = ns.CreateObject[g.netapprox.TcpJobReceiver]()
            rx.Setup(port, target)
            self.net.hosts[job.dst].node.AddApplication(rx)
            rx.SetStartTime(ns.Seconds(0))
            tx = ns.CreateObject[g.netapprox.TcpJobSender]()
            tx.Setup(self.net.hosts[job.dst].ip, port, total, self.protocol.endswith("-es"))
            self.net.hosts[job.src].node.AddApplication(tx)
            tx.SetStartTime(ns.NanoSeconds(int(round(job.start_s * 1e9))))
            self._job_state[job.job_id] = {"job": job, "tx": tx, "rx": rx, "total": total, "target": target}

    @property
    def pfabric_packets(self) -> int:
        """pFabric's per-port switch buffer in this trial, packets."""
        s = self.settings
        return s.pfabric_buffer_packets or pfabric_buffer_packets(s.topology)

    def _app_at(self, apps: dict[int, Any], host: int, cls: Any, *setup: Any) -> Any:
        """Host ``host``'s one ``cls`` application (``Setup(its address, *setup)``, running from time 0), created
        the first time a job asks for it."""
        app = apps.get(host)
        if app is None:
            app = apps[host] = self.ns.CreateObject[cls]()
            app.Setup(self.net.hosts[host].ip, *setup)
            self.net.hosts[host].node.AddApplication(app)
            app.SetStartTime(self.ns.Seconds(0))
        return app

    def _job_app(self, job: JobPlan, cls: Any, *setup: Any) -> Any:
        """``job``'s ``cls`` sender on its source host: ``Setup(the destination's address, *setup)``, started at the
        job's start."""
        app = self.ns.CreateObject[cls]()
        app.Setup(self.net.hosts[job.dst].ip, *setup)
        self.net.hosts[job.src].node.AddApplication(app)
        app.SetStartTime(self.ns.NanoSeconds(int(round(job.start_s * 1e9))))
        return app

    def _start_pfabric(self) -> None:
        """pFabric hosts: one flow per job carrying the DCTCP baseline's byte stream (EarlySend: every message,
        done when the first ceil(MSR N) arrived; SampleSend: the sampled messages), in packets of
        ``pfabric_mss`` bytes, the window one BDP, the timeout ``pfabric_rto_rtts`` RTTs."""
        g, s = self.g, self.settings
        topo = s.topology
        window = bdp_packets(topo)
        rto_ns = int(round(s.pfabric_rto_rtts * topo.base_rtt_s() * 1e9))
        receivers: dict[int, Any] = {}
        for job in self.jobs:
            total, target = tcp_stream(job.workload, job.msr, self.protocol, self.seed * 1000 + job.job_id)
            rx = self._app_at(receivers, job.dst, g.netapprox.PfabricReceiver)
            tx = self._job_app(job, g.netapprox.PfabricSender, job.job_id, total, target, PFABRIC_MSS, window,
                               rto_ns, s.pfabric_probe_after, self.protocol.endswith("-es"))
            self._job_state[job.job_id] = {"job": job, "tx": tx, "rx": rx, "total": total, "target": target}

    def _start_homa(self) -> None:
        """Homa hosts: one message per job carrying the DCTCP baseline's byte stream (as pFabric's flows), RTTbytes
        (one BDP) unscheduled at the level of the workload's cut-offs (``peers.homa_levels`` over this trial's
        messages), the rest granted by the receiver."""
        g, s = self.g, self.settings
        topo = s.topology
        rtt_pkts = bdp_packets(topo)
        rtt_ns = topo.base_rtt_s() * 1e9
        streams = {job.job_id: tcp_stream(job.workload, job.msr, self.protocol, self.seed * 1000 + job.job_id)
                   for job in self.jobs}
        if not streams:
            return
        u, cutoffs = homa_levels([t for t, _ in streams.values()], rtt_pkts * PFABRIC_MSS)
        overcommit = s.homa_overcommit or (8 - u)
        self.homa = {"unscheduled_levels": u, "cutoffs": list(cutoffs), "overcommit": overcommit,
                     "rtt_packets": rtt_pkts}
        receivers: dict[int, Any] = {}
        self._homa_receivers = receivers
        for job in self.jobs:
            total, target = streams[job.job_id]
            rx = self._app_at(receivers, job.dst, g.netapprox.HomaReceiver, rtt_pkts, overcommit, u,
                              int(s.homa_resend_rtts * rtt_ns))
            tx = self._job_app(job, g.netapprox.HomaSender, job.job_id, total, target, PFABRIC_MSS, rtt_pkts,
                               homa_level(total, cutoffs), int(2 * s.homa_resend_rtts * rtt_ns),
                               self.protocol.endswith("-es"))
            self._job_state[job.job_id] = {"job": job, "tx": tx, "rx": rx, "total": total, "target": target}

    def _start_aeolus(self) -> None:
        """Aeolus hosts: one message per job carrying the DCTCP baseline's byte stream (as pFabric's flows); with
        ``aeolus-*`` the first BDP leaves unscheduled at line rate, with ``expresspass-*`` nothing before the first
        credit; the receiver credits one packet per data packet time of its link."""
        g, s = self.g, self.settings
        topo = s.topology
        unsched = bdp_packets(topo) if self.protocol.startswith("aeolus") else 0
        rtt_ns = topo.base_rtt_s() * 1e9
        gap_ns = int(g.netapprox.AeolusCreditGapNs(topo.host_gbps * 1e9, topo.mtu))
        self.aeolus = {"unscheduled_packets": unsched, "credit_gap_ns": gap_ns,
                       "threshold_packets": s.aeolus_threshold_packets, "credit_queue": s.aeolus_credit_queue}
        receivers: dict[int, Any] = {}
        self._aeolus_receivers = receivers
        for job in self.jobs:
            total, target = tcp_stream(job.workload, job.msr, self.protocol, self.seed * 1000 + job.job_id)
            rx = self._app_at(receivers, job.dst, g.netapprox.AeolusReceiver, gap_ns)
            tx = self._job_app(job, g.netapprox.AeolusSender, job.job_id, total, target, PFABRIC_MSS, unsched,
                               int(s.aeolus_timeout_rtts * rtt_ns), self.protocol.endswith("-es"))
            self._job_state[job.job_id] = {"job": job, "tx": tx, "rx": rx, "total": total, "target": target}

    def _atp_datagrams(self, job_id: int, workload: JobWorkload, *, tlr: float | None) -> list[bytes]:
        chunk = 1400 - wire.HEADER_LEN
        flags = int(wire.Flags.APPROX) if tlr is not None else 0
        tlr_q = wire.tlr_to_q15(tlr) if tlr is not None else 0
        out, seq = [], 0
        for mid, size in enumerate(workload.sizes):
            cnt = max(1, math.ceil(size / chunk))
            for idx in range(cnt):
                plen = min(chunk, size - idx * chunk) if size > 0 else 0
                out.append(wire.encode_data(flags=flags, priority=0, job_id=job_id, msg_id=mid, group_id=0,
                                            tlr=tlr_q, pkt_idx=idx, pkt_cnt=cnt, seq=seq,
                                            deadline_us=wire.NO_DEADLINE, weight=0, payload=bytes(plen)))
                seq += 1
        return out

    def _start_udp(self) -> None:
        ns, g = self.ns, self.g
        counters: dict[int, Any] = {}
        rate = self.settings.topology.host_gbps * 1e9
        for job in self.jobs:
            c = self._app_at(counters, job.dst, g.netapprox.UdpCounter, UDP_JOB_PORT)
            c.SetTarget(job.job_id, required_messages(job.msr, job.workload.n))
            tx = ns.CreateObject[g.netapprox.UdpBlaster]()
            tx.Setup(self.net.hosts[job.dst].ip, UDP_JOB_PORT, rate, IP_UDP + PPP_HEADER, False, -1)
            datagrams = self._atp_datagrams(job.job_id, job.workload, tlr=None)
            for d in datagrams:
                tx.AddDatagram(d, len(d))
            self.net.hosts[job.src].node.AddApplication(tx)
            tx.SetStartTime(ns.NanoSeconds(int(round(job.start_s * 1e9))))
            self._job_state[job.job_id] = {"job": job, "tx": tx, "rx": c, "packets": len(datagrams)}

    def _start_background(self) -> None:
        ns, g = self.ns, self.g
        self._bg_sinks: dict[int, Any] = {}
        for i, b in enumerate(self.background):
            dst = self.net.hosts[b.dst]
            if b.dst not in self._bg_sinks:
                sink = self._bg_sinks[b.dst] = ns.CreateObject[g.netapprox.UdpCounter]()
                sink.Setup(dst.bg_ip, BG_PORT)
                dst.node.AddApplication(sink)
                sink.SetStartTime(ns.Seconds(0))
            tx = ns.CreateObject[g.netapprox.UdpBlaster]()
            stop = int(round((b.start_s + b.duration_s) * 1e9))
            tx.Setup(dst.bg_ip, BG_PORT, b.rate_bps, IP_UDP + PPP_HEADER, True, stop)
            flags = int(wire.Flags.APPROX) if b.tlr is not None else 0
            payload = bytes(1400 - wire.HEADER_LEN)
            for k in range(64):
                d = wire.encode_data(flags=flags, priority=0, job_id=0xFFFF0000 + i, msg_id=k, group_id=0,
                                     tlr=wire.tlr_to_q15(b.tlr) if b.tlr is not None else 0, pkt_idx=0,
                                     pkt_cnt=1, seq=k, deadline_us=wire.NO_DEADLINE, weight=0, payload=payload)
                tx.AddDatagram(d, len(d))
            self.net.hosts[b.src].node.AddApplication(tx)
            tx.SetStartTime(ns.NanoSeconds(int(round(b.start_s * 1e9))))
            self._keep.append(tx)

    def _start_flows(self) -> None:
        ns, g = self.ns, self.g
        self._flow_senders: dict[int, Any] = {}
        self._flow_sinks: dict[int, Any] = {}
        for i, f in enumerate(self.flows):
            if f.dst not in self._flow_sinks:
                sink = self._flow_sinks[f.dst] = ns.CreateObject[g.netapprox.FlowSink]()
                sink.Setup(FLOW_PORT)
                self.net.hosts[f.dst].node.AddApplication(sink)
                sink.SetStartTime(ns.Seconds(0))
            tx = self._flow_senders.get(f.src)
            if tx is None:
                tx = self._flow_senders[f.src] = ns.CreateObject[g.netapprox.FlowSender]()
                self.net.hosts[f.src].node.AddApplication(tx)
                tx.SetStartTime(ns.Seconds(0))
            tx.AddFlow(i, int(round(f.start_s * 1e9)), self.net.hosts[f.dst].ip, FLOW_PORT, f.size)

    # -- progress and completion ---------------------------------------------------------------------

    def _done_count(self) -> int:
        n = 0
        for st in self._job_state.values():
            if is_atp(self.protocol):
                n += st.get("summary") is not None or st.get("failed") is not None
            elif self.protocol in TCP_PROTOCOLS or self.protocol in PEER_PROTOCOLS:
                n += st["tx"].DoneNs() >= 0
            else:  # every datagram sent, and time for the last one to arrive (or be dropped)
                last = st["tx"].LastNs()
                n += last >= 0 and self.clock() * 1e9 >= last + UDP_DRAIN_US * 1e3
        return n

    def _flows_done(self) -> bool:
        if not self.flows:
            return True
        done = sum(int(s.Done().size()) for s in self._flow_sinks.values())
        return done >= len(self.flows)

    def _on_check(self) -> None:
        now = self.clock()
        done = self._done_count()
        finished = done >= len(self.jobs) and self._flows_done() and all(
            now >= b.start_s + b.duration_s for b in self.background)
        wall = time.perf_counter()
        if self.progress is not None and (finished or wall - self._last_progress >= 5.0):
            self._last_progress = wall
            self.progress(f"  {self.label}: simulated {now * 1e3:.3f} ms, {done}/{len(self.jobs)} jobs done, "
                          f"{wall - self._wall_run:.0f} s")
        if finished:
            self._stopped_at = now
            self.ns.Simulator.Stop()
            return
        self._schedule(self.settings.check_us * 1e-6, self._on_check)

    # -- results -------------------------------------------------------------------------------------

    def _collect(self, sim_end: float) -> dict:
        rate = self.settings.topology.host_gbps * 1e9
        jobs = [self._job_metrics(st, rate) for st in self._job_state.values()]
        queues = self._queue_stats(sim_end)
        out: dict[str, Any] = {"protocol": self.protocol, "seed": self.seed, "jobs": jobs, "queues": queues,
                               "sim_end_s": sim_end, "completed_all": self._stopped_at is not None}
        if self.flows:
            out["flows"] = self._flow_records()
        if self._bg_sinks:
            out["background_rx"] = {
                dst: {"datagrams": int(sink.Datagrams()),
                      "queue_byte": {q: int(sink.QueueSeen(q)) for q in list(range(8)) + [0xFF] if sink.QueueSeen(q)}}
                for dst, sink in self._bg_sinks.items()}
        if self.protocol in TCP_PROTOCOLS or self.flows:
            out["tcp_attributes"] = tcp_attributes(self.ns)
        if getattr(self, "homa", None):
            out["homa"] = {**self.homa, "receivers": {
                str(dst): {"grants": int(rx.GrantsSent()), "max_granted": int(rx.MaxGrantedAtOnce()),
                           "grants_at": [int(rx.GrantsAt(q)) for q in range(8)], "resends": int(rx.Resends())}
                for dst, rx in self._homa_receivers.items()}}
        if getattr(self, "aeolus", None):
            ports = [qd for sw in self.net.switches.values() for qd in sw.ports.values()]
            out["aeolus"] = {**self.aeolus,
                             "unscheduled_drops": sum(int(qd.UnscheduledDrops()) for qd in ports),
                             "credit_drops": sum(int(qd.CreditDrops()) for qd in ports),
                             "credits_sent": sum(int(rx.CreditsSent()) for rx in self._aeolus_receivers.values())}
        if is_atp(self.protocol):
            out["atp_config"] = dataclasses.asdict(self.atp_config)
            reasons: dict[str, int] = {}
            for d in self.decisions:
                reasons[d["reason"]] = reasons.get(d["reason"], 0) + 1
            snap = self.runtime.snapshot()
            writes = {op: sum(sw[op] for sw in snap["switches"].values()) for op in ("insert", "modify", "delete")}
            out["controller"] = {"epochs": self.runtime.epochs, "decisions": reasons, "table_writes": writes,
                                 "reports_accepted": snap["reports_accepted"],
                                 "reports_dropped": sum(snap["reports_dropped"].values()),
                                 "policy_mode": self.policy.mode}
            if self.tuning:
                out["tuning"] = self.tuning
            if self.timeline_job is not None:
                st = self._job_state.get(self.timeline_job)
                out["timeline"] = st["timeline"] if st else []
                out["decisions"] = [d for d in self.decisions if d["job"] == self.timeline_job]
                # the experiment layer's timeline fields, in simulated seconds
                out["timeline_start"] = st["job"].start_s if st else 0.0
                out["queue_changes"] = [{"wall": d["time"], "assignments": {str(d["job"]): d["new"]}}
                                        for d in out["decisions"] if d["new"] is not None]
                out["background_starts"] = [b.start_s for b in self.background]
        host = self._host_queue_stats()
        out["queues"]["host_drops"], out["queues"]["host_ce_marks"] = host["dropped"], host["marked"]
        out["perf"] = {"switch_packets": queues.pop("_switch_packets"), "host_packets": host["sent"]}
        return out

    def _host_queue_stats(self) -> dict[str, int]:
        """Packets sent, dropped and CE-marked by the queue discs under the hosts' NICs, over every host."""
        n = {"sent": 0, "dropped": 0, "marked": 0}
        for h in self.net.hosts:
            tc = h.node.GetObject["ns3::TrafficControlLayer"]()
            qd = tc.GetRootQueueDiscOnDevice(h.device)
            if qd:
                st = qd.GetStats()
                n["sent"] += int(st.nTotalSentPackets)
                n["dropped"] += int(st.nTotalDroppedPackets)
                n["marked"] += int(st.nTotalMarkedPackets)
        return n

    def _job_metrics(self, st: dict, rate: float) -> dict:
        job: JobPlan = st["job"]
        wl = job.workload
        n = wl.n
        m = M.job_record(job, rate, IP_UDP + PPP_HEADER)
        if is_atp(self.protocol):
            summ = st.get("summary")
            if summ is not None:
                delivered = sum(gs.delivered for gs in summ.groups)
                lost_ids = summ.lost_ids
                m.update(jct_s=summ.jct_s, msr_met=summ.msr_met(), delivered=delivered,
                         msg_loss=len(lost_ids) / n if n else None,
                         pkt_loss=summ.packets_lost / summ.packets_sent if summ.packets_sent else None,
                         packets_sent=summ.packets_sent, retransmissions=summ.retransmissions,
                         losses_found_by=dict(summ.losses_found_by), spurious_losses=summ.spurious_losses,
                         receiver_confirmed=summ.receiver_confirmed,
                         final_tlr=[gs.final_tlr for gs in summ.groups],
                         delivered_bytes_frac=M.atp_delivered_bytes_frac(wl, lost_ids))
            elif st.get("failed"):
                m["failed"] = st["failed"]
            ep = st.get("endpoint")
            if ep is not None:
                m["host_send_failures"] = ep.send_failures
        elif self.protocol in TCP_PROTOCOLS:
            tx, rx = st["tx"], st["rx"]
            done = tx.DoneNs()
            stats = tx.Stats()
            received = int(rx.Received())
            delivered = _messages_in_stream(wl, received, self.protocol, self.seed * 1000 + job.job_id, job.msr)
            m.update(jct_s=(done - tx.StartNs()) * 1e-9 if done >= 0 else None, msr_met=done >= 0,
                     delivered=delivered, msg_loss=0.0 if done >= 0 else None,
                     pkt_loss=int(stats.retransmissions) / int(stats.segments) if int(stats.segments) else None,
                     segments=int(stats.segments), retransmissions=int(stats.retransmissions),
                     timeouts=int(stats.timeouts), ecn_reductions=int(stats.cwr), stream_bytes=st["total"],
                     bytes_received=received, delivered_bytes_frac=M.tcp_delivered_bytes_frac(wl, received, delivered))
        elif self.protocol in PEER_PROTOCOLS:
            tx, rx = st["tx"], st["rx"]
            done = tx.DoneNs()
            received = min(st["total"], int(rx.Contiguous(self.net.hosts[job.src].ip, job.job_id)) * PFABRIC_MSS)
            delivered = _messages_in_stream(wl, received, self.protocol, self.seed * 1000 + job.job_id, job.msr)
            sent = int(tx.Sent())
            m.update(jct_s=(done - tx.StartNs()) * 1e-9 if done >= 0 else None, msr_met=done >= 0,
                     delivered=delivered, msg_loss=0.0 if done >= 0 else None,
                     pkt_loss=int(tx.Retransmissions()) / sent if sent else None, packets_sent=sent,
                     retransmissions=int(tx.Retransmissions()), timeouts=int(tx.Timeouts()),
                     stream_bytes=st["total"], bytes_received=received,
                     delivered_bytes_frac=M.tcp_delivered_bytes_frac(wl, received, delivered))
            if self.protocol in PFABRIC_PROTOCOLS:
                m["probes"] = int(tx.Probes())
            elif self.protocol in AEOLUS_PROTOCOLS:
                m.update(credits=int(tx.Credits()), credits_wasted=int(tx.CreditsWasted()),
                         unscheduled_sent=int(tx.UnscheduledSent()), probe_losses=int(tx.ProbeLosses()))
            else:
                m["grants"] = int(tx.Grants())
        else:
            tx, rx = st["tx"], st["rx"]
            t = rx.TargetNs(job.job_id)
            complete = int(rx.Complete(job.job_id))
            sent = int(tx.Sent())
            m.update(jct_s=(t - tx.StartNs()) * 1e-9 if t >= 0 else None, msr_met=t >= 0, delivered=complete,
                     msg_loss=1 - complete / n, pkt_loss=1 - int(rx.Packets(job.job_id)) / sent if sent else None)
        return M.finish_record(m)

    def _queue_stats(self, sim_end: float) -> dict:
        """Time-average and peak backlog of the switch ports facing the jobs' receivers (NetApprox Fig. 7/8),
        split into queue 0 and the approximate queues, plus drops and marks over every switch port."""
        receivers = sorted({j.dst for j in self.jobs})
        means, peaks, approx_means = [], [], []
        for h in receivers:
            sw, port = self.net.host_port(h)
            qd = self.net.switches[sw].queue_disc(port)
            span = max(1e-12, sim_end - float(qd.CountersSince()))
            per_q = [qd.Counters(q) for q in range(8)]
            means.append(sum(c.backlogIntegral for c in per_q) / span)
            approx_means.append(sum(c.backlogIntegral for c in per_q[1:]) / span)
            peaks.append(max(int(c.maxBacklog) for c in per_q))
        per_queue = [{"enqueued": 0, "dropped": 0, "trimmed": 0, "marked": 0, "max_backlog": 0} for _ in range(8)]
        tx = 0
        host_facing = {self.net.host_port(h.index) for h in self.net.hosts}
        lost_at = {"host_facing": 0, "fabric": 0}  # drops + trims on ports facing a host / between switches
        for name, sw in self.net.switches.items():
            for port, qd in sw.ports.items():
                where = "host_facing" if (name, port) in host_facing else "fabric"
                for q in range(8):
                    c = qd.Counters(q)
                    pq = per_queue[q]
                    pq["enqueued"] += int(c.enqueued)
                    pq["dropped"] += int(c.dropped)
                    pq["trimmed"] += int(c.trimmed)
                    lost_at[where] += int(c.dropped) + int(c.trimmed)
                    pq["marked"] += int(c.marked)
                    pq["max_backlog"] = max(pq["max_backlog"], int(c.maxBacklog))
                    tx += int(c.transmitted)
        return {"receiver_port_mean_pkts": sum(means) / len(means) if means else None,
                "receiver_port_approx_mean_pkts": sum(approx_means) / len(approx_means) if approx_means else None,
                "receiver_port_max_pkts": max(peaks) if peaks else None,
                "switch_drops": sum(p["dropped"] for p in per_queue),
                "switch_trims": sum(p["trimmed"] for p in per_queue), "lost_at": lost_at,
                "switch_ce_marks": sum(p["marked"] for p in per_queue), "per_queue": per_queue,
                "_switch_packets": tx}

    def _flow_records(self) -> list[dict]:
        done: dict[int, int] = {}
        for sink in self._flow_sinks.values():
            for item in sink.Done():
                done[int(item.first)] = int(item.second)
        out = []
        for i, f in enumerate(self.flows):
            t = done.get(i)
            out.append({"src": f.src, "dst": f.dst, "size": f.size, "trace_size": f.trace_size,
                        "start_s": f.start_s, "fct_s": (t * 1e-9 - f.start_s) if t is not None else None})
        return out

    def _teardown(self) -> None:
        for ep in getattr(self, "_endpoints", []):
            ep.close()
        for ep, _st in getattr(self, "_receivers", {}).values():
            ep.close()
        if getattr(self, "runtime", None) is not None:
            self.runtime.close()
        self.ns.Simulator.Destroy()
        host_sim.reset()
        self._keep = []
        self._job_state = {}
        self._endpoints, self._receivers = [], {}
        self.net = None
        self.runtime = None


def _messages_in_stream(wl: JobWorkload, received: int, protocol: str, seed: int, msr: float) -> int:
    """Complete messages in the first ``received`` bytes of a TCP baseline's stream."""
    order = stream_order(wl, msr, protocol, seed)
    left = received - TCP_JOB_HEADER
    n = 0
    for i in order:
        left -= TCP_MSG_HEADER + wl.sizes[i]
        if left < 0:
            break
        n += 1
    return n


class _DecisionSink(DecisionLog):
    """The runtime's decision log, handed to a callback instead of a file (enabled, so epochs log too)."""

    def __init__(self, sink: Callable[..., None]) -> None:
        super().__init__(None)
        self._sink = sink

    @property
    def enabled(self) -> bool:
        return True

    def write(self, event: str, **fields: Any) -> None:
        self._sink(event, **fields)


def run_trial(settings: SimSettings, protocol: str, jobs: Sequence[JobPlan], *, seed: int, **kw: Any) -> dict:
    """Build, run and tear down one trial (see ``Trial``)."""
    return Trial(settings, protocol, jobs, seed=seed, **kw).run()
