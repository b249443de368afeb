"""Plan files as a contract: JSON Schema, loading/validation, re-evaluation and diff.

- `plan_schema()` generates the JSON Schema of plan files from the pydantic models in
  `opweave_planner.plan`; the package ships it as `schemas/plan.schema.json` (a test keeps
  the two equal).
- `read_plan(path)` loads a plan (or infeasibility record) and rejects a malformed file or
  an unknown `schema_version` with one line naming the file and the reason.
- `evaluate_plan(plan, ...)` re-simulates a plan's placement under new prices, network or
  profiles without searching, after checking that it is consistent with the model (every
  operator exactly once, stages equal to the template's expansion).
- `diff_plans(old, new)` says what changed: placement, GPUs, batch, cost, TPOT and the deployment
  (decode only, aggregated or disaggregated, with the TTFT of the kinds that have one).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from opweave_planner.errors import UserError, printable
from opweave_planner.plan import (
    DIFF_WORDS,
    FLAG_AT,
    SCHEMA_MAJOR,
    SCHEMA_VERSION,
    Infeasible,
    Plan,
    distribution_minor,
    dumps,
    recorded_values,
    value_at,
)

SCHEMA_FILE = Path(__file__).resolve().parent / "schemas" / "plan.schema.json"
SCHEMA_TITLE = "opweave-planner plan file"


# ----------------------------------------------------------------------------- schema

def plan_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a plan file: a Plan or an Infeasible record."""
    from pydantic.json_schema import models_json_schema

    _, defs = models_json_schema([(Plan, "validation"), (Infeasible, "validation")],
                                 ref_template="#/$defs/{model}")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": SCHEMA_TITLE,
        "description": (
            f"Plan files of schema_version {SCHEMA_VERSION} (readers of major version {SCHEMA_MAJOR} "
            "accept any 1.x file whose minor version they know). Additive change (a new optional "
            "key) bumps MINOR; removing or renaming a key or changing a meaning or unit bumps MAJOR. "
            "See docs/consuming-a-plan.md."
        ),
        "x-schema-version": SCHEMA_VERSION,
        "oneOf": [{"$ref": "#/$defs/Plan"}, {"$ref": "#/$defs/Infeasible"}],
        "$defs": defs["$defs"],
    }


def schema_bytes() -> bytes:
    return dumps(plan_schema())


def shipped_schema_bytes() -> bytes:
    return SCHEMA_FILE.read_bytes()


# ----------------------------------------------------------------------------- loading

_VERSION = re.compile(r"^([0-9]+)\.([0-9]+)$")


def supported_minor() -> int:
    return int(SCHEMA_VERSION.split(".")[1])


def check_version(version: Any, where: str) -> None:
    if not isinstance(version, str) or not _VERSION.match(version):
        raise UserError(f"{where}: schema_version {version!r} is not MAJOR.MINOR; not an opweave plan file")
    major, minor = (int(x) for x in version.split("."))
    if major != SCHEMA_MAJOR or minor > supported_minor():
        raise UserError(f"{where}: unknown schema_version '{version}'; this opweave-planner reads "
                        f"{SCHEMA_MAJOR}.0 to {SCHEMA_VERSION} (a newer file needs a newer opweave-planner)")


def _first_error(exc: ValidationError) -> str:
    errs = exc.errors()
    e = errs[0]
    loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
    more = f" (and {len(errs) - 1} more problem{'s' if len(errs) > 2 else ''})" if len(errs) > 1 else ""
    return f"{loc}: {e['msg']}{more}"


def parse_plan(obj: Any, where: str) -> Plan | Infeasible:
    """Validate a decoded JSON document into a Plan or an Infeasible record."""
    if not isinstance(obj, dict):
        raise UserError(f"{where}: expected a JSON object (a plan file), got {type(obj).__name__}")
    if "schema_version" not in obj:
        raise UserError(f"{where}: no schema_version key; not an opweave plan file")
    check_version(obj["schema_version"], where)
    model = Infeasible if obj.get("feasible") is False else Plan
    try:
        doc = model.model_validate(obj)
    except ValidationError as exc:
        raise UserError(f"{where}: malformed plan: {_first_error(exc)}") from None
    dist = doc.workload.distribution
    if dist is not None and int(doc.schema_version.split(".")[1]) < distribution_minor(dist):
        raise UserError(f"{where}: workload.distribution.overflow '{dist.overflow}' needs schema_version "
                        f"{SCHEMA_MAJOR}.{distribution_minor(dist)}, the file says {doc.schema_version}")
    if isinstance(doc, Plan):
        check_internal(doc, where)
        for name, alt in (doc.alternatives or {}).items():  # simulate re-evaluates each from its own figures
            check_internal(alt.plan, f"{where}: alternatives.{name}.plan")
    check_recorded_request(doc, where)
    return doc


