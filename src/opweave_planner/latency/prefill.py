"""Time to prefill prompts on one (GPU type, TP) group, chunked as the runtime chunks them.

One rule, written once: a prefill step processes T new tokens (the chunk budget, split over
the requests it serves in arrival order); every operator other than attention costs what the
decode operators cost at T tokens (`lookup.token_latency`: GEMMs at m = T, the fused MoE over
T tokens, elementwise passes and the TP all-reduce per token); the LM head runs only for the
requests whose prompt ends in that step; attention is the measured prefill kernel
(`interp.context_attention`, aiconfigurator's context tables, which have no cached prefix) with
a prefix charged as the difference of two prefix-free passes, ``T(p + c) - T(p)`` (causal
attention work is additive over the triangle; never below a pass over the chunk alone).
The prompt's KV is then handed to the decode pool over a link: its bytes / bandwidth + latency.

`chunk_tokens` 0 is one pass over the batch's prompts (a static prefill benchmark); the
default is vLLM's `max_num_batched_tokens` for `vllm serve` (`default_chunk_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opweave_planner.inputs.hardware import GpuType
from opweave_planner.latency import interp
from opweave_planner.latency.lookup import (
    Parallel,
    kernels_for,
    sharded_attention,
    token_latency,
)
from opweave_planner.structure.operators import Kernel, OperatorSequence, OpKind

__all__ = ["PrefillEstimate", "attention_pass", "chunk_attention_us", "chunk_schedule", "default_chunk_tokens",
           "prefill"]

#: vLLM's `max_num_batched_tokens` for the OpenAI server (EngineArgs, V1 engine): 8192 on GPUs
#: with at least 70 GiB that are not A100s, else 2048
_LARGE_GPU_BYTES = 70 * 2**30
_CHUNK_LARGE, _CHUNK_SMALL = 8192, 2048


def default_chunk_tokens(gpu: GpuType) -> int:
    """vLLM's default prefill chunk (tokens per scheduler step) on this GPU type."""
    large = gpu.memory_bytes >= _LARGE_GPU_BYTES and "a100" not in gpu.id.lower()
    return _CHUNK_LARGE if large else _CHUNK_SMALL


def chunk_schedule(prompt: int, batch: int, chunk_tokens: int) -> list[list[tuple[int, int, bool]]]:
    """Steps of (new tokens, cached prefix, prompt ends here) segments, first come first served.

    `chunk_tokens` 0: one step holding every prompt whole.
    """
    if chunk_tokens <= 0:
        return [[(prompt, 0, True)] * batch]
    steps: list[list[tuple[int, int, bool]]] = []
    step: list[tuple[int, int, bool]] = []
    room = chunk_tokens
    for _ in range(batch):
        done = 0
        while done < prompt:
            take = min(room, prompt - done)
            step.append((take, done, done + take == prompt))
            done += take
            room -= take
            if room == 0:
                steps.append(step)
                step, room = [], chunk_tokens
    if step:
        steps.append(step)
    return steps


@dataclass(frozen=True)
class PrefillEstimate:
    """A prefill's time on one group and its parts; `sources` names the worst source per part."""

    prefill_ms: float
    handoff_ms: float
    steps: int
    chunk_tokens: int
    kv_bytes_per_request: float
    breakdown_ms: dict[str, float]
    sources: dict[str, str]
    measured_share: float

    @property
    def total_ms(self) -> float:
        return self.prefill_ms + self.handoff_ms


def chunk_attention_us(t_new: float, t_whole: float, t_prefix: float, prefix: int, recurrent: bool) -> float:
    """Attention of a chunk of new tokens after `prefix` cached ones, from prefix-free passes over
    the chunk (`t_new`), chunk + prefix (`t_whole`) and the prefix (`t_prefix`): causal work is
    additive over the triangle, so the difference, never below a pass over the chunk alone. A
    recurrent state (linear attention) makes a chunk a pass over itself. Plain Python here (this
    module imports no numba); `latency.mixed` registers it for its kernels (`jit.shared`)."""
    if prefix == 0 or recurrent:
        return t_new
    return max(t_whole - t_prefix, t_new)


