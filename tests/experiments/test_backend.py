"""The experiment back-end contract (experiments/backend.py): both back ends implement it, the registry resolves
them and their command lines, and the figures ask a back end for nothing the protocol does not declare."""
from __future__ import annotations

import ast
from pathlib import Path

from netapprox.experiments import backend as B

FIGURES = Path(B.__file__).with_name("figures.py")


def protocol_members(proto: type) -> set[str]:
    names = set()
    for cls in proto.__mro__:
        if cls is object or cls.__name__ in ("Protocol", "Generic"):
            continue
        names |= set(getattr(cls, "__annotations__", {}))
        names |= {n for n, v in vars(cls).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return names


def test_every_registered_back_end_implements_the_protocol():
    from netapprox.experiments.emulated import EmulatedBackend, Scale
    from netapprox.experiments.sim.backend import SimBackend
    assert set(B.BACKENDS) == {"emulated", "sim"} and B.DEFAULT_BACKEND in B.BACKENDS
    assert B.backend_class("emulated") is EmulatedBackend and B.backend_class("sim") is SimBackend
    for name in B.BACKENDS:
        cls = B.backend_class(name)
        missing = sorted(m for m in protocol_members(B.Backend) if not hasattr(cls, m) and m != "scale")
        assert not missing, (name, missing)
        assert cls.name == name
        assert callable(B.command(name))
    assert isinstance(EmulatedBackend(Scale()), B.TestbedBackend)
    assert {"ddnn_trial", "vector_trial"} <= protocol_members(B.TestbedBackend)


def test_the_figures_use_only_what_the_protocol_declares():
    """Every attribute figures.py reads from a back end (``backend.x``, ``sweep.backend.x``) is a member of
    ``TestbedBackend`` (``Backend`` plus the two trials that are not plans)."""
    tree = ast.parse(FIGURES.read_text())
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if (isinstance(base, ast.Name) and base.id == "backend") or \
                    (isinstance(base, ast.Attribute) and base.attr == "backend"):
                used.add(node.attr)
    assert used, "figures.py reads nothing from a back end: the scan is broken"
    assert used <= protocol_members(B.TestbedBackend), sorted(used - protocol_members(B.TestbedBackend))


def test_the_figures_and_the_sim_back_end_import_no_testbed_or_command_line():
    """figures.py reaches a testbed only through its back end; the ns-3 back end imports no command line."""
    figures = {n.module for n in ast.walk(ast.parse(FIGURES.read_text())) if isinstance(n, ast.ImportFrom)}
    assert not figures & {"netapprox.topo.testbed", "netapprox.experiments.emulated"}, figures
    sim = Path(B.__file__).with_name("sim")
    for path in sim.glob("*.py"):
        mods = {n.module for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)}
        assert not mods & {"netapprox.experiments.cli", "netapprox.experiments.figures",
                           "netapprox.experiments.sim_cli"}, (path.name, mods)
