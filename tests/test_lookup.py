"""Operator-level latency lookup: every shipped model on every shipped GPU, sources, shards."""

from __future__ import annotations

import numpy as np
import pytest

from opweave_planner import api
from opweave_planner.data import shipped_dir
from opweave_planner.inputs.hardware import load_hardware
from opweave_planner.inputs.model import bundled_models, load_model
from opweave_planner.latency.lookup import (
    SOURCE_NAMES,
    Parallel,
    kv_shard,
    op_latencies,
    weight_shard,
)
from opweave_planner.structure.operators import build_sequence

PROFILES = shipped_dir("profiles")

SHIPPED = ("h100", "h200", "a100", "l40s")
GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@pytest.mark.parametrize("model", bundled_models())
def test_profiles_show_every_model_gpu_tp(model):
    for gpu in SHIPPED:
        for tp in (1, 2, 4, 8):
            info = api.profile_table(model, gpu, tp, "32k")
            for row in info["operators"]:
                lat = np.array(row["latency_us"])
                assert np.all(np.isfinite(lat)) and np.all(lat > 0), (model, gpu, tp, row)
                assert set(row["source"]) <= set(SOURCE_NAMES)
            assert info["decode_step_ms"] == sorted(info["decode_step_ms"])  # more requests never faster


def test_unprofiled_gpu_uses_fitted_roofline():
    info = api.profile_table("llama-3.1-8b", "b200", 1, "8k")
    assert all(s == "fitted" for r in info["operators"] for s in r["source"])
    assert "qkv_proj" in info["not_measured_kinds"]


@pytest.mark.parametrize("model", ["gemma-3-27b", "qwen3-next-80b-a3b", "deepseek-v3"])
def test_latency_monotone_in_batch_and_context(model):
    seq = build_sequence(load_model(model))
    g = load_hardware().resolve("h100")
    short = op_latencies(seq, g, Parallel(8), 4096, GRID)
    long = op_latencies(seq, g, Parallel(8), 65536, GRID)
    assert np.all(np.diff(short.lat_us, axis=1) >= -1e-9)
    assert np.all(long.lat_us >= short.lat_us - 1e-9)


def test_sliding_window_attention_stops_growing_past_its_window():
    seq = build_sequence(load_model("gemma-3-27b"))
    g = load_hardware().resolve("h100")
    idx = next(i for i, op in enumerate(seq.ops) if op.kind == "attn_sliding")
    full = next(i for i, op in enumerate(seq.ops) if op.kind == "attn_full")
    a = op_latencies(seq, g, Parallel(1), 8192, GRID)
    b = op_latencies(seq, g, Parallel(1), 65536, GRID)
    assert np.array_equal(a.lat_us[idx], b.lat_us[idx])
    assert np.all(b.lat_us[full] > a.lat_us[full])


def test_tensor_parallel_all_reduce_is_charged():
    seq = build_sequence(load_model("llama-3.1-70b"))
    g = load_hardware().resolve("h100")
    o = next(i for i, op in enumerate(seq.ops) if op.kind == "o_proj")
    tp1 = op_latencies(seq, g, Parallel(1), 8192, (64,)).lat_us[o, 0]
    tp8 = op_latencies(seq, g, Parallel(8), 8192, (64,)).lat_us[o, 0]
    assert tp8 > tp1 / 8  # the all-reduce keeps TP from scaling perfectly


def test_memory_shards():
    seq = build_sequence(load_model("qwen3-32b"))
    attn = next(op for op in seq.ops if op.kind == "attn_full")
    # 8 KV heads: split up to 8 ways, replicated beyond
    assert kv_shard(attn, 8, 1000) == kv_shard(attn, 16, 1000) == attn.kv_bytes(1000) / 8
    qkv = next(op for op in seq.ops if op.kind == "qkv_proj")
    assert weight_shard(qkv, 4) == qkv.weight_bytes / 4
    ds = build_sequence(load_model("deepseek-v3"))
    mla = next(op for op in ds.ops if op.kind == "attn_mla")
    assert kv_shard(mla, 8, 1000) == mla.kv_bytes(1000)  # latent cache replicated across TP


