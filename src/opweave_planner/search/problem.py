"""What the numba search reads and returns, as named tuples of plain arrays.

`Problem` holds one template's stages, every device-group configuration's
latency/weight/KV prefix sums and prices, the grid and the limits. It is built
and size-checked here, once, in Python: numba does not bounds-check, so every
implicit size rule (the microbatch index covers every b = B/(mu n), prefix sums
have N+1 entries, `cfg_ok` has one row per owner) is asserted before a kernel
runs. `Selection` names a complete plan inside a Problem; `Counters` are the
search statistics. Time unit: microseconds; cost rate: USD per GPU-hour per
resident request.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

PRUNE_EPS = 1e-12  # pruning / SLO margin: a candidate that could tie is never pruned


class Problem(NamedTuple):
    stage_owner: np.ndarray  # int64[S]: owner of each stage
    stage_start: np.ndarray  # int64[S]: first operator (cyclic range [start, end))
    stage_end: np.ndarray  # int64[S]
    payload: np.ndarray  # float64[S]: bytes per request sent after stage j
    k: int  # owners
    pref: np.ndarray  # float64[C, M, N+1]: latency prefix sums per config and microbatch size
    mpref: np.ndarray  # float64[C, M, N+1]: prefix sums of the measured part of the latency
    wpref: np.ndarray  # float64[C, N+1]: weight bytes per GPU
    kvpref: np.ndarray  # float64[C, N+1]: KV bytes per GPU per reserved unit (see `units`)
    cfg_tp: np.ndarray  # int64[C]
    cfg_price: np.ndarray  # float64[C]: USD per GPU-hour
    cfg_mem: np.ndarray  # float64[C]: usable bytes per GPU
    cfg_ws: np.ndarray  # float64[C]: workspace bytes per request per GPU
    cfg_ok: np.ndarray  # bool[k, C]: configs an owner may take
    cfg_gpu: np.ndarray  # int64[C]: GPU type index
    cfg_node: np.ndarray  # int64[C]: GPUs per node
    cfg_intra_bw: np.ndarray  # float64[C]: intra-node bytes per µs
    cfg_stage_fixed: np.ndarray  # float64[C]: µs each stage costs per microbatch (dispatch)
    cfg_transfer_fixed: np.ndarray  # float64[C]: µs of one NCCL send/recv call on the config's GPU
    mb_grid: np.ndarray  # int64[M]: microbatch size of each grid index
    mb_index: np.ndarray  # int64[max b + 1]: grid index of a microbatch size, or -1
    batches: np.ndarray  # int64: global batch sizes
    max_mu: int
    max_rep: int
    max_gpus: float
    bw: float  # inter-node bytes per µs
    lat: float  # inter-node latency, µs
    intra_lat: float  # intra-node latency, µs
    slo: float  # µs
    latency_objective: bool  # minimise T_rtt instead of cost (owner rates sum to one)
    max_nodes: float  # nodes a plan may occupy (inf: no limit)
    prune_factor: float  # (1 + slack)(1 + 1e-12): prune what exceeds the incumbent by more
    # memory of n resident requests: units[n] x kvpref + n x kvcpref. A fixed context: units[n] = n
    # and kvpref is a request's whole KV; a workload: units[n] is the context tokens reserved for n
    # requests (a quantile of their sum, at least one request at the longest context)
    # (None: a fixed context's value, filled by `typed`)
    units: np.ndarray | None = None  # float64[max B + 1]
    kvcpref: np.ndarray | None = None  # float64[C, N+1]: KV/state bytes per GPU per request, not growing
    # a workload (stochastic objective; all empty for a fixed context): stage latencies at
    # context knots, the scenarios' per-slot context prefix sums, the SLO percentile (fraction)
    knots: np.ndarray | None = None  # float64[G]: context knots (G = 0: fixed context)
    kpref: np.ndarray | None = None  # float64[C, M, G, N+1]: latency prefix sums at each knot
    scen_cs: np.ndarray | None = None  # float64[n_scenarios, max B + 1]: cumulative context over slots
    # knot_free[a, b]: configs a and b differ by the same latency at every knot (dominance at
    # one context is dominance at all); None: True for a fixed context, False for a workload
    knot_free: np.ndarray | None = None  # bool[C, C]
    pct: float = 0.0  # SLO percentile as a fraction (0.95)
    theta: float = 0.0  # stationary mean context (what the plan's stage figures are shown at)


class Hot(NamedTuple):
    """The part of a Problem the per-(B, mu) loops read, bound once per template.

    Numba reads a field of a large heterogeneous tuple (the whole Problem, with its 3-D
    latency tables) far more slowly than one of a small tuple; measured on gemma-3-27b, H100,
    this alone made the search 2-3x slower. The field names are the Problem's, so the
    evaluator's physics functions accept either.
    """

    cfg_ok: np.ndarray
    mb_index: np.ndarray
    cfg_ws: np.ndarray
    cfg_mem: np.ndarray
    cfg_tp: np.ndarray
    cfg_price: np.ndarray
    cfg_gpu: np.ndarray
    cfg_node: np.ndarray
    cfg_intra_bw: np.ndarray
    cfg_transfer_fixed: np.ndarray
    units: np.ndarray
    k: int
    max_rep: int
    latency_objective: bool
    use_bnb: bool
    prune_factor: float
    slo_cap: float  # slo x (1 + 1e-12)
    gpu_cap: float  # max_gpus + 1e-9
    max_nodes: float
    bw: float
    lat: float
    intra_lat: float
    transfer_fixed_min: float  # the cheapest NCCL call of any config: what the bounds may assume


class Fabric(NamedTuple):
    """The GPU and link facts the link and node rules read (see `evaluate.fabric`)."""

    cfg_gpu: np.ndarray
    cfg_node: np.ndarray
    cfg_tp: np.ndarray
    cfg_intra_bw: np.ndarray
    bw: float
    lat: float
    intra_lat: float


class Selection(NamedTuple):
    """A complete plan inside a Problem: global batch, microbatches, and per owner its
    configuration, replica count and microbatch grid index."""

    batch: int
    mu: int
    cfg: np.ndarray  # int64[k]
    replicas: np.ndarray  # int64[k]
    mb: np.ndarray  # int64[k]


class Scratch(NamedTuple):
    """Working arrays of one search or evaluation (no allocation in the hot loop)."""

    sel: np.ndarray  # int64[k]: selected point index per owner
    cfg: np.ndarray  # int64[k]: the selection as the evaluator reads it
    mb: np.ndarray
    bh: np.ndarray
    rep: np.ndarray
    bhf: np.ndarray  # float64[k]: bound scratch
    eg: np.ndarray
    ing: np.ndarray
    t: np.ndarray  # float64[S]: stage vectors
    occ: np.ndarray
    latv: np.ndarray
    fbuf: np.ndarray  # simulator scratch
    ibuf: np.ndarray
    counters: np.ndarray  # int64[4], Counters order
    best_f: np.ndarray  # float64[5]: cost, checked TPOT (percentile), gpus, incumbent, mean TPOT
    best_i: np.ndarray  # int64[2 + 3k]: B, mu, then (cfg, replicas, mb) per owner
    walk_state: np.ndarray  # int64[2]: level, and 1 while a walk is suspended at a leaf
    kt: np.ndarray  # float64[S, G]: stage times at the context knots (workload)
    t2: np.ndarray  # float64[S, max mu]: stage times per microbatch of one scenario
    cg: np.ndarray  # int64[max mu, k]: knot index of each (microbatch, owner) context
    cw: np.ndarray  # float64[max mu, k]: interpolation weight of that context
    samples: np.ndarray  # float64[n_scenarios x max replicas]: per-scenario TPOT samples


class Counters(NamedTuple):
    candidates: int = 0
    simulations: int = 0
    pruned_by_bound: int = 0
    pruned_by_frontier: int = 0

    def __add__(self, other: Counters) -> Counters:  # type: ignore[override]
        return Counters(*(a + b for a, b in zip(self, other, strict=True)))


class SearchResult(NamedTuple):
    """One template's best plan (`found` False: none) and its statistics."""

    found: bool
    cost: float  # cost rate x µs
    t_rtt: float  # µs: the figure checked against the SLO (a workload: its percentile)
    gpus: float
    selection: Selection
    counters: Counters
    t_mean: float = 0.0  # µs: mean TPOT (cost is mean x rate); a fixed context: t_rtt


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(f"inconsistent search problem: {what}")


