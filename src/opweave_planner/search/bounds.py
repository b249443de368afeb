"""Valid lower bounds of a partial assignment (numba).

Owners below `level` are fixed at their selected points; the rest take their
optimistic minima (stage-time sum, cost rate, GPUs per request, microbatch).
T_rtt is at least each owner's compute stream (mu x its stage-time sum), the
loop (every stage and hand-off once, plus link latencies) and each endpoint's
egress/ingress busy time; hand-offs use the same `transfer_occupancy` as the
evaluator, at the optimistic microbatch and the fastest link still possible.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from opweave_planner.compile.problem import Configs, Fabric, Grid, Limits
from opweave_planner.jit import entry, kernel, shared
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


@kernel(refcount=False)
def split_exceeds(pts, mu, t_lb, thr, slo_cap):
    """True when every complete assignment of this (B, mu) costs more than `thr` (or misses the
    SLO), by two bounds that need no sort: one pass over each owner's points.

    T >= max(t_lb, mu S_o) for every owner, so cost = T sum_o r_o >= sum_o max(t_lb, mu S_o) r_o,
    at least the sum of each owner's least such term (`coupled_exceeds` at the root is at least
    this, so it is its cheap first test); and T >= sum_o S_o (the loop), so cost >=
    (sum_o S_o)(sum_o r_o) >= (sum_o sqrt(S_o r_o))^2 (Cauchy-Schwarz), each S_o r_o at least the
    owner's least. A point with mu S > slo_cap cannot be part of a feasible plan."""
    split, root = 0.0, 0.0
    for o in range(pts.count.shape[0]):
        least, sq = np.inf, np.inf
        ptot, pr = pts.total[o], pts.r[o]
        for a in range(pts.count[o]):
            t = mu * ptot[a]
            if t <= slo_cap:
                least = min(least, max(t_lb, t) * pr[a])
                sq = min(sq, ptot[a] * pr[a])
        split += least
        root += math.sqrt(sq)
    return split > thr or root * root > thr


@kernel(refcount=False)
def point_staircase(pts, o, mu, rr, thr, slo_cap):
    """Owner o's staircase for `coupled_exceeds` (prof_t/prof_r/prof_n) from its points in any
    order, so the root can use the coupled bound before the frontier and the sort.

    rr is the r_fixed + r_min_rest that `coupled_exceeds` is given. A point whose compute
    stream t = mu x S has t > slo_cap or t x rr > thr is left out: `coupled_exceeds` returns
    True before its tau reaches any such t (tau ascends and checks exactly these), and the f_o
    it reads at every smaller tau are the same, so its answer is unchanged."""
    ptot, pr, ts, rs = pts.total[o], pts.r[o], pts.prof_t[o], pts.prof_r[o]
    n = 0
    for a in range(pts.count[o]):
        t = mu * ptot[a]
        if t <= slo_cap and t * rr <= thr:
            ts[n], rs[n] = ptot[a], pr[a]
            n += 1
    heapsort(ts, rs, pts.tmpi, n)  # tmpi: the sort's scratch, free until the points are sorted
    pts.prof_n[o] = compact_steps(ts, rs, n)


@shared
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
def owner_sorted(fp, ok, tot, buf):
    """An owner's floor choices, sorted by S into buf = (ts, rs, ci): returns their count.

    ok is its cfg_ok row, tot [C, M] its stage-time sums (as `owner_tables` holds them). A
    choice is a (configuration c, microbatch b) the owner may take with b at most the largest
    batch and S <= SLO; its rate is q = price tp / b (a point's r is q / mu); ci = c M + m.
    What depends on mu is `owner_steps`' filter, so one sort serves every mu."""
    cf, tp, mb_grid, batches = fp.configs, fp.fabric.cfg_tp, fp.grid.mb_grid, fp.grid.batches
    ts, rs, ci = buf
    top = 0
    for bi in range(batches.shape[0]):
        top = max(top, batches[bi])
    slo_m, n_mb, n = fp.limits.slo * (1.0 + FLOOR_MARGIN), mb_grid.shape[0], 0
    for c in range(cf.cfg_price.shape[0]):
        if not ok[c]:
            continue
        for m in range(n_mb):
            if mb_grid[m] <= top and tot[c, m] <= slo_m:
                ts[n], rs[n], ci[n] = tot[c, m], cf.cfg_price[c] * tp[c] / mb_grid[m], c * n_mb + m
                n += 1
    heapsort(ts, rs, ci, n)
    return n


