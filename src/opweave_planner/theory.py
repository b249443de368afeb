"""Closed-form cost model of operator-level disaggregation (paper Section 3, Appendix A).

Two layers:

* pure functions over plain floats (SI units: USD/s, bytes/s, FLOP/s, bytes,
  parameters) implementing the analytical model: cost per byte ``alpha`` and per
  FLOP ``gamma``, the GEMM threshold ``b_star``, the relaxed colocated batch
  ``b_bar``, cost per token of colocated / homogeneous / heterogeneous serving,
  Theorem 3.1 (``g_hom`` and its bound), Theorem 3.2 (``eta``, ``dominance``,
  ``x_star``, ``g_het``, ``g_het_peak``, ``g_het_bound``, ``w_star``) and the
  Appendix A.6 balance test for core-attention disaggregation (``cad_balance``);
* builders that derive those inputs from a model, GPU types and a tensor-parallel
  degree (``build_inputs``) and tabulate everything over context lengths
  (``analyze``).

Sharding convention: quantities are per GPU of a TP group. Weights, active
GEMM parameters and (head-sharded) KV divide by the TP degree; MLA's latent
cache is replicated; KV heads replicate once TP exceeds their count. Memory
``M`` is one GPU's capacity. Cost per token is reported for the whole group
(per-GPU cost times TP), so ratios are unaffected by the convention.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opweave_planner.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    from opweave_planner.inputs.hardware import GpuType
    from opweave_planner.inputs.model import ModelSpec

_REL_TOL = 1e-12


# --------------------------------------------------------------------------- #
# Pure math (plain floats)
# --------------------------------------------------------------------------- #

def alpha(cost_per_s: float, bandwidth: float) -> float:
    """Monetary cost of streaming one byte from memory: c / beta (USD/byte)."""
    return cost_per_s / bandwidth


def gamma(cost_per_s: float, flops: float) -> float:
    """Monetary cost of one floating-point operation: c / F (USD/FLOP)."""
    return cost_per_s / flops


def b_star(m_weights: float, p_act: float, bandwidth: float, flops: float) -> float:
    """Batch at which GEMM weight loading (M_w/beta) equals GEMM compute (2 b P_act / F)."""
    return m_weights * flops / (2.0 * p_act * bandwidth)


def b_bar(memory: float, m_weights: float, m_kv: float) -> float:
    """Relaxed colocated batch limit (M - M_w) / m_kv; may be below 1 (infeasible)."""
    return (memory - m_weights) / m_kv


def cpt_hom(alpha_: float, gamma_: float, m_kv: float, p_act: float) -> float:
    """Eq. 1: homogeneous ODS, attention bandwidth-priced, GEMM compute-priced."""
    return alpha_ * m_kv + 2.0 * gamma_ * p_act


def cpt_het(alpha_attn: float, gamma_gemm: float, m_kv: float, p_act: float) -> float:
    """Eq. 2: attention on one GPU type (its alpha), GEMMs on another (its gamma)."""
    return alpha_attn * m_kv + 2.0 * gamma_gemm * p_act


def cpt_coloc(alpha_: float, gamma_: float, m_kv: float, p_act: float,
              memory: float, m_weights: float) -> float:
    """Eq. 4 at the largest relaxed batch; ``inf`` where colocation is infeasible (b_bar < 1)."""
    bb = b_bar(memory, m_weights, m_kv)
    if not bb >= 1.0:
        return math.inf
    return alpha_ * m_kv + max(alpha_ * m_weights / bb, 2.0 * gamma_ * p_act)


def best_hom(alphas: Sequence[float], gammas: Sequence[float], m_kv: float,
             p_act: float) -> tuple[int, float]:
    """Eq. 6: cheapest single GPU type for both sides -> (index, cost per token)."""
    costs = [cpt_hom(a, g, m_kv, p_act) for a, g in zip(alphas, gammas, strict=True)]
    j = min(range(len(costs)), key=costs.__getitem__)
    return j, costs[j]


def best_het(alphas: Sequence[float], gammas: Sequence[float], m_kv: float,
             p_act: float) -> tuple[int, int, float]:
    """Eq. 7: lowest-alpha type for attention, lowest-gamma type for GEMMs -> (j, k, cost)."""
    j = min(range(len(alphas)), key=alphas.__getitem__)
    k = min(range(len(gammas)), key=gammas.__getitem__)
    return j, k, cpt_het(alphas[j], gammas[k], m_kv, p_act)


def g_hom(m_kv: float, p_act: float, m_weights: float, memory: float,
          bandwidth: float, flops: float) -> float:
    """Theorem 3.1: CPT_coloc / CPT_hom on one GPU type (the price cancels).

    1 where b_bar >= b*; ``M/(M-M_w) * x/(x+kappa)`` with x = m_kv/beta,
    kappa = 2 P_act / F below the threshold; ``nan`` where colocation is
    infeasible (b_bar < 1).
    """
    bb = b_bar(memory, m_weights, m_kv)
    if not bb >= 1.0:
        return math.nan
    if bb >= b_star(m_weights, p_act, bandwidth, flops):
        return 1.0
    x = m_kv / bandwidth
    kappa = 2.0 * p_act / flops
    return g_hom_bound(memory, m_weights) * x / (x + kappa)


def g_hom_bound(memory: float, m_weights: float) -> float:
    """Theorem 3.1 bound M / (M - M_w) (``inf`` when the weights do not fit)."""
    return memory / (memory - m_weights) if memory > m_weights else math.inf


def eta(bw1: float, flops1: float, bw2: float, flops2: float) -> float:
    """Hardware ratio (beta1 F2) / (beta2 F1); the theorem labels the pair so it is >= 1."""
    return (bw1 * flops2) / (bw2 * flops1)


def dominance(a1: float, g1: float, a2: float, g2: float) -> int | None:
    """1 or 2 if that type is no worse on both alpha and gamma, else None (a real trade-off)."""
    if a1 <= a2 and g1 <= g2:
        return 1
    if a2 <= a1 and g2 <= g1:
        return 2
    return None


def x_star(p_act: float, a1: float, g1: float, a2: float, g2: float) -> float | None:
    """KV bytes per request where the two homogeneous costs cross; None under dominance."""
    if dominance(a1, g1, a2, g2) is not None:
        return None
    return 2.0 * p_act * (g1 - g2) / (a2 - a1)


def g_het(m_kv: float, p_act: float, alphas: Sequence[float], gammas: Sequence[float]) -> float:
    """CPT*_hom / CPT*_het over the given GPU types (Eqs. 6-7)."""
    return best_hom(alphas, gammas, m_kv, p_act)[1] / best_het(alphas, gammas, m_kv, p_act)[2]


def g_het_peak(a1: float, g1: float, a2: float, g2: float) -> float:
    """Gain at x*: (rq - 1)/(r + q - 2) with r = alpha ratio, q = gamma ratio (1 under dominance)."""
    if dominance(a1, g1, a2, g2) is not None:
        return 1.0
    r = max(a1, a2) / min(a1, a2)
    q = max(g1, g2) / min(g1, g2)
    return (r * q - 1.0) / (r + q - 2.0)


def g_het_bound(eta_: float) -> float:
    """Theorem 3.2 bound (1 + sqrt(eta)) / 2, eta oriented to be >= 1."""
    e = max(eta_, 1.0 / eta_)
    return (1.0 + math.sqrt(e)) / 2.0


def w_star(bw1: float, flops1: float, bw2: float, flops2: float) -> float:
    """Cost ratio c1/c2 attaining the bound: sqrt(beta1 F1 / (beta2 F2))."""
    return math.sqrt((bw1 * flops1) / (bw2 * flops2))


@dataclass(frozen=True)
class CadBalance:
    """Appendix A.6: can the attention and rest-of-model stages of CAD be balanced?"""

    t_attn_max_s: float  # M1 / (mu beta1): longest attention stage memory allows
    t_rest_min_s: float  # M_w,2 / beta2: weight-loading floor of the rest-of-model stage
    feasible: bool

    @property
    def slack(self) -> float:
        """t_attn_max / t_rest_min; >= 1 means the latency ranges overlap."""
        return self.t_attn_max_s / self.t_rest_min_s if self.t_rest_min_s > 0 else math.inf


def cad_balance(memory1: float, bw1: float, m_weights2: float, bw2: float,
                microbatches: int) -> CadBalance:
    """Necessary condition M1/(mu beta1) >= M_w,2/beta2 for a uniform-layer model."""
    if microbatches < 1:
        raise UserError(f"--microbatches: must be >= 1, got {microbatches}")
    t_attn = memory1 / (microbatches * bw1)
    t_rest = m_weights2 / bw2
    return CadBalance(t_attn, t_rest, t_attn >= t_rest * (1.0 - _REL_TOL))


def invert_nondecreasing(fn: Callable[[float], float], target: float, hi: float = 2.0**40,
                         iters: int = 200) -> float | None:
    """Smallest s in [0, hi] with fn(s) >= target (bisection); None if fn never reaches it."""
    if fn(0.0) >= target:
        return 0.0
    if fn(hi) < target:
        return None
    lo = 0.0
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if fn(mid) >= target:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-9 * max(1.0, hi):
            break
    return hi


# --------------------------------------------------------------------------- #
# Inputs from a model, GPU types and a parallel configuration
# --------------------------------------------------------------------------- #

@dataclass(frozen=True)
class GpuParams:
    """One GPU type in SI units: c (USD/s), beta (B/s), F (FLOP/s), M (bytes)."""

    id: str
    c: float
    beta: float
    flops: float
    memory: float

    @property
    def alpha(self) -> float:
        return alpha(self.c, self.beta)

    @property
    def gamma(self) -> float:
        return gamma(self.c, self.flops)

    @classmethod
    def from_gpu(cls, g: GpuType) -> GpuParams:
        if g.price_per_hour <= 0:
            raise UserError(f"--prices: GPU '{g.id}' has price {g.price_per_hour}; "
                            "the cost model needs a positive USD per GPU-hour")
        return cls(id=g.id, c=g.price_per_hour / 3600.0, beta=g.bandwidth_gbps * 1e9,
                   flops=g.bf16_tflops * 1e12, memory=g.memory_bytes)


@dataclass(frozen=True)
class ModelInputs:
    """Per-GPU model quantities of one TP shard.

    ``m_kv(s) = sum_w b_w * min(s, w) + fixed`` with w = 0 meaning unbounded, so
    sliding windows and linear-attention state are taken from the real layer mix.
    """

    model: str
    tp: int
    m_weights: float  # resident weight bytes per GPU, inactive experts included
    p_act: float  # active GEMM-side parameters per request per GPU
    kv_terms: tuple[tuple[int, float], ...]  # (window or 0, bytes per context token per GPU)
    kv_fixed: float  # context-independent state bytes per request per GPU
    uniform_layers: bool  # every layer has the same attention kind and window

    def m_kv(self, context: float) -> float:
        return self.kv_fixed + sum(b * (min(context, w) if w else context) for w, b in self.kv_terms)

    @property
    def kv_strictly_increasing(self) -> bool:
        return any(w == 0 and b > 0 for w, b in self.kv_terms)

    def context_for_kv(self, kv_bytes: float) -> float | None:
        """Smallest context whose per-request KV reaches ``kv_bytes`` (None: never)."""
        return invert_nondecreasing(self.m_kv, kv_bytes)


def _kv_shard_fraction(op: Any, tp: int) -> float:
    """Share of an operator's KV/state one GPU keeps: the search's rule (`lookup.kv_shard`)."""
    from opweave_planner.latency.lookup import kv_shard

    probe = 1 << 20  # any context past every window: the share does not depend on it
    total = op.kv_bytes(probe)
    return kv_shard(op, tp, probe) / total if total else 1.0


def model_inputs(model: ModelSpec, tp: int = 1) -> ModelInputs:
    """M_weights, P_act and m_kv(s) per GPU of a TP-``tp`` group."""
    from opweave_planner.latency.lookup import weight_shard
    from opweave_planner.structure.operators import build_sequence

    if tp < 1:
        raise UserError(f"--tp: must be a positive integer, got {tp}")
    seq = build_sequence(model)
    m_weights = sum(weight_shard(op, tp) for op in seq.ops)  # the search's rule
    p_act = 0.0
    for op in seq.ops:
        if op.traits.gemm_work:  # not the embedding lookup nor the core attention
            p_act += op.active_params / tp
    terms: dict[int, float] = {}
    fixed = 0.0
    for op in seq.ops:
        if op.kv_bytes_per_token == 0 and op.state_bytes == 0:
            continue
        frac = _kv_shard_fraction(op, tp)
        if op.kv_bytes_per_token:
            terms[op.kv_window] = terms.get(op.kv_window, 0.0) + op.kv_bytes_per_token * frac
        fixed += op.state_bytes * frac
    patterns = {(lay.attention.kind, lay.attention.window) for lay in model.layers}
    return ModelInputs(model=model.name, tp=tp, m_weights=m_weights, p_act=p_act,
                       kv_terms=tuple(sorted(terms.items())), kv_fixed=fixed,
                       uniform_layers=len(patterns) == 1)


def build_inputs(model: str | ModelSpec, gpus: Sequence[str] | str, tp: int = 1,
                 catalog: str | None = None, prices: str | None = None
                 ) -> tuple[ModelInputs, list[GpuParams]]:
    """Resolve a model name/path and GPU ids into the cost model's inputs."""
    from opweave_planner.inputs.hardware import load_hardware
    from opweave_planner.inputs.model import load_model

    spec = load_model(model) if isinstance(model, str) else model
    hw = load_hardware(catalog, prices)
    names = [n for n in (gpus.split(",") if isinstance(gpus, str) else gpus) if n.strip()]
    if not names:
        raise UserError("--gpus: give at least one GPU id, e.g. h100,l40s")
    params: list[GpuParams] = []
    for n in names:
        gp = GpuParams.from_gpu(hw.resolve(n))
        if gp.id in {p.id for p in params}:
            raise UserError(f"--gpus: '{n}' is listed twice")
        params.append(gp)
    return model_inputs(spec, tp), params


