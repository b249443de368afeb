"""Shaping a workload for a runtime: what is served of a request under ``max_model_len``
(clip, drop or truncate), the prompt scale that reaches a ``scale_ctx`` target, and
:func:`materialize`, which turns a spec into its shaped :class:`~opweave_planner.workload.law.
ContextLaw`. See docs/workloads.md, "Length limits and rescaling".
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from opweave_planner.errors import UserError
from opweave_planner.workload.law import (
    ContextLaw,
    NothingFits,
    law_pmf,
    pmf_moments,
    stationary_moments,
    trace_pmf,
)
from opweave_planner.workload.reader import read_checked
from opweave_planner.workload.spec import (
    FixedContextSpec,
    LawSpec,
    LengthLaw,
    TraceSpec,
    parse_overflow,
)

__all__ = ["MIN_KEPT_SCALED", "apply_max_model_len", "fit_requests", "materialize", "scaled_law"]


def fit_requests(
    prompt: np.ndarray, output: np.ndarray, max_model_len: int, overflow: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What a runtime serves of each request under ``prompt + output <= max_model_len``.

    ``clip``: the output is cut to ``max_model_len - prompt`` (a runtime stops the request at
    the length limit); a prompt that leaves no room for one output token is dropped.
    ``drop``: every request that does not fit is dropped.
    ``truncate``: the prompt keeps its last ``max_model_len - output`` tokens (a chat
    frontend drops the oldest history so that the answer fits; it assumes the answer's
    length known, where a real frontend reserves a fixed budget); an output that alone
    reaches the limit is cut to ``max_model_len - 1`` behind a one-token prompt. Nothing
    is dropped.
    Returns (prompt, output, keep, changed) over all requests: the served lengths (read them
    at ``keep``) and which kept requests were shortened.
    """
    parse_overflow(overflow)
    over = prompt + output > max_model_len
    if overflow == "drop":
        return prompt, output, ~over, np.zeros_like(over)
    if overflow == "truncate":
        out = np.minimum(output, max_model_len - 1)
        return np.minimum(prompt, max_model_len - out), out, np.ones_like(over), over
    keep = prompt < max_model_len
    return prompt, np.where(over, max_model_len - prompt, output), keep, over & keep


