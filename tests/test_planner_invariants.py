"""End-to-end invariants of the planner through the library API (small models, reduced grid).

* loosening the SLO, lowering a GPU price, or allowing another GPU type never raises cost;
* opweave is never more expensive than a restricted policy (colocated, afd, cad) that is feasible;
* every emitted plan re-simulates (reference simulator on the plan's own stages) to its tpot_ms,
  meets its SLO and GPU limit, and its cost follows from its owners;
* identical inputs give identical bytes, and --jobs 2 gives the bytes of --jobs 1.
"""

from __future__ import annotations

import functools
import json
import math

import pytest

from opweave_planner import api
from opweave_planner.inputs.hardware import load_hardware
from opweave_planner.plan import plan_bytes
from opweave_planner.schedule.reference import simulate_rtt

SPACE = dict(max_owners=2, batches=(1, 2, 4, 8, 16, 32, 64), max_replicas=2, tensor_parallel_sizes=(1, 2))
MODELS = ("llama-3.1-8b", "qwen3-30b-a3b")
POLICIES = ("opweave", "colocated", "afd", "cad")
SLOS = ("25ms", "40ms", "60ms", "120ms")
REL = 1e-9  # plan figures are printed with 9 significant digits


@functools.cache
def solve(model, slo, gpus="h100", policy="opweave", prices=None, ctx="8k", jobs=1):
    req = api.make_request(model, slo, ctx, gpus=gpus, policy=policy, prices=prices, **SPACE)
    _outcome = api.plan(req, jobs=jobs)
    plan, infeasible = _outcome.plan, _outcome.infeasible
    assert (plan is None) != (infeasible is None)
    return plan


def cost(plan):
    return math.inf if plan is None else plan.usd_per_million_tokens


def no_more(a, b):
    """cost a <= cost b up to printing precision."""
    return a <= b * (1 + REL) or (math.isinf(a) and math.isinf(b))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("policy", POLICIES)
def test_loosening_slo_never_raises_cost(model, policy):
    costs = [cost(solve(model, slo, policy=policy)) for slo in SLOS]
    assert any(math.isfinite(c) for c in costs)
    for tight, loose in zip(costs, costs[1:]):
        assert no_more(loose, tight), (model, policy, costs)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("slo", ("40ms", "60ms"))
def test_cheaper_gpu_never_raises_cost(tmp_path, model, slo):
    base = solve(model, slo, gpus="h100,a100")
    previous = cost(base)
    for gpu, factor in (("h100", 0.8), ("a100", 0.5), ("h100", 0.5)):
        # prices from the catalog in effect, lowered one GPU at a time (cumulatively)
        hw = api.gpu_catalog()
        prices = {g.id: g.price_per_hour for g in hw.gpus if g.id in ("h100", "a100")}
        if gpu == "h100" and factor == 0.5:
            prices["a100"] *= 0.5
        prices[gpu] *= factor
        path = tmp_path / f"prices-{gpu}-{factor}.json"
        path.write_text(json.dumps(prices))
        now = cost(solve(model, slo, gpus="h100,a100", prices=str(path)))
        assert no_more(now, previous), (gpu, factor, now, previous)
        previous = now


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("slo", SLOS)
@pytest.mark.parametrize("policy", POLICIES)
def test_another_gpu_type_never_raises_cost(model, slo, policy):
    assert no_more(cost(solve(model, slo, gpus="h100,a100", policy=policy)),
                   cost(solve(model, slo, gpus="h100", policy=policy)))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("slo", SLOS)
@pytest.mark.parametrize("gpus", ("h100", "h100,a100"))
def test_opweave_no_more_expensive_than_restricted_policies(model, slo, gpus):
    ow = cost(solve(model, slo, gpus=gpus))
    for policy in ("colocated", "afd", "cad"):
        other = cost(solve(model, slo, gpus=gpus, policy=policy))
        if math.isfinite(other):
            assert no_more(ow, other), (policy, ow, other)


