"""The decode-step operator DAG of a model, reduced to its linear execution order.

Each operator carries what later stages need: its weights, FLOPs, the KV or
recurrent state it keeps per request, and the bytes of the tensor it emits.
Stage-boundary payloads are derived from the DAG (every tensor produced before
a cut and consumed after it crosses), so the residual stream is never forgotten.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from functools import cache

import networkx as nx

from opweave_planner.inputs.model import AttentionSpec, LayerSpec, MlpSpec, ModelSpec


class Slot(IntEnum):
    """Universal slot order inside one layer. A template cut names a slot; a layer lacking
    that slot takes the cut before its next present operator."""

    ATTN_IN = 0
    ATTN_IN2 = 1
    ATTN_CORE = 2
    ATTN_OUT = 3
    ROUTER = 4
    SHARED_UP = 5
    SHARED_DOWN = 6
    FFN_UP = 7
    FFN_DOWN = 8


class OpKind(StrEnum):
    """What an operator computes; the latency lookup and the sharding rules key on it."""

    EMBED = "embed"
    LM_HEAD = "lm_head"
    QKV_PROJ = "qkv_proj"
    MLA_DOWN = "mla_down"
    MLA_UP = "mla_up"
    ATTN_FULL = "attn_full"
    ATTN_SLIDING = "attn_sliding"
    ATTN_LINEAR = "attn_linear"
    ATTN_MLA = "attn_mla"
    O_PROJ = "o_proj"
    ROUTER = "router"
    SHARED_UP = "shared_up"
    SHARED_DOWN = "shared_down"
    MOE_UP = "moe_up"
    MOE_DOWN = "moe_down"
    FFN_UP = "ffn_up"
    FFN_DOWN = "ffn_down"


SLOTS = tuple(s.name.lower() for s in Slot)
SLOT = {s.name.lower(): int(s) for s in Slot}
EMBED_LAYER = -1

ATTENTION_CORE_KINDS = (OpKind.ATTN_FULL, OpKind.ATTN_SLIDING, OpKind.ATTN_LINEAR, OpKind.ATTN_MLA)


@dataclass(frozen=True)
class Operator:
    """One kernel-level operator of a decode step (per request quantities)."""

    name: str
    kind: OpKind
    layer: int
    slot: int
    params: int  # parameters counted toward the model size
    active_params: float  # parameters touched per request (routed experts: top-k share)
    weight_bytes: float  # resident bytes (tied lm_head still needs its copy)
    flops: float  # FLOPs per request, context-independent part
    ctx_flops: float = 0.0  # FLOPs per request per attended context token
    kv_bytes_per_token: float = 0.0  # cache bytes per request per context token
    kv_window: int = 0  # 0: unbounded; else cache stops growing at this many tokens
    state_bytes: float = 0.0  # fixed recurrent state per request
    out_bytes: float = 0.0  # bytes per request of the tensor this operator emits
    gemm: tuple[tuple[int, int], ...] = ()  # (n, k) of dense GEMMs per token row
    attention: AttentionSpec | None = None
    mlp: MlpSpec | None = None
    weight_dtype_bytes: float = 2.0
    weight_dtype: str = "bfloat16"  # storage format by name (picks the kernel table)
    sharding: str = "tp"  # tp | vocab | experts | replicated

    def kv_bytes(self, context: int) -> float:
        """KV/state bytes per request at `context` tokens."""
        tokens = min(context, self.kv_window) if self.kv_window else context
        return self.kv_bytes_per_token * tokens + self.state_bytes

    def attended_tokens(self, context: int) -> int:
        return min(context, self.kv_window) if self.kv_window else context


@dataclass(frozen=True, eq=False)
class OperatorSequence:
    """Built once per model (cached); compared and hashed by identity to keep caches cheap."""

    model: ModelSpec
    ops: tuple[Operator, ...]
    # payload[i]: bytes per request crossing a cut placed before ops[i] (payload[0]: the token hand-back)
    payload: tuple[float, ...] = field(repr=False)

    @property
    def n(self) -> int:
        return len(self.ops)

    def total_params(self) -> int:
        return sum(op.params for op in self.ops)

    def active_params(self) -> float:
        return sum(op.active_params for op in self.ops)

    def weight_bytes(self) -> float:
        tied_copy = self.ops[-1].weight_bytes if self.model.tie_embeddings else 0.0
        return sum(op.weight_bytes for op in self.ops) - tied_copy

    def kv_bytes(self, context: int) -> float:
        return sum(op.kv_bytes(context) for op in self.ops)


def _attention_ops(layer: LayerSpec, m: ModelSpec) -> list[tuple]:
    """(slot, kind, gemms, extra params, out bytes) of a layer's attention module."""
    a, h, ab = layer.attention, m.hidden_size, m.act_bytes
    post_norm = h if m.norms_per_layer == 4 else 0  # Gemma's post-attention norm
    core_kind = f"attn_{a.kind}"
    if a.kind == "mla":
        down_n = a.q_lora_rank + a.kv_lora_rank + a.qk_rope_dim
        absorb_k = a.kv_lora_rank * a.n_heads * a.qk_nope_dim  # kv_b rows used for keys
        absorb_v = a.kv_lora_rank * a.n_heads * a.v_head_dim  # kv_b rows used for values
        return [
            ("attn_in", "mla_down", [(down_n, h)], h + a.q_lora_rank + a.kv_lora_rank, down_n * ab),
            ("attn_in2", "mla_up", [(a.n_heads * a.head_dim, a.q_lora_rank)], absorb_k,
             a.n_heads * (a.kv_lora_rank + a.qk_rope_dim) * ab),
            ("attn_core", core_kind, [], 0, a.n_heads * a.kv_lora_rank * ab),
            ("attn_out", "o_proj", [(h, a.n_heads * a.v_head_dim)], absorb_v + post_norm, h * ab),
        ]
    if a.kind == "linear":
        qkvz = 2 * a.lin_k_heads * a.lin_k_dim + 2 * a.lin_v_heads * a.lin_v_dim
        ba = 2 * a.lin_v_heads
        conv_ch = 2 * a.lin_k_heads * a.lin_k_dim + a.lin_v_heads * a.lin_v_dim
        core_params = conv_ch * a.conv_kernel + 2 * a.lin_v_heads + a.lin_v_dim
        v_width = a.lin_v_heads * a.lin_v_dim
        return [
            ("attn_in", "qkv_proj", [(qkvz + ba, h)], h, (qkvz + ba) * ab),
            ("attn_core", core_kind, [], core_params, v_width * ab),
            ("attn_out", "o_proj", [(h, v_width)], post_norm, h * ab),
        ]
    q_out = a.n_heads * a.head_dim * (2 if a.q_gate else 1)
    kv_out = 2 * a.n_kv_heads * a.head_dim
    bias = (q_out + kv_out) if a.bias else 0
    qk_norm = 2 * a.head_dim if a.qk_norm else 0
    return [
        ("attn_in", "qkv_proj", [(q_out + kv_out, h)], h + bias + qk_norm, (q_out + kv_out) * ab),
        ("attn_core", core_kind, [], a.n_heads if a.sinks else 0, a.n_heads * a.head_dim * ab),
        ("attn_out", "o_proj", [(h, a.n_heads * a.head_dim)], (h if a.bias else 0) + post_norm, h * ab),
    ]


