"""What the search carries and returns: its scratch arrays, a Selection, its statistics.

`Selection` names a complete plan inside a Problem; `Scratch` holds the working arrays of one
search or evaluation (the hot loop allocates nothing); `Counters` are the search statistics.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Selection(NamedTuple):
    """A complete plan inside a Problem: global batch, microbatches, and per owner its
    configuration, replica count and microbatch grid index."""

    batch: int
    mu: int
    cfg: np.ndarray  # int64[k]
    replicas: np.ndarray  # int64[k]
    mb: np.ndarray  # int64[k]


class Scratch(NamedTuple):
    """Working arrays of one search or evaluation (built by keyword in `evaluate.new_scratch`)."""

    sel: np.ndarray  # int64[k]: selected point index per owner
    cfg: np.ndarray  # int64[k]: the selection as the evaluator reads it
    mb: np.ndarray
    bh: np.ndarray
    rep: np.ndarray
    bhf: np.ndarray  # float64[k]: bound scratch
    eg: np.ndarray
    ing: np.ndarray
    t: np.ndarray  # float64[S]: stage vectors
    occ: np.ndarray
    latv: np.ndarray
    fbuf: np.ndarray  # simulator scratch
    ibuf: np.ndarray
    counters: np.ndarray  # int64[4], Counters order
    best_f: np.ndarray  # float64[5]: cost, checked TPOT (percentile), gpus, incumbent, mean TPOT
    best_i: np.ndarray  # int64[2 + 3k]: B, mu, then (cfg, replicas, mb) per owner
    walk_state: np.ndarray  # int64[2]: level, and 1 while a walk is suspended at a leaf
    kt: np.ndarray  # float64[S, G]: stage times at the context knots (workload)
    t2: np.ndarray  # float64[S, max mu]: stage times per microbatch of one scenario
    cg: np.ndarray  # int64[max mu, k]: knot index of each (microbatch, owner) context
    cw: np.ndarray  # float64[max mu, k]: interpolation weight of that context
    samples: np.ndarray  # float64[n_scenarios x max replicas]: per-scenario TPOT samples


class Counters(NamedTuple):
    candidates: int = 0
    simulations: int = 0
    pruned_by_bound: int = 0
    pruned_by_frontier: int = 0

    def __add__(self, other: Counters) -> Counters:  # type: ignore[override]
        return Counters(*(a + b for a, b in zip(self, other, strict=True)))


class SearchResult(NamedTuple):
    """One template's best plan (`found` False: none) and its statistics."""

    found: bool
    cost: float  # cost rate x µs
    t_rtt: float  # µs: the figure checked against the SLO (a workload: its percentile)
    gpus: float
    selection: Selection
    counters: Counters
    t_mean: float = 0.0  # µs: mean TPOT (cost is mean x rate); a fixed context: t_rtt


def selection(batch: int, mu: int, cfg, replicas, mb) -> Selection:
    return Selection(int(batch), int(mu), np.asarray(cfg, np.int64), np.asarray(replicas, np.int64),
                     np.asarray(mb, np.int64))
