"""Owner points and network-safe Pareto frontiers (numba, over the Problem's parts).

A point is one owner's (configuration, replicas) at a (B, mu): its cost rate r,
GPUs per request rho, microbatch b and stage times. Points are sorted by
(r, rho, b, sum T, config, replicas), an order consistent with dominance, so the
depth-first walk visits combinations in a fixed order and its result equals
exhaustive enumeration.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from opweave_planner.jit import kernel
from opweave_planner.search.evaluate import cost_rate, memory_need, owner_nodes, range_sum, stage_time

# counter slots (Counters field order)
C_CAND, C_SIM, C_BOUND, C_FRONT = 0, 1, 2, 3


class OwnerTables(NamedTuple):
    tab: np.ndarray  # float64[k, C, M, L]: stage time of an owner's i-th stage
    total: np.ndarray  # float64[k, C, M]: the sum of an owner's stage times (its tab row, in order)
    count: np.ndarray  # int64[k]: stages per owner
    pos: np.ndarray  # int64[S]: a stage's index among its owner's stages
    wown: np.ndarray  # float64[k, C]: weight bytes per GPU
    kvown: np.ndarray  # float64[k, C]: KV bytes per GPU per reserved unit (Stages.kv_units)
    kvcown: np.ndarray  # float64[k, C]: context-independent KV/state bytes per request per GPU
    # what dominance compares, per stage: its time, then (a workload) its time at every context
    # knot, so a dropped point is no faster than its dominator at any context
    dom: np.ndarray  # float64[k, C, M, L (1 + G)]
    knot_free: np.ndarray  # bool[C, C]: Traffic.knot_free
    pair_payload: np.ndarray  # float64[k, k]: boundary bytes per request, sender -> receiver
    n_cross: np.ndarray  # float64[k, k]: boundaries per owner pair
    # a config's TP as a dense rank (0 .. distinct TPs - 1): the frontier's grouping key
    tp_rank: np.ndarray  # int64[C]
    # every config of this one's GPU type hands off inside a node no slower than over the
    # network (bandwidth and latency): a plan that needs fewer GPUs, and so may fit in one
    # node, never gets a slower link (the fixed-context frontier's cross-TP rule)
    intra_ok: np.ndarray  # bool[C]


class Points(NamedTuple):
    """Per owner, its points at the current (B, mu) in rows [o, :count[o]]."""

    c: np.ndarray
    m: np.ndarray
    n: np.ndarray
    bh: np.ndarray
    r: np.ndarray
    rho: np.ndarray
    total: np.ndarray  # sum of the owner's stage times
    count: np.ndarray  # int64[k]
    min_total: np.ndarray  # float64[k]: per-owner minima over its points (bounds)
    min_r: np.ndarray
    min_rho: np.ndarray
    min_bh: np.ndarray
    keep: np.ndarray  # bool[pmax]: frontier scratch
    # the owner's time/rate staircase (coupled bound): stage-time sums ascending, each entry's
    # r the least cost rate of any point no slower than it (so r descends)
    prof_t: np.ndarray  # float64[k, pmax]
    prof_r: np.ndarray  # float64[k, pmax]
    prof_n: np.ndarray  # int64[k]
    pidx: np.ndarray  # int64[k]: bound scratch
    # frontier and sort scratch: point indices grouped or ordered, bucket starts, a gather buffer
    order: np.ndarray  # int64[pmax]
    start: np.ndarray  # int64[C x max_rep + 1]
    gkey: np.ndarray  # int64[pmax]
    tmpf: np.ndarray  # float64[pmax]
    tmpi: np.ndarray  # int64[pmax]
    # per replica count n at the current (B, mu): the microbatch b = B / (mu n) and its grid index
    # (-1: none), so a point costs no integer division
    rep_bh: np.ndarray  # int64[max_rep + 1]
    rep_m: np.ndarray  # int64[max_rep + 1]


@kernel(inline=True)
def _stage_sums(tab, ok, count):
    """Each owner's stage-time sum per (configuration, microbatch), added in stage order as a
    point's total always was (the same bits)."""
    k, n_cfg, n_mb = tab.shape[0], tab.shape[1], tab.shape[2]
    total = np.zeros((k, n_cfg, n_mb))
    for o in range(k):
        for c in range(n_cfg):
            if ok[o, c]:
                for m in range(n_mb):
                    tot = 0.0
                    for i in range(count[o]):
                        tot += tab[o, c, m, i]
                    total[o, c, m] = tot
    return total


