"""Reading a regen matrix file (its format: the docstring of `opweave_planner.regen`):
every entry expanded and validated into tasks before anything is planned."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opweave_planner.errors import UserError, printable

# the cross-product axes of an [[entry]] and the PlanRequest field each one sets
AXES = {"models": "model", "contexts": "ctx", "slos": "slo", "gpus": "gpus", "policies": "policy"}
PATH_SETTINGS = ("prices", "catalog", "profiles")
# settings an entry (or the top) may also give as a list: each list is one more axis of the
# cross product, and the file name carries its value (the whole deployment's and --ctx's lengths)
LISTED_SETTINGS = ("prompt_len", "output_len", "ttft", "ttft_percentile", "request_rate", "arrivals", "rate_scale")
# regen's own key (not a PlanRequest setting): the runtime every plan must run on, or "any"
DEPLOYABLE = "deployable"
ANY_RUNTIME = "any"
ALIASES = {"tps": "tensor_parallel_sizes"}  # spellings of matrices written before schema 1.2


def _settings_keys() -> tuple[str, ...]:
    from opweave_planner.inputs.request import PlanRequest

    return tuple(n for n in PlanRequest.model_fields if n not in AXES.values())


@dataclass(frozen=True)
class RegenTask:
    """One matrix entry: its file name and its validated request (picklable for workers/Ray)."""

    name: str
    request: Any
    deployable: str | None = None  # an export target that must run the plan (None: any plan)


MAX_MATRIX_BYTES = 16 << 20  # a matrix is a few KiB of TOML

def _safe(text: str) -> str:
    """A file-name part: anything but letters, digits and . + - becomes '-'."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-")


def _abs(base: Path, value: object) -> str:
    """`value` relative to the matrix folder, symlinks resolved (os.path.realpath: unlike
    Path.resolve on 3.11 it never raises on a loop). A dangling link or a loop is kept as
    written, so the input check names it rather than a target that is not there."""
    given = base / str(value)
    real = os.path.realpath(given)
    return real if os.path.exists(real) or not os.path.lexists(given) else os.path.abspath(given)


def _workload_value(base: Path, value: object) -> str:
    """A workloads item: a file relative to the matrix, or an inline law as written (what
    workload_spec reads as one, unless a file of that name lies beside the matrix)."""
    from opweave_planner.workload.spec import is_inline_law

    text = str(value)
    return text if is_inline_law(text) and not os.path.lexists(base / text) else _abs(base, text)


def deployable_target(value: object, where: str) -> str | None:
    """A `deployable` value: an export target's name, or "any" (None: no requirement)."""
    from opweave_planner.export.registry import target

    if value is None or value == ANY_RUNTIME:
        return None
    return target(value, f"{where}: {DEPLOYABLE}").name


def _deployable_request(given: dict[str, Any], runtime: str | None):
    """The entry's request, under `runtime`'s search limits (the tighter of the entry's own and
    the target's): the search then returns the cheapest plan that runtime runs."""
    from opweave_planner import api

    req = api.make_request(**given)
    if runtime is None:
        return req
    from opweave_planner.export.registry import TARGETS

    tighter = {k: v for k, v in TARGETS[runtime].search_limits.items()
               if getattr(req, k) is None or getattr(req, k) > v}
    return api.make_request(**{**given, **tighter}) if tighter else req


def _list(value: Any, key: str, where: str) -> list:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list) and value:
        return value
    raise UserError(f"{where}: '{key}' must be a non-empty list")


def _settings(obj: Any, where: str, base: Path, allowed: tuple[str, ...]) -> dict[str, Any]:
    """A table of PlanRequest settings (paths relative to the matrix file)."""
    if not isinstance(obj, dict):
        raise UserError(f"{where}: expected a table of settings")
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = ALIASES.get(key, key)
        if name not in allowed:
            raise UserError(f"{where}: unknown key '{printable(key)}'; expected one of {', '.join(allowed)}")
        if name in PATH_SETTINGS:
            if not isinstance(value, str):
                raise UserError(f"{where}: '{key}' must be a path string")
            value = _abs(base, value)
        out[name] = value
    return out


def _length_label(req) -> str:
    """ctx32k[-isl7k-osl1k], or for a workload wl-<file stem>[-scale32k]."""
    from opweave_planner.inputs.units import label_tokens

    if req.workload is None:
        lengths = "" if req.lengths is None else f"-isl{label_tokens(req.lengths[0])}-osl{label_tokens(req.lengths[1])}"
        return f"ctx{label_tokens(req.ctx)}{lengths}"
    from opweave_planner.workload.spec import named_file

    stem = Path(req.workload).stem if named_file(req.workload) is not None else req.workload
    scale = "" if req.scale_ctx is None else f"-scale{label_tokens(req.scale_ctx)}"
    return _safe(f"wl-{stem}{scale}")


