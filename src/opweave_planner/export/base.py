"""What an export target is (the declaration each runtime module makes, `registry` collects) and
what it is given (`Context`: the plan, the resolved options, where every replica runs).

A target is data, not a module convention, so the CLI's `--to` and `--runtime-version` help,
the refusal hint and the docs table are read from the declarations instead of being written
again by hand, and a module that leaves something out fails on import, not at run time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from opweave_planner.errors import InfeasibleError, UserError

_NAME = re.compile(r"[a-z][a-z0-9-]*")  # a --to value and a docs table key
_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)*")


class Refusal(InfeasibleError):
    """The target runtime cannot run this plan's shape (exit 3)."""


@dataclass(frozen=True)
class Target:
    """One runtime `export --to NAME` writes files for.

    `check(ctx)` raises `Refusal` (exit 3) when the runtime cannot run the plan's shape, or
    `UserError` (exit 2) for an option this target cannot use; `render(ctx)` then returns every
    file by name, built only from the plan and the pinned flag table of `ctx.version`.
    `fits(plan_dict, name)` says whether the plan file's alternative `name` (its plan document,
    or None for a summary without one) is a shape this target runs, so a refusal can name it.
    `search_limits` are the PlanRequest limits that confine a search to shapes `fits` accepts
    (empty when no limit expresses them), so `regen`'s `deployable` searches for the cheapest
    plan the runtime runs instead of filtering the optimum out afterwards.
    """

    name: str
    summary: str  # one line for --to's help and the docs' table of targets
    versions: tuple[str, ...]  # pinned releases, oldest first
    default_version: str
    fits: Callable[[Mapping[str, Any] | None, str], bool]
    check: Callable[[Context], None]
    render: Callable[[Context], dict[str, bytes]]
    hint: str = "re-plan with --policy colocated"  # what to do when no alternative fits
    needs_model: bool = False  # check reads the model's config: one that cannot be loaded is an error
    search_limits: Mapping[str, int] = field(default_factory=dict)  # e.g. max_stages=1 (see above)

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"export target name {self.name!r} is not a lower-case word")
        if not self.versions or not all(_VERSION.fullmatch(v) for v in self.versions):
            raise ValueError(f"export target {self.name}: versions {self.versions!r} are not release numbers")
        if self.default_version not in self.versions:
            raise ValueError(f"export target {self.name}: default {self.default_version} is not pinned")
        if not self.summary or any(c in text for text in (self.summary, self.hint) for c in "\n["):
            raise ValueError(f"export target {self.name}: summary and hint are one line each, without "
                             f"'[' (help text is rich markup)")


# ----------------------------------------------------------------------------- what a target is given

# Kubernetes node label set by NVIDIA GPU feature discovery, and its value per catalog GPU id.
GPU_LABEL_KEY = "nvidia.com/gpu.product"
GPU_PRODUCTS = {
    "h100": "NVIDIA-H100-80GB-HBM3",
    "a100": "NVIDIA-A100-SXM4-80GB",
    "l40s": "NVIDIA-L40S",
    "h200": "NVIDIA-H200",
    "h20": "NVIDIA-H20",
    "b200": "NVIDIA-B200",
}


@dataclass(frozen=True)
class Replica:
    """One device group of an owner, placed on a node of its GPU type."""

    owner: int
    index: int
    node: int  # node number, counted across all owners (see Context._placement)
    devices: tuple[int, ...]  # CUDA device indices on that node

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(d) for d in self.devices)


@dataclass
class Context:
    """Everything an exporter may read: the plan, its raw JSON and the resolved options."""

    plan: Any  # opweave_planner.plan.Plan
    raw: dict[str, Any]
    path: str
    target: Target  # the runtime being exported to
    version: str
    model_id: str
    spec: Any  # ModelSpec or None when the plan's model cannot be loaded
    hw: Any  # Hardware (the shipped catalog plus --catalog)
    labels: dict[str, str] = field(default_factory=dict)  # GPU id -> node label value
    image: str | None = None
    alternative: str | None = None  # the alternative being exported, if any
    base_cost: float | None = None  # cost of the file's main plan (for deltas)

    def gpu(self, gid: str):
        return self.hw.resolve(gid, f"{self.path}: owners[].gpu")

    def placement(self, owner) -> list[Replica]:
        return self._placement[owner.index]

    @cached_property
    def _placement(self) -> dict[int, list[Replica]]:
        """Every owner's groups on numbered nodes, TP groups never split across nodes.

        When the plan's stages hand off inside one node (one GPU type, every GPU in one node, as
        the planner's link model assumed) all owners share node 0, owners' devices in order;
        otherwise each owner's groups fill their own nodes first fit, nodes numbered across owners.
        """
        plan = self.plan
        gpn = {o.index: self.gpu(o.gpu).gpus_per_node for o in plan.owners}
        shared = (len({o.gpu for o in plan.owners}) == 1 and plan.gpus_total <= gpn[0])
        out: dict[int, list[Replica]] = {}
        first_node = offset = 0
        for o in plan.owners:
            tp = o.tensor_parallel
            per_node = max(1, gpn[o.index] // tp)
            reps = []
            for r in range(o.replicas):
                if shared:
                    reps.append(Replica(o.index, r, 0, tuple(range(offset, offset + tp))))
                    offset += tp
                else:
                    local = (r % per_node) * tp
                    reps.append(Replica(o.index, r, first_node + r // per_node, tuple(range(local, local + tp))))
            out[o.index] = reps
            if not shared:
                first_node += math.ceil(o.replicas / per_node)
        return out

    def memory_fraction(self, owner) -> float:
        """Share of GPU memory the runtime may take: what the planner treated as usable.

        The planner keeps `memory_reserve_gb` GiB per GPU for the framework (per GPU type when the
        plan records `memory_reserve_gb_by_gpu`, schema 1.5); the runtime's own
        budget (weights + KV + activations) is the rest, rounded down to 0.01 and capped at 0.95.
        """
        cap = self.gpu(owner.gpu).memory_bytes
        reserve = self.plan.search.space.reserve_gb(owner.gpu) * 2**30  # what the search held back there
        return min(0.95, math.floor((cap - reserve) / cap * 100) / 100)

    def node_label(self, gid: str) -> str:
        if gid in self.labels:
            return self.labels[gid]
        if gid in GPU_PRODUCTS:
            return GPU_PRODUCTS[gid]
        raise UserError(f"--node-label: no {GPU_LABEL_KEY} value known for GPU type '{gid}'; "
                        f"pass --node-label {gid}=VALUE")

    @property
    def slug(self) -> str:
        """A DNS-1035 label for the deployment (model and GPU count): Services are named after it."""
        name = re.sub(r"[^a-z0-9-]+", "-", f"{self.plan.model}-{self.plan.gpus_total}gpu".lower()).strip("-")
        if not name[:1].isalpha():
            name = f"m-{name}"
        return name[:52].rstrip("-")
