"""Depth-first branch-and-bound over the owners' frontiers, one template at a time (numba).

`search_template` walks every (B, mu) of the grid: owner points, the
network-safe frontier, then a DFS that visits combinations in lexicographic
order of the sorted point lists. A candidate replaces the incumbent only if it
is cheaper, or equally cheap with fewer GPUs; pruning uses strict comparisons
with a 1e-12 margin, so it never removes a candidate that could tie. The
result therefore equals exhaustive enumeration (tests/test_search_exact.py); with the
frontier, up to the simulator's floating-point rounding (points.pareto_sorted).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from opweave_planner.compile.problem import PRUNE_EPS, Problem, objective_flags
from opweave_planner.jit import entry, kernel
from opweave_planner.search.bounds import (
    coupled_exceeds,
    floor_prunes,
    lower_bound,
    point_staircase,
    split_exceeds,
    template_floor,
)
from opweave_planner.search.evaluate import (
    NODE_TOL,
    evaluate_into,
    evaluate_workload_into,
    new_scratch,
    plan_gpus,
    plan_link,
    plan_nodes,
)
from opweave_planner.search.points import (
    C_BOUND,
    C_CAND,
    C_SIM,
    build_points,
    new_points,
    owner_tables,
    pareto_filter,
    pareto_sorted,
    point_minima,
    sort_points,
)
from opweave_planner.search.state import Counters, SearchResult, Selection

EPS = PRUNE_EPS


class Caps(NamedTuple):
    """What the walk and its leaf compare against, derived once per search from the limits."""

    slo: float  # Limits.slo (1 + 1e-12): an SLO tie is never pruned
    gpus: float  # Limits.max_gpus + 1e-9
    nodes: float  # Limits.max_nodes
    cost_factor: float  # Limits.prune_factor
    transfer_fixed_min: float  # the cheapest NCCL call of any config: what the bounds may assume
    use_bnb: bool


@kernel(inline=True, refcount=False)
def _select(pts, sc, k):
    for o in range(k):
        q = sc.sel[o]
        sc.cfg[o], sc.mb[o], sc.bh[o], sc.rep[o] = pts.c[o, q], pts.m[o, q], pts.bh[o, q], pts.n[o, q]


@kernel(inline=True)
def _leaf(caps, p, pts, sc, B, mu, fixed, workload):
    """Simulate a complete assignment that survived the bounds; keep it if it is the best.

    fixed / workload: the objective's flags, exactly one of them None (see `objective_flags`)."""
    fab, k = p.fabric, p.stages.k
    if plan_nodes(fab, sc.cfg, sc.rep) > caps.nodes:
        sc.counters[C_BOUND] += 1
        return
    sc.counters[C_SIM] += 1
    trtt = tmean = 0.0
    if fixed is not None:  # a fixed context
        trtt = evaluate_into(p, mu, sc)
        tmean = trtt
    if workload is not None:  # a workload: the percentile for the SLO, the mean for the cost
        trtt, tmean = evaluate_workload_into(p, B, mu, sc, caps.slo)
    if trtt > caps.slo:
        return
    rsum = 0.0
    for o in range(k):
        rsum += pts.r[o, sc.sel[o]]
    gpus = plan_gpus(fab, sc.cfg, sc.rep)
    cost = tmean * rsum
    bf = sc.best_f
    if cost < bf[0] or (cost == bf[0] and gpus < bf[2] - NODE_TOL):
        bf[0], bf[1], bf[2], bf[4] = cost, trtt, gpus, tmean
        bf[3] = min(bf[3], cost)
        sc.best_i[0], sc.best_i[1] = B, mu
        for o in range(k):
            sc.best_i[2 + 3 * o] = sc.cfg[o]
            sc.best_i[3 + 3 * o] = sc.rep[o]
            sc.best_i[4 + 3 * o] = sc.mb[o]


