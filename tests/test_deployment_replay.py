"""benchmarks/deployment_replay.py's engine on cases with a known answer: exact FCFS waits at the
prefill pool, step times at full and partial occupancy, a wait for a free decode slot, context
growth, routing to the least-loaded unit."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dr():
    spec = importlib.util.spec_from_file_location("deployment_replay", ROOT / "benchmarks" / "deployment_replay.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["deployment_replay"] = mod
    spec.loader.exec_module(mod)
    return mod


def _model(dr, cap, units=1, base=1000.0, per_req=10.0, per_tok=0.0, knots=(1.0, 1e5)):
    """One stage, one microbatch: base + per_req x n + per_tok x mean context µs (0 when empty)."""
    kn = np.array(knots)
    n = np.arange(cap + 1)[:, None]
    kt = (base + per_req * n + per_tok * kn[None, :]) * (n > 0)
    return dr.DecodeModel(np.zeros(1, np.int64), kt[None], kn, np.zeros(1), np.zeros(1), 1, cap, units)


def _requests(dr, arrival, prompt, output):
    a = np.asarray(arrival, float)
    p = np.asarray(prompt, np.int64)
    return dr.Requests(a, p, p, np.asarray(output, np.int64))


def test_one_server_deterministic_waits_exact(dr):
    a = np.array([0.0, 0.1, 0.2, 1.0])
    start, end = dr.prefill_pool(a, np.full(4, 0.25), 1)
    assert np.allclose(start, [0.0, 0.25, 0.5, 1.0])
    assert np.allclose(end - a, [0.25, 0.4, 0.55, 0.25])
    start2, _ = dr.prefill_pool(a, np.full(4, 0.25), 2)
    assert np.allclose(start2, [0.0, 0.1, 0.25, 1.0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 10), min_size=1, max_size=30), st.lists(st.floats(0.01, 3), min_size=30, max_size=30),
       st.integers(1, 4))
def test_prefill_pool_matches_the_planners_kernel(dr, gaps, service, servers):
    """The heap and `latency.ttft.replay` are two writings of one rule: same waits."""
    from opweave_planner.latency.ttft import replay

    a = np.cumsum(gaps)
    s = np.array(service[: a.size])
    start, _ = dr.prefill_pool(a, s, servers)
    assert np.allclose(start - a, replay(a, s, servers), atol=1e-9)


def test_full_occupancy_tpot_is_the_step_time(dr):
    dm = _model(dr, cap=4)
    rq = _requests(dr, [0, 0, 0, 0], [100] * 4, [5] * 4)
    d = dr.decode_pool(np.zeros(4), rq, dm)
    assert d["tpot_token"].size == 4 * 4 and np.allclose(d["tpot_token"], 1.04e-3)
    assert np.allclose(d["first"], 1.04e-3) and np.allclose(d["join"], 0.0)
    assert d["occupancy"][4] == 16 and d["occupancy"].sum() == 16


def test_partial_occupancy_and_a_wait_for_a_free_slot(dr):
    dm = _model(dr, cap=2)
    rq = _requests(dr, [0, 0, 0], [100] * 3, [2, 4, 1])
    d = dr.decode_pool(np.zeros(3), rq, dm)
    # steps 1-2 hold requests 0 and 1 (1.02 ms each); request 2 joins when request 0 leaves
    assert np.isclose(d["join"][2], 2 * 1.02e-3)
    assert np.isclose(d["first"][2], 3 * 1.02e-3)
    # request 1: tokens at 1.02, 2.04, 3.06 (2 resident), then alone: 3.06 + 1.01
    assert np.allclose(sorted(d["tpot_token"]), sorted([1.02e-3, 1.02e-3, 1.02e-3, 1.01e-3]))
    assert d["step_occupancy"][2] == 3 and d["step_occupancy"][1] == 1


def test_step_time_follows_the_growing_context(dr):
    dm = _model(dr, cap=1, base=0.0, per_req=0.0, per_tok=2.0)
    rq = _requests(dr, [0.5], [100], [3])
    d = dr.decode_pool(np.array([0.5]), rq, dm)
    assert np.isclose(d["first"][0], 0.5 + 200e-6)
    assert np.allclose(d["tpot_token"], [202e-6, 204e-6])


def test_idle_gap_and_least_loaded_routing(dr):
    dm = _model(dr, cap=4, units=2)
    rq = _requests(dr, [0, 0, 5.0], [100] * 3, [2, 2, 2])
    d = dr.decode_pool(np.array([0.0, 0.0, 5.0]), rq, dm)
    # the two first requests go to different units, so both run alone (1.01 ms steps)
    assert np.allclose(d["first"][:2], 1.01e-3) and np.allclose(d["tpot_token"], 1.01e-3)
    # the third arrives at an idle deployment: joins at once
    assert np.isclose(d["join"][2], 5.0) and np.isclose(d["first"][2], 5.0 + 1.01e-3)


def test_whole_replay_ttft_parts(dr):
    dm = _model(dr, cap=8)
    rq = _requests(dr, [0.0, 0.0], [10, 10], [3, 0])  # the second is dropped by the window: not decoded
    r = dr.replay(rq, np.array([0.2, 0.2]), np.array([0.01, 0.01]), 1, dm)
    assert np.allclose(r.ttft_kv, [0.21, 0.41])
    assert np.isclose(r.ttft_token[0], 0.21 + 1.01e-3) and np.isnan(r.ttft_token[1])


def _linear_step(calls=None):
    """1 ms + 1 µs per prefill token + 10 µs per decode (a made-up mixed step, exact in tests)."""

    def step(ctxs, segs):
        if calls is not None:
            calls.append((len(ctxs), list(segs)))
        return 1e-3 + 1e-6 * sum(s[0] for s in segs) + 1e-5 * len(ctxs)

    return step


def test_aggregated_chunked_prompt_then_decode(dr):
    rq = _requests(dr, [0.0], [250], [2])
    d = dr.aggregated_pool(rq.arrival, rq, _linear_step(), units=1, cap=4, chunk=100)
    assert np.isclose(d["first"][0], 1.1e-3 + 1.1e-3 + 1.05e-3)  # chunks of 100, 100, 50 tokens
    assert np.allclose(d["tpot_token"], [1.01e-3])  # the prompt's last step gave the first of its 2 tokens
    assert d["mixed"].tolist() == [True, True, True, False]


def test_aggregated_decode_first_then_the_chunk_budget(dr):
    calls = []
    rq = _requests(dr, [0.0, 1.5e-3], [50, 150], [5, 1])
    dr.aggregated_pool(rq.arrival, rq, _linear_step(calls), units=1, cap=4, chunk=100)
    # step 1: request 0's prompt (50); step 2 (starts 1.05 ms): request 0 decodes alone; step 3
    # (starts 2.06 ms, request 1 arrived at 1.5 ms): one decode, then 99 of request 1's tokens,
    # the rest (51) in step 4 beside the decode
    assert calls[0] == (0, [(50, 0, True)]) and calls[1] == (1, [])
    assert calls[2] == (1, [(99, 0, False)]) and calls[3] == (1, [(51, 99, True)])


def test_aggregated_slot_cap_holds_a_prompt_back(dr):
    calls = []
    rq = _requests(dr, [0.0, 0.0], [10, 10], [3, 1])
    d = dr.aggregated_pool(rq.arrival, rq, _linear_step(calls), units=1, cap=1, chunk=100)
    # one slot: request 1 starts its prompt only after request 0 decoded the last 2 of its 3 tokens
    assert calls[0] == (0, [(10, 0, True)]) and [c[0] for c in calls[1:3]] == [1, 1]
    assert calls[3] == (0, [(10, 0, True)])
    assert np.isclose(d["first"][1], 4 * 1.01e-3)


def test_aggregated_round_robin(dr):
    calls = []
    rq = _requests(dr, [0.0, 0.0, 0.0], [10, 10, 10], [1, 1, 1])
    d = dr.aggregated_pool(rq.arrival, rq, _linear_step(calls), units=2, cap=4, chunk=100, round_robin=True)
    # requests 0 and 2 share replica 0 (one step of 20 prompt tokens), request 1 is alone on replica 1
    assert np.allclose(d["first"], [1.02e-3, 1.01e-3, 1.02e-3])


from opweave_planner.deployment import open_occupancy  # noqa: E402  (the planner's rule the benchmark imports)


class _FakeAt:
    """An evaluator stand-in: at occupancy n every period is (1 + n / 100) ms."""

    def __call__(self, n):
        t = 1e-3 * (1 + n / 100)
        return np.full(4, t), t


def test_open_prediction_solves_littles_law():
    # N = rate x mean output x TPOT(N) = 100 x 100 x 1e-3 (1 + N / 100) = 10 + N / 10: N = 100 / 9
    n, p95 = open_occupancy(_FakeAt(), np.arange(1, 65), 100.0, 100.0, 64)
    assert np.isclose(n, 100 / 9, rtol=1e-6)
    # the p95 of the token-weighted occupancy n Poisson(n; N) / N, read off the same law
    g = np.arange(1, 64)
    w = np.exp(g * math.log(n) - n - np.array([math.lgamma(x + 1.0) for x in g])) * g
    c = np.cumsum(w) / w.sum()
    assert np.isclose(p95, 1e-3 * (1 + g[np.searchsorted(c, 0.95)] / 100))


def test_open_prediction_saturates_at_the_slots():
    n, p95 = open_occupancy(_FakeAt(), np.arange(1, 9), 1000.0, 100.0, 8)
    assert n == 8 and np.isclose(p95, 1.08e-3)
