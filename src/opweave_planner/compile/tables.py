"""The configuration tables of a request: every device-group configuration's latency, weight and
KV prefix sums, price, memory and links, built once per request (and per worker) as the Problem
parts every template shares; and one template's own part, its stages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from opweave_planner.compile.problem import (
    Configs,
    Fabric,
    Grid,
    Stages,
    Traffic,
    memory_need,
    stage_time,
)
from opweave_planner.compile.space import batch_caps, batch_set, microbatch_grid, node_size
from opweave_planner.compile.traffic import (
    FULL,
    KvReserve,
    WorkloadArrays,
    kv_mix,
    kv_parts,
    lower_tables,
    resident_counts,
)
from opweave_planner.inputs.hardware import GpuType, Hardware
from opweave_planner.inputs.request import PlanRequest
from opweave_planner.latency.interp import INTERPOLATED
from opweave_planner.latency.lookup import Parallel, kv_shard, op_latencies, weight_shard
from opweave_planner.latency.memory import fixed_costs, usable_bytes
from opweave_planner.structure.operators import OperatorSequence, OpKind
from opweave_planner.structure.templates import StagePlan, boundary_payload
from opweave_planner.workload.law import ContextLaw


@dataclass(frozen=True)
class Config:
    """What configuration index c of every per-configuration array is."""

    gpu: GpuType
    parallel: Parallel


class Tables(NamedTuple):
    """Every configuration of a request as the Problem parts all its templates share."""

    configs: tuple[Config, ...]
    mb_grid: tuple[int, ...]  # every microbatch: the grid's (ascending), then those of the caps only
    per_config: Configs  # at the grid's microbatches (the first of mb_grid)
    fabric: Fabric
    grid: Grid  # at the request's batches
    traffic: Traffic
    # the one-stage template's parts: the grid and the caps (compile/space.py), at every microbatch
    colocated_configs: Configs
    colocated_grid: Grid
    colocated_traffic: Traffic
    moe_pref: np.ndarray  # int64[N+1]: routed-expert operators before each position (owner rule)
    expert_parallel: np.ndarray  # bool[C]: the config shards routed experts
    # a workload: sliding-window bytes per GPU per context token, prefix sums per window length
    # (their part of kvpref), and the reserve of any KV mix; () and None for a fixed context
    kv_windows: tuple[tuple[int, np.ndarray], ...] = ()
    reserve: KvReserve | None = None  # over the grid's resident counts (the other templates')
    colocated_reserve: KvReserve | None = None  # over the one-stage template's (grid and caps)


def usable_per_gpu(gpu, tp: int, req) -> float:
    """Bytes per GPU a (GPU type, TP) group may fill under the request's memory budget (its
    utilisation, runtime reserve and headroom): one rule for the decode search and the prefill pool."""
    usable = usable_bytes(gpu, tp, utilization=req.gpu_memory_utilization, reserve_gb=req.memory_reserve_gb)
    return usable * (1.0 - req.memory_headroom) if req.memory_headroom else usable


def configurations(seq: OperatorSequence, hw: Hardware, req: PlanRequest) -> tuple[Config, ...]:
    """Every (GPU type, TP, expert-parallel) configuration the request searches."""
    has_moe = any(op.kind == OpKind.MOE_UP for op in seq.ops)
    out = []
    for gid in req.gpus:
        g = hw.resolve(gid)
        for tp in req.tensor_parallel_sizes:
            if tp > node_size(g, req):
                continue
            out.append(Config(g, Parallel(tp)))
            if has_moe and req.moe_expert_parallel and tp > 1:
                out.append(Config(g, Parallel(tp, moe_ep=True)))
    return tuple(out)


class MemoryParts(NamedTuple):
    """Per configuration, what its memory rule reads: prefix sums over the operators (weights,
    KV per reserved unit, KV/state per request, bytes per GPU), usable bytes, workspace."""

    wpref: np.ndarray  # float64[C, N+1]
    kvpref: np.ndarray
    kvcpref: np.ndarray
    cfg_mem: np.ndarray  # float64[C]
    cfg_ws: np.ndarray  # float64[C]: bytes per GPU per request of activation workspace
    # a workload: sliding-window bytes per GPU per context token, prefix sums per window length
    windows: tuple[tuple[int, np.ndarray], ...]


def context_of(req: PlanRequest, wl: ContextLaw | None) -> int:
    """The context latencies and fixed-context KV are read at: --ctx, or the workload's mean."""
    return req.ctx if wl is None else max(1, round(wl.theta))


