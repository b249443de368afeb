"""The plan file: a pydantic contract, built from a search result, written atomically.

Units: milliseconds for times, USD per million output tokens for cost, USD per
hour for prices, bytes for payloads and memory. `schema_version` is
MAJOR.MINOR: a new optional key bumps MINOR (old readers keep working); a
removed/renamed key or a changed meaning bumps MAJOR. See
docs/consuming-a-plan.md; the JSON Schema (schemas/plan.schema.json) is
generated from these models by `opweave_planner.contract.plan_schema`.
"""

from __future__ import annotations

import hashlib
from enum import IntEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from opweave_planner import __version__
from opweave_planner.atomic import write_atomic  # noqa: F401  (re-exported for callers)
from opweave_planner.data import profiles_root
from opweave_planner.report import dumps
from opweave_planner.sizing import Deployment

SCHEMA_VERSION = "1.5"
# Keys added after 1.0, with the MINOR that introduced them: a file is stamped with the lowest
# version whose schema covers the keys it actually carries, so old readers keep reading it.
_MINOR_KEYS = (("max_stages", 2), ("max_nodes", 2), ("gpus_per_node", 2), ("memory_headroom", 2),
               ("prefer_simpler", 2), ("gpu_memory_utilization", 2), ("moe_routing", 2), ("fixed_costs", 2),
               ("memory_reserve_gb_by_gpu", 5))
SCHEMA_MAJOR = 1
_VERSION_PATTERN = rf"^{SCHEMA_MAJOR}\.(0|[1-9][0-9]*)$"


class _Frozen(BaseModel):
    # floats must be finite everywhere (JSON has no NaN/inf; a writer must not emit null)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


# strict field types: `true` is not 1 and "3" is not 3 in a plan file
PolicyName = Literal["opweave", "colocated", "afd", "cad"]  # = inputs.request.Policy values
_ACTION_PATTERN = r"^(compute|send|recv) (0|[1-9][0-9]*) (0|[1-9][0-9]*)$"
ActionEntry = Annotated[str, Field(pattern=_ACTION_PATTERN)]
Count = Annotated[StrictInt, Field(ge=0)]
FinitePrice = Annotated[float, Field(ge=0, allow_inf_nan=False)]
NetworkFigure = Annotated[float, Field(ge=0, allow_inf_nan=False)]
# Names and paths that exports write into scripts and manifests, and the terminal prints: no
# control characters (a newline in a model name would become its own line of a generated script)
NAME_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]+$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]


def _f(description: str, **kw):
    return Field(description=description, **kw)


class Distribution(_Frozen):
    """The request-length workload a plan was made for (schema 1.3): where it came from, how it
    was shaped, its stationary decode context, and the settings of the percentile objective."""

    workload: str = _f("The --workload value: a trace or law file (absolute path) or an inline law")
    source: Literal["trace", "law"] = _f("A request trace, or a parametric law")
    format: str | None = _f("Trace format recognised from its header (azure, burstgpt, mooncake, vidur, "
                            "plain)", default=None)
    sha256: str | None = _f("SHA-256 of the trace file", default=None)
    rows: Count | None = _f("Requests in the trace file", default=None)
    requests: Count | None = _f("Requests kept after --max-model-len", default=None)
    clipped: Count | None = _f("Requests --max-model-len shortened (output clipped, or prompt truncated)",
                               default=None)
    dropped: Count | None = _f("Requests --max-model-len dropped", default=None)
    prompt: str | None = _f("Prompt-length law (a law)", default=None)
    output: str | None = _f("Output-length law (a law)", default=None)
    clipped_mass: float | None = _f("Probability mass clipped by --max-model-len (a law)", default=None, ge=0)
    dropped_mass: float | None = _f("Probability mass dropped by --max-model-len (a law)", default=None, ge=0)
    scale_ctx: StrictInt | None = _f("--scale-ctx: target stationary mean context, tokens", default=None)
    prompt_scale: float = _f("Factor applied to prompt lengths for --scale-ctx (1: none)", gt=0)
    max_model_len: StrictInt | None = _f("Longest request admitted (prompt + output), tokens", default=None)
    overflow: Literal["clip", "drop", "truncate"] = _f("What --max-model-len did to longer requests "
                                                       "(truncate: since schema 1.4)")
    theta: float = _f("Stationary mean decode context θ, tokens (what a random decode step sees)", ge=0)
    nu: float = _f("Its standard deviation ν, tokens", ge=0)
    cv: float = _f("ν / θ", ge=0)
    naive_mean: float = _f("Arrival average prompt mean + output mean / 2, tokens (not what decode sees)",
                           ge=0)
    mean_prompt: float = _f("Mean prompt length of the kept requests, tokens", ge=0)
    mean_output: float = _f("Mean output length of the kept requests, tokens", ge=0)
    max_context: Count = _f("Longest context a request reaches, tokens")
    context_quantiles: dict[str, Count] = _f("Quantiles of the stationary decode context, tokens")
    slo_percentile: float = _f("Percentile of step TPOT held to the SLO", gt=0, lt=100)
    kv_quantile: float = _f("Quantile of a replica's summed KV/state its memory is sized for", gt=0, lt=1)
    scenarios: StrictInt = _f("Sampled snapshots of the resident contexts the TPOT figures come from", ge=1)
    seed: Count = _f("Seed of those snapshots")
    context_knots: StrictInt = _f("Contexts at which stage latencies were looked up (linear between them)",
                                  ge=2)


