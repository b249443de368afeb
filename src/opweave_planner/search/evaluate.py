"""The one evaluator: a Selection of a Problem -> stage vectors, link, memory, T_rtt.

Every rule of the physics the search scores is written here once and called
by the search leaf, its bounds, the plan writer and `simulate`:

- `transfer_occupancy`: a hand-off occupies the sender's egress and the
  receiver's ingress for payload x max(b_send, b_recv) / bandwidth;
- `plan_link`: stage hand-offs use the GPU's intra-node link only when every
  owner has one GPU type and the whole plan fits in one node;
- `memory_need`: weights + the KV of the mu b resident requests (a fixed context:
  mu b x a request's KV; a workload: a quantile of their summed context) + b x workspace;
- `cost_rate`: USD per GPU-hour per resident request (the latency objective
  gives every owner 1/k so that cost equals T_rtt);
- `scenario_tpots` (a workload): per sampled snapshot of the resident contexts, the
  steady-state period with per-microbatch stage times, where a microbatch split over an
  owner's replicas waits for its slowest replica (the barrier). The plan's TPOT is a
  percentile of those periods and its cost uses their mean (docs/workloads.md).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from opweave_planner.jit import entry, kernel
from opweave_planner.schedule.kernels import (
    busy_fractions,
    critical_resource,
    make_scratch,
    simulate_rtt_per_microbatch,
    simulate_rtt_scratch,
)
from opweave_planner.search.problem import (
    Fabric,
    Problem,
    Scratch,
    Selection,
    objective_flags,
)

NODE_TOL = 1e-9


@entry
def range_sum(pref, start, end):
    """Sum over the cyclic operator range [start, end) from a prefix-sum row."""
    if end > start:
        return pref[end] - pref[start]
    return pref[pref.shape[0] - 1] - pref[start] + pref[end]


@entry
def stage_time(pref_row, start, end, fixed):
    """A stage's compute time per microbatch: its operators' latencies plus the fixed
    dispatch cost every stage pays however small (a graph launch after its input arrives)."""
    return range_sum(pref_row, start, end) + fixed


@kernel
def transfer_occupancy(payload, bh_send, bh_recv, bw):
    return payload * max(bh_send, bh_recv) / bw


@kernel
def transfer_fixed(p, c_send, c_recv):
    """One NCCL send/recv call per hand-off: the slower endpoint's fixed cost (µs)."""
    return max(p.cfg_transfer_fixed[c_send], p.cfg_transfer_fixed[c_recv])


@kernel
def memory_need(units, weights, kv_per_unit, kv_per_request, workspace_per_request, mu, bh):
    """Bytes per GPU of a replica holding mu x bh resident requests (units: Problem.units)."""
    n = mu * bh
    return weights + units[n] * kv_per_unit + n * kv_per_request + bh * workspace_per_request


@entry
def cost_rate(latency_objective, k, price, tp, mu, bh):
    """USD per GPU-hour per resident request of one owner point (1/k: the latency objective)."""
    if latency_objective:
        return 1.0 / k
    return price * tp / (mu * bh)


@kernel(inline=True, refcount=False)
def fabric(p):
    """The GPUs and links of a Problem or a Hot (same field names), as one small tuple: the
    link and node rules then compile once, not once per tuple type that carries them. It
    allocates nothing, so it may be inlined into `hot` callers (walk) as well as `inner` ones."""
    return Fabric(p.cfg_gpu, p.cfg_node, p.cfg_tp, p.cfg_intra_bw, p.bw, p.lat, p.intra_lat)


@kernel
def plan_link(f, cfg, gpus):
    """(bytes/µs, latency µs, intra-node?) of the stage hand-offs of a complete plan (f: Fabric)."""
    c0 = cfg[0]
    if cfg.shape[0] > 1 and gpus <= f.cfg_node[c0] + NODE_TOL:
        for o in range(cfg.shape[0]):
            if f.cfg_gpu[cfg[o]] != f.cfg_gpu[c0]:
                return f.bw, f.lat, False
        return f.cfg_intra_bw[c0], f.intra_lat, True
    return f.bw, f.lat, False


@kernel
def plan_gpus(f, cfg, replicas):
    g = 0.0
    for o in range(cfg.shape[0]):
        g += f.cfg_tp[cfg[o]] * replicas[o]
    return g


