"""Analytics benchmark with several sources (``make bench`` section ``analytics-sources``): the paper's Fig. 15 input
as the paper runs it, the job's rows split over three sources (§7.2: three Kafka brokers) sending to the worker at
once, on the emulated testbed next to web-search flows (``experiments.analytics_sources``; docs/analytics.md,
Several sources).

``run(seeds, progress) -> dict``: ATP-S1 (every source one live analytics job at its share of the bound, one
estimate over all of them) and ATP-S1&2 (then the worker's partial aggregates to the reducer over ATP, once the last
source ended) against TCP-ES and TCP-SS (every source its own TCP connection, S2 over TCP), side by side in one run,
e_max 1 / 2 / 5 / 10 %. Headline key ``analytics_sources_jct_over_tcp_es``: per e_max, ATP-S1&2's JCT (first
source's start to the last partial at the reducer) over TCP-ES's, the mean over seeds of the per-seed ratios, as
the one-source key; the summary keeps ATP-S1's first stage against the TCPs' (``atp_over_tcp_es``). The one-source
section (``analytics``) and its keys are unchanged. Needs root; about four minutes; run it alone (``flock
/work/locks/measure.lock`` where that is the rule).
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from netapprox.analytics.sources import PAPER_SOURCES
from netapprox.experiments import analytics_sources


def run(seeds: Sequence[int] = (1, 2, 3), progress: Callable[[str], None] = print,
        workdir: Path | None = None, sources: int = PAPER_SOURCES) -> dict:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-analytics-sources-") as tmp:
        res = analytics_sources.fig15_sources(seeds, Path(workdir or tmp), progress, sources)
    s = res["summary"]
    return {"headline": {"analytics_sources_jct_over_tcp_es": {e: v["atp_s12_over_tcp_es"] for e, v in s.items()}},
            "summary": s, "rows": res["rows"], "sources": sources, "hosts": res["hosts"],
            "seconds": time.monotonic() - t0, "seeds": list(seeds)}
