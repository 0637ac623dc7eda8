"""Controller configuration: frozen dataclasses, filled from a TOML file (``load_config``) and CLI flags
(``controller/__main__.py``) at the edge only. docs/controller.md documents every key; an annotated example
is ``controller/examples/bmv2.toml``.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import tomllib
import types
from pathlib import Path
from typing import Any, Mapping

from netapprox.controller.drivers import DRIVER_CLASSES
from netapprox.controller.errors import ConfigError, did_you_mean
from netapprox.controller.model import DEFAULT_THRESHOLDS, NUM_QUEUES, ClassRule, Route
from netapprox.hostlib.wire import DEFAULT_REPORT_PORT

OBJECTIVES = ("priority", "deadline", "weight")
POLICY_MODES = ("netapprox", "static", "fifo")
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


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """Inputs of the pure policy function (``controller.policy``)."""

    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    """TLR thresholds T_0..T_7: TLR in [T_k, T_k+1) goes to queue k (queue 1 below T_1). Default k/8."""
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
    """``netapprox``: jobs are re-mapped every epoch from their reports; ``static``: only the TLR thresholds
    (each packet is queued by the TLR it carries) and ``pinned`` jobs; ``fifo``: a network-oblivious switch
    (every packet in queue 0, the baseline the papers compare against)."""
    pinned: tuple[tuple[int, int], ...] = ()
    """(job id, queue) pairs: these jobs always get this queue (ATP_FixPrio in the ablation)."""
    loss_margin: float = 0.02
    """A job is losing when its measured loss exceeds its TLR by more than this."""
    promote_after_epochs: int = 3
    """A job losing for this many consecutive epochs moves one queue up (NetApprox Fig. 10)."""

    def __post_init__(self) -> None:
        if self.mode not in POLICY_MODES:
            raise ConfigError(f"policy mode {self.mode!r} unknown.{did_you_mean(self.mode, POLICY_MODES)}"
                              f" Known: {', '.join(POLICY_MODES)}")
        for job, queue in self.pinned:
            if not 1 <= queue < NUM_QUEUES or not 0 < job < 1 << 32:
                raise ConfigError(f"policy pinned ({job}, {queue}): job id 1..2^32-1, queue 1..{NUM_QUEUES - 1}")
        if self.promote_after_epochs < 1:
            raise ConfigError(f"policy promote_after_epochs must be >= 1, got {self.promote_after_epochs}")


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    """The host report channel (UDP socket, and packet-in from P4 switches)."""

    bind: str = "0.0.0.0"
    """Address of the UDP report socket."""
    port: int = DEFAULT_REPORT_PORT
    """UDP report port; 0 picks a free port, -1 disables the socket (packet-in and ``Runtime.ingest`` only)."""
    key: bytes | None = None
    """Shared HMAC key: when set, reports without a valid tag are dropped (``bad_mac``)."""
    rate_per_host: float = 1000.0
    """Token-bucket rate limit per reporting host, reports per second."""
    burst: int = 200
    """Token-bucket depth per reporting host."""
    rcvbuf_bytes: int = 4 << 20
    """Receive buffer of the report socket: reports arriving while an epoch runs wait there (as root the
    runtime may exceed net.core.rmem_max)."""


@dataclasses.dataclass(frozen=True)
class SwitchConfig:
    """One switch: which driver programs it, the driver's options, and its static entries."""

    name: str
    """Unique switch name (logs, metrics, decision log)."""
    kind: str = "p4runtime"
    """A key of ``controller.drivers.DRIVER_CLASSES``: ``p4runtime`` (BMv2, Tofino) or ``kernel`` (the Linux
    kernel switch)."""
    options: Mapping[str, Any] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    """Driver options, passed to ``<Driver>.from_options(name, options)``."""
    routes: tuple[Route, ...] = ()
    """routes_v4 entries (P4 targets)."""
    class_rules: tuple[ClassRule, ...] = ()
    """queue_by_class entries for non-approximate traffic (default: everything to queue 0)."""
    job_sources: tuple[str, ...] = ()
    """IPv4 prefixes of the hosts whose jobs cross this switch (a report's source address says where its job
    runs): only those jobs get ``queue_by_job`` entries here, so a switch's work follows the jobs crossing it.
    Empty: every job (the default, right for a single switch or a core switch)."""

    def __post_init__(self) -> None:
        import ipaddress

        for prefix in self.job_sources:
            try:
                ipaddress.ip_network(prefix, strict=False)
            except ValueError as e:
                raise ConfigError(f"switch {self.name!r}: job_sources entry {prefix!r}: {e}") from None