@kernel
def plan_nodes(f, cfg, replicas):
    """Nodes a plan occupies: one when its hand-offs are intra-node, else each owner's
    replicas packed into its GPU type's nodes (a TP group never spans nodes)."""
    _bw, _lat, intra = plan_link(f, cfg, plan_gpus(f, cfg, replicas))
    if intra:
        return 1.0
    nodes = 0.0
    for o in range(cfg.shape[0]):
        c = cfg[o]
        node, tp = f.cfg_node[c], f.cfg_tp[c]
        if tp > node:  # a group wider than a node (not produced by the catalog's TP filter)
            nodes += replicas[o] * ((tp + node - 1) // node)
        else:
            per_node = node // tp
            nodes += (replicas[o] + per_node - 1) // per_node
    return nodes


@kernel
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
            sc.occ[j] = transfer_occupancy(p.payload[j], float(sc.bh[o]), float(sc.bh[b]), link_bw)
            sc.latv[j] = link_lat + transfer_fixed(p, c, sc.cfg[b])
        else:
            sc.occ[j] = 0.0
            sc.latv[j] = 0.0


@kernel
def owner_bytes(p, o, c, mu, bh):
    """Bytes per GPU owner o needs in config c at microbatch bh."""
    w = 0.0
    kv = 0.0
    kvc = 0.0
    for j in range(p.stage_owner.shape[0]):
        if p.stage_owner[j] == o:
            w += range_sum(p.wpref[c], p.stage_start[j], p.stage_end[j])
            kv += range_sum(p.kvpref[c], p.stage_start[j], p.stage_end[j])
            kvc += range_sum(p.kvcpref[c], p.stage_start[j], p.stage_end[j])
    return memory_need(p.units, w, kv, kvc, p.cfg_ws[c], mu, bh)


@entry
def owner_need(p, o, c, mu, bh):
    """`owner_bytes` for Python (the brute-force test). Kernels call owner_bytes itself: a
    callee's CPython wrapper, which unboxes a whole Problem, is linked into every caller."""
    return owner_bytes(p, o, c, mu, bh)


@kernel(inline=True)
def evaluate_into(p, mu, sc):
    """The leaf: stage vectors of the selection in sc into sc, then the simulator (µs)."""
    link_bw, link_lat, _intra = plan_link(fabric(p), sc.cfg, plan_gpus(fabric(p), sc.cfg, sc.rep))
    stage_vectors(p, sc, link_bw, link_lat)
    return simulate_rtt_scratch(p.stage_owner, sc.t, sc.occ, sc.latv, mu, p.k, sc.fbuf, sc.ibuf)


@kernel
def new_scratch(p, seed_cost):
    s, k, g, mu = p.stage_owner.shape[0], p.k, p.knots.shape[0], p.max_mu
    fbuf, ibuf = make_scratch(s, mu, k)
    best_f = np.array([np.inf, 0.0, 0.0, seed_cost, 0.0])
    n_samples = p.scen_cs.shape[0] * p.max_rep if g else 0
    return Scratch(np.zeros(k, np.int64), np.zeros(k, np.int64), np.zeros(k, np.int64),
                   np.zeros(k, np.int64), np.zeros(k, np.int64), np.empty(k), np.empty(k), np.empty(k),
                   np.empty(s), np.empty(s), np.empty(s), fbuf, ibuf, np.zeros(4, np.int64), best_f,
                   np.zeros(2 + 3 * k, np.int64), np.zeros(2, np.int64), np.zeros((s, g)),
                   np.zeros((s, mu)), np.zeros((mu, k), np.int64), np.zeros((mu, k)), np.zeros(n_samples))


# --------------------------------------------------------------------------- a workload


@entry
def order_index(n, pct):
    """k of the percentile's order statistic x_(k) of n samples: k = ceil(n pct), numpy's
    'inverted_cdf' (never an interpolation, so a pointwise lower bound stays one)."""
    k = math.ceil(n * pct - 1e-9)
    return min(max(k, 1), n)


@kernel
def sample_groups(p, sc):
    """Independent systems per snapshot: a one-owner plan's replicas each give a sample; with
    several owners the replicas are coupled by the barrier and a snapshot gives one."""
    return sc.rep[0] if p.k == 1 else 1


@kernel
def knot_stage_times(p, sc):
    """sc.kt[j, g]: stage j's compute time per microbatch at context knot g (selection in sc)."""
    for j in range(p.stage_owner.shape[0]):
        o = p.stage_owner[j]
        c, m = sc.cfg[o], sc.mb[o]
        for g in range(p.knots.shape[0]):
            sc.kt[j, g] = stage_time(p.kpref[c, m, g], p.stage_start[j], p.stage_end[j], p.cfg_stage_fixed[c])


@kernel
def locate(knots, x):
    """(g, w) with x = (1 - w) knots[g] + w knots[g + 1], clamped to the knot range."""
    last = knots.shape[0] - 1
    if x <= knots[0]:
        return 0, 0.0
    if x >= knots[last]:
        return last - 1, 1.0
    lo, hi = 0, last
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if knots[mid] <= x:
            lo = mid
        else:
            hi = mid
    return lo, (x - knots[lo]) / (knots[lo + 1] - knots[lo])


@kernel
def knot_time(kt, j, g, w):
    """Stage j's time at the context (g, w): linear between the two knots around it."""
    a = kt[j, g]
    return a + w * (kt[j, g + 1] - a)


@kernel
def scenario_contexts(p, s, B, mu, group, sc):
    """Knot position (sc.cg, sc.cw) of each (microbatch, owner) of scenario s.

    Microbatch i holds slots [i B/mu, (i+1) B/mu); an owner's replica r takes the r-th
    run of bh of them. One owner: its replicas are independent copies and `group` picks
    one. Several owners: a microbatch's stage on an owner ends when its slowest replica
    does (the barrier): the one with the largest mean context, latency being nondecreasing
    in context."""
    cs = p.scen_cs[s]
    per = B // mu
    for i in range(mu):
        for o in range(p.k):
            bh = sc.bh[o]
            if p.k == 1:
                lo = i * per + group * bh
                x = (cs[lo + bh] - cs[lo]) / bh
            else:
                x = 0.0
                for r in range(sc.rep[o]):
                    lo = i * per + r * bh
                    x = max(x, (cs[lo + bh] - cs[lo]) / bh)
            g, w = locate(p.knots, x)
            sc.cg[i, o] = g
            sc.cw[i, o] = w


@kernel
def scenario_tpots(p, B, mu, sc, cap, fail_cap):
    """sc.samples[:n] = the steady-state period of each scenario (one owner: of each replica),
    with per-microbatch stage times; returns n, or -1 as soon as more than `fail_cap` samples
    exceed `cap` µs (the percentile can no longer meet it)."""
    s_n, k = p.stage_owner.shape[0], p.k
    groups = sample_groups(p, sc)
    n = 0
    fails = 0
    for s in range(p.scen_cs.shape[0]):
        for group in range(groups):
            scenario_contexts(p, s, B, mu, group, sc)
            for j in range(s_n):
                o = p.stage_owner[j]
                for i in range(mu):
                    sc.t2[j, i] = knot_time(sc.kt, j, sc.cg[i, o], sc.cw[i, o])
            v = simulate_rtt_per_microbatch(p.stage_owner, sc.t2, sc.occ, sc.latv, mu, k, sc.fbuf, sc.ibuf)
            sc.samples[n] = v
            n += 1
            if v > cap:
                fails += 1
                if fails > fail_cap:
                    return -1
    return n


@kernel
def evaluate_workload_into(p, B, mu, sc, cap):
    """(percentile TPOT, mean TPOT) µs of the selection in sc under the workload's scenarios;
    (inf, inf) as soon as the percentile is sure to exceed `cap` µs (the search passes the SLO,
    the plan writer inf). A float, not a flag: numba compiles a function once per literal bool."""
    link_bw, link_lat, _intra = plan_link(fabric(p), sc.cfg, plan_gpus(fabric(p), sc.cfg, sc.rep))
    stage_vectors(p, sc, link_bw, link_lat)  # hand-off occupancy and latency (context-free)
    knot_stage_times(p, sc)
    total = p.scen_cs.shape[0] * sample_groups(p, sc)
    kk = order_index(total, p.pct)
    n = scenario_tpots(p, B, mu, sc, cap, total - kk)
    if n < 0:
        return np.inf, np.inf
    vals = np.sort(sc.samples[:n])
    return vals[kk - 1], vals.sum() / n


@kernel(inline=True)
def _selected(p, cfg, mb, replicas):
    """A fresh scratch holding the given selection, as the walk's `_select` leaves it."""
    sc = new_scratch(p, np.inf)
    for o in range(p.k):
        sc.cfg[o], sc.mb[o], sc.rep[o] = cfg[o], mb[o], replicas[o]
        sc.bh[o] = p.mb_grid[mb[o]]
    return sc


@kernel(inline=True)
def _workload_times(p, B, mu, sc):
    """(checked, mean, shown) TPOT and the sorted scenario samples of the selection in sc."""
    t_check, t_mean = evaluate_workload_into(p, B, mu, sc, np.inf)
    samples = np.sort(sc.samples[:p.scen_cs.shape[0] * sample_groups(p, sc)])
    g, w = locate(p.knots, p.theta)  # stage figures shown at the stationary mean context
    for j in range(p.stage_owner.shape[0]):
        sc.t[j] = knot_time(sc.kt, j, g, w)
        for i in range(mu):
            sc.t2[j, i] = sc.t[j]
    # every microbatch alike through the per-microbatch simulator: the same schedule, and a
    # workload run compiles no one-time-per-stage variant of the simulator besides
    t_show = simulate_rtt_per_microbatch(p.stage_owner, sc.t2, sc.occ, sc.latv, mu, p.k, sc.fbuf, sc.ibuf)
    return t_check, t_mean, t_show, samples


@entry
def _detail(p, B, mu, cfg, mb, replicas, fixed, workload):
    """The plan writer's one entry point: `Evaluation`'s fields for one selection, scored as the
    leaf scores it. fixed / workload: the objective's flags, exactly one None (`objective_flags`)."""
    sc = _selected(p, cfg, mb, replicas)
    t_check = t_mean = t_show = 0.0
    samples = np.zeros(0)
    if fixed is not None:
        t_check = t_mean = t_show = evaluate_into(p, mu, sc)
    if workload is not None:
        t_check, t_mean, t_show, samples = _workload_times(p, B, mu, sc)
    # the stage vectors, not the whole scratch: every array returned is boxed by compiled code
    return (t_check, t_mean, t_show, samples, sc.t, sc.occ, sc.latv) + _figures(p, mu, cfg, mb, replicas, sc, t_show)


@kernel(inline=True)
def _figures(p, mu, cfg, mb, replicas, sc, t_show):
    """Everything else a plan states about the selection in sc (stage vectors already there)."""
    s, k = p.stage_owner.shape[0], p.k
    measured = np.empty(s)
    gpus = plan_gpus(fabric(p), cfg, replicas)
    _bw, _lat, intra = plan_link(fabric(p), cfg, gpus)
    for j in range(s):
        o = p.stage_owner[j]
        measured[j] = range_sum(p.mpref[cfg[o], mb[o]], p.stage_start[j], p.stage_end[j])
    comp, egr, ing = busy_fractions(p.stage_owner, sc.t, sc.occ, mu, k, t_show)
    kind, index = critical_resource(comp, egr, ing)
    need = np.empty(k)
    usable = np.empty(k)
    rsum = 0.0
    for o in range(k):
        need[o] = owner_bytes(p, o, cfg[o], mu, sc.bh[o])
        usable[o] = p.cfg_mem[cfg[o]]
        rsum += cost_rate(p.latency_objective, k, p.cfg_price[cfg[o]], p.cfg_tp[cfg[o]], mu, sc.bh[o])
    return measured, gpus, intra, comp, kind, index, need, usable, rsum


class Evaluation(NamedTuple):
    """Everything a plan file states about a Selection (µs, bytes, cost rate).

    A fixed context: t_rtt = t_mean = t_show, the steady-state round trip. A workload: t_rtt is
    the SLO percentile of the scenario periods (`samples`, sorted), t_mean their mean (what the
    cost uses), and the per-stage figures and busy fractions are at the stationary mean context,
    whose round trip is t_show.
    """

    t_rtt: float
    t_mean: float
    t_show: float
    samples: np.ndarray
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
        return self.t_mean * self.rate

    def percentile(self, pct: float) -> float:
        """A percentile (fraction) of the scenario TPOTs, by the search's order-statistic rule."""
        if not self.samples.size:
            return self.t_rtt
        return float(self.samples[order_index(self.samples.size, pct) - 1])

    @property
    def fits_memory(self) -> bool:
        return bool((self.memory_need <= self.memory_usable).all())


def evaluate(p: Problem, sel: Selection) -> Evaluation:
    """Evaluate one Selection exactly as the search leaf scored it."""
    (t_rtt, t_mean, t_show, samples, t, occ, latv, measured, gpus, intra, comp, kind, index, need, usable,
     rate) = _detail(p, sel.batch, sel.mu, sel.cfg, sel.mb, sel.replicas, *objective_flags(p))
    return Evaluation(float(t_rtt), float(t_mean), float(t_show), samples, t, occ, latv, measured,
                      float(gpus), bool(intra), comp, int(kind), int(index), need, usable, float(rate))
