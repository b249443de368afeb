"""The decode workload: fixed context, request traces and parametric length laws.

One module for the planner and ``afd``. Inputs are validated once at the edge into frozen,
hashable specs (:class:`FixedContextSpec`, :class:`TraceSpec`, :class:`LawSpec`);
:func:`materialize` turns a spec into a :class:`Workload`, whose central object is the
**stationary decode context** law: a resident slot observed at a uniformly random decode
step holds a request chosen with probability proportional to its decode length ``D`` (its
output tokens, ``D >= 1``), at a uniform age ``a`` in ``{0, ..., D-1}``; its context is
``P + a`` (renewal-reward, AFD-provisioning paper Section 4.1, Lemma 4.1). The law is held
as a dense probability vector over integer contexts ``0..max_context`` (exact, no binning),
so θ, ν², quantiles, sampling and the KV distribution all come from one array. See
``docs/workloads.md``.

Token counts go through the package's one grammar, :func:`opweave_planner.inputs.units.
parse_tokens` (``131072``, ``32k``, ``1.5k``; k = 1024; a whole, positive count), re-exported
here.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import math
import os
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, get_args

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from opweave_planner import jit
from opweave_planner.atomic import check_input_file
from opweave_planner.errors import UserError
from opweave_planner.inputs.units import parse_tokens

__all__ = [
    "OVERFLOWS", "FixedContextSpec", "LawSpec", "LengthLaw", "Trace", "TraceSpec", "Workload",
    "WorkloadSpec", "apply_max_model_len", "fit_requests", "kv_bytes", "kv_moments", "kv_quantile",
    "kv_sum_bounds", "kv_sum_quantile", "materialize", "parse_law", "parse_overflow", "parse_percentile",
    "parse_quantile", "parse_tokens", "read_trace", "scaled_law", "scenarios",
    "stationary_moments", "step_percentile", "trace_sha256", "trace_workload", "workload_spec",
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


def parse_percentile(value: str | float, field: str = "--slo-percentile") -> float:
    """A percentile strictly inside (0, 100), e.g. ``95`` or ``'99.9'``."""
    x = _number(value, field)
    if not 0.0 < x < 100.0:
        raise UserError(f"{field}: {value!r} is outside (0, 100); expected e.g. 95")
    return x


def parse_overflow(value: str, field: str = "--overflow") -> str:
    """One of :data:`OVERFLOWS`, case-insensitive."""
    text = str(value).strip().lower()
    if text not in OVERFLOWS:
        raise UserError(f"{field}: {value!r} unknown; expected {' or '.join(OVERFLOWS)}")
    return text


def parse_quantile(value: str | float, field: str = "--kv-quantile") -> float:
    """A quantile level strictly inside (0, 1), e.g. ``0.999``."""
    x = _number(value, field)
    if not 0.0 < x < 1.0:
        raise UserError(f"{field}: {value!r} is outside (0, 1); expected e.g. 0.999")
    return x


# --------------------------------------------------------------------------- specs


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LengthLaw(_Frozen):
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


class FixedContextSpec(_Frozen):
    """``--ctx``: every resident request at exactly this context (today's behaviour)."""

    kind: Literal["fixed"] = "fixed"
    context: int = Field(gt=0)


class _Shaped(_Frozen):
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


def _law_toml(path: Path, field: str) -> tuple[LengthLaw, LengthLaw]:
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


def workload_spec(
    ctx: str | int | None = None,
    workload: str | Path | None = None,
    *,
    scale_ctx: str | int | None = None,
    max_model_len: str | int | None = None,
    overflow: str = "clip",
    field: str = "--workload",
    shape: bool = True,
) -> FixedContextSpec | TraceSpec | LawSpec:
    """The edge: CLI-level strings -> one validated spec.

    ``workload`` is a trace file (format from its header), a ``.toml`` law file, or an inline
    law. ``ctx`` alone is the fixed context. A trace is read once here (format, sha256, rows
    and every row validated) so that bad input fails before any search; so is the shaping
    (``materialize``), unless ``shape`` is False: a caller whose length limit is still to
    come (the model's window, when ``max_model_len`` is None) shapes once it has it.
    """
    if (ctx is None) == (workload is None):
        raise UserError("--ctx / --workload: give exactly one of them")
    if ctx is not None:
        if scale_ctx is not None or max_model_len is not None:
            raise UserError("--scale-ctx / --max-model-len: only apply to --workload")
        return FixedContextSpec(context=parse_tokens(ctx, "--ctx"))
    overflow = parse_overflow(overflow)
    shaped = {
        "scale_ctx": None if scale_ctx is None else parse_tokens(scale_ctx, "--scale-ctx"),
        "max_model_len": None
        if max_model_len is None
        else parse_tokens(max_model_len, "--max-model-len"),
        "overflow": overflow,
    }
    if shaped["max_model_len"] is not None and shaped["max_model_len"] < 2:
        raise UserError("--max-model-len: must leave room for a prompt token and an output")
    text = str(workload)
    path = Path(text).expanduser()
    inline = ":" in text and not text.lower().endswith((".csv", ".jsonl", ".toml"))
    try:
        os.lstat(path)
        named = True
    except FileNotFoundError:
        named = False
    except (OSError, ValueError):  # under a file, a name too long...: a path, unless a law
        named = not inline
    if named or not inline:
        if not named:
            raise UserError(f"{field} {text}: no such file (and not an inline law such as "
                            "lognormal:mean=12k,cv=1.2;out=geometric:mean=300)")
        check_input_file(path, field)  # a folder, FIFO, device, loop or dangling link, by name
        if path.suffix.lower() == ".toml":
            prompt, output = _law_toml(path, field)
            spec = LawSpec(prompt=prompt, output=output, **shaped)
        else:
            tr = _read_once(path)
            spec = TraceSpec(path=tr.path, format=tr.format, sha256=tr.sha256, rows=tr.rows,
                             **shaped)
    else:
        prompt, output = parse_law(text, field)
        spec = LawSpec(prompt=prompt, output=output, **shaped)
    if shape:
        materialize(spec)  # every shaping error (unreachable --scale-ctx, nothing fits) here
    return spec


# --------------------------------------------------------------------------- trace reading

#: format -> (prompt column, output column), columns matched case-insensitively
CSV_FORMATS: dict[str, tuple[str, str]] = {
    "azure": ("contexttokens", "generatedtokens"),
    "burstgpt": ("request tokens", "response tokens"),
    "vidur": ("num_prefill_tokens", "num_decode_tokens"),
    "plain": ("prompt_tokens", "output_tokens"),
}
#: the AFD CSV of earlier releases: any one prompt and any one decode column name
LEGACY_PROMPT = ("prompt", "prompt_len", "prompt_tokens")
LEGACY_DECODE = ("decode", "decode_len", "decode_tokens")
JSONL_KEYS = ("input_length", "output_length")  # Mooncake


@dataclass(frozen=True, eq=False)
class Trace:
    """Per-request prompt and output lengths of a trace file (int64 arrays)."""

    path: str
    format: str
    sha256: str
    prompt: np.ndarray
    output: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.prompt.size)


#: longest length a trace may give (2^40 tokens; keeps every sum well inside int64)
MAX_LENGTH = 1 << 40
#: longest line of a trace (a CSV record, quoted line ends included): real lines are under
#: a few KiB (a Mooncake line with its hash_ids), and it bounds what one line can cost
MAX_LINE = 1 << 22
#: longest prompt or output field of a CSV trace, in bytes (quotes and blanks included)
MAX_FIELD = 4096
_BLOCK = 1 << 22  # bytes read (and hashed) at a time
_ROWS = 1 << 18  # rows a scan kernel fills per call
_JSON_DEPTH = 64  # deeper JSON lines go to orjson (which allows 1024)
_BOM = b"\xef\xbb\xbf"
_BLANKS = re.compile(rb"[ \t\n\r\v\f\x1c-\x1f]*")  # ASCII whitespace, as str.isspace() has it
_EOL = re.compile(rb"\r\n|\r|\n")
_NUL_TEXT = "a NUL byte; expected UTF-8 text (a UTF-16 file?)"

# what a scan kernel stopped at (info[0]); info[1:4] = position, rows, line; info[4:] the detail
_MORE, _FULL, _SLOW, _NUL, _UTF8, _LONG, _COLUMNS, _VALUE, _FIELD, _QUOTE, _TWICE = range(11)
_INPUT = np.frombuffer(b"input_length", np.uint8)
_OUTPUT = np.frombuffer(b"output_length", np.uint8)
_TRUE, _FALSE, _NULL = (np.frombuffer(word, np.uint8) for word in (b"true", b"false", b"null"))


