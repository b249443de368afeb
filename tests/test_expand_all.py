"""`expand_all` builds the plans `expand` builds one template at a time, in any grouping (issue 30)."""

from __future__ import annotations

import pytest
from test_structure import _expand_by_definition

from opweave_planner.inputs.model import load_model
from opweave_planner.policies import templates_for
from opweave_planner.structure import templates as tm
from opweave_planner.structure.operators import build_sequence
from opweave_planner.structure.templates import Template, expand, expand_all


@pytest.mark.parametrize("name", ["gemma-3-27b", "deepseek-v3", "gpt-oss-120b", "qwen3-next-80b-a3b"])
def test_expand_all_is_expand(name, monkeypatch):
    seq = build_sequence(load_model(name))
    every = templates_for(seq, "opweave", 3)
    monkeypatch.setattr(tm, "EXPAND_CHUNK", 97)  # chunks that split a (sub-block, owners) run
    some = [*every[::5][::-1], Template(1, (0,)), every[-1]]  # any order, repeats, the colocated
    for ts in (every, some):
        got = expand_all(seq, ts)
        assert got == [expand.__wrapped__(seq, t) for t in ts]  # each alone: a run of one
        assert all(type(x) is int for p in got for x in p.owner + p.start + p.end)
    for t, plan in list(zip(every, expand_all(seq, every), strict=True))[::max(1, len(every) // 300)]:
        assert (plan.owner, plan.ops) == _expand_by_definition(seq, t), t
    assert expand_all(seq, []) == []