def check_recorded_request(doc: Plan | Infeasible, where: str) -> None:
    """The request a plan records must itself be valid (simulate and regen rebuild it)."""
    # a workload's trace may live elsewhere on this machine (simulate asks for it); the rest of
    # the request is checked at the plan's longest context
    dist = doc.workload.distribution
    fixed = {} if dist is None else {"ctx": doc.workload.context_tokens}
    try:
        recorded_request(doc, **fixed)
    except UserError as exc:
        text = str(exc)
        flag, sep, rest = text.partition(": ")
        loc = FLAG_AT.get(flag)  # the key that records the flag
        raise UserError(f"{where}: inconsistent plan: {loc}: {rest}" if sep and loc
                        else f"{where}: inconsistent plan: {text}") from None


MAX_PLAN_BYTES = 64 << 20  # the largest emitted plan (every alternative embedded) is well under 1 MiB


def read_plan(path: str | Path) -> Plan | Infeasible:
    from opweave_planner.atomic import read_input

    try:
        data = read_input(path, limit=MAX_PLAN_BYTES)
    except UserError as exc:
        raise UserError(f"plan file {exc}") from None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise UserError(f"{path}: malformed plan: not valid JSON ({exc})") from None
    return parse_plan(obj, str(path))


def read_feasible_plan(path: str | Path) -> Plan:
    doc = read_plan(path)
    if isinstance(doc, Infeasible):
        raise UserError(f"{path}: is an infeasibility record ({doc.reason}); there is no plan to simulate")
    return doc


def check_internal(plan: Plan, where: str) -> None:
    """Cross-field consistency that needs no model: indices, positions and batch arithmetic."""
    def bad(msg: str) -> UserError:
        return UserError(f"{where}: inconsistent plan: {msg}")

    k = len(plan.owners)
    if plan.template.owners != k:
        raise bad(f"template.owners is {plan.template.owners} but there are {k} owners")
    if plan.num_stages != len(plan.stages):
        raise bad(f"num_stages is {plan.num_stages} but there are {len(plan.stages)} stages")
    for j, st in enumerate(plan.stages):
        if st.index != j:
            raise bad(f"stages[{j}].index is {st.index}")
        if st.owner >= k:
            raise bad(f"stages[{j}].owner {st.owner} does not exist ({k} owners)")
    gpus = 0
    for o, own in enumerate(plan.owners):
        if own.index != o:
            raise bad(f"owners[{o}].index is {own.index}")
        mine = [j for j, st in enumerate(plan.stages) if st.owner == o]
        if own.stage_positions != mine:
            raise bad(f"owners[{o}].stage_positions {own.stage_positions} but its stages are {mine}")
        if own.resident_batch != plan.microbatches * own.microbatch:
            raise bad(f"owners[{o}].resident_batch {own.resident_batch} != microbatches x microbatch")
        if own.resident_batch * own.replicas != plan.global_batch:
            raise bad(f"owners[{o}] serves {own.resident_batch} x {own.replicas} requests, "
                      f"global_batch is {plan.global_batch}")
        gpus += own.replicas * own.tensor_parallel
    if gpus != plan.gpus_total:
        raise bad(f"gpus_total is {plan.gpus_total} but the owners hold {gpus} GPUs")
    if len(plan.action_order) != k:
        raise bad(f"action_order has {len(plan.action_order)} lists for {k} owners")
    _check_figures(plan, bad)
    _check_space(plan, bad)
    n_stages, mu = len(plan.stages), plan.microbatches
    for o, entries in enumerate(plan.action_order):
        for e in entries:  # the pattern is checked by the model: '<kind> <stage> <microbatch>'
            kind, j, mb = e.split()
            j, mb = int(j), int(mb)
            if j >= n_stages or mb >= mu:
                raise bad(f"action_order[{o}] entry '{e}': stage {j} or microbatch {mb} does not exist "
                          f"({n_stages} stages, {mu} microbatches)")
            here, after = plan.stages[j].owner, plan.stages[(j + 1) % n_stages].owner
            mine = {"compute": here == o, "send": here == o != after, "recv": after == o != here}[kind]
            if not mine:
                raise bad(f"action_order[{o}] entry '{e}' is not an action of owner {o}")