_CTX_TOKEN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def _parse_tokens(text: str) -> int:
    m = _CTX_TOKEN.match(text)
    if not m:
        raise UserError(f"--ctx: '{text}' is not a token count (e.g. 4096, 8k, 1m)")
    scale = {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]
    value = float(m.group(1)) * scale
    if value < 1 or value != int(value):
        raise UserError(f"--ctx: '{text}' must be a positive whole number of tokens")
    return int(value)


def parse_contexts(text: str) -> list[int]:
    """'1k..256k' -> 1024, 2048, ..., 262144 (doubling); '4k,32k,100000' -> that list."""
    text = text.strip()
    if ".." in text:
        lo_s, _, hi_s = text.partition("..")
        lo, hi = _parse_tokens(lo_s), _parse_tokens(hi_s)
        if hi < lo:
            raise UserError(f"--ctx: range '{text}' ends below its start")
        out = []
        s = lo
        while s <= hi:
            out.append(s)
            s *= 2
        return out
    out = sorted({_parse_tokens(p) for p in text.split(",") if p.strip()})
    if not out:
        raise UserError("--ctx: give a range like 1k..256k or a list like 4k,32k")
    return out


# --------------------------------------------------------------------------- #
# Tabulation
# --------------------------------------------------------------------------- #

def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def _per_mtok(cpt: float, tp: int) -> float | None:
    """USD per token for one GPU's share -> USD per million tokens for the whole group."""
    return _finite(cpt * tp * 1e6)


