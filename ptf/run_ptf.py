"""Run the NetApprox PTF suite against BMv2 simple_switch_grpc in a private network namespace.

    python ptf/run_ptf.py [--build] [test names ...]      (as root; `make ptf` does --build)

What it does, and undoes in reverse whatever happens:
  1. creates the namespace ``na-p4-<random>`` with IPv6 off (no stray router solicitations) and one veth pair
     per switch port: ``swp<i>`` (BMv2 port i) <-> ``ptf<i>`` (PTF port i), i = 1..4;
  2. starts ``simple_switch_grpc --priority-queues 8 --cpu-port 255`` on the swp side, without a
     program (the tests push build/v1model/{bmv2.json,p4info.txtpb} over P4Runtime), keeps its PID and
     waits until its gRPC and Thrift ports answer;
  3. runs ``ptf`` inside the namespace on ptf/tests;
  4. stops exactly that simple_switch_grpc PID and deletes the namespace (which removes the veths).
The exit status is ptf's: 0 only if every PTF test passed.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
import tempfile

from netapprox.topo.bmv2 import Bmv2Error, Bmv2Options, Bmv2Process
from netapprox.topo.netns import Lifecycle

REPO = pathlib.Path(__file__).resolve().parent.parent
PTF_TESTS = REPO / "ptf" / "tests"
BUILD = REPO / "build" / "v1model"
PORTS = (1, 2, 3, 4)
CPU_PORT = 255
GRPC_PORT = 9559
THRIFT_PORT = 9090


class HarnessError(RuntimeError):
    """The namespace, the switch or the PTF run could not be set up."""


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise HarnessError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
    return res


def missing_tools() -> list[str]:
    """Executables this harness needs that are not on PATH."""
    return [t for t in ("p4c-bm2-ss", "simple_switch_grpc", "ip") if shutil.which(t) is None]


def build(defines: str = "") -> None:
    """`make p4`: compile p4src/v1model/netapprox.p4 into build/v1model (no-op when up to date)."""
    cmd = ["make", "-C", str(REPO), "p4"]
    if defines:
        cmd.append(f"P4_DEFINES={defines}")
    _run(cmd)


class Bmv2Namespace(Lifecycle):
    """A namespace with veth pairs and one simple_switch_grpc in it. Use as a context manager."""

    def __init__(self, workdir: pathlib.Path, ports=PORTS, cpus: str | None = None) -> None:
        self.name = f"na-p4-{secrets.token_hex(4)}"
        self.workdir = workdir
        self.ports = tuple(ports)
        self.cpus = cpus  # taskset CPU list for simple_switch_grpc, e.g. "0" (queueing experiments)
        self.switch: Bmv2Process | None = None
        self.switch_log = workdir / "simple_switch_grpc.log"
        self._ns_created = False

    def exec_cmd(self, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *cmd]

    def start(self) -> None:
        self._create_namespace()
        self._start_switch()

    def _create_namespace(self) -> None:
        _run(["ip", "netns", "add", self.name])
        self._ns_created = True
        for key in ("all", "default"):
            _run(self.exec_cmd(["sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"]))
        _run(self.exec_cmd(["ip", "link", "set", "lo", "up"]))
        for i in self.ports:
            _run(["ip", "-n", self.name, "link", "add", f"swp{i}", "type", "veth", "peer", "name", f"ptf{i}"])
            for dev in (f"swp{i}", f"ptf{i}"):
                _run(["ip", "-n", self.name, "link", "set", dev, "mtu", "9000", "up"])

    def _start_switch(self) -> None:
        options = Bmv2Options(ports={i: f"swp{i}" for i in self.ports}, device_id=0, grpc_port=GRPC_PORT,
                              thrift_port=THRIFT_PORT, cpu_port=CPU_PORT, netns=self.name, cpus=self.cpus,
                              log_level=None, event_log=str(self.workdir / "bmv2"))
        self.switch = Bmv2Process(options, self.switch_log)
        try:
            self.switch.start(timeout=30)
        except Bmv2Error as e:
            raise HarnessError(str(e)) from None

    def log_tail(self, lines: int = 30) -> str:
        return self.switch.log_tail(lines) if self.switch is not None else "(no log)"

    def close(self) -> None:
        if self.switch is not None:
            self.switch.stop()
        self.switch = None
        if self._ns_created:
            subprocess.run(["ip", "netns", "delete", self.name], capture_output=True)
            self._ns_created = False


def run_ptf(ns: Bmv2Namespace, tests: list[str], *, timeout: float = 300, arch: str = "v1model",
            test_dir: pathlib.Path = PTF_TESTS, params: dict | None = None) -> subprocess.CompletedProcess:
    """Run ptf on ``test_dir`` (default ptf/tests) inside ``ns`` with the suite's test parameters and ``params``;
    returns the finished process (stdout+stderr in .stdout)."""
    params = {
        "grpcaddr": f"127.0.0.1:{GRPC_PORT}",
        "device_id": 0,
        "p4info": str(BUILD / "p4info.txtpb"),
        "bmv2_json": str(BUILD / "bmv2.json"),
        "cpu_port": CPU_PORT,
        "thrift_port": THRIFT_PORT,
        "arch": arch,
        **(params or {}),
    }
    cmd = [sys.executable, str(pathlib.Path(sys.executable).parent / "ptf"), "--test-dir", str(test_dir),
           "--log-file", str(ns.workdir / "ptf.log"), "--qlen", "4096", "--test-params", ";".join(f"{k}={v!r}" for k, v in params.items())]
    for i in ns.ports:
        cmd += ["--interface", f"{i}@ptf{i}"]
    cmd += tests
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(ns.exec_cmd(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=str(ns.workdir), env=env)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        out += f"\nptf did not finish within {timeout}s and was stopped"
        return subprocess.CompletedProcess(proc.args, 124, out)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


def keep_logs(workdir: pathlib.Path, dest: pathlib.Path) -> None:
    """Copy the files of a run's ``workdir`` (BMv2 and PTF logs) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in workdir.iterdir():
        if f.is_file():
            shutil.copy(f, dest / f.name)


def cannot_run(prog: str, missing: list[str]) -> str | None:
    """The one-line reason ``prog`` cannot run here (not root, tools not on PATH), or None."""
    if os.geteuid() != 0:
        return f"{prog}: needs root (network namespaces)"
    if missing:
        return f"{prog}: not on PATH: {', '.join(missing)}; see docs/dataplane.md"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tests", nargs="*", help="PTF test names (module or module.Class); default: all")
    ap.add_argument("--build", action="store_true", help="run `make p4` first")
    ap.add_argument("--keep-logs", metavar="DIR", help="copy BMv2 and PTF logs here")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--taskset", metavar="CPUS", help="pin simple_switch_grpc to these CPUs (e.g. 0)")
    args = ap.parse_args(argv)
    why = cannot_run("run_ptf", missing_tools())
    if why:
        print(why, file=sys.stderr)
        return 2
    if args.build:
        build()
    with tempfile.TemporaryDirectory(prefix="netapprox-ptf-") as tmp:
        workdir = pathlib.Path(tmp)
        try:
            with Bmv2Namespace(workdir, cpus=args.taskset) as ns:
                res = run_ptf(ns, args.tests, timeout=args.timeout)
        finally:
            if args.keep_logs:
                keep_logs(workdir, pathlib.Path(args.keep_logs))
        print(res.stdout)
        return res.returncode


if __name__ == "__main__":
    sys.exit(main())
