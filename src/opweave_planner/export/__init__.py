"""`opweave-plan export`: launch files for a real serving runtime, from a plan file.

`export_plan(...)` validates the inputs (exit 2 on a bad one), asks the target (a `base.Target`
of `registry.TARGETS`) whether it can run the plan's shape (exit 3 with the reason and a runnable
alternative), renders every file in memory from pinned per-version flag tables, and only then
writes the folder, all or nothing: a new folder is staged beside its final name and renamed into
place; in an existing one every file is staged first and then swapped in, the previous files kept
until every swap has succeeded.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opweave_planner.atomic import fsync_folder, read_input, write_fd
from opweave_planner.errors import UserError, printable
from opweave_planner.export.base import Context, Target
from opweave_planner.export.common import (
    alternative_plan,
    alternatives,
    check_model_id,
    check_plan_names,
    check_text,
    chunk_tokens_of,
    hf_repo,
    normalise_alternative,
    shown,
)
from opweave_planner.export.documents import json_bytes
from opweave_planner.export.registry import TARGETS

MANIFEST = "export.json"
MAX_MANIFEST = 1 << 20  # bytes of a previous export.json read (ours are a few KiB)
MAX_OWN_FILE = 16 << 20  # bytes of a previous file hashed before it is removed (ours are KiB)
# names an exporter writes (serve-replica-0.sh, values.yaml, ...): no other name is ever removed
_OWN_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,127}\.(?:sh|yaml|json|jsonl)")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_STAGE = ".opweave-export-"  # the staging folder's prefix (removed before export returns)


@dataclass(frozen=True)
class Exported:
    target: str
    version: str
    out: str
    files: tuple[str, ...]
    alternative: str | None
    kept: tuple[str, ...] = ()  # files the previous export listed that were changed since: not removed
    notes: tuple[str, ...] = ()  # what the user should know about what was written (one line each)


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def resolve_version(target: Target, version: str | None) -> tuple[str, str]:
    """(release asked for, the flag table written for it): any release from the oldest table to
    the newest table's minor series; a release between two tables takes the older one (every
    flag the exporter writes is in the tables at both ends, `tests/test_export_flags.py`)."""
    if version is None:
        return target.default_version, target.default_version
    v = version.strip().removeprefix("v")
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+){1,2})(?:\.?post[0-9]+|rc[0-9]+)?", v)
    oldest, newest = _release(target.versions[0]), _release(target.versions[-1])
    if m is None or not (oldest <= _release(m.group(1)) and _release(m.group(1))[:2] <= newest[:2]):
        raise UserError(f"--runtime-version: {target.name} {printable(version)} is not supported; expected a "
                        f"release from {target.versions[0]} to {'.'.join(map(str, newest[:2]))}.x "
                        f"(flag tables: {', '.join(target.versions)})")
    table = max((t for t in target.versions if _release(t) <= _release(m.group(1))), key=_release)
    return v, table


def _check_out(out: str) -> Path:
    """The output folder must be one the user could mean: a named folder other than the
    filesystem root, that is a folder (or does not exist yet) under a writable ancestor."""
    out = os.fspath(out) if isinstance(out, os.PathLike) else out
    if not isinstance(out, str) or not out.strip():
        raise UserError("--out: empty; expected the folder to write the launch files into (e.g. deploy/)")
    check_text(out, "--out", "a folder")
    real = os.path.realpath(out)
    if os.path.dirname(real) == real:
        raise UserError(f"--out: '{printable(out)}' is the filesystem root; expected a folder for the launch "
                        f"files (e.g. deploy/)")
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise UserError(f"--out: '{printable(out)}' exists and is not a folder")
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"--out: '{printable(str(probe))}' is not a writable folder")
    return p


def _load(plan_path: str) -> tuple[Any, dict[str, Any], bytes]:
    """The plan, its raw document and its bytes (read once: the manifest hashes what was read)."""
    import orjson

    from opweave_planner.contract import parse_plan
    from opweave_planner.plan import Infeasible, Plan

    data = read_input(plan_path, "plan file")
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise UserError(f"{plan_path}: malformed plan: not valid JSON ({exc})") from None
    check_plan_names(raw, plan_path)
    doc = parse_plan(_without_alternatives(raw), plan_path)
    if isinstance(doc, Infeasible):
        raise UserError(f"{plan_path}: is an infeasibility record ({doc.reason}); there is no plan to export")
    assert isinstance(doc, Plan)
    return doc, raw, data


def _without_alternatives(raw: Any) -> Any:
    """`alternatives` is read on its own (`common.alternatives`), leniently: the main plan is
    validated without it, so a summary-only or older alternatives section never blocks export."""
    if isinstance(raw, dict) and "alternatives" in raw:
        return {k: v for k, v in raw.items() if k != "alternatives"}
    return raw


def _labels(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        check_text(pair, "--node-label", "GPU=VALUE")
        gid, sep, value = pair.partition("=")
        if not sep or not gid.strip() or not value.strip():
            raise UserError(f"--node-label: '{shown(pair)}' is not GPU=VALUE (e.g. h100=NVIDIA-H100-80GB-HBM3)")
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
          image: str | None = None, catalog: str | None = None,
          deployment_mode: str | None = None) -> tuple[Context, dict[str, bytes]]:
    """Every file of the export, in memory (nothing is written). `deployment_mode`: export that
    mode of a plan that records both (aggregated: deployment.aggregated's replicas; disaggregated:
    the decode copies and the prefill pool) instead of the plan's `deployment.mode`."""
    from opweave_planner.contract import parse_plan
    from opweave_planner.inputs.hardware import load_hardware
    from opweave_planner.inputs.model import load_model

    if target not in TARGETS:
        raise UserError(f"--to: unknown target '{target}'; expected one of {', '.join(TARGETS)}")
    runtime = TARGETS[target]
    release, version = resolve_version(runtime, runtime_version)
    labels = _labels(node_labels)
    check_text(image, "--image", "a container image")
    if model_id is not None:
        check_model_id(model_id)
    plan, raw, plan_data = _load(plan_path)
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
        check_plan_names(alt_doc, plan_path, f"alternatives.{alt}.")
        plan = parse_plan(alt_doc, f"{plan_path} alternatives.{alt}")
    try:
        spec = load_model(model or plan.model)
    except UserError:
        if model is not None or runtime.needs_model:
            raise
        spec = None
    if (model is not None and spec is not None and spec.name != plan.model
            and spec.source_sha256 != plan.provenance.model_sha256):  # a renamed copy of the config is fine
        raise UserError(f"--model: {model} is '{spec.name}', but {plan_path} is a plan for '{plan.model}'")
    mid = model_id if model_id is not None else hf_repo(plan.model) or _hub_id(plan)
    if mid is None:
        raise UserError(f"--model-id: model '{shown(plan.model)}' is not bundled; pass the Hugging Face repo "
                        f"or weights path to serve")
    check_model_id(mid, "--model-id" if model_id is not None else f"--model-id (the default for {plan.model})")
    hw = load_hardware(catalog)
    ctx = Context(plan=plan, raw=raw, path=plan_path, target=runtime, version=version, release=release,
                  model_id=mid,
                  spec=spec, hw=hw, labels=labels, image=image, alternative=alt,
                  base_cost=base_cost, deployment=_deployment(plan, raw, alt, hw),
                  deployment_mode=_check_mode(deployment_mode, plan, plan_path))
    if ctx.aggregated is not None:
        hw.resolve(ctx.aggregated.gpu, f"{plan_path}: deployment.aggregated.gpu")
    for o in ctx.owners:
        ctx.gpu(o.gpu)  # a GPU type the catalog lacks is a bad input, named here
    if ctx.prefill is not None:
        hw.resolve(ctx.prefill.gpu, f"{plan_path}: deployment.prefill.gpu")
    runtime.check(ctx)
    files = runtime.render(ctx)
    files[MANIFEST] = _manifest(ctx, files, plan_data)
    return ctx, files


