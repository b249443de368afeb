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
from opweave_planner.search.evaluate import transfer_occupancy


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
