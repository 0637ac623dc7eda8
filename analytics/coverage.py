"""How often the reported bounds cover the truth: seeded ATP jobs over the simulated lossy link, each estimator's
answers compared with the exact ones (docs/analytics.md, Unbiased samples; tests/analytics/test_analytics_coverage.py).

    python -m netapprox.analytics.coverage --runs 200            # fixed MSR 0.3
    python -m netapprox.analytics.coverage --runs 200 --adapt    # the MSR follows the estimate, stops when met
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from typing import Callable, Sequence

from netapprox.analytics import link
from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.job import AnalyticsJob, Query
from netapprox.analytics.synthetic import correlated_rows
from netapprox.hostlib.config import AtpConfig

QUERIES = (Query("avg", 0.05, per_group=True), Query("sum", 0.05), Query("count", 0.1, above=4.0),
           Query("rank", 0.2, k=3))
CONFIG = AtpConfig(packet_size=256, surplus=False)
"""256-byte packets make the generated rows 1 to 5 packets long; no surplus, so the MSR decides what arrives."""


@dataclasses.dataclass(frozen=True)
class Coverage:
    covered: dict[tuple[str, int | None], float]
    """(aggregate, group) -> fraction of the runs whose bound covered the exact answer."""
    arrived: tuple[int, ...]
    """Rows that arrived, per run."""
    all_met: int
    """Runs in which every bound was met."""

    def as_dict(self) -> dict:
        return {"covered": {f"{a}/{'all' if g is None else g}": v for (a, g), v in self.covered.items()},
                "arrived": {"min": min(self.arrived), "mean": statistics.mean(self.arrived),
                            "max": max(self.arrived)}, "runs": len(self.arrived), "all_met": self.all_met}


def _stream(seed: int, k: int) -> int:
    """The seed of stream ``k`` of run ``seed``: distinct, independent streams per run (SplitMix-style mix)."""
    x = (seed * 0x9E3779B97F4A7C15 + (k + 1) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 31
    return (x * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF) >> 16


def measure(runs: int, *, rows: int = 1000, msr: float | None = 0.3, adapt: bool = False, loss: float = 0.1,
            rate_bps: float = 50e6, config: AtpConfig = CONFIG,
            config_for: Callable[[AnalyticsJob], AtpConfig] | None = None) -> Coverage:
    """``runs`` jobs (seeds 0 .. runs-1) of ``rows`` generated rows (value and size related) with ``QUERIES``;
    ``config_for(job)`` gives each job's ATP options (default: ``AnalyticsJob.config(config)``, MRDF off). The link:
    random ``loss``, then a ``rate_bps`` bottleneck with a 16-packet tail-drop queue."""
    if runs < 1:
        raise AnalyticsError(f"runs {runs}: must be >= 1")
    covered: dict[tuple[str, int | None], list[bool]] = {}
    arrived, met = [], 0
    for seed in range(runs):
        # the data, the job's order and each direction of the link draw from their own streams: random.Random
        # of one seed gives one stream, and a link that lost the packets whose draws made the rows' values
        # would be a network that reads the data
        data_seed, order_seed, fwd_seed, rev_seed = (_stream(seed, k) for k in range(4))
        job = AnalyticsJob(correlated_rows(rows, seed=data_seed), QUERIES, seed=order_seed,
                           max_payload=config.max_payload)
        spec = job.job_spec(msr)
        live = job.live_msr(spec) if adapt else None
        t = link.run(spec, config_for(job) if config_for else job.config(config),
                     forward=link.LossyPath(loss=loss, rate_bps=rate_bps, seed=fwd_seed),
                     reverse=link.LossyPath(seed=rev_seed), on_step=live.step if live is not None else None)
        if t.failure is not None:
            raise AnalyticsError(f"run {seed}: the job failed: {t.failure}")
        result = live.result(t.received) if live is not None else job.estimate(t.received)
        arrived.append(len(t.received))
        met += result.all_met
        for a in result.answers:
            ok = a.estimate is not None and a.estimate.covers(job.truth(a.query, a.group))
            covered.setdefault((a.query.aggregate, a.group), []).append(ok)
    return Coverage({k: sum(v) / len(v) for k, v in covered.items()}, tuple(arrived), met)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netapprox.analytics.coverage",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                description="Coverage of the reported 95 %% bounds over seeded ATP jobs on a lossy "
                                            "link, rows whose size grows with their value.")
    p.add_argument("--runs", type=int, default=200, help="jobs, seeds 0 .. runs-1")
    p.add_argument("--rows", type=int, default=1000, help="rows per job")
    p.add_argument("--msr", type=float, default=0.3, help="fixed MSR (without --adapt)")
    p.add_argument("--adapt", action="store_true",
                   help="start at the paper's heuristic and follow the estimate, ending once every bound holds")
    p.add_argument("--loss", type=float, default=0.1, help="random loss of the link")
    p.add_argument("--mrdf", action="store_true", help="send in MRDF order (biased: the check should fail)")
    args = p.parse_args(argv)
    try:
        cov = measure(args.runs, rows=args.rows, msr=None if args.adapt else args.msr, adapt=args.adapt,
                      loss=args.loss,
                      config_for=(lambda job: dataclasses.replace(CONFIG, mrdf=True)) if args.mrdf else None)
    except AnalyticsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(cov.as_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