def memory_parts(seq: OperatorSequence, configs: tuple[Config, ...], req: PlanRequest,
                 wl: ContextLaw | None) -> MemoryParts:
    """The configurations' memory arrays (`wl`: the workload, None for --ctx)."""
    n, c_n, context = seq.n, len(configs), context_of(req, wl)
    wpref, kvpref, kvcpref = np.zeros((c_n, n + 1)), np.zeros((c_n, n + 1)), np.zeros((c_n, n + 1))
    win_pref = {} if wl is None else {w: np.zeros((c_n, n + 1)) for w in sorted({op.kv_window for op in seq.ops} - {0})}
    cfg_mem, cfg_ws = np.zeros(c_n), np.zeros(c_n)
    max_out = max(op.out_bytes for op in seq.ops)
    for c, cfg in enumerate(configs):
        tp = cfg.parallel.tp
        wpref[c, 1:] = np.cumsum([weight_shard(op, tp) for op in seq.ops])
        if wl is None:
            kvpref[c, 1:] = np.cumsum([kv_shard(op, tp, context) for op in seq.ops])
        else:
            parts = np.array([kv_parts(op, tp, kv_shard) for op in seq.ops])
            kvpref[c, 1:], kvcpref[c, 1:] = np.cumsum(parts[:, 0]), np.cumsum(parts[:, 1])
            for w, pref_w in win_pref.items():
                pref_w[c, 1:] = np.cumsum(np.where([op.kv_window == w for op in seq.ops], parts[:, 0], 0.0))
        cfg_mem[c] = usable_per_gpu(cfg.gpu, tp, req)
        # activation buffers (a few live tensors) and the fp32 logits slice
        cfg_ws[c] = 4 * max_out + 4.0 * seq.model.vocab_size / tp
    return MemoryParts(wpref=wpref, kvpref=kvpref, kvcpref=kvcpref, cfg_mem=cfg_mem, cfg_ws=cfg_ws,
                       windows=tuple(win_pref.items()))


def fixed_units(top: int) -> np.ndarray:
    """Traffic.units of a fixed context: n resident requests hold n units (each its whole KV)."""
    return np.arange(top + 1, dtype=np.float64)


def stage_fixed(configs: tuple[Config, ...], req: PlanRequest) -> np.ndarray:
    """Per configuration, the fixed dispatch cost every stage pays (µs; 0 with --no-fixed-costs)."""
    fixed = {g.id: fixed_costs(g) for g in {cfg.gpu.id: cfg.gpu for cfg in configs}.values()}
    on = 1.0 if req.fixed_costs else 0.0
    return np.array([on * fixed[c.gpu.id].stage_dispatch_us for c in configs])