def _mlp_ops(layer: LayerSpec, m: ModelSpec) -> list[tuple]:
    """(slot, kind, gemms, extra params, out bytes) of a layer's FFN or MoE."""
    f, h, ab = layer.mlp, m.hidden_size, m.act_bytes
    post_norm = h if m.norms_per_layer == 4 else 0  # Gemma's post-FFN norm
    if f.kind == "dense":
        return [
            ("ffn_up", "ffn_up", [(2 * f.intermediate, h)], h, f.intermediate * ab),
            ("ffn_down", "ffn_down", [(h, f.intermediate)], post_norm, h * ab),
        ]
    ops = [("router", "router", [(f.n_experts, h)], h + (f.n_experts if f.bias else 0),
            h * ab + f.top_k * 8)]
    if f.shared_intermediate:
        gate = h if f.shared_gate else 0
        ops.append(("shared_up", "shared_up", [(2 * f.shared_intermediate, h)], gate,
                    f.shared_intermediate * ab))
        ops.append(("shared_down", "shared_down", [(h, f.shared_intermediate)], 0, h * ab))
    up_bias = f.n_experts * 2 * f.expert_intermediate if f.bias else 0
    down_bias = f.n_experts * h if f.bias else 0
    ops.append(("ffn_up", "moe_up", [], up_bias, f.top_k * f.expert_intermediate * ab))
    ops.append(("ffn_down", "moe_down", [], down_bias + post_norm, h * ab))
    return ops


