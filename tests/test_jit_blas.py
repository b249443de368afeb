"""jit._skip_blas_probe: running a cached kernel does not import scipy.linalg (0.2-0.45 s of a
plan), and a kernel that does use BLAS still gets it."""

from __future__ import annotations

import os
import subprocess
import sys

CODE = """
import sys
import numpy as np
from opweave_planner.latency.ttft import replay
replay(np.zeros(3), np.ones(3), 1)
print('scipy.linalg' in sys.modules, 'numba.np.arraymath' in sys.modules)
from opweave_planner import jit
from numba.np import arraymath, linalg
print(arraymath._HAVE_BLAS, arraymath.ensure_blas is linalg.ensure_blas)

def blas(a, m):
    return np.dot(a, a), (m @ m)[0, 1]

import numba
f = jit._at_opt_level(numba.njit(blas))
m = np.arange(4.0).reshape(2, 2)
print(f(np.arange(3.0), m) == blas(np.arange(3.0), m), 'scipy.linalg' in sys.modules)
"""


def test_a_kernel_runs_without_scipy_linalg_and_blas_still_works(tmp_path):
    res = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)})
    assert res.stdout.split() == ["False", "True", "True", "True", "True", "True"], res.stderr
