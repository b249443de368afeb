"""Fit the six linear latency coefficients from measured (size, latency) samples.

Attention is fitted against the total token load of a microbatch, FFN against the
aggregated batch size and communication against the number of transferred requests.
Each line is a non-negative least-squares fit (a negative slope or intercept has no
physical meaning and would be rejected by ``LatencyCoefficients``); the residuals are
reported so a caller can see when the linear law does not hold.

``calibrate_from_profiles`` builds those samples from the project's profile-based
operator latencies (``opweave_planner.latency.lookup``) for a model, an attention GPU,
an FFN GPU and their parallelism; docs/afd.md describes the sampling and the units.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import nnls

from opweave_planner.afd.provisioning import LatencyCoefficients
from opweave_planner.errors import UserError


@dataclass(frozen=True)
class LineFit:
    """``latency ~ slope * size + intercept`` with its error measures."""

    slope: float
    intercept: float
    samples: int
    rmse: float
    max_abs_error: float
    max_rel_error: float
    r2: float

    def as_dict(self) -> dict:
        return asdict(self)


def fit_line(size, latency, name: str = "samples") -> LineFit:
    """Non-negative least-squares line through (size, latency) arrays."""
    x = np.asarray(size, dtype=np.float64).ravel()
    y = np.asarray(latency, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise UserError(
            f"{name}: expected equal-length size and latency arrays, got {x.size} and {y.size}"
        )
    if x.size < 2 or np.unique(x).size < 2:
        raise UserError(f"{name}: expected at least two distinct sizes to fit a line")
    if not (np.isfinite(x).all() and np.isfinite(y).all()) or (x < 0).any() or (y < 0).any():
        raise UserError(f"{name}: expected finite, non-negative sizes and latencies")
    design = np.column_stack([x, np.ones_like(x)])
    (slope, intercept), _ = nnls(design, y)
    resid = design @ np.array([slope, intercept]) - y
    ss_tot = float(((y - y.mean()) ** 2).sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(y > 0, np.abs(resid) / y, np.where(resid == 0, 0.0, np.inf))
    return LineFit(
        slope=float(slope),
        intercept=float(intercept),
        samples=int(x.size),
        rmse=float(math.sqrt((resid**2).mean())),
        max_abs_error=float(np.abs(resid).max()),
        max_rel_error=float(rel.max()),
        r2=1.0 - float((resid**2).sum()) / ss_tot if ss_tot > 0 else 1.0,
    )


@dataclass(frozen=True)
class Calibration:
    """Fitted coefficients plus the per-component fits they came from."""

    coefficients: LatencyCoefficients
    attention: LineFit
    ffn: LineFit
    communication: LineFit
    setup: dict | None = None  # what the samples came from (profile calibration only)

    def as_dict(self) -> dict:
        out = {
            "coefficients": self.coefficients.as_dict(),
            "attention": self.attention.as_dict(),
            "ffn": self.ffn.as_dict(),
            "communication": self.communication.as_dict(),
        }
        if self.setup is not None:
            out["setup"] = self.setup
        return out


def calibrate(attention, ffn, communication) -> Calibration:
    """Fit (alpha_A, beta_A), (alpha_F, beta_F), (alpha_C, beta_C).

    Each argument is a pair of arrays: attention (tokens, latency), FFN (batch, latency),
    communication (requests, latency), all latencies in one unit.
    """
    fits = {}
    for name, pair in (("attention", attention), ("ffn", ffn), ("communication", communication)):
        try:
            size, latency = pair
        except (TypeError, ValueError):
            raise UserError(
                f"{name} samples: expected a (sizes, latencies) pair of arrays"
            ) from None
        fits[name] = fit_line(size, latency, f"{name} samples")
    coef = LatencyCoefficients(
        alpha_a=fits["attention"].slope,
        beta_a=fits["attention"].intercept,
        alpha_f=fits["ffn"].slope,
        beta_f=fits["ffn"].intercept,
        alpha_c=fits["communication"].slope,
        beta_c=fits["communication"].intercept,
    )
    return Calibration(coef, fits["attention"], fits["ffn"], fits["communication"])


ATTENTION_BATCH_FRACTIONS = (1.0,)
"""Attention microbatch sizes sampled, as fractions of B.

