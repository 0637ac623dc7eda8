"""Controller configuration: frozen dataclasses, filled from a TOML file (``load_config``) and CLI flags
(``controller/__main__.py``) at the edge only. docs/controller.md documents every key; an annotated example
is ``controller/examples/bmv2.toml``.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import secrets
import socket
import tomllib
import types
from pathlib import Path
from typing import Any, Iterable, Mapping

from netapprox.controller.drivers import ARBITRATED_KINDS, DEFAULT_KIND, DRIVER_CLASSES, parse_options, path_options
from netapprox.controller.errors import ConfigError, did_you_mean
from netapprox.controller.model import (
    DEFAULT_APPROX_BUFFERS,
    FIRST_APPROX_QUEUE,
    POLICY_THRESHOLDS,
    NUM_QUEUES,
    ClassRule,
    EcmpRoute,
    Route,
    check_thresholds,
)
from netapprox.hostlib import checks as C
from netapprox.hostlib.config import ConfigError as HostConfigError
from netapprox.hostlib.reporting import read_report_key
from netapprox.hostlib.wire import DEFAULT_REPORT_PORT

OBJECTIVES = ("priority", "deadline", "weight")
POLICY_MODES = ("adaptive", "netapprox", "static", "fifo")
DRIVER_KINDS = tuple(DRIVER_CLASSES)
NO_DEADLINE = 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class TaggedFlow:
    """One component flow of a CadentFlow: the tag ranges its packets carry."""

    priority: tuple[int, int] = (0, 255)
    """Inclusive range of the ATP ``priority`` tag (0 = most urgent)."""
    deadline_us: tuple[int, int] = (0, NO_DEADLINE)
    """Inclusive range of the ATP ``deadline_us`` tag (remaining slack in µs at send time)."""
    weight: int = 0
    """CadentFlow weight 1..255 (0 = none); used by the ``weight`` objective (heavier = more urgent)."""
    queue: int | None = None
    """Pin this flow to a logical queue (1..7) instead of deriving one from the objective."""

    def __post_init__(self) -> None:
        _check_fields(self, TAGGED_FLOW_KEYS, "cadentflow flow")


@dataclasses.dataclass(frozen=True)
class CadentFlow:
    """A CadentFlow declaration: tagged flows plus the application objective that orders them."""

    name: str
    """Label used in logs."""
    objective: str = "priority"
    """``priority``: order by priority tag; ``deadline``: order by deadline slack (tightest first);
    ``weight``: order by weight (heaviest first)."""
    flows: tuple[TaggedFlow, ...] = ()
    """The component flows."""
    jobs: tuple[int, ...] = ()
    """ATP job ids whose packets carry these tags. The policy installs no ``queue_by_job`` entry for them, so
    their tags (``queue_by_tag``) decide their queue instead of their reported TLR."""

    def __post_init__(self) -> None:
        _check_fields(self, CADENTFLOW_KEYS, f"[[cadentflow]] {self.name!r}")


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """The online tuner of policy mode ``adaptive`` (``controller.tuning``) and the limits an operator sets on
    it: how often it re-derives the TLR thresholds and the approximate queues' buffers, how far they may go,
    and how strongly a job's remaining work moves its queue. docs/controller.md, Tuning."""

    every_epochs: int = 2
    """Re-derive the thresholds (and buffers) every this many epochs."""
    min_threshold: float = -1.0
    """Lowest value the tuner may give a cutoff T_2..T_7, on the placement scale (a job's TLR plus
    ``remaining_weight`` per doubling of its remaining work over the median: below 0 for jobs with little left)."""
    max_threshold: float = 1.5
    """Highest value the tuner may give a cutoff T_2..T_7 (above 1 for jobs with much left)."""
    min_gap: float = 0.0078125
    """Smallest distance between consecutive cutoffs (1/128 by default)."""
    hysteresis: float = 0.02
    """New cutoffs are written only when one of them moves by more than this (TLR units), so that tables do
    not flap while the reported TLRs wobble."""
    remaining_weight: float = 0.0
    """How far a job's remaining work (messages still needed for its MSR, times the bytes a message has lately
    cost it) moves it up: each halving of its remaining work below the live jobs' load-weighted median (beyond
    ``remaining_deadband``) takes this off the value the cutoffs place (TLR units: 1/8 is one queue of the
    paper's k/8). A job with more work left than the median keeps its TLR. 0 (the default: in the measurements
    of docs/results.md it cost more than it gave): the TLR alone places."""
    demote_weight: float = 0.0
    """How far a job's remaining work moves it down: each doubling of its remaining work above the median
    (beyond ``remaining_deadband``) adds this to the value the cutoffs place. 0: a job with more work left than
    the median keeps its TLR."""
    remaining_deadband: float = 1.0
    """Halvings below the median that move no job (jobs of about the same size keep the order of their TLRs)."""
    finish_ref: float = 0.0
    """The finishing rule measured against the mix: a job whose remaining work is more than nothing and at most
    this fraction of the live jobs' load-weighted median remaining work (``tuning.Tuned.work_ref``, re-measured
    every tuning step) goes to the first approximate queue, as ``PolicyConfig.finish_epochs`` puts a job about
    to finish there (either rule suffices). 0 (the default): off."""
    split_gap: float = 0.0625
    """Jobs whose placement values lie closer than this share a queue: the cutoffs go into the gaps between
    values at least this wide (the widest first, at most six)."""
    buffers: bool = True
    """Also share the approximate queues' buffer out by load, where the target allows it (the simulated and
    the kernel switch); false: the k-MTU buffers stay."""
    buffer_min: int = 1
    """Smallest buffer of an approximate queue, in units of each switch's ``approx_buffer_unit`` packets (MTUs
    on byte-counting targets; 1 packet per unit by default): a switch multiplies the shares by its unit."""
    buffer_max: int = 16
    """Largest buffer of an approximate queue, in the same units."""
    buffer_total: int = sum(DEFAULT_APPROX_BUFFERS)
    """Buffer the approximate queues 1..7 share, in the same units (28: as much as the paper's 7 + 6 + ... + 1,
    so queue 0 keeps its share)."""

    def __post_init__(self) -> None:
        _check_fields(self, TUNING_KEYS, "[policy.tuning]")
        if self.min_threshold >= self.max_threshold:
            raise ConfigError(f"[policy.tuning] min_threshold: must be below max_threshold ({self.max_threshold:g}), "
                              f"got {self.min_threshold:g}")
        span = self.max_threshold - self.min_threshold
        need = self.min_gap * (NUM_QUEUES - 3) + 2 / 4096  # six cutoffs, and room for a value below and above
        if need >= span:
            raise ConfigError(f"[policy.tuning] min_gap: six cutoffs {self.min_gap:g} apart need max_threshold - "
                              f"min_threshold above {need:g}, got {span:g}")
        if self.buffer_min > self.buffer_max:
            raise ConfigError(f"[policy.tuning] buffer_min: must be <= buffer_max ({self.buffer_max}), "
                              f"got {self.buffer_min}")
        queues = NUM_QUEUES - 1
        if not queues * self.buffer_min <= self.buffer_total <= queues * self.buffer_max:
            raise ConfigError(f"[policy.tuning] buffer_total: 7 queues of {self.buffer_min}..{self.buffer_max} "
                              f"packets hold {queues * self.buffer_min}..{queues * self.buffer_max}, "
                              f"got {self.buffer_total}")


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """Inputs of the pure policy function (``controller.policy``)."""

    thresholds: tuple[float, ...] = POLICY_THRESHOLDS
    """TLR thresholds T_0..T_7: TLR in [T_k, T_k+1) goes to queue k (queue 1 below T_1). Default
    ``model.POLICY_THRESHOLDS`` (0, 0.3, 0.45, 0.6, 0.7, 0.8, 0.875, 0.95): with the finishing rule, the best fixed
    configuration measured (docs/controller.md, The default policy); the paper's k/8 is
    ``model.DEFAULT_THRESHOLDS``. Mode ``adaptive`` starts from them and then tunes them online (``tuning``)."""
    hysteresis: float = 0.02
    """A job leaves its queue only when its TLR is this far (in TLR units) outside the queue's range."""
    job_timeout_s: float = 1.0
    """A (job, group) that has not reported for this long is forgotten; a job with no group left is expired
    and its entries are removed."""
    ecn_threshold_pkts: int = 20
    """ECN marking threshold of queue 0 (BMv2: packets; the P4 driver converts for Tofino)."""
    install_tlr_rules: bool = True
    """Install the queue_by_tlr thresholds (per-packet fallback for jobs the controller has not seen yet)."""
    cadentflows: tuple[CadentFlow, ...] = ()
    """CadentFlow declarations, turned into queue_by_tag rules."""
    mode: str = "netapprox"
    """``netapprox``: jobs are re-mapped every epoch from their reports with the fixed ``thresholds`` (the
    default policy's unless set, ``model.POLICY_THRESHOLDS``); ``adaptive``: the same, with the thresholds and the approximate queues' buffers
    tuned online and a job's remaining work moving its queue (``tuning``); ``static``: only the TLR thresholds
    (each packet is queued by the TLR it carries) and ``pinned`` jobs; ``fifo``: a network-oblivious switch
    (every packet in queue 0, the baseline the papers compare against)."""
    pinned: tuple[tuple[int, int], ...] = ()
    """(job id, queue) pairs: these jobs always get this queue (ATP_FixPrio in the ablation)."""
    loss_margin: float = 0.02
    """A job is losing when its measured loss exceeds its TLR by more than this."""
    promote_after_epochs: int = 3
    """A job losing for this many consecutive epochs moves one queue up (NetApprox Fig. 10)."""
    tuning: TuningConfig = dataclasses.field(default_factory=lambda: TuningConfig())
    """The online tuner of mode ``adaptive`` and its limits (``[policy.tuning]``)."""
    finish_epochs: float = 64.0
    """Modes ``netapprox`` and ``adaptive``: a job that, at the rate it reports, would have what its MSR needs
    within this many epochs goes to the first approximate queue whatever its TLR (``policy.finishing``): it is
    about to finish, and the jobs that arrive meanwhile (placed by their TLRs before the controller sees them)
    do not hold it back. 64 (the horizon with the lowest mean JCT on the shifting workload's design seeds,
    docs/results.md): nearly every job whose remaining work is known is finishing. 0: the TLR alone places
    (the paper's policy)."""
    spray: bool = True
    """On switches with ECMP groups (``[[switch]] ecmp_routes``): spray approximate ATP DATA per packet over the
    equal-cost next hops (the design); False: every packet by its flow's hash, as an ordinary ECMP switch
    (the flow-hash variant). Mode ``fifo`` never sprays."""
    rank_levels: int = 0
    """Job ranks (hostlib's ``job_rank_levels``; 0: off, the default): ``queue_by_tag`` sends a TAGGED
    approximate packet whose ``priority`` is r < ``rank_levels`` to queue 1 + r (below every CadentFlow rule),
    and the controller leaves every job to the tags its packets carry (no ``queue_by_job`` entry, no tuning
    sample): a ranked job's rank, not its TLR, places it, from its first packet (docs/controller.md, Job
    ranks). Untagged packets still go by their TLR."""

    def __post_init__(self) -> None:
        _check_fields(self, POLICY_KEYS, "[policy]")


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    """The host report channel (UDP socket, and packet-in from P4 switches)."""

    bind: str = "0.0.0.0"
    """Address of the UDP report socket."""
    port: int = DEFAULT_REPORT_PORT
    """UDP report port; 0 picks a free port, -1 disables the socket (packet-in and ``Runtime.ingest`` only)."""
    key: bytes | None = None
    """Shared HMAC key: when set, reports without a valid tag are dropped (``bad_mac``). Required when the report
    socket listens beyond loopback, unless ``unauthenticated`` (``check_report_listener``)."""
    unauthenticated: bool = False
    """Accept unsigned reports on a socket that listens beyond loopback: the explicit opt-out of the key (then
    anyone who reaches the port can move any job between queues)."""
    rate_per_host: float = 1000.0
    """Token-bucket rate limit per reporting host, reports per second."""
    burst: int = 200
    """Token-bucket depth per reporting host."""
    rcvbuf_bytes: int = 16 << 20
    """Receive buffer of the report socket: reports arriving while an epoch runs wait there (as root the
    runtime may exceed net.core.rmem_max). Linux doubles it, and a signed 72-byte report takes 832 bytes of it
    on this kernel, so 16 MiB holds about 40,000 reports, 0.4 s at 100,000/s. With 4 MiB (about 10,000)
    ``make bench``'s ingest lost 0.4-1.5 % of 100,000 reports/s to the kernel on two shared cores."""

    def __post_init__(self) -> None:
        _check_fields(self, REPORT_KEYS, "[reports]")


