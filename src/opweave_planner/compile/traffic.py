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
  the longest context plus `n - 1` at the shortest. Sliding-window layers are reserved at their
  window and recurrent state is per request (`kvcpref`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opweave_planner.compile.problem import order_index
from opweave_planner.compile.space import microbatch_grid
from opweave_planner.inputs.request import PlanRequest
from opweave_planner.structure.operators import Operator
from opweave_planner.workload.edge import workload_spec
from opweave_planner.workload.kv import kv_events, kv_sum_bounds
from opweave_planner.workload.law import ContextLaw, scenarios
from opweave_planner.workload.shaping import materialize

KV_SUM_GRID = 1 << 18  # the KV tail's convolution grid: an upper bound at any size; measured on
# the Mooncake sample scaled to 32k over the 27 resident counts of the default grid, this one is
# at most 0.54 % above the default grid's figure, its gap to the lower bound at most 1.4 %, and
# the 27 quantiles take 0.33 s instead of 1.22 s
EVENT_GRID = 1 << 16  # the episode law's grid: on the Mooncake sample and the Azure trace scaled to 32k
# its reserve at 1e-4 is within 0.01 % of a 2^22 grid's for n = 1..1024 (benchmarks/kv_events_check.py)
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
    units: np.ndarray  # float64[max B + 1]: context tokens reserved for n requests


def resident_counts(req: PlanRequest, batches: tuple[int, ...] | None = None) -> list[int]:
    """Every mu x b a replica can hold on the searched batch set (default: the request's grid)."""
    grid = microbatch_grid(req, batches)
    top = max(req.batches)
    return sorted({mu * b for mu in range(1, req.max_microbatches + 1) for b in grid if mu * b <= top})


class Reserves:
    """units[n], the context tokens reserved for n resident requests, computed on first use and
    kept: the batch caps (compile/space.py) probe a few counts, `build_traffic` fills the rest."""

    def __init__(self, req: PlanRequest, wl: ContextLaw) -> None:
        self.req, self.wl, self._done = req, wl, {}

    def __getitem__(self, n: int) -> float:
        n = int(n)
        if n not in self._done:
            req, wl = self.req, self.wl
            tail = kv_sum_bounds(wl, n, req.kv_quantile, 1.0, grid=KV_SUM_GRID)[1]
            events = kv_events(wl, n, EVENT_GRID).reserve(req.preemptions_per_request)
            self._done[n] = max(tail, events, wl.max_context + (n - 1) * wl.min_context)
        return self._done[n]


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
                  reserves: Reserves | None = None) -> WorkloadArrays:
    """The arrays of a workload request (`wl`: its `workload_of`) over the searched batch set
    (`batches`, default the request's grid; `reserves`: counts already computed)."""
    batches = req.batches if batches is None else batches
    reserves = Reserves(req, wl) if reserves is None else reserves
    top = max(req.batches)
    draws = scenarios(wl, req.scenarios, top, req.seed)
    cs = np.zeros((req.scenarios, top + 1))
    cs[:, 1:] = np.cumsum(draws, axis=1)
    pct = req.percentile / 100.0
    c_lb = lower_context(cs, batches, req.max_microbatches, req.max_replicas, pct)
    units = np.arange(top + 1, dtype=np.float64) * wl.max_context  # never read: every count is filled below
    for n in resident_counts(req, batches):
        units[n] = reserves[n]
    return WorkloadArrays(workload=wl, scen_cs=cs, knots=_knots(wl, (wl.theta,)), c_lb=c_lb, pct=pct, units=units)


def kv_parts(op: Operator, tp: int, longest: int, shard) -> tuple[float, float]:
    """(bytes per GPU per context token, bytes per GPU per request) of one operator's cache:
    full attention grows with the context; a sliding window is reserved at its window (or the
    longest context), recurrent state is fixed. `shard` is latency.lookup.kv_shard."""
    base = shard(op, tp, 0)
    if op.kv_window:
        return 0.0, shard(op, tp, min(op.kv_window, longest))
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
