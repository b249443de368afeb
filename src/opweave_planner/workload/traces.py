"""The trace formats, declared once: the reader recognises a file by them, and every help text,
error and docs table that lists formats is generated from them.

Adding a CSV format is one `TraceFormat` in `_DECLARED` (and its row in docs/workloads.md, which
a test keeps equal to `docs_table()`); a JSON lines format with other keys needs the JSONL
kernel to take its keys too (scan.py reads the one JSONL format's keys as constants). Standard
library only, so `--help` can read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from opweave_planner.errors import UserError

__all__ = ["FORMATS", "JSONL", "TraceFormat", "csv_columns", "docs_table", "listing", "suffixes", "words"]


@dataclass(frozen=True)
class TraceFormat:
    """One trace format: how a file of it is recognised and where its two lengths are.

    ``prompt``/``output`` are the column names (CSV, matched case-insensitively; a header may
    name any one of several) or the JSON keys (JSONL, exact) of a request's prompt length and
    of its output length, the number of decode steps it occupies its slot."""

    name: str  # what the plan records (`workload.distribution.format`)
    label: str  # how help and errors call it
    prompt: tuple[str, ...]
    output: tuple[str, ...]
    source: str  # where such traces come from (docs)
    jsonl: bool = False  # JSON lines (the JSONL kernel) instead of CSV
    suffixes: tuple[str, ...] = (".csv",)
    output_word: str = "output"  # what errors call the output length
    columns_in_help: bool = False  # help names it by its columns (its label names no source)
    note: str = ""  # docs: what else its files carry

    def __post_init__(self) -> None:
        if not (self.name.islower() and self.prompt and self.output and self.suffixes):
            raise ValueError(f"trace format {self.name!r}: a lower-case name, prompt and output names "
                             "and a file suffix")
        if self.jsonl and (len(self.prompt), len(self.output)) != (1, 1):
            raise ValueError(f"trace format {self.name!r}: a JSONL format has one key of each")

    @property
    def kind(self) -> str:
        return "JSONL" if self.jsonl else "CSV"

    @property
    def pair(self) -> str:
        """'ContextTokens,GeneratedTokens': its first prompt and output names."""
        return f"{self.prompt[0]},{self.output[0]}"

    def match(self, cols: list[str], path: Path) -> tuple[int, int] | None:
        """(prompt column, output column) of a lower-cased CSV header, None if it is not this
        format's; a header naming two columns of one kind is refused (which one is a guess)."""
        found = [[c for c in (n.lower() for n in names) if c in cols] for names in (self.prompt, self.output)]
        if not (found[0] and found[1]):
            return None
        for named in found:
            if len(named) > 1:
                raise UserError(f"trace {path}: the header names two columns of one kind "
                                f"({named[0]!r}, {named[1]!r}); keep one")
        return cols.index(found[0][0]), cols.index(found[1][0])


_DECLARED = (
    TraceFormat("azure", "Azure", ("ContextTokens",), ("GeneratedTokens",),
                "Azure LLM inference traces 2023/2024", note="with `TIMESTAMP`"),
    TraceFormat("burstgpt", "BurstGPT", ("Request tokens",), ("Response tokens",), "BurstGPT"),
    TraceFormat("vidur", "Vidur", ("num_prefill_tokens",), ("num_decode_tokens",), "Vidur request traces"),
    TraceFormat("plain", "plain", ("prompt_tokens",), ("output_tokens",), "anything else, written by hand",
                columns_in_help=True),
    TraceFormat("afd", "AFD", ("prompt", "prompt_len", "prompt_tokens"), ("decode", "decode_len", "decode_tokens"),
                "the `afd --trace` CSV of earlier releases", output_word="decode", columns_in_help=True),
    TraceFormat("mooncake", "Mooncake", ("input_length",), ("output_length",), "Mooncake FAST'25 traces",
                jsonl=True, suffixes=(".jsonl",)),
)

#: every format by name, in the order help, errors and docs list them
FORMATS: Mapping[str, TraceFormat] = MappingProxyType({f.name: f for f in _DECLARED})
_JSONL = [f for f in _DECLARED if f.jsonl]
if len(_JSONL) != 1 or len(FORMATS) != len(_DECLARED):
    raise ValueError("trace formats: unique names and one JSONL format (its keys are the JSONL kernel's)")
#: the JSON lines format: a file whose first non-blank line starts with '{'
JSONL: TraceFormat = _JSONL[0]


def words(fmt: str) -> tuple[str, str]:
    """What errors call a request's two lengths in format ``fmt``: ('prompt', 'output')."""
    return "prompt", FORMATS[fmt].output_word


def suffixes() -> tuple[str, ...]:
    """The file suffixes of trace files (lower case), in declaration order."""
    return tuple(dict.fromkeys(s for f in FORMATS.values() for s in f.suffixes))


def _named(f: TraceFormat) -> str:
    return f"{f.label} ({f.pair})" if f.columns_in_help else f.label


def _either(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def listing() -> str:
    """The formats as help lists them: 'Azure, BurstGPT, ... CSV, Mooncake JSONL'."""
    groups = []
    for jsonl in (False, True):
        names = [_named(f) for f in FORMATS.values() if f.jsonl == jsonl]
        if names:
            groups.append(f"{_either(names)} {'JSONL' if jsonl else 'CSV'}")
    return ", ".join(groups)


def _expected() -> str:
    """Every format with its prompt and output names, for the unknown-header error."""
    return ", ".join(f"{f.label} {f.kind} ({f.pair})" for f in FORMATS.values())


def csv_columns(header: list[str], path: Path) -> tuple[str, int, int]:
    """(format, prompt column, output column) of a CSV header; a header that repeats a name or
    names the columns of two formats is refused (which pair was meant is a guess)."""
    cols = [h.strip().lower() for h in header]
    for i, name in enumerate(cols):
        if name and name in cols[:i]:
            raise UserError(f"trace {path}: column {header[i].strip()!r} appears twice in the header")
    found = []
    for f in FORMATS.values():
        at = None if f.jsonl else f.match(cols, path)
        if at is not None:
            found.append((f.name, *at))
    if len(found) > 1:
        pairs = " and ".join(f"{fmt} ({header[i].strip()},{header[o].strip()})" for fmt, i, o in found[:2])
        raise UserError(f"trace {path}: the header names the columns of two formats, {pairs}; "
                        "keep one prompt and one output column")
    if found:
        return found[0]
    raise UserError(
        f"trace {path}: unknown header {','.join(h.strip() for h in header)[:120]!r}; expected the "
        f"columns of one format: {_expected()}"
    )


def docs_table() -> str:
    """The table of formats docs/workloads.md carries (a test keeps the two equal)."""
    rows = []
    for f in FORMATS.values():
        if len(f.prompt) > 1 or len(f.output) > 1:
            head = (f"one of {'/'.join(f'`{n}`' for n in f.prompt)} and one of "
                    f"{'/'.join(f'`{n}`' for n in f.output)}")
        else:
            head = f"`{f.prompt[0]}`, `{f.output[0]}`"
        if f.jsonl:
            head = f"JSON lines with {head}"
        if f.note:
            head += f" ({f.note})"
        rows.append(f"| `{f.name}` | {head} | {f.source} |")
    return "\n".join(["| format | header (prompt, output) | source |", "|---|---|---|", *rows])