@kernel(inline=True)
def _tp_rank(cfg_tp):
    """Per configuration, the number of distinct TP degrees below its own."""
    n_cfg = cfg_tp.shape[0]
    tp_rank = np.zeros(n_cfg, np.int64)
    for b in range(n_cfg):
        first = True  # b is the first config of its TP: count that TP once
        for e in range(b):
            if cfg_tp[e] == cfg_tp[b]:
                first = False
        for a in range(n_cfg):
            if first and cfg_tp[b] < cfg_tp[a]:
                tp_rank[a] += 1
    return tp_rank


@kernel(inline=True)
def _intra_ok(fab):
    n_cfg = fab.cfg_gpu.shape[0]
    ok = np.ones(n_cfg, np.bool_)
    for a in range(n_cfg):
        for c in range(n_cfg):
            if fab.cfg_gpu[c] == fab.cfg_gpu[a] and (fab.cfg_intra_bw[c] < fab.bw or fab.intra_lat > fab.lat):
                ok[a] = False
    return ok


@kernel(inline=True)
def owner_tables(p):
    """The template's per-owner tables, built once per search. Every (B, mu) reads an owner's
    stage-time sum, so it is summed here once (`total`), not per point; the stage times are
    filled one latency row at a time (a row is contiguous; stage by stage, every (c, m) read
    a new cache line and the loop was memory-bound: most of a floor-pruned template's cost)."""
    st, cf, tr = p.stages, p.configs, p.traffic
    owner, start, end, payload, ok = st.stage_owner, st.stage_start, st.stage_end, st.payload, st.cfg_ok
    pref, wpref, kvpref, kvcpref, fixed, kpref = cf.pref, cf.wpref, cf.kvpref, cf.kvcpref, cf.cfg_stage_fixed, tr.kpref
    s, k = owner.shape[0], st.k
    n_cfg, n_mb = pref.shape[0], pref.shape[1]
    # knot times matter to dominance only between two configurations of equal TP whose latency
    # difference varies with the context (knot_free: it does not, e.g. EP vs TP experts)
    n_g = 0
    for a in range(n_cfg):
        for b in range(a + 1, n_cfg):
            if p.fabric.cfg_tp[a] == p.fabric.cfg_tp[b] and not tr.knot_free[a, b]:
                n_g = tr.knots.shape[0]
    count = np.zeros(k, np.int64)
    most = 0
    for j in range(s):
        count[owner[j]] += 1
        most = max(most, count[owner[j]])
    tab = np.zeros((k, n_cfg, n_mb, most))
    wown = np.zeros((k, n_cfg))
    kvown = np.zeros((k, n_cfg))
    kvcown = np.zeros((k, n_cfg))
    pos = np.zeros(s, np.int64)
    fill = np.zeros(k, np.int64)
    pair_payload = np.zeros((k, k))
    n_cross = np.zeros((k, k))
    for j in range(s):
        o = owner[j]
        pos[j] = fill[o]
        fill[o] += 1
        a, b = o, owner[(j + 1) % s]
        if a != b:
            pair_payload[a, b] += payload[j]
            n_cross[a, b] += 1.0
        for c in range(n_cfg):
            if not ok[o, c]:
                continue  # a config this owner may not take (other GPU type, EP without experts)
            wown[o, c] += range_sum(wpref[c], start[j], end[j])
            kvown[o, c] += range_sum(kvpref[c], start[j], end[j])
            kvcown[o, c] += range_sum(kvcpref[c], start[j], end[j])
    used = np.zeros(n_cfg, np.bool_)  # some owner may take the config
    for o in range(k):
        for c in range(n_cfg):
            used[c] = used[c] or ok[o, c]
    for c in range(n_cfg):
        if not used[c]:
            continue
        for m in range(n_mb):
            row = pref[c, m]
            for j in range(s):
                if ok[owner[j], c]:
                    tab[owner[j], c, m, pos[j]] = stage_time(row, start[j], end[j], fixed[c])
    # what dominance compares: a fixed context (no knot times) compares the stage times themselves
    if n_g == 0:
        dom = tab
    else:
        dom = np.zeros((k, n_cfg, n_mb, most * (1 + n_g)))
        for c in range(n_cfg):
            if not used[c]:
                continue
            for m in range(n_mb):
                for j in range(s):
                    o = owner[j]
                    if not ok[o, c]:
                        continue
                    base = pos[j] * (1 + n_g)
                    dom[o, c, m, base] = tab[o, c, m, pos[j]]
                    for g in range(n_g):
                        dom[o, c, m, base + 1 + g] = stage_time(kpref[c, m, g], start[j], end[j], fixed[c])
    return OwnerTables(tab=tab, total=_stage_sums(tab, ok, count), count=count, pos=pos, wown=wown, kvown=kvown,
                       kvcown=kvcown, dom=dom, knot_free=tr.knot_free, pair_payload=pair_payload, n_cross=n_cross,
                       tp_rank=_tp_rank(p.fabric.cfg_tp), intra_ok=_intra_ok(p.fabric))


