"""Serving policies as restrictions of one template space.

opweave: every legal sub-block and every cyclic template with 1..K owners.
colocated: the one-stage template. afd: one-layer sub-block cut before the
attention module and before the FFN/MoE. cad: one-layer sub-block cut around
the core attention kernel. All run through the same search and simulator.
"""

from __future__ import annotations

from opweave_planner.inputs.request import Policy
from opweave_planner.structure.blocks import detect_blocks
from opweave_planner.structure.operators import OperatorSequence, Slot
from opweave_planner.structure.templates import Template, enumerate_templates, subblock_keys

POLICIES = tuple(p.value for p in Policy)
COLOCATED = Template(lsub=1, cuts=(0,))


def _cut(seq: OperatorSequence, *slots: Slot) -> Template:
    keys = subblock_keys(seq, detect_blocks(seq), 1)
    cuts = []
    for s in slots:
        # the first operator of the layer at or after this slot
        pos = next(i for i, key in enumerate(keys) if key[0] == 0 and key[1] >= s)
        cuts.append(pos)
    return Template(lsub=1, cuts=tuple(sorted(set(cuts))))


def templates_for(seq: OperatorSequence, policy: Policy, max_owners: int = 3) -> list[Template]:
    """Templates of a policy, in the fixed order that breaks ties."""
    policy = Policy(policy)
    if policy == Policy.COLOCATED:
        return [COLOCATED]
    if policy == Policy.AFD:
        return [_cut(seq, Slot.ATTN_IN, Slot.ROUTER)]
    if policy == Policy.CAD:
        return [_cut(seq, Slot.ATTN_CORE, Slot.ATTN_OUT)]
    blocks = detect_blocks(seq)
    out = [COLOCATED]
    for lsub in blocks.subblocks:
        n_ops = blocks.ops_per_subblock[lsub]
        for k in range(2, min(max_owners, n_ops) + 1):
            out.extend(enumerate_templates(lsub, n_ops, k))
    return out