class Workload(_Frozen):
    """The request the plan serves."""

    context_tokens: StrictInt = _f("Context length per request that KV/state must fit, tokens (a workload: "
                                   "its longest request, prompt + output, what a runtime's max-model-len "
                                   "must admit)", ge=1)
    tpot_slo_ms: float = _f("Time-per-output-token SLO, milliseconds", gt=0)
    distribution: Distribution | None = _f("The request-length workload (absent: every request at "
                                           "context_tokens); added in schema 1.3", default=None)


class TpotStats(_Frozen):
    """Step TPOT over the workload's scenarios (schema 1.3). `tpot_ms` is the `percentile`."""

    percentile: float = _f("The percentile tpot_ms reports (the SLO is held there)", gt=0, lt=100)
    mean_ms: float = _f("Mean step TPOT (the cost per token uses it: throughput is B / mean)", gt=0)
    p50_ms: float = _f("Median step TPOT", gt=0)
    p95_ms: float = _f("95th percentile step TPOT", gt=0)
    p99_ms: float = _f("99th percentile step TPOT", gt=0)
    max_ms: float = _f("Slowest sampled step", gt=0)
    at_mean_context_ms: float = _f("Round trip with every request at θ (what the stage figures show)", gt=0)
    samples: StrictInt = _f("Periods sampled: scenarios, times replicas for a one-owner plan", ge=1)


class OwnerOut(_Frozen):
    """A device group type: `replicas` identical groups of `tensor_parallel` GPUs of type `gpu`."""

    index: StrictInt = _f("Owner index; stages[].owner refers to it", ge=0)
    gpu: Name = _f("GPU type id (catalog id, e.g. h100)")
    tensor_parallel: StrictInt = _f("GPUs per device group (tensor-parallel degree), all in one node", ge=1)
    expert_parallel: StrictInt = _f("Routed experts split across this many GPUs of the group (1: replicated "
                              "per TP shard rules)", ge=1)
    replicas: StrictInt = _f("Number of identical device groups; each serves resident_batch requests", ge=1)
    resident_batch: StrictInt = _f("Requests resident on one replica (= microbatches x microbatch)", ge=1)
    microbatch: StrictInt = _f("Requests per microbatch on one replica", ge=1)
    stage_positions: list[Count] = _f("Indices of the stages this owner runs, ascending")
    usd_per_hour_per_replica: float = _f("Price of one replica: tensor_parallel x GPU price, USD per hour", ge=0)
    busy_fraction: float = _f("Fraction of the round trip the group computes (0..1)", ge=0, le=1)
    memory_bytes_per_gpu: float = _f("Bytes per GPU: weight shard + KV/state of resident_batch requests "
                                     "+ activation workspace", ge=0)


