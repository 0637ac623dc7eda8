"""netapprox.ml without PyTorch: group policies, gloo's ring layout, vector jobs, the multi-job ATP exchange."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from netapprox.hostlib import wire
from netapprox.hostlib.config import ConfigError
from netapprox.hostlib.exchange import AtpExchange, ReceivedJob
from netapprox.ml.layout import chunk_bounds, reduction_order
from netapprox.ml.policy import GroupPolicy, paper_policy, parse_policy, single_msr, smallest
from netapprox.ml.vectors import received_vector, vector_job

FPP = wire.floats_per_packet(1400 - wire.HEADER_LEN)


def test_paper_policy_bands_by_segment_maximum():
    p = paper_policy()
    assert p.group_msr() == {1: 0.0, 2: 0.125, 3: 0.925}
    v = np.zeros(4 * 10, dtype=np.float32)
    v[0:10] = 0.0005            # all small -> group 1
    v[10:20] = 0.0005
    v[15] = -0.002              # one middle value makes the segment middle -> group 2
    v[20:30] = 0.003            # above the upper threshold -> group 3
    v[30:35] = np.nan           # NaN is never "small"
    assert p.classify(v, 10).tolist() == [1, 2, 3, 3]
    assert p.classify(v[:35], 10).tolist() == [1, 2, 3, 3]  # the last, short segment is padded with zeros


def test_smallest_policy_bands_by_rank_whatever_the_scale():
    p = smallest(0.25)
    assert p.group_msr() == {1: 0.0, 2: 1.0}
    mags = np.array([5, 1, 0, 0, 3, 2, 0, 4], dtype=np.float32)
    for scale in (1e-6, 1.0, 1e6):  # the same packets are the smallest at any scale
        assert p.classify(np.repeat(mags * scale, 10), 10).tolist() == [2, 2, 1, 1, 2, 2, 2, 2]  # ties: first ones
    assert smallest(0.0).classify(np.ones(30), 10).tolist() == [2, 2, 2]
    assert smallest(1.0).classify(np.ones(30), 10).tolist() == [1, 1, 1]
    assert "by magnitude" in p.describe()


def test_policies_parse_and_reject_nonsense():
    assert parse_policy("paper") == paper_policy()
    assert parse_policy("msr:0.9") == single_msr(0.9)
    assert parse_policy("bands:0.003:0,1") == GroupPolicy((0.003,), (0.0, 1.0))
    assert parse_policy("smallest:0.3:0,1") == smallest(0.3, 0.0, 1.0)
    for bad in ("bands:0.003:0", "bands:0.02,0.01:0,0,1", "msr:1.5", "nope", "bands:x:0,1", "smallest:1.5:0,1"):
        with pytest.raises(ConfigError):
            parse_policy(bad)


@pytest.mark.parametrize("n,world,expect", [
    (1000, 3, [(0, 334), (334, 668), (668, 1000)]),
    (10, 3, [(0, 4), (4, 8), (8, 10)]),
    (7, 3, [(0, 4), (4, 7), (7, 7)]),
    (2_500_000, 3, [(0, 833_336), (833_336, 1_666_672), (1_666_672, 2_500_000)]),  # 1 MiB segments
    (1024, 4, [(0, 256), (256, 512), (512, 768), (768, 1024)]),
    (5, 1, [(0, 5)]),
])
def test_chunk_bounds_follow_gloo_ring(n, world, expect):
    # measured against ProcessGroupGloo's allreduce (which element each rank adds last)
    assert chunk_bounds(n, world) == expect


def test_reduction_order_is_the_ring_towards_the_owner():
    assert reduction_order(0, 3) == [2, 1, 0]
    assert reduction_order(2, 4) == [1, 0, 3, 2]


def test_vector_job_payloads_are_hostlib_float_ranges_grouped_by_msr():
    v = np.arange(3 * FPP + 5, dtype=np.float32) / 7
    groups = np.array([1, 3, 1, 2], dtype=np.uint16)
    job = vector_job(9, v, group_of_segment=groups, group_msr={1: 0.0, 2: 0.5, 3: 0.9}, floats_per_packet=FPP)
    assert job.vector_len == len(v)
    assert [m.group_id for m in job.messages] == [3, 2, 1, 1]  # most demanding MSR first
    for m in job.messages:
        first, values = wire.decode_float_range(m.data)
        assert m.data == wire.encode_float_range(first, v[first:first + len(values)].tolist())
    rj = ReceivedJob(job_id=9, peer=None, total=4, vector_len=len(v), groups=(), lost_ids=(2,),
                     messages={i: m.data for i, m in enumerate(job.messages) if i != 2}
                     | {99: wire.encode_float_range(10**6, [1.0])})  # out of range: ignored
    got, have = received_vector(rj, len(v))
    lost_first, lost_vals = wire.decode_float_range(job.messages[2].data)
    mask = np.ones(len(v), dtype=bool)
    mask[lost_first:lost_first + len(lost_vals)] = False
    assert np.array_equal(have, mask)
    assert np.array_equal(got[mask], v[mask]) and not got[~mask].any()


def test_exchange_vector_job_rotates_where_each_group_starts():
    v = np.arange(10 * FPP, dtype=np.float32)
    groups = np.array([1, 2] * 5, dtype=np.uint16)
    firsts = []
    for it in range(4):
        job = vector_job(1, v, group_of_segment=groups, group_msr={1: 0.5, 2: 0.9}, floats_per_packet=FPP, rotate=it)
        order = [wire.decode_float_range(m.data)[0] // FPP for m in job.messages]
        assert sorted(order) == list(range(10))  # every segment once
        assert [int(groups[s]) for s in order] == [2] * 5 + [1] * 5  # still grouped, most demanding MSR first
        firsts.append(order[0])
    assert firsts[0] == 1 and len(set(firsts)) > 1  # rotate=0 keeps id order; others start elsewhere


def test_exchange_carries_concurrent_jobs_within_each_groups_bound_under_loss():
    from netapprox.hostlib.config import AtpConfig
    rng = np.random.default_rng(3)
    scale = np.repeat(np.where(np.arange(40) % 2, 1e-2, 1e-4), FPP)  # every other segment small
    v = (rng.standard_normal(40 * FPP) * scale).astype(np.float32)
    policy = GroupPolicy((0.01,), (0.0, 0.9))
    cfg = AtpConfig(completion="all_sent")
    exchanges = [AtpExchange(config=cfg, loss=0.2, seed=i) for i in range(3)]
    try:
        pairs = [(0, 1), (1, 0), (2, 0), (2, 1)]
        futs = []
        for k, (s, d) in enumerate(pairs):
            job = vector_job(100 + k, v, group_of_segment=policy.classify(v, FPP), group_msr=policy.group_msr(),
                             floats_per_packet=FPP)
            futs.append((exchanges[d].receive(100 + k), exchanges[s].send(exchanges[d].address, job), job))
        lost_small = 0
        for rfut, sfut, job in futs:
            got, summary = rfut.result(30), sfut.result(30)
            assert summary.receiver_confirmed
            for g in summary.groups:
                assert g.lost <= g.total - g.required, g
            lost_small += summary.group(1).lost
            vec, have = received_vector(got, len(v))
            assert np.array_equal(vec[have], v[have])
            # what the receiver misses is exactly what the sender's summary (the receiver's DONE) calls lost
            assert int((~have).sum()) == sum(len(wire.decode_float_range(job.messages[i].data)[1])
                                             for i in summary.lost_ids)
        assert lost_small > 0  # the injected loss reached the MSR-0 group and was not repaired
        assert sum(e.datagrams_dropped for e in exchanges) > 0
    finally:
        for e in exchanges:
            e.close()


def test_hostlib_and_ml_cores_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import netapprox.hostlib.api, netapprox.hostlib.aio, netapprox.controller.core\n"
            "import netapprox.ml, netapprox.ml.policy, netapprox.ml.layout, netapprox.ml.vectors, netapprox.hostlib.exchange\n"
            "import netapprox.ml.transform\n"
            "try:\n    netapprox.ml.register(None)\nexcept ModuleNotFoundError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'netapprox[torch]'" in out.stdout
