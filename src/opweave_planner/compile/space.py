"""The search space a request spans, beyond its own fields: microbatch sizes and node sizes."""

from __future__ import annotations

from opweave_planner.inputs.hardware import GpuType
from opweave_planner.inputs.request import PlanRequest


def microbatch_grid(req: PlanRequest) -> tuple[int, ...]:
    """Every per-replica microbatch b = B / (mu n) that the request's grid can produce."""
    values = {
        b // (mu * n)
        for b in req.batches
        for mu in range(1, req.max_microbatches + 1)
        for n in range(1, req.max_replicas + 1)
        if b % (mu * n) == 0
    }
    return tuple(sorted(values))


def node_size(gpu: GpuType, req: PlanRequest) -> int:
    """GPUs per node: the catalog's, or the deployment's --gpus-per-node when smaller."""
    return gpu.gpus_per_node if req.gpus_per_node is None else min(gpu.gpus_per_node, req.gpus_per_node)
