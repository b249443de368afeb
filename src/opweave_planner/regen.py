"""`regen`: plan every entry of a matrix file, rewrite only the plan files that changed.

Matrix file (TOML; relative paths are relative to the matrix file)::

    prices = "prices.toml"          # optional: GPU id -> USD per GPU-hour
    catalog = "my-gpus.toml"        # optional: extra GPU types
    profiles = "profiles/"          # optional: profile folder (default: shipped)
    backend = "vllm"                # optional
    network_bandwidth = 32.0        # optional: inter-node GB/s
    network_latency = 20.0          # optional: inter-node latency, microseconds

    [space]                         # optional search-space limits for every entry
    max_owners = 3
    batches = [16, 32, 64, 128]

    [[entry]]                       # the cross product of these lists (the axes)
    models = ["llama-3.1-8b", "qwen3-30b-a3b"]
    contexts = ["8k", "32k"]
    slos = ["30ms", "60ms"]
    gpus = ["h100", "h100,a100"]
    policies = ["opweave", "colocated"]
    max_replicas = 2                # optional settings for this entry (or in [entry.space])

Every key other than the axes and `entry` is a PlanRequest setting under its one name (the
CLI flag without dashes: `max_gpus` for `--max-gpus`), at the top (every entry) or in an
entry; `[space]` tables are accepted for matrices written before settings were unified.

Each entry becomes `<out>/<model>_ctx<ctx>_slo<slo>_<gpu+gpu>_<policy>.json` (a plan, or an
infeasibility record). Files are compared byte for byte and rewritten atomically only when
different. Exit status: 1 when any file was written or removed, 0 when none, 2 on bad input or
when an entry still failed after its retries (the others are written all the same).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opweave_planner.errors import UserError

# the cross-product axes of an [[entry]] and the PlanRequest field each one sets
AXES = {"models": "model", "contexts": "ctx", "slos": "slo", "gpus": "gpus", "policies": "policy"}
PATH_SETTINGS = ("prices", "catalog", "profiles")
ALIASES = {"tps": "tensor_parallel_sizes"}  # spellings of matrices written before schema 1.2


def _settings_keys() -> tuple[str, ...]:
    from opweave_planner.inputs.request import PlanRequest

    return tuple(n for n in PlanRequest.model_fields if n not in AXES.values())


@dataclass(frozen=True)
class RegenTask:
    """One matrix entry: its file name and its validated request (picklable for workers/Ray)."""

    name: str
    request: Any


def run_task(task: RegenTask) -> bytes:
    """Plan one entry; the canonical bytes of its plan (or infeasibility record)."""
    from opweave_planner import api
    from opweave_planner.plan import plan_bytes

    plan, infeasible = api.plan(task.request, jobs=1)
    return plan_bytes(plan if plan is not None else infeasible)


# ----------------------------------------------------------------------------- matrix

def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-")


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
            raise UserError(f"{where}: unknown key '{key}'; expected one of {', '.join(allowed)}")
        if name in PATH_SETTINGS:
            if not isinstance(value, str):
                raise UserError(f"{where}: '{key}' must be a path string")
            value = str((base / value).resolve())
        out[name] = value
    return out


def _entry_tasks(entry: Any, ew: str, common: dict[str, Any], base: Path) -> list[tuple[str, Any, str]]:
    """(file name, request, label) for every combination of one [[entry]]."""
    from opweave_planner import api
    from opweave_planner.inputs.model import load_model
    from opweave_planner.inputs.units import label_tokens

    if not isinstance(entry, dict):
        raise UserError(f"{ew}: must be a table")
    missing = [k for k in AXES if k not in entry]
    if missing:
        raise UserError(f"{ew}: missing {', '.join(missing)}")
    lists = {k: _list(entry[k], k, ew) for k in AXES}
    rest = {k: v for k, v in entry.items() if k not in AXES and k != "space"}
    settings = {**common, **_settings(entry.get("space", {}), f"{ew}: space", base, _settings_keys()),
                **_settings(rest, ew, base, _settings_keys())}
    out = []
    for model in lists["models"]:
        for ctx in lists["contexts"]:
            for slo in lists["slos"]:
                for gpus in lists["gpus"]:
                    for policy in lists["policies"]:
                        label = f"{ew} ({model}, {ctx}, {slo}, {gpus}, {policy})"
                        try:
                            req = api.make_request(model=str(model), ctx=ctx, slo=str(slo), gpus=str(gpus),
                                                   policy=str(policy), **settings)
                            name = load_model(req.model).name
                        except UserError as exc:
                            raise UserError(f"{label}: {exc}") from None
                        out.append((f"{_safe(name)}_ctx{label_tokens(req.ctx)}_slo{req.slo_ms:g}ms_"
                                    f"{'+'.join(req.gpus)}_{req.policy.value}.json", req, label))
    return out


def load_matrix(path: str | Path) -> list[RegenTask]:
    """Expand a matrix file into validated tasks (every entry checked before anything runs)."""
    p = Path(path)
    where = str(path)
    if not p.is_file():
        raise UserError(f"--matrix: file '{path}' does not exist")
    try:
        obj = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"--matrix: '{path}' is not valid TOML ({exc})") from None
    except OSError as exc:
        raise UserError(f"--matrix: '{path}' cannot be read ({exc.strerror})") from None
    base = p.resolve().parent
    top = {k: v for k, v in obj.items() if k not in ("space", "entry")}
    common = {**_settings(top, where, base, (*_settings_keys(), "space", "entry")),
              **_settings(obj.get("space", {}), f"{where}: space", base, _settings_keys())}
    entries = obj.get("entry")
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{where}: no [[entry]] tables; each lists models, contexts, slos, gpus and policies")
    tasks: list[RegenTask] = []
    names: dict[str, str] = {}
    for e_i, entry in enumerate(entries):
        for name, req, label in _entry_tasks(entry, f"{where}: entry {e_i + 1}", common, base):
            if name in names:
                raise UserError(f"{where}: {label} duplicates {names[name]} (both write {name})")
            names[name] = label
            tasks.append(RegenTask(name=name, request=req))
    return tasks


# ----------------------------------------------------------------------------- regen

@dataclass
class FileChange:
    name: str
    status: str  # new | changed | unchanged | removed | failed | stale
    summary: str = ""


@dataclass
class RegenReport:
    executor: str
    entries: int
    files: list[FileChange]

    def count(self, status: str) -> int:
        return sum(f.status == status for f in self.files)

    @property
    def written(self) -> int:
        return self.count("new") + self.count("changed") + self.count("removed")

    @property
    def exit_code(self) -> int:
        if self.count("failed"):
            return 2
        return 1 if self.written else 0

    def to_dict(self) -> dict[str, Any]:
        return {"executor": self.executor, "entries": self.entries,
                "counts": {s: self.count(s) for s in ("new", "changed", "unchanged", "removed", "stale", "failed")},
                "files": [{"name": f.name, "status": f.status, "summary": f.summary} for f in self.files],
                "exit_code": self.exit_code}

    def lines(self) -> list[str]:
        c = self.to_dict()["counts"]
        head = (f"regen: {self.entries} entries via {self.executor}: {c['changed']} changed, {c['new']} new, "
                f"{c['unchanged']} unchanged" + (f", {c['removed']} removed" if c["removed"] else "")
                + (f", {c['stale']} not in the matrix (kept; --prune removes)" if c["stale"] else "")
                + (f", {c['failed']} FAILED" if c["failed"] else ""))
        out = [head]
        for f in self.files:
            if f.status != "unchanged":
                out.append(f"  {f.status:<9} {f.name}" + (f": {f.summary}" if f.summary else ""))
        return out


def _change_summary(old: bytes, new: bytes) -> str:
    """Words for what changed between two versions of a plan file."""
    import orjson

    from opweave_planner.contract import diff_plans, parse_plan

    try:
        a, b = parse_plan(orjson.loads(old), "old"), parse_plan(orjson.loads(new), "new")
    except (UserError, orjson.JSONDecodeError):
        return "previous file was not a readable plan"
    d = diff_plans(a, b)
    parts = [c["summary"] for c in d["changes"]]
    if not parts:
        parts = ["same plan; inputs changed: " + (", ".join(d["inputs_changed"]) or "none")]
        parts += d["notes"]
    return "; ".join(parts)


def _is_plan_file(path: Path) -> bool:
    """Only files this tool wrote are ever reported stale or pruned (not any *.json)."""
    import orjson

    from opweave_planner.contract import parse_plan

    try:
        parse_plan(orjson.loads(path.read_bytes()), str(path))
    except (UserError, OSError, orjson.JSONDecodeError):
        return False
    return True


def _entry_line(index: int, total: int, change: FileChange, value: bytes | None) -> str:
    from opweave_planner.report import entry_line, measured_share

    if change.status == "failed":
        return f"[{index}/{total}] {change.name}: FAILED ({change.summary})"
    doc = orjson_loads(value)
    usd = doc.get("usd_per_million_tokens")
    return entry_line(index, total, change.name.removesuffix(".json"), usd, status=change.status,
                      measured=measured_share(doc.get("stages") or []), tpot_ms=doc.get("tpot_ms"),
                      reason=doc.get("reason"))


def orjson_loads(data: bytes | None) -> dict:
    import orjson

    return orjson.loads(data) if data else {}


def regen(matrix: str | Path, out: str | Path, jobs: int = 1, ray: str | None = None, retries: int = 1,
          prune: bool = False, log=None) -> RegenReport:
    """Plan every entry; write changed files as each entry finishes; `log(line)` per entry."""
    from opweave_planner.atomic import check_writable
    from opweave_planner.executor import make_executor
    from opweave_planner.plan import write_atomic

    tasks = load_matrix(matrix)
    executor = make_executor(jobs, ray, retries)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: '{out}' is not a folder")
    if out.exists():
        check_writable(out / ".opweave-regen-probe", "--out")
    changes: dict[int, FileChange] = {}

    def finished(res) -> None:
        task = tasks[res.index]
        if not res.ok:
            tries = f" after {res.attempts} attempt{'s' if res.attempts > 1 else ''}"
            change = FileChange(task.name, "failed", f"{res.error}{tries}")
        else:
            path = out / task.name
            if path.exists() and not path.is_file():
                change = FileChange(task.name, "failed", f"'{path}' exists and is not a file")
            else:
                old = path.read_bytes() if path.is_file() else None
                if old == res.value:
                    change = FileChange(task.name, "unchanged")
                else:
                    write_atomic(path, res.value, field="--out")
                    change = FileChange(task.name, "new" if old is None else "changed",
                                        "" if old is None else _change_summary(old, res.value))
        changes[res.index] = change
        if log:
            log(_entry_line(len(changes), len(tasks), change, res.value if res.ok else None))

    executor.map(run_task, tasks, [t.name for t in tasks], on_result=finished)
    files = [changes[i] for i in range(len(tasks))]
    produced = {t.name for t in tasks}
    if out.is_dir():
        for stale in sorted(out.glob("*.json")):
            if stale.name not in produced and _is_plan_file(stale):
                if prune:
                    stale.unlink()
                    files.append(FileChange(stale.name, "removed", "not in the matrix"))
                else:
                    files.append(FileChange(stale.name, "stale", "not in the matrix"))
    return RegenReport(executor.name, len(tasks), files)
