"""Typer options derived from request models: a setting's flag, type and help live on its field.

`with_settings(names)` adds one option per named field of a model (`PlanRequest` unless told
otherwise: `afd`'s and `compare`'s requests are built the same way) to a command and hands the
command the given values as a dict (None = not given, so the field's default applies when the
request is built with `build`). No command re-declares a setting.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any, Optional

import typer
from pydantic import BaseModel, ValidationError

from opweave_planner.errors import UserError
from opweave_planner.inputs.request import PlanRequest

_SCALAR = {int: int, float: float, bool: bool, str: str}
Model = type[BaseModel]


def meta(model: Model, name: str) -> dict[str, Any]:
    """A field's CLI metadata (`flags`, `cli`), kept in its json_schema_extra."""
    extra = model.model_fields[name].json_schema_extra
    return extra if isinstance(extra, dict) else {}


def flags(model: Model, name: str) -> list[str]:
    """A field's CLI spellings: its declared flags, else `--the-name`."""
    return meta(model, name).get("flags") or [f"--{name.replace('_', '-')}"]


def flag(model: Model, name: str) -> str:
    """The spelling an error names (the first flag, without its `/--no-` half)."""
    return flags(model, name)[0].split("/")[0]


def _annotation(model: Model, name: str) -> Any:
    if meta(model, name).get("cli") == "str":
        return Optional[str]  # noqa: UP045
    ann = model.model_fields[name].annotation
    for base, cli in _SCALAR.items():
        if ann is base or ann == (base | None):
            return Optional[cli]  # noqa: UP045
    return Optional[str]  # noqa: UP045  (enums, tuples: parsed by the request's validators)


def _option(model: Model, name: str) -> Any:
    field = model.model_fields[name]
    help_text = field.description or ""
    if field.is_required():
        help_text += " (required)"
    elif field.default not in (None, (), ""):
        default = field.default
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else getattr(default, "value", default)
        if not isinstance(default, bool):
            help_text += f" [default: {shown}]"  # plain click help (cli/main.py): no markup to escape
    return typer.Option(None, *flags(model, name), help=help_text, show_default=False)


def setting_parameters(names: Sequence[str], model: Model = PlanRequest) -> list[inspect.Parameter]:
    return [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=_option(model, n),
                              annotation=_annotation(model, n)) for n in names]


def with_settings(names: Sequence[str], model: Model = PlanRequest, into: str = "settings",
                  first: bool = False) -> Callable:
    """Decorate a command whose parameter `into` is a dict with options for `names` of `model`.

    `first` lists these options before the command's own in --help. Stacked decorators (each
    with its own `into`) give a command the settings of two models.
    """
    names = tuple(names)

    def deco(func: Callable) -> Callable:
        sig = inspect.signature(func)
        hints = typing.get_type_hints(func, include_extras=True)  # keep Annotated options
        own = [p.replace(annotation=hints.get(p.name, p.annotation))
               for p in sig.parameters.values() if p.name != into]

        @functools.wraps(func)
        def wrapper(*args: Any, **kw: Any) -> Any:
            given = {n: kw.pop(n, None) for n in names}
            return func(*args, **kw, **{into: given})

        added = setting_parameters(names, model)
        params = added + own if first else own + added
        # keyword-only after positional-or-keyword typer parameters
        wrapper.__signature__ = sig.replace(parameters=[
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD
            and p.annotation is not typer.Context else p for p in params])
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__
        return wrapper

    return deco


def all_settings(exclude: Sequence[str] = (), model: Model = PlanRequest) -> tuple[str, ...]:
    return tuple(n for n in model.model_fields if n not in exclude)


def build(model: Model, given: dict[str, Any]) -> Any:
    """The request of the values a command was given (None: not given, the default applies).

    The models raise `UserError`s naming the flag themselves; what pydantic checks on its own
    (a required field, a type) becomes one such line too.
    """
    try:
        return model(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else ""
        where = flag(model, name) if name in model.model_fields else name or model.__name__
        if err["type"] == "missing":
            raise UserError(f"{where}: required") from None
        raise UserError(f"{where}: {err['msg'].lower()} (got {err.get('input')!r})") from None