@kernel(refcount=False)
def walk(caps, fab, ot, pts, sc, B, mu, opt_link):
    """DFS over the product of the owners' sorted frontiers at one (B, mu).

    Returns True when it stops at a complete assignment that survived the bounds (the
    caller simulates it and calls again to resume), False when the walk is done. Simulation
    allocates, so it runs outside this reference-count-free function.
    """
    k, use_bnb, state = pts.count.shape[0], caps.use_bnb, sc.walk_state
    sel, count, r, min_r, counters, best_f = sc.sel, pts.count, pts.r, pts.min_r, sc.counters, sc.best_f
    factor, slo_cap, gpu_cap, tx_min = caps.cost_factor, caps.slo, caps.gpus, caps.transfer_fixed_min
    if state[1] == 1:
        level = state[0]
    else:
        level = 0
        sel[0] = -1
    while level >= 0:
        sel[level] += 1
        if sel[level] >= count[level]:
            level -= 1
            continue
        depth = level + 1
        incumbent = best_f[3]
        if use_bnb and incumbent < np.inf:
            # points are sorted by r: once the optimistic cost with this point's r exceeds the
            # incumbent (T bound with this owner still optimistic), every later point does too
            t_opt, r_opt, _g = lower_bound(ot, pts, sc, level, B, mu, opt_link[0], opt_link[1] + tx_min)
            if t_opt * (r_opt - min_r[level] + r[level, sel[level]]) > incumbent * factor:
                counters[C_BOUND] += count[level] - sel[level]
                sel[level] = count[level]
                continue
        link_bw, link_lat = opt_link[0], opt_link[1]
        if depth == k:
            _select(pts, sc, k)
            link_bw, link_lat, _intra = plan_link(fab, sc.cfg, plan_gpus(fab, sc.cfg, sc.rep))
        if use_bnb or depth == k:
            t_lb, rsum, gpus = lower_bound(ot, pts, sc, depth, B, mu, link_bw, link_lat + tx_min)
            if depth == k:
                counters[C_CAND] += 1
            if t_lb > slo_cap or gpus > gpu_cap or t_lb * rsum > incumbent * factor:
                counters[C_BOUND] += 1
                continue
            if use_bnb and depth < k:
                r_fixed, r_rest = 0.0, 0.0
                for o in range(depth):
                    r_fixed += r[o, sel[o]]
                for o in range(depth, k):
                    r_rest += min_r[o]
                if coupled_exceeds(pts, depth, mu, t_lb, r_fixed, r_rest, incumbent * factor, slo_cap):
                    counters[C_BOUND] += 1
                    continue
        if depth < k:
            level = depth
            sel[level] = -1
            continue
        state[0], state[1] = level, 1
        return True
    state[1] = 0
    return False


@kernel(refcount=False)
def _collect(p, ot, B, mu, pts):
    """Build every owner's points; -1 when an owner has none, else the summed minimum rho."""
    rho_floor = 0.0
    for o in range(p.stages.k):
        if build_points(p, ot, o, B, mu, pts) == 0:
            return -1.0
        least = pts.rho[o, 0]
        for a in range(1, pts.count[o]):
            least = min(least, pts.rho[o, a])
        rho_floor += least
    return rho_floor


@kernel(inline=True, refcount=False)
def _root_prunes(caps, ot, pts, sc, B, mu, opt_link):
    """The bounds of a (B, mu) with every owner open, before the frontier and the sort (most of a
    (B, mu)'s cost): the walk's bound at the owners' minima, the split bound (one pass, no sort)
    and then the coupled bound on staircases built from the unsorted points. Both are the walk's own bounds at the root, and
    the coupled one there is at most its value below any first owner's point (that point's r
    is at least f_0 at the larger T bound), so they prune only (B, mu) whose every branch the
    walk would prune: the same result, fewer frontiers, sorts and walks."""
    k, thr = pts.count.shape[0], sc.best_f[3] * caps.cost_factor
    r_rest = 0.0
    for o in range(k):
        point_minima(pts, o)
        r_rest += pts.min_r[o]
    t_lb, rsum, gpus = lower_bound(ot, pts, sc, 0, B, mu, opt_link[0], opt_link[1] + caps.transfer_fixed_min)
    if t_lb > caps.slo or gpus > caps.gpus or t_lb * rsum > thr or split_exceeds(pts, mu, t_lb, thr, caps.slo):
        return True
    for o in range(k):
        point_staircase(pts, o, mu, r_rest, thr, caps.slo)
    return coupled_exceeds(pts, 0, mu, t_lb, 0.0, r_rest, thr, caps.slo)


