"""Preemption episodes (issue 29): the up-crossing law of a replica's summed KV against a brute-force
enumeration of the slots' Markov chain and a Monte Carlo run of it, the reserve it sets, and the plan
record of it."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from opweave_planner import api
from opweave_planner.plan import plan_version
from opweave_planner.workload.edge import workload_spec
from opweave_planner.workload.kv import kv_bytes, kv_events, kv_sum_bounds
from opweave_planner.workload.shaping import materialize, request_ends

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"
ROWS = [(3, 2), (5, 1), (2, 4), (6, 3), (4, 1)]  # (prompt, output) of a tiny trace


def _tiny(tmp_path):
    path = tmp_path / "tiny.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:46.{i:07d},{p},{d}\n" for i, (p, d) in enumerate(ROWS)))
    return materialize(workload_spec(None, str(path)))


def _pair_law() -> dict[tuple[int, int], float]:
    """One slot's (context now, context next step) in stationarity, enumerated from the chain."""
    pair: dict[tuple[int, int], float] = {}
    total = sum(d for _, d in ROWS)
    for p, d in ROWS:
        for a in range(d):
            nxt = [(p + a + 1, 1.0)] if a < d - 1 else [(q, 1.0 / len(ROWS)) for q, _ in ROWS]
            for c1, w in nxt:
                pair[(p + a, c1)] = pair.get((p + a, c1), 0.0) + w / total
    return pair


@pytest.mark.parametrize("n", [1, 2, 3])
def test_up_crossings_match_the_enumerated_chain(tmp_path, n):
    wl = _tiny(tmp_path)
    ev = kv_events(wl, n)
    assert ev.step == 1.0  # a tiny law is binned per token: the formula is exact there
    nu: dict[int, float] = {}
    for combo in itertools.product(_pair_law().items(), repeat=n):
        pr = float(np.prod([w for _, w in combo]))
        s0, s1 = sum(c[0] for c, _ in combo), sum(c[1] for c, _ in combo)
        for cap in range(s0, s1):
            nu[cap] = nu.get(cap, 0.0) + pr
    base = n * min(p for p, _ in ROWS)
    for cap in range(base, 12 * n):
        assert ev.per_step(cap) == pytest.approx(nu.get(cap, 0.0), abs=1e-12), cap
        assert ev.per_request(cap) == pytest.approx(nu.get(cap, 0.0) * wl.mean_output / n, abs=1e-12)


MIX = dict(per_token=1.0, windows=((4, 2.0),))  # x(c) = c + 2 min(c, 4): integers, one bin each


@pytest.mark.parametrize("n", [1, 2, 3])
def test_up_crossings_of_a_window_mix_match_the_enumerated_chain(tmp_path, n):
    """Sliding-window layers hold min(c, window): a slot below the window grows by 3, past it by 1."""
    wl = _tiny(tmp_path)
    ev = kv_events(wl, n, **MIX)
    assert ev.step == 1.0

    def x(c):
        return float(kv_bytes(c, **MIX))

    nu: dict[int, float] = {}
    above: dict[int, float] = {}
    for combo in itertools.product(_pair_law().items(), repeat=n):
        pr = float(np.prod([w for _, w in combo]))
        s0, s1 = sum(x(c[0]) for c, _ in combo), sum(x(c[1]) for c, _ in combo)
        for cap in range(int(s0), int(s1)):
            nu[cap] = nu.get(cap, 0.0) + pr
        above[int(s0)] = above.get(int(s0), 0.0) + pr
    base = n * x(min(p for p, _ in ROWS))
    assert ev.base == base
    tops = sorted(above)
    for cap in range(int(base), 30 * n):
        assert ev.per_step(cap) == pytest.approx(nu.get(cap, 0.0), abs=1e-12), cap
        assert ev.share_above(cap) == pytest.approx(sum(above[t] for t in tops if t > cap), abs=1e-12), cap


