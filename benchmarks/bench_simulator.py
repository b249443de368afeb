"""Simulations per second of the schedule simulator on one core (issue 4).

Usage:  python benchmarks/bench_simulator.py [--cases 2000] [--repeats 50] [--rounds 5]

Shapes (2 owners, stage j on owner j % 2, mu = 4, stage latencies U(200, 2000) us,
occ U(5, 50) us, lat 20 us):
  * 21 stages: gemma-3-27b, 2 stages per 6-layer block (10 blocks + a 2-layer tail);
    the last stage sits on owner 0, so the token hand-back is local;
  * 124 stages: attention-FFN split of every one of the 62 layers.

The figure is measured inside a numba loop after warm-up; the first call of each kernel
(numba compile, or load from the on-disk cache) is timed and reported separately.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numba
import numpy as np

from opweave_planner.schedule import kernels as K


@numba.njit
def _loop_scratch(owner, T, OCC, LAT, mu, n_owners, repeats):
    fbuf, ibuf = K.make_scratch(owner.shape[0], mu, n_owners)
    acc = 0.0
    for _ in range(repeats):
        for i in range(T.shape[0]):
            acc += K.simulate_rtt_scratch(owner, T[i], OCC[i], LAT[i], mu, n_owners, fbuf, ibuf)
    return acc


@numba.njit
def _loop_alloc(owner, T, OCC, LAT, mu, n_owners, repeats):
    acc = 0.0
    for _ in range(repeats):
        for i in range(T.shape[0]):
            acc += K.simulate_rtt(owner, T[i], OCC[i], LAT[i], mu, n_owners)
    return acc


def _cases(S, n, rng):
    T = rng.uniform(200.0, 2000.0, (n, S))
    OCC = rng.uniform(5.0, 50.0, (n, S))
    LAT = np.full((n, S), 20.0)
    return T, OCC, LAT


def _rate(fn, args, repeats, rounds):
    """Median simulations/s over ``rounds`` timed runs of ``repeats`` passes over the cases."""
    n = args[1].shape[0]
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn(*args, repeats)
        rates.append(n * repeats / (time.perf_counter() - t0))
    return float(np.median(rates))


_COLD = (
    "import time, numpy as np; t0 = time.perf_counter();"
    "from opweave_planner.schedule import kernels as K; o = np.array([0, 1]); x = np.ones(2);"
    "K.simulate_rtt(o, x, x, x, 4, 2); print(time.perf_counter() - t0)"
)


def cold_compile_seconds() -> float:
    """Import + first simulate_rtt in a fresh interpreter with an empty numba cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        out = subprocess.run(
            [sys.executable, "-c", _COLD], env=env, capture_output=True, text=True, check=True
        )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000, help="random plans per shape")
    ap.add_argument("--repeats", type=int, default=50, help="passes over the cases per round")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (median reported)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    rng = np.random.default_rng(args.seed)
    mu, n_owners = 4, 2

    owner0 = np.array([0, 1], dtype=np.int64)
    one = np.ones(2)
    t0 = time.perf_counter()
    K.simulate_rtt(owner0, one, one, one, mu, n_owners)
    first_kernel = time.perf_counter() - t0
    t0 = time.perf_counter()
    K.simulate_detail(owner0, one, one, one, mu, n_owners)
    K.simulate_many(owner0, one[None, :], one[None, :], one[None, :], mu, n_owners)
    first_other = time.perf_counter() - t0
    t0 = time.perf_counter()
    tiny = (owner0, one[None, :], one[None, :], one[None, :], mu, n_owners, 1)
    _loop_scratch(*tiny)
    _loop_alloc(*tiny)
    bench_compile = time.perf_counter() - t0
    cold = cold_compile_seconds()
    print(f"numba {numba.__version__}, numpy {np.__version__}, pinned to 1 core")
    print(
        f"warm-up: cold compile (empty cache, fresh process, incl. import) {cold:.2f} s; "
        f"first simulate_rtt here {first_kernel:.2f} s (cache load or compile); "
        f"simulate_detail + simulate_many {first_other:.2f} s; "
        f"benchmark loops {bench_compile:.2f} s"
    )
    print(
        f"{'shape':<16}{'S':>4}{'mu':>3}{'sims/s scratch':>16}{'sims/s alloc':>14}"
        f"{'us/sim':>8}{'iters mean/max':>16}{'fallbacks':>10}"
    )
    for name, S in (("gemma 2/block", 21), ("AFD every layer", 124)):
        owner = (np.arange(S) % 2).astype(np.int64)
        T, OCC, LAT = _cases(S, args.cases, rng)
        fbuf, ibuf = K.make_scratch(S, mu, n_owners)
        iters, fallbacks = [], 0
        for i in range(args.cases):
            _, it, _, fb = K.simulate_rtt_info(
                owner, T[i], OCC[i], LAT[i], mu, n_owners, fbuf, ibuf, K.MAX_ITERATIONS
            )
            iters.append(it)
            fallbacks += int(fb)
        loop_args = (owner, T, OCC, LAT, mu, n_owners)
        scratch = _rate(_loop_scratch, loop_args, args.repeats, args.rounds)
        alloc = _rate(_loop_alloc, loop_args, args.repeats, args.rounds)
        it = f"{np.mean(iters):.2f}/{max(iters)}"
        print(
            f"{name:<16}{S:>4}{mu:>3}{scratch:>16,.0f}{alloc:>14,.0f}"
            f"{1e6 / scratch:>8.2f}{it:>16}{fallbacks:>10d}"
        )


if __name__ == "__main__":
    main()
