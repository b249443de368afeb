"""Alternatives and deployment constraints (issue 15 items 1-2): exact, from one search.

Every alternative must equal the optimum of a separate, restricted search over the same
grid; constraints are honoured by the returned plan; loosening a constraint never raises cost.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opweave_planner import api

SPACE = dict(max_owners=2, batches=(4, 8, 16, 32, 64), max_replicas=2, tensor_parallel_sizes=(1, 2, 4))
MODEL, SLO, CTX = "llama-3.1-8b", "30ms", "8k"


def plan(**kw):
    settings_ = {**SPACE, **kw}
    doc = api.plan(api.make_request(MODEL, settings_.pop("slo", SLO), settings_.pop("ctx", CTX),
                                                **settings_)).plan
    return doc


def cost(doc) -> float:
    return math.inf if doc is None else doc.usd_per_million_tokens


@pytest.fixture(scope="module")
def mixed():
    return plan(gpus="h100,a100")


def test_alternatives_are_listed_with_deltas(mixed):
    assert mixed.schema_version == "1.9"  # the plan says what binds it (1.9); its alternatives do not
    assert {a.plan.schema_version for a in mixed.alternatives.values()} == {"1.2"}
    alts = mixed.alternatives
    assert set(alts) >= {"colocated", "two_owner", "single_gpu_type"}
    for a in alts.values():
        assert a.usd_per_million_tokens >= mixed.usd_per_million_tokens * (1 - 1e-9)  # never beats the optimum
        assert a.cost_delta_pct == pytest.approx((a.usd_per_million_tokens / mixed.usd_per_million_tokens - 1) * 100,
                                                 abs=1e-5)
        assert a.plan.alternatives is None and a.plan.usd_per_million_tokens == a.usd_per_million_tokens
    assert alts["colocated"].num_stages == 1
    assert len(alts["two_owner"].plan.owners) <= 2
    assert len({o.gpu for o in alts["single_gpu_type"].plan.owners}) == 1


def test_colocated_alternative_equals_the_colocated_policy(mixed):
    ref = plan(gpus="h100,a100", policy="colocated")
    assert mixed.alternatives["colocated"].usd_per_million_tokens == ref.usd_per_million_tokens
    assert mixed.alternatives["colocated"].plan.owners == ref.owners


def test_single_type_alternative_equals_the_cheapest_homogeneous_search(mixed):
    best = min(cost(plan(gpus=g)) for g in ("h100", "a100"))
    assert mixed.alternatives["single_gpu_type"].usd_per_million_tokens == best


def test_two_owner_alternative_equals_a_two_owner_search():
    three = plan(gpus="h100,a100", max_owners=3, batches=(8, 16, 32))
    two = plan(gpus="h100,a100", max_owners=2, batches=(8, 16, 32))
    assert three.alternatives["two_owner"].usd_per_million_tokens == two.usd_per_million_tokens


def test_restricted_policies_carry_no_alternatives():
    doc = plan(gpus="h100", policy="colocated")
    assert doc.alternatives is None


def test_prefer_simpler_returns_the_simplest_plan_within_the_share(mixed):
    loose = plan(gpus="h100,a100", prefer_simpler="50%")
    assert loose.usd_per_million_tokens <= mixed.usd_per_million_tokens * 1.5 * (1 + 1e-9)
    assert loose.num_stages <= mixed.num_stages
    if loose.num_stages < mixed.num_stages:
        assert loose.alternatives["optimum"].usd_per_million_tokens == mixed.usd_per_million_tokens
    exact = plan(gpus="h100,a100", prefer_simpler="0%")
    assert exact.usd_per_million_tokens == mixed.usd_per_million_tokens


def test_max_nodes_and_gpus_per_node_are_honoured():
    doc = plan(gpus="h100", gpus_per_node=2, max_nodes=2)
    assert doc is not None
    assert all(o.tensor_parallel <= 2 for o in doc.owners)
    nodes = sum(math.ceil(o.replicas * o.tensor_parallel / 2) for o in doc.owners)
    assert nodes <= 2 or doc.metrics.stage_link == "intra_node"
    assert doc.search.space.gpus_per_node == 2 and doc.search.space.max_nodes == 2


def test_memory_headroom_keeps_memory_free():
    from opweave_planner.inputs.hardware import load_hardware
    from opweave_planner.latency.memory import usable_bytes

    doc = plan(gpus="h100", memory_headroom="30%")
    free = plan(gpus="h100")
    assert doc is not None and cost(doc) >= cost(free) * (1 - 1e-12)
    h100 = load_hardware().resolve("h100")
    for o in doc.owners:  # the same budget the search uses, less the 30 % kept free
        assert o.memory_bytes_per_gpu <= usable_bytes(h100, o.tensor_parallel) * 0.7 * (1 + 1e-9)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["max_stages", "max_nodes", "memory_headroom", "max_gpus"]), st.data())
def test_loosening_a_constraint_never_raises_cost(name, data):
    values = {"max_stages": [1, 2, 4, 64], "max_nodes": [1, 2, 4], "memory_headroom": ["50%", "20%", "0%"],
              "max_gpus": [2, 4, 8, 16]}[name]
    i = data.draw(st.integers(0, len(values) - 2))
    tight, loose = values[i], values[i + 1]
    a = cost(plan(gpus="h100", batches=(8, 16, 32), **{name: tight}))
    b = cost(plan(gpus="h100", batches=(8, 16, 32), **{name: loose}))
    assert b <= a * (1 + 1e-12), (name, tight, loose, a, b)
