"""NYC TLC trip records: the yellow-taxi parquet format, its real column names, read as is (``read_rows``) and
generated with realistic distributions for tests and the evaluation (``generate``), never downloaded.

The generator (fixed by its seed) draws, per trip: the pickup hour from an hourly profile (a night trough at
4-5 am, a morning peak at 8-9, the evening peak at 6-7 pm), the pickup and drop-off zones from a Zipf law over the
263 taxi zones (the busiest Manhattan zones and the airports first, exponent 0.7: the top zone about 7 % of
pickups, the top ten about a quarter), the distance from a log-normal (median about 1.8 miles, mean 2.9, a heavy tail
to 60 miles; airport trips longer), the duration from the distance and the hour's speed, then fare, tip (card
payments), tolls and the surcharges as the TLC's meter computes them. It is a model of the data's shape, not the
data: ``--data PATH`` reads real files (the TLC publishes them monthly:
https://www.nyc.gov/site/tlc/about/tlc-trip-record-data.page).

Needs pyarrow (the ``analytics`` extra; ``make setup`` installs it).
"""
from __future__ import annotations

import datetime as dt
import math
import random
from pathlib import Path
from typing import Sequence

from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.job import Row

COLUMNS = ("VendorID", "tpep_pickup_datetime", "tpep_dropoff_datetime", "passenger_count", "trip_distance",
           "RatecodeID", "store_and_fwd_flag", "PULocationID", "DOLocationID", "payment_type", "fare_amount",
           "extra", "mta_tax", "tip_amount", "tolls_amount", "improvement_surcharge", "total_amount",
           "congestion_surcharge", "Airport_fee")
"""The yellow-taxi trip record columns, in the TLC's order (2023 onwards; earlier files lack ``Airport_fee``)."""
NEEDED = ("tpep_pickup_datetime", "trip_distance", "PULocationID")
"""What ``read_rows`` needs of a file: the value (distance), the key (pickup zone) and the group (pickup hour)."""
ZONES = 263
AIRPORTS = (132, 138)  # JFK, LaGuardia
# the busiest pickup zones first (Upper East Side, Midtown, Penn Station, ...); the rest follow in a seeded order
_POPULAR = (237, 161, 236, 162, 230, 186, 142, 170, 163, 132, 48, 68, 234, 239, 141, 79, 107, 249, 140, 138, 113,
            164, 100, 229, 90, 262, 263, 246, 43, 233)
# relative trips per hour of the day (0 = midnight)
HOURLY = (3.6, 2.6, 1.9, 1.4, 1.0, 1.0, 2.0, 3.5, 4.6, 4.7, 4.5, 4.6, 4.8, 4.8, 5.0, 5.0, 4.9, 5.4, 6.2, 6.3, 5.8,
          5.6, 5.3, 4.5)
# mean speed (mph) per hour: free-flowing at night, slow at midday and in the evening peak
_SPEED = (15.0, 16.0, 17.0, 18.0, 19.0, 18.0, 15.0, 12.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0,
          10.0, 10.0, 11.0, 12.0, 13.0, 14.0, 14.0)


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as err:
        raise AnalyticsError(f"TLC parquet files need pyarrow ({err}): install the 'analytics' extra") from err
    return pa, pq


def _zone_order(rng: random.Random) -> list[int]:
    rest = [z for z in range(1, ZONES + 1) if z not in _POPULAR]
    rng.shuffle(rest)
    return list(_POPULAR) + rest


