"""The emulated back end: a trial on a kernel switch in network namespaces (topo/testbed.py), with real
programs on the hosts. Needs root.

    backend = EmulatedBackend(Scale())
    with backend:                                       # closes its testbed on exit
        trial = backend.run_trial(plan, workdir)        # plan: experiments.plans.TrialPlan

| protocol | sender | receiver |
|---|---|---|
| ``atp`` (+ variants) | ``experiments.atp_job send`` (hostlib.api) | ``experiments.atp_job recv`` |
| ``tcp-es``, ``tcp-ss`` | ``experiments.baselines tcp-send`` (kernel TCP) | ``experiments.baselines tcp-recv`` |
| ``udp`` | ``experiments.baselines udp-send`` at line rate | ``experiments.baselines udp-recv`` |

Background segments are ``baselines udp-send`` blasts to the receiving host's second address; flows are
``experiments.flows`` clients and servers. Every program of a trial is launched first and waits for one
start line (``experiments.hostprog``). A testbed serves every trial of its switch kind in a row (a sweep runs
them grouped, ``group_of``); job ids are mapped to ids unique in this process, since the controller outlives
a trial, and reported as the plan's. Per-job metrics: experiments/metrics.py.

The testbed's own experiments (``vector_trial``: a gradient vector over ATP; ``ddnn_trial``: a DNN ring next to
flows) run their programs directly on a ``Testbed``.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from netapprox.controller.model import ClassRule, queue_for_tlr
from netapprox.experiments import ddnn
from netapprox.experiments import metrics as M
from netapprox.experiments.baselines import TCP_DEFAULT_PORT, UDP_DEFAULT_PORT
from netapprox.experiments.flows import FLOW_DEFAULT_PORT
from netapprox.experiments.hostprog import ready_marks, write_start
from netapprox.experiments.jobs import Flow, JobWorkload
from netapprox.experiments.plans import (
    ATP_VARIANTS, Background, JobPlan, TrialPlan, atp_variant, is_atp, switch_for)
from netapprox.experiments.workloads import make_job, web_search_flows
from netapprox.hostlib.wire import DEFAULT_ATP_PORT as ATP_PORT
from netapprox.topo.testbed import Proc, Testbed, TestbedConfig, read_json, read_json_lines

BASELINES = ("tcp-es", "tcp-ss", "udp")
NETWORK_VARIANTS = ("atp-flowhash",)
"""ATP variants that differ only in what the network does (experiments.plans.ATP_ABLATION): ``atp-flowhash``, the
leaf-spine hashing every flow instead of spraying approximate DATA (the policy's ``spray`` off)."""
RECEIVER_VARIANTS = ("atp-nogrants", "atp-flowhash-nogrants", "atp-grants", "atp-flowhash-grants")
"""ATP variants whose receivers grant or not whatever hostlib's default (``receiver_grants``; experiments.plans),
with the fabric spraying and hashing: the side-by-side measurement of docs/results.md, "Receiver grants"."""
SENDER_VARIANTS = ("atp-reorderseen",)
"""ATP variants whose senders are not told what the fabric does: ``atp-reorderseen``, a sender on a spraying
leaf-spine that is not told so (``AtpConfig.path_reorders`` off: its first window on the packet threshold)."""
PROTOCOLS = tuple(ATP_VARIANTS) + NETWORK_VARIANTS + RECEIVER_VARIANTS + SENDER_VARIANTS + BASELINES
START_MARGIN_S = 0.1
"""The start line is this far after the last program of a trial said it is ready (``experiments.hostprog``: each
polls the start file every 2 ms), so every program has seen it before the instant comes."""
START_READY_TIMEOUT_S = 60.0
"""At most this long for the programs to get ready; the line opens then anyway (a late program records it)."""
SWITCH_CONFIG = {"netapprox": {"switch": "netapprox", "controller": True},
                 "static": {"switch": "netapprox", "controller": False},
                 "fifo": {"switch": "fifo", "controller": False}}
"""The testbed of each switch kind (experiments.plans.SWITCHES)."""
QUEUE_SAMPLE_S = 0.02


@dataclasses.dataclass(frozen=True)
class Scale:
    """How far the papers' setups are scaled down (recorded in every result file)."""

    rate_mbit: float = 20.0
    """Line rate of every switch port."""
    buffer_packets: int = 64
    """Port buffer (MTU packets); NetApprox gives 36 to queue 0 and 7..1 to queues 1..7."""
    approx_buffer_unit: int | None = None
    """The switches' ``approx_buffer_unit``; None: the one default of every data plane (``model.half_buffer_unit``:
    1, the paper's k-MTU queues, for 64-packet ports)."""
    hosts: int = 4
    """Workload hosts on the single rack."""
    fbkv_n: int = 1000
    """Messages per FBKV job (mean item ~365 B: ~365 KB per job)."""
    fbhd_n: int = 40
    """Messages per FBHD job."""
    fbhd_max: int = 200_000
    """Cap on one FBHD message (bytes) so a job fits a few seconds at this rate."""
    flow_size_scale: float = 50.0
    """Web-search flow sizes are divided by this (mean 1.67 MB -> 33 KB)."""
    timeout_s: float = 60.0
    """Per-trial timeout."""
    lead_s: float = 0.2
    """A job that meets background starts this long after the background (process start-up time)."""
    slack_s: float = 1.0
    """Background outlasts the job it is set against by this much beyond the job's expected span."""
    topology: str = "rack"
    """``rack`` (one kernel switch) or ``leafspine`` (Mininet: ``leaves`` x ``spines`` kernel switches, the hosts
    spread over the leaves; topo/testbed.py)."""
    leaves: int = 2
    spines: int = 2
    uplink_mbit: float | None = None
    """leafspine: every leaf-spine link's rate; None: ``rate_mbit``."""

    @property
    def rate_bps(self) -> float:
        return self.rate_mbit * 1e6

    def job(self, kind: str, seed: int, times: int = 1) -> JobWorkload:
        if kind == "fbkv":
            return make_job("fbkv", seed, self.fbkv_n * times)
        return make_job("fbhd", seed, self.fbhd_n * times, max_size=self.fbhd_max)

    def job_seed(self, seed: int, host: int) -> int:
        """The workload seed of ``host``'s job in a run of ``seed`` (one rack: fewer than 100 hosts)."""
        return seed * 100 + host

    def senders_of(self, seed: int, hosts: Sequence[int], exclude: Sequence[int] = ()) -> list[int]:
        """Every host but ``exclude`` sends (a rack has few hosts)."""
        return [h for h in hosts if h not in exclude]

    def testbed(self, **kw: Any) -> TestbedConfig:
        base = {"hosts": self.hosts, "rate_mbit": self.rate_mbit, "buffer_packets": self.buffer_packets,
                "approx_buffer_unit": self.approx_buffer_unit,
                "topology": self.topology, "leaves": self.leaves, "spines": self.spines,
                "uplink_mbit": self.uplink_mbit}
        base.update(kw)
        return TestbedConfig(**base)


_id_counter = [int(time.time()) % 100000 * 1000]


def next_job_id() -> int:
    """Job ids unique within this process and unlikely to repeat across runs (the controller keys on them)."""
    _id_counter[0] += 1
    return _id_counter[0]


class EmulatedBackend:
    """Runs trial plans on the emulated rack; see the module docstring."""

    name = "emulated"
    protocols = PROTOCOLS
    baselines = ("tcp-es", "tcp-ss")
    """Its TCP EarlySend and SampleSend (kernel TCP: DCTCP where the kernel has it, else CUBIC)."""
    time_unit = ("s", 1.0)
    rate_unit = "mbps"
    cluster = False
    """Trials need root, namespaces and the whole machine's timing: they run here, one at a time."""
    deterministic = False
    """A trial is a measurement: a rerun measures again unless told to take finished trials from a cache."""

    def __init__(self, scale: Scale = Scale()) -> None:
        self.scale = scale
        self._tb: Testbed | None = None
        self._tb_key: tuple | None = None

    @property
    def hosts(self) -> list[int]:
        return list(range(self.scale.hosts))

    @property
    def where(self) -> str:
        """For plot titles: where the trials ran (the rack is the default, so nothing)."""
        return ""

    def far_hosts(self) -> tuple[int, int, int]:
        """(sender, background sender, receiver) of a job against background (on a rack: any three hosts)."""
        return 0, 1, self.scale.hosts - 1

    def identity(self) -> dict:
        """What, besides a plan and the code, decides a trial's result (the trial cache's key): the scale, and
        the machine it is measured on."""
        return {"name": self.name, "scale": dataclasses.asdict(self.scale), "host": socket.gethostname()}

    def prepare(self) -> None:
        """Nothing to load before a trial (the testbed starts with the first trial of its switch kind)."""

    def describe(self, protocols: Sequence[str] = ()) -> dict:
        """What a result file records about where its trials ran."""
        sc = self.scale
        where = (f"one rack: {sc.hosts} hosts and a controller host on a kernel switch" if sc.topology == "rack" else
                 f"a leaf-spine of kernel switches ({sc.leaves} leaves, {sc.spines} spines, {sc.hosts // sc.leaves} hosts "
                 f"per leaf, leaf-spine links at {sc.uplink_mbit or sc.rate_mbit:g} Mbit/s) and a controller host")
        return {"scale": dataclasses.asdict(sc),
                "testbed": f"{where}, {sc.rate_mbit:g} Mbit/s ports, {sc.buffer_packets}-packet buffers",
                "switches": {p: switch_for(p) for p in protocols}}

    def result_dir(self, out: Path, name: str) -> tuple[str, Path]:
        """(experiment name in result.json, folder) of a figure's results."""
        return name, out / name

    def group_of(self, plan: TrialPlan) -> tuple:
        """Trials of one group share a testbed; a sweep runs them in a row."""
        return plan.switch_kind, plan.sample_queues, plan.policy, sprays(plan.protocol)

    def check(self, plan: TrialPlan) -> None:
        if plan.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {plan.protocol!r}; known: {', '.join(PROTOCOLS)}")
        if plan.switch_kind not in SWITCH_CONFIG:
            raise ValueError(f"switch {plan.switch_kind!r}: choose one of {', '.join(SWITCH_CONFIG)}")

    def run_trial(self, plan: TrialPlan, workdir: Path) -> dict:
        """Run ``plan`` on the testbed of its group under ``workdir`` (started here, or kept from the trial
        before when it is the same) and return its record."""
        self.check(plan)
        kind = plan.switch_kind
        cfg = self.scale.testbed(**SWITCH_CONFIG[kind], sample_queues_s=QUEUE_SAMPLE_S if plan.sample_queues else None,
                                 policy=tuple(plan.policy), spray=sprays(plan.protocol))
        tb = self._testbed((*self.group_of(plan), Path(workdir).resolve()), cfg, Path(workdir) / f"work-{kind}")
        return run_on_testbed(tb, plan, timeout=self.scale.timeout_s)

    def ddnn_trial(self, seed: int, *, workers: int, model_bytes: int, compute_s: float, flow_load: float,
                   duration_s: float, class_rules: Sequence[ClassRule], name: str, workdir: Path) -> tuple[dict, dict]:
        """A ring-allreduce DNN next to web-search flows (``ddnn_trial``) on a testbed of ``workers`` + 1 hosts
        without a controller, ``class_rules`` pinned: (metrics, raw record)."""
        tb = self._testbed(("ddnn", workers, Path(workdir).resolve()),
                           self.scale.testbed(hosts=workers + 1, controller=False), Path(workdir))
        tb.pin_jobs([], class_rules=list(class_rules))
        return ddnn_trial(tb, self.scale, seed, workers=workers, model_bytes=model_bytes, compute_s=compute_s,
                          flow_load=flow_load, duration_s=duration_s, name=name)

    def vector_trial(self, vec: np.ndarray, vec_name: str, bound: float, load: float, *, name: str,
                     workdir: Path) -> tuple[dict, dict]:
        """A gradient vector sent by ATP with MSR = 1 - ``bound`` next to background at ``load``
        (``vector_trial``); the vector is written once per ``vec_name``: (metrics, raw record)."""
        tb = self._testbed(("vector", Path(workdir).resolve()), self.scale.testbed(), Path(workdir))
        vfile = tb.workdir / f"{vec_name}.npy"
        if not vfile.exists():
            np.save(vfile, vec)
        return vector_trial(tb, self.scale, vec, vfile, bound, load, name=name)

    def _testbed(self, key: tuple, cfg: TestbedConfig, workdir: Path) -> Testbed:
        """The testbed for ``key``: kept from the trial before when the key is the same, else started anew."""
        if self._tb is None or self._tb_key != key:
            self.close()
            tb = Testbed(cfg, workdir)
            tb.__enter__()
            self._tb, self._tb_key = tb, key
        return self._tb

    def close(self) -> None:
        if self._tb is not None:
            tb, self._tb, self._tb_key = self._tb, None, None
            tb.close()

    def __enter__(self) -> "EmulatedBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------------
# One trial on a testbed


def sprays(protocol: str) -> bool:
    """Whether the network sprays approximate ATP DATA for ``protocol`` (the policy's default, unless the ATP
    variant says otherwise; only a multi-path testbed has anything to spray over)."""
    return bool(atp_variant(protocol).get("spray", True)) if is_atp(protocol) else True


def _bg_port(b: Background, i: int) -> int:
    return ATP_PORT if b.tlr is not None else UDP_DEFAULT_PORT + 1 + i


def queue_packets_arg(tb: Testbed) -> str:
    """The switch's queue buffers for an ATP sender's ``--queue-packets`` (hostlib's default is a larger port's)."""
    return ",".join(str(q) for q in tb.config.queue_packets)


def _rate_arg(bps: float) -> str:
    return f"{bps / 1e6:g}M"


def run_on_testbed(tb: Testbed, plan: TrialPlan, *, timeout: float = 60.0) -> dict:
    """Run ``plan`` on ``tb``: receivers, flow servers and background receivers first, then every sender,
    background source and flow client from one start line; wait; collect the per-job metrics."""
    wd = tb.workdir / plan.name
    if wd.exists():  # a previous run's ready files and summaries must not be mistaken for this run's
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    run = _TrialRun(tb, plan, wd, timeout)
    if plan.protocol == "atp-fixprio":  # ATP_FixPrio: every job stays in the queue of 1 - MSR
        tb.pin_jobs([(run.wire_id[j.job_id], queue_for_tlr(1 - j.msr)) for j in plan.jobs])
    run.start_receivers()
    run.launch()
    run.wait()
    return run.collect()


def open_start_line(start_file: Path, procs: Sequence[Proc]) -> float:
    """Wait until each of ``procs`` marked itself ready at ``start_file`` or exited (at most
    ``START_READY_TIMEOUT_S``), then write the start line, ``START_MARGIN_S`` from now, and return it."""
    end = time.monotonic() + START_READY_TIMEOUT_S
    while time.monotonic() < end:
        if len(ready_marks(start_file)) + sum(p.poll() is not None for p in procs) >= len(procs):
            break
        time.sleep(0.005)
    t_start = time.time() + START_MARGIN_S
    write_start(start_file, t_start)
    return t_start


class _TrialRun:
    """One trial on the testbed, phase by phase: what each phase started, for the next to wait on and read."""

    def __init__(self, tb: Testbed, plan: TrialPlan, wd: Path, timeout: float) -> None:
        self.tb, self.plan, self.wd, self.timeout = tb, plan, wd, timeout
        self.protocol, self.name = plan.protocol, plan.name
        self.rate_bps = tb.config.rate_mbit * 1e6
        self.wire_id = {j.job_id: next_job_id() for j in plan.jobs}
        self.by_dst: dict[int, list[JobPlan]] = {}
        for j in plan.jobs:
            self.by_dst.setdefault(j.dst, []).append(j)
        self.flow_pairs: dict[tuple[int, int], list[Flow]] = {}
        for f in plan.flows:
            self.flow_pairs.setdefault((f.src, f.dst), []).append(f)
        self.bg_ports = [_bg_port(b, i) for i, b in enumerate(plan.background)]
        self.receivers: dict[int, Proc] = {}
        self.rx_json: dict[int, Path] = {}
        self.flow_servers: list[Proc] = []
        self.bg_rx: list[tuple[Proc, Path]] = []
        self.bg_tx: list[Proc] = []
        self.flow_clients: list[tuple[Proc, Path, tuple[int, int]]] = []
        self.senders: list[tuple[Proc, Path, JobPlan]] = []
        self.t_start = self.t_end = 0.0
        self.start_file = wd / "start"
        self.jobs_done_file = wd / "jobs-done"  # written once every sender exited (``TrialPlan.stop_with_jobs``)
        self.codes: list = []
        self.rx_codes: list = []
        self.bg_codes: list = []

    # 1. receivers, flow servers, background receivers
    def start_receivers(self) -> None:
        tb, wd, timeout, protocol, name = self.tb, self.wd, self.timeout, self.protocol, self.name
        ready_files: list[Path] = []  # every program starts first, then all are waited for (not one by one)
        for dst, js in self.by_dst.items():
            out = wd / f"rx{dst}.json"
            ready = wd / f"rx{dst}.ready"
            self.rx_json[dst] = out
            if is_atp(protocol):
                args = ["recv", f"{tb.ip(dst)}:{ATP_PORT}", "--jobs", str(len(js)), "--timeout", str(timeout),
                        "--json", str(out), "--rate", _rate_arg(self.rate_bps)]
                v = atp_variant(protocol)
                if "receiver_grants" in v:
                    args += ["--grants", "on" if v["receiver_grants"] else "off"]
                if "grant_window_packets" in v:
                    args += ["--grant-window", str(v["grant_window_packets"])]
                self.receivers[dst] = tb.start_py(dst, "netapprox.experiments.atp_job", args, f"{name}-rx{dst}")
            elif protocol in ("tcp-es", "tcp-ss"):
                args = ["tcp-recv", f"{tb.ip(dst)}:{TCP_DEFAULT_PORT}", "--jobs", str(len(js)), "--timeout",
                        str(timeout), "--json", str(out), "--ready-file", str(ready)]
                self.receivers[dst] = tb.start_py(dst, "netapprox.experiments.baselines", args, f"{name}-rx{dst}")
                ready_files.append(ready)
            else:
                args = ["udp-recv", f"{tb.ip(dst)}:{UDP_DEFAULT_PORT}", "--jobs", str(len(js)), "--timeout",
                        str(timeout), "--msr", str(js[0].msr), "--n", str(js[0].workload.n), "--json", str(out),
                        "--ready-file", str(ready)]
                self.receivers[dst] = tb.start_py(dst, "netapprox.experiments.baselines", args, f"{name}-rx{dst}")
                ready_files.append(ready)
        span = self.plan.span_s
        for i, dst in enumerate(dict.fromkeys(dst for _, dst in self.flow_pairs)):
            ready = wd / f"fsrv{i}.ready"
            self.flow_servers.append(tb.start_py(dst, "netapprox.experiments.flows",
                                                 ["server", f"{tb.ip(dst)}:{FLOW_DEFAULT_PORT}", "--duration",
                                                  str(span + timeout + 5), "--ready-file", str(ready)],
                                                 f"{name}-fsrv{i}"))
            ready_files.append(ready)
        # Approximate-looking background must use the ATP port to be queued by TLR; it goes to a second
        # address of the receiving host (same switch port), so no ATP receiver socket sees it. Segments to
        # the same (host, port) share one receiver that counts them as separate jobs.
        groups: dict[tuple[int, int], list[Background]] = {}
        for b, port in zip(self.plan.background, self.bg_ports):
            groups.setdefault((b.dst, port), []).append(b)
        for i, ((dst, port), bs) in enumerate(groups.items()):
            ready = wd / f"bgrx{i}.ready"
            out = wd / f"bgrx{i}.json"
            span_b = max(b.end_s for b in bs)
            self.bg_rx.append((tb.start_py(dst, "netapprox.experiments.baselines",
                                           ["udp-recv", f"{tb.alias_ip(dst)}:{port}", "--jobs", str(len(bs)),
                                            "--timeout", str(span_b + timeout), "--json", str(out),
                                            "--ready-file", str(ready)], f"{name}-bgrx{i}"), out))
            ready_files.append(ready)
        for ready in ready_files:
            tb.wait_file(ready)
        if is_atp(protocol):
            for dst in self.by_dst:
                tb.wait_bound(dst, ATP_PORT)

    # 2. background, flows and jobs, all from one start line (experiments.hostprog): every program is
    # launched first and waits at the line; once all are there it opens at ``t_start``, so start-up costs do
    # not stagger an "all at once" pattern.
    def launch(self) -> None:
        tb, wd, timeout, name, plan = self.tb, self.wd, self.timeout, self.name, self.plan
        for i, (b, port) in enumerate(zip(plan.background, self.bg_ports)):
            args = ["udp-send", f"{tb.alias_ip(b.dst)}:{port}", "--rate", str(b.rate_bps), "--duration",
                    str(b.duration_s), "--n", "50", "--fixed-size", "1368", "--job-id", str(900000 + i),
                    "--json", str(wd / f"bgtx{i}.json"), "--start-at", self.start_arg(b.start_s)]
            if b.tlr is not None:
                args += ["--tlr", str(b.tlr)]
            if plan.stop_with_jobs:
                args += ["--stop-file", str(self.jobs_done_file)]
            self.bg_tx.append(tb.start_py(b.src, "netapprox.experiments.baselines", args, f"{name}-bgtx{i}"))
        for i, ((src, dst), fl) in enumerate(self.flow_pairs.items()):
            sched = wd / f"flows{i}.json"
            sched.write_text(json.dumps([dataclasses.asdict(f) for f in fl]))
            out = wd / f"fcli{i}.json"
            args = ["client", f"{tb.ip(dst)}:{FLOW_DEFAULT_PORT}", "--schedule", str(sched), "--timeout",
                    str(timeout), "--json", str(out), "--start-at", self.start_arg(0.0)]
            if plan.stop_with_jobs:
                args += ["--stop-file", str(self.jobs_done_file)]
            self.flow_clients.append((tb.start_py(src, "netapprox.experiments.flows", args, f"{name}-fcli{i}"),
                                      out, (src, dst)))
        for j in plan.jobs:
            module, args, out = self.sender_args(j)
            self.senders.append((tb.start_py(j.src, module, args, f"{name}-tx{j.job_id}"), out, j))
        at_line = [*self.bg_tx, *(c[0] for c in self.flow_clients),
                   *(s[0] for s in self.senders if s[2].after is None)]
        self.t_start = open_start_line(self.start_file, at_line)

    def start_arg(self, offset_s: float) -> str:
        """``--start-at`` for a program that starts ``offset_s`` after the trial's start line."""
        return f"@{self.start_file}+{offset_s!r}"

    def sender_args(self, j: JobPlan) -> tuple[str, list[str], Path]:
        """The program and arguments that send job ``j`` with this trial's protocol, and where it writes."""
        tb, wd, protocol = self.tb, self.wd, self.protocol
        job_file = wd / f"job{j.job_id}.json"
        job_file.write_text(json.dumps(j.workload.to_dict()))
        out = wd / f"tx{j.job_id}.json"
        start = ["--start-at", self.start_arg(j.start_s)]
        if j.after is not None:  # a second stage: once job ``after``'s sender ended (every one of a tuple)
            for a in _afters(j):
                (wd / f"done{a}").unlink(missing_ok=True)
            start = ["--start-after", *(str(wd / f"done{a}") for a in _afters(j))]
        if any(j.job_id in _afters(k) for k in self.plan.jobs):
            start += ["--done-file", str(wd / f"done{j.job_id}")]
        jid = str(self.wire_id[j.job_id])
        if is_atp(protocol):
            v = atp_variant(protocol)
            what = ["--analytics", j.analytics] if j.analytics else ["--job", str(job_file), "--msr", str(j.msr)]
            args = ["send", f"{tb.ip(j.dst)}:{ATP_PORT}", *what, "--job-id", jid, "--mode", v["mode"], "--completion", v.get("completion", "early"),
                    "--rate", _rate_arg(self.rate_bps), "--queue-packets", queue_packets_arg(tb), "--json", str(out),
                    "--timeline", str(wd / f"timeline{j.job_id}.jsonl"), *start]
            if not v["mrdf"]:
                args.append("--no-mrdf")
            if tb.config.sprays and v.get("path_reorders", True):
                args.append("--path-reorders")  # a fabric that sprays tells its senders (AtpConfig.path_reorders)
            if tb.controller is not None:
                args += tb.report_args
            return "netapprox.experiments.atp_job", args, out
        if protocol in ("tcp-es", "tcp-ss"):
            return "netapprox.experiments.baselines", [
                "tcp-send", f"{tb.ip(j.dst)}:{TCP_DEFAULT_PORT}", "--mode", protocol[-2:], "--msr", str(j.msr),
                "--job", str(job_file), "--job-id", jid, "--seed", jid, "--timeout", str(self.timeout),
                "--json", str(out), *start], out
        return "netapprox.experiments.baselines", [
            "udp-send", f"{tb.ip(j.dst)}:{UDP_DEFAULT_PORT}", "--rate", str(self.rate_bps), "--job", str(job_file),
            "--job-id", jid, "--json", str(out), *start], out

    # 3. wait
    def wait(self) -> None:
        tb, plan, timeout, t_start = self.tb, self.plan, self.timeout, self.t_start
        lead = max(0.0, t_start - time.time())
        self.codes = tb.wait_all([s[0] for s in self.senders],
                                 lead + timeout + max((j.start_s for j in plan.jobs), default=0) + 10)
        self.jobs_done_file.touch()
        self.rx_codes = tb.wait_all(list(self.receivers.values()), 15)
        tb.wait_all([c[0] for c in self.flow_clients], max(0.0, t_start - time.time()) + timeout + plan.span_s + 10)
        for s in self.flow_servers:
            tb.stop(s)
        self.bg_codes = tb.wait_all(self.bg_tx, max(0.0, t_start - time.time()) + plan.span_s + 10)
        tb.wait_all([r for r, _ in self.bg_rx], 15)
        self.t_end = time.time()

    # 4. collect
    def collect(self) -> dict:
        tb, plan, wd, t_start, t_end = self.tb, self.plan, self.wd, self.t_start, self.t_end
        rx_by_dst = {dst: read_json(path) or {} for dst, path in self.rx_json.items()}
        jobs = []
        for (proc, out, j), code in zip(self.senders, self.codes):
            tx = read_json(out)
            rx_jobs = rx_by_dst.get(j.dst, {}).get("jobs", [])
            rx = next((r for r in rx_jobs if r.get("job_id") == self.wire_id[j.job_id]), None)
            m = job_metrics(self.protocol, j, tx, rx, self.rate_bps)
            m["exit_code"] = code
            if tx is None:
                m["error"] = proc.tail(600)
            jobs.append(m)
        flow_rows = []
        for _proc, out, (src, dst) in self.flow_clients:
            for f in (read_json(out) or {}).get("flows", []):
                f["src"], f["dst"] = src, dst
                flow_rows.append(f)
        record: dict[str, Any] = {
            "protocol": self.protocol, "seed": plan.seed, "jobs": jobs, "flows": flow_rows,
            "background": [read_json(p) for _, p in self.bg_rx],
            "background_tx": [read_json(wd / f"bgtx{i}.json") for i in range(len(plan.background))],
            "start_wall": t_start, "end_wall": t_end, "receiver_exit_codes": self.rx_codes,
            "background_exit_codes": self.bg_codes}
        if plan.sample_queues:
            record["queues"] = queue_stats(tb, t_start, t_end, sorted(self.by_dst))
        tuning = [t for t in tb.tuning if t_start - 1.0 <= t["wall"] <= t_end]
        if tuning:  # policy mode adaptive: the tuner's changes during the trial
            record["tuning"] = tuning
        if plan.timeline_job is not None:
            j = next(m for m in jobs if m["job_id"] == plan.timeline_job)
            wid = str(self.wire_id[plan.timeline_job])
            record.update(
                timeline=read_json_lines(wd / f"timeline{plan.timeline_job}.jsonl"),
                timeline_start=j.get("start_wall") or t_start,
                queue_changes=[{"wall": e["wall"], "assignments": {str(plan.timeline_job): e["assignments"][wid]}}
                               for e in tb.epochs if wid in e["assignments"]],
                background_starts=[(b or {}).get("start_wall") for b in record["background_tx"]])
        return record


def queue_stats(tb: Testbed, start_wall: float, end_wall: float, hosts: Sequence[int]) -> dict:
    """Mean and peak total backlog (packets, all queues) and the approximate queues' mean backlog on the ports
    facing ``hosts``, from the testbed's samples between the two instants."""
    ports = [tb.port_of(h) for h in hosts]
    rows = [r for r in tb.queue_samples if start_wall <= r["wall"] <= end_wall]
    totals = [sum(r[p]) for r in rows for p in ports if p in r]
    approx = [sum(r[p][1:]) for r in rows for p in ports if p in r]
    if not totals:
        return {"receiver_port_mean_pkts": None, "receiver_port_approx_mean_pkts": None,
                "receiver_port_max_pkts": None}
    return {"receiver_port_mean_pkts": float(np.mean(totals)), "receiver_port_approx_mean_pkts": float(np.mean(approx)),
            "receiver_port_max_pkts": float(np.max(totals))}


def _afters(j: JobPlan) -> tuple[int, ...]:
    """The jobs ``j`` starts after (``JobPlan.after``: one, a tuple, or none)."""
    return () if j.after is None else (j.after,) if isinstance(j.after, int) else tuple(j.after)


def job_metrics(protocol: str, job: JobPlan, tx: dict | None, rx: dict | None, rate_bps: float) -> dict:
    """A job's metrics (experiments/metrics.py) from its sender's and receiver's JSON summaries."""
    n = job.workload.n
    m = M.job_record(job, rate_bps)
    if tx is None:
        return m
    m["start_wall"] = tx.get("start_wall")
    m["late_start_s"] = tx.get("late_start_s")
    if is_atp(protocol):
        groups = tx.get("groups") or []
        sent = tx.get("packets_sent") or 0
        m.update(jct_s=tx.get("jct_s"), msr_met=bool(tx.get("msr_met")),
                 delivered=sum(g.get("delivered", 0) for g in groups),
                 msg_loss=sum(g.get("lost", 0) for g in groups) / n if n else None,
                 pkt_loss=(tx.get("packets_lost", 0) / sent) if sent else None,
                 receiver_confirmed=tx.get("receiver_confirmed"), retransmissions=tx.get("retransmissions"),
                 final_tlr=[g.get("final_tlr") for g in groups])
        if rx is not None and rx.get("lost_ids") is not None:
            m["delivered_bytes_frac"] = M.atp_delivered_bytes_frac(job.workload, rx["lost_ids"])
    elif protocol in ("tcp-es", "tcp-ss"):
        info = tx.get("tcp_info") or {}
        segs = info.get("segs_out")
        m.update(jct_s=tx.get("jct_s"), msr_met=bool(tx.get("completed")),
                 delivered=(rx or {}).get("delivered"), msg_loss=0.0 if tx.get("completed") else None,
                 pkt_loss=(info.get("total_retrans", 0) / segs) if segs else None, cc=tx.get("cc"))
        if rx is not None and rx.get("bytes_received") is not None:
            m["delivered_bytes_frac"] = M.tcp_delivered_bytes_frac(job.workload, rx["bytes_received"],
                                                                   rx.get("delivered") or 0)
    elif rx is not None:
        complete = rx.get("messages_complete", 0)
        tw = rx.get("target_wall")
        m.update(delivered=complete, msr_met=complete >= M.required_messages(job.msr, n),
                 msg_loss=1 - complete / n, pkt_loss=rx.get("packet_loss"),
                 jct_s=(tw - tx["start_wall"]) if tw else None)
    return M.finish_record(m)


# --------------------------------------------------------------------------------------------------
# The testbed's own trials


def vector_trial(tb: Testbed, scale: Scale, vec: np.ndarray, vfile: Path, bound: float, load: float,
                 name: str) -> tuple[dict, dict]:
    """A gradient vector sent by ATP with MSR = 1 - ``bound`` next to approximate background at ``load`` of the
    link in the job's queue: measured loss, error of the received vector, JCT."""
    wd = tb.workdir / name
    if wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    rate = scale.rate_bps
    jid = next_job_id()
    msr = round(1.0 - bound, 6)
    q0 = queue_for_tlr(bound)
    vec_dir = wd / "vectors"
    rx = tb.start_py(1, "netapprox.experiments.atp_job", ["recv", f"{tb.ip(1)}:7600", "--jobs", "1", "--timeout", str(scale.timeout_s),
                                                          "--json", str(wd / "rx.json"), "--vector-out", str(vec_dir)], f"{name}-rx")
    tb.wait_bound(1, 7600)
    dur = 3.0 * vec.nbytes * 8 / rate + 1.0
    bg_procs = []
    if load > 0:
        bg_rx = tb.start_py(1, "netapprox.experiments.baselines", ["udp-recv", f"{tb.alias_ip(1)}:7600", "--timeout", str(dur + 20),
                                                                    "--ready-file", str(wd / "bg.ready"), "--json", str(wd / "bgrx.json")],
                            f"{name}-bgrx")
        tb.wait_file(wd / "bg.ready")
        bg_procs = [bg_rx, tb.start_py(2, "netapprox.experiments.baselines", ["udp-send", f"{tb.alias_ip(1)}:7600", "--rate", str(load * rate),
                                                                               "--duration", str(dur), "--n", "50", "--fixed-size", "1368",
                                                                               "--tlr", str((q0 + 0.5) / 8), "--job-id", "900100"],
                                       f"{name}-bgtx")]
        time.sleep(0.2)
    args = ["send-vector", f"{tb.ip(1)}:7600", "--vector", str(vfile), "--job-id", str(jid), "--msr", str(msr),
            "--rate", f"{rate / 1e6:g}M", "--queue-packets", queue_packets_arg(tb), "--json", str(wd / "tx.json")]
    if tb.controller is not None:
        args += tb.report_args
    tx = tb.start_py(0, "netapprox.experiments.atp_job", args, f"{name}-tx")
    tb.wait_all([tx], scale.timeout_s + 10)
    tb.wait_all([rx], 15)
    for p in bg_procs:
        tb.stop(p)
    txj, rxj = read_json(wd / "tx.json") or {}, read_json(wd / "rx.json") or {}
    got = None
    for j in rxj.get("jobs", []):
        if j.get("vector_file"):
            got = np.load(j["vector_file"])
    m: dict[str, Any] = {"jct_s": txj.get("jct_s"), "msr_met": txj.get("msr_met")}
    groups = txj.get("groups") or []
    if groups:
        m["msg_loss"] = sum(g.get("lost", 0) for g in groups) / max(1, sum(g.get("total", 0) for g in groups))
        m["within_bound"] = m["msg_loss"] <= bound + 1e-9
    if got is not None and got.shape == vec.shape:
        m["rel_l2_error"] = float(np.linalg.norm(vec - got) / np.linalg.norm(vec))
    else:
        m["rel_l2_error"] = None
        m["vector_missing"] = True
    return m, {"tx": txj, "rx": rxj}


def ddnn_trial(tb: Testbed, scale: Scale, seed: int, *, workers: int, model_bytes: int, compute_s: float,
               flow_load: float, duration_s: float, name: str) -> tuple[dict, dict]:
    """A ring-allreduce DNN on hosts 0..workers-1 next to web-search flows from host ``workers``: iteration
    time and the flows' FCT."""
    rate = scale.rate_bps
    wd = tb.workdir / name
    if wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    peers = ",".join(tb.ip(h) for h in range(workers))
    src = workers  # the flow source host
    fl = web_search_flows(seed, load=flow_load, link_bps=rate, duration_s=duration_s, senders=[src],
                          receivers=list(range(workers)), size_scale=scale.flow_size_scale)
    by_dst: dict[int, list] = {}
    for f in fl:
        # the start of every flow is shifted by 1 s so that the ring is running when flows begin
        by_dst.setdefault(f.dst, []).append(dataclasses.replace(f, start_s=f.start_s + 1.0))
    servers = []
    for d in by_dst:
        ready = wd / f"fsrv{d}.ready"
        servers.append(tb.start_py(d, "netapprox.experiments.flows", ["server", f"{tb.ip(d)}:5800", "--duration",
                                                                      str(duration_s + scale.timeout_s + 5), "--ready-file", str(ready)],
                                   f"{name}-fsrv{d}"))
        tb.wait_file(ready)
    procs = [tb.start_py(r, "netapprox.experiments.ddnn", ["worker", "--rank", str(r), "--peers", peers, "--model-bytes",
                                                           str(model_bytes), "--compute-s", str(compute_s), "--duration",
                                                           str(duration_s + 1.0), "--json", str(wd / f"w{r}.json")], f"{name}-w{r}")
             for r in range(workers)]
    clients = []
    for d, flows in by_dst.items():
        sched = wd / f"flows{d}.json"
        sched.write_text(json.dumps([dataclasses.asdict(f) for f in flows]))
        clients.append((tb.start_py(src, "netapprox.experiments.flows", ["client", f"{tb.ip(d)}:5800", "--schedule", str(sched),
                                                                         "--timeout", str(scale.timeout_s), "--json", str(wd / f"fcli{d}.json")],
                                    f"{name}-fcli{d}"), wd / f"fcli{d}.json"))
    tb.wait_all(procs, duration_s + scale.timeout_s)
    tb.wait_all([c for c, _ in clients], scale.timeout_s + duration_s)
    for s_ in servers:
        tb.stop(s_)
    iters = []
    for r in range(workers):
        w = read_json(wd / f"w{r}.json") or {}
        iters += [it["iteration_s"] for it in w.get("iterations", [])[1:]]  # the first one warms up
    flows = [f for _, path in clients for f in (read_json(path) or {}).get("flows", [])]
    m = {"iteration_mean_s": float(np.mean(iters)) if iters else None, "iterations": len(iters),
         "network_time_s": ddnn.network_time_s(model_bytes, workers, rate), **M.flow_fct_stats(flows)}
    return m, {"iterations": iters, "flows": flows}
