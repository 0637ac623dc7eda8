"""The emulated testbed: programs on emulated hosts, and a kernel switch with N hosts and its controller.

``HostPrograms`` runs ``python -m <module> ...`` on emulated hosts (namespaces of ``NetnsLab`` or Mininet
hosts), each with its output in a log file of one working folder, keeps every process by PID, waits for them
and stops exactly those. Every path it hands a program is absolute, and programs run in that folder: a
relative path given by a caller is resolved once, against the caller's folder, before any host starts. The
demo (``topo.demo``) and the experiments' testbed below both run their programs through it, and read what
the programs write with ``read_json`` (a JSON file) and ``read_json_lines`` (one JSON object per line).

``Testbed`` wraps ``topo.netns.NetnsLab`` (a bridge in its own network namespace, one veth per host, all
names ``na`` + random) and runs the controller's one runtime (``controller.runtime.Runtime``) over a
``controller.kernel.driver.KernelDriver`` for its egress ports, with a per-epoch callback that records the
controller's decisions and, when asked, per-queue samples:

- ``switch="netapprox"``: the 8 strict-priority queues, queue k >= 1 holding 8 - k packets and queue 0
  the rest of ``buffer_packets``. With ``controller=True`` the policy moves jobs between queues from their
  REPORTs (ATP_Full, policy mode ``netapprox``). With ``controller=False`` the switch keeps a static state
  (policy mode ``static``): the default TLR thresholds (each packet is queued by the TLR it carries) plus
  optional fixed ``job_queues`` (ATP_FixPrio pins a job to a queue).
- ``switch="fifo"``: the same port with one queue (policy mode ``fifo``): every class, TLR and job goes to
  queue 0, whose buffer is the whole ``buffer_packets`` (the 7 approximate queues are empty and unused). This
  is the network-oblivious switch the papers' baselines run on.

With ``topology="leafspine"`` the same ``Testbed`` runs on a Mininet leaf-spine of kernel switches
(``MininetLab`` over ``topo.net.Emulation``): the runtime drives every switch and installs its ECMP groups, so
approximate ATP DATA is sprayed over the spines (``spray=False``: flow hashing, the ``atp-flowhash`` variant).

Hosts 0..N-1 run the workload; one extra host, ``ctl``, is the controller's in-band address: REPORTs sent
to ``testbed.report_addr`` (UDP 7601) reach the runtime's report socket, opened inside that host's namespace.
Everything started here is stopped by PID in ``close()``, and the namespaces are deleted, also on errors and
Ctrl-C.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from pyroute2 import IPRoute

from netapprox.controller.config import ControllerConfig, PolicyConfig, ReportConfig, SwitchConfig, report_key, with_policy
from netapprox.controller.kernel import tc
from netapprox.controller.model import queue_buffer_packets, resolve_buffer_unit
from netapprox.controller.runtime import Runtime
from netapprox.hostlib.wire import DEFAULT_REPORT_PORT
from netapprox.topo.netns import Lifecycle, NetnsLab, socket_in_netns, stop_process

log = logging.getLogger(__name__)

REPORT_PORT = DEFAULT_REPORT_PORT
APPROX_QUEUES_BUFFER = 28  # 7 + 6 + ... + 1 packets in queues 1..7


def read_json(path: Path) -> Any:
    """The JSON value in ``path``; None when the file is missing or not (yet) complete JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_json_lines(path: Path) -> list[dict]:
    """Every line of ``path`` that is a JSON object, in order (other lines, such as a program's log messages,
    are skipped); [] when the file is missing."""
    out = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


