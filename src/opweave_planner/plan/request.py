"""The one table between a request and its plan file: PlanRequest field, plan key, since-minor, words.

Every setting a plan records is one row. From the rows come the `search.space` model
(`schema.SpaceOut`), the version stamp of its keys (`io.schema_version_for`), what a plan file
says its request was (`recorded_values`, behind `contract.recorded_request`), the key an error
about a recorded flag names (`FLAG_AT`) and the words `diff` uses (`DIFF_WORDS`). Recording a
new setting takes its PlanRequest field, one row here, and the code that acts on it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from opweave_planner.inputs.request import flag_of

__all__ = ["TABLE", "Recorded", "SPACE", "SPACE_ROWS", "FLAG_AT", "DIFF_WORDS", "value_at", "space_values",
           "recorded_values"]

SPACE = "search.space."
_DIST = "workload.distribution."
_GE1 = {"ge": 1}


class Recorded(NamedTuple):
    """One recorded setting.

    `field`: the PlanRequest field (None: a figure the plan derives that diff still names, or a
    space key no flag sets); `at`: its dotted key in a plan file; `since`: the 1.x MINOR that
    added the key (a `search.space` key added after 1.0 is optional: older files lack it);
    `words`: how diff names a change of it (None: diff's request line leaves it out). `about` and
    `bounds` are a `search.space` key's description and constraints in the file (its type is the
    strict twin of the field's, `schema._STRICT`; the other keys are declared by their models).
    """

    field: str | None
    at: str
    since: int = 0
    words: str | None = None
    about: str = ""
    bounds: dict[str, float] | None = None


TABLE = (
    Recorded("model", "model", 0, "model"),
    Recorded("policy", "policy", 0, "policy"),
    Recorded("slo", "workload.tpot_slo_ms", 0, "SLO ms"),
    Recorded("ctx", "workload.context_tokens", 0, "ctx"),
    Recorded("prompt_len", "workload.prompt_tokens", 7, "prompt-len"),
    Recorded("output_len", "workload.output_tokens", 7, "output-len"),
    Recorded("workload", _DIST + "workload", 3, "workload"),
    Recorded(None, _DIST + "sha256", 3, "trace sha256"),
    Recorded(None, _DIST + "prompt", 3, "prompt law"),
    Recorded(None, _DIST + "output", 3, "output law"),
    Recorded("scale_ctx", _DIST + "scale_ctx", 3, "scale-ctx"),
    Recorded("max_model_len", _DIST + "max_model_len", 3, "max-model-len"),
    Recorded("overflow", _DIST + "overflow", 3, "overflow"),
    Recorded("slo_percentile", _DIST + "slo_percentile", 3, "slo-percentile"),
    Recorded("kv_quantile", _DIST + "kv_quantile", 3, "kv-quantile"),
    Recorded("preemptions_per_request", _DIST + "preemptions_per_request", 8, "preemptions-per-request"),
    Recorded("scenarios", _DIST + "scenarios", 3, "scenarios"),
    Recorded("seed", _DIST + "seed", 3, "seed"),
    Recorded("gpus", SPACE + "gpus", about="GPU types searched"),
    Recorded("tensor_parallel_sizes", SPACE + "tensor_parallel_sizes", about="TP degrees searched"),
    Recorded("batches", SPACE + "batches", about="Global resident batch sizes searched"),
    Recorded("batch_caps", SPACE + "batch_caps", 12,
             about="false: only `batches` were searched (absent: from 1.12 on, each configuration's memory "
                   "and SLO batch caps too, docs/search.md#batches)"),
    Recorded("max_owners", SPACE + "max_owners", about="Most owners per template", bounds=_GE1),
    Recorded("max_microbatches", SPACE + "max_microbatches", about="Most microbatches in flight", bounds=_GE1),
    Recorded("max_replicas", SPACE + "max_replicas", about="Most replicas per owner", bounds=_GE1),
    Recorded("max_gpus", SPACE + "max_gpus", about="GPU budget of a plan", bounds=_GE1),
    Recorded("max_stages", SPACE + "max_stages", 2, bounds=_GE1,
             about="Most pipeline stages a plan may have (absent: no limit)"),
    Recorded("max_nodes", SPACE + "max_nodes", 2, bounds=_GE1,
             about="Most nodes a plan may occupy (absent: no limit)"),
    Recorded("gpus_per_node", SPACE + "gpus_per_node", 2, bounds=_GE1,
             about="GPUs per node of the deployment (absent: each GPU type's catalog figure)"),
    Recorded("memory_headroom", SPACE + "memory_headroom", 2, bounds={"ge": 0, "lt": 1},
             about="Share of usable GPU memory kept free (absent: 0)"),
    Recorded("prefer_simpler", SPACE + "prefer_simpler", 2, bounds={"ge": 0},
             about="The plan is the simplest (fewest stages, then cheapest, then fewest GPUs) within this "
                   "share of the optimum, which is listed under alternatives.optimum"),
    Recorded("moe_expert_parallel", SPACE + "moe_expert_parallel",
             about="Expert-parallel variants searched for MoE owners"),
    Recorded("gpu_memory_utilization", SPACE + "gpu_memory_utilization", 2, bounds={"gt": 0, "le": 1},
             about="Share of each GPU's memory the runtime may use (vLLM's gpu_memory_utilization)"),
    Recorded("moe_routing", SPACE + "moe_routing", 2, about="MoE kernel tables used: power-law or balanced"),
    Recorded("fixed_costs", SPACE + "fixed_costs", 2,
             about="Stages and hand-offs were charged their fixed dispatch / NCCL call costs"),
    Recorded("memory_reserve_gb", SPACE + "memory_reserve_gb", bounds={"ge": 0},
             about="Per-GPU memory held back for framework/CUDA context inside the runtime's budget, GiB "
                   "(NCCL buffers by TP come on top); the largest of memory_reserve_gb_by_gpu when that is "
                   "present"),
    Recorded(None, SPACE + "memory_reserve_gb_by_gpu", 5),  # declared in schema.py: no flag sets it
    Recorded("ttft", "deployment.prefill.ttft_slo_ms", 10, "TTFT SLO ms"),
    Recorded("ttft_percentile", "deployment.prefill.ttft_percentile", 10, "ttft-percentile"),
    Recorded("request_rate", "deployment.arrivals.request_rate", 10, "request-rate"),
    Recorded("arrivals", "deployment.arrivals.process", 10, "arrivals"),
    Recorded("rate_scale", "deployment.arrivals.rate_scale", 10, "rate-scale"),
    Recorded("target_tokens_per_s", "deployment.arrivals.target_tokens_per_s", 10, "target-tokens-per-s"),
    Recorded("deployment_mode", "deployment.deployment_mode", 11, "deployment-mode"),
    Recorded("backend", "provenance.backend"),
    Recorded("network_bandwidth", "provenance.network.inter_node_gbps"),
    Recorded("network_latency", "provenance.network.inter_node_latency_us"),
)

SPACE_ROWS = tuple(r for r in TABLE if r.at.startswith(SPACE))
#: flag -> the plan key that records it (an error about a recorded value names the key)
FLAG_AT = {flag_of(r.field): r.at for r in TABLE if r.field}
#: (plan key, words) of the request settings a diff names, in this order
DIFF_WORDS = tuple((r.at, r.words) for r in TABLE if r.words)


def value_at(doc: Any, dotted: str) -> Any:
    """The value at a dotted key of a plan (a model or its JSON); None where it is absent."""
    for key in dotted.split("."):
        doc = doc.get(key) if isinstance(doc, dict) else getattr(doc, key, None)
    return doc


def space_values(req) -> dict[str, Any]:
    """The searched space as a plan records it, from a PlanRequest (the reserve in effect: a
    record says what the search held back, never "the default")."""
    out = {r.field: getattr(req, r.field) for r in SPACE_ROWS if r.field}
    out["memory_reserve_gb"] = req.reserve_gb
    out["batch_caps"] = None if req.batch_caps else False  # recorded only when off (absent: on)
    return out


def recorded_values(doc) -> dict[str, Any]:
    """The PlanRequest values a plan file records, read at the table's keys (None: the file does
    not record it, so the field's default applies)."""
    values = {r.field: value_at(doc, r.at) for r in TABLE if r.field}
    values["model"] = getattr(doc, "model_source", None) or values["model"]  # the file it was made from
    if value_at(doc, _DIST.rstrip(".")) is not None:
        values["ctx"] = None  # a workload's longest request: derived, not a setting
    if values["ttft"] is None and value_at(doc, "deployment.aggregated.ttft_slo_ms") is not None:
        # an aggregated deployment without a prefill pool records the TTFT SLO itself (1.14)
        values["ttft"] = value_at(doc, "deployment.aggregated.ttft_slo_ms")
        values["ttft_percentile"] = value_at(doc, "deployment.aggregated.ttft_percentile")
    if values["deployment_mode"] is None and value_at(doc, "deployment.mode") is not None:
        values["deployment_mode"] = "disaggregated"  # a whole deployment without the key: that mode only (1.10)
    if value_at(doc, SPACE + "memory_reserve_gb_by_gpu") is not None:
        values["memory_reserve_gb"] = None  # the catalog's own reserve, per GPU type
    return values
