"""TLC trip records (netapprox.analytics.tlc): the generator writes the yellow-taxi parquet schema with its real
column names and the documented shapes, fixed by its seed; read_rows reads such files as any TLC file; bad files
get one line."""
from __future__ import annotations

import statistics

import pytest

from netapprox.analytics import AnalyticsError, AnalyticsJob, Query, link, tlc
from netapprox.analytics.__main__ import main
from netapprox.hostlib.config import AtpConfig

pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is the 'analytics' extra, which make setup installs")


@pytest.fixture(scope="module")
def trips(tmp_path_factory):
    return tlc.write(tmp_path_factory.mktemp("tlc") / "yellow_tripdata_2018-01.parquet", 20000, seed=3)


def test_analytics_tlc_schema_and_seed(trips, tmp_path):
    table = pq.read_table(trips)
    assert tuple(table.column_names) == tlc.COLUMNS
    assert str(table.schema.field("tpep_pickup_datetime").type) == "timestamp[us]"
    assert table.num_rows == 20000
    again = tlc.write(tmp_path / "again.parquet", 20000, seed=3)
    assert pq.read_table(again).equals(table)
    assert not pq.read_table(tlc.write(tmp_path / "other.parquet", 20000, seed=4)).equals(table)


def test_analytics_tlc_distributions_have_the_documented_shape(trips):
    t = pq.read_table(trips).to_pydict()
    dist = t["trip_distance"]
    assert 1.4 < statistics.median(dist) < 2.3  # median about 1.7 miles
    assert max(dist) > 15 * statistics.median(dist)  # heavy tail
    assert statistics.mean(dist) > statistics.median(dist)  # right-skewed
    hours = [0] * 24
    for p in t["tpep_pickup_datetime"]:
        hours[p.hour] += 1
    assert hours[18] > 4 * hours[4] and hours[8] > 3 * hours[4]  # evening and morning peaks, night trough
    zones: dict[int, int] = {}
    for z in t["PULocationID"]:
        zones[z] = zones.get(z, 0) + 1
    top = sorted(zones.values(), reverse=True)
    assert top[0] > 10 * top[len(top) // 2]  # a few zones take most pickups
    assert all(1 <= z <= 263 for z in zones)
    assert all(d > p for p, d in zip(t["tpep_pickup_datetime"], t["tpep_dropoff_datetime"]))


def test_analytics_tlc_rows_estimate_the_hourly_average_distance(trips):
    rows = tlc.read_rows([trips])
    assert len(rows) == 20000 and {r.group for r in rows} == set(range(24))
    job = AnalyticsJob(rows, [Query("avg", 0.05)], seed=1)
    r = job.run(adapt=True, config=AtpConfig(surplus=False, max_rate_bps=100e6),
                forward=link.LossyPath(loss=0.05, rate_bps=100e6, seed=1))
    a = r.answer("avg")
    assert a.met and r.received < 0.5 * r.total
    assert abs(a.estimate.value - job.truth(a.query)) <= a.estimate.half_width * 1.5


def test_analytics_tlc_bad_files_are_one_line(tmp_path, capsys):
    with pytest.raises(AnalyticsError, match="no such file"):
        tlc.read_rows([tmp_path / "missing.parquet"])
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(AnalyticsError, match="not a parquet file"):
        tlc.read_rows([tmp_path / "junk.parquet"])
    import pyarrow as pa
    pq.write_table(pa.table({"fare_amount": [1.0]}), tmp_path / "fares.parquet")
    with pytest.raises(AnalyticsError, match="no column tpep_pickup_datetime, trip_distance, PULocationID"):
        tlc.read_rows([tmp_path / "fares.parquet"])
    assert main(["--data", str(tmp_path / "missing.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err


def test_analytics_cli_reads_tlc_data(trips, capsys):
    assert main(["--data", str(trips), "--e-max", "0.05", "--json"]) == 0
    import json
    r = json.loads(capsys.readouterr().out)
    assert r["total"] == 20000 and r["all_met"]
