"""README's results: the section "What the numbers say" is exactly the table experiments/headline.py renders from
the committed docs/bench-headline.json (which ``make bench`` writes), short, and equal to the headline
docs/results.md shows for the same run; no other number in README's prose differs from docs/results.md."""
from __future__ import annotations

import json
import re
from pathlib import Path

from netapprox.experiments import headline as H

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
HEADLINE = json.loads((REPO / "docs" / "bench-headline.json").read_text())
RESULTS = (REPO / "docs" / "results.md").read_text()


def test_readme_results_section_is_the_generated_table():
    assert H.section_of(README) == H.readme_section(HEADLINE), \
        "README's results section is not generated: python -m netapprox.experiments.report --no-doc --readme README.md"


def test_readme_results_section_is_short():
    body = [line for line in H.section_of(README)[1:] if line.strip()]
    assert len(body) <= 25, f"{len(body)} non-empty lines"


def test_headline_file_equals_the_bench_headline_docs_results_shows():
    bench = RESULTS[RESULTS.index("## `make bench`"):]
    commit = re.search(r"commit `?([0-9a-f]{7})", bench).group(1)
    shown = json.loads(re.search(r"```\n(\{.*?\})\n```", bench, re.S).group(1))
    same_run = {k: e for k, e in HEADLINE["headline"].items() if e["run"].split()[0] == commit}
    assert same_run, f"no headline key from the run docs/results.md shows (commit {commit})"
    for key, e in same_run.items():
        assert e["value"] == shown[key], key


def _prose(text: str) -> str:
    """README without code blocks and without the generated section."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    section = "\n".join(H.section_of(text))
    return text.replace(section, "")


def test_no_other_number_in_readme_differs_from_docs_results():
    numbers = set(re.findall(r"(?<![\w.-])\d+\.\d+(?![\w.])", _prose(README)))
    missing = sorted(n for n in numbers if not re.search(rf"(?<![\w.]){re.escape(n)}(?![\d])", RESULTS))
    assert not missing, f"README quotes numbers docs/results.md does not have: {missing}"


def test_a_new_headline_key_appears_with_its_bar_and_a_run_of_some_sections_keeps_the_rest():
    doc = H.merge(HEADLINE, {"atp_jct_under_loss_over_ideal": {"0.1": 1.2}, "atp_over_tcp_es_fifo": None},
                  {"git_commit": "abcdef0123", "finished_utc": "2026-11-29T10:00:00Z", "duration_s": 60},
                  {"atp_jct_under_loss_over_ideal": "<= 1.5"}, {"atp_jct_under_loss_over_ideal": "JCT under loss"})
    assert doc["headline"]["atp_over_tcp_es_fifo"] == HEADLINE["headline"]["atp_over_tcp_es_fifo"]
    row = [line for line in H.readme_section(doc) if "`atp_jct_under_loss_over_ideal`" in line]
    assert row == ["| `atp_jct_under_loss_over_ideal`: JCT under loss | 0.1: 1.20 | ≤ 1.5 | yes | "
                   "abcdef0 2026-11-29, 1 min |"]


def test_bars():
    assert H.bar_met({"0.5": 0.28, "0.9": 0.63}, "<= 0.5") is False
    assert H.bar_met({"median": 9.0, "p99": 14.5}, "median < 10") is True
    assert H.bar_met({"median": 9.0, "p99": 14.5}, "median < 10, p99 < 20") is True
    assert H.bar_met({"median": 9.0, "p99": 22.0}, "median < 10, p99 < 20") is False
    assert H.bar_met({"median": 9.0}, "median < 10, p99 < 20") is None  # a part with nothing to check
    assert H.bar_met(90855, ">= 100000") is False
    assert H.bar_met(0.9, None) is None and H.bar_met({}, "<= 1") is None


def test_many_keys_still_fit_in_25_lines():
    doc = H.merge(HEADLINE, {f"leafspine_{i}": 0.5 + i / 100 for i in range(12)},
                  {"git_commit": "abcdef0123", "finished_utc": "2026-11-29", "duration_s": 60},
                  {f"leafspine_{i}": "<= 1" for i in range(0, 12, 2)})
    lines = H.readme_section(doc)
    assert len([line for line in lines[1:] if line.strip()]) <= 25
    text = "\n".join(lines)
    ratio = HEADLINE["headline"]["atp_over_tcp_ss_fifo"]["value"]["0.5"]  # a key without a bar, below the table
    assert all(f"`leafspine_{i}`" in text for i in range(12)) and f"`atp_over_tcp_ss_fifo` 0.5: {ratio:.2f}" in text