@kernel(refcount=False)
def owner_steps(fp, units, sums, buf, n, mu, ts, rs):
    """One owner's floor staircase at mu into ts/rs[:w] from its sorted choices buf[:n]
    (`owner_sorted`): (w, the least S x q of its choices at mu); w = 0: it has none.

    units is its reserve rows [C, B+], sums [3, C] its weight, KV-per-unit and per-request KV
    bytes per GPU. A choice counts at mu if mu b is at most the largest batch (B = mu n b), b
    fits its memory at mu (the rule `build_points` applies, on the same sums) and mu S meets
    the SLO (T >= mu S), so every point of any (B, mu) is one. Out: the steps of f(tau) = the
    least q of a choice with S <= tau, S ascending, q strictly descending (`compact_steps`)."""
    cf, mb_grid, batches = fp.configs, fp.grid.mb_grid, fp.grid.batches
    bs, br, bi_ = buf
    top = 0
    for bi in range(batches.shape[0]):
        top = max(top, batches[bi])
    slo_m, n_mb, w, sq = fp.limits.slo * (1.0 + FLOOR_MARGIN), mb_grid.shape[0], 0, np.inf
    for a in range(n):
        c, m = bi_[a] // n_mb, bi_[a] % n_mb
        bh, row = mb_grid[m], units[c]
        if mu * bh > top or mu * bh >= row.shape[0] or mu * bs[a] > slo_m:
            continue
        if memory_need(row, sums[0, c], sums[1, c], sums[2, c], cf.cfg_ws[c], mu, bh) > cf.cfg_mem[c]:
            continue
        ts[w], rs[w] = bs[a], br[a]
        sq = min(sq, bs[a] * br[a])
        w += 1
    return compact_steps(ts, rs, w), sq


@kernel(refcount=False)
def owner_sums(fp, ok, ranges, lo, hi, sums, tot):
    """An owner's `owner_sorted` / `owner_steps` inputs from its stages, rows lo..hi-1 of ranges [S, 2]
    (start, end) in stage order: sums [3, C] and tot [C, M], summed in stage order as
    `owner_tables` adds them (the same bits)."""
    cf = fp.configs
    for c in range(cf.cfg_price.shape[0]):
        if not ok[c]:
            continue
        w, kv, kvc = 0.0, 0.0, 0.0
        for j in range(lo, hi):
            w += range_sum(cf.wpref[c], ranges[j, 0], ranges[j, 1])
            kv += range_sum(cf.kvpref[c], ranges[j, 0], ranges[j, 1])
            kvc += range_sum(cf.kvcpref[c], ranges[j, 0], ranges[j, 1])
        sums[0, c], sums[1, c], sums[2, c] = w, kv, kvc
        for m in range(tot.shape[1]):
            t = 0.0
            for j in range(lo, hi):
                t += stage_time(cf.pref[c, m], ranges[j, 0], ranges[j, 1], cf.cfg_stage_fixed[c])
            tot[c, m] = t


@kernel(inline=True, refcount=False)
def _sift(ts, rs, ci, a, n):
    """Heap sift-down of entry a in ts/rs/ci[:n] (a max-heap on ts)."""
    while True:
        c = 2 * a + 1
        if c >= n:
            return
        if c + 1 < n and ts[c + 1] > ts[c]:
            c += 1
        if ts[a] >= ts[c]:
            return
        ts[a], ts[c] = ts[c], ts[a]
        rs[a], rs[c] = rs[c], rs[a]
        ci[a], ci[c] = ci[c], ci[a]
        a = c