@kernel(inline=True)
def new_points(p):
    k, pmax = p.stages.k, p.configs.pref.shape[0] * p.grid.max_rep
    return Points(c=np.zeros((k, pmax), np.int64), m=np.zeros((k, pmax), np.int64),
                  n=np.zeros((k, pmax), np.int64), bh=np.zeros((k, pmax), np.int64), r=np.zeros((k, pmax)),
                  rho=np.zeros((k, pmax)), total=np.zeros((k, pmax)), count=np.zeros(k, np.int64),
                  min_total=np.empty(k), min_r=np.empty(k), min_rho=np.empty(k), min_bh=np.empty(k),
                  keep=np.empty(pmax, np.bool_), prof_t=np.zeros((k, pmax)), prof_r=np.zeros((k, pmax)),
                  prof_n=np.zeros(k, np.int64), pidx=np.zeros(k, np.int64), order=np.zeros(pmax, np.int64),
                  start=np.zeros(pmax + 1, np.int64), gkey=np.zeros(pmax, np.int64), tmpf=np.zeros(pmax),
                  tmpi=np.zeros(pmax, np.int64), rep_bh=np.zeros(p.grid.max_rep + 1, np.int64),
                  rep_m=np.zeros(p.grid.max_rep + 1, np.int64))


@kernel(inline=True, refcount=False)
def build_points(p, ot, o, B, mu, pts):
    """Memory-feasible points of owner o at (B, mu); returns their count."""
    ok, cf, tp, grid, units = p.stages.cfg_ok, p.configs, p.fabric.cfg_tp, p.grid, p.stages.kv_units
    lat_obj, k = p.limits.latency_objective, p.stages.k
    rep_bh, rep_m = pts.rep_bh, pts.rep_m
    for n in range(1, grid.max_rep + 1):
        rep_m[n] = -1
        if B % (mu * n) == 0:
            rep_bh[n] = B // (mu * n)
            rep_m[n] = grid.mb_index[rep_bh[n]]
    npts = 0
    for c in range(ok.shape[1]):
        if not ok[o, c]:
            continue
        for n in range(1, grid.max_rep + 1):
            m = rep_m[n]
            if m < 0:
                continue
            bh = rep_bh[n]
            if memory_need(units[o, c], ot.wown[o, c], ot.kvown[o, c], ot.kvcown[o, c], cf.cfg_ws[c], mu, bh) > cf.cfg_mem[c]:
                continue
            pts.c[o, npts] = c
            pts.m[o, npts] = m
            pts.n[o, npts] = n
            pts.bh[o, npts] = bh
            pts.r[o, npts] = cost_rate(lat_obj, k, cf.cfg_price[c], tp[c], mu, bh)
            pts.rho[o, npts] = tp[c] / (mu * bh)
            pts.total[o, npts] = ot.total[o, c, m]
            npts += 1
    pts.count[o] = npts
    return npts


@kernel(inline=True, refcount=False)
def _dominates(tab, length, step, r, c, m, a, b):
    """Point a no worse than b in cost rate and every stage time, strictly somewhere (every
    `step`-th entry of the dominance table: 1 compares the knot times too)."""
    if r[a] > r[b]:
        return False
    strict = r[a] < r[b]
    ca, ma, cb, mb = c[a], m[a], c[b], m[b]
    for i in range(0, length, step):
        x, y = tab[ca, ma, i], tab[cb, mb, i]
        if x > y:
            return False
        if x < y:
            strict = True
    return strict


