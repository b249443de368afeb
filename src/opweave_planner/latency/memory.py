"""One memory-budget rule per GPU, and the fixed costs a plan pays per stage and per transfer.

Usable bytes per GPU for weights, KV/state and activation workspace::

    capacity x gpu_memory_utilization - runtime reserve - NCCL buffers(TP)

* capacity: the GPU description's memory (`GpuType.memory_bytes`), i.e. the
  profiles' measured capacity (L40S: 46,068 MiB) unless a --catalog overrides it;
* gpu_memory_utilization: the share of the card the serving runtime allows
  itself. vLLM's default is 0.9 (``EngineArgs.gpu_memory_utilization``, the same
  from v0.2 through the v0.24 the shipped tables were measured with); the
  remaining 10% is never used by the runtime;
* runtime reserve: what the runtime keeps *inside* that budget besides weights,
  KV cache and our activation workspace: CUDA context, CUDA-graph pools and
  allocator slack. vLLM profiles these as "non-torch" and peak memory and
  subtracts them from the budget before sizing the KV cache. We use the GPU's
  ``other_memory_bytes`` (aiconfigurator's ``other_mem``, 3.5 GiB) unless a
  reserve is given;
* NCCL buffers: ``nccl_memory_bytes`` by TP size, read from the shipped
  system.json (aiconfigurator's ``nccl_mem``: 0 / 342 / 392 / 392 MiB for TP
  1 / 2 / 4 / 8), never hard-coded.
"""

from __future__ import annotations

from dataclasses import dataclass

from opweave_planner.inputs.hardware import GIB, GpuType

__all__ = [
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "FixedCosts",
    "fixed_costs",
    "nccl_bytes",
    "reserve_bytes",
    "usable_bytes",
]

#: vLLM's default gpu_memory_utilization (EngineArgs, v0.2 .. v0.24)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9


def nccl_bytes(gpu: GpuType, tp: int) -> float:
    """NCCL buffer bytes per GPU of a TP group: the listed size, else the largest listed below it."""
    table = dict(gpu.nccl_memory_bytes)
    if tp in table:
        return float(table[tp])
    below = [t for t in table if t <= tp]
    return float(table[max(below)]) if below else 0.0


def reserve_bytes(gpu: GpuType, reserve_gb: float | None = None) -> float:
    """Runtime bytes per GPU inside the budget besides weights/KV/NCCL (`reserve_gb` GiB overrides)."""
    return float(gpu.other_memory_bytes) if reserve_gb is None else reserve_gb * GIB


def usable_bytes(gpu: GpuType, tp: int, *, utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                 reserve_gb: float | None = None) -> float:
    """Bytes per GPU left for weights, KV/state and workspace under the runtime's budget."""
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    return gpu.memory_bytes * utilization - reserve_bytes(gpu, reserve_gb) - nccl_bytes(gpu, tp)


@dataclass(frozen=True)
class FixedCosts:
    """Per-plan fixed costs in µs, with where each number comes from (docs/profiles.md)."""

    #: per stage per microbatch: one CUDA-graph replay starting after its input arrives
    stage_dispatch_us: float
    #: per stage-to-stage transfer: one NCCL send/recv call, on top of link latency and bytes
    transfer_fixed_us: float
    #: per small kernel (elementwise passes): the fastest measured kernel on the GPU
    kernel_floor_us: float


def fixed_costs(gpu: GpuType) -> FixedCosts:
    """The GPU's fixed costs: measured on its profiles (aiconfigurator data) or catalog defaults.

    stage dispatch = the fastest measured kernel call (a graph replay cannot start
    its first kernel faster than the GPU runs its smallest kernel); transfer = the
    fastest measured 2-GPU NCCL collective (one NCCL call's fixed cost).
    """
    return FixedCosts(stage_dispatch_us=gpu.kernel_floor_us, transfer_fixed_us=gpu.transfer_fixed_us,
                      kernel_floor_us=gpu.kernel_floor_us)
