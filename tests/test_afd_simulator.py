"""Bundle simulator: exact deterministic cycles, reproducibility, agreement with the rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opweave_planner.afd import provisioning as pv
from opweave_planner.afd.simulator import barrier_overhead_mc, simulate_bundle
from opweave_planner.errors import UserError
from opweave_planner.workload.sampling import LengthDist, ParametricWorkload

GEO = ParametricWorkload(LengthDist("geometric", 100), LengthDist("geometric", 500))
ONE_STEP = ParametricWorkload(LengthDist("fixed", 40), LengthDist("fixed", 1))
ATTENTION_BOUND = pv.LatencyCoefficients(0.01, 10.0, 0.001, 1.0, 1e-4, 0.1)


def _times(coef, r, batch, prompt):
    t_a = coef.alpha_a * batch * prompt + coef.beta_a
    t_f = coef.alpha_f * r * batch + coef.beta_f
    t_c = coef.alpha_c * r * batch + coef.beta_c
    return t_a, t_f, t_c


def test_one_batch_in_flight_is_the_serial_round_trip():
    coef = pv.LatencyCoefficients(0.5, 3.0, 0.25, 7.0, 0.125, 2.0)
    r, batch, n = 3, 4, 100  # 0.8 * 300 completions = 20 whole steps of 12 requests
    res = simulate_bundle(coef, ONE_STEP, r, batch, n, batches_in_flight=1)
    t_a, t_f, t_c = _times(coef, r, batch, 40)
    cycle = t_a + t_f + 2 * t_c
    assert res.t_stable == pytest.approx(20 * cycle)
    assert res.throughput_per_instance == pytest.approx(r * batch / ((r + 1) * cycle))
    assert res.tpot == pytest.approx(cycle)
    assert res.idle_attention == pytest.approx(1 - t_a / cycle)
    assert res.idle_ffn == pytest.approx(1 - t_f / cycle)
    assert res.barrier_overhead == 0.0


@pytest.mark.parametrize(
    "coef",
    [
        pv.LatencyCoefficients(0.5, 3.0, 0.01, 7.0, 0.001, 0.5),  # attention-bound: period t_A
        pv.LatencyCoefficients(0.1, 3.0, 0.1, 7.0, 0.05, 6.0),  # balanced: round trip binds
    ],
)
def test_two_batches_reach_the_max_plus_period(coef):
    r, batch = 2, 4
    res = simulate_bundle(coef, ONE_STEP, r, batch, 4000)
    t_a, t_f, t_c = _times(coef, r, batch, 40)
    period = max(t_a, t_f, t_c, (t_a + t_f + 2 * t_c) / 2)
    assert res.throughput_per_instance == pytest.approx(r * batch / ((r + 1) * period), rel=2e-3)


def test_same_seed_same_result_other_seed_differs():
    kwargs = {
        "coef": pv.LatencyCoefficients(**pv.PAPER_SECTION_52),
        "workload": GEO,
        "r": 4,
        "batch": 32,
        "requests_per_instance": 400,
    }
    a = simulate_bundle(**kwargs, seed=11)
    assert a == simulate_bundle(**kwargs, seed=11)
    assert a.throughput_per_instance != simulate_bundle(**kwargs, seed=12).throughput_per_instance


def test_attention_bound_bundle_follows_the_gaussian_cycle_time():
    w = ParametricWorkload(LengthDist("geometric", 20), LengthDist("geometric", 50))
    batch = 64
    for r in (1, 8):
        res = simulate_bundle(ATTENTION_BOUND, w, r, batch, 10_000, seed=3)
        tau_g = float(pv.tau_gaussian(ATTENTION_BOUND, batch, w.theta, w.nu, r))
        assert res.throughput_per_instance == pytest.approx(
            float(pv.per_instance_throughput(batch, r, tau_g)), rel=0.02
        )
        assert res.idle_ffn > 0.9
    # At r = 8 the barrier costs several percent: the mean-field rule overestimates.
    tau_mf = float(pv.tau_mf(ATTENTION_BOUND, batch, w.theta, 8))
    assert res.throughput_per_instance < 0.95 * float(pv.per_instance_throughput(batch, 8, tau_mf))
    assert res.barrier_overhead == pytest.approx(
        float(pv.barrier_overhead(batch, w.theta, w.nu, 8)), rel=0.25
    )


def test_monte_carlo_barrier_overhead_matches_the_clt_within_half_a_point():
    rs = [1, 2, 4, 8, 12, 16]
    mc = barrier_overhead_mc(GEO, 256, rs, trials=2000, seed=0)
    clt = pv.barrier_overhead(256, GEO.theta, GEO.nu, rs)
    assert mc[0] == 0.0
    np.testing.assert_array_less(np.abs(mc - clt), 0.005)
    assert np.all(np.diff(mc) > 0)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"r": 0}, "r: expected an integer >= 1"),
        ({"requests_per_instance": 10}, "requests per instance: expected an integer >= 64"),
        ({"start": "warm"}, "--start: expected stationary or cold"),
        ({"batches_in_flight": 0}, "batches in flight"),
    ],
)
def test_bad_simulation_inputs(kwargs, needle):
    args = {
        "coef": ATTENTION_BOUND,
        "workload": GEO,
        "r": 2,
        "batch": 32,
        "requests_per_instance": 100,
    }
    with pytest.raises(UserError, match=needle):
        simulate_bundle(**{**args, **kwargs})


def test_every_request_completes_and_cold_start_differs():
    coef = pv.LatencyCoefficients(**pv.PAPER_SECTION_52)
    warm = simulate_bundle(coef, GEO, 2, 16, 200, seed=4)
    cold = simulate_bundle(coef, GEO, 2, 16, 200, seed=4, start="cold")
    assert warm.requests == cold.requests == 400
    assert math.isfinite(warm.t_total) and warm.t_total >= warm.t_stable
    assert warm.throughput_per_instance != cold.throughput_per_instance
