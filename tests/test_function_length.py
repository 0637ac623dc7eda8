"""No function in the package over 100 lines without a one-line reason: a comment ``over 100 lines: <why>`` in
the comment block right above it (C, C++ headers) or right above or below its ``def`` line (Python)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ("hostlib", "controller", "topo", "experiments", "bench", "ml", "analytics", "tools", "ptf")
LIMIT = 100
REASON = re.compile(r"over 100 lines: \S")
C_SUFFIXES = (".c", ".h")
C_START = re.compile(r"^(\s*)(?!(?:if|for|while|switch|else|do|return|catch|case|static_assert)\b)"
                     r"(?:[\w:<>~\*&,]+[ \t\*&]+)*(~?[\w:]+)\s*\([^;]*$")
KEYWORDS = ("if", "for", "while", "switch", "else", "do", "return", "catch", "sizeof", "typedef", "struct", "enum",
            "#", "class", "namespace", "union")


def package_files(suffixes: tuple[str, ...]) -> list[Path]:
    return sorted(p for top in PACKAGE for p in (ROOT / top).rglob("*") if p.suffix in suffixes and p.is_file())


def python_long(path: Path) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every function in ``path`` over LIMIT lines without a reason."""
    text = path.read_text()
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        n = node.end_lineno - first + 1
        near = lines[max(0, first - 4):first - 1] + lines[node.lineno:node.lineno + 3]
        if n > LIMIT and not any(REASON.search(line) for line in near):
            out.append((node.name, first, n))
    return out


def c_long(path: Path) -> list[tuple[str, int, int]]:
    """The same for C and C++: a function (or method) starts with its signature and ends at the first ``}`` at the
    signature's indentation."""
    lines = path.read_text().splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = C_START.match(lines[i])
        prev = lines[i - 1].strip() if i else ""
        starts = not prev or prev.endswith((";", "}", "{", "*/", ":")) or prev.startswith(("//", "#", "template"))
        if not m or not starts or lines[i].strip().startswith(KEYWORDS + ("*", "/")) or "=" in lines[i].split("(")[0]:
            i += 1
            continue
        indent = m.group(1)
        j = i
        while j < len(lines) and not lines[j].rstrip().endswith(("{", ";")):
            j += 1
        if j >= len(lines) or lines[j].rstrip().endswith(";") or j - i > 8:
            i += 1
            continue
        end = j + 1
        while end < len(lines) and not (lines[end].startswith(indent + "}") and
                                        not lines[end][len(indent):len(indent) + 1].isspace()):
            end += 1
        n = end - i + 1
        above = []
        k = i - 1
        while k >= 0 and (lines[k].lstrip().startswith(("/*", "*", "//")) or lines[k].rstrip().endswith("*/")):
            above.append(lines[k])
            k -= 1
        if n > LIMIT and not any(REASON.search(line) for line in above):
            out.append((m.group(2), i + 1, n))
        i = j + 1 if n <= LIMIT else end + 1
    return out


def test_the_scanners_find_long_functions(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT + 1))
    py = tmp_path / "m.py"
    py.write_text(f"def long():\n{body}\n\n\n# over 100 lines: a reason\ndef reasoned():\n{body}\n\n\ndef short():\n    pass\n")
    assert [name for name, _, _ in python_long(py)] == ["long"]
    cbody = "\n".join(f"    int x{i} = {i};" for i in range(LIMIT + 1))
    c = tmp_path / "m.c"
    c.write_text(f"static int long_one(int a,\n                    int b) {{\n{cbody}\n}}\n\n"
                 f"/* over 100 lines: a reason */\nint reasoned(void) {{\n{cbody}\n}}\n\nint short_one(void) {{\n}}\n"
                 f"class A {{\n  public:\n    void Method(int x) override {{\n{cbody}\n    }}\n}};\n")
    assert [name for name, _, _ in c_long(c)] == ["long_one", "Method"]


@pytest.mark.parametrize("kind", ["python", "c"])
def test_no_function_over_100_lines_without_a_reason(kind):
    scan, suffixes = (python_long, (".py",)) if kind == "python" else (c_long, C_SUFFIXES)
    found = [f"{p.relative_to(ROOT)}:{line} {name} ({n} lines)"
             for p in package_files(suffixes) for name, line, n in scan(p)]
    assert not found, "functions over 100 lines without an 'over 100 lines: <why>' comment:\n" + "\n".join(found)