MODES = ("aggregated", "disaggregated")


def _check_mode(mode: str | None, plan, path: str) -> str | None:
    """The deployment mode asked for, when the plan records that mode's deployment."""
    if mode is None:
        return None
    if mode not in MODES:
        raise UserError(f"--deployment-mode: '{shown(str(mode))}' unknown; expected one of {', '.join(MODES)}")
    dep = plan.deployment
    have = None if dep is None else dep.aggregated if mode == "aggregated" else dep.prefill
    if have is None:
        raise UserError(f"--deployment-mode: {path} records no {mode} deployment (deployment."
                        f"{'aggregated' if mode == 'aggregated' else 'prefill'}); plan with --ttft and "
                        f"--request-rate (or --target-tokens-per-s) to search both modes")
    return mode


def _hub_id(plan) -> str | None:
    """A plan made from a Hugging Face id (the offline hub cache: no model_source) serves that id."""
    from opweave_planner.inputs.hf_cache import HF_ID

    if plan.model_source is None and "/" in plan.model and HF_ID.fullmatch(plan.model):
        return plan.model
    return None


def _deployment(plan, raw: dict[str, Any], alt: str | None, hw):
    """The sizing the export deploys: the plan's own; for an alternative, the main plan's target
    load sized on the alternative (its file entry records none); None: the plan is not sized."""
    if plan.deployment is not None or alt is None:
        return plan.deployment
    from opweave_planner.sizing import size_deployment

    main = raw.get("deployment") if isinstance(raw, dict) else None
    if not isinstance(main, dict):
        return None
    tokens, conc = main.get("target_tokens_per_s"), main.get("target_concurrency")
    if tokens is None and conc is None:
        return None
    gpn = plan.search.space.gpus_per_node
    try:
        return size_deployment(plan, target_tokens_per_s=tokens, target_concurrency=conc,
                               gpus_per_node={g.id: min(g.gpus_per_node, gpn or g.gpus_per_node) for g in hw.gpus})
    except UserError as exc:  # never a silent "records no sizing": the plan does record a target load
        load = " and ".join(x for x in (f"{tokens:g} tokens/s" if tokens is not None else "",
                                        f"{conc} concurrent requests" if conc is not None else "") if x)
        raise UserError(f"--alternative {alt}: the plan's target load ({load}) cannot be sized on this "
                        f"alternative ({exc}); export the plan itself, or re-plan") from None


