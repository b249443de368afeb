"""Leave-one-out error of the library's own interpolation over the shipped tables.

For every table and axis, every other grid line along the axis (one parity,
never the first or last) is removed from a copy of the grid, the copy goes through the
lookup's own preparation and interpolation (`interp._prepare`, `interp._interp`:
filling, the monotone pass, speed-of-light edge rules), and each removed cell
whose two neighbours are measured is predicted and compared: |pred - true| /
true. Then the other parity. Dropping a point doubles the bracketing gap, so
this over-states the error of a real lookup, which brackets a query with the
nearest points.

    python benchmarks/interp_loo.py [--profiles profiles] [--backend vllm]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from opweave_planner.latency import interp
from opweave_planner.latency.tables import available_gpus, load_profile_set

_KINDS = {"gemm": interp._GEMM, "attention": interp._ATTN}


def loo_errors(ps, kind: str, key: tuple, axis: int) -> np.ndarray:
    """Relative errors of the library's lookup at cells removed every other point along `axis`."""
    table = ps.table(kind)
    raw = table.grids[key]
    axes = table.axis_arrays
    sol = interp._sol_for(ps, _KINDS[kind], key)
    g = np.moveaxis(raw, axis, -1)
    nb_ok = np.zeros(g.shape, dtype=bool)
    nb_ok[..., 1:-1] = np.isfinite(g[..., :-2]) & np.isfinite(g[..., 1:-1]) & np.isfinite(g[..., 2:])
    nb_ok = np.moveaxis(nb_ok, -1, axis)
    errs = []
    for parity in (0, 1):
        # whole lines (every other grid point, never the first or last) go, as in a coarser
        # measurement; only cells with both neighbours measured are scored
        drop = np.zeros(raw.shape, dtype=bool)
        sl = [slice(None)] * raw.ndim
        sl[axis] = slice(1 + parity, raw.shape[axis] - 1, 2)
        drop[tuple(sl)] = True
        held = np.where(drop, np.nan, raw)
        drop &= nb_ok
        if not drop.any():
            continue
        if not np.isfinite(held).any():
            continue
        prep = interp._prepare(held, axes, sol)
        idx = np.nonzero(drop)
        coords = [ax[i] for ax, i in zip(axes, idx, strict=True)]
        pred, _ = interp._interp(prep, coords)
        errs.append(np.abs(pred - raw[idx]) / raw[idx])
    return np.concatenate(errs) if errs else np.zeros(0)


def main(argv: list[str] | None = None) -> list[tuple]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=Path(__file__).parents[1] / "profiles")
    ap.add_argument("--backend", default="vllm")
    args = ap.parse_args(argv)
    rows = []
    checks = [
        ("gemm", 0, "m", lambda k: k[0] == "bfloat16"),
        ("attention", 1, "kv_len", lambda k: True),
        ("attention", 0, "batch", lambda k: True),
    ]
    for gpu in available_gpus(args.profiles):
        ps = load_profile_set(args.profiles, gpu, args.backend)
        for kind, axis, name, select in checks:
            table = ps.table(kind)
            if table is None:
                continue
            e = [loo_errors(ps, kind, k, axis) for k in table.grids if select(k)]
            e = np.concatenate(e) if e else np.zeros(0)
            if e.size:
                rows.append((gpu, kind, name, e.size, np.median(e), np.percentile(e, 90)))
    print(f"{'gpu':6} {'table':10} {'axis':7} {'points':>7} {'median':>8} {'p90':>8}")
    for gpu, kind, name, n, med, p90 in rows:
        print(f"{gpu:6} {kind:10} {name:7} {n:7d} {100 * med:7.2f}% {100 * p90:7.2f}%")
    return rows


if __name__ == "__main__":
    main()
