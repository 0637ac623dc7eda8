"""Topology files: a network, its switches' target, its jobs and its controller settings in one small file.

YAML (``.yaml``/``.yml``) or JSON. Everything is checked when the file is read, and a mistake is one line
naming the file and the field. Example (topo/examples/ has the rack, the dumbbell and the leaf-spine)::

    name: dumbbell
    target: kernel              # kernel | bmv2 (every switch); default kernel
    buffer_packets: 64          # per port; queue k >= 1 holds 8 - k packets, queue 0 the rest
    switches: [s1, s2]
    hosts:                      # name: switch it hangs off (address 10.0.0.<n>, or ip: given)
      h1: s1
      h2: {switch: s2, ip: 10.0.0.2}
    links:                      # switch-switch links; host links come from `hosts`
      - {a: s1, b: s2, rate_mbit: 20}
    host_rate_mbit: 50          # host links
    jobs:                       # ATP jobs `python -m netapprox.topo.session` starts (optional)
      - {name: A, src: h1, dst: h2, messages: 2000, msr: 0.9}
    controller:                 # the controller's [controller], [policy] and [reports] keys (docs/controller.md)
      epoch_ms: 20
      policy: {hysteresis: 0.02}

Link delays are not offered: they need the ``netem`` qdisc, which the kernels this runs on lack (a
``delay_ms`` key is refused with that reason).
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
from pathlib import Path
from typing import Any, Mapping

import yaml

from netapprox.controller.config import config_from_dict
from netapprox.controller.errors import ConfigError as ControllerConfigError
from netapprox.hostlib.config import ConfigError, parse_rate

TARGETS = ("kernel", "bmv2")
CTL_NAME = "ctl"


class TopologyFileError(ValueError):
    """A topology file is malformed; the message is one line naming the file and the field."""


@dataclasses.dataclass(frozen=True)
class HostSpec:
    name: str
    """Mininet host name."""
    switch: str
    """The switch its one link goes to."""
    ip: str
    """IPv4 address (/24 with the others)."""


@dataclasses.dataclass(frozen=True)
class LinkSpec:
    a: str
    """A switch."""
    b: str
    """Another switch."""
    rate_mbit: float
    """Line rate, both directions (each switch shapes its egress port on the link)."""


@dataclasses.dataclass(frozen=True)
class JobSpec:
    name: str
    """Label in the session's output."""
    src: str
    """Sending host."""
    dst: str
    """Receiving host."""
    messages: int = 1000
    """Messages (one packet each unless ``size`` says otherwise)."""
    msr: float = 0.9
    """Minimum sampling rate."""
    size: int = 1368
    """Message size, bytes."""
    rate: str = "20M"
    """The sender's R_max (atp-send --rate)."""


@dataclasses.dataclass(frozen=True)
class TopologySpec:
    """A parsed topology file."""

    name: str
    target: str
    switches: tuple[str, ...]
    hosts: tuple[HostSpec, ...]
    links: tuple[LinkSpec, ...]
    host_rate_mbit: float
    buffer_packets: int
    jobs: tuple[JobSpec, ...]
    controller: Mapping[str, Any]
    """The controller's TOML tables as a dict: ``{"controller": {...}, "policy": {...}, "reports": {...}}``."""

    @property
    def has_loop(self) -> bool:
        """Whether the switch links form a cycle (the kernel target then runs STP on its bridges)."""
        parent = {s: s for s in self.switches}

        def root(s: str) -> str:
            while parent[s] != s:
                s = parent[s]
            return s

        for link in self.links:
            ra, rb = root(link.a), root(link.b)
            if ra == rb:
                return True
            parent[ra] = rb
        return False


def _fail(where: str, message: str) -> TopologyFileError:
    return TopologyFileError(f"{where}: {message}")


def _keys(table: Any, allowed: tuple[str, ...], where: str) -> dict:
    if not isinstance(table, Mapping):
        raise _fail(where, f"expected a mapping, got {type(table).__name__}")
    unknown = [k for k in table if k not in allowed]
    if unknown:
        if unknown[0] == "delay_ms":
            raise _fail(f"{where}.delay_ms", "link delays need the netem qdisc, which this kernel lacks")
        raise _fail(f"{where}.{unknown[0]}", f"unknown key; known: {', '.join(allowed)}")
    return dict(table)


