"""The experiment back-end contract: what a figure (experiments/figures.py) and a sweep (experiments/sweep.py) may
ask of the place its trials run, and the one registry of back ends.

A back end runs trial plans (experiments/plans.py) and says where they ran. Two implement it: the emulated
testbed (``emulated``: kernel or BMv2 switches in network namespaces, experiments/emulated.py) and the ns-3
simulation (``sim``: a data-center fabric, experiments/sim/backend.py). ``python -m netapprox.experiments
<back end> <figure>`` resolves the back end's command through ``BACKENDS`` (the emulated testbed is the default:
``python -m netapprox.experiments <figure>``).

| member | what it is |
|---|---|
| ``name`` | the registry key |
| ``scale`` | sizes and rates: ``rate_bps``, ``job(kind, seed, times)``, ``job_seed``, ``senders_of``, ``flow_size_scale``, ``lead_s``, ``slack_s`` |
| ``protocols``, ``baselines`` | protocols it runs; its TCP EarlySend and SampleSend |
| ``time_unit``, ``rate_unit``, ``where`` | for tables and titles |
| ``hosts``, ``far_hosts()`` | the workload hosts; (sender, background sender, receiver) of a job against background |
| ``identity()``, ``describe(protocols)``, ``result_dir(out, name)`` | the trial cache's key, what a result file records, where it goes |
| ``prepare()``, ``group_of(plan)``, ``check(plan)``, ``run_trial(plan, workdir)``, ``close()`` | running trials |

A testbed back end (``TestbedBackend``) also runs the trials that are not plans: a ring-allreduce DNN next to
flows (``ddnn_trial``) and a gradient vector against background (``vector_trial``).
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from netapprox.experiments.plans import TrialPlan


@runtime_checkable
class Backend(Protocol):
    """Where a figure's trials run (the module docstring lists what each member is)."""

    name: str
    scale: Any
    protocols: Sequence[str]
    baselines: tuple[str, str]
    time_unit: tuple[str, float]
    rate_unit: str

    @property
    def hosts(self) -> list[int]: ...

    @property
    def where(self) -> str: ...

    def far_hosts(self) -> tuple[int, int, int]: ...

    def identity(self) -> dict: ...

    def prepare(self) -> None: ...

    def describe(self, protocols: Sequence[str] = ()) -> dict: ...

    def result_dir(self, out: Path, name: str) -> tuple[str, Path]: ...

    def group_of(self, plan: TrialPlan) -> tuple: ...

    def check(self, plan: TrialPlan) -> None: ...

    def run_trial(self, plan: TrialPlan, workdir: Path) -> dict: ...

    def close(self) -> None: ...


@runtime_checkable
class TestbedBackend(Backend, Protocol):
    """A back end with hosts that run programs: also the trials that are not plans."""

    def ddnn_trial(self, seed: int, *, workers: int, model_bytes: int, compute_s: float, flow_load: float,
                   duration_s: float, class_rules: Sequence[Any], name: str, workdir: Path) -> tuple[dict, dict]: ...

    def vector_trial(self, vec: Any, vec_name: str, bound: float, load: float, *, name: str,
                     workdir: Path) -> tuple[dict, dict]: ...


BACKENDS: Mapping[str, tuple[str, str]] = {
    "emulated": ("netapprox.experiments.emulated:EmulatedBackend", "netapprox.experiments.emulated_cli:main"),
    "sim": ("netapprox.experiments.sim.backend:SimBackend", "netapprox.experiments.sim_cli:main"),
}
"""name -> ("module:class" of the back end, "module:function" of its command line ``main(argv) -> int``).
Imported lazily: the emulated testbed needs no ns-3, the simulation no root."""
DEFAULT_BACKEND = "emulated"


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def backend_class(name: str) -> type:
    """The back-end class registered as ``name``."""
    return _load(BACKENDS[name][0])


def command(name: str) -> Any:
    """The command line (``main(argv) -> int``) of the back end ``name``."""
    return _load(BACKENDS[name][1])
