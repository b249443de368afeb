"""Fit the six linear latency coefficients from measured (size, latency) samples.

Attention is fitted against the total token load of a microbatch, FFN against the
aggregated batch size and communication against the number of transferred requests.
Each line is a non-negative least-squares fit (a negative slope or intercept has no
physical meaning and would be rejected by ``LatencyCoefficients``); the residuals are
reported so a caller can see when the linear law does not hold.
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

    def as_dict(self) -> dict:
        return {
            "coefficients": self.coefficients.as_dict(),
            "attention": self.attention.as_dict(),
            "ffn": self.ffn.as_dict(),
            "communication": self.communication.as_dict(),
        }


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
