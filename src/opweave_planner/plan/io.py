"""A plan's bytes: canonical JSON, fixed rounding, the version stamp, atomic writing.

Equal inputs give equal files (tests/test_golden_replan.py compares bytes), and a file is
stamped with the lowest 1.x whose keys it carries, so a reader of an older 1.x keeps reading it.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel

from opweave_planner.atomic import write_atomic
from opweave_planner.plan.request import SPACE, SPACE_ROWS
from opweave_planner.plan.schema import SCHEMA_MAJOR, Distribution, SpaceOut, Workload

__all__ = ["dumps", "rounded", "plan_bytes", "write_atomic", "schema_version_for", "distribution_minor",
           "infeasible_version", "plan_version"]

EVENTS_MINOR = 8  # workload.distribution.preemptions_per_request and owners[].kv_events

# search.space keys added after 1.0, with the MINOR that introduced them (from the table)
_MINOR_KEYS = tuple((r.at.removeprefix(SPACE), r.since) for r in SPACE_ROWS if r.since)


def dumps(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, 2-space indent, trailing newline (byte-stable)."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def rounded(x: float, digits: int = 9) -> float:
    """Stable decimal rounding so identical inputs always print identical bytes."""
    return float(f"{x:.{digits}g}")


def plan_bytes(plan: BaseModel) -> bytes:
    """Canonical bytes of a plan (sorted keys, fixed rounding): equal inputs give equal files.

    Optional keys added by a later MINOR version are omitted when absent, so a file written by
    an older 1.x reads back to the same bytes.
    """
    return dumps(plan.model_dump(mode="json", exclude_none=True))


def distribution_minor(distribution: Distribution) -> int:
    """The lowest 1.x that can carry this workload record (1.4: the value "truncate"; 1.8: a
    preemptions_per_request target, with the owners' kv_events)."""
    if distribution.preemptions_per_request is not None:
        return EVENTS_MINOR
    return 4 if distribution.overflow == "truncate" else 3


WINDOW_MINOR = 7  # workload.prompt_tokens / output_tokens / max_model_len


def schema_version_for(space: SpaceOut, alternatives: bool = False,
                       distribution: Distribution | None = None, workload: Workload | None = None) -> str:
    """The lowest 1.x whose keys cover this plan (1.1: per-stage measured_fraction; 1.2:
    alternatives, model_source and the deployment constraints; 1.3: a workload distribution;
    1.4: its ``overflow`` "truncate"; 1.5: per-GPU memory reserves; 1.7: a fixed context's prompt,
    output and window; 1.12: `batch_caps` false; `alternatives` says a 1.2 key outside the searched
    space is present;
    `distribution` is the plan's workload distribution record, or None; `workload` the plan's
    workload, whose distribution it implies)."""
    minor = 2 if alternatives else 1
    if workload is not None:
        distribution = workload.distribution
        if workload.max_model_len is not None:
            minor = WINDOW_MINOR
    if distribution is not None:
        minor = max(minor, distribution_minor(distribution))
    for key, since in _MINOR_KEYS:
        if getattr(space, key) is not None:
            minor = max(minor, since)
    return f"{SCHEMA_MAJOR}.{minor}"


INFEASIBLE_MINOR = 6  # an infeasibility record's binding and lowest_tpot_ms keys


def infeasible_version(space: SpaceOut, distribution: Distribution | None = None,
                       workload: Workload | None = None) -> str:
    """The version an infeasibility record is stamped with: it carries the 1.6 keys."""
    minor = int(schema_version_for(space, distribution=distribution, workload=workload).split(".")[1])
    return f"{SCHEMA_MAJOR}.{max(minor, INFEASIBLE_MINOR)}"


BINDING_MINOR = 9  # a plan's `binding` record
DISAGGREGATED_MINOR = 10  # deployment.mode / arrivals / prefill and the all-in costs
AGGREGATED_MINOR = 11  # deployment.deployment_mode / aggregated, mode "aggregated"
LOAD_MINOR = 13  # deployment.tpot_p95_at_load_ms and its occupancy
POOL_LESS_MINOR = 14  # mode aggregated without a prefill pool: disaggregated_infeasible, aggregated.ttft_*


def plan_version(plan) -> str:
    """The lowest 1.x covering every key a Plan carries (the searched space, its workload record,
    the 1.2 keys model_source / deployment / alternatives, the 1.9 binding, the 1.10
    disaggregated deployment, the 1.11 aggregated one, the 1.13 TPOT at load, the 1.14 aggregated one
    without a prefill pool)."""
    extra = any(getattr(plan, k) is not None for k in ("model_source", "deployment", "alternatives"))
    minor = int(schema_version_for(plan.search.space, alternatives=extra, workload=plan.workload).split(".")[1])
    if plan.binding is not None:
        minor = max(minor, BINDING_MINOR)
    if plan.deployment is not None and plan.deployment.mode is not None:
        minor = max(minor, DISAGGREGATED_MINOR)
        if plan.deployment.deployment_mode is not None:
            minor = max(minor, AGGREGATED_MINOR)
        if plan.deployment.prefill is None:
            minor = max(minor, POOL_LESS_MINOR)
    if plan.deployment is not None and plan.deployment.tpot_p95_at_load_ms is not None:
        minor = max(minor, LOAD_MINOR)
    return f"{SCHEMA_MAJOR}.{minor}"
