"""The console-script guard: every way a command can end maps to one line and a documented code.

``run_cli(app)`` is what ``cli/main.py:run()`` calls. It maps

* `UserError` -> ``error: <line>`` (``infeasible: <line>`` for `InfeasibleError`), its code;
* click/typer usage errors -> one line naming the flag (not typer's 4-line box), exit 2;
* Ctrl-C -> ``interrupted``, 130; SIGTERM -> ``terminated``, 143;
* a closed stdout (``| head``) -> silent, 141;
* an OSError about a named path (missing, unreadable, a folder, name too long) that escaped
  the edge checks -> ``error: '<path>': <reason>``, exit 2;
* anything else -> ``internal error: <Type>: <msg> (rerun with --debug ...)``, exit 4,
  with the traceback only under ``--debug`` (stripped from argv) or ``OPWEAVE_DEBUG=1``.

Never exit 1 for a crash: 1 means "a real change" (simulate/diff/regen).
Only the standard library and our errors/procs load here (click classes are matched by
name, since typer >= 0.2x vendors its own copy as typer._click).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from opweave_planner.errors import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    InfeasibleError,
    InternalError,
    Terminated,
    UserError,
    one_line,
)

DEBUG_FLAG = "--debug"
DEBUG_ENV = "OPWEAVE_DEBUG"


def debug_requested(argv: Sequence[str], environ=os.environ) -> bool:
    """``--debug`` anywhere before ``--``, or OPWEAVE_DEBUG set to 1/true/yes."""
    head = list(argv)[: list(argv).index("--")] if "--" in argv else list(argv)
    return DEBUG_FLAG in head or environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes")


def strip_debug(argv: Sequence[str]) -> list[str]:
    """argv without ``--debug`` (the app never has to declare it)."""
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    return [a for a in argv[:cut] if a != DEBUG_FLAG] + argv[cut:]


def _is(exc: BaseException, name: str) -> bool:
    """Match click's exception classes by name: typer may vendor its own click (typer._click)."""
    return any(c.__name__ == name and c.__module__.split(".")[0] in ("click", "typer")
               for c in type(exc).__mro__)


def _param_name(exc: Any) -> str | None:
    param = getattr(exc, "param", None)
    if param is None:
        return getattr(exc, "param_hint", None) if isinstance(getattr(exc, "param_hint", None), str) else None
    opts = [o for o in getattr(param, "opts", []) or [] if o.startswith("--")] or list(getattr(param, "opts", []) or [])
    if opts:
        return max(opts, key=len)
    return (getattr(param, "human_readable_name", None) or getattr(param, "name", None) or "").upper() or None


_PYDANTIC_KINDS = {"int_parsing": "is not an integer", "float_parsing": "is not a number",
                   "bool_parsing": "is not true/false", "int_from_float": "is not an integer"}


def _pydantic_reason(exc: BaseException) -> str | None:
    """typer >= 0.2x converts values with pydantic: name the value, e.g. "'abc' is not an integer"."""
    cause = exc.__cause__
    errs = getattr(cause, "errors", None)
    if not callable(errs):
        return None
    try:
        first = errs()[0]
    except (IndexError, TypeError, ValueError):
        return None
    kind = _PYDANTIC_KINDS.get(first.get("type", ""))
    value = first.get("input")
    text = kind or one_line(first.get("msg", "")).rstrip(".")
    return f"{value!r} {text}" if kind else f"{value!r}: {text}"


def usage_line(exc: Any) -> str:
    """One line for a click usage error: ``--max-gpus: 'abc' is not a valid integer``."""
    msg = one_line(getattr(exc, "message", None) or exc).rstrip(".")
    name = _param_name(exc)
    if _is(exc, "MissingParameter") and name:
        return f"{name}: required"
    if _is(exc, "BadParameter") and name:
        return f"{name}: {_pydantic_reason(exc) or msg}"
    text = one_line(exc.format_message()) if hasattr(exc, "format_message") else msg
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", None)
    return f"{text.rstrip('.')} (see '{path} --help')" if path else text.rstrip(".")


def _cause_interrupt(exc: BaseException) -> BaseException | None:
    """click turns Ctrl-C into Abort; find the KeyboardInterrupt (or Terminated) behind it."""
    seen = exc
    for _ in range(8):
        seen = seen.__cause__ or seen.__context__
        if seen is None:
            return None
        if isinstance(seen, KeyboardInterrupt | Terminated):
            return seen
    return None