def apply_max_model_len(
    prompt: np.ndarray, output: np.ndarray, max_model_len: int | None, overflow: str = "clip"
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Requests with ``prompt + output > max_model_len`` do not fit: :func:`fit_requests`
    says what is served. Returns (prompt, output, clipped, dropped): the kept requests,
    how many of them were shortened (``clipped``: output cut, or prompt truncated) and
    how many were dropped."""
    if max_model_len is None:
        return prompt, output, 0, 0
    p, o, keep, changed = fit_requests(prompt, output, max_model_len, overflow)
    return p[keep], o[keep], int(changed.sum()), int(keep.size - keep.sum())


def _scaled(prompt: np.ndarray, s: float) -> np.ndarray:
    return np.rint(prompt * s).astype(np.int64)


def _solve_scale(theta_at, target: float, what: str) -> float:
    """A prompt scale s > 0 with θ(s) closest to ``target`` (θ nondecreasing in s; inf where
    no request fits the length limit).

    θ(s) is close to affine (θ(0) + s (θ(1) - θ(0))), so the first guess is that line's root
    (through a smaller s than 1 where nothing fits at 1); a bracket is grown geometrically
    around it, then secant steps safeguarded by bisection. Scale 0 (every prompt empty) is
    never an answer: a target the outputs alone reach is refused.
    """
    t0 = theta_at(0.0)
    if not math.isfinite(t0):
        raise UserError(f"--scale-ctx {what}: no request fits --max-model-len even with an empty "
                        "prompt (the outputs alone are longer); raise --max-model-len")
    if target <= t0:
        raise UserError(
            f"--scale-ctx: {target:g} tokens is not above {t0:.1f}, the mean context the outputs "
            f"alone give {what}; no prompt scaling reaches it"
        )
    s1, t1 = 1.0, theta_at(1.0)
    for _ in range(64):  # prompts all round to 0 long before s1 = 2^-64
        if math.isfinite(t1):
            break
        s1 /= 2.0
        t1 = theta_at(s1)
    guess = s1 * (target - t0) / (t1 - t0) if t1 > t0 else s1
    lo, t_lo = 0.0, t0
    hi, t_hi = guess, theta_at(guess)
    step = 1.001
    while t_hi < target:
        lo, t_lo = hi, t_hi
        hi *= step
        step = step * step
        if hi > 1e9:
            raise UserError(f"--scale-ctx: {target:g} tokens is not reachable {what}")
        t_hi = theta_at(hi)
    if lo == 0.0:
        probe = guess / 1.001
        t_probe = theta_at(probe)
        if t_probe < target:
            lo, t_lo = probe, t_probe
    best = min([(abs(t_hi - target), hi)] + ([(abs(t_lo - target), lo)] if lo > 0 else []))
    for _ in range(80):
        if best[0] <= 1e-9 * target or hi - lo <= 1e-12 * hi:
            break
        mid = lo + (target - t_lo) * (hi - lo) / (t_hi - t_lo) if t_hi > t_lo else 0.5 * (lo + hi)
        if not lo + 0.01 * (hi - lo) < mid < hi - 0.01 * (hi - lo):
            mid = 0.5 * (lo + hi)
        t_mid = theta_at(mid)
        best = min(best, (abs(t_mid - target), mid))
        if t_mid < target:
            lo, t_lo = mid, t_mid
        else:
            hi, t_hi = mid, t_mid
    return best[1]


def _fixed(spec: FixedContextSpec) -> ContextLaw:
    c = spec.context
    pmf = np.zeros(c + 1)
    pmf[c] = 1.0
    return ContextLaw(spec, pmf, float(c), 0.0, float(c), 0.0, c, c)


def _shape_trace(tr_p, tr_o, spec) -> tuple[np.ndarray, np.ndarray, int, int, float]:
    L, ov = spec.max_model_len, spec.overflow
    scale = 1.0
    if spec.scale_ctx is not None:
        # Unique (P, D) pairs with counts: the same θ, fewer terms per evaluation.
        key, cnt = np.unique(np.stack([tr_p, tr_o]), axis=1, return_counts=True)
        up, uo = key[0], key[1]

        def theta_at(s: float) -> float:
            p = _scaled(up, s)
            p2, o2, w = p, uo, cnt
            if L is not None:
                p2, o2, keep, _ = fit_requests(p, uo, L, ov)
                p2, o2, w = p2[keep], o2[keep], cnt[keep]
            if w.size == 0:
                return math.inf
            return stationary_moments(p2, o2, w)[0]

        scale = _solve_scale(theta_at, float(spec.scale_ctx), f"for {spec.path}")
        tr_p = _scaled(tr_p, scale)
    p, o, clipped, dropped = apply_max_model_len(tr_p, tr_o, L, ov)
    if spec.scale_ctx is not None:
        _check_kept(1.0 - dropped / tr_p.size, spec, f"trace {spec.path}")
        if ov == "truncate":  # nothing is dropped: the window, not the trace, would shape the cohort
            _check_kept(1.0 - clipped / tr_p.size, spec, f"trace {spec.path}", "serves whole only")
    return p, o, clipped, dropped, scale


#: with --scale-ctx, the least share of requests (or probability mass) that must stay
MIN_KEPT_SCALED = 0.5


def _check_kept(kept: float, spec, what: str, verb: str = "keeps only") -> None:
    """Rescaling against a length limit can reach a target only by dropping most requests
    (the survivors are the short ones, blown up), or with ``truncate`` by cutting most prompts
    to the limit; refuse such a degenerate cohort."""
    if kept < MIN_KEPT_SCALED:
        raise UserError(
            f"{what}: --scale-ctx {spec.scale_ctx} under --max-model-len {spec.max_model_len} "
            f"{verb} {100 * kept:.1f} % of the requests; raise --max-model-len or lower "
            "--scale-ctx"
        )


def _trace(spec: TraceSpec) -> ContextLaw:
    tr = read_checked(spec.path, spec.sha256)
    p, o, clipped, dropped, scale = _shape_trace(tr.prompt, tr.output, spec)
    if p.size == 0:
        raise UserError(
            f"trace {spec.path}: every request is longer than --max-model-len "
            f"{spec.max_model_len}; nothing left to plan for"
        )
    theta, nu2 = stationary_moments(p, o)
    pmf = trace_pmf(p, o, f"trace {spec.path}")
    p.setflags(write=False)
    o.setflags(write=False)
    return ContextLaw(spec, pmf, theta, nu2, float(p.mean()), float(o.mean()),
                    int(p.min()), int((p + o).max() - 1), int(p.size), clipped, dropped,
                    scale, p, o)



def scaled_law(base: LengthLaw, s: float) -> LengthLaw:
    """``base`` with its mean multiplied by ``s`` (same family and CV; a fixed value rounded,
    a geometric mean kept >= 1): the prompt law ``scale_ctx`` produces."""
    mean = base.mean * s
    if base.dist == "fixed":
        return LengthLaw(dist="fixed", mean=float(round(mean)))
    if base.dist == "geometric":
        return LengthLaw(dist="geometric", mean=max(mean, 1.0))
    return LengthLaw(dist="lognormal", mean=max(mean, 1e-9), cv=base.cv)


def _materialize_law(spec: LawSpec) -> ContextLaw:
    L, ov = spec.max_model_len, spec.overflow
    wd = spec.output.pmf(1, None if L is None else L + 1)

    def build(law: LengthLaw):
        return law_pmf(law.pmf(0, L), wd, L, ov)

    scale, law = 1.0, spec.prompt
    if spec.scale_ctx is not None:
        def theta_at(s: float) -> float:
            law = LengthLaw(dist="fixed", mean=0.0) if s == 0.0 else scaled_law(spec.prompt, s)
            try:
                return pmf_moments(build(law)[0])[0]
            except NothingFits:
                return math.inf

        scale = _solve_scale(theta_at, float(spec.scale_ctx), "for this law")
        law = scaled_law(spec.prompt, scale)
    pmf, lo, hi, mean_p, mean_o, clipped, dropped = build(law)
    if spec.scale_ctx is not None:
        _check_kept(1.0 - dropped, spec, "workload law")
    pmf = np.array(pmf[: hi + 1])
    pmf[:lo] = 0.0
    theta, nu2 = pmf_moments(pmf)
    return ContextLaw(spec, pmf, theta, nu2, mean_p, mean_o, lo, hi, 0, clipped, dropped, scale)


@lru_cache(maxsize=8)
def materialize(spec: FixedContextSpec | TraceSpec | LawSpec) -> ContextLaw:
    """The :class:`ContextLaw` of a spec (cached per process; a trace is re-read, or taken from
    this process's read cache, and its sha256 checked)."""
    if isinstance(spec, FixedContextSpec):
        return _fixed(spec)
    if isinstance(spec, TraceSpec):
        return _trace(spec)
    return _materialize_law(spec)


def _norm(w: np.ndarray) -> np.ndarray:
    w = np.clip(np.asarray(w, dtype=np.float64), 0.0, None)
    return w / w.sum()


@lru_cache(maxsize=8)
def request_ends(wl: ContextLaw) -> tuple[np.ndarray, np.ndarray]:
    """(arrive, last): the laws over contexts, per kept request (the arrival law, not the
    stationary one), of a request's first decode context ``P`` and its last ``P + D - 1``.
    A slot at its last step holds a request drawn from the arrival law (stationary weight
    ``D`` times the chance ``1/D`` of being at the last step), and its replacement starts
    at ``P``: the two ends of every turnover (docs/workloads.md, "Preemption episodes")."""
    if isinstance(wl.spec, FixedContextSpec):
        raise UserError("preemption episodes: a fixed --ctx has no request turnover")
    if wl.prompt is not None:
        size = wl.max_context + 1
        arrive = np.bincount(wl.prompt, minlength=size)[:size]
        last = np.bincount(wl.prompt + wl.output - 1, minlength=size)[:size]
        return _norm(arrive), _norm(last)
    spec = wl.spec
    L, ov = spec.max_model_len, spec.overflow
    law = spec.prompt if spec.scale_ctx is None else scaled_law(spec.prompt, wl.scale)
    wp = law.pmf(0, L)
    wd = spec.output.pmf(1, None if L is None else L + 1)
    from scipy.signal import fftconvolve

    ends = np.clip(fftconvolve(wp, wd), 0.0, None)  # index P + D (independent P, D)
    if L is None:
        arrive, end = wp, ends
    elif ov == "drop":
        fits = np.cumsum(wd)  # P(D <= k)
        room = L - np.arange(wp.size)
        arrive = wp * np.where(room >= 0, fits[np.clip(room, 0, fits.size - 1)], 0.0)
        end = ends[: L + 1]
    else:  # clip: kept P < L, the output cut at L - P, so P + D is min(P + D, L)
        arrive = wp[:L]
        end = np.zeros(L + 1)
        end[: min(L, ends.size)] = ends[:L]
        end[L] = max(0.0, float(wp[:L].sum()) - float(end[:L].sum()))
    size = wl.max_context + 1
    a = np.zeros(size)
    a[: min(size, arrive.size)] = arrive[:size]
    e = np.zeros(size)
    e[: min(size, end.size - 1)] = end[1 : size + 1]
    return _norm(a), _norm(e)
