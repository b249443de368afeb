"""CPU time of the windowed-workload search (issue 27's "within 2x of today's time").

Usage:  PYTHONPATH=src python benchmarks/window_search_time.py [--row gemma-25ms-8k] [--target 1e-4]

Builds the row's request as benchmarks/preemption_effect.py does (the Mooncake sample rescaled to
θ on H100, `--preemptions-per-request` target), plans it once to warm every cache a process keeps
across requests (numba, the trace, the profiles), clears the per-request caches a warm process
would not share, then times one more `api.plan` on the CPU clock (process_time: the box is shared,
wall time is not). Prints CPU s and the plan's $/Mtok, B and GPUs. Runs in older trees as well:
the target is set only where PlanRequest has the field.
"""

from __future__ import annotations

import argparse
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from preemption_effect import ROWS
from workload_effect import _workload_request


def main(argv=None) -> int:
    from opweave_planner import api
    from opweave_planner.inputs.request import PlanRequest

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", default="gemma-25ms-8k", choices=sorted(ROWS))
    ap.add_argument("--target", type=float, default=1e-4)
    ap.add_argument("--runs", type=int, default=1, help="timed plans after the warm one")
    a = ap.parse_args(argv)
    req, _ = _workload_request(*ROWS[a.row])
    if "preemptions_per_request" in PlanRequest.model_fields:
        req = req.model_copy(update={"preemptions_per_request": a.target})
    api.plan(req)  # warm: numba, the trace, the profiles
    for _ in range(a.runs):
        _cold_request_caches()
        t0 = time.process_time()
        p = api.plan(req).plan
        cpu = time.process_time() - t0
        print(f"{a.row} target {a.target:g}: {cpu:.2f} s CPU; " + (
            "infeasible" if p is None else
            f"{p.usd_per_million_tokens:.6f} $/Mtok, B {p.global_batch}, {p.gpus_total} GPUs"), flush=True)
    return 0


def _cold_request_caches() -> None:
    """Clear the module-level caches of one request's reserve (the event laws, the sums, the
    binnings): a new request (another trace, scale or target) finds none of them, so the timed plan
    must not either."""
    import gc
    from functools import _lru_cache_wrapper

    from opweave_planner.compile import compiled, traffic
    from opweave_planner.workload import kv

    for mod in (kv, traffic, compiled):
        for obj in vars(mod).values():
            if isinstance(obj, _lru_cache_wrapper):
                obj.cache_clear()
    gc.collect()


if __name__ == "__main__":
    sys.exit(main())