def gpus_exported(ctx: Context) -> int:
    """GPUs the files run: every decode group of every copy, and the prefill pool where written."""
    pool = len(ctx.prefill_placement) * ctx.prefill.tensor_parallel if ctx.target.writes_prefill and ctx.prefill else 0
    return sum(len(ctx.placement(o)) * o.tensor_parallel for o in ctx.owners) + pool


def sizing_note(ctx: Context) -> str:
    """One line on how much of a deployment the files run."""
    dep = ctx.deployment
    gpus = gpus_exported(ctx)
    if dep is None:
        return (f"one copy of the plan ({gpus} GPUs): it records no deployment sizing; plan with "
                f"--target-tokens-per-s or --target-concurrency to deploy more")
    agg = ctx.aggregated
    if agg is not None:
        why = "the plan's mode" if ctx.deployment_mode is None else "--deployment-mode aggregated"
        other = ("the plan's disaggregated deployment is its decode plan and prefill pool"
                 if dep.prefill is not None else "the plan has no disaggregated deployment: no prefill pool "
                 "meets its TTFT" if dep.disaggregated_infeasible is not None else "the plan planned no prefill pool")
        return (f"the plan's aggregated deployment: {len(ctx.placement(ctx.owners[0]))} replicas of {agg.gpu} "
                f"TP{agg.tensor_parallel} ({gpus} GPUs on {ctx.nodes} node{'s' if ctx.nodes != 1 else ''}), "
                f"each prefilling and decoding {agg.batch} requests with a {agg.chunk_tokens}-token chunk "
                f"budget, no prefill pool ({why}; {other})")
    pool = ctx.prefill
    if pool is not None and ctx.target.writes_prefill:
        return (f"{dep.copies} copies of the plan (the decode pool) and its prefill pool ({pool.instances}x "
                f"{pool.gpu} TP{pool.tensor_parallel}, chunk {pool.chunk_tokens} tokens), {gpus} GPUs on "
                f"{ctx.nodes} nodes, as its deployment sized; the prompt's KV goes from prefill to decode "
                f"over NIXL")
    line = f"{dep.copies} copies of the plan, {gpus} GPUs on {ctx.nodes} nodes, as its deployment sized"
    if pool is not None:  # this target writes no prefill pool: say what the files leave out
        line += (f"; the decode pool only: the plan's prefill pool ({pool.instances}x {pool.gpu} TP"
                 f"{pool.tensor_parallel}) is not exported ({ctx.target.name} has no disaggregated export), "
                 f"and these servers prefill what they receive themselves, which the plan's TPOT does not "
                 f"include")
    return line


