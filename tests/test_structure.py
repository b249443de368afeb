"""Operator sequence, partition blocks and cyclic templates."""

from __future__ import annotations

from math import comb

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opweave_planner.inputs.model import load_model
from opweave_planner.structure.blocks import detect_blocks
from opweave_planner.structure.operators import SLOT, build_sequence
from opweave_planner.structure.templates import (
    Template,
    boundary_payload,
    count_templates,
    enumerate_templates,
    expand,
    subblock_keys,
)


def seq_of(name):
    return build_sequence(load_model(name))


def test_linear_order_is_a_topological_order_with_ends():
    seq = seq_of("qwen3-next-80b-a3b")
    assert seq.ops[0].kind == "embed" and seq.ops[-1].kind == "lm_head"
    layers = [op.layer for op in seq.ops]
    assert layers == sorted(layers)
    kinds = {op.kind for op in seq.ops}
    assert {"qkv_proj", "attn_linear", "attn_full", "o_proj", "router", "shared_up",
            "shared_down", "moe_up", "moe_down"} <= kinds


@pytest.mark.parametrize("name, prefix, block, full, tail", [
    ("gemma-3-27b", 0, 6, 10, 2),
    ("gemma-3-12b", 0, 6, 8, 0),
    ("qwen3-next-80b-a3b", 0, 4, 12, 0),
    ("gpt-oss-120b", 0, 2, 18, 0),
    ("llama-3.1-70b", 0, 1, 80, 0),
    ("qwen3-32b", 0, 1, 64, 0),
    ("deepseek-v3", 3, 1, 58, 0),
])
def test_partition_blocks(name, prefix, block, full, tail):
    b = detect_blocks(seq_of(name))
    assert (b.prefix_layers, b.block_layers, b.full_blocks, b.tail_layers) == (prefix, block, full, tail)


def test_subblocks_share_structure_across_attention_kinds():
    assert detect_blocks(seq_of("gemma-3-27b")).subblocks == (1, 2, 3, 6)
    assert detect_blocks(seq_of("qwen3-next-80b-a3b")).subblocks == (1, 2, 4)


@given(n=st.integers(1, 14), k=st.integers(1, 3))
@settings(max_examples=40, deadline=None)
def test_template_count_is_n_choose_k(n, k):
    temps = list(enumerate_templates(1, n, k))
    assert len(temps) == count_templates(n, k) == comb(n, k)
    assert len(set(temps)) == len(temps)


def _cut(seq, lsub, *slots):
    keys = subblock_keys(seq, detect_blocks(seq), lsub)
    return Template(lsub, tuple(sorted(keys.index((0, SLOT[s])) for s in slots)))


@pytest.mark.parametrize("name, stages", [("gemma-3-27b", 124), ("qwen3-next-80b-a3b", 96)])
def test_afd_and_cad_are_two_stage_templates(name, stages):
    seq = seq_of(name)
    ffn_slot = "router" if any(op.kind == "router" for op in seq.ops) else "ffn_up"
    afd = expand(seq, _cut(seq, 1, "attn_in", ffn_slot))
    cad = expand(seq, _cut(seq, 1, "attn_core", "attn_out"))
    assert afd.n_stages == cad.n_stages == stages
    # CAD: the core-attention owner holds exactly the core attention operators
    core_owner_ops = [seq.ops[i].kind for j, o in enumerate(cad.owner) for i in cad.ops[j] if o == cad.owner[1]]
    assert all(k.startswith("attn_") for k in core_owner_ops)
    colo = expand(seq, Template(1, (0,)))
    assert colo.n_stages == 1


@pytest.mark.parametrize("name", ["gemma-3-27b", "deepseek-v3", "qwen3-next-80b-a3b", "gpt-oss-120b"])
@given(data=st.data())
@settings(max_examples=25, deadline=None)
def test_every_expansion_covers_each_operator_once(name, data):
    seq = seq_of(name)
    b = detect_blocks(seq)
    lsub = data.draw(st.sampled_from(b.subblocks))
    n = b.ops_per_subblock[lsub]
    k = data.draw(st.integers(1, min(3, n)))
    cuts = tuple(sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=k, max_size=k))))
    plan = expand(seq, Template(lsub, cuts))
    flat = [i for ops in plan.ops for i in ops]
    assert sorted(flat) == list(range(seq.n))
    # adjacent stages around the loop never share an owner (unless there is a single stage)
    s = plan.n_stages
    assert s == 1 or all(plan.owner[j] != plan.owner[(j + 1) % s] for j in range(s))
    assert len(boundary_payload(seq, plan)) == s


