"""Barrier constant, cycle times and the two ratio rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy.stats import norm

from opweave_planner.afd import provisioning as pv
from opweave_planner.errors import UserError

PAPER = pv.LatencyCoefficients(**pv.PAPER_SECTION_52)


def test_kappa_known_values():
    got = pv.kappa(np.array([1, 2, 3, 4, 5]))
    sqrt_pi = math.sqrt(math.pi)
    # E[max] of 1..5 standard normals: 0, 1/sqrt(pi), 3/(2 sqrt(pi)), tabulated, tabulated.
    want = [0.0, 1 / sqrt_pi, 1.5 / sqrt_pi, 1.0293753730, 1.1629644736]
    np.testing.assert_allclose(got, want, atol=1e-9)


@pytest.mark.parametrize("r", [7, 24, 24.5, 300])
def test_kappa_matches_adaptive_quadrature_of_the_density(r):
    def integrand(z):
        return z * r * norm.pdf(z) * norm.cdf(z) ** (r - 1)

    want, _ = integrate.quad(integrand, -12, 12, points=[math.sqrt(2 * math.log(r))], limit=200)
    assert float(pv.kappa(r)) == pytest.approx(want, abs=1e-9)


def test_kappa_grows_like_sqrt_two_log_r():
    r = np.array([10, 100, 1000, 10_000])
    k = pv.kappa(r)
    assert np.all(np.diff(k) > 0)
    assert np.all(k < np.sqrt(2 * np.log(r)))


@pytest.mark.parametrize("z", [-60.0, -4.0, -0.3, 0.0, 0.8, 5.0, 45.0])
def test_expected_excess_closed_form_for_one_worker(z):
    want = norm.pdf(z) - z * norm.sf(z)
    assert float(pv.expected_excess(1, z)) == pytest.approx(want, abs=1e-12)


def test_barrier_overhead_formula():
    theta, nu, batch = 599.0, math.sqrt(259_400.0), 256
    got = pv.barrier_overhead(batch, theta, nu, [2, 8])
    np.testing.assert_allclose(got, nu / theta * pv.kappa([2, 8]) / 16)
    load = pv.barrier_load(batch, theta, nu, [2, 8])
    np.testing.assert_allclose(load / (batch * theta) - 1, got)


def _grid_argmax(f, lo=1e-3, hi=400.0, points=400_001):
    grid = np.geomspace(lo, hi, points)
    values = f(grid)
    return grid[int(np.argmax(values))], float(values.max())


def _coefs():
    pos = st.floats(1e-4, 1.0)
    fixed = st.floats(0.0, 400.0)
    return st.builds(
        pv.LatencyCoefficients,
        alpha_a=st.floats(1e-5, 1e-2),
        beta_a=fixed,
        alpha_f=pos,
        beta_f=fixed,
        alpha_c=pos,
        beta_c=fixed,
    )


@settings(max_examples=60, deadline=None)
@given(coef=_coefs(), batch=st.integers(8, 512), theta=st.floats(10.0, 5000.0))
def test_mean_field_rule_is_the_global_optimum(coef, batch, theta):
    try:
        best = pv.optimal_ratio_mf(coef, batch, theta)
    except UserError:
        return  # no positive finite candidate: nothing to compare
    r_grid, thr_grid = _grid_argmax(
        lambda r: pv.per_instance_throughput(batch, r, pv.tau_mf(coef, batch, theta, r))
    )
    assert best.throughput >= thr_grid * (1 - 1e-9)
    if best.r < 399:
        assert best.r == pytest.approx(r_grid, rel=1e-3, abs=2e-3)


@pytest.mark.parametrize(
    "coef, regime",
    [
        (pv.LatencyCoefficients(1e-2, 10.0, 0.01, 5.0, 0.005, 1.0), "attention"),
        (pv.LatencyCoefficients(1e-4, 1.0, 0.05, 500.0, 0.01, 5.0), "ffn"),
        (pv.LatencyCoefficients(1e-4, 1.0, 0.01, 5.0, 0.05, 500.0), "communication"),
        (pv.LatencyCoefficients(1e-4, 1.0, 0.1, 1.0, 0.001, 200.0), "communication-ffn"),
    ],
)
def test_regimes(coef, regime):
    best = pv.optimal_ratio_mf(coef, 64, 100.0)
    assert best.regime == regime
    assert best.r == pytest.approx(best.candidates[regime])


def test_paper_section_52_mean_field_ratio_is_the_attention_ffn_balance():
    theta = 599.0
    best = pv.optimal_ratio_mf(PAPER, 256, theta)
    mu_a = PAPER.alpha_a * 256 * theta + PAPER.beta_a
    assert best.r == pytest.approx((mu_a - PAPER.beta_f) / (PAPER.alpha_f * 256))
    assert best.balance == "attention=ffn"


@settings(max_examples=40, deadline=None)
@given(
    coef=_coefs(),
    batch=st.integers(8, 512),
    theta=st.floats(10.0, 5000.0),
    cv=st.floats(0.0, 3.0),
    r=st.floats(1.0, 64.0),
)
def test_gaussian_cycle_is_between_mean_field_and_barrier_aware_bounds(coef, batch, theta, cv, r):
    nu = cv * theta
    t_g = float(pv.tau_gaussian(coef, batch, theta, nu, r))
    t_mf = float(pv.tau_mf(coef, batch, theta, r))
    mu_a, sigma_a = pv.attention_moments(coef, batch, theta, nu)
    # Jensen: E[max(X, G)] >= max(E[X], G); and <= G + E[(X - mu)_+] + (mu - G)_+ .
    assert t_g >= max(t_mf, mu_a + sigma_a * float(pv.kappa(r))) * (1 - 1e-9)
    upper = float(pv.shared_stage_time(coef, batch, r)) + sigma_a * float(
        pv.expected_excess(r, 0.0)
    )
    assert t_g <= upper + max(mu_a - float(pv.shared_stage_time(coef, batch, r)), 0.0) + 1e-9 * t_g


def test_gaussian_rule_collapses_to_mean_field_without_variance():
    g = pv.optimal_ratio_gaussian(PAPER, 256, 599.0, 0.0)
    assert g.r == pytest.approx(pv.optimal_ratio_mf(PAPER, 256, 599.0).r, rel=1e-4)


def test_gaussian_rule_is_the_grid_optimum():
    theta, nu = 599.0, math.sqrt(259_400.0)
    g = pv.optimal_ratio_gaussian(PAPER, 256, theta, nu)
    r_grid, thr_grid = _grid_argmax(
        lambda r: pv.per_instance_throughput(256, r, pv.tau_gaussian(PAPER, 256, theta, nu, r)),
        lo=1.0,
        hi=64.0,
        points=20_001,
    )
    assert g.throughput >= thr_grid * (1 - 1e-9)
    assert g.r == pytest.approx(r_grid, rel=1e-3)


@pytest.mark.parametrize(
    "bad", [{"alpha_a": -1.0}, {"beta_f": float("nan")}, {"alpha_f": 0.0, "alpha_c": 0.0}]
)
def test_bad_coefficients_are_rejected(bad):
    with pytest.raises(UserError, match="coefficient"):
        pv.LatencyCoefficients(**{**pv.PAPER_SECTION_52, **bad})
