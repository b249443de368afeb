"""Every model of a plan file: a pydantic contract, frozen, strict, finite.

Units: milliseconds for times, USD per million output tokens for cost, USD per
hour for prices, bytes for payloads and memory. `schema_version` is
MAJOR.MINOR: a new optional key bumps MINOR (old readers keep working); a
removed/renamed key or a changed meaning bumps MAJOR. See
docs/consuming-a-plan.md; the JSON Schema (schemas/plan.schema.json) is
generated from these models by `opweave_planner.contract.plan_schema`.
"""

from __future__ import annotations

import types
from typing import Annotated, Literal, get_args

from pydantic import ConfigDict, Field, StrictBool, StrictInt, create_model, model_validator

from opweave_planner.frozen import Frozen
from opweave_planner.inputs.request import PlanRequest
from opweave_planner.plan.request import SPACE, SPACE_ROWS, Recorded

__all__ = [
    "SCHEMA_MAJOR", "SCHEMA_VERSION", "NAME_PATTERN", "Name", "PolicyName", "Plan", "Infeasible",
    "Alternative", "Workload", "Distribution", "TpotStats", "KvEventsOut", "OwnerOut", "StageOut", "TemplateOut", "Metrics",
    "SpaceOut", "SearchStats", "Provenance", "Deployment", "OwnerDeployment", "BindingOut", "ArrivalsOut",
    "PrefillPoolOut", "AggregatedOut", "DisaggregatedInfeasibleOut",
]

SCHEMA_VERSION = "1.14"
SCHEMA_MAJOR = 1
_VERSION_PATTERN = rf"^{SCHEMA_MAJOR}\.(0|[1-9][0-9]*)$"


class _Frozen(Frozen):
    # floats must be finite everywhere (JSON has no NaN/inf; a writer must not emit null)
    model_config = ConfigDict(allow_inf_nan=False)


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
    """A key with its description first: every key of the file says what it is and its unit."""
    return Field(description=description, **kw)


class Distribution(_Frozen):
    """The request-length workload a plan was made for (schema 1.3): where it came from, how it
    was shaped, its stationary decode context, and the settings of the percentile objective."""

    workload: str = _f("The --workload value: a trace or law file (relative to the working directory the "
                       "plan was made in when the file lies under it, else absolute; sha256 is its "
                       "identity) or an inline law")
    source: Literal["trace", "law"] = _f("A request trace, or a parametric law")
    format: str | None = _f("Trace format recognised from its header: its name in docs/workloads.md's table "
                            "of trace formats (azure, mooncake, ...)", default=None)
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
    preemptions_per_request: float | None = _f(
        "Target of forced preemptions per served request the KV reserve holds (the reserve is the larger of "
        "that capacity and the kv_quantile's); absent before schema 1.8", default=None, gt=0, lt=1)
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
    prompt_tokens: StrictInt | None = _f("Prompt tokens of a fixed-context request (--prompt-len); added in "
                                         "schema 1.7", default=None, ge=1)
    output_tokens: StrictInt | None = _f("Output tokens of a fixed-context request (--output-len); added in "
                                         "schema 1.7", default=None, ge=1)
    max_model_len: StrictInt | None = _f(
        "Window the runtime admits, prompt + output tokens, apart from the context planned for (what exports "
        "write as --max-model-len); absent: a workload's distribution.max_model_len, else context_tokens; "
        "added in schema 1.7", default=None, ge=1)

    @model_validator(mode="after")
    def _window_is_prompt_plus_output(self) -> Workload:
        lengths = (self.prompt_tokens, self.output_tokens, self.max_model_len)
        if any(v is not None for v in lengths):
            if None in lengths or self.distribution is not None:
                raise ValueError("workload: prompt_tokens, output_tokens and max_model_len come together, "
                                 "with a fixed context only")
            if self.max_model_len != self.prompt_tokens + self.output_tokens:
                raise ValueError(f"workload.max_model_len {self.max_model_len} is not prompt_tokens + "
                                 f"output_tokens ({self.prompt_tokens} + {self.output_tokens})")
        return self

    @property
    def window(self) -> int:
        """The longest request (prompt + output) a runtime serving this plan must admit."""
        if self.max_model_len is not None:
            return self.max_model_len
        if self.distribution is not None and self.distribution.max_model_len is not None:
            return self.distribution.max_model_len
        return self.context_tokens


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


