"""How many attention instances per FFN instance: mean-field and barrier-aware rules.

One decode step of an rA-1F bundle costs

    tau(B; r) = max{ alpha_A W + beta_A,  alpha_C rB + beta_C,  alpha_F rB + beta_F }

where ``W`` is the token load of the slowest of the ``r`` attention workers.  The
mean-field rule replaces ``W`` by ``B theta``; the Gaussian rule replaces it by
``B theta + sqrt(B) nu M_r`` with ``M_r`` the maximum of ``r`` standard normals, whose
mean is the barrier constant ``kappa_r``.  Throughput per instance is
``rB / ((r + 1) tau)``.

Quadrature uses a fixed composite Gauss-Legendre rule so every function here is
vectorised over arrays of ``r`` and deterministic.  For ``r < 1`` (fewer attention than
FFN instances) the barrier is taken over a single worker.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy.special import log_ndtr

from opweave_planner.errors import UserError

PAPER_SECTION_52 = {
    "alpha_a": 0.00165,
    "beta_a": 50.0,
    "alpha_f": 0.083,
    "beta_f": 100.0,
    "alpha_c": 0.022,
    "beta_c": 20.0,
}
"""Section 5.2 / Table 3 coefficients (cycles; DeepSeek-V3 on Ascend 910C)."""

MAX_COEFFICIENT = 1e12  # time units per token/request: larger products overflow the quadrature
_PANELS = 96
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(16)
_TAIL = 40.0  # standard deviations beyond which every integrand below is < 1e-300


@dataclass(frozen=True)
class LatencyCoefficients:
    """Linear latency laws: attention in tokens, FFN and communication in requests."""

    alpha_a: float
    beta_a: float
    alpha_f: float
    beta_f: float
    alpha_c: float
    beta_c: float

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not math.isfinite(value) or not 0 <= value <= MAX_COEFFICIENT:
                raise UserError(
                    f"latency coefficient {name}: expected a finite number in [0, "
                    f"{MAX_COEFFICIENT:g}], got {value}"
                )
        if self.alpha_f == 0 and self.alpha_c == 0:
            raise UserError(
                "latency coefficients alpha_f, alpha_c: expected at least one > 0 "
                "(otherwise adding attention instances is free and r* is unbounded)"
            )

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _integrate(f, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Composite Gauss-Legendre of elementwise ``f`` over [lo, hi] (arrays, broadcast)."""
    lo, hi = np.broadcast_arrays(np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64))
    width = (hi - lo) / _PANELS
    panel = np.arange(_PANELS, dtype=np.float64)[:, None]
    t = (panel + (_NODES[None, :] + 1.0) / 2.0).ravel()  # positions in panel units
    x = lo[..., None] + width[..., None] * t
    w = np.tile(_WEIGHTS, _PANELS) / 2.0
    return (f(x) * w).sum(axis=-1) * width


def _barrier_count(r) -> np.ndarray:
    return np.maximum(np.asarray(r, dtype=np.float64), 1.0)


def expected_excess(r, z) -> np.ndarray:
    """E[(M_r - z)_+] = int_z^inf (1 - Phi(m)^r) dm for M_r the maximum of r standard normals.

    The integral is split at 0 so each piece spans at most ``_TAIL`` standard deviations;
    below ``-_TAIL`` the survival function is 1 to double precision and is added exactly.
    """
    n, z = np.broadcast_arrays(_barrier_count(r), np.asarray(z, dtype=np.float64))
    zc = np.clip(z, -_TAIL, _TAIL)

    def survival(x):
        return -np.expm1(n[..., None] * log_ndtr(x))

    pos = np.maximum(zc, 0.0)
    neg = np.minimum(zc, 0.0)
    out = _integrate(survival, neg, np.zeros_like(neg)) + _integrate(survival, pos, pos + _TAIL)
    return out + np.maximum(-_TAIL - z, 0.0)


def kappa(r) -> np.ndarray:
    """Barrier constant kappa_r = E[max of r i.i.d. standard normals] (quadrature)."""
    return expected_excess(r, -_TAIL) - _TAIL


