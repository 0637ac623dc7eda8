"""The experiments' ATP host program takes the switch's queue sizes (the emulated rack's are not hostlib's default)."""
from __future__ import annotations

import argparse

import pytest

from netapprox.experiments import atp_job
from netapprox.hostlib.config import AtpConfig, ConfigError, parse_queue_packets


def _args(**kw) -> argparse.Namespace:
    base = {"mode": "adaptive", "no_mrdf": False, "completion": "early", "rate": "20M", "queue_packets": None,
            "report_key_file": None}
    return argparse.Namespace(**{**base, **kw})


def test_the_sender_is_told_the_queue_sizes():
    assert atp_job.build_config(_args(queue_packets="36,7,6,5,4,3,2,1")).queue_packets == (36, 7, 6, 5, 4, 3, 2, 1)
    assert atp_job.build_config(_args()).queue_packets == AtpConfig().queue_packets


@pytest.mark.parametrize("bad", ["1,2", "36,7,6,5,4,3,2,x", "36,7,6,5,4,3,2,-1", ""])
def test_bad_queue_sizes_are_one_line(bad, capsys):
    with pytest.raises(ConfigError, match="queue_packets"):
        parse_queue_packets(bad)
    if bad:
        with pytest.raises(SystemExit):
            atp_job.main(["send", "10.0.0.2:7600", "--job", "none.json", "--job-id", "1", "--msr", "0.5",
                          "--queue-packets", bad])
        err = capsys.readouterr().err.strip().splitlines()
        assert "queue_packets" in err[-1] and "8 comma-separated integers" in err[-1]


@pytest.mark.parametrize(("topology", "spray", "protocol", "told"), [
    ("leafspine", True, "atp", True), ("leafspine", False, "atp-flowhash", False),
    ("leafspine", True, "atp-reorderseen", False), ("rack", True, "atp", False)])
def test_a_testbed_that_sprays_tells_its_senders(tmp_path, topology, spray, protocol, told):
    """The emulated back end passes ``--path-reorders`` to an ATP sender exactly when its fabric sprays (and the
    variant is not the one left untold), and the sender's AtpConfig then says so."""
    from netapprox.experiments.emulated import _TrialRun
    from netapprox.experiments.jobs import JobWorkload
    from netapprox.experiments.plans import JobPlan, TrialPlan
    from netapprox.topo.testbed import TestbedConfig

    cfg = TestbedConfig(**({"topology": "leafspine", "hosts": 4, "leaves": 2, "spines": 2} if topology == "leafspine"
                           else {}), spray=spray)

    class Tb:  # what _TrialRun reads of a testbed before anything starts
        config, controller = cfg, None

        @staticmethod
        def ip(h):
            return f"10.0.0.{h + 1}"

    job = JobPlan(1, 0, 1, JobWorkload("m", 1, (8_000,), (0.0,)), 0.5)
    run = _TrialRun(Tb(), TrialPlan({}, 1, protocol, (job,)), tmp_path, 10.0)
    _module, args, _out = run.sender_args(job)
    assert ("--path-reorders" in args) is told
    assert atp_job.build_config(atp_job.parser().parse_args(args)).path_reorders is told
