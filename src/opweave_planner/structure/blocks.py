"""Partition blocks: the smallest layer-aligned period of a model's operator pattern.

One rule covers real models that do not divide evenly: an irregular prefix
(e.g. DeepSeek-V3's dense layers) is allowed before the periodic part, and the
last block may be truncated (Gemma-3-27B: 62 = 10 x 6 + 2). The prefix and the
truncated tail are costed from their real layers; only the template is shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from opweave_planner.structure.operators import OperatorSequence


@dataclass(frozen=True)
class BlockStructure:
    prefix_layers: int  # irregular leading layers before the period starts
    block_layers: int  # L_block
    full_blocks: int  # complete blocks after the prefix
    tail_layers: int  # layers of the truncated last block
    subblocks: tuple[int, ...]  # legal L_sub values (divide L_block, same slot structure)
    ops_per_subblock: dict[int, int]  # L_sub -> N operators in one sub-block

    @property
    def n_blocks(self) -> int:
        return self.full_blocks + (1 if self.tail_layers else 0)


def _layer_signatures(seq: OperatorSequence) -> tuple[list[tuple], list[tuple]]:
    """Exact per-layer operator pattern, and the coarser slot structure."""
    exact: dict[int, list] = {}
    slots: dict[int, list] = {}
    for op in seq.ops:
        if 0 <= op.layer < seq.model.n_layers:
            exact.setdefault(op.layer, []).append((op.kind, op.gemm, op.kv_window, op.params))
            slots.setdefault(op.layer, []).append(op.slot)
    n = seq.model.n_layers
    return [tuple(exact[i]) for i in range(n)], [tuple(slots[i]) for i in range(n)]


@cache
def detect_blocks(seq: OperatorSequence) -> BlockStructure:
    """Choose (prefix q, period p) minimising q + p, ties to the smaller prefix."""
    exact, slots = _layer_signatures(seq)
    n = len(exact)
    best: tuple[int, int] | None = None
    for total in range(1, n + 1):
        for q in range(total):
            p = total - q
            if q + p > n:
                continue
            if all(exact[i] == exact[q + (i - q) % p] for i in range(q, n)):
                best = (q, p)
                break
        if best:
            break
    assert best is not None  # p = n always matches
    q, p = best
    subs = []
    ops_per_sub = {}
    for lsub in range(1, p + 1):
        if p % lsub:
            continue
        reps = [slots[q + r * lsub: q + (r + 1) * lsub] for r in range(p // lsub)]
        if all(rep == reps[0] for rep in reps):
            subs.append(lsub)
            ops_per_sub[lsub] = sum(len(s) for s in reps[0])
    return BlockStructure(
        prefix_layers=q, block_layers=p, full_blocks=(n - q) // p, tail_layers=(n - q) % p,
        subblocks=tuple(subs), ops_per_subblock=ops_per_sub,
    )
