"""One sweep runner for every figure and both back ends: a list of trial plans in, a result file out.

    run_sweep(rf, plans, backend, workdir=rf.out_dir)             # every plan, in this process
    run_sweep(rf, plans, backend, workdir=..., workers=4)         # ns-3 trials in 4 worker processes

Each plan is one trial (``backend.run_trial(plan, workdir)``). Its metrics (``metrics(plan, trial)``, by default
``experiments.metrics.job_summary``) and its record are filed in ``rf`` under the plan's seed and params, in
the order of ``plans`` whatever order trials finish in, and ``rf`` is written after every trial. A trial that
raises is filed as an error with its plan and traceback, and the others go on.

Trials of a back end that keeps state between them (the emulated testbed: one per switch kind) run grouped
(``backend.group_of``), in order of each group's first plan. Back ends whose trials share nothing
(``backend.cluster``: ns-3) may run them in worker processes, each loading the simulator once.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from netapprox.experiments import results as R
from netapprox.experiments.metrics import job_summary
from netapprox.experiments.plans import TrialPlan

Metrics = Callable[[TrialPlan, dict], "dict | None"]
"""(plan, trial record) -> the run's metrics; None: not a run of the result file (the figure used the record
itself, e.g. a timeline)."""


def default_metrics(plan: TrialPlan, trial: dict) -> dict:
    return job_summary(trial)


@dataclasses.dataclass
class Sweep:
    """How a figure's trials run: on ``backend``, in ``workers`` processes when the back end allows it."""

    backend: Any
    workers: int = 1

    def run(self, rf: R.ResultFile, plans: Sequence[TrialPlan], *, metrics: Metrics = default_metrics,
            workdir: Path | None = None) -> None:
        run_sweep(rf, plans, self.backend, workdir=workdir, metrics=metrics, workers=self.workers)


def as_sweep(sweep_or_backend: Any) -> Sweep:
    """A ``Sweep``, or a back end to run everything on in this process."""
    return sweep_or_backend if isinstance(sweep_or_backend, Sweep) else Sweep(sweep_or_backend)


def ordered(plans: Sequence[TrialPlan], backend: Any) -> list[int]:
    """Indices of ``plans`` in the order they run: grouped by ``backend.group_of``, groups in order of their
    first plan, plans within a group in their own order."""
    first: dict[Any, int] = {}
    for i, p in enumerate(plans):
        first.setdefault(backend.group_of(p), i)
    return sorted(range(len(plans)), key=lambda i: (first[backend.group_of(plans[i])], i))


def run_sweep(rf: R.ResultFile, plans: Sequence[TrialPlan], backend: Any, *, workdir: Path | None = None,
              metrics: Metrics = default_metrics, workers: int = 1) -> None:
    """Run every plan on ``backend`` and file it in ``rf`` (see the module docstring)."""
    for p in plans:  # a mistake in a sweep is found before its first trial
        backend.check(p)
    workdir = Path(workdir if workdir is not None else rf.out_dir)
    if not rf.expected:
        rf.progress.total = rf.expected = len(plans)
    position: dict[int, int] = {}

    def on_result(i: int, trial: dict | None, error: str | None) -> None:
        plan = plans[i]
        if error is not None:
            rf.fail(plan.seed, plan.params, error, plan.to_dict())
        else:
            m = metrics(plan, trial)
            if m is None:
                rf.progress.step(plan.label, "done")
            else:
                position[id(rf.add(plan.seed, plan.params, m, dict(trial)))] = i
                rf.runs.sort(key=lambda r: position.get(id(r), -1))
        rf.write()

    order = ordered(plans, backend)
    if workers > 1 and getattr(backend, "cluster", False) and len(plans) > 1:
        rf.progress.note(f"{len(plans)} trials in {workers} worker processes")
        for i, trial, error in _in_processes(plans, order, backend, workdir, workers):
            on_result(i, trial, error)
    else:
        rf.progress.note(f"{len(plans)} trials in this process")
        with backend:
            for i in order:
                trial, error = _run_one(backend, plans[i], workdir)
                on_result(i, trial, error)


def _run_one(backend: Any, plan: TrialPlan, workdir: Path) -> tuple[dict | None, str | None]:
    try:
        return backend.run_trial(plan, workdir), None
    except Exception:  # noqa: BLE001 - one failed trial is filed with its traceback; the sweep goes on
        return None, traceback.format_exc()


_worker_backend: list[Any] = []


def _init_worker(backend: Any) -> None:
    _worker_backend[:] = [backend]


def _worker_run(plan: TrialPlan, workdir: Path) -> tuple[dict | None, str | None]:
    return _run_one(_worker_backend[0], plan, workdir)


def _in_processes(plans: Sequence[TrialPlan], order: Sequence[int], backend: Any, workdir: Path,
                  workers: int) -> Iterator[tuple[int, dict | None, str | None]]:
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                                initargs=(backend,)) as pool:
        futures = {pool.submit(_worker_run, plans[i], workdir): i for i in order}
        for fut in concurrent.futures.as_completed(futures):
            trial, error = fut.result()
            yield futures[fut], trial, error
