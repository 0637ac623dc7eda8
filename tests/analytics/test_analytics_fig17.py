"""Fig. 17's parts that need no testbed (experiments/stream_eval.py): the registry, the generated stream's windows,
and the goodput summary."""
from __future__ import annotations

import pytest

from netapprox.analytics import stream


def test_fig17_is_registered_and_its_stream_is_in_pickup_order():
    from netapprox.experiments import analytics_eval, stream_eval
    assert analytics_eval.FIGURES["fig17"] is stream_eval.fig17
    assert analytics_eval.FIGURES["fig17-fifo"] is stream_eval.fig17_fifo
    rows, times = stream_eval.stream_of(1, trips=2000)
    assert len(rows) == len(times) == 2000 and times == sorted(times) and 0 <= times[0] and times[-1] < 86400
    windows = stream.time_windows(rows, times, stream_eval.WINDOW_S, start=0.0)
    assert len(windows) == 24
    assert len(windows[4].rows) < len(windows[18].rows)  # the generated day's night trough and evening peak


def test_fig17_summary_is_goodput_of_the_same_seed():
    from netapprox.experiments import stream_eval as S
    rows = []
    for seed, jct in ((1, {"atp-s1": 1.0, "tcp-es": 2.0, "tcp-ss": 4.0}), (2, {"atp-s1": 3.0, "tcp-es": 3.0,
                                                                                "tcp-ss": 3.0})):
        for p in S.PROTOCOLS:
            for w in range(2):
                rows.append({"seed": seed, "e_max": 0.05, "protocol": p, "window": w, "rows": 100, "msr": 0.5,
                             "jct_s": jct[p] / 2, "measured_error": 0.01 * (w + 1) * (4 if p == "tcp-es" else 1)})
    s = S.summarize(rows)["0.05"]
    assert s["goodput_rows_s"]["atp-s1"] == pytest.approx((200 / 1.0 + 200 / 3.0) / 2)
    assert s["atp_over_tcp_es_per_seed"] == [2.0, 1.0] and s["atp_over_tcp_es"] == pytest.approx(1.5)
    assert s["atp_over_tcp_ss_per_seed"] == [4.0, 1.0]
    assert s["atp_over"] == {"tcp-es": pytest.approx(1.5), "tcp-ss": pytest.approx(2.5)}
    assert s["error_max"]["tcp-es"] == pytest.approx(0.08) and s["within_e_max"]["tcp-es"] == pytest.approx(0.5)


def test_fig17_summary_of_the_strict_priority_bound():
    """ATP's windows at their strict-priority bounds as a goodput, over TCP-ES's of the same seed; ATP's goodput over
    it. A seed with a window without its bound has none."""
    from netapprox.experiments import stream_eval as S
    rows = [{"seed": 1, "e_max": 0.05, "protocol": "atp-s1", "window": w, "rows": 100, "msr": 0.5, "jct_s": 0.5,
             "bound_s": 0.4} for w in range(2)]
    rows += [{"seed": 1, "e_max": 0.05, "protocol": "tcp-es", "window": w, "rows": 100, "msr": 0.5, "jct_s": 0.2}
             for w in range(2)]
    rows += [{"seed": 2, "e_max": 0.05, "protocol": p, "window": 0, "rows": 100, "msr": 0.5, "jct_s": 1.0}
             for p in ("atp-s1", "tcp-es")]
    s = S.summarize(rows)["0.05"]
    assert s["bound_goodput_over_tcp_es_per_seed"] == pytest.approx([0.5])
    assert s["atp_over_bound_goodput"] == pytest.approx(0.8)
