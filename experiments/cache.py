"""The trial cache: every finished trial stored under a key of what determines it, so that a rerun or a resumed
sweep runs only what is missing (experiments/sweep.py).

    cache = TrialCache(Path("results/cache"))
    key = cache.key(backend, plan)      # sha256 of the back end's identity, the full plan and the code version
    cache.get(key) or cache.put(key, plan, backend.run_trial(plan, workdir))

The key covers the back end (its name and scale: topology, rates, job sizes, buffers, every setting), the plan
(protocol, jobs with their workloads, background, flows, switch, seed) and ``code_version()``: a hash of every
source file of hostlib, controller, topo and experiments, with the versions of numpy and ns-3. Any change to
any of them is a new key, so a stale trial is never answered; an entry is one JSON file, written atomically,
``<root>/<key[:2]>/<key>.json``. Deleting the folder forgets everything.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import netapprox.controller
import netapprox.experiments
import netapprox.hostlib
import netapprox.topo
from netapprox.experiments.plans import TrialPlan
from netapprox.experiments.results import json_default

SOURCE_SUFFIXES = (".py", ".c", ".h")
PACKAGES = (netapprox.hostlib, netapprox.controller, netapprox.topo, netapprox.experiments)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """A hash of the code a trial runs: every source file of the packages it uses, numpy and ns-3's versions,
    and Python's (computed once per process)."""
    h = hashlib.sha256()
    for pkg in PACKAGES:
        root = Path(pkg.__file__).resolve().parent
        for path in sorted(p for p in root.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()):
            h.update(f"{pkg.__name__}/{path.relative_to(root).as_posix()}\0".encode())
            h.update(path.read_bytes())
    for dist in ("numpy", "ns3"):
        h.update(f"{dist}={_version(dist)}\0".encode())
    h.update(platform.python_version().encode())
    return h.hexdigest()[:16]


class TrialCache:
    """Finished trials under ``root`` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def key(self, backend: Any, plan: TrialPlan) -> str:
        ident = {"backend": backend.identity(), "plan": plan.to_dict(), "code": code_version()}
        return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        """The trial record stored under ``key``; None when there is none (or it cannot be read)."""
        try:
            return json.loads(self._path(key).read_text())["trial"]
        except (OSError, ValueError, KeyError):
            return None

    def put(self, key: str, plan: TrialPlan, trial: dict) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"key": key, "code": code_version(), "label": plan.label, "protocol": plan.protocol, "trial": trial}
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, default=json_default)
        os.replace(tmp, path)
