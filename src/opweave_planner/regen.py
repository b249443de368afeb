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

The whole deployment's settings and a fixed context's lengths (`prompt_len`, `output_len`,
`ttft`, `ttft_percentile`, `request_rate`, `arrivals`, `rate_scale`) may also be lists: each list
is one more axis of the cross product, and the file name carries the values
(`..._ctx8k-isl7k-osl1k_slo60ms_ttft800ms-p90-rate6_...`).

An entry gives `contexts` (fixed context lengths) or `workloads` (trace or law files relative
to the matrix, or inline laws; `scale_ctx`, `slo_percentile`, ... as settings). Each entry
becomes `<out>/<model>_ctx<ctx>_slo<slo>_<gpu+gpu>_<policy>.json` (a workload:
`..._wl-<file stem>[-scale<ctx>]_...`), a plan or an infeasibility record. Files are compared byte for byte and rewritten atomically only when
different. Exit status: 1 when any file was written or removed, 0 when none, 2 on bad input or
when an entry still failed after its retries (the others are written all the same), 3 when an
entry's plan is not deployable (below) or, with `fail_on` naming it, an entry is infeasible.

`deployable = "vllm"` (at the top or in an entry; `--deployable` for every entry naming none,
"any" for no requirement) asks for plans that export target runs: the search runs under the
target's own limits (`Target.search_limits`, for vllm/sglang/dynamo/llm-d one stage on one
owner), so the file holds the cheapest plan that runtime runs, and the result is checked with
the target's own rule (`export.registry.runs`). A plan that still fails it (vllm-afd: no search
limit expresses an attention | FFN split) is not written and reported `undeployable`.

Stable regeneration (`hysteresis` > 0, see docs/regen.md): when the new optimum's placement
differs from the entry's existing plan, that plan is re-evaluated under the new inputs
(`contract.evaluate_plan`, same placement); if it still meets its SLO, fits memory, was made
for the same request and searched space, and costs at most `hysteresis` % more than the new
optimum, its re-evaluated bytes are written instead (placement kept, prices and cost current).
The comparison is always against the new optimum of the full search, so a kept plan is never
more than `hysteresis` % dearer than the best. Hysteresis 0 is exactly the plain regeneration.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from opweave_planner.errors import UserError, printable
from opweave_planner.regen_files import (
    CACHE_FILE,
    MAX_OWN_BYTES,
    _file_sha,
    _load_cache,
    _own_file_problem,
    _previous,
    _record,
    _write_own,
    check_own_file,
    code_hash,
    fingerprint,
)
from opweave_planner.regen_matrix import AXES, RegenTask, load_matrix

__all__ = ["AXES", "CACHE_FILE", "MAX_HYSTERESIS", "MAX_OWN_BYTES", "TOPOLOGY_ASPECTS", "EntryResult",
           "FileChange", "RegenJob", "RegenReport", "RegenTask", "check_own_file", "code_hash", "fingerprint",
           "expected_cost", "heaviest_first", "load_matrix", "parse_fail_on", "parse_hysteresis", "premium_pct", "regen", "run_job", "run_task", "topology_changes",
           "within_hysteresis"]


REGEN_ETA_AFTER = 0.05  # the share of the expected work done before an entry line shows an ETA
# an entry's search cost beside its fixed part (compiling the request, building the plan: about
# 0.3 s), per GPU type of four TP sizes: an opweave entry on one type takes about 10x a
# colocated one. The first weights (1000 for opweave, 1 for colocated, no fixed part) put the
# first regen ETA at 0.04x the real time left (benchmarks/bench_eta.py --only regen)
_POLICY_WEIGHT = {"opweave": 10.0, "cad": 3.0, "afd": 1.0, "colocated": 0.1}


