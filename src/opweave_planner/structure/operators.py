"""The decode-step operator DAG of a model, reduced to its linear execution order.

Each operator carries what later stages need: its weights, FLOPs, the KV or
recurrent state it keeps per request, and the bytes of the tensor it emits.
Stage-boundary payloads are derived from the DAG (every tensor produced before
a cut and consumed after it crosses), so the residual stream is never forgotten.
What depends on an operator's kind (its AFD side, sharding, KV rule, kernel model,
fused passes, all-reduce) is one row of `TRAITS`, so no other module names kinds.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from functools import cache

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
    """What an operator computes; everything that depends on it is read from its `TRAITS` row."""

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


class Side(StrEnum):
    """Where attention-FFN disaggregation runs an operator (OTHER: embedding and LM head, which
    stay with the requests, i.e. on the attention instances)."""

    ATTENTION = "attention"
    FFN = "ffn"
    OTHER = "other"


class Shard(StrEnum):
    """How a TP group divides an operator's weights and GEMMs (`lookup.sharded_gemms`, `weight_shard`)."""

    COLUMN = "column"  # output features split (vocab-parallel LM head too)
    ROW = "row"  # input features split: a row-parallel projection
    QKV = "qkv"  # query share plus whole, possibly replicated, KV heads (softmax attention; else COLUMN)
    REPLICATED = "replicated"  # small or latent-shared weights every rank keeps
    EVEN = "even"  # no GEMM of its own: weights split evenly (vocab rows, experts, attention heads)


class KvRule(StrEnum):
    """How a TP group divides an operator's KV cache or recurrent state (`lookup.kv_shard`)."""

    NONE = "none"  # keeps none
    HEADS = "heads"  # softmax KV: kv_heads_per_rank heads per GPU
    LATENT = "latent"  # MLA's latent cache is shared by all heads: replicated
    STATE = "state"  # linear attention's state: split over min(TP, value heads)


class Kernel(StrEnum):
    """Which kernel model costs the operator (`lookup` dispatches on it)."""

    GATHER = "gather"  # the embedding lookup: its elementwise pass only
    GEMM = "gemm"  # the dense GEMMs of `Operator.gemm`
    ATTENTION = "attention"  # softmax decode attention
    STATE = "state"  # a memory pass over the recurrent state
    LATENT = "latent"  # a memory pass over the latent cache
    FUSED_MOE_UP = "fused_moe_up"  # the fused MoE's gate+up share
    FUSED_MOE_DOWN = "fused_moe_down"  # the fused MoE's down share


class Passes(StrEnum):
    """The small elementwise kernels fused next to an operator (`lookup.elementwise_bytes`)."""

    NONE = "none"  # fused into its own kernel
    GATHER = "gather"  # write the gathered hidden state
    OPEN_ATTENTION = "open_attention"  # residual add + norm; rotary and KV write for softmax QKV
    CLOSE_ATTENTION = "close_attention"  # Gemma's post-norm, then the pre-MLP add + norm
    ACTIVATION = "activation"  # SiLU-and-mul of a gated up projection
    CLOSE_FFN = "close_ffn"  # Gemma's post-FFN norm
    FINAL_NORM = "final_norm"  # the final norm, joined to the LM head


CORE_KERNELS = (Kernel.ATTENTION, Kernel.STATE, Kernel.LATENT)
MOE_KERNELS = (Kernel.FUSED_MOE_UP, Kernel.FUSED_MOE_DOWN)


@dataclass(frozen=True)
class Traits:
    """What the rest of the planner needs to know about one operator kind."""

    side: Side
    kernel: Kernel
    passes: Passes = Passes.NONE
    shard: Shard = Shard.COLUMN
    kv: KvRule = KvRule.NONE
    allreduce_after: bool = False  # closes a TP partial sum (embed: vocab-parallel)

    @property
    def core(self) -> bool:
        """The attention core: context-dependent work, no GEMM."""
        return self.kernel in CORE_KERNELS

    @property
    def experts(self) -> bool:
        return self.kernel in MOE_KERNELS

    @property
    def gemm_work(self) -> bool:
        """Its parameters are multiplied by every token (P_act): not the gather nor the core."""
        return self.kernel == Kernel.GEMM or self.experts


