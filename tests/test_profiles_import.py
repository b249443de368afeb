"""Importer on a tiny synthetic aiconfigurator tree, and the CLI wrapper."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from opweave_planner.cli.profiles import app
from opweave_planner.errors import UserError
from opweave_planner.latency import interp as I
from opweave_planner.latency.importers import import_aiconfigurator, parse_simple_yaml
from opweave_planner.latency.tables import load_profile_set

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

YAML = """# SPDX header
gpu:
  mem_bw: 1000000000000 # 1TB/s
  mem_capacity: 17179869184
  bfloat16_tc_flops: 100000000000000
  sm_version: 90
node:
  num_gpus_per_node: 4
  intra_node_bw: 100000000000
  inter_node_bw: 10000000000
  p2p_latency: 0.00001
misc:
  nccl_mem:
    1: 0
    2: 1000
  other_mem: 2000
"""


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = {k: [r[k] for r in rows] for k in rows[0]}
    pq.write_table(pa.table(cols), path)


def _tree(root):
    systems = root / "systems"
    systems.mkdir(parents=True)
    (systems / "tiny_sxm.yaml").write_text(YAML)
    data = systems / "data" / "tiny_sxm"
    dev = "Tiny GPU"
    _write(
        data / "gemm/vllm/1.0/gemm_perf.parquet",
        [
            {
                "device": dev,
                "gemm_dtype": dt,
                "m": m,
                "n": 64,
                "k": 32,
                "latency": 0.001 * m + 0.002,
            }
            for dt in ("bfloat16", "nvfp4")
            for m in (1, 2, 4, 8)
        ]
        + [{"device": dev, "gemm_dtype": "bfloat16", "m": 1, "n": 64, "k": 32, "latency": 0.0015}],
    )
    _write(
        data / "gemm/vllm/0.9/gemm_perf.parquet",
        [{"device": dev, "gemm_dtype": "bfloat16", "m": 1, "n": 8, "k": 8, "latency": 1.0}],
    )
    _write(
        data / "attention/vllm/1.0/generation_attention_perf.parquet",
        [
            {
                "device": dev,
                "batch_size": b,
                "isl": 1,
                "num_heads": 8,
                "num_key_value_heads": 2,
                "head_dim": 64,
                "beam_width": 1,
                "kv_cache_dtype": "bfloat16",
                "step": s,
                "latency": 0.01 + 1e-7 * b * s,
            }
            for b in (1, 4)
            for s in (1, 3, 7)
        ],
    )
    _write(
        data / "comm/vllm/1.0/custom_allreduce_perf.parquet",
        [
            {
                "device": dev,
                "kernel_source": f"vLLM_custom_{v}",
                "allreduce_dtype": "bfloat16",
                "num_gpus": 2,
                "message_size": s,
                "latency": 0.005 * (2 if v == "eager" else 1),
            }
            for v in ("graph", "eager")
            for s in (128, 256)
        ],
    )
    return root


def test_yaml_subset():
    spec = parse_simple_yaml(YAML)
    assert spec["gpu"]["mem_bw"] == 10**12 and spec["misc"]["nccl_mem"]["2"] == 1000


def test_import_tiny_tree(tmp_path):
    out = tmp_path / "profiles"
    written = import_aiconfigurator(_tree(tmp_path / "src"), out)
    assert {p.name for p in written} == {
        "gemm.json",
        "attention.json",
        "allreduce.json",
        "system.json",
    }
    ps = load_profile_set(out, "tiny", "vllm")
    assert ps.system.memory_bandwidth_gbps == 1000 and ps.system.gpus_per_node == 4
    assert ps.system.p2p_latency_us == pytest.approx(10.0)
    gemm = ps.table("gemm")
    assert gemm.backend_version == "1.0" and list(gemm.grids) == [("bfloat16", 64, 32)]
    # duplicate (m=1) keeps the fastest call; ms -> µs
    np.testing.assert_allclose(gemm.grids[("bfloat16", 64, 32)], [1.5, 4, 6, 10])
    attn = ps.table("attention")
    assert attn.axes["kv_len"] == (2, 4, 8)  # step + 1
    val, src = I.decode_attention(ps, [1, 4], 8, 2, 64, 4)
    np.testing.assert_allclose(val, [10.0003, 10.0012], rtol=1e-3)
    assert (src == I.MEASURED).all()
    ar = ps.table("allreduce")
    assert ar.axes["message_bytes"] == (256, 512)
    assert ar.grids[("bfloat16", 2)].tolist() == [5.0, 5.0]  # graph variant only


def test_import_errors_and_cli(tmp_path):
    src = _tree(tmp_path / "src")
    with pytest.raises(UserError, match="expected an aiconfigurator 'systems' folder"):
        import_aiconfigurator(tmp_path / "nowhere", tmp_path / "o")
    with pytest.raises(UserError, match="no tables for backend 'trtllm'"):
        import_aiconfigurator(src, tmp_path / "o", backend="trtllm")
    res = CliRunner().invoke(
        app, ["import", str(src), "--out", str(tmp_path / "cli"), "--gpus", "tiny"]
    )
    assert res.exit_code == 0, res.output
    assert "wrote 4 files" in res.output
    assert (tmp_path / "cli" / "tiny" / "vllm" / "gemm.json").is_file()


def test_import_prefill_tables(tmp_path):
    """Context attention (step 0 only) and Gated DeltaNet's context phase (its two kernels summed
    per cell) are converted with the same fit and floor; lookups read them back measured."""
    src = _tree(tmp_path / "src")
    data = src / "systems" / "data" / "tiny_sxm"
    dev = "Tiny GPU"
    _write(data / "attention/vllm/1.0/context_attention_perf.parquet", [
        {"device": dev, "batch_size": b, "isl": s, "num_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
         "beam_width": 1, "kv_cache_dtype": "bfloat16", "step": step, "window_size": 0,
         "latency": 0.02 + 1e-6 * b * s * (1 + step)}
        for b in (1, 2) for s in (128, 1024) for step in (0, 5)])
    _write(data / "linear_attention/vllm/1.0/gdn_perf.parquet", [
        {"device": dev, "phase": phase, "kernel_source": ks, "batch_size": b, "seq_len": s,
         "num_k_heads": 4, "head_k_dim": 128, "num_v_heads": 8, "head_v_dim": 128, "latency": 0.01 * (1 + b)}
        for phase in ("context", "generation") for ks in ("conv", "rule") for b in (1, 2) for s in (256, 512)])
    out = tmp_path / "profiles"
    written = {p.name for p in import_aiconfigurator(src, out)}
    assert {"context_attention.json", "linear_attention.json"} <= written
    ps = load_profile_set(out, "tiny", "vllm")
    ctx = ps.table("context_attention")
    assert ctx.axes["seq_len"] == (128, 1024)
    np.testing.assert_allclose(ctx.grids[("bfloat16", 8, 2, 64, 0)], [[20.128, 21.024], [20.256, 22.048]], rtol=1e-3)
    val, src_codes = I.context_attention(ps, [1, 2], 8, 2, 64, 1024)
    np.testing.assert_allclose(val, [21.024, 22.048], rtol=1e-3)
    assert (src_codes == I.MEASURED).all()
    gdn = ps.table("linear_attention")  # context rows only, conv + rule
    np.testing.assert_allclose(gdn.grids[(4, 128, 8, 128)], [[40.0, 40.0], [60.0, 60.0]])
