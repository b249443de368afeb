"""The one evaluator: a Selection of a Problem -> stage vectors, link, memory, T_rtt.

Every rule of the physics the search scores is written here once and called
by the search leaf, its bounds, the plan writer and `simulate`:

- `transfer_occupancy`: a hand-off occupies the sender's egress and the
  receiver's ingress for payload x max(b_send, b_recv) / bandwidth;
- `plan_link`: stage hand-offs use the GPU's intra-node link only when every
  owner has one GPU type and the whole plan fits in one node;
- `memory_need` (written in compile/problem.py, shared with the batch caps): weights + the KV
  of the mu b resident requests (a fixed context: mu b x a request's KV; a workload: a reserve
  of their summed KV in the owner's own mix of full and sliding-window layers, Stages.kv_units)
  + b x workspace;
- `cost_rate`: USD per GPU-hour per resident request (the latency objective
  gives every owner 1/k so that cost equals T_rtt);
- `scenario_tpots` (a workload): per sampled snapshot of the resident contexts, the
  steady-state period with per-microbatch stage times, where a microbatch split over an
  owner's replicas waits for its slowest replica (the barrier). The plan's TPOT is a
  percentile of those periods and its cost uses their mean (docs/workloads.md).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from opweave_planner.compile.problem import (
    Problem,
    memory_need,
    objective_flags,
    order_index,
    range_sum,
    stage_time,
)
from opweave_planner.jit import entry, kernel, shared
from opweave_planner.schedule.kernels import (
    busy_fractions,
    critical_resource,
    make_scratch,
    simulate_rtt_per_microbatch,
    simulate_rtt_scratch,
)
from opweave_planner.search.state import Scratch, Selection

NODE_TOL = 1e-9
shared(order_index)  # the percentile rule, written once in compile/problem.py
# the memory and stage-time rules, written once in compile/problem.py (the batch caps call them too)
shared(memory_need)
shared(range_sum)
shared(stage_time)


@kernel
def transfer_occupancy(payload, bh_send, bh_recv, bw):
    return payload * max(bh_send, bh_recv) / bw


@kernel
def transfer_fixed(fab, c_send, c_recv):
    """One NCCL send/recv call per hand-off: the slower endpoint's fixed cost (µs)."""
    return max(fab.cfg_transfer_fixed[c_send], fab.cfg_transfer_fixed[c_recv])


@entry
def cost_rate(latency_objective, k, price, tp, mu, bh):
    """USD per GPU-hour per resident request of one owner point (1/k: the latency objective)."""
    if latency_objective:
        return 1.0 / k
    return price * tp / (mu * bh)


@kernel
def plan_link(fab, cfg, gpus):
    """(bytes/µs, latency µs, intra-node?) of the stage hand-offs of a complete plan."""
    c0 = cfg[0]
    if cfg.shape[0] > 1 and gpus <= fab.cfg_node[c0] + NODE_TOL:
        for o in range(cfg.shape[0]):
            if fab.cfg_gpu[cfg[o]] != fab.cfg_gpu[c0]:
                return fab.bw, fab.lat, False
        return fab.cfg_intra_bw[c0], fab.intra_lat, True
    return fab.bw, fab.lat, False


@kernel
def plan_gpus(fab, cfg, replicas):
    g = 0.0
    for o in range(cfg.shape[0]):
        g += fab.cfg_tp[cfg[o]] * replicas[o]
    return g


@kernel
def plan_nodes(fab, cfg, replicas):
    """Nodes a plan occupies: one when its hand-offs are intra-node, else each owner's
    replicas packed into its GPU type's nodes (a TP group never spans nodes)."""
    _bw, _lat, intra = plan_link(fab, cfg, plan_gpus(fab, cfg, replicas))
    if intra:
        return 1.0
    nodes = 0.0
    for o in range(cfg.shape[0]):
        nodes += owner_nodes(fab, cfg[o], replicas[o])
    return nodes


