"""Valid lower bounds of a partial assignment (numba).

Owners below `level` are fixed at their selected points; the rest take their
optimistic minima (stage-time sum, cost rate, GPUs per request, microbatch).
T_rtt is at least each owner's compute stream (mu x its stage-time sum), the
loop (every stage and hand-off once, plus link latencies) and each endpoint's
egress/ingress busy time; hand-offs use the same `transfer_occupancy` as the
evaluator, at the optimistic microbatch and the fastest link still possible.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from opweave_planner.compile.problem import Configs, Fabric, Grid, Limits
from opweave_planner.jit import entry, kernel
from opweave_planner.search.evaluate import memory_need, range_sum, stage_time, transfer_occupancy

# the template floor sums in another order than the walk's bound: a relative margin far above
# rounding keeps every template that could tie
FLOOR_MARGIN = 1e-9


@kernel(refcount=False)
def lower_bound(ot, pts, sc, level, B, mu, link_bw, link_lat):
    """(T_rtt bound µs, cost-rate sum bound, GPUs bound); uses sc.bhf/eg/ing as scratch."""
    # tuple fields bound to locals once: numba reference-counts every field access
    sel, total, r, rho, bh = sc.sel, pts.total, pts.r, pts.rho, pts.bh
    min_total, min_r, min_rho, min_bh = pts.min_total, pts.min_r, pts.min_rho, pts.min_bh
    bhf, eg, ing, pair, n_cross = sc.bhf, sc.eg, sc.ing, ot.pair_payload, ot.n_cross
    k = bhf.shape[0]
    comp = 0.0
    loop = 0.0
    rsum = 0.0
    gpus = 0.0
    for o in range(k):
        if o < level:
            q = sel[o]
            s_, r_, rho_, b_ = total[o, q], r[o, q], rho[o, q], bh[o, q]
        else:
            s_, r_, rho_, b_ = min_total[o], min_r[o], min_rho[o], min_bh[o]
        comp = max(comp, mu * s_)
        loop += s_
        rsum += r_
        gpus += B * rho_
        bhf[o] = b_
    for o in range(k):
        eg[o] = 0.0
        ing[o] = 0.0
    for a in range(k):
        for b in range(k):
            if pair[a, b] > 0.0:
                occ = transfer_occupancy(pair[a, b], bhf[a], bhf[b], link_bw)
                loop += occ + n_cross[a, b] * link_lat
                eg[a] += mu * occ
                ing[b] += mu * occ
    t_lb = max(comp, loop)
    for o in range(k):
        t_lb = max(t_lb, eg[o], ing[o])
    return t_lb, rsum, gpus


@kernel(refcount=False)
def coupled_exceeds(pts, depth, mu, t_lb, r_fixed, r_min_rest, thr, slo_cap):
    """True when every completion of owners >= depth costs more than `thr` or misses the SLO.

    A completion's T is at least tau* = max(t_lb, mu x each remaining owner's stage-time sum),
    and each remaining owner's r is at least f_o(tau*), the least r of its points no slower
    than tau*/mu (its staircase). So cost >= min over tau >= t_lb of tau (r_fixed + sum f_o(tau));
    f_o is a step function, so the minimum lies on the merged breakpoints, walked ascending.
    Unlike `lower_bound` x the summed minimum r, this couples each owner's time and rate."""
    k = pts.count.shape[0]
    pt, pr, pn, idx = pts.prof_t, pts.prof_r, pts.prof_n, pts.pidx
    tau = t_lb
    for o in range(depth, k):
        i = 0
        while i < pn[o] and mu * pt[o, i] <= tau:
            i += 1
        idx[o] = i
    while True:
        # f_o only falls as tau grows: past these, no larger tau can help
        if tau > slo_cap or tau * (r_fixed + r_min_rest) > thr:
            return True
        s, reach = r_fixed, True
        for o in range(depth, k):
            if idx[o] == 0:
                reach = False
                break
            s += pr[o, idx[o] - 1]
        if reach and tau * s <= thr:
            return False
        nxt = np.inf
        for o in range(depth, k):
            if idx[o] < pn[o]:
                nxt = min(nxt, mu * pt[o, idx[o]])
        if nxt == np.inf:
            return True
        tau = nxt
        for o in range(depth, k):
            while idx[o] < pn[o] and mu * pt[o, idx[o]] <= tau:
                idx[o] += 1


