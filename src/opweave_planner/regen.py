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

    [[entry]]                       # the cross product of these lists
    models = ["llama-3.1-8b", "qwen3-30b-a3b"]
    contexts = ["8k", "32k"]
    slos = ["30ms", "60ms"]
    gpus = ["h100", "h100,a100"]
    policies = ["opweave", "colocated"]
    [entry.space]                   # optional overrides for this entry
    max_replicas = 2

Each entry becomes `<out>/<model>_ctx<ctx>_slo<slo>_<gpu+gpu>_<policy>.json` (a plan, or an
infeasibility record). Files are compared byte for byte and rewritten atomically only when
different. Exit status: 1 when any file was written or removed, 0 when none, 2 on bad input or
when an entry still failed after its retries (the others are written all the same).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opweave_planner.errors import UserError

ENTRY_KEYS = ("models", "contexts", "slos", "gpus", "policies")
TOP_KEYS = {"prices", "catalog", "profiles", "backend", "network_bandwidth", "network_latency", "space", "entry"}
SPACE_INT_LISTS = {"tps": "tps", "tensor_parallel_sizes": "tps", "batches": "batches"}
SPACE_INTS = ("max_owners", "max_microbatches", "max_replicas", "max_gpus")
SPACE_KEYS = set(SPACE_INT_LISTS) | set(SPACE_INTS) | {"moe_expert_parallel", "memory_reserve_gb"}


@dataclass(frozen=True)
class RegenTask:
    """One matrix entry, in plain picklable values (what a worker process or Ray task receives)."""

    name: str
    model: str
    context: int
    slo_ms: float
    gpus: str
    policy: str
    prices: str | None = None
    catalog: str | None = None
    profiles_dir: str | None = None
    backend: str = "vllm"
    network_gbps: float | None = None
    network_latency_us: float | None = None
    reserve_gb: float | None = None
    space: tuple[tuple[str, Any], ...] = field(default=())

    def request(self):
        from opweave_planner import api

        return api.make_request(self.model, self.slo_ms, self.context, gpus=self.gpus, policy=self.policy,
                                catalog=self.catalog, prices=self.prices, profiles_dir=self.profiles_dir,
                                backend=self.backend, network_gbps=self.network_gbps,
                                network_latency_us=self.network_latency_us, reserve_gb=self.reserve_gb,
                                **dict(self.space))


def run_task(task: RegenTask) -> bytes:
    """Plan one entry; the canonical bytes of its plan (or infeasibility record)."""
    from opweave_planner import api
    from opweave_planner.plan import plan_bytes

    plan, infeasible = api.plan(task.request(), jobs=1)
    return plan_bytes(plan if plan is not None else infeasible)


# ----------------------------------------------------------------------------- matrix

def _label_tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-")


def _list(value: Any, key: str, where: str) -> list:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list) and value:
        return value
    raise UserError(f"{where}: '{key}' must be a non-empty list")


def _space(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise UserError(f"{where}: 'space' must be a table")
    unknown = set(obj) - SPACE_KEYS
    if unknown:
        raise UserError(f"{where}: unknown space key(s) {', '.join(sorted(unknown))}; expected "
                        f"{', '.join(sorted(SPACE_KEYS))}")
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if k in SPACE_INT_LISTS:
            if not (isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                                      for x in v)):
                raise UserError(f"{where}: space.{k} must be a non-empty list of positive integers")
            out[SPACE_INT_LISTS[k]] = tuple(v)
        elif k in SPACE_INTS:
            if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
                raise UserError(f"{where}: space.{k} must be a positive integer")
            out[k] = v
        elif k == "moe_expert_parallel":
            if not isinstance(v, bool):
                raise UserError(f"{where}: space.{k} must be true or false")
            out[k] = v
        else:  # memory_reserve_gb
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise UserError(f"{where}: space.{k} must be a non-negative number")
            out["reserve_gb"] = float(v)
    return out


def _number(obj: dict, key: str, where: str) -> float | None:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise UserError(f"{where}: '{key}' must be a positive number")
    return float(v)


