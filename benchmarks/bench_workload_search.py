"""Speed of the workload-aware search against the fixed-context one (issue 13 acceptance).

Usage:  python benchmarks/bench_workload_search.py [--rounds 3] [--gpus h100]

gemma-3-27b, 60 ms: `--ctx 32k` against `--workload examples/traces/mooncake-conversation-
sample.jsonl --scale-ctx 32k`, in one process, rounds interleaved, warm numba cache (one
untimed warm-up of each first). Times: building the search arrays (latency tables; for the
workload also the knots, scenarios and KV tail), the search itself, and both; the ratio is
workload / fixed. Target: the workload-aware search at most 2x the fixed-context one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

TRACE = Path(__file__).resolve().parent.parent / "examples" / "traces" / "mooncake-conversation-sample.jsonl"


def _once(req) -> tuple[float, float, object]:
    from opweave_planner.compile import compile_request
    from opweave_planner.latency.lookup import op_latencies
    from opweave_planner.search.driver import run_search
    from opweave_planner.workload import kv, shaping

    # cold caches of the request, so each round pays what a fresh command pays
    op_latencies.cache_clear()
    shaping.materialize.cache_clear()
    kv._kv_sum_bounds.cache_clear()
    t0 = time.perf_counter()
    ctx = compile_request(req)
    t1 = time.perf_counter()
    out = run_search(ctx)
    return t1 - t0, time.perf_counter() - t1, out


def main(argv=None) -> int:
    from opweave_planner import api

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gpus", default="h100")
    a = ap.parse_args(argv)
    base = dict(model="gemma-3-27b", slo="60ms", gpus=a.gpus)
    reqs = {"--ctx 32k": api.make_request(**base, ctx="32k"),
            "--workload mooncake --scale-ctx 32k": api.make_request(**base, workload=str(TRACE), scale_ctx="32k")}
    for r in reqs.values():
        _once(r)  # warm-up: numba cache load, imports
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in reqs}
    outs = {}
    for _ in range(a.rounds):
        for k, r in reqs.items():
            arr, srch, outs[k] = _once(r)
            times[k].append((arr, srch))
    print(f"gemma-3-27b 60 ms --gpus {a.gpus}, median of {a.rounds} rounds")
    print(f"{'request':<38}{'arrays s':>10}{'search s':>10}{'total s':>10}  counters")
    med = {}
    for k, ts in times.items():
        arr = statistics.median(t[0] for t in ts)
        srch = statistics.median(t[1] for t in ts)
        tot = statistics.median(t[0] + t[1] for t in ts)
        med[k] = (arr, srch, tot)
        c = outs[k].counters
        print(f"{k:<38}{arr:>10.2f}{srch:>10.2f}{tot:>10.2f}  candidates {c.candidates:,}, "
              f"simulated leaves {c.simulations:,}")
    (fa, fs, ft), (wa, ws, wt) = med.values()
    print(f"workload / fixed: arrays {wa / fa:.2f}x, search {ws / fs:.2f}x, total {wt / ft:.2f}x (target <= 2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