@kernel(inline=True)
def floor_prunes(floor, seed, factor):
    """A template floor above the seed x the prune factor (x (1 + FLOOR_MARGIN)): no candidate
    of the template can beat the seed (the walk's test and the driver's pre-floor, one rule)."""
    return floor > seed * factor * (1.0 + FLOOR_MARGIN)


class FloorParts(NamedTuple):
    """The Problem parts an owner's floor staircase reads besides its own stages and rows."""

    configs: Configs
    fabric: Fabric
    grid: Grid
    limits: Limits


@kernel(refcount=False)
def owner_staircase(fp, ok, units, ranges, lo, hi, ts, rs):
    """One owner's floor staircase into ts/rs[:n]; returns n (0: the owner has no choice).

    The owner's stages are rows lo..hi-1 of ranges [S, 2] (start, end), in stage order; ok its
    cfg_ok row, units its reserve rows [C, B+]. A choice (configuration, microbatch b) counts if the owner may take
    the configuration, b fits its memory at mu = 1 (the need grows with mu while the reserve per
    resident count does not fall) and its stage-time sum S meets the SLO; its rate is
    price tp / b. Out: S ascending (insertion sort: small arrays, little to compile), each r the
    least of any choice no slower. Sums run in stage order, as `owner_tables` adds them."""
    cf, tp, mb_grid, batches = fp.configs, fp.fabric.cfg_tp, fp.grid.mb_grid, fp.grid.batches
    top = 0
    for bi in range(batches.shape[0]):
        top = max(top, batches[bi])
    slo_m = fp.limits.slo * (1.0 + FLOOR_MARGIN)
    n = 0
    for c in range(cf.cfg_price.shape[0]):
        if not ok[c]:
            continue
        row = units[c]
        grows = True
        for i in range(1, row.shape[0]):
            if row[i] < row[i - 1]:
                grows = False
        w, kv, kvc = 0.0, 0.0, 0.0
        for j in range(lo, hi):
            w += range_sum(cf.wpref[c], ranges[j, 0], ranges[j, 1])
            kv += range_sum(cf.kvpref[c], ranges[j, 0], ranges[j, 1])
            kvc += range_sum(cf.kvcpref[c], ranges[j, 0], ranges[j, 1])
        for m in range(mb_grid.shape[0]):
            bh = mb_grid[m]
            if bh > top or bh >= row.shape[0]:
                continue
            if grows and memory_need(row, w, kv, kvc, cf.cfg_ws[c], 1, bh) > cf.cfg_mem[c]:
                continue
            tot = 0.0
            for j in range(lo, hi):
                tot += stage_time(cf.pref[c, m], ranges[j, 0], ranges[j, 1], cf.cfg_stage_fixed[c])
            if tot <= slo_m:
                a = n  # insert after every entry no slower: ascending S
                while a > 0 and ts[a - 1] > tot:
                    ts[a], rs[a] = ts[a - 1], rs[a - 1]
                    a -= 1
                ts[a], rs[a] = tot, cf.cfg_price[c] * tp[c] / bh
                n += 1
    for a in range(1, n):
        rs[a] = min(rs[a], rs[a - 1])
    return n


@kernel(refcount=False)
def merge_floor(ts, rs, cnt, rows, lo, hi, idx):
    """min over tau of tau x sum_o f_o(tau), the owners' staircases being rows[lo:hi] of
    ts/rs/cnt (in owner order); walked on the merged breakpoints; inf when an owner has none."""
    for o in range(lo, hi):
        idx[o - lo] = 0
        if cnt[rows[o]] == 0:
            return np.inf
    floor = np.inf
    while True:
        tau = np.inf  # the next breakpoint: the least time some owner has not reached
        for o in range(lo, hi):
            u, i = rows[o], idx[o - lo]
            if i < cnt[u]:
                tau = min(tau, ts[u, i])
        if tau == np.inf:
            return floor
        total = 0.0
        for o in range(lo, hi):
            u = rows[o]
            while idx[o - lo] < cnt[u] and ts[u, idx[o - lo]] <= tau:
                idx[o - lo] += 1
            total = total + rs[u, idx[o - lo] - 1] if idx[o - lo] > 0 else np.inf
        floor = min(floor, tau * total)


