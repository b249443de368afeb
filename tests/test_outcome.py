"""api.plan's typed outcome (issue 26 item 5): a status, the binding constraint and the lowest
achievable TPOT as data, recorded in the infeasibility file (schema 1.6), so callers branch on
why a request has no plan instead of parsing its sentence."""

from __future__ import annotations

import pytest

from opweave_planner import api
from opweave_planner.plan import Binding, Outcome, Status

SMALL = dict(max_owners=1, batches=(8, 16), max_replicas=1, tensor_parallel_sizes=(1, 2))


def _plan(slo, **kw):
    return api.plan(api.make_request("llama-3.1-8b", slo, 8192, gpus="h100", policy="colocated",
                                     **{**SMALL, **kw}))


def test_a_feasible_request_is_optimal_with_its_plan():
    out = _plan(60)
    assert out.status == Status.OPTIMAL and out.infeasible is None and out.document is out.plan
    # a plan says what binds its batch (schema 1.9); no lowest TPOT, that is the SLO-infeasible record's
    assert out.binding == Binding(out.plan.binding.constraint) and out.lowest_tpot_ms is None


def test_an_slo_below_reach_names_the_slo_and_the_lowest_tpot_which_is_reachable():
    out = _plan(1)
    assert out.status == Status.INFEASIBLE and out.plan is None and out.binding == Binding.SLO
    assert out.infeasible.schema_version == "1.6" and out.lowest_tpot_ms > 1
    assert f"{out.lowest_tpot_ms:.1f} ms" in out.infeasible.reason
    # the figure is what the searched space achieves: at that SLO a plan exists, just below it none
    at = _plan(out.lowest_tpot_ms * (1 + 1e-9))
    assert at.status == Status.OPTIMAL and at.plan.tpot_ms <= out.lowest_tpot_ms * (1 + 1e-9)
    assert _plan(out.lowest_tpot_ms * (1 - 1e-6)).binding == Binding.SLO


def test_no_memory_feasible_placement_names_memory():
    out = api.plan(api.make_request("llama-3.1-70b", 60, 32768, gpus="l40s", policy="colocated",
                                    max_gpus=1, batches=(8,), tensor_parallel_sizes=(1,), max_replicas=1))
    assert out.status == Status.INFEASIBLE and out.binding == Binding.MEMORY
    assert out.lowest_tpot_ms is None and "memory-feasible" in out.infeasible.reason


def test_a_stage_cap_below_every_template_names_the_cap_not_memory():
    """AFD alternates attention and FFN owners layer by layer: 64 stages for llama-3.1-8b, so
    --max-stages 4 leaves no template to search; the record says so (no binding of the two
    kinds the schema names), where it used to blame memory."""
    out = api.plan(api.make_request("llama-3.1-8b", 60, 8192, gpus="h100,a100", policy="afd", max_stages=4,
                                    batches=(8, 16), max_replicas=1, tensor_parallel_sizes=(1, 2)))
    assert out.status == Status.INFEASIBLE and out.binding is None and out.lowest_tpot_ms is None
    assert out.infeasible.reason.startswith("--max-stages 4: every afd template of llama-3.1-8b has at least ")
    assert "memory" not in out.infeasible.reason
    # a cap that leaves some templates: the reason of the binding it found says how many were searched
    part = api.plan(api.make_request("llama-3.1-8b", 1, 8192, gpus="h100", max_owners=2, max_stages=2,
                                     batches=(8, 16), max_replicas=1, tensor_parallel_sizes=(1, 2)))
    assert part.binding == Binding.SLO and part.infeasible.reason.endswith(" templates")
    assert "; --max-stages 2 left " in part.infeasible.reason
    # the same request with room for its stages has a plan
    assert api.plan(api.make_request("llama-3.1-8b", 60, 8192, gpus="h100,a100", policy="afd", batches=(8, 16),
                                     max_replicas=1, tensor_parallel_sizes=(1, 2))).status == Status.OPTIMAL


def test_an_outcome_holds_exactly_one_document():
    with pytest.raises(ValueError):
        Outcome(Status.OPTIMAL)
    with pytest.raises(ValueError):
        Outcome(Status.INFEASIBLE, plan=_plan(60).plan)
