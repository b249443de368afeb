"""Valid lower bounds of a partial assignment (numba).

Owners below `level` are fixed at their selected points; the rest take their
optimistic minima (stage-time sum, cost rate, GPUs per request, microbatch).
T_rtt is at least each owner's compute stream (mu x its stage-time sum), the
loop (every stage and hand-off once, plus link latencies) and each endpoint's
egress/ingress busy time; hand-offs use the same `transfer_occupancy` as the
evaluator, at the optimistic microbatch and the fastest link still possible.
"""

from __future__ import annotations

import numpy as np

from opweave_planner.jit import kernel
from opweave_planner.search.evaluate import memory_need, transfer_occupancy

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


@kernel
def template_floor(p, ot):
    """A lower bound of every candidate's cost in a template, from its owner tables alone.

    A candidate costs T x sum_o r_o with r_o = price tp / (mu b_o), and T >= mu S_o for every
    owner (its compute stream, as in `lower_bound`), so it costs at least
    max_o S_o x sum_o price tp / b_o, whatever mu. Over the owners' (configuration, microbatch)
    choices this is at least min over tau of tau x sum_o f_o(tau), f_o(tau) the least
    price tp / b of the owner's choices with S_o <= tau (a staircase, minimised on its
    breakpoints as in `coupled_exceeds`). A choice counts if the owner may take the configuration,
    b fits its memory at mu = 1 (the need grows with mu while the reserve per resident count does
    not fall) and S_o meets the SLO; inf when an owner has none. No (B, mu), no points. The
    latency objective (r = 1/k) and a workload get 0: a workload's cost is its mean TPOT, which
    its lower tables (made for the percentile) do not bound (tests/test_template_floor.py found
    candidates below the floor). docs/search.md: the proof."""
    st, cf, grid, lim, tp = p.stages, p.configs, p.grid, p.limits, p.fabric.cfg_tp
    if lim.latency_objective or p.traffic.knots.shape[0] > 0:
        return 0.0
    top = 0
    for bi in range(grid.batches.shape[0]):
        top = max(top, grid.batches[bi])
    slo = lim.slo * (1.0 + FLOOR_MARGIN)
    k, n_c, n_m = st.k, cf.cfg_price.shape[0], grid.mb_grid.shape[0]
    ts, rs, cnt = np.empty((k, n_c * n_m)), np.empty((k, n_c * n_m)), np.zeros(k, np.int64)
    for o in range(k):
        for c in range(n_c):
            if not st.cfg_ok[o, c]:
                continue
            units = st.kv_units[o, c]  # the owner's own reserve row, as the memory check reads it
            grows = True
            for i in range(1, units.shape[0]):
                if units[i] < units[i - 1]:
                    grows = False
            for m in range(n_m):
                bh = grid.mb_grid[m]
                if bh > top or bh >= units.shape[0]:
                    continue
                if grows and memory_need(units, ot.wown[o, c], ot.kvown[o, c], ot.kvcown[o, c], cf.cfg_ws[c],
                                         1, bh) > cf.cfg_mem[c]:
                    continue
                tot = 0.0
                for i in range(ot.count[o]):
                    tot += ot.tab[o, c, m, i]
                if tot <= slo:
                    ts[o, cnt[o]], rs[o, cnt[o]] = tot, cf.cfg_price[c] * tp[c] / bh
                    cnt[o] += 1
        if cnt[o] == 0:
            return np.inf
        # the staircase: times ascending, each r the least of any choice no slower
        order = np.argsort(ts[o, :cnt[o]])
        t_o, r_o = ts[o, :cnt[o]][order], rs[o, :cnt[o]][order]
        for a in range(1, cnt[o]):
            r_o[a] = min(r_o[a], r_o[a - 1])
        ts[o, :cnt[o]], rs[o, :cnt[o]] = t_o, r_o
    idx = np.zeros(k, np.int64)
    floor = np.inf
    while True:
        tau = np.inf  # the next breakpoint: the least time some owner has not reached
        for o in range(k):
            if idx[o] < cnt[o]:
                tau = min(tau, ts[o, idx[o]])
        if tau == np.inf:
            return floor
        total = 0.0
        for o in range(k):
            while idx[o] < cnt[o] and ts[o, idx[o]] <= tau:
                idx[o] += 1
            total = total + rs[o, idx[o] - 1] if idx[o] > 0 else np.inf
        floor = min(floor, tau * total)
