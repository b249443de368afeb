"""Plausibility gate over every shipped table: speed-of-light floor, upper bound, GPU dominance.

Exceptions are listed with their reason; each must still match something, so the
list cannot silently outlive the data it excuses.
"""

from __future__ import annotations

import numpy as np
import pytest

from opweave_planner.data import shipped_dir
from opweave_planner.inputs.hardware import load_hardware
from opweave_planner.inputs.model import bundled_models, load_model
from opweave_planner.latency import interp as I
from opweave_planner.latency import plausibility as pl
from opweave_planner.latency.lookup import Parallel, op_latencies
from opweave_planner.latency.tables import available_gpus, load_profile_set
from opweave_planner.structure.operators import build_sequence

PROFILES = shipped_dir("profiles")
GPUS = tuple(available_gpus(PROFILES))
ROUND = 1e-3  # tables keep 4 significant digits

#: (gpu, kind, predicate(key, coords) on cells, reason) for cells above
#: UPPER_MULTIPLE x speed of light + UPPER_ALLOWANCE_US; coords are the cell's axis values
UPPER_EXCEPTIONS = [
    ("*", "attention", lambda k, c: k[3] >= 256 or k[4] > 0,
     "head_dim 256/512 and sliding-window kernels: slow measured paths (windowed kernels pay "
     "for the whole launch grid, the bound counts only the window)"),
    ("*", "attention", lambda k, c: c[0] * k[2] <= 16,
     "at most 16 (request, KV head) pairs per call: too few thread blocks to stream at DRAM speed"),
    ("*", "attention", lambda k, c: c[0] >= 256 and c[1] <= 64,
     "hundreds of requests with almost no context: per-request work, not KV traffic"),
    ("*", "gemm", lambda k, c: (min(k[1], k[2]) <= 1024 and (c[0] >= 8192 or max(k[1], k[2]) >= 32768))
     or (min(k[1], k[2]) <= 128 and max(k[1], k[2]) >= 8192),
     "skinny GEMMs (n or k <= 1024) at huge m or with k/n >= 32768, or n/k <= 128 against "
     ">= 8192: activation traffic, quantisation and split-K limits, not weight streaming"),
    ("*", "moe", lambda k, c: k[5] >= 4 or k[6] >= 8 or k[4] // k[6] >= 256 or k[3] >= 16,
     "fused MoE with tensor-parallel experts (tp >= 4), expert parallel >= 8 (our bound splits "
     "work evenly over ranks), >= 256 local experts or top-k >= 16: routing and tile waste"),
    ("*", "moe", lambda k, c: c[0] >= 2048,
     "2048+ tokens through 128-256 experts: grouped-GEMM tiles far from peak"),
    ("*", "moe", lambda k, c: k[0] in ("fp8", "int4_wo", "w4a16_mxfp4"),
     "per-tensor fp8 and weight-only 4-bit fused MoE paths are measured ~3x slower than "
     "fp8_block at small token counts"),
    ("*", "mla", lambda k, c: True, "MLA module = several GEMMs + attention: fixed costs add up"),
    # the prefill side (context tables): one call over batch x seq_len new tokens
    ("*", "context_attention", lambda k, c: k[3] >= 256 or k[4] > 0,
     "head_dim 256/512 and sliding-window prefill kernels: slow measured paths (windowed kernels "
     "pay for the whole launch grid, the bound counts only the window)"),
    ("*", "context_attention", lambda k, c: c[0] * c[1] <= 4096,
     "at most 4096 tokens in the call: launch and tile fill, not FLOPs"),
    ("*", "context_attention", lambda k, c: c[0] * k[1] <= 64,
     "at most 64 (request, query head) pairs: too few thread blocks for the tensor cores"),
    ("*", "context_attention", lambda k, c: k[0] == "fp8",
     "fp8 KV-cache prefill path: quantising K/V on the way in, measured up to 30x its bound at "
     "1-4 heads"),
    ("h200", "context_attention", lambda k, c: k[2:4] == (8, 64),
     "H200 shapes with 8 KV heads of head_dim 64 at 32-128 requests x 256-1024 tokens: "
     "outlier cells of the measurement"),
    ("*", "mla_context", lambda k, c: True, "MLA prefill module = several GEMMs + attention"),
    ("*", "linear_attention", lambda k, c: c[0] * c[1] <= 4096,
     "Gated DeltaNet prefill over at most 4096 tokens: two kernels' launches"),
    ("*", "linear_attention", lambda k, c: c[0] * k[2] <= 32,
     "at most 32 (request, value head) pairs: the chunked delta rule is sequential over chunks"),
    ("l40s", "allreduce", lambda k, c: k[1] >= 4,
     "4/8-GPU all-reduce over PCIe host bridges shares the root-complex bandwidth"),
]

