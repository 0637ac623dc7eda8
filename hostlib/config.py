"""Configuration and job description: frozen values, filled in by callers (argparse only in ``__main__``)."""
from __future__ import annotations

import dataclasses
import math
import struct
from typing import Iterable, Mapping, Sequence

from netapprox.hostlib import wire

MODES = ("adaptive", "paper", "fixtlr", "base")
MODE_ALIASES = {"full": "paper"}  # the name the paper's algorithm had before ``adaptive`` existed
COMPLETION_POLICIES = ("all_sent", "early")
MAX_MESSAGES = 0xFFFFFFF0  # msg ids above this are control messages (hostlib/control.py)
_MIN_BUDGET_PER_SLOT = 32 << 10
DEFAULT_MAX_RATE_BPS = 1e9
DEFAULT_FIRST_WINDOW_MAX = 64
"""Packets: the most a first window computed from the guessed ``initial_rtt_s`` may be."""
"""R_max when none is configured and the egress interface reports no speed (hostlib/link.py)."""  # half of it is the slot's guarantee: a job record and some data


JOB_RANK_MAX_LEVELS = 7
"""The most job ranks: one per approximate queue of a NetApprox switch (queues 1..7)."""
GRANT_WINDOW_MAX_PACKETS = (4 << 20) // 4096
"""Receiver grants: the most packets a budget sized by the rate may keep in flight towards a receiver (1024): what
the 4 MiB receive buffer hostlib asks its UDP sockets for (hostlib/udp.py) holds at 4 KiB of kernel memory per
full-size datagram. Granting more than the socket holds turns a receiver that is slower than its senders into
losses (docs/results.md, "Two keys that slipped")."""
_JOB_RANK_HASH = 2654435761


def job_rank(job_id: int, levels: int, age_s: float = 0.0, promote_s: float = 0.0) -> int:
    """The rank a job's packets carry (``AtpConfig.job_rank_levels``): ``(job_id x 2654435761 >> 7) mod
    levels`` (Knuth's multiplicative hash: consecutive ids spread over the levels), less one per ``promote_s``
    of ``age_s`` when ``promote_s`` > 0, at least 0. The C core computes the same (hostlib/native/sender.c)."""
    rank = ((job_id & 0xFFFFFFFF) * _JOB_RANK_HASH >> 7) % levels
    if promote_s > 0 and age_s > 0:
        rank = max(0, rank - int(age_s / promote_s))
    return rank


class ConfigError(ValueError):
    """A configuration or job description that cannot work; the message says which field and why."""


