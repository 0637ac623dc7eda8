"""S2's reduce side without Spark: partial aggregates (moments) give the estimator of the rows themselves, a lost
partial is a smaller sample of its stratum (the bound widens, the estimate stays unbiased), a stratum none of whose
partials arrived is one line, and partials go over ATP (loopback) to the reducer."""
from __future__ import annotations

import math
import random
import statistics

import pytest

from netapprox.analytics import AnalyticsError, estimators
from netapprox.analytics import partials as nspark


def _strata(seed: int, sizes=(400, 250, 60)) -> list[tuple[int, int, list[float]]]:
    rng = random.Random(seed)
    return [(h, n, [rng.lognormvariate(1.0 + h, 0.8) for _ in range(n)]) for h, n in enumerate(sizes)]


def _rows(strata, fraction: float, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for h, n, values in strata:
        for v in rng.sample(values, max(2, int(fraction * n))):
            out.append({"stratum": h, "population": n, "value": v})
    return out


def test_moments_give_the_estimator_of_the_values():
    rows = _rows(_strata(1), 0.3, 2)
    by = {}
    for r in rows:
        by.setdefault(r["stratum"], []).append(r["value"])
    pops = {r["stratum"]: r["population"] for r in rows}
    direct = estimators.avg([estimators.Stratum(pops[h], tuple(v)) for h, v in by.items()])
    cells = nspark.partials(rows)
    got = nspark.combine(cells.items(), "avg")
    assert got.value == pytest.approx(direct.value, rel=1e-12)
    assert got.half_width == pytest.approx(direct.half_width, rel=1e-9)
    assert nspark.combine(cells.items(), "sum").value == pytest.approx(sum(pops.values()) * direct.value, rel=1e-12)


def test_partials_split_over_tasks_add_up_and_a_lost_one_widens_the_bound():
    rows = _rows(_strata(3), 0.4, 4)
    random.Random(5).shuffle(rows)  # the map tasks' shares: random (repartition)
    tasks = [rows[i::4] for i in range(4)]
    parts = [(h, m) for t in tasks for h, m in nspark.partials(t).items()]
    whole = nspark.combine(nspark.partials(rows).items(), "avg")
    split = nspark.combine(parts, "avg")
    assert split.value == pytest.approx(whole.value, rel=1e-12)
    lost = [p for p in parts if not (p[0] == 0 and p is parts[0])]  # one task's partial of stratum 0 lost
    fewer = nspark.combine(lost, "avg")
    assert fewer.sample < whole.sample and fewer.half_width > whole.half_width


def test_losing_partials_at_random_keeps_the_estimate_unbiased_and_covered():
    """200 draws: each task's partial of each stratum lost with probability 0.3; the estimate from what arrived
    covers the true mean at its 95 % about as often as it should, its z-scores centred."""
    strata = _strata(7, sizes=(2000, 1200, 500))
    truth = sum(sum(v) for _, _, v in strata) / sum(n for _, n, _ in strata)
    covered, zs = 0, []
    for run in range(200):
        rows = _rows(strata, 0.2, 100 + run)
        rng = random.Random(10_000 + run)
        rng.shuffle(rows)
        tasks = [rows[i::8] for i in range(8)]
        parts = [(h, m) for t in tasks for h, m in nspark.partials(t).items() if rng.random() > 0.3]
        e = nspark.combine(parts, "avg")
        covered += e.covers(truth)
        zs.append((e.value - truth) / (e.half_width / 1.96))
    assert covered >= 0.93 * 200
    assert abs(statistics.mean(zs)) < 0.2


def test_a_stratum_without_any_partial_is_one_line_and_bad_partials_are_refused():
    rows = _rows(_strata(9), 0.3, 1)
    parts = [(h, m) for h, m in nspark.partials(rows).items() if h != 2]
    e = nspark.combine(parts, "avg")  # two strata: an estimate of their population only, which it says
    assert e.population == 650
    with pytest.raises(AnalyticsError, match="no partial aggregate of stratum 2 arrived"):
        nspark.combine(parts, "avg", strata={0, 1, 2})
    with pytest.raises(AnalyticsError, match="no partial aggregate arrived"):
        nspark.combine([], "avg")
    with pytest.raises(AnalyticsError, match="populations"):
        nspark.combine([(0, estimators.Moments(10, 2, 1.0, 1.0)), (0, estimators.Moments(11, 2, 1.0, 1.0))], "avg")
    with pytest.raises(AnalyticsError, match="36 bytes"):
        nspark.decode_partial(b"x" * 10)
    with pytest.raises(AnalyticsError, match="population of 5"):
        nspark.decode_partial(nspark.PARTIAL.pack(1, 5, 9, 1.0, 1.0))
    with pytest.raises(AnalyticsError, match="not a sample's"):
        nspark.decode_partial(nspark.PARTIAL.pack(1, 5, 2, float("nan"), 1.0))
    assert math.isfinite(e.value)


def test_partials_go_over_atp_to_the_reducer():
    rows = _rows(_strata(11), 0.3, 2)
    cells = nspark.partials(rows)
    with nspark.Reducer() as red:
        for j in (1, 2):
            summary = nspark.send_partials(red.address, cells, job_id=j, seed=3)
            assert summary.msr_met()
        red.wait([1, 2], 10)
        got = [p for j in (1, 2) for p in red.jobs[j]["partials"]]
    assert sorted(got, key=lambda p: p[0]) == sorted(list(cells.items()) * 2, key=lambda p: p[0])


def test_count_over_partials_is_the_count_of_the_rows_and_refuses_partials_of_values():
    """Count's partials (moments of the 0/1 indicator, ``partials(..., predicate=...)``) split over tasks give
    ``estimators.count`` of the rows themselves; partials of the values are refused in one line."""
    rows = _rows(_strata(11), 0.3, 12)
    random.Random(13).shuffle(rows)

    def long_trip(r):
        return r["value"] > 6.0

    by: dict[int, list] = {}
    for r in rows:
        by.setdefault(r["stratum"], []).append(r)
    pops = {r["stratum"]: r["population"] for r in rows}
    direct = estimators.count(estimators.indicator_strata([(pops[h], by[h]) for h in sorted(by)], long_trip))
    parts = [(h, m) for t in (rows[0::3], rows[1::3], rows[2::3])
             for h, m in nspark.partials(t, predicate=long_trip).items()]
    got = nspark.combine(parts, "count")
    assert 0 < direct.value < sum(pops.values())
    assert got.value == pytest.approx(direct.value, rel=1e-12)
    assert got.half_width == pytest.approx(direct.half_width, rel=1e-9) and got.name == "count"
    with pytest.raises(AnalyticsError, match="not of 0/1 indicators"):
        nspark.combine(nspark.partials(rows).items(), "count")
    with pytest.raises(AnalyticsError, match="avg, sum or count"):
        nspark.combine(parts, "median")


def _keyed_rows(seed: int) -> list[dict]:
    """Rows with a key (a pickup zone) whose popularity differs by stratum."""
    rng = random.Random(seed)
    out = []
    for h, n in enumerate((900, 500, 200)):
        weights = [1.0 / (1 + (z + 3 * h) % 12) for z in range(12)]
        keys = rng.choices(range(100, 112), weights, k=n)
        out += [{"stratum": h, "population": n, "key": key} for key in rng.sample(keys, int(0.3 * n))]
    return out


def test_rank_over_partials_is_the_rank_of_the_rows_and_bad_key_counts_are_refused():
    """A Rank's partials (per stratum the task's rows and each key's count, one message) split over tasks give
    ``estimators.rank`` of the rows' keys: the same keys, counts and bounds; a lost one is a smaller sample of its
    stratum; malformed ones are one line."""
    rows = _keyed_rows(21)
    random.Random(22).shuffle(rows)
    by: dict[int, list] = {}
    for r in rows:
        by.setdefault(r["stratum"], []).append(r["key"])
    pops = {r["stratum"]: r["population"] for r in rows}
    direct = estimators.rank([(pops[h], by[h]) for h in sorted(by)], 3)
    tasks = [nspark.key_partials(rows[i::3]) for i in range(3)]
    parts = [(h, *cell) for t in tasks for h, cell in t.items()]
    got = nspark.combine_rank(parts, 3)
    assert got.keys() == direct.keys() and got.separated == direct.separated
    for (_, a), (_, b) in zip(got.top, direct.top):
        assert a.value == pytest.approx(b.value, rel=1e-12) and a.half_width == pytest.approx(b.half_width, rel=1e-9)
    fewer = nspark.combine_rank(parts[1:], 3)
    assert fewer.top[0][1].sample < got.top[0][1].sample
    data = nspark.encode_key_counts(*parts[0])
    assert nspark.decode_key_counts(data) == parts[0]
    with pytest.raises(AnalyticsError, match="not 25"):
        nspark.decode_key_counts(data[:25])
    with pytest.raises(AnalyticsError, match="not a sample's"):
        nspark.decode_key_counts(nspark.encode_key_counts(0, 10, 2, {5: 3}))
    with pytest.raises(AnalyticsError, match="stratum 2 arrived"):
        nspark.combine_rank([p for p in parts if p[0] != 2], 3, strata={0, 1, 2})


def test_rank_partials_go_over_atp_to_the_reducer():
    rows = _keyed_rows(23)
    cells = nspark.key_partials(rows)
    with nspark.Reducer() as red:
        assert nspark.send_key_partials(red.address, cells, job_id=5, seed=1).msr_met()
        red.wait([5], 10)
        got = red.jobs[5]
    assert sorted(got["key_counts"]) == sorted((h, *c) for h, c in cells.items())
    assert got["malformed"] == 0 and got["partials"] == []


def test_s2_queries_it_cannot_answer_are_one_line():
    """``approx_s2``'s checks, without Spark: the aggregate, Count's predicate, Rank's k, and neither given to
    another aggregate."""
    nspark.check_s2_query("avg")
    nspark.check_s2_query("count", predicate=lambda r: True)
    nspark.check_s2_query("rank", k=3)
    for kwargs, message in [(dict(aggregate="median"), "avg, sum, count or rank"),
                            (dict(aggregate="count"), "count needs predicate="),
                            (dict(aggregate="rank"), "rank needs k="),
                            (dict(aggregate="rank", k=0), "rank k=0: an integer >= 1"),
                            (dict(aggregate="rank", k=2.5), "rank k=2.5"),
                            (dict(aggregate="rank", k=True), "rank k=True"),
                            (dict(aggregate="avg", k=3), "k= is rank's"),
                            (dict(aggregate="sum", predicate=lambda r: True), "predicate= is count's")]:
        aggregate = kwargs.pop("aggregate")
        with pytest.raises(AnalyticsError, match=message):
            nspark.check_s2_query(aggregate, **kwargs)


def test_s2_count_and_rank_map_tasks_over_atp_give_the_rows_own_answers():
    """What ``approx_s2`` runs for Count and Rank, without Spark: three map tasks' partials (``map_s2``) over ATP
    (``send_s2``, loopback) to the reducer, whose answer (``reduce_s2``) is the rows' own estimate."""
    rows = [dict(r, value=float(r["key"] % 7)) for r in _keyed_rows(31)]
    random.Random(32).shuffle(rows)
    by: dict[int, list] = {}
    for r in rows:
        by.setdefault(r["stratum"], []).append(r)
    pops = {h: rs[0]["population"] for h, rs in by.items()}
    answers = {}
    with nspark.Reducer() as red:
        for job, aggregate in enumerate(("count", "rank")):
            ids = [10 * job + i + 1 for i in range(3)]
            for i, j in enumerate(ids):
                cells = nspark.map_s2(rows[i::3], aggregate, predicate=lambda r: r["value"] >= 4)
                assert nspark.send_s2(red.address, cells, aggregate, job_id=j, seed=2).msr_met()
            red.wait(ids, 10)
            answers[aggregate] = nspark.reduce_s2([red.jobs[j] for j in ids], aggregate,
                                                  k=3 if aggregate == "rank" else None, strata=set(by))
    direct = estimators.count(estimators.indicator_strata([(pops[h], by[h]) for h in sorted(by)],
                                                          lambda r: r["value"] >= 4))
    assert 0 < direct.value < sum(pops.values())
    assert answers["count"].value == pytest.approx(direct.value, rel=1e-12)
    assert answers["count"].half_width == pytest.approx(direct.half_width, rel=1e-9)
    ranked = estimators.rank([(pops[h], [r["key"] for r in by[h]]) for h in sorted(by)], 3)
    assert answers["rank"].keys() == ranked.keys()
    for (_, a), (_, b) in zip(answers["rank"].top, ranked.top):
        assert a.value == pytest.approx(b.value, rel=1e-12) and a.half_width == pytest.approx(b.half_width, rel=1e-9)
