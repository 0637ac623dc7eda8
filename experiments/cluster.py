"""Trials on a Dask cluster (PyPI ``distributed``, the ``cluster`` extra), for the sweep runner
(experiments/sweep.py).

    with Cluster(workers=4) as cluster:                       # a LocalCluster of 4 worker processes, here
    with Cluster(address="tcp://10.0.0.1:8786") as cluster:   # a running scheduler (or DASK_SCHEDULER_ADDRESS)
        for i, (trial, error) in cluster.run(backend, plans, workdir): ...

Each trial is one task: ``run_task(backend, plan, workdir)`` on a worker, which returns the trial's record or
its traceback, never raises. A worker process loads what its back end needs once, on its first trial
(``backend.prepare()``: ns-3 and the simulations' C++), and keeps it for every trial after. A worker that dies
in the middle of a trial (killed, out of memory, its machine gone) has the trial rescheduled by Dask on another
worker, up to ``distributed.scheduler.allowed-failures`` times; each plan is one task, so a trial's result
arrives once. Every worker must run the same code as this process: a worker whose ``code_version()`` differs
returns an error for its trials instead of numbers made by other code.
"""
from __future__ import annotations

import logging
import os
import socket
import traceback
import uuid
from pathlib import Path
from typing import Any, Iterator, Sequence

from distributed import Client, LocalCluster, as_completed

from netapprox.experiments.cache import code_version
from netapprox.experiments.plans import TrialPlan

_prepared: set[str] = set()


def run_task(backend: Any, plan: TrialPlan, workdir: Path) -> dict:
    """One trial on a worker: ``{"trial": record}`` or ``{"error": traceback}``, with the worker's code version
    and where it ran."""
    out: dict[str, Any] = {"code": code_version(), "worker": f"{socket.gethostname()}:{os.getpid()}"}
    try:
        if backend.name not in _prepared:
            backend.prepare()
            _prepared.add(backend.name)
        out["trial"] = backend.run_trial(plan, workdir)
    except Exception:  # noqa: BLE001 - the sweep files the trial with its traceback and goes on
        out["error"] = traceback.format_exc()
    return out


class Cluster:
    """A Dask client: to a running scheduler at ``address``, or to a LocalCluster of ``workers`` processes (one
    thread each) started here and stopped by ``close()``."""

    def __init__(self, *, workers: int | None = None, address: str | None = None) -> None:
        self.local: LocalCluster | None = None
        if address:
            self.client = Client(address, timeout="60s")
        else:
            n = workers or os.cpu_count() or 1
            self.local = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                                      silence_logs=logging.ERROR)
            self.client = Client(self.local)
            self.client.wait_for_workers(n, timeout=300)

    def describe(self) -> str:
        """Where the trials run, for the first progress line: workers, scheduler, dashboard."""
        info = self.client.scheduler_info()
        where = (f"a LocalCluster of {len(info['workers'])} worker processes" if self.local is not None
                 else f"the Dask cluster at {self.client.scheduler.address} ({len(info['workers'])} workers)")
        dashboard = self.dashboard()
        return where + (f", dashboard {dashboard}" if dashboard else "")

    def dashboard(self) -> str | None:
        return self.client.dashboard_link if "dashboard" in self.client.scheduler_info().get("services", {}) else None

    def running(self) -> int:
        """Trials workers are running now (a worker may hold more than it runs: one per thread runs)."""
        threads = {addr: w["nthreads"] for addr, w in self.client.scheduler_info()["workers"].items()}
        return sum(min(len(keys), threads.get(addr, 1)) for addr, keys in self.client.processing().items())

    def run(self, backend: Any, plans: Sequence[TrialPlan], order: Sequence[int],
            workdir: Path) -> Iterator[tuple[int, dict | None, str | None]]:
        """Submit every plan (in ``order``) and yield ``(index, record, error)`` as trials finish."""
        here = code_version()
        futures = {self.client.submit(run_task, backend, plans[i], workdir, key=f"trial-{i}-{uuid.uuid4().hex}",
                                      pure=False): i for i in order}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                out = fut.result()
            except Exception as exc:  # noqa: BLE001 - e.g. KilledWorker: the trial's workers kept dying
                yield i, None, f"{type(exc).__name__}: {exc}"
                continue
            if out["code"] != here:
                yield i, None, (f"worker {out['worker']} runs other code (version {out['code']}, here {here}): "
                                "install this NetApprox on every worker")
            elif "error" in out:
                yield i, None, out["error"]
            else:
                yield i, out["trial"], None

    def close(self) -> None:
        self.client.close()
        if self.local is not None:
            self.local.close()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
