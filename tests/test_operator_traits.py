"""One trait row per operator kind, read everywhere instead of kind names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from opweave_planner.inputs.model import bundled_models, load_model
from opweave_planner.latency import lookup
from opweave_planner.structure.operators import (
    TRAITS,
    Kernel,
    KvRule,
    OpKind,
    Passes,
    Shard,
    Side,
    build_sequence,
    operator_side,
)

PKG = Path(__file__).resolve().parents[1] / "src" / "opweave_planner"
KIND_NAMES = {k.value for k in OpKind}
# modules that still spell kinds; each entry is a change someone owes (remove it with the change)
PENDING: set[str] = set()


def test_every_kind_has_one_row():
    assert set(TRAITS) == set(OpKind)


def test_every_trait_value_has_its_rule():
    assert set(lookup._COSTS) == set(Kernel)
    assert set(lookup._PASSES) == set(Passes)
    assert set(lookup._KV_SHARD) == set(KvRule) - {KvRule.NONE}


@pytest.mark.parametrize("name", bundled_models())
def test_traits_agree_with_what_the_builder_emits(name):
    for op in build_sequence(load_model(name)).ops:
        t = op.traits
        assert bool(op.gemm) == (t.kernel == Kernel.GEMM), op.name
        assert (op.kv_bytes(1 << 20) > 0) == (t.kv != KvRule.NONE), op.name
        assert t.shard != Shard.EVEN or not op.gemm, op.name
        assert t.core == (op.context_flops > 0 or op.state_bytes > 0), op.name


def test_operator_side_reads_plan_names():
    assert operator_side("embed") == operator_side("lm_head") == Side.OTHER
    assert operator_side("layers.3.o_proj") == operator_side("layers.0.attn_mla") == Side.ATTENTION
    assert operator_side("layers.0.moe_up") == operator_side("layers.1.ffn_down") == Side.FFN
    assert operator_side("layers.1.something_new") == Side.OTHER


def _kind_literals(source: str, label: str) -> list[str]:
    """Lines of a module that spell an operator kind as a string (outside OpKind itself)."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "OpKind":
            skip.update(id(n) for n in ast.walk(node))
    return sorted(f"{label}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and n.value in KIND_NAMES and id(n) not in skip)


def test_no_module_names_operator_kinds_by_string():
    found = [hit for p in sorted(PKG.rglob("*.py")) if str(p.relative_to(PKG)) not in PENDING
             for hit in _kind_literals(p.read_text(), str(p.relative_to(PKG)))]
    assert not found, found
    stale = [rel for rel in PENDING if not _kind_literals((PKG / rel).read_text(), rel)]
    assert not stale, f"{stale} no longer spell kinds: drop them from PENDING"


def test_the_literal_scan_sees_kind_lists_and_comparisons():
    src = 'FFN = ("router", "moe_up")\nif x == "embed":\n    pass\nclass OpKind:\n    A = "o_proj"\n'
    assert _kind_literals(src, "m") == ["m:1 'moe_up'", "m:1 'router'", "m:2 'embed'"]
