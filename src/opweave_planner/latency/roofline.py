"""Calibrated roofline: the fallback for kernels and GPUs without measurements.

    time_us = max(bytes / (bandwidth * eff_bw), flops / (peak * eff_flops)) + overhead_us

The efficiencies are fitted per GPU to its measured tables (`fit_efficiency`):

* ``eff_bw`` and ``attention_overhead_us``: decode attention (bf16 KV, full
  attention), the memory-bound class, as ``t = c + bytes/(bw*eff)`` over the
  calls that stream at least 128 MiB (so that L2-resident calls do not inflate
  the apparent bandwidth); the intercept is then refitted over all calls;
* ``overhead_us``: the median excess over the ideal roofline of small GEMMs
  (m <= 16, n*k <= 2**22), i.e. the launch/tail cost of a short kernel;
* ``eff_flops``: large bf16 GEMMs (m, n, k >= 1024), the compute-bound class,
  with the overhead above held fixed.

All fits minimise squared *relative* error. A GPU without tables (H20, B200,
...) borrows the efficiencies of the nearest measured GPU (`nearest_efficiency`).
Inputs are plain floats: bandwidth in GB/s (1e9 B/s), peak in TFLOPS (1e12/s),
bytes and FLOPs per kernel call; outputs are microseconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = [
    "DEFAULT_EFFICIENCY",
    "ClassFit",
    "Efficiency",
    "FitReport",
    "allreduce_work",
    "attention_work",
    "dtype_bytes",
    "elementwise_work",
    "fit_efficiency",
    "gemm_work",
    "measured_points",
    "mla_work",
    "moe_work",
    "nearest_efficiency",
    "roofline_us",
    "sol_us",
]

_DTYPE_BYTES = {
    "float32": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "half": 2.0,
    "fp8": 1.0,
    "fp8_block": 1.0,
    "int8": 1.0,
    "int4_wo": 0.5,
    "w4a16_mxfp4": 0.5,
    "mxfp4": 0.5,
    "nvfp4": 0.5,
}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a storage dtype (4-bit formats count 0.5)."""
    try:
        return _DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype '{dtype}' (known: {', '.join(_DTYPE_BYTES)})") from None


def _act_bytes(dtype: str) -> float:
    """Activation bytes: fp8 GEMMs quantise activations too; 4-bit ones do not."""
    return 1.0 if dtype.startswith("fp8") or dtype == "int8" else 2.0


@dataclass(frozen=True)
class Efficiency:
    """Fraction of peak bandwidth / FLOPs reached, and fixed per-kernel costs (µs)."""

    bw: float
    flops: float
    overhead_us: float
    attention_overhead_us: float


#: Used when no measured GPU is available at all (sources marked ROOFLINE).
DEFAULT_EFFICIENCY = Efficiency(bw=0.8, flops=0.7, overhead_us=4.0, attention_overhead_us=8.0)


def sol_us(bytes_, flops, bandwidth_gbps: float, peak_tflops: float) -> np.ndarray:
    """Ideal (speed-of-light) time in µs: max(bytes/bandwidth, flops/peak)."""
    b = np.asarray(bytes_, dtype=np.float64) / (bandwidth_gbps * 1e3)
    f = np.asarray(flops, dtype=np.float64) / (peak_tflops * 1e6)
    return np.maximum(b, f)


def roofline_us(
    bytes_,
    flops,
    bandwidth_gbps: float,
    peak_tflops: float,
    eff: Efficiency = DEFAULT_EFFICIENCY,
    *,
    overhead_us: float | None = None,
) -> np.ndarray:
    """Calibrated roofline time (µs) for arrays of bytes moved and FLOPs per call.

    `overhead_us` overrides `eff.overhead_us` (e.g. `eff.attention_overhead_us`).
    """
    c = eff.overhead_us if overhead_us is None else overhead_us
    return sol_us(bytes_, flops, bandwidth_gbps * eff.bw, peak_tflops * eff.flops) + c


# ----------------------------------------------------------------------------- work models


def gemm_work(m, n: int, k: int, dtype: str = "bfloat16") -> tuple[np.ndarray, np.ndarray]:
    """(bytes, flops) of y[m,n] = x[m,k] @ W[k,n]: weights + input + bf16 output."""
    m = np.asarray(m, dtype=np.float64)
    nbytes = m * k * _act_bytes(dtype) + float(k) * n * dtype_bytes(dtype) + m * n * 2.0
    return nbytes, 2.0 * m * n * k


