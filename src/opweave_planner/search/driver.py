"""Algorithm 1: for each template, search all (B, mu) in numba; keep the best plan.

The colocated template is searched first; its cost seeds every other
template's incumbent, so pruning does not depend on how templates are split
across worker processes and `--jobs N` returns the same bytes as `--jobs 1`.
Across templates the winner is the smallest (cost, GPUs, stages, template order).
"""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from opweave_planner.inputs.hardware import Hardware, load_hardware
from opweave_planner.inputs.model import load_model
from opweave_planner.policies import templates_for
from opweave_planner.search.arrays import SearchArrays, build_arrays, owner_ok, stage_arrays
from opweave_planner.search.space import SearchRequest
from opweave_planner.structure.operators import OperatorSequence, build_sequence
from opweave_planner.structure.templates import Template, expand


@dataclass(frozen=True)
class Owner:
    config: int
    replicas: int
    mb_index: int


@dataclass
class Candidate:
    template_index: int
    template: Template
    cost: float  # r-units x µs
    t_rtt_us: float
    gpus: int
    n_stages: int
    batch: int
    mu: int
    owners: tuple[Owner, ...]

    def order_key(self) -> tuple:
        return (self.cost, self.gpus, self.n_stages, self.template_index)


@dataclass
class SearchOutcome:
    best: Candidate | None
    counters: dict[str, int] = field(default_factory=dict)
    templates: int = 0


@dataclass
class Context:
    """Everything a worker needs, rebuilt from the request in each process."""

    request: SearchRequest
    hw: Hardware
    seq: OperatorSequence
    arrays: SearchArrays
    templates: list[Template]


def make_context(req: SearchRequest) -> Context:
    hw = load_hardware(req.catalog, req.prices).with_network(
        inter_node_gbps=req.network_gbps, inter_node_latency_us=req.network_latency_us)
    seq = build_sequence(load_model(req.model))
    space = req.space
    arrays = build_arrays(seq, hw, space.gpus, space.tps, space.moe_expert_parallel, req.context,
                          space.microbatch_grid(), req.profiles_dir, req.backend, req.reserve_gb)
    return Context(req, hw, seq, arrays, templates_for(seq, space.policy, space.max_owners))


def _search_one(ctx: Context, index: int, seed_cost: float, slo_us: float, latency_objective: bool):
    from opweave_planner.search.kernels import search_template

    tmpl = ctx.templates[index]
    plan = expand(ctx.seq, tmpl)
    st = stage_arrays(ctx.seq, plan)
    a = ctx.arrays
    sp = ctx.request.space
    found, best_f, best_i, counters = search_template(
        st.owner, st.start, st.end, st.payload, st.k, a.pref, a.wpref, a.kvpref,
        a.cfg_tp, a.cfg_price, a.cfg_mem, a.cfg_ws, owner_ok(a, st), a.cfg_gpu, a.cfg_node,
        a.cfg_intra_bw, a.mb_index, np.array(sp.batches, np.int64), sp.max_microbatches,
        sp.max_replicas, float(sp.max_gpus), a.bw, a.lat, a.intra_lat, slo_us, seed_cost, ctx.request.use_pareto, ctx.request.use_bnb, latency_objective,
    )
    cand = None
    if found:
        owners = tuple(Owner(int(best_i[2 + 3 * o]), int(best_i[3 + 3 * o]), int(best_i[4 + 3 * o]))
                       for o in range(st.k))
        cand = Candidate(index, tmpl, float(best_f[0]), float(best_f[1]), round(best_f[2]),
                         plan.n_stages, int(best_i[0]), int(best_i[1]), owners)
    return cand, counters


_WORKER: dict = {}


def _worker_run(req: SearchRequest, indices: list[int], seed: float, slo_us: float, lat_obj: bool):
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
    """Search every template of the context's policy; deterministic for any `jobs`."""
    slo_us = (ctx.request.slo_ms if slo_ms is None else slo_ms) * 1e3
    totals = np.zeros(4, np.int64)
    # phase 1: the colocated (or first) template seeds the incumbent
    best, counters = _search_one(ctx, 0, math.inf, slo_us, latency_objective)
    totals += counters
    seed = best.cost if best else math.inf
    rest = list(range(1, len(ctx.templates)))
    if progress:
        progress(1, len(ctx.templates))
    if jobs <= 1 or len(rest) < 2 * jobs:
        for done, i in enumerate(rest, start=2):
            cand, counters = _search_one(ctx, i, seed, slo_us, latency_objective)
            totals += counters
            best = _better(best, cand)
            if progress:
                progress(done, len(ctx.templates))
    else:
        chunks = [rest[i::jobs * 4] for i in range(jobs * 4)]
        done = 1
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(_worker_run, ctx.request, ch, seed, slo_us, latency_objective)
                       for ch in chunks if ch]
            for fut in futures:
                for cand, counters in fut.result():
                    totals += counters
                    best = _better(best, cand)
                    done += 1
                if progress:
                    progress(done, len(ctx.templates))
    names = ("candidates", "simulations", "pruned_by_bound", "pruned_by_frontier")
    return SearchOutcome(best, {n: int(v) for n, v in zip(names, totals, strict=True)},
                         len(ctx.templates))