class KvEventsOut(_Frozen):
    """A workload owner's KV overflow (schema 1.8): episodes are up-crossings of a capacity by one
    replica's summed KV, each a forced preemption once it is the usable memory."""

    per_request_at_reserve: float = _f("Up-crossings of the reserved memory per served request", ge=0)
    per_request_at_usable: float = _f("Up-crossings of the usable memory (what the runtime gets for KV) per "
                                      "served request: forced preemptions", ge=0)
    per_replica_hour_at_reserve: float = _f("Up-crossings of the reserved memory per replica-hour "
                                            "(at the mean step TPOT)", ge=0)
    per_replica_hour_at_usable: float = _f("Forced preemptions per replica-hour (at the mean step TPOT)", ge=0)
    share_above_reserve: float = _f("Share of a replica's steps above the reserved memory", ge=0, le=1)
    share_above_usable: float = _f("Share of a replica's steps above the usable memory", ge=0, le=1)


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
    kv_events: KvEventsOut | None = _f("KV overflow episodes of a workload plan (schema 1.8)", default=None)


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


class BindingOut(_Frozen):
    """What keeps the plan at its batch: its shape (owners, mu, replicas) scored at the next batch
    of the searched set it can split, by the search's evaluator; added in schema 1.9."""

    constraint: Literal["slo", "memory", "gpus", "nodes", "batches", "cost"] = _f(
        "slo: at next_batch the shape fits memory but misses the TPOT SLO; memory: it does not fit "
        "(next_* then describe this template's cheapest next_batch plan, with more replicas); gpus / "
        "nodes: that plan needs more than --max-gpus / --max-nodes; batches: no larger searched batch "
        "the shape can split; cost: next_batch fits and meets the SLO but costs more per token")
    next_batch: StrictInt | None = _f("The next searched global batch the plan's shape can split "
                                      "(divisible by microbatches x replicas of every owner)", default=None, ge=1)
    memory_owner: StrictInt | None = _f("Owner with the least memory headroom at next_batch", default=None, ge=0)
    memory_used_gib: float | None = _f("That owner's bytes per GPU in this plan, GiB", default=None, ge=0)
    memory_usable_gib: float | None = _f("That owner's usable bytes per GPU (after the reserve and "
                                         "--gpu-memory-utilization), GiB", default=None, ge=0)
    memory_next_gib: float | None = _f("That owner's bytes per GPU at next_batch, GiB", default=None, ge=0)
    next_tpot_ms: float | None = _f("TPOT at next_batch (slo, cost: this shape; memory, gpus, nodes: the "
                                    "cheapest plan of this template there), milliseconds", default=None, gt=0)
    next_usd_per_million_tokens: float | None = _f("Cost at next_batch, same plan as next_tpot_ms", default=None,
                                                   ge=0)
    next_gpus_total: StrictInt | None = _f("GPUs at next_batch, same plan as next_tpot_ms", default=None, ge=1)


# the plan file's strict twin of each request type (`true` is not 1 and "3" is not 3 in a file);
# searched GPU ids are names, which exports write into scripts
_STRICT = {int: StrictInt, bool: StrictBool, float: float, str: str,
           tuple[int, ...]: list[StrictInt], tuple[str, ...]: list[Name]}


def _space_key(row: Recorded):
    """A `search.space` key: the strict twin of its request field's type, described and bounded
    by its row, and optional when it came after 1.0 (older files lack it)."""
    kind = PlanRequest.model_fields[row.field].annotation
    if isinstance(kind, types.UnionType):  # `int | None`: a file records the value in effect
        (kind,) = (a for a in get_args(kind) if a is not type(None))
    kind, bounds = _STRICT[kind], row.bounds or {}
    if not row.since:
        return kind, _f(row.about, **bounds)
    return kind | None, _f(f"{row.about}; added in schema 1.{row.since}", default=None, **bounds)


# the space keys no request field sets (their rows have no field)
_DERIVED_SPACE = {"memory_reserve_gb_by_gpu": (dict[Name, Annotated[float, Field(ge=0)]] | None, _f(
    "Each searched GPU type's reserve, GiB, when they differ (a catalog's own figures, none given "
    "on the command line); added in schema 1.5", default=None))}


class _Space(_Frozen):
    """SpaceOut's behaviour; its keys are the table's `search.space` rows (plan/request.py)."""

    def reserve_gb(self, gpu: str) -> float:
        """The reserve the search held back on `gpu`."""
        return (self.memory_reserve_gb_by_gpu or {}).get(gpu, self.memory_reserve_gb)


