"""User-facing errors and the one exit-code map every command follows.

The CLI turns these into a single stderr line and an exit code; the library
raises them so tests can assert on messages without a subprocess.
"""

from __future__ import annotations

import re

EXIT_OK = 0
EXIT_CHANGED = 1  # simulate / diff / regen: a real difference was found (never a crash)
EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away (e.g. `| head`)

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success (plan found, nothing changed)",
    EXIT_CHANGED: "a real change (simulate, diff, regen)",
    EXIT_BAD_INPUT: "bad input: one line naming the field or file",
    EXIT_INFEASIBLE: "no feasible plan: one line naming the binding constraint",
    EXIT_INTERNAL: "internal error: one line; rerun with --debug for the traceback",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
    EXIT_BROKEN_PIPE: "stdout closed early by its reader",
    EXIT_TERMINATED: "terminated (SIGTERM)",
}
"""Documented exit codes (the README's table is generated from / checked against this)."""


# characters that must never reach a terminal raw: C0/C1 controls (ANSI escapes, newlines),
# DEL, lone surrogates, line/paragraph separators and the bidi overrides
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: object) -> str:
    """``text`` with every control character escaped (``\\x1b``, ``\\n``): a file name or a
    string read from a file can then never move the cursor, recolour or split a line."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"),
                            str(text))


def one_line(text: object, limit: int = 400) -> str:
    """Collapse whitespace, escape what is left unprintable and cap the length: every message the
    CLI prints is one line that cannot move the cursor or recolour the terminal."""
    line = printable(" ".join(str(text).split()))
    return line if len(line) <= limit else line[: limit - 1] + "…"


class UserError(Exception):
    """Bad input from the user (exit code 2)."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message, limit=2000))


class InfeasibleError(UserError):
    """No plan satisfies the constraints; the message names the binding one (exit code 3)."""

    exit_code = EXIT_INFEASIBLE


class InternalError(RuntimeError):
    """A broken invariant of ours, not the user's input (exit code 4, never 1)."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message, limit=2000))


class Terminated(BaseException):
    """SIGTERM turned into an exception so `finally` blocks and pools shut down (exit 143).

    A BaseException like KeyboardInterrupt, so `except Exception` never swallows it; not a
    KeyboardInterrupt subclass, because typer turns those into a bare exit 130.
    """

    exit_code = EXIT_TERMINATED


def exit_code_for(exc: BaseException) -> int:
    """The documented exit code of an exception that ended a command."""
    if isinstance(exc, Terminated):
        return EXIT_TERMINATED
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, UserError | InternalError):
        return exc.exit_code
    if isinstance(exc, BrokenPipeError):
        return EXIT_BROKEN_PIPE
    return EXIT_INTERNAL