def expected_cost(task: RegenTask) -> float:
    """A rough relative cost of planning `task`: a fixed 1 plus its policy's weight times the
    search's own per-template weight (`search.driver.template_work`) of its phase over every
    GPU type, plus one per type alone when there are several, 1 for one type of four TP sizes.
    Orders the work and scales regen's ETA; no plan depends on it."""
    from opweave_planner.search.driver import template_work

    req = task.request
    types, tps = len(req.gpus), len(req.tensor_parallel_sizes)
    work = template_work(types * tps, 1) + (types * template_work(tps, 1) if types > 1 else 0.0)
    return 1.0 + _POLICY_WEIGHT.get(str(req.policy), 10.0) * work / template_work(4, 1)


def heaviest_first(tasks: list[RegenTask]) -> list[int]:
    """Indices of `tasks` by expected cost, largest first (ties: matrix order): on worker
    processes the long entries start first, so none is left running alone at the end."""
    return sorted(range(len(tasks)), key=lambda i: (-expected_cost(tasks[i]), i))


def run_task(task: RegenTask) -> bytes:
    """Plan one entry; the canonical bytes of its plan (or infeasibility record)."""
    from opweave_planner import api
    from opweave_planner.plan import plan_bytes

    return plan_bytes(api.plan(task.request, jobs=1).document)


# ----------------------------------------------------------------------------- hysteresis

MAX_HYSTERESIS = 100.0
_PERCENT = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(%?)\s*")
# diff_plans aspects that change what a runtime deploys (the rest is cost, TPOT and inputs)
TOPOLOGY_ASPECTS = ("placement", "gpus", "batch", "feasibility", "request")
# PlanRequest settings an existing plan is re-evaluated under (the entry's new inputs)
_REEVAL_INPUTS = ("prices", "catalog", "profiles", "network_bandwidth", "network_latency", "model")
# and the entry's target load and whole-deployment settings: a kept placement is re-sized for them
_REEVAL_LOAD = ("target_tokens_per_s", "target_concurrency", "ttft", "ttft_percentile", "request_rate", "arrivals",
                "rate_scale")


def parse_hysteresis(text: object, field: str = "--hysteresis") -> float:
    """'5%' -> 5.0 (percent of the new optimum's cost); 0 to 100 %, a bare number other than 0
    is ambiguous (5 % or 500 %?) and rejected."""
    expect = f"expected a percentage from 0% to {MAX_HYSTERESIS:g}% such as 5%, got '{text}'"
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _PERCENT.fullmatch(str(text))
        if not m:
            raise UserError(f"{field}: {expect}")
        value = float(m.group(1))
        if not m.group(2) and value != 0:
            raise UserError(f"{field}: '{text}' has no unit; write a percentage such as 5%")
    if not (0.0 <= value <= MAX_HYSTERESIS):  # also rejects nan
        raise UserError(f"{field}: {expect}")
    return value


def within_hysteresis(kept_usd: float, optimum_usd: float, hysteresis_pct: float) -> bool:
    """Keep when the re-evaluated plan costs at most `hysteresis_pct` % more than the optimum
    (inclusive; compared on the plan files' own rounded figures, so the decision is exact)."""
    return hysteresis_pct > 0 and kept_usd <= optimum_usd * (1.0 + hysteresis_pct / 100.0)


def premium_pct(kept_usd: float, optimum_usd: float) -> float:
    """How much more the previous placement costs than the new optimum, % of the optimum."""
    if optimum_usd > 0:
        return (kept_usd / optimum_usd - 1.0) * 100.0
    return 0.0 if kept_usd <= 0 else float("inf")


def topology_changes(old, new) -> list[str]:
    """The topology aspects (placement, GPUs, batch, feasibility, request) that differ."""
    from opweave_planner.contract import diff_plans

    return [c["aspect"] for c in diff_plans(old, new)["changes"] if c["aspect"] in TOPOLOGY_ASPECTS]


@dataclass(frozen=True)
class RegenJob:
    """What a worker needs for one entry: the task, the file's current bytes, the hysteresis."""

    task: RegenTask
    previous: bytes | None = None
    hysteresis: float = 0.0


