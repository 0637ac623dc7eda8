"""The streaming port on Flink (PyFlink's DataStream API): a source over ATP for the window computation.

:func:`window_averages` runs a Flink job whose source operator receives ATP jobs on ``bind`` (one job per window
of the stream, :mod:`netapprox.analytics.stream`) and emits every row that arrived with its window, the stratum
(ATP group) it was sent in and that stratum's size at the sender; Flink keys the rows by (window, stratum) and sums
each cell's count, sum and sum of squares; the window's average and its bound are the stratified estimate over its
cells (docs/analytics.md, Streaming). PyFlink runs the source's Python code in its own Python worker: it must
import ``netapprox`` (:func:`environment` points it at this interpreter).

Needs ``apache-flink`` (the ``flink`` extra) and a JVM (``tools/setup-system.sh``); importing this module without
them raises ImportError.
"""
from __future__ import annotations

import math
import sys
from typing import Sequence

from pyflink.common import Types
from pyflink.datastream import RuntimeExecutionMode, StreamExecutionEnvironment
from pyflink.datastream.functions import FlatMapFunction

from netapprox.analytics.errors import AnalyticsError
from netapprox.analytics.estimators import Estimate, z_of

CELL = Types.TUPLE([Types.INT(), Types.INT(), Types.LONG(), Types.LONG(), Types.DOUBLE(), Types.DOUBLE()])
"""(window, stratum, population, rows, sum, sum of squares): one (window, stratum) cell's partial aggregate."""


class AtpWindows(FlatMapFunction):
    """The ATP source: for each address it is given, receive ``windows`` ATP jobs there (all within ``timeout``
    seconds) and emit a cell per row that arrived; windows that never arrive are one :class:`AnalyticsError`."""

    def __init__(self, windows: int, timeout: float) -> None:
        self.windows, self.timeout = windows, timeout

    def flat_map(self, bind: str):
        import queue
        import threading

        from netapprox.analytics.job import AnalyticsJob, Row
        from netapprox.hostlib.api import ReceiverEndpoint
        from netapprox.hostlib.errors import ReceiveTimeout
        done: "queue.Queue[object]" = queue.Queue()
        arrived: dict[int, list[tuple[int, bytes]]] = {}

        def on_job(r) -> None:
            sizes = {g.group_id: g.total for g in r.groups}
            done.put([(r.job_id, stratum, sizes[stratum], Row.decode(data).value)
                      for stratum, data in arrived.pop(r.job_id, [])])

        def serve() -> None:  # the receiver keeps serving while Flink consumes the windows already in
            try:
                with ReceiverEndpoint(bind, config=AnalyticsJob.config(), accept_jobs=self.windows) as ep:
                    ep.serve(jobs=self.windows, timeout=self.timeout, on_job=on_job, on_message=lambda ev: arrived
                             .setdefault(ev.job_id, []).append((ev.group_id, ev.data)))
            except ReceiveTimeout:
                done.put(AnalyticsError(f"netapprox source {bind}: no ATP job arrived within {self.timeout:g} s"))
            except Exception as err:  # noqa: BLE001 - raised in the Flink task below
                done.put(err)

        threading.Thread(target=serve, daemon=True).start()
        for _ in range(self.windows):
            cells = done.get()
            if isinstance(cells, Exception):
                raise cells
            for w, stratum, pop, v in cells:
                yield (w, stratum, pop, 1, v, v * v)


def environment():
    """A local Flink environment in batch execution (the source is bounded: a given number of windows) whose
    Python workers run this interpreter."""
    env = StreamExecutionEnvironment.get_execution_environment()
    env.set_runtime_mode(RuntimeExecutionMode.BATCH)
    env.set_parallelism(1)
    env.set_python_executable(sys.executable)
    return env


def _add(a, b):
    return (a[0], a[1], a[2], a[3] + b[3], a[4] + b[4], a[5] + b[5])


def window_cells(env, bind: str, windows: int, *, timeout: float = 30.0) -> list[tuple]:
    """Run the Flink job: ``windows`` ATP jobs received on ``bind``, reduced to their (window, stratum) cells."""
    src = env.from_collection([bind], type_info=Types.STRING())
    cells = (src.flat_map(AtpWindows(windows, timeout), output_type=CELL)
             .key_by(lambda c: (c[0], c[1]), key_type=Types.TUPLE([Types.INT(), Types.INT()]))
             .reduce(_add))
    with cells.execute_and_collect() as it:
        return [tuple(c) for c in it]


