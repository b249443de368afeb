"""Profiler pipeline: shapes -> runner -> our format, with a fake runner (no torch needed)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from opweave_planner.errors import UserError
from opweave_planner.latency import interp as I
from opweave_planner.latency.profiler import ProfilePlan, TorchRunner, parse_shapes, run_profile
from opweave_planner.latency.tables import load_profile_set


class FakeRunner:
    def __init__(self):
        self.calls = []

    def gemm(self, m, n, k, dtype):
        self.calls.append(("gemm", m, n, k))
        return 2.0 + 2 * m * n * k / 1e8

    def attention(self, batch, n_heads, n_kv_heads, head_dim, kv_len, window, kv_dtype):
        self.calls.append(("attention", batch, kv_len))
        return 5.0 + batch * min(kv_len, window or kv_len) * n_kv_heads * head_dim * 4 / 1e6

    def allreduce(self, n_gpus, message_bytes):
        return 4.0 + message_bytes / 1e5

    def system_facts(self):
        return {
            "device": "Fake GPU",
            "memory_bytes": 2**34,
            "memory_bandwidth_gbps": 1000.0,
            "peak_tflops": {"bfloat16": 100.0},
            "gpus_per_node": 2,
            "intra_node_bandwidth_gbps": 100.0,
            "inter_node_bandwidth_gbps": 10.0,
        }


PLAN = ProfilePlan(
    gemm_shapes=((64, 32), (128, 64)),
    m_values=(1, 4, 16),
    attention_shapes=((4, 2, 16, 0), (4, 2, 16, 64)),
    batches=(1, 2, 8),
    kv_lens=(16, 64, 256),
    allreduce_gpus=(2,),
    message_bytes=(1024, 4096),
    max_kv_bytes=8 * 256 * 2 * 2 * 16 * 2 - 1,
)


def test_pipeline_with_fake_runner(tmp_path):
    runner = FakeRunner()
    lines = []
    written = run_profile(PLAN, runner, tmp_path, "fake", progress=lines.append)
    assert [p.name for p in written] == [
        "system.json",
        "gemm.json",
        "attention.json",
        "allreduce.json",
    ]
    assert len(lines) == 3
    # the (8 x 256) cells exceed max_kv_bytes and are skipped
    assert sum(c[0] == "attention" for c in runner.calls) == 2 * 9 - 2
    ps = load_profile_set(tmp_path, "fake", "torch")
    val, src = I.gemm(ps, [1, 4, 16], 64, 32)
    np.testing.assert_allclose(val, [2.0 + 2 * m * 64 * 32 / 1e8 for m in (1, 4, 16)], rtol=1e-3)
    assert (src == I.MEASURED).all()
    _, src = I.decode_attention(ps, 8, 4, 2, 16, 256)
    assert src[()] == I.CLAMPED  # unmeasured corner: scaled edge value
    val, _ = I.decode_attention(ps, 2, 4, 2, 16, [64, 256, 4096], window=64)
    assert val[0] == val[1] == val[2]
    assert ps.system.device == "Fake GPU" and ps.system.gpu == "fake"


def test_parse_shapes():
    assert parse_shapes(["1:2", "3:4"], (2,), "gemm") == ((1, 2), (3, 4))
    with pytest.raises(UserError, match="--attention 'x': expected N:N:N or N:N:N:N"):
        parse_shapes(["x"], (3, 4), "attention")


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch installed")
def test_torch_missing_is_user_error():
    with pytest.raises(UserError, match=r"install opweave-planner\[profile\]"):
        TorchRunner(device="cpu")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_torch_runner_on_cpu(tmp_path):
    plan = ProfilePlan(
        gemm_shapes=((32, 16),),
        m_values=(1, 4),
        attention_shapes=((2, 1, 8, 0),),
        batches=(1, 2),
        kv_lens=(8, 16),
    )
    written = run_profile(plan, TorchRunner(device="cpu", warmup=1, iters=2), tmp_path, "cpu")
    assert len(written) == 3
    ps = load_profile_set(tmp_path, "cpu", "torch")
    val, _ = I.gemm(ps, [1, 4], 32, 16)
    assert np.all(val > 0)