def _check_figures(plan: Plan, bad) -> None:
    """Prices, network and per-stage hand-offs: the numbers simulate re-evaluates with."""
    from opweave_planner.inputs.hardware import Network, bounds_text, first_error, within

    net = plan.provenance.network
    unknown = sorted(set(net) - set(Network.model_fields))
    if unknown:
        raise bad(f"provenance.network has unknown key '{unknown[0]}'; expected "
                  f"{', '.join(Network.model_fields)}")
    if "inter_node_gbps" in net and not net["inter_node_gbps"] > 0:
        raise bad(f"provenance.network.inter_node_gbps is {net['inter_node_gbps']:g}; a bandwidth must be > 0")
    try:  # the physical ranges a catalog's network must keep (simulate rebuilds it from these)
        Network(**net)
    except ValidationError as exc:
        raise bad(f"provenance.network.{first_error(exc)}") from None
    prices = plan.provenance.prices_usd_per_gpu_hour
    for gid, usd in prices.items():  # the range a catalog's price must keep
        if not within("price", usd):
            raise bad(f"provenance.prices_usd_per_gpu_hour.{gid} is {usd:g}; expected {bounds_text('price')}")
    for o in plan.owners:
        if o.gpu not in prices:
            raise bad(f"owners[{o.index}].gpu '{o.gpu}' has no price in provenance.prices_usd_per_gpu_hour")
        want = prices[o.gpu] * o.tensor_parallel
        if abs(o.usd_per_hour_per_replica - want) > 1e-6 * max(1.0, want):
            raise bad(f"owners[{o.index}].usd_per_hour_per_replica {o.usd_per_hour_per_replica:g} is not "
                      f"tensor_parallel x the recorded price of {o.gpu} ({want:g})")
        if o.expert_parallel not in (1, o.tensor_parallel):
            raise bad(f"owners[{o.index}].expert_parallel {o.expert_parallel} is neither 1 nor "
                      f"tensor_parallel {o.tensor_parallel}")
    s = len(plan.stages)
    for j, st in enumerate(plan.stages):
        local = plan.stages[(j + 1) % s].owner == st.owner
        if local and (st.transfer_ms or st.payload_bytes_per_request):
            raise bad(f"stages[{j}] hands off to its own owner but records a transfer")
    allowed = ("none",) if len(plan.owners) == 1 else ("intra_node", "inter_node")
    if plan.metrics.stage_link not in allowed:
        raise bad(f"metrics.stage_link '{plan.metrics.stage_link}' is not "
                  f"{'none (one owner)' if len(plan.owners) == 1 else 'intra_node or inter_node'}")


def _check_space(plan: Plan, bad) -> None:
    """Shape of the template record (the searched space itself is checked by rebuilding the
    recorded request; a hand-edited plan may leave that space, e.g. more replicas)."""
    if len(plan.template.cut_operators) != len(plan.template.cut_positions):
        raise bad("template.cut_operators and template.cut_positions differ in length")


def check_against_model(plan: Plan, seq, where: str):
    """Every operator of the model exactly once, and stages equal to the template's expansion.

    Returns the Template to re-simulate.
    """
    from opweave_planner.structure.blocks import detect_blocks
    from opweave_planner.structure.templates import Template, expand

    def bad(msg: str) -> UserError:
        return UserError(f"{where}: inconsistent with model {seq.model.name}: {msg}")

    names = [op.name for op in seq.ops]
    known = set(names)
    seen: dict[str, list[int]] = {}
    for st in plan.stages:
        for name in st.operators:
            seen.setdefault(name, []).append(st.index)
    unknown = [n for n in seen if n not in known]
    if unknown:
        raise bad(f"operator '{unknown[0]}' is not in the model" + _more(unknown))
    counts = Counter({n: len(v) for n, v in seen.items()})
    repeated = [n for n in names if counts[n] > 1]
    if repeated:
        n = repeated[0]
        raise bad(f"operator '{n}' repeated (stages {', '.join(map(str, seen[n]))})" + _more(repeated))
    missing = [n for n in names if n not in seen]
    if missing:
        raise bad(f"operator '{missing[0]}' missing" + _more(missing))
    blocks = detect_blocks(seq)
    lsub, cuts = plan.template.subblock_layers, tuple(plan.template.cut_positions)
    if lsub not in blocks.subblocks:
        raise bad(f"template.subblock_layers {lsub} is not a sub-block length of the model "
                  f"({', '.join(map(str, blocks.subblocks))})")
    n_ops = blocks.ops_per_subblock[lsub]
    if list(cuts) != sorted(set(cuts)) or any(not 0 <= c < n_ops for c in cuts) or not cuts:
        raise bad(f"template.cut_positions {list(cuts)} are not sorted distinct positions in [0, {n_ops})")
    tmpl = Template(lsub=lsub, cuts=cuts)
    splan = expand(seq, tmpl)
    if splan.n_stages != len(plan.stages) or max(splan.owner) + 1 != len(plan.owners):
        raise bad(f"the template expands to {splan.n_stages} stages over {max(splan.owner) + 1} owners, "
                  f"the plan lists {len(plan.stages)} over {len(plan.owners)}")
    for j, st in enumerate(plan.stages):
        expect = [names[i] for i in splan.ops[j]]
        if st.operators != expect or st.owner != splan.owner[j]:
            raise bad(f"stage {j} differs from the template's expansion (expected owner {splan.owner[j]}, "
                      f"operators {expect[0]}..{expect[-1]})")
    return tmpl


def _more(items: list) -> str:
    return f" (and {len(items) - 1} more)" if len(items) > 1 else ""


# ----------------------------------------------------------------------------- evaluation

