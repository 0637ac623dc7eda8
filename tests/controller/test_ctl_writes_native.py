"""The write queue's C loops over queue_by_job (controller/p4runtime/_jobwrites.c) against its Python loops: two
drivers given the same epochs, one writing through the C loops and one through the Python ones, send the same
Writes byte for byte and keep the same state (what is installed, waiting, in flight, without room)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netapprox.bench.controller import AcceptingSession, bench_p4info
from netapprox.controller.model import JobRule, SwitchState, TableUpdates
from netapprox.controller.p4runtime import write_queue
from netapprox.controller.p4runtime.driver import P4RuntimeDriver
from netapprox.controller.p4runtime.options import P4RuntimeOptions
from support.skips import need_extension


@pytest.fixture(autouse=True)
def _built():
    need_extension(write_queue.NATIVE, "the write queue's C loops (controller/p4runtime/_jobwrites.c)")


class _Future:
    def __init__(self) -> None:
        self.answered = False

    def done(self) -> bool:
        return self.answered


class HoldingSession(AcceptingSession):
    """Accepts every Write, but answers one only when the test says so (so Writes stay in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[list[bytes]] = []
        self.futures: list[_Future] = []

    def write_future(self, batch):
        self.sent.append(list(batch))
        self.futures.append(_Future())
        return self.futures[-1]

    def answer(self, n: int) -> None:
        for future in self.futures[:n]:
            future.answered = True


def drivers(tmp_path, capacity: int | None, inflight: int, budget: float) -> list[P4RuntimeDriver]:
    bmv2_json = tmp_path / "bmv2.json"
    bmv2_json.write_bytes(b"{}")
    options = P4RuntimeOptions(p4info=bench_p4info(str(tmp_path)), bmv2_json=str(bmv2_json),
                               max_inflight_writes=inflight, max_batch_updates=4, max_updates_per_s=budget)
    out = []
    for native in (True, False):
        driver = P4RuntimeDriver("s1", options, session=HoldingSession())
        driver.connect()
        driver.apply_updates(lambda: SwitchState(), TableUpdates(static=True, jobs={}, urgent=frozenset()))
        driver.writes.native = native
        driver.writes._job_capacity = capacity
        out.append(driver)
    return out


def state(driver: P4RuntimeDriver) -> tuple:
    q = driver.writes
    installed = {job: (rule, entry is None) for job, (rule, entry) in q.classification.job_entries.items()}
    return (driver.session.sent, installed, list(q._dirty), sorted(q._inflight_jobs), q._inflight_inserts,
            list(q._no_room), sorted(q._urgent), q.deferred_updates, q.deferred_urgent, dict(q.write_stats))


epochs = st.lists(st.tuples(st.dictionaries(st.integers(1, 12), st.none() | st.integers(1, 7), max_size=6),
                            st.sets(st.integers(1, 12), max_size=3), st.integers(0, 3), st.integers(0, 8)),
                  min_size=1, max_size=15)


@settings(max_examples=120, deadline=None)
@given(epochs=epochs, capacity=st.sampled_from([None, 3, 6]), inflight=st.sampled_from([1, 2, 8]),
       budget=st.sampled_from([0.0, 1e9]), adopted=st.sets(st.integers(1, 12), max_size=4))
def test_the_c_loops_write_as_the_python_loops(tmp_path_factory, epochs, capacity, inflight, budget, adopted):
    """Random epochs of queue_by_job moves and deletes, losing jobs, Writes answered late (in flight), a table
    that fills up (jobs wait for room), a write budget, and jobs adopted from the switch (kept until their hosts
    report): the same Writes and the same state after each."""
    pair = drivers(tmp_path_factory.mktemp("w"), capacity, inflight, budget)
    if adopted:  # as a controller that found these entries on the switch at its start
        for driver in pair:
            for job in sorted(adopted):
                driver.writes.classification.commit_job(job, JobRule(job, 1), None)  # installed on the switch
            driver.writes._adopted = set(adopted)
            driver.writes._adopted_until = float("inf")  # kept all along (adopt_jobs_s not over)
    for jobs, urgent, answered, tokens in epochs:
        for driver in pair:
            driver.session.answer(answered)
            if budget:
                driver.writes.tokens = tokens
            driver.apply_updates(lambda: pytest.fail("a static write"),
                                 TableUpdates(static=False, jobs=jobs, urgent=frozenset(urgent)))
        assert state(pair[0]) == state(pair[1])
    for driver in pair:
        driver.session.answer(len(driver.session.futures))
        driver.writes.flush()
    assert state(pair[0]) == state(pair[1])