def barrier_overhead(batch: int, theta: float, nu: float, r) -> np.ndarray:
    """Relative synchronisation overhead (nu / theta) kappa_r / sqrt(B) of the slowest worker."""
    return (nu / theta) * kappa(r) / math.sqrt(batch)


def barrier_load(batch: int, theta: float, nu: float, r) -> np.ndarray:
    """Barrier-aware attention load B theta + sqrt(B) nu kappa_r (tokens)."""
    return batch * theta + math.sqrt(batch) * nu * kappa(r)


def attention_moments(coef: LatencyCoefficients, batch: int, theta: float, nu: float):
    """(mu_A, sigma_A): mean and CLT standard deviation of one worker's attention time."""
    return coef.alpha_a * batch * theta + coef.beta_a, coef.alpha_a * math.sqrt(batch) * nu


def shared_stage_time(coef: LatencyCoefficients, batch: int, r) -> np.ndarray:
    """G_{B,r}: the slower of communication and FFN for the aggregated rB batch."""
    n = np.asarray(r, dtype=np.float64) * batch
    return np.maximum(coef.alpha_c * n + coef.beta_c, coef.alpha_f * n + coef.beta_f)


def tau_mf(coef: LatencyCoefficients, batch: int, theta: float, r) -> np.ndarray:
    """Mean-field cycle time max{mu_A, t_C(rB), t_F(rB)}."""
    mu_a = coef.alpha_a * batch * theta + coef.beta_a
    return np.maximum(mu_a, shared_stage_time(coef, batch, r))


def tau_gaussian(coef: LatencyCoefficients, batch: int, theta: float, nu: float, r) -> np.ndarray:
    """Gaussian cycle time G + sigma_A E[(M_r - z)_+], z = (G - mu_A) / sigma_A."""
    mu_a, sigma_a = attention_moments(coef, batch, theta, nu)
    g = shared_stage_time(coef, batch, r)
    if sigma_a == 0:
        return np.maximum(mu_a, g)
    with np.errstate(over="ignore", divide="ignore"):  # a tiny sigma_A sends z to +-inf
        z = (g - mu_a) / sigma_a
    return g + sigma_a * expected_excess(r, z)


def per_instance_throughput(batch: int, r, tau) -> np.ndarray:
    """Tokens per unit time per instance: rB / ((r + 1) tau)."""
    r = np.asarray(r, dtype=np.float64)
    return r * batch / ((r + 1.0) * np.asarray(tau, dtype=np.float64))


@dataclass(frozen=True)
class RatioOptimum:
    """A provisioning recommendation and why: which candidate of Theorem 4.4 won."""

    r: float
    throughput: float
    tau: float
    regime: str
    balance: str
    candidates: dict[str, float]


def _crossing(level: float, slope: float, intercept: float) -> float:
    """The r where ``slope * r + intercept`` reaches ``level`` (+-inf for a flat line)."""
    if slope:
        return (level - intercept) / slope
    return math.inf if level >= intercept else -math.inf


def _stationary_point(slope: float, intercept: float) -> float:
    """Maximiser of r / ((r + 1)(slope r + intercept)): sqrt(intercept / slope)."""
    return math.sqrt(intercept / slope) if slope else math.inf


