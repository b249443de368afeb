"""The preemption-episode law's grid (issue 29): the reserve at a target on the planner's grid
against a 64x finer one, and what the default search grid's resident counts cost.

Usage:  python benchmarks/kv_events_check.py [--target 1e-4] [--scale 32k]

For the Mooncake sample and the Azure trace rescaled to θ = --scale: per resident count n, the
event reserve C_ε (`kv_events(...).reserve`) on compile/traffic.EVENT_GRID and on 2^22, the
kv-quantile floor C_q (0.999, the planner's KV_SUM_GRID), and the preemptions per request at
C_q; then the time the planner's 27 default resident counts take on a fresh cache.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"


def main(argv=None) -> int:
    from opweave_planner import api
    from opweave_planner.compile.traffic import EVENT_GRID, KV_SUM_GRID, resident_counts
    from opweave_planner.workload.edge import workload_spec
    from opweave_planner.workload.kv import _kv_events, kv_events, kv_sum_bounds
    from opweave_planner.workload.shaping import materialize

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=float, default=1e-4)
    ap.add_argument("--scale", default="32k")
    a = ap.parse_args(argv)
    for name in ("mooncake-conversation-sample.jsonl", "azure-conv-sample.csv"):
        wl = materialize(workload_spec(None, str(TRACES / name), scale_ctx=a.scale, max_model_len=131072))
        worst = 0.0
        for n in (1, 8, 64, 256, 1024):
            r, rf = kv_events(wl, n, EVENT_GRID).reserve(a.target), kv_events(wl, n, 1 << 22).reserve(a.target)
            q = kv_sum_bounds(wl, n, 0.999, 1.0, grid=KV_SUM_GRID)[1]
            worst = max(worst, abs(r / rf - 1))
            print(f"{name} n={n}: C_eps {r:,.0f} (2^22 grid: {rf:,.0f}, {(r / rf - 1) * 100:+.4f} %), "
                  f"C_q {q:,.0f}; at C_q {kv_events(wl, n, EVENT_GRID).per_request(q):.2e} preemptions/request")
        _kv_events.cache_clear()
        counts = resident_counts(api.make_request("llama-3.1-8b", "30ms", None, workload=str(TRACES / name)))
        t0 = time.perf_counter()
        for n in counts:
            kv_events(wl, n, EVENT_GRID).reserve(a.target)
        print(f"{name}: largest grid difference {worst * 100:.4f} %; {len(counts)} resident counts in "
              f"{time.perf_counter() - t0:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
