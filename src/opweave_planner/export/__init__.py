"""`opweave-plan export`: launch files for a real serving runtime, from a plan file.

`export_plan(...)` validates the inputs (exit 2 on a bad one), asks the target whether it can run
the plan's shape (exit 3 with the reason and a runnable alternative), renders every file in
memory from pinned per-version flag tables, and only then writes the folder: a new folder
appears whole (renamed into place), an existing one gets each file replaced atomically.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opweave_planner.errors import UserError
from opweave_planner.export import dynamo, llmd, sglang, vllm, vllm_afd
from opweave_planner.export.common import (
    Context,
    alternative_plan,
    alternatives,
    hf_repo,
    json_bytes,
    normalise_alternative,
)

TARGETS = {"vllm": vllm, "sglang": sglang, "dynamo": dynamo, "llm-d": llmd, "vllm-afd": vllm_afd}
MANIFEST = "export.json"


@dataclass(frozen=True)
class Exported:
    target: str
    version: str
    out: str
    files: tuple[str, ...]
    alternative: str | None


def resolve_version(target: str, version: str | None) -> str:
    mod = TARGETS[target]
    if version is None:
        return mod.DEFAULT_VERSION
    v = version.strip().removeprefix("v")
    if v not in mod.VERSIONS:
        raise UserError(f"--runtime-version: {target} {version} is not supported; pinned: "
                        f"{', '.join(mod.VERSIONS)}")
    return v


def _check_out(out: str) -> Path:
    """The output folder must be a folder (or not exist yet) under a writable ancestor."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise UserError(f"--out: '{out}' exists and is not a folder")
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"--out: '{probe}' is not a writable folder")
    return p


