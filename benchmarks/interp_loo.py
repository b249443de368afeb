"""Leave-one-out error of the piecewise-linear interpolation over the shipped tables.

For every measured cell whose two neighbours along an axis are also measured,
drop it, predict it by linear interpolation between those neighbours (the rule
`latency.interp` applies between grid points) and record |pred - true| / true.
Dropping a point doubles the bracketing gap, so this over-states the error of a
real lookup, which brackets the query with the nearest points.

    python benchmarks/interp_loo.py [--profiles profiles] [--backend vllm]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from opweave_planner.latency.tables import available_gpus, load_profile_set


def loo_errors(x: np.ndarray, grid: np.ndarray, axis: int) -> np.ndarray:
    """Relative LOO errors along `axis` of `grid` (nan = unmeasured) with coordinates `x`."""
    g = np.moveaxis(grid, axis, -1)
    left, mid, right = g[..., :-2], g[..., 1:-1], g[..., 2:]
    t = (x[1:-1] - x[:-2]) / (x[2:] - x[:-2])
    pred = left + (right - left) * t
    ok = np.isfinite(left) & np.isfinite(mid) & np.isfinite(right)
    return np.abs(pred[ok] - mid[ok]) / mid[ok]


def table_errors(table, axis: int, select=lambda key: True) -> np.ndarray:
    x = table.axis_arrays[axis]
    errs = [loo_errors(x, g, axis) for k, g in table.grids.items() if select(k)]
    return np.concatenate(errs) if errs else np.zeros(0)


def main(argv: list[str] | None = None) -> list[tuple]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=Path(__file__).parents[1] / "profiles")
    ap.add_argument("--backend", default="vllm")
    args = ap.parse_args(argv)
    rows = []
    for gpu in available_gpus(args.profiles):
        ps = load_profile_set(args.profiles, gpu, args.backend)
        checks = [
            ("gemm", 0, "m", lambda k: k[0] == "bfloat16"),
            ("attention", 1, "kv_len", lambda k: True),
            ("attention", 0, "batch", lambda k: True),
        ]
        for kind, axis, name, select in checks:
            table = ps.table(kind)
            if table is None:
                continue
            e = table_errors(table, axis, select)
            if e.size:
                rows.append((gpu, kind, name, e.size, np.median(e), np.percentile(e, 90)))
    print(f"{'gpu':6} {'table':10} {'axis':7} {'points':>7} {'median':>8} {'p90':>8}")
    for gpu, kind, name, n, med, p90 in rows:
        print(f"{gpu:6} {kind:10} {name:7} {n:7d} {100 * med:7.2f}% {100 * p90:7.2f}%")
    return rows


if __name__ == "__main__":
    main()
