"""One sweep runner for every figure and both back ends: a list of trial plans in, a result file out.

    Sweep(backend).run(rf, plans)                                  # every trial here, one after another
    Sweep(backend, workers=4).run(rf, plans)                       # on a Dask LocalCluster of 4 processes
    Sweep(backend, scheduler="tcp://10.0.0.1:8786").run(rf, plans) # on a running Dask cluster
    Sweep(backend, cache=TrialCache(Path("results/cache")))        # trials already done are not run again

Each plan is one trial (``backend.run_trial(plan, workdir)`` -> its record). Its metrics (``metrics(plan,
trial)``, by default ``experiments.metrics.job_summary``) and its record are filed in ``rf`` under the plan's
seed and params, in the order of ``plans`` whatever order trials finish in, and ``rf`` is written after every
trial. A trial that raises is filed as an error (``rf.errors``: its plan and traceback) and the others go on.

With a cache (experiments/cache.py), every plan the cache holds is answered from it before anything runs, and
every trial that finishes is stored, so a rerun or a resumed sweep runs only what is missing.

On a cluster (``workers`` > 1 or ``scheduler``; experiments/cluster.py) each trial is one Dask task, results
stream back and are filed as above; a worker that dies mid-trial has its trial rescheduled. Only back ends whose
trials share nothing run there (``backend.cluster``: ns-3); the emulated testbed needs root, namespaces and the
machine's whole timing, so its trials run here, one at a time, grouped by testbed (``backend.group_of``), and a
cluster is refused. A progress line per trial says how many are done, running and left, the time spent and an
estimate of what is left; the first says where the trials run (the Dask dashboard's address when there is one).
A ``Sweep`` keeps its cluster for every figure it runs; ``close()`` (or leaving ``with``) stops it. A run with
fewer trials to compute than ``workers`` (and no ``scheduler``, no cluster started yet) runs them here instead:
starting a LocalCluster costs more than it saves then. ``trials`` counts the trials of the runs so far (from
the cache too), which a figure's result rows (derived per-seed ratios among them) do not.
"""
from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from netapprox.experiments import results as R
from netapprox.experiments.cache import TrialCache
from netapprox.experiments.metrics import job_summary
from netapprox.experiments.plans import TrialPlan

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
"""Dask's own variable for a scheduler's address (the command lines' ``--scheduler`` wins over it)."""
Metrics = Callable[[TrialPlan, dict], "dict | None"]
"""(plan, trial record) -> the run's metrics; None: not a run of the result file (the figure used the record
itself, e.g. a timeline)."""


def default_metrics(plan: TrialPlan, trial: dict) -> dict:
    return job_summary(trial)


class Sweep:
    """How a figure's trials run: on ``backend``, here or on a Dask cluster, with or without a trial cache."""

    def __init__(self, backend: Any, *, workers: int = 1, scheduler: str | None = None,
                 cache: TrialCache | None = None) -> None:
        if (workers > 1 or scheduler) and not backend.cluster:
            raise ValueError(f"the {backend.name} back end runs its trials here, one at a time: they need root, network "
                             "namespaces and this machine's timing (no --workers or --scheduler)")
        self.backend = backend
        self.workers = workers
        self.scheduler = scheduler
        self.cache = cache
        self.trials = 0
        """Trials of the runs so far (computed or from the cache); set it to 0 to count a figure's."""
        self._cluster: Any = None

    @property
    def on_cluster(self) -> bool:
        return bool(self.scheduler) or self.workers > 1

    def cluster(self) -> Any:
        """The Dask cluster, started (or connected to) on first use."""
        if self._cluster is None:
            from netapprox.experiments.cluster import Cluster  # noqa: PLC0415 - Dask is the optional 'cluster' extra

            self._cluster = Cluster(workers=self.workers, address=self.scheduler)
        return self._cluster

    def run(self, rf: R.ResultFile, plans: Sequence[TrialPlan], *, metrics: Metrics = default_metrics,
            workdir: Path | None = None) -> None:
        """Run every plan (see the module docstring) and file it in ``rf``."""
        for p in plans:  # a mistake in a sweep is found before its first trial
            self.backend.check(p)
        workdir = Path(workdir if workdir is not None else rf.out_dir).resolve()
        if not rf.expected:
            rf.progress.total = rf.expected = len(plans)
        self.trials += len(plans)
        tracker = _Tracker(rf, plans, metrics, self.cache, self.backend)
        todo = [i for i in ordered(plans, self.backend) if not tracker.from_cache(i)]
        if not todo:
            return
        small = not self.scheduler and self._cluster is None and len(todo) < self.workers
        if self.on_cluster and not small:
            cluster = self.cluster()
            tracker.note(f"{len(todo)} trials on {cluster.describe()}")
            tracker.running = cluster.running
            for i, trial, error in cluster.run(self.backend, plans, todo, workdir):
                tracker.done(i, trial, error)
        else:
            tracker.note(f"{len(todo)} trials in this process" + (
                f" (fewer than {self.workers} workers: no Dask cluster started)" if self.on_cluster else ""))
            tracker.running = lambda: 1
            with self.backend:
                for i in todo:
                    trial, error = run_here(self.backend, plans[i], workdir)
                    tracker.done(i, trial, error)

    def close(self) -> None:
        if self._cluster is not None:
            cluster, self._cluster = self._cluster, None
            cluster.close()

    def __enter__(self) -> "Sweep":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def as_sweep(sweep_or_backend: Any) -> Sweep:
    """A ``Sweep``, or a back end to run everything on in this process."""
    return sweep_or_backend if isinstance(sweep_or_backend, Sweep) else Sweep(sweep_or_backend)