@dataclass(frozen=True)
class EntryResult:
    """A worker's answer: the bytes to hold in the file and what was decided.

    `premium_pct` is the previous placement's cost under the new inputs over the new
    optimum's, minus one, in % (None when it was not priced: no previous plan, same
    placement, or the previous plan could not be re-evaluated).
    """

    value: bytes
    kept: bool = False
    premium_pct: float | None = None
    note: str = ""


def _premium(pct: float) -> str:
    # negative when the new plan is not the cheapest (--prefer-simpler returns a simpler one)
    return f"previous placement costs {abs(pct):.2f} % {'more' if pct >= 0 else 'less'} than the new optimum"


def run_job(job: RegenJob) -> EntryResult:
    """Plan one entry, then (hysteresis > 0) keep its existing placement if it still qualifies."""
    import orjson

    from opweave_planner import api
    from opweave_planner.contract import evaluate_plan, parse_plan
    from opweave_planner.plan import Plan, plan_bytes

    task = job.task
    outcome = api.plan(task.request, jobs=1)
    plan, optimum = outcome.plan, plan_bytes(outcome.document)
    if job.hysteresis <= 0 or job.previous is None or plan is None:
        return EntryResult(optimum)
    try:
        prev = parse_plan(orjson.loads(job.previous), task.name)
    except (UserError, orjson.JSONDecodeError):
        return EntryResult(optimum)
    if not isinstance(prev, Plan) or not topology_changes(prev, plan):
        return EntryResult(optimum)
    overrides = {k: getattr(task.request, k) for k in (*_REEVAL_INPUTS, *_REEVAL_LOAD)}
    try:
        ev = evaluate_plan(prev, where=task.name, **overrides)
    except Exception as exc:  # never worse than a plain regen: the optimum is written
        text = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
        return EntryResult(optimum, note=f"replaced: previous placement not re-evaluated ({' '.join(text.split())})")
    again = ev.plan
    pct = premium_pct(again.usd_per_million_tokens, plan.usd_per_million_tokens)
    why = ""
    if (prev.model, prev.workload, prev.policy) != (plan.model, plan.workload, plan.policy):
        why = "the previous plan answers a different request"
    elif prev.search.space != plan.search.space:
        why = "the previous plan was searched over a different space"
    elif _load_of(again) != _load_of(plan):
        why = "the previous plan's deployment answers a different target load or TTFT"
    elif again.provenance != plan.provenance:
        diff = [k for k in type(plan.provenance).model_fields
                if getattr(again.provenance, k) != getattr(plan.provenance, k)]
        why = f"the previous plan re-evaluates under different inputs ({', '.join(diff)})"
    elif not ev.meets_slo:
        why = f"previous placement misses the SLO ({again.tpot_ms:.4g} ms > {prev.workload.tpot_slo_ms:g} ms)"
    elif not ev.fits_memory:
        why = "previous placement no longer fits memory"
    elif task.deployable and not _runs(task.deployable, orjson.loads(plan_bytes(again))):
        why = f"previous placement is not one {task.deployable} runs"
    if why:
        return EntryResult(optimum, note=f"replaced: {why}")
    if within_hysteresis(again.usd_per_million_tokens, plan.usd_per_million_tokens, job.hysteresis):
        note = f"kept: {_premium(pct)} (<= {job.hysteresis:g} %)"
        return EntryResult(plan_bytes(again), kept=True, premium_pct=pct, note=note)
    return EntryResult(optimum, premium_pct=pct, note=f"replaced: {_premium(pct)} (> {job.hysteresis:g} %)")


def _load_of(doc) -> tuple | None:
    """What a plan's deployment was sized for (the request's side of it, not the figures)."""
    d = doc.deployment
    if d is None:
        return None
    a, p = d.arrivals, d.prefill if d.prefill is not None else d.aggregated  # 1.14: no prefill pool
    return (d.mode, d.target_concurrency, d.target_tokens_per_s if a is None else None,
            None if a is None else (a.process, a.request_rate, a.target_tokens_per_s, a.rate_scale),
            None if p is None else (p.ttft_slo_ms, p.ttft_percentile))


