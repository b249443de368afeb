"""The one evaluator: a Selection of a Problem -> stage vectors, link, memory, T_rtt.

Every rule of the physics the search scores is written here once and called
by the search leaf, its bounds, the plan writer and `simulate`:

- `transfer_occupancy`: a hand-off occupies the sender's egress and the
  receiver's ingress for payload x max(b_send, b_recv) / bandwidth;
- `plan_link`: stage hand-offs use the GPU's intra-node link only when every
  owner has one GPU type and the whole plan fits in one node;
- `memory_need`: weights + mu b x KV/state per request + b x workspace;
- `cost_rate`: USD per GPU-hour per resident request (the latency objective
  gives every owner 1/k so that cost equals T_rtt).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from opweave_planner.schedule.kernels import (
    busy_fractions,
    critical_resource,
    make_scratch,
    simulate_rtt_scratch,
)
from opweave_planner.search.problem import Problem, Scratch, Selection

NODE_TOL = 1e-9


@njit(cache=True)
def range_sum(pref, start, end):
    """Sum over the cyclic operator range [start, end) from a prefix-sum row."""
    if end > start:
        return pref[end] - pref[start]
    return pref[pref.shape[0] - 1] - pref[start] + pref[end]


@njit(cache=True)
def stage_time(pref_row, start, end, fixed):
    """A stage's compute time per microbatch: its operators' latencies plus the fixed
    dispatch cost every stage pays however small (a graph launch after its input arrives)."""
    return range_sum(pref_row, start, end) + fixed


@njit(cache=True)
def transfer_occupancy(payload, bh_send, bh_recv, bw):
    return payload * max(bh_send, bh_recv) / bw


@njit(cache=True)
def transfer_fixed(p, c_send, c_recv):
    """One NCCL send/recv call per hand-off: the slower endpoint's fixed cost (µs)."""
    return max(p.cfg_transfer_fixed[c_send], p.cfg_transfer_fixed[c_recv])


@njit(cache=True)
def memory_need(weights, kv_per_request, workspace_per_request, mu, bh):
    return weights + mu * bh * kv_per_request + bh * workspace_per_request


@njit(cache=True)
def cost_rate(latency_objective, k, price, tp, mu, bh):
    """USD per GPU-hour per resident request of one owner point (1/k: the latency objective)."""
    if latency_objective:
        return 1.0 / k
    return price * tp / (mu * bh)


@njit(cache=True)
def plan_link(p, cfg, gpus):
    """(bytes/µs, latency µs, intra-node?) of the stage hand-offs of a complete plan."""
    c0 = cfg[0]
    if p.k > 1 and gpus <= p.cfg_node[c0] + NODE_TOL:
        for o in range(p.k):
            if p.cfg_gpu[cfg[o]] != p.cfg_gpu[c0]:
                return p.bw, p.lat, False
        return p.cfg_intra_bw[c0], p.intra_lat, True
    return p.bw, p.lat, False


@njit(cache=True)
def plan_gpus(p, cfg, replicas):
    g = 0.0
    for o in range(p.k):
        g += p.cfg_tp[cfg[o]] * replicas[o]
    return g


