"""Memory budget and fixed costs come from the one GPU description (profiles' system.json)."""

from __future__ import annotations

import pytest

from opweave_planner.data import shipped_dir
from opweave_planner.inputs.hardware import GIB, load_hardware
from opweave_planner.inputs.model import load_model
from opweave_planner.latency import memory as M
from opweave_planner.latency.interp import decode_attention
from opweave_planner.latency.lookup import Parallel, op_latencies
from opweave_planner.latency.tables import load_profile_set
from opweave_planner.structure.operators import build_sequence


def test_capacity_is_the_profiles_measured_memory():
    hw = load_hardware()
    l40s = hw.resolve("l40s")
    spec = load_profile_set(shipped_dir("profiles"), "l40s").system
    assert l40s.memory_bytes == spec.memory_bytes == 46068 * 2**20
    assert l40s.facts == "profiles/l40s/system.json"


def test_usable_bytes_rule_and_nccl_from_system_json():
    g = load_hardware().resolve("h100")
    spec = load_profile_set(shipped_dir("profiles"), "h100").system
    for tp in (1, 2, 4, 8):
        want = 80 * GIB * 0.9 - spec.other_memory_bytes - spec.nccl_memory_bytes[str(tp)]
        assert M.usable_bytes(g, tp) == pytest.approx(want)
    assert M.nccl_bytes(g, 16) == spec.nccl_memory_bytes["8"]  # largest listed size below
    assert M.usable_bytes(g, 8, utilization=1.0, reserve_gb=0) == 80 * GIB - spec.nccl_memory_bytes["8"]
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        M.usable_bytes(g, 1, utilization=1.5)


def test_fixed_costs_are_measured_per_gpu():
    hw = load_hardware()
    h100, a100 = M.fixed_costs(hw.resolve("h100")), M.fixed_costs(hw.resolve("a100"))
    assert 1.0 < h100.kernel_floor_us < 5.0 and 3.0 < h100.transfer_fixed_us < 15.0
    assert a100.transfer_fixed_us > h100.transfer_fixed_us  # A100's NCCL calls measure slower
    assert M.fixed_costs(hw.resolve("b200")).kernel_floor_us > 0  # catalog default


def test_catalog_override_reaches_every_cost_path(tmp_path):
    """A --catalog bandwidth override changes the roofline, the tables' SOL floor and memory alike."""
    cat = tmp_path / "cat.toml"
    cat.write_text("[gpus.h100]\nbandwidth_gbps = 1000\nmemory_gb = 40\n")
    base, slow = load_hardware().resolve("h100"), load_hardware(str(cat)).resolve("h100")
    assert slow.bf16_tflops == base.bf16_tflops and slow.price_per_hour == base.price_per_hour
    assert M.usable_bytes(slow, 1) < M.usable_bytes(base, 1)
    seq = build_sequence(load_model("llama-3.1-8b"))
    fast_lat = op_latencies(seq, base, Parallel(1), 32768, (64,))
    slow_lat = op_latencies(seq, slow, Parallel(1), 32768, (64,))
    attn = next(i for i, op in enumerate(seq.ops) if op.kind == "attn_full")
    # attention at 64 x 32k streams 4 GiB of KV: the override's floor (4.3 ms) binds
    assert slow_lat.lat_us[attn, 0] > 2 * fast_lat.lat_us[attn, 0]
    ps = load_profile_set(shipped_dir("profiles"), "h100").with_system(slow.system_updates())
    val, _ = decode_attention(ps, 64, 32, 8, 128, 32768)
    assert val[()] == pytest.approx(slow_lat.lat_us[attn, 0], rel=1e-9)