class StageOut(_Frozen):
    """A contiguous (cyclic) operator range run by one owner."""

    index: StrictInt = _f("Stage position in the decode loop; stage 0 holds the embedding", ge=0)
    owner: StrictInt = _f("Owner running this stage", ge=0)
    operators: list[str] = _f("Operator names in execution order (model operator sequence slice)",
                              min_length=1)
    latency_ms: float = _f("Compute time of the stage for one microbatch, milliseconds", ge=0)
    transfer_ms: float = _f("Hand-off to the next stage for one microbatch (link occupancy + latency), "
                            "milliseconds; 0 when the next stage has the same owner", ge=0)
    payload_bytes_per_request: float = _f("Activation bytes per request sent to the next stage; 0 when "
                                          "the next stage has the same owner", ge=0)
    measured_fraction: float | None = _f(
        "Share of latency_ms taken from measured or interpolated kernel tables (the rest was clamped at a "
        "table edge or from the fitted roofline); added in schema 1.1", default=None, ge=0, le=1)


class TemplateOut(_Frozen):
    """The cyclic sub-block template the stages were expanded from."""

    subblock_layers: StrictInt = _f("Layers per repeated sub-block", ge=1)
    cut_positions: list[Count] = _f("Cut operator indices inside the sub-block (sorted)")
    cut_operators: list[str] = _f("The cuts as 'layer+<offset>.<slot>'")
    owners: StrictInt = _f("Number of owners (K)", ge=1)


class Metrics(_Frozen):
    inter_node_mib_per_token: float = _f("MiB crossing the inter-node network per output token", ge=0)
    price_weighted_occupancy: float = _f("Busy fraction weighted by spend (0..1)", ge=0, le=1)
    per_gpu_batch: float = _f("global_batch / gpus_total, requests per GPU", ge=0)
    critical_resource: str = _f("Resource that binds the round trip (compute/egress/ingress of owner i, "
                                "or loop latency)")
    stage_link: str = _f("Link stage hand-offs use: intra_node, inter_node or none (one owner)")


class SpaceOut(_Frozen):
    """The search space the plan was chosen from (what `regen` and `simulate` rebuild)."""

    gpus: list[Name] = _f("GPU types searched")
    tensor_parallel_sizes: list[StrictInt] = _f("TP degrees searched")
    batches: list[StrictInt] = _f("Global resident batch sizes searched")
    max_owners: StrictInt = _f("Most owners per template", ge=1)
    max_microbatches: StrictInt = _f("Most microbatches in flight", ge=1)
    max_replicas: StrictInt = _f("Most replicas per owner", ge=1)
    max_gpus: StrictInt = _f("GPU budget of a plan", ge=1)
    max_stages: StrictInt | None = _f("Most pipeline stages a plan may have (absent: no limit); added in "
                                "schema 1.2", default=None, ge=1)
    max_nodes: StrictInt | None = _f("Most nodes a plan may occupy (absent: no limit); added in schema 1.2",
                               default=None, ge=1)
    gpus_per_node: StrictInt | None = _f("GPUs per node of the deployment (absent: each GPU type's catalog "
                                   "figure); added in schema 1.2", default=None, ge=1)
    memory_headroom: float | None = _f("Share of usable GPU memory kept free (absent: 0); added in "
                                       "schema 1.2", default=None, ge=0, lt=1)
    prefer_simpler: float | None = _f("The plan is the simplest (fewest stages, then cheapest, then "
                                      "fewest GPUs) within this share of the optimum, which is listed "
                                      "under alternatives.optimum; added in schema 1.2", default=None, ge=0)
    moe_expert_parallel: StrictBool = _f("Expert-parallel variants searched for MoE owners")
    gpu_memory_utilization: float | None = _f("Share of each GPU's memory the runtime may use (vLLM's "
                                              "gpu_memory_utilization); added in schema 1.2", default=None,
                                              gt=0, le=1)
    moe_routing: str | None = _f("MoE kernel tables used: power-law or balanced; added in schema 1.2",
                                 default=None)
    fixed_costs: StrictBool | None = _f("Stages and hand-offs were charged their fixed dispatch / NCCL call "
                                  "costs; added in schema 1.2", default=None)
    memory_reserve_gb: float = _f("Per-GPU memory held back for framework/CUDA context inside the "
                                  "runtime's budget, GiB (NCCL buffers by TP come on top); the largest "
                                  "of memory_reserve_gb_by_gpu when that is present", ge=0)
    memory_reserve_gb_by_gpu: dict[Name, Annotated[float, Field(ge=0)]] | None = _f(
        "Each searched GPU type's reserve, GiB, when they differ (a catalog's own figures, none given "
        "on the command line); added in schema 1.5", default=None)

    def reserve_gb(self, gpu: str) -> float:
        """The reserve the search held back on `gpu`."""
        return (self.memory_reserve_gb_by_gpu or {}).get(gpu, self.memory_reserve_gb)


