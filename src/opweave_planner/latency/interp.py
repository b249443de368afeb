"""Kernel-level latency lookups over a ProfileSet, vectorised over tokens / batch / KV length.

Every function returns ``(latency_us, source)``: a float64 array in microseconds
per kernel call on one GPU and an int8 array of source codes, broadcast over the
array arguments:

==============  =  =============================================================
MEASURED        0  a measured grid point of the exact shape (the shipped value is
                   within `monotone.KEEP_TOL` of the measurement)
INTERPOLATED    1  between measured points of the exact shape (piecewise linear)
SMOOTHED        2  a cell the robust monotone fit moved by more than KEEP_TOL
FLOORED         3  a cell measured faster than speed of light, raised to it
CLAMPED         4  beyond a continuous axis edge, or a cell the source did not
                   measure: nearest edge value scaled by the speed-of-light ratio
                   (utilisation held constant; below the first point: held flat)
FITTED          5  shape or family not measured (or untrusted): nearest measured
                   shape scaled by the ratio of the calibrated roofline, a sibling
                   dtype's table (fp8_block -> fp8), or the calibrated roofline
ROOFLINE        6  no table and no fitted efficiency: default-efficiency roofline
==============  =  =============================================================

Rules (see docs/profiles.md):

* continuous axes (GEMM ``m``, MoE ``tokens``, attention ``batch`` x ``kv_len``,
  all-reduce ``message_bytes``) are interpolated piecewise-linearly (bilinearly
  in 2-D) in linear space; categorical fields must match exactly, else the
  nearest measured shape is scaled (FITTED); a family, dtype or attention head
  layout this GPU did not measure is taken from a GPU with at least its
  bandwidth and compute, scaled by the calibrated-roofline ratio (FITTED);
* every value is at least the speed-of-light time on the GPU description in
  effect (FLOORED where that raises a stored cell);
* shipped tables are already monotone (robust fit at import, `monotone`); a
  prepared grid whose filled cells break that is made monotone by a running
  maximum, and a stored cell it raises by more than KEEP_TOL is SMOOTHED;
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
from opweave_planner.latency import plausibility as pl
from opweave_planner.latency import roofline as rf
from opweave_planner.latency.monotone import KEEP_TOL
from opweave_planner.latency.tables import ProfileSet, available_gpus, load_profile_set

__all__ = [
    "CLAMPED",
    "DEFAULT_MOE_ROUTING",
    "FITTED",
    "FLOORED",
    "MOE_ROUTINGS",
    "INTERPOLATED",
    "MEASURED",
    "ROOFLINE",
    "SMOOTHED",
    "SOURCE_LEGEND",
    "SOURCE_NAMES",
    "SOURCE_SHORT",
    "allreduce",
    "context_attention",
    "decode_attention",
    "efficiency",
    "gemm",
    "linear_attention",
    "mla_context",
    "mla_decode",
    "moe",
    "shipped_efficiencies",
]

MEASURED, INTERPOLATED, SMOOTHED, FLOORED, CLAMPED, FITTED, ROOFLINE = range(7)
SOURCE_NAMES = ("measured", "interpolated", "smoothed", "floored", "clamped", "fitted", "roofline")
#: one-letter tags and their legend, for tables that print a source per figure
SOURCE_SHORT = {"measured": "M", "interpolated": "I", "smoothed": "S", "floored": "L",
                "clamped": "C", "fitted": "F", "roofline": "R"}
SOURCE_LEGEND = ("M measured, I interpolated, S smoothed by the monotone fit, L floored at speed "
                 "of light, C clamped at a table edge, F fitted (scaled shape, family or GPU), "
                 "R default roofline")
#: routed-expert load of the fused-MoE tables; default and reason: docs/profiles.md
MOE_ROUTINGS = ("balanced", "power-law")
DEFAULT_MOE_ROUTING = "power-law"

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


def _prepare(raw: np.ndarray, axes: tuple[np.ndarray, ...], sol, plateau_from=None,
             labels: np.ndarray | None = None) -> _Prepared:
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
    below = values < s * (1 - 1e-3)  # hardware facts overridden (catalog): floor at their SOL
    values = np.where(below, s, values)
    before = values
    for ax in range(values.ndim):
        values = np.maximum.accumulate(values, axis=ax)
    stored = np.isfinite(raw)
    codes = np.where(stored & (values > before * (1 + KEEP_TOL)), np.maximum(codes, SMOOTHED), codes)
    if labels is not None:  # the importer's labels: smoothed / floored cells
        codes = np.where(stored & (labels > 0), np.maximum(codes, labels + INTERPOLATED), codes)
    codes = np.where(stored & below, np.maximum(codes, FLOORED), codes)
    codes = codes.astype(np.int8)
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
    """How one kernel family is costed: its table, distance between shapes, overhead."""

    name: str
    distance: Callable[[tuple, tuple], float]  # (query key, candidate key) -> >= 0 or inf
    attention_overhead: bool = False

    def work(self, key: tuple, *coords):
        return pl.kind_work(self.name, key, *coords)


def _log_gap(a: float, b: float) -> float:
    return abs(math.log(max(a, 1e-9) / max(b, 1e-9)))


def _peak(ps: ProfileSet, kind: _Kind, key: tuple) -> float:
    return ps.system.peak(pl.compute_dtype(kind.name, key))


def _model(ps: ProfileSet, kind: _Kind, key: tuple, coords: list[np.ndarray]) -> np.ndarray:
    """Calibrated roofline of `key`; MoE uses the balanced expert count (an estimate, not a bound)."""
    eff, _ = efficiency(ps)
    if kind.name == "moe":
        key = (*key[:-1], "balanced")
    nbytes, flops = kind.work(key, *coords)
    c = eff.attention_overhead_us if kind.attention_overhead else None
    return rf.roofline_us(nbytes, flops, _bandwidth(ps, kind), _peak(ps, kind, key), eff, overhead_us=c)


def _bandwidth(ps: ProfileSet, kind: _Kind) -> float:
    if pl.link_bound(kind.name):
        return ps.system.intra_node_bandwidth_gbps
    return ps.system.memory_bandwidth_gbps


def _sol_for(ps: ProfileSet, kind: _Kind, key: tuple):
    bw, peak = _bandwidth(ps, kind), _peak(ps, kind, key)

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
        prep = _prepare(table.grids[key], table.axis_arrays, _sol_for(ps, kind, key), plateau,
                        table.labels.get(key))
        ps.cache[ck] = prep
    return prep


def _resolve(ps: ProfileSet, kind: _Kind, key: tuple) -> tuple | None:
    """The measured key to use for `key`: itself, the nearest shape, or None.

    A GEMM dtype the table lacks (dropped as implausible at import) is searched
    under its fallback family (fp8_block -> fp8).
    """
    ck = ("resolve", kind.name, key)
    if ck in ps.cache:
        return ps.cache[ck]
    table = ps.tables.get(kind.name)
    best = None
    want = key
    if kind.name == "gemm" and table is not None:
        sibling = pl.GEMM_FALLBACK.get(key[0])
        have = _gemm_dtypes(ps)
        if key[0] not in have and sibling in have:
            want = (sibling, *key[1:])
    if table is not None:
        if want in table.grids:
            best = want
        else:
            scored = [(kind.distance(want, cand), cand) for cand in table.grids]
            scored = [sc for sc in scored if math.isfinite(sc[0])]
            if scored:
                best = min(scored, key=lambda sc: (sc[0], str(sc[1])))[1]
    ps.cache[ck] = best
    return best


def _donor(ps: ProfileSet, kind: _Kind, key: tuple, exact: bool = False) -> ProfileSet | None:
    """Another measured GPU (same folder and backend) with a usable table for `key`.

    Preference: GPUs with at least this GPU's bandwidth and bf16 peak (so the
    scaled figure keeps their measured fixed costs and never undercuts them),
    nearest in (log bandwidth, log peak); else the nearest of all. `exact`:
    only dominating GPUs that measured `key` itself.
    """
    ck = ("donor", kind.name, key, exact)
    if ck in ps.cache:
        return ps.cache[ck]
    bw, peak = ps.system.memory_bandwidth_gbps, ps.system.peak("bfloat16")
    scored = []
    for gid in available_gpus(ps.root):
        if gid == ps.gpu:
            continue
        try:
            other = load_profile_set(ps.root, gid, ps.backend)
        except UserError:
            continue
        if kind.name not in other.tables:
            continue
        obw, opeak = other.system.memory_bandwidth_gbps, other.system.peak("bfloat16")
        dominated = obw >= bw and opeak >= peak
        # `exact` asks the hardware first and then for `key` itself (what `_resolve` returns
        # when the table has it): no table read for a GPU that cannot donate, no nearest scan
        if exact and (not dominated or key not in other.tables[kind.name].grids):
            continue
        if _resolve(other, kind, key) is None:
            continue
        dist = math.hypot(math.log(obw / bw), math.log(opeak / peak))
        scored.append((not dominated, dist, gid, other))
    best = min(scored, key=lambda sc: sc[:3])[3] if scored else None
    ps.cache[ck] = best
    return best


def _scaled(ps: ProfileSet, kind: _Kind, key: tuple, src: ProfileSet, use: tuple) -> _Prepared:
    """`src`'s prepared grid of `use`, scaled to `key` on `ps` by the calibrated-roofline ratio
    point by point, made monotone and floored at `key`'s speed of light on `ps` (FITTED)."""
    prep = _prepared(src, kind, use)
    mesh = np.meshgrid(*prep.axes, indexing="ij")
    values = prep.values * (_model(ps, kind, key, mesh) / _model(src, kind, use, mesh))
    for ax in range(values.ndim):
        values = np.maximum.accumulate(values, axis=ax)
    sol = _sol_for(ps, kind, key)
    values = np.maximum(values, sol(*mesh))
    codes = np.maximum(prep.codes, FITTED).astype(np.int8)
    return _Prepared(prep.axes, values, codes, sol)