def gpu_summary(mi: ModelInputs, g: GpuParams) -> dict[str, Any]:
    """Context-independent quantities of one GPU type: alpha, gamma, b*, Theorem 3.1 bound."""
    bs = b_star(mi.m_weights, mi.p_act, g.beta, g.flops)
    free = g.memory - mi.m_weights
    fits = free > 0
    onset = mi.context_for_kv(free / bs) if fits else None  # b_bar(s) = b*
    s_max = mi.context_for_kv(free) if fits else None  # b_bar(s) = 1
    return {
        "id": g.id,
        "price_per_hour": g.c * 3600.0,
        "bandwidth_gbps": g.beta / 1e9,
        "bf16_tflops": g.flops / 1e12,
        "memory_gib": g.memory / (1 << 30),
        "alpha_usd_per_gb": g.alpha * 1e9,
        "gamma_usd_per_pflop": g.gamma * 1e15,
        "b_star": bs,
        "weights_fit": fits,
        "g_hom_bound": _finite(g_hom_bound(g.memory, mi.m_weights)),
        "g_hom_onset_ctx": None if onset is None else math.ceil(onset),
        "coloc_max_ctx": None if s_max is None else math.floor(s_max),
    }


def pair_summary(mi: ModelInputs, ga: GpuParams, gb: GpuParams) -> dict[str, Any]:
    """Theorem 3.2 for two GPU types, labelled so that eta >= 1 (type 1 = attention side)."""
    g1, g2 = (ga, gb) if eta(ga.beta, ga.flops, gb.beta, gb.flops) >= 1.0 else (gb, ga)
    e = eta(g1.beta, g1.flops, g2.beta, g2.flops)
    dom = dominance(g1.alpha, g1.gamma, g2.alpha, g2.gamma)
    xs = x_star(mi.p_act, g1.alpha, g1.gamma, g2.alpha, g2.gamma)
    s_star = mi.context_for_kv(xs) if xs is not None else None
    if s_star is not None and xs is not None and xs < mi.m_kv(0.0):
        s_star = None
    return {
        "type1": g1.id,
        "type2": g2.id,
        "eta": e,
        "dominant": None if dom is None else (g1.id if dom == 1 else g2.id),
        "x_star_bytes": xs,
        "s_star_ctx": None if s_star is None else round(s_star),
        "peak_gain": g_het_peak(g1.alpha, g1.gamma, g2.alpha, g2.gamma),
        "bound": g_het_bound(e),
        "cost_ratio": g1.c / g2.c,
        "w_star": w_star(g1.beta, g1.flops, g2.beta, g2.flops),
    }


