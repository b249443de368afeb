"""The configuration arrays of a search (latency, weight and KV prefix sums per device-group
configuration), built once per request and per worker, and the per-template Problem."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opweave_planner.inputs.hardware import GpuType, Hardware
from opweave_planner.inputs.request import PlanRequest
from opweave_planner.latency.interp import INTERPOLATED
from opweave_planner.latency.lookup import Parallel, kv_shard, op_latencies, weight_shard
from opweave_planner.latency.memory import fixed_costs, usable_bytes
from opweave_planner.search.problem import PRUNE_EPS, Problem, check_problem, typed
from opweave_planner.search.traffic import Traffic, build_traffic, kv_parts, lower_tables
from opweave_planner.structure.operators import OperatorSequence, OpKind
from opweave_planner.structure.templates import StagePlan, boundary_payload


@dataclass(frozen=True)
class Config:
    gpu: GpuType
    parallel: Parallel


@dataclass
class SearchArrays:
    configs: list[Config]
    mb_grid: tuple[int, ...]
    pref: np.ndarray  # [C, M, N+1] latency prefix sums, µs
    mpref: np.ndarray  # [C, M, N+1] prefix sums of the latency that comes from measured/interpolated tables
    wpref: np.ndarray  # [C, N+1] per-GPU weight bytes prefix sums
    kvpref: np.ndarray  # [C, N+1] per-GPU KV bytes per reserved unit (a request; a workload: a token)
    kvcpref: np.ndarray  # [C, N+1] per-GPU KV/state bytes per request that do not grow (workload)
    moe_pref: np.ndarray  # [N+1] count of routed-expert operators
    cfg_tp: np.ndarray
    cfg_price: np.ndarray
    cfg_mem: np.ndarray  # usable bytes per GPU after reserves
    cfg_ws: np.ndarray  # workspace bytes per request per GPU
    cfg_ep: np.ndarray
    cfg_gpu: np.ndarray  # GPU type index of each config
    cfg_node: np.ndarray  # GPUs per node
    cfg_intra_bw: np.ndarray  # intra-node bytes per µs
    cfg_stage_fixed: np.ndarray  # µs each stage of a config costs per microbatch (graph dispatch)
    cfg_transfer_fixed: np.ndarray  # µs of one NCCL send/recv call on a config's GPU type
    mb_index: np.ndarray  # b_hat -> grid index (or -1)
    bw: float  # inter-node bytes per µs
    lat: float  # inter-node µs
    intra_lat: float  # intra-node µs
    units: np.ndarray  # [max B + 1] reserved units for n resident requests (Problem.units)
    knots: np.ndarray  # [G] context knots (a workload; empty for a fixed context)
    kpref: np.ndarray  # [C, M, G, N+1] latency prefix sums at each knot
    scen_cs: np.ndarray  # [n, max B + 1] scenarios' cumulative contexts
    pct: float  # SLO percentile fraction (0: fixed context)
    theta: float  # stationary mean context (a fixed context: ctx)
    knot_free: np.ndarray | None = None  # [C, C] latency difference the same at every knot
    traffic: Traffic | None = None


def node_size(gpu: GpuType, req: PlanRequest) -> int:
    """GPUs per node: the catalog's, or the deployment's --gpus-per-node when smaller."""
    return gpu.gpus_per_node if req.gpus_per_node is None else min(gpu.gpus_per_node, req.gpus_per_node)


def build_arrays(seq: OperatorSequence, hw: Hardware, req: PlanRequest) -> SearchArrays:
    """Every (GPU type, TP, expert-parallel) configuration of the request, as arrays."""
    gpus, tps, moe_ep = req.gpus, req.tensor_parallel_sizes, req.moe_expert_parallel
    mb_grid, profiles_dir, backend = req.microbatch_grid(), req.profiles, req.backend
    traffic = build_traffic(req) if req.stochastic else None
    context = req.ctx if traffic is None else max(1, round(traffic.workload.theta))
    knots = np.zeros(0) if traffic is None else traffic.knots
    has_moe = any(op.kind == OpKind.MOE_UP for op in seq.ops)
    configs = []
    for gid in gpus:
        g = hw.resolve(gid)
        for tp in tps:
            if tp > node_size(g, req):
                continue
            configs.append(Config(g, Parallel(tp)))
            if has_moe and moe_ep and tp > 1:
                configs.append(Config(g, Parallel(tp, moe_ep=True)))
    n = seq.n
    c_n, m_n = len(configs), len(mb_grid)
    pref = np.zeros((c_n, m_n, n + 1))
    mpref = np.zeros((c_n, m_n, n + 1))
    wpref = np.zeros((c_n, n + 1))
    kvpref = np.zeros((c_n, n + 1))
    kvcpref = np.zeros((c_n, n + 1))
    kpref = np.zeros((c_n, m_n, knots.size, n + 1))
    knot_lat = []
    max_out = max(op.out_bytes for op in seq.ops)
    cfg_mem, cfg_ws = np.zeros(c_n), np.zeros(c_n)
    for c, cfg in enumerate(configs):
        tp = cfg.parallel.tp
        lat = op_latencies(seq, cfg.gpu, cfg.parallel, context, mb_grid, profiles_dir, backend, req.moe_routing)
        pref[c, :, 1:] = np.cumsum(lat.lat_us.T, axis=1)
        mpref[c, :, 1:] = np.cumsum((lat.lat_us * (lat.source <= INTERPOLATED)).T, axis=1)
        wpref[c, 1:] = np.cumsum([weight_shard(op, tp) for op in seq.ops])
        if traffic is None:
            kvpref[c, 1:] = np.cumsum([kv_shard(op, tp, context) for op in seq.ops])
        else:
            parts = np.array([kv_parts(op, tp, traffic.workload.max_context, kv_shard) for op in seq.ops])
            kvpref[c, 1:], kvcpref[c, 1:] = np.cumsum(parts[:, 0]), np.cumsum(parts[:, 1])
            at = _knot_latencies(seq, cfg, req, knots)
            knot_lat.append(at)
            kpref[c, :, :, 1:] = np.cumsum(at, axis=2)
            pref[c, :, 1:] = np.cumsum(lower_tables(np.moveaxis(at, 1, 2), knots, traffic.c_lb), axis=1)
        cfg_mem[c] = usable_bytes(cfg.gpu, tp, utilization=req.gpu_memory_utilization,
                                  reserve_gb=req.memory_reserve_gb)
        if req.memory_headroom:
            cfg_mem[c] *= 1.0 - req.memory_headroom
        # activation buffers (a few live tensors) and the fp32 logits slice
        cfg_ws[c] = 4 * max_out + 4.0 * seq.model.vocab_size / tp
    moe_pref = np.zeros(n + 1, np.int64)
    moe_pref[1:] = np.cumsum([op.kind in (OpKind.MOE_UP, OpKind.MOE_DOWN) for op in seq.ops])
    mb_index = np.full(max(mb_grid) + 1, -1, np.int64)
    for i, b in enumerate(mb_grid):
        mb_index[b] = i
    fixed = {g.id: fixed_costs(g) for g in {cfg.gpu.id: cfg.gpu for cfg in configs}.values()}
    on = 1.0 if req.fixed_costs else 0.0
    return SearchArrays(
        configs=configs, mb_grid=mb_grid, pref=pref, mpref=mpref, wpref=wpref, kvpref=kvpref, kvcpref=kvcpref,
        moe_pref=moe_pref,
        cfg_tp=np.array([c.parallel.tp for c in configs], np.int64),
        cfg_price=np.array([c.gpu.price_per_hour for c in configs]),
        cfg_mem=cfg_mem, cfg_ws=cfg_ws,
        cfg_ep=np.array([c.parallel.moe_ep for c in configs]),
        cfg_gpu=np.array([hw.ids().index(c.gpu.id) for c in configs], np.int64),
        cfg_node=np.array([node_size(c.gpu, req) for c in configs], np.int64),
        cfg_intra_bw=np.array([c.gpu.intra_node_gbps * 1e3 for c in configs]),
        cfg_stage_fixed=np.array([on * fixed[c.gpu.id].stage_dispatch_us for c in configs]),
        cfg_transfer_fixed=np.array([on * fixed[c.gpu.id].transfer_fixed_us for c in configs]),
        mb_index=mb_index,
        bw=hw.network.inter_node_gbps * 1e3,
        lat=hw.network.inter_node_latency_us,
        intra_lat=hw.network.intra_node_latency_us,
        units=np.arange(max(req.batches) + 1, dtype=np.float64) if traffic is None else traffic.units,
        knots=knots, kpref=kpref,
        scen_cs=np.zeros((0, 1)) if traffic is None else traffic.scen_cs,
        pct=0.0 if traffic is None else traffic.pct,
        theta=float(context) if traffic is None else traffic.workload.theta, traffic=traffic,
        knot_free=knot_free(knot_lat, c_n),
    )


def _knot_latencies(seq: OperatorSequence, cfg: Config, req: PlanRequest, knots: np.ndarray) -> np.ndarray:
    """[M, G, N]: every operator's latency at each context knot, made nondecreasing in context."""
    at = np.stack([op_latencies(seq, cfg.gpu, cfg.parallel, int(x), req.microbatch_grid(), req.profiles,
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


@dataclass(frozen=True)
class StageArrays:
    owner: np.ndarray
    start: np.ndarray
    end: np.ndarray
    payload: np.ndarray
    k: int


def stage_arrays(seq: OperatorSequence, plan: StagePlan) -> StageArrays:
    k = max(plan.owner) + 1
    start = np.array([ops[0] for ops in plan.ops], np.int64)
    end = np.array([(ops[-1] + 1) for ops in plan.ops], np.int64)
    end[end == seq.n] = seq.n  # a stage ending at lm_head ends at N
    if plan.n_stages == 1:
        start[:], end[:] = 0, seq.n
    return StageArrays(np.array(plan.owner, np.int64), start, end,
                       np.array(boundary_payload(seq, plan)), k)




def make_problem(arrays: SearchArrays, st: StageArrays, req: PlanRequest, *, batches: tuple[int, ...],
                 slo_us: float, latency_objective: bool = False, only_gpu: int | None = None) -> Problem:
    """The Problem of one template: its stages over every configuration of the request
    (`only_gpu`: restricted to the configurations of one GPU type index)."""
    ok = owner_ok(arrays, st)
    if only_gpu is not None:
        ok = ok & (arrays.cfg_gpu == only_gpu)[None, :]
    slack = 0.0 if req.prefer_simpler is None else req.prefer_simpler
    return check_problem(typed(Problem(
        stage_owner=st.owner, stage_start=st.start, stage_end=st.end, payload=st.payload, k=st.k,
        pref=arrays.pref, mpref=arrays.mpref, wpref=arrays.wpref, kvpref=arrays.kvpref,
        cfg_tp=arrays.cfg_tp, cfg_price=arrays.cfg_price, cfg_mem=arrays.cfg_mem, cfg_ws=arrays.cfg_ws,
        cfg_ok=ok, cfg_gpu=arrays.cfg_gpu, cfg_node=arrays.cfg_node, cfg_stage_fixed=arrays.cfg_stage_fixed,
        cfg_transfer_fixed=arrays.cfg_transfer_fixed,
        cfg_intra_bw=arrays.cfg_intra_bw, mb_grid=np.array(arrays.mb_grid, np.int64),
        mb_index=arrays.mb_index, batches=np.array(batches, np.int64), max_mu=req.max_microbatches,
        max_rep=req.max_replicas, max_gpus=req.max_gpus, bw=arrays.bw, lat=arrays.lat,
        intra_lat=arrays.intra_lat, slo=slo_us, latency_objective=latency_objective,
        max_nodes=float("inf") if req.max_nodes is None else req.max_nodes,
        prune_factor=(1.0 + slack) * (1.0 + PRUNE_EPS), units=arrays.units, kvcpref=arrays.kvcpref,
        knots=arrays.knots, knot_free=arrays.knot_free,
        kpref=arrays.kpref, scen_cs=arrays.scen_cs, pct=arrays.pct, theta=arrays.theta)))


def owner_ok(arrays: SearchArrays, st: StageArrays) -> np.ndarray:
    """cfg_ok[o, c]: expert-parallel variants only for owners holding routed experts."""
    owns_moe = np.zeros(st.k, bool)
    for j in range(st.owner.size):
        s, e = st.start[j], st.end[j]
        cnt = arrays.moe_pref[e] - arrays.moe_pref[s] if e > s else (
            arrays.moe_pref[-1] - arrays.moe_pref[s] + arrays.moe_pref[e])
        owns_moe[st.owner[j]] |= cnt > 0
    return np.array([[owns_moe[o] or not ep for ep in arrays.cfg_ep] for o in range(st.k)])
