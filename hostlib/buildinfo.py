"""What the native cores were built from: a hash of hostlib/native/'s sources.

setup.py compiles it into the extension (``_native.source_hash``) and hostlib/core.py compares it with the sources
beside the package at import: a C file edited (or a branch checked out) after ``make setup`` leaves an extension
that no longer matches them, and running it would measure code that is not the code in front of the reader.
Standard library only: setup.py loads this file before anything is installed.
"""
from __future__ import annotations

import hashlib
from pathlib import Path


def source_hash(native_dir: str | Path) -> str:
    """The first 16 hex digits of SHA-256 over every ``*.c`` and ``*.h`` in ``native_dir`` (name and bytes, in
    name order); ``""`` when there are none (an installed wheel without its sources)."""
    files = sorted(p for p in Path(native_dir).glob("*.[ch]") if p.is_file())
    if not files:
        return ""
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]
