"""Rows whose size and value are related, for the tests and the command line's default data: the value (a trip
distance, miles) is log-normal, the row's bytes grow with it (a longer trip carries a longer record: its route),
the key (a zone) is Zipf-distributed, the group alternates. Fixed by the seed."""
from __future__ import annotations

import random

from netapprox.analytics.job import Row


def correlated_rows(n: int, *, seed: int = 0, groups: int = 2, keys: int = 30, bytes_per_unit: float = 30.0,
                    max_extra: int = 900) -> list[Row]:
    """``n`` rows: value ~ LogNormal(1, 0.7), ``bytes_per_unit * value`` extra bytes (at most ``max_extra``), key
    ``k`` with probability proportional to ``1 / (k + 1)``, group ``i % groups``."""
    rng = random.Random(seed)
    weights = [1.0 / (k + 1) for k in range(keys)]
    out = []
    for i in range(n):
        v = rng.lognormvariate(1.0, 0.7)
        key = rng.choices(range(keys), weights)[0]
        out.append(Row(v, key=key, group=i % groups, extra=bytes(min(max_extra, int(bytes_per_unit * v)))))
    return out