@jit.kernel(refcount=False)
def _space(c):
    """ASCII whitespace as str.isspace() has it (what a blank line and a padded number hold)."""
    return c == 32 or 9 <= c <= 13 or 28 <= c <= 31


@jit.kernel(refcount=False)
def _utf8(buf, i, n):
    """Length of the UTF-8 character that starts with byte buf[i] >= 0x80: 2-4, 0 if it is
    none (Python's strict decoder: no overlong form, surrogate or code point past U+10FFFF),
    -1 if the buffer ends inside it."""
    c = buf[i]
    lo, hi = 0x80, 0xBF  # the second byte's range; the others are always 0x80..0xBF
    if 0xC2 <= c <= 0xDF:
        k = 2
    elif 0xE0 <= c <= 0xEF:
        k = 3
        lo = 0xA0 if c == 0xE0 else 0x80
        hi = 0x9F if c == 0xED else 0xBF
    elif 0xF0 <= c <= 0xF4:
        k = 4
        lo = 0x90 if c == 0xF0 else 0x80
        hi = 0x8F if c == 0xF4 else 0xBF
    else:
        return 0
    for j in range(1, k):
        if i + j >= n:
            return -1
        b = buf[i + j]
        if not ((lo if j == 1 else 0x80) <= b <= (hi if j == 1 else 0xBF)):
            return 0
    return k


@jit.kernel(refcount=False)
def _fail(info, status, line, a, b, c, d):
    info[0] = status
    info[4] = line
    info[5] = a
    info[6] = b
    info[7] = c
    info[8] = d


@jit.entry
def _scan_csv(buf, pos, final, line, cols, out_p, out_o, row, info):
    """Records of buf[pos:] parsed as the csv module's excel dialect does (``"`` quotes a field,
    ``""`` inside is one quote, a quote elsewhere is text), a record ending at \\n, \\r\\n or \\r
    outside quotes; the prompt and output columns ``cols`` of each non-blank record go to
    out_p/out_o as ASCII decimal integers. Stops at the first bad record, at a record the
    buffer cuts (unless ``final``) or when out_* are full; info says which (_MORE...)."""
    n = buf.size
    val = np.zeros(2, np.int64)
    phase = np.zeros(2, np.int64)  # 0 leading blanks, 1 digits, 2 trailing blanks, 3 not a number
    span = np.zeros(4, np.int64)  # first and last byte + 1 of the prompt and output fields
    need = max(cols[0], cols[1])
    status = _MORE
    while pos < n and status == _MORE:
        if row == out_p.size:
            status = _FULL
            break
        start, first = pos, line
        field, state, blank, cut = 0, 0, True, False  # state: 0 field start, 1 unquoted, 2 quoted, 3 quote in quoted
        val[:] = 0
        phase[:] = 0
        slot = 0 if cols[0] == 0 else (1 if cols[1] == 0 else -1)
        if slot >= 0:
            span[2 * slot] = pos
        while True:
            if state <= 1 and pos < n:  # fast runs: text of another column, or a length's digits
                j = pos
                if slot < 0:
                    stop = min(n, start + MAX_LINE + 1)
                    while j < stop and 32 < buf[j] < 127 and buf[j] != 44 and buf[j] != 34:
                        j += 1
                elif phase[slot] <= 1:
                    stop = min(n, span[2 * slot] + MAX_FIELD)
                    v = val[slot]
                    while j < stop and 48 <= buf[j] <= 57:
                        if v <= MAX_LENGTH:
                            v = v * 10 + (buf[j] - 48)
                        j += 1
                    if j > pos:
                        val[slot] = v
                        phase[slot] = 1
                if j > pos:
                    pos, state, blank = j, 1, False
            if pos - start > MAX_LINE:
                _fail(info, _LONG, first, 0, 0, 0, 0)
                status = _LONG
                break
            if pos >= n:
                if not final:
                    cut = True
                elif state == 2:
                    _fail(info, _QUOTE, first, 0, 0, 0, 0)
                    status = _QUOTE
                break
            c = buf[pos]
            width = 1
            if c == 0:
                _fail(info, _NUL, line, 0, 0, 0, 0)
                status = _NUL
                break
            if c >= 0x80:
                width = _utf8(buf, pos, n)
                if width < 0 and not final:
                    cut = True
                    break
                if width <= 0:
                    _fail(info, _UTF8, line, 0, 0, 0, 0)
                    status = _UTF8
                    break
            if state != 2 and (c == 10 or c == 13):  # the record's end
                if slot >= 0:
                    span[2 * slot + 1] = pos
                if c == 13 and pos + 1 >= n and not final:
                    cut = True  # \r\n split by the buffer's end
                    break
                pos += 2 if c == 13 and pos + 1 < n and buf[pos + 1] == 10 else 1
                line += 1
                break
            if state == 2:
                if c == 34:
                    state = 3
                    pos += 1
                    continue
                if c == 13 and pos + 1 >= n and not final:
                    cut = True
                    break
                if c == 10 or (c == 13 and (pos + 1 >= n or buf[pos + 1] != 10)):
                    line += 1
            elif c == 44:  # the field's end
                if slot >= 0:
                    span[2 * slot + 1] = pos
                field += 1
                slot = 0 if cols[0] == field else (1 if cols[1] == field else -1)
                if slot >= 0:
                    span[2 * slot] = pos + 1
                state = 0
                pos += 1
                continue
            elif c == 34 and state == 0:
                state = 2
                pos += 1
                continue
            elif c == 34 and state == 3:
                state = 2
            else:
                state = 1
            # a character of the field's text
            space = width == 1 and _space(c)
            if not space:
                blank = False
            if slot >= 0:
                if pos + width - span[2 * slot] > MAX_FIELD:
                    _fail(info, _FIELD, first, slot, 0, 0, 0)
                    status = _FIELD
                    break
                ph = phase[slot]
                if 48 <= c <= 57 and ph <= 1:
                    phase[slot] = 1
                    if val[slot] <= MAX_LENGTH:
                        val[slot] = val[slot] * 10 + (c - 48)
                elif space:
                    if ph == 1:
                        phase[slot] = 2
                else:
                    phase[slot] = 3
            pos += width
        if status != _MORE:
            break
        if cut:
            pos, line = start, first
            break
        if blank:
            continue
        if field + 1 <= need:
            _fail(info, _COLUMNS, first, field + 1, 0, 0, 0)
            status = _COLUMNS
            break
        for k in range(2):
            if phase[k] == 0 or phase[k] == 3 or val[k] > MAX_LENGTH or val[k] < k:
                huge = 1 if phase[k] != 0 and phase[k] != 3 and val[k] > MAX_LENGTH else 0
                _fail(info, _VALUE, first, k, span[2 * k], span[2 * k + 1], huge)
                status = _VALUE
                break
        if status != _MORE:
            break
        out_p[row] = val[0]
        out_o[row] = val[1]
        row += 1
    info[0] = status
    info[1] = pos
    info[2] = row
    info[3] = line


@jit.kernel(refcount=False)
def _json_string(buf, i, e):
    """Index after the JSON string that starts at buf[i] == '"', -1 if it is not a plain one
    (a \\u escape, a control character, no closing quote: orjson decides)."""
    j = i + 1
    while j < e:
        c = buf[j]
        if c == 34:
            return j + 1
        if c == 92:
            if j + 1 >= e:
                return -1
            x = buf[j + 1]
            if not (x == 34 or x == 92 or x == 47 or x == 98 or x == 102 or x == 110 or x == 114
                    or x == 116):
                return -1
            j += 2
        elif c < 32:
            return -1
        else:
            j += 1
    return -1


@jit.kernel(refcount=False)
def _json_number(buf, i, e):
    """Index after the JSON number at buf[i], -1 if it is none or one orjson might refuse
    (an exponent of three digits may overflow a double; 40 characters bound the mantissa)."""
    j = i
    if j < e and buf[j] == 45:
        j += 1
    if j < e and buf[j] == 48:
        j += 1
    elif j < e and 49 <= buf[j] <= 57:
        while j < e and 48 <= buf[j] <= 57:
            j += 1
    else:
        return -1
    if j < e and buf[j] == 46:
        j += 1
        k = j
        while j < e and 48 <= buf[j] <= 57:
            j += 1
        if j == k:
            return -1
    if j < e and (buf[j] == 101 or buf[j] == 69):
        j += 1
        if j < e and (buf[j] == 43 or buf[j] == 45):
            j += 1
        k = j
        while j < e and 48 <= buf[j] <= 57:
            j += 1
        if j == k or j - k > 2:
            return -1
    return j if j - i <= 40 else -1


