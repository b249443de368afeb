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
    writes_prefill: bool = False  # renders a disaggregated plan's prefill pool (Context.prefill)

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
    index: int  # counted over every copy of the plan: copy = index // the owner's replicas
    node: int  # node number, counted across all owners (see Context._placement)
    devices: tuple[int, ...]  # CUDA device indices on that node
    copy: int = 0  # which copy of the plan (the plan's deployment.copies; 0 when it records none)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(d) for d in self.devices)


@dataclass(frozen=True)
class ServerGroup:
    """The aggregated deployment's replicas (schema 1.11) as the one owner the exporters serve:
    (GPU, TP) groups of `batch` resident requests that prefill and decode together."""

    gpu: str
    tensor_parallel: int
    replicas: int
    resident_batch: int
    index: int = 0
    expert_parallel: int = 1  # the aggregated search skips expert-parallel shapes


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
    deployment: Any = None  # the plan's Deployment (sizing), or None: one copy
    release: str | None = None  # the release asked for (`version` is the flag table written for it)
    probing: bool = False  # checking whether an alternative fits: refusals name no other alternative
    deployment_mode: str | None = None  # the mode to export of a plan that searched both (None: the plan's)

    @property
    def mode(self) -> str | None:
        """The deployment mode the files run: the one asked for, else the plan's `deployment.mode`."""
        dep = self.deployment
        return None if dep is None else self.deployment_mode or getattr(dep, "mode", None)

    def gpu(self, gid: str):
        return self.hw.resolve(gid, f"{self.path}: owners[].gpu")

    @property
    def aggregated(self):
        """The aggregated deployment (schema 1.11) when it is the plan's mode: the export runs its
        replicas, not the decode plan's owners (those are the disaggregated alternative's)."""
        return self.deployment.aggregated if self.mode == "aggregated" else None

    @cached_property
    def owners(self) -> tuple:
        """The groups the export serves: the aggregated replicas as one owner, else the plan's owners."""
        agg = self.aggregated
        if agg is None:
            return tuple(self.plan.owners)
        return (ServerGroup(agg.gpu, agg.tensor_parallel, agg.replicas, agg.batch),)

    @property
    def copies(self) -> int:
        """Copies of the plan the export deploys: the plan's sizing, else one (an aggregated
        deployment is its replicas: one copy of them)."""
        return 1 if self.deployment is None or self.aggregated is not None else self.deployment.copies

    def groups(self, owner) -> int:
        """Device groups of `owner` over every copy (the deployment's replicas of that owner)."""
        return self.copies * owner.replicas

    def placement(self, owner) -> list[Replica]:
        return self._placement[owner.index]

    @cached_property
    def _placement(self) -> dict[int, list[Replica]]:
        """Every owner's groups, over every copy, on numbered nodes, TP groups never split.

        A multi-owner plan whose stages hand off inside one node (one GPU type, a copy in one
        node, as the planner's link model assumed) keeps each copy's owners on one node, whole
        copies per node, owners' devices in order; otherwise each owner's groups (every copy's)
        fill their own nodes first fit, nodes numbered across owners. The node counts are the
        ones `sizing` counts for the plan's deployment.
        """
        plan, owners = self.plan, self.owners
        gpn = {o.index: self.gpu(o.gpu).gpus_per_node for o in owners}
        shared = (len(owners) > 1 and len({o.gpu for o in owners}) == 1
                  and plan.gpus_total <= gpn[0])
        out: dict[int, list[Replica]] = {o.index: [] for o in owners}
        if shared:
            per_node = max(1, gpn[0] // plan.gpus_total)
            for c in range(self.copies):
                offset = (c % per_node) * plan.gpus_total
                for o in owners:
                    tp = o.tensor_parallel
                    for r in range(o.replicas):
                        out[o.index].append(Replica(o.index, c * o.replicas + r, c // per_node,
                                                    tuple(range(offset, offset + tp)), c))
                        offset += tp
            return out
        first_node = 0
        for o in owners:
            tp = o.tensor_parallel
            per_node = max(1, gpn[o.index] // tp)
            groups = self.groups(o)
            for g in range(groups):
                local = (g % per_node) * tp
                out[o.index].append(Replica(o.index, g, first_node + g // per_node,
                                            tuple(range(local, local + tp)), g // o.replicas))
            first_node += math.ceil(groups / per_node)
        return out

    @property
    def prefill(self):
        """The prefill pool a disaggregated plan records beside its decode copies (schema 1.10),
        which the export deploys too; None for a plan whose decode servers prefill themselves."""
        return self.deployment.prefill if self.mode == "disaggregated" else None

    @cached_property
    def prefill_placement(self) -> list[Replica]:
        """The prefill instances on their own nodes, numbered after the decode pool's (the plan
        hands the prompt's KV to the decode pool over the inter-node link), first fit, TP groups
        never split; owner -1 marks the pool."""
        pool = self.prefill
        if pool is None:
            return []
        tp = pool.tensor_parallel
        per_node = max(1, self.gpu(pool.gpu).gpus_per_node // tp)
        first = len({r.node for reps in self._placement.values() for r in reps})
        return [Replica(-1, i, first + i // per_node, tuple(range((i % per_node) * tp, (i % per_node + 1) * tp)))
                for i in range(pool.instances)]

    @property
    def nodes(self) -> int:
        """Nodes the export places groups on (the prefill pool's included)."""
        return len({r.node for reps in self._placement.values() for r in reps}
                   | {r.node for r in self.prefill_placement})

    def usable_bytes(self, owner) -> float:
        """Bytes per GPU the plan was searched with for weights, KV/state and workspace (its
        gpu_memory_utilization, reserve, NCCL buffers and headroom): the one budget exported."""
        from opweave_planner.latency.memory import usable_bytes

        space = self.plan.search.space
        gpu = self.gpu(owner.gpu)
        util = space.gpu_memory_utilization if space.gpu_memory_utilization is not None else 0.9
        usable = usable_bytes(gpu, owner.tensor_parallel, utilization=util, reserve_gb=space.reserve_gb(owner.gpu))
        return usable * (1.0 - (space.memory_headroom or 0.0))

    def memory_fraction(self, owner) -> float:
        """vLLM's --gpu-memory-utilization: the share of the card whose budget, less the reserve
        and NCCL buffers vLLM subtracts itself, leaves the usable bytes the plan was searched
        with (the plan's own gpu_memory_utilization when it kept no headroom), rounded down to 1e-4."""
        space = self.plan.search.space
        if not space.memory_headroom:
            return space.gpu_memory_utilization if space.gpu_memory_utilization is not None else 0.9
        from opweave_planner.latency.memory import nccl_bytes

        gpu = self.gpu(owner.gpu)
        budget = (self.usable_bytes(owner) + space.reserve_gb(owner.gpu) * 2**30
                  + nccl_bytes(gpu, owner.tensor_parallel))
        return math.floor(budget / gpu.memory_bytes * 1e4) / 1e4

    def static_fraction(self, owner) -> float:
        """SGLang's --mem-fraction-static: its static pool holds weights and KV, so it is the
        plan's usable bytes over capacity (activations, CUDA graphs, the reserve and NCCL come
        out of the rest), rounded down to 1e-4."""
        return math.floor(self.usable_bytes(owner) / self.gpu(owner.gpu).memory_bytes * 1e4) / 1e4

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


def share(x: float) -> str:
    """A memory share as a flag value: at most four decimals, no trailing zeros (0.9, 0.8512)."""
    return f"{x:.4f}".rstrip("0").rstrip(".")