_A, _F, _O = Side.ATTENTION, Side.FFN, Side.OTHER
TRAITS: dict[OpKind, Traits] = {
    OpKind.EMBED: Traits(_O, Kernel.GATHER, Passes.GATHER, Shard.EVEN, allreduce_after=True),
    OpKind.LM_HEAD: Traits(_O, Kernel.GEMM, Passes.FINAL_NORM),
    OpKind.QKV_PROJ: Traits(_A, Kernel.GEMM, Passes.OPEN_ATTENTION, Shard.QKV),
    OpKind.MLA_DOWN: Traits(_A, Kernel.GEMM, Passes.OPEN_ATTENTION, Shard.REPLICATED),
    OpKind.MLA_UP: Traits(_A, Kernel.GEMM),
    OpKind.ATTN_FULL: Traits(_A, Kernel.ATTENTION, shard=Shard.EVEN, kv=KvRule.HEADS),
    OpKind.ATTN_SLIDING: Traits(_A, Kernel.ATTENTION, shard=Shard.EVEN, kv=KvRule.HEADS),
    OpKind.ATTN_LINEAR: Traits(_A, Kernel.STATE, shard=Shard.EVEN, kv=KvRule.STATE),
    OpKind.ATTN_MLA: Traits(_A, Kernel.LATENT, shard=Shard.EVEN, kv=KvRule.LATENT),
    OpKind.O_PROJ: Traits(_A, Kernel.GEMM, Passes.CLOSE_ATTENTION, Shard.ROW, allreduce_after=True),
    OpKind.ROUTER: Traits(_F, Kernel.GEMM, shard=Shard.REPLICATED),
    OpKind.SHARED_UP: Traits(_F, Kernel.GEMM, Passes.ACTIVATION),
    OpKind.SHARED_DOWN: Traits(_F, Kernel.GEMM, shard=Shard.ROW),
    OpKind.MOE_UP: Traits(_F, Kernel.FUSED_MOE_UP, shard=Shard.EVEN),
    OpKind.MOE_DOWN: Traits(_F, Kernel.FUSED_MOE_DOWN, Passes.CLOSE_FFN, Shard.EVEN, allreduce_after=True),
    OpKind.FFN_UP: Traits(_F, Kernel.GEMM, Passes.ACTIVATION),
    OpKind.FFN_DOWN: Traits(_F, Kernel.GEMM, Passes.CLOSE_FFN, Shard.ROW, allreduce_after=True),
}
"""One row per kind: adding a kind is its enum member, this row and the builder that emits it."""

SLOTS = tuple(s.name.lower() for s in Slot)
SLOT = {s.name.lower(): int(s) for s in Slot}
EMBED_LAYER = -1


def operator_side(name: str) -> Side:
    """The AFD side of an operator by its plan name ('layers.3.o_proj', 'embed'); OTHER for a
    name of no known kind (a plan file is read as it is)."""
    kind = _KIND_OF.get(name.rsplit(".", 1)[-1])
    return Side.OTHER if kind is None else TRAITS[kind].side


_KIND_OF = {k.value: k for k in OpKind}


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
    context_flops: float = 0.0  # FLOPs per request per attended context token
    kv_bytes_per_token: float = 0.0  # cache bytes per request per context token
    kv_window: int = 0  # 0: unbounded; else cache stops growing at this many tokens
    state_bytes: float = 0.0  # fixed recurrent state per request
    out_bytes: float = 0.0  # bytes per request of the tensor this operator emits
    gemm: tuple[tuple[int, int], ...] = ()  # (n, k) of dense GEMMs per token row
    attention: AttentionSpec | None = None
    mlp: MlpSpec | None = None
    weight_dtype_bytes: float = 2.0
    weight_dtype: str = "bfloat16"  # storage format by name (picks the kernel table)

    @property
    def traits(self) -> Traits:
        return TRAITS[self.kind]

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


