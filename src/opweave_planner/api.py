"""Library entry points: what the CLI and the tests call.

Each function takes plain values (names, paths, numbers), validates them at
the edge and returns plain data (dicts/dataclasses) that the CLI renders.
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

from opweave_planner.errors import UserError
from opweave_planner.inputs import request, units
from opweave_planner.inputs.hardware import Hardware, load_hardware
from opweave_planner.inputs.model import ModelSpec, load_model
from opweave_planner.inputs.request import PlanRequest
from opweave_planner.plan import Binding, Infeasible, Outcome, Status, rounded
from opweave_planner.structure.blocks import detect_blocks
from opweave_planner.structure.operators import OperatorSequence, build_sequence
from opweave_planner.structure.templates import count_templates

INSPECT_CONTEXTS = (1024, 8192, 32768, 131072)


def _layer_label(seq: OperatorSequence, layer: int) -> str:
    lay = seq.model.layers[layer]
    a = lay.attention
    att = f"sliding({a.window})" if a.kind == "sliding" else a.kind
    return f"{att}+{lay.mlp.kind}"


def _pattern(seq: OperatorSequence, layers: range) -> str:
    labels = [_layer_label(seq, i) for i in layers]
    return ", ".join(f"{k} x{len(list(g))}" for k, g in groupby(labels))


def inspect_model(model: str, blocks: bool = False, max_owners: int = 3) -> dict[str, Any]:
    """Sizes, KV/state per request and layer pattern of a model (and its blocks)."""
    spec: ModelSpec = load_model(model)
    seq = build_sequence(spec)
    bs = detect_blocks(seq)
    q, p = bs.prefix_layers, bs.block_layers
    per_token = sum(op.kv_bytes_per_token for op in seq.ops if not op.kv_window)
    windowed = sorted({op.kv_window for op in seq.ops if op.kv_window})
    fixed = sum(op.state_bytes for op in seq.ops)
    info: dict[str, Any] = {
        "model": spec.name,
        "model_type": spec.model_type,
        "layers": spec.n_layers,
        "hidden_size": spec.hidden_size,
        "total_params": seq.total_params(),
        "active_params": round(seq.active_params()),
        "weight_bytes": round(seq.weight_bytes()),
        "kv_bytes_per_request": {str(c): round(seq.kv_bytes(c)) for c in INSPECT_CONTEXTS},
        "kv_formula": {
            "bytes_per_context_token_unbounded": per_token,
            "windowed_layers": {
                str(w): sum(op.kv_bytes_per_token for op in seq.ops if op.kv_window == w) for w in windowed
            },
            "fixed_state_bytes": fixed,
        },
        "layer_pattern": {
            "prefix": _pattern(seq, range(q)) if q else "",
            "block": _pattern(seq, range(q, q + p)),
            "blocks": bs.full_blocks,
            "tail": _pattern(seq, range(q + bs.full_blocks * p, spec.n_layers)) if bs.tail_layers else "",
        },
        "operators": seq.n,
    }
    if blocks:
        info["partition"] = {
            "prefix_layers": q,
            "block_layers": p,
            "full_blocks": bs.full_blocks,
            "tail_layers": bs.tail_layers,
            "subblocks": [
                {
                    "layers": lsub,
                    "operators": bs.ops_per_subblock[lsub],
                    "templates": {str(k): count_templates(bs.ops_per_subblock[lsub], k)
                                  for k in range(1, max_owners + 1)},
                }
                for lsub in bs.subblocks
            ],
            "block_operators": [
                op.name for op in seq.ops if q <= op.layer < q + p
            ],
        }
    return info


def gpu_catalog(catalog: str | None = None, prices: str | None = None) -> Hardware:
    return load_hardware(catalog, prices)


parse_duration_ms = units.parse_duration_ms
parse_tokens = units.parse_tokens


def default_gpus(hw: Hardware, profiles_dir: str | None = None) -> tuple[str, ...]:
    """Every catalog GPU type that has shipped (or given) profiles."""
    from opweave_planner.data import profiles_root
    from opweave_planner.latency.tables import available_gpus

    have = set(available_gpus(profiles_root(profiles_dir)))
    return tuple(g for g in hw.ids() if g in have)


def resolve_request(req: PlanRequest) -> PlanRequest:
    """Check the request against its model and catalog; name GPU types by catalog id.

    An empty `gpus` becomes every profiled type, aliases become ids, and a context beyond the
    model's window is rejected, so two requests for the same search compare equal.
    """
    spec = load_model(req.model)  # fail early with a clear message
    hw = load_hardware(req.catalog, req.prices)
    if spec.max_context and req.ctx is not None and req.ctx > spec.max_context:
        raise UserError(f"--ctx: {req.ctx} tokens exceeds {spec.name}'s max_position_embeddings "
                        f"({spec.max_context})")
    req = request.with_model_window(req, spec.max_context)
    if req.gpus:
        ids = tuple(dict.fromkeys(hw.resolve(g).id for g in req.gpus))
    else:
        ids = default_gpus(hw, req.profiles)
    if not ids:
        raise UserError("--gpus: no GPU type selected; expected e.g. h100 or h100,a100")
    return req.model_copy(update={"gpus": ids})


def make_request(model=None, slo=None, ctx=None, **values) -> PlanRequest:
    """Validate user-level settings (PlanRequest field names) into a resolved PlanRequest."""
    return resolve_request(request.make_request(model=model, slo=slo, ctx=ctx, **values))


def _infeasible(ctx, jobs: int, stats) -> Infeasible:
    """The record of a request no plan meets, naming the binding constraint (ctx: the compiled
    request): a search without the SLO tells whether memory or the SLO binds."""
    from opweave_planner.plan import infeasible_version, workload_of, workload_record
    from opweave_planner.search.driver import run_search

    req = ctx.request
    relaxed = run_search(ctx, jobs=jobs, slo_ms=float("inf"), latency_objective=True)
    lowest = None
    stages = [ctx.stage_plan(t).n_stages for t in ctx.templates]
    over = sum(ctx.over_max_stages(t) for t in ctx.templates)
    if relaxed.best is None and over == len(stages) > 0:
        # every template of the policy is over --max-stages: nothing was searched, memory is not why
        binding = None
        reason = (f"--max-stages {req.max_stages}: every {req.policy.value} template of {ctx.seq.model.name} has "
                  f"at least {min(stages)} stages; raise --max-stages or choose another --policy")
    elif relaxed.best is None:
        seq = ctx.seq
        kv = seq.kv_bytes(ctx.context_tokens) / 2**30
        w = seq.weight_bytes() / 2**30
        budget = req.max_gpus
        mem = ctx.tables.per_config.cfg_mem
        usable = [(mem[i] * c.parallel.tp, c) for i, c in enumerate(ctx.tables.configs) if c.parallel.tp <= budget]
        best_bytes, best_cfg = max(usable, key=lambda x: x[0], default=(0.0, None))
        group = f"{best_cfg.gpu.id} x{best_cfg.parallel.tp}" if best_cfg else "none"
        binding = Binding.MEMORY
        reason = (f"no memory-feasible plan within {budget} GPUs: weights are {w:.1f} GiB and one "
                  f"request's KV/state at {ctx.context_tokens} tokens is {kv:.2f} GiB, while the largest device "
                  f"group allowed ({group}) has {best_bytes / 2**30:.0f} GiB usable after the per-GPU reserve "
                  f"(policy {req.policy.value})")
    else:
        binding, lowest = Binding.SLO, rounded(relaxed.best.t_rtt_us / 1e3)
        what = "TPOT" if not req.stochastic else f"p{req.percentile:g} step TPOT"
        reason = (f"the lowest achievable {what} is {lowest:.1f} ms > SLO {req.slo_ms:g} ms "
                  f"(policy {req.policy.value}, GPUs {','.join(req.gpus)})")
    if over and binding is not None:  # the templates --max-stages left out might do better: say how many were searched
        reason += f"; --max-stages {req.max_stages} left {len(stages) - over} of {len(stages)} templates"
    workload = workload_of(req, ctx.context_tokens, workload_record(req, ctx))
    return Infeasible(schema_version=infeasible_version(stats.space, workload=workload), model=ctx.seq.model.name,
                      workload=workload,
                      policy=str(req.policy.value), reason=reason,
                      binding=None if binding is None else binding.value,
                      lowest_tpot_ms=lowest)


def _simplest(outcome, slack: float):
    """Fewest stages, then cheapest, then fewest GPUs, among template bests within `slack`."""
    best = outcome.best
    near = [c for c in outcome.found if c.cost <= best.cost * (1.0 + slack)]
    return min(near, key=lambda c: (c.n_stages, c.cost, c.gpus, c.template_index))


def sized(doc, req: PlanRequest, hw: Hardware, compiled=None):
    """`doc` with its deployment for the request's target load (`deployment.sized`, which
    `simulate` calls too) and its TPOT at that load (`contract.with_load`)."""
    from opweave_planner.contract import with_load
    from opweave_planner.deployment import sized as deploy

    return with_load(deploy(doc, req, hw, compiled))


def plan(req: PlanRequest, jobs: int = 1, progress=None) -> Outcome:
    """Run the search; an Outcome: OPTIMAL with its plan, or INFEASIBLE with the record naming
    the binding constraint.

    An opweave plan lists the cheapest plan of each simpler class (`alternatives`), from the
    same search; with --prefer-simpler the plan is the simplest within that share of the
    optimum, and the optimum is listed too.

    `progress(done, total)`, if given, is called after each batch of templates and at each
    phase's end: `done` is the estimated work done so far (hundredths of a unit,
    `search.driver.template_work`), non-decreasing; `total` is always given, never below done:
    done plus the work foreseen at the seeds known so far, so it shrinks when a phase's seed
    lets the template floors skip more; the last call has done == total. The first call comes
    after the colocated template (which carries cache loading): `report.Progress`'s ETA is the
    rate since that call, shown once `search.driver.ETA_AFTER` (5 %) moved after it.
    """
    from opweave_planner.compile import compile_request
    from opweave_planner.inputs.request import Policy
    from opweave_planner.plan import build_plan, plan_version, search_stats, with_alternatives
    from opweave_planner.plan.binding import binding_of
    from opweave_planner.search.driver import run_search

    ctx = compile_request(req)
    outcome = run_search(ctx, jobs=jobs, progress=progress)
    stats = search_stats(req, ctx.hw, outcome)
    if outcome.best is None:
        return Outcome(Status.INFEASIBLE, infeasible=_infeasible(ctx, jobs, stats))

    def build(cand):
        doc, _ev = build_plan(ctx, cand.template, cand.selection, stats, scored_t_rtt_us=cand.t_rtt_us)
        return doc

    chosen = outcome.best if req.prefer_simpler is None else _simplest(outcome, req.prefer_simpler)
    doc, ev = build_plan(ctx, chosen.template, chosen.selection, stats, scored_t_rtt_us=chosen.t_rtt_us)
    doc = doc.model_copy(update={"binding": binding_of(ctx, chosen.template, chosen.selection, ev)})
    doc = sized(doc.model_copy(update={"schema_version": plan_version(doc)}), req, ctx.hw, ctx)
    if req.policy != Policy.OPWEAVE:
        return Outcome(Status.OPTIMAL, plan=doc)
    named = {name: build(c) for name, c in outcome.alternatives.items() if c is not None}
    if chosen is not outcome.best:
        named["optimum"] = build(outcome.best)
    return Outcome(Status.OPTIMAL, plan=with_alternatives(doc, named))


SHOW_MICROBATCHES = (1, 4, 16, 64, 256)


def profile_table(model: str, gpu: str, tp: int, ctx: str | int, microbatches=SHOW_MICROBATCHES,
                  moe_ep: bool = False, profiles_dir: str | None = None, backend: str = "vllm",
                  catalog: str | None = None) -> dict[str, Any]:
    """Per-operator latency (µs) across microbatch sizes with each figure's source."""
    from opweave_planner.latency.lookup import SOURCE_NAMES, Parallel, op_latencies

    spec = load_model(model)
    hw = load_hardware(catalog)
    g = hw.resolve(gpu, "--gpu")
    if tp not in (1, 2, 4, 8) or tp > g.gpus_per_node:
        raise UserError(f"--tp: {tp} not supported on {g.id}; expected 1, 2, 4 or 8 within a node")
    context = parse_tokens(ctx)
    seq = build_sequence(spec)
    lat = op_latencies(seq, g, Parallel(tp, moe_ep), context, tuple(microbatches), profiles_dir, backend)
    rows: dict[tuple, dict[str, Any]] = {}
    for i, op in enumerate(seq.ops):
        key = (op.kind, tuple(lat.lat_us[i]), tuple(lat.source[i]))
        if key not in rows:
            rows[key] = {"operator": op.name, "kind": op.kind, "count": 0,
                         "latency_us": [round(float(x), 3) for x in lat.lat_us[i]],
                         "source": [SOURCE_NAMES[s] for s in lat.source[i]]}
        rows[key]["count"] += 1
    total = lat.lat_us.sum(axis=0)
    unmeasured = sorted({r["kind"] for r in rows.values() if any(s in ("fitted", "roofline", "clamped") for s in r["source"])})
    return {"model": spec.name, "gpu": g.id, "tensor_parallel": tp, "expert_parallel": tp if moe_ep else 1,
            "context_tokens": context, "microbatches": list(microbatches), "operators": list(rows.values()),
            "decode_step_ms": [round(float(x) / 1e3, 4) for x in total], "not_measured_kinds": unmeasured}