@dataclasses.dataclass(frozen=True)
class SwitchConfig:
    """One switch: which driver programs it, the driver's options, and its static entries."""

    name: str
    """Unique switch name (logs, metrics, decision log)."""
    kind: str = DEFAULT_KIND
    """A key of ``controller.drivers.DRIVER_CLASSES``: ``p4runtime`` (BMv2, Tofino), ``kernel`` (the Linux
    kernel switch) or ``sim`` (an ns-3 switch: the simulation builds its driver; no file options)."""
    options: Mapping[str, Any] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    """Driver options, passed to ``<Driver>.from_options(name, options)``."""
    routes: tuple[Route, ...] = ()
    """routes_v4 entries (P4 targets)."""
    class_rules: tuple[ClassRule, ...] = ()
    """queue_by_class entries for non-approximate traffic (default: everything to queue 0)."""
    ecmp_routes: tuple[EcmpRoute, ...] = ()
    """ECMP groups of a multi-path fabric (``controller.fabric.ecmp_routes`` computes them from a topology): the
    kernel switch forwards by them, a P4 switch gets them as ``routes_v4`` -> ``set_ecmp_group`` and 16
    ``ecmp_members`` entries each; approximate ATP DATA is sprayed when the policy's ``spray`` is on."""
    job_sources: tuple[str, ...] = ()
    """IPv4 prefixes of the hosts whose jobs cross this switch (a report's source address says where its job
    runs): only those jobs get ``queue_by_job`` entries here, so a switch's work follows the jobs crossing it.
    Empty: every job (the default, right for a single switch or a core switch)."""

    def __post_init__(self) -> None:
        _check_fields(self, SWITCH_KEYS, f"[[switch]] {self.name!r}")
        parse_options(self.kind, self.options, f"[[switch]] {self.name!r} options")