Only B by default: the analysis evaluates t_A at batch B, and the Q/K/V/O projections
scale with the batch rather than with T, so mixing batch sizes into one T-line costs
accuracy at B (14-24 % max relative error with (0.5, 1.0) on H100; docs/afd.md)."""
CONTEXT_DIVISORS = (32, 16, 8, 4, 2, 1)
"""Per-request contexts sampled, as the maximum context divided by these."""
FFN_RATIOS = (1, 2, 4, 8, 16, 24, 32)
"""FFN and communication batches sampled: n = r B for these r (capped at max_ratio)."""


def calibrate_from_profiles(
    model: str,
    attn_gpu: str,
    ffn_gpu: str,
    *,
    attn_tp: int = 1,
    ffn_tp: int = 1,
    moe_ep: bool = False,
    context: int = 32768,
    batch: int = 256,
    max_ratio: int = 32,
    profiles_dir: str | None = None,
    backend: str = "vllm",
    hardware=None,
) -> Calibration:
    """Fit the six coefficients from profile-based operator latencies (µs per decode step).

    * attention: the attention-side operators of every layer (plus embedding and LM head)
      on one GPU of an ``attn_tp`` group, at microbatch sizes ``b`` in
      ``ATTENTION_BATCH_FRACTIONS * batch`` and per-request contexts ``c`` from
      ``context / 32`` to ``context``; regressed on the token load ``T = b c``;
    * FFN: the FFN-side operators of every layer on one GPU of an ``ffn_tp`` group (MoE
      experts split across it with ``moe_ep``) at ``n = r * batch`` for r in ``FFN_RATIOS``
      up to ``max_ratio``;
    * communication: one A->F (or F->A) hand-off per layer of ``n`` hidden states,
      ``L * (latency + n * hidden * act_bytes / inter-node bandwidth)``.
    """
    from opweave_planner.inputs.hardware import load_hardware
    from opweave_planner.inputs.model import load_model
    from opweave_planner.latency.lookup import SOURCE_NAMES, Parallel, op_latencies
    from opweave_planner.structure.operators import Side, build_sequence

    for name, value in (
        ("attn_tp", attn_tp),
        ("ffn_tp", ffn_tp),
        ("batch", batch),
        ("max_ratio", max_ratio),
    ):
        if int(value) != value or value < 1:
            raise UserError(f"{name}: expected an integer >= 1, got {value}")
    if context < 32:
        raise UserError(f"context: expected at least 32 tokens, got {context}")
    hw = hardware if hardware is not None else load_hardware()
    g_attn = hw.resolve(attn_gpu, "--attn-gpu")
    g_ffn = hw.resolve(ffn_gpu, "--ffn-gpu")
    spec = load_model(model)
    seq = build_sequence(spec)
    # the embedding and the LM head (Side.OTHER) stay with the requests, on the attention side
    ffn_mask = np.array([op.traits.side == Side.FFN for op in seq.ops])
    attn_mask = ~ffn_mask
    if moe_ep and not any(op.traits.experts for op in seq.ops):
        raise UserError(f"--ep: model {model} has no MoE layers to split across experts")

    attn_batches = tuple(sorted({max(1, round(f * batch)) for f in ATTENTION_BATCH_FRACTIONS}))
    contexts = tuple(sorted({max(1, context // d) for d in CONTEXT_DIVISORS}))
    par_a = Parallel(attn_tp, False)
    core_mask = np.array([op.traits.core for op in seq.ops])
    tok, lat_a, src_a, src_core = [], [], [], []
    for c in contexts:
        ol = op_latencies(seq, g_attn, par_a, c, attn_batches, profiles_dir, backend)
        tok.extend(b * c for b in attn_batches)
        lat_a.extend(ol.lat_us[attn_mask].sum(axis=0))
        src_a.extend(ol.source[attn_mask].max(axis=0))
        src_core.extend(ol.source[core_mask].max(axis=0))

    ratios = [r for r in FFN_RATIOS if r <= max_ratio] or [1]
    if max_ratio not in ratios and max_ratio > ratios[-1]:
        ratios.append(max_ratio)
    if len(ratios) < 2:
        ratios = [1, 2]
    n_ffn = tuple(r * batch for r in ratios)
    par_f = Parallel(ffn_tp, moe_ep)
    ol = op_latencies(seq, g_ffn, par_f, context, n_ffn, profiles_dir, backend)
    lat_f = ol.lat_us[ffn_mask].sum(axis=0)
    src_f = ol.source[ffn_mask].max(axis=0)

    net = hw.network
    layers = spec.n_layers
    per_request_bytes = spec.hidden_size * spec.act_bytes
    n_arr = np.asarray(n_ffn, dtype=np.float64)
    lat_c = layers * (
        net.inter_node_latency_us + n_arr * per_request_bytes / (net.inter_node_gbps * 1e3)
    )

    base = calibrate((tok, lat_a), (n_arr, lat_f), (n_arr, lat_c))

    def sources(src) -> dict[str, int]:
        vals, counts = np.unique(np.asarray(src, dtype=np.int64), return_counts=True)
        return {SOURCE_NAMES[v]: int(k) for v, k in zip(vals, counts)}

    setup = {
        "model": spec.name if hasattr(spec, "name") else model,
        "attn_gpu": g_attn.id,
        "ffn_gpu": g_ffn.id,
        "attn_tp": attn_tp,
        "ffn_tp": ffn_tp,
        "moe_ep": moe_ep,
        "context": context,
        "batch": batch,
        "backend": backend,
        "unit": "us per decode step (all layers)",
        "layers": layers,
        "attention_batches": list(attn_batches),
        "attention_contexts": list(contexts),
        "ffn_batches": list(n_ffn),
        "inter_node_gbps": net.inter_node_gbps,
        "inter_node_latency_us": net.inter_node_latency_us,
        "bytes_per_request_per_layer": per_request_bytes,
        "attention_sources": sources(src_a),
        "attention_core_sources": sources(src_core),
        "ffn_sources": sources(src_f),
    }
    return Calibration(base.coefficients, base.attention, base.ffn, base.communication, setup)
