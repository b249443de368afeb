"""Library entry points: what the CLI and the tests call.

Each function takes plain values (names, paths, numbers), validates them at
the edge and returns plain data (dicts/dataclasses) that the CLI renders.
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

from opweave_planner.spec.hardware import Hardware, load_hardware
from opweave_planner.spec.model import ModelSpec, load_model
from opweave_planner.structure.blocks import detect_blocks
from opweave_planner.structure.operators import OperatorSequence, build_sequence
from opweave_planner.structure.templates import count_templates

INSPECT_CONTEXTS = (1024, 8192, 32768, 131072)


def _layer_label(seq: OperatorSequence, layer: int) -> str:
    lay = seq.model.layers[layer]
    a = lay.attention
    att = f"sliding({a.window})" if a.kind == "sliding" else a.kind
    return f"{att}+{lay.mlp.kind}"


def _pattern(seq: OperatorSequence, layers: range) -> str:
    labels = [_layer_label(seq, i) for i in layers]
    return ", ".join(f"{k} x{len(list(g))}" for k, g in groupby(labels))


def inspect_model(model: str, blocks: bool = False, max_owners: int = 3) -> dict[str, Any]:
    """Sizes, KV/state per request and layer pattern of a model (and its blocks)."""
    spec: ModelSpec = load_model(model)
    seq = build_sequence(spec)
    bs = detect_blocks(seq)
    q, p = bs.prefix_layers, bs.block_layers
    per_token = sum(op.kv_bytes_per_token for op in seq.ops if not op.kv_window)
    windowed = sorted({op.kv_window for op in seq.ops if op.kv_window})
    fixed = sum(op.state_bytes for op in seq.ops)
    info: dict[str, Any] = {
        "model": spec.name,
        "model_type": spec.model_type,
        "layers": spec.n_layers,
        "hidden_size": spec.hidden_size,
        "total_params": seq.total_params(),
        "active_params": round(seq.active_params()),
        "weight_bytes": round(seq.weight_bytes()),
        "kv_bytes_per_request": {str(c): round(seq.kv_bytes(c)) for c in INSPECT_CONTEXTS},
        "kv_formula": {
            "bytes_per_context_token_unbounded": per_token,
            "windowed_layers": {
                str(w): sum(op.kv_bytes_per_token for op in seq.ops if op.kv_window == w) for w in windowed
            },
            "fixed_state_bytes": fixed,
        },
        "layer_pattern": {
            "prefix": _pattern(seq, range(0, q)) if q else "",
            "block": _pattern(seq, range(q, q + p)),
            "blocks": bs.full_blocks,
            "tail": _pattern(seq, range(q + bs.full_blocks * p, spec.n_layers)) if bs.tail_layers else "",
        },
        "operators": seq.n,
    }
    if blocks:
        info["partition"] = {
            "prefix_layers": q,
            "block_layers": p,
            "full_blocks": bs.full_blocks,
            "tail_layers": bs.tail_layers,
            "subblocks": [
                {
                    "layers": lsub,
                    "operators": bs.ops_per_subblock[lsub],
                    "templates": {str(k): count_templates(bs.ops_per_subblock[lsub], k)
                                  for k in range(1, max_owners + 1)},
                }
                for lsub in bs.subblocks
            ],
            "block_operators": [
                op.name for op in seq.ops if q <= op.layer < q + p
            ],
        }
    return info


def gpu_catalog(catalog: str | None = None, prices: str | None = None) -> Hardware:
    return load_hardware(catalog, prices)