@dataclasses.dataclass(frozen=True)
class ControllerConfig:
    """Everything the controller needs. Build it with ``load_config`` or directly in code."""

    switches: tuple[SwitchConfig, ...] = ()
    """The switches to program; names must be unique."""
    policy: PolicyConfig = dataclasses.field(default_factory=lambda: PolicyConfig())
    """Queue policy."""
    reports: ReportConfig = dataclasses.field(default_factory=lambda: ReportConfig())
    """Host report channel."""
    epoch_s: float = 0.020
    """Epoch length in seconds (20 ms suits emulation; raise it for real hardware fleets)."""
    counters_every: int = 1
    """Read counters every N epochs (0 = never)."""
    decision_log: str | None = None
    """Path of the JSON-lines decision log (appended), or None."""
    metrics_bind: str = "127.0.0.1"
    """Address of the Prometheus metrics endpoint."""
    metrics_port: int = -1
    """Port of the Prometheus endpoint (``/metrics``); 0 picks a free port, -1 disables it."""
    decide_on_arrival: bool = True
    """Between epochs, decide and write the jobs whose new reports move them (if they are not losing), so a
    report reaches the switches within milliseconds instead of at the next epoch; epochs still expire jobs,
    count losing streaks and promote. Off: every decision at an epoch boundary."""
    reconnect_initial_s: float = 0.1
    """First reconnect delay after a switch is lost; doubles on every failure."""
    reconnect_max_s: float = 1.0
    """Ceiling of the reconnect delay. A restarted switch is found at most this long (plus the gRPC channel's own
    retry, at most 1 s) after it answers again; an attempt at a switch that is down costs one refused connection."""
    replica: int = 0
    """This process's rank in a replica set of controllers with this configuration (1, 2, ...; all different):
    each switch makes the highest live rank its primary, the others keep their connections as backups and take
    over when it fails (docs/controller.md, "Running two controllers"). P4Runtime switches only. 0: a single
    controller."""

    def __post_init__(self) -> None:
        _check_fields(self, CONTROLLER_KEYS, "[controller]")
        names = [s.name for s in self.switches]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ConfigError(f"switch names must be unique; repeated: {sorted(dup)}")
        if self.reconnect_max_s < self.reconnect_initial_s:
            raise ConfigError(f"[controller] reconnect_max_s: must be >= reconnect_initial_s "
                              f"({self.reconnect_initial_s:g}), got {self.reconnect_max_s:g}")
        unarbitrated = [s.name for s in self.switches if s.kind not in ARBITRATED_KINDS]
        if self.replica and unarbitrated:
            raise ConfigError(f"[controller] replica: switch {unarbitrated[0]!r} has no arbiter between controllers "
                              f"(replicas need kind {' or '.join(ARBITRATED_KINDS)}: the switch decides who writes)")