def _bracket_values(axis: tuple[int, ...], v: int) -> tuple[int, int] | None:
    """The measured values either side of `v` on a sorted axis (equal when `v` is one), or None."""
    i = int(np.searchsorted(axis, v))
    if i < len(axis) and axis[i] == v:
        return axis[i], axis[i]
    if i == 0 or i == len(axis):
        return None
    return axis[i - 1], axis[i]


def _between_shapes(ps: ProfileSet, key: tuple) -> _Prepared | None:
    """A GEMM shape inside the measured (n, k) grid: bilinear in (n, k) between the four
    measured shapes around it, grid point by grid point in m (INTERPOLATED at best).

    aiconfigurator's tables are a full (n, k) grid of model-like widths (22 x 22 on the
    vLLM tables) and it serves any shape inside it from the measurements; a nearest-shape
    roofline scale (FITTED) would throw the neighbours' measurements away. Needs all four
    corners measured in the same dtype; else None (the nearest-shape rule applies). A dtype
    dropped at import reads its sibling's grid (fp8_block -> fp8), FITTED.
    """
    dtype, n, k = key
    table = ps.tables["gemm"]
    label = INTERPOLATED
    if dtype not in _gemm_dtypes(ps) and pl.GEMM_FALLBACK.get(dtype) in _gemm_dtypes(ps):
        dtype, label = pl.GEMM_FALLBACK[dtype], FITTED  # an untrusted family reads its sibling
    ck = ("gemm_nk", dtype)
    if ck not in ps.cache:
        shapes = {(c[1], c[2]) for c in table.grids if c[0] == dtype}
        ps.cache[ck] = (shapes, tuple(sorted({s[0] for s in shapes})), tuple(sorted({s[1] for s in shapes})))
    shapes, ns, ks = ps.cache[ck]
    bn, bk = _bracket_values(ns, n), _bracket_values(ks, k)
    if bn is None or bk is None or not all((a, b) in shapes for a in bn for b in bk):
        return None
    tn = 0.0 if bn[0] == bn[1] else (n - bn[0]) / (bn[1] - bn[0])
    tk = 0.0 if bk[0] == bk[1] else (k - bk[0]) / (bk[1] - bk[0])
    values = 0.0
    codes = np.full(table.axis_arrays[0].shape, label, np.int8)
    for a, wa in zip(bn, (1 - tn, tn), strict=True):
        for b, wb in zip(bk, (1 - tk, tk), strict=True):
            prep = _prepared(ps, _GEMM, (dtype, a, b))
            values = values + wa * wb * prep.values
            if wa * wb > 0:
                codes = np.maximum(codes, prep.codes)
    for ax in range(values.ndim):
        values = np.maximum.accumulate(values, axis=ax)
    sol = _sol_for(ps, _GEMM, key)
    floor = sol(*np.meshgrid(*table.axis_arrays, indexing="ij"))
    codes = np.where(values < floor * (1 - 1e-3), np.maximum(codes, FLOORED), codes).astype(np.int8)
    return _Prepared(table.axis_arrays, np.maximum(values, floor), codes, sol)