@jit.kernel(refcount=False)
def _json_length(buf, i, e, minimum):
    """(value, index after it) of a length written as a plain JSON integer in minimum..2^40,
    (-1, -1) otherwise (a float, a sign, a string...: orjson and the old checks decide)."""
    j, v = i, 0
    while j < e and 48 <= buf[j] <= 57 and j - i <= 13:
        v = v * 10 + (buf[j] - 48)
        j += 1
    if j == i or j - i > 13 or (buf[i] == 48 and j - i > 1) or v < minimum or v > MAX_LENGTH:
        return -1, -1
    if j < e and (buf[j] == 46 or buf[j] == 101 or buf[j] == 69):
        return -1, -1
    return v, j


@jit.kernel(refcount=False)
def _same(buf, i, j, word):
    if j - i != word.size:
        return False
    for k in range(word.size):  # noqa: SIM110 (a loop: numba compiles no generator here)
        if buf[i + k] != word[k]:
            return False
    return True


@jit.kernel(refcount=False)
def _json_lengths(buf, s, e, stack):
    """(code, input_length, output_length) of the JSON line buf[s:e]: code 0 read, 1 a blank
    line, 2 anything unusual (orjson and the old checks decide), 3 a length key given twice.

    A validating parser for the common case: an object whose two lengths are plain
    integers, every string without \\u escapes, nesting under _JSON_DEPTH."""
    i = s
    while i < e and _space(buf[i]):
        i += 1
    if i == e:
        return 1, 0, 0
    i = s
    while i < e and (buf[i] == 32 or buf[i] == 9):
        i += 1
    if buf[i] != 123:
        return 2, 0, 0
    vin, vout, key, twice = -1, -1, -1, False
    depth, state = 0, 0  # state: 0 a value, 1 a value or ']', 2 a key, 3 a key or '}', 4 ':', 5 after a value
    while True:
        while i < e and (buf[i] == 32 or buf[i] == 9):
            i += 1
        if i == e or (depth == 0 and state == 5):
            break
        c = buf[i]
        if (c == 93 and state == 1) or (c == 125 and state == 3):  # [] or {}
            depth -= 1
            i += 1
            state = 5
            continue
        if state <= 1:
            if key >= 0:  # the value of input_length or output_length
                v, j = _json_length(buf, i, e, key)
                if j < 0:
                    return 2, 0, 0
                if (vin if key == 0 else vout) >= 0:
                    twice = True
                if key == 0:
                    vin = v
                else:
                    vout = v
                i, key, state = j, -1, 5
                continue
            if c == 123 or c == 91:
                if depth == _JSON_DEPTH:
                    return 2, 0, 0
                stack[depth] = c
                depth += 1
                i += 1
                state = 3 if c == 123 else 1
                continue
            if c == 34:
                i = _json_string(buf, i, e)
            elif c == 116 and _same(buf, i, min(e, i + 4), _TRUE):
                i += 4
            elif c == 102 and _same(buf, i, min(e, i + 5), _FALSE):
                i += 5
            elif c == 110 and _same(buf, i, min(e, i + 4), _NULL):
                i += 4
            elif c == 45 or 48 <= c <= 57:
                i = _json_number(buf, i, e)
            else:
                return 2, 0, 0
            if i < 0:
                return 2, 0, 0
            state = 5
        elif state <= 3:
            if c != 34:
                return 2, 0, 0
            j = _json_string(buf, i, e)
            if j < 0:
                return 2, 0, 0
            key = -1
            if depth == 1:
                key = 0 if _same(buf, i + 1, j - 1, _INPUT) else (1 if _same(buf, i + 1, j - 1, _OUTPUT) else -1)
            i, state = j, 4
        elif state == 4:
            if c != 58:
                return 2, 0, 0
            i += 1
            state = 0
        else:
            top = stack[depth - 1]
            if c == 44:
                state = 2 if top == 123 else 0
            elif (c == 125 and top == 123) or (c == 93 and top == 91):
                depth -= 1
            else:
                return 2, 0, 0
            i += 1
    if depth != 0 or state != 5 or i != e or vin < 0 or vout < 0:
        return 2, 0, 0
    return (3 if twice else 0), vin, vout


@jit.entry
def _scan_jsonl(buf, pos, final, line, out_p, out_o, row, info):
    """JSON lines of buf[pos:] (ending at \\n, \\r\\n or \\r), their input and output lengths
    to out_p/out_o; stops at a line for orjson (_SLOW: info[5:8] its start, end and the next
    line's start), at a bad byte, at a line the buffer cuts (unless final), when full."""
    n = buf.size
    stack = np.zeros(_JSON_DEPTH, np.uint8)
    status = _MORE
    while pos < n:
        if row == out_p.size:
            status = _FULL
            break
        start, end, nxt = pos, -1, -1
        stop = min(n, start + MAX_LINE)
        while True:
            while pos < stop and 13 < buf[pos] < 0x80:  # the common bytes, in a tight loop
                pos += 1
            if pos >= n:
                break
            c = buf[pos]
            if c == 10 or c == 13:
                if c == 13 and pos + 1 >= n and not final:
                    break
                end = pos
                nxt = pos + 2 if c == 13 and pos + 1 < n and buf[pos + 1] == 10 else pos + 1
                break
            if pos - start >= MAX_LINE:
                status = _LONG
                break
            if c == 0:
                status = _NUL
                break
            width = 1
            if c >= 0x80:
                width = _utf8(buf, pos, n)
                if width < 0 and not final:
                    break
                if width <= 0:
                    status = _UTF8
                    break
            pos += width
        if status != _MORE:
            _fail(info, status, line, 0, 0, 0, 0)
            break
        if end < 0:
            if not final:
                pos = start
                break
            end, nxt = n, n
        code, a, b = _json_lengths(buf, start, end, stack)
        if code == 2 or code == 3:
            status = _SLOW if code == 2 else _TWICE
            _fail(info, status, line, start, end, nxt, 0)
            pos = start
            break
        if code == 0:
            out_p[row] = a
            out_o[row] = b
            row += 1
        line += 1
        pos = nxt
    info[0] = status
    info[1] = pos
    info[2] = row
    info[3] = line


def _bad_value(path: Path, line: int, what: str, minimum: int, value: str, huge: bool) -> UserError:
    shown = value if len(value) <= 40 else value[:40] + "..."
    if huge:
        return UserError(f"trace {path} line {line}: {what} length {shown} exceeds 2^40 tokens")
    odd = "_" in value or any(ch.isdigit() and not "0" <= ch <= "9" for ch in value)
    hint = " (ASCII digits 0-9 only)" if odd else ""
    return UserError(f"trace {path} line {line}: {what} length must be an integer >= {minimum}, "
                     f"got {shown!r}{hint}")


def _output_message(fmt: str) -> tuple[str, str]:
    return ("prompt", "decode") if fmt == "afd" else ("prompt", "output")


def _csv_columns(header: list[str], path: Path) -> tuple[str, int, int]:
    """(format, prompt column, output column) of a CSV header; a header that repeats a name or
    names the columns of two formats is refused (which pair was meant is a guess)."""
    cols = [h.strip().lower() for h in header]
    for i, name in enumerate(cols):
        if name and name in cols[:i]:
            raise UserError(f"trace {path}: column {header[i].strip()!r} appears twice in the header")
    found = [(fmt, cols.index(pc), cols.index(oc)) for fmt, (pc, oc) in CSV_FORMATS.items()
             if pc in cols and oc in cols]
    prompts = [c for c in LEGACY_PROMPT if c in cols]
    decodes = [c for c in LEGACY_DECODE if c in cols]
    if prompts and decodes:
        for names in (prompts, decodes):
            if len(names) > 1:
                raise UserError(f"trace {path}: the header names two columns of one kind "
                                f"({names[0]!r}, {names[1]!r}); keep one")
        found.append(("afd", cols.index(prompts[0]), cols.index(decodes[0])))
    if len(found) > 1:
        pairs = " and ".join(f"{fmt} ({header[i].strip()},{header[o].strip()})" for fmt, i, o in found[:2])
        raise UserError(f"trace {path}: the header names the columns of two formats, {pairs}; "
                        "keep one prompt and one output column")
    if found:
        return found[0]
    raise UserError(
        f"trace {path}: unknown header {','.join(h.strip() for h in header)[:120]!r}; expected "
        "Azure (ContextTokens,GeneratedTokens), BurstGPT (Request tokens,Response tokens), "
        "Vidur (num_prefill_tokens,num_decode_tokens), prompt_tokens,output_tokens, "
        "prompt,decode, or Mooncake JSONL (input_length,output_length)"
    )


