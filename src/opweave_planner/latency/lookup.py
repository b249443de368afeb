"""Operator latencies by real shape after sharding, precomputed over the microbatch grid.

An operator's latency is the sum of the kernels it launches on one GPU of its
device group (GEMMs with TP-sharded widths, decode attention with heads per
GPU, the fused MoE, the TP all-reduce that closes a row-parallel projection,
and the small elementwise passes fused into it). Each figure keeps the worst
source among its kernels (measured < interpolated < clamped < fitted <
roofline). Arrays are cached per (model, GPU, TP, MoE mode, context, grid).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from opweave_planner.data import profiles_root
from opweave_planner.inputs.hardware import GpuType
from opweave_planner.latency import interp
from opweave_planner.latency import roofline as rf
from opweave_planner.latency.tables import available_gpus, load_profile_set
from opweave_planner.structure.operators import (
    Kernel,
    KvRule,
    Operator,
    OperatorSequence,
    Passes,
    Shard,
)

SOURCE_NAMES = interp.SOURCE_NAMES
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


def kv_heads_per_rank(n_kv_heads: int, tp: int) -> int:
    """KV heads each TP rank holds: split while there are enough, one replicated head beyond.

    vLLM's rule (``QKVParallelLinear``: ``num_kv_heads_per_rank = max(1, num_kv_heads // tp)``,
    the heads replicated ``tp // num_kv_heads`` times).
    """
    return max(1, n_kv_heads // tp)


class _Kernels:
    """Kernel costs for one GPU description: measured tables when present, else the calibrated roofline.

    The profile set is viewed through the GPU description (`GpuType.system_updates`), so
    a catalog override of bandwidth or peak reaches the tables' speed-of-light scaling
    and fallbacks as well as the roofline.
    """

    def __init__(self, gpu: GpuType, root: Path, backend: str, moe_routing: str) -> None:
        self.gpu = gpu
        self.ps = None
        self.routing = moe_routing
        if gpu.id in available_gpus(root):
            self.ps = load_profile_set(root, gpu.id, backend).with_system(gpu.system_updates())
            self.eff, fitted = interp.efficiency(self.ps)
            self.fallback = interp.FITTED if fitted else interp.ROOFLINE
        else:
            fits = _fits(root, backend)
            if fits:
                self.eff, _ = rf.nearest_efficiency(fits, gpu.bandwidth_gbps, gpu.bf16_tflops)
                self.fallback = interp.FITTED
            else:
                self.eff, self.fallback = rf.DEFAULT_EFFICIENCY, interp.ROOFLINE

    def _roof(self, work, b, dtype="bfloat16", attention=False):
        nbytes, flops = work
        peak = self.gpu.peak(dtype)
        over = self.eff.attention_overhead_us if attention else None
        lat = rf.roofline_us(nbytes, flops, self.gpu.bandwidth_gbps, peak, self.eff, overhead_us=over)
        return np.broadcast_to(lat, b.shape).astype(np.float64), np.full(b.shape, self.fallback, np.int8)

    def gemm(self, b, n, k, dtype):
        if self.ps is not None:
            return interp.gemm(self.ps, b, n, k, dtype)
        return self._roof(rf.gemm_work(b, n, k, dtype), b, dtype)

    def elementwise(self, b, nbytes_per_token):
        """A memory-bound pass (norm, rotary, activation, KV write): bytes over the fitted
        bandwidth, never below this GPU's per-kernel launch floor."""
        t = b * nbytes_per_token / (self.gpu.bandwidth_gbps * 1e3 * self.eff.bw)
        lat = np.maximum(t, self.gpu.kernel_floor_us)
        code = interp.FITTED if self.ps is not None else self.fallback
        return lat, np.full(b.shape, code, np.int8)

    def attention(self, b, nh, nkv, hd, context, window):
        if self.ps is not None:
            return interp.decode_attention(self.ps, b, nh, nkv, hd, context, window)
        kv = min(context, window) if window else context
        return self._roof(rf.attention_work(b, nh, nkv, hd, kv), b, attention=True)

    def memory_pass(self, b, nbytes, flops):
        return self._roof((b * nbytes, b * flops), b, attention=True)

    def _prefill(self, table, work, b, seq_len, *shape):
        """A prefill kernel over `b` requests of `seq_len` new tokens each, no prefix: its table
        (`table(ps, b, *shape, s)`) when profiled, else the roofline of `work(b, *shape, s)`."""
        s = np.asarray(seq_len, dtype=np.float64)
        if self.ps is not None:
            return table(self.ps, b, *shape, s)
        return self._roof(work(b, *shape, s), np.broadcast_to(b, s.shape), attention=True)

    def context_attention(self, b, nh, nkv, hd, seq_len, window):
        def table(ps, b, nh, nkv, hd, s):
            return interp.context_attention(ps, b, nh, nkv, hd, s, window)

        def work(b, nh, nkv, hd, s):
            return rf.context_attention_work(b, nh, nkv, hd, s, window)

        return self._prefill(table, work, b, seq_len, nh, nkv, hd)

    def mla_context(self, b, nh, seq_len):
        return self._prefill(interp.mla_context, rf.mla_context_work, b, seq_len, nh)

    def linear_attention(self, b, nk, dk, nv, dv, seq_len):
        return self._prefill(interp.linear_attention, rf.linear_attention_work, b, seq_len, nk, dk, nv, dv)

    def moe(self, b, hidden, inter, topk, experts, tp, ep, dtype):
        if self.ps is not None:
            return interp.moe(self.ps, b, hidden, inter, topk, experts, tp, ep, dtype, self.routing)
        return self._roof(rf.moe_work(b, hidden, inter, topk, experts, tp, ep, dtype), b, dtype)

    def allreduce(self, tp, nbytes):
        if tp == 1:
            return np.zeros_like(nbytes), np.zeros(nbytes.shape, np.int8)
        if self.ps is not None:
            return interp.allreduce(self.ps, tp, nbytes)
        bw = self.gpu.intra_node_gbps * 1e3
        lat = rf.allreduce_work(tp, nbytes) / bw + 2 * self.eff.overhead_us
        return lat, np.full(nbytes.shape, self.fallback, np.int8)


