"""The one way a generated script is written: every word quoted, the only expansions named `Var`s.

Every generated script is code people run as root, so it is written from three kinds of line
only: comments (`comment`: any text, made one printable line), fixed template lines whose only
interpolations are checked integers (`integer`), and commands and assignments whose every word
goes through `quote`. `quote` single-quotes any `str` (shlex.quote), so no input string can
expand, end a quote or start a new command; the only expansions a script makes are `Var`s, which
input never is: exporter code names them, and their names and defaults are plain words.
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING, Any

from opweave_planner.errors import InternalError, printable

if TYPE_CHECKING:
    from opweave_planner.export.base import Context

_VAR_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
_VAR_TEXT = re.compile(r"[A-Za-z0-9 ._/-]*")  # a `${NAME:-default}` or `${NAME:?message}` argument


class Var:
    """A `${NAME}` (`${NAME:-default}`, `${NAME:?message}`) the script expands on purpose.

    Checked on construction, so even exporter code cannot hide a command substitution in one.
    """

    __slots__ = ("text",)

    def __init__(self, name: str, default: str | None = None, required: str | None = None) -> None:
        if not _VAR_NAME.fullmatch(name) or (default is not None and required is not None):
            raise ValueError(f"not a script variable: {name!r}")
        op, arg = (":-", default) if default is not None else (":?", required) if required is not None \
            else ("", "")
        if not _VAR_TEXT.fullmatch(arg):
            raise ValueError(f"not a plain default or message: {arg!r}")
        self.text = "${" + name + op + arg + "}"

    def __repr__(self) -> str:
        return f"Var({self.text})"


class Word(tuple):
    """One shell word joined from fixed text and `Var`s, e.g. `"http://${HOST}:${PORT}"`."""

    def __new__(cls, *parts: str | Var) -> Word:
        return super().__new__(cls, parts)


ShellWord = str | Var | Word
_DOUBLE_QUOTED = str.maketrans({c: "\\" + c for c in '\\"$`'})


def quote(word: ShellWord) -> str:
    """The word as bash reads it back unchanged: any `str` single-quoted (it never expands), a
    `Var` or `Word` double-quoted with everything but its `Var`s escaped."""
    if isinstance(word, Var):
        return f'"{word.text}"'
    if isinstance(word, Word):
        return '"' + "".join(p.text if isinstance(p, Var) else _plain(p).translate(_DOUBLE_QUOTED)
                             for p in word) + '"'
    return shlex.quote(_plain(word))


def _plain(text: str) -> str:
    """A string may become a script word if it is one line of printable text: a NUL cannot be in a
    script at all, and a control character would hide the word from a reader of the file."""
    if not isinstance(text, str) or not clean(text):
        raise InternalError(f"generated script: refused the word {printable(str(text))!r}; input "
                            f"names are checked where they enter")
    return text


def clean(text: str) -> bool:
    """One line of text a terminal shows as it is: nothing `printable` would escape (no control
    character, line separator or bidi override)."""
    return printable(text) == text


def comment(text: str) -> str:
    return "# " + printable(text)


def integer(value: Any) -> str:
    """An int for a template line; anything else (a string from a tampered plan) is a bug here."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InternalError(f"generated script: expected an integer, got {type(value).__name__}")
    return str(value)


def number(value: Any) -> str:
    """A plan figure as a script word: the repr of a real number, never text."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InternalError(f"generated script: expected a number, got {type(value).__name__}")
    return repr(value)


def assign(name: str, value: ShellWord, note: str = "") -> str:
    """`NAME=value` (`export NAME=value` for a name the runtime reads), quoted like any word."""
    Var(name)  # the name is checked like a Var's
    return f"{name}={quote(value)}" + (f"  {comment(note)}" if note else "")


def _is_flag(word: ShellWord) -> bool:
    return isinstance(word, str) and word.startswith("-")


def shell_command(argv: list[ShellWord], indent: str = "  ") -> str:
    """One argument (or flag with its value) per continued line, every word through `quote`."""
    i = 0
    while i < len(argv) and (not _is_flag(argv[i]) or (argv[i] == "-m" and i == 1)):
        i += 1 + (argv[i] == "-m")
    parts: list[str] = [" ".join(quote(w) for w in argv[:i])] if i else []
    while i < len(argv):
        word = argv[i]
        if _is_flag(word) and i + 1 < len(argv) and not _is_flag(argv[i + 1]):
            parts.append(f"{quote(word)} {quote(argv[i + 1])}")
            i += 2
        else:
            parts.append(quote(word))
            i += 1
    return (" \\\n" + indent).join(parts)


def script(lines: list[str]) -> bytes:
    """The script file; a last check that no line holds a control character (only `quote`d words,
    `comment`s and template lines reach here, so one would be a bug in this package)."""
    text = "#!/usr/bin/env bash\n" + "\n".join(lines).rstrip("\n") + "\n"
    if not all(clean(line) for line in text.split("\n")):
        raise InternalError("generated script: a line holds a control character")
    return text.encode()


def header(ctx: Context, what: str) -> list[str]:
    """What the script is and which plan it came from, as comments (names made printable)."""
    p = ctx.plan
    alt = f", alternative '{ctx.alternative}'" if ctx.alternative else ""
    agg = ctx.aggregated
    if agg is None:
        shape = (f"  {integer(p.gpus_total)} GPUs, global batch {integer(p.global_batch)}, context "
                 f"{integer(p.workload.context_tokens)} tokens (window {integer(p.workload.window)}), predicted "
                 f"TPOT {p.tpot_ms:.6g} ms (SLO {p.workload.tpot_slo_ms:g} ms).")
        deployed = (f"  Deployment: {ctx.copies} cop{'y' if ctx.copies == 1 else 'ies'} of the plan"
                    + (" (it records no sizing)." if ctx.deployment is None else " (its deployment sizing)."))
    else:
        shape = (f"  aggregated mode: {integer(agg.gpus)} GPUs, max-num-seqs {integer(agg.batch)}, chunk "
                 f"{integer(agg.chunk_tokens)} tokens, window {integer(p.workload.window)}, replayed p"
                 f"{agg.tpot_percentile:g} TPOT {agg.tpot_ms:.6g} ms (SLO {p.workload.tpot_slo_ms:g} ms), TTFT "
                 f"{agg.ttft_ms:.6g} ms.")
        deployed = (f"  Deployment: {integer(agg.replicas)} replicas of {agg.gpu} TP{integer(agg.tensor_parallel)} "
                    f"serving prefill and decode (deployment.aggregated; no prefill pool).")
    return [
        comment(what),
        comment(f"Generated by opweave-plan export --to {ctx.target.name} (runtime {ctx.version}) from {p.model} "
                f"plan ({p.policy}{alt}):"),
        comment(shape),
        comment(deployed),
        "set -euo pipefail",
    ]