def optimal_ratio_mf(coef: LatencyCoefficients, batch: int, theta: float) -> RatioOptimum:
    """Closed-form r*_mf: the best of Theorem 4.4's candidate set.

    Throughput rises with r while attention is the bottleneck, so the optimum is either
    where the shared stage G catches up with mu_A (attention regime), the stationary
    point sqrt(beta_i / (alpha_i B)) of a communication or FFN piece, or the kink where
    those two pieces cross.  Candidates that are not positive and finite are dropped.
    """
    mu_a = coef.alpha_a * batch * theta + coef.beta_a
    cross_c = _crossing(mu_a, coef.alpha_c * batch, coef.beta_c)
    cross_f = _crossing(mu_a, coef.alpha_f * batch, coef.beta_f)
    named = {
        "attention": min(cross_c, cross_f),
        "communication": _stationary_point(coef.alpha_c * batch, coef.beta_c),
        "ffn": _stationary_point(coef.alpha_f * batch, coef.beta_f),
        "communication-ffn": _crossing(
            coef.beta_c, batch * (coef.alpha_f - coef.alpha_c), coef.beta_f
        ),
    }
    valid = {k: v for k, v in named.items() if math.isfinite(v) and v > 0}
    if not valid:
        raise UserError(
            "latency coefficients: no positive finite candidate ratio; "
            "expected beta_c or beta_f > 0, or attention slower than the shared stage"
        )
    rs = np.array(list(valid.values()))
    thr = per_instance_throughput(batch, rs, tau_mf(coef, batch, theta, rs))
    best = int(np.argmax(thr))
    regime = list(valid)[best]
    if regime == "attention":
        balance = "attention=communication" if cross_c < cross_f else "attention=ffn"
    elif regime == "communication-ffn":
        balance = "communication=ffn"
    else:
        short = "c" if regime == "communication" else "f"
        balance = f"beta_{short} = alpha_{short} B r^2"
    r_best = float(rs[best])
    return RatioOptimum(
        r=r_best,
        throughput=float(thr[best]),
        tau=float(tau_mf(coef, batch, theta, r_best)),
        regime=regime,
        balance=balance,
        candidates={k: float(v) for k, v in named.items()},
    )


def _binding_stage(coef: LatencyCoefficients, batch: int, theta: float, r: float) -> str:
    """Which mean-field term sets the cycle time at ``r`` (ties go to attention, then FFN)."""
    n = r * batch
    terms = {
        "attention": coef.alpha_a * batch * theta + coef.beta_a,
        "ffn": coef.alpha_f * n + coef.beta_f,
        "communication": coef.alpha_c * n + coef.beta_c,
    }
    return max(terms, key=lambda k: terms[k])


def optimal_ratio_gaussian(
    coef: LatencyCoefficients, batch: int, theta: float, nu: float, r_max: float | None = None
) -> RatioOptimum:
    """r*_G: maximise rB / ((r+1) tau_G) over real r in (0, r_max] (grid, then golden section)."""
    mf = optimal_ratio_mf(coef, batch, theta)
    hi = r_max if r_max is not None else max(64.0, 4.0 * mf.r)
    lo = min(0.05, mf.r / 4.0)
    grid = np.geomspace(lo, hi, 2001)

    def thr(r):
        return per_instance_throughput(batch, r, tau_gaussian(coef, batch, theta, nu, r))

    values = thr(grid)
    i = int(np.argmax(values))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    inv_phi = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(60):
        c, d = b - inv_phi * (b - a), a + inv_phi * (b - a)
        fc, fd = thr(np.array([c, d]))
        if fc >= fd:
            b = d
        else:
            a = c
    r_best = (a + b) / 2.0
    best_thr = float(thr(np.array([r_best]))[0])
    if best_thr < values[i]:
        r_best, best_thr = float(grid[i]), float(values[i])
    tau = float(tau_gaussian(coef, batch, theta, nu, np.array([r_best]))[0])
    regime = _binding_stage(coef, batch, theta, r_best)
    return RatioOptimum(
        r=float(r_best),
        throughput=best_thr,
        tau=tau,
        regime=regime,
        balance="numerical optimum of the Gaussian throughput",
        candidates={},
    )


def ratio_table(
    coef: LatencyCoefficients, batch: int, theta: float, nu: float, r
) -> dict[str, np.ndarray]:
    """Per-r columns: kappa_r, barrier overhead, both cycle times and both throughputs."""
    r = np.asarray(r, dtype=np.float64)
    t_mf = tau_mf(coef, batch, theta, r)
    t_g = tau_gaussian(coef, batch, theta, nu, r)
    return {
        "r": r,
        "kappa": kappa(r),
        "barrier_overhead": barrier_overhead(batch, theta, nu, r),
        "tau_mf": t_mf,
        "tau_g": t_g,
        "throughput_mf": per_instance_throughput(batch, r, t_mf),
        "throughput_g": per_instance_throughput(batch, r, t_g),
    }