SpaceOut = create_model(
    "SpaceOut", __base__=_Space, __module__=__name__,
    __doc__="The search space the plan was chosen from (what `regen` and `simulate` rebuild).",
    **{r.at.removeprefix(SPACE): _space_key(r) if r.field else _DERIVED_SPACE[r.at.removeprefix(SPACE)]
       for r in SPACE_ROWS})


class SearchStats(_Frozen):
    templates: Count
    candidates: Count
    simulations: Count
    pruned_by_bound: Count
    pruned_by_frontier: Count
    exhaustive: StrictBool = _f("True when neither the bound nor the frontier pruned (every candidate "
                                "was enumerated, --no-bnb --no-pareto); the search is exact either way")
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


class OwnerDeployment(_Frozen):
    """One owner of the plan, multiplied out to the deployment."""

    index: int = _f("Owner index in the plan (owners[].index)", ge=0)
    gpu: str = _f("GPU type id")
    tensor_parallel: int = _f("GPUs per device group", ge=1)
    replicas: int = _f("Device groups of this owner in the whole deployment: copies x the plan's replicas", ge=1)
    gpus: int = _f("GPUs of this owner in the deployment: replicas x tensor_parallel", ge=1)
    nodes: int | None = _f("Nodes this owner's groups occupy (absent when owners share nodes: stage link "
                           "intra_node)", default=None, ge=1)
    usd_per_hour: float = _f("Price of this owner's GPUs, USD per hour", ge=0)


class ArrivalsOut(_Frozen):
    """The arrival process a disaggregated deployment was sized for (schema 1.10), recorded as a
    workload is: what it was, its rate, how many requests were replayed."""

    process: Literal["poisson", "trace"] = _f("poisson: seeded exponential gaps; trace: the --workload "
                                              "trace's own timestamps")
    request_rate: float | None = _f("--request-rate, requests per second (absent: the rate came from "
                                    "--target-tokens-per-s or the trace)", default=None, gt=0)
    target_tokens_per_s: float | None = _f("--target-tokens-per-s the Poisson rate came from (rate = it / mean "
                                           "output tokens)", default=None, gt=0)
    rate: float = _f("Mean arrival rate the pools are sized for, requests per second", gt=0)
    rate_scale: float | None = _f("--rate-scale of a trace replay (absent: 1 or Poisson)", default=None, gt=0)
    requests: StrictInt = _f("Requests replayed through the prefill pool", ge=1)
    seed: Count | None = _f("Seed of the Poisson arrivals", default=None)
    mean_prompt_tokens: float = _f("Mean prompt tokens of the replayed requests", gt=0)
    mean_output_tokens: float = _f("Mean output tokens per request (the decode pool's throughput is rate x "
                                   "this)", gt=0)


def _gpus_are_groups_times_tp(pool, where: str, groups: str):
    """A pool's GPUs are its groups (instances, replicas) x TP; else the key named."""
    n = getattr(pool, groups)
    if pool.gpus != n * pool.tensor_parallel:
        raise ValueError(f"deployment.{where}.gpus {pool.gpus} is not {groups} x tensor_parallel "
                         f"({n} x {pool.tensor_parallel})")
    return pool


class PrefillPoolOut(_Frozen):
    """The prefill pool of a disaggregated deployment (schema 1.10): N instances of one (GPU type,
    TP) group, the cheapest of the enumeration whose replayed TTFT meets the SLO at its percentile."""

    gpu: Name = _f("GPU type id")
    tensor_parallel: StrictInt = _f("GPUs per prefill instance", ge=1)
    instances: StrictInt = _f("Prefill instances: the least count meeting the TTFT SLO for this (GPU, TP)", ge=1)
    gpus: StrictInt = _f("GPUs of the pool: instances x tensor_parallel", ge=1)
    usd_per_hour: float = _f("Price of the pool, USD per hour", ge=0)
    chunk_tokens: Count = _f("Prefill chunk (tokens per step) the prefill times assume")
    ttft_slo_ms: float = _f("--ttft, milliseconds", gt=0)
    ttft_percentile: float = _f("Percentile of TTFT held to the SLO", gt=0, lt=100)
    ttft_ms: float = _f("Replayed TTFT at that percentile (wait + prefill + hand-off), milliseconds", ge=0)
    ttft_mean_ms: float = _f("Replayed mean TTFT, milliseconds", ge=0)
    wait_mean_ms: float = _f("Replayed mean queueing wait, milliseconds", ge=0)
    prefill_mean_ms: float = _f("Mean prefill time of a request on one instance, milliseconds", gt=0)
    handoff_mean_ms: float = _f("Mean KV hand-off to the decode pool (prompt KV bytes over the inter-node "
                                "link + its latency), milliseconds", ge=0)
    utilisation: float = _f("Offered load per instance: rate x mean prefill time / instances", ge=0)
    mgc_wait_mean_ms: float = _f("Check: the Allen-Cunneen M/G/c mean wait at the same rate and service "
                                 "times, milliseconds", ge=0)
    cost_share: float = _f("The pool's share of the all-in USD per hour", ge=0, le=1)
    measured_share: float = _f("Share of the prefill time from measured or interpolated kernel tables (the "
                               "rest fitted or clamped), weighted over the replayed requests", ge=0, le=1)
    options: StrictInt = _f("(GPU type, TP) options enumerated", ge=1)

    @model_validator(mode="after")
    def _gpus_are_instances_times_tp(self) -> PrefillPoolOut:
        return _gpus_are_groups_times_tp(self, "prefill", "instances")


