"""KV/state bytes under the stationary context law: one request's bytes, their moments and
quantile, and the quantile of a replica's sum over its resident requests (the memory a plan
reserves). See docs/workloads.md, "KV/state bytes and the memory tail".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Literal

import numpy as np

from opweave_planner.errors import UserError
from opweave_planner.workload.law import ContextLaw, slot_stream
from opweave_planner.workload.spec import parse_quantile

__all__ = ["KV_GRID", "KvEvents", "kv_bytes", "kv_events", "kv_moments", "kv_quantile", "kv_split_terms",
           "kv_sum_bounds", "kv_sum_quantile"]


def kv_bytes(
    contexts: np.ndarray | int,
    per_token: float,
    windows: Sequence[tuple[int, float]] = (),
    fixed: float = 0.0,
) -> np.ndarray:
    """KV/state bytes of one request at each context: ``per_token * c`` for full-attention
    layers, ``bytes * min(c, window)`` per ``(window, bytes per token)`` of sliding-window
    layers, plus ``fixed`` (linear-attention / recurrent state, context-independent)."""
    c = np.asarray(contexts, dtype=np.float64)
    out = per_token * c + fixed
    for window, per in windows:
        out = out + per * np.minimum(c, float(window))
    return out


def kv_quantile(
    workload: ContextLaw, q: float, per_token: float,
    windows: Sequence[tuple[int, float]] = (), fixed: float = 0.0,
) -> float:
    """The ``q``-quantile of one resident request's KV bytes: KV is nondecreasing in the
    context, so it is ``kv_bytes(workload.quantile(q))`` exactly."""
    return float(kv_bytes(workload.quantile(parse_quantile(q, "kv quantile")), per_token,
                          windows, fixed))


def kv_moments(
    workload: ContextLaw, per_token: float, windows: Sequence[tuple[int, float]] = (),
    fixed: float = 0.0,
) -> tuple[float, float, float, float]:
    """(mean, variance, skewness, excess kurtosis) of one resident request's KV bytes
    under the stationary context law (exact: a dot product with the pmf)."""
    x = kv_bytes(np.arange(workload.pmf.size), per_token, windows, fixed)
    w = workload.pmf
    m = float(x @ w)
    d = x - m
    var = float((d * d) @ w)
    if var <= 0:
        return m, 0.0, 0.0, 0.0
    sd = math.sqrt(var)
    return m, var, float((d**3) @ w) / sd**3, float((d**4) @ w) / var**2 - 3.0


KvMethod = Literal["exact", "cornish-fisher", "normal", "mc"]
#: bound on the length of the n-fold convolution grid of :func:`kv_sum_bounds`
KV_GRID = 1 << 20


def kv_sum_bounds(
    workload: ContextLaw,
    n_requests: int,
    q: float,
    per_token: float,
    windows: Sequence[tuple[int, float]] = (),
    fixed: float = 0.0,
    grid: int = KV_GRID,
) -> tuple[float, float]:
    """Bounds ``(lo, hi)`` on the ``q``-quantile of the KV bytes summed over ``n_requests``
    independent stationary resident requests, from the exact law of that sum on a grid.

    One request's KV is rounded *up* onto ``G`` equal bins of width ``h`` over its range
    (``G = clamp(KV_GRID / n, 256, 65536)``); the n-fold convolution of that law (FFT) is the
    exact law of the rounded-up sum, which dominates the true sum and exceeds it by less than
    ``n h``. So ``hi`` (the rounded-up quantile) is an upper bound and ``hi - n h`` a lower
    bound (``grid`` replaces KV_GRID: smaller is faster and only looser); ``(hi - lo) / hi`` is below ``(max - min) / (G mean)`` per request (0.3 % for the
    Mooncake trace at n = 1024, far less for small n). Deterministic, no sampling; cached
    per (workload, n, q, KV coefficients): the 20 batch sizes 1..1024 of the search grid take
    0.55 s together on Mooncake scaled to 32k.
    """
    q, n = _sum_of(q, n_requests)
    key = tuple((int(a), float(b)) for a, b in windows)
    return _kv_sum_bounds(workload, n, q, float(per_token), key, float(fixed), int(grid))


def _sum_of(q: float, n_requests: int) -> tuple[float, int]:
    """(q, n) of a quantile of the KV summed over n requests, checked."""
    q = parse_quantile(q, "kv quantile")
    if n_requests < 1:
        raise UserError(f"kv quantile: n_requests must be >= 1, got {n_requests}")
    return q, int(n_requests)


@lru_cache(maxsize=256)
def _kv_sum_bounds(
    workload: ContextLaw, n: int, q: float, per_token: float,
    windows: tuple[tuple[int, float], ...], fixed: float, total_grid: int = KV_GRID,
) -> tuple[float, float]:
    from scipy.fft import irfft, next_fast_len, rfft

    from opweave_planner.workload.kvscan import quantile_index

    lo_c, hi_c = workload.min_context, workload.max_context
    ctx = np.arange(lo_c, hi_c + 1)
    x = kv_bytes(ctx, per_token, windows, fixed)
    w = workload.pmf[lo_c : hi_c + 1]
    x_min, x_max = float(x.min()), float(x.max())
    if x_max <= x_min:
        return n * x_min, n * x_min
    grid = int(min(65536, max(256, total_grid // n)))
    h = (x_max - x_min) / (grid - 1)
    k = np.minimum(np.ceil((x - x_min) / h - 1e-9), grid - 1).astype(np.int64)
    one = np.bincount(k, weights=w, minlength=grid)
    size = n * (grid - 1) + 1
    nfft = next_fast_len(size, real=True)
    raw = irfft(_power(rfft(one, nfft), n), nfft)
    kq = quantile_index(raw, size, q - 1e-12)  # the cdf of raw[:size] clipped at 0, in one scan
    if kq < 0:  # no mass left (never on a law): the arrays' own answer
        cdf = np.cumsum(np.clip(raw[:size], 0.0, None))
        cdf /= cdf[-1]
        kq = int(min(np.searchsorted(cdf, q - 1e-12, side="left"), size - 1))
    hi = n * x_min + kq * h
    return max(n * x_min, hi - n * h), hi


def _power(z: np.ndarray, n: int) -> np.ndarray:
    """z ** n elementwise, by the binary powers numpy itself takes below an exponent of 100 (the same
    bits there); at and past 100 numpy's complex power goes through exp(n log z), about 10x slower on
    the long transforms, where these squarings are as accurate (|z| <= 1: a law's transform)."""
    if n < 100:
        return _small_power(z, n)
    out, p = None, z
    while n:
        if n & 1:
            out = p if out is None else out * p
        n >>= 1
        if n:
            p = p * p
    return out


def _small_power(z: np.ndarray, n: int) -> np.ndarray:
    """z ** n for a whole n below 100, the same bits: numpy's own for 1 and 2 (its fast paths), else
    its complex power's binary powers in one kernel (workload.kvscan.int_power)."""
    if n < 3:
        return z**n
    from opweave_planner.workload.kvscan import int_power

    return int_power(z, n)


def kv_sum_quantile(
    workload: ContextLaw, n_requests: int, q: float, per_token: float,
    windows: Sequence[tuple[int, float]] = (), fixed: float = 0.0,
    method: KvMethod = "exact", samples: int = 200_000, seed: int = 0,
) -> float:
    """The ``q``-quantile of the KV bytes summed over ``n_requests`` independent stationary
    resident requests (a replica's resident batch).

    * ``exact`` (default): the upper bound of :func:`kv_sum_bounds` (conservative, within
      ``n h`` of the true quantile);
    * ``cornish-fisher``: the normal quantile corrected for the sum's skewness ``γ1/√n`` and
      excess kurtosis ``γ2/n`` (error ``O(n^-3/2)``; can be several % low for small ``n`` on
      bounded, saturating KV laws — see docs/workloads.md);
    * ``normal``: ``n m + z_q √n s`` (CLT; 10-30 % low for n <= 16 on long-tailed traces);
    * ``mc``: the empirical quantile (``method='higher'``) of ``samples`` sums, slot ``j``
      drawn from the stream of :func:`~opweave_planner.workload.law.scenarios` (fixed
      ``seed``: deterministic).
    """
    if method == "exact":
        return kv_sum_bounds(workload, n_requests, q, per_token, windows, fixed)[1]
    q, n = _sum_of(q, n_requests)
    hi = n * float(kv_bytes(workload.max_context, per_token, windows, fixed))
    lo = n * float(kv_bytes(workload.min_context, per_token, windows, fixed))
    if method == "mc":
        total = np.zeros(samples)
        for j in range(n):
            total += kv_bytes(workload.sample(slot_stream(seed, j), samples), per_token, windows, fixed)
        return float(np.quantile(total, q, method="higher"))
    from scipy.special import ndtri

    m, var, g1, g2 = kv_moments(workload, per_token, windows, fixed)
    z = float(ndtri(q))
    if method == "cornish-fisher":
        s1, s2 = g1 / math.sqrt(n), g2 / n
        z = z + (z * z - 1) * s1 / 6 + (z**3 - 3 * z) * s2 / 24 - (2 * z**3 - 5 * z) * s1**2 / 36
    elif method != "normal":
        raise UserError(
            f"kv quantile method: {method!r}; expected exact, cornish-fisher, normal or mc"
        )
    return float(min(hi, max(lo, n * m + z * math.sqrt(n * var))))


#: fewest bins of one request's context law: a sum of n such is far wider than a bin
EVENT_MIN_BINS = 256
#: binomial mass of finishing counts left out of the event sum (far below any target)
EVENT_TAIL = 1e-15


@dataclass(frozen=True, eq=False)
class KvEvents:
    """Up-crossing and exceedance of every capacity for ``n`` resident requests, in the units of
    one request's ``kv_bytes(c, per_token, windows)`` (:func:`kv_events`; by default context tokens): capacity ``base + k * step`` has ``nu_up[k]``, the chance per
    step that the summed context crosses it, and ``above[k]``, the share of steps above it."""

    n: int
    base: float
    step: float
    mean_output: float
    nu_up: np.ndarray = field(repr=False)
    above_of: Callable[[], np.ndarray] = field(repr=False)  # `above`, made on first read: the reserve
    # never reads it, and it is two of the law's longest transforms
    split_terms: int = 1  # (m, K) terms of the exact law (with windows: what `exact=True` costs)

    @cached_property
    def above(self) -> np.ndarray:
        """Share of steps above each capacity (read-only)."""
        return self.above_of()

    def _index(self, capacity: float) -> int:
        if not math.isfinite(capacity):  # no context-dependent KV: never crossed
            return self.nu_up.size - 1 if capacity > 0 else -1
        k = math.floor((capacity - self.base) / self.step + 1e-9)
        return min(max(k, -1), self.nu_up.size - 1)

    def per_request(self, capacity: float) -> float:
        """Up-crossings of ``capacity`` per served request: ``E[D] / n * nu_up`` (a replica
        serves ``n / E[D]`` requests per step)."""
        k = self._index(capacity)
        if k < 0:
            return float(self.mean_output / self.n)
        if k >= self.nu_up.size - 1:
            return 0.0
        return float(self.mean_output / self.n * self.nu_up[k])

    def per_step(self, capacity: float) -> float:
        """Up-crossings of ``capacity`` per replica-step."""
        return self.per_request(capacity) * self.n / self.mean_output

    def share_above(self, capacity: float) -> float:
        """Share of steps whose summed context exceeds ``capacity``."""
        k = self._index(capacity)
        return 1.0 if k < 0 else float(self.above[k])

    def reserve(self, target: float) -> float:
        """The smallest capacity at and above which every capacity's preemptions per request are
        at most ``target`` (the event law need not be monotone below its tail)."""
        eps = self.mean_output / self.n * self.nu_up
        bad = np.flatnonzero(eps > target)
        k = 0 if bad.size == 0 else int(bad[-1]) + 1
        return self.base + k * self.step


def kv_events(workload: ContextLaw, n_requests: int, grid: int = KV_GRID, per_token: float = 1.0,
              windows: Sequence[tuple[int, float]] = (), exact: bool = True, fast: bool = False) -> KvEvents:
    """The law of a replica's preemption episodes at every capacity, counted in the units of one
    request's ``kv_bytes(c, per_token, windows)`` (the defaults: context tokens).

    In stationarity each of the ``n`` slots is at its last step with chance ``1/E[D]``,
    independently, so ``m ~ Binomial(n, 1/E[D])`` finish in a step; a finishing slot holds the
    arrival law of ``P + D - 1`` and its replacement that of ``P``; the ``n - m`` others hold the
    stationary law conditioned on not being last and grow by one token, which adds
    ``per_token + sum(window bytes)`` below the window and ``per_token`` at or past it: of them
    ``K ~ Binomial(n - m, p_below)`` are below. With ``W`` the continuing sum, ``F`` the finishing
    and ``A`` the arriving one (independent given ``m`` and ``K``),

        nu_up(C) = P(S_t <= C < S_t+1) = sum_m,k b_m b_k sum_w P(W = w) P(F <= C - w) P(A > C - w - g_mk),

    ``g_mk`` the continuing slots' growth: one convolution per ``(m, k)``, summed in the frequency
    domain: one inverse FFT for every ``C``. Values are binned to the nearest of
    ``G = clamp(grid / n, 256, 65536)`` bins, none finer than one token's growth past the window;
    the growth is a fractional shift (linear in the bin). Windows of several lengths count every context below the longest as below all of them
    (more growth: an upper bound on the crossings). Cached per (workload, n, grid, coefficients).

    ``exact=False`` takes one class of continuing slots (their marginal law) and lets the
    below-window ones number their largest kept ``K`` (its binomial tail above is below
    ``EVENT_TAIL``): more growth, so an upper bound on every ``nu_up``, at the cost of the
    window-free law; the same law where nothing is below a window.

    ``fast=True`` (what the planner's reserve reads) takes the long transforms' powers by squaring
    (`_power`) and blends each ``k``'s transform into its two shifts without ``k x F`` temporaries:
    the same law, rounded differently in the last digits of its far tail (about 1e-11 per request,
    where plans record it); the default keeps the arithmetic the plan records were made with.
    """
    if n_requests < 1:
        raise UserError(f"preemption episodes: n_requests must be >= 1, got {n_requests}")
    key = tuple(sorted((int(a), float(b)) for a, b in windows if b))
    return _kv_events(workload, int(n_requests), int(grid), float(per_token), key, bool(exact), bool(fast))


def _binomial(n: int, p: float) -> np.ndarray:
    """Binomial(n, p) masses at 0..n, in logs (scipy.stats costs a second to import)."""
    from scipy.special import gammaln

    ms = np.arange(n + 1)
    if p >= 1.0:
        return (ms == n).astype(np.float64)
    if p <= 0.0:
        return (ms == 0).astype(np.float64)
    return np.exp(gammaln(n + 1.0) - gammaln(ms + 1.0) - gammaln(n - ms + 1.0)
                  + ms * math.log(p) + (n - ms) * math.log1p(-p))


def _kept(masses: np.ndarray) -> tuple[int, int]:
    """First and last count whose mass is not below EVENT_TAIL of the largest."""
    keep = np.flatnonzero(masses > EVENT_TAIL * masses.max())
    return int(keep[0]), int(keep[-1])


@lru_cache(maxsize=64)
def _classes(n: int, p_fin: float, p_below: float) -> tuple:
    """(b_m, kept m range, kept k range per m, their (m, k) count) of n slots: m ~ Binomial(n, p_fin)
    finish, k ~ Binomial(n - m, p_below) of the others are below a window (cached: the choice of law,
    kv_split_terms, reads it just before the law itself; read-only)."""
    bm = _binomial(n, p_fin)
    m_lo, m_hi = _kept(bm)
    ks = {m: _kept(_binomial(n - m, p_below)) for m in range(m_lo, m_hi + 1)}
    bm.setflags(write=False)
    return bm, m_lo, m_hi, ks, sum(b - a + 1 for a, b in ks.values())


def kv_split_terms(workload: ContextLaw, n_requests: int, grid: int = KV_GRID, per_token: float = 1.0,
                   windows: Sequence[tuple[int, float]] = ()) -> int:
    """`kv_events(...).split_terms` without the law: what choosing between the exact and the one-class
    law reads (its binning is the law's own, kept for the law that follows)."""
    n = int(n_requests)
    key = tuple(sorted((int(a), float(b)) for a, b in windows if b))
    bins = _bins(workload, float(per_token), key, int(min(65536, max(EVENT_MIN_BINS, int(grid) // n))))
    return _classes(n, bins[3], bins[11])[4]


def _term(s: float, m: int, grid: int, small: int, cdf_f, tail) -> np.ndarray:
    """The transform of P(F <= x) P(A > x - s) on the short grid (x and the shift s in bins; F, A
    sums of m finishing / arriving requests, `cdf_f` and `tail` = P(A > k - 1) their laws)."""
    from scipy.fft import rfft

    from opweave_planner.workload.kvscan import term_values

    span = m * (grid - 1) + math.ceil(s) + 2
    if m == 0:
        # A = 0: P(0 > x - s), linear in a bin; F = 0 has cdf 1 everywhere (x 1.0 changes no bit)
        return rfft(np.clip(s - np.arange(span, dtype=np.float64), 0.0, 1.0), small)
    # cdf_f padded with ones times np.interp(x - s, arange(-1, tail.size - 1), tail, left=1, right=0)
    return rfft(term_values(float(s), span, cdf_f, tail), small)


@lru_cache(maxsize=1024)
def _kv_events(workload: ContextLaw, n: int, total_grid: int, per_token: float = 1.0,
               windows: tuple[tuple[int, float], ...] = (), exact: bool = True, fast: bool = False) -> KvEvents:
    from scipy.fft import irfft, next_fast_len, rfft

    e_d, x_lo, grow_below, p_fin, step, grid, a1, f1, s1, wa1, wb1, p_below, split = _binning(
        workload, per_token, windows, int(min(65536, max(EVENT_MIN_BINS, total_grid // n))), exact)
    g_a, g_b = per_token / step, grow_below / step  # one token of growth, in bins
    size = n * (grid - 1) + math.ceil(n * g_b) + 3
    nfft = next_fast_len(size, real=True)
    bm, m_lo, m_hi, ks, terms = _classes(n, p_fin, p_below)
    k_top = {m: ks[m][1] for m in ks}
    if not split:
        ks = dict.fromkeys(ks, (0, 0))
    k_lo, k_hi = min(a for a, _ in ks.values()), max(b for _, b in ks.values())
    # sum b_m b_k Wb^k Wa^(n-m-k) h_mk = Wb^k_lo Wa^a0 * [sum b_m b_k Wb^(k-k_lo) Wa^(n-m-k-a0) h_mk]: the
    # bracket is short (at most m_hi + k_hi - k_lo slots wide), so it takes small FFTs, and the long one
    # is done once
    a0 = max(0, n - m_hi - k_hi)
    small = next_fast_len((n - a0 - k_lo) * (grid - 1) + math.ceil(n * g_b) + 3, real=True)
    wa_small = rfft(wa1, small)
    wb_small = rfft(wb1, small) if split else None  # the one-class law has no below-window class
    pow_a = np.empty((max(n - m - ks[m][0] - a0 for m in ks) + 1, small // 2 + 1), dtype=np.complex128)
    pow_a[0] = 1.0
    for e in range(1, pow_a.shape[0]):
        pow_a[e] = pow_a[e - 1] * wa_small
    pow_b = np.empty((k_hi - k_lo + 1, small // 2 + 1), dtype=np.complex128)
    pow_b[0] = 1.0
    for e in range(1, pow_b.shape[0]):
        pow_b[e] = pow_b[e - 1] * wb_small
    acc = np.zeros(small // 2 + 1, dtype=np.complex128)
    cdf_f = tail = None
    ends = _end_sums(workload, per_token, windows, step, grid)
    for m in range(m_hi, m_lo - 1, -1):
        if m:
            cdf_f, tail = ends.at(m, f1, a1)
        if not split:
            shift = (n - m - k_top[m]) * g_a + k_top[m] * g_b
            acc += bm[m] * pow_a[n - m - a0] * _term(shift, m, grid, small, cdf_f, tail)
            continue
        # the term is linear in the shift between whole bins (linear interpolation), so each k's is a
        # blend of the terms at the two whole shifts around its own: a few transforms per m, not one per k
        bk = _binomial(n - m, p_below)
        k = np.arange(ks[m][0], ks[m][1] + 1)
        shift = (n - m - k) * g_a + k * g_b
        whole = np.floor(shift).astype(np.int64)
        frac = shift - whole
        at = np.arange(int(whole.min()), int(whole.max()) + 2)
        weight = np.zeros((at.size, k.size))  # blend weight of each whole shift in each k's term
        weight[whole - at[0], np.arange(k.size)] = bk[k] * (1.0 - frac)
        weight[whole + 1 - at[0], np.arange(k.size)] += bk[k] * frac
        if fast:  # weight @ (k's transforms): each k's product made once and added to its two shifts
            from opweave_planner.workload.kvscan import blend_into

            laws = np.zeros((at.size, small // 2 + 1), dtype=np.complex128)
            for j in range(k.size):  # laws[i] += weight[i, j] * (the product, numpy's), where nonzero
                blend_into(laws.view(np.float64), np.ascontiguousarray(weight[:, j]),
                           (pow_a[n - m - k[j] - a0] * pow_b[k[j] - k_lo]).view(np.float64))
        else:
            laws = weight @ (pow_a[n - m - k - a0] * pow_b[k - k_lo])
        for i in np.flatnonzero(weight.any(axis=1)):
            acc += bm[m] * laws[i] * _term(float(at[i]), m, grid, small, cdf_f, tail)
    inner = irfft(acc, small)
    power = _power if fast else np.power
    acc = power(rfft(wa1, nfft), a0)
    if k_lo:
        acc = acc * power(rfft(wb1, nfft), k_lo)
    acc = acc * rfft(inner, nfft)
    nu = np.clip(irfft(acc, nfft)[:size], 0.0, None)
    nu.setflags(write=False)

    def above() -> np.ndarray:
        total = np.clip(irfft(rfft(s1, nfft) ** n, nfft)[:size], 0.0, None)
        out = np.clip(1.0 - np.cumsum(total) / total.sum(), 0.0, 1.0)
        out.setflags(write=False)
        return out

    return KvEvents(n=n, base=n * x_lo, step=step, mean_output=e_d, nu_up=nu, above_of=above, split_terms=terms)


@lru_cache(maxsize=1024)
def _binning(workload: ContextLaw, per_token: float, windows: tuple[tuple[int, float], ...], grid: int,
             exact: bool) -> tuple:
    """The n-free part of `_kv_events` (one request's laws on `grid` bins, the continuing slots' classes):
    every n with the same bin count shares it (every n past 65536 / EVENT_MIN_BINS)."""
    e_d, x_lo, grow_below, p_fin, step, grid, a1, f1, s1, cont, below, p_below, binned = _bins(
        workload, per_token, windows, grid)
    split = exact and p_below > 0.0
    if split:  # the continuing slots in two classes, K ~ Binomial(n - m, p_below) below the window
        cont_b, cont_a = np.where(below, cont, 0.0), np.where(below, 0.0, cont)
        wa1 = binned(cont_a / cont_a.sum()) if cont_a.sum() > 0 else binned(cont_a)
        wb1 = binned(cont_b / cont_b.sum())
    else:  # one class: every below-window count at its largest kept one (exact without a window)
        wa1 = binned(cont / cont.sum()) if cont.sum() > 0 else s1
        wb1 = np.zeros(grid)
    for a in (wa1, wb1):
        a.setflags(write=False)
    return e_d, x_lo, grow_below, p_fin, step, grid, a1, f1, s1, wa1, wb1, p_below, split


@lru_cache(maxsize=16)
def _bins(workload: ContextLaw, per_token: float, windows: tuple[tuple[int, float], ...], grid: int) -> tuple:
    """`_binning`'s part common to the one-class and the exact law (the exact law of a count follows its
    one-class law at once: a short cache; its context-long arrays are not kept for long)."""
    from opweave_planner.workload.shaping import request_ends

    arrive, last = request_ends(workload)
    e_d = float(workload.mean_output)
    lo_c, hi_c = workload.min_context, workload.max_context
    stat = workload.pmf
    lo = min(lo_c, int(np.flatnonzero(arrive > 0)[0]), int(np.flatnonzero(last > 0)[0]))
    hi = max(hi_c, arrive.size - 1, last.size - 1)
    xs = kv_bytes(np.arange(hi + 1), per_token, windows)  # one request's value at each context
    x_lo = float(xs[lo])
    grow_below = per_token + sum(b for _, b in windows)  # a context below every window grows by this
    p_fin = min(1.0, 1.0 / e_d) if e_d > 0 else 1.0
    # the finest bin is one token's growth past every window (the growth below them if none is left)
    step = max(per_token if per_token > 0 else grow_below, (float(xs[hi]) - x_lo) / (grid - 1))
    grid = math.floor((float(xs[hi]) - x_lo) / step + 0.5) + 1

    bin_of = np.clip(np.floor((xs - x_lo) / step + 0.5), 0, grid - 1).astype(np.int64)  # each context's bin

    def binned(w: np.ndarray) -> np.ndarray:
        # the positive masses by bin (a zero added to a bin's sum of positive ones leaves it as it was)
        return np.bincount(bin_of[: w.size], weights=np.where(w > 0, w, 0.0), minlength=grid)

    a1, f1 = binned(arrive), binned(last)
    s1 = binned(stat)
    cont = stat.copy()
    cont[: last.size] -= p_fin * last[: cont.size]
    cont = np.clip(cont, 0.0, None) if p_fin < 1.0 else cont
    # continuing slots below the (longest) window grow by grow_below, the others by per_token
    below = np.zeros(cont.size, bool)
    below[: max((w for w, _ in windows), default=0)] = True
    cont_b = np.where(below, cont, 0.0)
    p_below = float(cont_b.sum() / cont.sum()) if cont.sum() > 0 else 0.0
    for a in (a1, f1, s1, cont, below):
        a.setflags(write=False)
    return e_d, x_lo, grow_below, p_fin, step, grid, a1, f1, s1, cont, below, p_below, binned


class _EndSums:
    """(P(F <= k), P(A > k - 1)) of m finishing / arriving requests summed, per m on first use: the
    one-class and exact laws of one n, and every n past the finest bin count (one grid), share them."""

    def __init__(self) -> None:
        self.memo: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def at(self, m: int, f1: np.ndarray, a1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if m not in self.memo:
            from scipy.fft import irfft, next_fast_len, rfft

            grid = f1.size
            lm = next_fast_len(m * (grid - 1) + 1, real=True)
            from opweave_planner.workload.kvscan import end_laws

            power = _small_power if m < 100 else np.power  # z ** m, bit for bit
            sf = np.clip(irfft(power(rfft(f1, lm), m), lm)[: m * (grid - 1) + 1], 0.0, None)
            sa = np.clip(irfft(power(rfft(a1, lm), m), lm)[: m * (grid - 1) + 1], 0.0, None)
            # np.minimum(np.cumsum(sf) / sf.sum(), 1) and [1] + np.clip(1 - np.cumsum(sa) / sa.sum(), 0, 1)
            cdf_f, tail = end_laws(sf, float(sf.sum()), sa, float(sa.sum()))  # P(F <= k), P(A > k - 1)
            cdf_f.setflags(write=False)
            tail.setflags(write=False)
            self.memo[m] = cdf_f, tail
        return self.memo[m]


@lru_cache(maxsize=256)
def _end_sums(workload: ContextLaw, per_token: float, windows: tuple[tuple[int, float], ...], step: float,
              grid: int) -> _EndSums:
    """The end sums of one binning (the bins of `_kv_events`' `binned`: workload, coefficients, step, grid)."""
    return _EndSums()