def _number(value: Any, where: str, *, kind: type = float, lo: float | None = None, hi: float | None = None):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise _fail(where, f"expected {'an integer' if kind is int else 'a number'}, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise _fail(where, f"{value} is outside [{lo}, {hi}]")
    return kind(value)


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise _fail(where, f"expected a list, got {value!r}")
    return value


def _rate(value: Any, where: str) -> str:
    text = value if isinstance(value, str) else repr(value)
    try:
        if isinstance(value, bool):
            raise ConfigError("not a rate")
        parse_rate(text)
    except ConfigError:
        raise _fail(where, f"expected a rate such as 20M or 500k (bit/s), got {value!r}") from None
    return text


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.isidentifier() or len(value) > 7:
        raise _fail(where, f"names are identifiers of at most 7 characters (Mininet interface names), got {value!r}")
    return value


def parse(data: Mapping[str, Any], source: str = "<topology>") -> TopologySpec:
    """A ``TopologySpec`` from a parsed file; raises ``TopologyFileError``."""
    top = _keys(data, ("name", "target", "buffer_packets", "switches", "hosts", "links", "host_rate_mbit", "jobs",
                       "controller"), source)
    target = top.get("target", "kernel")
    if target not in TARGETS:
        raise _fail(f"{source}: target", f"{target!r}; choose one of {', '.join(TARGETS)}")
    switches = top.get("switches")
    if not isinstance(switches, list) or not switches:
        raise _fail(f"{source}: switches", "a non-empty list of switch names is required")
    switches = tuple(_name(s, f"{source}: switches[{i}]") for i, s in enumerate(switches))
    if len(set(switches)) != len(switches):
        raise _fail(f"{source}: switches", "names repeat")
    hosts = []
    raw_hosts = top.get("hosts")
    if not isinstance(raw_hosts, Mapping) or not raw_hosts:
        raise _fail(f"{source}: hosts", "a non-empty mapping host -> switch is required")
    for n, (name, value) in enumerate(raw_hosts.items(), start=1):
        where = f"{source}: hosts.{name}"
        _name(name, where)
        if name in switches or name == CTL_NAME:
            raise _fail(where, "a host needs a name no switch (and not 'ctl') has")
        spec = {"switch": value} if isinstance(value, str) else _keys(value, ("switch", "ip"), where)
        if spec.get("switch") not in switches:
            raise _fail(f"{where}.switch", f"{spec.get('switch')!r} is not one of the switches")
        ip = spec.get("ip", f"10.0.0.{n}")
        try:
            addr = ipaddress.IPv4Address(ip)
        except ValueError:
            raise _fail(f"{where}.ip", f"{ip!r} is not an IPv4 address") from None
        if addr not in ipaddress.IPv4Network("10.0.0.0/24") or str(addr) in ("10.0.0.0", "10.0.0.254", "10.0.0.255"):
            raise _fail(f"{where}.ip", f"{ip} must lie in 10.0.0.1-253 (10.0.0.254 is the controller's host)")
        hosts.append(HostSpec(name, spec["switch"], str(addr)))
    if len({h.ip for h in hosts}) != len(hosts):
        raise _fail(f"{source}: hosts", "two hosts have the same ip")
    host_rate = _number(top.get("host_rate_mbit", 100.0), f"{source}: host_rate_mbit", lo=0.1, hi=100000)
    links = []
    for i, link in enumerate(_list(top.get("links", []), f"{source}: links")):
        where = f"{source}: links[{i}]"
        link = _keys(link, ("a", "b", "rate_mbit"), where)
        for end in ("a", "b"):
            if link.get(end) not in switches:
                raise _fail(f"{where}.{end}", f"{link.get(end)!r} is not one of the switches")
        if link["a"] == link["b"]:
            raise _fail(where, "a link joins two different switches")
        links.append(LinkSpec(link["a"], link["b"], _number(link.get("rate_mbit", host_rate), f"{where}.rate_mbit",
                                                             lo=0.1, hi=100000)))
    names = {h.name for h in hosts}
    jobs = []
    for i, job in enumerate(_list(top.get("jobs", []), f"{source}: jobs")):
        where = f"{source}: jobs[{i}]"
        job = _keys(job, ("name", "src", "dst", "messages", "msr", "size", "rate"), where)
        for end in ("src", "dst"):
            if job.get(end) not in names:
                raise _fail(f"{where}.{end}", f"{job.get(end)!r} is not one of the hosts")
        name = job.get("name", f"job{i + 1}")
        if not isinstance(name, str) or not name.replace("-", "_").isidentifier():
            raise _fail(f"{where}.name", f"a job name is a word (letters, digits, _ or -; it names files), got {name!r}")
        jobs.append(JobSpec(name=name, src=job["src"], dst=job["dst"],
                            messages=_number(job.get("messages", 1000), f"{where}.messages", kind=int, lo=1),
                            msr=_number(job.get("msr", 0.9), f"{where}.msr", lo=0.0, hi=1.0),
                            size=_number(job.get("size", 1368), f"{where}.size", kind=int, lo=1),
                            rate=_rate(job.get("rate", "20M"), f"{where}.rate")))
    if len({j.name for j in jobs}) != len(jobs):
        raise _fail(f"{source}: jobs", "job names repeat")
    controller = _keys(top.get("controller", {}), ("epoch_ms", "counters_every", "decision_log", "metrics_bind",
                                                   "metrics_port", "policy", "reports", "cadentflow"),
                       f"{source}: controller")
    tables = {k: controller.pop(k) for k in ("policy", "reports", "cadentflow") if k in controller}
    tables["controller"] = controller
    spec = TopologySpec(
        name=str(top.get("name", Path(source).stem)), target=target, switches=switches, hosts=tuple(hosts),
        links=tuple(links), host_rate_mbit=host_rate,
        buffer_packets=_number(top.get("buffer_packets", 64), f"{source}: buffer_packets", kind=int, lo=29, hi=100000),
        jobs=tuple(jobs), controller=tables)
    controller_config(spec, [], source)  # the controller settings are checked now, not when the network is up
    return spec


def controller_config(spec: TopologySpec, switches, source: str = "<topology>"):
    """The ``ControllerConfig`` of ``spec`` for a network's switch entries."""
    try:
        config = config_from_dict(spec.controller, source=f"{source}: controller")
    except ControllerConfigError as e:
        raise TopologyFileError(str(e)) from None
    return dataclasses.replace(config, switches=tuple(switches))


def load(path: str | Path) -> TopologySpec:
    """Read and check a topology file (YAML or JSON)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise TopologyFileError(f"{path}: cannot read: {e.strerror}") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # noqa: BLE001 - yaml and json raise their own error types
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TopologyFileError(f"{path}: not valid {'YAML' if path.suffix in ('.yaml', '.yml') else 'JSON'}: "
                                f"{first}") from None
    return parse(data if data is not None else {}, str(path))