# --- checks: one line per key ---------------------------------------------------------------------------
#
# Every value is type- and range-checked when a config is built (from TOML, a topology file, CLI flags or
# code), so a mistake is one line naming the key ("[controller] counters_every: expected an integer >= 0,
# got 'x'") instead of an error in the running controller. A new config field is one line in its table;
# tests/controller/test_ctl_config.py fails for a field without one.


def _check_fields(obj: Any, checks: Mapping[str, C.Check], where: str) -> None:
    """Check every field of a frozen dataclass and store the canonical value (a list becomes a tuple)."""
    for name, check in checks.items():
        try:
            value = check(getattr(obj, name), f"{where} {name}")
        except C.CheckError as e:
            raise ConfigError(str(e)) from None
        object.__setattr__(obj, name, value)


def _instances(cls: type) -> C.Check:
    def check(value, field):
        items = C.sequence(lambda v, f: v)(value, field)
        for i, item in enumerate(items):
            if not isinstance(item, cls):
                raise C.CheckError(f"{field}[{i}]", f"expected a {cls.__name__}, got {type(item).__name__}")
        return items
    return check


def _instance(cls: type) -> C.Check:
    def check(value, field):
        if not isinstance(value, cls):
            raise C.CheckError(field, f"expected a {cls.__name__}, got {type(value).__name__}")
        return value
    return check


