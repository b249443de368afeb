"""Kernel-level latency lookups over a ProfileSet, vectorised over tokens / batch / KV length.

Every function returns ``(latency_us, source)``: a float64 array in microseconds
per kernel call on one GPU and an int8 array of source codes, broadcast over the
array arguments:

==============  =  =============================================================
MEASURED        0  exactly a measured grid point of the exact shape
INTERPOLATED    1  between measured points of the exact shape (piecewise linear)
CLAMPED         2  beyond a continuous axis edge, or a cell the source did not
                   measure: nearest edge value scaled by the speed-of-light ratio
                   (utilisation held constant; below the first point: held flat)
FITTED          3  shape not measured: nearest measured shape scaled by the ratio
                   of the calibrated roofline, or the calibrated roofline itself
ROOFLINE        4  no table and no fitted efficiency: default-efficiency roofline
==============  =  =============================================================

Rules (see docs/profiles.md):

* continuous axes (GEMM ``m``, MoE ``tokens``, attention ``batch`` x ``kv_len``,
  all-reduce ``message_bytes``) are interpolated piecewise-linearly (bilinearly
  in 2-D) in linear space; categorical fields must match exactly, else the
  nearest measured shape is scaled (FITTED);
* each prepared grid is made monotone non-decreasing along every axis with a
  running maximum (the importer already ships monotone tables, so measured
  points are returned exactly);
* sliding-window attention uses ``min(kv_len, window)``; a windowed table's
  columns at or past the window hold the plateau the kernel reaches (its
  largest value), so latency stops growing past the window.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from opweave_planner.errors import UserError
from opweave_planner.latency import roofline as rf
from opweave_planner.latency.tables import ProfileSet, available_gpus, load_profile_set

__all__ = [
    "CLAMPED",
    "FITTED",
    "INTERPOLATED",
    "MEASURED",
    "ROOFLINE",
    "SOURCE_NAMES",
    "allreduce",
    "decode_attention",
    "efficiency",
    "gemm",
    "mla_decode",
    "moe",
    "shipped_efficiencies",
]

MEASURED, INTERPOLATED, CLAMPED, FITTED, ROOFLINE = 0, 1, 2, 3, 4
SOURCE_NAMES = ("measured", "interpolated", "clamped", "fitted", "roofline")

Result = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class _Prepared:
    """A filled, monotone grid of one measured shape, ready for interpolation."""

    axes: tuple[np.ndarray, ...]
    values: np.ndarray
    codes: np.ndarray
    sol: Callable[..., np.ndarray]  # speed-of-light time of this shape at given coords


# ----------------------------------------------------------------------------- grids


def _fill_1d(x: np.ndarray, y: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fill nan cells: linear inside the measured span, SOL-scaled above, flat below."""
    ok = np.isfinite(y)
    codes = np.where(ok, MEASURED, INTERPOLATED).astype(np.int8)
    if ok.all():
        return y.copy(), codes
    idx = np.flatnonzero(ok)
    lo, hi = idx[0], idx[-1]
    v = np.interp(x, x[ok], y[ok])
    v[hi + 1 :] = y[hi] * s[hi + 1 :] / s[hi]
    codes[:lo] = CLAMPED
    codes[hi + 1 :] = CLAMPED
    return v, codes


def _prepare(raw: np.ndarray, axes: tuple[np.ndarray, ...], sol, plateau_from=None) -> _Prepared:
    mesh = np.meshgrid(*axes, indexing="ij")
    s = np.maximum(sol(*mesh), 1e-12)
    if raw.ndim == 1:
        values, codes = _fill_1d(axes[0], raw, s)
    else:
        values = raw.copy()
        codes = np.full(raw.shape, MEASURED, dtype=np.int8)
        for i in range(raw.shape[0]):  # along kv_len within each batch row
            if np.isfinite(raw[i]).any():
                values[i], codes[i] = _fill_1d(axes[1], raw[i], s[i])
        empty = ~np.isfinite(values[:, 0])
        if empty.any():  # whole rows unmeasured: fill along batch, flag as clamped
            for j in range(raw.shape[1]):
                values[:, j], _ = _fill_1d(axes[0], values[:, j], s[:, j])
            codes[empty] = CLAMPED
    for ax in range(values.ndim):
        values = np.maximum.accumulate(values, axis=ax)
    if plateau_from is not None:  # sliding window: hold the plateau from the window on
        cols = axes[1] >= plateau_from
        if cols.any():
            values[:, cols] = values[:, -1:]
            codes[:, cols] = codes[:, -1:]
    return _Prepared(axes, values, codes, sol)