@dataclass
class Reevaluation:
    """What `simulate` returns: a plan re-simulated under new inputs, beside its previous version
    (named apart from the search's per-selection Evaluation)."""

    plan: Plan  # the plan re-simulated under the new inputs (same placement)
    previous: Plan
    meets_slo: bool
    fits_memory: bool
    memory: list[tuple[float, float]]  # per owner: (bytes needed, usable bytes) per GPU
    inputs_changed: list[str]

    def to_dict(self) -> dict[str, Any]:
        p, old = self.plan, self.previous
        return {
            "model": p.model,
            "policy": p.policy,
            "workload": p.workload.model_dump(),
            "usd_per_million_tokens": p.usd_per_million_tokens,
            "tpot_ms": p.tpot_ms,
            "tpot": None if p.tpot is None else p.tpot.model_dump(),
            "meets_slo": self.meets_slo,
            "fits_memory": self.fits_memory,
            "gpus_total": p.gpus_total,
            "previous": {"usd_per_million_tokens": old.usd_per_million_tokens, "tpot_ms": old.tpot_ms,
                         "tpot": None if old.tpot is None else old.tpot.model_dump(),
                         "deployment": None if old.deployment is None else old.deployment.model_dump()},
            "owners": [
                {"index": o.index, "gpu": o.gpu, "tensor_parallel": o.tensor_parallel, "replicas": o.replicas,
                 "usd_per_hour_per_replica": o.usd_per_hour_per_replica, "busy_fraction": o.busy_fraction,
                 "memory_bytes_per_gpu": o.memory_bytes_per_gpu,
                 "usable_memory_bytes_per_gpu": float(f"{usable:.9g}"), "fits_memory": need <= usable,
                 **({} if o.kv_events is None else {"kv_events": o.kv_events.model_dump()})}
                for o, (need, usable) in zip(p.owners, self.memory, strict=True)
            ],
            "metrics": p.metrics.model_dump(),
            "inputs_changed": self.inputs_changed,
            "deployment": None if p.deployment is None else p.deployment.model_dump(),
        }


_PROVENANCE_INPUTS = (("model_sha256", "model"), ("catalog_sha256", "catalog"), ("prices_sha256", "prices"),
                      ("profiles_sha256", "profiles"), ("network_sha256", "network"),
                      ("backend", "backend"), ("tool_version", "tool_version"))


def _hardware(plan: Plan, req):
    """Catalog in effect: the plan's recorded prices (unless --prices names a GPU), the
    request's network (the plan's own unless overridden)."""
    from opweave_planner.inputs.hardware import (
        Network,
        load_hardware,
        parse_prices,
        read_table_file,
    )

    hw = load_hardware(req.catalog, req.prices)
    named: set[str] = set()
    if req.prices:
        aliases = {a: g.id for g in hw.gpus for a in (g.id, *g.aliases)}
        named = set(parse_prices(read_table_file(req.prices, "--prices"), hw.ids(), aliases, req.prices))
    ids = set(hw.ids())
    recorded = plan.provenance.prices_usd_per_gpu_hour
    gpus = []
    for g in hw.gpus:
        if g.id in recorded and g.id not in named:
            g = g.model_copy(update={"price_per_hour": recorded[g.id]})
        gpus.append(g)
    for gid in {o.gpu for o in plan.owners} | set(plan.search.space.gpus):
        if gid not in ids:
            raise UserError(f"plan uses GPU type '{gid}', which the catalog in effect lacks; pass --catalog")
    hw = hw.model_copy(update={"gpus": tuple(gpus)})
    net = {k: v for k, v in plan.provenance.network.items() if k in Network.model_fields}
    hw = hw.model_copy(update={"network": Network(**net)})
    return hw.with_network(inter_node_gbps=req.network_bandwidth, inter_node_latency_us=req.network_latency)


def recorded_request(plan: Plan | Infeasible, **overrides: Any):
    """The PlanRequest a plan file records (model, workload, policy, searched space, backend,
    network), with `overrides` (PlanRequest field names; None = keep the plan's)."""
    from opweave_planner.inputs.request import (
        CTX_ONLY,
        DEPLOYMENT_ONLY,
        WORKLOAD_ONLY,
        make_request,
    )

    values = recorded_values(plan)
    dist = plan.workload.distribution
    given = {k: v for k, v in overrides.items() if v is not None}
    if "ctx" in given or "workload" in given:  # another context: its own prompt and output lengths
        for key in CTX_ONLY:
            values.pop(key, None)
    if "ctx" in given:  # re-evaluate at one fixed context: drop the recorded workload settings
        lengths = "prompt_len" in given or "output_len" in given  # the prefill pool needs a prompt length
        for key in ("workload", *WORKLOAD_ONLY, *(() if lengths else DEPLOYMENT_ONLY)):
            values.pop(key, None)
    elif "workload" in given:  # another workload: its own shaping, the plan's percentile settings
        from opweave_planner.workload.reader import trace_sha256

        values.pop("ctx", None)
        # the same trace at another path (a plan moved to another machine) keeps its shaping
        if dist is None or dist.sha256 is None or trace_sha256(given["workload"]) != dist.sha256:
            for key in ("scale_ctx", "max_model_len", "overflow"):
                values.pop(key, None)
    for key in _replaced_rate_source(given):  # one rate source: a new one replaces the recorded one
        values.pop(key, None)
    values.update(given)
    return make_request(**values)


def _replaced_rate_source(given: dict[str, Any]) -> tuple[str, ...]:
    """The recorded arrival settings a new rate source overrides (--request-rate,
    --target-tokens-per-s or --arrivals trace: exactly one is in effect)."""
    if "request_rate" in given or "target_tokens_per_s" in given or given.get("arrivals") == "poisson":
        return ("request_rate", "target_tokens_per_s", "arrivals", "rate_scale")
    if given.get("arrivals") == "trace":
        return ("request_rate", "target_tokens_per_s")
    return ()