@dataclasses.dataclass(frozen=True)
class AtpConfig:
    """Sender and receiver knobs. Defaults suit a 20-100 Mbit/s emulated network with a ~1-10 ms RTT."""

    mode: str = "adaptive"
    """``adaptive`` (default): dynamic TLR (eq. 1) and an ACK-clocked window of packets in flight, paced at
    R_max, that is cut only while the measured loss (over packets whose fate is known) exceeds the TLR
    (docs/hostlib.md). ``paper`` (also ``full``): dynamic TLR (eq. 1) + the paper's rate control (eq. 2/3,
    per-epoch loss, R_min floor). Ablations of ``paper``: ``fixtlr``, static TLR = 1 - MSR; ``base``, send
    everything at ``max_rate_bps``, then retransmit until every MSR is met."""

    mrdf: bool = True
    """Minimal-remaining-data-first scheduling. Off: messages go in id order, repairs first."""

    completion: str = "early"
    """``early`` (default): done as soon as every group meets its MSR. ``all_sent``: done when every group
    meets its MSR and every message was sent at least once (messages the MSR does not need delay it)."""

    max_rate_bps: float | None = None
    """R_max, bit/s on the wire (datagram + ``overhead_bytes``): the host's link rate. ``None``: the adapters
    that own a socket (``hostlib.api``, ``hostlib.aio``, the CLI) use the speed of the interface the route to
    the receiver leaves by, 10 Gbit/s to a receiver on this host, else ``DEFAULT_MAX_RATE_BPS``
    (hostlib/link.py); a sans-I/O core given ``None`` uses ``DEFAULT_MAX_RATE_BPS``."""

    initial_rate_bps: float | None = None
    """Starting rate; ``None`` means ``max_rate_bps``."""

    gain: float = 0.0625
    """m in eq. 2: how fast the rate climbs back towards R_max when loss is below the TLR."""

    packet_size: int = 1400
    """Largest ATP datagram (32-byte header + payload) the sender builds."""

    pack_messages: bool = True
    """Message packing: a DATA packet carries several whole one-packet messages of one group (same tags), as many
    as fit ``packet_size`` with a 6-byte record header each, taken in the scheduler's order when the pacer
    releases the packet (never waiting for more). Loss, MRDF, the MSR guarantee and acknowledgements stay per
    message. Off: one message (or one part of one) per packet."""

    overhead_bytes: int = 42
    """Per-packet bytes outside the ATP datagram counted by pacing (IPv4 20 + UDP 8 + Ethernet 14)."""

    pacing_gain: float = 1.25
    """``adaptive``: the pacing rate is this times R_max. The window (one queue plus one bandwidth-delay product)
    bounds what is in flight, so pacing above the bottleneck's rate fills the switch's queue instead of losing
    packets, and lets a sender woken late catch up: time a stall costs is not lost for good."""

    burst_packets: int = 2
    """Token bucket depth in packets: approximate switch queues are a few packets deep, so bursts are loss."""

    pacing_train_s: float = 1e-3
    """Pacing in trains: the token bucket holds this long's worth of bytes at the current rate when that is more
    than ``burst_packets`` (above ~23 Mbit/s at the defaults), so a sender woken late by up to this much still
    keeps its rate, and at high rates one wake-up sends a train of packets (one GSO batch). 1 ms is the pacing
    quantum Linux sizes TSO bursts to. A train never exceeds the queue the switch stamped on the last data ACK
    (``queue_packets``), and is ``burst_packets`` until the first data ACK says how deep that queue is.
    0: ``burst_packets`` only."""

    initial_rtt_s: float = 0.01
    """RTT assumed before the first sample."""

    min_epoch_s: float = 0.002
    """Floor of the epoch length; an epoch is one smoothed RTT but never shorter than this."""

    epoch_s: float | None = None
    """Fixed epoch length; ``None`` means one smoothed RTT (floored by ``min_epoch_s``)."""

    initial_window: int | None = None
    """The first window, packets: what a job sends before anything comes back, at the pacing rate. ``None``: one
    bandwidth-delay product, ``max_rate_bps`` x ``initial_rtt_s`` in full packets (at least 2, at most
    ``DEFAULT_FIRST_WINDOW_MAX``: ``initial_rtt_s`` is a guess until the first sample, 10 ms by default, so the
    default does not trust it further; give the window to go further, as the simulations do with their base
    RTT), so a job starts at line rate. Losses of first-window packets (first windows of jobs that start together collide at their
    receiver) do not cut the ``adaptive`` window nor end its ramp (it opens by one per acknowledgement until
    the first loss above the TLR, then by ``gain`` x its ceiling per window)."""

    first_window_low: bool = False
    """Send the first window as the lowest priority (TLR 1.0, the surplus queue of every NetApprox switch), so
    that it uses only capacity that scheduled packets (those a receiver granted) leave free (Aeolus). Off by
    default (docs/simulation.md has the measurement)."""

    job_rank_levels: int = 0
    """A rank between jobs from their first packet (0: off, hostlib's default). With L in 1..7, every approximate
    DATA packet of a message without CadentFlow tags carries the flag ``TAGGED`` and, in ``priority``, the job's
    rank: ``job_rank(job_id, L)`` (a hash of the job id, 0..L-1), one level more urgent every
    ``job_rank_promote_s`` of the job's age, never below 0 (weight 1, no deadline). A controller with the
    policy key ``rank_levels`` maps rank r to approximate queue 1 + r and leaves ranked jobs to their tags, so
    jobs into one receiver are served one before another rather than interleaved in one queue
    (docs/hostlib.md, Job ranks; docs/results.md, "Jobs that share a receiver")."""

    job_rank_promote_s: float = 0.0
    """With ``job_rank_levels``: a job's rank moves one level towards 0 every this many seconds of its age
    (0: never), so no job stays behind the others it meets for longer than ``(L - 1)`` x this."""

    surplus: bool = True
    """``adaptive``: once the messages on their way cover a group's MSR, send further messages as surplus (TLR 1.0:
    the lowest queue of every NetApprox switch, so they use only spare capacity). Off (with the ``early``
    completion): send nothing the MSR does not need until losses make it need more; a receiver that grants never
    gets surplus beyond the first window either."""

    max_window: int = 1024
    """``adaptive``: most packets in flight."""

    queue_packets: tuple[int, ...] = (64, 7, 6, 5, 4, 3, 2, 1)
    """``adaptive``: buffer of each logical queue in MTUs, as NetApprox switches size them (queue k >= 1 holds
    8 - k MTUs of bytes): when ACKs echo the queue the switch chose, the window stops at that queue (counted
    in packets of the size being sent) plus one bandwidth-delay product. A queue listed as 0 (or no stamp)
    leaves the ceiling to loss."""

    loss_memory: int = 64
    """``adaptive``: the loss rate is measured over roughly the last this-to-twice-this packets whose fate is
    known (acknowledged or declared lost); packets in flight never count."""

    loss_min_samples: int = 8
    """``adaptive``: fates needed before the loss rate is trusted."""

    reorder_threshold: int = 3
    """A packet is lost when a packet sent this many sequence numbers later is acknowledged (until the path
    is seen reordering: ``adaptive_reorder``)."""

    adaptive_reorder: bool = True
    """Once the path is seen reordering (a packet acknowledged after one sent later, or after it was declared lost),
    find losses by time only, with a reorder window of min RTT / 4 that spurious losses widen (at most one srtt), back
    to ``reorder_threshold`` after 16 losses with none spurious (model: RACK, RFC 8985; recovery.py). Off: the fixed
    ``reorder_threshold`` and 9/8 RTT."""

    path_reorders: bool = False
    """The network is known to reorder this job's packets (it sprays them over equal-cost paths; a deployment says
    so, as Linux's ``net.ipv4.tcp_reordering`` does): with ``adaptive_reorder``, the job starts as if it had seen
    reordering, its first window's losses found by time with the reorder window from the first RTT sample, not by
    ``reorder_threshold`` packets before the first reordered ACK comes back. 16 losses with none spurious still
    bring back ``reorder_threshold`` (a wrong hint costs only those)."""

    min_loss_timeout_s: float = 0.005
    """Floor of the time after which an unacknowledged packet counts as lost."""

    idle_timeout_s: float = 10.0
    """Sender: give up when nothing has been acknowledged for this long. Receiver: forget a job that
    has been silent this long (abandoned)."""

    fin_timeout_s: float = 2.0
    """Sender: how long to wait for the receiver's DONE after the job completed before finishing
    without it (the summary then says ``receiver_confirmed: false``)."""

    report_key: bytes | None = None
    """HMAC key for REPORT packets to the controller; ``None`` sends them unsigned."""

    admission_key: bytes | None = None
    """Shared key for job admission (docs/hostlib.md, threat model). Sender: signs every announce part
    with it. Receiver: drops announces without a valid signature, unanswered. ``None``: announces are
    unsigned and any host that can echo an admission token gets a job slot."""

    # receiver limits (memory stays bounded whatever arrives)
    memory_budget_bytes: int = 256 << 20
    """Receiver: the one budget for everything it holds (job records, manifests, delivered bitmaps, payload
    of incomplete or not-yet-in-order messages, DONE answers), as counted by ``AtpReceiver.memory``. Half
    is guaranteed to the job slots in equal parts, half is shared (hostlib/admission.py). Packets that
    would exceed it are dropped unacknowledged (``dropped["memory_budget"]``). At least 32 KiB per slot."""

    max_messages: int = 1 << 20
    """Receiver: largest N accepted for one job."""

    max_packets_per_message: int = 4096
    """Receiver: largest ``pkt_cnt`` accepted."""

    max_jobs: int = 64
    """Receiver: job slots, jobs being received at once (finished jobs answering repeated FINs do not
    hold one). A new job takes a free slot, or the slot of a stalled job, or one of a source holding more
    than its share; otherwise its announce is dropped (the sender retries)."""

    max_jobs_per_source: int = 16
    """Receiver: slots one source address (host, any port) may hold at once."""

    stall_timeout_s: float = 1.0
    """Receiver: a job that has taken no new data for this long may lose its slot to a new job when every
    slot is taken; jobs that never took any data go first."""

    token_lifetime_s: float = 10.0
    """Receiver: how long an admission token (a RETRY's, or an ACK's to an unvalidated job) stays valid."""

    address_token_lifetime_s: float = 3600.0
    """Receiver: how long an address-validation token (NEW_TOKEN, given to a validated sender's host for its next
    jobs) stays valid; the key that signs them is replaced this often (the previous one is kept for the tokens it
    signed). A returning sender presenting a valid one is admitted at once, validated, even under pressure."""

    open_admission_share: float = 0.5
    """Receiver: admit a job announced without a token at once (no round trip; its first window of data is
    kept) while fewer than this share of the job slots and of the memory budget are in use and its source holds
    fewer than this share of ``max_jobs_per_source``; otherwise, *under pressure*, answer with a RETRY and keep
    nothing, like TCP's SYN cookies (a sender with a valid address-validation token is still admitted at once:
``address_token_lifetime_s``). A job admitted
    without a token is *unvalidated* until the sender echoes the token its ACKs carry: it may hold at most its
    slot's guarantee of memory and is sent at most as many bytes as it sent. 0: always RETRY (one round trip per
    job). A receiver serving a fixed number of jobs (``accept_jobs``) always asks for a token."""

    manifest_bytes_per_s: float = 1 << 20
    """Receiver: manifest bytes one source host may have decoded per second, and twice that from all sources
    together for manifests above 1 KiB (token buckets one second deep that may go into debt: a manifest of any
    size is decoded once the debt is repaid; hostlib/admission.py). A complete announce over it is dropped
    unacknowledged (``dropped["manifest_rate"]``) and decoded when the sender retransmits it later. Decoding
    costs 30-100 ms of CPU per MiB here, so the default bounds manifest decoding to about 20% of a core
    whatever any number of senders do; ordinary jobs' manifests are a few dozen bytes."""

    finished_linger_s: float = 5.0
    """Receiver: how long a finished job's DONE is kept to answer repeated FINs."""

    receiver_grants: bool = True
    """Receiver: schedule what its jobs send beyond their first window (Homa, pHost). It grants each job how far
    it may send (a sequence number, on its ACKs or in a GRANT), in order of the least data left to reach the MSR,
    keeping ``grant_window_packets`` in flight towards itself in all; a job whose MSR is met comes last, with what
    the others are not expected to need (its sender may still send the rest: ``all_sent``). A sender follows
    grants once its receiver sends them. The grants are a few numbers in each job's record. On by default, as in
    the simulation (one default for every data plane: tests/test_parity.py); docs/results.md, "Receiver grants",
    has what was measured with and without."""

    grant_overrides_window: bool = True
    """Sender: once its receiver grants, data below the grant leaves whatever the ``adaptive`` window says (Homa,
    pHost: the receiver schedules its downlink and the sender trusts it; the window still bounds the first window
    and probes). Off: the window bounds granted data too. Without receiver grants it changes nothing."""

    grant_window_packets: int | None = None
    """Receiver: packets in flight towards it, over all the jobs it grants; ``None``: one bandwidth-delay product
    (``max_rate_bps`` x ``initial_rtt_s``, at least 2 packets) in the packets that arrive: full packets until the
    first DATA packet, then the mean size on the wire of the DATA packets that arrived whole. A receiver not told
    its rate (``max_rate_bps`` None) measures the rate its link delivers (hostlib/receiver.py, ``DeliveryRate``)
    and grants nothing before its first estimate."""

    grant_window_max_packets: int | None = GRANT_WINDOW_MAX_PACKETS
    """Receiver: the most packets a budget that follows the rate (``grant_window_packets`` None) may grant in flight;
    ``None``: no bound. The default is what hostlib's receive buffer holds (``GRANT_WINDOW_MAX_PACKETS``): a
    bandwidth-delay product at the guessed ``initial_rtt_s`` of a fast host (4-5 Gbit/s over loopback: 4,000
    packets) would otherwise send the senders more than the receiving socket can queue."""

    ack_every: int = 16
    """Receiver: ACK coalescing. Packets of a job that arrive in one batch (between two ``datagrams_to_send``
    calls) share one ACK, at most this many per ACK; it echoes the newest of them and its SACK blocks cover the
    rest (docs/wire-format.md). A packet with another queue byte or CE mark than the ones waiting ends the run.
    1: one ACK per DATA packet. At most 16 (``wire.MAX_SACK_BLOCKS``), so the blocks cover every packet."""

    def __post_init__(self) -> None:
        if self.mode in MODE_ALIASES:
            object.__setattr__(self, "mode", MODE_ALIASES[self.mode])
        if self.mode not in MODES:
            raise ConfigError(f"mode {self.mode!r}: choose one of {', '.join(MODES)}")
        if self.completion not in COMPLETION_POLICIES:
            raise ConfigError(f"completion {self.completion!r}: choose one of {', '.join(COMPLETION_POLICIES)}")
        if self.max_rate_bps is not None and (not self.max_rate_bps > 0 or math.isinf(self.max_rate_bps)):
            raise ConfigError(f"max_rate_bps must be a positive finite rate (or None), got {self.max_rate_bps}")
        if self.initial_rate_bps is not None and not (
                0 < self.initial_rate_bps <= (self.max_rate_bps or math.inf) and not math.isinf(self.initial_rate_bps)):
            raise ConfigError(f"initial_rate_bps must be in (0, max_rate_bps={self.max_rate_bps or 'R_max'}]")
        if not 0 < self.gain <= 1:
            raise ConfigError(f"gain (m) must be in (0, 1], got {self.gain}")
        if not wire.HEADER_LEN + 16 <= self.packet_size <= 65507:
            raise ConfigError(f"packet_size {self.packet_size}: must be 48..65507 bytes (UDP payload)")
        if not 1.0 <= self.pacing_gain <= 4.0:
            raise ConfigError(f"pacing_gain must be in [1, 4], got {self.pacing_gain}")
        if self.burst_packets < 1:
            raise ConfigError("burst_packets must be >= 1")
        if not self.pacing_train_s >= 0 or math.isinf(self.pacing_train_s):
            raise ConfigError(f"pacing_train_s must be >= 0 seconds, got {self.pacing_train_s}")
        if not 1 <= self.ack_every <= wire.MAX_SACK_BLOCKS:
            raise ConfigError(f"ack_every must be in 1..{wire.MAX_SACK_BLOCKS}, got {self.ack_every}")
        for name in ("initial_rtt_s", "min_epoch_s", "min_loss_timeout_s", "idle_timeout_s", "fin_timeout_s",
                     "finished_linger_s", "stall_timeout_s", "token_lifetime_s", "address_token_lifetime_s",
                     "manifest_bytes_per_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 1.0 <= self.address_token_lifetime_s <= 2**31 / 1000:
            raise ConfigError(f"address_token_lifetime_s must be 1 s .. 24 days, got {self.address_token_lifetime_s}")
        if self.epoch_s is not None and not self.epoch_s > 0:
            raise ConfigError(f"epoch_s must be > 0 or None, got {self.epoch_s}")
        if self.initial_window is not None and not 1 <= self.initial_window <= self.max_window:
            raise ConfigError(f"need 1 <= initial_window <= max_window, got {self.initial_window}, {self.max_window}")
        if self.grant_window_packets is not None and self.grant_window_packets < 1:
            raise ConfigError(f"grant_window_packets must be >= 1 or None, got {self.grant_window_packets}")
        if self.grant_window_max_packets is not None and self.grant_window_max_packets < 2:
            raise ConfigError(f"grant_window_max_packets must be >= 2 or None, got {self.grant_window_max_packets}")
        if len(self.queue_packets) != 8 or any(q < 0 for q in self.queue_packets):
            raise ConfigError(f"queue_packets needs 8 sizes >= 0, got {self.queue_packets}")
        if self.loss_memory < 1 or not 1 <= self.loss_min_samples <= 2 * self.loss_memory:
            raise ConfigError("need loss_memory >= 1 and 1 <= loss_min_samples <= 2 * loss_memory")
        if self.reorder_threshold < 1:
            raise ConfigError("reorder_threshold must be >= 1")
        if not 0 <= self.job_rank_levels <= JOB_RANK_MAX_LEVELS:
            raise ConfigError(f"job_rank_levels must be in 0..{JOB_RANK_MAX_LEVELS}, got {self.job_rank_levels}")
        if not self.job_rank_promote_s >= 0 or math.isinf(self.job_rank_promote_s):
            raise ConfigError(f"job_rank_promote_s must be >= 0 seconds, got {self.job_rank_promote_s}")
        if not 1 <= self.max_messages <= MAX_MESSAGES:
            raise ConfigError(f"max_messages must be in 1..{MAX_MESSAGES}")
        if not 1 <= self.max_packets_per_message <= 0xFFFF:
            raise ConfigError("max_packets_per_message must be in 1..65535")
        if self.max_jobs < 1 or self.max_jobs_per_source < 1:
            raise ConfigError("max_jobs and max_jobs_per_source must be >= 1")
        if self.memory_budget_bytes < self.max_jobs * _MIN_BUDGET_PER_SLOT:
            raise ConfigError(f"memory_budget_bytes {self.memory_budget_bytes}: at least "
                              f"{_MIN_BUDGET_PER_SLOT // 1024} KiB per job slot (max_jobs {self.max_jobs})")
        if not 0.0 <= self.open_admission_share <= 1.0:
            raise ConfigError(f"open_admission_share must be in [0, 1], got {self.open_admission_share}")
        if self.admission_key is not None and not self.admission_key:
            raise ConfigError("admission_key is empty; use None for no key")

    @property
    def max_payload(self) -> int:
        return self.packet_size - wire.HEADER_LEN

    @property
    def grant_cap_packets(self) -> int:
        """``grant_window_max_packets``, 0 for none (the native receiver reads it)."""
        return self.grant_window_max_packets or 0

    def grant_budget_for(self, packets: int) -> int:
        """A budget that follows the rate, ``packets`` (at least 2), bounded by ``grant_window_max_packets``."""
        packets = max(2, packets)
        return min(packets, self.grant_window_max_packets) if self.grant_window_max_packets else packets

    @property
    def bdp_packets(self) -> int:
        """One bandwidth-delay product, ``max_rate_bps`` (``DEFAULT_MAX_RATE_BPS`` when None) x ``initial_rtt_s``,
        in full packets (at least 2)."""
        rate = self.max_rate_bps or DEFAULT_MAX_RATE_BPS
        return max(2, math.ceil(rate * self.initial_rtt_s / ((self.packet_size + self.overhead_bytes) * 8)))

    @property
    def first_window(self) -> int:
        """``initial_window``, or one bandwidth-delay product (at most ``DEFAULT_FIRST_WINDOW_MAX``)."""
        if self.initial_window is not None:
            return self.initial_window
        return min(self.max_window, DEFAULT_FIRST_WINDOW_MAX, self.bdp_packets)


@dataclasses.dataclass(frozen=True)
class Tags:
    """CadentFlow tags, stamped into every packet of a message (TAGGED flag)."""

    priority: int = 0
    """0 = most urgent .. 255."""

    weight: int = 1
    """1..255."""

    deadline_s: float | None = None
    """Deadline in seconds after the job starts; packets carry the remaining slack in µs at send time."""

    def __post_init__(self) -> None:
        if not 0 <= self.priority <= 255:
            raise ConfigError(f"tag priority {self.priority}: must be 0..255")
        if not 1 <= self.weight <= 255:
            raise ConfigError(f"tag weight {self.weight}: must be 1..255")
        if self.deadline_s is not None and not self.deadline_s >= 0:
            raise ConfigError(f"tag deadline {self.deadline_s}: must be >= 0 seconds")


@dataclasses.dataclass(frozen=True)
class Message:
    """One application message: delivered only when all its packets arrive."""

    data: bytes
    """Payload; split into packets of at most ``AtpConfig.max_payload`` bytes."""

    group_id: int = 0
    """Sampling group (0 = the job's global group)."""

    tags: Tags | None = None
    """CadentFlow tags for this message; ``None`` uses the job's tags."""


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """A job: N messages, a global MSR and optional per-group MSRs. Message ``i`` has msg_id ``i``."""

    job_id: int
    """Unique per controller domain, 1..2^32-1 (0 is reserved)."""

    messages: tuple[Message, ...]
    """The job's messages, in msg_id order."""

    msr: float = 1.0
    """Minimal message sampling rate of every group without its own entry in ``group_msr``."""

    group_msr: tuple[tuple[int, float], ...] = ()
    """Per-group MSRs as ``(group_id, msr)`` pairs (a dict is accepted and frozen)."""

    tags: Tags | None = None
    """CadentFlow tags for every message without its own."""

    vector_len: int | None = None
    """Set by :meth:`from_vector`: the job carries one float32 vector of this length."""

    def __post_init__(self) -> None:
        if isinstance(self.group_msr, Mapping):
            object.__setattr__(self, "group_msr", tuple(sorted(self.group_msr.items())))
        if not isinstance(self.messages, tuple):
            object.__setattr__(self, "messages", tuple(self.messages))
        if not 1 <= self.job_id <= 0xFFFFFFFF:
            raise ConfigError(f"job_id {self.job_id}: must be 1..4294967295 (0 is reserved)")
        if not self.messages:
            raise ConfigError("a job needs at least one message")
        if len(self.messages) > MAX_MESSAGES:
            raise ConfigError(f"{len(self.messages)} messages; at most {MAX_MESSAGES} per job")
        for g, msr in ((None, self.msr), *self.group_msr):
            if not (isinstance(msr, (int, float)) and 0.0 <= msr <= 1.0):
                where = "global MSR" if g is None else f"MSR of group {g}"
                raise ConfigError(f"{where} is {msr!r}; must be in [0, 1]")
        for i, m in enumerate(self.messages):
            if not 0 <= m.group_id <= 0xFFFF:
                raise ConfigError(f"message {i}: group_id {m.group_id} must be 0..65535")
            if not isinstance(m.data, (bytes, bytearray, memoryview)):
                raise ConfigError(f"message {i}: data must be bytes, got {type(m.data).__name__}")

    def msr_of(self, group_id: int) -> float:
        for g, msr in self.group_msr:
            if g == group_id:
                return float(msr)
        return float(self.msr)

    def group_sizes(self) -> dict[int, int]:
        sizes: dict[int, int] = {}
        for m in self.messages:
            sizes[m.group_id] = sizes.get(m.group_id, 0) + 1
        return sizes

    def required(self, group_id: int, total: int | None = None) -> int:
        """ceil(MSR_g * N_g): messages of group ``group_id`` that must be delivered."""
        n = self.group_sizes()[group_id] if total is None else total
        return required_messages(self.msr_of(group_id), n)

    @classmethod
    def uniform(cls, job_id: int, *, messages: int, size: int, msr: float = 1.0,
                groups: Sequence[tuple[int, float, int]] = (), tags: Tags | None = None) -> "JobSpec":
        """``messages`` messages of group 0 (global MSR ``msr``), then for each ``(group, msr, count)``
        ``count`` messages of that group; every message ``size`` bytes of a recognisable pattern."""
        if messages < 0 or size < 0:
            raise ConfigError("message count and size must be >= 0")
        msgs: list[Message] = []
        group_msr: dict[int, float] = {}
        plan = [(0, msr, messages)] + [tuple(g) for g in groups]
        for group_id, g_msr, count in plan:
            if count < 0:
                raise ConfigError(f"group {group_id}: negative message count {count}")
            if group_id != 0 or count:
                if group_id in group_msr and group_id != 0:
                    raise ConfigError(f"group {group_id} given twice")
                if group_id != 0:
                    group_msr[group_id] = g_msr
            for _ in range(count):
                msgs.append(Message(pattern_bytes(len(msgs), size), group_id))
        return cls(job_id=job_id, messages=tuple(msgs), msr=msr, group_msr=group_msr, tags=tags)

    @classmethod
    def from_vector(cls, job_id: int, values: Iterable[float], *, msr: float,
                    floats_per_message: int = wire.floats_per_packet(1400 - wire.HEADER_LEN),
                    group_id: int = 0, tags: Tags | None = None) -> "JobSpec":
        """A float32 vector split so that no float straddles packets: message ``i`` is one packet
        carrying the range header and ``floats_per_message`` values (bounded-loss paper §3.2)."""
        vals = list(values)
        if floats_per_message < 1:
            raise ConfigError("floats_per_message must be >= 1")
        msgs = tuple(
            Message(wire.encode_float_range(i, vals[i:i + floats_per_message]), group_id)
            for i in range(0, len(vals), floats_per_message)
        )
        return cls(job_id=job_id, messages=msgs, msr=msr, tags=tags, vector_len=len(vals))


def required_messages(msr: float, total: int) -> int:
    """ceil(msr * total), robust to float error (0.9 * 10 is 9, not 10)."""
    return min(total, math.ceil(round(msr * total, 9)))


def pattern_bytes(msg_id: int, size: int) -> bytes:
    """Deterministic payload for synthetic messages: the msg id repeated, so corruption is visible."""
    if size == 0:
        return b""
    unit = struct.pack("!I", msg_id & 0xFFFFFFFF)
    return (unit * (size // 4 + 1))[:size]


def parse_queue_packets(text: str) -> tuple[int, ...]:
    """``"36,7,6,5,4,3,2,1"``: each switch queue's buffer in MTUs from queue 0, as ``AtpConfig.queue_packets``
    takes it; a ConfigError (a ValueError) says what is wrong."""
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"queue_packets {text!r}: need 8 comma-separated integers") from None
    if len(sizes) != 8 or any(q < 0 for q in sizes):
        raise ConfigError(f"queue_packets {text!r}: need 8 comma-separated integers >= 0")
    return sizes


def parse_rate(text: str) -> float:
    """``100M``, ``20m``, ``1.5G``, ``500k`` or a plain number: bit/s."""
    t = text.strip()
    scale = {"k": 1e3, "m": 1e6, "g": 1e9}
    mult = 1.0
    if t and t[-1].lower() in scale:
        mult = scale[t[-1].lower()]
        t = t[:-1]
    if t.lower().endswith("bit"):
        t = t[:-3]
    try:
        value = float(t) * mult
    except ValueError:
        raise ConfigError(f"rate {text!r}: expected a number with optional k/M/G suffix, e.g. 100M") from None
    if not value > 0 or math.isinf(value):
        raise ConfigError(f"rate {text!r} must be positive")
    return value
