"""Compile-time settings of the package's kernels: jit._share_inline_copies (numba's inliner
copies a callee's IR block by block; inside its `copy_ir` the blocks now share one memo, one
scope copy instead of one per block, and a deep copy of a block anywhere else keeps its own) and
the plain-text error messages numba builds for every overload it rejects."""

from __future__ import annotations

import copy

import numba  # noqa: F401  (the package's kernels need it; this test drives numba's IR directly)
from numba.core import inline_closurecall, ir
from numba.core.compiler import run_frontend

from opweave_planner import jit


def _branchy(x, n):
    total = 0.0
    for i in range(n):
        if i % 2:
            total += x
        else:
            total -= 1.0
    return total


# a function named copy_ir whose code claims numba's inliner's file and copies in a loop, as
# numba's own does (a comprehension would be a frame of its own)
_NS: dict = {"copy": copy}
exec(compile("def copy_ir(blocks):\n    out = {}\n    for k, b in blocks.items():\n"
             "        out[k] = copy.deepcopy(b)\n    return out\n", inline_closurecall.__file__, "exec"), _NS)


def test_the_inliners_copy_shares_one_scope_and_others_do_not():
    jit._share_inline_copies()
    blocks = run_frontend(_branchy).blocks
    assert len(blocks) > 3
    inside = _NS["copy_ir"](blocks)
    scopes = {id(b.scope) for b in inside.values()}
    assert len(scopes) == 1  # one copy of the scope for every block
    assert all(b.scope is not blocks[k].scope for k, b in inside.items())
    # a second call is a new copy, not the first one again
    again = _NS["copy_ir"](blocks)
    assert all(again[k] is not inside[k] for k in blocks)
    # elsewhere: numba's own memo, a scope copy per block, as before
    outside = {k: copy.deepcopy(b) for k, b in blocks.items()}
    assert len({id(b.scope) for b in outside.values()}) == len(blocks)
    # the copies are the same IR
    for k, b in blocks.items():
        assert [str(s) for s in inside[k].body] == [str(s) for s in b.body] == [str(s) for s in outside[k].body]


def test_inlined_kernels_compute_as_before():
    """A kernel with a multi-block callee inlined (inline=True) twice, compiled with the shared
    copy: the same numbers as plain Python."""
    def body(x, n):
        total = 0.0
        for i in range(n):
            total = total + x if i % 2 else total - 1.0
        return total

    inner = jit.kernel(inline=True)(body)

    def outer(x, n):
        return inner(x, n) + inner(2.0 * x, n + 1)

    fast = numba.njit(outer)
    assert isinstance(ir.Block.__dict__.get("__deepcopy__"), type(outer))
    for x, n in [(1.5, 0), (0.25, 7), (-3.0, 12)]:
        assert fast(x, n) == body(x, n) + body(2.0 * x, n + 1)


def test_numba_still_copies_block_by_block_in_copy_ir():
    """What the patch recognises: if numba renames copy_ir or copies otherwise, the patch is
    inert (inlining only slower again) and this says so."""
    import inspect

    src = inspect.getsource(inline_closurecall.InlineWorker.inline_ir)
    assert "def copy_ir(the_ir):" in src and "copy.deepcopy(the_ir.blocks[block_label])" in src


def test_numba_formats_rejected_overloads_without_colour():
    """The package sets NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING before any of its modules can
    import numba (opweave_planner/__init__.py), schedule.kernels included, which imports numba
    before jit; a user's own value wins."""
    import os
    import subprocess
    import sys

    code = ("import opweave_planner.schedule.kernels, numba.core.errors as e;"
            "print(type(e.termcolor()).__name__)")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING"}
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "NOPColorScheme"
    from importlib.util import find_spec

    if find_spec("colorama") is None:  # numba highlights with colorama only
        return
    env["NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING"] = ""
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert got.stdout.strip() != "NOPColorScheme"


def test_compile_flags_compare_as_numba_compares_them():
    """jit._compare_flags_by_their_settings: the fast path answers only 'equal' for the same
    settings; an explicit default still equals an unset option (numba's rule), and a different
    setting differs; hashing is numba's."""
    from numba.core.compiler import Flags
    from numba.core.targetconfig import TargetConfig

    jit._compare_flags_by_their_settings()
    assert getattr(TargetConfig.__eq__, "opweave_settings", False)
    a, b = Flags(), Flags()
    a.nrt = b.nrt = True
    assert a == b and hash(a) == hash(b)
    default = Flags()
    default.boundscheck = Flags().boundscheck  # set explicitly to its default
    assert default == Flags() and default._values != Flags()._values
    c = Flags()
    c.nrt = False
    assert a != c
    assert (a == 1) is False


LOAD = """
import sys
import numpy as np
from opweave_planner.schedule.kernels import simulate_rtt
from opweave_planner.schedule.reference import simulate_rtt as reference
owner, t = np.array([0, 1, 0], np.int64), np.array([1.0, 2.5, 0.5])
occ, lat = np.array([0.25, 0.5, 0.0]), np.array([0.1, 0.1, 0.0])
got = simulate_rtt(owner, t, occ, lat, 2, 2)
assert abs(got - reference(list(owner), list(t), list(occ), list(lat), 2, 2)) < 1e-9, got
print("registries", "numba.np.npdatetime" in sys.modules)
if sys.argv[1] == "compile":  # a new compile after a light load: numba refreshes for it
    import numba
    f = numba.njit(lambda a: (np.sqrt(a) + a.sum()).max())  # numba's array math registries
    assert f(np.array([1.0, 4.0])) == 2.0 + 5.0
"""


def test_a_cached_kernel_loads_without_numbas_registries(tmp_path):
    """jit._load_without_refresh: a process that only loads cached kernels starts numba's runtime,
    not its every lowering and typing registry, computes as before, and can still compile."""
    import os
    import subprocess
    import sys

    script = tmp_path / "load.py"
    script.write_text(LOAD)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def run(mode):
        res = subprocess.run([sys.executable, str(script), mode], env=env, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stderr
        return res.stdout.split()

    assert run("first") == ["registries", "True"]  # an empty cache: compiled, registries loaded
    assert run("compile") == ["registries", "False"]  # loaded: none of them, then a compile works
