"""Arrivals (workload/arrivals.py) and the prefill pool's TTFT (latency/ttft.py): the replay
kernel against a plain-Python twin, against queueing theory (M/M/1, M/D/1, M/M/4), and on the
shipped traces' timestamps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from opweave_planner.errors import UserError
from opweave_planner.latency.ttft import mgc, replay, service_times, ttft_stats
from opweave_planner.workload.arrivals import from_trace, poisson

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"


def _twin(arrivals, service, servers):
    free = [0.0] * servers
    out = []
    for a, s in zip(arrivals, service, strict=True):
        j = min(range(servers), key=lambda k: (free[k], k))
        start = max(a, free[j])
        out.append(start - a)
        free[j] = start + s
    return np.array(out)


def test_replay_matches_its_plain_python_twin_and_is_deterministic():
    rng = np.random.default_rng(3)
    a = np.cumsum(rng.exponential(1.0, 500))
    s = rng.gamma(2.0, 1.2, 500)
    for c in (1, 2, 3):
        w = replay(a, s, c)
        np.testing.assert_allclose(w, _twin(a, s, c), rtol=0, atol=1e-12)
        assert np.array_equal(w, replay(a, s, c))
    assert np.all(replay(a, s, 3) <= replay(a, s, 2) + 1e-12)


@pytest.mark.parametrize("c, scv, rho", [(1, 1.0, 0.7), (1, 0.0, 0.8), (4, 1.0, 0.8)])
def test_replay_agrees_with_queueing_theory(c, scv, rho):
    """Poisson arrivals, exponential (scv 1) or deterministic (scv 0) service: the replay's mean
    wait and p95 wait within 6 % of the exact M/M/1, M/D/1 (Pollaczek-Khinchine) and M/M/4
    figures, which Allen-Cunneen reproduces."""
    n, mean_s = 400_000, 0.2
    rate = rho * c / mean_s
    arr = poisson(rate, n, 1000, seed=11)
    rng = np.random.default_rng(12)
    service = rng.exponential(mean_s, n) if scv else np.full(n, mean_s)
    w = replay(arr.times_s, service, c)[n // 10:]  # past the empty start
    fig = mgc(rate, mean_s, scv, c)
    if c == 1 and scv == 1.0:
        assert fig.wait_mean_s == pytest.approx(rho * mean_s / (1 - rho))
    if c == 1 and scv == 0.0:
        assert fig.wait_mean_s == pytest.approx(rho * mean_s / (2 * (1 - rho)))
    assert w.mean() == pytest.approx(fig.wait_mean_s, rel=0.06)
    if scv == 1.0:  # the exponential tail is exact for M/M/c
        assert np.percentile(w, 95) == pytest.approx(fig.wait_quantile_s, rel=0.06)
    assert mgc(rate * 2, mean_s, scv, c).wait_mean_s == float("inf")


def test_poisson_arrivals_are_seeded():
    a, b = poisson(5.0, 20_000, [100, 200], seed=1), poisson(5.0, 20_000, [100, 200], seed=1)
    assert np.array_equal(a.times_s, b.times_s) and np.array_equal(a.prompts, b.prompts)
    assert a.rate == pytest.approx(5.0, rel=0.03) and set(a.prompts.tolist()) == {100, 200}
    assert not np.array_equal(a.times_s, poisson(5.0, 20_000, 100, seed=2).times_s)
    with pytest.raises(UserError, match="--request-rate"):
        poisson(0.0, 10, 100)


@pytest.mark.parametrize("name", ["mooncake-conversation-sample.jsonl", "azure-conv-sample.csv"])
def test_trace_timestamps_with_rate_scale(name):
    arr = from_trace(TRACES / name)
    assert arr.times_s[0] == 0 and np.all(np.diff(arr.times_s) >= 0) and arr.times_s[-1] > 0
    assert np.all(arr.prompts > 0)
    fast = from_trace(TRACES / name, rate_scale=2.0)
    np.testing.assert_allclose(fast.times_s, arr.times_s / 2)
    assert fast.rate == pytest.approx(2 * arr.rate)


def test_trace_errors_are_one_line(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": "x", "input_length": 3}\n')
    with pytest.raises(UserError, match=r"t.jsonl:1: expected"):
        from_trace(bad)
    csvf = tmp_path / "t.csv"
    csvf.write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="TIMESTAMP and ContextTokens"):
        from_trace(csvf)
    with pytest.raises(UserError, match="--rate-scale"):
        from_trace(TRACES / "azure-conv-sample.csv", rate_scale=-1)


def test_ttft_through_prefill_servers_on_a_trace():
    """Mooncake's timestamps through H100 TP 1 servers of llama-3.1-8b (one-pass prefill per
    request): more servers never raise TTFT, and TTFT is at least the request's own prefill."""
    from opweave_planner.inputs.hardware import load_hardware
    from opweave_planner.inputs.model import load_model
    from opweave_planner.latency.prefill import prefill
    from opweave_planner.structure.operators import build_sequence

    seq, g = build_sequence(load_model("llama-3.1-8b")), load_hardware().resolve("h100")
    arr = from_trace(TRACES / "mooncake-conversation-sample.jsonl", rate_scale=4.0)
    lengths = np.minimum(-(-arr.prompts // 1024) * 1024, 32768)  # a few distinct prefills
    service = service_times(lengths, lambda n: prefill(seq, g, 1, n, 1, 0).prefill_ms / 1e3)
    stats = [ttft_stats(arr.times_s, service, c, percentile=95) for c in (1, 2, 4)]
    assert stats[0].percentile_s >= stats[1].percentile_s >= stats[2].percentile_s
    assert stats[2].mean_s >= service.mean() and stats[2].utilisation < stats[0].utilisation


def test_bad_arrival_inputs_are_refused_before_the_kernel(tmp_path):
    with pytest.raises(ValueError, match="equal, non-empty"):
        ttft_stats(np.array([0.0, 1.0, 2.0]), np.array([0.1, 0.1]), 1)
    with pytest.raises(ValueError, match="equal, non-empty"):
        ttft_stats(np.array([]), np.array([]), 1)
    bad = tmp_path / "t.jsonl"
    bad.write_bytes(b"\xff\xfe{}")
    with pytest.raises(UserError, match="not UTF-8"):
        from_trace(bad)
    with pytest.raises(UserError, match="folder"):
        from_trace(tmp_path)
