"""Algorithm 1: for each template, search all (B, mu) in numba; keep the best plan.

The colocated template is searched first; its cost seeds every other
template's incumbent, so pruning does not depend on how templates are split
across worker processes and `--jobs N` returns the same bytes as `--jobs 1`.
Across templates the winner is the smallest (cost, GPUs, stages, template order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from opweave_planner.inputs.hardware import Hardware, load_hardware
from opweave_planner.inputs.model import load_model
from opweave_planner.inputs.request import PlanRequest
from opweave_planner.policies import templates_for
from opweave_planner.procs import deferred_interrupts, process_pool
from opweave_planner.search.arrays import SearchArrays, build_arrays, make_problem, stage_arrays
from opweave_planner.search.problem import Counters, Problem, Selection
from opweave_planner.structure.operators import OperatorSequence, build_sequence
from opweave_planner.structure.templates import StagePlan, Template, expand


@dataclass
class Candidate:
    """The best plan of one template: where it is, what it costs, and its Selection."""

    template_index: int
    template: Template
    cost: float  # cost rate x µs
    t_rtt_us: float
    gpus: int
    n_stages: int
    selection: Selection

    def order_key(self) -> tuple:
        return (self.cost, self.gpus, self.n_stages, self.template_index)


@dataclass
class SearchOutcome:
    best: Candidate | None
    counters: Counters = field(default_factory=Counters)
    templates: int = 0


@dataclass
class Context:
    """Everything a worker needs, rebuilt from the request in each process."""

    request: PlanRequest
    hw: Hardware
    seq: OperatorSequence
    arrays: SearchArrays
    templates: list[Template]

    def problem(self, template: Template, *, slo_us: float | None = None, latency_objective: bool = False,
                batches: tuple[int, ...] | None = None) -> tuple[StagePlan, Problem]:
        """The template's expansion and its Problem under this request."""
        splan = expand(self.seq, template)
        req = self.request
        prob = make_problem(self.arrays, stage_arrays(self.seq, splan), req,
                            batches=req.batches if batches is None else batches,
                            slo_us=req.slo_ms * 1e3 if slo_us is None else slo_us,
                            latency_objective=latency_objective)
        return splan, prob


def hardware_for(req: PlanRequest) -> Hardware:
    return load_hardware(req.catalog, req.prices).with_network(
        inter_node_gbps=req.network_bandwidth, inter_node_latency_us=req.network_latency)


def make_context(req: PlanRequest, hw: Hardware | None = None, seq: OperatorSequence | None = None) -> Context:
    hw = hw or hardware_for(req)
    seq = seq or build_sequence(load_model(req.model))
    arrays = build_arrays(seq, hw, req)
    return Context(req, hw, seq, arrays, templates_for(seq, req.policy, req.max_owners))


def _search_one(ctx: Context, index: int, seed_cost: float, slo_us: float, latency_objective: bool):
    from opweave_planner.search.walk import search_template

    tmpl = ctx.templates[index]
    splan, prob = ctx.problem(tmpl, slo_us=slo_us, latency_objective=latency_objective)
    req = ctx.request
    if req.max_stages is not None and splan.n_stages > req.max_stages:
        return None, Counters()
    res = search_template(prob, seed_cost, req.pareto, req.bnb)
    cand = None
    if res.found:
        cand = Candidate(index, tmpl, res.cost, res.t_rtt, round(res.gpus), splan.n_stages, res.selection)
    return cand, res.counters


_WORKER: dict = {}


def _worker_run(req: PlanRequest, indices: list[int], seed: float, slo_us: float, lat_obj: bool):
    ctx = _WORKER.get(req)
    if ctx is None:
        ctx = _WORKER[req] = make_context(req)
    return [_search_one(ctx, i, seed, slo_us, lat_obj) for i in indices]


def _better(a: Candidate | None, b: Candidate | None) -> Candidate | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a.order_key() <= b.order_key() else b


def run_search(ctx: Context, jobs: int = 1, progress=None, slo_ms: float | None = None,
               latency_objective: bool = False) -> SearchOutcome:
    """Search every template of the context's policy; deterministic for any `jobs`.

    Ctrl-C and SIGTERM are deferred to between kernel calls (never raised inside a numba
    frame) and then stop the search; worker processes die with their parent.
    """
    slo_us = (ctx.request.slo_ms if slo_ms is None else slo_ms) * 1e3
    n = len(ctx.templates)
    with deferred_interrupts() as check:
        # phase 1: the colocated (or first) template seeds the incumbent
        best, totals = _search_one(ctx, 0, math.inf, slo_us, latency_objective)
        check()
        seed = best.cost if best else math.inf
        rest = list(range(1, n))
        if progress:
            progress(1, n)
        if jobs <= 1 or len(rest) < 2 * jobs:
            runs = ([(i, _search_one(ctx, i, seed, slo_us, latency_objective))] for i in rest)
        else:
            runs = _pooled(ctx, rest, jobs, seed, slo_us, latency_objective)
        done = 1
        for results in runs:
            for _i, (cand, counters) in results:
                totals += counters
                best = _better(best, cand)
                done += 1
            if progress:
                progress(done, n)
            check()
    return SearchOutcome(best, totals, n)


def _pooled(ctx: Context, rest: list[int], jobs: int, seed: float, slo_us: float, lat_obj: bool):
    """Chunks of templates on worker processes, yielded in a fixed order (same bytes as jobs=1)."""
    chunks = [rest[i::jobs * 4] for i in range(jobs * 4)]
    with process_pool(jobs) as pool:
        futures = [(ch, pool.submit(_worker_run, ctx.request, ch, seed, slo_us, lat_obj)) for ch in chunks if ch]
        for ch, fut in futures:
            yield list(zip(ch, fut.result(), strict=True))
