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

import codecs
import csv
import hashlib
import math
import os
import re
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, get_args

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

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
_CHUNK_ROWS = 65536
_READ_BYTES = 1 << 20


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
) -> FixedContextSpec | TraceSpec | LawSpec:
    """The edge: CLI-level strings -> one validated spec.

    ``workload`` is a trace file (format from its header), a ``.toml`` law file, or an inline
    law. ``ctx`` alone is the fixed context. A trace is read once here (format, sha256, rows
    and every row validated) so that bad input fails before any search.
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
    if path.is_file():
        if path.suffix.lower() == ".toml":
            prompt, output = _law_toml(path, field)
            spec = LawSpec(prompt=prompt, output=output, **shaped)
        else:
            tr = _read_once(path)
            spec = TraceSpec(path=tr.path, format=tr.format, sha256=tr.sha256, rows=tr.rows,
                             **shaped)
    elif ":" in text and not any(text.lower().endswith(e) for e in (".csv", ".jsonl", ".toml")):
        prompt, output = parse_law(text, field)
        spec = LawSpec(prompt=prompt, output=output, **shaped)
    else:
        raise UserError(f"{field} {text}: no such file (and not an inline law such as "
                        "lognormal:mean=12k,cv=1.2;out=geometric:mean=300)")
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


class _HashingLines:
    """Iterate a file's text lines while hashing its bytes (one pass, bounded memory)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.digest = hashlib.sha256()

    def __iter__(self) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8-sig")()
        rest = ""
        try:
            handle = self.path.open("rb")
        except OSError as exc:
            raise UserError(f"trace {self.path}: cannot open ({exc.strerror})") from None
        with handle:
            while True:
                block = handle.read(_READ_BYTES)
                self.digest.update(block)
                try:
                    text = rest + decoder.decode(block, final=not block)
                except UnicodeDecodeError:
                    raise UserError(f"trace {self.path}: not UTF-8 text") from None
                if not block:
                    if text:
                        yield text
                    return
                lines = text.split("\n")
                rest = lines.pop()
                for line in lines:
                    yield line + "\n"


#: longest length a trace may give (2^40 tokens; keeps every sum well inside int64)
MAX_LENGTH = 1 << 40


def _bad_value(path: Path, line: int, what: str, minimum: int, value: str) -> UserError:
    try:
        huge = int(value) > MAX_LENGTH
    except ValueError:
        huge = False
    if huge:
        return UserError(f"trace {path} line {line}: {what} length {value} exceeds 2^40 tokens")
    return UserError(
        f"trace {path} line {line}: {what} length must be an integer >= {minimum}, got {value!r}"
    )


def _to_int(cells: list[str], path: Path, lines: list[int], what: str, minimum: int) -> np.ndarray:
    """Vectorised integer conversion of a chunk; the first bad cell is reported by line."""
    try:
        arr = np.array([c.strip() for c in cells]).astype(np.int64)
        bad = np.flatnonzero((arr < minimum) | (arr > MAX_LENGTH))
    except (ValueError, OverflowError):
        arr, bad = None, None
    if arr is not None and bad.size == 0:
        return arr
    for i, cell in enumerate(cells):
        try:
            ok = minimum <= int(cell.strip()) <= MAX_LENGTH
        except ValueError:
            ok = False
        if not ok:
            raise _bad_value(path, lines[i], what, minimum, cell.strip())
    raise AssertionError("unreachable")


def _output_message(fmt: str) -> tuple[str, str]:
    return ("prompt", "decode") if fmt == "afd" else ("prompt", "output")


def _csv_columns(header: list[str], path: Path) -> tuple[str, int, int]:
    cols = [h.strip().lower() for h in header]
    for fmt, (pc, oc) in CSV_FORMATS.items():
        if pc in cols and oc in cols:
            return fmt, cols.index(pc), cols.index(oc)
    ip = next((cols.index(c) for c in LEGACY_PROMPT if c in cols), None)
    idc = next((cols.index(c) for c in LEGACY_DECODE if c in cols), None)
    if ip is not None and idc is not None:
        return "afd", ip, idc
    raise UserError(
        f"trace {path}: unknown header {','.join(h.strip() for h in header)[:120]!r}; expected "
        "Azure (ContextTokens,GeneratedTokens), BurstGPT (Request tokens,Response tokens), "
        "Vidur (num_prefill_tokens,num_decode_tokens), prompt_tokens,output_tokens, "
        "prompt,decode, or Mooncake JSONL (input_length,output_length)"
    )


def _read_csv(lines: Iterator[str], first: str, path: Path):
    reader = csv.reader(_chain(first, lines))
    header = next(reader)
    fmt, ip, io = _csv_columns(header, path)
    pw, ow = _output_message(fmt)
    need = max(ip, io)
    width = len(header)
    chunks_p: list[np.ndarray] = []
    chunks_o: list[np.ndarray] = []
    cp: list[str] = []
    co: list[str] = []
    ln: list[int] = []

    def flush() -> None:
        chunks_p.append(_to_int(cp, path, ln, pw, 0))
        chunks_o.append(_to_int(co, path, ln, ow, 1))
        cp.clear()
        co.clear()
        ln.clear()

    for row in reader:
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) <= need:
            raise UserError(
                f"trace {path} line {reader.line_num}: expected {width} columns, got {len(row)}"
            )
        cp.append(row[ip])
        co.append(row[io])
        ln.append(reader.line_num)
        if len(cp) >= _CHUNK_ROWS:
            flush()
    if cp:
        flush()
    return fmt, chunks_p, chunks_o


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest


