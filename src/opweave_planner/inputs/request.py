"""`PlanRequest`: every setting of one search, declared once.

The field name is the setting's one name: the CLI flag is derived from it
(`max_gpus` -> `--max-gpus`), a regen matrix uses it as its key, and the plan
file records the search-space fields under `search.space.<name>`. Values are
validated here and nowhere else; a bad value raises a `UserError` naming the
flag. Adding a setting means adding a field here and using it where it acts.
"""

from __future__ import annotations

import math
import os
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from opweave_planner.errors import UserError
from opweave_planner.inputs import units
from opweave_planner.workload import traces

# Global resident batch sizes: powers of two and three times powers of two.
DEFAULT_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
DEFAULT_TPS = (1, 2, 4, 8)
MAX_BATCH = 1 << 16  # a replica never holds more resident requests than this
MAX_GPU_BUDGET = 4096
DEFAULT_RESERVE_GB = 3.5  # framework + CUDA context + allocator slack per GPU (aiconfigurator's figure)


ARRIVALS = ("poisson", "trace")
DEPLOYMENT_MODES = ("auto", "aggregated", "disaggregated")


class Policy(StrEnum):
    OPWEAVE = "opweave"
    COLOCATED = "colocated"
    AFD = "afd"
    CAD = "cad"


def _setting(description: str, *, flags: tuple[str, ...] = (), default: Any = None, cli: str = "",
             space: bool = False, **kw: Any) -> Any:
    """A request field with its CLI spelling; `space` marks fields recorded as the searched space."""
    extra = {"flags": list(flags), "cli": cli, "space": space}
    return Field(default=default, description=description, json_schema_extra=extra, **kw)


def _split(value: Any) -> Any:
    if isinstance(value, str):
        return tuple(s.strip() for s in value.split(",") if s.strip())
    return value


