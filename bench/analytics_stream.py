"""Streaming analytics benchmark (``make bench`` section ``analytics-stream``): the paper's Fig. 17 on the emulated
testbed at e_max 5 % (``experiments.stream_eval.fig17``: hourly windows of a generated TLC day, each planned from the
windows before it, ATP-S1 on NetApprox switches and TCP-ES / TCP-SS on FIFO next to web-search flows, side by side
in one run; docs/analytics.md, Fig. 17). Headline key ``analytics_stream_goodput_over_tcp_es``: ATP-S1's goodput
over TCP-ES's (the mean over seeds of the per-seed ratios), per e_max; ``summary`` has the errors it was measured at.
Needs root; about a minute and a half; run it alone (``flock /work/locks/measure.lock`` where that is the rule).
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from netapprox.experiments import stream_eval

E_MAXES = (0.05,)


def run(seeds: Sequence[int] = (1, 2, 3), progress: Callable[[str], None] = print,
        workdir: Path | None = None) -> dict:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-analytics-stream-") as tmp:
        res = stream_eval.fig17(seeds, Path(workdir or tmp), progress, e_maxes=E_MAXES)
    s = res["summary"]
    return {"headline": {"analytics_stream_goodput_over_tcp_es": {e: v["atp_over_tcp_es"] for e, v in s.items()}},
            "summary": s, "rows": res["rows"], "seconds": time.monotonic() - t0, "seeds": list(seeds)}
