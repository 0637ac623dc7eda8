"""The native cores say what they were built from, and a build older than its sources is not used."""
from __future__ import annotations

import shutil
import types
from pathlib import Path

from netapprox.hostlib import buildinfo, core

NATIVE_DIR = Path(core.__file__).parent / "native"


def test_the_build_in_use_matches_the_sources(native):
    """``make setup`` built the extension from the sources in the tree (this fails on a stale build)."""
    from netapprox.hostlib import _native
    assert _native.source_hash == buildinfo.source_hash(NATIVE_DIR) != ""


def test_an_edited_source_makes_the_build_stale(tmp_path):
    copy = tmp_path / "native"
    shutil.copytree(NATIVE_DIR, copy)
    built = types.SimpleNamespace(source_hash=buildinfo.source_hash(copy))
    assert core.stale_native(built, copy) is None
    with open(copy / "sender.c", "a") as f:
        f.write("/* edited after the build */\n")
    why = core.stale_native(built, copy)
    assert why is not None and "run make setup" in why and "\n" not in why
    (copy / "extra.h").write_text("")  # a new file counts too
    assert buildinfo.source_hash(copy) != built.source_hash


def test_nothing_to_compare_is_not_stale(tmp_path):
    """No sources beside the package (an installed wheel) or a build that does not say: nothing to compare."""
    built = types.SimpleNamespace(source_hash="0123456789abcdef")
    assert buildinfo.source_hash(tmp_path) == ""
    assert core.stale_native(built, tmp_path) is None
    assert core.stale_native(types.SimpleNamespace(), NATIVE_DIR) is None
