"""``python -m netapprox.topo.session FILE``: a topology file's network and its controller, then the Mininet CLI.

    sudo .venv/bin/python -m netapprox.topo.session topo/examples/dumbbell.yaml [--pcap DIR] [--metrics-port 9100]

Brings up the network described in FILE (topo/topofile.py) on its target (kernel switches, or BMv2 with
``target: bmv2``), starts the controller through its runtime (reports reach it on the in-band host ``ctl``,
10.0.0.254:7601, or as packet-in on BMv2), starts the file's ``jobs`` (an ``atp-recv`` on each destination, an
``atp-send`` on each source, reporting to the controller) and drops into the Mininet CLI, where the host
shells have ``atp-send``/``atp-recv`` on their PATH (``h1 atp-send 10.0.0.2 --messages 500 --report-to
10.0.0.254:7601 --report-key-file RESULTS/report.key``: reports are signed with the key the controller was
given, the topology file's ``controller.reports.key`` or one made for the run). Leaving the CLI (``exit``, Ctrl-D) or a signal stops everything it started: the jobs,
the controller, the captures, the switches and the network. ``--no-cli`` runs the jobs to completion (or
``--duration`` seconds) instead, for scripts and tests.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

from mininet.cli import CLI

from netapprox.controller.errors import BindError
from netapprox.controller.runtime import Runtime
from netapprox.hostlib import checks as C
from netapprox.hostlib.wire import DEFAULT_ATP_PORT
from netapprox.topo.net import Emulation, EmulationConfig
from netapprox.topo.netns import Lifecycle, stop_on_signals, stop_process
from netapprox.topo.topofile import TopologyFileError, TopologySpec, controller_config, load

REPO = Path(__file__).resolve().parent.parent


class Session(Lifecycle):
    """The network, the controller and the jobs of one topology file; ``close()`` stops them all."""

    def __init__(self, spec: TopologySpec, *, pcap: str | None = None, metrics_port: int | None = None,
                 results: str = "results/session") -> None:
        self.spec = spec
        self.pcap = pcap
        self.metrics_port = metrics_port
        self.results = Path(results)
        self.emu = None
        self.runtime = None
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        # Host shells inherit this environment: put this interpreter's scripts (atp-send, atp-recv) first.
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        self.results.mkdir(parents=True, exist_ok=True)
        self.emu = Emulation(EmulationConfig(topology="file", spec=self.spec, target=self.spec.target,
                                             buffer_packets=self.spec.buffer_packets, rate_mbit=self.spec.host_rate_mbit,
                                             log_dir=str(self.results), pcap=self.pcap,
                                             bmv2_json=str(REPO / "build" / "v1model" / "bmv2.json")))
        self.emu.start()
        config = controller_config(self.spec, self.emu.switch_configs())
        config = dataclasses.replace(config, reports=dataclasses.replace(
            config.reports, key=self.emu.report_key(config.reports.key)))  # the hosts get it: report_args
        if self.metrics_port is not None:
            config = dataclasses.replace(config, metrics_port=self.metrics_port)
        sock = self.emu.report_socket() if self.spec.target == "kernel" else None
        self.runtime = Runtime(config, report_socket=sock)
        if not self.runtime.connect(30.0):
            raise RuntimeError("the controller could not program the switches within 30 s")
        self.runtime.start()

    def start_jobs(self) -> None:
        hosts = {h.name: h for h in self.emu.net.hosts}
        ip = {h.name: h.ip for h in self.spec.hosts}
        for dst in sorted({j.dst for j in self.spec.jobs}):
            self._popen(f"recv-{dst}", hosts[dst], ["atp-recv", "--port", str(DEFAULT_ATP_PORT), "--serve"])
        time.sleep(0.5)
        for i, job in enumerate(self.spec.jobs):
            self._popen(job.name, hosts[job.src], [
                "atp-send", f"{ip[job.dst]}:{DEFAULT_ATP_PORT}", "--job-id", str(1000 + i), "--messages",
                str(job.messages), "--msr", str(job.msr), "--size", str(job.size), "--rate", job.rate,
                *self.emu.report_args, "--json", str((self.results / f"{job.name}.json").resolve())])

    def _popen(self, name: str, host, args: list[str]) -> None:
        with open(self.results / f"{name}.log", "w") as log:
            self.procs[name] = host.popen(args, stdout=log, stderr=subprocess.STDOUT)

    def wait_jobs(self, timeout: float) -> dict[str, int | None]:
        """Wait for the senders; returns each job's exit code (None: still running at the deadline)."""
        end = time.monotonic() + timeout
        codes = {}
        for job in self.spec.jobs:
            try:
                codes[job.name] = self.procs[job.name].wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[job.name] = None
        return codes

    def cli(self) -> None:
        CLI(self.emu.net)

    def close(self) -> None:
        for proc in self.procs.values():
            stop_process(proc)
        self.procs.clear()
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None
        if self.emu is not None:
            self.emu.close()
            self.emu = None


def main(argv: list[str] | None = None) -> int:
    ap = C.OneLineParser(prog="python -m netapprox.topo.session", description=__doc__.splitlines()[0])
    ap.add_argument("topology", help="topology file (YAML or JSON; see topo/examples/)")
    ap.add_argument("--pcap", metavar="DIR", help="write one pcap per switch interface into DIR (default: no capture)")
    ap.add_argument("--metrics-port", type=C.arg(C.port(allow=(0,))),
                    help="serve the controller's Prometheus metrics on this port (default: the topology file's, else off)")
    ap.add_argument("--results", default="results/session", help="logs and job summaries (default results/session)")
    ap.add_argument("--no-cli", action="store_true", help="run the jobs to completion (or --duration), no CLI")
    ap.add_argument("--duration", type=C.arg(C.number(gt=0.0)), default=120.0,
                    help="with --no-cli: stop after this long (s)")
    args = ap.parse_args(argv)
    try:
        spec = load(args.topology)
        for option, directory in (("--results", args.results), ("--pcap", args.pcap)):
            if directory is not None:
                C.output_file(create_dirs=True)(Path(directory) / "x.log", option)
    except (TopologyFileError, C.CheckError) as e:
        ap.error(str(e))
    if os.geteuid() != 0:
        print(f"{ap.prog}: error: needs root (Mininet, network namespaces, qdiscs): run it with sudo", file=sys.stderr)
        return 2

    stop_on_signals()  # SIGTERM/SIGHUP clean up like Ctrl-C
    try:
        with Session(spec, pcap=args.pcap, metrics_port=args.metrics_port, results=args.results) as session:
            print(f"{spec.name}: {len(spec.switches)} {spec.target} switch(es), {len(spec.hosts)} hosts; controller "
                  f"up (reports to {session.emu.report_target}, key {session.emu.report_key_file}, metrics {session.runtime.metrics_address})", flush=True)
            session.start_jobs()
            if args.no_cli:
                codes = session.wait_jobs(args.duration)
                for name, code in codes.items():
                    print(f"job {name}: {'still running' if code is None else f'exit {code}'}", flush=True)
                return 0 if all(c == 0 for c in codes.values()) else 1
            print("Mininet CLI: host shells have atp-send/atp-recv; `exit` stops everything.", flush=True)
            session.cli()
            return 0
    except KeyboardInterrupt:
        print("interrupted: everything the session started has been stopped", file=sys.stderr)
        return 130
    except BindError as e:  # a port in use: one line, exit status 2, like every command line
        print(f"{ap.prog}: error: {C.one_line(e)}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError) as e:
        print(f"{ap.prog}: error: {C.one_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
