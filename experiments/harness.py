"""Testbed for the experiments: a kernel switch with N hosts, its controller, and processes on the hosts.

``Testbed`` wraps ``topo.netns.NetnsLab`` (a bridge in its own network namespace, one veth per host, all
names ``na`` + random) and programs its egress ports with ``controller.kernel_driver.KernelDriver``:

- ``switch="netapprox"``: the 8 strict-priority queues, queue k >= 1 holding 8 - k packets and queue 0
  the rest of ``buffer_packets``. With ``controller=True`` the in-process ``controller.loop.Controller``
  runs its epoch loop and moves jobs between queues from their REPORTs (ATP_Full). With
  ``controller=False`` the switch keeps a static state: the default TLR thresholds (each packet is
  queued by the TLR it carries) plus optional fixed ``job_queues`` (ATP_FixPrio pins a job to a queue).
- ``switch="fifo"``: the same port with one queue: every class, TLR and job goes to queue 0, whose buffer
  is the whole ``buffer_packets`` (the 7 approximate queues are empty and unused). This is the
  "conventional switch" the non-approximate FCT is compared against.

Hosts 0..N-1 run the workload; one extra host, ``ctl``, is the controller's in-band address: REPORTs
sent to ``testbed.report_addr`` (UDP 7601) reach a socket opened inside that host's namespace and are
handed to ``Controller.ingest_report``. Everything started here is stopped by PID in ``close()``, and the
namespaces are deleted, also on errors and Ctrl-C.
"""
from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

log = logging.getLogger(__name__)

REPORT_PORT = 7601
CLONE_NEWNET = 0x40000000
APPROX_QUEUES_BUFFER = 28  # 7 + 6 + ... + 1 packets in queues 1..7


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
    """Run the controller's epoch loop (dynamic priority). Off: static TLR thresholds (+ ``job_queues``)."""
    job_queues: tuple[tuple[int, int], ...] = ()
    """Static (job id, queue) pins, used when ``controller`` is off (ATP_FixPrio)."""
    epoch_s: float = 0.02
    """Controller epoch."""
    sample_queues_s: float | None = None
    """Sample every port's per-queue backlog this often (queue-length plots); None: do not sample."""

    def __post_init__(self) -> None:
        if self.switch not in ("netapprox", "fifo"):
            raise ValueError(f"switch {self.switch!r}: choose 'netapprox' or 'fifo'")
        if self.hosts < 2:
            raise ValueError("need at least two hosts")
        if self.buffer_packets <= APPROX_QUEUES_BUFFER:
            raise ValueError(f"buffer_packets must exceed {APPROX_QUEUES_BUFFER} (the approximate queues)")


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def socket_in_netns(netns: str, kind: int = socket.SOCK_DGRAM) -> socket.socket:
    """A socket created inside named network namespace ``netns`` (a short-lived thread enters it)."""
    box: dict[str, Any] = {}

    def make() -> None:
        try:
            _setns(f"/var/run/netns/{netns}")
            box["sock"] = socket.socket(socket.AF_INET, kind)
        except BaseException as exc:  # handed to the caller
            box["err"] = exc

    t = threading.Thread(target=make, name=f"setns-{netns}")
    t.start()
    t.join()
    if "err" in box:
        raise box["err"]
    return box["sock"]


def fifo_state():
    """Every packet to queue 0: no job/tag rules, one TLR rule covering [0, 1], class default queue 0."""
    from netapprox.controller.model import SwitchState, TlrRule
    from netapprox.hostlib.wire import TLR_ONE
    return SwitchState(tlr_rules=frozenset({TlrRule(tlr_lo=0, tlr_hi=TLR_ONE, qid=0)}))


def static_state(job_queues: Sequence[tuple[int, int]] = ()):
    """Default TLR thresholds (per-packet TLR classification) plus fixed job -> queue pins."""
    from netapprox.controller.model import JobRule, SwitchState, default_tlr_rules
    return SwitchState(tlr_rules=default_tlr_rules(),
                       job_rules=frozenset(JobRule(job_id=j, qid=q) for j, q in job_queues))


