"""What a search ends with, as data (scipy's OptimizeResult habit): a status, the binding
constraint when nothing is feasible, and the plan or the infeasibility record to write.

Callers branch on `status` and `binding`, never on the words of `Infeasible.reason`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from opweave_planner.plan.schema import Infeasible, Plan

__all__ = ["Binding", "Outcome", "Status"]


class Status(StrEnum):
    """How the search ended. It is exact over its grid either way: OPTIMAL is the cheapest
    plan there (or the simplest within --prefer-simpler of it), INFEASIBLE means none meets
    the request."""

    OPTIMAL = "optimal"
    INFEASIBLE = "infeasible"


class Binding(StrEnum):
    """What binds: why no plan meets the request (the infeasibility record's `binding`: slo or
    memory; none where --max-stages is below every template, which its `reason` names), or why
    a plan stops at its batch (the plan's `binding.constraint`, schema 1.9)."""

    SLO = "slo"  # memory-feasible plans exist, but the fastest misses the TPOT SLO / the next batch would
    MEMORY = "memory"  # no placement holds the weights and KV within the GPU budget / the next batch's KV
    GPUS = "gpus"  # the next batch fits only with more GPUs than --max-gpus
    NODES = "nodes"  # ... only on more nodes than --max-nodes
    BATCHES = "batches"  # the plan runs the largest batch of the request's set that its shape can split
    COST = "cost"  # the next batch fits and meets the SLO, but costs more per token


@dataclass(frozen=True)
class Outcome:
    status: Status
    plan: Plan | None = None
    infeasible: Infeasible | None = None

    def __post_init__(self) -> None:
        if (self.plan is None) == (self.infeasible is None) or \
                (self.status == Status.OPTIMAL) != (self.plan is not None):
            raise ValueError("an Outcome holds exactly one of a plan (OPTIMAL) or an infeasibility record")

    @property
    def document(self) -> Plan | Infeasible:
        """What the plan file holds."""
        return self.plan if self.plan is not None else self.infeasible  # type: ignore[return-value]

    @property
    def binding(self) -> Binding | None:
        """The infeasibility record's binding constraint, or what binds the plan's batch."""
        if self.plan is not None:
            return None if self.plan.binding is None else Binding(self.plan.binding.constraint)
        return None if self.infeasible.binding is None else Binding(self.infeasible.binding)

    @property
    def lowest_tpot_ms(self) -> float | None:
        """The fastest memory-feasible plan's TPOT when the SLO binds."""
        return None if self.infeasible is None else self.infeasible.lowest_tpot_ms