@kernel(refcount=False)
def owner_nodes(fab, c, n):
    """Nodes n replicas of config c fill when the plan spans nodes (the frontier compares it)."""
    node, tp = fab.cfg_node[c], fab.cfg_tp[c]
    if tp > node:  # a group wider than a node (not produced by the catalog's TP filter)
        return n * ((tp + node - 1) // node)
    per_node = node // tp
    return (n + per_node - 1) // per_node


@kernel
def stage_vectors(st, cf, fab, sc, link_bw, link_lat):
    """Fill compute time, hand-off occupancy and link latency per stage (µs) of the selection
    in sc.cfg / sc.mb / sc.bh."""
    s = st.stage_owner.shape[0]
    for j in range(s):
        o = st.stage_owner[j]
        c = sc.cfg[o]
        sc.t[j] = stage_time(cf.pref[c, sc.mb[o]], st.stage_start[j], st.stage_end[j], cf.cfg_stage_fixed[c])
        b = st.stage_owner[(j + 1) % s]
        if b != o:
            sc.occ[j] = transfer_occupancy(st.payload[j], float(sc.bh[o]), float(sc.bh[b]), link_bw)
            sc.latv[j] = link_lat + transfer_fixed(fab, c, sc.cfg[b])
        else:
            sc.occ[j] = 0.0
            sc.latv[j] = 0.0


@kernel
def owner_bytes(st, cf, units, o, c, mu, bh):
    """Bytes per GPU owner o needs in config c at microbatch bh."""
    w = 0.0
    kv = 0.0
    kvc = 0.0
    for j in range(st.stage_owner.shape[0]):
        if st.stage_owner[j] == o:
            w += range_sum(cf.wpref[c], st.stage_start[j], st.stage_end[j])
            kv += range_sum(cf.kvpref[c], st.stage_start[j], st.stage_end[j])
            kvc += range_sum(cf.kvcpref[c], st.stage_start[j], st.stage_end[j])
    return memory_need(units, w, kv, kvc, cf.cfg_ws[c], mu, bh)


@entry
def owner_need(p, o, c, mu, bh):
    """`owner_bytes` for Python (the brute-force test). Kernels call owner_bytes itself: a
    callee's CPython wrapper, which unboxes a whole Problem, is linked into every caller."""
    return owner_bytes(p.stages, p.configs, p.stages.kv_units[o, c], o, c, mu, bh)


@kernel(inline=True)
def evaluate_into(p, mu, sc):
    """The leaf: stage vectors of the selection in sc into sc, then the simulator (µs)."""
    st, fab = p.stages, p.fabric
    link_bw, link_lat, _intra = plan_link(fab, sc.cfg, plan_gpus(fab, sc.cfg, sc.rep))
    stage_vectors(st, p.configs, fab, sc, link_bw, link_lat)
    return simulate_rtt_scratch(st.stage_owner, sc.t, sc.occ, sc.latv, mu, st.k, sc.fbuf, sc.ibuf)


@kernel
def new_scratch(p, seed_cost):
    s, k, g, mu = p.stages.stage_owner.shape[0], p.stages.k, p.traffic.knots.shape[0], p.grid.max_mu
    fbuf, ibuf = make_scratch(s, mu, k)
    n_samples = p.traffic.scen_cs.shape[0] * p.grid.max_rep if g else 0
    return Scratch(
        sel=np.zeros(k, np.int64), cfg=np.zeros(k, np.int64), mb=np.zeros(k, np.int64),
        bh=np.zeros(k, np.int64), rep=np.zeros(k, np.int64), bhf=np.empty(k), eg=np.empty(k),
        ing=np.empty(k), t=np.empty(s), occ=np.empty(s), latv=np.empty(s), fbuf=fbuf, ibuf=ibuf,
        counters=np.zeros(4, np.int64), best_f=np.array([np.inf, 0.0, 0.0, seed_cost, 0.0]),
        best_i=np.zeros(2 + 3 * k, np.int64), walk_state=np.zeros(2, np.int64), kt=np.zeros((s, g)),
        t2=np.zeros((s, mu)), cg=np.zeros((mu, k), np.int64), cw=np.zeros((mu, k)),
        samples=np.zeros(n_samples))


# --------------------------------------------------------------------------- a workload


@kernel
def sample_groups(k, sc):
    """Independent systems per snapshot: a one-owner plan's replicas each give a sample; with
    several owners the replicas are coupled by the barrier and a snapshot gives one."""
    return sc.rep[0] if k == 1 else 1


@kernel
def knot_stage_times(st, cf, tr, sc):
    """sc.kt[j, g]: stage j's compute time per microbatch at context knot g (selection in sc)."""
    for j in range(st.stage_owner.shape[0]):
        o = st.stage_owner[j]
        c, m = sc.cfg[o], sc.mb[o]
        for g in range(tr.knots.shape[0]):
            sc.kt[j, g] = stage_time(tr.kpref[c, m, g], st.stage_start[j], st.stage_end[j], cf.cfg_stage_fixed[c])


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
def scenario_contexts(k, tr, s, B, mu, group, sc):
    """Knot position (sc.cg, sc.cw) of each (microbatch, owner) of scenario s.

    Microbatch i holds slots [i B/mu, (i+1) B/mu); an owner's replica r takes the r-th
    run of bh of them. One owner: its replicas are independent copies and `group` picks
    one. Several owners: a microbatch's stage on an owner ends when its slowest replica
    does (the barrier): the one with the largest mean context, latency being nondecreasing
    in context."""
    cs = tr.scen_cs[s]
    per = B // mu
    for i in range(mu):
        for o in range(k):
            bh = sc.bh[o]
            if k == 1:
                lo = i * per + group * bh
                x = (cs[lo + bh] - cs[lo]) / bh
            else:
                x = 0.0
                for r in range(sc.rep[o]):
                    lo = i * per + r * bh
                    x = max(x, (cs[lo + bh] - cs[lo]) / bh)
            g, w = locate(tr.knots, x)
            sc.cg[i, o] = g
            sc.cw[i, o] = w


@kernel
def scenario_tpots(st, tr, B, mu, sc, cap, fail_cap):
    """sc.samples[:n] = the steady-state period of each scenario (one owner: of each replica),
    with per-microbatch stage times; returns n, or -1 as soon as more than `fail_cap` samples
    exceed `cap` µs (the percentile can no longer meet it)."""
    owner, k = st.stage_owner, st.k
    groups = sample_groups(k, sc)
    n = 0
    fails = 0
    for s in range(tr.scen_cs.shape[0]):
        for group in range(groups):
            scenario_contexts(k, tr, s, B, mu, group, sc)
            for j in range(owner.shape[0]):
                o = owner[j]
                for i in range(mu):
                    sc.t2[j, i] = knot_time(sc.kt, j, sc.cg[i, o], sc.cw[i, o])
            v = simulate_rtt_per_microbatch(owner, sc.t2, sc.occ, sc.latv, mu, k, sc.fbuf, sc.ibuf)
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
    st, fab, tr = p.stages, p.fabric, p.traffic
    link_bw, link_lat, _intra = plan_link(fab, sc.cfg, plan_gpus(fab, sc.cfg, sc.rep))
    stage_vectors(st, p.configs, fab, sc, link_bw, link_lat)  # hand-off occupancy and latency (context-free)
    knot_stage_times(st, p.configs, tr, sc)
    total = tr.scen_cs.shape[0] * sample_groups(st.k, sc)
    kk = order_index(total, tr.pct)
    n = scenario_tpots(st, tr, B, mu, sc, cap, total - kk)
    if n < 0:
        return np.inf, np.inf
    vals = np.sort(sc.samples[:n])
    return vals[kk - 1], vals.sum() / n


@kernel(inline=True)
def _selected(p, cfg, mb, replicas):
    """A fresh scratch holding the given selection, as the walk's `_select` leaves it."""
    sc = new_scratch(p, np.inf)
    for o in range(p.stages.k):
        sc.cfg[o], sc.mb[o], sc.rep[o] = cfg[o], mb[o], replicas[o]
        sc.bh[o] = p.grid.mb_grid[mb[o]]
    return sc


@kernel(inline=True)
def _workload_times(p, B, mu, sc):
    """(checked, mean, shown) TPOT and the sorted scenario samples of the selection in sc."""
    st, tr = p.stages, p.traffic
    t_check, t_mean = evaluate_workload_into(p, B, mu, sc, np.inf)
    samples = np.sort(sc.samples[:tr.scen_cs.shape[0] * sample_groups(st.k, sc)])
    g, w = locate(tr.knots, tr.theta)  # stage figures shown at the stationary mean context
    for j in range(st.stage_owner.shape[0]):
        sc.t[j] = knot_time(sc.kt, j, g, w)
        for i in range(mu):
            sc.t2[j, i] = sc.t[j]
    # every microbatch alike through the per-microbatch simulator: the same schedule, and a
    # workload run compiles no one-time-per-stage variant of the simulator besides
    t_show = simulate_rtt_per_microbatch(st.stage_owner, sc.t2, sc.occ, sc.latv, mu, st.k, sc.fbuf, sc.ibuf)
    return t_check, t_mean, t_show, samples


class Evaluation(NamedTuple):
    """Everything a plan file states about a Selection (µs, bytes, cost rate), as `_detail`
    builds it.

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
    nodes: float  # the nodes it occupies (`plan_nodes`: what --max-nodes caps)
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


@kernel(inline=True)
def _detail(p, B, mu, cfg, mb, replicas, fixed, workload):
    """The plan writer's one entry point: the `Evaluation` of one selection, scored as the leaf
    scores it. fixed / workload: the objective's flags, exactly one None (`objective_flags`)."""
    st, cf, fab = p.stages, p.configs, p.fabric
    sc = _selected(p, cfg, mb, replicas)
    t_check = t_mean = t_show = 0.0
    samples = np.zeros(0)
    if fixed is not None:
        t_check = t_mean = t_show = evaluate_into(p, mu, sc)
    if workload is not None:
        t_check, t_mean, t_show, samples = _workload_times(p, B, mu, sc)
    s, k = st.stage_owner.shape[0], st.k
    measured = np.empty(s)
    for j in range(s):
        o = st.stage_owner[j]
        measured[j] = range_sum(cf.mpref[cfg[o], mb[o]], st.stage_start[j], st.stage_end[j])
    gpus = plan_gpus(fab, cfg, replicas)
    _bw, _lat, intra = plan_link(fab, cfg, gpus)
    comp, _egr, _ing = busy_fractions(st.stage_owner, sc.t, sc.occ, mu, k, t_show)
    kind, index = critical_resource(comp, _egr, _ing)
    need = np.empty(k)
    usable = np.empty(k)
    rate = 0.0
    for o in range(k):
        c = cfg[o]
        need[o] = owner_bytes(st, cf, st.kv_units[o, c], o, c, mu, sc.bh[o])
        usable[o] = cf.cfg_mem[c]
        rate += cost_rate(p.limits.latency_objective, k, cf.cfg_price[c], fab.cfg_tp[c], mu, sc.bh[o])
    # the stage vectors, not the whole scratch: every array returned is boxed by compiled code
    return Evaluation(t_rtt=t_check, t_mean=t_mean, t_show=t_show, samples=samples, t=sc.t, occ=sc.occ,
                      latv=sc.latv, measured=measured, gpus=gpus, intra_node=intra,
                      nodes=plan_nodes(fab, cfg, replicas), busy=comp,
                      critical_kind=kind, critical_index=index, memory_need=need, memory_usable=usable,
                      rate=rate)


@entry
def _detail_fixed(p, B, mu, cfg, mb, replicas):
    """`_detail` of a fixed context: one entry and cache file per objective (walk._search_fixed)."""
    return _detail(p, B, mu, cfg, mb, replicas, True, None)


@entry
def _detail_workload(p, B, mu, cfg, mb, replicas):
    """`_detail` of a workload."""
    return _detail(p, B, mu, cfg, mb, replicas, None, True)


def evaluate(p: Problem, sel: Selection) -> Evaluation:
    """Evaluate one Selection exactly as the search leaf scored it."""
    fixed, _workload = objective_flags(p)
    run = _detail_fixed if fixed else _detail_workload
    return run(p, int(sel.batch), int(sel.mu), _ints(sel.cfg), _ints(sel.mb), _ints(sel.replicas))


def _ints(a) -> np.ndarray:
    """int64, C-contiguous and writable: the one array type `_detail` is compiled for (a plan's
    selection may come from a file, a slice or a read-only view)."""
    return np.require(a, np.int64, ("C", "W"))