_CORE_KIND = {"full": OpKind.ATTN_FULL, "sliding": OpKind.ATTN_SLIDING, "linear": OpKind.ATTN_LINEAR,
              "mla": OpKind.ATTN_MLA}  # AttentionSpec.kind -> the core operator's kind


def _attention_ops(layer: LayerSpec, m: ModelSpec) -> list[tuple]:
    """(slot, kind, gemms, extra params, out bytes) of a layer's attention module."""
    a, h, ab = layer.attention, m.hidden_size, m.act_bytes
    post_norm = h if m.norms_per_layer == 4 else 0  # Gemma's post-attention norm
    core_kind = _CORE_KIND[a.kind]
    if a.kind == "mla":
        down_n = a.q_lora_rank + a.kv_lora_rank + a.qk_rope_dim
        absorb_k = a.kv_lora_rank * a.n_heads * a.qk_nope_dim  # kv_b rows used for keys
        absorb_v = a.kv_lora_rank * a.n_heads * a.v_head_dim  # kv_b rows used for values
        return [
            (Slot.ATTN_IN, OpKind.MLA_DOWN, [(down_n, h)], h + a.q_lora_rank + a.kv_lora_rank, down_n * ab),
            (Slot.ATTN_IN2, OpKind.MLA_UP, [(a.n_heads * a.head_dim, a.q_lora_rank)], absorb_k,
             a.n_heads * (a.kv_lora_rank + a.qk_rope_dim) * ab),
            (Slot.ATTN_CORE, core_kind, [], 0, a.n_heads * a.kv_lora_rank * ab),
            (Slot.ATTN_OUT, OpKind.O_PROJ, [(h, a.n_heads * a.v_head_dim)], absorb_v + post_norm, h * ab),
        ]
    if a.kind == "linear":
        qkvz = 2 * a.lin_k_heads * a.lin_k_dim + 2 * a.lin_v_heads * a.lin_v_dim
        ba = 2 * a.lin_v_heads
        conv_ch = 2 * a.lin_k_heads * a.lin_k_dim + a.lin_v_heads * a.lin_v_dim
        core_params = conv_ch * a.conv_kernel + 2 * a.lin_v_heads + a.lin_v_dim
        v_width = a.lin_v_heads * a.lin_v_dim
        return [
            (Slot.ATTN_IN, OpKind.QKV_PROJ, [(qkvz + ba, h)], h, (qkvz + ba) * ab),
            (Slot.ATTN_CORE, core_kind, [], core_params, v_width * ab),
            (Slot.ATTN_OUT, OpKind.O_PROJ, [(h, v_width)], post_norm, h * ab),
        ]
    q_out = a.n_heads * a.head_dim * (2 if a.q_gate else 1)
    kv_out = 2 * a.n_kv_heads * a.head_dim
    bias = (q_out + kv_out) if a.bias else 0
    qk_norm = 2 * a.head_dim if a.qk_norm else 0
    return [
        (Slot.ATTN_IN, OpKind.QKV_PROJ, [(q_out + kv_out, h)], h + bias + qk_norm, (q_out + kv_out) * ab),
        (Slot.ATTN_CORE, core_kind, [], a.n_heads if a.sinks else 0, a.n_heads * a.head_dim * ab),
        (Slot.ATTN_OUT, OpKind.O_PROJ, [(h, a.n_heads * a.head_dim)], (h if a.bias else 0) + post_norm, h * ab),
    ]


