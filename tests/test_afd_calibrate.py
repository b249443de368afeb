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


def test_fit_line_reproduces_synthetic_linear_data_exactly():
    size = np.array([256.0, 512, 1024, 4096, 8192])
    fit = fit_line(size, 0.75 * size + 123.0)
    assert fit.slope == pytest.approx(0.75, rel=1e-12)
    assert fit.intercept == pytest.approx(123.0, rel=1e-12)
    assert fit.rmse < 1e-9 and fit.max_rel_error < 1e-12


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen3-30b-a3b"])
def test_profile_calibration_gives_positive_coefficients_and_small_error(model):
    from opweave_planner.afd.calibrate import calibrate_from_profiles
    from opweave_planner.inputs.hardware import load_hardware

    cal = calibrate_from_profiles(model, "h100", "h100", context=32768, batch=256)
    coef = cal.coefficients
    assert coef.alpha_a > 0 and coef.beta_a > 0 and coef.alpha_f > 0
    assert coef.alpha_c > 0 and coef.beta_c > 0
    assert cal.attention.max_rel_error < 0.05
    assert cal.ffn.max_rel_error < 0.30 and cal.ffn.r2 > 0.98
    # communication is exactly the network law: L * (latency + n * H * bytes / bandwidth)
    net, st = load_hardware().network, cal.setup
    assert coef.beta_c == pytest.approx(st["layers"] * net.inter_node_latency_us)
    assert coef.alpha_c == pytest.approx(
        st["layers"] * st["bytes_per_request_per_layer"] / (net.inter_node_gbps * 1e3)
    )
    assert st["ffn_batches"] == [256 * r for r in (1, 2, 4, 8, 16, 24, 32)]
    assert set(cal.as_dict()) == {"coefficients", "attention", "ffn", "communication", "setup"}


def test_profile_calibration_moe_ep_and_errors():
    from opweave_planner.afd.calibrate import calibrate_from_profiles

    tp1 = calibrate_from_profiles("qwen3-30b-a3b", "h100", "h100", context=8192)
    ep2 = calibrate_from_profiles(
        "qwen3-30b-a3b", "h100", "h100", ffn_tp=2, moe_ep=True, context=8192
    )
    assert ep2.coefficients.alpha_f < tp1.coefficients.alpha_f  # two GPUs share the experts
    assert ep2.coefficients.alpha_a == tp1.coefficients.alpha_a  # attention side unchanged
    with pytest.raises(UserError, match="no MoE"):
        calibrate_from_profiles("llama-3.1-8b", "h100", "h100", moe_ep=True)
    with pytest.raises(UserError, match="--ffn-gpu"):
        calibrate_from_profiles("llama-3.1-8b", "h100", "nope")
    with pytest.raises(UserError, match="attn_tp"):
        calibrate_from_profiles("llama-3.1-8b", "h100", "h100", attn_tp=0)
