"""A live MSR change (AtpSender.set_msr, docs/hostlib.md): the job completes with ceil(MSR * N_g) of every group
delivered for the MSR in force when it completes, raised or lowered while it ran; both cores."""
from __future__ import annotations

import pytest

from netapprox.hostlib import core
from netapprox.hostlib.config import AtpConfig, ConfigError, JobSpec, required_messages
from hostlib_sim import Path, run_job

pytestmark = pytest.mark.usefixtures("cores")


def _run(job, changes, config=AtpConfig(surplus=False), **paths):
    holder = []
    steps = [0]

    def make(job, **kw):
        holder.append(core.AtpSender(job, **kw))
        return holder[-1]

    def on_step(now, receiver):
        steps[0] += 1
        while changes and steps[0] >= changes[0][0] and holder[0].state.value == "sending":
            _, gid, msr = changes.pop(0)
            holder[0].set_msr(gid, msr, now)

    run = run_job(job, config, sender_cls=make, on_step=on_step, **paths)
    assert not changes, "the job ended before every change was made"
    return run


def test_raised_msr_is_met_after_losses_the_old_one_allowed():
    job = JobSpec.uniform(31, messages=400, size=300, msr=0.3)
    run = _run(job, [(40, 0, 0.9)], forward=Path(loss=0.3, seed=3))
    g = run.summary.as_dict()["groups"][0]
    assert g["msr"] == 0.9 and g["delivered"] >= required_messages(0.9, 400) == 360


def test_lowered_msr_completes_the_job_early():
    job = JobSpec.uniform(32, messages=2000, size=300, msr=0.95, groups=[(1, 0.95, 1000)])
    run = _run(job, [(3, 0, 0.1), (3, 1, 0.2)], forward=Path(loss=0.05, seed=4, rate_bps=20e6))
    groups = {g["group_id"]: g for g in run.summary.as_dict()["groups"]}
    assert groups[0]["delivered"] >= 100 and groups[1]["delivered"] >= 200
    assert groups[0]["delivered"] < 0.9 * 1000 and groups[1]["delivered"] < 0.9 * 1000


def test_live_msr_change_refuses_what_it_cannot_honour():
    job = JobSpec.uniform(33, messages=20, size=100, msr=0.5, groups=[(1, 1.0, 5)])
    s = core.AtpSender(job, config=AtpConfig(), now=0.0)
    with pytest.raises(ConfigError, match=r"a live change must be in \[0, 1\)"):
        s.set_msr(0, 1.0, 0.0)
    with pytest.raises(ConfigError, match="announced with MSR 1"):
        s.set_msr(1, 0.5, 0.0)
    with pytest.raises(KeyError):
        s.set_msr(7, 0.5, 0.0)
    s.set_msr(0, 0.0, 0.0)  # nothing needed and the announce not yet acknowledged: still sending
    assert s.state.value == "sending" and s.tlr(0) == pytest.approx(1.0)