def _check_plan(plan, slo_ms, max_gpus=32):
    k = len(plan.owners)
    owner = [s.owner for s in plan.stages]
    n = len(owner)
    # one GPU type in a single node: stage transfers use the intra-node link
    one_node = k > 1 and len({o.gpu for o in plan.owners}) == 1 and plan.gpus_total <= 8
    lat_us = plan.provenance.network["intra_node_latency_us" if one_node else "inter_node_latency_us"]
    if one_node:
        assert plan.metrics.inter_node_mib_per_token == 0.0
    t, occ, lat = [], [], []
    for j, s in enumerate(plan.stages):
        t.append(s.latency_ms * 1e3)
        if owner[(j + 1) % n] != owner[j]:
            occ.append(max(s.transfer_ms * 1e3 - lat_us, 0.0))
            lat.append(lat_us)
        else:
            assert s.transfer_ms == 0.0
            occ.append(0.0)
            lat.append(0.0)
    t_rtt = simulate_rtt(owner, t, occ, lat, plan.microbatches, k)
    assert math.isclose(t_rtt / 1e3, plan.tpot_ms, rel_tol=1e-6), (t_rtt, plan.tpot_ms)
    assert plan.tpot_ms <= slo_ms * (1 + 1e-9)
    assert plan.gpus_total == sum(o.tensor_parallel * o.replicas for o in plan.owners) <= max_gpus
    hw = load_hardware()
    for o in plan.owners:
        # fits memory, with the default 3.5 GiB framework reserve left free
        assert 0 < o.memory_bytes_per_gpu + 3.5 * 2**30 <= hw.resolve(o.gpu).memory_bytes
        assert o.resident_batch == plan.microbatches * o.microbatch
        assert o.replicas * o.resident_batch == plan.global_batch
    rate = sum(o.usd_per_hour_per_replica / o.resident_batch for o in plan.owners)
    assert math.isclose(plan.usd_per_million_tokens, plan.tpot_ms * 1e3 * rate / 3.6e3, rel_tol=1e-6)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("slo", SLOS)
@pytest.mark.parametrize("gpus", ("h100", "h100,a100"))
@pytest.mark.parametrize("policy", POLICIES)
def test_every_plan_resimulates_to_its_tpot(model, slo, gpus, policy):
    plan = solve(model, slo, gpus=gpus, policy=policy)
    if plan is not None:
        _check_plan(plan, api.parse_duration_ms(slo))


@pytest.mark.parametrize("model", MODELS)
def test_identical_inputs_identical_bytes(model):
    req = api.make_request(model, "60ms", "8k", gpus="h100,a100", **SPACE)
    first = api.plan(req).plan
    second = api.plan(api.make_request(model, "60ms", "8k", gpus="h100,a100", **SPACE)).plan
    assert first is not None
    assert plan_bytes(first) == plan_bytes(second)


@pytest.mark.parametrize("model", MODELS)
def test_jobs_two_equals_jobs_one(model):
    # max_owners=3 gives enough templates for the worker pool to be used (>= 2 * jobs)
    kw = dict(SPACE, max_owners=3)
    req = api.make_request(model, "60ms", "8k", gpus="h100,a100", **kw)
    one = api.plan(req, jobs=1).plan
    two = api.plan(req, jobs=2).plan
    assert one is not None
    assert plan_bytes(one) == plan_bytes(two)


def test_latency_objective_finds_the_fastest_plan_across_templates():
    """The infeasibility report's 'lowest achievable TPOT' is the minimum over all templates."""
    from opweave_planner.compile import compile_request
    from opweave_planner.search.driver import run_search

    req = api.make_request("llama-3.1-8b", "60ms", "8k", gpus="h100", **SPACE)
    ctx = compile_request(req)
    fastest = run_search(ctx, slo_ms=float("inf"), latency_objective=True).best
    for policy in ("colocated", "afd", "cad"):
        sub = compile_request(api.make_request("llama-3.1-8b", "60ms", "8k", gpus="h100", policy=policy, **SPACE))
        best = run_search(sub, slo_ms=float("inf"), latency_objective=True).best
        assert fastest.t_rtt_us <= best.t_rtt_us * (1 + 1e-12)
    assert math.isclose(fastest.cost, fastest.t_rtt_us, rel_tol=1e-12)