@kernel(inline=True)
def _search(p, seed_cost, use_pareto, use_bnb, floored, fixed, workload):
    # fixed / workload: the objective's flags from `objective_flags`, exactly one of them None;
    # the None one's branches are dropped at compile time, so each mode compiles only its own kernels;
    # floored: the caller's pre-floor already found the floor below the seed (the same bits)
    sc = new_scratch(p, seed_cost)
    fab, lim = p.fabric, p.limits
    ot = owner_tables(p)
    if use_bnb and not floored and floor_prunes(template_floor(p, ot), seed_cost, lim.prune_factor):
        # no candidate can beat the seed: one prune for the template, from its owner tables' sums
        # (the driver's pre-floor, search/prefloor.py, skips the same templates unbuilt)
        sc.counters[C_BOUND] += 1
        return sc.best_f, sc.best_i, sc.counters
    pts = new_points(p)
    node_max, intra_max, tx_min = 0, 0.0, np.inf  # loops, not ndarray.max(): less to compile
    for c in range(fab.cfg_node.shape[0]):
        node_max = max(node_max, fab.cfg_node[c])
        intra_max = max(intra_max, fab.cfg_intra_bw[c])
        tx_min = min(tx_min, fab.cfg_transfer_fixed[c])
    caps = Caps(slo=lim.slo * (1 + EPS), gpus=lim.max_gpus + NODE_TOL, nodes=lim.max_nodes,
                cost_factor=lim.prune_factor, transfer_fixed_min=tx_min, use_bnb=use_bnb)
    batches, max_mu, k = p.grid.batches, p.grid.max_mu, p.stages.k
    for bi in range(batches.shape[0]):
        B = batches[bi]
        for mu in range(1, max_mu + 1):
            if B % mu != 0:
                continue
            rho_floor = _collect(p, ot, B, mu, pts)
            if rho_floor < 0.0:
                continue
            # a single-node plan is still possible: bounds must assume the faster link
            one_node = k > 1 and B * rho_floor <= node_max + NODE_TOL
            opt_link = (max(fab.bw, intra_max), min(fab.lat, fab.intra_lat)) if one_node else (fab.bw, fab.lat)
            if use_bnb and _root_prunes(caps, ot, pts, sc, B, mu, opt_link):
                sc.counters[C_BOUND] += 1
                continue
            for o in range(k):
                if use_pareto and workload is not None and pts.count[o] > 1:
                    # a workload: equal replicas and TP only (a replica count changes the barrier)
                    pareto_filter(fab, ot, o, not one_node, pts, sc.counters)
                sort_points(pts, o)
                if use_pareto and fixed is not None and pts.count[o] > 1:
                    pareto_sorted(fab, ot, o, not one_node, pts, sc.counters)
            while walk(caps, fab, ot, pts, sc, B, mu, opt_link):
                _leaf(caps, p, pts, sc, B, mu, fixed, workload)
    return sc.best_f, sc.best_i, sc.counters


@entry
def _search_fixed(p, seed_cost, use_pareto, use_bnb, floored):
    """`_search` of a fixed context. Each objective has its own entry, so each entry has one
    signature and its own cache file: the first-run notice can tell which objective is cached
    (jit.PLAN_ENTRIES), and two processes of different objectives never rewrite one index."""
    return _search(p, seed_cost, use_pareto, use_bnb, floored, True, None)


@entry
def _search_workload(p, seed_cost, use_pareto, use_bnb, floored):
    """`_search` of a workload (see `_search_fixed`)."""
    return _search(p, seed_cost, use_pareto, use_bnb, floored, None, True)


@entry
def template_floor_of(p):
    """`template_floor` of a Problem (tests: it never exceeds the template's optimum)."""
    return template_floor(p, owner_tables(p))


def search_template(p: Problem, seed_cost: float = math.inf, use_pareto: bool = True,
                    use_bnb: bool = True, floored: bool = False) -> SearchResult:
    """The cheapest SLO-feasible Selection of one template's Problem over every (B, mu).

    floored: the template floor is known not to prune at this seed (the driver's pre-floor ran
    the same kernels on it), so the kernel does not compute it again."""
    fixed, _workload = objective_flags(p)
    run = _search_fixed if fixed else _search_workload
    best_f, best_i, counters = run(p, float(seed_cost), bool(use_pareto), bool(use_bnb), bool(floored))
    # one copy of the winner's (cfg, replicas, mb) triples, its rows the Selection's arrays; plain
    # Python floats and ints through tolist (this runs once per template visit)
    k = p.stages.k
    per_owner = best_i[2:2 + 3 * k].reshape(k, 3).T.copy()
    cost, t_rtt, gpus, _incumbent, t_mean = best_f.tolist()
    sel = Selection(batch=int(best_i[0]), mu=int(best_i[1]), cfg=per_owner[0], replicas=per_owner[1],
                    mb=per_owner[2])
    return SearchResult(found=math.isfinite(cost), cost=cost, t_rtt=t_rtt, gpus=gpus, selection=sel,
                        counters=Counters(*counters.tolist()), t_mean=t_mean)