@dataclasses.dataclass(frozen=True)
class ControllerConfig:
    """Everything the controller needs. Build it with ``load_config`` or directly in code."""

    switches: tuple[SwitchConfig, ...] = ()
    """The switches to program; names must be unique."""
    policy: PolicyConfig = PolicyConfig()
    """Queue policy."""
    reports: ReportConfig = ReportConfig()
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
    reconnect_max_s: float = 5.0
    """Ceiling of the reconnect delay."""

    def __post_init__(self) -> None:
        names = [s.name for s in self.switches]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ConfigError(f"switch names must be unique; repeated: {sorted(dup)}")
        if self.epoch_s <= 0:
            raise ConfigError(f"epoch_s must be positive, got {self.epoch_s}")


# --- TOML -----------------------------------------------------------------------------------------------


def _take(table: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> dict[str, Any]:
    unknown = [k for k in table if k not in allowed]
    if unknown:
        k = unknown[0]
        raise ConfigError(f"{where}: unknown key {k!r}.{did_you_mean(k, allowed)} Known keys: {', '.join(allowed)}")
    return dict(table)


def _pair(value: Any, where: str) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (value[0], value[1])
    raise ConfigError(f"{where}: expected an integer or an inclusive [lo, hi] pair, got {value!r}")


def _route(t: Mapping[str, Any], where: str) -> Route:
    t = _take(t, ("prefix", "port", "src_mac", "dst_mac"), where)
    try:
        net = ipaddress.IPv4Network(t["prefix"], strict=True)
        return Route(prefix=str(net.network_address), prefix_len=net.prefixlen, port=int(t["port"]),
                     src_mac=str(t.get("src_mac", "00:00:00:00:00:00")),
                     dst_mac=str(t.get("dst_mac", "00:00:00:00:00:00")))
    except KeyError as e:
        raise ConfigError(f"{where}: missing key {e.args[0]!r}") from None
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None


def _class_rule(t: Mapping[str, Any], where: str) -> ClassRule:
    t = _take(t, ("rank", "ip_proto", "ip_proto_mask", "l4_dport", "l4_dport_mask", "queue"), where)
    try:
        proto, dport = t.get("ip_proto"), t.get("l4_dport")
        return ClassRule(rank=int(t.get("rank", 1)),
                         ip_proto=int(proto or 0),
                         ip_proto_mask=int(t.get("ip_proto_mask", 0xFF if proto is not None else 0)),
                         l4_dport=int(dport or 0),
                         l4_dport_mask=int(t.get("l4_dport_mask", 0xFFFF if dport is not None else 0)),
                         qid=int(t["queue"]))
    except KeyError as e:
        raise ConfigError(f"{where}: missing key {e.args[0]!r}") from None
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None


def _cadentflow(t: Mapping[str, Any], where: str) -> CadentFlow:
    t = _take(t, ("name", "objective", "flows", "jobs"), where)
    objective = t.get("objective", "priority")
    if objective not in OBJECTIVES:
        raise ConfigError(f"{where}: objective {objective!r} unknown.{did_you_mean(objective, OBJECTIVES)}"
                          f" Known: {', '.join(OBJECTIVES)}")
    flows = []
    for i, f in enumerate(t.get("flows", ())):
        fw = f"{where}.flows[{i}]"
        f = _take(f, ("priority", "deadline_us", "weight", "queue"), fw)
        prio = _pair(f.get("priority", [0, 255]), fw + ".priority")
        dl = _pair(f.get("deadline_us", [0, NO_DEADLINE]), fw + ".deadline_us")
        if not (0 <= prio[0] <= prio[1] <= 255 and 0 <= dl[0] <= dl[1] <= NO_DEADLINE):
            raise ConfigError(f"{fw}: priority must lie in 0..255 and deadline_us in 0..2^32-1, lo <= hi")
        weight = int(f.get("weight", 0))
        if not 0 <= weight <= 255:
            raise ConfigError(f"{fw}: weight {weight} outside 0..255")
        queue = f.get("queue")
        if queue is not None and not 1 <= int(queue) < NUM_QUEUES:
            raise ConfigError(f"{fw}: queue {queue} outside 1..{NUM_QUEUES - 1} (queue 0 is non-approximate)")
        flows.append(TaggedFlow(priority=prio, deadline_us=dl, weight=weight,
                                queue=None if queue is None else int(queue)))
    return CadentFlow(name=str(t.get("name", where)), objective=objective, flows=tuple(flows),
                      jobs=tuple(int(j) for j in t.get("jobs", ())))


def config_from_dict(data: Mapping[str, Any], *, source: str = "<config>",
                     base_dir: Path | None = None) -> ControllerConfig:
    """Build a ``ControllerConfig`` from parsed TOML. Relative paths in switch options named ``*_path``,
    ``p4info``, ``bmv2_json``, ``tofino_*`` are resolved against ``base_dir``."""
    top = _take(data, ("controller", "policy", "reports", "switch", "cadentflow"), source)
    ctl = _take(top.get("controller", {}), tuple(f.name for f in dataclasses.fields(ControllerConfig)
                                                 if f.name not in ("switches", "policy", "reports")) + ("epoch_ms",),
                f"{source} [controller]")
    if "epoch_ms" in ctl:
        ctl["epoch_s"] = float(ctl.pop("epoch_ms")) / 1000.0

    pol = _take(top.get("policy", {}), ("thresholds", "hysteresis", "job_timeout_s", "ecn_threshold_pkts",
                                        "install_tlr_rules", "mode", "pinned", "loss_margin",
                                        "promote_after_epochs"), f"{source} [policy]")
    if "thresholds" in pol:
        pol["thresholds"] = tuple(float(x) for x in pol["thresholds"])
    if "pinned" in pol:
        pol["pinned"] = tuple(_pair(p, f"{source} [policy] pinned") for p in pol["pinned"])
    cadentflows = tuple(_cadentflow(t, f"{source} [[cadentflow]][{i}]")
                        for i, t in enumerate(top.get("cadentflow", ())))
    policy = PolicyConfig(**pol, cadentflows=cadentflows)

    rep = _take(top.get("reports", {}), ("bind", "port", "key", "key_file", "rate_per_host", "burst", "rcvbuf_bytes"),
                f"{source} [reports]")
    if "key_file" in rep:
        path = Path(rep.pop("key_file"))
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        rep["key"] = path.read_bytes().strip()
    elif "key" in rep:
        rep["key"] = str(rep["key"]).encode()
    reports = ReportConfig(**rep)

    switches = []
    for i, s in enumerate(top.get("switch", ())):
        where = f"{source} [[switch]][{i}]"
        s = _take(s, ("name", "kind", "options", "routes", "class_rules", "job_sources"), where)
        if "name" not in s:
            raise ConfigError(f"{where}: missing key 'name'")
        kind = s.get("kind", "p4runtime")
        if kind not in DRIVER_KINDS:
            raise ConfigError(f"{where}: kind {kind!r} unknown.{did_you_mean(kind, DRIVER_KINDS)}"
                              f" Known: {', '.join(DRIVER_KINDS)}")
        options = dict(s.get("options", {}))
        if base_dir is not None:
            for key, value in options.items():
                if isinstance(value, str) and _is_path_option(key) and not Path(value).is_absolute():
                    options[key] = str(base_dir / value)
        switches.append(SwitchConfig(
            name=str(s["name"]), kind=kind, options=types.MappingProxyType(options),
            routes=tuple(_route(r, f"{where}.routes[{j}]") for j, r in enumerate(s.get("routes", ()))),
            class_rules=tuple(_class_rule(r, f"{where}.class_rules[{j}]")
                              for j, r in enumerate(s.get("class_rules", ()))),
            job_sources=tuple(str(p) for p in s.get("job_sources", ()))))
    try:
        return ControllerConfig(switches=tuple(switches), policy=policy, reports=reports, **ctl)
    except TypeError as e:
        raise ConfigError(f"{source}: {e}") from None


def _is_path_option(key: str) -> bool:
    return key in ("p4info", "bmv2_json", "device_config") or key.endswith("_path") or key.startswith("tofino_")


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
