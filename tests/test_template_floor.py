"""The per-template floor (search.bounds.template_floor) never exceeds the template's optimum.

It lets the walk skip a whole template whose floor is above the seed, so it must be a valid lower
bound of every candidate: checked against the brute force of tests/test_search_exact.py on random
small instances, against every feasible candidate, not only the optimum, under a fixed context
and under a workload (its mean TPOT, bounded by the lower tables as the walk's prune is). A seed
just above the optimum still finds it (the skip keeps every template that could tie); a seed
below the floor finds nothing, as the walk would.

The driver's pre-floor (search/prefloor.py, `bounds.phase_floors`) decides the same skips before a
template's Problem is built: its floors equal `template_floor_of` bit for bit (random instances
and every template of a real request, per GPU type), its pruned set is the kernel's, and a search
with it returns what one without it does, counters included, for --jobs 1 and 2.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_search_exact import SETTINGS, brute_force, instances, problem_of
from test_search_workload_exact import workload_instances, workload_problem

from opweave_planner import api
from opweave_planner.compile import compile_request
from opweave_planner.search import driver
from opweave_planner.search.bounds import FLOOR_MARGIN, FloorParts, phase_floors
from opweave_planner.search.prefloor import PreFloor
from opweave_planner.search.state import Counters
from opweave_planner.search.walk import search_template, template_floor_of

REL = 1e-9


def _check(prob, inst):
    floor = template_floor_of(prob)
    best, feasible = brute_force(inst, problem=prob)
    if prob.latency_objective:
        assert floor == 0.0  # no bound: the latency objective
        return
    if best is None:
        event("infeasible")
        return
    event("floor above 0" if floor > 0 else "floor 0")
    event("tight (>= 90 % of the optimum)" if floor >= 0.9 * best[0] else "loose")
    for cost, _gpus, ident in feasible:
        assert floor <= cost * (1 + REL), (floor, cost, ident)
    # seeded with the optimum itself, the template is not skipped and returns it
    res = search_template(prob, best[0], True, True)
    assert res.found and math.isclose(res.cost, best[0], rel_tol=REL, abs_tol=1e-12)


@settings(max_examples=130, **SETTINGS)
@given(instances())
def test_floor_is_below_every_candidate(inst):
    _check(problem_of(inst), inst)


@settings(max_examples=60, **SETTINGS)
@given(workload_instances())
def test_floor_is_below_every_candidate_under_a_workload(inst):
    _check(workload_problem(inst), inst)


@settings(max_examples=100, **SETTINGS)
@given(instances())
def test_a_seed_below_the_floor_finds_nothing(inst):
    prob = problem_of(inst)
    floor = template_floor_of(prob)
    if prob.latency_objective or not 0.0 < floor < math.inf:
        return
    res = search_template(prob, floor / 2, True, True)
    assert not res.found
    assert res.counters.candidates == 0 and res.counters.simulations == 0


def _phase_floors(prob, seed: float):
    """`phase_floors` of one Problem's owners, the template listed twice (shared owner rows)."""
    st_, i64 = prob.stages, np.int64
    js = [[j for j in range(st_.stage_owner.size) if st_.stage_owner[j] == o] for o in range(st_.k)]
    off = np.cumsum([0] + [len(j) for j in js]).astype(i64)
    flat = [j for per in js for j in per]
    own = np.tile(np.arange(st_.k, dtype=i64), 2)
    ranges = np.ascontiguousarray(np.stack([st_.stage_start[flat], st_.stage_end[flat]], axis=1))
    fp = FloorParts(configs=prob.configs, fabric=prob.fabric, grid=prob.grid, limits=prob.limits)
    units, u_units = np.ascontiguousarray(st_.kv_units), np.arange(st_.k, dtype=i64)  # each owner its own rows
    return phase_floors(fp, (units, u_units), st_.cfg_ok, off, ranges,
                        np.array([0, st_.k, 2 * st_.k], i64), own, seed)


