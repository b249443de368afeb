"""Typer options derived from `PlanRequest`: a setting's flag, type and help live on its field.

`with_settings(names)` adds one option per named field to a command and hands the
command the given values as a `settings` dict (None = not given, so the field's
default applies when the request is built). No command re-declares a setting.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any, Optional

import typer

from opweave_planner.inputs.request import PlanRequest, field_meta

_SCALAR = {int: int, float: float, bool: bool, str: str}


def _annotation(name: str) -> Any:
    meta = field_meta(name)
    if meta.get("cli") == "str":
        return Optional[str]  # noqa: UP045
    ann = PlanRequest.model_fields[name].annotation
    for base, cli in _SCALAR.items():
        if ann is base or ann == (base | None):
            return Optional[cli]  # noqa: UP045
    return Optional[str]  # noqa: UP045  (enums, tuples: parsed by the request's validators)


def _option(name: str) -> Any:
    meta = field_meta(name)
    field = PlanRequest.model_fields[name]
    flags = meta.get("flags") or [f"--{name.replace('_', '-')}"]
    help_text = field.description or ""
    if field.is_required():
        help_text += " (required)"
    elif field.default not in (None, (), ""):
        default = field.default
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else getattr(default, "value", default)
        if not isinstance(default, bool):
            help_text += f" [default: {shown}]"
    return typer.Option(None, *flags, help=help_text, show_default=False)


def setting_parameters(names: Sequence[str]) -> list[inspect.Parameter]:
    return [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=_option(n), annotation=_annotation(n))
            for n in names]


def with_settings(names: Sequence[str]) -> Callable:
    """Decorate a command whose last parameter is `settings: dict` with options for `names`."""
    names = tuple(names)

    def deco(func: Callable) -> Callable:
        sig = inspect.signature(func)
        hints = typing.get_type_hints(func)
        own = [p.replace(annotation=hints.get(p.name, p.annotation))
               for p in sig.parameters.values() if p.name != "settings"]

        @functools.wraps(func)
        def wrapper(*args: Any, **kw: Any) -> Any:
            settings = {n: kw.pop(n, None) for n in names}
            return func(*args, **kw, settings=settings)

        params = own + setting_parameters(names)
        # keyword-only after positional-or-keyword typer parameters
        wrapper.__signature__ = sig.replace(parameters=[
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD
            and p.annotation is not typer.Context else p for p in params])
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__
        return wrapper

    return deco


def all_settings(exclude: Sequence[str] = ()) -> tuple[str, ...]:
    return tuple(n for n in PlanRequest.model_fields if n not in exclude)
