"""The randomized Hadamard transform (ml/transform.py): exact round trips where the arithmetic is exact, float32
rounding otherwise, linearity across workers, and a lost packet's error spread over its block."""
from __future__ import annotations

import numpy as np
import pytest

from netapprox.hostlib import wire
from netapprox.hostlib.config import ConfigError
from netapprox.ml import transform
from netapprox.ml.transform import Hadamard, block_sizes, fwht

FPP = wire.floats_per_packet(1400 - wire.HEADER_LEN)


def test_hadamard_butterflies_match_the_matrix():
    h = np.array([[1.0]])
    for _ in range(4):
        h = np.block([[h, h], [h, -h]])
    x = np.random.default_rng(0).standard_normal((3, 16))
    assert np.allclose(fwht(x), x @ h.T)


@pytest.mark.parametrize("n", [1, 5, 340, 4096, 16640, 65792, 100_003])
def test_hadamard_blocks_pad_at_most_three_values(n):
    sizes = block_sizes(n, 4096)
    assert all(s in (4, 16, 64, 256, 1024, 4096) for s in sizes)
    assert n <= sum(sizes) <= n + 3 and Hadamard(n).padded_len == sum(sizes)


def test_hadamard_round_trip_is_exact_without_loss_where_the_arithmetic_is():
    # integer values: every butterfly sum, the exact 2^-k scaling and the float32 rounding are exact
    x = np.random.default_rng(1).integers(-1000, 1000, 20_000).astype(np.float32)
    t = Hadamard(len(x), seed=3)
    assert np.array_equal(t.inverse(t.forward(x)), x)
    # gradients: float32 once on the way out, so within a few ulps of each block's norm
    g = (np.random.default_rng(2).standard_normal(20_000) * np.logspace(-6, 0, 20_000)).astype(np.float32)
    back = t.inverse(t.forward(g))
    start = 0
    for size in t.sizes:
        stop = min(len(g), start + size)
        if start < stop:
            assert np.abs(back[start:stop] - g[start:stop]).max() <= 4 * np.finfo(np.float32).eps * \
                np.linalg.norm(g[start:stop])
        start += size
    assert np.mean(back == g) > 0.3  # most values come back bit for bit


def test_hadamard_is_linear_so_workers_may_sum_transformed_contributions():
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(9000).astype(np.float32) for _ in range(3)]
    t = Hadamard(9000, seed=7)
    summed = t.inverse(sum(t.forward(x) for x in xs))
    assert np.allclose(summed, sum(xs), atol=1e-5)
    other = Hadamard(9000, seed=8)  # another seed, other signs: a worker with another seed would garble the sum
    assert not np.allclose(other.inverse(sum(t.forward(x) for x in xs)), sum(xs), atol=1e-2)


def test_hadamard_spreads_a_lost_packet_over_its_block_with_the_lost_energy():
    rng = np.random.default_rng(4)
    x = np.zeros(4096 * 3, dtype=np.float32)
    x[5000:5100] = rng.standard_normal(100) * 10  # a few large gradients in the middle block
    t = Hadamard(len(x), seed=5)
    y = t.forward(x)
    lost = slice(4096 + FPP, 4096 + 2 * FPP)  # one packet's range of the middle block, read as zero
    y_lost = y.copy()
    y_lost[lost] = 0.0
    err = t.inverse(y_lost) - x
    # Parseval: the error has exactly the norm of what was lost, and stays in that block
    assert np.isclose(np.linalg.norm(err), np.linalg.norm(y[lost]), rtol=1e-4)
    assert not err[:4096].any() and not err[8192:].any()
    # spread: every value of the block is off by a little, none by much, while without the transform the same
    # loss would wipe out 340 consecutive values
    assert np.count_nonzero(err[4096:8192]) > 4000
    assert np.abs(err).max() < 0.2 * np.abs(x).max()
    # what is lost is one packet of the block's twelve: about 1/12 of the block's energy, whichever values
    expected = np.sqrt(FPP / 4096) * np.linalg.norm(x)
    assert 0.5 * expected < np.linalg.norm(err) < 1.5 * expected


def test_hadamard_rejects_bad_blocks_and_lengths():
    for block in (0, 3, 8, 2048, 5000):
        with pytest.raises(ConfigError, match="power of 4"):
            Hadamard(10, block=block)
    with pytest.raises(ConfigError):
        Hadamard(0)
    t = Hadamard(10)
    with pytest.raises(ValueError):
        t.forward(np.zeros(11, dtype=np.float32))
    with pytest.raises(ValueError):
        t.inverse(np.zeros(10, dtype=np.float32))


def test_hadamard_cost_is_measured_per_mb():
    c = transform.cost_per_mb(0.25, repeats=1)
    assert c["forward_s_per_mb"] > 0 and c["inverse_s_per_mb"] > 0 and c["block"] == 4096
    assert transform.main(["--mb", "0.25"]) == 0
