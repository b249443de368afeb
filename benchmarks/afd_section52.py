"""Section 5.2 of the AFD paper: simulated best r next to r*_mf and r*_G.

Parameters: Table 3 coefficients, B = 256, prompt and decode geometric on {1, 2, ...}
with means 100 and 500, r in {1, 2, 4, 8, 16, 24, 32}, 10,000 requests per instance.
The paper's simulator keeps two batches in flight; ``--batches-in-flight`` and
``--start`` show how sensitive the simulated optimum is to those modelling choices.

    python benchmarks/afd_section52.py [--seeds 0,1,2] [--batches-in-flight 2] [--start stationary]
"""

from __future__ import annotations

import argparse

RATIOS = (1, 2, 4, 8, 16, 24, 32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--batches-in-flight", type=int, default=2)
    parser.add_argument("--start", default="stationary", choices=("stationary", "cold"))
    parser.add_argument("--requests", type=int, default=10_000)
    args = parser.parse_args()

    from opweave_planner.afd import provisioning as pv
    from opweave_planner.afd.simulator import simulate_bundle
    from opweave_planner.workload.sampling import LengthDist, ParametricWorkload

    coef = pv.LatencyCoefficients(**pv.PAPER_SECTION_52)
    workload = ParametricWorkload(LengthDist("geometric", 100), LengthDist("geometric", 500))
    batch = 256
    mf = pv.optimal_ratio_mf(coef, batch, workload.theta)
    gauss = pv.optimal_ratio_gaussian(coef, batch, workload.theta, workload.nu)
    table = pv.ratio_table(coef, batch, workload.theta, workload.nu, RATIOS)
    print(f"theta = {workload.theta:g}, nu^2 = {workload.nu2:g}")
    print(f"r*_mf = {mf.r:.3f} ({mf.regime} regime, {mf.balance}); r*_G = {gauss.r:.3f}")
    print(
        f"batches in flight = {args.batches_in_flight}, start = {args.start}, "
        f"{args.requests} requests/instance"
    )
    header = f"{'r':>3} {'thr_mf':>7} {'thr_G':>7}" + "".join(
        f" {'sim s' + s:>8}" for s in args.seeds.split(",")
    )
    print(header)
    sims = {}
    for i, r in enumerate(RATIOS):
        row = []
        for seed in (int(s) for s in args.seeds.split(",")):
            res = simulate_bundle(
                coef,
                workload,
                r,
                batch,
                args.requests,
                seed=seed,
                batches_in_flight=args.batches_in_flight,
                start=args.start,
            )
            row.append(res.throughput_per_instance)
            sims.setdefault(seed, {})[r] = res.throughput_per_instance
        cells = "".join(f" {x:8.4f}" for x in row)
        print(f"{r:>3} {table['throughput_mf'][i]:7.4f} {table['throughput_g'][i]:7.4f}{cells}")
    best = {seed: max(values, key=values.get) for seed, values in sims.items()}
    print("simulated best r per seed: " + ", ".join(f"seed {s}: {r}" for s, r in best.items()))
    print(f"r*_mf = {mf.r:.2f}, r*_G = {gauss.r:.2f} (paper: 9.3 predicted, 8 simulated)")


if __name__ == "__main__":
    main()
