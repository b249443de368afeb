"""A template's Problem, built cheaply (issue 30), still typed and checked as the kernels need."""

from __future__ import annotations

import numpy as np
import pytest

from opweave_planner import api
from opweave_planner.compile import compile_request
from opweave_planner.compile.problem import PARTS, Problem, check_problem, typed_part


@pytest.fixture(scope="module")
def ctx():
    return compile_request(api.make_request("gemma-3-27b", "60ms", "32k", gpus="h100"))


def test_typed_part_keeps_a_typed_array_and_copies_the_rest(ctx):
    st = ctx.problem(ctx.templates[7]).stages
    again = typed_part(st)
    assert all(a is b for a, b in zip(again, st, strict=True))  # already typed: the same arrays
    ro = st.payload.copy()
    ro.flags.writeable = False
    odd = typed_part(st._replace(stage_owner=st.stage_owner.astype(np.int32), payload=ro,
                                 stage_start=np.asfortranarray(st.stage_start[::-1])[::-1], k=np.int64(st.k)))
    assert odd.stage_owner.dtype == np.int64 and odd.payload.flags.writeable and odd.payload is not ro
    assert odd.stage_start.flags.c_contiguous and type(odd.k) is int
    assert np.array_equal(odd.payload, st.payload) and np.array_equal(odd.stage_owner, st.stage_owner)


def test_problem_of_whole_parts_is_the_problem_of_its_fields(ctx):
    p = ctx.problem(ctx.templates[3])
    whole = Problem(**dict(zip(PARTS, p, strict=True)))
    assert type(whole) is Problem and tuple(whole) == tuple(p)
    fields = {f: v for part in p for f, v in zip(part._fields, part, strict=True)}
    assert tuple(Problem(**fields)) == tuple(p)
    with pytest.raises(TypeError):
        Problem(**dict(zip(PARTS, p, strict=True)), slo=1.0, bogus=1)


@pytest.mark.parametrize("change, message", [
    (lambda st: dict(stage_owner=st.stage_owner + 1), "owners are not 0..k-1"),
    (lambda st: dict(stage_end=st.stage_end + 10_000), "stage ranges outside the operator sequence"),
    (lambda st: dict(stage_start=-st.stage_start - 1), "stage ranges outside the operator sequence"),
    (lambda st: dict(payload=st.payload[:-1]), "payload axis 0 is"),
    (lambda st: dict(cfg_ok=st.cfg_ok[None]), "cfg_ok has 3 dimensions, not 2 (k C)"),
    (lambda st: dict(kv_units=st.kv_units[:, :, :3]), "kv_units does not cover every batch"),
])
def test_a_bad_template_problem_is_refused(ctx, change, message):
    p = ctx.problem(ctx.templates[9])
    bad = p._replace(stages=p.stages._replace(**change(p.stages)))
    check_problem(p, ("stages",))
    with pytest.raises(ValueError, match="inconsistent search problem: " + message.replace("(", r"\(").replace(")", r"\)")):
        check_problem(bad, ("stages",))
    assert check_problem(bad, ()) is bad  # nothing named, nothing checked