@kernel(refcount=False)
def heapsort(ts, rs, ci, n):
    """Sort ts/rs/ci[:n] by ts, in place, O(n log n) (an insertion sort of the ~10^3 floor
    choices was most of a template's floor); the order among equal ts is any."""
    for a in range(n // 2 - 1, -1, -1):
        _sift(ts, rs, ci, a, n)
    for e in range(n - 1, 0, -1):
        ts[0], ts[e] = ts[e], ts[0]
        rs[0], rs[e] = rs[e], rs[0]
        ci[0], ci[e] = ci[e], ci[0]
        _sift(ts, rs, ci, 0, e)


@kernel(refcount=False)
def compact_steps(ts, rs, n):
    """ts/rs[:n] sorted by ts -> the steps of f(tau) = min rs over ts <= tau in ts/rs[:w]; w.

    Keeps the end of each run of equal ts whose running minimum r fell: S ascending, r strictly
    descending. Every breakpoint it drops leaves every f_o as it was at a larger tau, so
    `merge_floor`'s minimum is the same bits as on the whole sorted list."""
    w, least = 0, np.inf
    for a in range(n):
        least = min(least, rs[a])
        if a + 1 < n and ts[a + 1] == ts[a]:
            continue  # not the last of its run of equal times
        if w == 0 or least < rs[w - 1]:
            ts[w], rs[w] = ts[a], least
            w += 1
    return w


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


@kernel(inline=True, refcount=False)
def _loop_term(sq, own, lo, n, max_mu, mu, rows):
    """(sum_o sqrt(sq_o))^2 / mu over the template's owners own[lo:lo + n] at mu, their rows
    (u max_mu + mu - 1) into rows[:n]; inf when an owner has no choice (its sq is inf).

    The loop's bound: T >= sum_o S_o (every stage once), so T sum_o q_o / mu >=
    (sum_o S_o)(sum_o q_o) / mu >= (sum_o sqrt(S_o q_o))^2 / mu (Cauchy-Schwarz), each S_o q_o
    at least the owner's least."""
    root = 0.0
    for j in range(n):
        rows[j] = own[lo + j] * max_mu + mu - 1
        root += math.sqrt(sq[rows[j]])
    return root * root / mu


@kernel(refcount=False)
def least_floor(ts, rs, cnt, sq, own, span, max_mu, scratch):
    """A template's floor: the least over mu of max(`merge_floor`, the loop term) of its owners
    own[lo:hi] (span = (lo, hi)), owner u's staircase at mu in row u max_mu + mu - 1 of
    ts/rs/cnt and its least S x q in sq; scratch = (idx, rows), two int arrays of the owners'
    count. The mu of the least loop term goes first; a mu whose loop term is no less than the
    least floor so far cannot lower it (its floor is at least that term), so its merge is
    skipped: the same minimum, bit for bit."""
    (lo, hi), (idx, rows) = span, scratch
    n, first, least = hi - lo, 1, np.inf
    for mu in range(1, max_mu + 1):
        term = _loop_term(sq, own, lo, n, max_mu, mu, rows)
        if term < least:
            first, least = mu, term
    floor = np.inf
    for step in range(max_mu):
        mu = (first - 1 + step) % max_mu + 1
        term = _loop_term(sq, own, lo, n, max_mu, mu, rows)
        if term < floor:
            floor = min(floor, max(merge_floor(ts, rs, cnt, rows, 0, n, idx), term))
    return floor


@kernel
def template_floor(p, ot):
    """A lower bound of every candidate's cost in a template, from its owner tables' sums.

    A candidate at (B, mu) costs T x sum_o r_o with r_o = q_o / mu, q_o = price tp / b_o, and
    T >= mu S_o for every owner (its compute stream, as in `lower_bound`), so it costs at least
    max_o S_o x sum_o q_o. Over the owners' choices at mu (`owner_steps`) this is at least
    min over tau of tau x sum_o f_o(tau), f_o(tau) the least q of the owner's choices with
    S_o <= tau (minimised on its breakpoints by `merge_floor`, as in `coupled_exceeds`); the
    loop T >= sum_o S_o gives a second bound (`_loop_term`). The floor is the least over mu of
    the larger of the two (`least_floor`). No (B, mu), no points; f_o depends only on the owner's stages, so
    the driver's pre-floor (search/prefloor.py) computes each distinct owner's once per phase
    from its stage ranges (`owner_sums`, the same sums bit for bit) with the same kernels. The
    latency objective (r = 1/k) gets 0. A workload's cost is its mean TPOT x sum r: its stage
    times here are the lower tables at c_lb, which bound every scenario's mean per-microbatch
    stage time (compile/traffic.py: Jensen on the convex minorant), the bound the walk's own
    prune rests on, so its floor holds the same way. docs/search.md: the proof."""
    st = p.stages
    if p.limits.latency_objective:
        return 0.0
    fp = FloorParts(configs=p.configs, fabric=p.fabric, grid=p.grid, limits=p.limits)
    k, width, max_mu = st.k, p.configs.cfg_price.shape[0] * p.grid.mb_grid.shape[0], p.grid.max_mu
    ts, rs = np.empty((k * max_mu, width)), np.empty((k * max_mu, width))
    cnt, sq, sums = np.zeros(k * max_mu, np.int64), np.empty(k * max_mu), np.empty((3, p.configs.cfg_price.shape[0]))
    buf = (np.empty(width), np.empty(width), np.empty(width, np.int64))
    for o in range(k):
        sums[0], sums[1], sums[2] = ot.wown[o], ot.kvown[o], ot.kvcown[o]
        n = owner_sorted(fp, st.cfg_ok[o], ot.total[o], buf)
        for mu in range(1, max_mu + 1):
            v = o * max_mu + mu - 1
            cnt[v], sq[v] = owner_steps(fp, st.kv_units[o], sums, buf, n, mu, ts[v], rs[v])
    scratch = (np.zeros(k, np.int64), np.zeros(k, np.int64))
    return least_floor(ts, rs, cnt, sq, np.arange(k), (0, k), max_mu, scratch)


@entry
def phase_floors(fp, rows, ok, st_off, ranges, t_off, t_own, seed):
    """(floor, pruned) of many templates of one phase, each distinct owner's staircases built
    once (search/prefloor.py): owner u has cfg_ok row ok[u], stages ranges[st_off[u]:
    st_off[u + 1]] and reserve rows units[u_units[u]] (rows = (units [M, C, B+], u_units): owners
    of one KV mix share them; a fixed context has one); template t has owners t_own[t_off[t]:t_off[t + 1]]. The
    same kernels as `template_floor`, so the same floors bit for bit; pruned against `seed` as
    the walk prunes (`floor_prunes`)."""
    (units, u_units), n_u, n_t, max_mu = rows, ok.shape[0], t_off.shape[0] - 1, fp.grid.max_mu
    n_cfg, n_mb = fp.configs.cfg_price.shape[0], fp.grid.mb_grid.shape[0]
    # row u * max_mu + mu - 1: owner u's staircase at mu
    ts, rs = np.empty((n_u * max_mu, n_cfg * n_mb)), np.empty((n_u * max_mu, n_cfg * n_mb))
    cnt, sq = np.zeros(n_u * max_mu, np.int64), np.empty(n_u * max_mu)
    sums, tot = np.zeros((3, n_cfg)), np.zeros((n_cfg, n_mb))
    buf = (np.empty(n_cfg * n_mb), np.empty(n_cfg * n_mb), np.empty(n_cfg * n_mb, np.int64))
    for u in range(n_u):
        owner_sums(fp, ok[u], ranges, st_off[u], st_off[u + 1], sums, tot)
        n = owner_sorted(fp, ok[u], tot, buf)
        for mu in range(1, max_mu + 1):
            v = u * max_mu + mu - 1
            cnt[v], sq[v] = owner_steps(fp, units[u_units[u]], sums, buf, n, mu, ts[v], rs[v])
    most = 0
    for t in range(n_t):
        most = max(most, t_off[t + 1] - t_off[t])
    floors, pruned = np.empty(n_t), np.zeros(n_t, np.bool_)
    scratch = (np.zeros(most, np.int64), np.zeros(most, np.int64))
    for t in range(n_t):
        floors[t] = least_floor(ts, rs, cnt, sq, t_own, (t_off[t], t_off[t + 1]), max_mu, scratch)
        pruned[t] = floor_prunes(floors[t], seed, fp.limits.prune_factor)
    return floors, pruned