def _bracket(x: np.ndarray, q: np.ndarray):
    qc = np.clip(q, x[0], x[-1])
    i = np.clip(np.searchsorted(x, qc, side="right") - 1, 0, max(x.size - 2, 0))
    if x.size == 1:
        return qc, i, np.zeros_like(qc)
    t = (qc - x[i]) / (x[i + 1] - x[i])
    return qc, i, t


def _interp(prep: _Prepared, coords: list[np.ndarray]) -> Result:
    """Piecewise-linear (bilinear) lookup with edge scaling and source codes."""
    if len(coords) == 1:
        x = prep.axes[0]
        qc, i, t = _bracket(x, coords[0])
        j = np.minimum(i + 1, x.size - 1)
        v = prep.values
        val = v[i] * (1 - t) + v[j] * t
        code = np.where(
            t == 0,
            prep.codes[i],
            np.where(
                t == 1,
                prep.codes[j],
                np.maximum(INTERPOLATED, np.maximum(prep.codes[i], prep.codes[j])),
            ),
        )
        on_grid = (t == 0) | (t == 1)
        clamped_q = [qc]
    else:
        (xb, xk), v, c = prep.axes, prep.values, prep.codes
        bc, i, tb = _bracket(xb, coords[0])
        kc, j, tk = _bracket(xk, coords[1])
        i1, j1 = np.minimum(i + 1, xb.size - 1), np.minimum(j + 1, xk.size - 1)
        w = ((1 - tb) * (1 - tk), (1 - tb) * tk, tb * (1 - tk), tb * tk)
        corners = ((i, j), (i, j1), (i1, j), (i1, j1))
        val = sum(wi * v[a, b] for wi, (a, b) in zip(w, corners, strict=True))
        code = np.zeros(val.shape, dtype=np.int8)
        for wi, (a, b) in zip(w, corners, strict=True):
            code = np.maximum(code, np.where(wi > 0, c[a, b], 0))
        on_grid = ((tb == 0) | (tb == 1)) & ((tk == 0) | (tk == 1))
        clamped_q = [bc, kc]
    code = np.where(on_grid, code, np.maximum(code, INTERPOLATED)).astype(np.int8)
    outside = np.zeros(val.shape, dtype=bool)
    for q, qc in zip(coords, clamped_q, strict=True):
        outside |= q != qc
    if outside.any():
        ratio = prep.sol(*coords) / np.maximum(prep.sol(*clamped_q), 1e-12)
        val = np.where(outside, val * np.maximum(ratio, 1.0), val)
        code = np.where(outside, np.maximum(code, CLAMPED), code).astype(np.int8)
    return val, code


# ----------------------------------------------------------------------------- efficiency


def efficiency(ps: ProfileSet) -> tuple[rf.Efficiency, bool]:
    """(fitted efficiency, True) for a set with GEMM/attention tables, else (default, False)."""
    report = rf.fit_efficiency(ps)
    if report is None:
        return rf.DEFAULT_EFFICIENCY, False
    return report.efficiency, True


def shipped_efficiencies(profiles_dir: Path, backend: str = "vllm") -> dict:
    """gpu -> (bandwidth GB/s, bf16 TFLOPS, Efficiency) for every measured GPU under a folder.

    Feed it to `roofline.nearest_efficiency` to cost a GPU without tables.
    """
    out = {}
    for gpu in available_gpus(profiles_dir):
        try:
            ps = load_profile_set(profiles_dir, gpu, backend)
        except UserError:  # a GPU folder without this backend is skipped
            continue
        eff, fitted = efficiency(ps)
        if fitted:
            out[gpu] = (ps.system.memory_bandwidth_gbps, ps.system.peak("bfloat16"), eff)
    return out


# ----------------------------------------------------------------------------- generic


@dataclass(frozen=True)
class _Kind:
    """How one kernel family is costed: work model, distance between shapes, overhead."""

    name: str
    work: Callable[..., tuple[np.ndarray, np.ndarray]]  # (key, *coords) -> (bytes, flops)
    distance: Callable[[tuple, tuple], float]  # (query key, candidate key) -> >= 0 or inf
    attention_overhead: bool = False


def _log_gap(a: float, b: float) -> float:
    return abs(math.log(max(a, 1e-9) / max(b, 1e-9)))


def _model(ps: ProfileSet, kind: _Kind, key: tuple, coords: list[np.ndarray]) -> np.ndarray:
    eff, _ = efficiency(ps)
    nbytes, flops = kind.work(key, *coords)
    c = eff.attention_overhead_us if kind.attention_overhead else None
    return rf.roofline_us(
        nbytes, flops, _bandwidth(ps, kind), ps.system.peak(str(key[0])), eff, overhead_us=c
    )


