"""Kernel lookups: exact at measured points, monotone, windows, edges and fallbacks."""

from __future__ import annotations

import shutil

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from opweave_planner.data import shipped_dir
from opweave_planner.latency import interp as I
from opweave_planner.latency import roofline as rf
from opweave_planner.latency.tables import load_profile_set

PROFILES = shipped_dir("profiles")
GPUS = ("h100", "h200", "a100", "l40s")


def _ps(gpu="h100"):
    return load_profile_set(PROFILES, gpu, "vllm")


def _stored_codes(table, key, idx):
    """Source codes a lookup must return at stored cells: measured unless the importer labelled them."""
    lab = table.labels[key][idx]
    return np.where(lab > 0, lab + I.INTERPOLATED, I.MEASURED)


def test_gemm_exact_at_measured_points():
    for gpu in GPUS:
        ps = _ps(gpu)
        table = ps.table("gemm")
        m = table.axis_arrays[0]
        for key in list(table.grids)[::37]:
            raw = table.grids[key]
            ok = np.isfinite(raw)
            val, src = I.gemm(ps, m[ok], key[1], key[2], key[0])
            np.testing.assert_allclose(val, raw[ok], rtol=1e-12)
            assert (src == _stored_codes(table, key, ok)).all()


def test_attention_exact_at_measured_points():
    for gpu in GPUS:
        ps = _ps(gpu)
        table = ps.table("attention")
        b_axis, kv_axis = table.axis_arrays
        for key in list(table.grids)[::11]:
            raw = table.grids[key]
            kv_dtype, nh, nkv, hd, window = key
            bi, ki = np.nonzero(np.isfinite(raw))
            if window:  # measured points below the window are returned as such
                keep = kv_axis[ki] < window
                bi, ki = bi[keep], ki[keep]
            val, src = I.decode_attention(
                ps, b_axis[bi], nh, nkv, hd, kv_axis[ki], window, kv_dtype
            )
            np.testing.assert_allclose(val, raw[bi, ki], rtol=1e-12)
            assert (src == _stored_codes(table, key, (bi, ki))).all()


def test_mla_moe_allreduce_exact():
    ps = _ps("h100")
    for kind, call in (
        ("mla", lambda k, c: I.mla_decode(ps, c[0], k[2], c[1], k[0], k[1])),
        ("moe", lambda k, c: I.moe(ps, c[0], *k[1:7], dtype=k[0], routing=k[7])),
        ("allreduce", lambda k, c: I.allreduce(ps, k[1], c[0], k[0])),
    ):
        table = ps.table(kind)
        key = next(iter(table.grids))
        raw = table.grids[key]
        idx = np.nonzero(np.isfinite(raw))
        coords = [ax[i] for ax, i in zip(table.axis_arrays, idx, strict=True)]
        val, src = call(key, coords)
        np.testing.assert_allclose(val, raw[idx], rtol=1e-12)
        assert (src == _stored_codes(table, key, idx)).all()


_ATTN_SHAPES = st.tuples(
    st.sampled_from([1, 2, 4, 8, 16, 24, 32, 40, 64]),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([64, 80, 128, 256]),
    st.sampled_from([0, 0, 128, 512, 1024, 4096]),
    st.sampled_from(["bfloat16", "fp8"]),
)


@settings(max_examples=40, deadline=None)
@given(
    gpu=st.sampled_from(GPUS),
    n=st.integers(16, 70000),
    k=st.integers(16, 70000),
    tokens=st.lists(st.floats(0.5, 60000), min_size=2, max_size=30),
    dtype=st.sampled_from(["bfloat16", "fp8"]),
)
def test_gemm_monotone_in_tokens(gpu, n, k, tokens, dtype):
    m = np.sort(np.asarray(tokens))
    val, src = I.gemm(_ps(gpu), m, n, k, dtype)
    assert np.all(np.diff(val) >= -1e-9 * val[1:]) and np.all(val > 0)
    assert src.dtype == np.int8


@settings(max_examples=40, deadline=None)
@given(
    gpu=st.sampled_from(GPUS),
    shape=_ATTN_SHAPES,
    batch=st.integers(1, 5000),
    kv=st.lists(st.floats(1, 300000), min_size=2, max_size=30),
)
def test_attention_monotone_in_kv_and_batch(gpu, shape, batch, kv):
    nh, nkv, hd, window, kv_dtype = shape
    nh = max(nh, nkv)
    ps = _ps(gpu)
    kv = np.sort(np.asarray(kv))
    val, _ = I.decode_attention(ps, batch, nh, nkv, hd, kv, window, kv_dtype)
    assert np.all(np.diff(val) >= -1e-9 * val[1:])
    b = np.arange(1, 3000, 37)
    val_b, _ = I.decode_attention(ps, b, nh, nkv, hd, kv[-1], window, kv_dtype)
    assert np.all(np.diff(val_b) >= -1e-9 * val_b[1:])


@settings(max_examples=20, deadline=None)
@given(
    gpu=st.sampled_from(("h100", "h200", "l40s")),
    tokens=st.lists(st.floats(1, 30000), min_size=2, max_size=20),
)
def test_moe_monotone_in_tokens(gpu, tokens):
    t = np.sort(np.asarray(tokens))
    val, _ = I.moe(_ps(gpu), t, 4096, 1536, 8, 128, 1, 4)
    assert np.all(np.diff(val) >= -1e-9 * val[1:])


