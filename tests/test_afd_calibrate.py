"""Least-squares latency coefficients from (size, latency) samples."""

from __future__ import annotations

import numpy as np
import pytest

from opweave_planner.afd import provisioning as pv
from opweave_planner.afd.calibrate import calibrate, fit_line
from opweave_planner.errors import UserError


def _samples(coef: pv.LatencyCoefficients, noise: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1_000, 400_000, size=200)
    batch = rng.integers(16, 8192, size=200)

    def jitter(y):
        return y * (1 + noise * rng.standard_normal(y.size))

    return (
        (tokens, jitter(coef.alpha_a * tokens + coef.beta_a)),
        (batch, jitter(coef.alpha_f * batch + coef.beta_f)),
        (batch, jitter(coef.alpha_c * batch + coef.beta_c)),
    )


def test_noiseless_samples_recover_the_coefficients_exactly():
    truth = pv.LatencyCoefficients(**pv.PAPER_SECTION_52)
    cal = calibrate(*_samples(truth, 0.0))
    for name, value in truth.as_dict().items():
        assert getattr(cal.coefficients, name) == pytest.approx(value, rel=1e-9)
    assert cal.attention.rmse < 1e-9 and cal.ffn.r2 == pytest.approx(1.0)


def test_noisy_samples_report_their_error():
    truth = pv.LatencyCoefficients(**pv.PAPER_SECTION_52)
    cal = calibrate(*_samples(truth, 0.02, seed=1))
    assert cal.coefficients.alpha_f == pytest.approx(truth.alpha_f, rel=0.02)
    for fit in (cal.attention, cal.ffn, cal.communication):
        assert 0.02 < fit.max_rel_error < 0.2
        assert fit.rmse > 0 and 0.9 < fit.r2 < 1.0
    assert set(cal.as_dict()) == {"coefficients", "attention", "ffn", "communication"}


def test_intercepts_are_not_negative():
    size = np.array([1.0, 2.0, 3.0, 4.0])
    fit = fit_line(size, 10 * size - 5)  # the unconstrained line has intercept -5
    assert fit.intercept == 0.0 and fit.slope > 0
    assert fit.max_abs_error > 0


@pytest.mark.parametrize(
    "size, latency, needle",
    [
        ([1, 2], [1.0], "equal-length"),
        ([3, 3, 3], [1.0, 2.0, 3.0], "two distinct sizes"),
        ([1, 2], [1.0, float("nan")], "finite"),
        ([1, -2], [1.0, 2.0], "non-negative"),
    ],
)
def test_bad_samples_are_rejected(size, latency, needle):
    with pytest.raises(UserError, match=needle):
        fit_line(size, latency, "attention samples")


def test_calibrate_names_the_component():
    good = ([1, 2, 3], [1.0, 2.0, 3.0])
    with pytest.raises(UserError, match="ffn samples"):
        calibrate(good, ([1, 1], [2.0, 2.0]), good)
    with pytest.raises(UserError, match="communication samples"):
        calibrate(good, good, None)