def _bandwidth(ps: ProfileSet, kind: _Kind) -> float:
    if kind.name == "allreduce":
        return ps.system.intra_node_bandwidth_gbps
    return ps.system.memory_bandwidth_gbps


def _sol_for(ps: ProfileSet, kind: _Kind, key: tuple):
    bw, peak = _bandwidth(ps, kind), ps.system.peak(str(key[0]))

    def sol(*coords):
        nbytes, flops = kind.work(key, *coords)
        return rf.sol_us(nbytes, flops, bw, peak)

    return sol


def _prepared(ps: ProfileSet, kind: _Kind, key: tuple) -> _Prepared:
    ck = ("prep", kind.name, key)
    prep = ps.cache.get(ck)
    if prep is None:
        table = ps.tables[kind.name]
        plateau = key[4] if kind.name == "attention" and key[4] > 0 else None
        prep = _prepare(table.grids[key], table.axis_arrays, _sol_for(ps, kind, key), plateau)
        ps.cache[ck] = prep
    return prep


def _resolve(ps: ProfileSet, kind: _Kind, key: tuple) -> tuple | None:
    """The measured key to use for `key`: itself, the nearest shape, or None."""
    ck = ("resolve", kind.name, key)
    if ck in ps.cache:
        return ps.cache[ck]
    table = ps.tables.get(kind.name)
    best = None
    if table is not None:
        if key in table.grids:
            best = key
        else:
            scored = [(kind.distance(key, cand), cand) for cand in table.grids]
            scored = [sc for sc in scored if math.isfinite(sc[0])]
            if scored:
                best = min(scored, key=lambda sc: (sc[0], str(sc[1])))[1]
    ps.cache[ck] = best
    return best


def _prepared_for(ps: ProfileSet, kind: _Kind, key: tuple) -> _Prepared | None:
    """Grid for `key`: its own measurements, or the nearest shape's grid scaled (FITTED).

    The scaled grid is the proxy's grid times the calibrated-roofline ratio
    model(key) / model(proxy) at every grid point, made monotone again with a
    running max, so FITTED lookups obey the same interpolation and edge rules.
    """
    ck = ("for", kind.name, key)
    if ck in ps.cache:
        return ps.cache[ck]
    use = _resolve(ps, kind, key)
    prep = None
    if use is not None:
        prep = _prepared(ps, kind, use)
        if use != key:
            mesh = np.meshgrid(*prep.axes, indexing="ij")
            values = prep.values * (_model(ps, kind, key, mesh) / _model(ps, kind, use, mesh))
            for ax in range(values.ndim):
                values = np.maximum.accumulate(values, axis=ax)
            codes = np.maximum(prep.codes, FITTED).astype(np.int8)
            prep = _Prepared(prep.axes, values, codes, _sol_for(ps, kind, key))
    ps.cache[ck] = prep
    return prep


def _lookup(ps: ProfileSet, kind: _Kind, key: tuple, coords: list[np.ndarray]) -> Result:
    coords = [np.asarray(c, dtype=np.float64) for c in np.broadcast_arrays(*coords)]
    prep = _prepared_for(ps, kind, key)
    if prep is None:
        _, fitted = efficiency(ps)
        val = _model(ps, kind, key, coords)
        code = np.full(val.shape, FITTED if fitted else ROOFLINE, dtype=np.int8)
        return val, code
    return _interp(prep, coords)


def _dtype_gate(a: str, b: str) -> float:
    return 0.0 if a == b else math.inf


# ----------------------------------------------------------------------------- GEMM


def _gemm_work(key, m):
    dtype, n, k = key
    return rf.gemm_work(m, n, k, dtype)


_GEMM = _Kind(
    "gemm",
    _gemm_work,
    lambda q, c: _dtype_gate(q[0], c[0]) + _log_gap(q[1], c[1]) + _log_gap(q[2], c[2]),
)


def gemm(ps: ProfileSet, m, n: int, k: int, dtype: str = "bfloat16") -> Result:
    """Latency (µs) of ``[m, k] @ [k, n]`` for an array of token counts `m`.

    `n`, `k` are the per-GPU (post-sharding) output and input features; `dtype`
    one of the table's GEMM dtypes (bfloat16, fp8, fp8_block where measured).
    """
    return _lookup(ps, _GEMM, (dtype, int(n), int(k)), [m])


# ----------------------------------------------------------------------------- attention


def _attn_work(key, batch, kv_len):
    kv_dtype, nh, nkv, hd, window = key
    if window > 0:
        kv_len = np.minimum(kv_len, window)
    return rf.attention_work(batch, nh, nkv, hd, kv_len, kv_dtype)