def _line_ends(data: bytes) -> int:
    """How many lines ``data`` ends (\\n, \\r\\n and a lone \\r count one each)."""
    return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


class _Source:
    """A trace file read in blocks, every byte hashed once as it is read (the plan records the
    sha256), with the unparsed rest of the last block kept in ``buf``."""

    def __init__(self, handle, path: Path) -> None:
        self.handle, self.path = handle, path
        self.digest = hashlib.sha256()
        self.buf, self.pos, self.final, self.seen = b"", 0, False, 0
        self.size = os.fstat(handle.fileno()).st_size

    def more(self) -> None:
        """Append the next block to the unparsed rest (the tail is at most MAX_LINE long)."""
        block = self.handle.read(_BLOCK)
        self.digest.update(block)
        self.final = not block
        self.seen += len(block)
        self.buf = self.buf[self.pos:] + block
        self.pos = 0

    def rows_expected(self, rows: int) -> int:
        """The file's rows at the density of those parsed so far, 5 % over."""
        parsed = max(1, self.seen - (len(self.buf) - self.pos))
        return int(rows * max(self.size, self.seen) / parsed * 1.05)

    def first_line(self) -> tuple[int, int]:
        """Skip the byte-order mark and blank lines: (line number, first byte) of the first
        other line, which then starts at ``pos``."""
        self.more()
        while len(self.buf) < len(_BOM) and not self.final:
            self.more()
        if self.buf[:2] in (b"\xff\xfe", b"\xfe\xff"):
            raise UserError(f"trace {self.path}: UTF-16 or UTF-32 text; expected UTF-8")
        if self.buf.startswith(_BOM):
            self.pos = 3
        line = 1
        while True:
            j = _BLANKS.match(self.buf, self.pos).end()
            if j < len(self.buf) or self.final:
                break
            keep = j - 1 if self.buf.endswith(b"\r") else j  # its \n may start the next block
            line += _line_ends(self.buf[self.pos:keep])
            self.pos = keep
            self.more()
        if j == len(self.buf):
            raise UserError(f"trace {self.path}: empty file; expected a header line and requests")
        start = max(self.pos, self.buf.rfind(b"\n", self.pos, j) + 1, self.buf.rfind(b"\r", self.pos, j) + 1)
        line += _line_ends(self.buf[self.pos:start])
        self.pos = start
        return line, self.buf[j]

    def header(self, line: int) -> list[str]:
        """The CSV header at ``pos`` (one line), ``pos`` moved past it."""
        while True:
            m = _EOL.search(self.buf, self.pos)
            if self.final or (m and m.end() < len(self.buf)):  # (a final \r may pair with a \n)
                break
            if (m.start() if m else len(self.buf)) - self.pos > MAX_LINE:
                break
            self.more()
        end = m.start() if m else len(self.buf)
        if end - self.pos > MAX_LINE:
            raise UserError(f"trace {self.path} line {line}: longer than {MAX_LINE >> 20} MiB; "
                            "expected a header line")
        raw = self.buf[self.pos:end]
        self.pos = m.end() if m else end
        if b"\0" in raw:
            raise UserError(f"trace {self.path} line {line}: {_NUL_TEXT}")
        try:
            text = raw.decode("utf-8")
            return next(csv.reader([text], strict=True))
        except UnicodeDecodeError:
            raise UserError(f"trace {self.path} line {line}: not UTF-8 text") from None
        except csv.Error as exc:
            raise UserError(f"trace {self.path} line {line}: the header is not one line of CSV "
                            f"({exc})") from None


def _field_text(raw: bytes) -> str:
    """A CSV field's text (unquoted, stripped) for an error message."""
    text = raw.decode("utf-8", "replace")
    with contextlib.suppress(csv.Error, StopIteration, IndexError):
        text = next(csv.reader([text]))[0] if text.lstrip(" \t").startswith('"') else text
    return text.strip()


def _json_line(raw: bytes, path: Path, line: int) -> tuple[int, int] | None:
    """(input_length, output_length) of a JSON line the kernel leaves to orjson, None for a
    blank one; or the one-line error naming the line."""
    if not raw.decode("utf-8").strip():
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise UserError(f"trace {path} line {line}: not a JSON object") from None
    if not isinstance(obj, dict) or not all(k in obj for k in JSONL_KEYS):
        raise UserError(
            f"trace {path} line {line}: expected a JSON object with input_length and output_length"
        )
    values = []
    for key, minimum, what in (("input_length", 0, "prompt"), ("output_length", 1, "output")):
        v = obj[key]
        whole = isinstance(v, int) and not isinstance(v, bool)
        if not whole or not minimum <= v <= MAX_LENGTH:
            raise _bad_value(path, line, what, minimum, str(v), whole and v > MAX_LENGTH)
        values.append(v)
    return values[0], values[1]


_PROBLEMS = {
    _NUL: _NUL_TEXT, _UTF8: "not UTF-8 text", _QUOTE: "a quoted field is never closed",
    _LONG: f"longer than {MAX_LINE >> 20} MiB; expected one request per line",
    _TWICE: "input_length or output_length given twice",
}


def _scan_error(src: _Source, info: np.ndarray, fmt: str, width: int) -> UserError:
    status, line = int(info[0]), int(info[4])
    where = f"trace {src.path} line {line}"
    if status in _PROBLEMS:
        return UserError(f"{where}: {_PROBLEMS[status]}")
    if status == _COLUMNS:
        return UserError(f"{where}: expected {width} columns, got {int(info[5])}")
    what = _output_message(fmt)[int(info[5])]
    if status == _FIELD:
        return UserError(f"{where}: the {what} field is longer than {MAX_FIELD} bytes")
    text = _field_text(src.buf[int(info[6]):int(info[7])])
    return _bad_value(src.path, line, what, int(info[5]), text, bool(info[8]))


def _scan(src: _Source, line: int, fmt: str, cols: tuple[int, int], width: int):
    """Run the format's kernel over the file from ``src.pos``; (prompt, output) arrays.

    The kernels write into two arrays that grow once they are full, to the rows the file's
    size promises (so a large file is copied about once, and the peak stays near the result)."""
    out_p, out_o = np.empty(_ROWS, np.int64), np.empty(_ROWS, np.int64)
    info = np.zeros(9, np.int64)
    col = np.array(cols, np.int64)
    row = 0
    while True:
        buf = np.frombuffer(src.buf, np.uint8)
        if fmt == "mooncake":
            _scan_jsonl(buf, src.pos, src.final, line, out_p, out_o, row, info)
        else:
            _scan_csv(buf, src.pos, src.final, line, col, out_p, out_o, row, info)
        status, src.pos, row, line = (int(x) for x in info[:4])
        if status == _FULL:
            out_p, out_o = (_grown(a, max(2 * a.size, src.rows_expected(row))) for a in (out_p, out_o))
        elif status == _SLOW:
            got = _json_line(src.buf[int(info[5]):int(info[6])], src.path, line)
            if got is not None:
                out_p[row], out_o[row] = got
                row += 1
            src.pos, line = int(info[7]), line + 1
        elif status != _MORE:
            raise _scan_error(src, info, fmt, width)
        elif src.final:
            break
        else:
            src.more()
    if out_p.size > row + row // 8:  # more room than rows (a small file, a bad guess): trim
        return out_p[:row].copy(), out_o[:row].copy()
    return out_p[:row], out_o[:row]


def _grown(a: np.ndarray, size: int) -> np.ndarray:
    out = np.empty(size, a.dtype)
    out[: a.size] = a
    return out