def cad_summary(mi: ModelInputs, attn: GpuParams, rest: GpuParams, microbatches: int) -> dict[str, Any]:
    cb = cad_balance(attn.memory, attn.beta, mi.m_weights, rest.beta, microbatches)
    return {
        "attn": attn.id,
        "rest": rest.id,
        "t_attn_max_ms": cb.t_attn_max_s * 1e3,
        "t_rest_min_ms": cb.t_rest_min_s * 1e3,
        "slack": cb.slack,
        "balanced_feasible": cb.feasible,
    }


def context_row(mi: ModelInputs, gpus: Sequence[GpuParams], context: int) -> dict[str, Any]:
    """All per-context quantities: b_bar, G_hom and costs per GPU, then the best hom/het."""
    kv = mi.m_kv(context)
    per_gpu = {}
    for g in gpus:
        bb = b_bar(g.memory, mi.m_weights, kv)
        coloc = cpt_coloc(g.alpha, g.gamma, kv, mi.p_act, g.memory, mi.m_weights)
        gh = g_hom(kv, mi.p_act, mi.m_weights, g.memory, g.beta, g.flops)
        per_gpu[g.id] = {
            "b_bar": bb if bb > 0 else 0.0,
            "coloc_feasible": bb >= 1.0,
            "compute_bound": bb >= b_star(mi.m_weights, mi.p_act, g.beta, g.flops),
            "g_hom": _finite(gh),
            "cpt_coloc": _per_mtok(coloc, mi.tp),
            "cpt_hom": _per_mtok(cpt_hom(g.alpha, g.gamma, kv, mi.p_act), mi.tp),
        }
    alphas = [g.alpha for g in gpus]
    gammas = [g.gamma for g in gpus]
    jh, hom = best_hom(alphas, gammas, kv, mi.p_act)
    ja, kg, het = best_het(alphas, gammas, kv, mi.p_act)
    return {
        "context": context,
        "m_kv_bytes": kv,
        "gpus": per_gpu,
        "best_hom": gpus[jh].id,
        "cpt_hom_best": _per_mtok(hom, mi.tp),
        "het_attn": gpus[ja].id,
        "het_gemm": gpus[kg].id,
        "cpt_het_best": _per_mtok(het, mi.tp),
        "g_het": hom / het,
        # Ideal heterogeneous ODS: one request's KV shard fits on the attention GPU and
        # the weight shard fits on the GEMM GPU (same TP degree on both sides).
        "ods_feasible": kv <= gpus[ja].memory and mi.m_weights < gpus[kg].memory,
    }