class SearchStats(_Frozen):
    templates: Count
    candidates: Count
    simulations: Count
    pruned_by_bound: Count
    pruned_by_frontier: Count
    exhaustive: StrictBool
    space: SpaceOut


class Provenance(_Frozen):
    """Inputs the plan depends on, so a change can be traced to its cause.

    Hashes cover only what this plan's search read: the catalog entries and prices of the
    searched GPU types, their profile files, the network description and the model file.
    """

    tool_version: str = _f("opweave-planner version that wrote the file")
    model_sha256: str = _f("SHA-256 of the model config.json")
    catalog_sha256: str = _f("SHA-256 of the searched GPU types' catalog entries (prices excluded)")
    prices_sha256: str = _f("SHA-256 of the searched GPU types' prices")
    prices_usd_per_gpu_hour: dict[str, FinitePrice] = _f("Price in effect per searched GPU type, USD per GPU-hour")
    profiles_sha256: str = _f("SHA-256 of the searched GPU types' latency profile files")
    network: dict[str, NetworkFigure] = _f("Network description: inter_node_gbps (GB/s), inter_node_latency_us, "
                                   "intra_node_latency_us (microseconds)")
    network_sha256: str = _f("SHA-256 of the network description")
    backend: str = _f("Profile backend (e.g. vllm)")


class Plan(_Frozen):
    """A feasible decode-serving plan."""

    schema_version: str = _f("MAJOR.MINOR of this file format", pattern=_VERSION_PATTERN)
    model: Name = _f("Model name (no control characters)")
    model_source: Name | None = _f("Absolute path of the config.json the plan was made from, when it was "
                                  "not a bundled model or Hugging Face id (what simulate and regen "
                                  "reload); added in schema 1.2", default=None)
    workload: Workload
    policy: PolicyName = _f("Plan family searched: opweave, colocated, afd or cad")
    usd_per_million_tokens: float = _f("Cost, USD per million output tokens", ge=0)
    tpot_ms: float = _f("Steady-state time per output token (decode round trip), milliseconds; with a "
                        "workload distribution, its SLO percentile of step TPOT (see tpot)", gt=0)
    tpot: TpotStats | None = _f("Step TPOT distribution under the workload; added in schema 1.3", default=None)
    microbatches: StrictInt = _f("Microbatches in flight per replica (mu)", ge=1)
    global_batch: StrictInt = _f("Requests decoding concurrently across the plan (B)", ge=1)
    gpus_total: StrictInt = _f("GPUs in the plan: sum over owners of replicas x tensor_parallel", ge=1)
    num_stages: StrictInt = _f("Stages in the decode loop", ge=1)
    owners: list[OwnerOut] = _f("Device group types", min_length=1)
    template: TemplateOut
    stages: list[StageOut] = _f("The decode loop, in order; after the last stage comes stage 0", min_length=1)
    action_order: list[list[ActionEntry]] = _f(
        "Per owner, the static action order the simulator assumed: '<compute|send|recv> <stage> "
        "<microbatch>', repeated every decode step")
    metrics: Metrics
    search: SearchStats
    provenance: Provenance
    deployment: Deployment | None = _f(
        "Deployment sized for the request's target load (--target-tokens-per-s / --target-concurrency): "
        "copies, replicas, GPUs, nodes, USD per hour; added in schema 1.2", default=None)
    alternatives: dict[str, Alternative] | None = _f(
        "Cheapest plan of each simpler class that has one: colocated (one stage), two_owner (at most "
        "two device-group types, AFD/CAD-like), single_gpu_type; and optimum when --prefer-simpler "
        "chose a simpler plan than the cheapest. Added in schema 1.2", default=None)