def _manifest(ctx: Context, files: dict[str, bytes], plan_bytes: bytes) -> bytes:
    p = ctx.plan
    from opweave_planner.export.bench import traffic

    dep = ctx.deployment
    return json_bytes({
        "deployment": {
            "sized": dep is not None, "copies": ctx.copies, "note": sizing_note(ctx),
            "target_tokens_per_s": None if dep is None else dep.target_tokens_per_s,
            "target_concurrency": None if dep is None else dep.target_concurrency,
            "gpus_total": gpus_exported(ctx),
            "nodes_total": ctx.nodes if ctx.target.writes_prefill else len(
                {r.node for o in ctx.owners for r in ctx.placement(o)}),
            # what the files run (a plan without a prefill pool runs aggregated decode servers)
            "mode": "disaggregated" if ctx.prefill is not None and ctx.target.writes_prefill else "aggregated",
            "prefill": _prefill_record(ctx),
            "chunk_tokens": chunk_tokens_of(p, ctx.mode),
            "owners": [{"owner": o.index, "gpu": o.gpu, "tensor_parallel": o.tensor_parallel,
                        "replicas": len(ctx.placement(o)), "resident_batch": o.resident_batch,
                        "memory_fraction": ctx.memory_fraction(o), "static_fraction": ctx.static_fraction(o)}
                       for o in ctx.owners],
            "plan_mode": None if dep is None else dep.mode,
            "exported_mode": ctx.mode,  # the plan's, or the one --deployment-mode asked for
            "aggregated": _aggregated_record(ctx),
            "max_model_len": p.workload.window,
        },
        "benchmark": traffic(ctx).summary(),
        "target": ctx.target.name,
        "runtime_version": ctx.release or ctx.version,
        "flag_table": ctx.version,
        "model_id": ctx.model_id,
        "alternative": ctx.alternative,
        "plan": {"sha256": hashlib.sha256(plan_bytes).hexdigest(), "model": p.model, "policy": p.policy,
                 "tpot_ms": p.tpot_ms, "tpot_slo_ms": p.workload.tpot_slo_ms,
                 "usd_per_million_tokens": p.usd_per_million_tokens, "global_batch": p.global_batch,
                 "gpus_total": p.gpus_total, "num_stages": p.num_stages},
        "placement": [{"owner": r.owner, "replica": r.index, "copy": r.copy, "gpu": o.gpu, "node": r.node,
                       "devices": list(r.devices)} for o in ctx.owners for r in ctx.placement(o)]
                     + ([{"owner": "prefill", "replica": r.index, "copy": None, "gpu": ctx.prefill.gpu,
                          "node": r.node, "devices": list(r.devices)} for r in ctx.prefill_placement]
                        if ctx.target.writes_prefill else []),
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
    })


def _aggregated_record(ctx: Context) -> dict[str, Any] | None:
    """The aggregated servers the files run when that is the plan's mode (None otherwise)."""
    agg = ctx.aggregated
    if agg is None:
        return None
    group = ctx.owners[0]
    return {"gpu": agg.gpu, "tensor_parallel": agg.tensor_parallel, "replicas": len(ctx.placement(group)),
            "gpus": len(ctx.placement(group)) * agg.tensor_parallel, "max_num_seqs": agg.batch,
            "chunk_tokens": agg.chunk_tokens, "memory_fraction": ctx.memory_fraction(group),
            "static_fraction": ctx.static_fraction(group), "ttft_ms": agg.ttft_ms, "tpot_ms": agg.tpot_ms,
            "tpot_percentile": agg.tpot_percentile}


def _prefill_record(ctx: Context) -> dict[str, Any] | None:
    """The prefill pool the files run (None where there is none or the target writes none)."""
    pool = ctx.prefill
    if pool is None or not ctx.target.writes_prefill:
        return None
    return {"gpu": pool.gpu, "tensor_parallel": pool.tensor_parallel, "instances": len(ctx.prefill_placement),
            "chunk_tokens": pool.chunk_tokens, "memory_fraction": ctx.memory_fraction(pool),
            "static_fraction": ctx.static_fraction(pool),
            "nodes": sorted({r.node for r in ctx.prefill_placement})}


def write(out: str, files: dict[str, bytes]) -> tuple[str, ...]:
    """Write the export all or nothing; returns the files a previous export listed that this one
    does not write and that were kept because they changed since (only our own are removed)."""
    dest = _check_out(out)
    try:
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            stage = _stage_dir(dest.parent, f".{dest.name[:64]}.")
            try:
                _write_all(stage, files)
                os.rename(stage, dest)
            except BaseException:
                shutil.rmtree(stage, ignore_errors=True)
                raise
            fsync_folder(dest.parent)
            return ()
        return _swap_in(dest, files)
    except OSError as exc:
        raise UserError(f"--out: cannot write '{printable(out)}' ({exc.strerror or exc})") from None


def _stage_dir(parent: Path, prefix: str) -> Path:
    """A new private-named folder in `parent` (same filesystem, so renames out of it are atomic),
    with the permissions a plain mkdir gives."""
    while True:
        path = parent / f"{prefix}{secrets.token_hex(6)}.tmp"
        try:
            os.mkdir(path, 0o777)
            return path
        except FileExistsError:
            continue