def generate(n: int, *, seed: int = 0, start: dt.date = dt.date(2018, 1, 1), days: int = 7):
    """A ``pyarrow.Table`` of ``n`` trips in the yellow-taxi schema, pickups over ``days`` days from ``start``."""
    if n < 1 or days < 1:
        raise AnalyticsError(f"generate: rows {n} and days {days} must be >= 1")
    pa, _ = _pyarrow()
    rng = random.Random(seed)
    zones = _zone_order(rng)
    weights = [1.0 / (rank + 1) ** 0.7 for rank in range(ZONES)]
    cols: dict[str, list] = {c: [] for c in COLUMNS}
    t0 = dt.datetime.combine(start, dt.time())
    for _ in range(n):
        day = rng.randrange(days)
        hour = rng.choices(range(24), HOURLY)[0]
        pickup = t0 + dt.timedelta(days=day, hours=hour, seconds=rng.randrange(3600))
        pu, do = rng.choices(zones, weights, k=2)
        airport = pu in AIRPORTS or do in AIRPORTS
        dist = rng.lognormvariate(math.log(1.7), 0.85) + (rng.uniform(8.0, 14.0) if airport else 0.0)
        dist = round(min(60.0, max(0.1, dist)), 2)
        speed = max(4.0, rng.gauss(_SPEED[hour], 2.5))
        minutes = dist / speed * 60.0 + rng.uniform(1.0, 4.0)
        dropoff = pickup + dt.timedelta(seconds=int(minutes * 60))
        ratecode = 2 if airport and pu == 132 else 1
        fare = 52.0 if ratecode == 2 else round(2.5 + 2.5 * dist + 0.5 * minutes / 2, 2)
        extra = 1.0 if hour >= 20 or hour < 6 else (1.0 if 16 <= hour < 20 else 0.0)
        card = rng.random() < 0.68
        tip = round(fare * rng.uniform(0.12, 0.25), 2) if card else 0.0
        tolls = 6.55 if airport and rng.random() < 0.4 else 0.0
        airport_fee = 1.75 if pu in AIRPORTS else 0.0
        congestion = 2.5 if pu not in AIRPORTS else 0.0
        total = round(fare + extra + 0.5 + tip + tolls + 0.3 + congestion + airport_fee, 2)
        for c, v in (("VendorID", rng.choice((1, 2))), ("tpep_pickup_datetime", pickup),
                     ("tpep_dropoff_datetime", dropoff),
                     ("passenger_count", float(rng.choices((1, 2, 3, 4, 5, 6), (70, 14, 4, 2, 6, 4))[0])),
                     ("trip_distance", dist), ("RatecodeID", float(ratecode)),
                     ("store_and_fwd_flag", "Y" if rng.random() < 0.01 else "N"), ("PULocationID", pu),
                     ("DOLocationID", do), ("payment_type", 1 if card else 2), ("fare_amount", fare),
                     ("extra", extra), ("mta_tax", 0.5), ("tip_amount", tip), ("tolls_amount", tolls),
                     ("improvement_surcharge", 0.3), ("total_amount", total), ("congestion_surcharge", congestion),
                     ("Airport_fee", airport_fee)):
            cols[c].append(v)
    types = {"VendorID": pa.int32(), "tpep_pickup_datetime": pa.timestamp("us"),
             "tpep_dropoff_datetime": pa.timestamp("us"), "passenger_count": pa.float64(),
             "trip_distance": pa.float64(), "RatecodeID": pa.float64(), "store_and_fwd_flag": pa.string(),
             "PULocationID": pa.int32(), "DOLocationID": pa.int32(), "payment_type": pa.int64()}
    return pa.table({c: pa.array(cols[c], type=types.get(c, pa.float64())) for c in COLUMNS})


def write(path: str | Path, n: int, *, seed: int = 0, **kw) -> Path:
    """``generate(n, seed=seed, ...)`` written as one parquet file; returns its path."""
    _, pq = _pyarrow()
    path = Path(path)
    pq.write_table(generate(n, seed=seed, **kw), path)
    return path


def read_rows(paths: Sequence[str | Path], *, group_by: str = "hour", limit: int | None = None) -> list[Row]:
    """Rows of TLC parquet files (real or generated): value ``trip_distance``, key ``PULocationID``, group the
    pickup hour (``group_by="hour"``), or none (``"none"``); the row's bytes are the whole record as text (a
    longer trip has more digits: size and value are related, as on the wire). Trips with a distance <= 0 or
    missing fields are skipped, as the TLC's own cleaning does."""
    _, pq = _pyarrow()
    if group_by not in ("hour", "none"):
        raise AnalyticsError(f"group_by {group_by!r}: 'hour' or 'none'")
    rows: list[Row] = []
    for p in paths:
        p = Path(p)
        if not p.is_file():
            raise AnalyticsError(f"--data {p}: no such file")
        try:
            table = pq.read_table(p)
        except Exception as err:  # pyarrow raises several types for a file that is not parquet
            raise AnalyticsError(f"--data {p}: not a parquet file ({type(err).__name__}: {err})") from err
        missing = [c for c in NEEDED if c not in table.column_names]
        if missing:
            raise AnalyticsError(f"--data {p}: no column {', '.join(missing)} (a TLC yellow-taxi trip file has "
                                 f"{', '.join(NEEDED)})")
        rows += read_table_rows(table, group_by=group_by, limit=None if limit is None else limit - len(rows),
                                allow_empty=True)
        if limit is not None and len(rows) >= limit:
            return rows
    if not rows:
        raise AnalyticsError(f"--data: no usable trips in {', '.join(str(p) for p in paths)}")
    return rows


def read_table_rows(table, *, group_by: str = "hour", limit: int | None = None, allow_empty: bool = False
                    ) -> list[Row]:
    """``read_rows`` of a ``pyarrow.Table`` already in memory (``generate``'s)."""
    if group_by not in ("hour", "none"):
        raise AnalyticsError(f"group_by {group_by!r}: 'hour' or 'none'")
    names = table.column_names
    rows: list[Row] = []
    for rec in table.to_pylist():
        d, pu, t = rec["trip_distance"], rec["PULocationID"], rec["tpep_pickup_datetime"]
        if d is None or pu is None or t is None or not d > 0:
            continue
        extra = ",".join("" if rec[c] is None else str(rec[c]) for c in names).encode()
        rows.append(Row(float(d), key=int(pu), group=t.hour if group_by == "hour" else 0, extra=extra))
        if limit is not None and len(rows) >= limit:
            break
    if not rows and not allow_empty:
        raise AnalyticsError("no usable trips in the table")
    return rows