@kernel(refcount=False)
def pareto_filter(fab, ot, o, cross_type, pts, counters):
    """A workload's network-safe frontier (a fixed context's is `pareto_sorted`): dominance only
    at equal TP and equal b (equal transfer sizes, GPU count and barrier), with no dearer NCCL
    call, no more nodes, and across GPU types only when no candidate of this (B, mu) fits in
    one node (otherwise the GPU type decides the link).

    At one (B, mu), b = B / (mu n), so equal b is equal n: the points are bucketed by (n, TP rank)
    (a stable counting sort) and only pairs inside a bucket are compared, in the order the full
    double loop would compare them (a ascending, then b ascending). Pairs across buckets are the
    ones the full loop skips, and no check in one bucket reads another's keep flags, so the kept
    set is the full loop's, for any relation (linear, not quadratic, in the points per owner)."""
    tp, gpu, tx, node, tab, length = fab.cfg_tp, fab.cfg_gpu, fab.cfg_transfer_fixed, fab.cfg_node, ot.dom[o], ot.dom.shape[3]
    knot_free, stride, tp_rank = ot.knot_free, ot.dom.shape[3] // ot.tab.shape[3], ot.tp_rank
    pc, pm, pn, pbh, pr, prho, ptot = pts.c[o], pts.m[o], pts.n[o], pts.bh[o], pts.r[o], pts.rho[o], pts.total[o]
    npts = pts.count[o]
    keep, order, start, gkey = pts.keep, pts.order, pts.start, pts.gkey
    keep[:npts] = True
    n_tp, n_rep = 0, 0
    for a in range(npts):
        n_tp = max(n_tp, tp_rank[pc[a]] + 1)
        n_rep = max(n_rep, pn[a])
    n_b = n_rep * n_tp
    for g in range(n_b + 1):
        start[g] = 0
    for a in range(npts):
        gkey[a] = (pn[a] - 1) * n_tp + tp_rank[pc[a]]
        start[gkey[a] + 1] += 1
    for g in range(n_b):
        start[g + 1] += start[g]
    for a in range(npts):  # start[g] moves to the end of bucket g as it fills
        order[start[gkey[a]]] = a
        start[gkey[a]] += 1
    lo = 0
    for g in range(n_b):
        hi = start[g]
        for ia in range(lo, hi):
            a = order[ia]
            for ib in range(lo, hi):
                b = order[ib]
                if a == b or not keep[a] or tp[pc[a]] != tp[pc[b]] or pbh[a] != pbh[b]:
                    continue
                if not cross_type and gpu[pc[a]] != gpu[pc[b]]:
                    continue
                if tx[pc[a]] > tx[pc[b]]:  # a's hand-offs would cost more: not safe to drop b
                    continue
                # equal TP and replicas: only node sizes (a catalog's, per GPU type) can differ
                if node[pc[a]] != node[pc[b]] and owner_nodes(fab, pc[a], pn[a]) > owner_nodes(fab, pc[b], pn[b]):
                    continue
                step = stride if knot_free[pc[a], pc[b]] else 1
                if _dominates(tab, length, step, pr, pc, pm, a, b):
                    keep[b] = False
        lo = hi
    w = 0
    for a in range(npts):
        if keep[a]:
            pc[w], pm[w], pn[w], pbh[w], pr[w], prho[w], ptot[w] = pc[a], pm[a], pn[a], pbh[a], pr[a], prho[a], ptot[a]
            w += 1
    counters[C_FRONT] += npts - w
    pts.count[o] = w


@kernel(refcount=False)
def pareto_sorted(fab, ot, o, cross_type, pts, counters):
    """The fixed-context frontier, across TP degrees, replica counts and (where no plan of this
    (B, mu) fits in one node) GPU types, on points already sorted by `sort_points`.

    Point a removes a later point b when swapping b for a in any complete plan can make it
    neither dearer, slower, wider nor later in the enumeration: r, GPUs per request (rho) and
    microbatch (every hand-off's size is max(b_send, b_recv)) no larger; every stage time no
    larger; no dearer NCCL call; no more nodes when the plan spans nodes; and the same link:
    either no plan of this (B, mu) fits in one node (cross_type), or a is of b's GPU type
    with the same node size and no slower intra-node link, and, if a needs fewer GPUs (the
    plan may now fit in one node), that type's intra-node link is no slower than the network
    (`OwnerTables.intra_ok`). a comes first in the sorted order, so the plan with a is visited
    before the one with b, and the walk keeps the first of equal (cost, GPUs): the result is
    exhaustive enumeration's, up to the simulator's rounding (monotone in exact arithmetic; in
    floating point b's plan can come out a few ulps cheaper than a's, and exhaustive enumeration
    then returns it: tests/test_search_exact.py, test_frontier_rounding_tie). The relation is
    transitive, so comparing b with the points kept
    so far removes exactly the dominated points. Minima and staircase are unchanged (a
    dominator is no larger in each), so the sort's stay valid."""
    gpu, tx, node, intra, intra_ok = fab.cfg_gpu, fab.cfg_transfer_fixed, fab.cfg_node, fab.cfg_intra_bw, ot.intra_ok
    tab, length = ot.tab[o], ot.count[o]
    pc, pm, pn, pbh, pr, prho, ptot = pts.c[o], pts.m[o], pts.n[o], pts.bh[o], pts.r[o], pts.rho[o], pts.total[o]
    npts, w = pts.count[o], 0
    for b in range(npts):
        cb, mb = pc[b], pm[b]
        nodes_b = owner_nodes(fab, cb, pn[b])
        dominated = False
        for a in range(w):  # the kept points before b, each with r_a <= r_b by the sort
            ca = pc[a]
            if prho[a] > prho[b] or pbh[a] > pbh[b] or ptot[a] > ptot[b] or tx[ca] > tx[cb]:
                continue
            if gpu[ca] != gpu[cb]:
                if not cross_type:
                    continue
            elif not cross_type:
                if node[ca] != node[cb] or intra[ca] < intra[cb] or (prho[a] < prho[b] and not intra_ok[ca]):
                    continue
            if owner_nodes(fab, ca, pn[a]) > nodes_b:
                continue
            ma, worse = pm[a], False
            for i in range(length):
                if tab[ca, ma, i] > tab[cb, mb, i]:
                    worse = True
                    break
            if not worse:
                dominated = True
                break
        if not dominated:
            pc[w], pm[w], pn[w], pbh[w], pr[w], prho[w], ptot[w] = cb, mb, pn[b], pbh[b], pr[b], prho[b], ptot[b]
            w += 1
    counters[C_FRONT] += npts - w
    pts.count[o] = w