def test_kernel_shapes_for_the_profiler_match_the_lookup():
    from opweave_planner.latency.lookup import kernel_shapes

    seq = build_sequence(load_model("llama-3.1-8b"))
    gemms, attn = kernel_shapes(seq, 2)
    assert (6144 // 2, 4096) in gemms  # fused QKV, column parallel
    assert (4096, 4096 // 2) in gemms  # output projection, row parallel
    assert (4096, 14336 // 2) in gemms  # FFN down, row parallel
    assert attn == [(16, 4, 128, 0)]
    _, gemma_attn = kernel_shapes(build_sequence(load_model("gemma-3-27b")), 1)
    assert sorted(gemma_attn) == [(32, 16, 128, 0), (32, 16, 128, 1024)]


def test_kv_heads_replicate_past_their_count_in_qkv_width_weights_and_cache():
    """vLLM's rule: each rank keeps max(1, n_kv // tp) KV heads (Qwen3-235B-A22B: 4 KV heads)."""
    from opweave_planner.latency.lookup import kv_heads_per_rank, sharded_attention, sharded_gemms

    seq = build_sequence(load_model("qwen3-235b-a22b"))
    qkv = next(op for op in seq.ops if op.kind == "qkv_proj")
    attn = next(op for op in seq.ops if op.kind == "attn_full")
    a = qkv.attention
    assert (a.n_heads, a.n_kv_heads, a.head_dim) == (64, 4, 128)
    assert kv_heads_per_rank(4, 2) == 2 and kv_heads_per_rank(4, 8) == 1
    (n, k), = sharded_gemms(qkv, 8)
    assert n == (64 // 8 + 2 * 1) * 128 and k == qkv.gemm[0][1]  # not (64 + 8) * 128 / 8
    assert weight_shard(qkv, 8) == pytest.approx(qkv.weight_bytes * 1280 / 9216)
    assert sharded_attention(attn, 8) == (8, 1, 128)
    assert kv_shard(attn, 8, 4096) == pytest.approx(attn.kv_bytes(4096) / 4)


def test_embedding_all_reduce_and_elementwise_kernel_floor():
    seq = build_sequence(load_model("qwen3-32b"))
    g = load_hardware().resolve("a100")
    emb = next(i for i, op in enumerate(seq.ops) if op.kind == "embed")
    one = op_latencies(seq, g, Parallel(1), 8192, (1,))
    eight = op_latencies(seq, g, Parallel(8), 8192, (1,))
    # TP 1: the gather alone, at the measured kernel floor; TP 8 adds the vocab-parallel all-reduce
    assert one.lat_us[emb, 0] == pytest.approx(g.kernel_floor_us)
    assert eight.lat_us[emb, 0] > one.lat_us[emb, 0] + 4.0


def test_moe_routing_families():
    from opweave_planner.errors import UserError
    from opweave_planner.latency import interp
    from opweave_planner.latency.tables import load_profile_set

    ps = load_profile_set(PROFILES, "h100")
    args = ([16.0, 256.0], 2048, 768, 8, 128, 1, 1, "bfloat16")
    bal, _ = interp.moe(ps, *args, routing="balanced")
    pl, _ = interp.moe(ps, *args, routing="power-law")
    assert bal[0] > 1.4 * pl[0]  # skewed load touches fewer experts at few tokens
    assert bal[1] == pytest.approx(pl[1], rel=0.1)
    assert interp.DEFAULT_MOE_ROUTING == "power-law"
    with pytest.raises(UserError, match="--moe-routing"):
        interp.moe(ps, *args, routing="uniform")
    seq = build_sequence(load_model("qwen3-30b-a3b"))
    g = load_hardware().resolve("h100")
    up = next(i for i, op in enumerate(seq.ops) if op.kind == "moe_up")
    a = op_latencies(seq, g, Parallel(1), 8192, (16,), moe_routing="balanced").lat_us[up, 0]
    b = op_latencies(seq, g, Parallel(1), 8192, (16,), moe_routing="power-law").lat_us[up, 0]
    assert a > b