def analyze(mi: ModelInputs, gpus: Sequence[GpuParams], contexts: Sequence[int],
            microbatches: int = 2) -> dict[str, Any]:
    """The whole report: inputs, per-GPU and per-pair summaries, CAD balance, table rows."""
    if not gpus:
        raise UserError("--gpus: give at least one GPU id")
    pairs = [pair_summary(mi, a, b) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    cad = [cad_summary(mi, a, r, microbatches) for a in gpus for r in gpus]
    return {
        "model": mi.model,
        "tp": mi.tp,
        "microbatches": microbatches,
        "inputs": {
            "m_weights_bytes": mi.m_weights,
            "p_act": mi.p_act,
            "kv_terms": [{"window": w or None, "bytes_per_token": b} for w, b in mi.kv_terms],
            "kv_fixed_bytes": mi.kv_fixed,
            "kv_strictly_increasing": mi.kv_strictly_increasing,
            "uniform_layers": mi.uniform_layers,
        },
        "gpus": [gpu_summary(mi, g) for g in gpus],
        "pairs": pairs,
        "cad": cad,
        "rows": [context_row(mi, gpus, s) for s in contexts],
    }


def curves(mi: ModelInputs, gpus: Sequence[GpuParams], lo: int, hi: int,
           points: int = 200) -> dict[str, Any]:
    """Dense G_hom(s) per GPU and G_het(s) per pair on a geometric grid (for plotting)."""
    lo = max(1, lo)
    hi = max(hi, lo + 1)
    ratio = (hi / lo) ** (1.0 / max(1, points - 1))
    grid = [lo * ratio**i for i in range(points)]
    hom = {g.id: [g_hom(mi.m_kv(s), mi.p_act, mi.m_weights, g.memory, g.beta, g.flops) for s in grid]
           for g in gpus}
    het = {}
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            het[f"{a.id}+{b.id}"] = [g_het(mi.m_kv(s), mi.p_act, [a.alpha, b.alpha], [a.gamma, b.gamma])
                                     for s in grid]
    return {"context": grid, "g_hom": hom, "g_het": het}


def plot_gains(mi: ModelInputs, gpus: Sequence[GpuParams], lo: int, hi: int, path: str) -> None:
    """Write G_hom(s) per GPU and G_het(s) per pair, each with its dashed bound (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot: matplotlib is not installed; "
                        "install the extra with: pip install 'opweave-planner[plot]'") from None
    data = curves(mi, gpus, lo, hi)
    npairs = len(data["g_het"])
    fig, axes = plt.subplots(1, 2 if npairs else 1, figsize=(11 if npairs else 6, 4), squeeze=False)
    ax = axes[0][0]
    for k, g in enumerate(gpus):
        color = f"C{k}"
        ax.plot(data["context"], data["g_hom"][g.id], color=color, label=f"{g.id} (TP{mi.tp})")
        bound = g_hom_bound(g.memory, mi.m_weights)
        if math.isfinite(bound):
            ax.axhline(bound, color=color, linestyle="--", linewidth=1)
    ax.set(xlabel="context length s (tokens)", ylabel="G_hom(s)",
           title=f"{mi.model}: homogeneous ODS vs colocated")
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if npairs:
        ax = axes[0][1]
        k = 0
        for i, a in enumerate(gpus):
            for b in gpus[i + 1:]:
                color = f"C{k}"
                ax.plot(data["context"], data["g_het"][f"{a.id}+{b.id}"], color=color, label=f"{a.id}+{b.id}")
                ax.axhline(g_het_bound(eta(a.beta, a.flops, b.beta, b.flops)), color=color,
                           linestyle="--", linewidth=1)
                s_peak = pair_summary(mi, a, b)["s_star_ctx"]
                if s_peak is not None and lo <= s_peak <= hi:
                    ax.plot([s_peak], [g_het(mi.m_kv(s_peak), mi.p_act, [a.alpha, b.alpha],
                                             [a.gamma, b.gamma])], "o", color=color, markersize=4)
                k += 1
        ax.set(xlabel="context length s (tokens)", ylabel="G_het(s)",
               title="heterogeneous vs best homogeneous ODS")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    from opweave_planner.atomic import save_figure

    try:
        save_figure(fig, path, dpi=120)
    finally:
        plt.close(fig)