def window_average(cells: Sequence[tuple], confidence: float = 0.95) -> dict[int, Estimate]:
    """Per window, the stratified average and its bound from its cells (``Stratum``'s estimator, from moments)."""
    by_window: dict[int, list[tuple]] = {}
    for c in cells:
        by_window.setdefault(c[0], []).append(c)
    z = z_of(confidence)
    out = {}
    for w, cs in sorted(by_window.items()):
        big_n = sum(c[2] for c in cs)
        mean = var = 0.0
        for _, _, pop, n, s, s2 in cs:
            m = s / n
            if n < pop and n < 2:
                raise AnalyticsError(f"window {w}: a stratum of {pop} rows has {n} in the sample; a bound needs 2")
            v = 0.0 if n == pop else (1 - n / pop) * max(0.0, (s2 - n * m * m) / (n - 1)) / n
            mean += pop / big_n * m
            var += (pop / big_n) ** 2 * v
        out[w] = Estimate("avg", mean, z * math.sqrt(var), confidence, sum(c[3] for c in cs), big_n)
    return out


def run_stream(rows_per_window: int = 1000, windows: int = 3, e_max: float = 0.1, *, seed: int = 5,
               timeout: float = 120.0) -> dict:
    """A stream of ``windows`` count windows of correlated rows (``correlated_rows``), each sent over ATP
    (loopback) at the MSR planned from the windows before it (:func:`netapprox.analytics.stream.send_windows`), and
    averaged by a local Flink job whose source is :class:`AtpWindows`: per window, Flink's estimate and the
    sender's view."""
    import socket
    import threading

    from netapprox.analytics import stream
    from netapprox.analytics.job import Query
    from netapprox.analytics.synthetic import correlated_rows
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        dest = f"127.0.0.1:{s.getsockname()[1]}"
    rows = correlated_rows(rows_per_window * windows, seed=seed)
    sent: dict = {}

    def send() -> None:
        try:
            sent["answers"] = stream.send_windows(dest, stream.count_windows(rows, rows_per_window),
                                                  Query("avg", e_max), sizer=stream.WindowSizer("count",
                                                                                                rows_per_window),
                                                  seed=seed, wait_s=timeout)
        except Exception as err:  # noqa: BLE001 - reported in the result
            sent["error"] = f"{type(err).__name__}: {err}"

    t = threading.Thread(target=send, daemon=True)
    t.start()
    est = window_average(window_cells(environment(), dest, windows, timeout=timeout))
    t.join(timeout)
    truth = [math.fsum(r.value for r in rows[k * rows_per_window:(k + 1) * rows_per_window]) / rows_per_window
             for k in range(windows)]
    return {"error": sent.get("error"), "windows": [
        {"window": w, "flink": est[w].as_dict() if w in est else None, "truth": truth[w - 1],
         "sender": a.as_dict()} for w, a in zip(range(1, windows + 1), sent.get("answers", []))]}


def _no_source(timeout: float) -> str | None:
    """The error line of a Flink job whose ATP source gets no job within ``timeout`` (``None``: it did not fail)."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        bind = f"127.0.0.1:{s.getsockname()[1]}"
    try:
        window_cells(environment(), bind, 1, timeout=timeout)
    except Exception as err:  # noqa: BLE001 - Flink wraps the source's AnalyticsError in its own exceptions
        return next((line.strip() for line in str(err).splitlines() if "AnalyticsError" in line), str(err)[-300:])
    return None


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import json
    p = argparse.ArgumentParser(prog="python -m netapprox.analytics.flink",
                                description="Window averages of a stream sent over ATP, computed by Flink.")
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--rows", type=int, default=1000, help="rows per (count) window")
    p.add_argument("--e-max", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--no-source-check", type=float, default=None, metavar="S",
                   help="then run a Flink job whose source never gets a job, with this timeout, and report its error")
    args = p.parse_args(argv)
    try:
        res = run_stream(args.rows, args.windows, args.e_max, seed=args.seed, timeout=args.timeout)
    except AnalyticsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.no_source_check is not None:
        res["no_source"] = _no_source(args.no_source_check)
    print(json.dumps(res, indent=1, default=str))
    return 1 if res["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