def _runs(runtime: str, doc: dict) -> bool:
    from opweave_planner.export.registry import runs

    return runs(runtime, doc)


# ----------------------------------------------------------------------------- regen

# what `fail_on` may name: conditions that make regen exit 3 (an undeployable plan always does)
FAIL_ON = ("infeasible", "undeployable")


def parse_fail_on(text: object, field: str = "--fail-on") -> tuple[str, ...]:
    """'infeasible' or 'infeasible,undeployable' -> the conditions (empty: none)."""
    if text is None or text == "":
        return ()
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    out = []
    for item in items:
        word = str(item).strip()
        if word not in FAIL_ON:
            raise UserError(f"{field}: unknown condition '{printable(word)}'; expected {' or '.join(FAIL_ON)} "
                            f"(comma-separated)")
        if word not in out:
            out.append(word)
    return tuple(out)


@dataclass
class FileChange:
    """One file's outcome. Its words may come from a worker's error, an old file or the cache
    record, so they are made printable here, once, for every report (text and JSON)."""

    name: str
    status: str  # new | changed | unchanged | removed | failed | stale | undeployable
    summary: str = ""
    # for a changed file: "topology" (placement, GPUs, batch, feasibility), "cost" (cost or TPOT
    # moved, same placement) or "provenance" (same placement and figures; only inputs recorded)
    kind: str = ""
    kept: bool = False  # the previous placement was kept (hysteresis)
    premium_pct: float | None = None  # previous placement's cost over the new optimum's, %
    note: str = ""  # the hysteresis decision in words
    binding: str = ""  # the file holds an infeasibility record: its binding constraint (slo, memory)
    reason: str = ""  # ... and its reason

    def __post_init__(self) -> None:
        self.name, self.summary, self.note, self.binding, self.reason = (
            printable(x) for x in (self.name, self.summary, self.note, self.binding, self.reason))

    @property
    def infeasible(self) -> bool:
        return bool(self.reason)


