"""Sliding-window layers reserved at min(context, window) (issue 29, item 3): the reserve of a mix of
full and window KV against an enumeration of the slots' chain, the one-class event bound against the
exact split law, and a gemma-3-27b workload plan whose owner's reserve is its own mix's, below the
old accounting (every window layer at its full window per request)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_search_exact import SETTINGS, assert_kernel_matches, brute_force
from test_search_workload_exact import workload_instances, workload_problem

from opweave_planner import api
from opweave_planner.compile.compiled import compile_request
from opweave_planner.compile.problem import memory_need, typed
from opweave_planner.compile.tables import owner_mixes, owner_sum
from opweave_planner.compile.traffic import EVENT_GRID, FULL, KV_SUM_GRID, KvReserve
from opweave_planner.workload.edge import trace_workload, workload_spec
from opweave_planner.workload.kv import kv_bytes, kv_events, kv_sum_bounds, kv_sum_quantile
from opweave_planner.workload.shaping import materialize

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"
AZURE = str(TRACES / "azure-conv-sample.csv")
ROWS = [(3, 2), (5, 1), (2, 4), (6, 3), (4, 1)]  # (prompt, output) of a tiny trace
MIX = (1.0, ((4, 2.0),))  # x(c) = c + 2 min(c, 4): integer values, binned one per unit


def _tiny(tmp_path):
    path = tmp_path / "tiny.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:46.{i:07d},{p},{d}\n" for i, (p, d) in enumerate(ROWS)))
    return materialize(workload_spec(None, str(path)))


def _chain(n: int):
    """(up-crossings per step by capacity, law of the summed value) of n slots, enumerated."""
    total = sum(d for _, d in ROWS)
    pair: dict[tuple[int, int], float] = {}
    for p, d in ROWS:
        for a in range(d):
            nxt = [(p + a + 1, 1.0)] if a < d - 1 else [(q, 1.0 / len(ROWS)) for q, _ in ROWS]
            for c1, w in nxt:
                pair[(p + a, c1)] = pair.get((p + a, c1), 0.0) + w / total
    x = {c: int(kv_bytes(c, *MIX)) for c in range(20)}
    nu: dict[int, float] = {}
    law: dict[int, float] = {}
    for combo in itertools.product(pair.items(), repeat=n):
        pr = math.prod(w for _, w in combo)
        s0, s1 = sum(x[c[0]] for c, _ in combo), sum(x[c[1]] for c, _ in combo)
        for cap in range(s0, s1):
            nu[cap] = nu.get(cap, 0.0) + pr
        law[s0] = law.get(s0, 0.0) + pr
    return nu, law


@pytest.mark.parametrize(("q", "eps"), [(0.9, 0.02), (0.5, 0.2), (0.99, 1e-3)])
def test_reserve_of_a_window_mix_is_the_enumerated_chains(tmp_path, q, eps):
    wl = _tiny(tmp_path)
    res = KvReserve(workload=wl, counts=(1, 2, 3), top=3, kv_quantile=q, preemptions_per_request=eps)
    units = res.units(MIX)
    e_d = wl.mean_output
    for n in (1, 2, 3):
        nu, law = _chain(n)
        bad = [cap for cap, v in nu.items() if e_d / n * v > eps * (1 + 1e-9)]
        c_eps = max(bad) + 1 if bad else n * int(kv_bytes(2, *MIX))
        vals = sorted(law)
        cdf = np.cumsum([law[v] for v in vals])
        c_q = vals[int(np.searchsorted(cdf, q - 1e-12))]
        floor = kv_bytes(wl.max_context, *MIX) + (n - 1) * kv_bytes(wl.min_context, *MIX)
        lo, hi = kv_sum_bounds(wl, n, q, *MIX, grid=KV_SUM_GRID)
        assert lo <= c_q <= hi  # the quantile's grid brackets the enumerated one
        assert units[n] == max(c_eps, hi, float(floor)), (n, c_eps, c_q, hi, floor)
        # a window layer at min(c, window): at most what the window-at-full accounting reserves
        assert units[n] <= 3 * res.units(FULL)[n]


@pytest.mark.parametrize("n", [1, 4, 16, 64])
def test_the_one_class_event_law_bounds_the_split_one(n):
    wl = trace_workload(AZURE)  # theta 1.2k: a fifth of the stationary mass below gemma's 1,024 window
    mix = (0.161290322581, ((1024, 0.838709677419),))
    exact, bound = kv_events(wl, n, EVENT_GRID, *mix), kv_events(wl, n, EVENT_GRID, *mix, exact=False)
    assert exact.step == bound.step and exact.base == bound.base
    assert (bound.nu_up >= exact.nu_up - 1e-15).all()
    for eps in (1e-5, 1e-4, 1e-3):
        assert exact.reserve(eps) <= bound.reserve(eps) <= exact.reserve(eps) * 1.02



@pytest.mark.parametrize(("n", "exact"), [(3, True), (8, True), (300, False), (700, False)])
def test_the_reserves_fast_arithmetic_is_the_same_law(n, exact):
    """fast=True (the reserve's squarings and blend) against the arithmetic plans record with: the same
    grid, crossings within rounding of the far tail, the same reserve at every target; 300 and 700
    take the squarings (exponents past 100), 3 and 8 the exact split's blend."""
    wl = trace_workload(AZURE)
    mix = (0.161290322581, ((1024, 0.838709677419),))
    slow = kv_events(wl, n, EVENT_GRID, *mix, exact=exact)
    fast = kv_events(wl, n, EVENT_GRID, *mix, exact=exact, fast=True)
    assert fast is not slow and (fast.base, fast.step, fast.split_terms) == (slow.base, slow.step, slow.split_terms)
    assert np.abs(fast.nu_up - slow.nu_up).max() <= 1e-13
    assert np.array_equal(fast.above, slow.above)  # made with numpy's own power in both
    for eps in (1e-6, 1e-5, 1e-4, 1e-3):
        assert fast.reserve(eps) == slow.reserve(eps)


def test_power_is_numpys_below_100_and_within_rounding_past_it():
    from opweave_planner.workload.kv import _power

    rng = np.random.default_rng(7)
    z = rng.uniform(-1, 1, 4096) + 1j * rng.uniform(-1, 1, 4096)
    z /= np.maximum(1.0, np.abs(z))  # |z| <= 1, as a law's transform
    for n in (0, 1, 2, 3, 7, 64, 99):
        assert np.array_equal(_power(z, n), z**n)
    for n in (100, 101, 257, 1024):
        assert np.allclose(_power(z, n), z**n, rtol=1e-11, atol=1e-300)

GEMMA = dict(model="gemma-3-27b", slo="60ms", gpus="h100", workload=AZURE, policy="colocated",
             tensor_parallel_sizes=(4,), batches=(16, 32, 64), max_replicas=1)


def test_a_gemma_plan_reserves_its_owners_window_mix_below_the_old_accounting():
    req = api.make_request(**GEMMA)
    plan = api.plan(req).plan
    ctx = compile_request(req)
    (owner,) = plan.owners
    tmpl = next(t for t in ctx.templates if t.k == 1)
    prob = ctx.problem(tmpl)
    c = next(i for i, cf in enumerate(ctx.tables.configs) if cf.gpu.id == owner.gpu and cf.parallel.tp == 4)
    n = owner.resident_batch
    mix = owner_mixes(ctx.tables, prob.stage_owner, prob.stage_start, prob.stage_end, 0)[c]
    assert mix != FULL
    per_unit = float(owner_sum(ctx.tables.per_config.kvpref, prob.stage_owner, prob.stage_start,
                               prob.stage_end, 0)[c])
    (window, window_bytes), = [(w, float(owner_sum(p, prob.stage_owner, prob.stage_start, prob.stage_end, 0)[c]))
                               for w, p in ctx.tables.kv_windows]
    wl = ctx.workload
    reserve = float(prob.kv_units[0, c, n])
    # the reserve is the mix's own: its quantile, its (exact) event law, its floor
    want = max(kv_sum_bounds(wl, n, req.kv_quantile, *mix, grid=KV_SUM_GRID)[1],
               kv_events(wl, n, EVENT_GRID, *mix).reserve(req.preemptions_per_request),
               float(kv_bytes(wl.max_context, *mix) + (n - 1) * kv_bytes(wl.min_context, *mix)))
    assert want <= reserve <= want * 1.01
    # in bytes, the quantile floor agrees with a Monte Carlo of the summed min(c, window) bytes
    per_token, windows = per_unit - window_bytes, [(window, window_bytes)]
    mc = kv_sum_quantile(wl, n, req.kv_quantile, per_token, windows, method="mc", samples=100_000, seed=3)
    tail = kv_sum_bounds(wl, n, req.kv_quantile, per_token, windows, grid=KV_SUM_GRID)[1]
    assert abs(mc / tail - 1) < 0.01
    # below the accounting of every window layer at min(window, longest context) per request
    old = float(ctx.tables.traffic.units[n]) * per_token + n * window_bytes * min(window, wl.max_context)
    assert reserve * per_unit < old
    need = float(plan.owners[0].memory_bytes_per_gpu)
    assert need == pytest.approx(float(ctx.tables.per_config.wpref[c, -1]) + reserve * per_unit
                                 + n * float(ctx.tables.per_config.kvcpref[c, -1]) + owner.microbatch
                                 * float(ctx.tables.per_config.cfg_ws[c]), rel=1e-6)


def test_loosening_the_targets_of_a_window_plan_never_raises_cost():
    costs = [api.plan(api.make_request(**GEMMA, preemptions_per_request=t)).plan.usd_per_million_tokens
             for t in (1e-6, 1e-4, 1e-2)]
    assert costs == sorted(costs, reverse=True), costs
    costs = [api.plan(api.make_request(**GEMMA, kv_quantile=q)).plan.usd_per_million_tokens
             for q in (0.9999, 0.999, 0.99)]
    assert costs == sorted(costs, reverse=True), costs


@settings(max_examples=100, **SETTINGS)
@given(workload_instances(), st.data())
def test_kernel_equals_brute_force_with_a_reserve_row_per_owner_and_config(inst, data):
    """Owners of one template hold different mixes of window and full layers, so each (owner,
    config) reads its own reserve row: the kernel's memory check (points) and the evaluator's
    (brute force) read the same one."""
    p = typed(workload_problem(inst))
    k, c_n, _ = p.kv_units.shape
    scale = np.array([[data.draw(st.integers(0, 4)) / 4 for _ in range(c_n)] for _ in range(k)])
    p = p._replace(kv_units=p.kv_units * scale[:, :, None])
    best, feasible = brute_force(inst, problem=p)
    event("infeasible" if best is None else "feasible")
    assert_kernel_matches(inst, best, feasible, problem=p)


def test_a_window_models_memory_caps_read_the_whole_model_replicas_own_mix():
    """A workload's memory caps (compile/space.py) are the largest batches whose need fits with the
    one-stage owner's own reserve row (KvReserve.at in its window mix, brute force over every b),
    the one-stage problem carries that row at each cap, and full-attention units would put the caps
    elsewhere (TP1: the memory binds below the grid's top)."""
    req = api.make_request(**{**GEMMA, "tensor_parallel_sizes": (1,)})
    ctx = compile_request(req)
    tmpl = next(t for t in ctx.templates if ctx.stage_plan(t).n_stages == 1)
    prob, t = ctx.problem(tmpl), ctx.tables
    res, cf, top = t.colocated_reserve, t.colocated_configs, max(req.batches)
    searched = {int(b) for b in prob.batches}
    mixes = owner_mixes(t, prob.stage_owner, prob.stage_start, prob.stage_end, 0)
    moved = 0
    for c, mix in enumerate(mixes):
        assert mix != FULL

        def largest(mu, row, c=c):
            return next((b for b in range(top // mu, 0, -1) if memory_need(
                row, cf.wpref[c, -1], cf.kvpref[c, -1], cf.kvcpref[c, -1], cf.cfg_ws[c], mu, b) <= cf.cfg_mem[c]), 0)

        for mu in range(1, req.max_microbatches + 1):
            b = largest(mu, res.row(mix))
            if b:
                assert mu * b in searched
                assert float(prob.kv_units[0, c, mu * b]) == res.at(mu * b, mix)
            moved += largest(mu, res.row(FULL)) != b
    assert moved


def _fresh_reserve(res: KvReserve, mix, n: int) -> float:
    """The reserve of n residents in `mix` with nothing cached (every cache of the laws cleared), by the
    rule written out: the quantile bound; the one-class event law, and the exact split one where that
    exceeds the bound and the split takes 2..EVENT_SPLIT_TERMS terms; the floor."""
    from opweave_planner.compile.traffic import EVENT_SPLIT_TERMS
    from opweave_planner.workload import kv

    for cached in (kv._kv_events, kv._binning, kv._bins, kv._end_sums, kv._kv_sum_bounds):
        cached.cache_clear()
    wl, target = res.workload, res.preemptions_per_request
    if mix[1] and max(w for w, _ in mix[1]) <= wl.min_context:
        return mix[0] * _fresh_reserve(res, FULL, n) + n * sum(w * b for w, b in mix[1])
    tail = kv_sum_bounds(wl, n, res.kv_quantile, *mix, grid=KV_SUM_GRID)[1]
    bound = kv_events(wl, n, EVENT_GRID, *mix, exact=False, fast=True)
    events = bound.reserve(target)
    if events > tail and 1 < bound.split_terms <= EVENT_SPLIT_TERMS:
        events = kv_events(wl, n, EVENT_GRID, *mix, fast=True).reserve(target)
    return max(tail, events, float(kv_bytes(wl.max_context, *mix) + (n - 1) * kv_bytes(wl.min_context, *mix)))


@pytest.mark.parametrize("model", ["gemma-3-27b", "llama-3.1-8b"])
def test_every_owners_rows_are_its_mixs_reserve_at_every_count_it_reads(model):
    """Stages.kv_units against the reserve computed afresh: every owner of a two-owner template at the
    grid's counts and the one-stage owner at its own (grid and caps), full attention included (the
    shared Traffic.units holds the grid's counts only: a one-stage row read from it fails here at the
    caps' counts of llama, whose layers are all full attention)."""
    req = api.make_request(**{**GEMMA, "model": model, "policy": "opweave", "max_owners": 2})
    ctx = compile_request(req)
    one = next(t for t in ctx.templates if ctx.stage_plan(t).n_stages == 1)
    two = next(t for t in ctx.templates if t.k == 2 and ctx.stage_plan(t).n_stages > 1)
    assert set(ctx.tables.colocated_reserve.counts) - set(ctx.tables.reserve.counts)  # the caps' own counts
    seen = set()
    for tmpl, res in ((one, ctx.tables.colocated_reserve), (two, ctx.tables.reserve)):
        prob = ctx.problem(tmpl)
        for o in range(tmpl.k):
            mixes = owner_mixes(ctx.tables, prob.stage_owner, prob.stage_start, prob.stage_end, o)
            for c, mix in enumerate(mixes):
                for n in res.counts:
                    if (mix, n) not in seen:  # a fresh reserve once per (mix, count)
                        seen.add((mix, n))
                        assert float(prob.kv_units[o, c, n]) == _fresh_reserve(res, mix, n), (tmpl, o, c, n)
                    assert float(prob.kv_units[o, c, n]) == res.at(n, mix)


def test_the_exact_laws_binning_shares_the_one_class_ones_bins_bit_for_bit():
    """`_binning` of the exact split law after the one-class one (sharing `_bins`) is the one made alone."""
    from opweave_planner.workload import kv

    wl = trace_workload(AZURE)
    mix = (0.161290322581, ((1024, 0.838709677419),))
    for grid in (65536, 8192):
        kv._bins.cache_clear()
        kv._binning.cache_clear()
        alone = kv._binning(wl, *mix, grid, True)
        kv._bins.cache_clear()
        kv._binning.cache_clear()
        kv._binning(wl, *mix, grid, False)
        shared = kv._binning(wl, *mix, grid, True)
        assert shared[-1] and len(shared) == len(alone)
        for a, b in zip(shared, alone, strict=True):
            assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b


@pytest.mark.parametrize("mix", [FULL, (0.2, ((1024, 0.8),))])
@pytest.mark.parametrize("q", [0.5, 0.99, 0.999999])
def test_the_moment_bound_is_below_the_convolution_bound_at_every_count(mix, q):
    """KvReserve.cheap (Cantelli, two moments) never exceeds KvReserve.below (the convolution) nor the
    reserve itself: the batch caps reject a probe on it without changing which batch fits."""
    wl = trace_workload(AZURE)
    res = KvReserve(workload=wl, counts=(1,), top=1024, kv_quantile=q, preemptions_per_request=1e-4)
    gaps = []
    for n in (1, 2, 3, 7, 16, 100, 333, 1024):
        cheap, below = res.cheap(n, mix), res.below(n, mix)
        assert cheap <= below, (n, cheap, below)
        gaps.append(cheap / below)
        assert res.cheap(n, mix) <= res.at(n, mix) and res.cheap(n, mix) == res.at(n, mix)  # a known count: itself
    assert max(gaps) > 0.9  # and not vacuous: within 10 % of the convolution at large counts
