"""Cyclic stage templates over a sub-block, and their expansion over the whole model.

A template with K owners is K cut positions inside a sub-block of N operators;
stage m runs from cut m to cut m+1, and the last stage wraps into the next
sub-block. There are C(N, K) of them. Expanding tiles the cuts over every
sub-block repetition (irregular prefix and truncated tail included), maps each
cut by (layer offset, slot) so layers lacking a slot take the cut before their
next operator, assigns stage g to owner (g - 1) mod K, and finally merges
adjacent stages of the same owner around the decode loop (so an empty stage
vanishes, and the last stage joins the first when they share an owner).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from itertools import combinations
from math import comb

from opweave_planner.structure.blocks import BlockStructure, detect_blocks
from opweave_planner.structure.operators import OperatorSequence, OpKind


@dataclass(frozen=True)
class Template:
    lsub: int  # sub-block length in layers
    cuts: tuple[int, ...]  # K sorted cut positions in [0, N)

    @property
    def k(self) -> int:
        return len(self.cuts)


@dataclass(frozen=True)
class StagePlan:
    """A template expanded over the model: the cyclic stage sequence."""

    template: Template
    owner: tuple[int, ...]  # owner of each stage
    ops: tuple[tuple[int, ...], ...]  # operator indices of each stage, in execution order
    cut_keys: tuple[tuple[int, int], ...]  # (layer offset, slot) of each cut

    @property
    def n_stages(self) -> int:
        return len(self.owner)


def count_templates(n_ops: int, k: int) -> int:
    return comb(n_ops, k)


def enumerate_templates(lsub: int, n_ops: int, k: int):
    """All C(N, K) cyclic templates of a sub-block, in a fixed order."""
    for cuts in combinations(range(n_ops), k):
        yield Template(lsub=lsub, cuts=cuts)


def subblock_keys(seq: OperatorSequence, blocks: BlockStructure, lsub: int) -> list[tuple[int, int]]:
    """(layer offset, slot) of each operator of the reference sub-block."""
    first = blocks.prefix_layers
    return [((op.layer - first) % lsub, op.slot) for op in seq.ops if first <= op.layer < first + lsub]


@cache
def expand(seq: OperatorSequence, template: Template) -> StagePlan:
    blocks = detect_blocks(seq)
    keys = subblock_keys(seq, blocks, template.lsub)
    cut_keys = tuple(keys[c] for c in template.cuts)
    k = template.k
    first_layer = blocks.prefix_layers

    def stage_number(layer: int, slot: int) -> int:
        rep, offset = divmod(layer - first_layer, template.lsub)
        key = (offset, slot)
        passed = sum(1 for c in cut_keys if c <= key)
        return rep * k + passed

    numbers = []
    n = seq.n
    for op in seq.ops:
        if op.kind == OpKind.EMBED:
            numbers.append(None)
        elif op.kind == OpKind.LM_HEAD:
            numbers.append(numbers[-1])
        else:
            numbers.append(stage_number(op.layer, op.slot))
    numbers[0] = numbers[1]
    owners = [(g - 1) % k for g in numbers]
    # Runs of one owner are one stage; rotate so the run holding embed's predecessor ends the list.
    starts = [i for i in range(n) if owners[i] != owners[i - 1]]
    if not starts:
        return StagePlan(template, (0,), (tuple(range(n)),), cut_keys)
    stage_ops = []
    stage_owner = []
    for s_idx, start in enumerate(starts):
        end = starts[(s_idx + 1) % len(starts)]
        idx = list(range(start, end)) if end > start else list(range(start, n)) + list(range(end))
        stage_ops.append(tuple(idx))
        stage_owner.append(owners[start])
    # Stage 0 is the one containing operator 0 (embed).
    zero = next(i for i, ops in enumerate(stage_ops) if 0 in ops)
    stage_ops = stage_ops[zero:] + stage_ops[:zero]
    stage_owner = stage_owner[zero:] + stage_owner[:zero]
    return StagePlan(template, tuple(stage_owner), tuple(stage_ops), cut_keys)


def boundary_payload(seq: OperatorSequence, plan: StagePlan) -> list[float]:
    """Bytes per request crossing the boundary after each stage (cyclic)."""
    s = plan.n_stages
    return [seq.payload[plan.ops[(j + 1) % s][0]] for j in range(s)]
