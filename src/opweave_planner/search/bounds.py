"""Valid lower bounds of a partial assignment (numba).

Owners below `level` are fixed at their selected points; the rest take their
optimistic minima (stage-time sum, cost rate, GPUs per request, microbatch).
T_rtt is at least each owner's compute stream (mu x its stage-time sum), the
loop (every stage and hand-off once, plus link latencies) and each endpoint's
egress/ingress busy time; hand-offs use the same `transfer_occupancy` as the
evaluator, at the optimistic microbatch and the fastest link still possible.
"""

from __future__ import annotations

from numba import njit

from opweave_planner.search.evaluate import transfer_occupancy


@njit(cache=True)
def lower_bound(ot, pts, sc, level, B, mu, link_bw, link_lat):
    """(T_rtt bound µs, cost-rate sum bound, GPUs bound); uses sc.bhf/eg/ing as scratch."""
    k = ot.count.shape[0]
    comp = 0.0
    loop = 0.0
    rsum = 0.0
    gpus = 0.0
    for o in range(k):
        if o < level:
            q = sc.sel[o]
            s_, r_, rho_, b_ = pts.total[o, q], pts.r[o, q], pts.rho[o, q], pts.bh[o, q]
        else:
            s_, r_, rho_, b_ = pts.min_total[o], pts.min_r[o], pts.min_rho[o], pts.min_bh[o]
        comp = max(comp, mu * s_)
        loop += s_
        rsum += r_
        gpus += B * rho_
        sc.bhf[o] = b_
    for o in range(k):
        sc.eg[o] = 0.0
        sc.ing[o] = 0.0
    for a in range(k):
        for b in range(k):
            if ot.pair_payload[a, b] > 0.0:
                occ = transfer_occupancy(ot.pair_payload[a, b], sc.bhf[a], sc.bhf[b], link_bw)
                loop += occ + ot.n_cross[a, b] * link_lat
                sc.eg[a] += mu * occ
                sc.ing[b] += mu * occ
    t_lb = max(comp, loop)
    for o in range(k):
        t_lb = max(t_lb, sc.eg[o], sc.ing[o])
    return t_lb, rsum, gpus
