"""Time to first token at a prefill pool: arrivals replayed through N prefill servers, and an
analytical M/G/c figure beside it as a check.

`replay` is a deterministic numba kernel: requests in arrival order, first come first served,
each to the server that frees first (ties: the lowest index); a request's TTFT is its wait plus
its own prefill time plus the KV hand-off. One request per server at a time (no batching of
prompts): the service time is the request's prefill on one (GPU, TP) group
(`latency.prefill`), so the kernel takes service times, not models. `mgc` is the
Allen-Cunneen approximation (exact mean wait for M/M/c and for M/G/1) with the exponential
tail of M/M/c for quantiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from opweave_planner.jit import entry

__all__ = ["MgcFigure", "TtftStats", "mgc", "replay", "service_times", "ttft_stats"]


@entry
def replay(arrivals: np.ndarray, service: np.ndarray, servers: int) -> np.ndarray:
    """Wait (s) of each request: FCFS over `servers` identical servers, arrival order given."""
    n = arrivals.size
    free = np.zeros(servers)
    wait = np.empty(n)
    for i in range(n):
        j = 0
        for k in range(1, servers):
            if free[k] < free[j]:
                j = k
        start = max(arrivals[i], free[j])
        wait[i] = start - arrivals[i]
        free[j] = start + service[i]
    return wait


def service_times(prompts: np.ndarray, prefill_s) -> np.ndarray:
    """Each request's prefill time (s): `prefill_s(length)` once per distinct length."""
    lengths, inverse = np.unique(np.asarray(prompts, dtype=np.int64), return_inverse=True)
    table = np.array([float(prefill_s(int(n))) for n in lengths])
    return table[inverse]


@dataclass(frozen=True)
class TtftStats:
    """TTFT over a replay (s): its mean and percentile, the wait's, and the servers' utilisation."""

    mean_s: float
    percentile_s: float
    wait_mean_s: float
    wait_percentile_s: float
    utilisation: float
    percentile: float


def ttft_stats(arrivals: np.ndarray, service: np.ndarray, servers: int, handoff_s=0.0,
               percentile: float = 95.0) -> TtftStats:
    """Replay the arrivals (`replay`) and summarise TTFT = wait + service + hand-off."""
    if servers < 1:
        raise ValueError("servers must be at least 1")
    a = np.ascontiguousarray(arrivals, dtype=np.float64)
    s = np.ascontiguousarray(service, dtype=np.float64)
    if a.ndim != 1 or a.shape != s.shape or a.size == 0:  # the kernel reads s[i] for every a[i], unchecked
        raise ValueError(f"arrivals {a.shape} and service {s.shape}: expected two equal, non-empty 1-D arrays")
    wait = replay(a, s, int(servers))
    ttft = wait + s + np.broadcast_to(np.asarray(handoff_s, dtype=np.float64), s.shape)
    span = max(float(a[-1] - a[0]), 1e-12)
    return TtftStats(float(ttft.mean()), float(np.percentile(ttft, percentile)), float(wait.mean()),
                     float(np.percentile(wait, percentile)), float(s.sum() / (servers * span)), percentile)


@dataclass(frozen=True)
class MgcFigure:
    """M/G/c at arrival rate `rate`: utilisation, probability of waiting, mean wait, a wait quantile."""

    utilisation: float
    p_wait: float
    wait_mean_s: float
    wait_quantile_s: float


def _erlang_c(c: int, load: float) -> float:
    """Probability that an arrival waits in M/M/c with offered load `load` = rate x mean service."""
    rho = load / c
    term, total = 1.0, 1.0
    for k in range(1, c):
        term *= load / k
        total += term
    last = term * load / c / (1.0 - rho)
    return last / (total + last)


def mgc(rate: float, mean_service_s: float, scv: float, servers: int, quantile: float = 0.95) -> MgcFigure:
    """Allen-Cunneen: Wq = ErlangC / (c mu - lambda) x (1 + scv) / 2, with `scv` the squared
    coefficient of variation of the service time; the wait's `quantile` from the M/M/c tail
    P(W > t) = P(wait) exp(-t P(wait) / Wq). Unstable (utilisation >= 1): infinite waits."""
    load = rate * mean_service_s
    rho = load / servers
    if rho >= 1.0:
        return MgcFigure(rho, 1.0, math.inf, math.inf)
    pw = _erlang_c(servers, load)
    wq = pw / (servers / mean_service_s - rate) * (1.0 + scv) / 2.0
    tail = 1.0 - quantile
    wq_q = 0.0 if pw <= tail or wq == 0 else wq / pw * math.log(pw / tail)
    return MgcFigure(rho, pw, wq, wq_q)
