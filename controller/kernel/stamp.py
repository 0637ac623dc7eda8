"""The kernel switch's eBPF queue stamper: build (clang) and attach (tc) ``stamp.bpf.c``.

A small eBPF classifier (one section per queue) on each stamp class 1:2q writes q into the ATP ``queue`` byte
of DATA packets (and zeroes the UDP checksum), as the P4 program does. It needs clang and tc with BPF
support; without them the stamp classes pass packets on unchanged (u32 match-all) and the byte stays 0xFF
(``attach_stamps`` raises, the driver logs it).

ECN: with the stamper, queue 0's section also marks CE from a virtual copy of queue 0's backlog
(``attach_queue0``; queue 0 drains at line rate, being the highest priority). Thresholds on other queues are
not implemented.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Mapping, Sequence

from netapprox.controller.errors import KernelSwitchError
from netapprox.controller.kernel.tc import STAMP_PRIO, PortShape, netns_prefix
from netapprox.controller.model import NUM_QUEUES
from netapprox.hostlib.wire import DEFAULT_ATP_PORT, OFFSETS


STAMP_SOURCE = Path(__file__).resolve().with_name("stamp.bpf.c")


def _build_dir() -> Path:
    """Where compiled stampers are cached: ``$NETAPPROX_CACHE_DIR/kernel`` if set; in a checkout, its build/kernel
    folder; installed as a package, ``$XDG_CACHE_HOME/netapprox/kernel`` (default ~/.cache/netapprox/kernel)."""
    if os.environ.get("NETAPPROX_CACHE_DIR"):
        return Path(os.environ["NETAPPROX_CACHE_DIR"]) / "kernel"
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").exists():
        return checkout / "build" / "kernel"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "netapprox" / "kernel"


BUILD_DIR = _build_dir()


def stamp_object(atp_port: int = DEFAULT_ATP_PORT, ecn: tuple[int, int, int] | None = None) -> Path:
    """The compiled stamper for ``atp_port`` (built with clang on first use, cached in ``BUILD_DIR``).

    ``ecn``: (threshold bytes, line rate kbit/s, queue 0 buffer bytes) builds section q0 with CE marking."""
    out_dir = BUILD_DIR
    defines = [f"-DATP_PORT={atp_port}", f"-DATP_QUEUE_OFFSET={OFFSETS['queue']}"]
    name = f"stamp-{atp_port}"
    if ecn is not None:
        threshold, rate_kbps, cap = ecn
        defines += [f"-DECN_THRESHOLD_BYTES={threshold}", f"-DRATE_KBPS={rate_kbps}", f"-DQUEUE0_BYTES={cap}"]
        name += f"-ecn{threshold}-r{rate_kbps}-c{cap}"
    obj = out_dir / f"{name}.o"
    if obj.exists() and obj.stat().st_mtime >= STAMP_SOURCE.stat().st_mtime:
        return obj
    clang = shutil.which("clang")
    if clang is None:
        raise KernelSwitchError("the queue stamper needs clang (Debian: clang, libbpf-dev)")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = obj.with_suffix(f".{os.getpid()}.tmp")
    arch_inc = f"/usr/include/{os.uname().machine}-linux-gnu"
    cmd = [clang, "-O2", "-g", "-target", "bpf", *defines, f"-I{arch_inc}", "-c", str(STAMP_SOURCE), "-o", str(tmp)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise KernelSwitchError(f"compiling {STAMP_SOURCE.name} failed: {res.stderr.strip()[-500:]}")
    os.replace(tmp, obj)
    return obj


def _tc_batch(netns: str | None, lines: list[str], what: str) -> None:
    res = subprocess.run(netns_prefix(netns) + ["tc", "-batch", "-"], input="\n".join(lines) + "\n",
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise KernelSwitchError(f"{what} failed: {res.stderr.strip()[-500:]}")


def attach_queue0(netns: str | None, shapes: Mapping[str, PortShape], ecn_threshold_pkts: int | None,
                  atp_port: int = DEFAULT_ATP_PORT) -> None:
    """(Re)attach queue 0's stamper on every port: with CE marking at ``ecn_threshold_pkts`` MTU-sized packets
    of virtual backlog (drained at each port's line rate), or without marking when None."""
    lines = []
    for ifname, shape in shapes.items():
        ecn = None
        if ecn_threshold_pkts is not None:
            ecn = (ecn_threshold_pkts * shape.mtu_bytes, int(round(shape.rate_mbit * 1000)), shape.queue0_bytes())
        obj = stamp_object(atp_port, ecn)
        lines.append(f"filter replace dev {ifname} parent 1:20 protocol all prio {STAMP_PRIO} "
                     f"handle 1 bpf obj {obj} sec q0 classid 1:10")
    _tc_batch(netns, lines, "attaching queue 0's stamper")


def attach_stamps(netns: str | None, ifnames: Sequence[str], atp_port: int = DEFAULT_ATP_PORT) -> None:
    """Attach the stamper to the 8 stamp classes of every port (one ``tc -batch`` run). ``netns``: a name
    under /var/run/netns, a path such as /proc/PID/ns/net, or None for this namespace."""
    obj = stamp_object(atp_port)
    lines = []
    for ifname in ifnames:
        for q in range(NUM_QUEUES):
            lines.append(f"filter replace dev {ifname} parent 1:{0x20 + q:x} protocol all prio {STAMP_PRIO} "
                         f"handle 1 bpf obj {obj} sec q{q} classid 1:{0x10 + q:x}")
    _tc_batch(netns, lines, "attaching the queue stamper")