@settings(max_examples=200, **SETTINGS)
@given(instances(), st.sampled_from([0.5, 1.0, 1.0 + 1e-10, 2.0]))
def test_the_phase_floor_is_the_template_floor_bit_for_bit(inst, scale):
    _same_floors(problem_of(inst)._replace(latency_objective=False), scale)


@settings(max_examples=80, **SETTINGS)
@given(workload_instances(), st.sampled_from([0.5, 1.0, 2.0]))
def test_the_phase_floor_is_the_template_floor_bit_for_bit_under_a_workload(inst, scale):
    _same_floors(workload_problem(inst)._replace(latency_objective=False), scale)


def _same_floors(prob, scale):
    floor = template_floor_of(prob)
    seed = floor * scale if math.isfinite(floor) and floor > 0 else 1.0
    floors, pruned = _phase_floors(prob, seed)
    assert floors[0] == floors[1] == floor or (math.isinf(floor) and math.isinf(floors[0]))
    assert pruned[0] == pruned[1] == (floor > seed * prob.prune_factor * (1.0 + FLOOR_MARGIN))
    event("pruned" if pruned[0] else "kept")
    if pruned[0]:  # what the kernel does with such a seed: nothing but one prune
        res = search_template(prob, seed, True, True)
        assert not res.found and res.counters == Counters(pruned_by_bound=1)


TRACE = str(Path(__file__).resolve().parent.parent / "examples" / "traces" / "mooncake-conversation-sample.jsonl")


@pytest.fixture(scope="module", params=["fixed", "workload"])
def small_request(request):
    """A fixed context, and a workload of a sliding-window model (owners of different KV mixes
    read different reserve rows)."""
    if request.param == "fixed":
        return compile_request(api.make_request("llama-3.1-8b", "30ms", "8k", gpus="h100,a100", max_owners=3,
                                                batches=(8, 32, 128), tensor_parallel_sizes=(1, 2)))
    return compile_request(api.make_request("gemma-3-12b", "30ms", None, gpus="h100,a100", max_owners=2,
                                            batches=(8, 32, 128), tensor_parallel_sizes=(1, 2),
                                            workload=TRACE, scale_ctx="16k"))


def test_the_pre_floor_of_real_templates_is_the_kernels(small_request):
    ctx = small_request
    if ctx.context_knots:  # owners of several mixes, so several reserve rows
        assert len(PreFloor(ctx)._layout(tuple(i for i, t in enumerate(ctx.templates)
                                                if ctx.stage_plan(t).n_stages > 1))[5]) > 1
    multi = [i for i, t in enumerate(ctx.templates) if ctx.stage_plan(t).n_stages > 1]
    pre = PreFloor(ctx)
    for only in (None, 0, 1):
        floors, _pruned, _factor = pre.floors(multi, 30e3, only)
        for i, f in zip(multi, floors, strict=True):
            assert f == template_floor_of(ctx.problem(ctx.templates[i], slo_us=30e3, only_gpu=only)), (only, i)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_search_with_the_pre_floor_is_one_without(small_request, monkeypatch, jobs):
    ctx, skipped = small_request, []
    real = PreFloor.pruned

    def counted(self, ph):
        got = real(self, ph)
        skipped.append(len(got))
        return got

    monkeypatch.setattr(PreFloor, "pruned", counted)
    with_pre = driver.run_search(ctx, jobs=jobs)
    assert sum(skipped) > 0  # the seeds are tight enough that the pre-floor skips templates
    monkeypatch.setattr(PreFloor, "pruned", lambda self, ph: frozenset())
    without = driver.run_search(ctx, jobs=1)
    assert with_pre.counters == without.counters
    assert [c.order_key() for c in with_pre.found] == [c.order_key() for c in without.found]
    assert with_pre.best.order_key() == without.best.order_key()
    assert {k: c and c.order_key() for k, c in with_pre.alternatives.items()} == {
        k: c and c.order_key() for k, c in without.alternatives.items()}