def _deployment_label(req) -> str:
    """'' (decode only), or _ttft1000ms[-p99]-rate8 / -tps20000 / -trace[x40]: a whole deployment's
    TTFT SLO and rate source."""
    if not req.disaggregated:
        return ""
    pct = "" if req.ttft_percentile is None else f"-p{req.ttft_percentile:g}"
    if req.arrivals == "trace":
        rate = "-trace" + ("" if req.rate_scale is None else f"x{req.rate_scale:g}")
    elif req.request_rate is not None:
        rate = f"-rate{req.request_rate:g}"
    else:
        rate = f"-tps{req.target_tokens_per_s:g}"
    return "_" + _safe(f"ttft{req.ttft:g}ms{pct}{rate}")


def _listed(settings: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """`settings` once per combination of its LISTED_SETTINGS lists (a scalar is a list of one)."""
    from itertools import product

    keys = [k for k in LISTED_SETTINGS if isinstance(settings.get(k), list)]
    lists = [_list(settings[k], k, where) for k in keys]
    return [{**settings, **dict(zip(keys, combo, strict=True))} for combo in product(*lists)]


def _entry_tasks(entry: Any, ew: str, common: dict[str, Any], base: Path,
                 runtime: str | None = None) -> list[tuple[str, Any, str, str | None]]:
    """(file name, request, label, deployable) for every combination of one [[entry]]."""
    from opweave_planner.inputs.model import load_model

    if not isinstance(entry, dict):
        raise UserError(f"{ew}: must be a table")
    if ("contexts" in entry) == ("workloads" in entry):
        raise UserError(f"{ew}: give contexts (fixed context lengths) or workloads (trace or law files), "
                        f"one of them")
    axes = dict(AXES)
    if "workloads" in entry:
        axes.pop("contexts")
        axes["workloads"] = "workload"
    missing = [k for k in axes if k not in entry]
    if missing:
        raise UserError(f"{ew}: missing {', '.join(missing)}")
    lists = {k: _list(entry[k], k, ew) for k in axes}
    if "workloads" in lists:
        lists["contexts"] = [_workload_value(base, w) for w in lists.pop("workloads")]
    if DEPLOYABLE in entry:
        runtime = deployable_target(entry[DEPLOYABLE], ew)
    rest = {k: v for k, v in entry.items() if k not in axes and k not in ("space", DEPLOYABLE)}
    settings = {**common, **_settings(entry.get("space", {}), f"{ew}: space", base, _settings_keys()),
                **_settings(rest, ew, base, _settings_keys())}
    out = []
    for model in lists["models"]:
        for ctx in lists["contexts"]:
            for slo in lists["slos"]:
                for gpus in lists["gpus"]:
                    for policy in lists["policies"]:
                        for combo in _listed(settings, ew):
                            listed = "".join(f", {k} {combo[k]}" for k in LISTED_SETTINGS
                                             if isinstance(settings.get(k), list))
                            label = printable(f"{ew} ({model}, {ctx}, {slo}, {gpus}, {policy}{listed})")
                            length = {"workload": ctx} if "workloads" in entry else {"ctx": ctx}
                            given = dict(model=str(model), slo=str(slo), gpus=str(gpus), policy=str(policy),
                                         **{**combo, **length})
                            try:
                                req = _deployable_request(given, runtime)
                                name = load_model(req.model).name
                            except UserError as exc:
                                raise UserError(f"{label}: {exc}") from None
                            out.append((f"{_safe(name)}_{_length_label(req)}_slo{req.slo_ms:g}ms"
                                        f"{_deployment_label(req)}_{'+'.join(req.gpus)}_{req.policy.value}.json",
                                        req, label, runtime))
    return out


def load_matrix(path: str | Path, deployable: str | None = None) -> list[RegenTask]:
    """Expand a matrix file into validated tasks (every entry checked before anything runs).

    `deployable` (regen's --deployable) is the runtime for every entry that names none: a
    `deployable` key at the top of the matrix or in an entry wins ("any": no requirement)."""
    from opweave_planner.atomic import read_input

    p = Path(path)
    where = printable(path)
    data = read_input(p, "--matrix", MAX_MATRIX_BYTES)
    try:
        obj = tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, ValueError, RecursionError) as exc:  # ValueError: not UTF-8,
        # or an integer over Python's 4300-digit conversion limit
        raise UserError(f"--matrix: '{where}' is not valid TOML ({printable(exc)})") from None
    base = Path(os.path.realpath(p)).parent
    runtime = deployable_target(deployable, "--deployable")
    if DEPLOYABLE in obj:
        runtime = deployable_target(obj[DEPLOYABLE], where)
    top = {k: v for k, v in obj.items() if k not in ("space", "entry", DEPLOYABLE)}
    common = {**_settings(top, where, base, (*_settings_keys(), "space", "entry", DEPLOYABLE)),
              **_settings(obj.get("space", {}), f"{where}: space", base, _settings_keys())}
    entries = obj.get("entry")
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{where}: no [[entry]] tables; each lists models, contexts, slos, gpus and policies")
    tasks: list[RegenTask] = []
    names: dict[str, str] = {}
    for e_i, entry in enumerate(entries):
        for name, req, label, need in _entry_tasks(entry, f"{where}: entry {e_i + 1}", common, base, runtime):
            if name in names:
                raise UserError(f"{where}: {label} duplicates {names[name]} (both write {name})")
            names[name] = label
            tasks.append(RegenTask(name=name, request=req, deployable=need))
    return tasks