def test_sliding_window_stops_growing():
    kv = np.array([2048, 4096, 8192, 32768, 131072, 10**6])
    for gpu in GPUS:
        ps = _ps(gpu)
        for shape in ((32, 8, 128), (16, 8, 256), (64, 1, 64)):
            for window in (128, 1024):
                val, _ = I.decode_attention(ps, 64, *shape, kv, window)
                assert np.all(val == val[0]), (gpu, shape, window)
                full, _ = I.decode_attention(ps, 64, *shape, kv, 0)
                assert full[-1] > val[-1]


def test_sources():
    ps = _ps("h100")
    table = ps.table("gemm")
    n, k = next(key[1:] for key in table.grids if key[0] == "bfloat16")
    _, src = I.gemm(ps, [1, 18, 40000, 0.5], n, k)
    assert src.tolist() == [I.MEASURED, I.INTERPOLATED, I.CLAMPED, I.CLAMPED]
    _, src = I.gemm(ps, [1, 64], 4000, 4095)  # inside the measured (n, k) grid: its corners' worst
    assert src[0] == I.INTERPOLATED and src[1] in (I.INTERPOLATED, I.SMOOTHED)
    _, src = I.gemm(ps, [1, 64], 100000, 4096)  # wider than any measured n
    assert (src == I.FITTED).all()
    val, src = I.mla_decode(_ps("a100"), [1, 64], 16, 4096)  # a100/vllm has no MLA table
    assert (src == I.FITTED).all() and np.all(np.diff(val) > 0)
    val, src = I.allreduce(ps, 1, [1e6])
    assert val[0] == 0 and src[0] == I.MEASURED
    _, src = I.allreduce(ps, 16, [1e6])
    assert src[0] == I.FITTED
    _, src = I.decode_attention(ps, [1, 4096], 32, 8, 128, 200000)
    assert src[1] == I.CLAMPED


def test_roofline_source_without_tables(tmp_path):
    shutil.copy(PROFILES / "h100" / "system.json", tmp_path / "system.json")
    (tmp_path / "h20" / "none").mkdir(parents=True)
    shutil.copy(PROFILES / "h100" / "system.json", tmp_path / "h20" / "system.json")
    ps = load_profile_set(tmp_path, "h20", "none")
    val, src = I.gemm(ps, [1, 8], 4096, 4096)
    assert (src == I.ROOFLINE).all() and np.all(val > 0)


def test_fit_report_and_nearest():
    for gpu in GPUS:
        report = rf.fit_efficiency(_ps(gpu))
        e = report.efficiency
        assert 0.05 <= e.bw <= 1 and 0.05 <= e.flops <= 1 and e.overhead_us > 0
        names = {c.name.split()[0] for c in report.classes}
        assert names == {"attention", "gemm"}
        for c in report.classes:
            assert c.n_points > 100 and 0 <= c.median_rel_err <= c.p90_rel_err
        compute = next(c for c in report.classes if "compute" in c.name)
        assert compute.median_rel_err < 0.2
        assert report.lines()[0].startswith(f"{gpu}/vllm")
    fits = I.shipped_efficiencies(PROFILES)
    eff, src = rf.nearest_efficiency(fits, 4000, 148)  # an H20-like GPU
    assert src in fits and eff is fits[src][2]
    avg, name = rf.nearest_efficiency(fits, 8000, 2250, mean=True)
    assert name.startswith("mean(") and 0 < avg.bw <= 1


def test_roofline_formula():
    t = rf.roofline_us(3.35e9, 0.0, 3350.0, 989.0, rf.Efficiency(1.0, 1.0, 2.0, 5.0))
    assert abs(float(t) - 1002.0) < 1e-6
    nbytes, flops = rf.elementwise_work([1, 2], 4096, reads=2, writes=1)
    assert nbytes.tolist() == [4096 * 6, 4096 * 12] and flops[1] == 2 * flops[0]


def test_gemm_between_measured_shapes_is_bilinear_in_n_and_k():
    """A shape inside the measured (n, k) grid reads its four measured neighbours (qwen3-32b
    TP 4's ffn_up, (12800, 5120), lies between n 12288 and 16384): bilinear, INTERPOLATED,
    and on a grid line it reduces to the measured shapes."""
    ps = _ps("h100")
    m = np.array([1.0, 64.0, 4096.0])
    lo, _ = I.gemm(ps, m, 12288, 5120)
    hi, _ = I.gemm(ps, m, 16384, 5120)
    mid, src = I.gemm(ps, m, 12800, 5120)
    t = (12800 - 12288) / (16384 - 12288)
    np.testing.assert_allclose(mid, np.maximum((1 - t) * lo + t * hi, mid.min()), rtol=1e-9)
    assert (src <= I.SMOOTHED).all() and (src >= I.INTERPOLATED).all()
    both, _ = I.gemm(ps, m, 12800, 5632)  # between k 5120 and 6144 too
    k_hi, _ = I.gemm(ps, m, 12800, 6144)
    assert np.all(mid <= both) and np.all(both <= k_hi)
    # an untrusted dtype reads its sibling's grid between shapes, and says so
    _, src = I.gemm(ps, m, 12800, 5120, dtype="fp8_block")
    assert (src == I.FITTED).all()