def qkv_split(op: Operator, tp: int) -> tuple[int, int] | None:
    """(query width, key+value width) per GPU of a softmax-attention QKV projection, or None."""
    a = op.attention
    if op.traits.shard != Shard.QKV or a is None or a.kind not in ("full", "sliding"):
        return None
    q_out = a.n_heads * a.head_dim * (2 if a.q_gate else 1)
    return max(1, q_out // tp), 2 * kv_heads_per_rank(a.n_kv_heads, tp) * a.head_dim


def sharded_gemms(op: Operator, tp: int) -> list[tuple[int, int]]:
    """Per-GPU (n, k) of an operator's GEMMs: row-parallel projections split k, the rest n.

    A QKV projection keeps whole KV heads per GPU: past the KV-head count they are
    replicated, so its width is q/tp + 2 * kv_heads_per_rank * head_dim.
    """
    out = []
    split = qkv_split(op, tp)
    shard = op.traits.shard
    for n, k in op.gemm:
        if shard == Shard.REPLICATED:
            out.append((n, k))
        elif shard == Shard.ROW:
            out.append((n, max(1, k // tp)))
        elif split is not None:
            out.append((sum(split), k))
        else:
            out.append((max(1, n // tp), k))
    return out


def sharded_attention(op: Operator, tp: int) -> tuple[int, int, int]:
    """Per-GPU (query heads, KV heads, head dim) of a decode-attention operator."""
    a = op.attention
    return max(1, a.n_heads // tp), kv_heads_per_rank(a.n_kv_heads, tp), a.head_dim


def kernel_shapes(seq: OperatorSequence, tp: int) -> tuple[list[tuple[int, int]], list[tuple[int, int, int, int]]]:
    """Distinct per-GPU GEMM (n, k) and attention (heads, kv heads, head dim, window) a model needs."""
    gemms: dict[tuple[int, int], None] = {}
    attn: dict[tuple[int, int, int, int], None] = {}
    for op in seq.ops:
        for nk in sharded_gemms(op, tp):
            gemms[nk] = None
        if op.traits.kernel == Kernel.ATTENTION:
            attn[(*sharded_attention(op, tp), op.attention.window or 0)] = None
    return list(gemms), list(attn)


def _gemm_dtype(op: Operator) -> str:
    """The GEMM table of an operator's weight format (no mxfp4 dense tables: bf16 kernels)."""
    return "fp8_block" if op.weight_dtype == "fp8_block" else "bfloat16"


def _moe_dtype(op: Operator) -> str:
    """The fused-MoE table of the experts' weight format."""
    return op.weight_dtype if op.weight_dtype in ("fp8_block", "mxfp4") else "bfloat16"


def elementwise_bytes(op: Operator, seq: OperatorSequence, tp: int) -> list[float]:
    """Bytes per token of each elementwise kernel an operator launches on one GPU.

    vLLM's decode step per layer: fused residual-add + RMSNorm before attention
    and before the MLP (read x and residual, write both: 4 x hidden), rotary on
    q and k and the KV-cache write (read + write of the per-GPU q/k/v widths),
    and SiLU-and-mul (read 2 x width, write 1 x width). The final norm joins the
    LM head, the embedding is a gather (write hidden). Routers, MLA, linear
    attention and MoE fuse their own passes and are costed by their kernels.
    """
    return _PASSES[op.traits.passes](op, seq, tp)


def _norm(seq: OperatorSequence) -> float:
    return 4.0 * seq.model.hidden_size * seq.model.act_bytes


def _post_norm(seq: OperatorSequence) -> list[float]:
    """Gemma's post-attention / post-FFN norms (norms_per_layer == 4)."""
    return [2.0 * seq.model.hidden_size * seq.model.act_bytes] if seq.model.norms_per_layer == 4 else []


def _open_attention(op: Operator, seq: OperatorSequence, tp: int) -> list[float]:
    """Pre-attention add + norm; a softmax QKV projection adds rotary and the KV-cache write."""
    split = qkv_split(op, tp)
    if split is None:
        return [_norm(seq)]
    q, kv = split
    ab = seq.model.act_bytes
    return [_norm(seq), 2.0 * (q + kv / 2) * ab, kv * (ab + seq.model.kv_bytes)]


def _activation(op: Operator, seq: OperatorSequence, tp: int) -> list[float]:
    width = sum(n for n, _ in sharded_gemms(op, tp)) / 2
    return [3.0 * width * seq.model.act_bytes]


_PASSES = {
    Passes.NONE: lambda op, seq, tp: [],
    Passes.GATHER: lambda op, seq, tp: [seq.model.hidden_size * seq.model.act_bytes],
    Passes.OPEN_ATTENTION: _open_attention,
    Passes.CLOSE_ATTENTION: lambda op, seq, tp: _post_norm(seq) + [_norm(seq)],  # + pre-MLP add + norm
    Passes.ACTIVATION: _activation,
    Passes.CLOSE_FFN: lambda op, seq, tp: _post_norm(seq),
    Passes.FINAL_NORM: lambda op, seq, tp: [_norm(seq)],
}


def _gemms(kern: _Kernels, op: Operator, seq: OperatorSequence, par: Parallel, context: int, b) -> list:
    return [kern.gemm(b, n, k, _gemm_dtype(op)) for n, k in sharded_gemms(op, par.tp)]


def _attention(kern: _Kernels, op: Operator, seq: OperatorSequence, par: Parallel, context: int, b) -> list:
    return [kern.attention(b, *sharded_attention(op, par.tp), context, op.attention.window or 0)]


def _state(kern: _Kernels, op: Operator, seq: OperatorSequence, par: Parallel, context: int, b) -> list:
    shard = _state_shard(op, par.tp)
    return [kern.memory_pass(b, 2.0 * op.state_bytes / shard, op.flops / shard)]


def _latent(kern: _Kernels, op: Operator, seq: OperatorSequence, par: Parallel, context: int, b) -> list:
    # the latent cache is shared by all heads, so it is replicated across TP
    return [kern.memory_pass(b, op.kv_bytes(context), op.context_flops * context / par.tp)]


def _moe(kern: _Kernels, op: Operator, seq: OperatorSequence, par: Parallel, context: int, b) -> list:
    f = op.mlp
    ep, etp = (par.tp, 1) if par.moe_ep else (1, par.tp)
    lat, src = kern.moe(b, seq.model.hidden_size, f.expert_intermediate, f.top_k, f.n_experts, etp, ep, _moe_dtype(op))
    share = MOE_UP_SHARE if op.traits.kernel == Kernel.FUSED_MOE_UP else 1.0 - MOE_UP_SHARE
    return [(lat * share, src)]


_COSTS = {
    Kernel.GATHER: lambda kern, op, seq, par, context, b: [],  # the gather is its elementwise pass
    Kernel.GEMM: _gemms,
    Kernel.ATTENTION: _attention,
    Kernel.STATE: _state,
    Kernel.LATENT: _latent,
    Kernel.FUSED_MOE_UP: _moe,
    Kernel.FUSED_MOE_DOWN: _moe,
}


def decode_core(kern: _Kernels, op: Operator, seq: OperatorSequence, par: Parallel, context: int, b) -> list:
    """(latency µs, source) pairs of an operator's own kernels over microbatch sizes `b` at a
    resident `context` (for attention: the decode kernel over the KV cache), without its
    elementwise passes and all-reduce (`token_latency` adds those at a token count)."""
    return _COSTS[op.traits.kernel](kern, op, seq, par, context, np.atleast_1d(np.asarray(b, dtype=np.float64)))


def _op_latency(kern: _Kernels, op: Operator, seq: OperatorSequence, par: Parallel, context: int, b,
                core=None):
    """(latency µs, source) arrays over microbatch sizes `b` for one operator on one GPU.

    `core` replaces the operator's own kernel list (the prefill side's attention over a prompt);
    its elementwise passes and the all-reduce after it are costed here either way."""
    traits = op.traits
    parts = _COSTS[traits.kernel](kern, op, seq, par, context, b) if core is None else list(core)
    for nbytes in elementwise_bytes(op, seq, par.tp):
        parts.append(kern.elementwise(b, nbytes))
    if traits.allreduce_after:
        parts.append(kern.allreduce(par.tp, b * seq.model.hidden_size * seq.model.act_bytes))
    lats = np.array([p[0] for p in parts])
    srcs = np.array([p[1] for p in parts])
    # the figure is as trustworthy as the kernel that dominates it
    src = np.take_along_axis(srcs, lats.argmax(axis=0)[None, :], axis=0)[0].astype(np.int8)
    return lats.sum(axis=0), src


@lru_cache(maxsize=32)
def kernels_for(gpu: GpuType, profiles_dir: str | None = None, backend: str = "vllm",
                moe_routing: str = interp.DEFAULT_MOE_ROUTING) -> _Kernels:
    """The kernel costs of one GPU description (tables when profiled, else the calibrated roofline)."""
    return _Kernels(gpu, Path(os.path.realpath(profiles_root(profiles_dir))), backend, moe_routing)


def token_latency(kern: _Kernels, op: Operator, seq: OperatorSequence, par: Parallel, tokens,
                  core=None):
    """(latency µs, source) of one operator over `tokens` tokens on one GPU: its GEMMs at m =
    tokens, its fused MoE over tokens, its elementwise passes and all-reduce per token. An
    attention operator needs `core`, the (latency, source) pairs of its core kernels (the
    decode rule reads a KV cache the prefill side does not have)."""
    b = np.atleast_1d(np.asarray(tokens, dtype=np.float64))
    if core is None and op.traits.kernel in (Kernel.ATTENTION, Kernel.STATE, Kernel.LATENT):
        raise ValueError(f"{op.name}: an attention operator's prefill cost needs its core kernels")
    return _op_latency(kern, op, seq, par, 0, b, core)


def _signature(op: Operator) -> tuple:
    return (op.kind, op.gemm, op.attention, op.mlp, op.kv_window, op.state_bytes, op.weight_dtype_bytes,
            op.weight_dtype)


@lru_cache(maxsize=64)
def _firsts(seq: OperatorSequence) -> tuple[int, ...]:
    """Per operator, the first operator of its signature (costed once; once per model, not per
    op_latencies call: hashing the signatures' models took 0.03-0.05 s of a README plan)."""
    first: dict[tuple, int] = {}
    return tuple(first.setdefault(_signature(op), i) for i, op in enumerate(seq.ops))


@lru_cache(maxsize=256)
def op_latencies(seq: OperatorSequence, gpu: GpuType, par: Parallel, context: int,
                 mb_grid: tuple[int, ...], profiles_dir: str | None = None,
                 backend: str = "vllm", moe_routing: str = interp.DEFAULT_MOE_ROUTING) -> OpLatencies:
    """Latency of every operator of `seq` for each microbatch size in `mb_grid`.

    `moe_routing` ("balanced" | "power-law") picks the fused-MoE tables' expert-load family.
    """
    kern = _Kernels(gpu, Path(os.path.realpath(profiles_root(profiles_dir))), backend, moe_routing)
    b = np.asarray(mb_grid, dtype=np.float64)
    lat = np.empty((seq.n, b.size))
    src = np.empty((seq.n, b.size), np.int8)
    for i, (op, first) in enumerate(zip(seq.ops, _firsts(seq), strict=True)):
        lat[i], src[i] = _op_latency(kern, op, seq, par, context, b) if first == i else (lat[first], src[first])
    return OpLatencies(gpu.id, par, context, tuple(mb_grid), lat, src)


def weight_shard(op: Operator, tp: int) -> float:
    """Per-GPU resident weight bytes of an operator in a TP group of `tp`.

    Replicated kinds keep everything; a QKV projection keeps its query share
    plus whole (possibly replicated) KV heads; the rest splits evenly.
    """
    if op.traits.shard == Shard.REPLICATED:
        return op.weight_bytes
    split = qkv_split(op, tp)
    if split is not None:
        full = sum(n for n, _ in op.gemm)
        return op.weight_bytes * sum(split) / full
    return op.weight_bytes / tp


def _state_shard(op: Operator, tp: int) -> int:
    """GPUs a linear-attention state splits over: one value head each at most."""
    return min(tp, op.attention.lin_v_heads)


_KV_SHARD = {  # (operator, TP, total bytes) -> bytes on one GPU
    KvRule.HEADS: lambda op, tp, total: total * kv_heads_per_rank(op.attention.n_kv_heads, tp)
    / op.attention.n_kv_heads,
    KvRule.LATENT: lambda op, tp, total: total,  # shared by all heads: replicated
    KvRule.STATE: lambda op, tp, total: total / _state_shard(op, tp),
}


def kv_shard(op: Operator, tp: int, context: int) -> float:
    """Per-GPU KV/state bytes per request: `kv_heads_per_rank` heads (MLA latents replicated)."""
    total = op.kv_bytes(context)
    if not total:
        return 0.0
    return _KV_SHARD[op.traits.kv](op, tp, total)