def _expand_by_definition(seq, template):
    """The expansion as the module docstring states it, operator by operator (the oracle of the
    vectorised `expand`): stage number = repetition x K + the cuts at or before the operator's
    (layer offset, slot); embed joins the first layer's stage, lm_head the one before it; owner
    (g - 1) mod K; runs of one owner merged around the loop; stage 0 holds embed."""
    b = detect_blocks(seq)
    keys = subblock_keys(seq, b, template.lsub)
    cut_keys = [keys[c] for c in template.cuts]
    k, first = template.k, b.prefix_layers
    numbers = []
    for op in seq.ops:
        if op.kind == "embed":
            numbers.append(None)
        elif op.kind == "lm_head":
            numbers.append(numbers[-1])
        else:
            rep, offset = divmod(op.layer - first, template.lsub)
            numbers.append(rep * k + sum(c <= (offset, op.slot) for c in cut_keys))
    numbers[0] = numbers[1]
    owners = [(g - 1) % k for g in numbers]
    n = seq.n
    starts = [i for i in range(n) if owners[i] != owners[i - 1]]
    if not starts:
        return (0,), ((*range(n),),)
    ops = [tuple(range(a, e)) if e > a else tuple(range(a, n)) + tuple(range(e))
           for a, e in zip(starts, starts[1:] + starts[:1], strict=True)]
    own = [owners[a] for a in starts]
    z = next(i for i, o in enumerate(ops) if 0 in o)
    return tuple(own[z:] + own[:z]), tuple(ops[z:] + ops[:z])


@pytest.mark.parametrize("name", ["gemma-3-27b", "deepseek-v3", "gpt-oss-120b", "qwen3-next-80b-a3b"])
def test_expand_matches_its_definition(name):
    """Every template of up to 3 owners (a sample of the larger sets), compared with the oracle."""
    seq = seq_of(name)
    b = detect_blocks(seq)
    for lsub in b.subblocks:
        n = b.ops_per_subblock[lsub]
        tmpls = [t for k in range(1, min(3, n) + 1) for t in enumerate_templates(lsub, n, k)]
        for t in tmpls[:: max(1, len(tmpls) // 400)]:
            plan = expand(seq, t)
            assert (plan.owner, plan.ops) == _expand_by_definition(seq, t), t
            assert plan.start == tuple(ops[0] for ops in plan.ops)
            assert all(e == (ops[-1] + 1) % seq.n for e, ops in zip(plan.end, plan.ops, strict=True))


def test_gemma_block_template_handles_truncated_tail():
    seq = seq_of("gemma-3-27b")
    # cuts before layers 0 and 3 of each block: the 2 tail layers belong to the first
    # stage position, which wraps into layer 0 (same owner), so they merge: 10 x 2 = 20
    assert expand(seq, Template(6, (0, 15))).n_stages == 20
    # cuts before layers 0 and 1: tail layer 60 is owner 0, layer 61 owner 1, then the
    # loop returns to owner 0: 10 x 2 + 2 = 22
    plan = expand(seq, Template(6, (0, 5)))
    assert plan.n_stages == 22
    assert sorted(i for ops in plan.ops for i in ops) == list(range(seq.n))


def test_payload_includes_residual_stream():
    seq = seq_of("gemma-3-27b")
    h = 5376 * 2
    idx = {op.name: i for i, op in enumerate(seq.ops)}
    assert seq.payload[idx["layers.3.o_proj"]] == 32 * 128 * 2 + h  # attention output + residual
    assert seq.payload[idx["layers.3.qkv_proj"]] == h  # a layer boundary carries the hidden state
    assert seq.payload[0] == 4  # the token hand-back
