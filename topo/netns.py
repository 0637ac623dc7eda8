"""Named network namespaces, veth links and a kernel switch without Mininet (tests, benchmarks).

Everything created here has a unique name (``na`` + random hex) and is removed by ``close()`` (also on
errors and Ctrl-C when used as a context manager). Processes started with ``NetnsLab.popen`` are tracked by
PID and stopped exactly by that PID.
"""
from __future__ import annotations

import ctypes
import ipaddress
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from typing import Any, Sequence

CLONE_NEWNET = 0x40000000


def unique_tag(nbytes: int = 2) -> str:
    return secrets.token_hex(nbytes)


def run(cmd: Sequence[str], *, check: bool = True, netns: str | None = None, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd`` (a list), inside ``netns`` when given. Raises with stderr on failure when ``check``."""
    full = (["ip", "netns", "exec", netns] if netns else []) + list(cmd)
    res = subprocess.run(full, capture_output=True, text=True, **kw)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


class Lifecycle:
    """A context manager over ``start()`` and ``close()``: entering starts (and closes again if starting fails
    halfway), leaving closes. ``close`` must be safe to call on a half-started object."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stop_on_signals(signals: Sequence[int] = (signal.SIGTERM, signal.SIGHUP)) -> None:
    """Make ``signals`` stop the calling program the way Ctrl-C does (a ``KeyboardInterrupt``, so the
    ``with`` blocks above clean up), in this process only: a forked child (pyroute2 opens namespace sockets
    from a short-lived child, and stops it with SIGTERM) inherits the handler, and must terminate the way the
    signal's default action would, not unwind its parent's stack."""
    main_pid = os.getpid()

    def interrupt(signum, _frame):
        if os.getpid() != main_pid:
            os._exit(128 + signum)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in signals:
        signal.signal(sig, interrupt)


def netns_path(netns: str | int) -> str:
    """The namespace file of a named namespace (``ip netns``), a process id, or a path given as is."""
    if isinstance(netns, int):
        return f"/proc/{netns}/ns/net"
    return netns if "/" in netns else f"/var/run/netns/{netns}"


def socket_in_netns(netns: str | int, kind: int = socket.SOCK_DGRAM) -> socket.socket:
    """A socket created inside network namespace ``netns`` (see ``netns_path``); it stays there. A short-lived
    thread enters the namespace, so the calling thread's namespace never changes."""
    box: dict[str, Any] = {}

    def worker() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(netns_path(netns), os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into {netns_path(netns)}: {os.strerror(err)}")
            finally:
                os.close(fd)
            box["sock"] = socket.socket(socket.AF_INET, kind)
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    t = threading.Thread(target=worker, name="netns-socket")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["sock"]


class NetnsLab(Lifecycle):
    """A kernel switch (bridge in its own namespace) with ``hosts`` host namespaces, one veth each.

    Host i (0-based) has address ``subnet`` .i+1, interface ``eth0``; the switch port facing it is
    ``p<i+1>`` (port number i+1). The queue tree and classifier are not built here: use
    ``controller.kernel.driver.KernelDriver`` with ``netns=lab.switch_ns`` and ``ports=lab.ports``.
    """

    def __init__(self, hosts: int = 2, subnet: str = "10.201.0.0/24") -> None:
        self.tag = unique_tag()
        self.switch_ns = f"na{self.tag}sw"
        self.host_ns = [f"na{self.tag}h{i + 1}" for i in range(hosts)]
        net = ipaddress.ip_network(subnet)
        self.prefixlen = net.prefixlen
        self.host_ips = [str(net.network_address + i + 1) for i in range(hosts)]
        self.ports = [f"p{i + 1}" for i in range(hosts)]
        self._namespaces: list[str] = []
        self._procs: list[subprocess.Popen] = []

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        for ns in [self.switch_ns] + self.host_ns:
            run(["ip", "netns", "add", ns])
            self._namespaces.append(ns)
            run(["ip", "link", "set", "lo", "up"], netns=ns)
        sw = self.switch_ns
        # No multicast snooping: a snooping bridge joins 224.0.0.106 (multicast router discovery) and sends
        # IGMP reports out of every port, into queue 0's counters, whenever its timers say.
        run(["ip", "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"], netns=sw)
        # No STP, forward immediately, and no bridge netfilter hooks.
        run(["ip", "link", "set", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"], netns=sw)
        run(["ip", "link", "set", "br0", "up"], netns=sw)
        for i, ns in enumerate(self.host_ns):
            port = self.ports[i]
            run(["ip", "link", "add", port, "netns", sw, "type", "veth", "peer", "name", "eth0", "netns", ns],
                netns=sw)
            run(["ip", "link", "set", port, "master", "br0", "up"], netns=sw)
            run(["ip", "addr", "add", f"{self.host_ips[i]}/{self.prefixlen}", "dev", "eth0"], netns=ns)
            run(["ip", "link", "set", "eth0", "up"], netns=ns)
            run(["ethtool", "-K", "eth0", "tx", "off"], netns=ns, check=False)
        # Quiet, deterministic hosts: no IPv6 chatter, static ARP (per-queue counters then count only test traffic).
        for ns in [self.switch_ns] + self.host_ns:
            run(["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"], netns=ns, check=False)
            run(["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"], netns=ns, check=False)
        macs = [open_mac(ns) for ns in self.host_ns]
        for i, ns in enumerate(self.host_ns):
            for j, ip in enumerate(self.host_ips):
                if i != j:
                    run(["ip", "neigh", "replace", ip, "lladdr", macs[j], "dev", "eth0", "nud", "permanent"], netns=ns)

    def popen(self, host: int, cmd: Sequence[str], **kw) -> subprocess.Popen:
        """Start ``cmd`` in host ``host``'s namespace; it is stopped (by PID) on close()."""
        p = subprocess.Popen(["ip", "netns", "exec", self.host_ns[host]] + list(cmd), start_new_session=True, **kw)
        self._procs.append(p)
        return p

    def run(self, host: int, cmd: Sequence[str], **kw) -> subprocess.CompletedProcess:
        return run(cmd, netns=self.host_ns[host], **kw)

    def close(self) -> None:
        for p in self._procs:
            stop_process(p)
        self._procs.clear()
        for ns in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        self._namespaces.clear()


def open_mac(netns: str, ifname: str = "eth0") -> str:
    out = run(["cat", f"/sys/class/net/{ifname}/address"], netns=netns).stdout.strip()
    return out


def stop_process(p: subprocess.Popen, timeout: float = 3.0) -> None:
    """Stop exactly ``p`` (and its own process group, which it leads when started with
    ``start_new_session=True``): SIGTERM, then SIGKILL."""
    if p.poll() is not None:
        return
    try:
        pgid = os.getpgid(p.pid)
        own_group = pgid == p.pid
    except ProcessLookupError:
        return
    sig_target = (lambda s: os.killpg(pgid, s)) if own_group else p.send_signal
    try:
        sig_target(signal.SIGTERM)
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            sig_target(signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout)
    except ProcessLookupError:
        pass


def wait_until(pred, timeout: float, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(interval)
    return pred()
