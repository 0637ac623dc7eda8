"""Analytics benchmark (``make bench`` section ``analytics``): the paper's Fig. 15 on the emulated testbed.

``run(seeds, progress) -> dict``: ``experiments.analytics_eval.fig15`` (the average trip distance of generated TLC
trips within e_max 1 / 2 / 5 / 10 %, next to web-search TCP flows; ATP-S1 and ATP-S1&2 on NetApprox switches,
TCP-ES and TCP-SS on FIFO, side by side in one run; docs/analytics.md, Evaluation). Headline keys, per e_max, for
the bar's transport, ATP-S1&2 (both stages, the input and the map->reduce, over ATP):
``analytics_jct_over_tcp_es`` (its whole job's JCT over TCP-ES's, both stages over TCP, the mean over seeds of the
per-seed ratios) and ``analytics_error_over_emax`` (its largest measured error over the seeds, over e_max). The
summary keeps ATP-S1's first stage against the TCPs' (``atp_over_tcp_es``). Needs root; about three minutes; run it
alone (``flock /work/locks/measure.lock`` where that is the rule).
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from netapprox.experiments import analytics_eval


def run(seeds: Sequence[int] = (1, 2, 3), progress: Callable[[str], None] = print,
        workdir: Path | None = None) -> dict:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-analytics-") as tmp:
        res = analytics_eval.fig15(seeds, Path(workdir or tmp), progress)
    s = res["summary"]
    return {"headline": {"analytics_jct_over_tcp_es": {e: v["atp_s12_over_tcp_es"] for e, v in s.items()},
                         "analytics_error_over_emax": {e: v["error_over_emax"].get("atp-s12")
                                                       for e, v in s.items()}},
            "summary": s, "rows": res["rows"], "seconds": time.monotonic() - t0, "seeds": list(seeds)}