@kernel
def template_floor(p):
    """A lower bound of every candidate's cost in a template, from its owners' stages alone.

    A candidate costs T x sum_o r_o with r_o = price tp / (mu b_o), and T >= mu S_o for every
    owner (its compute stream, as in `lower_bound`), so it costs at least
    max_o S_o x sum_o price tp / b_o, whatever mu. Over the owners' (configuration, microbatch)
    choices this is at least min over tau of tau x sum_o f_o(tau), f_o(tau) the least
    price tp / b of the owner's choices with S_o <= tau (`owner_staircase`, minimised on its
    breakpoints by `merge_floor`, as in `coupled_exceeds`). No (B, mu), no points, no owner
    tables: f_o depends only on the owner's stages, so the driver's pre-floor (search/prefloor.py)
    computes each distinct owner's once per phase with these same two kernels. The latency
    objective (r = 1/k) and a workload get 0: a workload's cost is its mean TPOT, which its lower
    tables (made for the percentile) do not bound (tests/test_template_floor.py found candidates
    below the floor). docs/search.md: the proof."""
    st = p.stages
    if p.limits.latency_objective or p.traffic.knots.shape[0] > 0:
        return 0.0
    fp = FloorParts(configs=p.configs, fabric=p.fabric, grid=p.grid, limits=p.limits)
    k, s, width = st.k, st.stage_owner.shape[0], p.configs.cfg_price.shape[0] * p.grid.mb_grid.shape[0]
    ranges, off = np.empty((s, 2), np.int64), np.zeros(k + 1, np.int64)
    for o in range(k):  # the stages grouped by owner, each owner's in stage order
        off[o + 1] = off[o]
        for j in range(s):
            if st.stage_owner[j] == o:
                ranges[off[o + 1], 0], ranges[off[o + 1], 1] = st.stage_start[j], st.stage_end[j]
                off[o + 1] += 1
    ts, rs, cnt, rows = np.empty((k, width)), np.empty((k, width)), np.zeros(k, np.int64), np.arange(k)
    for o in range(k):
        cnt[o] = owner_staircase(fp, st.cfg_ok[o], st.kv_units[o], ranges, off[o], off[o + 1], ts[o], rs[o])
        if cnt[o] == 0:
            return np.inf
    return merge_floor(ts, rs, cnt, rows, 0, k, np.zeros(k, np.int64))


@entry
def phase_floors(fp, units, ok, st_off, ranges, t_off, t_own, seed):
    """(floor, pruned) of many templates of one phase, each distinct owner's staircase built
    once (search/prefloor.py): owner u has cfg_ok row ok[u] and stages ranges[st_off[u]:
    st_off[u + 1]]; template t has owners t_own[t_off[t]:t_off[t + 1]]. Every owner shares the
    reserve rows `units` [C, B+] (a fixed context). The same kernels as `template_floor`, so the
    same floors bit for bit; pruned against `seed` as the walk prunes (`floor_prunes`)."""
    n_u, n_t = ok.shape[0], t_off.shape[0] - 1
    width = fp.configs.cfg_price.shape[0] * fp.grid.mb_grid.shape[0]
    ts, rs, cnt = np.empty((n_u, width)), np.empty((n_u, width)), np.zeros(n_u, np.int64)
    for u in range(n_u):
        cnt[u] = owner_staircase(fp, ok[u], units, ranges, st_off[u], st_off[u + 1], ts[u], rs[u])
    most = 0
    for t in range(n_t):
        most = max(most, t_off[t + 1] - t_off[t])
    idx, floors, pruned = np.zeros(most, np.int64), np.empty(n_t), np.zeros(n_t, np.bool_)
    for t in range(n_t):
        floors[t] = merge_floor(ts, rs, cnt, t_own, t_off[t], t_off[t + 1], idx)
        pruned[t] = floor_prunes(floors[t], seed, fp.limits.prune_factor)
    return floors, pruned
