"""A stand-in back end for the sweep runner's tests (tests/experiments/test_sweep_cluster.py): what a back end
offers the experiment layer (experiments/figures.py), without a network or a simulator.

Its trial sleeps ``delay_s`` and derives every number from the plan, so a trial gives the same record wherever
it runs. Every trial it starts leaves a file in ``runs`` named after the trial and the process that ran it,
and another when it finishes, so a test counts trials across worker processes and finds the one running now.
"""
from __future__ import annotations

import dataclasses
import os
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

from netapprox.experiments.plans import TrialPlan


@dataclasses.dataclass(frozen=True)
class FakeScale:
    rate_bps: float = 1e9
    fbkv_n: int = 20


class FakeBackend:
    name = "fake"
    protocols = ("atp", "tcp-es", "broken")
    baselines = ("tcp-es", "tcp-ss")
    time_unit = ("s", 1.0)
    rate_unit = "mbps"
    where = ""
    cluster = True
    deterministic = True

    def __init__(self, runs: Path, delay_s: float = 0.0, scale: FakeScale = FakeScale()) -> None:
        self.runs = Path(runs)
        self.delay_s = delay_s
        self.scale = scale

    @property
    def hosts(self) -> list[int]:
        return list(range(4))

    def identity(self) -> dict:
        return {"name": self.name, "scale": dataclasses.asdict(self.scale)}

    def describe(self, protocols: Sequence[str] = ()) -> dict:
        return {"scale": dataclasses.asdict(self.scale)}

    def result_dir(self, out: Path, name: str) -> tuple[str, Path]:
        return name, out / name

    def group_of(self, plan: TrialPlan) -> tuple:
        return ()

    def check(self, plan: TrialPlan) -> None:
        if plan.protocol not in self.protocols:
            raise ValueError(f"protocol {plan.protocol!r}: choose one of {', '.join(self.protocols)}")

    def prepare(self) -> None:
        self.runs.mkdir(parents=True, exist_ok=True)
        (self.runs / f"prepared-{os.getpid()}").touch()

    def run_trial(self, plan: TrialPlan, workdir: Path | None = None) -> dict:
        self.runs.mkdir(parents=True, exist_ok=True)
        tag = f"{plan.name}@{os.getpid()}@{uuid.uuid4().hex[:8]}"
        (self.runs / f"start-{tag}").touch()
        time.sleep(self.delay_s)
        if plan.protocol == "broken":
            raise RuntimeError(f"the fake back end cannot run {plan.label}")
        jobs = []
        for j in plan.jobs:
            jct = (j.workload.total_bytes * 8 / self.scale.rate_bps) * (1.0 + j.src / 10) * (2.0 if plan.protocol != "atp" else j.msr)
            jobs.append({"job_id": j.job_id, "src": j.src, "dst": j.dst, "msr": j.msr, "n": j.workload.n,
                         "jct_s": jct, "msr_met": True, "msg_loss": round(1 - j.msr, 6) if plan.protocol == "atp" else 0.0,
                         "pkt_loss": 0.01 * plan.seed, "bound_s": jct / 2, "jct_over_bound": 2.0})
        (self.runs / f"done-{tag}").touch()
        return {"protocol": plan.protocol, "seed": plan.seed, "jobs": jobs}

    def close(self) -> None:
        pass

    def __enter__(self) -> "FakeBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def started(runs: Path) -> list[str]:
    """Trials started so far, one entry per start (a trial started twice appears twice)."""
    return sorted(p.name.split("@")[0][len("start-"):] for p in Path(runs).glob("start-*"))


def running(runs: Path) -> list[tuple[str, int]]:
    """(trial, process id) of the trials started and not finished."""
    done = {p.name[len("done-"):] for p in Path(runs).glob("done-*")}
    out = []
    for p in Path(runs).glob("start-*"):
        tag = p.name[len("start-"):]
        if tag not in done:
            name, pid, _ = tag.split("@")
            out.append((name, int(pid)))
    return out
