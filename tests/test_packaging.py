"""The distribution installs one import name, ``netapprox``: every package folder is mapped under it, and no
module imports a top-level folder by its bare name (which would only work from a source checkout)."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("hostlib", "controller", "topo", "experiments", "bench", "ml", "analytics")


def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_installed_under_netapprox():
    st = _setuptools()
    listed = set(st["packages"])
    for folder in FOLDERS:
        assert st["package-dir"][f"netapprox.{folder}"] == folder
        for init in sorted((REPO / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(REPO).parts
            name = ".".join(("netapprox",) + rel)
            assert name in listed, f"{init.parent.relative_to(REPO)} is a package but {name!r} is not in " \
                                   "pyproject.toml [tool.setuptools] packages"


def test_no_bare_top_level_imports():
    bare = re.compile(rf"^\s*(from|import) ({'|'.join(FOLDERS)})(\.|\s|$)", re.M)
    offenders = []
    for folder in FOLDERS + ("tests", "ptf"):
        for path in (REPO / folder).rglob("*.py"):
            for m in bare.finditer(path.read_text()):
                offenders.append(f"{path.relative_to(REPO)}: {m.group(0).strip()}")
    assert not offenders, "import through netapprox.<folder>:\n" + "\n".join(offenders)



def test_no_package_module_edits_sys_path():
    """Installed code imports what it needs through ``netapprox.*``; a module that puts a checkout folder (such
    as tests/) on ``sys.path`` works only from a checkout."""
    edit = re.compile(r"sys\.path\.(insert|append|extend)|sys\.path\s*(\+?=)")
    offenders = [f"{path.relative_to(REPO)}:{text[:m.start()].count(chr(10)) + 1}"
                 for folder in FOLDERS for path in sorted((REPO / folder).rglob("*.py"))
                 for text in [path.read_text()] for m in edit.finditer(text)]
    assert not offenders, "sys.path edited in package code: " + ", ".join(offenders)

LAYERS = {"hostlib": (), "controller": ("hostlib",), "topo": ("hostlib", "controller"),
          "experiments": ("hostlib", "controller", "topo", "bench", "ml", "analytics"),
          "bench": ("hostlib", "controller", "topo", "experiments", "analytics"),
          "ml": ("hostlib",), "analytics": ("hostlib",)}


def test_imports_run_one_way():
    """hostlib <- controller <- topo <- experiments/bench (docs/architecture.md): no module imports a layer
    above its own."""
    ref = re.compile(r"netapprox\.(hostlib|controller|topo|experiments|bench|ml|analytics)\b")
    offenders = []
    for folder, allowed in LAYERS.items():
        for path in (REPO / folder).rglob("*.py"):
            for m in ref.finditer(path.read_text()):
                if m.group(1) != folder and m.group(1) not in allowed:
                    offenders.append(f"{path.relative_to(REPO)}: {m.group(0)}")
    assert not offenders, "imports against the layering:\n" + "\n".join(sorted(set(offenders)))


def test_license_and_citation_match_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    import yaml

    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["license"] == project["license"]
    assert cff["version"] == project["version"]
    titles = [r["title"] for r in cff["references"]]
    assert len(titles) == 4 and all(t.split()[0] in (REPO / "docs" / "citing.md").read_text() for t in titles)