def _options(value: Any, field: str) -> Mapping[str, Any]:
    return types.MappingProxyType(C.mapping(C.string(), lambda v, f: v)(value, field))


def _thresholds(value: Any, field: str) -> tuple[float, ...]:
    values = C.sequence(C.number(ge=0.0, lt=1.0), length=NUM_QUEUES)(value, field)
    try:
        check_thresholds(values)
    except ValueError:
        raise C.CheckError(field, f"expected {NUM_QUEUES} strictly increasing TLRs starting at 0 (T_k = k/8 by "
                                  f"default), got {list(values)}") from None
    return values


def _tag_range(hi: int) -> C.Check:
    """An integer or an inclusive ``[lo, hi]`` pair within 0..hi; returned as a pair."""
    def check(value, field):
        if isinstance(value, int) and not isinstance(value, bool):
            value = (value, value)
        lo_hi = C.sequence(C.integer(ge=0, le=hi), length=2)(value, field)
        if lo_hi[0] > lo_hi[1]:
            raise C.CheckError(field, f"expected [lo, hi] with lo <= hi, got {list(lo_hi)}")
        return lo_hi
    return check


def _pin(value: Any, field: str) -> tuple[int, int]:
    job, queue = C.sequence(lambda v, f: v, length=2)(value, field)
    return (JOB_ID(job, f"{field} job id"), APPROX_QUEUE(queue, f"{field} queue"))


def _prefix(value: Any, field: str) -> str:
    C.string()(value, field)
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError as e:
        raise C.CheckError(field, str(e)) from None
    return value


def _key(value: Any, field: str) -> bytes:
    if not isinstance(value, (bytes, bytearray)) or not value:
        raise C.CheckError(field, "expected a non-empty key (bytes)")
    return bytes(value)


def _approx_queue(value: Any, field: str) -> int:
    try:
        return C.integer(ge=1, le=NUM_QUEUES - 1)(value, field)
    except C.CheckError as e:
        raise C.CheckError(field, e.problem + " (queue 0 is non-approximate)") from None


JOB_ID = C.integer(ge=1, le=0xFFFFFFFF)
APPROX_QUEUE = _approx_queue
SECONDS = C.number(gt=0.0, le=86400.0)