class Alternative(_Frozen):
    """The cheapest plan of a simpler class, found by the same search (exact over the grid)."""

    usd_per_million_tokens: float = _f("Cost, USD per million output tokens", ge=0)
    tpot_ms: float = _f("Steady-state time per output token, milliseconds", gt=0)
    cost_delta_pct: float = _f("Cost relative to this file's plan, percent (+: dearer)")
    tpot_delta_pct: float = _f("TPOT relative to this file's plan, percent (+: slower)")
    num_stages: StrictInt = _f("Stages in the decode loop", ge=1)
    gpus_total: StrictInt = _f("GPUs in the alternative", ge=1)
    plan: Plan = _f("The alternative as a complete plan (its own alternatives omitted)")


class Infeasible(_Frozen):
    """No plan meets the request; `reason` names the binding constraint."""

    schema_version: str = _f("MAJOR.MINOR of this file format", pattern=_VERSION_PATTERN)
    model: Name
    workload: Workload
    policy: PolicyName
    feasible: Literal[False] = _f("Always false", default=False)
    reason: str


def _round(x: float, digits: int = 9) -> float:
    """Stable decimal rounding so identical inputs always print identical bytes."""
    return float(f"{x:.{digits}g}")


def _sha(obj) -> str:
    return hashlib.sha256(dumps(obj)).hexdigest()