def check_problem(p: Problem) -> Problem:
    """Assert every size rule the kernels rely on (they do not bounds-check)."""
    s = p.stage_owner.shape[0]
    c_n, m_n, n1 = p.pref.shape
    _check(s >= 1 and p.stage_start.shape == (s,) and p.stage_end.shape == (s,) and p.payload.shape == (s,),
           "stage arrays differ in length")
    _check(p.k >= 1 and int(p.stage_owner.min()) == 0 and int(p.stage_owner.max()) == p.k - 1,
           "owners are not 0..k-1")
    _check(bool(((p.stage_start >= 0) & (p.stage_start < n1) & (p.stage_end >= 0) & (p.stage_end < n1)).all()),
           "stage ranges outside the operator sequence")
    _check(p.mpref.shape == p.pref.shape, "mpref shape")
    _check(p.wpref.shape == (c_n, n1) and p.kvpref.shape == (c_n, n1) and p.kvcpref.shape == (c_n, n1),
           "weight/KV prefix shapes")
    _check(p.units.shape[0] >= int(p.batches.max()) + 1, "units does not cover every resident count")
    g_n = p.knots.shape[0]
    _check(p.kpref.shape == (c_n, m_n, g_n, n1), "kpref is not [C, M, G, N+1]")
    _check(p.knot_free.shape == (c_n, c_n), "knot_free is not [C, C]")
    if g_n:
        _check(g_n >= 2 and bool((np.diff(p.knots) > 0).all()), "knots not increasing")
        _check(p.scen_cs.shape[0] >= 1 and p.scen_cs.shape[1] >= int(p.batches.max()) + 1,
               "scenarios do not cover every slot")
        _check(0.0 < p.pct <= 1.0, "percentile outside (0, 1]")
    for name in ("cfg_tp", "cfg_price", "cfg_mem", "cfg_ws", "cfg_gpu", "cfg_node", "cfg_intra_bw",
                 "cfg_stage_fixed", "cfg_transfer_fixed"):
        _check(getattr(p, name).shape == (c_n,), f"{name} has not {c_n} entries")
    _check(p.cfg_ok.shape == (p.k, c_n), "cfg_ok is not [k, C]")
    _check(p.mb_grid.shape == (m_n,), "mb_grid length differs from the latency tables")
    _check(p.batches.size >= 1 and int(p.batches.min()) >= 1, "empty or non-positive batch grid")
    _check(p.mb_index.shape[0] >= int(p.batches.max()) + 1, "mb_index does not cover every b = B/(mu n)")
    for i, b in enumerate(p.mb_grid):
        _check(p.mb_index[b] == i, "mb_index and mb_grid disagree")
    _check(p.max_mu >= 1 and p.max_rep >= 1, "max_mu / max_rep below 1")
    return p