class Proc:
    """A process on an emulated host, with its stdout/stderr in files and its PID kept for stopping."""

    def __init__(self, popen: subprocess.Popen, name: str, log_path: Path) -> None:
        self.popen = popen
        self.name = name
        self.log_path = log_path

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def running(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


class Testbed:
    """Use as a context manager: ``with Testbed(cfg, workdir) as tb: tb.start_py(0, "netapprox.hostlib", [...])``."""

    def __init__(self, config: TestbedConfig, workdir: Path) -> None:
        self.config = config
        self.workdir = Path(workdir)
        self.lab = None
        self.controller = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._report_sock: socket.socket | None = None
        self.driver = None
        self.queue_samples: list[dict] = []
        self.reports_relayed = 0
        self.epochs: list[dict] = []
        self._procs: list[Proc] = []
        self._aliases: dict[int, str] = {}

    # -- addresses -----------------------------------------------------------------------------------------
    def ip(self, host: int) -> str:
        return self.lab.host_ips[host]

    @property
    def ctl_host(self) -> int:
        return self.config.hosts

    @property
    def report_addr(self) -> tuple[str, int]:
        return self.lab.host_ips[self.ctl_host], REPORT_PORT

    def alias_ip(self, host: int) -> str:
        """A second address on ``host`` (same interface, same switch port), created on first use.

        Background traffic that must use the ATP port (to be queued by TLR) goes to this address, so it
        shares the host's switch port with the host's ATP receiver without sharing its socket."""
        if host not in self._aliases:
            import ipaddress
            base = ipaddress.ip_address(self.lab.host_ips[0]) - 1
            addr = str(base + 200 + host)
            self.lab.run(host, ["ip", "addr", "add", f"{addr}/{self.lab.prefixlen}", "dev", "eth0"])
            self._aliases[host] = addr
        return self._aliases[host]

    def port_of(self, host: int) -> str:
        """The switch port (egress interface) facing ``host``."""
        return self.lab.ports[host]

    # -- lifecycle -----------------------------------------------------------------------------------------
    def __enter__(self) -> "Testbed":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        from netapprox.controller.kernel_driver import KernelDriver
        from netapprox.topo.netns import NetnsLab

        cfg = self.config
        self.workdir.mkdir(parents=True, exist_ok=True)
        subnet_byte = 100 + (os.getpid() + int(time.time())) % 150
        self.lab = NetnsLab(hosts=cfg.hosts + 1, subnet=f"10.{subnet_byte}.{os.getpid() % 250}.0/24")
        self.lab.start()
        buffer = cfg.buffer_packets + (APPROX_QUEUES_BUFFER if cfg.switch == "fifo" else 0)
        options = {"ports": list(self.lab.ports), "netns": self.lab.switch_ns, "rate_mbit": cfg.rate_mbit,
                   "buffer_packets": buffer}
        self.driver = KernelDriver.from_options("s1", options)
        if cfg.switch == "fifo":
            self.driver.connect()
            self.driver.apply(fifo_state())
        elif cfg.controller:
            self._start_controller(options)
        else:
            self.driver.connect()
            self.driver.apply(static_state(cfg.job_queues))
        if cfg.sample_queues_s:
            self._spawn(self._sample_queues, "queue-sampler")

    def _start_controller(self, options: dict) -> None:
        from netapprox.controller.config import ControllerConfig, ReportConfig, SwitchConfig
        from netapprox.controller.loop import Controller

        ccfg = ControllerConfig(
            switches=(SwitchConfig(name="s1", kind="kernel", options=options),),
            reports=ReportConfig(port=-1, rate_per_host=100000.0, burst=10000),
            epoch_s=self.config.epoch_s, counters_every=0,
        )
        self.controller = Controller(ccfg, drivers={"s1": self.driver})
        if not self.controller.wait_until_up(30.0):
            raise RuntimeError("the controller could not program the kernel switch within 30 s "
                               "(see the controller's log messages above)")
        self._report_sock = socket_in_netns(self.lab.host_ns[self.ctl_host])
        self._report_sock.bind(("0.0.0.0", REPORT_PORT))
        self._report_sock.settimeout(0.1)
        self._spawn(self._relay_reports, "report-relay")
        self._spawn(self._run_controller, "controller")

    def _spawn(self, fn, name: str) -> None:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _run_controller(self) -> None:
        ctl = self.controller
        period = self.config.epoch_s
        nxt = time.monotonic()
        while not self._stop.is_set():
            res = ctl.step()
            if res.changes:
                self.epochs.append({"wall": time.time(), "epoch": res.epoch,
                                    "assignments": {str(k): v for k, v in res.assignments.items()}})
            nxt += period
            delay = nxt - time.monotonic()
            if delay < 0:
                nxt = time.monotonic()
            else:
                self._stop.wait(delay)

    def _relay_reports(self) -> None:
        while not self._stop.is_set():
            try:
                data, src = self._report_sock.recvfrom(2048)
            except socket.timeout:
                continue
            except OSError:
                return
            self.controller.ingest_report(data, f"{src[0]}:{src[1]}")
            self.reports_relayed += 1

    def _sample_queues(self) -> None:
        """Backlog and drops of every NetApprox leaf qdisc on every port: one netlink dump per sample."""
        from pyroute2 import IPRoute
        from netapprox.topo import kernel_switch as ks

        leaf = {ks.leaf_handle(q): q for q in range(8)}
        ipr = IPRoute(netns=self.lab.switch_ns)
        try:
            name_of = {ipr.link_lookup(ifname=p)[0]: p for p in self.lab.ports}
            while not self._stop.is_set():
                row: dict[str, Any] = {"wall": time.time()}
                try:
                    msgs = ipr.get_qdiscs()
                except Exception:  # a port being rebuilt
                    msgs = []
                for msg in msgs:
                    port = name_of.get(msg["index"])
                    q = leaf.get(msg["handle"])
                    if port is None or q is None:
                        continue
                    queue = msg.get_nested("TCA_STATS2", "TCA_STATS_QUEUE")
                    if queue is None:
                        continue
                    row.setdefault(port, [0] * 8)[q] = queue["qlen"]
                    row.setdefault(port + "_drops", [0] * 8)[q] = queue["drops"]
                self.queue_samples.append(row)
                self._stop.wait(self.config.sample_queues_s)
        finally:
            ipr.close()

    def queue_counters(self, host: int) -> list[dict]:
        """Per-queue transmitted/dropped packets on the port facing ``host`` (fresh pyroute2 handle)."""
        from pyroute2 import IPRoute
        from netapprox.topo import kernel_switch as ks

        ipr = IPRoute(netns=self.lab.switch_ns)
        try:
            idx = ipr.link_lookup(ifname=self.port_of(host))[0]
            return [dataclasses.asdict(s) for s in ks.read_port_stats(ipr, idx)]
        finally:
            ipr.close()

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()
        if self._report_sock is not None:
            self._report_sock.close()
            self._report_sock = None
        if self.controller is not None:
            try:
                self.controller.close()
            except Exception as exc:  # never mask the experiment's own error
                log.warning("controller close: %s", exc)
            self.controller = None
        elif self.driver is not None:
            self.driver.close()
        self.driver = None
        if self.lab is not None:
            self.lab.close()  # stops every process started on a host (by PID) and deletes the namespaces
            self.lab = None

    # -- processes -----------------------------------------------------------------------------------------
    def start_py(self, host: int, module: str, args: Sequence[str], name: str) -> Proc:
        """Run ``python -m module args`` on ``host``; output goes to ``workdir/name.log``."""
        log_path = self.workdir / f"{name}.log"
        fh = open(log_path, "wb")
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        try:
            p = self.lab.popen(host, [sys.executable, "-m", module, *args], stdout=fh, stderr=subprocess.STDOUT,
                               env=env, cwd=root)
        finally:
            fh.close()
        proc = Proc(p, name, log_path)
        self._procs.append(proc)
        return proc

    def wait_file(self, path: Path, timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if path.exists():
                return
            time.sleep(0.02)
        raise TimeoutError(f"{path} did not appear within {timeout} s")

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
        """Without a controller: install the static state with these (job, queue) pins (ATP_FixPrio) and
        queue_by_class rules (e.g. DNN traffic to a low-priority queue)."""
        if self.controller is not None or self.config.switch != "netapprox":
            raise RuntimeError("static pins need switch='netapprox' and controller=False")
        import dataclasses as _dc
        self.driver.apply(_dc.replace(static_state(job_queues), class_rules=frozenset(class_rules)))

    def wait_all(self, procs: Sequence[Proc], timeout: float) -> list[int | None]:
        """Wait for ``procs``; a process still running at the deadline is stopped (by PID) and gets None."""
        from netapprox.topo.netns import stop_process

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
        from netapprox.topo.netns import stop_process
        stop_process(proc.popen)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_json_lines(path: Path) -> list[dict]:
    out = []
    try:
        for line in Path(path).read_text().splitlines():
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out