def _print(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # stderr is gone too; the exit code still tells
        print(line, file=sys.stderr, flush=True)


def handle(exc: BaseException, debug: bool) -> int:
    """Print the one line for ``exc`` (and the traceback under debug); return the exit code."""
    if debug and not isinstance(exc, KeyboardInterrupt | Terminated):
        traceback.print_exception(exc, file=sys.stderr)
    if _is(exc, "Abort"):
        inner = _cause_interrupt(exc)
        exc = inner if inner is not None else KeyboardInterrupt()
    if isinstance(exc, Terminated):
        _print("terminated")
        return EXIT_TERMINATED
    if isinstance(exc, KeyboardInterrupt):
        _print("interrupted")
        return EXIT_INTERRUPTED
    if isinstance(exc, InfeasibleError):
        _print(f"infeasible: {exc}")
        return exc.exit_code
    if isinstance(exc, UserError):
        _print(f"error: {exc}")
        return exc.exit_code
    if _is(exc, "UsageError"):
        _print(f"error: {usage_line(exc)}")
        return EXIT_BAD_INPUT
    if _is(exc, "ClickException"):  # e.g. click.FileError: bad input, never exit 1
        _print(f"error: {one_line(exc.format_message())}")
        return EXIT_BAD_INPUT
    if isinstance(exc, BrokenPipeError):
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    path_line = _path_error(exc)
    if path_line is not None:
        _print(f"error: {path_line}")
        return EXIT_BAD_INPUT
    hint = "" if debug else " (rerun with --debug for the traceback)"
    if isinstance(exc, InternalError):
        _print(f"internal error: {exc}{hint}")
    else:
        _print(f"internal error: {type(exc).__name__}: {one_line(exc)}{hint}")
    return EXIT_INTERNAL


# OS errors that mean "this path the user named is not what it must be" (bad input, exit 2)
_PATH_ERRNOS = frozenset({errno.ENOENT, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR,
                          errno.ENAMETOOLONG, errno.ELOOP, errno.ENXIO})


def _path_error(exc: BaseException) -> str | None:
    """One line for an OSError about a named path that escaped the edge checks, else None.

    The edge (atomic.read_input, check_writable) names the flag; this last resort still names
    the file, so a missed check is exit 2 and one line, never a traceback or exit 4.
    """
    if not isinstance(exc, OSError) or exc.errno not in _PATH_ERRNOS or not exc.filename:
        return None
    name = os.fsdecode(exc.filename)
    shown = name if len(name) <= 80 else name[:60] + "…" + name[-16:]
    return one_line(f"'{shown}': {exc.strerror or exc}")


def _silence_stdout() -> None:
    """After EPIPE, point stdout at /dev/null so the interpreter's final flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _exit_code(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    _print(f"error: {one_line(value)}")  # sys.exit("message") style
    return EXIT_BAD_INPUT


def invoke(app: Any, argv: Sequence[str] | None = None, prog_name: str | None = None,
           install_signals: bool = True) -> int:
    """Run ``app`` (typer or click) on ``argv`` and return the documented exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = debug_requested(argv)
    args = strip_debug(argv)
    if install_signals:
        from opweave_planner.procs import install_sigterm_handler

        install_sigterm_handler()
    try:
        try:
            rc = app(args=args, prog_name=prog_name, standalone_mode=False)
            sys.stdout.flush()
        except SystemExit as exc:
            rc = exc.code
            if type(sys.stdout).__name__ == "PacifyFlushWrapper":
                # click's answer to EPIPE on stdout is sys.exit(1), which would read as "changed"
                _silence_stdout()
                return EXIT_BROKEN_PIPE
        code = _exit_code(rc)
        if code == EXIT_INTERRUPTED:  # typer >= 0.2x turns KeyboardInterrupt into Exit(130)
            _print("interrupted")
        return code
    except BaseException as exc:  # the one place that maps them all
        if _is(exc, "Exit") and isinstance(getattr(exc, "exit_code", None), int):
            return exc.exit_code  # typer.Exit / click Exit raised outside a command body
        return handle(exc, debug)


def run_cli(app: Any, argv: Sequence[str] | None = None, prog_name: str | None = None) -> NoReturn:
    """Console-script entry: `invoke`, then exit with its code."""
    code = invoke(app, argv, prog_name=prog_name)
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        _silence_stdout()
        code = code or EXIT_BROKEN_PIPE
    sys.exit(code)