#: (faster gpu, slower gpu, kind, predicate on key, reason) for dominance violations
DOMINANCE_EXCEPTIONS = [
    ("*", "l40s", "attention", lambda k: True,
     "the L40S micro-benchmark's KV stays in its 96 MB L2, so its cells sit at the DRAM "
     "speed-of-light floor, below H100/H200 kernels that are occupancy-bound at these shapes"),
    ("*", "l40s", "moe", lambda k: True,
     "sm90 fused-MoE kernels (per-tensor fp8 especially) are measured slower than sm89's at "
     "small token counts; we keep both measurements"),
    ("*", "l40s", "gemm", lambda k: k[0] == "fp8" or min(k[1], k[2]) <= 256,
     "fp8 GEMMs with small n or k: per-token activation quantisation costs more on sm90"),
    ("*", "l40s", "mla", lambda k: True, "MLA module at batch 1-4: fixed costs of several kernels"),
    ("*", "l40s", "context_attention", lambda k: True,
     "prefill attention: vLLM runs FlashAttention 3 on sm90 and FlashAttention 2 on the L40S; "
     "at 1-2 KV heads (and fp8 KV) FA3's larger tiles are measured slower"),
    ("*", "l40s", "mla_context", lambda k: True, "MLA prefill module at 1-16 heads: fixed costs of several kernels"),
    ("*", "l40s", "linear_attention", lambda k: True,
     "Gated DeltaNet prefill at 1-8 key heads: the chunked delta rule is sequential over chunks, "
     "clock-bound rather than bandwidth- or FLOP-bound"),
    ("*", "a100", "moe", lambda k: k[5] >= 16,
     "experts split 16/32 ways (58-116 wide per GPU): different fused-MoE kernels in vLLM "
     "0.14 (A100 data) and 0.24 (H100/H200), both far from any bound"),
]
#: pairs (faster, slower) where the faster GPU has strictly more bandwidth and bf16 compute
DOMINANCE = [("h100", "a100"), ("h200", "a100"), ("h100", "l40s"), ("h200", "l40s")]
DOMINANCE_TOL = 0.10  # relative, plus 1 µs
LAUNCH_BOUND_US = 20.0  # slower GPU's speed of light below this: fixed costs decide the order


def _floor(ps, kind):
    s = ps.system
    return pl.sol_floor(kind, s.memory_bandwidth_gbps, s.intra_node_bandwidth_gbps, s.peak_tflops)


def _balanced(kind, key):
    return (*key[:7], "balanced") if kind == "moe" else key


@pytest.mark.parametrize("gpu", GPUS)
def test_every_cell_at_least_speed_of_light(gpu):
    ps = load_profile_set(PROFILES, gpu)
    for kind, table in ps.tables.items():
        floor = _floor(ps, kind)
        mesh = np.meshgrid(*table.axis_arrays, indexing="ij")
        for key, grid in table.grids.items():
            ok = np.isfinite(grid)
            sol = floor(key, mesh)
            assert np.all(grid[ok] >= sol[ok] * (1 - ROUND)), (gpu, kind, key)


def test_every_cell_below_the_stated_multiple_or_a_listed_exception():
    used = set()
    for gpu in GPUS:
        ps = load_profile_set(PROFILES, gpu)
        for kind, table in ps.tables.items():
            floor = _floor(ps, kind)
            mesh = np.meshgrid(*table.axis_arrays, indexing="ij")
            rules = [(i, pred) for i, (g, k, pred, _) in enumerate(UPPER_EXCEPTIONS)
                     if g in ("*", gpu) and k == kind]
            for key, grid in table.grids.items():
                bound = pl.UPPER_MULTIPLE * floor(_balanced(kind, key), mesh) + pl.UPPER_ALLOWANCE_US
                for cell in np.argwhere(np.isfinite(grid) & (grid > bound)):
                    coords = [float(m[tuple(cell)]) for m in mesh]
                    hit = [i for i, pred in rules if pred(key, coords)]
                    assert hit, (gpu, kind, key, coords, float(grid[tuple(cell)]))
                    used.add(hit[0])
    assert used == set(range(len(UPPER_EXCEPTIONS))), "an exception no longer matches anything"


def _common(ta, tb):
    common = [np.intersect1d(a, b) for a, b in zip(ta.axis_arrays, tb.axis_arrays, strict=True)]
    ia = np.ix_(*[np.searchsorted(a, c) for a, c in zip(ta.axis_arrays, common, strict=True)])
    ib = np.ix_(*[np.searchsorted(b, c) for b, c in zip(tb.axis_arrays, common, strict=True)])
    return common, ia, ib


