"""Colocated steps that mix decodes with prefill chunks (chunked prefill), and a step-level
replay of arrivals through one aggregated replica.

A step of vLLM's V1 scheduler schedules the running decodes first (one token each), then fills
the rest of the token budget (`max_num_batched_tokens`, the chunk) with prefill chunks of the
waiting prompts, first come first served, at most `max_num_seqs` requests resident. Its time is
the colocated step at its decode batch plus its chunk, from the same primitives as the decode
tables and the prefill model (each rule once):

* every operator but attention cores and the LM head at d + c tokens (`lookup.token_latency`:
  GEMMs at m = d + c, the fused MoE, elementwise passes, TP all-reduces);
* the LM head (with the final norm) at d + e rows: the decodes and the e prompts ending here;
* decode attention of the d resident requests at their own contexts (prompt + tokens generated
  so far): `lookup.decode_core` tabulated at geometric context knots up to the longest context
  and read linearly between the two knots around the residents' mean context (memory-bound
  decode attention reads each request's KV once, so at a fixed decode count its time is close
  to affine in the summed context; a convex combination of two knots also stays above the
  speed-of-light floor each knot already carries, the floor being affine in the KV bytes);
* each prefill segment's attention over its prefix (`prefill.attention_pass` tabulated per
  length, combined by `prefill.chunk_attention_us`).

The four parts are tabulated once per (GPU, TP, longest context) (`StepTables`); `step_times` (arrays
in, times out) and `replay` read the tables in numba. A pure decode step (c = 0) at context k equals
the sum of `lookup.op_latencies` at batch d and context k (tests/test_aggregated.py checks it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opweave_planner.inputs.hardware import GpuType
from opweave_planner.jit import entry, kernel, shared
from opweave_planner.latency import interp
from opweave_planner.latency.lookup import Parallel, decode_core, kernels_for, token_latency
from opweave_planner.latency.prefill import attention_pass, chunk_attention_us
from opweave_planner.structure.operators import Kernel, OperatorSequence, OpKind

__all__ = ["StepTables", "ReplayResult", "CONTEXT_KNOTS", "context_knots", "step_tables", "mixed_step_us", "replay_replica", "step_times", "replay"]

shared(chunk_attention_us)


@dataclass(frozen=True, eq=False)
class StepTables:
    """One (GPU, TP, longest context)'s step parts, µs: `linear_us[n]` (every operator but attention
    cores and the LM head, n tokens), `head_us[w]` (LM head, w rows), `decode_attention_us[j, d]`
    (d resident decodes at context `knots[j]`; `context` is the last knot), `pass_us[k, s]` (a prefix-free prefill pass of s tokens through
    attention shape k, `count[k]` operators of it, `recurrent[k]` a linear-attention state)."""

    gpu: str
    tp: int
    context: int
    linear_us: np.ndarray
    head_us: np.ndarray
    decode_attention_us: np.ndarray
    pass_us: np.ndarray
    count: np.ndarray
    recurrent: np.ndarray
    knots: np.ndarray

    @property
    def max_batch(self) -> int:
        return self.decode_attention_us.shape[1] - 1

    @property
    def max_tokens(self) -> int:
        return self.linear_us.size - 1

    def decode_step_us(self, decodes: int, context: float | None = None) -> float:
        """A pure decode step of `decodes` resident requests at mean context `context` (None: the
        longest)."""
        at = None if context is None else [float(context)]
        return float(mixed_step_us(self, [decodes], [0, 0], [], [], [], at)[0])


#: decode contexts the attention core is tabulated at (geometric up to the longest context)
CONTEXT_KNOTS = 13
#: the shortest knot; a shorter context is read at it (attention there is launch overhead)
LOWEST_KNOT = 64


def context_knots(context: int) -> np.ndarray:
    """Geometric knots from LOWEST_KNOT (or `context`, if shorter) up to `context`."""
    lo = min(LOWEST_KNOT, int(context))
    return np.unique(np.geomspace(lo, int(context), CONTEXT_KNOTS).round().astype(np.int64)).astype(np.float64)


def _attention(op) -> bool:
    return op.traits.kernel in (Kernel.ATTENTION, Kernel.STATE, Kernel.LATENT)


def step_tables(seq: OperatorSequence, gpu: GpuType, tp: int, context: int, max_batch: int, max_tokens: int,
                max_prompt: int, *, profiles_dir: str | None = None, backend: str = "vllm",
                moe_routing: str = interp.DEFAULT_MOE_ROUTING) -> StepTables:
    """Tabulate the step parts for up to `max_batch` decodes, `max_tokens` tokens per step and
    prompts of up to `max_prompt` tokens (MoE experts sharded by TP, as the prefill pool's)."""
    par = Parallel(tp, False)
    kern = kernels_for(gpu, profiles_dir, backend, moe_routing)
    n = np.arange(1, max_tokens + 1, dtype=np.float64)
    d = np.arange(1, max_batch + 1, dtype=np.float64)
    s = np.arange(1, max_prompt + 1, dtype=np.float64)
    knots = context_knots(context)
    linear, head = np.zeros(max_tokens + 1), np.zeros(max_tokens + 1)
    dattn = np.zeros((knots.size, max_batch + 1))
    passes: dict[tuple, list] = {}
    memo: dict[tuple, np.ndarray] = {}
    for op in seq.ops:
        key = (op.kind, op.gemm, op.attention, op.mlp, op.kv_window, op.state_bytes, op.weight_dtype)
        if key not in memo:
            if _attention(op):
                zero = [(np.zeros(n.size), np.zeros(n.size, np.int8))]
                per_token = token_latency(kern, op, seq, par, n, zero)[0]
                core = np.array([sum(lat for lat, _ in decode_core(kern, op, seq, par, int(k), d)) for k in knots])
                call, recurrent = attention_pass(kern, op, par)
                memo[key] = (per_token, core, call(1.0, s)[0], recurrent)
            else:
                memo[key] = (token_latency(kern, op, seq, par, n)[0],)
        got = memo[key]
        if op.kind == OpKind.LM_HEAD:
            head[1:] += got[0]
        else:
            linear[1:] += got[0]
        if len(got) > 1:
            dattn[:, 1:] += got[1]
            entry_ = passes.setdefault(key, [got[2], got[3], 0])
            entry_[2] += 1
    shapes = list(passes.values())
    pass_us = np.zeros((len(shapes), max_prompt + 1))
    for k, (lat, _, _) in enumerate(shapes):
        pass_us[k, 1:] = lat
    return StepTables(gpu.id, tp, int(context), linear, head, dattn, pass_us,
                      np.array([c for _, _, c in shapes], dtype=np.float64),
                      np.array([r for _, r, _ in shapes], dtype=np.bool_), knots)


@kernel(inline=True)
def _segment_us(pass_us, recurrent, count, new, prefix):
    t = 0.0
    for k in range(pass_us.shape[0]):
        t += count[k] * chunk_attention_us(pass_us[k, new], pass_us[k, prefix + new], pass_us[k, prefix], prefix,
                                           recurrent[k])
    return t


@kernel(inline=True)
def _decode_attention_us(knots, dattn, decodes, context):
    """Decode attention of `decodes` residents at mean `context`, linear between the knots
    around it (clipped to the first and last knot)."""
    if decodes == 0:
        return 0.0
    last = knots.size - 1
    if context <= knots[0]:
        return dattn[0, decodes]
    if context >= knots[last]:
        return dattn[last, decodes]
    j = 0
    while knots[j + 1] < context:
        j += 1
    w = (context - knots[j]) / (knots[j + 1] - knots[j])
    return (1.0 - w) * dattn[j, decodes] + w * dattn[j + 1, decodes]


@kernel(inline=True)
def _base_us(linear, head, attention, decodes, tokens, ending):
    return linear[decodes + tokens] + head[decodes + ending] + attention


@entry
def step_times(linear, head, dattn, knots, pass_us, recurrent, count, decodes, contexts, seg_ptr, seg_new, seg_prefix,
               seg_ends):
    """Each step's time (µs): step i has `decodes[i]` decodes at mean context `contexts[i]` and
    the prefill segments `seg_ptr[i]:seg_ptr[i + 1]` of (new tokens, cached prefix, prompt ends here)."""
    out = np.empty(decodes.size)
    for i in range(decodes.size):
        tokens, ending, attn = 0, 0, 0.0
        for j in range(seg_ptr[i], seg_ptr[i + 1]):
            tokens += seg_new[j]
            ending += 1 if seg_ends[j] else 0
            attn += _segment_us(pass_us, recurrent, count, seg_new[j], seg_prefix[j])
        dec_attn = _decode_attention_us(knots, dattn, decodes[i], contexts[i])
        out[i] = _base_us(linear, head, dec_attn, decodes[i], tokens, ending) + attn
    return out


def mixed_step_us(tables: StepTables, decodes, seg_ptr, seg_new, seg_prefix, seg_ends,
                  contexts=None) -> np.ndarray:
    """The public step-time function (µs per step; arrays as in `step_times`), bounds checked
    here because the kernel reads the tables unchecked. `contexts`: each step's mean decode
    context (prompt + tokens generated so far, averaged over its decodes); None: the tables'
    longest context for every step."""
    dec = np.ascontiguousarray(decodes, dtype=np.int64)
    ctx = np.full(dec.size, float(tables.context)) if contexts is None else np.ascontiguousarray(contexts,
                                                                                                  dtype=np.float64)
    if ctx.shape != dec.shape or np.any(~np.isfinite(ctx)) or np.any(ctx < 0):
        raise ValueError("contexts: expected one non-negative mean decode context per step")
    ptr = np.ascontiguousarray(seg_ptr, dtype=np.int64)
    new = np.ascontiguousarray(seg_new, dtype=np.int64)
    pre = np.ascontiguousarray(seg_prefix, dtype=np.int64)
    ends = np.ascontiguousarray(seg_ends, dtype=np.bool_)
    if ptr.size != dec.size + 1 or ptr[0] != 0 or np.any(np.diff(ptr) < 0) or ptr[-1] != new.size:
        raise ValueError("seg_ptr: expected 0, non-decreasing, ending at len(seg_new), one more entry than decodes")
    if new.shape != pre.shape or new.shape != ends.shape:
        raise ValueError("seg_new, seg_prefix, seg_ends: expected equal shapes")
    tokens = np.add.reduceat(np.append(new, 0), ptr[:-1]) * (np.diff(ptr) > 0) if dec.size else dec
    if (np.any(dec < 0) or np.any(dec > tables.max_batch) or np.any(new < 0) or np.any(pre < 0)
            or np.any(dec + tokens > tables.max_tokens) or np.any(pre + new >= tables.pass_us.shape[1])):
        raise ValueError("decodes or segments beyond the tables (step_tables' max_batch / max_tokens / max_prompt)")
    return step_times(tables.linear_us, tables.head_us, tables.decode_attention_us, tables.knots, tables.pass_us,
                      tables.recurrent, tables.count, dec, ctx, ptr, new, pre, ends)


@entry
def replay(arrivals, prompts, outputs, max_batch, chunk, linear, head, dattn, knots, pass_us, recurrent, count, until):
    """One replica, step by step (times in s): each step's decodes first, then prefill chunks of
    the waiting prompts in arrival order within the budget `chunk`, at most `max_batch` resident;
    each decode's attention at its own context (prompt + tokens generated so far), read at the
    residents' mean context.
    Returns each request's TTFT (end of the step its prompt ends in), and for the steps with
    decodes starting by `until`: their durations, decode counts and whether they held a chunk."""
    n = arrivals.size
    ttft = np.zeros(n)
    rem = np.zeros(n, np.int64)
    dec = np.empty(max_batch, np.int64)
    done_pf = np.empty(max_batch + 1, np.int64)
    cap = 1024
    dur_out = np.empty(cap)
    dec_out = np.empty(cap, np.int64)
    mix_out = np.empty(cap, np.bool_)
    steps = 0
    nd = 0
    t = 0.0
    arrived, admitted, finished = 0, 0, 0
    pf, pf_done = -1, 0
    while finished < n:
        while arrived < n and arrivals[arrived] <= t:
            arrived += 1
        if nd == 0 and pf < 0 and admitted == arrived:
            t = arrivals[admitted]  # idle until the next arrival
            continue
        d = nd
        budget = chunk - d
        nrun = nd + (1 if pf >= 0 else 0)
        tokens, ending, attn, nfin = 0, 0, 0.0, 0
        cur, cur_done = pf, pf_done
        if cur < 0 and budget > 0 and admitted < arrived and nrun < max_batch:
            cur, cur_done = admitted, 0
            admitted += 1
            nrun += 1
        while cur >= 0 and budget > 0:
            take = min(prompts[cur] - cur_done, budget)
            attn += _segment_us(pass_us, recurrent, count, take, cur_done)
            tokens += take
            budget -= take
            if cur_done + take == prompts[cur]:
                ending += 1
                done_pf[nfin] = cur
                nfin += 1
                cur = -1
                if budget > 0 and admitted < arrived and nrun < max_batch:
                    cur, cur_done = admitted, 0
                    admitted += 1
                    nrun += 1
            else:
                cur_done += take
        pf, pf_done = cur, cur_done
        ctx_sum = 0.0
        for i in range(nd):
            r = dec[i]
            ctx_sum += prompts[r] + outputs[r] - rem[r]  # tokens generated so far: outputs - rem
        dec_attn = _decode_attention_us(knots, dattn, d, ctx_sum / d) if d > 0 else 0.0
        dur = (_base_us(linear, head, dec_attn, d, tokens, ending) + attn) * 1e-6
        if d > 0 and t <= until:
            if steps == cap:
                cap *= 2
                grown = np.empty(cap)
                grown[:steps] = dur_out[:steps]
                dur_out = grown
                grown_d = np.empty(cap, np.int64)
                grown_d[:steps] = dec_out[:steps]
                dec_out = grown_d
                grown_m = np.empty(cap, np.bool_)
                grown_m[:steps] = mix_out[:steps]
                mix_out = grown_m
            dur_out[steps] = dur
            dec_out[steps] = d
            mix_out[steps] = tokens > 0
            steps += 1
        t += dur
        i = nd - 1
        while i >= 0:  # each decode's token; a finished request leaves its slot
            r = dec[i]
            rem[r] -= 1
            if rem[r] == 0:
                finished += 1
                nd -= 1
                dec[i] = dec[nd]
            i -= 1
        for j in range(nfin):
            r = done_pf[j]
            ttft[r] = t - arrivals[r]
            rem[r] = outputs[r] - 1
            if rem[r] <= 0:
                finished += 1
            else:
                dec[nd] = r
                nd += 1
    return ttft, dur_out[:steps], dec_out[:steps], mix_out[:steps]


@dataclass(frozen=True)
class ReplayResult:
    """One replica's replay: TTFT per request (s), and the decode steps (s, decodes, mixed)."""

    ttft_s: np.ndarray
    step_s: np.ndarray
    step_decodes: np.ndarray
    step_mixed: np.ndarray


def replay_replica(tables: StepTables, arrivals, prompts, outputs, max_batch: int, chunk: int,
                   until: float = np.inf) -> ReplayResult:
    """`replay` through one replica, inputs checked here (the kernel indexes the tables unchecked)."""
    a = np.ascontiguousarray(arrivals, dtype=np.float64)
    p = np.ascontiguousarray(prompts, dtype=np.int64)
    o = np.ascontiguousarray(outputs, dtype=np.int64)
    if a.ndim != 1 or a.shape != p.shape or a.shape != o.shape or a.size == 0 or np.any(np.diff(a) < 0):
        raise ValueError("arrivals, prompts, outputs: expected equal non-empty 1-D arrays, arrivals sorted")
    if np.any(p < 1) or np.any(o < 1) or int(p.max()) >= tables.pass_us.shape[1]:
        raise ValueError("prompts and outputs: expected at least 1 token, prompts within the tables' max_prompt")
    if not 1 <= max_batch <= chunk or max_batch > tables.max_batch or chunk > tables.max_tokens:
        raise ValueError(f"max_batch {max_batch}, chunk {chunk}: expected 1 <= max_batch <= chunk within the tables")
    got = replay(a, p, o, int(max_batch), int(chunk), tables.linear_us, tables.head_us, tables.decode_attention_us,
                 tables.knots, tables.pass_us, tables.recurrent, tables.count, float(until))
    return ReplayResult(*got)