def plan_selection(plan: Plan, arrays, where: str, model_name: str):
    """The Selection a plan file describes, in the configuration arrays built for its owners."""
    from opweave_planner.search.state import selection

    cfg, mb = [], []
    for o in plan.owners:
        ep = o.expert_parallel > 1
        match = [c for c, conf in enumerate(arrays.configs)
                 if conf.gpu.id == o.gpu and conf.parallel.tp == o.tensor_parallel and conf.parallel.moe_ep == ep]
        if not match:
            raise UserError(f"{where}: owner {o.index} ({o.gpu} TP{o.tensor_parallel}, EP{o.expert_parallel}) "
                            f"is not a configuration {model_name} can run")
        if o.microbatch not in arrays.mb_grid:
            raise UserError(f"{where}: owners[{o.index}].microbatch {o.microbatch} is not global_batch / "
                            f"(microbatches x replicas)")
        cfg.append(match[0])
        mb.append(arrays.mb_grid.index(o.microbatch))
    return selection(plan.global_batch, plan.microbatches, cfg, [o.replicas for o in plan.owners], mb)


def plan_context(plan: Plan, *, where: str = "plan", searched: bool = False, **overrides: Any):
    """(Compiled, template, Selection) of `plan`'s placement under its recorded request and
    `overrides`: the request compiled for exactly its owners, for `simulate` and replays, or
    (`searched`) for the whole space the plan was searched over, which judging what binds needs
    (the next batch, more replicas)."""
    from opweave_planner.compile import compile_request
    from opweave_planner.inputs.model import load_model
    from opweave_planner.inputs.request import with_model_window
    from opweave_planner.structure.operators import build_sequence

    dist = plan.workload.distribution
    if (dist is not None and overrides.get("workload") is None and overrides.get("ctx") is None
            and ":" not in dist.workload and not Path(dist.workload).is_file()):
        raise UserError(f"{where}: the plan's workload {dist.workload} is not on this machine; pass "
                        f"--workload FILE (its sha256 was {dist.sha256}) or --ctx")
    req = recorded_request(plan, **overrides)
    try:
        spec = load_model(req.model)
    except UserError as exc:
        if overrides.get("model") is not None:
            raise
        raise UserError(f"{where}: the plan's model '{plan.model}' cannot be loaded ({exc}); "
                        f"pass --model") from None
    req = with_model_window(req, spec.max_context)
    seq = build_sequence(spec)
    tmpl = check_against_model(plan, seq, where)
    hw = _hardware(plan, req)
    own = req.model_copy(update={
        "gpus": tuple(dict.fromkeys(o.gpu for o in plan.owners)),
        "tensor_parallel_sizes": tuple(sorted({o.tensor_parallel for o in plan.owners})),
        "batches": (plan.global_batch,), "max_microbatches": plan.microbatches,
        "max_replicas": max(o.replicas for o in plan.owners),
        "moe_expert_parallel": any(o.expert_parallel > 1 for o in plan.owners)})
    # the searched space under new inputs has caps of its own (compile/space.py): the plan's batch
    # is kept in it, so its placement is still expressible there
    wide = req.model_copy(update={"batches": tuple(sorted({*req.batches, plan.global_batch}))})
    compiled = compile_request(wide if searched else own, hw, spec)
    sel = plan_selection(plan, compiled.tables, where, seq.model.name)
    return compiled, tmpl, sel


def evaluate_plan(plan: Plan, *, where: str = "plan", deploy: bool = True, **overrides: Any) -> Reevaluation:
    """Re-simulate `plan`'s placement (no search) under new prices / network / profiles / traffic.

    `overrides` are PlanRequest settings (prices, catalog, profiles, network_bandwidth,
    network_latency, model, ctx, workload and its settings). Defaults are the plan's own
    recorded prices, network and workload, the shipped catalog and profiles, so an unchanged
    plan under unchanged inputs reproduces its figures exactly.
    """
    from opweave_planner.plan import build_plan, plan_version
    from opweave_planner.plan.binding import binding_of

    overrides = {**overrides, **_recorded_sizing(plan, overrides)}  # only what overrides leave unset
    ctx, tmpl, sel = plan_context(plan, where=where, **overrides)
    new, ev = build_plan(ctx, tmpl, sel, plan.search)
    if plan.binding is not None:  # what binds it, judged again under the new inputs, in its searched space
        sctx, stmpl, ssel = plan_context(plan, where=where, searched=True, **overrides)
        new = new.model_copy(update={"binding": binding_of(sctx, stmpl, ssel, ev)})
        new = new.model_copy(update={"schema_version": plan_version(new)})
    if deploy:  # an alternative is listed unsized, as the search lists it
        from opweave_planner.deployment import with_load_tpot

        new = with_load_tpot(_deployed(plan, new, ctx, overrides), ctx, tmpl, sel)
    if plan.alternatives:  # each alternative re-simulated under the same inputs, listed against the plan
        from opweave_planner.inputs.request import DEPLOYMENT_ONLY
        from opweave_planner.plan import with_alternatives

        unsized = {k: v for k, v in overrides.items()
                   if k not in (*DEPLOYMENT_ONLY, "target_tokens_per_s", "target_concurrency")}
        named = {name: evaluate_plan(alt.plan, where=f"{where} alternatives.{name}", deploy=False,
                                     **unsized).plan
                 for name, alt in plan.alternatives.items()}
        new = with_alternatives(new, named)
    memory = [(float(n), float(u)) for n, u in zip(ev.memory_need, ev.memory_usable, strict=True)]
    changed = [label for key, label in _PROVENANCE_INPUTS
               if getattr(plan.provenance, key) != getattr(new.provenance, key)]
    if plan.workload.model_dump(exclude={"tpot_slo_ms"}) != new.workload.model_dump(exclude={"tpot_slo_ms"}):
        changed.append("workload")  # another trace, another shaping, or a fixed context instead
    return Reevaluation(
        plan=new, previous=plan,
        meets_slo=new.tpot_ms <= plan.workload.tpot_slo_ms * (1 + 1e-12),
        fits_memory=ev.fits_memory,
        memory=memory, inputs_changed=changed,
    )


