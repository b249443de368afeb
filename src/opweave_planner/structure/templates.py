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
from functools import cache, cached_property
from itertools import combinations
from math import comb

import numpy as np

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
    start: tuple[int, ...]  # first operator of each stage
    end: tuple[int, ...]  # one past its last operator, mod N (at or below `start`: it wraps past lm_head)
    cut_keys: tuple[tuple[int, int], ...]  # (layer offset, slot) of each cut
    n_ops: int  # operators of the model

    @property
    def n_stages(self) -> int:
        return len(self.owner)

    @cached_property
    def ops(self) -> tuple[tuple[int, ...], ...]:
        """Operator indices of each stage, in execution order (built on use: the search needs none)."""
        n = self.n_ops
        return tuple(tuple(range(a, b)) if b > a else tuple(range(a, n)) + tuple(range(b))
                     for a, b in zip(self.start, self.end, strict=True))


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
def _layout(seq: OperatorSequence, lsub: int) -> tuple[list[tuple[int, int]], np.ndarray, np.ndarray]:
    """What expanding a template of sub-block length `lsub` needs that no cut changes, per operator:
    its sub-block repetition, and which reference-sub-block keys (layer offset, slot) are <= its own
    (embed and lm_head take the operator whose stage they join)."""
    blocks = detect_blocks(seq)
    keys = subblock_keys(seq, blocks, lsub)
    first, n = blocks.prefix_layers, seq.n
    rep, le = np.zeros(n, np.int64), np.zeros((n, len(keys)), np.int64)
    src = np.arange(n)
    for i, op in enumerate(seq.ops):
        if op.kind == OpKind.EMBED:
            src[i] = -1
        elif op.kind == OpKind.LM_HEAD:
            src[i] = src[i - 1]
        else:
            rep[i], offset = divmod(op.layer - first, lsub)
            le[i] = [key <= (offset, op.slot) for key in keys]
    src[0] = src[1]  # embed runs with the first layer's stage
    if (src < 0).any():
        raise ValueError("an embed operator after the first position")
    return keys, rep[src], le[src]


@cache
def expand(seq: OperatorSequence, template: Template) -> StagePlan:
    """The template expanded over the model (the module docstring's rule)."""
    return expand_all(seq, (template,))[0]


# templates whose operators' stage numbers are summed at once by `expand_all` (bounds its [T, K, N]
# gather: 512 x 3 x 312 operators of gemma-3-27b is 3.8 MB)
EXPAND_CHUNK = 512


def expand_all(seq: OperatorSequence, templates) -> list[StagePlan]:
    """`[expand(seq, t) for t in templates]`, with the array work of the templates of one
    (sub-block length, owner count) done at once: the search reads every template's plan (5,240
    for gemma-3-27b: 0.3 s one by one, 0.06-0.1 s together)."""
    templates = list(templates)
    out: list[StagePlan | None] = [None] * len(templates)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, t in enumerate(templates):
        groups.setdefault((t.lsub, t.k), []).append(i)
    for (lsub, k), members in groups.items():
        keys, rep, le = _layout(seq, lsub)
        for lo in range(0, len(members), EXPAND_CHUNK):
            chunk = members[lo:lo + EXPAND_CHUNK]
            for i, plan in zip(chunk, _expand_chunk(seq.n, keys, rep, le, [templates[i] for i in chunk], k),
                               strict=True):
                out[i] = plan
    return out


def _expand_chunk(n: int, keys, rep: np.ndarray, le: np.ndarray, chunk: list[Template], k: int):
    """The plans of templates of one sub-block length with k cuts each (a row per template)."""
    cuts = np.array([t.cuts for t in chunk], np.int64).reshape(len(chunk), k)
    # stage number: the repetition's k stages, plus the cuts at or before the operator's key
    numbers = rep[None, :] * k + le.T[cuts].sum(axis=1)
    owners = (numbers - 1) % k
    # runs of one owner are one stage, cyclically (the last run joins the first when they share an owner)
    change = np.empty(owners.shape, bool)
    np.not_equal(owners[:, 0], owners[:, -1], out=change[:, 0])
    np.not_equal(owners[:, 1:], owners[:, :-1], out=change[:, 1:])
    rows, cols = np.nonzero(change)  # row-major: each template's starts, ascending
    bounds = np.searchsorted(rows, np.arange(len(chunk) + 1)).tolist()
    cols_l, owner_l = cols.tolist(), owners[rows, cols].tolist()
    for j, template in enumerate(chunk):
        cut_keys = tuple(keys[c] for c in template.cuts)
        a, b = bounds[j], bounds[j + 1]
        if a == b:
            yield StagePlan(template, (0,), (0,), (0,), cut_keys, n)
            continue
        starts, stage_owner = cols_l[a:b], owner_l[a:b]
        ends = starts[1:] + starts[:1]
        if starts[0] != 0:  # stage 0 is the one containing operator 0 (embed): the run that wraps
            starts, ends, stage_owner = starts[-1:] + starts[:-1], ends[-1:] + ends[:-1], stage_owner[-1:] + stage_owner[:-1]
        yield StagePlan(template, tuple(stage_owner), tuple(starts), tuple(ends), cut_keys, n)


def boundary_payload(seq: OperatorSequence, plan: StagePlan) -> list[float]:
    """Bytes per request crossing the boundary after each stage (cyclic)."""
    return [seq.payload[a] for a in plan.start[1:] + plan.start[:1]]
