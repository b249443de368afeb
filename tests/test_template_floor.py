"""The per-template floor (search.bounds.template_floor) never exceeds the template's optimum.

It lets the walk skip a whole template whose floor is above the seed, so it must be a valid lower
bound of every candidate: checked against the brute force of tests/test_search_exact.py on random
small instances, against every feasible candidate, not only the optimum. A workload gets no
floor (0): its cost is the mean TPOT, which the percentile's lower tables do not bound. A seed just above the optimum still finds it (the skip keeps every template that
could tie); a seed below the floor finds nothing, as the walk would.
"""

from __future__ import annotations

import math

from hypothesis import event, given, settings
from test_search_exact import SETTINGS, brute_force, instances, problem_of
from test_search_workload_exact import workload_instances, workload_problem

from opweave_planner.search.walk import search_template, template_floor_of

REL = 1e-9


def _check(prob, inst):
    floor = template_floor_of(prob)
    best, feasible = brute_force(inst, problem=prob)
    if prob.latency_objective or prob.knots.size:
        assert floor == 0.0  # no bound: the latency objective, and a workload (its mean TPOT)
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


@settings(max_examples=300, **SETTINGS)
@given(instances())
def test_floor_is_below_every_candidate(inst):
    _check(problem_of(inst), inst)


@settings(max_examples=150, **SETTINGS)
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