class AggregatedOut(_Frozen):
    """The aggregated deployment (schema 1.11): R colocated replicas of one (GPU type, TP) serving
    prefill and decode together with chunked prefill, the cheapest (GPU, TP, batch, chunk, R) of
    the enumeration whose step-level replay meets both SLOs."""

    gpu: Name = _f("GPU type id")
    tensor_parallel: StrictInt = _f("GPUs per replica", ge=1)
    batch: StrictInt = _f("Resident requests per replica (vLLM max_num_seqs)", ge=1)
    chunk_tokens: StrictInt = _f("Token budget of a step, decodes first, then prefill chunks (vLLM "
                                 "max_num_batched_tokens); what an export sets", ge=1)
    replicas: StrictInt = _f("Replicas: the least count meeting both SLOs for this shape (arrivals dealt "
                             "round-robin)", ge=1)
    gpus: StrictInt = _f("GPUs: replicas x tensor_parallel", ge=1)
    usd_per_hour: float = _f("Price of the replicas, USD per hour (the whole aggregated deployment)", ge=0)
    usd_per_million_output_tokens: float = _f("usd_per_hour per million output tokens at the arrival rate",
                                              ge=0)
    tpot_percentile: float = _f("Percentile of TPOT held to the SLO, over the decode tokens of mixed and "
                                "pure steps", gt=0, le=100)
    tpot_ms: float = _f("Replayed TPOT at that percentile, milliseconds", ge=0)
    tpot_mean_ms: float = _f("Replayed mean TPOT over decode tokens, milliseconds", ge=0)
    decode_step_ms: float = _f("A pure decode step at the full batch, milliseconds", gt=0)
    mixed_step_share: float = _f("Share of the steps with decodes that also carried a prefill chunk", ge=0, le=1)
    ttft_ms: float = _f("Replayed TTFT at the TTFT percentile (queue for the chunk budget + the steps "
                        "carrying the prompt), milliseconds", ge=0)
    ttft_mean_ms: float = _f("Replayed mean TTFT, milliseconds", ge=0)
    binding: Literal["throughput", "tpot", "ttft"] = _f("What one replica fewer would break: throughput "
                                                        "(the decode load), the TPOT SLO or the TTFT SLO")
    options: StrictInt = _f("(GPU type, TP, batch, chunk) candidates enumerated", ge=1)
    ttft_slo_ms: float | None = _f("--ttft, milliseconds, where the deployment has no prefill pool to record it "
                                   "(deployment.prefill.ttft_slo_ms otherwise); schema 1.14", default=None, gt=0)
    ttft_percentile: float | None = _f("Percentile of TTFT held to the SLO, where the deployment has no prefill "
                                       "pool to record it; schema 1.14", default=None, gt=0, lt=100)

    @model_validator(mode="after")
    def _gpus_are_replicas_times_tp(self) -> AggregatedOut:
        return _gpus_are_groups_times_tp(self, "aggregated", "replicas")


