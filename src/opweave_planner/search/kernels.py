"""Numba core of the search: owner points, network-safe frontiers, DFS branch-and-bound.

One call searches one template over every (B, mu) of the grid. Everything is
plain arrays; the driver builds them. Time unit: microseconds. Cost unit:
USD per GPU-hour per resident request (r); USD/token = T_rtt * sum(r) / 3.6e9.

Order and ties are fixed so the result equals exhaustive enumeration: owner
points are sorted by (r, rho, b_hat, sum T, config, replicas), which is
consistent with dominance, DFS visits combinations in lexicographic order of
those sorted lists, and a candidate replaces the incumbent only if it is
cheaper, or equally cheap with fewer GPUs. Pruning never removes a candidate
whose cost could tie the incumbent (strict comparison with a 1e-12 margin).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from opweave_planner.schedule.kernels import make_scratch, simulate_rtt_scratch

EPS = 1e-12
# counters
C_CAND, C_SIM, C_BOUND, C_FRONT = 0, 1, 2, 3


@njit(cache=True)
def _range_sum(pref, start, end):
    """Sum over the cyclic operator range [start, end) from a prefix-sum row."""
    if end > start:
        return pref[end] - pref[start]
    return pref[pref.shape[0] - 1] - pref[start] + pref[end]


@njit(cache=True)
def owner_tables(stage_owner, stage_start, stage_end, k, pref, wpref, kvpref):
    """Per owner: stage latency table T[owner][c, m, i], weights and KV bytes per GPU."""
    s = stage_owner.shape[0]
    n_cfg, n_mb = pref.shape[0], pref.shape[1]
    count = np.zeros(k, np.int64)
    for j in range(s):
        count[stage_owner[j]] += 1
    lmax = count.max()
    tab = np.zeros((k, n_cfg, n_mb, lmax))
    wown = np.zeros((k, n_cfg))
    kvown = np.zeros((k, n_cfg))
    pos = np.zeros(s, np.int64)
    fill = np.zeros(k, np.int64)
    for j in range(s):
        o = stage_owner[j]
        pos[j] = fill[o]
        fill[o] += 1
        for c in range(n_cfg):
            wown[o, c] += _range_sum(wpref[c], stage_start[j], stage_end[j])
            kvown[o, c] += _range_sum(kvpref[c], stage_start[j], stage_end[j])
            for m in range(n_mb):
                tab[o, c, m, pos[j]] = _range_sum(pref[c, m], stage_start[j], stage_end[j])
    return tab, count, pos, wown, kvown


@njit(cache=True)
def _dominates(tab, o, ca, ma, cb, mb, length, ra, rb):
    """Point a (cfg ca, mb ma) no worse than b everywhere, strictly somewhere (same tp, same b_hat)."""
    strict = ra < rb
    if ra > rb:
        return False
    for i in range(length):
        x, y = tab[o, ca, ma, i], tab[o, cb, mb, i]
        if x > y:
            return False
        if x < y:
            strict = True
    return strict


@njit(cache=True)
def build_points(o, B, mu, tab, count, wown, kvown, cfg_tp, cfg_price, cfg_mem, cfg_ws, cfg_ok,
                 mb_index, max_rep, lat_obj, out_c, out_m, out_n, out_r, out_rho, out_bh, out_sum):
    """Memory-feasible points of owner o at (B, mu). Returns their count."""
    n_cfg = tab.shape[1]
    length = count[o]
    npts = 0
    for c in range(n_cfg):
        if not cfg_ok[o, c]:
            continue
        for n in range(1, max_rep + 1):
            if B % (mu * n) != 0:
                continue
            bh = B // (mu * n)
            m = mb_index[bh]
            if m < 0:
                continue
            need = wown[o, c] + mu * bh * kvown[o, c] + bh * cfg_ws[c]
            if need > cfg_mem[c]:
                continue
            out_c[npts] = c
            out_m[npts] = m
            out_n[npts] = n
            out_bh[npts] = bh
            # latency objective: r sums to 1 over the k owners, so cost == T_rtt in every template
            out_r[npts] = 1.0 / count.shape[0] if lat_obj else cfg_price[c] * cfg_tp[c] / (mu * bh)
            out_rho[npts] = cfg_tp[c] / (mu * bh)
            tot = 0.0
            for i in range(length):
                tot += tab[o, c, m, i]
            out_sum[npts] = tot
            npts += 1
    return npts


@njit(cache=True)
def pareto_filter(o, npts, cross_type, tab, count, cfg_tp, cfg_gpu, out_c, out_m, out_n, out_r,
                  out_rho, out_bh, out_sum, counters):
    """Keep the network-safe frontier: dominance only at equal TP and equal b_hat (equal
    transfer sizes and GPU count), and across GPU types only when no candidate of this
    (B, mu) can fit in one node (otherwise the GPU type decides the link)."""
    length = count[o]
    keep = np.ones(npts, np.bool_)
    for a in range(npts):
        for b in range(npts):
            if a == b or not keep[a] or cfg_tp[out_c[a]] != cfg_tp[out_c[b]] or out_bh[a] != out_bh[b]:
                continue
            if not cross_type and cfg_gpu[out_c[a]] != cfg_gpu[out_c[b]]:
                continue
            if _dominates(tab, o, out_c[a], out_m[a], out_c[b], out_m[b], length, out_r[a], out_r[b]):
                keep[b] = False
    w = 0
    for a in range(npts):
        if keep[a]:
            out_c[w], out_m[w], out_n[w], out_bh[w] = out_c[a], out_m[a], out_n[a], out_bh[a]
            out_r[w], out_rho[w], out_sum[w] = out_r[a], out_rho[a], out_sum[a]
            w += 1
    counters[C_FRONT] += npts - w
    return w


@njit(cache=True)
def sort_points(npts, out_c, out_m, out_n, out_r, out_rho, out_bh, out_sum):
    """Insertion sort by (r, rho, b_hat, sum T, config, n): a dominance-consistent fixed order."""
    for a in range(1, npts):
        j = a
        while j > 0 and _key_less(out_r, out_rho, out_bh, out_sum, out_c, out_n, j, j - 1):
            for arr in (out_r, out_rho, out_sum):
                arr[j], arr[j - 1] = arr[j - 1], arr[j]
            for arri in (out_c, out_m, out_n, out_bh):
                arri[j], arri[j - 1] = arri[j - 1], arri[j]
            j -= 1


@njit(cache=True)
def _key_less(r, rho, bh, sm, c, n, a, b):
    if r[a] != r[b]:
        return r[a] < r[b]
    if rho[a] != rho[b]:
        return rho[a] < rho[b]
    if bh[a] != bh[b]:
        return bh[a] < bh[b]
    if sm[a] != sm[b]:
        return sm[a] < sm[b]
    if c[a] != c[b]:
        return c[a] < c[b]
    return n[a] < n[b]


@njit(cache=True)
def _bound(level, k, mu, B, sel, pts_sum, pts_r, pts_rho, pts_bh, min_sum, min_r, min_rho, min_bh,
           pair_payload, n_cross, bw, lat, bh, egress, ingress):
    """Lower bounds (T_rtt, cost rate sum r, GPUs) for owners < level fixed and the rest optimistic.

    bh, egress, ingress are caller-owned scratch of length k (no allocation in the hot loop).
    """
    comp = 0.0
    loop = 0.0
    rsum = 0.0
    gpus = 0.0
    for o in range(k):
        if o < level:
            p = sel[o]
            s_, r_, rho_, b_ = pts_sum[o, p], pts_r[o, p], pts_rho[o, p], pts_bh[o, p]
        else:
            s_, r_, rho_, b_ = min_sum[o], min_r[o], min_rho[o], min_bh[o]
        comp = max(comp, mu * s_)
        loop += s_
        rsum += r_
        gpus += B * rho_
        bh[o] = b_
    for o in range(k):
        egress[o] = 0.0
        ingress[o] = 0.0
    for a in range(k):
        for b in range(k):
            if pair_payload[a, b] > 0.0:
                occ = pair_payload[a, b] * max(bh[a], bh[b]) / bw
                loop += occ + n_cross[a, b] * lat
                egress[a] += mu * occ
                ingress[b] += mu * occ
    t_lb = max(comp, loop)
    for o in range(k):
        t_lb = max(t_lb, egress[o], ingress[o])
    return t_lb, rsum, gpus


@njit(cache=True)
def search_template(stage_owner, stage_start, stage_end, payload, k, pref, wpref, kvpref,
                    cfg_tp, cfg_price, cfg_mem, cfg_ws, cfg_ok, cfg_gpu, cfg_node, cfg_intra_bw,
                    mb_index, batches, max_mu, max_rep, max_gpus, bw, lat, intra_lat, slo, seed_cost,
                    use_pareto, use_bnb, lat_obj):
    """Search one template over all (B, mu). Returns best and counters.

    Links: stage transfers cross the inter-node network (bw bytes/µs, lat µs) unless every
    owner uses the same GPU type and the whole plan fits in one node, in which case they use
    that GPU's intra-node link (cfg_intra_bw, intra_lat). Bounds use the faster link whenever
    a single-node plan is still possible, so they stay optimistic.

    best_f = [cost (r-units * us), t_rtt, gpus]; best_i = [B, mu, cfg_0, n_0, m_0, ...]; found flag.
    """
    s = stage_owner.shape[0]
    tab, count, pos, wown, kvown = owner_tables(stage_owner, stage_start, stage_end, k, pref, wpref, kvpref)
    n_cfg = pref.shape[0]
    pmax = n_cfg * max_rep
    pts_c = np.zeros((k, pmax), np.int64)
    pts_m = np.zeros((k, pmax), np.int64)
    pts_n = np.zeros((k, pmax), np.int64)
    pts_bh = np.zeros((k, pmax), np.int64)
    pts_r = np.zeros((k, pmax))
    pts_rho = np.zeros((k, pmax))
    pts_sum = np.zeros((k, pmax))
    npts = np.zeros(k, np.int64)
    counters = np.zeros(4, np.int64)
    # boundary payload summed per (sender owner, receiver owner)
    pair_payload = np.zeros((k, k))
    n_cross = np.zeros((k, k))
    for j in range(s):
        a, b = stage_owner[j], stage_owner[(j + 1) % s]
        if a != b:
            pair_payload[a, b] += payload[j]
            n_cross[a, b] += 1.0
    best_f = np.array([np.inf, 0.0, 0.0])
    best_i = np.zeros(2 + 3 * k, np.int64)
    found = False
    incumbent = seed_cost
    fbuf, ibuf = make_scratch(s, max_mu, k)
    t = np.empty(s)
    occ = np.empty(s)
    latv = np.empty(s)
    min_sum = np.empty(k)
    min_r = np.empty(k)
    min_rho = np.empty(k)
    min_bh = np.empty(k)
    sel = np.zeros(k, np.int64)
    sc_bh = np.empty(k)
    sc_eg = np.empty(k)
    sc_in = np.empty(k)
    node_max = cfg_node.max()
    intra_max = cfg_intra_bw.max()
    for bi in range(batches.shape[0]):
        B = batches[bi]
        for mu in range(1, max_mu + 1):
            if B % mu != 0:
                continue
            empty = False
            rho_floor = 0.0
            for o in range(k):
                npts[o] = build_points(o, B, mu, tab, count, wown, kvown, cfg_tp, cfg_price, cfg_mem,
                                       cfg_ws, cfg_ok, mb_index, max_rep, lat_obj, pts_c[o], pts_m[o],
                                       pts_n[o], pts_r[o], pts_rho[o], pts_bh[o], pts_sum[o])
                if npts[o] == 0:
                    empty = True
                    break
                rho_floor += pts_rho[o, :npts[o]].min()
            if empty:
                continue
            one_node = k > 1 and B * rho_floor <= node_max + 1e-9
            bw_opt = max(bw, intra_max) if one_node else bw
            lat_opt = min(lat, intra_lat) if one_node else lat
            for o in range(k):
                if use_pareto and npts[o] > 1:
                    npts[o] = pareto_filter(o, npts[o], not one_node, tab, count, cfg_tp, cfg_gpu,
                                            pts_c[o], pts_m[o], pts_n[o], pts_r[o], pts_rho[o],
                                            pts_bh[o], pts_sum[o], counters)
                sort_points(npts[o], pts_c[o], pts_m[o], pts_n[o], pts_r[o], pts_rho[o], pts_bh[o],
                            pts_sum[o])
                min_sum[o] = pts_sum[o, :npts[o]].min()
                min_r[o] = pts_r[o, :npts[o]].min()
                min_rho[o] = pts_rho[o, :npts[o]].min()
                min_bh[o] = pts_bh[o, :npts[o]].min()
            # iterative DFS over the frontier product
            level = 0
            sel[0] = -1
            while level >= 0:
                sel[level] += 1
                if sel[level] >= npts[level]:
                    level -= 1
                    continue
                depth = level + 1
                if use_bnb and incumbent < np.inf:
                    # points are sorted by r: once the optimistic cost with this point's r exceeds
                    # the incumbent (T bound taken with this owner still optimistic), every later
                    # point of this owner does too
                    t_opt, r_opt, _g = _bound(level, k, mu, B, sel, pts_sum, pts_r, pts_rho, pts_bh,
                                              min_sum, min_r, min_rho, min_bh, pair_payload, n_cross,
                                              bw_opt, lat_opt, sc_bh, sc_eg, sc_in)
                    if t_opt * (r_opt - min_r[level] + pts_r[level, sel[level]]) > incumbent * (1 + EPS):
                        counters[C_BOUND] += npts[level] - sel[level]
                        sel[level] = npts[level]
                        continue
                link_bw, link_lat = bw_opt, lat_opt
                if depth == k:
                    link_bw, link_lat = bw, lat
                    if one_node:
                        g0 = cfg_gpu[pts_c[0, sel[0]]]
                        same = True
                        gp = 0.0
                        for o in range(k):
                            same = same and cfg_gpu[pts_c[o, sel[o]]] == g0
                            gp += B * pts_rho[o, sel[o]]
                        if same and gp <= cfg_node[pts_c[0, sel[0]]] + 1e-9:
                            link_bw, link_lat = cfg_intra_bw[pts_c[0, sel[0]]], intra_lat
                if use_bnb or depth == k:
                    t_lb, rsum, gpus = _bound(depth, k, mu, B, sel, pts_sum, pts_r, pts_rho, pts_bh,
                                              min_sum, min_r, min_rho, min_bh, pair_payload, n_cross,
                                              link_bw, link_lat, sc_bh, sc_eg, sc_in)
                    if depth == k:
                        counters[C_CAND] += 1
                    if (t_lb > slo * (1 + EPS) or gpus > max_gpus + 1e-9
                            or t_lb * rsum > incumbent * (1 + EPS)):
                        counters[C_BOUND] += 1
                        continue
                if depth < k:
                    level = depth
                    sel[level] = -1
                    continue
                # full assignment: exact stage vectors, then the simulator decides
                for j in range(s):
                    o = stage_owner[j]
                    p = sel[o]
                    t[j] = tab[o, pts_c[o, p], pts_m[o, p], pos[j]]
                    b = stage_owner[(j + 1) % s]
                    if b != o:
                        occ[j] = payload[j] * max(pts_bh[o, p], pts_bh[b, sel[b]]) / link_bw
                        latv[j] = link_lat
                    else:
                        occ[j] = 0.0
                        latv[j] = 0.0
                counters[C_SIM] += 1
                trtt = simulate_rtt_scratch(stage_owner, t, occ, latv, mu, k, fbuf, ibuf)
                if trtt > slo * (1 + EPS):
                    continue
                rsum = 0.0
                gpus = 0.0
                for o in range(k):
                    rsum += pts_r[o, sel[o]]
                    gpus += B * pts_rho[o, sel[o]]
                cost = trtt * rsum
                if cost < best_f[0] or (cost == best_f[0] and gpus < best_f[2] - 1e-9):
                    best_f[0], best_f[1], best_f[2] = cost, trtt, gpus
                    best_i[0], best_i[1] = B, mu
                    for o in range(k):
                        best_i[2 + 3 * o] = pts_c[o, sel[o]]
                        best_i[3 + 3 * o] = pts_n[o, sel[o]]
                        best_i[4 + 3 * o] = pts_m[o, sel[o]]
                    found = True
                    incumbent = min(incumbent, cost)
    return found, best_f, best_i, counters
