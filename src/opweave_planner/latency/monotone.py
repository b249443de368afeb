"""Robust monotone fit of measured latency grids: a despiking median filter, then isotonic regression.

A running maximum lets one noisy cell lift every cell after it (a plateau);
here a cell is only replaced when it is a spike, i.e. it differs by more than
``SPIKE_TOL`` from the median of itself and its two neighbours along an axis
(an edge cell is a spike when it is out of order with its neighbour by more
than that). Interior spikes are replaced by the linear interpolation of their
neighbours, edge spikes by the neighbour. What noise remains is removed by
isotonic (non-decreasing) median regression (pool adjacent violators with
block medians), which moves each violating run to its median instead of its
maximum.

Cells of a series that is already non-decreasing are returned unchanged, so
the fit is exact wherever a point agrees with its neighbours. 2-D grids are
despiked along the last axis, then the first, and made monotone by alternating
1-D isotonic fits (a final running maximum guarantees the result).
"""

from __future__ import annotations

import numpy as np

__all__ = ["KEEP_TOL", "SPIKE_TOL", "isotonic", "robust_monotone"]

#: a cell this far (relative) from its 3-point median is a spike
SPIKE_TOL = 0.15
#: a fitted cell within this relative distance of its measurement is still "measured"
KEEP_TOL = 0.03


def isotonic(y: np.ndarray) -> np.ndarray:
    """Least-absolute-deviation non-decreasing fit of `y`: pool adjacent violators, block medians.

    Medians rather than means, so a run of outliers shorter than the run of
    good cells it is pooled with does not move the result.
    """
    blocks: list[list[float]] = []
    meds: list[float] = []
    for v in y.tolist():
        blocks.append([v])
        meds.append(v)
        while len(meds) > 1 and meds[-2] > meds[-1]:
            merged = blocks[-2] + blocks[-1]
            blocks[-2:] = [merged]
            meds[-2:] = [float(np.median(merged))]
    return np.concatenate([np.full(len(b), m) for b, m in zip(blocks, meds, strict=True)])


def _line(x0: float, x1: float, y0: float, y1: float, x: float) -> float:
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _despike(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Replace spikes: interior cells far from their 3-point median, edge cells out of order.

    An interior spike becomes the line through its two neighbours; a first
    cell above its (despiked) neighbour by more than SPIKE_TOL, or a last cell
    below it, takes the neighbour's value (a low first or high last cell is
    consistent with growth and is kept).
    """
    n = y.size
    out = y.copy()
    for i in range(1, n - 1):
        med = float(np.median(y[i - 1 : i + 2]))
        if med > 0 and abs(y[i] - med) > SPIKE_TOL * med:
            out[i] = _line(x[i - 1], x[i + 1], y[i - 1], y[i + 1], x[i])
    if n >= 2:
        if out[0] > (1 + SPIKE_TOL) * out[1]:
            out[0] = out[1]
        if out[-1] < (1 - SPIKE_TOL) * out[-2]:
            out[-1] = out[-2]
    return out


def _along(grid: np.ndarray, x: np.ndarray, axis: int, fn) -> np.ndarray:
    """Apply `fn(x_measured, y_measured)` to every 1-D line of `grid` along `axis` (nan skipped)."""
    g = np.moveaxis(grid.copy(), axis, -1)
    flat = g.reshape(-1, g.shape[-1])
    for row in flat:
        ok = np.isfinite(row)
        if ok.sum() >= 2:
            row[ok] = fn(x[ok], row[ok])
    return np.moveaxis(flat.reshape(g.shape), -1, axis)


def _isotonic(_x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return isotonic(y)


def _is_monotone(grid: np.ndarray) -> bool:
    for ax in range(grid.ndim):
        g = np.moveaxis(grid, ax, -1).reshape(-1, grid.shape[ax])
        for row in g:
            r = row[np.isfinite(row)]
            if r.size > 1 and np.any(np.diff(r) < 0):
                return False
    return True


def robust_monotone(grid: np.ndarray, axes: tuple[np.ndarray, ...]) -> np.ndarray:
    """Non-decreasing (along every axis) robust fit of `grid`; nan cells stay nan."""
    out = np.asarray(grid, dtype=np.float64).copy()
    for ax in reversed(range(out.ndim)):
        out = _along(out, np.asarray(axes[ax], dtype=np.float64), ax, _despike)
    for _ in range(8):
        if _is_monotone(out):
            break
        for ax in reversed(range(out.ndim)):
            out = _along(out, np.asarray(axes[ax], dtype=np.float64), ax, _isotonic)
    while not _is_monotone(out):  # alternating 1-D fits did not settle: running max
        for ax in range(out.ndim):
            out = _along(out, np.asarray(axes[ax], dtype=np.float64), ax,
                         lambda _x, y: np.maximum.accumulate(y))
    return out
