"""The workload's grammar and its frozen specs: user text validated once, at the edge, into
hashable values that sit inside the frozen search request.

Token counts go through the package's one grammar, :func:`opweave_planner.inputs.units.
parse_tokens` (``131072``, ``32k``, ``1.5k``; k = 1024; a whole, positive count); law means may
be fractional. Specs only: edge.py reads the files they name, shaping.py materialises them.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal, get_args

import numpy as np
from pydantic import Field, model_validator

from opweave_planner.errors import UserError
from opweave_planner.frozen import Frozen
from opweave_planner.workload.traces import suffixes

__all__ = [
    "named_file",
    "LAW_TAIL", "MAX_SUPPORT", "OVERFLOWS", "FixedContextSpec", "LawSpec", "LengthLaw", "TraceSpec",
    "WorkloadSpec", "is_inline_law", "parse_law", "parse_law_file", "parse_overflow", "parse_percentile",
    "parse_quantile",
]

Overflow = Literal["clip", "drop", "truncate"]
#: what --max-model-len may do to a longer request (truncate: traces only, see fit_requests)
OVERFLOWS: tuple[str, ...] = get_args(Overflow)
Dist = Literal["fixed", "geometric", "lognormal"]

#: probability mass of an unbounded law beyond which its support is cut (mass moved onto the cut)
LAW_TAIL = 1e-9
#: the longest dense context vector we build (64 MiB of float64); longer needs --max-model-len
MAX_SUPPORT = 1 << 23


# --------------------------------------------------------------------------- grammar

# real-valued token counts (law means: ``geometric:mean=300.5``, ``lognormal:mean=1.5k``)
_TOKENS_REAL = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([kKmM]?)\s*")


def _number(value: object, field: str) -> float:
    if isinstance(value, bool):
        raise UserError(f"{field}: {value!r} is not a number")
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise UserError(f"{field}: {value!r} is not a number") from None
    if not math.isfinite(x):
        raise UserError(f"{field}: {value!r} is not a finite number")
    return x


def _inside(value: str | float, field: str, top: float, example: str) -> float:
    """A number strictly inside (0, top)."""
    x = _number(value, field)
    if not 0.0 < x < top:
        raise UserError(f"{field}: {value!r} is outside (0, {top:g}); expected e.g. {example}")
    return x


def parse_percentile(value: str | float, field: str = "--slo-percentile") -> float:
    """A percentile strictly inside (0, 100), e.g. ``95`` or ``'99.9'``."""
    return _inside(value, field, 100.0, "95")


def parse_overflow(value: str, field: str = "--overflow") -> str:
    """One of :data:`OVERFLOWS`, case-insensitive."""
    text = str(value).strip().lower()
    if text not in OVERFLOWS:
        raise UserError(f"{field}: {value!r} unknown; expected {' or '.join(OVERFLOWS)}")
    return text


def parse_quantile(value: str | float, field: str = "--kv-quantile") -> float:
    """A quantile level strictly inside (0, 1), e.g. ``0.999``."""
    return _inside(value, field, 1.0, "0.999")


# --------------------------------------------------------------------------- specs


class LengthLaw(Frozen):
    """A length law on the integers: ``fixed`` (the mean itself), ``geometric`` on {1, 2, ...}
    with the given mean, or ``lognormal`` with the given mean and coefficient of variation,
    rounded to the nearest integer (and at least the law's minimum: 0 for prompts, 1 for
    outputs). Unbounded laws are cut at their ``1 - LAW_TAIL`` quantile, the tail mass moved
    onto the cut (documented in docs/workloads.md)."""

    dist: Dist
    mean: float = Field(ge=0)
    cv: float | None = None

    def label(self) -> str:
        cv = f",cv={self.cv:g}" if self.cv is not None else ""
        return f"{self.dist}:mean={self.mean:g}{cv}"

    def pmf(self, minimum: int, cap: int | None = None) -> np.ndarray:
        """Probabilities of the values ``0..len-1`` (the support is cut at ``cap`` if given,
        the mass above moved onto it)."""
        if self.dist == "fixed":
            k = int(self.mean)
            out = np.zeros(k + 1)
            out[k] = 1.0
        elif self.dist == "geometric":
            p = 1.0 / self.mean
            if p >= 1.0:
                out = np.array([0.0, 1.0])
            else:
                hi = math.ceil(math.log(LAW_TAIL) / math.log1p(-p)) + 1
                if cap is not None:
                    hi = min(hi, cap)
                if hi + 1 > MAX_SUPPORT:
                    raise UserError(f"{self.label()}: support too wide; give --max-model-len")
                k = np.arange(hi + 1, dtype=np.float64)
                out = p * np.exp((k - 1.0) * math.log1p(-p))
                out[0] = 0.0
                out[hi] = 0.0
                out[hi] = max(0.0, 1.0 - out.sum())  # the tail P(X >= hi) onto hi
        else:
            from scipy.stats import lognorm

            s2 = math.log1p(float(self.cv) ** 2)
            dist = lognorm(s=math.sqrt(s2), scale=math.exp(math.log(self.mean) - s2 / 2))
            hi = max(minimum, math.ceil(dist.isf(LAW_TAIL)))
            if cap is not None:
                hi = min(hi, cap)
            if hi + 1 > MAX_SUPPORT:
                raise UserError(f"{self.label()}: support too wide; give --max-model-len")
            edges = dist.cdf(np.arange(hi + 1, dtype=np.float64) + 0.5)
            out = np.diff(edges, prepend=0.0)
            out[minimum] += out[:minimum].sum()
            out[:minimum] = 0.0
            out[hi] += max(0.0, 1.0 - out.sum())
        if cap is not None and out.size > cap + 1:
            out[cap] += out[cap + 1 :].sum()
            out = out[: cap + 1]
        return out


class FixedContextSpec(Frozen):
    """``--ctx``: every resident request at exactly this context (today's behaviour)."""

    kind: Literal["fixed"] = "fixed"
    context: int = Field(gt=0)


class _Shaped(Frozen):
    scale_ctx: int | None = Field(default=None, gt=0)
    max_model_len: int | None = Field(default=None, gt=1)
    overflow: Overflow = "clip"


class TraceSpec(_Shaped):
    """A request trace file, identified by its content hash (re-read and checked on use)."""

    kind: Literal["trace"] = "trace"
    path: str
    format: str
    sha256: str
    rows: int


class LawSpec(_Shaped):
    """Independent prompt and output length laws."""

    kind: Literal["law"] = "law"
    prompt: LengthLaw
    output: LengthLaw

    @model_validator(mode="after")
    def _no_truncate(self) -> LawSpec:
        if self.overflow == "truncate":
            # truncation ties the served prompt to the output; the law path convolves independent ones
            raise UserError("--overflow truncate: applies to a request trace; a length law takes clip or drop")
        return self


WorkloadSpec = Annotated[FixedContextSpec | TraceSpec | LawSpec, Field(discriminator="kind")]


def _law(dist: str, params: dict[str, str], field: str, minimum: int) -> LengthLaw:
    if dist not in ("fixed", "geometric", "lognormal"):
        raise UserError(f"{field}: unknown law {dist!r}; expected fixed, geometric or lognormal")
    allowed = {"mean", "cv"} if dist == "lognormal" else {"mean"}
    extra = sorted(set(params) - allowed)
    if extra:
        raise UserError(f"{field}: {dist} takes {', '.join(sorted(allowed))}, not {extra[0]}")
    if "mean" not in params:
        raise UserError(f"{field}: {dist} needs mean=..., e.g. {dist}:mean=12k")
    raw = params["mean"]
    if dist == "fixed":
        mean = 0.0 if str(raw).strip() == "0" else _tokens_real(raw, field)
        if mean != int(mean) or mean < minimum:
            raise UserError(f"{field}: fixed length {raw} must be a whole number >= {minimum}")
        return LengthLaw(dist="fixed", mean=mean)
    mean = _tokens_real(raw, field)
    if dist == "geometric" and mean < 1:
        raise UserError(f"{field}: geometric mean {raw} must be >= 1 (support 1, 2, ...)")
    cv = None
    if dist == "lognormal":
        if "cv" not in params:
            raise UserError(f"{field}: lognormal needs cv=..., e.g. lognormal:mean=12k,cv=1.2")
        cv = _number(params["cv"], f"{field} cv")
        if cv <= 0:
            raise UserError(f"{field}: cv {params['cv']} must be positive")
    return LengthLaw(dist=dist, mean=mean, cv=cv)  # type: ignore[arg-type]


def _tokens_real(raw: object, field: str) -> float:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        x = float(raw)
    else:
        m = _TOKENS_REAL.fullmatch(str(raw))
        if not m:
            raise UserError(f"{field}: mean {raw!r} is not a token count; expected e.g. 12k")
        x = float(m.group(1)) * {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]
    if not math.isfinite(x) or x <= 0:
        raise UserError(f"{field}: mean {raw!r} must be positive")
    return x


def _law_text(text: str, field: str, minimum: int) -> LengthLaw:
    dist, _, rest = text.strip().partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            if params or "mean" in params:
                raise UserError(f"{field}: expected key=value in {text!r}")
            key, value = "mean", key
        params[key.strip().lower()] = value.strip()
    return _law(dist.strip().lower(), params, field, minimum)


def parse_law(text: str, field: str = "--workload") -> tuple[LengthLaw, LengthLaw]:
    """Inline law: ``[prompt=]LAW;out[put]=LAW`` with ``LAW = DIST:mean=N[,cv=C]`` or
    ``DIST:N``, e.g. ``lognormal:mean=12k,cv=1.2;out=geometric:mean=300``."""
    parts = [s.strip() for s in text.split(";") if s.strip()]
    laws: dict[str, LengthLaw] = {}
    for i, part in enumerate(parts):
        key, eq, rest = part.partition("=")
        if eq and ":" not in key:
            name = key.strip().lower()
        elif i == 0:
            name, rest = "prompt", part
        else:
            raise UserError(f"{field}: expected prompt=LAW;out=LAW, got {part!r}")
        name = {"prompt": "prompt", "in": "prompt", "input": "prompt", "out": "output",
                "output": "output"}.get(name, name)
        if name not in ("prompt", "output") or name in laws:
            raise UserError(f"{field}: expected one prompt= and one out= law, got {part!r}")
        laws[name] = _law_text(rest, f"{field} {name}", 0 if name == "prompt" else 1)
    if set(laws) != {"prompt", "output"}:
        raise UserError(
            f"{field}: {text!r} needs a prompt and an output law, "
            "e.g. lognormal:mean=12k,cv=1.2;out=geometric:mean=300"
        )
    return laws["prompt"], laws["output"]


def parse_law_file(path: Path, field: str) -> tuple[LengthLaw, LengthLaw]:
    """A ``.toml`` law file: a ``[prompt]`` and an ``[output]`` table, each ``dist = ...`` and
    the law's parameters (examples/traces/law-mooncake-like.toml)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{field} {path}: cannot read as TOML ({exc})") from None
    laws = []
    for name, minimum in (("prompt", 0), ("output", 1)):
        table = data.get(name)
        if not isinstance(table, dict) or "dist" not in table:
            raise UserError(f"{field} {path}: expected a [{name}] table with dist = ...")
        params = {k: v for k, v in table.items() if k != "dist"}
        laws.append(_law(str(table["dist"]).lower(), params, f"{field} {path} [{name}]", minimum))
    extra = sorted(set(data) - {"prompt", "output"})
    if extra:
        raise UserError(f"{field} {path}: unknown table or key {extra[0]!r}")
    return laws[0], laws[1]


#: the suffix of a law file
LAW_SUFFIX = ".toml"


def is_inline_law(text: str) -> bool:
    """Whether a --workload value is written as an inline law (a ':' and no trace or law file
    suffix); it is one unless a file of that name exists, which the caller checks where it
    resolves names (the working directory, a matrix's folder)."""
    return ":" in text and not text.lower().endswith((*suffixes(), LAW_SUFFIX))


def named_file(text: str | os.PathLike) -> Path | None:
    """The regular file a --workload value names, else None (an inline law, a missing name, or
    one the OS cannot even look up: a name over 255 bytes raises on 3.11's is_file)."""
    try:
        path = Path(text).expanduser()
        return path if path.is_file() else None
    except (OSError, ValueError, RuntimeError):
        return None
