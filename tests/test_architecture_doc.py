"""docs/architecture.md is true to the tree: every path it names exists, and every code folder is named."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path, PurePath

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
CODE = ("hostlib", "controller", "topo", "experiments", "bench", "ml", "analytics", "tools", "ptf", "p4src", "tests")
FILE_SUFFIXES = (".py", ".c", ".h", ".p4", ".md", ".toml", ".lua", ".proto", ".json", ".txtpb", ".yaml", ".yml",
                 ".sh", ".cff")
NOT_PATHS = ("http", "python", "make", "-", "netapprox.", "results/", "build/", ".venv", "../")


def tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, timeout=30)
    except OSError:
        out = None
    if out is None or out.returncode != 0 or not out.stdout.strip():
        pytest.skip("needs a git checkout (the tracked files are the tree the document describes)")
    return out.stdout.split()


def named_paths(text: str) -> list[str]:
    """Backticked tokens that look like paths: with a slash, or a file name with a known suffix."""
    out = []
    for token in re.findall(r"`([^`\s]+)`", text):
        t = token.rstrip(",.;:)").lstrip("(")
        if t.startswith(NOT_PATHS) or any(c in t for c in "*<>{}"):
            continue
        if "/" in t or t.endswith(FILE_SUFFIXES):
            out.append(t)
    return out


def test_every_path_the_document_names_exists():
    files = tracked()
    names = {PurePath(f).name for f in files}
    dirs = {"/".join(PurePath(f).parts[:i]) for f in files for i in range(1, len(PurePath(f).parts))}
    missing = []
    for t in named_paths(DOC.read_text()):
        p = t.rstrip("/")
        if "/" not in p:
            ok = p in names or p in dirs
        else:  # a path from the top, or inside a folder the sentence is about
            ok = p in dirs or p in files or any(f.endswith("/" + p) for f in files) or \
                any(d.endswith("/" + p) for d in dirs)
        if not ok:
            missing.append(t)
    assert not missing, f"docs/architecture.md names paths that do not exist: {sorted(set(missing))}"


def test_every_code_folder_is_named():
    """Every folder with tracked files up to two levels deep (``controller/kernel``, ``tools/wireshark``, ...)."""
    files = tracked()
    text = DOC.read_text()
    folders = {"/".join(PurePath(f).parts[:i]) for f in files if PurePath(f).parts[0] in CODE
               for i in (1, 2) if len(PurePath(f).parts) > i}
    folders -= {f for f in folders if f.startswith("tests/") and f != "tests/support"}  # tests/<area> mirror the code
    unnamed = sorted(f for f in folders if f"`{f}" not in text and f"{f}/" not in text)
    assert not unnamed, f"docs/architecture.md does not name: {unnamed}"


def test_the_path_scan_finds_paths():
    assert named_paths("`hostlib/wire.py`, `wire.c`, `python -m x`, `<name>.py`, `AtpSender`") == \
        ["hostlib/wire.py", "wire.c"]