def attention_work(
    batch, n_heads: int, n_kv_heads: int, head_dim: int, kv_len, kv_dtype: str = "bfloat16"
) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, flops) of one decode-attention call: read K and V, read q, write o."""
    b = np.asarray(batch, dtype=np.float64)
    s = np.asarray(kv_len, dtype=np.float64)
    kv = b * s * (2.0 * n_kv_heads * head_dim * dtype_bytes(kv_dtype))
    qo = b * (2.0 * n_heads * head_dim * 2.0)
    return kv + qo, 4.0 * b * n_heads * s * head_dim


def context_attention_work(
    batch, n_heads: int, n_kv_heads: int, head_dim: int, seq_len, window: int = 0,
    kv_dtype: str = "bfloat16",
) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, flops) of one causal prefill-attention call over `seq_len` new tokens per request:
    read q, k, v and write o once (the tiles stay on chip); QK^T and PV over the causal triangle,
    each query seeing at most `window` keys when windowed."""
    b = np.asarray(batch, dtype=np.float64)
    s = np.asarray(seq_len, dtype=np.float64)
    keys = s * (s + 1) / 2.0 if not window else np.where(s <= window, s * (s + 1) / 2.0,
                                                         window * (window + 1) / 2.0 + (s - window) * window)
    nbytes = b * s * head_dim * (2.0 * n_heads * 2.0 + 2.0 * n_kv_heads * dtype_bytes(kv_dtype))
    return nbytes, 4.0 * b * n_heads * head_dim * keys


def mla_context_work(batch, n_heads: int, seq_len, kv_dtype: str = "bfloat16",
                     gemm_dtype: str = "bfloat16") -> tuple[np.ndarray, np.ndarray]:
    """(bytes, flops) of a DeepSeek-V3 MLA prefill module: its projections over every token
    (weights read once) and causal attention over the up-projected heads (192 qk, 128 v)."""
    b = np.asarray(batch, dtype=np.float64)
    s = np.asarray(seq_len, dtype=np.float64)
    w_bytes, _ = mla_work(0.0, n_heads, 0.0, kv_dtype, gemm_dtype)
    _, per_token = mla_work(1.0, n_heads, 0.0, kv_dtype, gemm_dtype)
    tokens = b * s
    attn = 2.0 * b * n_heads * (192 + 128) * s * (s + 1) / 2.0
    return w_bytes + tokens * 7168 * 4.0, tokens * per_token + attn


def linear_attention_work(batch, n_k_heads: int, k_dim: int, n_v_heads: int, v_dim: int, seq_len,
                          conv_kernel: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, flops) of a Gated DeltaNet prefill (conv1d + chunked delta rule) over `seq_len`
    tokens per request: q, k, v in and o out per token, the state written once, the state
    update per token."""
    b = np.asarray(batch, dtype=np.float64)
    s = np.asarray(seq_len, dtype=np.float64)
    width = 2 * n_k_heads * k_dim + 2 * n_v_heads * v_dim
    state = n_v_heads * k_dim * v_dim * 4.0
    nbytes = b * s * width * 2.0 * 2.0 + b * state
    flops = b * s * (6.0 * n_v_heads * k_dim * v_dim + 2.0 * width * conv_kernel)
    return nbytes, flops


def mla_work(
    batch,
    n_heads: int,
    kv_len,
    kv_dtype: str = "bfloat16",
    gemm_dtype: str = "bfloat16",
    *,
    hidden: int = 7168,
    q_lora_rank: int = 1536,
    kv_lora_rank: int = 512,
    qk_nope_dim: int = 128,
    qk_rope_dim: int = 64,
    v_head_dim: int = 128,
) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, flops) of a DeepSeek-style MLA decode module (projections + latent attention).

    Defaults are DeepSeek-V3's dimensions, which is what the MLA tables measure.
    """
    b = np.asarray(batch, dtype=np.float64)
    s = np.asarray(kv_len, dtype=np.float64)
    weights = (
        hidden * (q_lora_rank + kv_lora_rank + qk_rope_dim)
        + q_lora_rank * n_heads * (qk_nope_dim + qk_rope_dim)
        + kv_lora_rank * n_heads * (qk_nope_dim + v_head_dim)
        + n_heads * v_head_dim * hidden
    )
    latent = kv_lora_rank + qk_rope_dim
    nbytes = weights * dtype_bytes(gemm_dtype) + b * s * latent * dtype_bytes(kv_dtype)
    flops = 2.0 * b * weights + 2.0 * b * n_heads * s * (latent + kv_lora_rank)
    return nbytes, flops


