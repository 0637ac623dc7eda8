"""README's results table, generated: ``docs/bench-headline.json`` and the section "What the numbers say".

``make bench`` writes ``results/bench.json`` (gitignored). Its ``headline`` object (``bench.HEADLINE_KEYS``; others
add keys) is what README quotes, so it is kept in a committed file, ``docs/bench-headline.json``: per key its
value, its bar (``bench.HEADLINE_BARS``, e.g. ``<= 0.5`` or ``median < 10``), what it measures
(``bench.HEADLINE_ABOUT``) and the run that measured it (commit, date, minutes, seeds). ``merge`` adds a run's
measured keys to it and keeps the other keys with the run that measured them (a run of some ``--sections`` keeps
the rest). ``readme_section`` renders the table from it (every key with a value, in the file's order, each
with its bar and whether this value meets it) and ``update_readme`` puts that in README; a test checks that README
holds exactly that and that the file equals the headline docs/results.md shows for the same run. Nothing here
is typed by hand: the numbers come from bench.json.
"""
from __future__ import annotations

import json
import operator
import re
from pathlib import Path
from typing import Any, Iterator, Mapping

SECTION = "## What the numbers say"
INTRO = ("Every number below is a ratio (or rate) `make bench` measured side by side in one run, copied from "
         "`docs/bench-headline.json` by `python -m netapprox.experiments.report --readme README.md`; a ratio of ATP's "
         "time to another's favours ATP below 1. How each is made, every other result and their history: "
         "[docs/results.md](docs/results.md).")
MAX_ROWS = 20
"""Table rows at most (README's section stays within 25 lines): beyond them, the keys without a bar, then the
last ones, are listed on one line after the table."""
_BAR = re.compile(r"^\s*(?:(?P<leaf>[\w.]+)\s+)?(?P<op><=|>=|==|<|>)\s*(?P<limit>[-+0-9.eE]+)\s*$")
_OPS = {"<=": operator.le, ">=": operator.ge, "==": operator.eq, "<": operator.lt, ">": operator.gt}
_SHOWN_OP = {"<=": "≤", ">=": "≥", "==": "=", "<": "<", ">": ">"}


def leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], float]]:
    """(path, number) of every number in a headline value (a number, or nested objects of numbers)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from leaves(v, path + (str(k),))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path, float(value)


def bar_met(value: Any, bar: str | None) -> bool | None:
    """Whether every number of ``value`` (or of its leaves named ``leaf`` in a bar ``"leaf op limit"``) meets
    ``bar``; a bar of several such parts separated by commas (``"median < 10, p99 < 20"``) is met when every part
    is. None without a bar, a readable bar or a number to check."""
    met = [_part_met(value, part) for part in (bar or "").split(",")]
    return None if None in met else all(met)


def _part_met(value: Any, bar: str) -> bool | None:
    m = _BAR.match(bar)
    if m is None:
        return None
    op, limit, leaf = _OPS[m["op"]], float(m["limit"]), m["leaf"]
    checked = [v for path, v in leaves(value) if leaf is None or (path and path[-1] == leaf)]
    return None if not checked else all(op(v, limit) for v in checked)


def fmt_number(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.2f}" if abs(v) >= 0.1 else f"{v:.3f}"


def fmt_value(value: Any) -> str:
    items = list(leaves(value))
    if len(items) == 1 and not items[0][0]:
        return fmt_number(items[0][1])
    return ", ".join(f"{'/'.join(path)}: {fmt_number(v)}" for path, v in items)


def fmt_bar(bar: str | None) -> str:
    m = _BAR.match(bar or "")
    if m is None:
        return bar or "–"
    return f"{m['leaf'] + ' ' if m['leaf'] else ''}{_SHOWN_OP[m['op']]} {_limit(float(m['limit']))}"


def _limit(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:g}"


def run_of(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What the headline file keeps of a bench run's ``meta``."""
    return {"commit": (meta.get("git_commit") or "?")[:7], "finished_utc": meta.get("finished_utc"),
            "minutes": None if meta.get("duration_s") is None else round(meta["duration_s"] / 60, 1),
            "seeds": meta.get("seeds"), "sections": meta.get("sections")}