@njit(cache=True)
def plan_nodes(p, cfg, replicas):
    """Nodes a plan occupies: one when its hand-offs are intra-node, else each owner's
    replicas packed into its GPU type's nodes (a TP group never spans nodes)."""
    _bw, _lat, intra = plan_link(p, cfg, plan_gpus(p, cfg, replicas))
    if intra:
        return 1.0
    nodes = 0.0
    for o in range(p.k):
        c = cfg[o]
        node, tp = p.cfg_node[c], p.cfg_tp[c]
        if tp > node:  # a group wider than a node (not produced by the catalog's TP filter)
            nodes += replicas[o] * ((tp + node - 1) // node)
        else:
            per_node = node // tp
            nodes += (replicas[o] + per_node - 1) // per_node
    return nodes


@njit(cache=True)
def stage_vectors(p, sc, link_bw, link_lat):
    """Fill compute time, hand-off occupancy and link latency per stage (µs) of the selection
    in sc.cfg / sc.mb / sc.bh."""
    s = p.stage_owner.shape[0]
    for j in range(s):
        o = p.stage_owner[j]
        c = sc.cfg[o]
        sc.t[j] = stage_time(p.pref[c, sc.mb[o]], p.stage_start[j], p.stage_end[j], p.cfg_stage_fixed[c])
        b = p.stage_owner[(j + 1) % s]
        if b != o:
            sc.occ[j] = transfer_occupancy(p.payload[j], sc.bh[o], sc.bh[b], link_bw)
            sc.latv[j] = link_lat + transfer_fixed(p, c, sc.cfg[b])
        else:
            sc.occ[j] = 0.0
            sc.latv[j] = 0.0


@njit(cache=True)
def owner_need(p, o, c, mu, bh):
    """Bytes per GPU owner o needs in config c at microbatch bh."""
    w = 0.0
    kv = 0.0
    for j in range(p.stage_owner.shape[0]):
        if p.stage_owner[j] == o:
            w += range_sum(p.wpref[c], p.stage_start[j], p.stage_end[j])
            kv += range_sum(p.kvpref[c], p.stage_start[j], p.stage_end[j])
    return memory_need(w, kv, p.cfg_ws[c], mu, bh)


@njit(cache=True)
def evaluate_into(p, mu, sc):
    """The leaf: stage vectors of the selection in sc into sc, then the simulator (µs)."""
    link_bw, link_lat, _intra = plan_link(p, sc.cfg, plan_gpus(p, sc.cfg, sc.rep))
    stage_vectors(p, sc, link_bw, link_lat)
    return simulate_rtt_scratch(p.stage_owner, sc.t, sc.occ, sc.latv, mu, p.k, sc.fbuf, sc.ibuf)


@njit(cache=True)
def new_scratch(p, seed_cost):
    s, k = p.stage_owner.shape[0], p.k
    fbuf, ibuf = make_scratch(s, p.max_mu, k)
    best_f = np.array([np.inf, 0.0, 0.0, seed_cost])
    return Scratch(np.zeros(k, np.int64), np.zeros(k, np.int64), np.zeros(k, np.int64),
                   np.zeros(k, np.int64), np.zeros(k, np.int64), np.empty(k), np.empty(k), np.empty(k),
                   np.empty(s), np.empty(s), np.empty(s), fbuf, ibuf, np.zeros(4, np.int64), best_f,
                   np.zeros(2 + 3 * k, np.int64), np.zeros(2, np.int64))


@njit(cache=True)
def _evaluate_detail(p, mu, cfg, mb, replicas):
    s, k = p.stage_owner.shape[0], p.k
    sc = new_scratch(p, np.inf)
    for o in range(k):
        sc.cfg[o], sc.mb[o], sc.rep[o] = cfg[o], mb[o], replicas[o]
        sc.bh[o] = p.mb_grid[mb[o]]
    t_rtt = evaluate_into(p, mu, sc)
    t, occ, latv, bh = sc.t, sc.occ, sc.latv, sc.bh
    measured = np.empty(s)
    gpus = plan_gpus(p, cfg, replicas)
    _bw, _lat, intra = plan_link(p, cfg, gpus)
    for j in range(s):
        o = p.stage_owner[j]
        measured[j] = range_sum(p.mpref[cfg[o], mb[o]], p.stage_start[j], p.stage_end[j])
    comp, egr, ing = busy_fractions(p.stage_owner, t, occ, mu, k, t_rtt)
    kind, index = critical_resource(comp, egr, ing)
    need = np.empty(k)
    usable = np.empty(k)
    rsum = 0.0
    for o in range(k):
        need[o] = owner_need(p, o, cfg[o], mu, bh[o])
        usable[o] = p.cfg_mem[cfg[o]]
        rsum += cost_rate(p.latency_objective, k, p.cfg_price[cfg[o]], p.cfg_tp[cfg[o]], mu, bh[o])
    return t_rtt, t, occ, latv, measured, gpus, intra, comp, kind, index, need, usable, rsum


class Evaluation(NamedTuple):
    """Everything a plan file states about a Selection (µs, bytes, cost rate)."""

    t_rtt: float
    t: np.ndarray  # compute per stage and microbatch
    occ: np.ndarray  # hand-off link occupancy per stage
    latv: np.ndarray  # hand-off latency per stage
    measured: np.ndarray  # the part of t taken from measured/interpolated tables
    gpus: float
    intra_node: bool
    busy: np.ndarray  # compute busy fraction per owner
    critical_kind: int
    critical_index: int
    memory_need: np.ndarray  # bytes per GPU per owner
    memory_usable: np.ndarray
    rate: float  # sum over owners of the cost rate

    @property
    def cost(self) -> float:
        return self.t_rtt * self.rate

    @property
    def fits_memory(self) -> bool:
        return bool((self.memory_need <= self.memory_usable).all())


def evaluate(p: Problem, sel: Selection) -> Evaluation:
    """Evaluate one Selection exactly as the search leaf scored it."""
    out = _evaluate_detail(p, sel.mu, sel.cfg, sel.mb, sel.replicas)
    t_rtt, t, occ, latv, measured, gpus, intra, comp, kind, index, need, usable, rate = out
    return Evaluation(float(t_rtt), t, occ, latv, measured, float(gpus), bool(intra), comp, int(kind),
                      int(index), need, usable, float(rate))