def test_up_crossings_match_a_monte_carlo_run_of_a_clipped_law():
    """A law with --max-model-len clip: its request ends come from the law, not a trace."""
    wl = materialize(workload_spec(None, "lognormal:mean=40,cv=0.8;out=geometric:mean=12", max_model_len=96))
    arrive, last = request_ends(wl)
    rng = np.random.default_rng(7)
    n, steps = 4, 400_000
    # the chain itself: draw requests from the arrival law of (P, D), clip at the limit
    spec = wl.spec
    wp, wd = spec.prompt.pmf(0, 96), spec.output.pmf(1, 97)
    pool = 200_000
    p_all = rng.choice(wp.size, pool, p=wp / wp.sum())
    d_all = rng.choice(wd.size, pool, p=wd / wd.sum())
    keep = p_all < 96
    p_all, d_all = p_all[keep], np.minimum(d_all[keep], 96 - p_all[keep])
    assert np.allclose(np.bincount(p_all, minlength=arrive.size)[: arrive.size] / p_all.size, arrive, atol=3e-3)
    assert np.allclose(np.bincount(p_all + d_all - 1, minlength=last.size)[: last.size] / p_all.size, last,
                       atol=3e-3)
    idx = rng.choice(p_all.size, n, p=d_all / d_all.sum())
    p, d = p_all[idx].copy(), d_all[idx].copy()
    age = (rng.random(n) * d).astype(np.int64)
    caps = np.array([int(x) for x in kv_sum_bounds(wl, n, 0.5, 1.0)] + [int(kv_sum_bounds(wl, n, 0.99, 1.0)[1])])
    ups = np.zeros(caps.size)
    draws = rng.integers(0, p_all.size, steps * n)
    used = 0
    s_prev = int((p + age).sum())
    for _ in range(steps):
        age += 1
        done = age >= d
        k = int(done.sum())
        if k:
            j = draws[used:used + k]
            used += k
            p[done], d[done], age[done] = p_all[j], d_all[j], 0
        s = int((p + age).sum())
        ups += (s_prev <= caps) & (caps < s)
        s_prev = s
    ev = kv_events(wl, n)
    for cap, count in zip(caps, ups, strict=True):
        pred = ev.per_step(cap) * steps
        assert abs(count - pred) <= 5 * np.sqrt(pred) + 5, (cap, count, pred)


def test_a_looser_target_never_reserves_more():
    wl = materialize(workload_spec(None, str(TRACES / "azure-conv-sample.csv"), scale_ctx="8k"))
    for n in (1, 16, 128):
        ev = kv_events(wl, n)
        reserves = [ev.reserve(t) for t in (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)]
        assert reserves == sorted(reserves, reverse=True)
        for t, r in zip((1e-6, 1e-4, 1e-2), reserves[::2], strict=True):
            assert ev.per_request(r) <= t and ev.per_request(r + ev.step * 3) <= t


def test_a_larger_preemption_target_never_raises_cost_and_the_plan_says_so(tmp_path):
    small = dict(model="llama-3.1-8b", gpus="h100", batches="8,16,32,64", max_replicas=2, max_owners=1,
                 tensor_parallel_sizes="1", slo="30ms", workload=str(TRACES / "azure-conv-sample.csv"),
                 scale_ctx="8k")
    plans = [api.plan(api.make_request(**small, preemptions_per_request=t)).plan for t in (1e-6, 1e-4, 1e-2)]
    costs = [p.usd_per_million_tokens for p in plans]
    assert costs == sorted(costs, reverse=True), costs
    for p, t in zip(plans, (1e-6, 1e-4, 1e-2), strict=True):
        assert p.schema_version == "1.9" and plan_version(p.model_copy(update={"binding": None})) == "1.8"
        assert p.workload.distribution.preemptions_per_request == t
        for o in p.owners:
            e = o.kv_events
            assert e.per_request_at_reserve <= t * (1 + 1e-9)
            assert e.per_request_at_usable <= e.per_request_at_reserve or e.per_request_at_usable <= t
            assert e.share_above_usable <= e.share_above_reserve <= 1 - 0.999 + 1e-12
    from conftest import run_cli

    from opweave_planner.plan import plan_bytes
    from opweave_planner.report import summary_lines

    assert any("forced preemptions per request at the usable memory" in line for line in summary_lines(plans[1]))
    path = tmp_path / "plan.json"
    path.write_bytes(plan_bytes(plans[1]))
    ran = run_cli("simulate", path)
    assert ran.code == 0 and "KV overflow:" in ran.out and "at the usable memory" in ran.out, ran.out


def test_the_target_is_checked_at_the_edge():
    from opweave_planner.errors import UserError

    for bad in (0, 1, -1e-4, "x", True):
        with pytest.raises(UserError, match="--preemptions-per-request"):
            api.make_request("llama-3.1-8b", "30ms", None, workload=str(TRACES / "azure-conv-sample.csv"),
                             preemptions_per_request=bad)
