"""The one error of the analytics layer: a job description or data that cannot give the answer asked for."""
from __future__ import annotations


class AnalyticsError(ValueError):
    """A bound, an estimator or data that cannot work; the message says which one, why, and what would."""
