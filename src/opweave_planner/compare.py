"""Policy comparison: every policy for every (context, SLO[, network]) cell.

This is the library side of `opweave-plan compare` and of the evaluation
script in `benchmarks/`. It runs the same search (`api.plan`) once per policy
and cell and returns plain data (dicts, lists, floats, strings, None) so the
result round-trips through JSON unchanged:

- per cell and policy: USD per million output tokens (None with the
  infeasibility reason when no plan meets the SLO) and the Figure 10-11
  metrics (pipeline stages, inter-node MiB per output token, price-weighted
  compute occupancy, per-GPU batch);
- per cell: the "g x cheaper" ratio = best feasible baseline cost / opweave
  cost (None when opweave or every baseline is infeasible);
- with several GPU types: homogeneous opweave per type and the ratio best
  homogeneous cost / heterogeneous cost (Section 7.4).

Every baseline policy is a restriction of the opweave template space searched
with the same grid, simulator and limits, so wherever a baseline is feasible
opweave's cost is at most the baseline's (ratio >= 1); likewise heterogeneous
opweave can use any single type, so its ratio to the best homogeneous plan is
>= 1.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from opweave_planner.errors import UserError
from opweave_planner.executor import make_executor
from opweave_planner.inputs import units

POLICY_ORDER = ("opweave", "colocated", "afd", "cad")
BASELINES = ("colocated", "afd", "cad")
MIB = 2**20


parse_bandwidth_gbps = units.parse_bandwidth_gbps
parse_latency_us = units.parse_latency_us


def split_list(text: str | Sequence[Any] | None) -> list[Any]:
    """'a,b' or ['a', 'b'] -> ['a', 'b'] (blanks dropped; non-strings kept as they are)."""
    if text is None:
        return []
    items = text.split(",") if isinstance(text, str) else list(text)
    return [s.strip() if isinstance(s, str) else s for s in items if str(s).strip()]


def network_grid(latencies_us: Sequence[float], bandwidths_gbps: Sequence[float],
                 cross: bool = False) -> list[tuple[float | None, float | None]] | None:
    """Network settings as (GB/s, us) pairs; None in a pair means the planner default.

    One-at-a-time (the paper's Figure 14): every latency at the default
    bandwidth, then every bandwidth at the default latency. `cross=True` gives
    the full cross product instead. No sweep at all returns None (defaults).
    """
    lat, bw = list(latencies_us), list(bandwidths_gbps)
    if not lat and not bw:
        return None
    if cross and lat and bw:
        return [(b, la) for b in bw for la in lat]
    return [(None, la) for la in lat] + [(b, None) for b in bw]


_label_tokens = units.label_tokens


def _with_trailing_unit(items: list[Any], letters: str) -> list[Any]:
    """A unit written once at the end ("1,2,4GBps") applies to every bare item."""
    unit = re.search(rf"[{letters}]+\s*$", str(items[-1])) if items else None
    if unit is None:
        return items
    has_unit = letters.replace("/", "")  # "GB/s" ends in a unit; a lone "/" is not one
    return [x if re.search(rf"[{has_unit}]", str(x)) else f"{x}{unit.group(0)}" for x in items]


_AXES = {  # a grid axis: how an item parses, and what an empty list is told
    "ctx": (lambda c: units.parse_tokens(c, "--ctx"), "--ctx: expected at least one context length, e.g. 8k,32k"),
    "slo": (lambda s: float(s) if isinstance(s, (int, float)) else units.parse_duration_ms(s, "--slo"),
            "--slo: expected at least one SLO, e.g. 25ms,60ms"),
}
_NETWORK_UNITS = {"network_latency": (parse_latency_us, "A-Za-zµ"),
                  "network_bandwidth": (parse_bandwidth_gbps, "A-Za-z/")}


class CompareRequest(BaseModel):
    """The grid `compare` sweeps, each setting once (the CLI's options are generated from it).

    The names are PlanRequest's (model, ctx, slo, gpus) where compare takes a list of that
    setting; every other setting is a PlanRequest field shared by all cells.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(description="Bundled model name or a Hugging Face config.json",
                       json_schema_extra={"flags": ["--model", "-m"]})
    ctx: tuple[int, ...] = Field(("8k", "32k", "128k"), validate_default=True, description=(
        "Context lengths, comma-separated; with --workload, the --scale-ctx targets"))
    slo: tuple[float, ...] = Field(("25ms", "60ms"), validate_default=True,
                                   description="TPOT SLOs with units, comma-separated: 25ms,60ms")
    gpus: str | None = Field(None, description=(
        "GPU types: h100, h100,l40s or h100,a100 (several types also compares against homogeneous "
        "opweave); default: every profiled type"))
    policies: tuple[str, ...] = Field(POLICY_ORDER, validate_default=True, description="Policies to run")
    network_latency: tuple[float, ...] = Field((), description=(
        "Sweep inter-node latency: 5us,20us,50us,200us,500us"))
    network_bandwidth: tuple[float, ...] = Field((), description="Sweep inter-node bandwidth: 1,2,4,8,16,32GBps")
    network_cross: bool = Field(False, description=(
        "Sweep the latency x bandwidth cross product instead of one at a time"))

    @field_validator("ctx", "slo", mode="before")
    @classmethod
    def _axis(cls, v: Any, info) -> tuple:
        parse, missing = _AXES[info.field_name]
        out = tuple(parse(x) for x in split_list(v))
        if not out:
            raise UserError(missing)
        return out

    @field_validator("policies", mode="before")
    @classmethod
    def _policies(cls, v: Any) -> tuple[str, ...]:
        pols = tuple(dict.fromkeys(split_list(v)))
        if not pols:
            raise UserError("--policies: expected at least one of " + ", ".join(POLICY_ORDER))
        for p in pols:
            if p not in POLICY_ORDER:
                raise UserError(f"--policies: unknown policy '{p}'; expected one of {', '.join(POLICY_ORDER)}")
        return pols

    @field_validator("network_latency", "network_bandwidth", mode="before")
    @classmethod
    def _network(cls, v: Any, info) -> tuple[float, ...]:
        parse, letters = _NETWORK_UNITS[info.field_name]
        return tuple(parse(x) for x in _with_trailing_unit(split_list(v), letters))

    def networks(self) -> list[tuple[float | None, float | None]] | None:
        return network_grid(self.network_latency, self.network_bandwidth, cross=self.network_cross)


def _f(x: Any) -> float | None:
    if x is None:
        return None
    v = float(x)
    if v != v or v in (float("inf"), float("-inf")):
        return None
    return float(f"{v:.9g}")


def plan_entry(plan, infeasible) -> dict[str, Any]:
    """One policy's outcome in a cell, as plain data."""
    from opweave_planner.report import measured_share

    if plan is None:
        return {"feasible": False, "usd_per_million_tokens": None, "reason": infeasible.reason,
                "binding": infeasible.binding, "lowest_tpot_ms": infeasible.lowest_tpot_ms}
    mix: dict[str, int] = {}
    for o in plan.owners:
        mix[o.gpu] = mix.get(o.gpu, 0) + o.tensor_parallel * o.replicas
    return {
        "feasible": True,
        "usd_per_million_tokens": _f(plan.usd_per_million_tokens),
        "reason": None,
        "tpot_ms": _f(plan.tpot_ms),
        "num_stages": int(plan.num_stages),
        "gpus_total": int(plan.gpus_total),
        "gpu_mix": dict(sorted(mix.items())),
        "global_batch": int(plan.global_batch),
        "owners": len(plan.owners),
        "inter_node_mib_per_token": _f(plan.metrics.inter_node_mib_per_token),
        "price_weighted_occupancy": _f(plan.metrics.price_weighted_occupancy),
        "per_gpu_batch": _f(plan.metrics.per_gpu_batch),
        "critical_resource": plan.metrics.critical_resource,
        "measured_share": _f(measured_share(plan.stages)),
    }


def _cost(entry: dict[str, Any] | None) -> float | None:
    return entry.get("usd_per_million_tokens") if entry and entry.get("feasible") else None


def cell_summary(policies: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Best feasible baseline and the "g x cheaper" ratio of one cell."""
    best_pol, best = None, None
    for pol in BASELINES:
        c = _cost(policies.get(pol))
        if c is not None and (best is None or c < best):
            best_pol, best = pol, c
    ours = _cost(policies.get("opweave"))
    ratio = _f(best / ours) if best is not None and ours else None
    return {"best_baseline": best_pol, "best_baseline_usd": best, "ratio": ratio}


def search_entry(req) -> dict[str, Any]:
    """One independent search (module level so worker processes and Ray can run it)."""
    from opweave_planner import api

    out = api.plan(req)
    return plan_entry(out.plan, out.infeasible)


def executor_label(jobs: int, ray_address: str | None) -> str:
    return f"Ray at {ray_address}" if ray_address else (f"{jobs} processes" if jobs > 1 else "this process")


def compare(model: str, contexts: Sequence[str | int], slos: Sequence[str | float], gpus: str | None = None,
            policies: Sequence[str] = POLICY_ORDER,
            networks: Sequence[tuple[float | None, float | None]] | None = None, **kw) -> dict[str, Any]:
    """`compare_grid` of the request these lists make (`networks`: (GB/s, latency us) pairs)."""
    req = CompareRequest(model=model, ctx=contexts, slo=slos, gpus=gpus, policies=policies)
    return compare_grid(req, networks, **kw)


def compare_grid(req: CompareRequest, networks: Sequence[tuple[float | None, float | None]] | None = None,
                 jobs: int = 1, homogeneous: bool = True, ray_address: str | None = None, retries: int = 1,
                 progress: Callable[[str], None] | None = None, cache: dict | None = None,
                 **settings) -> dict[str, Any]:
    """Run every policy for every (context, SLO[, network]) cell; return plain data.

    `networks` is a list of (GB/s, latency us) pairs (None = planner default; by default the
    request's own sweep); every policy is re-optimized for each. With several GPU types in
    `gpus` and opweave among the policies, homogeneous opweave is also run per type
    (`homogeneous=False` skips it). Extra keyword arguments are PlanRequest
    settings (max_owners, batches, max_gpus, catalog, prices, profiles, ...).
    `cache` (a dict the caller keeps) memoizes outcomes by PlanRequest across calls, e.g. to reuse the
    homogeneous H100 searches of one grid in the heterogeneous ones.
    """
    from opweave_planner import api

    model, gpus, pols = req.model, req.gpus, list(req.policies)
    ctx_list, slo_list = list(req.ctx), list(req.slo)
    networks = req.networks() if networks is None else networks
    nets = list(networks) if networks else [(None, None)]
    # with a workload, each context is the stationary mean the trace is rescaled to (--scale-ctx)
    traffic = settings.get("workload") is not None
    if traffic and settings.get("scale_ctx") is not None:
        raise UserError("--scale-ctx: with --workload, compare rescales the trace to each context of --ctx; "
                        "give the targets there")

    def at(ctx) -> dict[str, Any]:
        return {"ctx": None, "scale_ctx": int(ctx)} if traffic else {"ctx": int(ctx)}

    # resolve GPU ids once (validates names; default = every profiled type)
    probe = api.make_request(model=model, slo=float(slo_list[0]), gpus=gpus, policy=pols[0],
                             **{**settings, **at(ctx_list[0])})
    gpu_ids = list(probe.gpus)
    hetero = len(gpu_ids) > 1 and homogeneous and "opweave" in pols

    def request(slo, ctx, gbps, lat, gpus, policy):
        # validated like any request (a cad cell under --max-gpus 1 names the GPU budget)
        from opweave_planner.inputs.request import make_request

        return make_request(**{**probe.model_dump(), "slo": float(slo), **at(ctx), "gpus": tuple(gpus),
                               "policy": policy, "network_bandwidth": gbps, "network_latency": lat})

    # every independent search of the grid, in a fixed order; run them through one executor
    layout = []  # (network, ctx, slo, {policy: request}, {gpu: request} | None)
    for gbps, lat in nets:
        for ctx in ctx_list:
            for slo in slo_list:
                reqs = {pol: request(slo, ctx, gbps, lat, gpu_ids, pol) for pol in pols}
                homo = None
                if hetero:
                    homo = {g: request(slo, ctx, gbps, lat, [g], "opweave") for g in gpu_ids}
                layout.append(((gbps, lat), ctx, slo, reqs, homo))
    todo = []
    for _net, _ctx, _slo, reqs, homo in layout:
        for req in [*reqs.values(), *(homo or {}).values()]:
            if (cache is None or req not in cache) and req not in todo:
                todo.append(req)
    if progress:
        progress(f"{len(todo)} searches on {executor_label(jobs, ray_address)}")
    keys = [f"{r.model} {units.label_tokens(r.ctx or r.scale_ctx)} {r.slo_ms:g}ms {r.policy.value} "
            f"{'+'.join(r.gpus)}" for r in todo]
    finished = [0]

    def on_result(res) -> None:
        from opweave_planner.report import entry_line

        finished[0] += 1
        if progress:
            e = res.value if res.ok else {}
            progress(entry_line(finished[0], len(todo), res.key, e.get("usd_per_million_tokens"),
                                tpot_ms=e.get("tpot_ms"), measured=e.get("measured_share"),
                                reason=e.get("reason") if res.ok else res.error))

    results = make_executor(jobs, ray_address, retries).map(search_entry, todo, keys, on_result=on_result)
    done: dict = dict(cache) if cache is not None else {}
    for req, res in zip(todo, results, strict=True):
        if not res.ok:
            raise UserError(f"search failed after {res.attempts} attempt(s) ({res.key}): {res.error}")
        done[req] = res.value
        if cache is not None:
            cache[req] = res.value
    cells = []
    for (gbps, lat), ctx, slo, reqs, homo in layout:
        out = {pol: done[req] for pol, req in reqs.items()}
        cell: dict[str, Any] = {
            "context_tokens": int(ctx),
            "context": _label_tokens(int(ctx)),
            "slo_ms": float(slo),
            "network": {"gbps": _f(gbps), "latency_us": _f(lat)},
            "policies": out,
            **cell_summary(out),
        }
        if homo is not None:
            homo_out = {g: done[req] for g, req in homo.items()}
            best_g, best = None, None
            for g, e in homo_out.items():
                c = _cost(e)
                if c is not None and (best is None or c < best):
                    best_g, best = g, c
            ours = _cost(out["opweave"])
            cell["homogeneous"] = homo_out
            cell["best_homogeneous"] = best_g
            cell["best_homogeneous_usd"] = best
            cell["hetero_ratio"] = _f(best / ours) if best is not None and ours else None
        cells.append(cell)
    ratios = [c["ratio"] for c in cells if c["ratio"] is not None]
    hratios = [c["hetero_ratio"] for c in cells if c.get("hetero_ratio") is not None]
    return {
        "model": probe.model,
        "gpus": gpu_ids,
        "policies": pols,
        "contexts": [int(c) for c in ctx_list],
        "slos_ms": [float(s) for s in slo_list],
        "networks": [{"gbps": _f(b), "latency_us": _f(la)} for b, la in nets],
        "space": {k: (list(v) if isinstance(v, tuple) else v) for k, v in probe.space_record().items()
                  if k != "gpus"},
        "cells": cells,
        "summary": {
            "max_ratio": max(ratios) if ratios else None,
            "min_ratio": min(ratios) if ratios else None,
            "max_hetero_ratio": max(hratios) if hratios else None,
            "cells": len(cells),
            "cells_with_ratio": len(ratios),
        },
    }


def iter_violations(result: dict[str, Any], rel_tol: float = 1e-9) -> list[str]:
    """Cells where opweave costs more than a feasible baseline (should be empty)."""
    bad = []
    for c in result["cells"]:
        ours = _cost(c["policies"].get("opweave"))
        for pol in BASELINES:
            theirs = _cost(c["policies"].get(pol))
            if theirs is None:
                continue
            if ours is None or ours > theirs * (1 + rel_tol):
                bad.append(f"ctx {c['context']} slo {c['slo_ms']:g}ms: opweave {ours} > {pol} {theirs}")
        for g, e in (c.get("homogeneous") or {}).items():
            theirs = _cost(e)
            if theirs is not None and (ours is None or ours > theirs * (1 + rel_tol)):
                bad.append(f"ctx {c['context']} slo {c['slo_ms']:g}ms: heterogeneous {ours} > {g}-only {theirs}")
    return bad