@dataclass
class RegenReport:
    executor: str
    entries: int
    files: list[FileChange]
    hysteresis: float = 0.0
    fail_on: tuple[str, ...] = ()

    def count(self, status: str) -> int:
        return sum(f.status == status for f in self.files)

    @property
    def written(self) -> int:
        return self.count("new") + self.count("changed") + self.count("removed")

    @property
    def exit_code(self) -> int:
        if self.count("failed"):
            return 2
        if self.count("undeployable") or ("infeasible" in self.fail_on and self.infeasible):
            return 3
        return 1 if self.written else 0

    @property
    def infeasible(self) -> list[FileChange]:
        """Entries whose file holds (or would hold) an infeasibility record, in matrix order."""
        return [f for f in self.files if f.infeasible]

    def changed(self, kind: str) -> list[FileChange]:
        """Changed feasible files of one kind ("topology", "cost" or "provenance"), in matrix order."""
        return [f for f in self.files if f.status == "changed" and f.kind == kind and not f.infeasible]

    @property
    def kept(self) -> list[FileChange]:
        return [f for f in self.files if f.kept]

    def to_dict(self) -> dict[str, Any]:
        return {"executor": self.executor, "entries": self.entries, "hysteresis_pct": self.hysteresis,
                "counts": {**{s: self.count(s) for s in ("new", "changed", "unchanged", "removed", "stale",
                                                          "failed", "undeployable")},
                           "infeasible": len(self.infeasible)},
                "changes": {"topology": [f.name for f in self.changed("topology")],
                            "cost_only": [f.name for f in self.changed("cost")],
                            "provenance_only": [f.name for f in self.changed("provenance")]},
                "kept": [f.name for f in self.kept],
                "infeasible": [{"name": f.name, "binding": f.binding or None, "reason": f.reason}
                               for f in self.infeasible],
                "fail_on": list(self.fail_on),
                "files": [{"name": f.name, "status": f.status, "summary": f.summary, "change": f.kind or None,
                           "kept": f.kept, "premium_pct": _num(f.premium_pct), "note": f.note,
                           "binding": f.binding or None, "reason": f.reason or None}
                          for f in self.files],
                "exit_code": self.exit_code}

    def lines(self) -> list[str]:
        c = self.to_dict()["counts"]
        topo, cost, prov = self.changed("topology"), self.changed("cost"), self.changed("provenance")
        bad = self.infeasible
        head = (f"regen: {self.entries} entries via {self.executor}: {c['changed']} changed "
                f"({len(topo)} topology, {len(cost)} cost only, {len(prov)} provenance only), {c['new']} new, "
                f"{c['unchanged']} unchanged" + (f", {c['removed']} removed" if c["removed"] else "")
                + (f", {len(bad)} infeasible" + (" (--fail-on infeasible)" if "infeasible" in self.fail_on else "")
                   if bad else "")
                + (f", {c['undeployable']} UNDEPLOYABLE (not written)" if c["undeployable"] else "")
                + (f", {c['stale']} not in the matrix (kept; --prune removes)" if c["stale"] else "")
                + (f", {c['failed']} FAILED" if c["failed"] else ""))
        if self.hysteresis > 0:
            head += f"; hysteresis {self.hysteresis:g} %: {len(self.kept)} placement(s) kept"
        out = [head]

        def line(f: FileChange) -> str:
            words = "; ".join(w for w in (f.note, f.summary) if w)
            return f"    {f.status:<9} {f.name}" + (f": {words}" if words else "")

        for title, group in (("topology changes (placement, GPUs or batch)", topo),
                             ("cost-only changes (same placement, new cost or TPOT)", cost),
                             ("provenance-only changes (same placement, cost and TPOT; recorded inputs "
                              "changed)", prov)):
            if group:
                out.append(f"  {title}: {len(group)}")
                out.extend(line(f) for f in group)
        quiet = [f for f in self.files if f.kept and f.status == "unchanged"]
        if quiet:
            out.append(f"  kept placements, file unchanged: {len(quiet)}")
            out.extend(line(f) for f in quiet)
        if bad:  # every infeasible entry, whatever its file did: the reason is the news
            out.append(f"  infeasible (no plan meets the request): {len(bad)}")
            out.extend(f"    {f.status:<9} {f.name}: {f.binding or 'binding not recorded'}: {f.reason}" for f in bad)
        rest = [f for f in self.files if f.status not in ("unchanged", "changed") and not f.infeasible]
        if rest:
            out.append(f"  other: {len(rest)}")
            out.extend(line(f) for f in rest)
        return [printable(x) for x in out]  # the executor's name holds the --ray address


def _num(x: float | None) -> float | None:
    if x is None or x != x or x in (float("inf"), float("-inf")):
        return None
    return float(f"{x:.6g}")


def _change_summary(old: bytes, new: bytes) -> tuple[str, str]:
    """Words for what changed between two versions of a plan file, and the kind of change
    ("topology" when placement, GPUs, batch or feasibility changed, "cost" when only the cost
    or TPOT did, "provenance" when neither: a price of a GPU the plan does not use, say)."""
    import orjson

    from opweave_planner.contract import diff_plans, parse_plan

    try:
        a, b = parse_plan(orjson.loads(old), "old"), parse_plan(orjson.loads(new), "new")
    except (UserError, orjson.JSONDecodeError):
        return "previous file was not a readable plan", "topology"
    d = diff_plans(a, b)
    parts = [c["summary"] for c in d["changes"]]
    kind = ("topology" if any(c["aspect"] in TOPOLOGY_ASPECTS for c in d["changes"])
            else "cost" if d["changes"] else "provenance")
    if not parts:
        parts = ["same plan, same cost and TPOT; inputs changed: " + (", ".join(d["inputs_changed"]) or "none")]
        parts += d["notes"]
    return "; ".join(parts), kind


