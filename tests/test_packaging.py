"""The distribution installs one import name, ``netapprox``: every package folder is mapped under it, and no
module imports a top-level folder by its bare name (which would only work from a source checkout)."""
from __future__ import annotations

import ast
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

ARCHITECTURE = REPO / "docs" / "architecture.md"


def documented_layers() -> dict[str, set[str]]:
    """The table between ``<!-- layers -->`` and ``<!-- /layers -->`` in docs/architecture.md: folder -> the
    folders it may import."""
    text = ARCHITECTURE.read_text()
    table = text[text.index("<!-- layers -->"):text.index("<!-- /layers -->")]
    layers = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            layers[cells[0].strip("`")] = set(re.findall(r"`([\w/]+)`", cells[1]))
    return layers


def netapprox_imports(path: Path) -> set[str]:
    """The top-level folders of ``netapprox`` that ``path`` imports, anywhere in it (``ast``, so text that only
    mentions a module does not count)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "netapprox" and len(parts) > 1:
                out.add(parts[1])
    return out


def test_imports_run_one_way():
    """Each folder imports only the folders its row of docs/architecture.md's layer table allows; the table
    names every package folder, ptf/, tools/ and the test support."""
    layers = documented_layers()
    assert set(FOLDERS) | {"ptf", "tools", "tests/support"} <= set(layers), sorted(layers)
    offenders = []
    for folder, allowed in layers.items():
        own = folder.split("/")[0]
        for path in sorted((REPO / folder).rglob("*.py")):
            for target in netapprox_imports(path) - allowed - {own}:
                offenders.append(f"{path.relative_to(REPO)}: netapprox.{target}")
    assert not offenders, "imports against the layering of docs/architecture.md:\n" + "\n".join(offenders)


def test_the_layer_table_allows_no_cycle():
    layers = documented_layers()

    def reaches(a: str, b: str, seen: frozenset = frozenset()) -> bool:
        return any(x == b or (x not in seen and reaches(x, b, seen | {x})) for x in layers.get(a, ()))
    assert not [f for f in layers if reaches(f, f)]


def test_the_import_scan_sees_imports_and_not_text(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('"""mentions netapprox.bench"""\nimport netapprox.hostlib.wire\n'
                 'def f():\n    from netapprox.controller import model\n')
    assert netapprox_imports(p) == {"hostlib", "controller"}


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
