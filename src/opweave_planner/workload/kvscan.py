"""The KV event law's element-wise loops (workload/kv.py), as kernels: each is numpy's own
arithmetic, operation for operation, so the law is the same bits (tests/test_window_kvscan.py
compares them with the numpy they replace); imported on first use, so importing workload.kv
imports no numba."""

from __future__ import annotations

import math

import numpy as np

from opweave_planner.jit import entry


@entry
def term_values(s, span, cdf_f, tail):
    """P(F <= x) P(A > x - s) at x = 0..span-1 (m >= 1 finishing requests): `cdf_f` padded with
    ones times np.interp(x - s, arange(-1, tail.size - 1), tail, left=1, right=0), computed as
    numpy's interp does (unit knot spacing: the slope is the difference of the two values)."""
    out = np.empty(span)
    nf, nt = cdf_f.shape[0], tail.shape[0]
    last = float(nt - 2)  # the last knot
    for i in range(span):
        xv = float(i) - s
        if xv < -1.0:
            a = 1.0
        elif xv > last:
            a = 0.0
        elif xv == last:
            a = tail[nt - 1]
        else:
            j = int(math.floor(xv)) + 1  # knot j is at j - 1
            xj = float(j - 1)
            a = tail[j] if xj == xv else (tail[j + 1] - tail[j]) * (xv - xj) + tail[j]
        out[i] = (cdf_f[i] if i < nf else 1.0) * a
    return out


@entry
def quantile_index(raw, size, v):
    """The first k < size with cdf[k] >= v, cdf the cumulative sum of raw[:size] clipped at 0 over
    its total (np.cumsum's sequential sums, divided as `cdf /= cdf[-1]` does), else size - 1: what
    np.searchsorted(cdf, v) finds on that nondecreasing cdf, without the cdf. -1: a zero total."""
    total = 0.0
    for i in range(size):
        total += raw[i] if raw[i] > 0.0 else 0.0
    if not total > 0.0:
        return -1
    run = 0.0
    for i in range(size):
        run += raw[i] if raw[i] > 0.0 else 0.0
        if run / total >= v:
            return i
    return size - 1


@entry
def end_laws(sf, f_total, sa, a_total):
    """(P(F <= k), P(A > k - 1)) from the clipped sums' masses and totals: np.minimum(np.cumsum(sf) /
    f_total, 1) and [1] + np.clip(1 - np.cumsum(sa) / a_total, 0, 1), in one pass each."""
    cdf_f = np.empty(sf.shape[0])
    run = 0.0
    for i in range(sf.shape[0]):
        run += sf[i]
        x = run / f_total
        cdf_f[i] = x if x <= 1.0 else 1.0
    tail = np.empty(sa.shape[0] + 1)
    tail[0] = 1.0
    run = 0.0
    for i in range(sa.shape[0]):
        run += sa[i]
        x = 1.0 - run / a_total
        x = x if x > 0.0 else 0.0
        tail[i + 1] = x if x < 1.0 else 1.0
    return cdf_f, tail


@entry
def blend_into(laws, weights, prod):
    """laws[i] += weights[i] * prod for each nonzero weight, on the float64 views of complex arrays
    (numpy's float-times-complex product is (w pr - 0 pi, w pi + 0 pr): w pr and w pi), in place."""
    for i in range(weights.shape[0]):
        w = weights[i]
        if w != 0.0:
            row = laws[i]
            for t in range(prod.shape[0]):
                row[t] += w * prod[t]


@entry
def int_power(z, n):
    """z ** n elementwise for a whole exponent 1 < n < 100: numpy's complex power there (npy_cpow:
    binary powers, each product (ar br - ai bi, ar bi + ai br), a zero base gives zero)."""
    out = np.empty_like(z)
    for t in range(z.shape[0]):
        ar, ai = z[t].real, z[t].imag
        if ar == 0.0 and ai == 0.0:
            out[t] = 0.0
            continue
        if n == 2:
            out[t] = complex(ar * ar - ai * ai, ar * ai + ai * ar)
            continue
        if n == 3:
            sr, si = ar * ar - ai * ai, ar * ai + ai * ar
            out[t] = complex(ar * sr - ai * si, ar * si + ai * sr)
            continue
        qr, qi, pr, pi, mask = 1.0, 0.0, ar, ai, 1
        while True:
            if n & mask:
                qr, qi = qr * pr - qi * pi, qr * pi + qi * pr
            mask <<= 1
            if n < mask:
                break
            pr, pi = pr * pr - pi * pi, pr * pi + pi * pr
        out[t] = complex(qr, qi)
    return out