def _mlp_ops(layer: LayerSpec, m: ModelSpec) -> list[tuple]:
    """(slot, kind, gemms, extra params, out bytes) of a layer's FFN or MoE."""
    f, h, ab = layer.mlp, m.hidden_size, m.act_bytes
    post_norm = h if m.norms_per_layer == 4 else 0  # Gemma's post-FFN norm
    if f.kind == "dense":
        return [
            (Slot.FFN_UP, OpKind.FFN_UP, [(2 * f.intermediate, h)], h, f.intermediate * ab),
            (Slot.FFN_DOWN, OpKind.FFN_DOWN, [(h, f.intermediate)], post_norm, h * ab),
        ]
    ops = [(Slot.ROUTER, OpKind.ROUTER, [(f.n_experts, h)], h + (f.n_experts if f.bias else 0),
            h * ab + f.top_k * 8)]
    if f.shared_intermediate:
        gate = h if f.shared_gate else 0
        ops.append((Slot.SHARED_UP, OpKind.SHARED_UP, [(2 * f.shared_intermediate, h)], gate,
                    f.shared_intermediate * ab))
        ops.append((Slot.SHARED_DOWN, OpKind.SHARED_DOWN, [(h, f.shared_intermediate)], 0, h * ab))
    up_bias = f.n_experts * 2 * f.expert_intermediate if f.bias else 0
    down_bias = f.n_experts * h if f.bias else 0
    ops.append((Slot.FFN_UP, OpKind.MOE_UP, [], up_bias, f.top_k * f.expert_intermediate * ab))
    ops.append((Slot.FFN_DOWN, OpKind.MOE_DOWN, [], down_bias + post_norm, h * ab))
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
        context_flops = kv_tok = state = 0.0
        window = 0
        traits = TRAITS[kind]
        if kind == OpKind.ROUTER:  # routing logits stay in the activation format
            dtype_b, dtype = m.act_bytes, m.act_dtype
        if traits.experts:
            per_expert = 2 * f.expert_intermediate * m.hidden_size if kind == OpKind.MOE_UP else (
                f.expert_intermediate * m.hidden_size)
            params = f.n_experts * per_expert + extra
            active = f.top_k * per_expert + extra * f.top_k / f.n_experts
            flops = 2.0 * f.top_k * per_expert
            dtype_b, dtype = m.expert_weight_bytes, m.expert_weight_dtype
        if traits.core:
            if a.kind in ("full", "sliding"):
                kv_tok = 2 * a.n_kv_heads * a.head_dim * m.kv_bytes
                context_flops = 4.0 * a.n_heads * a.head_dim
                window = a.window or 0
            elif a.kind == "mla":
                kv_tok = (a.kv_lora_rank + a.qk_rope_dim) * m.kv_bytes
                context_flops = 2.0 * a.n_heads * (2 * a.kv_lora_rank + a.qk_rope_dim)
            else:
                conv_ch = 2 * a.lin_k_heads * a.lin_k_dim + a.lin_v_heads * a.lin_v_dim
                state = (a.lin_v_heads * a.lin_k_dim * a.lin_v_dim + conv_ch * (a.conv_kernel - 1)) * m.kv_bytes
                flops = 6.0 * a.lin_v_heads * a.lin_k_dim * a.lin_v_dim + 2.0 * conv_ch * a.conv_kernel
        out.append(Operator(
            name=f"layers.{layer.index}.{kind}", kind=kind, layer=layer.index, slot=int(slot),
            params=int(params), active_params=active, weight_bytes=params * dtype_b, flops=flops,
            context_flops=context_flops, kv_bytes_per_token=kv_tok, kv_window=window, state_bytes=state,
            out_bytes=float(out_bytes), gemm=tuple(gemms), attention=a, mlp=f,
            weight_dtype_bytes=dtype_b, weight_dtype=dtype,
        ))
    return out