def searched_batches(seq: OperatorSequence, hw: Hardware, req: PlanRequest, wl: ContextLaw | None,
                     reserve: KvReserve | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The batch sets the search walks, (every template's, the one-stage template's): the
    request's grid, and that plus the caps of its configurations (compile/space.py; `wl` None
    for --ctx, else the workload and `reserve` its `traffic.kv_reserve`, read in the whole-model
    replica's own KV mix: a workload has memory caps only, its TPOT being a percentile over
    scenarios, not one stream; --no-batch-caps: the grid)."""
    if not req.batch_caps:
        return req.batches, req.batches
    configs = configurations(seq, hw, req)
    mem = memory_parts(seq, configs, req, wl)
    whole = np.zeros(1, np.int64), np.zeros(1, np.int64), np.full(1, seq.n, np.int64)  # one owner, every operator
    rows = ([fixed_units(max(req.batches))] * len(configs) if wl is None else
            [reserve.row(mix) for mix in kv_mixes(mem.kvpref, mem.windows, *whole, 0)])
    w, kv, kvc = mem.wpref[:, -1], mem.kvpref[:, -1], mem.kvcpref[:, -1]

    # the reserve's lower bounds first, cheapest first (the need grows with each): a probe past the
    # memory costs no event law, most of them no convolution either
    lower = [] if wl is None else [[row._replace(**{k: True}) for row in rows] for k in ("cheap", "lower")]

    def fits(c: int, mu: int, b: int) -> bool:
        for bound in lower:
            if memory_need(bound[c], w[c], kv[c], kvc[c], mem.cfg_ws[c], mu, b) > mem.cfg_mem[c]:
                return False
        return memory_need(rows[c], w[c], kv[c], kvc[c], mem.cfg_ws[c], mu, b) <= mem.cfg_mem[c]

    fixed, context = stage_fixed(configs, req), context_of(req, wl)

    def stream(c: int, top: int) -> np.ndarray:
        """The one-stage time of configuration c at microbatches 1..top."""
        cfg = configs[c]
        lat = op_latencies(seq, cfg.gpu, cfg.parallel, context, tuple(range(1, top + 1)), req.profiles,
                           req.backend, req.moe_routing).lat_us
        pref = np.zeros((seq.n + 1, top))
        pref[1:] = np.cumsum(lat, axis=0)
        return stage_time(pref, 0, seq.n, fixed[c])

    caps = batch_caps(req, len(configs), fits, stream if wl is None else None)
    return req.batches, batch_set(req, caps.memory, caps.slo)


def build_tables(seq: OperatorSequence, hw: Hardware, req: PlanRequest, wa: WorkloadArrays | None,
                 batches: tuple[int, ...] | None = None, colocated: tuple[int, ...] | None = None) -> Tables:
    """The request's configurations as arrays (`wa`: its workload's arrays, None for --ctx) over
    the searched batch sets (`searched_batches`; default the request's grid alone)."""
    batches = req.batches if batches is None else batches
    colocated = batches if colocated is None else colocated
    # the grid's microbatches first, then those only the caps produce: an index means the same
    # microbatch in both parts, and the other templates' tables stay the grid's size
    base = microbatch_grid(req, batches)
    configs = configurations(seq, hw, req)
    mb_grid = base + tuple(b for b in microbatch_grid(req, colocated) if b not in set(base))
    mem = memory_parts(seq, configs, req, None if wa is None else wa.workload)
    context = context_of(req, None if wa is None else wa.workload)
    knots = np.zeros(0) if wa is None else wa.knots
    n, c_n, m_n = seq.n, len(configs), len(mb_grid)
    pref, mpref = np.zeros((c_n, m_n, n + 1)), np.zeros((c_n, m_n, n + 1))
    kpref = np.zeros((c_n, m_n, knots.size, n + 1))
    knot_lat = []
    for c, cfg in enumerate(configs):
        lat = op_latencies(seq, cfg.gpu, cfg.parallel, context, mb_grid, req.profiles, req.backend, req.moe_routing)
        pref[c, :, 1:] = np.cumsum(lat.lat_us.T, axis=1)
        mpref[c, :, 1:] = np.cumsum((lat.lat_us * (lat.source <= INTERPOLATED)).T, axis=1)
        if wa is not None:
            at = _knot_latencies(seq, cfg, req, knots, mb_grid)
            knot_lat.append(at)
            kpref[c, :, :, 1:] = np.cumsum(at, axis=2)
            pref[c, :, 1:] = np.cumsum(lower_tables(np.moveaxis(at, 1, 2), knots, wa.c_lb), axis=1)
    moe_pref = np.zeros(n + 1, np.int64)
    moe_pref[1:] = np.cumsum([op.kind in (OpKind.MOE_UP, OpKind.MOE_DOWN) for op in seq.ops])
    fixed = {g.id: fixed_costs(g) for g in {cfg.gpu.id: cfg.gpu for cfg in configs}.values()}
    on = 1.0 if req.fixed_costs else 0.0
    per_config = Configs(pref=pref, mpref=mpref, wpref=mem.wpref, kvpref=mem.kvpref, kvcpref=mem.kvcpref,
                         cfg_price=np.array([c.gpu.price_per_hour for c in configs]), cfg_mem=mem.cfg_mem,
                         cfg_ws=mem.cfg_ws,
                         cfg_stage_fixed=stage_fixed(configs, req))
    fabric = Fabric(cfg_tp=np.array([c.parallel.tp for c in configs], np.int64),
                    cfg_gpu=np.array([hw.ids().index(c.gpu.id) for c in configs], np.int64),
                    cfg_node=np.array([node_size(c.gpu, req) for c in configs], np.int64),
                    cfg_intra_bw=np.array([c.gpu.intra_node_gbps * 1e3 for c in configs]),
                    cfg_transfer_fixed=np.array([on * fixed[c.gpu.id].transfer_fixed_us for c in configs]),
                    bw=hw.network.inter_node_gbps * 1e3, lat=hw.network.inter_node_latency_us,
                    intra_lat=hw.network.intra_node_latency_us)
    top = max(req.batches)

    def traffic(m: int) -> Traffic:
        """The Traffic part over the first m microbatches."""
        kp, kl = kpref[:, :m].copy(), [at[:m] for at in knot_lat]
        if wa is None:  # a fixed context: every request holds one unit (its whole KV); no knots, no scenarios
            return Traffic(units=fixed_units(top), knots=knots, kpref=kp, scen_cs=np.zeros((0, top + 1)),
                           knot_free=knot_free(kl, c_n), pct=0.0, theta=float(context))
        return Traffic(units=wa.units, knots=knots, kpref=kp, scen_cs=wa.scen_cs, knot_free=knot_free(kl, c_n),
                       pct=wa.pct, theta=wa.workload.theta)

    m = len(base)
    # the other templates' window-mix reserve rows over the grid's resident counts only
    reserve = None if wa is None else wa.reserve.over(resident_counts(req, batches))
    return Tables(configs=configs, mb_grid=mb_grid,
                  per_config=per_config._replace(pref=pref[:, :m].copy(), mpref=mpref[:, :m].copy()),
                  fabric=fabric, grid=grid(base, batches, req.max_microbatches, req.max_replicas),
                  traffic=traffic(m), colocated_configs=per_config,
                  colocated_grid=grid(mb_grid, colocated, req.max_microbatches, req.max_replicas),
                  colocated_traffic=traffic(len(mb_grid)),
                  moe_pref=moe_pref, expert_parallel=np.array([c.parallel.moe_ep for c in configs], bool),
                  kv_windows=mem.windows, reserve=reserve, colocated_reserve=None if wa is None else wa.reserve)


def grid(mb_grid: tuple[int, ...], batches, max_mu: int, max_rep: int) -> Grid:
    mb_index = np.full(max(mb_grid) + 1, -1, np.int64)
    for i, b in enumerate(mb_grid):
        mb_index[b] = i
    return Grid(mb_grid=np.array(mb_grid, np.int64), mb_index=mb_index, batches=np.array(batches, np.int64),
                max_mu=max_mu, max_rep=max_rep)


def _knot_latencies(seq: OperatorSequence, cfg: Config, req: PlanRequest, knots: np.ndarray,
                    mb_grid: tuple[int, ...]) -> np.ndarray:
    """[M, G, N]: every operator's latency at each context knot, made nondecreasing in context."""
    at = np.stack([op_latencies(seq, cfg.gpu, cfg.parallel, int(x), mb_grid, req.profiles,
                                req.backend, req.moe_routing).lat_us.T for x in knots], axis=1)
    return np.maximum.accumulate(at, axis=1)


def knot_free(knot_lat: list[np.ndarray], c_n: int) -> np.ndarray:
    """[a, b]: every operator's latency differs between configs a and b by the same amount at
    every knot (exactly), so frontier dominance need not compare the knots."""
    free = np.ones((c_n, c_n), bool)
    for a in range(len(knot_lat)):
        for b in range(len(knot_lat)):
            d = knot_lat[a] - knot_lat[b]
            free[a, b] = bool((d == d[:, :1, :]).all())
    return free


def stages(seq: OperatorSequence, plan: StagePlan, tables: Tables, only_gpu: int | None = None,
           memo: dict | None = None) -> Stages:
    """One template's stages over the request's configurations (`only_gpu`: every owner restricted
    to the configurations of one GPU type index; `memo`: owner_units' mixes, kept by the caller)."""
    k = max(plan.owner) + 1
    start = np.array(plan.start, np.int64)
    end = np.array(plan.end, np.int64)
    end[end == 0] = seq.n  # a stage ending at lm_head ends at N
    if plan.n_stages == 1:
        start[:], end[:] = 0, seq.n
    owner = np.array(plan.owner, np.int64)
    ok = owner_ok(tables, owner, start, end, k)
    if only_gpu is not None:
        ok = ok & (tables.fabric.cfg_gpu == only_gpu)[None, :]
    return Stages(stage_owner=owner, stage_start=start, stage_end=end,
                  payload=np.array(boundary_payload(seq, plan)), cfg_ok=ok, k=k,
                  kv_units=owner_units(tables, owner, start, end, k, plan.n_stages == 1, memo))


def owner_sum(pref: np.ndarray, owner: np.ndarray, start: np.ndarray, end: np.ndarray, o: int) -> np.ndarray:
    """[C]: a prefix-sum table [C, N1] summed over owner o's cyclic stage ranges."""
    js = np.flatnonzero(owner == o)
    s, e = start[js], end[js]
    return (pref[:, e] - pref[:, s]).sum(axis=1) + pref[:, -1] * float((e <= s).sum())


def owner_mixes(tables: Tables, owner, start, end, o: int) -> list:
    """Per configuration, the KV mix (compile.traffic.kv_mix) of owner o: FULL for a fixed context
    or an owner without sliding-window layers."""
    return kv_mixes(tables.per_config.kvpref, tables.kv_windows, owner, start, end, o)


def kv_mixes(kvpref: np.ndarray, kv_windows, owner, start, end, o: int) -> list:
    """`owner_mixes` from the prefix sums themselves (Configs.kvpref, Tables.kv_windows)."""
    c_n = kvpref.shape[0]
    if not kv_windows:
        return [FULL] * c_n
    per = owner_sum(kvpref, owner, start, end, o)
    wins = [(w, owner_sum(pref, owner, start, end, o)) for w, pref in kv_windows]
    return [kv_mix(float(per[c]), {w: float(b[c]) for w, b in wins}) for c in range(c_n)]


def owner_units(tables: Tables, owner, start, end, k: int, one: bool, memo: dict | None = None) -> np.ndarray:
    """[k, C, B+]: the reserve row of each owner in each configuration (Stages.kv_units; `one`: the
    one-stage template, whose resident counts include the batch caps': its rows are its own mixes'
    over those counts, even full attention's, as Traffic.units holds the grid's counts only).
    `memo` keeps each owner's mixes by its stage ranges (one owner recurs in many templates)."""
    units = (tables.colocated_traffic if one else tables.traffic).units
    reserve = tables.colocated_reserve if one else tables.reserve
    out = np.empty((k, tables.per_config.kvpref.shape[0], units.size))
    out[:] = units
    for o in range(k if tables.kv_windows or (one and reserve is not None) else 0):
        for c, mix in _owned_mixes(tables, owner, start, end, o, one, memo):
            out[o, c] = reserve.units(mix)
    return out


def _owned_mixes(tables: Tables, owner, start, end, o: int, one: bool, memo: dict | None) -> list:
    """[(c, mix)] of owner o whose row is its mix's own (every mix in the one-stage template, else
    those not FULL), from `memo` by the owner's stage ranges where given."""
    key = None
    if memo is not None:
        js = np.flatnonzero(owner == o)
        key = (one, start[js].tobytes(), end[js].tobytes())
        if key in memo:
            return memo[key]
    got = [(c, mix) for c, mix in enumerate(owner_mixes(tables, owner, start, end, o)) if one or mix != FULL]
    if key is not None:
        memo[key] = got
    return got


def owner_ok(tables: Tables, owner: np.ndarray, start: np.ndarray, end: np.ndarray, k: int) -> np.ndarray:
    """cfg_ok[o, c]: expert-parallel variants only for owners holding routed experts."""
    if not tables.expert_parallel.any():  # no such variant (a dense model, or no EP): every config
        return np.ones((k, tables.expert_parallel.size), bool)
    moe = tables.moe_pref
    cnt = np.where(end > start, moe[end] - moe[start], moe[-1] - moe[start] + moe[end])
    owns_moe = np.bincount(owner, weights=cnt > 0, minlength=k) > 0
    return owns_moe[:, None] | ~tables.expert_parallel[None, :]