def _recorded_sizing(plan: Plan, overrides: dict[str, Any]) -> dict[str, Any]:
    """The target load a plan's deployment was sized for that its recorded request does not carry
    (--target-concurrency; --target-tokens-per-s of a decode-only sizing), unless `overrides`
    name a load of their own."""
    dep = plan.deployment
    if dep is None:
        return {}
    out: dict[str, Any] = {}
    if dep.target_concurrency is not None and overrides.get("target_concurrency") is None:
        out["target_concurrency"] = dep.target_concurrency
    rate_given = any(overrides.get(k) is not None for k in ("request_rate", "target_tokens_per_s", "arrivals"))
    if dep.mode is None and dep.target_tokens_per_s is not None and not rate_given:
        out["target_tokens_per_s"] = dep.target_tokens_per_s  # a disaggregated one records it in arrivals
    return out


def _deployed(plan: Plan, new: Plan, ctx, overrides: dict[str, Any]) -> Plan:
    """`new` (re-simulated) with its deployment re-sized under the new inputs: decode copies for
    the target load and, for a disaggregated plan, the prefill pool chosen again over the same
    enumeration (the searched GPU types and TP degrees) with TTFT replayed under the new prices,
    rates, arrivals or trace. `ctx` is compiled for the plan's own owners; the pool's enumeration
    is the request's searched space."""
    from opweave_planner.deployment import sized
    from opweave_planner.inputs.request import with_model_window

    full = with_model_window(recorded_request(plan, **overrides), ctx.seq.model.max_context)
    return sized(new, full, ctx.hw, ctx)


def with_load(plan: Plan) -> Plan:
    """`plan` with its deployment's TPOT at load (`deployment.with_load_tpot`), the placement
    compiled for its owners under its recorded request (the plan writer's path; `simulate` has
    its own compile)."""
    from opweave_planner.deployment import has_load_figure, with_load_tpot

    if not has_load_figure(plan):
        return plan  # no compile for a plan without the figure
    return with_load_tpot(plan, *plan_context(plan, where="load TPOT"))


# ----------------------------------------------------------------------------- diff

def _gpus_words(p: Plan) -> str:
    parts = [f"{o.replicas}x {o.gpu} TP{o.tensor_parallel}" + (f" EP{o.expert_parallel}" if o.expert_parallel > 1 else "")
             for o in p.owners]
    return f"{' + '.join(parts)} ({p.gpus_total} GPUs)"


def _placement(p: Plan) -> dict[str, Any]:
    return {"template": {"subblock_layers": p.template.subblock_layers, "cut_positions": p.template.cut_positions},
            "num_stages": p.num_stages,
            "stages": [[s.owner, s.operators[0], s.operators[-1], len(s.operators)] for s in p.stages]}


def _placement_words(p: Plan) -> str:
    cuts = ", ".join(p.template.cut_operators)
    return f"{p.num_stages} stage{'s' if p.num_stages != 1 else ''} over {len(p.owners)} owner" \
           f"{'s' if len(p.owners) != 1 else ''} (sub-block {p.template.subblock_layers} layer(s), cuts {cuts})"


def _gpus(p: Plan) -> list:
    return [[o.gpu, o.tensor_parallel, o.expert_parallel, o.replicas] for o in p.owners]


def _batch(p: Plan) -> dict[str, Any]:
    return {"global_batch": p.global_batch, "microbatches": p.microbatches,
            "microbatch": [o.microbatch for o in p.owners]}


def _batch_words(p: Plan) -> str:
    return f"B={p.global_batch}, {p.microbatches} microbatch(es), per-owner microbatch " \
           f"{'/'.join(str(o.microbatch) for o in p.owners)}"


def pct(old: float, new: float) -> str:
    """' (+6.25%)': new against old (empty when old is 0)."""
    return f" ({(new / old - 1) * 100:+.2f}%)" if old else ""