def _prepared_for(ps: ProfileSet, kind: _Kind, key: tuple) -> _Prepared | None:
    """Grid for `key`: its own measurements, the nearest shape's grid scaled, or (family or
    dtype not measured on this GPU, or an attention layout only a dominating GPU measured)
    a donor GPU's grid scaled (`_scaled`, FITTED).

    Scaling keeps the interpolation, edge and floor rules of measured lookups.
    """
    ck = ("for", kind.name, key)
    if ck in ps.cache:
        return ps.cache[ck]
    # a GEMM shape the table lacks, inside its grid: no nearest-shape scan (four measured
    # corners of the dtype `_resolve` would search mean it finds a shape, and not `key`)
    between = kind.name == "gemm" and "gemm" in ps.tables and key not in ps.tables["gemm"].grids
    prep = _between_shapes(ps, key) if between else None
    if prep is not None:
        ps.cache[ck] = prep
        return prep
    use = _resolve(ps, kind, key)
    # attention kernels depend on the exact head layout: a dominating GPU that measured this
    # layout beats this GPU's nearest other layout (A100 has head_dim 128 only)
    same = _donor(ps, kind, key, exact=True) if use not in (None, key) and kind.name == "attention" else None
    if same is not None:
        prep = _scaled(ps, kind, key, same, key)
    elif use is not None:
        prep = _prepared(ps, kind, use) if use == key else _scaled(ps, kind, key, ps, use)
    else:
        donor = _donor(ps, kind, key)
        if donor is not None:
            prep = _scaled(ps, kind, key, donor, _resolve(donor, kind, key))
    ps.cache[ck] = prep
    return prep