def _attn_distance(q: tuple, c: tuple) -> float:
    if c[4] not in (0, q[4]):
        return math.inf
    d = 0.0 if c[0] == q[0] else 4.0  # other KV dtype only as a last resort
    d += _log_gap(q[2] * q[3], c[2] * c[3]) + 0.5 * _log_gap(q[1], c[1])
    d += 0.5 * _log_gap(q[3], c[3])
    return d + (0.0 if c[4] == q[4] else 0.25)


_ATTN = _Kind("attention", _attn_work, _attn_distance, attention_overhead=True)


def decode_attention(
    ps: ProfileSet,
    batch,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    kv_len,
    window: int = 0,
    kv_dtype: str = "bfloat16",
) -> Result:
    """Latency (µs) of one decode-attention layer call on one GPU.

    `batch` (requests) and `kv_len` (tokens in the KV cache, including the new
    one) broadcast against each other. Head counts are per GPU (after TP).
    `window` > 0 is a sliding window: the effective KV length is
    ``min(kv_len, window)``, so latency stops growing past the window.
    """
    window = int(window or 0)
    kv = np.asarray(kv_len, dtype=np.float64)
    if window > 0:
        kv = np.minimum(kv, window)
    key = (kv_dtype, int(n_heads), int(n_kv_heads), int(head_dim), window)
    return _lookup(ps, _ATTN, key, [batch, kv])


# ----------------------------------------------------------------------------- MLA


def _mla_work(key, batch, kv_len):
    kv_dtype, gemm_dtype, nh = key
    return rf.mla_work(batch, nh, kv_len, kv_dtype, gemm_dtype)


_MLA = _Kind(
    "mla",
    _mla_work,
    lambda q, c: (
        (0.0 if q[0] == c[0] else 2.0) + (0.0 if q[1] == c[1] else 1.0) + _log_gap(q[2], c[2])
    ),
    attention_overhead=True,
)


def mla_decode(
    ps: ProfileSet,
    batch,
    n_heads: int,
    kv_len,
    kv_dtype: str = "bfloat16",
    gemm_dtype: str = "bfloat16",
) -> Result:
    """Latency (µs) of a DeepSeek-V3-shaped MLA decode module (projections + attention).

    `n_heads` is per GPU (128 / TP for DeepSeek-V3); `kv_len` is the context length.
    """
    return _lookup(ps, _MLA, (kv_dtype, gemm_dtype, int(n_heads)), [batch, kv_len])


# ----------------------------------------------------------------------------- MoE


def _moe_work(key, tokens):
    dtype, hidden, inter, topk, n_experts, tp, ep = key
    return rf.moe_work(tokens, hidden, inter, topk, n_experts, tp, ep, dtype)


def _moe_distance(q: tuple, c: tuple) -> float:
    if q[0] != c[0]:
        return math.inf
    return sum(_log_gap(a, b) for a, b in zip(q[1:], c[1:], strict=True))


_MOE = _Kind("moe", _moe_work, _moe_distance)


def moe(
    ps: ProfileSet,
    tokens,
    hidden: int,
    inter: int,
    topk: int,
    n_experts: int,
    tp: int = 1,
    ep: int = 1,
    dtype: str = "bfloat16",
) -> Result:
    """Latency (µs) of a fused MoE layer on one GPU, balanced routing.

    `tokens` is the number of tokens entering the layer on this GPU (before
    top-k replication); `inter` is the full expert intermediate size (the
    table's convention), sharded by `tp`; experts are split over `ep` GPUs.
    """
    key = (dtype, int(hidden), int(inter), int(topk), int(n_experts), int(tp), int(ep))
    return _lookup(ps, _MOE, key, [tokens])


# ----------------------------------------------------------------------------- all-reduce


def _ar_work(key, message_bytes):
    _dtype, n_gpus = key
    return rf.allreduce_work(n_gpus, message_bytes), np.zeros_like(message_bytes)


_AR = _Kind(
    "allreduce",
    _ar_work,
    lambda q, c: (0.0 if q[0] == c[0] else 1.0) + _log_gap(q[1], c[1]),
)


def allreduce(ps: ProfileSet, n_gpus: int, message_bytes, dtype: str = "bfloat16") -> Result:
    """Latency (µs) of an intra-node tensor-parallel all-reduce of `message_bytes` per GPU.

    One GPU costs nothing (MEASURED zeros). Group sizes not in the table are
    scaled from the nearest measured size by the ring-all-reduce model (FITTED).
    """
    msg = np.asarray(message_bytes, dtype=np.float64)
    if int(n_gpus) <= 1:
        return np.zeros(msg.shape), np.zeros(msg.shape, dtype=np.int8)
    return _lookup(ps, _AR, (dtype, int(n_gpus)), [msg])