def merge(doc: Mapping[str, Any] | None, headline: Mapping[str, Any], meta: Mapping[str, Any],
          bars: Mapping[str, str] | None = None, about: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The headline file ``doc`` with a bench run's measured keys (value not null) replaced by this run's, bars
    and descriptions refreshed; keys the run did not measure keep their value and their run."""
    doc = {"runs": dict((doc or {}).get("runs", {})), "headline": dict((doc or {}).get("headline", {}))}
    run = run_of(meta)
    rid = run["commit"] + ("" if not run["finished_utc"] else f" {str(run['finished_utc'])[:10]}")
    measured = {k: v for k, v in headline.items() if v is not None and list(leaves(v))}
    if measured:
        doc["runs"][rid] = run
    for key, value in measured.items():
        doc["headline"][key] = {"value": value, "run": rid}
    for key, entry in doc["headline"].items():
        entry["bar"] = (bars or {}).get(key, entry.get("bar"))
        entry["what"] = (about or {}).get(key, entry.get("what"))
    used = {e["run"] for e in doc["headline"].values()}
    doc["runs"] = {r: v for r, v in doc["runs"].items() if r in used}
    return doc


def write_file(path: Path, doc: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"about": "generated by python -m netapprox.bench --headline-doc (see "
                                         "experiments/headline.py); do not edit", **doc}, indent=1) + "\n")


def readme_section(doc: Mapping[str, Any]) -> list[str]:
    """The lines of README's results section (its heading included): a short intro and one table row per
    headline key with a value."""
    runs = doc.get("runs", {})
    shown = {k: e for k, e in doc.get("headline", {}).items() if list(leaves(e.get("value")))}
    used = sorted({e.get("run", "?") for e in shown.values()})

    def when(rid: str) -> str:
        run = runs.get(rid, {})
        return rid + (f", {run['minutes']:g} min" if run.get("minutes") is not None else "")

    one = len(used) == 1
    intro = INTRO + (f" Run: commit {when(used[0])}, seeds {runs.get(used[0], {}).get('seeds')}." if one else "")
    lines = [SECTION, "", intro, "", "| headline key: what it measures | value | bar | met |" + ("" if one else " run |"),
             "|---|---|---|---|" + ("" if one else "---|")]
    rows = list(shown)
    if len(rows) > MAX_ROWS:
        barred = [k for k in rows if shown[k].get("bar")]
        rows = (barred if len(barred) <= MAX_ROWS else barred[:MAX_ROWS - 1])
    for key in rows:
        e = shown[key]
        met = bar_met(e["value"], e.get("bar"))
        what = f"`{key}`" + (f": {e['what']}" if e.get("what") else "")
        lines.append(f"| {what} | {fmt_value(e['value'])} | {fmt_bar(e.get('bar'))} | "
                     f"{'–' if met is None else 'yes' if met else '**no**'} |" + ("" if one else f" {when(e['run'])} |"))
    rest = [k for k in shown if k not in rows]
    if rest:
        lines += ["", "Also measured: " + "; ".join(
            f"`{k}` {fmt_value(shown[k]['value'])}" + (f" (bar {fmt_bar(shown[k]['bar'])}: "
                                                       f"{'met' if bar_met(shown[k]['value'], shown[k]['bar']) else 'not met'})"
                                                       if shown[k].get("bar") else "") for k in rest) + "."]
    return lines


def section_of(readme_text: str) -> list[str]:
    """README's results section as it stands (heading to the line before the next ``## `` heading)."""
    lines = readme_text.splitlines()
    start = lines.index(SECTION)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    section = lines[start:end]
    while section and not section[-1].strip():
        section.pop()
    return section


def update_readme(readme: Path, doc: Mapping[str, Any]) -> None:
    """Replace README's results section with ``readme_section(doc)``."""
    text = readme.read_text()
    lines = text.splitlines()
    start = lines.index(SECTION)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    new = lines[:start] + readme_section(doc) + [""] + lines[end:]
    readme.write_text("\n".join(new) + ("\n" if text.endswith("\n") else ""))
