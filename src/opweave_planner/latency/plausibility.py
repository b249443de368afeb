"""Physical plausibility of kernel latencies: speed-of-light floors, upper bounds, untrusted families.

A decode kernel cannot finish faster than its speed-of-light time
``max(bytes / DRAM bandwidth, FLOPs / peak)`` (all-reduces: ring bytes over the
intra-node link), whatever a micro-benchmark with an L2-resident working set
reports, so every imported cell is floored there (labelled "floored"). A cell
may be slow for good reasons (launch cost, small tiles), but not without
bound: it must stay below ``UPPER_MULTIPLE`` x its speed-of-light time plus
``UPPER_ALLOWANCE_US`` (a few launches and synchronisations). The work models
are those of `roofline`; one function per kernel family maps a table key and
its coordinates to (bytes, FLOPs), shared by the lookups and the importer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from opweave_planner.latency import roofline as rf

__all__ = [
    "GEMM_FALLBACK",
    "UNTRUSTED_RATIO",
    "UPPER_ALLOWANCE_US",
    "UPPER_MULTIPLE",
    "compute_dtype",
    "kind_work",
    "link_bound",
    "sol_floor",
    "untrusted_gemm_dtypes",
]

#: cells must stay below UPPER_MULTIPLE x speed of light + UPPER_ALLOWANCE_US
UPPER_MULTIPLE = 8.0
UPPER_ALLOWANCE_US = 60.0
#: a GEMM dtype is untrusted when its small-m median latency exceeds this multiple of
#: the same shapes in its trusted sibling dtype (the fp8_block floor on H100)
UNTRUSTED_RATIO = 2.0
#: dtype -> the family a lookup falls back to when the dtype's table is untrusted or absent
GEMM_FALLBACK = {"fp8_block": "fp8"}


def _gemm(key, m):
    dtype, n, k = key
    return rf.gemm_work(m, n, k, dtype)


def _attention(key, batch, kv_len):
    kv_dtype, nh, nkv, hd, window = key
    if window > 0:
        kv_len = np.minimum(kv_len, window)
    return rf.attention_work(batch, nh, nkv, hd, kv_len, kv_dtype)


def _mla(key, batch, kv_len):
    kv_dtype, gemm_dtype, nh = key
    return rf.mla_work(batch, nh, kv_len, kv_dtype, gemm_dtype)


def _moe(key, tokens):
    dtype, hidden, inter, topk, n_experts, tp, ep, routing = key
    return rf.moe_work(tokens, hidden, inter, topk, n_experts, tp, ep, dtype, routing=routing)


def _allreduce(key, message_bytes):
    _dtype, n_gpus = key
    return rf.allreduce_work(n_gpus, message_bytes), np.zeros_like(np.asarray(message_bytes, float))


def _context_attention(key, batch, seq_len):
    kv_dtype, nh, nkv, hd, window = key
    return rf.context_attention_work(batch, nh, nkv, hd, seq_len, window, kv_dtype)


def _mla_context(key, batch, seq_len):
    kv_dtype, gemm_dtype, nh = key
    return rf.mla_context_work(batch, nh, seq_len, kv_dtype, gemm_dtype)


def _linear_attention(key, batch, seq_len):
    return rf.linear_attention_work(batch, *key, seq_len)


_WORK: dict[str, Callable] = {
    "context_attention": _context_attention,
    "mla_context": _mla_context,
    "linear_attention": _linear_attention,
    "gemm": _gemm,
    "attention": _attention,
    "mla": _mla,
    "moe": _moe,
    "allreduce": _allreduce,
}


def kind_work(kind: str, key: tuple, *coords) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, FLOPs) of one call of a table's kernel at `coords` (broadcast arrays)."""
    return _WORK[kind](key, *coords)


def link_bound(kind: str) -> bool:
    """True when the family is bound by the intra-node link rather than DRAM."""
    return kind == "allreduce"


def compute_dtype(kind: str, key: tuple) -> str:
    """The dtype whose tensor-core peak bounds the kernel (MLA: its GEMM dtype)."""
    if kind == "linear_attention":
        return "bfloat16"
    return str(key[1] if kind in ("mla", "mla_context") else key[0])


def sol_floor(kind: str, bandwidth_gbps: float, link_gbps: float,
              peaks: Mapping[str, float]) -> Callable[[tuple, list[np.ndarray]], np.ndarray]:
    """`floor(key, coords) -> µs`: the speed-of-light time of a family's cells on one GPU."""
    bw = link_gbps if link_bound(kind) else bandwidth_gbps

    def floor(key: tuple, coords: list[np.ndarray]) -> np.ndarray:
        nbytes, flops = kind_work(kind, key, *coords)
        dt = _peak_dtype(compute_dtype(kind, key))
        return rf.sol_us(nbytes, flops, bw, peaks.get(dt, peaks["bfloat16"]))

    return floor


def _peak_dtype(dtype: str) -> str:
    if dtype.startswith("fp8"):
        return "fp8"
    return "int8" if dtype == "int8" else "bfloat16"


def untrusted_gemm_dtypes(points: Mapping[tuple, float]) -> dict[str, float]:
    """dtype -> median (dtype / sibling) latency ratio at m <= 16, for dtypes judged implausible.

    A block-scaled fp8 GEMM moves the same bytes as a per-tensor fp8 one plus
    ~1% of scales; a median small-m ratio above `UNTRUSTED_RATIO` over the
    shapes both measure is a measurement problem, not physics.
    """
    out = {}
    for dtype, sibling in GEMM_FALLBACK.items():
        ratios = [
            lat / points[(sibling, *rest)]
            for (dt, *rest), lat in points.items()
            if dt == dtype and rest[-1] <= 16 and (sibling, *rest) in points
        ]
        if ratios:
            med = float(np.median(ratios))
            if med > UNTRUSTED_RATIO:
                out[dtype] = med
    return out