def _load(plan_path: str) -> tuple[Any, dict[str, Any]]:
    import orjson

    from opweave_planner.contract import parse_plan
    from opweave_planner.plan import Infeasible, Plan

    p = Path(plan_path)
    if not p.is_file():
        raise UserError(f"{plan_path}: plan file does not exist")
    try:
        raw = orjson.loads(p.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise UserError(f"{plan_path}: malformed plan: not valid JSON ({exc})") from None
    doc = parse_plan(_without_alternatives(raw), plan_path)
    if isinstance(doc, Infeasible):
        raise UserError(f"{plan_path}: is an infeasibility record ({doc.reason}); there is no plan to export")
    assert isinstance(doc, Plan)
    return doc, raw


def _without_alternatives(raw: Any) -> Any:
    """`alternatives` is read on its own (`common.alternatives`), leniently: the main plan is
    validated without it, so a summary-only or older alternatives section never blocks export."""
    if isinstance(raw, dict) and "alternatives" in raw:
        return {k: v for k, v in raw.items() if k != "alternatives"}
    return raw


def _labels(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        gid, sep, value = pair.partition("=")
        if not sep or not gid.strip() or not value.strip():
            raise UserError(f"--node-label: '{pair}' is not GPU=VALUE (e.g. h100=NVIDIA-H100-80GB-HBM3)")
        out[gid.strip().lower()] = value.strip()
    return out


def _replan_advice(alt: str) -> str:
    if alt == "optimum":  # only a --prefer-simpler plan keeps the optimum beside it
        return "the plan is the optimum itself unless it was made with --prefer-simpler"
    if alt == "colocated":
        return "re-plan with --policy colocated"
    return "re-plan it with this opweave-planner (an opweave plan lists its alternatives)"


def build(plan_path: str, target: str, *, runtime_version: str | None = None, alternative: str | None = None,
          model_id: str | None = None, model: str | None = None, node_labels: tuple[str, ...] = (),
          image: str | None = None, catalog: str | None = None) -> tuple[Context, dict[str, bytes]]:
    """Every file of the export, in memory (nothing is written)."""
    from opweave_planner.contract import parse_plan
    from opweave_planner.inputs.hardware import load_hardware
    from opweave_planner.inputs.model import load_model

    if target not in TARGETS:
        raise UserError(f"--to: unknown target '{target}'; expected one of {', '.join(TARGETS)}")
    version = resolve_version(target, runtime_version)
    labels = _labels(node_labels)
    plan, raw = _load(plan_path)
    base_cost = plan.usd_per_million_tokens
    alt = None
    if alternative is not None:
        alt = normalise_alternative(alternative)
        entry = alternatives(raw).get(alt)
        if entry is None:
            raise UserError(f"--alternative: {plan_path} has no '{alt}' alternative (plan files list "
                            f"alternatives from schema 1.2); {_replan_advice(alt)}")
        alt_doc = alternative_plan(entry, raw)
        if alt_doc is None:
            raise UserError(f"--alternative: {plan_path}'s '{alt}' alternative carries no plan to export; "
                            f"{_replan_advice(alt)}")
        plan = parse_plan(alt_doc, f"{plan_path} alternatives.{alt}")
    try:
        spec = load_model(model or plan.model)
    except UserError:
        if model is not None or target == "vllm-afd":
            raise
        spec = None
    if (model is not None and spec is not None and spec.name != plan.model
            and spec.source_sha256 != plan.provenance.model_sha256):  # a renamed copy of the config is fine
        raise UserError(f"--model: {model} is '{spec.name}', but {plan_path} is a plan for '{plan.model}'")
    mid = model_id or hf_repo(plan.model)
    if not mid:
        raise UserError(f"--model-id: model '{plan.model}' is not bundled; pass the Hugging Face repo "
                        f"or weights path to serve")
    ctx = Context(plan=plan, raw=raw, path=plan_path, target=target, version=version, model_id=mid,
                  spec=spec, hw=load_hardware(catalog), labels=labels, image=image, alternative=alt,
                  base_cost=base_cost)
    for o in plan.owners:
        ctx.gpu(o.gpu)  # a GPU type the catalog lacks is a bad input, named here
    files = TARGETS[target].render(ctx)
    files[MANIFEST] = _manifest(ctx, files, Path(plan_path).read_bytes())
    return ctx, files


def _manifest(ctx: Context, files: dict[str, bytes], plan_bytes: bytes) -> bytes:
    p = ctx.plan
    return json_bytes({
        "target": ctx.target,
        "runtime_version": ctx.version,
        "model_id": ctx.model_id,
        "alternative": ctx.alternative,
        "plan": {"sha256": hashlib.sha256(plan_bytes).hexdigest(), "model": p.model, "policy": p.policy,
                 "tpot_ms": p.tpot_ms, "tpot_slo_ms": p.workload.tpot_slo_ms,
                 "usd_per_million_tokens": p.usd_per_million_tokens, "global_batch": p.global_batch,
                 "gpus_total": p.gpus_total, "num_stages": p.num_stages},
        "placement": [{"owner": r.owner, "replica": r.index, "gpu": o.gpu, "node": r.node,
                       "devices": list(r.devices)} for o in p.owners for r in ctx.placement(o)],
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
    })


def write(out: str, files: dict[str, bytes]) -> None:
    """A new folder appears whole; in an existing one every file is replaced atomically and the
    files a previous export listed but this one does not are removed."""
    from opweave_planner.atomic import write_atomic

    dest = _check_out(out)
    try:
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
            try:
                for name, data in files.items():
                    write_atomic(tmp / name, data)
                    _mode(tmp / name)
                tmp.chmod(0o755)
                os.rename(tmp, dest)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return
        stale = _previous_files(dest) - set(files)
        for name, data in sorted(files.items(), key=lambda kv: kv[0] == MANIFEST):
            write_atomic(dest / name, data)
            _mode(dest / name)
        for name in sorted(stale):
            (dest / name).unlink(missing_ok=True)
    except OSError as exc:
        raise UserError(f"--out: cannot write '{out}' ({exc.strerror or exc})") from None


def _mode(path: Path) -> None:
    path.chmod(0o755 if path.suffix == ".sh" else 0o644)


def _previous_files(dest: Path) -> set[str]:
    import json

    try:
        old = json.loads((dest / MANIFEST).read_text())
        return {n for n in old.get("files", {}) if isinstance(n, str) and "/" not in n and n != MANIFEST}
    except (OSError, ValueError, AttributeError):
        return set()


def export_plan(plan_path: str, target: str, out: str, **kw) -> Exported:
    """Check, render and write; returns what was written."""
    _check_out(out)
    ctx, files = build(plan_path, target, **kw)
    write(out, files)
    return Exported(target=target, version=ctx.version, out=out, files=tuple(sorted(files)),
                    alternative=ctx.alternative)