def attention_pass(kern, op, par: Parallel):
    """`call(batch, seq_lens) -> (latency µs, source)`: an attention operator's prefix-free prefill
    pass over `seq_lens` new tokens per request (its measured context-phase kernel), and whether
    its state is recurrent."""
    a = op.attention
    if a.kind == "linear":
        shard = min(par.tp, a.lin_v_heads)
        nk, nv = max(1, a.lin_k_heads // shard), max(1, a.lin_v_heads // shard)
        return (lambda b, s: kern.linear_attention(b, nk, a.lin_k_dim, nv, a.lin_v_dim, s)), True
    if a.kind == "mla":
        nh = max(1, a.n_heads // par.tp)
        return (lambda b, s: kern.mla_context(b, nh, s)), False
    nh, nkv, hd = sharded_attention(op, par.tp)
    window = a.window or 0
    return (lambda b, s: kern.context_attention(b, nh, nkv, hd, s, window)), False


def _attention_core(kern, op, par: Parallel, segments: list[tuple[int, int, bool]], one_pass: bool):
    """(latency µs, source) of an attention operator's core kernels over a step's segments."""
    call, recurrent = attention_pass(kern, op, par)
    if one_pass:  # every prompt whole and equal: one batched call
        lat, src = call(float(len(segments)), np.array([segments[0][0]], dtype=np.float64))
        return [(lat, src)]
    total, worst = np.zeros(1), np.zeros(1, np.int8)
    for new, prefix, _ in segments:
        lat, src = call(1.0, np.array([new, prefix + new, max(prefix, 1)], dtype=np.float64))
        t = chunk_attention_us(float(lat[0]), float(lat[1]), float(lat[2]), prefix, recurrent)
        used = src[:1] if prefix == 0 or recurrent else src
        total += t
        worst = np.maximum(worst, used.max())
    return [(total, worst)]


def prefill(seq: OperatorSequence, gpu: GpuType, tp: int, prompt: int, batch: int = 1,
            chunk_tokens: int | None = None, *, link_gbps: float = 32.0, link_latency_us: float = 20.0,
            profiles_dir: str | None = None, backend: str = "vllm",
            moe_routing: str = interp.DEFAULT_MOE_ROUTING, moe_ep: bool = False) -> PrefillEstimate:
    """Time to prefill `batch` prompts of `prompt` tokens on one TP group of `gpu`, and to hand
    their KV over a `link_gbps` / `link_latency_us` link (see the module docstring)."""
    chunk = default_chunk_tokens(gpu) if chunk_tokens is None else int(chunk_tokens)
    par = Parallel(tp, moe_ep)
    kern = kernels_for(gpu, profiles_dir, backend, moe_routing)
    steps = chunk_schedule(prompt, batch, chunk)
    parts: dict[str, float] = {}
    worst: dict[str, int] = {}
    measured = total = 0.0
    memo: dict[tuple, tuple[float, int]] = {}
    for step in steps:
        tokens = sum(seg[0] for seg in step)
        ending = sum(1 for seg in step if seg[2])
        for op in seq.ops:
            attention = op.traits.kernel in (Kernel.ATTENTION, Kernel.STATE, Kernel.LATENT)
            if op.kind == OpKind.LM_HEAD:
                if not ending:
                    continue
                key = (op.kind, ending)
                width = ending
            elif attention:
                key = (op.kind, op.attention, tuple(step), chunk <= 0)
                width = tokens
            else:
                key = (op.kind, op.gemm, op.mlp, op.weight_dtype, tokens)
                width = tokens
            got = memo.get(key)
            if got is None:
                core = _attention_core(kern, op, par, step, chunk <= 0) if attention else None
                lat, src = token_latency(kern, op, seq, par, [float(width)], core)
                got = memo[key] = (float(lat[0]), int(src[0]))
            lat_us, src = got
            parts[op.kind] = parts.get(op.kind, 0.0) + lat_us
            worst[op.kind] = max(worst.get(op.kind, 0), src)
            total += lat_us
            if src <= interp.INTERPOLATED:
                measured += lat_us
    kv = _handoff_bytes(seq, prompt)
    handoff_ms = (batch * kv / (link_gbps * 1e9) * 1e3 + link_latency_us / 1e3) if kv else 0.0
    return PrefillEstimate(
        prefill_ms=total / 1e3, handoff_ms=handoff_ms, steps=len(steps), chunk_tokens=chunk,
        kv_bytes_per_request=kv, breakdown_ms={k: v / 1e3 for k, v in parts.items()},
        sources={k: interp.SOURCE_NAMES[v] for k, v in worst.items()},
        measured_share=measured / total if total > 0 else 1.0,
    )


def _handoff_bytes(seq: OperatorSequence, prompt: int) -> float:
    """KV/state bytes of one request's prompt, each KV head once (a head replicated over TP
    ranks is sent once)."""
    return float(seq.kv_bytes(prompt))