class Proc:
    """A process on an emulated host, with its stdout/stderr in a file and its PID kept for stopping."""

    def __init__(self, popen: subprocess.Popen, name: str, log_path: Path) -> None:
        self.popen = popen
        self.name = name
        self.log_path = log_path

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def poll(self) -> int | None:
        return self.popen.poll()

    def running(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


HostPopen = Callable[..., subprocess.Popen]
"""``popen(host, cmd, **popen_kwargs)``: start ``cmd`` (a list) on emulated host ``host``."""


class HostPrograms:
    """Programs on emulated hosts, started with their output in ``workdir/<name>.log`` and stopped by PID.

    ``workdir`` is made absolute here, once; programs run with it as their working folder."""

    def __init__(self, workdir: Path, popen: HostPopen) -> None:
        self.workdir = Path(workdir).resolve()
        self._popen = popen
        self.procs: list[Proc] = []

    def start(self, host: Any, cmd: Sequence[str], name: str) -> Proc:
        """Run ``cmd`` on ``host``; its output goes to ``workdir/name.log``."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "wb") as fh:
            p = self._popen(host, list(cmd), stdout=fh, stderr=subprocess.STDOUT, cwd=str(self.workdir))
        proc = Proc(p, name, log_path)
        self.procs.append(proc)
        return proc

    def start_py(self, host: Any, module: str, args: Sequence[str], name: str) -> Proc:
        """Run ``python -m module args`` on ``host`` (this interpreter, so the same installation)."""
        return self.start(host, [sys.executable, "-m", module, *args], name)

    def wait_all(self, procs: Sequence[Proc], timeout: float) -> list[int | None]:
        """Wait for ``procs``; a process still running at the deadline is stopped (by PID) and gets None."""
        end = time.monotonic() + timeout
        codes: list[int | None] = []
        for p in procs:
            try:
                codes.append(p.wait(max(0.1, end - time.monotonic())))
            except subprocess.TimeoutExpired:
                stop_process(p.popen)
                codes.append(None)
        return codes

    def stop(self, proc: Proc) -> None:
        stop_process(proc.popen)

    def stop_all(self) -> None:
        for p in self.procs:
            try:
                stop_process(p.popen)
            except OSError as exc:  # one that cannot be stopped must not keep the others running
                log.warning("stopping %s: %s", p.name, exc)
        self.procs.clear()


def wait_file(path: Path, timeout: float = 10.0) -> None:
    """Wait until ``path`` exists (a program's ready file)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            return
        time.sleep(0.02)
    raise TimeoutError(f"{path} did not appear within {timeout} s")


class MininetLab:
    """``NetnsLab``'s interface over a running Mininet ``topo.net.Emulation`` (the leaf-spine): host i is the
    i-th workload host (``Emulation.hosts``), host N the controller host ``ctl``; programs run in a host's
    network namespace (``nsenter``), in their own session so that ``stop_process`` stops exactly them."""

    def __init__(self, emu: Any) -> None:
        self.emu = emu
        self.nodes = [*emu.hosts, emu.ctl]
        self.host_ips = [h.IP() for h in self.nodes]
        self.host_ns = [h.pid for h in self.nodes]
        self.prefixlen = 24
        self.ports = []  # the leaf interface facing each host
        for h in self.nodes:
            intf = h.intfList()[0].link
            self.ports.append(intf.intf2.name if intf.intf1.node is h else intf.intf1.name)
        self._procs: list[subprocess.Popen] = []

    def popen(self, host: int, cmd: Sequence[str], **kw) -> subprocess.Popen:
        p = subprocess.Popen(["nsenter", "-t", str(self.host_ns[host]), "-n", *cmd], start_new_session=True, **kw)
        self._procs.append(p)
        return p

    def run(self, host: int, cmd: Sequence[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        res = subprocess.run(["nsenter", "-t", str(self.host_ns[host]), "-n", *cmd], capture_output=True, text=True,
                             **kw)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} on {self.nodes[host].name}: {res.stderr.strip()}")
        return res

    def close(self) -> None:
        for p in self._procs:
            stop_process(p)
        self._procs.clear()
        self.emu.close()


@dataclasses.dataclass(frozen=True)
class TestbedConfig:
    """Shape of the emulated rack."""

    hosts: int = 4
    """Workload hosts (the controller host comes on top)."""
    rate_mbit: float = 20.0
    """Line rate of every switch port (the bottleneck is the receiver's port), Mbit/s."""
    buffer_packets: int = 64
    """Port buffer in MTU-sized packets (NetApprox: queue 0 gets this minus 28)."""
    switch: str = "netapprox"
    """``netapprox`` (8 priority queues) or ``fifo`` (one queue with the whole buffer)."""
    controller: bool = True
    """Re-map jobs from their reports (dynamic priority). Off: static TLR thresholds (+ ``job_queues``)."""
    job_queues: tuple[tuple[int, int], ...] = ()
    """Static (job id, queue) pins, used when ``controller`` is off (ATP_FixPrio)."""
    policy: tuple[tuple[str, Any], ...] = ()
    """With ``controller``: ``[policy]`` keys for it, as (key, value) pairs (``controller.config.with_policy``:
    mode ``adaptive``, fixed thresholds, tuning limits). Empty: the default policy."""
    epoch_s: float = 0.02
    """Controller epoch."""
    sample_queues_s: float | None = None
    """Sample every port's per-queue backlog this often (queue-length plots); None: do not sample."""
    topology: str = "rack"
    """``rack``: one kernel switch (``NetnsLab``). ``leafspine``: the Mininet leaf-spine of kernel switches
    (``topo.net.Emulation``: ``leaves`` leaves with ``hosts / leaves`` hosts each, every leaf linked to every one
    of ``spines`` spines at ``uplink_mbit``), the controller driving every switch and installing its ECMP groups."""
    leaves: int = 2
    """leafspine: leaf switches (the hosts are spread over them in order, the controller host on the first)."""
    spines: int = 2
    """leafspine: spine switches."""
    uplink_mbit: float | None = None
    """leafspine: rate of every leaf-spine link, Mbit/s; None: ``rate_mbit``."""
    approx_buffer_unit: int | None = None
    """The switches' ``approx_buffer_unit`` (queue k >= 1 holds it x (8 - k) packets); None: every data plane's
    default, ``model.half_buffer_unit`` of the port (1 for 64-packet ports: the paper's k-MTU queues)."""
    spray: bool = True
    """The policy's ``spray`` (leafspine): approximate ATP DATA sprayed per packet over the equal-cost uplinks;
    False: flow hashing for every packet (an ordinary ECMP fabric). The FIFO switch never sprays."""

    def __post_init__(self) -> None:
        if self.topology not in ("rack", "leafspine"):
            raise ValueError(f"topology {self.topology!r}: choose 'rack' or 'leafspine'")
        if self.topology == "leafspine" and (self.leaves < 2 or self.spines < 2 or self.hosts % self.leaves):
            raise ValueError(f"leafspine: need >= 2 leaves and >= 2 spines and hosts a multiple of the leaves "
                             f"(got {self.hosts} hosts, {self.leaves} leaves, {self.spines} spines)")
        if self.policy and (self.switch != "netapprox" or not self.controller):
            raise ValueError("a policy for the controller needs switch='netapprox' and controller=True")
        if self.switch not in ("netapprox", "fifo"):
            raise ValueError(f"switch {self.switch!r}: choose 'netapprox' or 'fifo'")
        if self.hosts < 2:
            raise ValueError("need at least two hosts")
        if self.buffer_packets <= APPROX_QUEUES_BUFFER:
            raise ValueError(f"buffer_packets must exceed {APPROX_QUEUES_BUFFER} (the approximate queues)")

    @property
    def port_buffer_packets(self) -> int:
        """The whole buffer the kernel driver is given per port: ``buffer_packets``, and for FIFO 28 more, so that
        its one queue (queue 0, the rest after the approximate queues) gets ``buffer_packets``."""
        return self.buffer_packets + (APPROX_QUEUES_BUFFER if self.switch == "fifo" else 0)

    @property
    def queue_packets(self) -> tuple[int, ...]:
        """Each logical queue's buffer in MTUs on every port, as ``AtpConfig.queue_packets`` takes it: what ATP
        senders on these hosts should be told (hostlib's default, 64 for queue 0, is a larger port's). NetApprox:
        queue 0 ``buffer_packets`` - 28, queue k >= 1 8 - k; FIFO: queue 0 ``buffer_packets`` (the driver gets 28
        more for the approximate queues, which FIFO leaves unused)."""
        unit = resolve_buffer_unit(self.approx_buffer_unit, self.port_buffer_packets)
        sizes = tuple(queue_buffer_packets(q, self.port_buffer_packets, unit=unit) for q in range(tc.NUM_QUEUES))
        return sizes[:1] + (0,) * (tc.NUM_QUEUES - 1) if self.switch == "fifo" else sizes

    @property
    def sprays(self) -> bool:
        """Whether approximate ATP DATA is sprayed over equal-cost paths here (its senders are told so:
        ``AtpConfig.path_reorders``)."""
        return self.topology != "rack" and self.spray and self.switch != "fifo"

    @property
    def policy_mode(self) -> str:
        if self.switch == "fifo":
            return "fifo"
        return "netapprox" if self.controller else "static"


class Testbed(Lifecycle):
    """Use as a context manager: ``with Testbed(cfg, workdir) as tb: tb.start_py(0, "netapprox.hostlib", [...])``."""

    def __init__(self, config: TestbedConfig, workdir: Path) -> None:
        self.config = config
        self.programs = HostPrograms(workdir, lambda host, cmd, **kw: self.lab.popen(host, cmd, **kw))
        self.workdir = self.programs.workdir
        self.lab: NetnsLab | None = None
        self.runtime: Runtime | None = None
        self.queue_samples: list[dict] = []
        self.epochs: list[dict] = []
        self.tuning: list[dict] = []
        self._aliases: dict[int, str] = {}
        self._port_names: dict[tuple[str, int], str] = {}  # (switch, port number) -> interface name
        self._epoch_done = threading.Condition()

    # -- addresses -----------------------------------------------------------------------------------------
    def ip(self, host: int) -> str:
        return self.lab.host_ips[host]

    @property
    def ctl_host(self) -> int:
        return self.config.hosts

    @property
    def report_addr(self) -> tuple[str, int]:
        return self.lab.host_ips[self.ctl_host], REPORT_PORT

    @property
    def report_key_file(self) -> Path:
        """The key the controller checks reports with (created with the first run in this work folder)."""
        return self.workdir / "report.key"

    @property
    def report_args(self) -> list[str]:
        """A sender's command-line arguments to report to this testbed's controller, signed."""
        return ["--report-to", f"{self.report_addr[0]}:{self.report_addr[1]}",
                "--report-key-file", str(self.report_key_file)]

    @property
    def controller(self) -> Runtime | None:
        """The runtime when it re-maps jobs from their reports (``controller=True`` on the NetApprox switch),
        else None: senders only need ``--report-to`` when this is set."""
        return self.runtime if self.config.policy_mode == "netapprox" else None

    @property
    def reports_relayed(self) -> int:
        """Reports the controller accepted so far."""
        return self.runtime.core.ingest_stats.accepted if self.runtime is not None else 0

    def alias_ip(self, host: int) -> str:
        """A second address on ``host`` (same interface, same switch port), created on first use.

        Background traffic that must use the ATP port (to be queued by TLR) goes to this address, so it
        shares the host's switch port with the host's ATP receiver without sharing its socket."""
        if host not in self._aliases:
            base = ipaddress.ip_address(self.lab.host_ips[0]) - 1
            addr = str(base + 200 + host)
            self.lab.run(host, ["ip", "addr", "add", f"{addr}/{self.lab.prefixlen}", "dev", "eth0"])
            self._aliases[host] = addr
        return self._aliases[host]

    def port_of(self, host: int) -> str:
        """The switch port (egress interface) facing ``host``."""
        return self.lab.ports[host]

    # -- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.config
        self.workdir.mkdir(parents=True, exist_ok=True)
        if cfg.topology == "leafspine":
            self._start_leafspine()
            return
        subnet_byte = 100 + (os.getpid() + int(time.time())) % 150
        self.lab = NetnsLab(hosts=cfg.hosts + 1, subnet=f"10.{subnet_byte}.{os.getpid() % 250}.0/24")
        self.lab.start()
        buffer = cfg.port_buffer_packets
        ports = {name: i + 1 for i, name in enumerate(self.lab.ports)}
        self._port_names = {("s1", n): name for name, n in ports.items()}
        options = {"ports": ports, "netns": self.lab.switch_ns, "rate_mbit": cfg.rate_mbit, "buffer_packets": buffer}
        if cfg.approx_buffer_unit is not None:
            options["approx_buffer_unit"] = cfg.approx_buffer_unit
        every = max(1, round(cfg.sample_queues_s / cfg.epoch_s)) if cfg.sample_queues_s else 0
        ccfg = ControllerConfig(
            switches=(SwitchConfig(name="s1", kind="kernel", options=options),),
            policy=with_policy(PolicyConfig(mode=cfg.policy_mode, pinned=tuple(cfg.job_queues)), cfg.policy,
                               "testbed policy"),
            reports=ReportConfig(rate_per_host=100000.0, burst=10000,
                                 key=report_key(self.report_key_file, create=True, where="testbed report key")),
            epoch_s=cfg.epoch_s, counters_every=every,
        )
        sock = socket_in_netns(self.lab.host_ns[self.ctl_host])
        try:
            sock.bind(("0.0.0.0", REPORT_PORT))
        except BaseException:
            sock.close()
            raise
        self.runtime = Runtime(ccfg, on_epoch=self._on_epoch, report_socket=sock)
        if not self.runtime.connect(30.0):
            raise RuntimeError("the controller could not program the kernel switch within 30 s "
                               "(see the controller's log messages above)")
        self.runtime.start()

    def _start_leafspine(self) -> None:
        from netapprox.topo.net import Emulation, EmulationConfig  # Mininet: imported only for this topology

        cfg = self.config
        emu = Emulation(EmulationConfig(topology="leafspine", hosts=cfg.hosts // cfg.leaves, leaves=cfg.leaves,
                                        spines=cfg.spines, rate_mbit=cfg.rate_mbit, bottleneck_mbit=cfg.uplink_mbit,
                                        buffer_packets=cfg.port_buffer_packets, approx_buffer_unit=cfg.approx_buffer_unit,
                                        log_dir=str(self.workdir)))
        emu.__enter__()
        try:
            self.lab = MininetLab(emu)
        except BaseException:
            emu.close()
            raise
        try:
            switches = emu.switch_configs()
            self._port_names = {(s.name, n): name for s in switches for name, n in s.options["ports"].items()}
            every = max(1, round(cfg.sample_queues_s / cfg.epoch_s)) if cfg.sample_queues_s else 0
            ccfg = ControllerConfig(
                switches=switches,
                policy=with_policy(PolicyConfig(mode=cfg.policy_mode, pinned=tuple(cfg.job_queues), spray=cfg.spray),
                                   cfg.policy, "testbed policy"),
                reports=ReportConfig(rate_per_host=100000.0, burst=10000,
                                     key=report_key(self.report_key_file, create=True, where="testbed report key")),
                epoch_s=cfg.epoch_s, counters_every=every)
            self.runtime = Runtime(ccfg, on_epoch=self._on_epoch, report_socket=emu.report_socket(REPORT_PORT))
            if not self.runtime.connect(30.0):
                raise RuntimeError("the controller could not program the leaf-spine's switches within 30 s")
            self.runtime.start()
            # Every host resolves the controller's address and every other host's before a trial starts, and
            # the bridges of the looped (STP) fabric learn every host: the first REPORTs of a short job could
            # otherwise all wait on that resolution (a job of ~60 ms then reached the controller with none of
            # them), and the first trial on a new fabric took 1.5-12x its later runs (two jobs of four at
            # 270-1090 ms instead of 60-100, in `make bench`'s leafspine rows).
            self._learn_fabric()
        except BaseException:
            self.close()
            raise

    def _learn_fabric(self) -> None:
        """One ping from every host to the controller and to every other host, all of a host's at once."""
        peers = [self.report_addr[0]] + [self.ip(h) for h in range(self.config.hosts)]
        for host in range(self.config.hosts):
            script = " ".join(f"ping -c 1 -W 2 {a} >/dev/null &" for a in peers if a != self.ip(host)) + " wait"
            self.lab.run(host, ["sh", "-c", script], check=False)

    def _on_epoch(self, result) -> None:
        if result.changes:
            self.epochs.append({"wall": time.time(), "epoch": result.epoch,
                                "assignments": {str(k): v for k, v in result.assignments.items()}})
        for change in result.plan.tuning:  # policy mode adaptive: the tuner's new thresholds and buffers
            self.tuning.append({"wall": time.time(), "epoch": result.epoch, **change.as_log()})
        if result.counters:
            row: dict[str, Any] = {"wall": time.time()}
            for switch, counters in result.counters.items():
                for q in counters.queues:
                    port = self._port_names[(switch, q.port)]
                    row.setdefault(port, [0] * 8)[q.qid] = q.backlog
                    row.setdefault(port + "_drops", [0] * 8)[q.qid] = q.dropped
            self.queue_samples.append(row)
        with self._epoch_done:
            self._epoch_done.notify_all()

    def queue_counters(self, host: int) -> list[dict]:
        """Per-queue transmitted/dropped packets on the port facing ``host`` (its own netlink handle, so it
        never races the controller's)."""
        if self.config.topology != "rack":
            raise RuntimeError("queue_counters reads the rack's switch; on the leaf-spine read the controller's "
                               "counters (the queue samples)")
        ipr = IPRoute(netns=self.lab.switch_ns)
        try:
            idx = ipr.link_lookup(ifname=self.port_of(host))[0]
            return [dataclasses.asdict(s) for s in tc.read_port_stats(ipr, idx)]
        finally:
            ipr.close()

    def close(self) -> None:
        if self.runtime is not None:
            try:
                self.runtime.close()
            except Exception as exc:  # never mask the experiment's own error
                log.warning("controller close: %s", exc)
            self.runtime = None
        if self.lab is not None:
            self.lab.close()  # stops every process started on a host (by PID) and deletes the namespaces
            self.lab = None

    # -- processes -----------------------------------------------------------------------------------------
    def start_py(self, host: int, module: str, args: Sequence[str], name: str) -> Proc:
        """Run ``python -m module args`` on ``host``; output goes to ``workdir/name.log``."""
        return self.programs.start_py(host, module, args, name)

    def wait_file(self, path: Path, timeout: float = 10.0) -> None:
        wait_file(path, timeout)

    def wait_bound(self, host: int, port: int, *, udp: bool = True, timeout: float = 10.0) -> None:
        """Wait until a socket on ``host`` listens on ``port`` (``ss`` inside the host's namespace)."""
        flag = "-Hunl" if udp else "-Htnl"
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            res = self.lab.run(host, ["ss", flag, f"sport = :{port}"], check=False)
            if res.stdout.strip():
                return
            time.sleep(0.05)
        raise TimeoutError(f"nothing bound to port {port} on host {host} within {timeout} s")

    def pin_jobs(self, job_queues: Sequence[tuple[int, int]], class_rules: Sequence = ()) -> None:
        """Without a controller: pin these (job, queue) pairs (ATP_FixPrio) and install these queue_by_class
        rules (e.g. DNN traffic to a low-priority queue). Returns once an epoch has applied them."""
        if self.config.policy_mode != "static":
            raise RuntimeError("static pins need switch='netapprox' and controller=False")
        core = self.runtime.core
        self.runtime.reconfigure(
            policy_config=dataclasses.replace(core.config.policy, pinned=tuple(job_queues)),
            switches=[dataclasses.replace(sw, class_rules=tuple(class_rules)) for sw in core.switches.values()])
        self.wait_epochs(2)  # the epoch under way may have started before the change

    def wait_epochs(self, n: int = 2, timeout: float = 10.0) -> None:
        """Return once the controller has run ``n`` more epochs (what waited on its report socket is then
        ingested: a job that ended just now may have REPORTs there still)."""
        target = self.runtime.epochs + n
        with self._epoch_done:
            if not self._epoch_done.wait_for(lambda: self.runtime.epochs >= target, timeout=timeout):
                raise RuntimeError(f"the controller did not run {n} epochs within {timeout:.0f} s")

    def wait_all(self, procs: Sequence[Proc], timeout: float) -> list[int | None]:
        """Wait for ``procs``; a process still running at the deadline is stopped (by PID) and gets None."""
        return self.programs.wait_all(procs, timeout)

    def stop(self, proc: Proc) -> None:
        self.programs.stop(proc)
