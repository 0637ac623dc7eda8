"""A randomized Hadamard transform of gradient buckets: a lost datagram costs a little everywhere.

Without a transform, a lost range-indexed packet takes 340 consecutive gradient values with it (one slice of
one layer). With it, the bucket is sent as ``y = H D x`` per block of ``block`` values (``D`` random signs,
``H`` the normalised Walsh-Hadamard matrix, ``H H = I``), and a worker applies ``x = D H y``: a range of
``y`` lost (read as zero) becomes an error spread over the whole block, each coordinate off by a little
(OptiReduce, NSDI'25, uses the same transform for the same reason). The transform is linear, so workers may
sum transformed contributions and transform the sum back; every worker draws the same signs from the same
seed. The error of a lost range has the norm of what was lost (``H`` is orthonormal), whichever values those
were.

``block`` is a power of 4, so the normalisation 1/sqrt(block) is a power of two and exact in floating point;
what does not fill a whole block goes in smaller powers of 4, so at most 3 values of padding travel.
The butterflies run in float64 over float32 input; what travels is float32 (``forward`` rounds once), so a
round trip without loss returns every value to within a few float32 ulps of the block's norm, and exactly
when the transformed values are representable (integer-valued input, tests/ml/test_ml_transform.py). That
rounding is why the transform is optional: without it the ATP hook's lossless result is bit-for-bit gloo's.

Pure numpy: no torch, no I/O. ``python -m netapprox.ml.transform`` prints its CPU cost per MB.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from typing import Sequence

import numpy as np

from netapprox.hostlib.config import ConfigError

DEFAULT_BLOCK = 4096
"""Values per transform block (a power of 4): 12 packets of 340 float32, 16 KiB."""


def _is_power_of_4(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0 and (n.bit_length() - 1) % 2 == 0


def fwht(blocks: np.ndarray) -> np.ndarray:
    """The unnormalised Walsh-Hadamard transform of every row of ``blocks`` (rows of a power-of-2 length),
    float64, in a new array: ``log2(len)`` vectorised butterfly passes."""
    out = np.array(blocks, dtype=np.float64, copy=True)
    rows, size = out.shape
    h = 1
    while h < size:
        v = out.reshape(rows, size // (2 * h), 2, h)
        a = v[:, :, 0, :].copy()
        np.add(a, v[:, :, 1, :], out=v[:, :, 0, :])
        np.subtract(a, v[:, :, 1, :], out=v[:, :, 1, :])
        h *= 2
    return out


def block_sizes(n: int, block: int) -> tuple[int, ...]:
    """How ``n`` values are cut into transform blocks: as many ``block``-sized ones as fit, then the rest in
    the largest powers of 4 that fit, the last one padded (by at most 3 values)."""
    sizes = [block] * (n // block)
    rest = n - sum(sizes)
    size = block
    while rest > 0:
        while size > 4 and size > rest:
            size //= 4
        sizes.append(size)
        rest -= size
    return tuple(sizes)


@dataclasses.dataclass(frozen=True)
class Hadamard:
    """The transform of a vector of ``n`` values: blocks of ``block`` values, the rest in smaller powers of 4
    (:func:`block_sizes`; ``padded_len`` values travel, at most 3 more than ``n``), random signs from ``seed``.
    Callers that sum transformed vectors must use equal ``n``, ``block`` and ``seed``."""

    n: int
    block: int = DEFAULT_BLOCK
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError("the Hadamard transform needs at least one value")
        if not _is_power_of_4(self.block):
            raise ConfigError(f"transform block {self.block}: must be a power of 4 (4, 16, ..., 4096, 16384)")

    @functools.cached_property
    def sizes(self) -> tuple[int, ...]:
        return block_sizes(self.n, self.block)

    @property
    def padded_len(self) -> int:
        return sum(self.sizes)

    @functools.cached_property
    def _signs(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        return np.where(rng.random(self.padded_len) < 0.5, -1.0, 1.0)

    def _apply(self, v: np.ndarray, *, inverse: bool) -> np.ndarray:
        """Per run of equal-sized blocks: (signs,) butterflies, 1/sqrt(size), (signs)."""
        out = np.empty(self.padded_len, dtype=np.float64)
        start = 0
        for size, count in _runs(self.sizes):
            stop = start + size * count
            part = v[start:stop].astype(np.float64)
            if not inverse:
                part *= self._signs[start:stop]
            part = fwht(part.reshape(count, size)).reshape(-1)
            part *= 2.0 ** -((size.bit_length() - 1) // 2)  # 1 / sqrt(size), exact
            if inverse:
                part *= self._signs[start:stop]
            out[start:stop] = part
            start = stop
        return out

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``H D x`` per block, float32, ``padded_len`` values."""
        v = np.asarray(x, dtype=np.float32).ravel()
        if len(v) != self.n:
            raise ValueError(f"expected {self.n} values, got {len(v)}")
        padded = np.zeros(self.padded_len, dtype=np.float32)
        padded[:self.n] = v
        return self._apply(padded, inverse=False).astype(np.float32)

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """``D H y`` per block, float32, the first ``n`` values."""
        v = np.asarray(y, dtype=np.float32).ravel()
        if len(v) != self.padded_len:
            raise ValueError(f"expected {self.padded_len} values, got {len(v)}")
        return self._apply(v, inverse=True)[:self.n].astype(np.float32)


def _runs(sizes: Sequence[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s in sizes:
        if out and out[-1][0] == s:
            out[-1] = (s, out[-1][1] + 1)
        else:
            out.append((s, 1))
    return out


def cost_per_mb(mb: float = 4.0, *, block: int = DEFAULT_BLOCK, repeats: int = 5) -> dict[str, float]:
    """CPU seconds of one forward and one inverse transform per MB of float32 values (process CPU time, the
    best of ``repeats``)."""
    n = int(mb * (1 << 20)) // 4
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    t = Hadamard(n, block=block, seed=1)
    fwd, inv = [], []
    for _ in range(repeats):
        c0 = time.process_time()
        y = t.forward(x)
        c1 = time.process_time()
        t.inverse(y)
        c2 = time.process_time()
        fwd.append(c1 - c0)
        inv.append(c2 - c1)
    return {"mb": mb, "block": t.block, "forward_s_per_mb": min(fwd) / mb, "inverse_s_per_mb": min(inv) / mb}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netapprox.ml.transform",
                                description="CPU cost of the randomized Hadamard transform per MB of float32")
    p.add_argument("--mb", type=float, default=4.0)
    p.add_argument("--block", type=int, default=DEFAULT_BLOCK)
    args = p.parse_args(argv)
    try:
        c = cost_per_mb(args.mb, block=args.block)
    except ConfigError as err:
        p.error(str(err))
    print(f"block {c['block']}: forward {c['forward_s_per_mb'] * 1e3:.1f} ms/MB, "
          f"inverse {c['inverse_s_per_mb'] * 1e3:.1f} ms/MB (CPU time, best of 5, {c['mb']:g} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
