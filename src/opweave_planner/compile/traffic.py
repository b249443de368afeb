"""A workload as search arrays: context knots, scenarios, the KV reserve and valid lower bounds.

For a fixed `--ctx` nothing here runs (every array is empty and the search is the
deterministic one). For a workload (`--workload`, docs/workloads.md):

- **scenarios**: `n` seeded snapshots of the resident slots' contexts, drawn from the
  stationary decode-context law (common random numbers: slot j has its own stream, so every
  plan of a request sees the same contexts in the slots it uses);
- **knots**: stage latencies are looked up at a few dozen context knots spanning the law's
  support and interpolated linearly between them; they are made nondecreasing in context (a
  longer context never runs faster), which is what lets a microbatch's slowest replica be the
  one with the longest mean context;
- **lower-bound tables**: the branch-and-bound's stage times are, per operator, the greatest
  convex minorant of its knot latencies evaluated at a context `c_lb` no larger than the
  scenarios' mean context and their percentile order statistic. By Jensen (a convex minorant
  of a nondecreasing function is nondecreasing), every scenario's per-microbatch stage times
  average at least those, and the bounds (`search/bounds.py`) are linear in the stage times,
  so they stay lower bounds of both the percentile TPOT and the mean TPOT;
- **KV reserve**: the context tokens reserved for `n` resident requests, `units[n]`: the
  larger of the smallest capacity their summed context crosses at most
  `--preemptions-per-request` times per served request (`kv_events`: forced preemptions are
  what users feel) and the `--kv-quantile` of their summed context (exact law on a grid, an
  upper bound: the time share above it stays bounded too), and never less than one request at
  the longest context plus `n - 1` at the shortest. A reserve is counted in the units of one
  request's KV `x(c) = beta_f c + sum beta_w min(c, w)` with the owner's own mix of full and
  sliding-window bytes (`KvReserve.units(mix)`, per owner and configuration in `Stages.kv_units`):
  a window layer holds min(context, window), as a paged runtime does, and the mix enters the
  convolutions. Recurrent state is per request (`kvcpref`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from opweave_planner.compile.problem import order_index
from opweave_planner.compile.space import microbatch_grid
from opweave_planner.inputs.request import PlanRequest
from opweave_planner.structure.operators import Operator
from opweave_planner.workload.edge import workload_spec
from opweave_planner.workload.kv import kv_bytes, kv_events, kv_moments, kv_split_terms, kv_sum_bounds
from opweave_planner.workload.law import ContextLaw, scenarios
from opweave_planner.workload.shaping import materialize

KV_SUM_GRID = 1 << 18  # the KV tail's convolution grid: an upper bound at any size; measured on
# the Mooncake sample scaled to 32k over the 27 resident counts of the default grid, this one is
# at most 0.54 % above the default grid's figure, its gap to the lower bound at most 1.4 %, and
# the 27 quantiles take 0.33 s instead of 1.22 s
EVENT_GRID = 1 << 16  # the episode law's grid: on the Mooncake sample and the Azure trace scaled to 32k
# its reserve at 1e-4 is within 0.01 % of a 2^22 grid's for n = 1..1024 (benchmarks/kv_events_check.py)
EVENT_SPLIT_TERMS = 64  # the exact window-split event law up to this many (finishing, below-window)
# terms; past it the one-class upper bound (on Azure at theta 1.2k, gemma-3-27b: +0.9 % at n = 8,
# +0.13 % at n = 256 in reserved units)
KNOTS = 32  # geometric knots over the law's support, plus its mean (never c_lb: the knots must not
# depend on the grid, so `simulate` of one plan reproduces the search's figures)


def workload_of(req: PlanRequest) -> ContextLaw:
    """The request's workload, read and shaped: a fixed context, or the stationary decode-context
    law of its trace or law (the reader and the shaping cache by the file's stamp and the spec, so
    an edited trace is read again and an unchanged one once per process)."""
    return materialize(workload_spec(req.ctx, req.workload, scale_ctx=req.scale_ctx,
                                     max_model_len=req.max_model_len, overflow=req.overflow))


@dataclass(frozen=True)
class WorkloadArrays:
    """What the search reads about a workload (see the module docstring)."""

    workload: ContextLaw
    scen_cs: np.ndarray  # float64[n, max B + 1]: cumulative context over slots
    knots: np.ndarray  # float64[G]
    c_lb: float  # context of the lower-bound tables
    pct: float  # SLO percentile as a fraction
    units: np.ndarray  # float64[max B + 1]: context tokens reserved for n requests (full attention), at
    # the grid's resident counts (the caps' own counts: `reserve`)
    reserve: KvReserve  # the reserve of any mix of full and sliding-window KV


def resident_counts(req: PlanRequest, batches: tuple[int, ...] | None = None) -> list[int]:
    """Every mu x b a replica can hold on the searched batch set (default: the request's grid)."""
    grid = microbatch_grid(req, batches)
    top = max(req.batches)
    return sorted({mu * b for mu in range(1, req.max_microbatches + 1) for b in grid if mu * b <= top})


def lower_context(cs: np.ndarray, batches, max_mu: int, max_rep: int, pct: float) -> float:
    """The largest context the lower-bound tables may assume: over every (B, mu, replicas) of
    the grid, the smallest of the scenarios' mean context and their percentile order statistic,
    pooled over replicas where a one-owner plan's replicas are independent copies."""
    n = cs.shape[0]
    low = np.inf
    for batch in batches:
        batch = int(batch)
        means = [cs[:, batch] / batch]
        for mu in range(1, max_mu + 1):
            for rep in range(2, max_rep + 1):
                if batch % (mu * rep):
                    continue
                bh, per = batch // (mu * rep), batch // mu
                share = np.zeros((n, rep))
                for i in range(mu):
                    for r in range(rep):
                        lo = i * per + r * bh
                        share[:, r] += cs[:, lo + bh] - cs[:, lo]
                means.append((share / (mu * bh)).ravel())
        for m in means:
            srt = np.sort(m)
            low = min(low, float(srt.mean()), float(srt[order_index(srt.size, pct) - 1]))
    return low


def _knots(wl: ContextLaw, extra: tuple[float, ...]) -> np.ndarray:
    lo = max(1, wl.min_context)
    hi = max(wl.max_context, lo + 1)  # at least two knots, even for a one-token workload
    pts = np.geomspace(lo, hi, KNOTS)
    pts = np.concatenate([pts, [float(round(e)) for e in extra if lo < e < hi], [lo, hi]])
    return np.unique(np.round(pts))


def build_traffic(req: PlanRequest, wl: ContextLaw, batches: tuple[int, ...] | None = None,
                  reserve: KvReserve | None = None) -> WorkloadArrays:
    """The arrays of a workload request (`wl`: its `workload_of`) over the searched batch set
    (`batches`, default the request's grid; `reserve`: its `kv_reserve`, with the counts the
    batch caps already probed)."""
    batches = req.batches if batches is None else batches
    top = max(req.batches)
    draws = scenarios(wl, req.scenarios, top, req.seed)
    cs = np.zeros((req.scenarios, top + 1))
    cs[:, 1:] = np.cumsum(draws, axis=1)
    pct = req.percentile / 100.0
    c_lb = lower_context(cs, batches, req.max_microbatches, req.max_replicas, pct)
    reserve = (kv_reserve(req, wl) if reserve is None else reserve).over(resident_counts(req, batches))
    # the full-attention row over the grid's counts only: the one-stage template, the one reading the
    # caps' counts, reads its own rows (compile.tables.owner_units), so a model whose whole replica
    # has window layers computes no full-attention reserve there
    return WorkloadArrays(workload=wl, scen_cs=cs, knots=_knots(wl, (wl.theta,)), c_lb=c_lb, pct=pct,
                          units=reserve.over(resident_counts(req, req.batches)).units(FULL), reserve=reserve)


#: (per_token, windows) of one request's KV in units of its bytes per context token below every
#: window: kv_bytes(c, per_token, windows) with per_token + sum of the window bytes = 1
Mix = tuple[float, tuple[tuple[int, float], ...]]
FULL: Mix = (1.0, ())  # full attention only: the unit is a context token


@dataclass(frozen=True)
class KvReserve:
    """The reserve of `n` resident requests in the units of a KV mix (see the module docstring):
    any count on first use and kept (`at`: the batch caps probe a few), and as a row over the
    resident counts `counts` (`units`, what the search reads)."""

    workload: ContextLaw
    counts: tuple[int, ...]
    top: int
    kv_quantile: float
    preemptions_per_request: float
    memo: dict = field(default_factory=dict, compare=False, repr=False)  # (n, mix) -> reserve

    def at(self, n: int, mix: Mix = FULL) -> float:
        """The reserve of n resident requests in the units of `mix`."""
        key = (int(n), mix)
        if key not in self.memo:
            self.memo[key] = _reserve_at(self, int(n), mix)
        return self.memo[key]

    def units(self, mix: Mix = FULL) -> np.ndarray:
        """float64[top + 1]: `units[n]` for each resident count (read-only; cached per mix)."""
        return _reserve_units(self, mix)

    def over(self, counts) -> KvReserve:
        """The same reserve (sharing what it computed) over other resident counts."""
        return replace(self, counts=tuple(counts))

    def row(self, mix: Mix = FULL) -> ReserveRow:
        """`units(mix)` read lazily at any count (what memory_need indexes, for the batch caps)."""
        return ReserveRow(self, mix)

    def below(self, n: int, mix: Mix = FULL) -> float:
        """A lower bound of `at(n, mix)` without its event law (the quantile and the floor the reserve
        takes the larger of): where even it does not fit, the reserve does not."""
        key, (per_token, windows) = (int(n), mix), mix
        if key in self.memo:
            return self.memo[key]
        if windows and max(w for w, _ in windows) <= self.workload.min_context:
            # affine in the full-attention reserve (`_reserve_at`), with a factor >= 0: so is a floor of it
            return per_token * self.below(n, FULL) + n * sum(w * b for w, b in windows)
        return _reserve_floor(self, int(n), mix)

    def cheap(self, n: int, mix: Mix = FULL) -> float:
        """A lower bound of `below(n, mix)` from one request's KV mean and variance alone, no
        convolution: where even it does not fit, neither does the reserve (most probes of the
        batch caps' bisection are far above the memory)."""
        if (int(n), mix) in self.memo:
            return self.memo[int(n), mix]
        return _reserve_cheap(self, int(n), mix)


class ReserveRow(NamedTuple):
    reserve: KvReserve
    mix: Mix
    lower: bool = False  # read KvReserve.below instead
    cheap: bool = False  # read KvReserve.cheap instead

    def __getitem__(self, n: int) -> float:
        if self.cheap:
            return self.reserve.cheap(n, self.mix)
        return self.reserve.below(n, self.mix) if self.lower else self.reserve.at(n, self.mix)


def kv_reserve(req: PlanRequest, wl: ContextLaw) -> KvReserve:
    """A workload request's reserve over its grid's resident counts."""
    return KvReserve(workload=wl, counts=tuple(resident_counts(req)), top=max(req.batches),
                     kv_quantile=req.kv_quantile, preemptions_per_request=req.preemptions_per_request)


def _reserve_floor(res: KvReserve, n: int, mix: Mix) -> float:
    """max(quantile bound, one at the longest context and n - 1 at the shortest): `_reserve_at` less
    its event law (the same convolution, cached: a probe that then needs the reserve pays no other)."""
    wl, (per_token, windows) = res.workload, mix
    tail = kv_sum_bounds(wl, n, res.kv_quantile, per_token, windows, grid=KV_SUM_GRID)[1]
    return max(tail, _spread(wl, n, mix))


def _spread(wl: ContextLaw, n: int, mix: Mix) -> float:
    """One request at the longest context and n - 1 at the shortest: the least any reserve takes."""
    return float(kv_bytes(wl.max_context, *mix)) + (n - 1) * float(kv_bytes(wl.min_context, *mix))


def _reserve_cheap(res: KvReserve, n: int, mix: Mix) -> float:
    """max(Cantelli's bound on the quantile, one at the longest context and n - 1 at the shortest).

    The sum S of n requests' KV has mean n m and variance n v, and Cantelli's inequality gives
    P(S <= n m - t) <= n v / (n v + t^2), below q' = q - 1e-6 once t^2 > n v (1 - q') / q': so
    n m - t is below the q'-quantile of S, and so below the q-quantile that `kv_sum_bounds`
    computes of the rounded-up sum (which dominates S) on its grid, whose cdf is off by far
    less than the 1e-6 given away. A further 1e-9 of the mean's size covers the moments' rounding."""
    m, var = _mean_var(res.workload, mix)
    q = res.kv_quantile - 1e-6
    cantelli = n * m - math.sqrt(n * var * (1.0 - q) / q) - 1e-9 * n * abs(m) if q > 0 else -math.inf
    return max(cantelli, _spread(res.workload, n, mix))


@lru_cache(maxsize=64)
def _mean_var(wl: ContextLaw, mix: Mix) -> tuple[float, float]:
    m, var, _skew, _kurt = kv_moments(wl, *mix)
    return m, var


def _reserve_at(res: KvReserve, n: int, mix: Mix) -> float:
    wl, (per_token, windows) = res.workload, mix
    if windows and max(w for w, _ in windows) <= wl.min_context:
        # no context is below a window: x(c) = per_token c + a constant, and so is every reserve
        return per_token * res.at(n, FULL) + n * sum(w * b for w, b in windows)
    tail = kv_sum_bounds(wl, n, res.kv_quantile, per_token, windows, grid=KV_SUM_GRID)[1]
    # the planner's event law alone: the one-class law bounds every crossing of the exact one from above,
    # so where the exact law is the planner's, making the one-class one first to skip the exact one where
    # even its reserve is below the quantile floor would not change the maximum (tests/test_window_reserve.py)
    events = event_law(wl, n, mix, fast=True).reserve(res.preemptions_per_request)
    return max(tail, events, _spread(wl, n, mix))


@lru_cache(maxsize=64)
def _reserve_units(res: KvReserve, mix: Mix) -> np.ndarray:
    longest = float(kv_bytes(res.workload.max_context, *mix))
    units = np.arange(res.top + 1, dtype=np.float64) * longest  # never read: every count is filled below
    for n in res.counts:
        units[n] = res.at(n, mix)
    units.setflags(write=False)
    return units


def event_law(wl: ContextLaw, n: int, mix: Mix, exact: bool | None = None, fast: bool = False):
    """The event law the planner reserves and records with (workload.kv.kv_events on EVENT_GRID):
    the exact window-split law where it takes at most EVENT_SPLIT_TERMS terms (few residents),
    else (or with exact=False) the one-class upper bound; the one law without a window (`fast`: the
    reserve's arithmetic, kv_events). Which law is read off the binomial terms alone (kv_split_terms):
    the one-class law is not made to choose the exact one."""
    if exact is None:
        exact = 1 < kv_split_terms(wl, n, EVENT_GRID, *mix) <= EVENT_SPLIT_TERMS
    return kv_events(wl, n, EVENT_GRID, *mix, exact=exact, fast=fast)


def kv_mix(per_token: float, windows: dict[int, float]) -> Mix:
    """The mix of an owner's KV from its bytes per context token (full and window layers together)
    and its window layers' bytes per token by window (rounded to 12 digits: one cache entry per
    mix, whichever sum of the same layers gave it)."""
    win = tuple(sorted((int(w), round(b / per_token, 12)) for w, b in windows.items() if b > 0))
    if not win:
        return FULL
    return round(1.0 - sum(b for _, b in win), 12), win


def kv_parts(op: Operator, tp: int, shard) -> tuple[float, float]:
    """(bytes per GPU per context token, bytes per GPU per request) of one operator's cache: attention
    grows with the context (a sliding window's up to its window: the reserve's mix caps it, see
    `kv_mix`), recurrent state is fixed. `shard` is latency.lookup.kv_shard."""
    base = shard(op, tp, 0)
    return shard(op, tp, 1) - base, base


def lower_tables(lat: np.ndarray, knots: np.ndarray, c_lb: float) -> np.ndarray:
    """Per (..., operator) the greatest convex minorant of the knot latencies (last axis,
    nondecreasing) evaluated at c_lb: the minimum over knot pairs a <= c_lb <= b of the chord."""
    below = np.flatnonzero(knots <= c_lb)
    above = np.flatnonzero(knots >= c_lb)
    if not below.size:
        return lat[..., 0]
    if not above.size:
        return lat[..., -1]
    best = None
    for a in below:
        for b in above:
            if a == b:
                v = lat[..., a]
            else:
                w = (c_lb - knots[a]) / (knots[b] - knots[a])
                v = lat[..., a] + w * (lat[..., b] - lat[..., a])
            best = v if best is None else np.minimum(best, v)
    return best
