"""Time the AFD bundle simulator: r = 32, B = 256, 10,000 completed requests per instance.

JIT compilation is timed separately: by default numba's cache goes to a fresh temporary
folder, so the first call really compiles.  Run:

    python benchmarks/bench_afd_simulator.py [--repeat 5] [--use-cache]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--use-cache", action="store_true", help="keep numba's on-disk cache")
    args = parser.parse_args()
    if not args.use_cache:
        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="afd-bench-numba-")

    from opweave_planner.afd.provisioning import PAPER_SECTION_52, LatencyCoefficients
    from opweave_planner.afd.simulator import simulate_bundle
    from opweave_planner.workload.sampling import LengthDist, ParametricWorkload

    coef = LatencyCoefficients(**PAPER_SECTION_52)
    workload = ParametricWorkload(LengthDist("geometric", 100), LengthDist("geometric", 500))

    start = time.perf_counter()
    simulate_bundle(coef, workload, 2, 16, 64)
    warmup = time.perf_counter() - start

    times = []
    for seed in range(args.repeat):
        start = time.perf_counter()
        res = simulate_bundle(coef, workload, 32, 256, args.requests, seed=seed)
        times.append(time.perf_counter() - start)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    print(f"JIT warm-up (first call{'' if args.use_cache else ', fresh cache'}): {warmup:.2f} s")
    print(
        f"r=32 B=256 {args.requests} requests/instance ({res.requests} total, {res.steps} steps): "
        f"median {statistics.median(times):.3f} s, min {min(times):.3f} s over {args.repeat} seeds"
    )


if __name__ == "__main__":
    main()