@kernel(inline=True, refcount=False)
def _key_less(r, rho, bh, total, c, n, a, b):
    if r[a] != r[b]:
        return r[a] < r[b]
    if rho[a] != rho[b]:
        return rho[a] < rho[b]
    if bh[a] != bh[b]:
        return bh[a] < bh[b]
    if total[a] != total[b]:
        return total[a] < total[b]
    if c[a] != c[b]:
        return c[a] < c[b]
    return n[a] < n[b]


@kernel(refcount=False)
def _swap(arr, a, b):
    arr[a], arr[b] = arr[b], arr[a]


@kernel(inline=True, refcount=False)
def _gather(arr, order, tmp, n):
    """arr[:n] = arr[order[:n]] through tmp (a buffer of arr's dtype)."""
    for a in range(n):
        tmp[a] = arr[order[a]]
    for a in range(n):
        arr[a] = tmp[a]


@kernel(inline=True, refcount=False)
def point_minima(pts, o):
    """The per-owner minima the bounds assume for an owner still open."""
    ptot, pr, prho, pbh = pts.total[o], pts.r[o], pts.rho[o], pts.bh[o]
    # minima by a loop, not ndarray.min(): each numpy reduction compiles its own generic code
    mt, mr, mrho, mbh = ptot[0], pr[0], prho[0], pbh[0]
    for a in range(1, pts.count[o]):
        mt, mr, mrho, mbh = min(mt, ptot[a]), min(mr, pr[a]), min(mrho, prho[a]), min(mbh, pbh[a])
    pts.min_total[o], pts.min_r[o], pts.min_rho[o], pts.min_bh[o] = mt, mr, mrho, mbh


@kernel(refcount=False)
def sort_points(pts, o):
    """Sort by (r, rho, b, sum T, config, n), then the per-owner minima and staircase.

    (config, n) names a point, so the key is a strict total order and the sorted order is
    unique: an insertion sort of indices, then one gather per array (not seven swaps a step)."""
    pc, pm, pn, pbh, pr, prho, ptot = pts.c[o], pts.m[o], pts.n[o], pts.bh[o], pts.r[o], pts.rho[o], pts.total[o]
    order, npts, moved = pts.order, pts.count[o], False
    for a in range(npts):
        order[a] = a
        j = a
        while j > 0 and _key_less(pr, prho, pbh, ptot, pc, pn, a, order[j - 1]):
            order[j] = order[j - 1]
            j -= 1
            moved = True
        order[j] = a
    if moved:  # points come mostly in key order (one GPU type: often exactly)
        for arr in (pr, prho, ptot):
            _gather(arr, order, pts.tmpf, npts)
        for arri in (pc, pm, pn, pbh):
            _gather(arri, order, pts.tmpi, npts)
    point_minima(pts, o)
    # staircase: in r order, a point enters when it is faster than every cheaper one
    prof_t, prof_r, w, fastest = pts.prof_t[o], pts.prof_r[o], 0, np.inf
    for a in range(pts.count[o]):
        if ptot[a] < fastest:
            fastest = ptot[a]
            prof_t[w], prof_r[w] = ptot[a], pr[a]
            w += 1
    for a in range(w // 2):  # reverse: times ascending
        _swap(prof_t, a, w - 1 - a)
        _swap(prof_r, a, w - 1 - a)
    pts.prof_n[o] = w
