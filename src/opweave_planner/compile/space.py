"""The search space a request spans, beyond its own fields: the batch set, microbatch sizes and
node sizes.

A runtime takes any integer `--max-num-seqs`, so a memory- or SLO-bound plan would otherwise
stop at the grid point below its cap. The one-stage (colocated) template searches the request's
grid (`--batches`) plus its **caps**: for every configuration c and microbatch count mu, with b
the microbatch and mu x b at most the grid's largest batch, where one replica of c holding the
whole model stops: the largest mu x b that fits its memory, and (a fixed context) the largest
and the cheapest mu x b whose one-stage TPOT mu x t(b) meets the SLO. Over those its search is
as cheap as over every integer batch; the other templates search the grid (docs/search.md#batches).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from opweave_planner.compile.problem import PRUNE_EPS
from opweave_planner.inputs.hardware import GpuType
from opweave_planner.inputs.request import PlanRequest


def microbatch_grid(req: PlanRequest, batches: Iterable[int] | None = None) -> tuple[int, ...]:
    """Every per-replica microbatch b = B / (mu n) that the batch set (default: the request's
    grid) can produce."""
    values = {
        b // (mu * n)
        for b in (req.batches if batches is None else batches)
        for mu in range(1, req.max_microbatches + 1)
        for n in range(1, req.max_replicas + 1)
        if b % (mu * n) == 0
    }
    return tuple(sorted(values))


def largest_fitting(fits, hi: int, guess: int | None = None) -> int:
    """The largest b in [1, hi] with fits(b), 0 if fits(1) is false; `fits` must be monotone
    (true up to some b, false after), which the memory rule is: its KV units never fall as
    the resident count grows, and its other terms are nonnegative multiples of b.

    `guess`, a b near the answer, only changes which b are probed: steps of 1, 2, 4, ... away
    from it bracket the answer, then bisection as without it. The memory caps guess each mu's
    from the last mu's resident count, so a cap costs about two probes instead of ten, and those
    probe resident counts the workload reserve already computed."""
    if hi < 1 or not fits(1):
        return 0
    lo = 1
    if guess is not None and 1 < guess <= hi:
        lo, hi = _bracket(fits, lo, hi, guess)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _bracket(fits, lo: int, hi: int, guess: int) -> tuple[int, int]:
    """(lo, hi) with fits(lo) true and every b above hi false, around `guess` (fits(lo) known)."""
    step = 1
    if fits(guess):
        lo = guess
        while lo < hi:
            probe = min(hi, lo + step)
            if not fits(probe):
                return lo, probe - 1
            lo, step = probe, 2 * step
        return lo, hi
    hi = guess - 1
    while lo < hi:
        probe = max(lo + 1, hi + 1 - step)
        if fits(probe):
            return probe, hi
        hi, step = probe - 1, 2 * step
    return lo, hi


class Caps(NamedTuple):
    """The caps of a request's configurations (see the module docstring)."""

    memory: frozenset[int]
    slo: frozenset[int]


def batch_caps(req: PlanRequest, n_configs: int, fits, stream=None) -> Caps:
    """Per configuration c and mu, the batches mu x b where one replica holding the whole model
    stops. Memory: the largest b that fits (`fits(c, mu, b)`, monotone in b). SLO (`stream`
    given: `stream(c, top)`, the one-stage time in µs at b = 1..top): among the b up to that
    whose compute stream mu x t(b) meets the SLO (the one-stage plan's TPOT), the largest, and
    the cheapest per token (least t(b)/b, the largest on ties), by a scan: no monotonicity of
    t is assumed. More replicas of one replica cost the same per token on more GPUs, so one
    replica's caps are a colocated plan's."""
    top, slo = max(req.batches), req.slo_ms * 1e3 * (1 + PRUNE_EPS)
    memory, by_slo = set(), set()
    for c in range(n_configs):
        times, resident = None, 0
        for mu in range(1, req.max_microbatches + 1):
            # the memory holds about the same resident count mu x b at every mu: start there
            b = largest_fitting(lambda b, c=c, mu=mu: fits(c, mu, b), top // mu, resident // mu or None)
            if not b:
                continue
            memory.add(mu * b)
            resident = mu * b
            if stream is None:
                continue
            if times is None:
                times = np.asarray(stream(c, b), np.float64)  # mu = 1 fits the largest b
            ok = np.flatnonzero(mu * times[:b] <= slo)
            if ok.size:
                per_token = times[ok] / (ok + 1)
                cheapest = ok[np.flatnonzero(per_token == per_token.min())[-1]]
                by_slo |= {mu * (int(ok[-1]) + 1), mu * (int(cheapest) + 1)}
    return Caps(memory=frozenset(memory), slo=frozenset(by_slo))


def batch_set(req: PlanRequest, *caps: Iterable[int]) -> tuple[int, ...]:
    """The searched batches: the request's grid (ascending), then the caps not on it, ascending.
    Caps come after the grid, so on an exact tie of cost and GPUs a grid plan wins as before."""
    grid = tuple(req.batches)
    extra = set().union(*caps) - set(grid)
    return grid + tuple(sorted(extra))


def node_size(gpu: GpuType, req: PlanRequest) -> int:
    """GPUs per node: the catalog's, or the deployment's --gpus-per-node when smaller."""
    return gpu.gpus_per_node if req.gpus_per_node is None else min(gpu.gpus_per_node, req.gpus_per_node)
