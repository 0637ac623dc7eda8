"""Command line: ``python -m netapprox.analytics [options]``: one approximate aggregate over ATP, its answer and its
error.

The rows are NYC TLC trip records read from ``--data`` (parquet files, real or written by
``netapprox.analytics.tlc``), TLC-format trips generated in memory (``--tlc-rows``), or by default generated rows
(``netapprox.analytics.synthetic``: trip distances whose record size grows with the distance, zones, two groups);
all fixed by ``--seed``. They are sent as one ATP job over a simulated lossy link in virtual time
(``netapprox.analytics.link``: the sans-I/O cores, no sockets, no root). The MSR starts at the paper's heuristic
for the tightest bound and follows the running estimate until every bound holds; ``--msr`` fixes it instead.
Exit status: 0 every bound met, 1 a bound not met, 2 bad input (one line on stderr).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Sequence

from netapprox.analytics import link
from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.job import AGGREGATES, AnalyticsJob, Query, Result
from netapprox.analytics.synthetic import correlated_rows
from netapprox.hostlib.config import AtpConfig, ConfigError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m netapprox.analytics", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Approximate analytics over ATP: state the largest relative error you accept (e_max at a "
                    "confidence), get the answer and its error bound. Runs one job over a simulated lossy link "
                    "in virtual time on generated rows (docs/analytics.md).")
    p.add_argument("--aggregate", choices=AGGREGATES, default="avg", help="what to compute over the rows' values")
    p.add_argument("--e-max", type=float, default=0.05, help="largest relative error accepted, in (0, 1)")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence level of the bound, in (0, 1)")
    p.add_argument("--per-group", action="store_true", help="the bound holds within every group too")
    p.add_argument("--k", type=int, default=15, help="rank: how many keys (top-k by count)")
    p.add_argument("--above", type=float, default=5.0, help="count: count the rows whose value is above this")
    p.add_argument("--data", nargs="+", metavar="PATH", default=None,
                   help="NYC TLC yellow-taxi trip parquet files: value trip_distance, key PULocationID, group the "
                        "pickup hour (default: generated rows)")
    p.add_argument("--tlc-rows", type=int, default=None,
                   help="generate this many TLC-format trips (netapprox.analytics.tlc) instead of --rows rows")
    p.add_argument("--group-by", choices=("hour", "none"), default="hour",
                   help="TLC data: the group of a trip")
    p.add_argument("--rows", type=int, default=10000, help="rows generated (without --data or --tlc-rows)")
    p.add_argument("--groups", type=int, default=2, help="groups the rows fall in")
    p.add_argument("--seed", type=int, default=0, help="seed of the rows, the message order and the link")
    p.add_argument("--msr", type=float, default=None,
                   help="fixed MSR for every stratum (default: start at the paper's heuristic, 1 - e_max, and follow "
                        "the running estimate until every bound holds)")
    p.add_argument("--loss", type=float, default=0.05, help="random loss rate of the simulated link, in [0, 1)")
    p.add_argument("--rate", type=float, default=100e6, help="bottleneck rate of the simulated link, bit/s")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def _table(result: Result) -> str:
    lines = [f"{'aggregate':<20} {'group':>5} {'estimate':>14} {'+-':>12} {'error':>8} {'e_max':>6}  met"]
    for a in result.answers:
        g = "all" if a.group is None else str(a.group)
        if a.estimate is None:
            lines.append(f"{a.query.name:<20} {g:>5} {'-':>14} {'-':>12} {'-':>8} {a.e_max:>6.3f}  no ({a.note})")
        elif a.query.aggregate == "rank":
            keys = ", ".join(f"{k}:{e.value:.0f}+-{e.half_width:.0f}" for k, e in a.estimate.top)
            lines.append(f"{a.query.name:<20} {g:>5} {keys}  error {a.error:.4f} e_max {a.e_max:.3f}  "
                         f"{'yes' if a.met else 'no'}")
        else:
            e = a.estimate
            lines.append(f"{a.query.name:<20} {g:>5} {e.value:>14.4f} {e.half_width:>12.4f} {a.error:>8.4f} "
                         f"{a.e_max:>6.3f}  {'yes' if a.met else 'no'}")
    jct = "-" if result.jct_s is None else f"{result.jct_s:.3f} s"
    lines.append(f"rows arrived {result.received} of {result.total}; JCT {jct} (virtual time)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.rows < 1 or args.groups < 1:
            raise AnalyticsError(f"--rows {args.rows} and --groups {args.groups}: must be >= 1")
        if args.msr is not None and not 0.0 < args.msr <= 1.0:
            raise AnalyticsError(f"--msr {args.msr}: must be in (0, 1]")
        if not (0.0 <= args.loss < 1.0) or not (math.isfinite(args.rate) and args.rate > 0):
            raise AnalyticsError(f"--loss {args.loss} must be in [0, 1) and --rate {args.rate} above 0")
        query = Query(args.aggregate, args.e_max, args.confidence, per_group=args.per_group, k=args.k,
                      above=args.above if args.aggregate == "count" else None)
        if args.data is not None:
            from netapprox.analytics import tlc
            rows = tlc.read_rows(args.data, group_by=args.group_by)
        elif args.tlc_rows is not None:
            from netapprox.analytics import tlc
            if args.tlc_rows < 1:
                raise AnalyticsError(f"--tlc-rows {args.tlc_rows}: must be >= 1")
            rows = tlc.read_table_rows(tlc.generate(args.tlc_rows, seed=args.seed), group_by=args.group_by)
        else:
            rows = correlated_rows(args.rows, seed=args.seed, groups=args.groups)
        job = AnalyticsJob(rows, [query], seed=args.seed)
        result = job.run(msr=args.msr, adapt=args.msr is None,
                         config=AtpConfig(max_rate_bps=args.rate, surplus=False),
                         forward=link.LossyPath(loss=args.loss, rate_bps=args.rate, seed=args.seed),
                         reverse=link.LossyPath(seed=args.seed + 1))
    except (AnalyticsError, ConfigError, link.TransferTimeout) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result.as_dict(), indent=2) if args.json else _table(result))
    return 0 if result.all_met else 1


if __name__ == "__main__":
    sys.exit(main())
