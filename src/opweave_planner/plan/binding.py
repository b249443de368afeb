"""What binds a feasible plan's batch: why the search stopped at B and not at the next batch.

The optimum's shape (template, GPU configurations, mu, replicas) is scored at the next batch
B' it can split (divisible by mu x replicas of every owner) that the search could have chosen,
by the search's own evaluator: memory that does not fit there, a TPOT over the SLO there, or a
plan that fits and is simply dearer. When memory binds, one search of the same template at B'
says what relieving it costs (more replicas), and whether the GPU or node cap forbids that.

Which B' is next follows what the search covers. A one-stage plan's search is exact over every
integer batch up to the grid's largest at a fixed context with the batch caps on (docs/search.md#batches), so B' is the
next multiple of mu x replicas above B (B + 1 for one replica and one microbatch: the
--max-num-seqs a user would try next), not the next grid point, which can be far above a cap
(B = 228 from the SLO cap read "B=240"). Other templates search the grid, so B' is its next
point they can split. A B' off the tables is scored on tables built for B' alone.
"""

from __future__ import annotations

import math

from opweave_planner.plan.build import usd_per_million_tokens
from opweave_planner.plan.io import rounded
from opweave_planner.plan.outcome import Binding
from opweave_planner.plan.schema import BindingOut

__all__ = ["binding_of", "next_batch"]

GIB = 2**30


def next_batch(batches, batch: int, splits, every_integer: bool = False) -> int | None:
    """The smallest batch above `batch` that every owner's mu x replicas divides: among the
    searched `batches`, or (`every_integer`, a one-stage plan) any integer up to their largest."""
    if every_integer:
        step = math.lcm(*(int(s) for s in splits))
        nxt = (batch // step + 1) * step
        return nxt if nxt <= max(int(b) for b in batches) else None
    above = sorted(int(b) for b in batches if int(b) > batch and all(int(b) % s == 0 for s in splits))
    return above[0] if above else None


def _at_batch(ctx, batch: int):
    """`ctx` if its tables hold every microbatch of `batch`, else the request compiled for that
    batch alone (no caps): the same configurations, in the same order, on tables of B' only."""
    from opweave_planner.compile import compile_request
    from opweave_planner.compile.space import microbatch_grid

    req = ctx.request
    have = set(int(b) for b in ctx.tables.grid.mb_grid)
    if set(microbatch_grid(req, (batch,))) <= have:
        return ctx
    return compile_request(req.model_copy(update={"batches": (batch,), "batch_caps": False}), hw=ctx.hw)


def _usd(cost: float) -> float:
    return rounded(usd_per_million_tokens(cost))


def _relief(ctx, template, batch: int, lift_caps: bool):
    """The cheapest plan of `template` at exactly `batch` under the request's SLO (caps lifted
    if asked): a SearchResult, or None."""
    from opweave_planner.compile.problem import typed_part
    from opweave_planner.search.walk import search_template

    req = ctx.request
    prob = ctx.problem(template, batches=(batch,))
    if lift_caps:
        prob = prob._replace(limits=typed_part(prob.limits._replace(max_gpus=math.inf, max_nodes=math.inf)))
    res = search_template(prob, math.inf, req.pareto, req.bnb)
    return res if res.found else None


def binding_of(ctx, template, sel, ev) -> BindingOut:
    """The constraint that keeps the plan (`sel`, evaluated as `ev`) at its batch, with figures."""
    import numpy as np

    from opweave_planner.search.evaluate import evaluate
    from opweave_planner.search.state import Selection

    req = ctx.request
    splits = [sel.mu * int(r) for r in sel.replicas]
    # every integer batch is covered only where the caps prove it: one stage, caps on, a fixed
    # context (under a workload the SLO caps are not built, so B + 1 might be a cheaper plan)
    every = ctx.stage_plan(template).n_stages == 1 and req.batch_caps and not req.stochastic
    nxt = next_batch(ctx.tables.grid.batches, sel.batch, splits, every_integer=every)
    if nxt is None:
        return BindingOut(constraint=Binding.BATCHES.value)
    ctx = _at_batch(ctx, nxt)
    grid = ctx.tables.grid
    mb = np.array([grid.mb_index[nxt // s] for s in splits], np.int64)
    at = Selection(batch=nxt, mu=sel.mu, cfg=sel.cfg, replicas=sel.replicas, mb=mb)
    ev2 = evaluate(ctx.problem(template, batches=(nxt,)), at)
    # the owner closest to its memory at the next batch
    o = max(range(len(sel.cfg)), key=lambda i: ev2.memory_need[i] / ev2.memory_usable[i])
    memory = dict(memory_owner=o, memory_used_gib=rounded(float(ev.memory_need[o]) / GIB, 6),
                  memory_usable_gib=rounded(float(ev.memory_usable[o]) / GIB, 6),
                  memory_next_gib=rounded(float(ev2.memory_need[o]) / GIB, 6))
    if ev2.fits_memory:
        kind = Binding.SLO if ev2.t_rtt > req.slo_ms * 1e3 else Binding.COST
        return BindingOut(constraint=kind.value, next_batch=nxt, **memory,
                          next_tpot_ms=rounded(ev2.t_rtt / 1e3), next_usd_per_million_tokens=_usd(ev2.cost),
                          next_gpus_total=round(ev2.gpus))
    kind, res = Binding.MEMORY, _relief(ctx, template, nxt, lift_caps=False)
    if res is None:
        res = _relief(ctx, template, nxt, lift_caps=True)
        if res is not None:
            kind = Binding.GPUS if res.gpus > req.max_gpus else Binding.NODES
    if res is None:
        return BindingOut(constraint=kind.value, next_batch=nxt, **memory)
    return BindingOut(constraint=kind.value, next_batch=nxt, **memory, next_tpot_ms=rounded(res.t_rtt / 1e3),
                      next_usd_per_million_tokens=_usd(res.cost), next_gpus_total=round(res.gpus))