def profiles_hash(profiles_dir: str | None, gpus: list[str], backend: str) -> str:
    root = profiles_root(profiles_dir)
    h = hashlib.sha256()
    for gid in sorted(set(gpus)):
        folder = root / gid
        for p in sorted(folder.glob("*.json")) + sorted((folder / backend).glob("*.json")):
            h.update(p.relative_to(root).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def provenance(hw, seq, gpus, profiles_dir: str | None, backend: str) -> Provenance:
    """Provenance scoped to the searched GPU types (a price edit of another type changes nothing)."""
    ids = sorted(set(gpus))
    types = {g.id: g for g in hw.gpus}
    specs = {gid: types[gid].model_dump(exclude={"price_per_hour", "price_estimated"}) for gid in ids}
    prices = {gid: types[gid].price_per_hour for gid in ids}
    net = hw.network.model_dump()
    return Provenance(
        tool_version=__version__, model_sha256=seq.model.source_sha256, catalog_sha256=_sha(specs),
        prices_sha256=_sha(prices), prices_usd_per_gpu_hour=prices,
        profiles_sha256=profiles_hash(profiles_dir, ids, backend),
        network={k: float(v) for k, v in net.items()}, network_sha256=_sha(net), backend=backend,
    )


def space_record(req, hw) -> SpaceOut:
    """The searched space, with the reserve each GPU type was searched with (`--memory-reserve-gb`,
    else the catalog's own figure per type), so simulate and regen judge the plan under it."""
    from opweave_planner.latency.memory import GIB, reserve_bytes

    rec = {**req.space_record(), "gpus": list(req.gpus)}
    used = {gid: _round(reserve_bytes(hw.resolve(gid, "--gpus")) / GIB) for gid in req.gpus}
    if req.memory_reserve_gb is None and used:
        rec["memory_reserve_gb"] = max(used.values())
        if len(set(used.values())) > 1:
            rec["memory_reserve_gb_by_gpu"] = used
    return SpaceOut(**rec)


def distribution_minor(distribution: Distribution) -> int:
    """The lowest 1.x that can carry this workload record (1.4: the value "truncate")."""
    return 4 if distribution.overflow == "truncate" else 3


def schema_version_for(space: SpaceOut, alternatives: bool = False,
                       distribution: Distribution | None = None) -> str:
    """The lowest 1.x whose keys cover this plan (1.1: per-stage measured_fraction; 1.2:
    alternatives, model_source and the deployment constraints; 1.3: a workload distribution;
    1.4: its ``overflow`` "truncate"; 1.5: per-GPU memory reserves; `alternatives` says a 1.2 key outside the searched space
    is present; `distribution` is the plan's workload distribution record, or None)."""
    minor = 2 if alternatives else 1
    if distribution is not None:
        minor = distribution_minor(distribution)
    for key, since in _MINOR_KEYS:
        if getattr(space, key) is not None:
            minor = max(minor, since)
    return f"{SCHEMA_MAJOR}.{minor}"


def _pct(new: float, base: float) -> float:
    return _round((new / base - 1.0) * 100.0, 6) if base else 0.0


def with_alternatives(plan: Plan, named: dict[str, Plan]) -> Plan:
    """`plan` with an `alternatives` section (schema 1.2) listing `named` against it."""
    alts = {name: Alternative(
        usd_per_million_tokens=p.usd_per_million_tokens, tpot_ms=p.tpot_ms,
        cost_delta_pct=_pct(p.usd_per_million_tokens, plan.usd_per_million_tokens),
        tpot_delta_pct=_pct(p.tpot_ms, plan.tpot_ms), num_stages=p.num_stages, gpus_total=p.gpus_total,
        plan=p) for name, p in named.items()}
    return plan.model_copy(update={"alternatives": alts, "schema_version": schema_version_for(
        plan.search.space, alternatives=True, distribution=plan.workload.distribution)})


class CriticalResource(IntEnum):
    """What binds the round trip (the simulator's CRIT_* codes)."""

    COMPUTE = 0
    EGRESS = 1
    INGRESS = 2
    LOOP_LATENCY = 3

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", " ")


def _owners(ctx, splan, sel, ev) -> list[OwnerOut]:
    out = []
    for o in range(len(sel.cfg)):
        cfg = ctx.arrays.configs[int(sel.cfg[o])]
        tp = cfg.parallel.tp
        bh = ctx.arrays.mb_grid[int(sel.mb[o])]
        out.append(OwnerOut(
            index=o, gpu=cfg.gpu.id, tensor_parallel=tp, expert_parallel=tp if cfg.parallel.moe_ep else 1,
            replicas=int(sel.replicas[o]), resident_batch=sel.mu * bh, microbatch=bh,
            stage_positions=[j for j in range(splan.n_stages) if splan.owner[j] == o],
            usd_per_hour_per_replica=_round(cfg.gpu.price_per_hour * tp),
            busy_fraction=_round(float(ev.busy[o]), 6), memory_bytes_per_gpu=_round(float(ev.memory_need[o])),
        ))
    return out


def _stages(seq, splan, payload, ev) -> list[StageOut]:
    s = splan.n_stages
    crosses = [splan.owner[(j + 1) % s] != splan.owner[j] for j in range(s)]
    return [StageOut(
        index=j, owner=int(splan.owner[j]), operators=[seq.ops[i].name for i in splan.ops[j]],
        latency_ms=_round(ev.t[j] / 1e3), transfer_ms=_round((ev.occ[j] + ev.latv[j]) / 1e3),
        payload_bytes_per_request=_round(float(payload[j]) if crosses[j] else 0.0),
        measured_fraction=_round(min(1.0, ev.measured[j] / ev.t[j]) if ev.t[j] > 0 else 1.0, 4),
    ) for j in range(s)]


def _metrics(ctx, sel, splan, payload, ev, gpus_total: int) -> Metrics:
    k, s = len(sel.cfg), splan.n_stages
    spend = busy_spend = 0.0
    for o in range(k):
        cfg = ctx.arrays.configs[int(sel.cfg[o])]
        usd = cfg.gpu.price_per_hour * cfg.parallel.tp * int(sel.replicas[o])
        spend += usd
        busy_spend += usd * float(ev.busy[o])
    inter = 0.0 if ev.intra_node else sum(payload[j] for j in range(s) if splan.owner[(j + 1) % s] != splan.owner[j])
    crit = CriticalResource(ev.critical_kind).label + (
        f" of owner {ev.critical_index}" if ev.critical_index >= 0 else "")
    return Metrics(
        inter_node_mib_per_token=_round(inter / 2**20),
        price_weighted_occupancy=_round(busy_spend / spend, 6) if spend > 0 else 1.0,
        per_gpu_batch=_round(sel.batch / gpus_total), critical_resource=crit,
        stage_link="none" if k == 1 else ("intra_node" if ev.intra_node else "inter_node"))


def build_plan(ctx, template, sel, search: SearchStats, *, scored_t_rtt_us: float | None = None):
    """Describe a Selection for a runtime, from the one evaluator the search scored it with.

    Returns (Plan, Evaluation).
    `scored_t_rtt_us` is the search's own figure for this Selection; the plan's TPOT must
    equal it (a second copy of the physics would show up here). `search` names the searched
    space, which scopes the provenance hashes.
    """
    from opweave_planner.schedule import action_order
    from opweave_planner.search.evaluate import evaluate
    from opweave_planner.structure.operators import SLOTS

    seq, req = ctx.seq, ctx.request
    source = seq.model.source if seq.model.source.startswith("/") else None
    splan, prob = ctx.problem(template, batches=(sel.batch,))
    ev = evaluate(prob, sel)
    dist = workload_record(req, ctx.arrays)
    if scored_t_rtt_us is not None and abs(ev.t_rtt - scored_t_rtt_us) > 1e-9 * abs(scored_t_rtt_us):
        raise AssertionError(f"plan TPOT {ev.t_rtt} us differs from the searched {scored_t_rtt_us} us")
    s, k, mu = splan.n_stages, prob.k, sel.mu
    owners = _owners(ctx, splan, sel, ev)
    gpus_total = sum(o.replicas * o.tensor_parallel for o in owners)
    usd_per_mtok = ev.cost / 3.6e9 * 1e6
    cut_ops = ([seq.ops[splan.ops[0][0]].name] if s == 1
               else [f"layer+{offset}.{SLOTS[slot]}" for offset, slot in splan.cut_keys])
    # scoped to the searched types and the plan's own (the same set unless a file was edited):
    # a plan always records the price of every GPU it uses, so it reads back
    prov = provenance(ctx.hw, seq, [*search.space.gpus, *(o.gpu for o in owners)], req.profiles, req.backend)
    order = [[f"{kind} {int(j)} {int(kk)}" for kind, j, kk in lst] for lst in action_order(prob.stage_owner, mu, k)]
    return Plan(
        schema_version=schema_version_for(search.space, alternatives=source is not None, distribution=dist),
        model=seq.model.name, model_source=source,
        workload=Workload(context_tokens=req.context_tokens, tpot_slo_ms=req.slo_ms, distribution=dist),
        policy=str(req.policy.value), usd_per_million_tokens=_round(usd_per_mtok), tpot_ms=_round(ev.t_rtt / 1e3),
        tpot=None if dist is None else tpot_stats(ev, req.percentile),
        microbatches=mu, global_batch=sel.batch, gpus_total=gpus_total, num_stages=s,
        owners=owners,
        template=TemplateOut(subblock_layers=template.lsub, cut_positions=list(template.cuts),
                             cut_operators=cut_ops, owners=k),
        stages=_stages(seq, splan, prob.payload, ev), action_order=order,
        metrics=_metrics(ctx, sel, splan, prob.payload, ev, gpus_total),
        search=search,
        provenance=prov,
    ), ev


def workload_record(req, arrays) -> Distribution | None:
    """What the plan records about its workload (None: a fixed context)."""
    if not req.stochastic:
        return None
    d = req.traffic().describe()
    d.pop("path", None)
    return Distribution(workload=req.workload, slo_percentile=req.percentile, kv_quantile=req.kv_quantile,
                        scenarios=req.scenarios, seed=req.seed, context_knots=int(arrays.knots.size),
                        **{k: (_round(v) if isinstance(v, float) else v) for k, v in d.items()})


def tpot_stats(ev, percentile: float) -> TpotStats:
    ms = [_round(ev.percentile(q) / 1e3) for q in (0.5, 0.95, 0.99)]
    return TpotStats(percentile=percentile, mean_ms=_round(ev.t_mean / 1e3), p50_ms=ms[0], p95_ms=ms[1],
                     p99_ms=ms[2], max_ms=_round(float(ev.samples[-1]) / 1e3),
                     at_mean_context_ms=_round(ev.t_show / 1e3), samples=int(ev.samples.size))


def search_stats(req, hw, outcome) -> SearchStats:
    return SearchStats(templates=outcome.templates, exhaustive=not (req.pareto or req.bnb),
                       space=space_record(req, hw), **outcome.counters._asdict())


Alternative.model_rebuild()
Plan.model_rebuild()


def plan_bytes(plan: BaseModel) -> bytes:
    """Canonical bytes of a plan (sorted keys, fixed rounding): equal inputs give equal files.

    Optional keys added by a later MINOR version are omitted when absent, so a file written by
    an older 1.x reads back to the same bytes.
    """
    return dumps(plan.model_dump(mode="json", exclude_none=True))