def moe_work(
    tokens,
    hidden: int,
    inter: int,
    topk: int,
    n_experts: int,
    tp: int = 1,
    ep: int = 1,
    dtype: str = "bfloat16",
    *,
    routing: str = "balanced",
) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, flops) on one GPU of a fused gated MoE (gate, up, down).

    Expected distinct local experts touched by T tokens: balanced routing
    E_l * (1 - (1 - topk/E)**T) (uniform random choice, a lower bound for an
    even spread); skewed ("power-law") routing can concentrate on few experts,
    so only min(E_l, max(1, topk/ep)) is certain.
    """
    t = np.asarray(tokens, dtype=np.float64)
    local = n_experts / ep
    inter_l = inter / tp
    if routing == "balanced":
        active = local * (1.0 - (1.0 - topk / n_experts) ** t)
    else:
        active = np.full(t.shape, min(local, max(1.0, topk / ep)))
    nbytes = active * 3.0 * hidden * inter_l * dtype_bytes(dtype) + t * hidden * 4.0
    flops = 2.0 * t * (topk / ep) * 3.0 * hidden * inter_l
    return nbytes, flops


def elementwise_work(
    tokens,
    hidden: int,
    reads: int = 1,
    writes: int = 1,
    flops_per_elem: float = 4.0,
    dtype: str = "bfloat16",
) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, flops) of a norm / activation / rotary-style pass over [tokens, hidden]."""
    t = np.asarray(tokens, dtype=np.float64)
    elems = t * hidden
    return elems * (reads + writes) * dtype_bytes(dtype), elems * flops_per_elem


def allreduce_work(n_gpus: int, message_bytes) -> np.ndarray:
    """Bytes each GPU sends in a ring all-reduce: 2 (n-1)/n * message."""
    msg = np.asarray(message_bytes, dtype=np.float64)
    return msg * (2.0 * (n_gpus - 1) / max(n_gpus, 1))


# ----------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class ClassFit:
    """Error of the fitted model over one measured kernel class (relative errors)."""

    name: str
    n_points: int
    median_rel_err: float
    p90_rel_err: float


@dataclass(frozen=True)
class FitReport:
    gpu: str
    backend: str
    efficiency: Efficiency
    classes: tuple[ClassFit, ...]

    def lines(self) -> list[str]:
        e = self.efficiency
        head = (
            f"{self.gpu}/{self.backend}: eff_bw={e.bw:.3f} eff_flops={e.flops:.3f} "
            f"overhead={e.overhead_us:.2f}us attention_overhead={e.attention_overhead_us:.2f}us"
        )
        out = [head]
        out += [
            f"  {c.name}: n={c.n_points} median={100 * c.median_rel_err:.1f}% "
            f"p90={100 * c.p90_rel_err:.1f}%"
            for c in self.classes
        ]
        return out


def measured_points(table, select=lambda key: True) -> list[tuple]:
    """Measured cells of the groups accepted by `select(key)`: [(key, coords, latency_us)]."""
    out = []
    mesh = np.meshgrid(*table.axis_arrays, indexing="ij")
    for key, grid in table.grids.items():
        if select(key):
            ok = np.isfinite(grid)
            out.append((key, [m[ok] for m in mesh], grid[ok]))
    return out


def _rel_errors(pred: np.ndarray, meas: np.ndarray) -> tuple[float, float]:
    err = np.abs(pred - meas) / meas
    return float(np.median(err)), float(np.percentile(err, 90))


def fit_efficiency(ps) -> FitReport | None:
    """Fit `Efficiency` to a ProfileSet's bf16 GEMM and attention tables (cached on `ps`).

    Returns None when the set has neither table (e.g. a GPU only described by
    system.json); callers then use `nearest_efficiency` or DEFAULT_EFFICIENCY.
    """
    if "fit" in ps.cache:
        return ps.cache["fit"]
    report = _fit(ps)
    ps.cache["fit"] = report
    return report


