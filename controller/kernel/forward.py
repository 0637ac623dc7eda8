"""The kernel switch's ECMP forwarding: build (clang) and attach (tc, clsact ingress) ``forward.bpf.c``.

``SwitchState.ecmp_routes`` becomes a route table compiled into the program (``route_lookup_source``) and
``SwitchState.spray`` its SPRAY switch; ``attach_forward`` puts it on the ingress of every port (one
``tc -batch``), ``detach_forward`` takes it off (the switch then bridges every packet, as without routes).
The decision is ``controller.reference.reference_next_hops`` (tests/controller/test_kernel_spray.py holds the
kernel to it). Objects are cached by their route table in the stamper's build folder.
"""
from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from netapprox.controller.errors import KernelSwitchError
from netapprox.controller.kernel import stamp
from netapprox.controller.kernel.tc import netns_prefix
from netapprox.controller.model import ECMP_BUCKETS, EcmpRoute
from netapprox.controller.reference import DATA_V1
from netapprox.hostlib.wire import DEFAULT_ATP_PORT, HEADER_LEN, OFFSETS, Flags

FORWARD_SOURCE = Path(__file__).resolve().with_name("forward.bpf.c")
FORWARD_PRIO = 1  # the forwarding program on clsact ingress


def route_lookup_source(routes: Iterable[EcmpRoute], ifindex: Mapping[int, int]) -> str:
    """C statements for ``route_port(dst, b)``: longest prefix first, the ifindex of bucket ``b`` of the first
    route holding ``dst`` (``model.ecmp_buckets``: the (b mod n)-th smallest port). ``ifindex``: port number
    -> interface index on the switch."""
    lines = []
    for r in sorted(routes, key=lambda r: (-r.prefix_len, r.prefix)):
        net = ipaddress.IPv4Network(f"{r.prefix}/{r.prefix_len}")
        members = sorted(r.ports)
        missing = [p for p in members if p not in ifindex]
        if missing:
            raise KernelSwitchError(f"ecmp route {net}: no port(s) {missing} on this switch")
        body = " ".join(f"if (k == {i}) return {ifindex[p]};" for i, p in enumerate(members))
        lines.append(f"if ((dst & 0x{int(net.netmask):08x}u) == 0x{int(net.network_address):08x}u) "
                     f"{{ __u32 k = b % {len(members)}; {body} return 0; }}")
    return " \\\n    ".join(lines) if lines else "(void)dst; (void)b;"


def forward_object(routes: Iterable[EcmpRoute], ifindex: Mapping[int, int], spray: bool,
                   atp_port: int = DEFAULT_ATP_PORT) -> Path:
    """The compiled forwarding program for this route table (built on first use, cached)."""
    lookup = route_lookup_source(routes, ifindex)
    defines = [f"-DATP_PORT={atp_port}", f"-DSPRAY={int(spray)}", f"-DECMP_BUCKETS={ECMP_BUCKETS}",
               f"-DATP_HEADER_LEN={HEADER_LEN}", f"-DATP_FLAGS_OFFSET={OFFSETS['flags']}",
               f"-DATP_FLAG_APPROX={int(Flags.APPROX)}", f"-DATP_DATA_BYTE0={DATA_V1}"]
    digest = hashlib.sha256((lookup + " ".join(defines) + FORWARD_SOURCE.read_text()).encode()).hexdigest()[:16]
    out_dir = stamp.BUILD_DIR
    obj = out_dir / f"forward-{digest}.o"
    if obj.exists():
        return obj
    clang = shutil.which("clang")
    if clang is None:
        raise KernelSwitchError("ECMP forwarding on the kernel switch needs clang (Debian: clang, libbpf-dev)")
    out_dir.mkdir(parents=True, exist_ok=True)
    header = out_dir / f"forward-{digest}.h"
    header.write_text(f"#define ROUTE_LOOKUP \\\n    {lookup}\n")
    tmp = obj.with_suffix(f".{os.getpid()}.tmp")
    arch_inc = f"/usr/include/{os.uname().machine}-linux-gnu"
    cmd = [clang, "-O2", "-g", "-target", "bpf", *defines, f"-I{arch_inc}", "-include", str(header),
           "-c", str(FORWARD_SOURCE), "-o", str(tmp)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise KernelSwitchError(f"compiling {FORWARD_SOURCE.name} failed: {res.stderr.strip()[-500:]}")
    os.replace(tmp, obj)
    return obj


def _tc_batch(netns: str | None, lines: list[str], what: str, ok_missing: bool = False) -> None:
    res = subprocess.run(netns_prefix(netns) + ["tc", "-force", "-batch", "-"], input="\n".join(lines) + "\n",
                         capture_output=True, text=True)
    if res.returncode != 0 and not ok_missing:
        raise KernelSwitchError(f"{what} failed: {res.stderr.strip()[-500:]}")


def attach_forward(netns: str | None, ifnames: Sequence[str], obj: Path) -> None:
    """Put ``obj`` on the clsact ingress of every port in ``ifnames`` (adding clsact where missing)."""
    have = subprocess.run(netns_prefix(netns) + ["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    lines = []
    for ifname in ifnames:
        if f"qdisc clsact ffff: dev {ifname} " not in have:
            lines.append(f"qdisc add dev {ifname} clsact")
        lines.append(f"filter replace dev {ifname} ingress protocol all prio {FORWARD_PRIO} handle 1 "
                     f"bpf da obj {obj} sec forward")
    _tc_batch(netns, lines, "attaching the ECMP forwarding program")


def detach_forward(netns: str | None, ifnames: Sequence[str]) -> None:
    """Take the forwarding program off every port (the switch then bridges everything); missing ones are fine."""
    _tc_batch(netns, [f"filter del dev {ifname} ingress protocol all prio {FORWARD_PRIO}" for ifname in ifnames],
              "detaching the ECMP forwarding program", ok_missing=True)