CONTROLLER_KEYS: dict[str, C.Check] = {
    "switches": _instances(SwitchConfig),
    "policy": _instance(PolicyConfig),
    "reports": _instance(ReportConfig),
    "epoch_s": C.number(gt=0.0, le=3600.0),
    "counters_every": C.integer(ge=0),
    "decision_log": C.optional(C.string()),
    "metrics_bind": C.host(),
    "metrics_port": C.port(allow=(-1, 0)),
    "decide_on_arrival": C.boolean(),
    "reconnect_initial_s": SECONDS,
    "reconnect_max_s": SECONDS,
    "replica": C.integer(ge=0, le=(1 << 64) - 1),
}
POLICY_KEYS: dict[str, C.Check] = {
    "thresholds": _thresholds,
    "hysteresis": C.number(ge=0.0, lt=1.0),
    "job_timeout_s": SECONDS,
    "ecn_threshold_pkts": C.integer(ge=1, le=(1 << 19) - 1),
    "install_tlr_rules": C.boolean(),
    "cadentflows": _instances(CadentFlow),
    "mode": C.choice(POLICY_MODES),
    "pinned": C.sequence(_pin),
    "loss_margin": C.fraction(),
    "promote_after_epochs": C.integer(ge=1),
    "tuning": _instance(TuningConfig),
    "finish_epochs": C.number(ge=0.0, le=1e6),
    "spray": C.boolean(),
    "rank_levels": C.integer(ge=0, le=NUM_QUEUES - FIRST_APPROX_QUEUE),
}
TUNING_KEYS: dict[str, C.Check] = {
    "every_epochs": C.integer(ge=1, le=1_000_000),
    "min_threshold": C.number(ge=-4.0, le=5.0),
    "max_threshold": C.number(ge=-4.0, le=5.0),
    "min_gap": C.number(ge=1 / 4096, lt=0.2),
    "hysteresis": C.number(ge=0.0, lt=1.0),
    "remaining_weight": C.number(ge=0.0, le=1.0),
    "demote_weight": C.number(ge=0.0, le=1.0),
    "remaining_deadband": C.number(ge=0.0, le=32.0),
    "finish_ref": C.number(ge=0.0, le=1024.0),
    "split_gap": C.number(ge=0.0, le=1.0),
    "buffers": C.boolean(),
    "buffer_min": C.integer(ge=1, le=1 << 20),
    "buffer_max": C.integer(ge=1, le=1 << 20),
    "buffer_total": C.integer(ge=NUM_QUEUES - 1, le=1 << 23),
}
REPORT_KEYS: dict[str, C.Check] = {
    "bind": C.host(),
    "port": C.port(allow=(-1, 0)),
    "key": C.optional(_key),
    "unauthenticated": C.boolean(),
    "rate_per_host": C.number(gt=0.0),
    "burst": C.integer(ge=1),
    "rcvbuf_bytes": C.integer(ge=4096),
}
SWITCH_KEYS: dict[str, C.Check] = {
    "name": C.string(),
    "kind": C.choice(DRIVER_KINDS),
    "options": _options,
    "routes": _instances(Route),
    "class_rules": _instances(ClassRule),
    "ecmp_routes": _instances(EcmpRoute),
    "job_sources": C.sequence(_prefix),
}
TAGGED_FLOW_KEYS: dict[str, C.Check] = {
    "priority": _tag_range(255),
    "deadline_us": _tag_range(NO_DEADLINE),
    "weight": C.integer(ge=0, le=255),
    "queue": C.optional(APPROX_QUEUE),
}
CADENTFLOW_KEYS: dict[str, C.Check] = {
    "name": C.string(),
    "objective": C.choice(OBJECTIVES),
    "flows": _instances(TaggedFlow),
    "jobs": C.sequence(JOB_ID),
}


# --- TOML -----------------------------------------------------------------------------------------------
#
# The TOML readers check the keys whose names or shapes differ from the dataclass fields (``epoch_ms``,
# ``key_file``, route prefixes, class rules, tag ranges); every other value is checked by its dataclass.


def _take(table: Any, allowed: tuple[str, ...], where: str) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: expected a table, got {table!r}")
    unknown = [k for k in table if k not in allowed]
    if unknown:
        k = unknown[0]
        raise ConfigError(f"{where}: unknown key {k!r}.{did_you_mean(k, allowed)} Known keys: {', '.join(allowed)}")
    return dict(table)