def _request(p: Plan | Infeasible) -> dict[str, Any]:
    """What a plan answers, with the window it admits beside the context it planned for. A trace
    is identified by its sha256, not the path it was read at (the same file in two checkouts is
    the same workload)."""
    w = p.workload.model_dump()
    if (w.get("distribution") or {}).get("sha256"):
        w["distribution"] = {k: v for k, v in w["distribution"].items() if k != "workload"}
    return {"model": p.model, "policy": p.policy, "workload": w, "window": p.workload.window}


def _request_words(ro: dict[str, Any], rn: dict[str, Any]) -> str:
    """'request: SLO ms 60 -> 30, seed 0 -> 1': the request settings that differ, old -> new
    (a setting one side does not have reads 'none'; derived workload figures are left out)."""
    def show(x: Any) -> str:
        return "none" if x is None else f"{x:g}" if isinstance(x, float) else str(x)

    # a workload plan's context key is derived (its longest request), not a setting: the planned
    # context is --ctx or none, and the window each admits is named on its own
    def planned(r: dict[str, Any], key: str) -> Any:
        derived = key == "workload.context_tokens" and value_at(r, "workload.distribution")
        return None if derived else value_at(r, key)

    parts = [f"{word} {show(planned(ro, key))} -> {show(planned(rn, key))}"
             for key, word in DIFF_WORDS if planned(ro, key) != planned(rn, key)]
    if ro["window"] != rn["window"]:
        parts.append(f"window {ro['window']} -> {rn['window']}")
    return "request: " + (", ".join(parts) if parts else "the workload's derived figures differ")


def deployment_record(p: Plan) -> dict[str, Any]:
    """What a plan deploys, in the figures its kind has: decode only (the sized copies, if any; no
    TTFT), aggregated (its replicas, their TTFT and TPOT) or disaggregated (both pools, the all-in
    cost, the prefill pool's TTFT; the TPOT is the plan's own)."""
    dep = p.deployment
    mode = None if dep is None else dep.mode
    rec: dict[str, Any] = {"mode": mode or "decode only", "pools": {}, "gpus": None, "usd_per_hour": None,
                           "usd_per_million_output_tokens": None, "ttft_percentile": None, "ttft_ms": None,
                           "tpot_percentile": None, "tpot_ms": None}
    if dep is None:
        return rec
    decode = {"copies": dep.copies, "gpus": dep.gpus_total}
    if mode is None:
        return {**rec, "pools": {"decode": decode}, "gpus": dep.gpus_total, "usd_per_hour": dep.usd_per_hour}
    if mode == "aggregated":
        a = dep.aggregated
        assert a is not None  # Deployment's validator: mode aggregated needs it
        pct = a.ttft_percentile if dep.prefill is None else dep.prefill.ttft_percentile
        group = {"replicas": a.replicas, "gpu": a.gpu, "tensor_parallel": a.tensor_parallel, "gpus": a.gpus,
                 "batch": a.batch, "chunk_tokens": a.chunk_tokens}
        return {**rec, "pools": {"replicas": group},
                "gpus": a.gpus, "usd_per_hour": a.usd_per_hour,
                "usd_per_million_output_tokens": a.usd_per_million_output_tokens, "ttft_percentile": pct,
                "ttft_ms": a.ttft_ms, "tpot_percentile": a.tpot_percentile, "tpot_ms": a.tpot_ms}
    f = dep.prefill
    assert f is not None  # Deployment's validator: a disaggregated deployment has its pool
    return {**rec, "pools": {"decode": decode, "prefill": {"instances": f.instances, "gpu": f.gpu,
                                                           "tensor_parallel": f.tensor_parallel, "gpus": f.gpus}},
            "gpus": dep.gpus_total + f.gpus, "usd_per_hour": dep.usd_per_hour_all_in,
            "usd_per_million_output_tokens": dep.usd_per_million_output_tokens_all_in,
            "ttft_percentile": f.ttft_percentile, "ttft_ms": f.ttft_ms,
            "tpot_percentile": p.tpot.percentile if p.tpot is not None else None, "tpot_ms": p.tpot_ms}


def deployment_words(rec: dict[str, Any]) -> str:
    """'aggregated: 6x h100 TP1 (B=32, chunk 512) = 6 GPUs, 20.94 USD/h, ...': a deployment_record."""
    pools = rec["pools"]

    def group(g: dict[str, Any], n: str) -> str:
        return f"{g[n]}x {g['gpu']} TP{g['tensor_parallel']}"

    if rec["mode"] == "decode only" and not pools:
        return "decode only (no deployment sized)"
    if rec["mode"] == "aggregated":
        r = pools["replicas"]
        shape = f"{group(r, 'replicas')} (B={r['batch']}, chunk {r['chunk_tokens']}) = {r['gpus']} GPUs"
    elif rec["mode"] == "disaggregated":
        d, f = pools["decode"], pools["prefill"]
        shape = (f"decode {d['copies']} copies of the plan = {d['gpus']} GPUs + prefill {group(f, 'instances')} = "
                 f"{f['gpus']} GPUs")
    else:
        d = pools["decode"]
        shape = f"{d['copies']} copies of the plan = {d['gpus']} GPUs"
    parts = [shape, f"{rec['usd_per_hour']:.6g} USD/h"]
    if rec["usd_per_million_output_tokens"] is not None:
        parts.append(f"{rec['usd_per_million_output_tokens']:.6g} USD per million output tokens all-in")
    if rec["ttft_ms"] is not None:
        parts.append(f"p{rec['ttft_percentile']:g} TTFT {rec['ttft_ms']:.6g} ms")
    if rec["mode"] == "aggregated":
        parts.append(f"p{rec['tpot_percentile']:g} TPOT {rec['tpot_ms']:.6g} ms")
    return f"{rec['mode']}: " + ", ".join(parts)


