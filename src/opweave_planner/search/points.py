"""Owner points and network-safe Pareto frontiers (numba, over Problem arrays).

A point is one owner's (configuration, replicas) at a (B, mu): its cost rate r,
GPUs per request rho, microbatch b and stage times. Points are sorted by
(r, rho, b, sum T, config, replicas), an order consistent with dominance, so the
depth-first walk visits combinations in a fixed order and its result equals
exhaustive enumeration.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from opweave_planner.search.evaluate import cost_rate, memory_need, range_sum

# counter slots (Counters field order)
C_CAND, C_SIM, C_BOUND, C_FRONT = 0, 1, 2, 3


class OwnerTables(NamedTuple):
    tab: np.ndarray  # float64[k, C, M, L]: stage time of an owner's i-th stage
    count: np.ndarray  # int64[k]: stages per owner
    pos: np.ndarray  # int64[S]: a stage's index among its owner's stages
    wown: np.ndarray  # float64[k, C]: weight bytes per GPU
    kvown: np.ndarray  # float64[k, C]: KV/state bytes per request per GPU
    pair_payload: np.ndarray  # float64[k, k]: boundary bytes per request, sender -> receiver
    n_cross: np.ndarray  # float64[k, k]: boundaries per owner pair


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


@njit(cache=True)
def owner_tables(p):
    s, k = p.stage_owner.shape[0], p.k
    n_cfg, n_mb = p.pref.shape[0], p.pref.shape[1]
    count = np.zeros(k, np.int64)
    for j in range(s):
        count[p.stage_owner[j]] += 1
    tab = np.zeros((k, n_cfg, n_mb, count.max()))
    wown = np.zeros((k, n_cfg))
    kvown = np.zeros((k, n_cfg))
    pos = np.zeros(s, np.int64)
    fill = np.zeros(k, np.int64)
    pair_payload = np.zeros((k, k))
    n_cross = np.zeros((k, k))
    for j in range(s):
        o = p.stage_owner[j]
        pos[j] = fill[o]
        fill[o] += 1
        a, b = o, p.stage_owner[(j + 1) % s]
        if a != b:
            pair_payload[a, b] += p.payload[j]
            n_cross[a, b] += 1.0
        for c in range(n_cfg):
            wown[o, c] += range_sum(p.wpref[c], p.stage_start[j], p.stage_end[j])
            kvown[o, c] += range_sum(p.kvpref[c], p.stage_start[j], p.stage_end[j])
            for m in range(n_mb):
                tab[o, c, m, pos[j]] = range_sum(p.pref[c, m], p.stage_start[j], p.stage_end[j])
    return OwnerTables(tab, count, pos, wown, kvown, pair_payload, n_cross)


@njit(cache=True)
def new_points(p):
    k, pmax = p.k, p.pref.shape[0] * p.max_rep
    return Points(np.zeros((k, pmax), np.int64), np.zeros((k, pmax), np.int64),
                  np.zeros((k, pmax), np.int64), np.zeros((k, pmax), np.int64),
                  np.zeros((k, pmax)), np.zeros((k, pmax)), np.zeros((k, pmax)), np.zeros(k, np.int64),
                  np.empty(k), np.empty(k), np.empty(k), np.empty(k))


@njit(cache=True)
def build_points(p, ot, o, B, mu, pts):
    """Memory-feasible points of owner o at (B, mu); returns their count."""
    npts = 0
    for c in range(p.pref.shape[0]):
        if not p.cfg_ok[o, c]:
            continue
        for n in range(1, p.max_rep + 1):
            if B % (mu * n) != 0:
                continue
            bh = B // (mu * n)
            m = p.mb_index[bh]
            if m < 0:
                continue
            if memory_need(ot.wown[o, c], ot.kvown[o, c], p.cfg_ws[c], mu, bh) > p.cfg_mem[c]:
                continue
            pts.c[o, npts], pts.m[o, npts], pts.n[o, npts], pts.bh[o, npts] = c, m, n, bh
            pts.r[o, npts] = cost_rate(p, c, mu, bh)
            pts.rho[o, npts] = p.cfg_tp[c] / (mu * bh)
            tot = 0.0
            for i in range(ot.count[o]):
                tot += ot.tab[o, c, m, i]
            pts.total[o, npts] = tot
            npts += 1
    pts.count[o] = npts
    return npts


@njit(cache=True)
def _dominates(ot, pts, o, a, b):
    """Point a no worse than b in cost rate and every stage time, strictly somewhere."""
    ra, rb = pts.r[o, a], pts.r[o, b]
    if ra > rb:
        return False
    strict = ra < rb
    ca, ma, cb, mb = pts.c[o, a], pts.m[o, a], pts.c[o, b], pts.m[o, b]
    for i in range(ot.count[o]):
        x, y = ot.tab[o, ca, ma, i], ot.tab[o, cb, mb, i]
        if x > y:
            return False
        if x < y:
            strict = True
    return strict


@njit(cache=True)
def _move(pts, o, dst, src):
    pts.c[o, dst], pts.m[o, dst], pts.n[o, dst], pts.bh[o, dst] = (
        pts.c[o, src], pts.m[o, src], pts.n[o, src], pts.bh[o, src])
    pts.r[o, dst], pts.rho[o, dst], pts.total[o, dst] = pts.r[o, src], pts.rho[o, src], pts.total[o, src]


@njit(cache=True)
def pareto_filter(p, ot, o, cross_type, pts, counters):
    """Keep the network-safe frontier: dominance only at equal TP and equal b (equal transfer
    sizes and GPU count), and across GPU types only when no candidate of this (B, mu) fits in
    one node (otherwise the GPU type decides the link)."""
    npts = pts.count[o]
    keep = np.ones(npts, np.bool_)
    for a in range(npts):
        for b in range(npts):
            if a == b or not keep[a] or p.cfg_tp[pts.c[o, a]] != p.cfg_tp[pts.c[o, b]]:
                continue
            if pts.bh[o, a] != pts.bh[o, b]:
                continue
            if not cross_type and p.cfg_gpu[pts.c[o, a]] != p.cfg_gpu[pts.c[o, b]]:
                continue
            if _dominates(ot, pts, o, a, b):
                keep[b] = False
    w = 0
    for a in range(npts):
        if keep[a]:
            _move(pts, o, w, a)
            w += 1
    counters[C_FRONT] += npts - w
    pts.count[o] = w


@njit(cache=True)
def _key_less(pts, o, a, b):
    if pts.r[o, a] != pts.r[o, b]:
        return pts.r[o, a] < pts.r[o, b]
    if pts.rho[o, a] != pts.rho[o, b]:
        return pts.rho[o, a] < pts.rho[o, b]
    if pts.bh[o, a] != pts.bh[o, b]:
        return pts.bh[o, a] < pts.bh[o, b]
    if pts.total[o, a] != pts.total[o, b]:
        return pts.total[o, a] < pts.total[o, b]
    if pts.c[o, a] != pts.c[o, b]:
        return pts.c[o, a] < pts.c[o, b]
    return pts.n[o, a] < pts.n[o, b]


@njit(cache=True)
def _swap(arr, o, a, b):
    arr[o, a], arr[o, b] = arr[o, b], arr[o, a]


@njit(cache=True)
def sort_points(pts, o):
    """Insertion sort by (r, rho, b, sum T, config, n), then the per-owner minima."""
    for a in range(1, pts.count[o]):
        j = a
        while j > 0 and _key_less(pts, o, j, j - 1):
            for arr in (pts.r, pts.rho, pts.total):
                _swap(arr, o, j, j - 1)
            for arri in (pts.c, pts.m, pts.n, pts.bh):
                _swap(arri, o, j, j - 1)
            j -= 1
    npts = pts.count[o]
    pts.min_total[o] = pts.total[o, :npts].min()
    pts.min_r[o] = pts.r[o, :npts].min()
    pts.min_rho[o] = pts.rho[o, :npts].min()
    pts.min_bh[o] = pts.bh[o, :npts].min()
