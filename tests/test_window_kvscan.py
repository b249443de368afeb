"""workload.kvscan's kernels are numpy's arithmetic bit for bit (issue 27: the windowed reserve's
event law and KV tail made faster without a digit of the plan changing): each against the numpy
expression it replaces in workload/kv.py, on random laws with zeros, negative round-off and ties."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opweave_planner.workload.kvscan import blend_into, end_laws, quantile_index, term_values


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a, b) and np.array_equal(np.signbit(a), np.signbit(b))


def _noisy(rng, size: int) -> np.ndarray:
    """A transform's output: a law's masses with FFT round-off (tiny negatives), zeros of both signs."""
    raw = rng.random(size) ** 4
    raw[rng.random(size) < 0.2] *= -1e-17
    raw[rng.random(size) < 0.05] = -0.0
    raw[rng.random(size) < 0.05] = 0.0
    return raw


@pytest.mark.parametrize("seed", range(4))
def test_term_values_is_numpys_interp_times_the_padded_cdf(seed):
    rng = np.random.default_rng(seed)
    for trial in range(400):
        m, grid = int(rng.integers(1, 20)), int(rng.integers(2, 400))
        nf = m * (grid - 1) + 1
        s = [float(rng.integers(0, 3 * nf)), float(rng.uniform(0, 3 * nf)),
             float(rng.integers(0, 50)) * 0.1 + float(rng.uniform(0, 1e-9))][trial % 3]
        span = m * (grid - 1) + math.ceil(s) + 2
        sf, sa = rng.random(nf) ** 3, rng.random(nf) ** 5
        cdf_f = np.minimum(np.cumsum(sf) / sf.sum(), 1.0)
        tail = np.concatenate([[1.0], np.clip(1.0 - np.cumsum(sa) / sa.sum(), 0.0, 1.0)])
        for a in (cdf_f, tail):
            a.setflags(write=False)
        x = np.arange(span, dtype=np.float64)
        want = np.concatenate([cdf_f, np.ones(span - nf)]) * np.interp(
            x - s, np.arange(-1, tail.size - 1), tail, left=1.0, right=0.0)
        assert _same(term_values(s, span, cdf_f, tail), want), (trial, s, span)


@pytest.mark.parametrize("seed", range(4))
def test_quantile_index_is_searchsorted_on_the_normalised_cumsum(seed):
    rng = np.random.default_rng(10 + seed)
    for trial in range(300):
        size = int(rng.integers(2, 5000))
        raw = _noisy(rng, size + 7) * (1.0 if trial % 2 else 1e-3)
        q = float(rng.choice([0.5, 0.9, 0.99, 0.999, 0.9999, 1.0, 1e-6, rng.random()]))
        cdf = np.cumsum(np.clip(raw[:size], 0.0, None))
        cdf /= cdf[-1]
        want = int(min(np.searchsorted(cdf, q - 1e-12, side="left"), size - 1))
        assert quantile_index(raw, size, q - 1e-12) == want, (trial, q)
    assert quantile_index(np.zeros(8), 8, 0.5) == -1  # no mass: the caller falls back to numpy


@pytest.mark.parametrize("seed", range(4))
def test_end_laws_are_the_normalised_cumsums(seed):
    rng = np.random.default_rng(20 + seed)
    for _ in range(300):
        size = int(rng.integers(1, 5000))
        sf = np.clip(_noisy(rng, size), 0.0, None)
        sa = np.clip(_noisy(rng, size), 0.0, None)
        if sf.sum() <= 0 or sa.sum() <= 0:
            continue
        cdf_f, tail = end_laws(sf, float(sf.sum()), sa, float(sa.sum()))
        assert _same(cdf_f, np.minimum(np.cumsum(sf) / sf.sum(), 1.0))
        assert _same(tail, np.concatenate([[1.0], np.clip(1.0 - np.cumsum(sa) / sa.sum(), 0.0, 1.0)]))


def test_blend_into_is_numpys_weighted_sum_of_complex_rows():
    rng = np.random.default_rng(30)
    for _ in range(200):
        rows, size = int(rng.integers(1, 5)), int(rng.integers(1, 3000))
        want = np.zeros((rows, size), np.complex128)
        got = want.copy()
        for _j in range(int(rng.integers(1, 6))):
            prod = (rng.random(size) - 0.5) + 1j * (rng.random(size) - 0.5)
            prod[rng.random(size) < 0.1] = 0.0
            weights = rng.random(rows) * (rng.random(rows) < 0.7)
            for i in np.flatnonzero(weights):
                want[i] += weights[i] * prod
            blend_into(got.view(np.float64), weights, prod.view(np.float64))
        assert _same(got.view(np.float64), want.view(np.float64))


def test_int_power_is_numpys_complex_power_below_100():
    from opweave_planner.workload.kvscan import int_power

    rng = np.random.default_rng(40)
    for _ in range(150):
        size = int(rng.integers(1, 3000))
        z = (rng.random(size) - 0.5) * 2 + 1j * (rng.random(size) - 0.5) * 2
        z[rng.random(size) < 0.05] = 0.0
        z[rng.random(size) < 0.05] = complex(-0.0, 0.3)
        z[rng.random(size) < 0.02] = complex(-0.0, -0.0)
        z[rng.random(size) < 0.02] = complex(1e-200, 1e-180)
        z /= max(1.0, float(np.abs(z).max()))  # a law's transform: |z| <= 1
        for n in (3, 4, 5, 64, 99, int(rng.integers(6, 99))):
            assert _same((z**n).view(np.float64), int_power(z, n).view(np.float64)), n