class DisaggregatedInfeasibleOut(_Frozen):
    """Why no disaggregated deployment meets the SLOs (schema 1.14): what binds its prefill pool,
    as an infeasibility record names what binds a decode plan."""

    binding: Literal["ttft", "memory", "gpus"] = _f(
        "ttft: the fastest unqueued prefill + hand-off of any (GPU type, TP) alone misses the TTFT percentile; "
        "memory: no searched (GPU type, TP) holds the weights and one prompt's KV; gpus: no pool within the "
        "GPU budget meets it")
    reason: str = _f("The binding constraint in words (what `--deployment-mode disaggregated` says when it refuses)")
    lowest_ttft_ms: float | None = _f("With binding ttft or gpus: the lowest unqueued TTFT at the percentile "
                                      "(prefill + hand-off), milliseconds", default=None, gt=0)
    handoff_mean_ms: float | None = _f("With binding ttft or gpus: that option's mean KV hand-off to the decode "
                                       "pool (prompt KV over the inter-node link), milliseconds", default=None, ge=0)


class Deployment(_Frozen):
    """How many copies of a plan a target load needs, with GPUs, nodes and cost per hour."""

    target_tokens_per_s: float | None = _f("Requested output throughput, tokens per second", default=None, gt=0)
    target_concurrency: int | None = _f("Requested concurrent requests", default=None, ge=1)
    tokens_per_s_per_copy: float = _f("Output tokens per second of one copy: global_batch / TPOT", gt=0)
    concurrency_per_copy: int = _f("Concurrent requests of one copy (the plan's global_batch)", ge=1)
    copies: int = _f("Copies of the whole plan (every owner with its replicas), rounded up", ge=1)
    tokens_per_s: float = _f("Output throughput of the deployment: copies x tokens_per_s_per_copy", gt=0)
    concurrency: int = _f("Concurrent requests the deployment holds: copies x global_batch", ge=1)
    owners: list[OwnerDeployment] = _f("Per owner: replicas, GPUs, nodes and price in the deployment",
                                       min_length=1)
    gpus_total: int = _f("GPUs in the deployment: copies x the plan's gpus_total", ge=1)
    gpus_by_type: dict[str, int] = _f("GPUs per GPU type")
    nodes_total: int = _f("Nodes in the deployment", ge=1)
    nodes_by_type: dict[str, int] = _f("Nodes per GPU type")
    node_rule: str = _f("How nodes were counted: whole copies per node (stage link intra_node) or nodes "
                        "per owner group")
    usd_per_hour: float = _f("Cost of the decode pool (the whole deployment when mode is absent: decode "
                             "only), USD per hour", ge=0)
    mode: Literal["disaggregated", "aggregated"] | None = _f(
        "The deployment to run: disaggregated (a prefill pool, prefill, beside these decode copies, sized "
        "for the arrivals) or aggregated (the replicas of `aggregated`; schema 1.11); absent: decode only "
        "(prefill not planned); added in schema 1.10. The disaggregated keys are present either way, except "
        "from 1.14 in mode aggregated where no prefill pool meets the TTFT (disaggregated_infeasible) or "
        "--deployment-mode aggregated planned none",
        default=None)
    deployment_mode: Literal["auto", "aggregated"] | None = _f(
        "--deployment-mode when both modes were searched (auto: the cheaper meeting both SLOs; aggregated: "
        "that mode chosen); absent: the disaggregated mode only (as in schema 1.10); schema 1.11",
        default=None)
    aggregated: AggregatedOut | None = _f("The aggregated deployment (absent: none meets both SLOs, or it was "
                                          "not searched); schema 1.11", default=None)
    arrivals: ArrivalsOut | None = _f("The arrivals both pools are sized for; schema 1.10", default=None)
    prefill: PrefillPoolOut | None = _f("The prefill pool; schema 1.10", default=None)
    usd_per_hour_all_in: float | None = _f("Decode + prefill + hand-off, USD per hour (the hand-off link has "
                                           "no price in the catalog: 0); schema 1.10", default=None, ge=0)
    usd_per_million_output_tokens_all_in: float | None = _f(
        "usd_per_hour_all_in per million output tokens at the arrival rate (rate x mean output); schema 1.10",
        default=None, ge=0)
    usd_per_million_output_tokens_decode: float | None = _f("The decode pool's share of it; schema 1.10",
                                                            default=None, ge=0)
    usd_per_million_output_tokens_prefill: float | None = _f("The prefill pool's share of it; schema 1.10",
                                                             default=None, ge=0)
    usd_per_million_input_tokens: float | None = _f(
        "The prefill pool's USD per hour per million prompt tokens at the arrival rate; schema 1.10",
        default=None, ge=0)
    binding_pool: Literal["decode", "prefill"] | None = _f("The pool with the larger cost; schema 1.10",
                                                           default=None)
    mean_occupancy_at_load: float | None = _f(
        "Expected requests resident per decode microbatch at the arrival rate (Little's law with the "
        "evaluator's mean TPOT at that occupancy); schema 1.13", default=None, gt=0)
    tpot_p95_at_load_ms: float | None = _f(
        "Expected p95 TPOT at the arrival rate: the evaluator over a Poisson occupancy of that mean (below "
        "tpot_p95_full_occupancy_ms when the copies are not full); schema 1.13", default=None, gt=0)
    tpot_p95_full_occupancy_ms: float | None = _f(
        "The plan's p95 TPOT with every microbatch full: the SLO guarantee at any load; schema 1.13",
        default=None, gt=0)
    disaggregated_infeasible: DisaggregatedInfeasibleOut | None = _f(
        "Mode aggregated chosen by auto because no prefill pool meets the TTFT SLO: what binds the "
        "disaggregated side (its keys, prefill and the all-in costs, are then absent); schema 1.14",
        default=None)

    @model_validator(mode="after")
    def _pools_come_together(self) -> Deployment:
        keys = ("arrivals", "prefill", "usd_per_hour_all_in", "usd_per_million_output_tokens_all_in",
                "usd_per_million_output_tokens_decode", "usd_per_million_output_tokens_prefill",
                "usd_per_million_input_tokens", "binding_pool")
        given = [getattr(self, k) is not None for k in keys]
        # from 1.14 an aggregated deployment may stand without a prefill pool (none meets the TTFT,
        # or --deployment-mode aggregated did not plan one): then only the arrivals come with mode
        pool_less = self.mode == "aggregated" and given[0] and not any(given[1:])
        if not pool_less and (any(given) != (self.mode is not None) or (self.mode is not None and not all(given))):
            raise ValueError(f"deployment: mode and {', '.join(keys)} come together (a disaggregated deployment)")
        if pool_less:
            agg = self.aggregated
            if agg is not None and (agg.ttft_slo_ms is None or agg.ttft_percentile is None):
                raise ValueError("deployment: an aggregated deployment without a prefill pool records "
                                 "aggregated.ttft_slo_ms and aggregated.ttft_percentile")
            if self.disaggregated_infeasible is None and self.deployment_mode != "aggregated":
                raise ValueError("deployment: mode aggregated without a prefill pool needs "
                                 "disaggregated_infeasible (auto) or deployment_mode aggregated")
        elif self.disaggregated_infeasible is not None:
            raise ValueError("deployment: disaggregated_infeasible comes with mode aggregated and no prefill pool")
        if self.disaggregated_infeasible is not None and self.deployment_mode != "auto":
            raise ValueError("deployment: disaggregated_infeasible comes with deployment_mode auto (both modes searched)")
        if (self.deployment_mode is not None or self.aggregated is not None) and self.mode is None:
            raise ValueError("deployment: deployment_mode and aggregated come with mode (a whole deployment)")
        if self.mode == "aggregated" and self.aggregated is None:
            raise ValueError("deployment: mode aggregated needs deployment.aggregated")
        if self.aggregated is not None and self.deployment_mode is None:
            raise ValueError("deployment: aggregated comes with deployment_mode (both modes searched)")
        return self


class Plan(_Frozen):
    """A feasible decode-serving plan."""

    schema_version: str = _f("MAJOR.MINOR of this file format", pattern=_VERSION_PATTERN)
    model: Name = _f("Model name (no control characters)")
    model_source: Name | None = _f("Path of the config.json the plan was made from (relative to the working "
                                  "directory when under it, else absolute), when it was not a bundled "
                                  "model or Hugging Face id (what simulate and regen reload); added in "
                                  "schema 1.2", default=None)
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
    binding: BindingOut | None = _f(
        "What keeps the plan at its batch (SLO, memory, GPU or node cap) and what the next batch would "
        "take; added in schema 1.9", default=None)
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
    binding: Literal["slo", "memory"] | None = _f(
        "The binding constraint: slo (memory-feasible plans exist, the fastest misses the TPOT SLO) or "
        "memory (no placement holds the weights and KV within the GPU budget); added in schema 1.6",
        default=None)
    lowest_tpot_ms: float | None = _f("With binding slo: the lowest TPOT any memory-feasible plan in the "
                                      "searched space achieves, milliseconds; added in schema 1.6",
                                      default=None, gt=0)


Alternative.model_rebuild()
Plan.model_rebuild()