def load_matrix(path: str | Path) -> list[RegenTask]:
    """Expand a matrix file into validated tasks (every entry checked before anything runs)."""
    from opweave_planner import api
    from opweave_planner.inputs.model import load_model

    p = Path(path)
    where = str(path)
    if not p.is_file():
        raise UserError(f"--matrix: file '{path}' does not exist")
    try:
        obj = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"--matrix: '{path}' is not valid TOML ({exc})") from None
    unknown = set(obj) - TOP_KEYS
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; expected "
                        f"{', '.join(sorted(TOP_KEYS))}")
    base = p.resolve().parent

    def rel(key: str) -> str | None:
        v = obj.get(key)
        if v is None:
            return None
        if not isinstance(v, str):
            raise UserError(f"{where}: '{key}' must be a path string")
        return str((base / v).resolve())

    common = {"prices": rel("prices"), "catalog": rel("catalog"), "profiles_dir": rel("profiles"),
              "backend": obj.get("backend", "vllm"),
              "network_gbps": _number(obj, "network_bandwidth", where),
              "network_latency_us": None if obj.get("network_latency") is None else float(obj["network_latency"])}
    if common["network_latency_us"] is not None and common["network_latency_us"] < 0:
        raise UserError(f"{where}: 'network_latency' must be non-negative")
    top_space = _space(obj.get("space", {}), where)
    entries = obj.get("entry")
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{where}: no [[entry]] tables; each lists models, contexts, slos, gpus and policies")
    tasks: list[RegenTask] = []
    names: dict[str, str] = {}
    for e_i, entry in enumerate(entries):
        ew = f"{where}: entry {e_i + 1}"
        extra = set(entry) - set(ENTRY_KEYS) - {"space"}
        if extra:
            raise UserError(f"{ew}: unknown key(s) {', '.join(sorted(extra))}; expected "
                            f"{', '.join(ENTRY_KEYS)}, space")
        missing = [k for k in ENTRY_KEYS if k not in entry]
        if missing:
            raise UserError(f"{ew}: missing {', '.join(missing)}")
        lists = {k: _list(entry[k], k, ew) for k in ENTRY_KEYS}
        space = {**top_space, **_space(entry.get("space", {}), ew)}
        reserve = space.pop("reserve_gb", None)
        for model in lists["models"]:
            try:
                spec = load_model(str(model))
            except UserError as exc:
                raise UserError(f"{ew}: {exc}") from None
            for ctx in lists["contexts"]:
                for slo in lists["slos"]:
                    for gpus in lists["gpus"]:
                        for policy in lists["policies"]:
                            try:
                                req = api.make_request(str(model), str(slo), str(ctx), gpus=str(gpus),
                                                       policy=str(policy), catalog=common["catalog"],
                                                       prices=common["prices"],
                                                       profiles_dir=common["profiles_dir"],
                                                       backend=common["backend"],
                                                       network_gbps=common["network_gbps"],
                                                       network_latency_us=common["network_latency_us"],
                                                       reserve_gb=reserve, **space)
                            except (UserError, TypeError) as exc:
                                raise UserError(f"{ew} ({model}, {ctx}, {slo}, {gpus}, {policy}): {exc}") from None
                            name = (f"{_safe(spec.name)}_ctx{_label_tokens(req.context)}_slo{req.slo_ms:g}ms_"
                                    f"{'+'.join(req.space.gpus)}_{policy}.json")
                            label = f"entry {e_i + 1} ({model}, {ctx}, {slo}, {gpus}, {policy})"
                            if name in names:
                                raise UserError(f"{where}: {label} duplicates {names[name]} (both write {name})")
                            names[name] = label
                            tasks.append(RegenTask(
                                name=name, model=str(model), context=req.context, slo_ms=req.slo_ms,
                                gpus=",".join(req.space.gpus), policy=str(policy), reserve_gb=reserve,
                                space=tuple(sorted(space.items())), **common))
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


def regen(matrix: str | Path, out: str | Path, jobs: int = 1, ray: str | None = None, retries: int = 1,
          prune: bool = False) -> RegenReport:
    from opweave_planner.executor import make_executor
    from opweave_planner.plan import write_atomic

    tasks = load_matrix(matrix)
    executor = make_executor(jobs, ray, retries)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: '{out}' is not a folder")
    results = executor.map(run_task, tasks, [t.name for t in tasks])
    files: list[FileChange] = []
    for task, res in zip(tasks, results, strict=True):
        if not res.ok:
            tries = f" after {res.attempts} attempt{'s' if res.attempts > 1 else ''}"
            files.append(FileChange(task.name, "failed", f"{res.error}{tries}"))
            continue
        path = out / task.name
        old = path.read_bytes() if path.is_file() else None
        if old == res.value:
            files.append(FileChange(task.name, "unchanged"))
            continue
        write_atomic(path, res.value)
        files.append(FileChange(task.name, "new" if old is None else "changed",
                                "" if old is None else _change_summary(old, res.value)))
    produced = {t.name for t in tasks}
    if out.is_dir():
        for stale in sorted(out.glob("*.json")):
            if stale.name not in produced:
                if prune:
                    stale.unlink()
                    files.append(FileChange(stale.name, "removed", "not in the matrix"))
                else:
                    files.append(FileChange(stale.name, "stale", "not in the matrix"))
    return RegenReport(executor.name, len(tasks), files)
