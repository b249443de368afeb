"""The configured finite search grid and the per-request inputs of one search."""

from __future__ import annotations

from dataclasses import dataclass

# Global resident batch sizes: powers of two and three times powers of two.
DEFAULT_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
DEFAULT_TPS = (1, 2, 4, 8)


@dataclass(frozen=True)
class SearchSpace:
    """Limits of the searched plan family (defaults: the paper's evaluation limits)."""

    gpus: tuple[str, ...]
    tps: tuple[int, ...] = DEFAULT_TPS
    batches: tuple[int, ...] = DEFAULT_BATCHES
    max_owners: int = 3
    max_microbatches: int = 4
    max_replicas: int = 4
    max_gpus: int = 32
    moe_expert_parallel: bool = True
    policy: str = "opweave"

    def microbatch_grid(self) -> tuple[int, ...]:
        """Every per-replica microbatch b = B / (mu n) that the grid can produce."""
        values = {
            b // (mu * n)
            for b in self.batches
            for mu in range(1, self.max_microbatches + 1)
            for n in range(1, self.max_replicas + 1)
            if b % (mu * n) == 0
        }
        return tuple(sorted(values))


@dataclass(frozen=True)
class SearchRequest:
    model: str
    context: int
    slo_ms: float
    space: SearchSpace
    catalog: str | None = None
    prices: str | None = None
    profiles_dir: str | None = None
    backend: str = "vllm"
    network_gbps: float | None = None
    network_latency_us: float | None = None
    reserve_gb: float | None = None
    use_pareto: bool = True
    use_bnb: bool = True
