"""How long the per-(model, GPU, parallelism) latency arrays take to build.

Issue target: all arrays for gemma-3-27b on the four profiled GPUs well under a second.
Run: python benchmarks/bench_latency_arrays.py [--model gemma-3-27b]
"""

from __future__ import annotations

import argparse
import time

from opweave_planner.compile.space import microbatch_grid
from opweave_planner.inputs.hardware import load_hardware
from opweave_planner.inputs.model import load_model
from opweave_planner.inputs.request import make_request
from opweave_planner.latency import lookup
from opweave_planner.structure.operators import build_sequence


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma-3-27b")
    ap.add_argument("--ctx", type=int, default=32768)
    args = ap.parse_args()
    hw = load_hardware()
    seq = build_sequence(load_model(args.model))
    grid = microbatch_grid(make_request(model=args.model, slo="60ms", ctx=args.ctx))
    gpus = ("h100", "h200", "a100", "l40s")
    has_moe = any(op.kind == "moe_up" for op in seq.ops)
    pars = [lookup.Parallel(tp, ep) for tp in (1, 2, 4, 8) for ep in ((False, True) if has_moe and tp > 1 else (False,))]
    for label in ("cold (profile loading, fits, grid preparation)", "warm tables, new context"):
        lookup.op_latencies.cache_clear()
        ctx = args.ctx if label.startswith("cold") else args.ctx + 1
        t0 = time.perf_counter()
        for g in gpus:
            for p in pars:
                lookup.op_latencies(seq, hw.resolve(g), p, ctx, grid)
        dt = time.perf_counter() - t0
        n = len(gpus) * len(pars)
        print(f"{args.model}: {n} (GPU, parallelism) arrays x {len(grid)} microbatch sizes x {seq.n} operators: "
              f"{dt:.3f} s  [{label}]")


if __name__ == "__main__":
    main()
