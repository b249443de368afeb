"""Monte Carlo check of the KV reserve's tail: is the `--kv-quantile` reserve what it says?

Usage:  python benchmarks/kv_tail_check.py [--n 96] [--snapshots 2000000] [--seed 0]
                                           [--quantiles 0.999,0.9999,0.99999]

For the workload of `workload_replay.py`'s qwen3-next case (the Mooncake sample at
--scale-ctx 32k), the planner reserves `units[n]` context tokens for n resident requests:
the q-quantile of their summed context under the stationary law (compile/traffic.py). This
script draws independent snapshots of n slots two ways and counts how often the sum exceeds
that reserve; both should come out near 1 - q:

* from the planner's own per-slot context law (`ContextLaw.pmf`), by inverse CDF;
* from the trace itself, as a renewal process is seen at a random step: a request chosen with
  probability proportional to its output length, at a uniform age (the replay's start state).

The replay counts steps above the reserve along one trajectory; this counts independent
snapshots, which is what a quantile of one snapshot promises.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

TRACE = Path(__file__).resolve().parent.parent / "examples" / "traces" / "mooncake-conversation-sample.jsonl"
CHUNK = 50_000


def exceedance(draw, reserve: float, snapshots: int) -> float:
    over = 0
    done = 0
    while done < snapshots:
        m = min(CHUNK, snapshots - done)
        over += int((draw(m).sum(axis=1) > reserve).sum())
        done += m
    return over / snapshots


def check(q: float, n: int, snapshots: int, seed: int) -> tuple[float, float, float]:
    """(reserve tokens, exceedance under the planner's law, exceedance from the trace)."""
    from opweave_planner import api
    from opweave_planner.compile.traffic import build_traffic, resident_counts, workload_of

    req = api.make_request("qwen3-next-80b-a3b", "80ms", workload=str(TRACE), scale_ctx="32k", gpus="h100",
                           kv_quantile=q)
    if n not in resident_counts(req):
        raise SystemExit(f"--n {n}: the planner reserves only for resident counts {resident_counts(req)}")
    tr = build_traffic(req, workload_of(req))
    wl = tr.workload
    reserve = float(tr.units[n])
    cdf = np.cumsum(np.asarray(wl.pmf, float))
    cdf /= cdf[-1]
    p, o = np.asarray(wl.prompt, float), np.asarray(wl.output, float)
    w = o / o.sum()
    rng = np.random.default_rng(seed)

    def from_law(m):
        return np.searchsorted(cdf, rng.random((m, n))).astype(np.float64)

    def from_trace(m):
        i = rng.choice(p.size, size=(m, n), p=w)
        return p[i] + np.floor(rng.random((m, n)) * o[i])

    return reserve, exceedance(from_law, reserve, snapshots), exceedance(from_trace, reserve, snapshots)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=96, help="resident requests per replica (the 0.9999 plan's 2 x 48)")
    ap.add_argument("--snapshots", type=int, default=2_000_000)
    ap.add_argument("--quantiles", default="0.999,0.9999,0.99999")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    for q in (float(x) for x in a.quantiles.split(",")):
        t0 = time.perf_counter()
        reserve, law, trace = check(q, a.n, a.snapshots, a.seed)
        print(f"--kv-quantile {q}: reserve {reserve:,.0f} tokens for n = {a.n}; P(sum > reserve) over "
              f"{a.snapshots:,} snapshots: {law:.2e} (planner's law), {trace:.2e} (trace, renewal start state); "
              f"promised {1 - q:.0e}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