def _dependencies(ops: list[Operator], layer_input: int) -> list[tuple[int, int]]:
    """Data edges (producer index, consumer index) of one layer's operators."""
    by_kind = {op.kind: i for i, op in enumerate(ops)}
    edges: list[tuple[int, int]] = []
    core = next(i for i, op in enumerate(ops) if op.traits.core)
    first = 0
    edges.append((layer_input, first))
    if OpKind.MLA_UP in by_kind:
        edges += [(first, by_kind[OpKind.MLA_UP]), (by_kind[OpKind.MLA_UP], core), (first, core)]
    else:
        edges.append((first, core))
    o = by_kind[OpKind.O_PROJ]
    edges += [(core, o), (layer_input, o)]
    last = len(ops) - 1
    if OpKind.ROUTER in by_kind:
        r, up, down = by_kind[OpKind.ROUTER], by_kind[OpKind.MOE_UP], by_kind[OpKind.MOE_DOWN]
        edges += [(o, r), (r, up), (up, down)]
        if OpKind.SHARED_UP in by_kind:
            su, sd = by_kind[OpKind.SHARED_UP], by_kind[OpKind.SHARED_DOWN]
            edges += [(r, su), (su, sd), (sd, down)]
    else:
        edges.append((o, by_kind[OpKind.FFN_UP]))
        edges.append((by_kind[OpKind.FFN_UP], by_kind[OpKind.FFN_DOWN]))
    edges.append((o, last))  # residual into the layer's final add
    return edges


def _lexicographic_order(succ: dict[int, dict[int, None]], key) -> list[int]:
    """The DAG's topological order that always takes the least `key` among the ready nodes (keys
    are unique, so the order is too: networkx's lexicographical_topological_sort, whose import
    alone was 0.19 s CPU of a small plan)."""
    indegree = dict.fromkeys(succ, 0)
    for children in succ.values():
        for v in children:
            indegree[v] += 1
    ready = [(key(v), v) for v, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, u = heapq.heappop(ready)
        order.append(u)
        for v in succ[u]:
            indegree[v] -= 1
            if indegree[v] == 0:
                heapq.heappush(ready, (key(v), v))
    if len(order) != len(succ):
        raise ValueError("the operator graph has a cycle")
    return order


@cache
def build_sequence(model: ModelSpec) -> OperatorSequence:
    """Build the decode DAG (node -> its consumers, in insertion order) and linearise it by
    (layer, slot) priority."""
    h, ab = model.hidden_size, model.act_bytes
    embed_params = model.vocab_size * h
    embed = Operator(
        name=OpKind.EMBED.value, kind=OpKind.EMBED, layer=EMBED_LAYER, slot=0, params=embed_params,
        active_params=float(embed_params), weight_bytes=embed_params * ab, flops=0.0,
        out_bytes=h * ab, weight_dtype_bytes=ab, weight_dtype=model.act_dtype,
    )
    head_params = 0 if model.tie_embeddings else embed_params
    lm_head = Operator(
        name=OpKind.LM_HEAD.value, kind=OpKind.LM_HEAD, layer=model.n_layers, slot=0, params=head_params + h,
        active_params=float(head_params + h), weight_bytes=(embed_params + h) * ab,
        flops=2.0 * embed_params, out_bytes=4.0, gemm=((model.vocab_size, h),),
        weight_dtype_bytes=ab, weight_dtype=model.act_dtype,
    )
    succ: dict[int, dict[int, None]] = {0: {}}

    def edge(u: int, v: int) -> None:
        succ.setdefault(u, {})[v] = None
        succ.setdefault(v, {})

    nodes: list[Operator] = [embed]
    prev_out = 0
    for layer in model.layers:
        layer_ops = _make_layer_ops(layer, model)
        base = len(nodes)
        nodes.extend(layer_ops)
        local_input = -1
        for u, v in _dependencies(layer_ops, local_input):
            edge(prev_out if u == local_input else base + u, base + v)
        prev_out = base + len(layer_ops) - 1
    nodes.append(lm_head)
    edge(prev_out, len(nodes) - 1)
    order = _lexicographic_order(succ, key=lambda i: (nodes[i].layer, nodes[i].slot, i))
    pos = {node: p for p, node in enumerate(order)}
    ops = tuple(nodes[i] for i in order)
    # Bytes crossing a cut before position p: outputs produced before p consumed at or after p.
    n = len(ops)
    diff = [0.0] * (n + 1)
    for u, children in succ.items():
        consumers = [pos[v] for v in children]
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