def read_trace(path: str | Path) -> Trace:
    """Read a request trace (format recognised from the header), streaming, with its sha256.

    Formats: Azure LLM CSV, BurstGPT CSV, Vidur CSV, ``prompt_tokens,output_tokens`` CSV, the
    AFD ``prompt,decode`` CSV, Mooncake JSONL. Every request needs a prompt length >= 0 and
    an output length >= 1 in ASCII digits; the first bad row is reported by its line (the
    file's lines, the header's included, counted from 1). The bytes are parsed in blocks by
    numba kernels (linear in the file, no Python object per row); see docs/workloads.md for
    what is accepted and refused.
    """
    path = Path(path)
    check_input_file(path, "trace")
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise UserError(f"trace {path}: cannot open ({exc.strerror})") from None
    with handle:
        src = _Source(handle, path)
        line, lead = src.first_line()
        if lead == ord("{"):
            fmt, cols, width = "mooncake", (0, 1), 2
        else:
            header = src.header(line)
            fmt, ip, io = _csv_columns(header, path)
            cols, width, line = (ip, io), len(header), line + 1
        prompt, output = _scan(src, line, fmt, cols, width)
    if prompt.size == 0:
        raise UserError(f"trace {path}: no data rows; expected at least one request")
    return Trace(str(path), fmt, src.digest.hexdigest(), prompt, output)


_TRACES: dict[tuple[str, str], Trace] = {}


def _keep(cache: dict, key, value):
    """Store in one of this module's small caches, dropping the oldest of more than eight."""
    if len(cache) >= 8:
        cache.pop(next(iter(cache)))
    cache[key] = value
    return value


def _remember(tr: Trace, path: str) -> Trace:
    """Keep the last few traces read, under their resolved path (a spec re-reads none)."""
    tr = Trace(path, tr.format, tr.sha256, tr.prompt, tr.output)
    return _keep(_TRACES, (path, tr.sha256), tr)


def file_stamp(path: str | os.PathLike | None) -> tuple[str, int, int] | None:
    """(resolved path, mtime ns, size) of a file, None when it is not one (a law, no workload):
    a cache key under which a file edited in a running process is another file."""
    try:
        resolved = str(Path(path).resolve()) if path else None
        st = os.stat(resolved) if resolved else None
    except (OSError, RuntimeError, ValueError):  # a symlink loop raises RuntimeError on 3.11
        return None
    return None if st is None else (resolved, st.st_mtime_ns, st.st_size)


def trace_sha256(workload: str | os.PathLike) -> str | None:
    """The sha256 of a trace file (read once, as a request would), None for a law or an inline
    law: tells whether another path holds the same trace."""
    path = Path(workload).expanduser()
    try:
        if not path.is_file() or path.suffix.lower() == ".toml":
            return None
    except (OSError, ValueError):  # a name too long (is_file raises ENAMETOOLONG on 3.11)
        return None
    return _read_once(path).sha256


def _read_once(path: Path) -> Trace:
    """`read_trace` once per file version per process: a request is validated before and after
    the model's window is known, and both see the same file."""
    key = file_stamp(path)
    if key is None:
        return read_trace(path)  # not a readable file: read_trace says why, in one line
    return _BY_STAMP[key] if key in _BY_STAMP else _keep(_BY_STAMP, key, _remember(read_trace(path), key[0]))


_BY_STAMP: dict[tuple[str, int, int], Trace] = {}


def _read_trace_checked(path: str, sha256: str) -> Trace:
    if (path, sha256) in _TRACES:
        return _TRACES[(path, sha256)]
    tr = read_trace(path)
    if tr.sha256 != sha256:
        raise UserError(f"trace {path}: file changed since it was read (sha256 differs)")
    return _remember(tr, path)


# --------------------------------------------------------------------------- shaping


