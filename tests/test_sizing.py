"""Sizing for a target load: copies rounded up exactly, nodes by the stage-link rule, cost per hour."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from opweave_planner.contract import read_plan
from opweave_planner.errors import UserError
from opweave_planner.plan import Deployment
from opweave_planner.sizing import (
    copies_needed,
    deployment_lines,
    size,
    size_deployment,
)

GOLDEN = Path(__file__).parent / "golden"
NODE8 = {"h100": 8, "a100": 8, "h200": 8, "l40s": 8}


def plain(**kw) -> Deployment:
    base = {"global_batch": 64, "tpot_ms": 20.0, "owners": [("h100", 2, 1, 6.98)], "stage_link": "none",
            "gpus_per_node": NODE8}
    return size(**{**base, **kw})


# ----------------------------------------------------------------------------- copies

def test_throughput_per_copy_is_global_batch_over_tpot():
    dep = plain(target_tokens_per_s=1)
    assert dep.tokens_per_s_per_copy == 3200.0  # 64 requests / 0.020 s
    assert dep.concurrency_per_copy == 64 and dep.copies == 1


@pytest.mark.parametrize("tokens, copies", [(3200, 1), (3200.001, 2), (6400, 2), (6400.5, 3), (0.5, 1),
                                            (32000, 10), (32001, 11)])
def test_tokens_target_rounds_up_exactly_at_the_boundary(tokens, copies):
    assert plain(target_tokens_per_s=tokens).copies == copies


def test_decimal_figures_do_not_round_a_whole_multiple_up():
    # 0.1 ms is not a binary float: 20000 / (1 / 0.0001 s) must still be exactly 2 copies
    assert copies_needed(1, 0.1, target_tokens_per_s=20000) == 2
    assert copies_needed(3, 0.3, target_tokens_per_s=20000) == 2
    assert copies_needed(3, 0.3, target_tokens_per_s=20000.0001) == 3


@pytest.mark.parametrize("conc, copies", [(1, 1), (64, 1), (65, 2), (128, 2), (129, 3)])
def test_concurrency_target_rounds_up(conc, copies):
    dep = plain(target_concurrency=conc)
    assert dep.copies == copies and dep.concurrency == 64 * copies >= conc


def test_both_targets_take_the_larger_count():
    dep = plain(target_tokens_per_s=3200, target_concurrency=200)  # 1 copy by throughput, 4 by concurrency
    assert dep.copies == 4
    assert plain(target_tokens_per_s=32000, target_concurrency=1).copies == 10


@pytest.mark.parametrize("kw, needle", [
    ({}, "--target-tokens-per-s or --target-concurrency"),
    ({"target_tokens_per_s": 0}, "--target-tokens-per-s"),
    ({"target_tokens_per_s": -5.0}, "--target-tokens-per-s"),
    ({"target_tokens_per_s": float("nan")}, "--target-tokens-per-s"),
    ({"target_tokens_per_s": float("inf")}, "--target-tokens-per-s"),
    ({"target_tokens_per_s": True}, "--target-tokens-per-s"),
    ({"target_concurrency": 0}, "--target-concurrency"),
    ({"target_concurrency": 2.5}, "--target-concurrency"),
])
def test_bad_targets_name_the_flag(kw, needle):
    with pytest.raises(UserError) as exc:
        plain(**kw)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


# ----------------------------------------------------------------------------- nodes

def test_per_owner_nodes_pack_whole_tensor_parallel_groups():
    # 2 owners on one GPU type but inter-node hand-offs: they do not share nodes
    dep = plain(owners=[("h100", 4, 1, 13.96), ("h100", 1, 3, 3.49)], stage_link="inter_node",
                target_concurrency=64 * 5)
    assert dep.copies == 5
    o0, o1 = dep.owners
    assert (o0.replicas, o0.gpus, o0.nodes) == (5, 20, 3)  # 2 TP4 groups per 8-GPU node
    assert (o1.replicas, o1.gpus, o1.nodes) == (15, 15, 2)
    assert dep.nodes_total == 5 and dep.nodes_by_type == {"h100": 5} and dep.gpus_total == 35


def test_group_never_spans_nodes_when_tp_does_not_divide_the_node():
    dep = plain(owners=[("x", 4, 1, 1.0)], gpus_per_node={"x": 6}, target_concurrency=64 * 3)
    assert dep.owners[0].nodes == 3  # one TP4 group per 6-GPU node, not ceil(12 / 6) = 2


def test_intra_node_plans_pack_whole_copies_per_node():
    # a copy of 3 GPUs on an 8-GPU node: 2 copies per node (a copy never spans nodes)
    dep = plain(owners=[("a100", 1, 1, 1.74), ("a100", 2, 1, 3.48)], stage_link="intra_node",
                target_concurrency=64 * 8)
    assert dep.copies == 8 and dep.gpus_total == 24
    assert dep.nodes_total == 4 and all(o.nodes is None for o in dep.owners)  # not ceil(24 / 8) = 3
    assert "whole copies per node" in dep.node_rule


def test_mixed_gpu_types_count_nodes_per_type():
    dep = plain(owners=[("h100", 1, 1, 3.49), ("a100", 1, 1, 1.74)], stage_link="inter_node",
                target_concurrency=64 * 9)
    assert dep.nodes_by_type == {"a100": 2, "h100": 2} and dep.gpus_by_type == {"a100": 9, "h100": 9}


@pytest.mark.parametrize("kw, needle", [
    ({"owners": [("b200", 1, 1, 5.0)]}, "no figure for GPU type 'b200'"),
    ({"owners": [("h100", 8, 1, 27.92)], "gpus_per_node": {"h100": 4}}, "TP8 group does not fit"),
    ({"owners": [("h100", 1, 1, 3.49), ("a100", 1, 1, 1.74)], "stage_link": "intra_node"}, "2 GPU types"),
    ({"owners": [("h100", 4, 3, 13.96)], "stage_link": "intra_node"}, "exceed a h100 node"),
    ({"stage_link": "ethernet"}, "stage_link 'ethernet'"),
])
def test_inconsistent_inputs_are_one_line_errors(kw, needle):
    with pytest.raises(UserError) as exc:
        plain(target_concurrency=1, **kw)
    assert needle in str(exc.value)


# ----------------------------------------------------------------------------- real plans

@pytest.mark.parametrize("name, link", [("llama-3.1-8b_colocated_h100_v1.2.json", "none"),
                                        ("llama-3.1-8b_afd_h100+a100_v1.2.json", "inter_node"),
                                        ("qwen3-30b-a3b_afd_h100+a100_v1.2.json", "intra_node")])
def test_plan_at_capacity_costs_its_usd_per_million_tokens(name, link):
    plan = read_plan(GOLDEN / name)
    assert plan.metrics.stage_link == link
    for target in (1.0, 12345.0, 1e6):
        dep = size_deployment(plan, target_tokens_per_s=target, gpus_per_node=NODE8)
        assert dep.gpus_total == dep.copies * plan.gpus_total
        assert sum(o.gpus for o in dep.owners) == dep.gpus_total == sum(dep.gpus_by_type.values())
        per_mtok = dep.usd_per_hour / (dep.tokens_per_s * 3600) * 1e6
        assert per_mtok == pytest.approx(plan.usd_per_million_tokens, rel=1e-7)
        assert dep.tokens_per_s >= target > (dep.copies - 1) * dep.tokens_per_s_per_copy
        for o, own in zip(dep.owners, plan.owners, strict=True):
            assert o.replicas == dep.copies * own.replicas


def test_more_target_never_means_fewer_gpus_nodes_or_dollars():
    plans = [read_plan(p) for p in sorted(GOLDEN.glob("*_v1.2.json"))]
    plans = [p for p in plans if hasattr(p, "owners")]
    assert len(plans) >= 3
    for plan in plans:
        prev = None
        for tokens, conc in itertools.product((1, 500, 2000, 2001, 7777, 50000, 50001, 1e6), (None, 1, 1000)):
            dep = size_deployment(plan, target_tokens_per_s=tokens, target_concurrency=conc, gpus_per_node=NODE8)
            if prev is not None and prev[0] <= tokens and (prev[1] or 0) <= (conc or 0):
                assert (dep.copies, dep.gpus_total, dep.nodes_total) >= prev[2][:3]
                assert dep.usd_per_hour >= prev[2][3]
            prev = (tokens, conc, (dep.copies, dep.gpus_total, dep.nodes_total, dep.usd_per_hour))
        # monotone in each target alone, over a dense sweep
        last = (0, 0, 0, 0.0)
        for tokens in range(100, 200_000, 997):
            d = size_deployment(plan, target_tokens_per_s=tokens, gpus_per_node=NODE8)
            now = (d.copies, d.gpus_total, d.nodes_total, d.usd_per_hour)
            assert all(a >= b for a, b in zip(now, last, strict=True)), (tokens, now, last)
            last = now


def test_deterministic_and_frozen():
    plan = read_plan(GOLDEN / "llama-3.1-8b_afd_h100+a100_v1.1.json")
    a = size_deployment(plan, target_tokens_per_s=50000, gpus_per_node=NODE8)
    b = size_deployment(plan, target_tokens_per_s=50000, gpus_per_node=dict(reversed(NODE8.items())))
    assert a.model_dump_json() == b.model_dump_json()
    with pytest.raises(Exception):  # noqa: B017 (pydantic's frozen-instance error)
        a.copies = 1  # type: ignore[misc]
    assert Deployment.model_json_schema()["properties"]["copies"]["description"]


def test_summary_lines():
    plan = read_plan(GOLDEN / "llama-3.1-8b_afd_h100+a100_v1.1.json")
    dep = size_deployment(plan, target_tokens_per_s=50000, gpus_per_node=NODE8)
    lines = deployment_lines(dep)
    assert lines[0].startswith(f"deployment (decode only) for 50,000 tokens/s: {dep.copies} copies of the plan")
    assert len(lines) == 2 + len(dep.owners) + 1
    o0 = plan.owners[0]
    assert lines[1].startswith(f"  owner 0: {dep.owners[0].replicas}x {o0.gpu} TP{o0.tensor_parallel} = "
                               f"{dep.owners[0].gpus} GPUs, ")
    assert f"{dep.gpus_total} GPUs (" in lines[-2] and f"on {dep.nodes_total} nodes" in lines[-2]
    assert lines[-1] == f"  cost: {dep.usd_per_hour:,.2f} USD per hour (decode only)"
    one = deployment_lines(size_deployment(plan, target_concurrency=1, gpus_per_node=NODE8))
    assert "1 copy of the plan" in one[0] and "for 1 concurrent request:" in one[0]