class PlanRequest(BaseModel):
    """One search: model, SLO, workload, hardware inputs and the limits of the plan family."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    model: str = _setting("Bundled model name, Hugging Face id or path to a config.json",
                          flags=("--model", "-m"), default=...)
    slo: float = _setting("TPOT SLO with a unit: 60ms, 0.06s, 60000us (stored in milliseconds)",
                          default=..., cli="str")
    ctx: int | None = _setting("Context length in tokens, every request at it: 32k = 32768, 1.5k = 1536, or "
                               "131072 (or give --workload)", cli="str")
    prompt_len: int | None = _setting("With --ctx: prompt tokens of a request (default: --ctx minus --output-len); "
                                      "the window a runtime admits is prompt + output", cli="str")
    output_len: int | None = _setting("With --ctx: output tokens of a request (default: --ctx minus --prompt-len)",
                                      cli="str")
    workload: str | None = _setting(
        f"Request lengths instead of one --ctx: a trace ({traces.listing()}), a law .toml, or inline "
        "'lognormal:mean=12k,cv=1.2;"
        "out=geometric:mean=300'; the SLO then holds at --slo-percentile and memory at --kv-quantile")
    scale_ctx: int | None = _setting("Rescale the workload's prompts so that the stationary mean decode context "
                                     "is this many tokens (32k)", cli="str")
    max_model_len: int | None = _setting("Longest request (prompt + output) the runtime admits; longer "
                                         "workload requests are clipped, dropped or truncated (--overflow)", cli="str")
    overflow: str = _setting("What --max-model-len does to a longer request: clip its output, drop it, "
                             "or truncate its prompt (a trace only)",
                             default="clip")
    slo_percentile: float | None = _setting("Percentile of step TPOT that must meet the SLO (with --workload; "
                                            "default 95)", cli="str")
    kv_quantile: float = _setting("Quantile of a replica's summed KV/state that its memory is sized for "
                                  "(with --workload)", default=0.999, cli="str")
    preemptions_per_request: float = _setting(
        "Forced preemptions per served request a replica's KV reserve may cause: the reserve is the "
        "smallest capacity its summed KV crosses that rarely, and never below --kv-quantile's "
        "(with --workload)", default=1e-4, cli="str")
    scenarios: int = _setting("Sampled snapshots of the resident contexts a plan is evaluated on "
                              "(with --workload)", default=256, ge=16, le=65536)
    seed: int = _setting("Seed of those snapshots (same seed: same snapshots, same plan bytes)", default=0,
                         ge=0, le=2**63 - 1)
    gpus: tuple[str, ...] = _setting(
        "GPU types: h100 (homogeneous) or h100,a100 (any mix); default: every profiled type",
        default=(), cli="str", space=True)
    policy: Policy = _setting("opweave | colocated | afd | cad", default=Policy.OPWEAVE, cli="str")
    tensor_parallel_sizes: tuple[int, ...] = _setting(
        "Tensor-parallel degrees searched (comma list)", flags=("--tensor-parallel-sizes", "--tps"),
        default=DEFAULT_TPS, cli="str", space=True)
    batches: tuple[int, ...] = _setting("Global resident batch sizes searched (comma list)",
                                        default=DEFAULT_BATCHES, cli="str", space=True)
    batch_caps: bool = _setting(
        "For one-stage (colocated) plans also search, per GPU configuration and microbatch count, the "
        "largest batch one replica fits in memory and its largest and cheapest SLO-feasible batch "
        "(off: the --batches grid alone)", flags=("--batch-caps/--no-batch-caps",), default=True, space=True)
    max_owners: int = _setting("Most owners (device-group types) per template", default=3, space=True,
                               ge=1, le=8)
    max_microbatches: int = _setting("Most microbatches in flight", default=4, space=True, ge=1, le=64)
    max_replicas: int = _setting("Most replicas per owner", default=4, space=True, ge=1, le=64)
    max_gpus: int = _setting("GPU budget of a plan", default=32, space=True, ge=1, le=MAX_GPU_BUDGET)
    max_stages: int | None = _setting("Most pipeline stages a plan may have (default: no limit)",
                                      space=True, ge=1, le=100_000)
    max_nodes: int | None = _setting("Most nodes a plan may occupy (default: no limit)", space=True,
                                     ge=1, le=MAX_GPU_BUDGET)
    gpus_per_node: int | None = _setting("GPUs per node of the deployment (default: each GPU type's "
                                         "catalog figure; a smaller value also caps TP)", space=True,
                                         ge=1, le=64)
    memory_headroom: float | None = _setting("Share of usable GPU memory kept free: 0.1 or 10% "
                                             "(default 0)", space=True, cli="str")
    prefer_simpler: float | None = _setting(
        "Return the simplest plan (fewest stages, then cheapest, then fewest GPUs) whose cost is "
        "within this share of the optimum: 0.01 or 1% (the optimum is still reported)", space=True,
        cli="str")
    moe_expert_parallel: bool = _setting("Search expert-parallel variants for MoE owners",
                                         flags=("--moe-expert-parallel/--no-moe-expert-parallel",),
                                         default=True, space=True)
    memory_reserve_gb: float | None = _setting(
        f"Per-GPU memory kept for the framework, CUDA context and allocator, GiB (default "
        f"{DEFAULT_RESERVE_GB}, plus NCCL buffers by TP)", flags=("--memory-reserve-gb", "--reserve-gb"),
        space=True, ge=0, le=1024)
    gpu_memory_utilization: float = _setting(
        "Share of each GPU's memory the runtime may use (vLLM's gpu_memory_utilization; default 0.9, "
        "vLLM's EngineArgs default)", default=0.9, space=True, gt=0, le=1)
    moe_routing: str = _setting("MoE kernel tables: power-law (skewed real routing, the default) or "
                                "balanced (uniform routing)", default="power-law", space=True)
    fixed_costs: bool = _setting("Charge each stage a dispatch cost and each hand-off an NCCL call cost "
                                 "(measured per GPU, docs/profiles.md)", flags=("--fixed-costs/--no-fixed-costs",),
                                 default=True, space=True)
    target_tokens_per_s: float | None = _setting(
        "Size a deployment for this output throughput, tokens per second (whole copies of the plan, "
        "rounded up; recorded as the plan's deployment)", gt=0, allow_inf_nan=False)
    target_concurrency: int | None = _setting(
        "Size a deployment for this many concurrent requests (whole copies of the plan, rounded up)",
        ge=1, le=10_000_000)
    ttft: float | None = _setting(
        "TTFT SLO with a unit (1s, 800ms): plan the whole deployment, a prefill pool sized for it beside "
        "the decode pool and the aggregated replicas (--deployment-mode) (needs --request-rate, --arrivals trace or --target-tokens-per-s; "
        "stored in milliseconds)", cli="str")
    ttft_percentile: float | None = _setting("Percentile of TTFT that must meet --ttft (default 95)", cli="str")
    request_rate: float | None = _setting("Poisson arrivals at this many requests per second (with --ttft)",
                                          cli="str")
    arrivals: str = _setting("Arrival process with --ttft: poisson (at --request-rate, or the rate "
                             "--target-tokens-per-s implies) or trace (the --workload trace's timestamps)",
                             default="poisson")
    rate_scale: float | None = _setting("With --arrivals trace: replay the trace this many times faster "
                                        "(default 1)", cli="str")
    deployment_mode: str = _setting("With --ttft: auto (search the aggregated and the disaggregated deployment, "
                                    "the cheaper meeting both SLOs wins), aggregated (chunked prefill inside "
                                    "the decode replicas) or disaggregated (a prefill pool beside the decode "
                                    "copies)", default="auto")
    prices: str | None = _setting("TOML/JSON file: GPU id -> USD per GPU-hour")
    catalog: str | None = _setting("TOML/JSON file adding or overriding GPU types")
    profiles: str | None = _setting("Latency profile folder (default: shipped)")
    backend: str = _setting("Profile backend", default="vllm")
    network_bandwidth: float | None = _setting("Inter-node bandwidth: 32 (GB/s), 4GB/s or 100Gbps "
                                               "(default 32 GB/s)", cli="str")
    network_latency: float | None = _setting("Inter-node latency: 20 (us) or 0.02ms (default 20 us)",
                                             cli="str")
    pareto: bool = _setting("Per-owner network-safe Pareto frontiers (off: exhaustive points)",
                            flags=("--pareto/--no-pareto",), default=True)
    bnb: bool = _setting("Branch-and-bound pruning (off: every candidate simulated)",
                         flags=("--bnb/--no-bnb",), default=True)

    @field_validator("slo", mode="before")
    @classmethod
    def _slo(cls, v: Any) -> float:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if not math.isfinite(v) or v <= 0:
                raise UserError(f"--slo: '{v}' must be a finite positive number of milliseconds")
            return float(v)
        return units.parse_duration_ms(v, "--slo")

    @field_validator("ctx", "prompt_len", "output_len", "scale_ctx", "max_model_len", mode="before")
    @classmethod
    def _tokens(cls, v: Any, info) -> int | None:
        return None if v is None else units.parse_tokens(v, flag_of(info.field_name))

    @field_validator("workload", mode="before")
    @classmethod
    def _workload(cls, v: Any) -> str | None:
        if v is None:
            return None
        from pathlib import Path

        text = str(v).strip()
        try:  # a file is recorded by absolute path; anything odd is left to the reader's input check
            path = Path(text).expanduser()
            return os.path.realpath(path) if path.is_file() else text
        except (OSError, ValueError, RuntimeError):
            return text

    @field_validator("overflow", mode="before")
    @classmethod
    def _overflow(cls, v: Any) -> str:
        from opweave_planner.workload.spec import parse_overflow

        return parse_overflow(v)

    @field_validator("slo_percentile", mode="before")
    @classmethod
    def _percentile(cls, v: Any) -> float | None:
        from opweave_planner.workload.spec import parse_percentile

        return None if v is None else parse_percentile(v, "--slo-percentile")

    @field_validator("kv_quantile", mode="before")
    @classmethod
    def _kv_quantile(cls, v: Any) -> float:
        from opweave_planner.workload.spec import parse_quantile

        return parse_quantile(v, "--kv-quantile")

    @field_validator("preemptions_per_request", mode="before")
    @classmethod
    def _preemptions(cls, v: Any) -> float:
        try:
            x = float(v)
        except (TypeError, ValueError):
            x = math.nan
        if isinstance(v, bool) or not (0 < x < 1):
            raise UserError(f"--preemptions-per-request: expected a number in (0, 1), e.g. 1e-4, got {v!r}")
        return x

    @field_validator("ttft", mode="before")
    @classmethod
    def _ttft(cls, v: Any) -> float | None:
        if v is None:
            return None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if not math.isfinite(v) or v <= 0:
                raise UserError(f"--ttft: '{v}' must be a finite positive number of milliseconds")
            return float(v)
        return units.parse_duration_ms(v, "--ttft")

    @field_validator("ttft_percentile", mode="before")
    @classmethod
    def _ttft_percentile(cls, v: Any) -> float | None:
        from opweave_planner.workload.spec import parse_percentile

        return None if v is None else parse_percentile(v, "--ttft-percentile")

    @field_validator("request_rate", "rate_scale", mode="before")
    @classmethod
    def _positive(cls, v: Any, info) -> float | None:
        if v is None:
            return None
        try:
            x = float(v)
        except (TypeError, ValueError):
            x = math.nan
        if isinstance(v, bool) or not (math.isfinite(x) and x > 0):
            what = "number of requests per second" if info.field_name == "request_rate" else "factor"
            raise UserError(f"{flag_of(info.field_name)}: expected a positive {what}, got {v!r}")
        return x

    @field_validator("arrivals", "deployment_mode", mode="before")
    @classmethod
    def _choice(cls, v: Any, info) -> str:
        choices = ARRIVALS if info.field_name == "arrivals" else DEPLOYMENT_MODES
        text = str(v).strip().lower()
        if text not in choices:
            raise UserError(f"{flag_of(info.field_name)}: '{v}' unknown; expected {', '.join(choices)}")
        return text

    @field_validator("policy", mode="before")
    @classmethod
    def _policy(cls, v: Any) -> Policy:
        try:
            return Policy(str(v).strip().lower())
        except ValueError:
            raise UserError(f"--policy: unknown policy '{v}'; expected one of "
                            f"{', '.join(p.value for p in Policy)}") from None

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, v: Any) -> Any:
        v = _split(v)
        if isinstance(v, (list, tuple)):
            return tuple(dict.fromkeys(str(g).strip().lower() for g in v if str(g).strip()))
        return v

    @field_validator("tensor_parallel_sizes", "batches", mode="before")
    @classmethod
    def _int_lists(cls, v: Any, info) -> Any:
        flag = flag_of(info.field_name)
        v = _split(v)
        if not isinstance(v, (list, tuple)) or not v:
            raise UserError(f"{flag}: expected a non-empty list of positive integers")
        out = []
        for x in v:
            try:
                n = int(x) if isinstance(x, str) else x
            except ValueError:
                n = None
            if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n > MAX_BATCH:
                raise UserError(f"{flag}: '{x}' is not a positive integer up to {MAX_BATCH}")
            out.append(n)
        return tuple(sorted(set(out)))

    @field_validator("tensor_parallel_sizes")
    @classmethod
    def _tps(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        bad = [t for t in v if t not in DEFAULT_TPS]
        if bad:
            raise UserError(f"--tensor-parallel-sizes: {bad[0]} unsupported; expected a subset of 1,2,4,8")
        return v

    @field_validator("network_bandwidth", mode="before")
    @classmethod
    def _bandwidth(cls, v: Any) -> float | None:
        return None if v is None else units.parse_bandwidth_gbps(v, "--network-bandwidth")

    @field_validator("network_latency", mode="before")
    @classmethod
    def _latency(cls, v: Any) -> float | None:
        return None if v is None else units.parse_latency_us(v, "--network-latency")

    @field_validator("moe_routing", mode="before")
    @classmethod
    def _routing(cls, v: Any) -> str:
        text = str(v).strip().lower().replace("_", "-")
        if text not in ("power-law", "balanced"):
            raise UserError(f"--moe-routing: '{v}' unknown; expected power-law or balanced")
        return text

    @field_validator("memory_headroom", "prefer_simpler", mode="before")
    @classmethod
    def _share(cls, v: Any, info) -> float | None:
        return None if v is None else units.parse_share(v, flag_of(info.field_name), below_one=(
            info.field_name == "memory_headroom"))

    @field_validator("memory_reserve_gb", mode="before")
    @classmethod
    def _reserve(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise UserError(f"--memory-reserve-gb: expected a number of GiB, got {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise UserError(f"--memory-reserve-gb: '{v}' must be a finite number of GiB")
        return v

    @field_validator("max_owners", "max_microbatches", "max_replicas", "max_gpus", "max_stages", "scenarios",
                     "seed", mode="before")
    @classmethod
    def _whole(cls, v: Any, info) -> Any:
        if isinstance(v, bool):  # pydantic would read true as 1
            raise UserError(f"{flag_of(info.field_name)}: expected an integer, got {v!r}")
        return v

    @field_validator("moe_expert_parallel", "pareto", "bnb", "batch_caps", mode="before")
    @classmethod
    def _switch(cls, v: Any, info) -> Any:
        if not isinstance(v, bool):  # pydantic would read "no", "off", 0 as false
            raise UserError(f"{flag_of(info.field_name)}: expected true or false, got {v!r}")
        return v

    @field_validator("profiles")
    @classmethod
    def _profiles(cls, v: str | None) -> str | None:
        if v is not None:
            from opweave_planner.data import check_profiles_dir

            check_profiles_dir(v)
        return v

    @model_validator(mode="after")
    def _one_workload(self) -> PlanRequest:
        if self.ctx is not None and self.workload is not None:
            raise UserError("--ctx / --workload: give one of them (a fixed context, or request lengths)")
        if self.ctx is None and self.workload is None:
            raise UserError("--ctx: required (the context length, e.g. 32k), or give --workload")
        if self.ctx is not None:
            for name in WORKLOAD_ONLY:  # given with a value other than its default
                if getattr(self, name) != PlanRequest.model_fields[name].default:
                    raise UserError(f"{flag_of(name)}: only applies with --workload (--ctx is one fixed context)")
            self._lengths_fit()
        else:
            for name in CTX_ONLY:
                if getattr(self, name) is not None:
                    raise UserError(f"{flag_of(name)}: only applies with --ctx (a workload's requests carry "
                                    f"their own lengths)")
            # a bad trace or law fails here, before any search. Without --max-model-len the limit is
            # the model's window (with_model_window): check now, shape once that limit is known.
            # The reader and the shaping cache by the file's stamp and the spec, so the compile
            # room's workload_of reads nothing again.
            from opweave_planner.workload.edge import workload_spec

            workload_spec(workload=self.workload, scale_ctx=self.scale_ctx, max_model_len=self.max_model_len,
                          overflow=self.overflow, shape=self.max_model_len is not None)
        return self

    @model_validator(mode="after")
    def _deployment_settings(self) -> PlanRequest:
        if self.ttft is None:
            for name in ("ttft_percentile", "request_rate", "rate_scale"):
                if getattr(self, name) is not None:
                    raise UserError(f"{flag_of(name)}: only applies with --ttft (a whole deployment)")
            if self.arrivals != "poisson":
                raise UserError("--arrivals: only applies with --ttft (a whole deployment)")
            if self.deployment_mode != "auto":
                raise UserError("--deployment-mode: only applies with --ttft (a whole deployment)")
            return self
        if self.arrivals == "trace":
            if self.workload is None:
                raise UserError("--arrivals trace: needs --workload, a trace file with timestamps")
            for name in ("request_rate", "target_tokens_per_s"):
                if getattr(self, name) is not None:
                    raise UserError(f"{flag_of(name)}: give it or --arrivals trace, not both (a trace has its own "
                                    f"rate; --rate-scale changes it)")
        else:
            if self.rate_scale is not None:
                raise UserError("--rate-scale: only applies with --arrivals trace")
            if self.request_rate is not None and self.target_tokens_per_s is not None:
                raise UserError("--request-rate: give it or --target-tokens-per-s, not both (the rate sets the "
                                "output throughput: rate x mean output)")
            if self.request_rate is None and self.target_tokens_per_s is None:
                raise UserError("--ttft: needs an arrival rate: --request-rate, --arrivals trace or "
                                "--target-tokens-per-s")
        if self.ctx is not None and self.lengths is None:
            raise UserError("--ttft: with --ctx, give --prompt-len and/or --output-len (a prompt's length "
                            "sets its prefill time)")
        if self.workload is not None:
            self._arrivals_readable()
        return self

    def _arrivals_readable(self) -> None:
        """What the prefill pool reads of the workload, checked here, before any search: a law has
        no requests to draw Poisson prompts from, and a trace replayed by its own timestamps needs
        them to span some time."""
        from opweave_planner.workload.spec import LawSpec

        if self.arrivals == "trace":
            from opweave_planner.workload.arrivals import from_trace

            try:
                arr = from_trace(self.workload, self.rate_scale or 1.0)
            except UserError as exc:
                raise UserError(f"--arrivals trace: {exc}") from None
            if arr.times_s.size < 2 or arr.times_s[-1] <= arr.times_s[0]:
                raise UserError(f"--arrivals trace: the timestamps of {self.workload} span no time "
                                f"({arr.times_s.size} timestamped request(s)); expected requests at distinct "
                                f"times (or give --request-rate)")
            return
        from opweave_planner.workload.edge import workload_spec

        if isinstance(workload_spec(workload=self.workload, shape=False), LawSpec):
            given = "--request-rate" if self.request_rate is not None else "--target-tokens-per-s"
            raise UserError(f"{given} with --ttft and --workload: Poisson prompts are drawn from a trace's "
                            f"requests; {self.workload} is a length law (give a trace file)")

    def _lengths_fit(self) -> None:
        """One of --prompt-len / --output-len takes the rest of --ctx; both must leave a token each."""
        p, o = self.prompt_len, self.output_len
        if p is None and o is None:
            return
        if p is not None and o is not None:
            return
        given, name = (p, "prompt_len") if p is not None else (o, "output_len")
        if given >= self.ctx:
            raise UserError(f"{flag_of(name)}: {given} tokens leaves no room in --ctx {self.ctx} for the "
                            f"{'output' if p is not None else 'prompt'}; give both --prompt-len and --output-len")

    @model_validator(mode="after")
    def _budget_holds_the_policy(self) -> PlanRequest:
        # every afd / cad plan has two owners of at least one GPU each (max_owners limits
        # only opweave's templates)
        need = 2 if self.policy in (Policy.AFD, Policy.CAD) else 1
        if self.max_gpus < need:
            raise UserError(f"--max-gpus: {self.max_gpus} GPU is below the {need} every "
                            f"{self.policy.value} plan needs (two owners of at least one GPU each)")
        return self

    # ------------------------------------------------------------------ derived views
    @property
    def slo_ms(self) -> float:
        return self.slo

    @property
    def stochastic(self) -> bool:
        """Planning for a distribution of contexts (--workload), not one --ctx."""
        return self.workload is not None

    @property
    def percentile(self) -> float:
        """The SLO percentile in effect (95 with a workload unless given; 100: a fixed context)."""
        if self.workload is None:
            return 100.0
        return 95.0 if self.slo_percentile is None else self.slo_percentile

    @property
    def disaggregated(self) -> bool:
        """A whole deployment: a prefill pool under a TTFT SLO beside the decode pool (--ttft)."""
        return self.ttft is not None

    @property
    def ttft_at(self) -> float:
        """The TTFT percentile in effect (95 unless given)."""
        return 95.0 if self.ttft_percentile is None else self.ttft_percentile

    @property
    def lengths(self) -> tuple[int, int] | None:
        """(prompt, output) tokens of a fixed-context request when either was given, else None."""
        if self.ctx is None or (self.prompt_len is None and self.output_len is None):
            return None
        p = self.prompt_len if self.prompt_len is not None else self.ctx - self.output_len
        o = self.output_len if self.output_len is not None else self.ctx - self.prompt_len
        return p, o

    @property
    def reserve_gb(self) -> float:
        """The per-GPU reserve in effect (the default when not given)."""
        return DEFAULT_RESERVE_GB if self.memory_reserve_gb is None else self.memory_reserve_gb

    def space_record(self) -> dict[str, Any]:
        """The searched space as the plan file records it (`search.space`)."""
        out = {name: getattr(self, name) for name in space_fields()}
        out["memory_reserve_gb"] = self.reserve_gb
        return out


# settings that describe a workload: refused with --ctx unless left at their default
WORKLOAD_ONLY = ("scale_ctx", "max_model_len", "overflow", "slo_percentile", "kv_quantile",
                 "preemptions_per_request", "scenarios", "seed")
# settings of a fixed context: refused with --workload
CTX_ONLY = ("prompt_len", "output_len")
# settings of the whole deployment, beside the decode search
DEPLOYMENT_ONLY = ("ttft", "ttft_percentile", "request_rate", "arrivals", "rate_scale", "deployment_mode")


def with_model_window(req: PlanRequest, max_context: int | None) -> PlanRequest:
    """A workload without --max-model-len gets the model's window, as a runtime's default does;
    a larger --max-model-len is an error."""
    if not req.stochastic or not max_context:
        return req
    if req.max_model_len is None:
        return make_request(**{**dict(req), "max_model_len": max_context})
    if req.max_model_len > max_context:
        raise UserError(f"--max-model-len: {req.max_model_len} tokens exceeds the model's "
                        f"max_position_embeddings ({max_context})")
    return req


def field_meta(name: str) -> dict[str, Any]:
    extra = PlanRequest.model_fields[name].json_schema_extra
    return extra if isinstance(extra, dict) else {}


def flag_of(name: str) -> str:
    """The CLI spelling of a field (its first flag)."""
    flags = field_meta(name).get("flags") or [f"--{name.replace('_', '-')}"]
    return flags[0].split("/")[0]


def space_fields() -> tuple[str, ...]:
    return tuple(n for n in PlanRequest.model_fields if field_meta(n).get("space"))


def make_request(**values: Any) -> PlanRequest:
    """Validate user values into a PlanRequest; the first problem becomes one `UserError` line.

    None values mean "not given" (the field's default applies), so the CLI, a matrix entry
    and a library caller can all pass only what they set.
    """
    given = {k: v for k, v in values.items() if v is not None}
    unknown = sorted(set(given) - set(PlanRequest.model_fields))
    if unknown:
        raise UserError(f"unknown setting '{unknown[0]}'; expected one of "
                        f"{', '.join(PlanRequest.model_fields)}")
    try:
        return PlanRequest(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "request"
        flag = flag_of(name) if name in PlanRequest.model_fields else name
        got = err.get("input")
        raise UserError(f"{flag}: {err['msg'].lower()} (got {got!r})") from None