def fit_requests(
    prompt: np.ndarray, output: np.ndarray, max_model_len: int, overflow: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What a runtime serves of each request under ``prompt + output <= max_model_len``.

    ``clip``: the output is cut to ``max_model_len - prompt`` (a runtime stops the request at
    the length limit); a prompt that leaves no room for one output token is dropped.
    ``drop``: every request that does not fit is dropped.
    ``truncate``: the prompt keeps its last ``max_model_len - output`` tokens (a chat
    frontend drops the oldest history so that the answer fits; it assumes the answer's
    length known, where a real frontend reserves a fixed budget); an output that alone
    reaches the limit is cut to ``max_model_len - 1`` behind a one-token prompt. Nothing
    is dropped.
    Returns (prompt, output, keep, changed) over all requests: the served lengths (read them
    at ``keep``) and which kept requests were shortened.
    """
    parse_overflow(overflow)
    over = prompt + output > max_model_len
    if overflow == "drop":
        return prompt, output, ~over, np.zeros_like(over)
    if overflow == "truncate":
        out = np.minimum(output, max_model_len - 1)
        return np.minimum(prompt, max_model_len - out), out, np.ones_like(over), over
    keep = prompt < max_model_len
    return prompt, np.where(over, max_model_len - prompt, output), keep, over & keep


def apply_max_model_len(
    prompt: np.ndarray, output: np.ndarray, max_model_len: int | None, overflow: str = "clip"
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Requests with ``prompt + output > max_model_len`` do not fit: :func:`fit_requests`
    says what is served. Returns (prompt, output, clipped, dropped): the kept requests,
    how many of them were shortened (``clipped``: output cut, or prompt truncated) and
    how many were dropped."""
    if max_model_len is None:
        return prompt, output, 0, 0
    p, o, keep, changed = fit_requests(prompt, output, max_model_len, overflow)
    return p[keep], o[keep], int(changed.sum()), int(keep.size - keep.sum())


def stationary_moments(
    prompt: np.ndarray, output: np.ndarray, weight: np.ndarray | None = None
) -> tuple[float, float]:
    """(θ, ν²) of the stationary decode context for (prompt, output) atoms with weights
    (the Appendix A.6 plug-in estimator when all weights are 1; the second moment is taken
    about θ, avoiding ``q - θ²`` cancellation)."""
    p = np.asarray(prompt, dtype=np.float64)
    d = np.asarray(output, dtype=np.float64)
    w = np.ones_like(d) if weight is None else np.asarray(weight, dtype=np.float64)
    total = (w * d).sum()
    theta = float((w * (d * p + d * (d - 1.0) / 2.0)).sum() / total)
    c = p - theta
    nu2 = float(
        (w * (d * c * c + c * d * (d - 1.0) + d * (d - 1.0) * (2.0 * d - 1.0) / 6.0)).sum()
        / total
    )
    return theta, max(nu2, 0.0)


def _trace_pmf(prompt: np.ndarray, output: np.ndarray, what: str) -> np.ndarray:
    """Dense stationary context law of a trace: request i covers contexts [P_i, P_i + D_i)
    with one unit of mass each, normalised by sum(D)."""
    end = prompt + output
    size = int(end.max())
    if size > MAX_SUPPORT:
        raise UserError(f"{what}: contexts up to {size} tokens; give --max-model-len")
    diff = np.bincount(prompt, minlength=size + 1).astype(np.float64)
    diff -= np.bincount(end, minlength=size + 1)
    pmf = np.cumsum(diff)[:size]
    return pmf / output.sum(dtype=np.float64)


def _scaled(prompt: np.ndarray, s: float) -> np.ndarray:
    return np.rint(prompt * s).astype(np.int64)


def _solve_scale(theta_at, target: float, what: str) -> float:
    """A prompt scale s > 0 with θ(s) closest to ``target`` (θ nondecreasing in s; inf where
    no request fits the length limit).

    θ(s) is close to affine (θ(0) + s (θ(1) - θ(0))), so the first guess is that line's root
    (through a smaller s than 1 where nothing fits at 1); a bracket is grown geometrically
    around it, then secant steps safeguarded by bisection. Scale 0 (every prompt empty) is
    never an answer: a target the outputs alone reach is refused.
    """
    t0 = theta_at(0.0)
    if not math.isfinite(t0):
        raise UserError(f"--scale-ctx {what}: no request fits --max-model-len even with an empty "
                        "prompt (the outputs alone are longer); raise --max-model-len")
    if target <= t0:
        raise UserError(
            f"--scale-ctx: {target:g} tokens is not above {t0:.1f}, the mean context the outputs "
            f"alone give {what}; no prompt scaling reaches it"
        )
    s1, t1 = 1.0, theta_at(1.0)
    for _ in range(64):  # prompts all round to 0 long before s1 = 2^-64
        if math.isfinite(t1):
            break
        s1 /= 2.0
        t1 = theta_at(s1)
    guess = s1 * (target - t0) / (t1 - t0) if t1 > t0 else s1
    lo, t_lo = 0.0, t0
    hi, t_hi = guess, theta_at(guess)
    step = 1.001
    while t_hi < target:
        lo, t_lo = hi, t_hi
        hi *= step
        step = step * step
        if hi > 1e9:
            raise UserError(f"--scale-ctx: {target:g} tokens is not reachable {what}")
        t_hi = theta_at(hi)
    if lo == 0.0:
        probe = guess / 1.001
        t_probe = theta_at(probe)
        if t_probe < target:
            lo, t_lo = probe, t_probe
    best = min([(abs(t_hi - target), hi)] + ([(abs(t_lo - target), lo)] if lo > 0 else []))
    for _ in range(80):
        if best[0] <= 1e-9 * target or hi - lo <= 1e-12 * hi:
            break
        mid = lo + (target - t_lo) * (hi - lo) / (t_hi - t_lo) if t_hi > t_lo else 0.5 * (lo + hi)
        if not lo + 0.01 * (hi - lo) < mid < hi - 0.01 * (hi - lo):
            mid = 0.5 * (lo + hi)
        t_mid = theta_at(mid)
        best = min(best, (abs(t_mid - target), mid))
        if t_mid < target:
            lo, t_lo = mid, t_mid
        else:
            hi, t_hi = mid, t_mid
    return best[1]


# --------------------------------------------------------------------------- the workload


@dataclass(frozen=True, eq=False)
class Workload:
    """A materialised workload: the stationary decode-context law and its summary.

    ``pmf[c]`` is the probability that a resident slot, observed at a random decode step,
    holds ``c`` context tokens (exact; zero outside ``[min_context, max_context]``).
    ``prompt``/``output`` are the kept requests of a trace (after ``scale_ctx`` and
    ``max_model_len``); ``None`` for a fixed context or a law.
    """

    spec: FixedContextSpec | TraceSpec | LawSpec
    pmf: np.ndarray = field(repr=False)
    theta: float
    nu2: float
    mean_prompt: float
    mean_output: float
    min_context: int
    max_context: int
    requests: int = 0  # kept requests (trace)
    clipped: float = 0  # trace: count; law: probability mass
    dropped: float = 0
    scale: float = 1.0  # the prompt scale applied for scale_ctx
    prompt: np.ndarray | None = field(default=None, repr=False)
    output: np.ndarray | None = field(default=None, repr=False)
    _cdf: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        pmf = np.array(self.pmf, dtype=np.float64)
        pmf[: self.min_context] = 0.0
        pmf = pmf[: self.max_context + 1]
        pmf /= pmf.sum()
        cdf = np.cumsum(pmf)
        cdf /= cdf[-1]
        pmf.setflags(write=False)
        cdf.setflags(write=False)
        object.__setattr__(self, "pmf", pmf)
        object.__setattr__(self, "_cdf", cdf)

    @property
    def nu(self) -> float:
        return math.sqrt(self.nu2)

    @property
    def cv(self) -> float:
        """ν / θ."""
        return self.nu / self.theta if self.theta > 0 else 0.0

    @property
    def naive_mean(self) -> float:
        """The arrival average prompt mean + output mean / 2 (not what a decode step sees)."""
        return self.mean_prompt + self.mean_output / 2.0

    @property
    def is_fixed(self) -> bool:
        return isinstance(self.spec, FixedContextSpec)

    def cdf(self, context: np.ndarray | int) -> np.ndarray:
        """P(context <= c), elementwise."""
        c = np.asarray(context, dtype=np.int64)
        idx = np.clip(c, 0, self._cdf.size - 1)
        return np.where(c < 0, 0.0, self._cdf[idx])

    def quantile(self, q: float | Sequence[float] | np.ndarray) -> np.ndarray | int:
        """Smallest context c with P(context <= c) >= q, q in (0, 1) (exact inverse CDF;
        a 1e-12 tolerance absorbs the rounding of the cumulative sum)."""
        qa = np.asarray(q, dtype=np.float64)
        if ((qa <= 0) | (qa >= 1)).any():
            raise UserError(f"quantile: {q!r} is outside (0, 1)")
        out = np.minimum(np.searchsorted(self._cdf, qa - 1e-12, side="left"), self._cdf.size - 1)
        return int(out) if out.ndim == 0 else out.astype(np.int64)

    def sample(self, rng: np.random.Generator | int, n: int) -> np.ndarray:
        """``n`` independent stationary contexts (int64), inverse CDF of ``n`` uniforms."""
        g = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        u = g.random(n)
        idx = np.searchsorted(self._cdf, u, side="right")
        return np.minimum(idx, self._cdf.size - 1).astype(np.int64)

    def describe(self) -> dict:
        """Everything a plan records about its workload (JSON-ready)."""
        s = self.spec
        out: dict = {"source": s.kind}
        if isinstance(s, FixedContextSpec):
            out["context_tokens"] = s.context
        elif isinstance(s, TraceSpec):
            out.update(path=s.path, format=s.format, sha256=s.sha256, rows=s.rows,
                       requests=self.requests, clipped=int(self.clipped),
                       dropped=int(self.dropped))
        else:
            out.update(prompt=s.prompt.label(), output=s.output.label(),
                       clipped_mass=self.clipped, dropped_mass=self.dropped)
        if not isinstance(s, FixedContextSpec):
            out.update(scale_ctx=s.scale_ctx, prompt_scale=self.scale,
                       max_model_len=s.max_model_len, overflow=s.overflow)
        qs = (0.5, 0.9, 0.95, 0.99, 0.999)
        out.update(
            theta=self.theta, nu=self.nu, cv=self.cv, naive_mean=self.naive_mean,
            mean_prompt=self.mean_prompt, mean_output=self.mean_output,
            max_context=self.max_context,
            context_quantiles={f"p{100 * q:g}": int(v) for q, v in zip(qs, self.quantile(qs))},
        )
        return out


def _fixed(spec: FixedContextSpec) -> Workload:
    c = spec.context
    pmf = np.zeros(c + 1)
    pmf[c] = 1.0
    return Workload(spec, pmf, float(c), 0.0, float(c), 0.0, c, c)


def _shape_trace(tr_p, tr_o, spec) -> tuple[np.ndarray, np.ndarray, int, int, float]:
    L, ov = spec.max_model_len, spec.overflow
    scale = 1.0
    if spec.scale_ctx is not None:
        # Unique (P, D) pairs with counts: the same θ, fewer terms per evaluation.
        key, cnt = np.unique(np.stack([tr_p, tr_o]), axis=1, return_counts=True)
        up, uo = key[0], key[1]

        def theta_at(s: float) -> float:
            p = _scaled(up, s)
            p2, o2, w = p, uo, cnt
            if L is not None:
                p2, o2, keep, _ = fit_requests(p, uo, L, ov)
                p2, o2, w = p2[keep], o2[keep], cnt[keep]
            if w.size == 0:
                return math.inf
            return stationary_moments(p2, o2, w)[0]

        scale = _solve_scale(theta_at, float(spec.scale_ctx), f"for {spec.path}")
        tr_p = _scaled(tr_p, scale)
    p, o, clipped, dropped = apply_max_model_len(tr_p, tr_o, L, ov)
    if spec.scale_ctx is not None:
        _check_kept(1.0 - dropped / tr_p.size, spec, f"trace {spec.path}")
        if ov == "truncate":  # nothing is dropped: the window, not the trace, would shape the cohort
            _check_kept(1.0 - clipped / tr_p.size, spec, f"trace {spec.path}", "serves whole only")
    return p, o, clipped, dropped, scale


#: with --scale-ctx, the least share of requests (or probability mass) that must stay
MIN_KEPT_SCALED = 0.5


def _check_kept(kept: float, spec, what: str, verb: str = "keeps only") -> None:
    """Rescaling against a length limit can reach a target only by dropping most requests
    (the survivors are the short ones, blown up), or with ``truncate`` by cutting most prompts
    to the limit; refuse such a degenerate cohort."""
    if kept < MIN_KEPT_SCALED:
        raise UserError(
            f"{what}: --scale-ctx {spec.scale_ctx} under --max-model-len {spec.max_model_len} "
            f"{verb} {100 * kept:.1f} % of the requests; raise --max-model-len or lower "
            "--scale-ctx"
        )


def _trace(spec: TraceSpec) -> Workload:
    tr = _read_trace_checked(spec.path, spec.sha256)
    p, o, clipped, dropped, scale = _shape_trace(tr.prompt, tr.output, spec)
    if p.size == 0:
        raise UserError(
            f"trace {spec.path}: every request is longer than --max-model-len "
            f"{spec.max_model_len}; nothing left to plan for"
        )
    theta, nu2 = stationary_moments(p, o)
    pmf = _trace_pmf(p, o, f"trace {spec.path}")
    p.setflags(write=False)
    o.setflags(write=False)
    return Workload(spec, pmf, theta, nu2, float(p.mean()), float(o.mean()),
                    int(p.min()), int((p + o).max() - 1), int(p.size), clipped, dropped,
                    scale, p, o)


class _NothingFits(UserError):
    """No request of a law fits the length limit: at most LAW_TAIL of its mass, the tail the
    law itself is cut at (the rescaling solver reads it as θ = inf)."""

    def __init__(self, limit: int, kept: float) -> None:
        super().__init__(f"workload: no request fits --max-model-len {limit} (a share of "
                         f"{kept:.1g} of the law's requests); raise --max-model-len")


def _law_pmf(wp: np.ndarray, wd: np.ndarray, L: int | None, overflow: str):
    """Stationary context law of independent (P, D) given their pmfs on 0..len-1.

    Without a length limit, context = P + A with A independent of P and
    P(A = a) = P(D > a) / E[D]: the pmf is (w_P * S_D) / E[D]. With ``clip`` (D cut to
    L - P, P >= L dropped) it is the same convolution cut at L - 1; with ``drop`` (kept only
    when P + D <= L) the term P(D > L - p) is subtracted for every p. Returns
    (pmf, min context, max context, mean prompt, mean output, clipped mass, dropped mass),
    the means over kept requests.
    """
    from scipy.signal import fftconvolve

    tail = np.cumsum(wd[::-1])[::-1]  # tail[k] = P(D >= k)
    surv = np.append(tail[1:], 0.0)  # surv[a] = P(D > a)
    ks = np.arange(wp.size, dtype=np.float64)
    kd = np.arange(wd.size, dtype=np.float64)
    conv = np.clip(fftconvolve(wp, surv), 0.0, None)  # index y = p + a
    p_min = int(np.flatnonzero(wp > 0)[0])
    p_max = int(np.flatnonzero(wp > 0)[-1])
    d_max = int(np.flatnonzero(wd > 0)[-1])
    if L is None:
        return (conv, p_min, p_max + d_max - 1, float(ks @ wp), float(kd @ wd), 0.0, 0.0)
    pos = np.arange(wp.size)
    room = L - pos  # the most output tokens a prompt of p leaves
    sd_room = np.where(room >= 0, surv[np.clip(room, 0, surv.size - 1)], 1.0)
    sd_room[room >= surv.size] = 0.0
    sd_room[room <= 0] = 1.0  # p >= L never fits
    if overflow == "drop":
        fit = wp * (1.0 - sd_room)
        kept = float(fit.sum())
        if not kept > LAW_TAIL:
            raise _NothingFits(L, kept)
        sub = np.cumsum(wp * sd_room * (pos < L))
        y = np.arange(min(conv.size, L))
        pmf = np.clip(conv[: y.size] - sub[np.minimum(y, sub.size - 1)], 0.0, None)
        pd_sum = np.cumsum(kd * wd)  # E[D; D <= k]
        e_d = np.where(room >= 1, pd_sum[np.clip(room, 0, pd_sum.size - 1)], 0.0)
        mean_o = float((wp * e_d).sum() / kept)
        mean_p = float(ks @ fit) / kept
        clipped, dropped = 0.0, 1.0 - kept
        fits = np.flatnonzero(fit > 1e-300)
        lo, hi = int(fits[0]), min(L - 1, p_max + d_max - 1)
    else:
        keep = pos < L
        kept = float(wp[keep].sum())
        if not kept > LAW_TAIL:
            raise _NothingFits(L, kept)
        pmf = conv[:L]
        cs = np.cumsum(surv)  # E[min(D, k + 1)] = cs[k]
        e_d = cs[np.clip(room - 1, 0, cs.size - 1)]
        mean_o = float((wp[keep] * e_d[keep]).sum() / kept)
        mean_p = float(ks[keep] @ wp[keep]) / kept
        clipped = float((wp * sd_room)[keep].sum())
        dropped = 1.0 - kept
        lo, hi = p_min, min(L - 1, p_max + d_max - 1)
    return pmf, lo, hi, mean_p, mean_o, clipped, dropped


def _pmf_moments(pmf: np.ndarray) -> tuple[float, float]:
    w = pmf / pmf.sum()
    c = np.arange(w.size, dtype=np.float64)
    theta = float(c @ w)
    return theta, float(((c - theta) ** 2) @ w)


def scaled_law(base: LengthLaw, s: float) -> LengthLaw:
    """``base`` with its mean multiplied by ``s`` (same family and CV; a fixed value rounded,
    a geometric mean kept >= 1): the prompt law ``scale_ctx`` produces."""
    mean = base.mean * s
    if base.dist == "fixed":
        return LengthLaw(dist="fixed", mean=float(round(mean)))
    if base.dist == "geometric":
        return LengthLaw(dist="geometric", mean=max(mean, 1.0))
    return LengthLaw(dist="lognormal", mean=max(mean, 1e-9), cv=base.cv)


def _materialize_law(spec: LawSpec) -> Workload:
    L, ov = spec.max_model_len, spec.overflow
    wd = spec.output.pmf(1, None if L is None else L + 1)

    def build(law: LengthLaw):
        return _law_pmf(law.pmf(0, L), wd, L, ov)

    scale, law = 1.0, spec.prompt
    if spec.scale_ctx is not None:
        def theta_at(s: float) -> float:
            law = LengthLaw(dist="fixed", mean=0.0) if s == 0.0 else scaled_law(spec.prompt, s)
            try:
                return _pmf_moments(build(law)[0])[0]
            except _NothingFits:
                return math.inf

        scale = _solve_scale(theta_at, float(spec.scale_ctx), "for this law")
        law = scaled_law(spec.prompt, scale)
    pmf, lo, hi, mean_p, mean_o, clipped, dropped = build(law)
    if spec.scale_ctx is not None:
        _check_kept(1.0 - dropped, spec, "workload law")
    pmf = np.array(pmf[: hi + 1])
    pmf[:lo] = 0.0
    theta, nu2 = _pmf_moments(pmf)
    return Workload(spec, pmf, theta, nu2, mean_p, mean_o, lo, hi, 0, clipped, dropped, scale)


@lru_cache(maxsize=8)
def materialize(spec: FixedContextSpec | TraceSpec | LawSpec) -> Workload:
    """The :class:`Workload` of a spec (cached per process; a trace is re-read, or taken from
    this process's read cache, and its sha256 checked)."""
    if isinstance(spec, FixedContextSpec):
        return _fixed(spec)
    if isinstance(spec, TraceSpec):
        return _trace(spec)
    return _materialize_law(spec)


def trace_workload(path: str | Path, **shaping) -> Workload:
    """Shortcut: read ``path`` and materialise it (``scale_ctx``, ``max_model_len``,
    ``overflow`` as in :func:`workload_spec`)."""
    return materialize(workload_spec(workload=str(path), **shaping))


# --------------------------------------------------------------------------- KV and scenarios


def kv_bytes(
    contexts: np.ndarray | int,
    per_token: float,
    windows: Sequence[tuple[int, float]] = (),
    fixed: float = 0.0,
) -> np.ndarray:
    """KV/state bytes of one request at each context: ``per_token * c`` for full-attention
    layers, ``bytes * min(c, window)`` per ``(window, bytes per token)`` of sliding-window
    layers, plus ``fixed`` (linear-attention / recurrent state, context-independent)."""
    c = np.asarray(contexts, dtype=np.float64)
    out = per_token * c + fixed
    for window, per in windows:
        out = out + per * np.minimum(c, float(window))
    return out


def scenarios(workload: Workload, n_scenarios: int, slots: int, seed: int = 0) -> np.ndarray:
    """``[n_scenarios, slots]`` stationary contexts: snapshots of the resident slots.

    Common random numbers: slot ``j`` draws from its own stream
    ``default_rng(SeedSequence([seed, j]))``, so for a given seed column ``j`` is the same
    whatever ``slots`` is, and a larger ``n_scenarios`` extends the columns; two plans asking
    for the same seed see the same contexts in the slots they share.
    """
    if n_scenarios < 1 or slots < 1:
        raise UserError(f"scenarios: need n_scenarios >= 1 and slots >= 1, got "
                        f"{n_scenarios}, {slots}")
    out = np.empty((n_scenarios, slots), dtype=np.int64)
    for j in range(slots):
        g = np.random.default_rng(np.random.SeedSequence([int(seed), j]))
        out[:, j] = workload.sample(g, n_scenarios)
    return out


def kv_quantile(
    workload: Workload, q: float, per_token: float,
    windows: Sequence[tuple[int, float]] = (), fixed: float = 0.0,
) -> float:
    """The ``q``-quantile of one resident request's KV bytes: KV is nondecreasing in the
    context, so it is ``kv_bytes(workload.quantile(q))`` exactly."""
    return float(kv_bytes(workload.quantile(parse_quantile(q, "kv quantile")), per_token,
                          windows, fixed))


def step_percentile(values: np.ndarray, percentile: float, axis: int = -1) -> np.ndarray:
    """The ``percentile`` of per-scenario step latencies: the order statistic
    ``x_(k)``, ``k = ceil(n p / 100)`` (numpy's ``inverted_cdf``), never an interpolation.

    An order statistic is monotone: if ``lower[s] <= values[s]`` for every scenario ``s``,
    then ``step_percentile(lower, p) <= step_percentile(values, p)``. A branch-and-bound lower
    bound evaluated pointwise on the same scenarios therefore stays a lower bound of the
    percentile objective.
    """
    p = parse_percentile(percentile, "percentile")
    return np.quantile(np.asarray(values, dtype=np.float64), p / 100.0, axis=axis,
                       method="inverted_cdf")


def kv_moments(
    workload: Workload, per_token: float, windows: Sequence[tuple[int, float]] = (),
    fixed: float = 0.0,
) -> tuple[float, float, float, float]:
    """(mean, variance, skewness, excess kurtosis) of one resident request's KV bytes
    under the stationary context law (exact: a dot product with the pmf)."""
    x = kv_bytes(np.arange(workload.pmf.size), per_token, windows, fixed)
    w = workload.pmf
    m = float(x @ w)
    d = x - m
    var = float((d * d) @ w)
    if var <= 0:
        return m, 0.0, 0.0, 0.0
    sd = math.sqrt(var)
    return m, var, float((d**3) @ w) / sd**3, float((d**4) @ w) / var**2 - 3.0


KvMethod = Literal["exact", "cornish-fisher", "normal", "mc"]
#: bound on the length of the n-fold convolution grid of :func:`kv_sum_bounds`
KV_GRID = 1 << 20


def kv_sum_bounds(
    workload: Workload,
    n_requests: int,
    q: float,
    per_token: float,
    windows: Sequence[tuple[int, float]] = (),
    fixed: float = 0.0,
    grid: int = KV_GRID,
) -> tuple[float, float]:
    """Bounds ``(lo, hi)`` on the ``q``-quantile of the KV bytes summed over ``n_requests``
    independent stationary resident requests, from the exact law of that sum on a grid.

    One request's KV is rounded *up* onto ``G`` equal bins of width ``h`` over its range
    (``G = clamp(KV_GRID / n, 256, 65536)``); the n-fold convolution of that law (FFT) is the
    exact law of the rounded-up sum, which dominates the true sum and exceeds it by less than
    ``n h``. So ``hi`` (the rounded-up quantile) is an upper bound and ``hi - n h`` a lower
    bound (``grid`` replaces KV_GRID: smaller is faster and only looser); ``(hi - lo) / hi`` is below ``(max - min) / (G mean)`` per request (0.3 % for the
    Mooncake trace at n = 1024, far less for small n). Deterministic, no sampling; cached
    per (workload, n, q, KV coefficients): the 20 batch sizes 1..1024 of the search grid take
    0.55 s together on Mooncake scaled to 32k.
    """
    q = parse_quantile(q, "kv quantile")
    if n_requests < 1:
        raise UserError(f"kv quantile: n_requests must be >= 1, got {n_requests}")
    key = tuple((int(a), float(b)) for a, b in windows)
    return _kv_sum_bounds(workload, int(n_requests), q, float(per_token), key, float(fixed), int(grid))


@lru_cache(maxsize=256)
def _kv_sum_bounds(
    workload: Workload, n: int, q: float, per_token: float,
    windows: tuple[tuple[int, float], ...], fixed: float, total_grid: int = KV_GRID,
) -> tuple[float, float]:
    from scipy.fft import irfft, next_fast_len, rfft

    lo_c, hi_c = workload.min_context, workload.max_context
    ctx = np.arange(lo_c, hi_c + 1)
    x = kv_bytes(ctx, per_token, windows, fixed)
    w = workload.pmf[lo_c : hi_c + 1]
    x_min, x_max = float(x.min()), float(x.max())
    if x_max <= x_min:
        return n * x_min, n * x_min
    grid = int(min(65536, max(256, total_grid // n)))
    h = (x_max - x_min) / (grid - 1)
    k = np.minimum(np.ceil((x - x_min) / h - 1e-9), grid - 1).astype(np.int64)
    one = np.bincount(k, weights=w, minlength=grid)
    size = n * (grid - 1) + 1
    nfft = next_fast_len(size, real=True)
    total = np.clip(irfft(rfft(one, nfft) ** n, nfft)[:size], 0.0, None)
    cdf = np.cumsum(total)
    cdf /= cdf[-1]
    kq = int(min(np.searchsorted(cdf, q - 1e-12, side="left"), size - 1))
    hi = n * x_min + kq * h
    return max(n * x_min, hi - n * h), hi


def kv_sum_quantile(
    workload: Workload,
    n_requests: int,
    q: float,
    per_token: float,
    windows: Sequence[tuple[int, float]] = (),
    fixed: float = 0.0,
    method: KvMethod = "exact",
    samples: int = 200_000,
    seed: int = 0,
) -> float:
    """The ``q``-quantile of the KV bytes summed over ``n_requests`` independent stationary
    resident requests (a replica's resident batch).

    * ``exact`` (default): the upper bound of :func:`kv_sum_bounds` (conservative, within
      ``n h`` of the true quantile);
    * ``cornish-fisher``: the normal quantile corrected for the sum's skewness ``γ1/√n`` and
      excess kurtosis ``γ2/n`` (error ``O(n^-3/2)``; can be several % low for small ``n`` on
      bounded, saturating KV laws — see docs/workloads.md);
    * ``normal``: ``n m + z_q √n s`` (CLT; 10-30 % low for n <= 16 on long-tailed traces);
    * ``mc``: the empirical quantile (``method='higher'``) of ``samples`` sums, slot ``j``
      drawn from the stream of :func:`scenarios` (fixed ``seed``: deterministic).
    """
    if method == "exact":
        return kv_sum_bounds(workload, n_requests, q, per_token, windows, fixed)[1]
    q = parse_quantile(q, "kv quantile")
    if n_requests < 1:
        raise UserError(f"kv quantile: n_requests must be >= 1, got {n_requests}")
    n = int(n_requests)
    hi = n * float(kv_bytes(workload.max_context, per_token, windows, fixed))
    lo = n * float(kv_bytes(workload.min_context, per_token, windows, fixed))
    if method == "mc":
        total = np.zeros(samples)
        for j in range(n):
            g = np.random.default_rng(np.random.SeedSequence([int(seed), j]))
            total += kv_bytes(workload.sample(g, samples), per_token, windows, fixed)
        return float(np.quantile(total, q, method="higher"))
    from scipy.special import ndtri

    m, var, g1, g2 = kv_moments(workload, per_token, windows, fixed)
    z = float(ndtri(q))
    if method == "cornish-fisher":
        s1, s2 = g1 / math.sqrt(n), g2 / n
        z = z + (z * z - 1) * s1 / 6 + (z**3 - 3 * z) * s2 / 24 - (2 * z**3 - 5 * z) * s1**2 / 36
    elif method != "normal":
        raise UserError(
            f"kv quantile method: {method!r}; expected exact, cornish-fisher, normal or mc"
        )
    return float(min(hi, max(lo, n * m + z * math.sqrt(n * var))))
