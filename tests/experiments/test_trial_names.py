"""A trial's working files are named by what tells it apart: two transports of one figure never share them
(a trial whose summary was not written must not read another transport's)."""
from netapprox.experiments.jobs import JobWorkload
from netapprox.experiments.plans import JobPlan, TrialPlan

JOBS = (JobPlan(1, 0, 1, JobWorkload("fixed", 1, (1000,) * 5, (0.0,) * 5), 0.5),)


def test_transports_with_the_same_parameters_get_their_own_names():
    es, ss = (TrialPlan({"figure": "fig15", "e_max": 0.05}, 1, p, JOBS) for p in ("tcp-es", "tcp-ss"))
    assert es.name != ss.name
    assert es.name == "s1-fig15-0.05-tcp-es"


def test_a_protocol_among_the_parameters_is_not_repeated():
    assert TrialPlan({"protocol": "atp"}, 2, "atp", JOBS).name == "s2-atp"