def _fit(ps) -> FitReport | None:
    sysm = ps.system
    bw, peak = sysm.memory_bandwidth_gbps, sysm.peak("bfloat16")
    gemm_t, attn_t = ps.table("gemm"), ps.table("attention")
    if gemm_t is None and attn_t is None:
        return None
    eff_bw, c_att = DEFAULT_EFFICIENCY.bw, DEFAULT_EFFICIENCY.attention_overhead_us
    overhead, eff_fl = DEFAULT_EFFICIENCY.overhead_us, DEFAULT_EFFICIENCY.flops
    att_x = att_t = None
    if attn_t is not None:
        pts = measured_points(attn_t, lambda k: k[0] == "bfloat16" and k[4] == 0)
        if pts:
            xs, ts = [], []
            for (_, nh, nkv, hd, _w), (b, s), t in pts:
                nbytes, _fl = attention_work(b, nh, nkv, hd, s, "bfloat16")
                xs.append(nbytes / (bw * 1e3))
                ts.append(t)
            att_x, att_t = np.concatenate(xs), np.concatenate(ts)
            # Slope from calls that stream >= 128 MiB (beyond any L2), intercept jointly.
            use = att_x * (bw * 1e3) >= 2.0**27
            if use.sum() < 10:
                use = np.ones_like(use)
            x, t = att_x[use], att_t[use]
            a_mat = np.stack([1.0 / t, x / t], axis=1)
            (_c, slope), *_ = np.linalg.lstsq(a_mat, np.ones_like(t), rcond=None)
            eff_bw = float(np.clip(1.0 / slope, 0.05, 1.0)) if slope > 0 else eff_bw
            # Intercept over all calls with the slope held: relative least squares.
            resid = att_t - att_x / eff_bw
            c_att = float(max(np.sum(resid / att_t**2) / np.sum(1.0 / att_t**2), 0.0))
    g_pts = []
    if gemm_t is not None:
        g_pts = measured_points(gemm_t, lambda k: k[0] == "bfloat16")
    g_m, g_b, g_f, g_t, g_nk = [], [], [], [], []
    for (_, n, k), (m,), t in g_pts:
        nbytes, fl = gemm_work(m, n, k, "bfloat16")
        g_m.append(m), g_b.append(nbytes), g_f.append(fl), g_t.append(t)
        g_nk.append(np.full(m.shape, float(n) * k))
    classes: list[ClassFit] = []
    if g_t:
        m, nbytes, fl, t, nk = (np.concatenate(v) for v in (g_m, g_b, g_f, g_t, g_nk))
        sol = sol_us(nbytes, fl, bw * eff_bw, peak)
        small = (m <= 16) & (nk <= 2.0**22)
        if small.any():
            overhead = float(max(np.median(t[small] - sol[small]), 0.0))
        big = (m >= 1024) & (nk >= 2.0**20)
        if big.any():
            y = fl[big] / (peak * 1e6)
            r = t[big] - overhead
            slope = float(np.sum(y * r / t[big] ** 2) / np.sum(y * y / t[big] ** 2))
            eff_fl = float(np.clip(1.0 / slope, 0.05, 1.0)) if slope > 0 else eff_fl
    eff = Efficiency(bw=eff_bw, flops=eff_fl, overhead_us=overhead, attention_overhead_us=c_att)
    if att_t is not None:
        pred = att_x / eff.bw + c_att
        classes.append(
            ClassFit("attention bf16 (memory-bound class)", att_t.size, *_rel_errors(pred, att_t))
        )
    if g_t:
        pred = roofline_us(nbytes, fl, bw, peak, eff)
        classes.append(ClassFit("gemm bf16 all shapes", t.size, *_rel_errors(pred, t)))
        if big.any():
            classes.append(
                ClassFit(
                    "gemm bf16 m,n,k>=1024 (compute class)",
                    int(big.sum()),
                    *_rel_errors(pred[big], t[big]),
                )
            )
        if small.any():
            classes.append(
                ClassFit(
                    "gemm bf16 m<=16 small (overhead class)",
                    int(small.sum()),
                    *_rel_errors(pred[small], t[small]),
                )
            )
    return FitReport(gpu=ps.gpu, backend=ps.backend, efficiency=eff, classes=tuple(classes))


def nearest_efficiency(
    fits: Mapping[str, tuple[float, float, Efficiency]],
    bandwidth_gbps: float,
    peak_tflops: float,
    *,
    mean: bool = False,
) -> tuple[Efficiency, str]:
    """Efficiency for an unmeasured GPU from measured ones.

    `fits` maps gpu id -> (bandwidth GB/s, bf16 peak TFLOPS, Efficiency). Picks
    the GPU nearest in (log bandwidth, log peak), or averages all when `mean`.
    Returns the efficiency and the name of where it came from.
    """
    if not fits:
        return DEFAULT_EFFICIENCY, "default"
    if mean:
        effs = [e for _, _, e in fits.values()]
        avg = Efficiency(
            *(
                float(np.mean([getattr(e, f) for e in effs]))
                for f in ("bw", "flops", "overhead_us", "attention_overhead_us")
            )
        )
        return avg, "mean(" + ",".join(sorted(fits)) + ")"

    def dist(item: tuple[str, tuple[float, float, Efficiency]]) -> tuple[float, str]:
        gpu, (b, p, _) = item
        return math.hypot(math.log(bandwidth_gbps / b), math.log(peak_tflops / p)), gpu

    gpu, (_, _, eff) = min(fits.items(), key=dist)
    return eff, gpu
