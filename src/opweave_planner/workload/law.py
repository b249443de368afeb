"""The stationary decode-context law, used by the planner and ``afd`` alike.

A resident slot observed at a uniformly random decode step holds a request chosen with
probability proportional to its decode length ``D`` (its output tokens, ``D >= 1``), at a
uniform age ``a`` in ``{0, ..., D-1}``; its context is ``P + a`` (renewal-reward,
AFD-provisioning paper Section 4.1, Lemma 4.1). :class:`ContextLaw` holds it as a dense
probability vector over integer contexts ``0..max_context`` (exact, no binning), so θ, ν²,
quantiles, sampling, the scenarios and the KV distribution all come from one array. See
docs/workloads.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from opweave_planner.errors import UserError
from opweave_planner.workload.spec import (
    LAW_TAIL,
    MAX_SUPPORT,
    FixedContextSpec,
    LawSpec,
    TraceSpec,
    parse_percentile,
)

__all__ = ["ContextLaw", "scenarios", "stationary_moments", "step_percentile"]


def stationary_moments(
    prompt: np.ndarray, output: np.ndarray, weight: np.ndarray | None = None
) -> tuple[float, float]:
    """(θ, ν²) of the stationary decode context for (prompt, output) atoms with weights
    (the Appendix A.6 plug-in estimator when all weights are 1; the second moment is taken
    about θ, avoiding ``q - θ²`` cancellation)."""
    p = np.asarray(prompt, dtype=np.float64)
    d = np.asarray(output, dtype=np.float64)
    w = np.ones_like(d) if weight is None else np.asarray(weight, dtype=np.float64)
    total = (w * d).sum()
    theta = float((w * (d * p + d * (d - 1.0) / 2.0)).sum() / total)
    c = p - theta
    nu2 = float(
        (w * (d * c * c + c * d * (d - 1.0) + d * (d - 1.0) * (2.0 * d - 1.0) / 6.0)).sum()
        / total
    )
    return theta, max(nu2, 0.0)


def trace_pmf(prompt: np.ndarray, output: np.ndarray, what: str) -> np.ndarray:
    """Dense stationary context law of a trace: request i covers contexts [P_i, P_i + D_i)
    with one unit of mass each, normalised by sum(D)."""
    end = prompt + output
    size = int(end.max())
    if size > MAX_SUPPORT:
        raise UserError(f"{what}: contexts up to {size} tokens; give --max-model-len")
    diff = np.bincount(prompt, minlength=size + 1).astype(np.float64)
    diff -= np.bincount(end, minlength=size + 1)
    pmf = np.cumsum(diff)[:size]
    return pmf / output.sum(dtype=np.float64)


@dataclass(frozen=True, eq=False)
class ContextLaw:
    """A materialised workload: the stationary decode-context law and its summary.

    ``pmf[c]`` is the probability that a resident slot, observed at a random decode step,
    holds ``c`` context tokens (exact; zero outside ``[min_context, max_context]``).
    ``prompt``/``output`` are the kept requests of a trace (after ``scale_ctx`` and
    ``max_model_len``); ``None`` for a fixed context or a law.
    """

    spec: FixedContextSpec | TraceSpec | LawSpec
    pmf: np.ndarray = field(repr=False)
    theta: float
    nu2: float
    mean_prompt: float
    mean_output: float
    min_context: int
    max_context: int
    requests: int = 0  # kept requests (trace)
    clipped: float = 0  # trace: count; law: probability mass
    dropped: float = 0
    scale: float = 1.0  # the prompt scale applied for scale_ctx
    prompt: np.ndarray | None = field(default=None, repr=False)
    output: np.ndarray | None = field(default=None, repr=False)
    _cdf: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        pmf = np.array(self.pmf, dtype=np.float64)
        pmf[: self.min_context] = 0.0
        pmf = pmf[: self.max_context + 1]
        pmf /= pmf.sum()
        cdf = np.cumsum(pmf)
        cdf /= cdf[-1]
        pmf.setflags(write=False)
        cdf.setflags(write=False)
        object.__setattr__(self, "pmf", pmf)
        object.__setattr__(self, "_cdf", cdf)

    @property
    def nu(self) -> float:
        return math.sqrt(self.nu2)

    @property
    def cv(self) -> float:
        """ν / θ."""
        return self.nu / self.theta if self.theta > 0 else 0.0

    @property
    def naive_mean(self) -> float:
        """The arrival average prompt mean + output mean / 2 (not what a decode step sees)."""
        return self.mean_prompt + self.mean_output / 2.0

    @property
    def is_fixed(self) -> bool:
        return isinstance(self.spec, FixedContextSpec)

    def cdf(self, context: np.ndarray | int) -> np.ndarray:
        """P(context <= c), elementwise."""
        c = np.asarray(context, dtype=np.int64)
        idx = np.clip(c, 0, self._cdf.size - 1)
        return np.where(c < 0, 0.0, self._cdf[idx])

    def quantile(self, q: float | Sequence[float] | np.ndarray) -> np.ndarray | int:
        """Smallest context c with P(context <= c) >= q, q in (0, 1) (exact inverse CDF;
        a 1e-12 tolerance absorbs the rounding of the cumulative sum)."""
        qa = np.asarray(q, dtype=np.float64)
        if ((qa <= 0) | (qa >= 1)).any():
            raise UserError(f"quantile: {q!r} is outside (0, 1)")
        out = np.minimum(np.searchsorted(self._cdf, qa - 1e-12, side="left"), self._cdf.size - 1)
        return int(out) if out.ndim == 0 else out.astype(np.int64)

    def sample(self, rng: np.random.Generator | int, n: int) -> np.ndarray:
        """``n`` independent stationary contexts (int64), inverse CDF of ``n`` uniforms."""
        g = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        u = g.random(n)
        idx = np.searchsorted(self._cdf, u, side="right")
        return np.minimum(idx, self._cdf.size - 1).astype(np.int64)

    def describe(self) -> dict:
        """Everything a plan records about its workload (JSON-ready)."""
        s = self.spec
        out: dict = {"source": s.kind}
        if isinstance(s, FixedContextSpec):
            out["context_tokens"] = s.context
        elif isinstance(s, TraceSpec):
            out.update(path=s.path, format=s.format, sha256=s.sha256, rows=s.rows,
                       requests=self.requests, clipped=int(self.clipped),
                       dropped=int(self.dropped))
        else:
            out.update(prompt=s.prompt.label(), output=s.output.label(),
                       clipped_mass=self.clipped, dropped_mass=self.dropped)
        if not isinstance(s, FixedContextSpec):
            out.update(scale_ctx=s.scale_ctx, prompt_scale=self.scale,
                       max_model_len=s.max_model_len, overflow=s.overflow)
        qs = (0.5, 0.9, 0.95, 0.99, 0.999)
        out.update(
            theta=self.theta, nu=self.nu, cv=self.cv, naive_mean=self.naive_mean,
            mean_prompt=self.mean_prompt, mean_output=self.mean_output,
            max_context=self.max_context,
            context_quantiles={f"p{100 * q:g}": int(v) for q, v in zip(qs, self.quantile(qs))},
        )
        return out


class NothingFits(UserError):
    """No request of a law fits the length limit: at most LAW_TAIL of its mass, the tail the
    law itself is cut at (the rescaling solver reads it as θ = inf)."""

    def __init__(self, limit: int, kept: float) -> None:
        super().__init__(f"workload: no request fits --max-model-len {limit} (a share of "
                         f"{kept:.1g} of the law's requests); raise --max-model-len")


def law_pmf(wp: np.ndarray, wd: np.ndarray, L: int | None, overflow: str):
    """Stationary context law of independent (P, D) given their pmfs on 0..len-1.

    Without a length limit, context = P + A with A independent of P and
    P(A = a) = P(D > a) / E[D]: the pmf is (w_P * S_D) / E[D]. With ``clip`` (D cut to
    L - P, P >= L dropped) it is the same convolution cut at L - 1; with ``drop`` (kept only
    when P + D <= L) the term P(D > L - p) is subtracted for every p. Returns
    (pmf, min context, max context, mean prompt, mean output, clipped mass, dropped mass),
    the means over kept requests.
    """
    from scipy.signal import fftconvolve

    tail = np.cumsum(wd[::-1])[::-1]  # tail[k] = P(D >= k)
    surv = np.append(tail[1:], 0.0)  # surv[a] = P(D > a)
    ks = np.arange(wp.size, dtype=np.float64)
    kd = np.arange(wd.size, dtype=np.float64)
    conv = np.clip(fftconvolve(wp, surv), 0.0, None)  # index y = p + a
    p_min = int(np.flatnonzero(wp > 0)[0])
    p_max = int(np.flatnonzero(wp > 0)[-1])
    d_max = int(np.flatnonzero(wd > 0)[-1])
    if L is None:
        return (conv, p_min, p_max + d_max - 1, float(ks @ wp), float(kd @ wd), 0.0, 0.0)
    pos = np.arange(wp.size)
    room = L - pos  # the most output tokens a prompt of p leaves
    sd_room = np.where(room >= 0, surv[np.clip(room, 0, surv.size - 1)], 1.0)
    sd_room[room >= surv.size] = 0.0
    sd_room[room <= 0] = 1.0  # p >= L never fits
    if overflow == "drop":
        fit = wp * (1.0 - sd_room)
        kept = float(fit.sum())
        if not kept > LAW_TAIL:
            raise NothingFits(L, kept)
        sub = np.cumsum(wp * sd_room * (pos < L))
        y = np.arange(min(conv.size, L))
        pmf = np.clip(conv[: y.size] - sub[np.minimum(y, sub.size - 1)], 0.0, None)
        pd_sum = np.cumsum(kd * wd)  # E[D; D <= k]
        e_d = np.where(room >= 1, pd_sum[np.clip(room, 0, pd_sum.size - 1)], 0.0)
        mean_o = float((wp * e_d).sum() / kept)
        mean_p = float(ks @ fit) / kept
        clipped, dropped = 0.0, 1.0 - kept
        fits = np.flatnonzero(fit > 1e-300)
        lo, hi = int(fits[0]), min(L - 1, p_max + d_max - 1)
    else:
        keep = pos < L
        kept = float(wp[keep].sum())
        if not kept > LAW_TAIL:
            raise NothingFits(L, kept)
        pmf = conv[:L]
        cs = np.cumsum(surv)  # E[min(D, k + 1)] = cs[k]
        e_d = cs[np.clip(room - 1, 0, cs.size - 1)]
        mean_o = float((wp[keep] * e_d[keep]).sum() / kept)
        mean_p = float(ks[keep] @ wp[keep]) / kept
        clipped = float((wp * sd_room)[keep].sum())
        dropped = 1.0 - kept
        lo, hi = p_min, min(L - 1, p_max + d_max - 1)
    return pmf, lo, hi, mean_p, mean_o, clipped, dropped


def pmf_moments(pmf: np.ndarray) -> tuple[float, float]:
    w = pmf / pmf.sum()
    c = np.arange(w.size, dtype=np.float64)
    theta = float(c @ w)
    return theta, float(((c - theta) ** 2) @ w)


def scenarios(workload: ContextLaw, n_scenarios: int, slots: int, seed: int = 0) -> np.ndarray:
    """``[n_scenarios, slots]`` stationary contexts: snapshots of the resident slots.

    Common random numbers: slot ``j`` draws from its own stream
    ``default_rng(SeedSequence([seed, j]))``, so for a given seed column ``j`` is the same
    whatever ``slots`` is, and a larger ``n_scenarios`` extends the columns; two plans asking
    for the same seed see the same contexts in the slots they share.
    """
    if n_scenarios < 1 or slots < 1:
        raise UserError(f"scenarios: need n_scenarios >= 1 and slots >= 1, got "
                        f"{n_scenarios}, {slots}")
    out = np.empty((n_scenarios, slots), dtype=np.int64)
    for j in range(slots):
        out[:, j] = workload.sample(slot_stream(seed, j), n_scenarios)
    return out


def slot_stream(seed: int, slot: int) -> np.random.Generator:
    """The random stream of one resident slot (common random numbers across plans)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), slot]))


def step_percentile(values: np.ndarray, percentile: float, axis: int = -1) -> np.ndarray:
    """The ``percentile`` of per-scenario step latencies: the order statistic
    ``x_(k)``, ``k = ceil(n p / 100)`` (numpy's ``inverted_cdf``), never an interpolation.

    An order statistic is monotone: if ``lower[s] <= values[s]`` for every scenario ``s``,
    then ``step_percentile(lower, p) <= step_percentile(values, p)``. A branch-and-bound lower
    bound evaluated pointwise on the same scenarios therefore stays a lower bound of the
    percentile objective.
    """
    p = parse_percentile(percentile, "percentile")
    return np.quantile(np.asarray(values, dtype=np.float64), p / 100.0, axis=axis,
                       method="inverted_cdf")

