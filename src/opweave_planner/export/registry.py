"""Every export target, in the order help, errors and docs list them.

Adding a target is its module (declaring `TARGET = Target(...)`) and its entry here; `--to`,
`--runtime-version`, the unknown-target error and the docs' table of targets are read from this
list. Light to import (the runtime modules load their heavy inputs inside functions), so the
CLI builds its help from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from opweave_planner.export import dynamo, llmd, sglang, vllm, vllm_afd
from opweave_planner.export.base import Target

TARGETS: Mapping[str, Target] = MappingProxyType({t.name: t for t in (
    vllm.TARGET, sglang.TARGET, dynamo.TARGET, llmd.TARGET, vllm_afd.TARGET,
)})


def _pins(t: Target) -> str:
    """'0.10.2 to 0.33.x (tables 0.10.2, 0.26.0, 0.33.0; default 0.33.0)'."""
    newest = ".".join(t.versions[-1].split(".")[:2])
    return (f"{t.versions[0]} to {newest}.x (tables {', '.join(t.versions)}; default "
            f"{t.default_version})")


def to_help() -> str:
    """`--to`'s help: each target with what it writes."""
    return "; ".join(f"{t.name}: {t.summary}" for t in TARGETS.values())


def version_help() -> str:
    """`--runtime-version`'s help: the pinned releases of each target."""
    return "Runtime release the files are for: " + "; ".join(
        f"{t.name} {_pins(t)}" for t in TARGETS.values())


def docs_table() -> str:
    """The table of targets docs/export.md carries (a test keeps the two equal)."""
    rows = [f"| `{t.name}` | {t.summary} | {_pins(t)} |" for t in TARGETS.values()]
    return "\n".join(["| `--to` | writes | `--runtime-version` |", "|---|---|---|", *rows])


def target(name: object, field: str = "--to") -> Target:
    """The target named `name`, or the one-line error listing the names."""
    from opweave_planner.errors import UserError, printable

    if isinstance(name, str) and name in TARGETS:
        return TARGETS[name]
    raise UserError(f"{field}: unknown runtime '{printable(name)}'; expected one of {', '.join(TARGETS)}")


def runs(name: str, plan_dict: Mapping[str, Any] | None) -> bool:
    """Can runtime `name` run this plan document? Its exporter's own rule (`Target.fits`), so
    regen's `deployable` and `export`'s refusal never disagree."""
    return plan_dict is not None and plan_dict.get("feasible", True) is not False \
        and TARGETS[name].fits(plan_dict, "optimum")
