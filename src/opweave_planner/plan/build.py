"""A plan from a search result: every figure from the one evaluator the search scored with.

`build_plan` describes a Selection (owners, stages, metrics, provenance); the helpers record
the request's workload and searched space, and list the simpler alternatives against a plan.
"""

from __future__ import annotations

import hashlib
import os
from enum import IntEnum
from pathlib import Path

from opweave_planner import __version__
from opweave_planner.data import profiles_root
from opweave_planner.latency.tables import DECODE_KINDS
from opweave_planner.plan.io import dumps, plan_version, rounded, schema_version_for
from opweave_planner.plan.request import space_values
from opweave_planner.plan.schema import (
    Alternative,
    Distribution,
    KvEventsOut,
    Metrics,
    OwnerOut,
    Plan,
    Provenance,
    SearchStats,
    SpaceOut,
    StageOut,
    TemplateOut,
    TpotStats,
    Workload,
)

__all__ = ["build_plan", "workload_of", "recorded_path", "workload_record", "space_record", "search_stats", "provenance", "profiles_hash",
           "with_alternatives", "tpot_stats", "CriticalResource"]


def _sha(obj) -> str:
    return hashlib.sha256(dumps(obj)).hexdigest()


def profiles_hash(profiles_dir: str | None, gpus: list[str], backend: str) -> str:
    root = profiles_root(profiles_dir)
    h = hashlib.sha256()
    for gid in sorted(set(gpus)):
        folder = root / gid
        # the decode tables only: adding the prefill side's files changes no decode plan
        tables = sorted(p for p in (folder / backend).glob("*.json") if p.stem in DECODE_KINDS)
        for p in sorted(folder.glob("*.json")) + tables:
            h.update(p.relative_to(root).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def provenance(hw, seq, gpus, profiles_dir: str | None, backend: str) -> Provenance:
    """Provenance scoped to the searched GPU types (a price edit of another type changes nothing)."""
    ids = sorted(set(gpus))
    types = {g.id: g for g in hw.gpus}
    specs = {gid: types[gid].model_dump(exclude={"price_per_hour", "price_estimated"}) for gid in ids}
    prices = {gid: types[gid].price_per_hour for gid in ids}
    net = hw.network.model_dump()
    return Provenance(
        tool_version=__version__, model_sha256=seq.model.source_sha256, catalog_sha256=_sha(specs),
        prices_sha256=_sha(prices), prices_usd_per_gpu_hour=prices,
        profiles_sha256=profiles_hash(profiles_dir, ids, backend),
        network={k: float(v) for k, v in net.items()}, network_sha256=_sha(net), backend=backend,
    )


def space_record(req, hw) -> SpaceOut:
    """The searched space, with the reserve each GPU type was searched with (`--memory-reserve-gb`,
    else the catalog's own figure per type), so simulate and regen judge the plan under it."""
    from opweave_planner.latency.memory import GIB, reserve_bytes

    rec = {**space_values(req), "gpus": list(req.gpus)}
    used = {gid: rounded(reserve_bytes(hw.resolve(gid, "--gpus")) / GIB) for gid in req.gpus}
    if req.memory_reserve_gb is None and used:
        rec["memory_reserve_gb"] = max(used.values())
        if len(set(used.values())) > 1:
            rec["memory_reserve_gb_by_gpu"] = used
    return SpaceOut(**rec)


def _pct(new: float, base: float) -> float:
    return rounded((new / base - 1.0) * 100.0, 6) if base else 0.0


def with_alternatives(plan: Plan, named: dict[str, Plan]) -> Plan:
    """`plan` with an `alternatives` section (schema 1.2) listing `named` against it."""
    alts = {name: Alternative(
        usd_per_million_tokens=p.usd_per_million_tokens, tpot_ms=p.tpot_ms,
        cost_delta_pct=_pct(p.usd_per_million_tokens, plan.usd_per_million_tokens),
        tpot_delta_pct=_pct(p.tpot_ms, plan.tpot_ms), num_stages=p.num_stages, gpus_total=p.gpus_total,
        plan=p) for name, p in named.items()}
    out = plan.model_copy(update={"alternatives": alts})
    return out.model_copy(update={"schema_version": plan_version(out)})


class CriticalResource(IntEnum):
    """What binds the round trip (the simulator's CRIT_* codes)."""

    COMPUTE = 0
    EGRESS = 1
    INGRESS = 2
    LOOP_LATENCY = 3

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", " ")


def kv_event_records(ctx, prob, sel, ev) -> list[KvEventsOut | None]:
    """Per owner, its replica's KV overflow episodes at the reserve and at the usable memory (the
    usable bytes left for context-dependent KV, in the units the reserve is counted in: the owner's
    mix of full and sliding-window layers)."""
    from opweave_planner.compile.tables import owner_mixes
    from opweave_planner.compile.traffic import event_law
    from opweave_planner.search.evaluate import range_sum

    out: list[KvEventsOut | None] = []
    steps_per_hour = 3.6e9 / ev.t_mean
    for o in range(prob.k):
        c = int(sel.cfg[o])
        n = sel.mu * int(prob.mb_grid[int(sel.mb[o])])
        per_token = sum(range_sum(prob.kvpref[c], prob.stage_start[j], prob.stage_end[j])
                        for j in range(prob.stage_owner.size) if prob.stage_owner[j] == o)
        reserve = float(prob.kv_units[o, c, n])
        mix = owner_mixes(ctx.tables, prob.stage_owner, prob.stage_start, prob.stage_end, o)[c]
        events = event_law(ctx.workload, n, mix)
        if per_token > 0:
            usable = reserve + (float(ev.memory_usable[o]) - float(ev.memory_need[o])) / per_token
        else:  # no context-dependent KV here: nothing grows, nothing overflows
            reserve = usable = float("inf")
        at = [(events.per_request(x), events.per_step(x), events.share_above(x)) for x in (reserve, usable)]
        out.append(KvEventsOut(
            per_request_at_reserve=rounded(at[0][0]), per_request_at_usable=rounded(at[1][0]),
            per_replica_hour_at_reserve=rounded(at[0][1] * steps_per_hour),
            per_replica_hour_at_usable=rounded(at[1][1] * steps_per_hour),
            share_above_reserve=rounded(at[0][2]), share_above_usable=rounded(at[1][2])))
    return out


def _owners(ctx, splan, sel, ev, events=None) -> list[OwnerOut]:
    out = []
    for o in range(len(sel.cfg)):
        cfg = ctx.tables.configs[int(sel.cfg[o])]
        tp = cfg.parallel.tp
        bh = ctx.tables.mb_grid[int(sel.mb[o])]
        out.append(OwnerOut(
            index=o, gpu=cfg.gpu.id, tensor_parallel=tp, expert_parallel=tp if cfg.parallel.moe_ep else 1,
            replicas=int(sel.replicas[o]), resident_batch=sel.mu * bh, microbatch=bh,
            stage_positions=[j for j in range(splan.n_stages) if splan.owner[j] == o],
            usd_per_hour_per_replica=rounded(cfg.gpu.price_per_hour * tp),
            busy_fraction=rounded(float(ev.busy[o]), 6), memory_bytes_per_gpu=rounded(float(ev.memory_need[o])),
            kv_events=None if events is None else events[o],
        ))
    return out


def _stages(seq, splan, payload, ev) -> list[StageOut]:
    s = splan.n_stages
    crosses = [splan.owner[(j + 1) % s] != splan.owner[j] for j in range(s)]
    return [StageOut(
        index=j, owner=int(splan.owner[j]), operators=[seq.ops[i].name for i in splan.ops[j]],
        latency_ms=rounded(ev.t[j] / 1e3), transfer_ms=rounded((ev.occ[j] + ev.latv[j]) / 1e3),
        payload_bytes_per_request=rounded(float(payload[j]) if crosses[j] else 0.0),
        measured_fraction=rounded(min(1.0, ev.measured[j] / ev.t[j]) if ev.t[j] > 0 else 1.0, 4),
    ) for j in range(s)]


def _metrics(ctx, sel, splan, payload, ev, gpus_total: int) -> Metrics:
    k, s = len(sel.cfg), splan.n_stages
    spend = busy_spend = 0.0
    for o in range(k):
        cfg = ctx.tables.configs[int(sel.cfg[o])]
        usd = cfg.gpu.price_per_hour * cfg.parallel.tp * int(sel.replicas[o])
        spend += usd
        busy_spend += usd * float(ev.busy[o])
    inter = 0.0 if ev.intra_node else sum(payload[j] for j in range(s) if splan.owner[(j + 1) % s] != splan.owner[j])
    crit = CriticalResource(ev.critical_kind).label + (
        f" of owner {ev.critical_index}" if ev.critical_index >= 0 else "")
    return Metrics(
        inter_node_mib_per_token=rounded(inter / 2**20),
        price_weighted_occupancy=rounded(busy_spend / spend, 6) if spend > 0 else 1.0,
        per_gpu_batch=rounded(sel.batch / gpus_total), critical_resource=crit,
        stage_link="none" if k == 1 else ("intra_node" if ev.intra_node else "inter_node"))


def usd_per_million_tokens(cost: float) -> float:
    """A search cost (USD/h rate x µs per token) in USD per million output tokens."""
    return cost / 3.6e9 * 1e6


def build_plan(ctx, template, sel, search: SearchStats, *, scored_t_rtt_us: float | None = None):
    """Describe a Selection for a runtime, from the one evaluator the search scored it with.

    Returns (Plan, Evaluation).
    `scored_t_rtt_us` is the search's own figure for this Selection; the plan's TPOT must
    equal it (a second copy of the physics would show up here). `search` names the searched
    space, which scopes the provenance hashes.
    """
    from opweave_planner.schedule import action_order
    from opweave_planner.search.evaluate import evaluate
    from opweave_planner.structure.operators import SLOTS

    seq, req = ctx.seq, ctx.request
    source = seq.model.source if seq.model.source.startswith("/") else None
    splan, prob = ctx.stage_plan(template), ctx.problem(template, batches=(sel.batch,))
    ev = evaluate(prob, sel)
    dist = workload_record(req, ctx)
    if scored_t_rtt_us is not None and abs(ev.t_rtt - scored_t_rtt_us) > 1e-9 * abs(scored_t_rtt_us):
        raise AssertionError(f"plan TPOT {ev.t_rtt} us differs from the searched {scored_t_rtt_us} us")
    s, k, mu = splan.n_stages, prob.k, sel.mu
    owners = _owners(ctx, splan, sel, ev, None if dist is None else kv_event_records(ctx, prob, sel, ev))
    gpus_total = sum(o.replicas * o.tensor_parallel for o in owners)
    usd_per_mtok = usd_per_million_tokens(ev.cost)
    cut_ops = ([seq.ops[splan.ops[0][0]].name] if s == 1
               else [f"layer+{offset}.{SLOTS[slot]}" for offset, slot in splan.cut_keys])
    # scoped to the searched types and the plan's own (the same set unless a file was edited):
    # a plan always records the price of every GPU it uses, so it reads back
    prov = provenance(ctx.hw, seq, [*search.space.gpus, *(o.gpu for o in owners)], req.profiles, req.backend)
    order = [[f"{kind} {int(j)} {int(kk)}" for kind, j, kk in lst] for lst in action_order(prob.stage_owner, mu, k)]
    workload = workload_of(req, ctx.context_tokens, dist)
    return Plan(
        schema_version=schema_version_for(search.space, alternatives=source is not None, workload=workload),
        model=seq.model.name, model_source=None if source is None else recorded_path(source),
        workload=workload,
        policy=str(req.policy.value), usd_per_million_tokens=rounded(usd_per_mtok), tpot_ms=rounded(ev.t_rtt / 1e3),
        tpot=None if dist is None else tpot_stats(ev, req.percentile),
        microbatches=mu, global_batch=sel.batch, gpus_total=gpus_total, num_stages=s,
        owners=owners,
        template=TemplateOut(subblock_layers=template.lsub, cut_positions=list(template.cuts),
                             cut_operators=cut_ops, owners=k),
        stages=_stages(seq, splan, prob.payload, ev), action_order=order,
        metrics=_metrics(ctx, sel, splan, prob.payload, ev, gpus_total),
        search=search,
        provenance=prov,
    ), ev


def workload_of(req, context_tokens: int, dist: Distribution | None) -> Workload:
    """The request a plan serves; with --prompt-len / --output-len, the window they make (1.7 keys,
    absent otherwise so earlier plans keep their bytes)."""
    window = {}
    if req.lengths is not None:
        p, o = req.lengths
        window = {"prompt_tokens": p, "output_tokens": o, "max_model_len": p + o}
    return Workload(context_tokens=context_tokens, tpot_slo_ms=req.slo_ms, distribution=dist, **window)


def recorded_path(value: str) -> str:
    """An input file (a workload trace, a model's config.json) as a plan records it: relative to
    the working directory when the file lies under it (POSIX separators), so plans made in two
    checkouts are the same bytes; absolute otherwise. Its sha256, recorded too, is its identity."""
    if not os.path.isabs(value):  # an inline law, or a name the reader refuses anyway
        return value
    try:
        cwd = os.path.realpath(os.getcwd())
        rel = os.path.relpath(value, cwd)
    except (OSError, ValueError):  # no working directory, or another drive
        return value
    parts = Path(rel).parts
    return value if not parts or parts[0] == os.pardir else Path(rel).as_posix()


def workload_record(req, compiled) -> Distribution | None:
    """What the plan records about its workload (None: a fixed context)."""
    if not req.stochastic:
        return None
    d = compiled.workload.describe()
    d.pop("path", None)
    return Distribution(workload=recorded_path(req.workload), slo_percentile=req.percentile, kv_quantile=req.kv_quantile,
                        preemptions_per_request=req.preemptions_per_request,
                        scenarios=req.scenarios, seed=req.seed, context_knots=compiled.context_knots,
                        **{k: (rounded(v) if isinstance(v, float) else v) for k, v in d.items()})


def tpot_stats(ev, percentile: float) -> TpotStats:
    ms = [rounded(ev.percentile(q) / 1e3) for q in (0.5, 0.95, 0.99)]
    return TpotStats(percentile=percentile, mean_ms=rounded(ev.t_mean / 1e3), p50_ms=ms[0], p95_ms=ms[1],
                     p99_ms=ms[2], max_ms=rounded(float(ev.samples[-1]) / 1e3),
                     at_mean_context_ms=rounded(ev.t_show / 1e3), samples=int(ev.samples.size))


def search_stats(req, hw, outcome) -> SearchStats:
    return SearchStats(templates=outcome.templates, exhaustive=not (req.pareto or req.bnb),
                       space=space_record(req, hw), **outcome.counters._asdict())
