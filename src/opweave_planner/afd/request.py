"""The settings of `afd ratio` and `afd simulate`, each declared once and validated here.

The CLI's options are generated from these fields (`cli/options.py`), as the planner's are from
`PlanRequest`: the field name is the flag (`attn_gpu` -> `--attn-gpu`) unless a field lists its
own. Only pydantic and the standard library load at import, so `afd --help` stays fast; what
needs numpy (coefficients, laws, traces) is built from a request by the command.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from opweave_planner.errors import UserError
from opweave_planner.inputs.request import MAX_BATCH, MAX_GPU_BUDGET
from opweave_planner.inputs.units import parse_tokens
from opweave_planner.workload import traces

MAX_RATIO = MAX_GPU_BUDGET  # attention instances per FFN: the planner's GPU budget bound
MAX_BATCHES_IN_FLIGHT = 64
MAX_SEED = (1 << 63) - 1
DEFAULT_RATIOS = (1, 2, 4, 8, 16, 24, 32)
COEFFICIENTS = ("alpha_a", "beta_a", "alpha_f", "beta_f", "alpha_c", "beta_c")
CALIBRATION = ("attn_gpu", "ffn_gpu", "attn_tp", "ffn_tp", "ep", "context", "profiles", "backend")
"""The settings that only apply with --model (profile calibration)."""

_PAPER = "(default: the paper's Section 5.2 value)"


def check_count(name: str, value: int, minimum: int = 1, maximum: int | None = None) -> int:
    """An integer in [minimum, maximum], or a UserError naming it."""
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise UserError(f"{name}: expected an integer >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise UserError(f"{name}: expected an integer <= {maximum}, got {value}")
    return int(value)


def check_seed(seed: int, name: str = "seed") -> int:
    """A seed numpy accepts and JSON can carry: 0 <= seed < 2^63."""
    return check_count(name, seed, 0, MAX_SEED)


def _ratios(value: Any, integers: bool) -> tuple:
    """'1,2,8' (or a sequence) -> the positive ratios of --r, none above MAX_RATIO."""
    kind = "positive integers" if integers else "positive numbers"
    parts = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for part in parts:
        text = part.strip() if isinstance(part, str) else str(part)
        try:
            number = int(text) if integers else float(text)
        except ValueError:
            raise UserError(f"--r: expected comma-separated {kind}, got {text!r}") from None
        if not 0 < number < float("inf"):
            raise UserError(f"--r: expected comma-separated {kind}, got {text!r}")
        if number > MAX_RATIO:
            raise UserError(f"--r: {text} attention instances per FFN is above the {MAX_RATIO} a bundle can have")
        out.append(number)
    if not out:
        raise UserError(f"--r: expected comma-separated {kind}")
    return tuple(out)


class AfdSetup(BaseModel):
    """What both commands share: the batch, the latency coefficients (given, the paper's, or
    calibrated from profiles with --model) and the workload (two length laws or a trace)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch: int = Field(256, description="Requests per attention microbatch B.",
                       json_schema_extra={"flags": ["--batch", "-B"]})
    alpha_a: float | None = Field(None, description=f"Attention time per token {_PAPER}.")
    beta_a: float | None = Field(None, description=f"Attention fixed time {_PAPER}.")
    alpha_f: float | None = Field(None, description=f"FFN time per request {_PAPER}.")
    beta_f: float | None = Field(None, description=f"FFN fixed time {_PAPER}.")
    alpha_c: float | None = Field(None, description=f"A<->F transfer time per request {_PAPER}.")
    beta_c: float | None = Field(None, description=f"A<->F transfer fixed time {_PAPER}.")
    prompt_mean: float = Field(100.0, description="Mean prompt length (parametric workload).")
    prompt_dist: str = Field("geometric", description="Prompt length law: geometric (on 1,2,...) or fixed.")
    decode_mean: float = Field(500.0, description="Mean decode lifetime in steps (parametric workload).")
    decode_dist: str = Field("geometric", description="Decode lifetime law: geometric (on 1,2,...) or fixed.")
    trace: str | None = Field(None, description=(
        f"Request trace ({traces.listing()}, recognised from its header); replaces the parametric "
        "workload."))
    model: str | None = Field(None, description=(
        "Calibrate the coefficients from profiles for this model (instead of --alpha-*/--beta-*)."),
        json_schema_extra={"flags": ["--model", "-m"]})
    attn_gpu: str | None = Field(None, description="GPU of attention instances.")
    ffn_gpu: str | None = Field(None, description="GPU of the FFN instance (default: --attn-gpu).")
    attn_tp: int = Field(1, description="TP degree per attention instance.")
    ffn_tp: int = Field(1, description="TP degree of the FFN instance.")
    ep: bool = Field(False, description="MoE experts split across the FFN's TP group.",
                     json_schema_extra={"flags": ["--ep"]})
    context: int = Field(32768, description="Largest per-request context sampled, in tokens: 32k = 32768.",
                         json_schema_extra={"flags": ["--ctx"], "cli": "str"})
    profiles: str | None = Field(None, description="Profile folder (default: shipped).")
    backend: str = Field("vllm", description="Profile backend.")

    @field_validator("batch")
    @classmethod
    def _batch(cls, v: int) -> int:
        if not 1 <= v <= MAX_BATCH:
            raise UserError(f"--batch: expected an integer in [1, {MAX_BATCH}], got {v}")
        return v

    @field_validator("attn_tp", "ffn_tp")
    @classmethod
    def _tp(cls, v: int, info) -> int:
        return check_count(_flag(info.field_name), v)

    @field_validator("context", mode="before")
    @classmethod
    def _context(cls, v: Any) -> int:
        return parse_tokens(v, "--ctx")

    @model_validator(mode="after")
    def _one_source_of_coefficients(self) -> AfdSetup:
        given = [_flag(n) for n in CALIBRATION if n in self.model_fields_set
                 and getattr(self, n) is not None and getattr(self, n) is not False]
        if self.model is None:
            if given:
                raise UserError(f"{', '.join(given)}: only apply with --model (profile calibration)")
            return self
        explicit = [_flag(n) for n in COEFFICIENTS if getattr(self, n) is not None]
        if explicit:
            raise UserError(f"--model and {', '.join(explicit)}: give the coefficients directly or calibrate "
                            "them from profiles, not both")
        if self.attn_gpu is None:
            raise UserError("--model: also give --attn-gpu (and --ffn-gpu if it differs)")
        return self

    @model_validator(mode="after")
    def _laws(self) -> AfdSetup:
        """The two length laws of a parametric workload (a trace replaces them)."""
        if self.trace is not None:
            return self
        from typing import get_args

        from opweave_planner.workload.sampling import DistKind, LengthDist

        for flag, kind, mean in (("--prompt", self.prompt_dist, self.prompt_mean),
                                 ("--decode", self.decode_dist, self.decode_mean)):
            if kind not in get_args(DistKind):
                raise UserError(f"{flag}-dist: expected {' or '.join(get_args(DistKind))}, got {kind!r}")
            try:
                LengthDist(kind, mean)
            except UserError as exc:
                raise UserError(f"{flag}-mean: {exc}") from None
        return self

    def coefficients(self) -> dict[str, float | None]:
        """The six coefficients as given (None: the paper's value applies)."""
        return {k: getattr(self, k) for k in COEFFICIENTS}


