"""Depth-first branch-and-bound over the owners' frontiers, one template at a time (numba).

`search_template` walks every (B, mu) of the grid: owner points, the
network-safe frontier, then a DFS that visits combinations in lexicographic
order of the sorted point lists. A candidate replaces the incumbent only if it
is cheaper, or equally cheap with fewer GPUs; pruning uses strict comparisons
with a 1e-12 margin, so it never removes a candidate that could tie. The
result therefore equals exhaustive enumeration (tests/test_search_exact.py).
"""

from __future__ import annotations

import math

import numpy as np

from opweave_planner.jit import entry, kernel
from opweave_planner.search.bounds import lower_bound
from opweave_planner.search.evaluate import (
    NODE_TOL,
    evaluate_into,
    evaluate_workload_into,
    fabric,
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
    sort_points,
)
from opweave_planner.search.problem import (
    PRUNE_EPS,
    Counters,
    Hot,
    Problem,
    SearchResult,
    Selection,
    objective_flags,
)

EPS = PRUNE_EPS


@kernel(inline=True, refcount=False)
def _select(pts, sc, k):
    for o in range(k):
        q = sc.sel[o]
        sc.cfg[o], sc.mb[o], sc.bh[o], sc.rep[o] = pts.c[o, q], pts.m[o, q], pts.bh[o, q], pts.n[o, q]


@kernel(inline=True)
def _leaf(h, p, pts, sc, B, mu, fixed, workload):
    """Simulate a complete assignment that survived the bounds; keep it if it is the best.

    fixed / workload: the objective's flags, exactly one of them None (see `objective_flags`)."""
    if plan_nodes(fabric(h), sc.cfg, sc.rep) > h.max_nodes:
        sc.counters[C_BOUND] += 1
        return
    sc.counters[C_SIM] += 1
    trtt = tmean = 0.0
    if fixed is not None:  # a fixed context
        trtt = evaluate_into(p, mu, sc)
        tmean = trtt
    if workload is not None:  # a workload: the percentile for the SLO, the mean for the cost
        trtt, tmean = evaluate_workload_into(p, B, mu, sc, h.slo_cap)
    if trtt > h.slo_cap:
        return
    rsum = 0.0
    for o in range(h.k):
        rsum += pts.r[o, sc.sel[o]]
    gpus = plan_gpus(fabric(h), sc.cfg, sc.rep)
    cost = tmean * rsum
    bf = sc.best_f
    if cost < bf[0] or (cost == bf[0] and gpus < bf[2] - NODE_TOL):
        bf[0], bf[1], bf[2], bf[4] = cost, trtt, gpus, tmean
        bf[3] = min(bf[3], cost)
        sc.best_i[0], sc.best_i[1] = B, mu
        for o in range(h.k):
            sc.best_i[2 + 3 * o] = sc.cfg[o]
            sc.best_i[3 + 3 * o] = sc.rep[o]
            sc.best_i[4 + 3 * o] = sc.mb[o]


@kernel(refcount=False)
def walk(h, ot, pts, sc, B, mu, opt_link):
    """DFS over the product of the owners' sorted frontiers at one (B, mu).

    Returns True when it stops at a complete assignment that survived the bounds (the
    caller simulates it and calls again to resume), False when the walk is done. Simulation
    allocates, so it runs outside this reference-count-free function.
    """
    k, use_bnb, state = h.k, h.use_bnb, sc.walk_state
    sel, count, r, min_r, counters, best_f = sc.sel, pts.count, pts.r, pts.min_r, sc.counters, sc.best_f
    factor, slo_cap, gpu_cap, tx_min = h.prune_factor, h.slo_cap, h.gpu_cap, h.transfer_fixed_min
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
            link_bw, link_lat, _intra = plan_link(fabric(h), sc.cfg, plan_gpus(fabric(h), sc.cfg, sc.rep))
        if use_bnb or depth == k:
            t_lb, rsum, gpus = lower_bound(ot, pts, sc, depth, B, mu, link_bw, link_lat + tx_min)
            if depth == k:
                counters[C_CAND] += 1
            if t_lb > slo_cap or gpus > gpu_cap or t_lb * rsum > incumbent * factor:
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
def _collect(h, ot, B, mu, pts):
    """Build every owner's points; -1 when an owner has none, else the summed minimum rho."""
    rho_floor = 0.0
    for o in range(h.k):
        if build_points(h, ot, o, B, mu, pts) == 0:
            return -1.0
        least = pts.rho[o, 0]
        for a in range(1, pts.count[o]):
            least = min(least, pts.rho[o, a])
        rho_floor += least
    return rho_floor


@entry
def _search(p, seed_cost, use_pareto, use_bnb, fixed, workload):
    # fixed / workload: the objective's flags from `objective_flags`, exactly one of them None;
    # the None one's branches are dropped at compile time, so each mode compiles only its own kernels
    ot = owner_tables(p)
    pts = new_points(p)
    sc = new_scratch(p, seed_cost)
    node_max, intra_max, tx_min = 0, 0.0, np.inf  # loops, not ndarray.max(): less to compile
    for c in range(p.cfg_node.shape[0]):
        node_max = max(node_max, p.cfg_node[c])
        intra_max = max(intra_max, p.cfg_intra_bw[c])
        tx_min = min(tx_min, p.cfg_transfer_fixed[c])
    h = Hot(p.cfg_ok, p.mb_index, p.cfg_ws, p.cfg_mem, p.cfg_tp, p.cfg_price, p.cfg_gpu, p.cfg_node,
            p.cfg_intra_bw, p.cfg_transfer_fixed, p.units, p.k, p.max_rep, p.latency_objective, use_bnb, p.prune_factor,
            p.slo * (1 + EPS), p.max_gpus + NODE_TOL, p.max_nodes, p.bw, p.lat, p.intra_lat, tx_min)
    batches, max_mu, k = p.batches, p.max_mu, p.k
    for bi in range(batches.shape[0]):
        B = batches[bi]
        for mu in range(1, max_mu + 1):
            if B % mu != 0:
                continue
            rho_floor = _collect(h, ot, B, mu, pts)
            if rho_floor < 0.0:
                continue
            # a single-node plan is still possible: bounds must assume the faster link
            one_node = k > 1 and B * rho_floor <= node_max + NODE_TOL
            opt_link = (max(h.bw, intra_max), min(h.lat, h.intra_lat)) if one_node else (h.bw, h.lat)
            for o in range(k):
                if use_pareto and pts.count[o] > 1:
                    pareto_filter(h, ot, o, not one_node, pts, sc.counters)
                sort_points(pts, o)
            while walk(h, ot, pts, sc, B, mu, opt_link):
                _leaf(h, p, pts, sc, B, mu, fixed, workload)
    return sc.best_f, sc.best_i, sc.counters


def search_template(p: Problem, seed_cost: float = math.inf, use_pareto: bool = True,
                    use_bnb: bool = True) -> SearchResult:
    """The cheapest SLO-feasible Selection of one template's Problem over every (B, mu)."""
    best_f, best_i, counters = _search(p, float(seed_cost), bool(use_pareto), bool(use_bnb), *objective_flags(p))
    k = p.k
    found = bool(np.isfinite(best_f[0]))
    sel = Selection(int(best_i[0]), int(best_i[1]), best_i[2::3][:k].copy(), best_i[3::3][:k].copy(),
                    best_i[4::3][:k].copy())
    return SearchResult(found, float(best_f[0]), float(best_f[1]), float(best_f[2]), sel,
                        Counters(*(int(x) for x in counters)), float(best_f[4]))
