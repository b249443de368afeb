"""Cost of the preemption target (issue 29) on the cohorts of benchmarks/workload_effect.py.

Usage:  python benchmarks/preemption_effect.py [--targets 0.5,1e-4] [--rows gemma-25ms-8k,...]

For each cohort (the Mooncake sample rescaled to θ on H100, clipped or truncated as in
workload_effect.py) the workload-aware plan is made at each `--preemptions-per-request`
target; a target as loose as 0.5 leaves the `--kv-quantile` floor alone in force (the reserve
before issue 29). Per plan: cost, p95, GPUs, B, and its worst owner's forced preemptions per
request and per replica-hour at the usable memory.
"""

from __future__ import annotations

import argparse
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from workload_effect import _workload_request

ROWS = {"gemma-25ms-8k": ("gemma-3-27b", "25ms", "8k"), "gemma-25ms-32k": ("gemma-3-27b", "25ms", "32k"),
        "gemma-60ms-8k": ("gemma-3-27b", "60ms", "8k"), "gemma-60ms-32k": ("gemma-3-27b", "60ms", "32k"),
        "qwen-40ms-8k": ("qwen3-next-80b-a3b", "40ms", "8k"), "qwen-40ms-32k": ("qwen3-next-80b-a3b", "40ms", "32k"),
        "qwen-80ms-8k": ("qwen3-next-80b-a3b", "80ms", "8k"), "qwen-80ms-32k": ("qwen3-next-80b-a3b", "80ms", "32k"),
        "qwen-40ms-128k": ("qwen3-next-80b-a3b", "40ms", "128k")}


def main(argv=None) -> int:
    from opweave_planner import api

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="0.5,1e-4")
    ap.add_argument("--rows", default=",".join(ROWS))
    a = ap.parse_args(argv)
    for row in a.rows.split(","):
        model, slo, scale = ROWS[row]
        base, overflow = _workload_request(model, slo, scale)
        costs = []
        for t in (float(x) for x in a.targets.split(",")):
            t0 = time.perf_counter()
            req = base.model_copy(update={"preemptions_per_request": t})
            p = api.plan(req).plan
            if p is None:
                print(f"{row} ({overflow}) target {t:g}: infeasible", flush=True)
                continue
            worst = max((o.kv_events for o in p.owners), key=lambda e: e.per_request_at_usable)
            costs.append(p.usd_per_million_tokens)
            delta = f" ({(costs[-1] / costs[0] - 1) * 100:+.1f} % vs target {a.targets.split(',')[0]})" \
                if len(costs) > 1 else ""
            print(f"{row} ({overflow}) target {t:g}: {p.usd_per_million_tokens:.4f} $/Mtok{delta}, p95 "
                  f"{p.tpot_ms:.2f} ms, {p.gpus_total} GPUs, B {p.global_batch}; at usable memory "
                  f"{worst.per_request_at_usable:.2g} preemptions/request, {worst.per_replica_hour_at_usable:.2g}"
                  f"/replica-hour; at reserve {worst.per_request_at_reserve:.2g}/request, "
                  f"{worst.share_above_reserve:.3%} of steps above  [{time.perf_counter() - t0:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