def _flag(name: str) -> str:
    """How the CLI spells a field (the rule of `cli/options.flag`: its first flag, else --the-name)."""
    extra = AfdSetup.model_fields[name].json_schema_extra or {}
    return extra.get("flags", [f"--{name.replace('_', '-')}"])[0]


class RatioRequest(AfdSetup):
    """`afd ratio`: the optimal ratio rules and a table over r."""

    r: tuple[float, ...] = Field(DEFAULT_RATIOS, description="Ratios for the table, comma-separated.",
                                 validate_default=True)

    @field_validator("r", mode="before")
    @classmethod
    def _r(cls, v: Any) -> tuple:
        return _ratios(v, integers=False)


class SimulateRequest(AfdSetup):
    """`afd simulate`: the bundle simulation per r, or with --mc the barrier Monte Carlo."""

    r: tuple[int, ...] = Field(DEFAULT_RATIOS, description="Attention instances per FFN, comma-separated integers.",
                               validate_default=True)
    requests: int = Field(10_000, description="Completed requests per attention instance.")
    seed: int = Field(0, description="Random seed; the same seed gives the same output.")
    batches_in_flight: int = Field(2, description="Batches cycling through A and F (paper: 2).")
    start: str = Field("stationary", description="Initial slots: stationary or cold (all fresh).")
    mc: bool = Field(False, description="Monte Carlo barrier overhead (Table 1) instead.",
                     json_schema_extra={"flags": ["--mc"]})
    trials: int = Field(50_000, description="Monte Carlo trials per r (with --mc).")

    @field_validator("r", mode="before")
    @classmethod
    def _r(cls, v: Any) -> tuple:
        return _ratios(v, integers=True)

    @field_validator("seed")
    @classmethod
    def _seed(cls, v: int) -> int:
        return check_seed(v, "--seed")

    @model_validator(mode="after")
    def _in_flight(self) -> SimulateRequest:
        if not self.mc and not 1 <= self.batches_in_flight <= MAX_BATCHES_IN_FLIGHT:
            raise UserError(f"--batches-in-flight: expected an integer in [1, {MAX_BATCHES_IN_FLIGHT}], "
                            f"got {self.batches_in_flight}")
        return self