def typed(p: Problem) -> Problem:
    """Fix every field's dtype so numba compiles one specialisation (and its cache hits); the
    workload fields left None get a fixed context's values."""
    c_n, m_n, n1 = p.pref.shape
    top = int(np.max(p.batches))
    p = p._replace(
        units=np.arange(top + 1, dtype=np.float64) if p.units is None else p.units,
        kvcpref=np.zeros_like(p.kvpref) if p.kvcpref is None else p.kvcpref,
        knots=np.zeros(0) if p.knots is None else p.knots,
        kpref=np.zeros((c_n, m_n, 0, n1)) if p.kpref is None else p.kpref,
        scen_cs=np.zeros((0, 1)) if p.scen_cs is None else p.scen_cs,
        knot_free=np.full((c_n, c_n), p.knots is None or not len(p.knots), np.bool_) if p.knot_free is None
        else p.knot_free)
    return p._replace(
        stage_owner=np.ascontiguousarray(p.stage_owner, np.int64),
        stage_start=np.ascontiguousarray(p.stage_start, np.int64),
        stage_end=np.ascontiguousarray(p.stage_end, np.int64),
        payload=np.ascontiguousarray(p.payload, np.float64), k=int(p.k),
        cfg_ok=np.ascontiguousarray(p.cfg_ok, np.bool_),
        cfg_stage_fixed=np.ascontiguousarray(p.cfg_stage_fixed, np.float64),
        cfg_transfer_fixed=np.ascontiguousarray(p.cfg_transfer_fixed, np.float64),
        mb_grid=np.ascontiguousarray(p.mb_grid, np.int64),
        batches=np.ascontiguousarray(p.batches, np.int64),
        max_mu=int(p.max_mu), max_rep=int(p.max_rep), max_gpus=float(p.max_gpus), bw=float(p.bw),
        lat=float(p.lat), intra_lat=float(p.intra_lat), slo=float(p.slo),
        latency_objective=bool(p.latency_objective), max_nodes=float(p.max_nodes),
        prune_factor=float(p.prune_factor),
        units=np.ascontiguousarray(p.units, np.float64), knots=np.ascontiguousarray(p.knots, np.float64),
        kpref=np.ascontiguousarray(p.kpref, np.float64), scen_cs=np.ascontiguousarray(p.scen_cs, np.float64),
        knot_free=np.ascontiguousarray(p.knot_free, np.bool_),
        pct=float(p.pct), theta=float(p.theta))


def objective_flags(p: Problem) -> tuple[bool | None, bool | None]:
    """(fixed, workload): which objective a Problem's kernels compile, as two flags of which
    exactly one is None. Numba drops a branch `if flag is not None` at compile time only when
    the flag is None (a True flag is a run-time value), so each objective sits under its own
    flag and a run compiles the kernels of its own objective only, not both."""
    return (None, True) if p.knots.shape[0] else (True, None)


def selection(batch: int, mu: int, cfg, replicas, mb) -> Selection:
    return Selection(int(batch), int(mu), np.asarray(cfg, np.int64), np.asarray(replicas, np.int64),
                     np.asarray(mb, np.int64))