def _lookup(ps: ProfileSet, kind: _Kind, key: tuple, coords: list[np.ndarray]) -> Result:
    coords = [np.asarray(c, dtype=np.float64) for c in np.broadcast_arrays(*coords)]
    prep = _prepared_for(ps, kind, key)
    if prep is None:
        _, fitted = efficiency(ps)
        val = np.maximum(_model(ps, kind, key, coords), _sol_for(ps, kind, key)(*coords))
        code = np.full(val.shape, FITTED if fitted else ROOFLINE, dtype=np.int8)
        return val, code
    return _interp(prep, coords)


def _dtype_gate(a: str, b: str) -> float:
    return 0.0 if a == b else math.inf


# ----------------------------------------------------------------------------- GEMM


_GEMM = _Kind(
    "gemm",
    lambda q, c: _dtype_gate(q[0], c[0]) + _log_gap(q[1], c[1]) + _log_gap(q[2], c[2]),
)


def _gemm_dtypes(ps: ProfileSet) -> frozenset:
    ck = ("gemm_dtypes",)
    if ck not in ps.cache:
        table = ps.tables.get("gemm")
        ps.cache[ck] = frozenset(k[0] for k in table.grids) if table is not None else frozenset()
    return ps.cache[ck]


def gemm(ps: ProfileSet, m, n: int, k: int, dtype: str = "bfloat16") -> Result:
    """Latency (µs) of ``[m, k] @ [k, n]`` for an array of token counts `m`.

    `n`, `k` are the per-GPU (post-sharding) output and input features; `dtype`
    one of the table's GEMM dtypes (bfloat16, fp8, fp8_block where measured).
    A dtype the table lacks (dropped as implausible at import, e.g. H100
    fp8_block) is read from its fallback family (fp8) of the same shape, FITTED.
    """
    return _lookup(ps, _GEMM, (dtype, int(n), int(k)), [m])