def _make_layer_ops(layer: LayerSpec, m: ModelSpec) -> list[Operator]:
    out = []
    a, f = layer.attention, layer.mlp
    for slot, kind, gemms, extra, out_bytes in _attention_ops(layer, m) + _mlp_ops(layer, m):
        gemm_params = sum(n * k for n, k in gemms)
        params = gemm_params + extra
        active = float(params)
        flops = 2.0 * gemm_params
        dtype_b, dtype = m.weight_bytes, m.weight_dtype
        ctx_flops = kv_tok = state = 0.0
        window = 0
        sharding = "tp"
        if kind == "router":
            dtype_b, dtype = m.act_bytes, m.act_dtype
        if kind in ("moe_up", "moe_down"):
            per_expert = 2 * f.expert_intermediate * m.hidden_size if kind == "moe_up" else (
                f.expert_intermediate * m.hidden_size)
            params = f.n_experts * per_expert + extra
            active = f.top_k * per_expert + extra * f.top_k / f.n_experts
            flops = 2.0 * f.top_k * per_expert
            dtype_b, dtype = m.expert_weight_bytes, m.expert_weight_dtype
            sharding = "experts"
        if kind in ATTENTION_CORE_KINDS:
            sharding = "tp"
            if a.kind in ("full", "sliding"):
                kv_tok = 2 * a.n_kv_heads * a.head_dim * m.kv_bytes
                ctx_flops = 4.0 * a.n_heads * a.head_dim
                window = a.window or 0
            elif a.kind == "mla":
                kv_tok = (a.kv_lora_rank + a.qk_rope_dim) * m.kv_bytes
                ctx_flops = 2.0 * a.n_heads * (2 * a.kv_lora_rank + a.qk_rope_dim)
            else:
                conv_ch = 2 * a.lin_k_heads * a.lin_k_dim + a.lin_v_heads * a.lin_v_dim
                state = (a.lin_v_heads * a.lin_k_dim * a.lin_v_dim + conv_ch * (a.conv_kernel - 1)) * m.kv_bytes
                flops = 6.0 * a.lin_v_heads * a.lin_k_dim * a.lin_v_dim + 2.0 * conv_ch * a.conv_kernel
        out.append(Operator(
            name=f"layers.{layer.index}.{kind}", kind=OpKind(kind), layer=layer.index, slot=SLOT[slot],
            params=int(params), active_params=active, weight_bytes=params * dtype_b, flops=flops,
            ctx_flops=ctx_flops, kv_bytes_per_token=kv_tok, kv_window=window, state_bytes=state,
            out_bytes=float(out_bytes), gemm=tuple(gemms), attention=a, mlp=f,
            weight_dtype_bytes=dtype_b, weight_dtype=dtype, sharding=sharding,
        ))
    return out