def _is_plan_file(path: Path) -> bool:
    """Only files this tool wrote are ever reported stale or pruned (not any *.json): a plain
    file (never a link, a FIFO or a folder) that reads as a plan."""
    from opweave_planner.contract import parse_plan

    data = _previous(path)
    if data is None:
        return False
    try:
        parse_plan(orjson.loads(data), str(path))
    except (UserError, orjson.JSONDecodeError, RecursionError):
        return False
    return True


def _entry_line(index: int, total: int, change: FileChange, value: bytes | None) -> str:
    from opweave_planner.report import entry_line, measured_share

    if change.status in ("failed", "undeployable"):
        return printable(f"[{index}/{total}] {change.name}: {change.status.upper()} ({change.summary})")
    doc = orjson_loads(value)
    usd = doc.get("usd_per_million_tokens")
    status = change.status + (f"; {change.note}" if change.note else "")
    return printable(entry_line(index, total, change.name.removesuffix(".json"), usd, status=status,
                                measured=measured_share(doc.get("stages") or []), tpot_ms=doc.get("tpot_ms"),
                                reason=doc.get("reason")))


def orjson_loads(data: bytes | None) -> dict:
    import orjson

    return orjson.loads(data) if data else {}


def regen(matrix: str | Path, out: str | Path, jobs: int = 1, ray: str | None = None, retries: int = 1,
          prune: bool = False, log=None, hysteresis: float | str = 0.0, deployable: str | None = None,
          fail_on: object = ()) -> RegenReport:
    """Plan every entry; write changed files as each entry finishes; `log(line)` per entry.

    `hysteresis` (percent, or text such as '5%'): keep an entry's existing placement while it
    stays feasible and within that share of the new optimum's cost (0: always the optimum).
    `deployable`: the runtime every entry naming none must run on; `fail_on`: conditions that
    make the exit status 3 ("infeasible").
    """
    from opweave_planner.atomic import check_writable_folder
    from opweave_planner.executor import make_executor

    hysteresis = parse_hysteresis(hysteresis)
    fail_on = parse_fail_on(fail_on)
    tasks = load_matrix(matrix, deployable)
    executor = make_executor(jobs, ray, retries)
    prints = {}
    for t in tasks:  # reads every entry's inputs: a bad one fails here, before --out is created
        try:
            prints[t.name] = fingerprint(t.request, hysteresis, t.deployable)
        except UserError as exc:
            raise UserError(f"{printable(matrix)}: {t.name}: {exc}") from None
    # before any search: --out, the cache record and every entry's file must be writable
    # plain files inside --out, or this fails now, not after planning everything
    check_writable_folder(out, "--out")
    out = Path(out)
    check_own_file(out / CACHE_FILE, "regen's cache record")
    for t in tasks:
        check_own_file(out / t.name, f"entry {t.name}")
    changes: dict[int, FileChange] = {}
    cache = _load_cache(out)
    todo = []
    for i, t in enumerate(tasks):  # inputs, code and file as last written: the search would repeat itself
        seen = _record(cache.get(t.name))
        if seen is not None and seen["fingerprint"] == prints[t.name] and seen["sha256"] == _file_sha(out / t.name):
            note = "; ".join(x for x in (seen["note"], "inputs unchanged: not re-planned") if x)
            changes[i] = FileChange(t.name, "unchanged", kept=seen["kept"], premium_pct=seen["premium_pct"],
                                    note=note, **_infeasibility(_previous(out / t.name)))
            if log:
                log(_entry_line(len(changes), len(tasks), changes[i], _previous(out / t.name)))
        else:
            todo.append(i)

    from opweave_planner.report import RateEta, format_duration

    # the ETA on each planned entry's line, in `expected_cost` units, at the rate since the
    # workers started: entries run side by side, so the rate since the first one finished
    # would count its neighbour's work as done in no time (it read 0.05x the time left)
    weight = {i: expected_cost(tasks[i]) for i in todo}
    left, left_done, total_weight = RateEta(REGEN_ETA_AFTER), [0.0], sum(weight.values())
    left.update(0.0, total_weight)

    def finished(res) -> None:
        index = todo[res.index]
        task = tasks[index]
        value = None
        if not res.ok:
            tries = f" after {res.attempts} attempt{'s' if res.attempts > 1 else ''}"
            change = FileChange(task.name, "failed", f"{res.error}{tries}")
        else:
            result = res.value if isinstance(res.value, EntryResult) else EntryResult(res.value)
            value = result.value
            decided = {"kept": result.kept, "premium_pct": result.premium_pct, "note": result.note,
                       **_infeasibility(value)}
            path = out / task.name
            problem = _own_file_problem(path)
            doc = orjson_loads(value)
            if problem:  # it changed since the check up front
                change = FileChange(task.name, "failed", f"'{path}' {problem}")
            elif task.deployable and doc.get("feasible") is not False and not _runs(task.deployable, doc):
                from opweave_planner.export.common import shape_words
                from opweave_planner.plan import Plan

                shape = shape_words(Plan.model_validate(doc))
                change = FileChange(task.name, "undeployable", f"{task.deployable} cannot run the optimum "
                                    f"({shape}); file left as it was", **decided)
                value = None
            else:
                old = _previous(path)
                if old == value:
                    change = FileChange(task.name, "unchanged", **decided)
                else:
                    _write_own(path, value)
                    if old is None:
                        change = FileChange(task.name, "new", **decided)
                    else:
                        summary, kind = _change_summary(old, value)
                        change = FileChange(task.name, "changed", summary, kind, **decided)
        changes[index] = change
        if change.status in ("failed", "undeployable"):
            cache.pop(task.name, None)
        else:
            cache[task.name] = {"fingerprint": prints[task.name], "sha256": hashlib.sha256(value).hexdigest(),
                                "kept": change.kept, "premium_pct": change.premium_pct, "note": change.note}
        if log:
            left_done[0] += weight[index]
            left.update(left_done[0], total_weight)
            eta = left.seconds() if len(changes) < len(tasks) else None
            log(_entry_line(len(changes), len(tasks), change, value)
                + ("" if eta is None else f"; ETA {format_duration(eta)}"))

    if jobs > 1 or ray:  # in one process the matrix order is the log's order, and costs nothing
        todo = [todo[i] for i in heaviest_first([tasks[i] for i in todo])]
    run = [tasks[i] for i in todo]
    try:
        if hysteresis > 0:
            jobs_ = [RegenJob(t, _previous(out / t.name), hysteresis) for t in run]
            executor.map(run_job, jobs_, [t.name for t in run], on_result=finished)
        else:  # exactly the plain regeneration
            executor.map(run_task, run, [t.name for t in run], on_result=finished)
    finally:
        _write_own(out / CACHE_FILE, orjson.dumps(cache, option=orjson.OPT_SORT_KEYS))
    files = [changes[i] for i in range(len(tasks))]
    produced = {t.name for t in tasks}
    if out.is_dir():
        for stale in sorted(out.glob("*.json")):
            if stale.name not in produced and _is_plan_file(stale):
                if prune:
                    try:
                        stale.unlink()
                    except OSError as exc:
                        files.append(FileChange(stale.name, "failed", f"cannot remove ({exc.strerror or exc})"))
                        continue
                    files.append(FileChange(stale.name, "removed", "not in the matrix"))
                else:
                    files.append(FileChange(stale.name, "stale", "not in the matrix"))
    return RegenReport(executor.name, len(tasks), files, hysteresis, fail_on)


def _infeasibility(value: bytes | None) -> dict[str, str]:
    """An infeasibility record's binding constraint and reason, as FileChange fields ({}: a plan)."""
    try:
        doc = orjson_loads(value)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(doc, dict) or doc.get("feasible") is not False:
        return {}
    return {"binding": str(doc.get("binding") or ""), "reason": str(doc.get("reason") or "no reason recorded")}
