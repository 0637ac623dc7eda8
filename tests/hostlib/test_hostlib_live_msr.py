"""A live MSR change (AtpSender.set_msr, docs/hostlib.md): the job completes with ceil(MSR * N_g) of every group
delivered for the MSR in force when it completes, raised or lowered while it ran; the change reaches the receiver
as an MSR change control message (docs/wire-format.md), repeated until acknowledged; both cores."""
from __future__ import annotations

import pytest

from netapprox.hostlib import control, core, events, wire
from netapprox.hostlib.config import AtpConfig, ConfigError, JobSpec, required_messages
from hostlib_sim import SENDER_ADDR, Path, admit, run_job

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
    assert g["msr"] == wire.q15_to_tlr(wire.tlr_to_q15(0.9))  # rounded as the wire carries it
    assert g["delivered"] >= required_messages(g["msr"], 400) == 360


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


def test_the_receiver_learns_the_change_even_when_its_packets_are_lost():
    job = JobSpec.uniform(34, messages=600, size=300, msr=0.9, groups=[(1, 0.8, 300)])
    sent = []

    def drop_msr_changes(h, _i):  # the first two MSR change packets are lost: resent until acknowledged
        if h.msg_id == control.MSR_MSG_ID:
            sent.append(h.seq)
            return len(sent) <= 2
        return False

    run = _run(job, [(20, 1, 0.4), (25, 0, 0.3)], forward=Path(loss=0.05, seed=5, drop=drop_msr_changes))
    assert len(sent) >= 3
    result = run.receiver_result()
    got = {g.group_id: g.msr for g in result.groups}
    assert got == {0: wire.q15_to_tlr(wire.tlr_to_q15(0.3)), 1: wire.q15_to_tlr(wire.tlr_to_q15(0.4))}
    assert got == {g["group_id"]: g["msr"] for g in run.summary.as_dict()["groups"]}


def _msr_change(job_id, group_id, change, q, seq):
    return wire.encode(wire.Header(job_id=job_id, msg_id=control.MSR_MSG_ID, group_id=group_id, seq=seq),
                       control.MSR_CHANGE.pack(change, q) if isinstance(q, int) else q)


def test_receiver_applies_newer_changes_and_counts_the_rest():
    r = core.AtpReceiver(config=AtpConfig(), now=0.0)
    admit(r, 40, [(0, 0.5, range(0, 100)), (1, 1.0, range(100, 110))], 110)
    for change, q, group in ((2, 0x2000, 0), (1, 0x6000, 0), (3, 0x1000, 1), (4, 0x1000, 9)):
        r.receive_datagram(_msr_change(40, group, change, q, 500 + change), SENDER_ADDR, 0.1)
    r.receive_datagram(_msr_change(40, 0, 0, 0x1000, 600), SENDER_ADDR, 0.1)  # change 0
    r.receive_datagram(_msr_change(40, 0, 5, wire.TLR_ONE, 601), SENDER_ADDR, 0.1)  # MSR 1
    r.receive_datagram(_msr_change(40, 0, 6, b"\x00\x00\x00\x06\x10", 602), SENDER_ADDR, 0.1)  # 5 bytes
    r.receive_datagram(_msr_change(41, 0, 7, 0x1000, 603), SENDER_ADDR, 0.1)  # no such job
    acks = [wire.decode(d)[0] for d, _ in r.datagrams_to_send(0.1)]
    stats = r.stats()
    assert stats["malformed"]["bad_msr_change"] == 3
    assert stats["dropped"]["msr_exact_group"] == 1 and stats["dropped"]["msr_unknown_group"] == 1
    assert stats["dropped"]["unknown_job"] == 1
    assert all(h.type == wire.PacketType.ACK for h in acks)
    # the FIN's result: change 2 (0.25) applied, the older change 1 acknowledged but not applied
    r.receive_datagram(wire.encode(wire.Header(job_id=40, msg_id=control.FIN_MSG_ID, seq=700)), SENDER_ADDR, 0.2)
    r.datagrams_to_send(0.2)
    finished = []
    while (e := r.next_event()) is not None:
        if isinstance(e, events.JobFinished):
            finished.append(e.result)
    (result,) = finished
    assert {g.group_id: g.msr for g in result.groups} == {0: 0.25, 1: 1.0}