def _dependencies(ops: list[Operator], layer_input: int) -> list[tuple[int, int]]:
    """Data edges (producer index, consumer index) of one layer's operators."""
    by_kind = {op.kind: i for i, op in enumerate(ops)}
    edges: list[tuple[int, int]] = []
    core = next(i for i, op in enumerate(ops) if op.kind in ATTENTION_CORE_KINDS)
    first = 0
    edges.append((layer_input, first))
    if "mla_up" in by_kind:
        edges += [(first, by_kind["mla_up"]), (by_kind["mla_up"], core), (first, core)]
    else:
        edges.append((first, core))
    o = by_kind["o_proj"]
    edges += [(core, o), (layer_input, o)]
    last = len(ops) - 1
    if "router" in by_kind:
        r = by_kind["router"]
        edges += [(o, r), (r, by_kind["moe_up"]), (by_kind["moe_up"], by_kind["moe_down"])]
        if "shared_up" in by_kind:
            su, sd = by_kind["shared_up"], by_kind["shared_down"]
            edges += [(r, su), (su, sd), (sd, by_kind["moe_down"])]
    else:
        edges.append((o, by_kind["ffn_up"]))
        edges.append((by_kind["ffn_up"], by_kind["ffn_down"]))
    edges.append((o, last))  # residual into the layer's final add
    return edges


@cache
def build_sequence(model: ModelSpec) -> OperatorSequence:
    """Build the decode DAG with networkx and linearise it by (layer, slot) priority."""
    h, ab = model.hidden_size, model.act_bytes
    embed_params = model.vocab_size * h
    embed = Operator(
        name="embed", kind=OpKind.EMBED, layer=EMBED_LAYER, slot=0, params=embed_params,
        active_params=float(embed_params), weight_bytes=embed_params * ab, flops=0.0,
        out_bytes=h * ab, weight_dtype_bytes=ab, weight_dtype=model.act_dtype, sharding="vocab",
    )
    head_params = 0 if model.tie_embeddings else embed_params
    lm_head = Operator(
        name="lm_head", kind=OpKind.LM_HEAD, layer=model.n_layers, slot=0, params=head_params + h,
        active_params=float(head_params + h), weight_bytes=(embed_params + h) * ab,
        flops=2.0 * embed_params, out_bytes=4.0, gemm=((model.vocab_size, h),),
        weight_dtype_bytes=ab, weight_dtype=model.act_dtype, sharding="vocab",
    )
    graph = nx.DiGraph()
    nodes: list[Operator] = [embed]
    graph.add_node(0)
    prev_out = 0
    for layer in model.layers:
        layer_ops = _make_layer_ops(layer, model)
        base = len(nodes)
        nodes.extend(layer_ops)
        local_input = -1
        for u, v in _dependencies(layer_ops, local_input):
            graph.add_edge(prev_out if u == local_input else base + u, base + v)
        prev_out = base + len(layer_ops) - 1
    nodes.append(lm_head)
    graph.add_edge(prev_out, len(nodes) - 1)
    order = list(nx.lexicographical_topological_sort(
        graph, key=lambda i: (nodes[i].layer, nodes[i].slot, i)))
    pos = {node: p for p, node in enumerate(order)}
    ops = tuple(nodes[i] for i in order)
    # Bytes crossing a cut before position p: outputs produced before p consumed at or after p.
    n = len(ops)
    diff = [0.0] * (n + 1)
    for u in graph.nodes:
        consumers = [pos[v] for v in graph.successors(u)]
        if consumers:
            start, end = pos[u] + 1, max(consumers)
            if end >= start:
                diff[start] += nodes[u].out_bytes
                diff[end + 1] -= nodes[u].out_bytes
    payload = []
    running = 0.0
    for p in range(n):
        running += diff[p]
        payload.append(running)
    payload[0] = lm_head.out_bytes  # the cut before embed is the token hand-back
    return OperatorSequence(model=model, ops=ops, payload=tuple(payload))
