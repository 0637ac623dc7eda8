"""The sweep runner on Dask (experiments/sweep.py, experiments/cluster.py) and the trial cache
(experiments/cache.py).

A stand-in back end (tests/support/sweep_backend.py) plays ns-3 in the plumbing tests: a Dask LocalCluster of two
worker processes files what the serial sweep files, a worker killed in the middle of a sweep costs nothing but
the time of its trial, and the cache answers a rerun without running a trial. One small real ns-3 sweep (k=4)
gives the same numbers on the cluster as in this process. Timeouts are generous: the machine may be loaded.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from netapprox.experiments import results as R
from netapprox.experiments.cache import TrialCache
from netapprox.experiments.emulated import EmulatedBackend
from netapprox.experiments.jobs import JobWorkload
from netapprox.experiments.plans import JobPlan, TrialPlan
from netapprox.experiments.sweep import Sweep
from support.skips import requires_ns3
from support.sweep_backend import FakeBackend, running, started

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(R, "PROGRESS", lines.append)
    return lines


def _plans(msrs=(0.5, 0.9), protocols=("atp", "tcp-es"), seeds=(1, 2)) -> list[TrialPlan]:
    out = []
    for seed in seeds:
        jobs = {msr: tuple(JobPlan(1 + h, h, (h + 1) % 4, JobWorkload("fixed", seed, (1000 + 100 * h,) * 20,
                                                                       (0.0,) * 20), msr) for h in range(4))
                for msr in msrs}
        out += [TrialPlan({"msr": msr, "protocol": p}, seed, p, jobs[msr]) for msr in msrs for p in protocols]
    return out


def _sweep(tmp_path, name: str, sweep: Sweep, plans) -> dict:
    rf = R.ResultFile(name, {}, [1, 2], tmp_path / name)
    sweep.run(rf, plans)
    return json.loads((tmp_path / name / "result.json").read_text())


def _runs(result: dict) -> list:
    return [(r["seed"], r["params"], r["metrics"]) for r in result["runs"]]


def test_a_sweep_on_a_local_cluster_files_what_the_serial_sweep_files(tmp_path, quiet):
    plans = _plans()
    serial = _sweep(tmp_path, "serial", Sweep(FakeBackend(tmp_path / "runs-serial")), plans)
    with Sweep(FakeBackend(tmp_path / "runs-cluster", delay_s=0.3), workers=2) as sweep:
        clustered = _sweep(tmp_path, "cluster", sweep, plans)
    assert len(serial["runs"]) == len(plans) and "errors" not in clustered
    assert _runs(clustered) == _runs(serial)  # per-trial metrics, and in the plan's order
    workers = {p.name.split("-", 1)[1] for p in (tmp_path / "runs-cluster").glob("prepared-*")}
    assert len(workers) == 2 and os.getpid() not in map(int, workers), "two worker processes ran the trials"
    assert any("LocalCluster of 2 worker processes" in line for line in quiet)
    assert any(line.startswith(f"[{len(plans)}/{len(plans)} done, 0 running, 0 waiting") for line in quiet)


def test_a_sweep_survives_a_killed_worker(tmp_path):
    plans = _plans(seeds=(1, 2, 3))
    runs = tmp_path / "runs"
    killed: list[tuple[str, int]] = []

    def kill_one_running_trial() -> None:
        end = time.monotonic() + 300
        while time.monotonic() < end and not killed:
            now = running(runs)
            if now:
                name, pid = now[0]
                os.kill(pid, signal.SIGKILL)  # a worker process this test's cluster started
                killed.append((name, pid))
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one_running_trial, daemon=True)
    with Sweep(FakeBackend(runs, delay_s=1.5), workers=2) as sweep:
        killer.start()
        result = _sweep(tmp_path, "killed", sweep, plans)
    killer.join(5)
    assert killed, "no trial was running to kill"
    assert "errors" not in result
    filed = [(r["seed"], json.dumps(r["params"], sort_keys=True)) for r in result["runs"]]
    assert len(filed) == len(plans) == len(set(filed)), "every trial once"
    assert started(runs).count(killed[0][0]) >= 2, "the killed trial ran again on a live worker"
    assert _runs(result) == _runs(_sweep(tmp_path, "serial", Sweep(FakeBackend(tmp_path / "serial")), plans))


def test_the_cache_answers_a_rerun_and_reruns_only_the_trials_a_change_touches(tmp_path):
    runs, cache = tmp_path / "runs", TrialCache(tmp_path / "cache")
    first = _sweep(tmp_path, "first", Sweep(FakeBackend(runs), cache=cache), _plans())
    assert len(started(runs)) == 8
    again = _sweep(tmp_path, "again", Sweep(FakeBackend(runs), cache=cache), _plans())
    assert len(started(runs)) == 8, "a rerun ran no trial: the cache answered every one"
    assert _runs(again) == _runs(first)
    changed = _sweep(tmp_path, "changed", Sweep(FakeBackend(runs), cache=cache), _plans(msrs=(0.5, 0.7)))
    after = started(runs)
    assert len(after) == 12 and sum("-0.7-" in s for s in after) == 4, "only the MSR 0.7 trials ran"
    assert [r for r in _runs(changed) if r[1]["msr"] == 0.5] == [r for r in _runs(first) if r[1]["msr"] == 0.5]


def test_the_cache_key_holds_the_plan_the_seed_the_scale_and_the_code(tmp_path):
    from netapprox.experiments import cache as C
    from support.sweep_backend import FakeScale

    store, plan = TrialCache(tmp_path), _plans()[0]
    base = FakeBackend(tmp_path)
    key = store.key(base, plan)
    assert store.key(FakeBackend(tmp_path / "elsewhere", delay_s=5), plan) == key  # nothing that changes results
    assert store.key(base, _plans(seeds=(3,))[0]) != key
    assert store.key(FakeBackend(tmp_path, scale=FakeScale(rate_bps=2e9)), plan) != key
    assert store.key(base, TrialPlan(plan.params, plan.seed, plan.protocol, plan.jobs[:-1])) != key
    assert len(C.code_version()) == 16


def test_a_trial_that_raises_is_filed_with_its_plan_and_the_sweep_goes_on(tmp_path):
    plans = _plans(protocols=("atp", "broken"))
    with Sweep(FakeBackend(tmp_path / "runs"), workers=2) as sweep:
        result = _sweep(tmp_path, "broken", sweep, plans)
    assert len(result["runs"]) == 4 and all(r["params"]["protocol"] == "atp" for r in result["runs"])
    assert len(result["errors"]) == 4
    error = result["errors"][0]
    assert "RuntimeError: the fake back end cannot run" in error["error"] and "Traceback" in error["error"]
    assert error["plan"]["protocol"] == "broken" and error["plan"]["jobs"]


def test_the_emulated_back_end_refuses_a_cluster():
    with pytest.raises(ValueError, match="runs its trials here, one at a time"):
        Sweep(EmulatedBackend(), workers=2)
    with pytest.raises(ValueError, match="no --workers or --scheduler"):
        Sweep(EmulatedBackend(), scheduler="tcp://127.0.0.1:8786")


@requires_ns3
def test_dask_alltoall_k4_gives_the_numbers_of_the_local_path(tmp_path):
    from netapprox.experiments.figures import EXPERIMENTS
    from netapprox.experiments.sim.backend import SimBackend, SimScale
    from netapprox.experiments.sim.topology import TopologyConfig

    backend = SimBackend(SimScale(TopologyConfig(k=4), fbkv_n=100))
    kw = {"msrs": (0.5,), "workloads": ("fbkv",), "protocols": ("atp", "dctcp-es")}
    local = EXPERIMENTS["alltoall"]([1], tmp_path / "local", Sweep(backend), **kw)
    with Sweep(backend, workers=2) as sweep:
        clustered = EXPERIMENTS["alltoall"]([1], tmp_path / "cluster", sweep, **kw)
    timing = ("wall_s", "cpu_s", "sim_packets_per_wall_s")

    def numbers(rf):
        return [(r["seed"], r["params"], {k: v for k, v in r["metrics"].items() if k not in timing}) for r in rf.runs]

    assert len(local.runs) == 3 and not clustered.errors  # two protocols and their per-seed ratio
    assert numbers(clustered) == numbers(local)
    assert [r["raw"]["jobs"] for r in clustered.runs[:2]] == [r["raw"]["jobs"] for r in local.runs[:2]]