# ----------------------------------------------------------------------------- attention


def _attn_distance(q: tuple, c: tuple) -> float:
    if c[4] not in (0, q[4]):
        return math.inf
    d = 0.0 if c[0] == q[0] else 4.0  # other KV dtype only as a last resort
    d += _log_gap(q[2] * q[3], c[2] * c[3]) + 0.5 * _log_gap(q[1], c[1])
    d += _log_gap(q[3], c[3])  # the kernel path depends on head_dim: keep it where possible
    return d + (0.0 if c[4] == q[4] else 0.25)


_ATTN = _Kind("attention", _attn_distance, attention_overhead=True)


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


# ----------------------------------------------------------------------------- prefill attention


_CTX_ATTN = _Kind("context_attention", _attn_distance, attention_overhead=True)


def context_attention(
    ps: ProfileSet,
    batch,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    seq_len,
    window: int = 0,
    kv_dtype: str = "bfloat16",
) -> Result:
    """Latency (µs) of one causal prefill-attention call over `seq_len` new tokens for each of
    `batch` requests with no cached prefix (aiconfigurator's context tables, step 0).

    Head counts are per GPU. A prefix is the caller's rule (`latency.prefill`).
    """
    key = (kv_dtype, int(n_heads), int(n_kv_heads), int(head_dim), int(window or 0))
    return _lookup(ps, _CTX_ATTN, key, [batch, seq_len])


_MLA_CTX = _Kind(
    "mla_context",
    lambda q, c: (
        (0.0 if q[0] == c[0] else 2.0) + (0.0 if q[1] == c[1] else 1.0) + _log_gap(q[2], c[2])
    ),
    attention_overhead=True,
)


def mla_context(ps: ProfileSet, batch, n_heads: int, seq_len, kv_dtype: str = "bfloat16",
                gemm_dtype: str = "bfloat16") -> Result:
    """Latency (µs) of a DeepSeek-V3-shaped MLA prefill module over `seq_len` new tokens."""
    return _lookup(ps, _MLA_CTX, (kv_dtype, gemm_dtype, int(n_heads)), [batch, seq_len])


_LINEAR = _Kind("linear_attention", lambda q, c: sum(_log_gap(a, b) for a, b in zip(q, c, strict=True)))


def linear_attention(ps: ProfileSet, batch, n_k_heads: int, k_dim: int, n_v_heads: int, v_dim: int,
                     seq_len) -> Result:
    """Latency (µs) of a Gated DeltaNet prefill (conv1d + chunked delta rule) per GPU."""
    return _lookup(ps, _LINEAR, (int(n_k_heads), int(k_dim), int(n_v_heads), int(v_dim)), [batch, seq_len])


# ----------------------------------------------------------------------------- MLA


_MLA = _Kind(
    "mla",
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


def _moe_distance(q: tuple, c: tuple) -> float:
    if q[0] != c[0]:
        return math.inf
    d = sum(_log_gap(a, b) for a, b in zip(q[1:7], c[1:7], strict=True))
    return d + (0.0 if q[7] == c[7] else 8.0)  # the other routing only as a last resort


_MOE = _Kind("moe", _moe_distance)


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
    routing: str = DEFAULT_MOE_ROUTING,
) -> Result:
    """Latency (µs) of a fused MoE layer on one GPU.

    `tokens` is the number of tokens entering the layer on this GPU (before
    top-k replication); `inter` is the full expert intermediate size (the
    table's convention), sharded by `tp`; experts are split over `ep` GPUs.
    `routing` picks the measured expert-load family: "balanced" (every expert
    equally loaded) or "power-law" (aiconfigurator's alpha = 1.2 skew).
    """
    if routing not in MOE_ROUTINGS:
        raise UserError(f"--moe-routing: expected one of {', '.join(MOE_ROUTINGS)}, got '{routing}'")
    key = (dtype, int(hidden), int(inter), int(topk), int(n_experts), int(tp), int(ep), routing)
    return _lookup(ps, _MOE, key, [tokens])


# ----------------------------------------------------------------------------- all-reduce


_AR = _Kind(
    "allreduce",
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
