"""The edge: ``--ctx`` / ``--workload`` text and the shaping settings -> one validated spec.

A trace is read once here (format, sha256, rows, every row checked) and the spec shaped, so
bad input fails before any search.
"""

from __future__ import annotations

import os
from pathlib import Path

from opweave_planner.atomic import check_input_file
from opweave_planner.errors import UserError
from opweave_planner.inputs.units import parse_tokens
from opweave_planner.workload.law import ContextLaw
from opweave_planner.workload.reader import read_once
from opweave_planner.workload.shaping import materialize
from opweave_planner.workload.spec import (
    LAW_SUFFIX,
    FixedContextSpec,
    LawSpec,
    TraceSpec,
    is_inline_law,
    parse_law,
    parse_law_file,
    parse_overflow,
)

__all__ = ["trace_workload", "workload_spec"]


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
    inline = is_inline_law(text)
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
        if path.suffix.lower() == LAW_SUFFIX:
            prompt, output = parse_law_file(path, field)
            spec = LawSpec(prompt=prompt, output=output, **shaped)
        else:
            tr = read_once(path)
            spec = TraceSpec(path=tr.path, format=tr.format, sha256=tr.sha256, rows=tr.rows,
                             **shaped)
    else:
        prompt, output = parse_law(text, field)
        spec = LawSpec(prompt=prompt, output=output, **shaped)
    if shape:
        materialize(spec)  # every shaping error (unreachable --scale-ctx, nothing fits) here
    return spec


def trace_workload(path: str | Path, **shaping) -> ContextLaw:
    """Shortcut: read ``path`` and materialise it (``scale_ctx``, ``max_model_len``,
    ``overflow`` as in :func:`workload_spec`)."""
    return materialize(workload_spec(workload=str(path), **shaping))
