"""Operator latencies by real shape after sharding, precomputed over the microbatch grid.

An operator's latency is the sum of the kernels it launches on one GPU of its
device group (GEMMs with TP-sharded widths, decode attention with heads per
GPU, the fused MoE, the TP all-reduce that closes a row-parallel projection,
and the small elementwise passes fused into it). Each figure keeps the worst
source among its kernels (measured < interpolated < clamped < fitted <
roofline). Arrays are cached per (model, GPU, TP, MoE mode, context, grid).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from opweave_planner.data import profiles_root
from opweave_planner.errors import UserError
from opweave_planner.inputs.hardware import GpuType
from opweave_planner.latency import interp
from opweave_planner.latency import roofline as rf
from opweave_planner.latency.tables import available_gpus, load_profile_set
from opweave_planner.structure.operators import Operator, OperatorSequence

SOURCE_NAMES = interp.SOURCE_NAMES
_REPLICATED = ("router", "mla_down")  # small or latent-shared weights every TP rank keeps
_ALLREDUCE_AFTER = ("o_proj", "ffn_down", "moe_down")
MOE_UP_SHARE = 2.0 / 3.0  # gate+up carry two thirds of a gated MoE's bytes and FLOPs


@dataclass(frozen=True)
class Parallel:
    tp: int
    moe_ep: bool = False  # experts split across the TP group instead of sharding each expert


@dataclass(frozen=True)
class OpLatencies:
    """lat_us[op, mb] and source[op, mb] for one (GPU, parallelism, context)."""

    gpu: str
    parallel: Parallel
    context: int
    mb_grid: tuple[int, ...]
    lat_us: np.ndarray
    source: np.ndarray


@lru_cache(maxsize=16)
def _fits(root: Path, backend: str) -> dict:
    return interp.shipped_efficiencies(root, backend)


class _Kernels:
    """Kernel costs for one GPU: measured tables when present, else the calibrated roofline."""

    def __init__(self, gpu: GpuType, root: Path, backend: str) -> None:
        self.gpu = gpu
        self.ps = None
        if gpu.id in available_gpus(root):
            self.ps = load_profile_set(root, gpu.id, backend)
            self.eff, fitted = interp.efficiency(self.ps)
            self.fallback = interp.FITTED if fitted else interp.ROOFLINE
        else:
            fits = _fits(root, backend)
            if fits:
                self.eff, _ = rf.nearest_efficiency(fits, gpu.bandwidth_gbps, gpu.bf16_tflops)
                self.fallback = interp.FITTED
            else:
                self.eff, self.fallback = rf.DEFAULT_EFFICIENCY, interp.ROOFLINE

    def _roof(self, work, b, attention=False):
        nbytes, flops = work
        peak = self.gpu.bf16_tflops
        over = self.eff.attention_overhead_us if attention else None
        lat = rf.roofline_us(nbytes, flops, self.gpu.bandwidth_gbps, peak, self.eff, overhead_us=over)
        return np.broadcast_to(lat, b.shape).astype(np.float64), np.full(b.shape, self.fallback, np.int8)

    def gemm(self, b, n, k, dtype):
        if self.ps is not None:
            return interp.gemm(self.ps, b, n, k, dtype)
        return self._roof(rf.gemm_work(b, n, k, dtype), b)

    def elementwise(self, b, width, reads=1, writes=1):
        return self._roof(rf.elementwise_work(b, width, reads, writes), b)

    def attention(self, b, nh, nkv, hd, ctx, window):
        if self.ps is not None:
            return interp.decode_attention(self.ps, b, nh, nkv, hd, ctx, window)
        kv = min(ctx, window) if window else ctx
        return self._roof(rf.attention_work(b, nh, nkv, hd, kv), b, attention=True)

    def memory_pass(self, b, nbytes, flops):
        return self._roof((b * nbytes, b * flops), b, attention=True)

    def moe(self, b, hidden, inter, topk, experts, tp, ep, dtype):
        if self.ps is not None:
            return interp.moe(self.ps, b, hidden, inter, topk, experts, tp, ep, dtype)
        return self._roof(rf.moe_work(b, hidden, inter, topk, experts, tp, ep, dtype), b)

    def allreduce(self, tp, nbytes):
        if tp == 1:
            return np.zeros_like(nbytes), np.zeros(nbytes.shape, np.int8)
        if self.ps is not None:
            return interp.allreduce(self.ps, tp, nbytes)
        bw = self.gpu.intra_node_gbps * 1e3
        lat = rf.allreduce_work(tp, nbytes) / bw + 2 * self.eff.overhead_us
        return lat, np.full(nbytes.shape, self.fallback, np.int8)


def sharded_gemms(op: Operator, tp: int) -> list[tuple[int, int]]:
    """Per-GPU (n, k) of an operator's GEMMs: row-parallel projections split k, the rest n."""
    out = []
    for n, k in op.gemm:
        if op.kind in _REPLICATED:
            out.append((n, k))
        elif op.kind in ("o_proj", "ffn_down", "shared_down"):
            out.append((n, max(1, k // tp)))
        else:
            out.append((max(1, n // tp), k))
    return out


def sharded_attention(op: Operator, tp: int) -> tuple[int, int, int]:
    """Per-GPU (query heads, KV heads, head dim) of a decode-attention operator."""
    a = op.attention
    return max(1, a.n_heads // tp), max(1, a.n_kv_heads // tp), a.head_dim


def kernel_shapes(seq: OperatorSequence, tp: int) -> tuple[list[tuple[int, int]], list[tuple[int, int, int, int]]]:
    """Distinct per-GPU GEMM (n, k) and attention (heads, kv heads, head dim, window) a model needs."""
    gemms: dict[tuple[int, int], None] = {}
    attn: dict[tuple[int, int, int, int], None] = {}
    for op in seq.ops:
        for nk in sharded_gemms(op, tp):
            gemms[nk] = None
        if op.kind in ("attn_full", "attn_sliding"):
            attn[(*sharded_attention(op, tp), op.attention.window or 0)] = None
    return list(gemms), list(attn)


def _gemm_dtype(op: Operator) -> str:
    return "fp8_block" if op.weight_dtype_bytes < 1.5 and op.weight_dtype_bytes > 0.9 else "bfloat16"


def _moe_dtype(op: Operator) -> str:
    wb = op.weight_dtype_bytes
    if wb < 0.9:
        return "mxfp4"
    return "fp8_block" if wb < 1.5 else "bfloat16"


def _op_latency(kern: _Kernels, op: Operator, seq: OperatorSequence, par: Parallel, ctx: int, b):
    """(latency µs, source) arrays over microbatch sizes `b` for one operator on one GPU."""
    h = seq.model.hidden_size
    tp = par.tp
    parts = []
    if op.kind == "embed":
        parts.append(kern.elementwise(b, h))
    elif op.gemm:
        for n, k in sharded_gemms(op, tp):
            parts.append(kern.gemm(b, n, k, _gemm_dtype(op)))
        parts.append(kern.elementwise(b, h))  # fused norm / activation / residual pass
    elif op.kind in ("attn_full", "attn_sliding"):
        parts.append(kern.attention(b, *sharded_attention(op, tp), ctx, op.attention.window or 0))
    elif op.kind == "attn_linear":
        shard = min(tp, op.attention.lin_v_heads)
        parts.append(kern.memory_pass(b, 2.0 * op.state_bytes / shard, op.flops / shard))
    elif op.kind == "attn_mla":
        # the latent cache is shared by all heads, so it is replicated across TP
        parts.append(kern.memory_pass(b, op.kv_bytes(ctx), op.ctx_flops * ctx / tp))
    elif op.kind in ("moe_up", "moe_down"):
        f = op.mlp
        ep, etp = (tp, 1) if par.moe_ep else (1, tp)
        lat, src = kern.moe(b, h, f.expert_intermediate, f.top_k, f.n_experts, etp, ep, _moe_dtype(op))
        share = MOE_UP_SHARE if op.kind == "moe_up" else 1.0 - MOE_UP_SHARE
        parts.append((lat * share, src))
    else:
        raise UserError(f"operator kind '{op.kind}' has no latency model")
    if op.kind in _ALLREDUCE_AFTER:
        parts.append(kern.allreduce(tp, b * h * seq.model.act_bytes))
    lats = np.array([p[0] for p in parts])
    srcs = np.array([p[1] for p in parts])
    # the figure is as trustworthy as the kernel that dominates it
    src = np.take_along_axis(srcs, lats.argmax(axis=0)[None, :], axis=0)[0].astype(np.int8)
    return lats.sum(axis=0), src


def _signature(op: Operator) -> tuple:
    return (op.kind, op.gemm, op.attention, op.mlp, op.kv_window, op.state_bytes, op.weight_dtype_bytes)


@lru_cache(maxsize=256)
def op_latencies(seq: OperatorSequence, gpu: GpuType, par: Parallel, context: int,
                 mb_grid: tuple[int, ...], profiles_dir: str | None = None,
                 backend: str = "vllm") -> OpLatencies:
    """Latency of every operator of `seq` for each microbatch size in `mb_grid`."""
    kern = _Kernels(gpu, profiles_root(profiles_dir).resolve(), backend)
    b = np.asarray(mb_grid, dtype=np.float64)
    lat = np.empty((seq.n, b.size))
    src = np.empty((seq.n, b.size), np.int8)
    memo: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    for i, op in enumerate(seq.ops):
        key = _signature(op)
        if key not in memo:
            memo[key] = _op_latency(kern, op, seq, par, context, b)
        lat[i], src[i] = memo[key]
    return OpLatencies(gpu.id, par, context, tuple(mb_grid), lat, src)


def weight_shard(op: Operator, tp: int) -> float:
    """Per-GPU resident weight bytes of an operator in a TP group of `tp`."""
    if op.kind in _REPLICATED:
        return op.weight_bytes
    return op.weight_bytes / tp


def kv_shard(op: Operator, tp: int, context: int) -> float:
    """Per-GPU KV/state bytes per request: heads split up to the KV-head count."""
    total = op.kv_bytes(context)
    if not total:
        return 0.0
    a = op.attention
    if op.kind == "attn_mla":
        return total
    heads = a.lin_v_heads if op.kind == "attn_linear" else a.n_kv_heads
    return total / min(tp, heads)