def test_a_gpu_with_more_bandwidth_and_compute_is_never_slower():
    used = set()
    for fast, slow in DOMINANCE:
        pf, ps = load_profile_set(PROFILES, fast), load_profile_set(PROFILES, slow)
        assert pf.system.memory_bandwidth_gbps > ps.system.memory_bandwidth_gbps
        assert pf.system.peak("bfloat16") > ps.system.peak("bfloat16")
        for kind, tf in pf.tables.items():
            ts = ps.table(kind)
            if ts is None:
                continue
            common, i_f, i_s = _common(tf, ts)
            mesh = np.meshgrid(*common, indexing="ij")
            floor = _floor(ps, kind)
            for key, gf in tf.grids.items():
                gs = ts.grids.get(key)
                if gs is None:
                    continue
                a, b = gf[i_f], gs[i_s]
                ok = np.isfinite(a) & np.isfinite(b) & (floor(_balanced(kind, key), mesh) >= LAUNCH_BOUND_US)
                if np.any(a[ok] > b[ok] * (1 + DOMINANCE_TOL) + 1.0):
                    hit = [i for i, (f, s, k, pred, _) in enumerate(DOMINANCE_EXCEPTIONS)
                           if f in ("*", fast) and s == slow and k == kind and pred(key)]
                    assert hit, (fast, slow, kind, key)
                    used.add(hit[0])
    assert used == set(range(len(DOMINANCE_EXCEPTIONS))), "an exception no longer matches anything"


def test_fp8_block_gemm_falls_back_to_same_shape_fp8_with_a_label():
    ps = load_profile_set(PROFILES, "h100")
    table = ps.table("gemm")
    assert not any(k[0] == "fp8_block" for k in table.grids)
    assert "fp8_block dropped as implausible" in table.notes
    m = np.array([1.0, 16.0, 256.0])
    block, src = I.gemm(ps, m, 3072, 1536, "fp8_block")
    fp8, _ = I.gemm(ps, m, 3072, 1536, "fp8")
    np.testing.assert_allclose(block, fp8)
    assert (src == I.FITTED).all()
    assert block[0] < 10.0  # not the ~57 µs floor of the dropped measurements


def test_gpu_without_a_family_borrows_a_dominating_gpus_measurements():
    """A100 has no fp8_block MoE and no MLA table: it is costed from H100's, scaled, never faster."""
    a100, h100 = load_profile_set(PROFILES, "a100"), load_profile_set(PROFILES, "h100")
    t = np.array([1.0, 8.0, 64.0, 256.0])
    args = (t, 7168, 2048, 8, 256, 8, 1, "fp8_block", "power-law")
    la, sa = I.moe(a100, *args)
    lh, _ = I.moe(h100, *args)
    assert (sa == I.FITTED).all() and np.all(la >= lh)
    ma, src = I.mla_decode(a100, [1, 64], 16, 8192, "bfloat16", "bfloat16")
    mh, _ = I.mla_decode(h100, [1, 64], 16, 8192, "bfloat16", "bfloat16")
    assert (src == I.FITTED).all() and np.all(ma >= mh)


@pytest.mark.parametrize("ctx", [8192, 32768])
def test_deepseek_v3_no_a100_operator_faster_than_h100(ctx):
    hw = load_hardware()
    seq = build_sequence(load_model("deepseek-v3"))
    grid = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    for tp in (1, 2, 4, 8):
        h = op_latencies(seq, hw.resolve("h100"), Parallel(tp), ctx, grid)
        a = op_latencies(seq, hw.resolve("a100"), Parallel(tp), ctx, grid)
        worse = h.lat_us > a.lat_us * 1.001
        assert not worse.any(), [(seq.ops[i].name, grid[j]) for i, j in np.argwhere(worse)[:5]]


def test_operator_latency_never_below_its_kernels_speed_of_light():
    """Every model's operators on every GPU: at least the time to stream the weights it reads."""
    hw = load_hardware()
    for name in bundled_models():
        seq = build_sequence(load_model(name))
        for gpu in GPUS:
            g = hw.resolve(gpu)
            lat = op_latencies(seq, g, Parallel(1), 8192, (1,))
            for i, op in enumerate(seq.ops):
                if op.gemm and op.kind not in ("router",):
                    stream_us = op.weight_bytes / (g.bandwidth_gbps * 1e3)
                    assert lat.lat_us[i, 0] >= stream_us * (1 - ROUND), (name, gpu, op.name)
