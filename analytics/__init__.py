"""Approximate analytics on ATP: a job states the largest relative error it accepts (``e_max`` at a confidence
level) per aggregate and per group; the estimators (Avg, Sum, Count, a top-k Rank) report each answer with its
error bound, from a stratified sample that ATP delivers (docs/analytics.md).

Layering: this package imports ``netapprox.hostlib`` only.
"""
from netapprox.analytics.accuracy import initial_msr, needed_fraction
from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.estimators import Estimate, RankEstimate, Stratum, avg, count, rank, total
from netapprox.analytics.job import AGGREGATES, AnalyticsJob, Answer, Query, Result, Row
from netapprox.analytics.synthetic import correlated_rows

__all__ = ["AGGREGATES", "AnalyticsError", "AnalyticsJob", "Answer", "Estimate", "Query", "RankEstimate", "Result",
           "Row", "Stratum", "avg", "correlated_rows", "count", "initial_msr", "needed_fraction", "rank", "total"]