def run_sweep(rf: R.ResultFile, plans: Sequence[TrialPlan], backend: Any, **kw: Any) -> None:
    """``Sweep(backend, **kw).run(rf, plans)`` for one result file, its cluster (if any) stopped after."""
    metrics = kw.pop("metrics", default_metrics)
    workdir = kw.pop("workdir", None)
    with Sweep(backend, **kw) as sweep:
        sweep.run(rf, plans, metrics=metrics, workdir=workdir)


def ordered(plans: Sequence[TrialPlan], backend: Any) -> list[int]:
    """Indices of ``plans`` in the order they run: grouped by ``backend.group_of``, groups in order of their
    first plan, plans within a group in their own order."""
    first: dict[Any, int] = {}
    for i, p in enumerate(plans):
        first.setdefault(backend.group_of(p), i)
    return sorted(range(len(plans)), key=lambda i: (first[backend.group_of(plans[i])], i))


def run_here(backend: Any, plan: TrialPlan, workdir: Path) -> tuple[dict | None, str | None]:
    """One trial in this process: its record, or its traceback."""
    try:
        return backend.run_trial(plan, workdir), None
    except Exception:  # noqa: BLE001 - one failed trial is filed with its traceback; the sweep goes on
        return None, traceback.format_exc()


class _Tracker:
    """Files finished trials in the result file, in plan order, stores them in the cache, and says how far the
    sweep is."""

    def __init__(self, rf: R.ResultFile, plans: Sequence[TrialPlan], metrics: Metrics, cache: TrialCache | None,
                 backend: Any) -> None:
        self.rf, self.plans, self.metrics, self.cache, self.backend = rf, plans, metrics, cache, backend
        self.position: dict[int, int] = {}
        self.keys: dict[int, str] = {}
        self.finished = self.cached = self.computed = 0
        self.t0 = time.monotonic()
        self.running: Callable[[], int] = lambda: 0

    def from_cache(self, i: int) -> bool:
        """File plan ``i`` from the cache when it holds it."""
        if self.cache is None:
            return False
        self.keys[i] = key = self.cache.key(self.backend, self.plans[i])
        trial = self.cache.get(key)
        if trial is None:
            return False
        self.cached += 1
        self._file(i, trial, None, "from the cache")
        return True

    def done(self, i: int, trial: dict | None, error: str | None) -> None:
        self.computed += 1
        if trial is not None and self.cache is not None:
            self.cache.put(self.keys.get(i) or self.cache.key(self.backend, self.plans[i]), self.plans[i], trial)
        self._file(i, trial, error)

    def _file(self, i: int, trial: dict | None, error: str | None, note: str = "") -> None:
        plan, rf = self.plans[i], self.rf
        self.finished += 1
        if error is not None:
            rf.fail(plan.seed, plan.params, error, plan.to_dict(), progress=False)
            result = "FAILED: " + error.strip().splitlines()[-1]
        else:
            m = self.metrics(plan, trial)
            result = R.brief(m) if m is not None else "done"
            if m is not None:
                self.position[id(rf.add(plan.seed, plan.params, m, dict(trial), progress=False))] = i
                rf.runs.sort(key=lambda r: self.position.get(id(r), -1))
        rf.write()
        self.line(f"{rf.experiment} {plan.label}: {result}" + (f" ({note})" if note else ""))

    def line(self, text: str) -> None:
        total = len(self.plans)
        spent = time.monotonic() - self.t0
        running = self.running() if self.finished < total else 0
        left = total - self.finished
        head = f"[{self.finished}/{total} done, {running} running, {left - running} waiting"
        if self.computed and left:
            head += f"; {_mmss(spent)} spent, ~{_mmss(spent / self.computed * left)} left"
        self.rf.progress.emit(f"{head}] {text}")

    def note(self, text: str) -> None:
        done = f" ({self.cached} from the cache)" if self.cached else ""
        self.rf.progress.emit(f"[{self.finished}/{len(self.plans)} done{done}] {text}")


def _mmss(s: float) -> str:
    return f"{int(s) // 60}m{int(s) % 60:02d}s"
