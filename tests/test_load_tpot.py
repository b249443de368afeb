"""Prefill-time refinement against every length's own time, and the deployment's TPOT at its load."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opweave_planner import api
from opweave_planner.deployment import (
    KNOT_TOL,
    KNOTS,
    AtOccupancy,
    _times,
    full_p95_ms,
    load_grid,
    open_occupancy,
)

SMALL = dict(model="llama-3.1-8b", slo="60ms", gpus="h100", policy="colocated", max_owners=1)


@settings(max_examples=40, deadline=None)
@given(st.integers(200, 3000), st.integers(1, 10_000), st.floats(1e-3, 0.5), st.integers(0, 5000))
def test_a_linear_time_with_one_jump_is_interpolated_exactly(n, at, jump, chunk):
    """Piecewise linear with one step (a chunk boundary or a table's jump): the refinement finds
    the step's two neighbours, so every length's time is exact."""
    lengths = np.unique(np.random.default_rng(n).integers(1, 12_000, n))
    one = lambda p: (1e-3 + 2e-6 * p + jump * (p >= at), 1e-4 * p, 0.5)
    got = _times(lengths, one, chunk)
    want = np.array([one(int(p)) for p in lengths])
    for k in range(3):
        np.testing.assert_allclose(got[k], want[:, k], rtol=1e-12, atol=1e-15)


def test_prefill_times_are_within_their_bound_of_every_lengths_own():
    """The real prefill model (steps at every 8,192-token chunk on h100, table jumps): a sampled
    set of lengths crossing two chunk boundaries, refined against exact; bound from the midpoint
    rule's tolerance (a missed jump between accepted midpoints can exceed it locally)."""
    from opweave_planner.inputs.hardware import load_hardware  # noqa: F401  (resolves the catalog)
    from opweave_planner.inputs.model import load_model
    from opweave_planner.latency.prefill import default_chunk_tokens, prefill
    from opweave_planner.structure.operators import build_sequence

    hw = api.gpu_catalog()
    gpu = hw.resolve("h100")
    seq = build_sequence(load_model("llama-3.1-8b"))
    lengths = np.unique(np.random.default_rng(7).integers(1, 20_000, 240))
    assert lengths.size > KNOTS
    one = lambda p: (lambda e: (e.prefill_ms, e.handoff_ms, e.measured_share))(prefill(seq, gpu, 1, p))
    calls = []
    counted = lambda p: calls.append(p) or one(p)
    got = _times(lengths, counted, default_chunk_tokens(gpu))
    exact = np.array([one(int(p))[0] for p in lengths])
    rel = np.abs(got[0] / exact - 1)
    assert rel.mean() < KNOT_TOL and rel.max() < 0.05, (rel.mean(), rel.max())
    assert len(calls) < lengths.size  # cheaper than every length
    chunk = default_chunk_tokens(gpu)
    edge = np.nonzero(np.diff((lengths - 1) // chunk))[0]
    np.testing.assert_allclose(got[0][edge], exact[edge], rtol=1e-12)
    np.testing.assert_allclose(got[0][edge + 1], exact[edge + 1], rtol=1e-12)


TRACE = "examples/traces/azure-conv-sample.csv"


@pytest.fixture(scope="module", params=["ctx", "trace"])
def plan_and_at(request):
    from opweave_planner.compile import compile_request
    from opweave_planner.contract import plan_context

    if request.param == "ctx":
        req = api.make_request(**SMALL, batches="32", ctx="2k", prompt_len="1k", output_len="256", ttft="1s",
                               request_rate=4, deployment_mode="disaggregated")
    else:
        req = api.make_request(**SMALL, batches="48", workload=TRACE, ttft="1s", arrivals="trace", rate_scale=40,
                               deployment_mode="disaggregated")
    doc = api.plan(req).plan
    ctx, tmpl, sel = plan_context(doc, where="test")
    cap = doc.owners[0].microbatch
    per = sel.mu * int(sel.replicas[0])
    every = ctx.request.model_copy(update={"batches": tuple(n * per for n in range(1, cap + 1))})
    return doc, AtOccupancy(compile_request(every, ctx.hw, ctx.seq.model), tmpl, sel), cap


def test_the_recorded_load_tpot_reads_back(plan_and_at):
    from opweave_planner.contract import parse_plan
    from opweave_planner.plan import plan_bytes, plan_version
    from opweave_planner.sizing import deployment_lines

    doc = plan_and_at[0]
    dep = doc.deployment
    assert doc.schema_version == "1.13" and plan_version(doc) == "1.13"
    assert dep.tpot_p95_full_occupancy_ms == full_p95_ms(doc)
    assert 0 < dep.tpot_p95_at_load_ms <= dep.tpot_p95_full_occupancy_ms
    assert 0 < dep.mean_occupancy_at_load <= doc.owners[0].microbatch
    back = parse_plan(orjson.loads(plan_bytes(doc)), "p.json").deployment
    assert back == dep
    line = next(x for x in deployment_lines(dep) if "at this load" in x)
    assert f"~{dep.tpot_p95_at_load_ms:,.2f} ms" in line and f"<= {full_p95_ms(doc):,.2f} ms at full" in line
    older = doc.model_copy(update={"deployment": dep.model_copy(update={
        "tpot_p95_at_load_ms": None, "mean_occupancy_at_load": None, "tpot_p95_full_occupancy_ms": None})})
    assert plan_version(older) == "1.10"


def test_at_full_load_it_is_the_plans_tpot(plan_and_at):
    doc, at, cap = plan_and_at
    n, p95 = open_occupancy(at, load_grid(cap), 1e9, 256.0, cap)
    assert doc.deployment.tpot_p95_full_occupancy_ms == full_p95_ms(doc)
    assert n == cap and p95 * 1e3 == pytest.approx(full_p95_ms(doc), rel=1e-8)


def test_the_recorded_figure_is_the_evaluator_at_the_little_fixed_point(plan_and_at):
    """The planner's coarse grid against every occupancy (the benchmark's grid), and N is the
    fixed point of Little's law on the evaluator's own mean TPOT."""
    doc, at, cap = plan_and_at
    dep = doc.deployment
    rate = dep.arrivals.rate / (dep.copies * doc.microbatches * doc.owners[0].replicas)
    n, p95 = open_occupancy(at, np.arange(1, cap + 1), rate, dep.arrivals.mean_output_tokens, cap)
    lo = max(int(np.floor(n)), 1)
    w = n - lo
    mean = (1 - w) * at(lo)[1] + w * at(min(lo + 1, cap))[1]
    assert n == pytest.approx(rate * dep.arrivals.mean_output_tokens * mean, rel=1e-5)
    assert dep.mean_occupancy_at_load == pytest.approx(n, rel=0.02)
    assert dep.tpot_p95_at_load_ms == pytest.approx(p95 * 1e3, rel=0.02)


def test_the_load_tpot_is_monotone_in_the_load(plan_and_at):
    doc, at, cap = plan_and_at
    got = [open_occupancy(at, load_grid(cap), r, 256.0, cap) for r in (0.5, 2, 8, 32, 128, 1e4)]
    ns, ps = zip(*got)
    assert all(a <= b for a, b in zip(ns, ns[1:])) and all(a <= b + 1e-12 for a, b in zip(ps, ps[1:]))
    assert ps[-1] * 1e3 == pytest.approx(full_p95_ms(doc), rel=1e-8) and ps[0] < ps[-1]


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 300), st.floats(0.01, 50.0), st.integers(0, 2**31))
def test_a_coarse_grid_is_exact_when_the_periods_are_linear_in_the_occupancy(cap, rate, seed):
    """Synthetic evaluator whose every order statistic is affine in n: the coarse grid's
    interpolation reproduces every integer's figure, so both grids give the same prediction."""
    from opweave_planner.deployment import OnGrid

    base = np.sort(np.random.default_rng(seed).uniform(1e-3, 2e-3, 64))
    at = lambda n: (base * (1 + 0.05 * n), float(base.mean() * (1 + 0.05 * n)))
    grid = load_grid(cap)
    on = OnGrid(at, grid)
    for k in (1, cap, max(1, cap // 3), max(1, cap - 1)):
        np.testing.assert_allclose(on(k)[0], at(k)[0], rtol=1e-12)
    every = open_occupancy(at, np.arange(1, cap + 1), rate, 100.0, cap)
    coarse = open_occupancy(at, grid, rate, 100.0, cap)
    assert coarse == pytest.approx(every, rel=1e-9)


def test_simulate_reproduces_the_load_figures_and_a_faster_rate_raises_them(plan_and_at, tmp_path):
    from opweave_planner.contract import evaluate_plan

    doc = plan_and_at[0]
    if doc.deployment.arrivals.process != "poisson":
        pytest.skip("a rate override applies to Poisson arrivals")
    same = evaluate_plan(doc).plan.deployment
    assert same == doc.deployment
    faster = evaluate_plan(doc, request_rate=doc.deployment.arrivals.rate * 2).plan.deployment
    per_copy = lambda d: d.arrivals.rate / d.copies
    if per_copy(faster) > per_copy(doc.deployment):
        assert faster.mean_occupancy_at_load > same.mean_occupancy_at_load
        assert faster.tpot_p95_at_load_ms >= same.tpot_p95_at_load_ms
