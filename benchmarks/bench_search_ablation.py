"""Search ablation in the layout of the paper's Table 3.

For gemma-3-27b, 32k context, 60 ms TPOT SLO, on H100 and on H100+A100: candidates
(full assignments reached), simulations (schedule-simulator calls) and wall time of
the search with both accelerations (Full), without Pareto frontiers (No-PF),
without branch-and-bound (No-B&B) and without either (Neither); checks that every
variant returns the same plan (same usd_per_million_tokens and identical plan fields
apart from the search statistics). cpu_s is the search's process CPU time (the
machine is shared, so wall time is noisy; with --jobs > 1 it excludes the workers).

    python benchmarks/bench_search_ablation.py --reduced        # all four variants, reduced grid
    python benchmarks/bench_search_ablation.py                  # Full only, full default grid
    python benchmarks/bench_search_ablation.py --all            # all four variants, full grid (slow)

The numba cache is warmed first (a tiny search); the warm-up time is reported separately.
"""

from __future__ import annotations

import argparse
import sys
import time

from opweave_planner import api
from opweave_planner.compile import compile_request
from opweave_planner.plan import build_plan, search_stats
from opweave_planner.search.driver import run_search

MODEL, CTX, SLO = "gemma-3-27b", "32k", "60ms"
HARDWARE = (("H100", "h100"), ("H100+A100", "h100,a100"))
VARIANTS = (("Full", True, True), ("No-PF", False, True), ("No-B&B", True, False), ("Neither", False, False))
REDUCED = dict(max_owners=2, batches=(1, 2, 4, 8, 16, 32, 64, 128), max_replicas=2, tensor_parallel_sizes=(1, 2, 4))


def warm_up() -> float:
    t0 = time.perf_counter()
    req = api.make_request("llama-3.1-8b", "60ms", "8k", gpus="h100", max_owners=2, batches=(1, 2),
                           max_replicas=1, tensor_parallel_sizes=(1,))
    api.plan(req)
    return time.perf_counter() - t0


def run_variant(gpus: str, pareto: bool, bnb: bool, space: dict, jobs: int):
    req = api.make_request(MODEL, SLO, CTX, gpus=gpus, pareto=pareto, bnb=bnb, **space)
    t0 = time.perf_counter()
    ctx = compile_request(req)
    t_ctx = time.perf_counter() - t0
    t1, c1 = time.perf_counter(), time.process_time()
    outcome = run_search(ctx, jobs=jobs)
    t_search, c_search = time.perf_counter() - t1, time.process_time() - c1
    best = outcome.best
    plan = None
    if best:
        plan, _ev = build_plan(ctx, best.template, best.selection, search_stats(req, ctx.hw, outcome),
                               scored_t_rtt_us=best.t_rtt_us)
    return outcome, plan, t_ctx, t_search, c_search


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reduced", action="store_true", help=f"reduced grid {REDUCED}, all four variants")
    ap.add_argument("--all", action="store_true", help="run all four variants on the chosen grid")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--hardware", choices=[h for h, _ in HARDWARE], action="append")
    args = ap.parse_args(argv)
    space = REDUCED if args.reduced else {}
    variants = VARIANTS if (args.reduced or args.all) else VARIANTS[:1]
    hardware = [h for h in HARDWARE if not args.hardware or h[0] in args.hardware]

    print(f"# {MODEL}, ctx {CTX}, SLO {SLO}, grid: {'reduced ' + str(REDUCED) if args.reduced else 'full default'}"
          f", jobs {args.jobs}")
    print(f"warm-up (numba cache load/compile + tiny search): {warm_up():.2f} s")
    header = f"{'hardware':<10} {'variant':<8} {'templates':>9} {'candidates':>12} {'simulations':>12} " \
             f"{'pruned_bnd':>12} {'pruned_pf':>10} {'search_s':>9} {'cpu_s':>7} {'setup_s':>8} {'usd/Mtok':>11} {'tpot_ms':>9}"
    print(header)
    print("-" * len(header))
    ok = True
    for hname, gpus in hardware:
        ref = None
        for vname, pf, bnb in variants:
            outcome, plan, t_ctx, t_search, c_search = run_variant(gpus, pf, bnb, space, args.jobs)
            c = outcome.counters._asdict()
            usd = plan.usd_per_million_tokens if plan else float("inf")
            tpot = plan.tpot_ms if plan else float("nan")
            print(f"{hname:<10} {vname:<8} {outcome.templates:>9} {c['candidates']:>12,} {c['simulations']:>12,} "
                  f"{c['pruned_by_bound']:>12,} {c['pruned_by_frontier']:>10,} {t_search:>9.2f} {c_search:>7.2f} {t_ctx:>8.2f} "
                  f"{usd:>11.6g} {tpot:>9.4g}", flush=True)
            key = None if plan is None else plan.model_dump(exclude={"search"})
            if ref is None:
                ref = (usd, key)
            elif (usd, key) != ref:
                ok = False
                print(f"  MISMATCH: {vname} differs from {variants[0][0]} ({usd} vs {ref[0]})", flush=True)
    print("all variants return the same plan" if ok else "VARIANTS DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