def _read_jsonl(lines: Iterator[str], first: str, path: Path):
    ps = np.empty(_CHUNK_ROWS, np.int64)
    os_ = np.empty(_CHUNK_ROWS, np.int64)
    chunks_p: list[np.ndarray] = []
    chunks_o: list[np.ndarray] = []
    n = 0
    for number, line in enumerate(_chain(first, lines), start=1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise UserError(f"trace {path} line {number}: not a JSON object") from None
        if not isinstance(obj, dict) or not all(k in obj for k in JSONL_KEYS):
            raise UserError(
                f"trace {path} line {number}: expected a JSON object with input_length and "
                "output_length"
            )
        for key, minimum, what, dest in (
            ("input_length", 0, "prompt", ps), ("output_length", 1, "output", os_)
        ):
            v = obj[key]
            if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= MAX_LENGTH:
                raise _bad_value(path, number, what, minimum, str(v))
            dest[n] = v
        n += 1
        if n == _CHUNK_ROWS:
            chunks_p.append(ps.copy())
            chunks_o.append(os_.copy())
            n = 0
    chunks_p.append(ps[:n].copy())
    chunks_o.append(os_[:n].copy())
    return "mooncake", chunks_p, chunks_o


def read_trace(path: str | Path) -> Trace:
    """Read a request trace (format recognised from the header), streaming, with its sha256.

    Formats: Azure LLM CSV, BurstGPT CSV, Vidur CSV, ``prompt_tokens,output_tokens`` CSV, the
    AFD ``prompt,decode`` CSV, Mooncake JSONL. Every request needs a prompt length >= 0 and
    an output length >= 1; the first bad row is reported by its line (the header is line 1).
    """
    path = Path(path)
    src = _HashingLines(path)
    lines = iter(src)
    first = None
    for line in lines:
        if line.strip():
            first = line
            break
    if first is None:
        raise UserError(f"trace {path}: empty file; expected a header line and requests")
    if first.lstrip().startswith("{"):
        fmt, cp, co = _read_jsonl(lines, first, path)
    else:
        fmt, cp, co = _read_csv(lines, first, path)
    for _ in lines:  # both readers consume every line; this only guarantees a full hash
        pass
    prompt = np.concatenate(cp) if cp else np.empty(0, np.int64)
    output = np.concatenate(co) if co else np.empty(0, np.int64)
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
    except OSError:
        return None
    return None if st is None else (resolved, st.st_mtime_ns, st.st_size)


def trace_sha256(workload: str | os.PathLike) -> str | None:
    """The sha256 of a trace file (read once, as a request would), None for a law or an inline
    law: tells whether another path holds the same trace."""
    path = Path(workload).expanduser()
    if not path.is_file() or path.suffix.lower() == ".toml":
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


def _trace_pmf(prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """Dense stationary context law of a trace: request i covers contexts [P_i, P_i + D_i)
    with one unit of mass each, normalised by sum(D)."""
    end = prompt + output
    size = int(end.max())
    if size > MAX_SUPPORT:
        raise UserError(f"workload: contexts up to {size} tokens; give --max-model-len")
    diff = np.bincount(prompt, minlength=size + 1).astype(np.float64)
    diff -= np.bincount(end, minlength=size + 1)
    pmf = np.cumsum(diff)[:size]
    return pmf / output.sum(dtype=np.float64)


def _scaled(prompt: np.ndarray, s: float) -> np.ndarray:
    return np.rint(prompt * s).astype(np.int64)


def _solve_scale(theta_at, target: float, what: str) -> float:
    """A prompt scale s >= 0 with θ(s) closest to ``target`` (θ nondecreasing in s).

    θ(s) is close to affine (θ(0) + s (θ(1) - θ(0))), so the first guess is that line's root;
    a bracket is grown geometrically around it, then secant steps safeguarded by bisection.
    """
    t0 = theta_at(0.0)
    if target < t0 - 0.5:
        raise UserError(
            f"--scale-ctx: {target:g} tokens is below {t0:.1f}, the mean context the outputs "
            f"alone give {what}; no prompt scaling reaches it"
        )
    t1 = theta_at(1.0)
    guess = (target - t0) / (t1 - t0) if t1 > t0 else 1.0
    if guess <= 0:
        return 0.0
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
    if lo == 0.0 and guess > 0:
        probe = guess / 1.001
        t_probe = theta_at(probe)
        if t_probe < target:
            lo, t_lo = probe, t_probe
    best = min((abs(t_lo - target), lo), (abs(t_hi - target), hi))
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
    pmf = _trace_pmf(p, o)
    p.setflags(write=False)
    o.setflags(write=False)
    return Workload(spec, pmf, theta, nu2, float(p.mean()), float(o.mean()),
                    int(p.min()), int((p + o).max() - 1), int(p.size), clipped, dropped,
                    scale, p, o)


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
        if not kept > 0:
            raise UserError(f"workload: no request fits --max-model-len {L}")
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
        if not kept > 0:
            raise UserError(f"workload: no request fits --max-model-len {L}")
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
            if s == 0.0:
                return _pmf_moments(build(LengthLaw(dist="fixed", mean=0.0))[0])[0]
            return _pmf_moments(build(scaled_law(spec.prompt, s))[0])[0]

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
