"""Sizing for a target load: how many copies of a plan a deployment needs, and what it costs.

A plan serves `global_batch` concurrent requests, each receiving one token per `tpot_ms`, so
one copy of it (every owner with its `replicas` device groups) delivers
`global_batch / (tpot_ms / 1000)` output tokens per second. For a target throughput N or a
target concurrency C the deployment runs

    copies = max(ceil(N / tokens_per_s_per_copy), ceil(C / global_batch))

copies (whichever targets are given), computed exactly on the decimal figures the plan file
holds (so 2 x a copy's throughput needs 2 copies, not 3 by a rounding error). Owner m then runs
copies x replicas_m groups of tensor_parallel_m GPUs, and the cost per hour is
copies x sum_m replicas_m x usd_per_hour_per_replica_m; at full capacity it equals the plan's
USD per million tokens.

Nodes (GPUs per node from the catalog in effect). A device group never spans nodes, so a node
of G GPUs holds floor(G / tensor_parallel) groups.
* stage link intra_node (every owner on one GPU type, the copy inside one node, hand-offs over
  NVLink/PCIe): owners share nodes, but a copy never spans nodes, so a node holds
  floor(G / gpus_per_copy) whole copies.
* stage link inter_node or none: hand-offs (if any) cross the network, so nodes are counted per
  owner group: owner m needs ceil(copies x replicas_m / floor(G_m / tensor_parallel_m)) nodes, and
  owners never share a node even when they use the same GPU type.

Pure: plain numbers or a Plan in, a frozen `Deployment` out (the model is the plan file's, in
plan/schema.py; this module only does the arithmetic, above the plan package).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from opweave_planner.errors import UserError
from opweave_planner.plan.io import rounded
from opweave_planner.plan.schema import Deployment, OwnerDeployment, Plan

TOKENS_FLAG = "--target-tokens-per-s"
CONCURRENCY_FLAG = "--target-concurrency"
NODE_RULES = {
    "intra_node": "whole copies per node: stage hand-offs stay inside a node",
    "inter_node": "nodes per owner group: stage hand-offs cross the network",
    "none": "nodes per owner group: one owner",
}


def _exact(x: float | int) -> Fraction:
    """The decimal a file shows for `x` (repr), as an exact fraction."""
    return Fraction(repr(x)) if isinstance(x, float) else Fraction(x)


def _ceil_div(a: Fraction, b: Fraction) -> int:
    return math.ceil(a / b)


def _check_targets(target_tokens_per_s: Any, target_concurrency: Any) -> None:
    if target_tokens_per_s is None and target_concurrency is None:
        raise UserError(f"{TOKENS_FLAG} or {CONCURRENCY_FLAG}: give at least one target load")
    tokens, conc = target_tokens_per_s, target_concurrency
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, (int, float))
                               or not math.isfinite(tokens) or tokens <= 0):
        raise UserError(f"{TOKENS_FLAG}: expected a positive number of tokens per second, got {tokens!r}")
    if conc is not None and (isinstance(conc, bool) or not isinstance(conc, int) or conc < 1):
        raise UserError(f"{CONCURRENCY_FLAG}: expected a positive whole number of requests, got {conc!r}")


def copies_needed(global_batch: int, tpot_ms: float, *, target_tokens_per_s: float | None = None,
                  target_concurrency: int | None = None) -> int:
    """Copies of a plan that serve every given target (rounded up, at least 1)."""
    _check_targets(target_tokens_per_s, target_concurrency)
    if global_batch < 1 or not (math.isfinite(tpot_ms) and tpot_ms > 0):
        raise UserError(f"plan: global_batch {global_batch} and tpot_ms {tpot_ms} must be positive")
    need = 1
    if target_tokens_per_s is not None:
        per_copy = _exact(global_batch) * 1000 / _exact(tpot_ms)
        need = max(need, _ceil_div(_exact(target_tokens_per_s), per_copy))
    if target_concurrency is not None:
        need = max(need, _ceil_div(Fraction(target_concurrency), Fraction(global_batch)))
    return need


def size(*, global_batch: int, tpot_ms: float, owners: list[tuple[str, int, int, float]], stage_link: str,
         gpus_per_node: dict[str, int], target_tokens_per_s: float | None = None,
         target_concurrency: int | None = None) -> Deployment:
    """Size a deployment from plain numbers.

    `owners`: per owner (gpu id, tensor_parallel, replicas in one copy, USD per hour of one
    replica); `stage_link`: the plan's metrics.stage_link (intra_node, inter_node or none).
    """
    if stage_link not in NODE_RULES:
        raise UserError(f"plan: stage_link '{stage_link}' is not one of {', '.join(NODE_RULES)}")
    if not owners:
        raise UserError("plan: no owners to size")
    copies = copies_needed(global_batch, tpot_ms, target_tokens_per_s=target_tokens_per_s,
                           target_concurrency=target_concurrency)
    for o, (gpu, tp, _replicas, _usd) in enumerate(owners):
        if gpu not in gpus_per_node:
            raise UserError(f"gpus per node: no figure for GPU type '{gpu}' (owner {o})")
        if tp > gpus_per_node[gpu]:
            raise UserError(f"owner {o}: a TP{tp} group does not fit a {gpu} node of {gpus_per_node[gpu]} GPUs")
    per_copy_gpus = sum(tp * r for _g, tp, r, _u in owners)
    out_owners: list[OwnerDeployment] = []
    gpus_by_type: dict[str, int] = {}
    nodes_by_type: dict[str, int] = {}
    shared = stage_link == "intra_node"
    for o, (gpu, tp, replicas, usd) in enumerate(owners):
        groups = copies * replicas
        nodes = None if shared else math.ceil(groups / (gpus_per_node[gpu] // tp))
        out_owners.append(OwnerDeployment(index=o, gpu=gpu, tensor_parallel=tp, replicas=groups, gpus=groups * tp,
                                          nodes=nodes, usd_per_hour=rounded(groups * usd)))
        gpus_by_type[gpu] = gpus_by_type.get(gpu, 0) + groups * tp
        if nodes is not None:
            nodes_by_type[gpu] = nodes_by_type.get(gpu, 0) + nodes
    if shared:
        types = {g for g, *_ in owners}
        if len(types) != 1:
            raise UserError(f"plan: stage_link intra_node but owners use {len(types)} GPU types")
        (gpu,) = types
        if per_copy_gpus > gpus_per_node[gpu]:
            raise UserError(f"plan: stage_link intra_node but a copy's {per_copy_gpus} GPUs exceed a {gpu} "
                            f"node of {gpus_per_node[gpu]}")
        nodes_by_type[gpu] = math.ceil(copies / (gpus_per_node[gpu] // per_copy_gpus))
    tokens_per_copy = float(_exact(global_batch) * 1000 / _exact(tpot_ms))
    return Deployment(
        target_tokens_per_s=None if target_tokens_per_s is None else float(target_tokens_per_s),
        target_concurrency=target_concurrency,
        tokens_per_s_per_copy=rounded(tokens_per_copy), concurrency_per_copy=global_batch, copies=copies,
        tokens_per_s=rounded(copies * tokens_per_copy), concurrency=copies * global_batch,
        owners=out_owners, gpus_total=copies * per_copy_gpus,
        gpus_by_type=dict(sorted(gpus_by_type.items())), nodes_total=sum(nodes_by_type.values()),
        nodes_by_type=dict(sorted(nodes_by_type.items())), node_rule=NODE_RULES[stage_link],
        usd_per_hour=rounded(copies * sum(r * usd for _g, _tp, r, usd in owners)),
    )


def size_deployment(plan: Plan, *, target_tokens_per_s: float | None = None,
                    target_concurrency: int | None = None, gpus_per_node: dict[str, int]) -> Deployment:
    """Size a deployment of `plan` for a target load (`gpus_per_node`: GPU id -> GPUs per node,
    from the catalog in effect). Throughput uses the mean step TPOT (a workload plan's
    `tpot_ms` is a percentile; tokens per second are B over the mean), as its cost does."""
    tpot = plan.tpot.mean_ms if plan.tpot is not None else plan.tpot_ms
    return size(global_batch=plan.global_batch, tpot_ms=tpot,
                owners=[(o.gpu, o.tensor_parallel, o.replicas, o.usd_per_hour_per_replica) for o in plan.owners],
                stage_link=plan.metrics.stage_link, gpus_per_node=gpus_per_node,
                target_tokens_per_s=target_tokens_per_s, target_concurrency=target_concurrency)


def _count(n: float) -> str:
    return f"{n:,.0f}" if float(n).is_integer() or n >= 100 else f"{n:.4g}"


def deployment_lines(dep: Deployment) -> list[str]:
    """The summary lines of a deployment (no CLI, no colour)."""
    targets = [f"{_count(dep.target_tokens_per_s)} tokens/s" if dep.target_tokens_per_s is not None else "",
               f"{dep.target_concurrency:,} concurrent request{'s' if dep.target_concurrency != 1 else ''}"
               if dep.target_concurrency is not None else ""]
    want = " and ".join(t for t in targets if t)
    from opweave_planner.report import COST_SCOPE

    pool = COST_SCOPE[dep.mode]
    lines = [f"deployment ({pool}) for {want}: {dep.copies} cop{'y' if dep.copies == 1 else 'ies'} of the plan "
             f"(each {_count(dep.tokens_per_s_per_copy)} tokens/s, {dep.concurrency_per_copy:,} requests), "
             f"capacity {_count(dep.tokens_per_s)} tokens/s, {dep.concurrency:,} requests"]
    for o in dep.owners:
        where = f", {o.nodes} node{'s' if o.nodes != 1 else ''}" if o.nodes is not None else ""
        lines.append(f"  owner {o.index}: {o.replicas}x {o.gpu} TP{o.tensor_parallel} = {o.gpus} GPUs{where}, "
                     f"{o.usd_per_hour:,.2f} USD/h")
    by_type = ", ".join(f"{g} {n}" for g, n in dep.gpus_by_type.items())
    nodes = ", ".join(f"{g} {n}" for g, n in dep.nodes_by_type.items())
    lines.append(f"  {dep.gpus_total} GPUs ({by_type}) on {dep.nodes_total} node{'s' if dep.nodes_total != 1 else ''} "
                 f"({nodes}; {dep.node_rule})")
    lines.append(f"  cost: {dep.usd_per_hour:,.2f} USD per hour ({pool})")
    if dep.tpot_p95_at_load_ms is not None:
        lines.append(f"  p95 TPOT at this load ~{dep.tpot_p95_at_load_ms:,.2f} ms (mean occupancy "
                     f"{dep.mean_occupancy_at_load:,.1f} requests per microbatch); guaranteed <= "
                     f"{dep.tpot_p95_full_occupancy_ms:,.2f} ms at full occupancy")
    if dep.mode is not None:
        lines += prefill_lines(dep)
    return lines


def prefill_lines(dep: Deployment) -> list[str]:
    """The prefill pool and the all-in cost of a disaggregated deployment (schema 1.14: none,
    and why)."""
    a, p = dep.arrivals, dep.prefill
    src = f"trace x{a.rate_scale or 1:g}" if a.process == "trace" else f"Poisson, seed {a.seed}"
    if p is None:
        miss = dep.disaggregated_infeasible
        why = "not planned (--deployment-mode aggregated)" if miss is None else f"infeasible: {miss.reason}"
        return [f"prefill pool for {a.rate:.4g} requests/s ({src}, {a.requests:,} replayed, mean prompt "
                f"{a.mean_prompt_tokens:,.0f} tokens): none, {why}"]
    return [
        f"prefill pool for {a.rate:.4g} requests/s ({src}, {a.requests:,} replayed, mean prompt "
        f"{a.mean_prompt_tokens:,.0f} tokens): {p.instances}x {p.gpu} TP{p.tensor_parallel} = {p.gpus} GPU{'s' if p.gpus != 1 else ''}, "
        f"{p.usd_per_hour:,.2f} USD/h",
        f"  p{p.ttft_percentile:g} TTFT {p.ttft_ms:,.1f} ms <= {p.ttft_slo_ms:g} ms (mean {p.ttft_mean_ms:,.1f}: "
        f"wait {p.wait_mean_ms:,.1f} + prefill {p.prefill_mean_ms:,.1f} + hand-off {p.handoff_mean_ms:,.1f}; "
        f"M/G/c mean wait {p.mgc_wait_mean_ms:,.1f}), utilisation {p.utilisation:.2f}, "
        f"cheapest of {p.options} (GPU, TP) options; measured share of the prefill time {p.measured_share:.0%}",
        f"  all-in: {dep.usd_per_hour_all_in:,.2f} USD per hour, {dep.usd_per_million_output_tokens_all_in:.4f} "
        f"USD/M output tokens (decode {dep.usd_per_million_output_tokens_decode:.4f} + prefill "
        f"{dep.usd_per_million_output_tokens_prefill:.4f} + hand-off 0), "
        f"{dep.usd_per_million_input_tokens:.4f} USD/M input tokens (prefill pool); {dep.binding_pool} pool binds "
        f"the cost (prefill {p.cost_share:.0%})",
    ]