def _checked(table: Any, checks: Mapping[str, C.Check], where: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """``table`` restricted to the keys of ``checks``, each checked; ``required`` keys must be present."""
    table = _take(table, tuple(checks), where)
    for key in required:
        if key not in table:
            raise ConfigError(f"{where}: missing key {key!r}")
    try:
        return C.check_table(table, checks, where)
    except C.CheckError as e:
        raise ConfigError(str(e)) from None


def _tables(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected an array of tables ([[...]]), got {value!r}")
    return value


def _ipv4_prefix(value: Any, field: str) -> ipaddress.IPv4Network:
    C.string()(value, field)
    try:
        return ipaddress.IPv4Network(value, strict=True)
    except ValueError as e:
        raise C.CheckError(field, str(e)) from None


ROUTE_KEYS: dict[str, C.Check] = {
    "prefix": _ipv4_prefix,
    "port": C.integer(ge=0, le=511),
    "src_mac": C.mac_address(),
    "dst_mac": C.mac_address(),
}
ECMP_ROUTE_KEYS: dict[str, C.Check] = {
    "prefix": _ipv4_prefix,
    "ports": C.sequence(C.integer(ge=0, le=511)),
    "src_macs": C.sequence(C.mac_address()),
    "dst_macs": C.sequence(C.mac_address()),
}
CLASS_RULE_KEYS: dict[str, C.Check] = {
    "rank": C.integer(ge=1, le=0xFFFF),
    "ip_proto": C.integer(ge=0, le=0xFF),
    "ip_proto_mask": C.integer(ge=0, le=0xFF),
    "l4_dport": C.integer(ge=0, le=0xFFFF),
    "l4_dport_mask": C.integer(ge=0, le=0xFFFF),
    "queue": C.integer(ge=0, le=NUM_QUEUES - 1),
}
# the TOML tables whose keys are the dataclass fields, with their TOML-only aliases
CONTROLLER_TOML_KEYS: dict[str, C.Check] = {
    **{k: v for k, v in CONTROLLER_KEYS.items() if k not in ("switches", "policy", "reports")},
    "epoch_ms": C.number(gt=0.0, le=3.6e6),
}
POLICY_TOML_KEYS: dict[str, C.Check] = {**{k: v for k, v in POLICY_KEYS.items() if k != "cadentflows"},
                                         "tuning": lambda v, f: v}  # a table, read below
REPORT_TOML_KEYS: dict[str, C.Check] = {**REPORT_KEYS, "key": C.string(), "key_file": C.string(),
                                         "create_key_file": C.boolean()}
SWITCH_TOML_KEYS: dict[str, C.Check] = {
    **{k: v for k, v in SWITCH_KEYS.items() if k not in ("routes", "class_rules", "ecmp_routes")},
    "routes": lambda v, f: v, "class_rules": lambda v, f: v, "ecmp_routes": lambda v, f: v,  # arrays of tables
}
TAGGED_FLOW_TOML_KEYS = TAGGED_FLOW_KEYS
CADENTFLOW_TOML_KEYS: dict[str, C.Check] = {**CADENTFLOW_KEYS, "flows": lambda v, f: v}


def _route(t: Any, where: str) -> Route:
    t = _checked(t, ROUTE_KEYS, where, required=("prefix", "port"))
    net = t["prefix"]
    return Route(prefix=str(net.network_address), prefix_len=net.prefixlen, port=t["port"],
                 src_mac=t.get("src_mac", "00:00:00:00:00:00"), dst_mac=t.get("dst_mac", "00:00:00:00:00:00"))


def _ecmp_route(t: Any, where: str) -> EcmpRoute:
    t = _checked(t, ECMP_ROUTE_KEYS, where, required=("prefix", "ports"))
    net = t["prefix"]
    try:
        return EcmpRoute(prefix=str(net.network_address), prefix_len=net.prefixlen, ports=tuple(t["ports"]),
                         src_macs=tuple(t.get("src_macs", ())), dst_macs=tuple(t.get("dst_macs", ())))
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None


def _class_rule(t: Any, where: str) -> ClassRule:
    t = _checked(t, CLASS_RULE_KEYS, where, required=("queue",))
    proto, dport = t.get("ip_proto"), t.get("l4_dport")
    return ClassRule(rank=t.get("rank", 1), ip_proto=proto or 0,
                     ip_proto_mask=t.get("ip_proto_mask", 0xFF if proto is not None else 0),
                     l4_dport=dport or 0, l4_dport_mask=t.get("l4_dport_mask", 0xFFFF if dport is not None else 0),
                     qid=t["queue"])


def _cadentflow(t: Any, where: str) -> CadentFlow:
    t = _checked(t, CADENTFLOW_TOML_KEYS, where)
    flows = tuple(TaggedFlow(**_checked(f, TAGGED_FLOW_TOML_KEYS, f"{where}.flows[{i}]"))
                  for i, f in enumerate(_tables(t.pop("flows", []), f"{where}.flows")))
    return CadentFlow(**{"name": where, **t}, flows=flows)


def config_from_dict(data: Mapping[str, Any], *, source: str = "<config>",
                     base_dir: Path | None = None) -> ControllerConfig:
    """Build a ``ControllerConfig`` from parsed TOML (every value checked; a mistake raises ``ConfigError``, one
    line naming the source and the key). Relative paths in the switch options that name files (the driver's
    options dataclass marks them) are resolved against ``base_dir``."""
    try:
        return _config_from_dict(data, source, base_dir)
    except ConfigError as e:
        message = str(e)
        raise ConfigError(message if message.startswith(source) else f"{source}: {message}") from None


def _config_from_dict(data: Mapping[str, Any], source: str, base_dir: Path | None) -> ControllerConfig:
    top = _take(data, ("controller", "policy", "reports", "switch", "cadentflow"), source)
    ctl = _checked(top.get("controller", {}), CONTROLLER_TOML_KEYS, "[controller]")
    if "epoch_ms" in ctl:
        ctl["epoch_s"] = ctl.pop("epoch_ms") / 1000.0

    pol = _checked(top.get("policy", {}), POLICY_TOML_KEYS, "[policy]")
    if "tuning" in pol:
        pol["tuning"] = TuningConfig(**_checked(pol["tuning"], TUNING_KEYS, "[policy.tuning]"))
    cadentflows = tuple(_cadentflow(t, f"[[cadentflow]][{i}]")
                        for i, t in enumerate(_tables(top.get("cadentflow", []), "[[cadentflow]]")))
    policy = PolicyConfig(**pol, cadentflows=cadentflows)

    rep = _checked(top.get("reports", {}), REPORT_TOML_KEYS, "[reports]")
    create = rep.pop("create_key_file", False)
    if "key_file" in rep:
        path = Path(rep.pop("key_file"))
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        rep["key"] = report_key(path, create=create, where="[reports] key_file")
    elif create:
        raise ConfigError("[reports] create_key_file: needs key_file (the path of the key to create)")
    elif "key" in rep:
        rep["key"] = rep["key"].encode()
    reports = ReportConfig(**rep)

    switches = []
    for i, s in enumerate(_tables(top.get("switch", []), "[[switch]]")):
        where = f"[[switch]][{i}]"
        s = _checked(s, SWITCH_TOML_KEYS, where, required=("name",))
        options = dict(s.get("options", {}))
        kind = s.get("kind", DEFAULT_KIND)
        if base_dir is not None and kind in DRIVER_CLASSES:
            paths = path_options(kind)
            for key, value in options.items():
                if isinstance(value, str) and key in paths and not Path(value).is_absolute():
                    options[key] = str(base_dir / value)
        switches.append(SwitchConfig(
            name=s["name"], kind=kind, options=types.MappingProxyType(options),
            routes=tuple(_route(r, f"{where}.routes[{j}]")
                         for j, r in enumerate(_tables(s.get("routes", []), f"{where}.routes"))),
            class_rules=tuple(_class_rule(r, f"{where}.class_rules[{j}]")
                              for j, r in enumerate(_tables(s.get("class_rules", []), f"{where}.class_rules"))),
            ecmp_routes=tuple(_ecmp_route(r, f"{where}.ecmp_routes[{j}]")
                              for j, r in enumerate(_tables(s.get("ecmp_routes", []), f"{where}.ecmp_routes"))),
            job_sources=s.get("job_sources", ())))
    return ControllerConfig(switches=tuple(switches), policy=policy, reports=reports, **ctl)


def report_key(path: Path, *, create: bool = False, where: str = "[reports] key_file") -> bytes:
    """The report key in the file at ``path``; with ``create``, a missing file is first created with a new key
    (32 random bytes as 64 hex digits, mode 0600, its directory made): the hosts get the same file
    (``atp-send --report-key-file``). An unreadable or empty file is a ``ConfigError`` naming ``where``."""
    if create:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # made earlier (or by a replica started at the same moment): read it
        except OSError as e:
            raise ConfigError(f"{where}: cannot create {str(path)!r}: {e.strerror}") from None
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_hex(32).encode() + b"\n")
    try:
        return read_report_key(path, where)
    except HostConfigError as e:
        raise ConfigError(str(e)) from None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is a loopback address; a name counts if every address it
    resolves to is one (an unresolvable name is not)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def check_report_listener(host: str, port: int, reports: ReportConfig) -> None:
    """Refuse (``ConfigError``, one line) a report socket at ``host``:``port`` beyond loopback without a key,
    unless ``reports.unauthenticated`` says the operator accepts unsigned reports there."""
    if reports.key is None and not reports.unauthenticated and not is_loopback(host):
        raise ConfigError(f"[reports] the report socket listens on {host}:{port}, beyond loopback, without a key: "
                          "give one (key_file, create_key_file = true to make it; --report-key-file "
                          "[--create-report-key]), bind 127.0.0.1, or accept unsigned reports (unauthenticated = "
                          "true; --report-unauthenticated)")


def with_policy(base: PolicyConfig, overrides: Mapping[str, Any] | Iterable[tuple[str, Any]],
                source: str = "policy") -> PolicyConfig:
    """``base`` with the ``[policy]`` keys in ``overrides`` (the TOML names and shapes: ``tuning`` a table or
    (key, value) pairs), every value checked as ``load_config`` checks it: the experiments' way of running a
    trial under another policy (mode ``adaptive``, fixed thresholds, tuning limits)."""
    table = dict(overrides.items() if isinstance(overrides, Mapping) else overrides)
    if "tuning" in table and not isinstance(table["tuning"], Mapping):
        table["tuning"] = dict(table["tuning"])
    try:
        pol = _checked(table, POLICY_TOML_KEYS, "[policy]")
        if "tuning" in pol:
            pol["tuning"] = dataclasses.replace(base.tuning, **_checked(pol["tuning"], TUNING_KEYS, "[policy.tuning]"))
        return dataclasses.replace(base, **pol)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def load_config(path: str | Path) -> ControllerConfig:
    """Read a TOML config file. Relative paths in it are taken from the current directory (run from the
    repository root, so ``build/v1model/p4info.txtpb`` works as written)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    return config_from_dict(data, source=str(path), base_dir=None)