def ttft_words(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """'p95 TTFT: 671.9 -> 390.5 ms (-41.88%)' between two deployment records (None: one side has
    no TTFT, a decode-only plan)."""
    a, b = old["ttft_ms"], new["ttft_ms"]
    if a is None or b is None:
        return None
    pa, pb = old["ttft_percentile"], new["ttft_percentile"]
    if pa == pb:
        return f"p{pb:g} TTFT: {a:.6g} -> {b:.6g} ms{pct(a, b)}"
    return f"TTFT: p{pa:g} {a:.6g} ms -> p{pb:g} {b:.6g} ms{pct(a, b)}"


def _scope(old: Plan, new: Plan) -> str:
    """What the plans' own cost and TPOT cover ('decode only', 'decode pool'), old -> new if it differs."""
    from opweave_planner.report import _cost_scope

    a, b = _cost_scope(old), _cost_scope(new)
    return a if a == b else f"{a} -> {b}"


def diff_plans(old: Plan | Infeasible, new: Plan | Infeasible) -> dict[str, Any]:
    """What changed between two plan files; `equivalent` is False when the plan changed."""
    changes: list[dict[str, Any]] = []

    def add(aspect: str, o: Any, n: Any, words: str) -> None:
        changes.append({"aspect": aspect, "old": o, "new": n, "summary": words})

    if _request(old) != _request(new):
        ro, rn = _request(old), _request(new)
        add("request", ro, rn, _request_words(ro, rn))
    notes: list[str] = []
    fo, fn = isinstance(old, Plan), isinstance(new, Plan)
    if not (fo and fn):
        if fo != fn or old.reason != new.reason:  # type: ignore[union-attr]
            def state(d):
                return "feasible" if isinstance(d, Plan) else f"infeasible ({d.reason})"
            add("feasibility", fo, fn, f"feasibility: {state(old)} -> {state(new)}")
        return {"equivalent": not changes, "changes": changes, "inputs_changed": [], "notes": notes}
    assert isinstance(old, Plan) and isinstance(new, Plan)
    if _placement(old) != _placement(new):
        add("placement", _placement(old), _placement(new),
            f"placement: {_placement_words(old)} -> {_placement_words(new)}")
    if _gpus(old) != _gpus(new):
        add("gpus", _gpus(old), _gpus(new), f"GPUs: {_gpus_words(old)} -> {_gpus_words(new)}")
    if _batch(old) != _batch(new):
        add("batch", _batch(old), _batch(new), f"batch: {_batch_words(old)} -> {_batch_words(new)}")
    if old.usd_per_million_tokens != new.usd_per_million_tokens:
        a, b = old.usd_per_million_tokens, new.usd_per_million_tokens
        add("usd_per_million_tokens", a, b,
            f"cost: {a:.6g} -> {b:.6g} USD per million tokens, {_scope(old, new)}{pct(a, b)}")
    if old.tpot_ms != new.tpot_ms:
        a, b = old.tpot_ms, new.tpot_ms
        add("tpot_ms", a, b, f"TPOT: {a:.6g} -> {b:.6g} ms{pct(a, b)}")
    do, dn = deployment_record(old), deployment_record(new)
    if do != dn:
        add("deployment", do, dn, f"deployment: {deployment_words(do)} -> {deployment_words(dn)}")
        ttft = ttft_words(do, dn)
        if ttft is not None and do["ttft_ms"] != dn["ttft_ms"]:
            add("ttft_ms", do["ttft_ms"], dn["ttft_ms"], ttft)
    inputs = [label for key, label in _PROVENANCE_INPUTS
              if getattr(old.provenance, key) != getattr(new.provenance, key)]
    po, pn = old.provenance.prices_usd_per_gpu_hour, new.provenance.prices_usd_per_gpu_hour
    for gid in sorted(set(po) | set(pn)):
        if po.get(gid) != pn.get(gid):
            a, b = (f"{x:.10g}" if x is not None else "not recorded" for x in (po.get(gid), pn.get(gid)))
            notes.append(f"price of {gid}: {a} -> {b} USD per GPU-hour")
    if old.metrics != new.metrics and not changes:
        notes.append("metrics differ")
    if old.search != new.search:
        notes.append("search statistics or searched space differ")
    do, dn = old.workload.distribution, new.workload.distribution
    if (do is not None and dn is not None and do.sha256 and do.sha256 == dn.sha256
            and do.workload != dn.workload):
        notes.append(f"trace recorded as {printable(do.workload)} -> {printable(dn.workload)} (same sha256)")
    return {"equivalent": not changes, "changes": changes, "inputs_changed": inputs, "notes": notes}