def _write_all(folder: Path, files: dict[str, bytes]) -> None:
    """Every file, whole and synced, into a fresh folder; scripts executable (both modes as a plain
    `open` and `chmod +x` would leave them under the umask)."""
    for name, data in files.items():
        mode = 0o777 if name.endswith(".sh") else 0o666
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            write_fd(fd, data)
        finally:
            os.close(fd)


def _swap_in(dest: Path, files: dict[str, bytes]) -> tuple[str, ...]:
    """Stage every file inside `dest`, then swap them in; on any failure put every previous file
    back as it was. Returns the stale files kept (see `_removable`)."""
    for name in files:
        if os.path.isdir(dest / name) and not os.path.islink(dest / name):
            raise UserError(f"--out: '{printable(str(dest / name))}' is a folder; the export writes a file of "
                            f"that name")
    previous = _previous_files(dest)
    stale = sorted(n for n in previous if n not in files)
    remove = [n for n in stale if _removable(dest / n, previous[n])]
    stage = _stage_dir(dest, _STAGE)
    new, old = stage / "new", stage / "old"
    restored = False
    done: list[tuple[str, bool]] = []  # (name, had a previous file) in the order swapped
    try:
        os.mkdir(new)
        os.mkdir(old)
        _write_all(new, files)
        for name in sorted(files, key=lambda n: n == MANIFEST):  # the manifest last
            had = _keep_previous(dest / name, old / name)
            done.append((name, had))
            os.replace(new / name, dest / name)
        for name in remove:
            done.append((name, True))
            os.rename(dest / name, old / name)
    except BaseException as exc:
        restored = _restore(dest, old, done)
        if not restored and isinstance(exc, OSError):
            raise UserError(f"--out: cannot write '{printable(str(dest))}' ({exc.strerror or exc}); the "
                            f"previous files are kept in '{printable(str(old))}'") from None
        raise
    else:
        restored = True
    finally:
        if restored:
            shutil.rmtree(stage, ignore_errors=True)
    fsync_folder(dest)
    return tuple(n for n in stale if n not in remove and os.path.lexists(dest / n))


def _keep_previous(path: Path, backup: Path) -> bool:
    """Keep the file being replaced under `backup` (a hard link, so `path` never disappears; a
    rename where the filesystem has no links); False when there is none."""
    if not os.path.lexists(path):
        return False
    try:
        os.link(path, backup, follow_symlinks=False)
    except OSError:
        os.rename(path, backup)
    return True


def _restore(dest: Path, old: Path, done: list[tuple[str, bool]]) -> bool:
    """Undo the swaps in reverse: each previous file back under its name, each new one removed.
    False if any step failed (the previous files then stay in the staging folder, not deleted)."""
    ok = True
    for name, had in reversed(done):
        try:
            if had and os.path.lexists(old / name):
                os.replace(old / name, dest / name)
            elif not had:
                (dest / name).unlink(missing_ok=True)
        except OSError:
            ok = False
    return ok


def _previous_files(dest: Path) -> dict[str, str]:
    """The files the previous export.json lists, name -> SHA-256, read bounded and leniently: a
    manifest that is missing, special, huge, malformed or nested too deep lists nothing."""
    import orjson

    try:
        doc = orjson.loads(read_input(dest / MANIFEST, limit=MAX_MANIFEST))  # never opens a FIFO
    except (UserError, orjson.JSONDecodeError, RecursionError):
        return {}
    listed = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(listed, dict):
        return {}
    return {name: sha for name, sha in listed.items()
            if isinstance(sha, str) and _SHA256.fullmatch(sha) and _OWN_NAME.fullmatch(name) and name != MANIFEST}


def _removable(path: Path, sha: str) -> bool:
    """A previous file may be removed only if it is still what the tool wrote: a regular file
    (not a link) whose SHA-256 is the one its manifest recorded."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        return hashlib.sha256(read_input(path, limit=MAX_OWN_FILE)).hexdigest() == sha
    except (OSError, UserError):
        return False


def export_plan(plan_path: str, target: str, out: str, **kw) -> Exported:
    """Check, render and write; returns what was written."""
    _check_out(out)
    ctx, files = build(plan_path, target, **kw)
    kept = write(out, files)
    return Exported(target=target, version=ctx.release or ctx.version, out=out, files=tuple(sorted(files)),
                    alternative=ctx.alternative, kept=kept, notes=(sizing_note(ctx),))
