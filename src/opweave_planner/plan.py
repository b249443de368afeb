"""The plan file: a pydantic contract, built from a search result, written atomically.

Units: milliseconds for times, USD per million output tokens for cost, bytes
per request for payloads. `schema_version` is MAJOR.MINOR: a new optional key
bumps MINOR (old readers keep working); a removed/renamed key or a changed
meaning bumps MAJOR.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from opweave_planner import __version__
from opweave_planner.data import shipped_dir
from opweave_planner.report import dumps

SCHEMA_VERSION = "1.0"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Workload(_Frozen):
    context_tokens: int
    tpot_slo_ms: float


class OwnerOut(_Frozen):
    index: int
    gpu: str
    tensor_parallel: int
    expert_parallel: int
    replicas: int
    resident_batch: int
    microbatch: int
    stage_positions: list[int]
    usd_per_hour_per_replica: float
    busy_fraction: float


class StageOut(_Frozen):
    index: int
    owner: int
    operators: list[str]
    latency_ms: float
    transfer_ms: float
    payload_bytes_per_request: float


class TemplateOut(_Frozen):
    subblock_layers: int
    cut_positions: list[int]
    cut_operators: list[str]
    owners: int


class Metrics(_Frozen):
    inter_node_mib_per_token: float
    price_weighted_occupancy: float
    per_gpu_batch: float
    critical_resource: str


class SearchStats(_Frozen):
    templates: int
    candidates: int
    simulations: int
    pruned_by_bound: int
    pruned_by_frontier: int
    exhaustive: bool


class Provenance(_Frozen):
    tool_version: str
    model_sha256: str
    catalog_sha256: str
    profiles_sha256: str
    network: dict[str, float]
    backend: str


class Plan(_Frozen):
    schema_version: str
    model: str
    workload: Workload
    policy: str
    usd_per_million_tokens: float
    tpot_ms: float
    microbatches: int
    global_batch: int
    gpus_total: int
    num_stages: int
    owners: list[OwnerOut]
    template: TemplateOut
    stages: list[StageOut]
    action_order: list[list[str]]  # per owner: "compute|send|recv <stage> <microbatch>"
    metrics: Metrics
    search: SearchStats
    provenance: Provenance


class Infeasible(_Frozen):
    schema_version: str
    model: str
    workload: Workload
    policy: str
    feasible: bool = False
    reason: str


def _round(x: float, digits: int = 9) -> float:
    """Stable decimal rounding so identical inputs always print identical bytes."""
    return float(f"{x:.{digits}g}")


def profiles_hash(profiles_dir: str | None, gpus: list[str], backend: str) -> str:
    root = Path(profiles_dir) if profiles_dir else shipped_dir("profiles")
    h = hashlib.sha256()
    for gid in sorted(gpus):
        folder = root / gid
        for p in sorted(folder.glob("*.json")) + sorted((folder / backend).glob("*.json")):
            h.update(p.relative_to(root).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


CRITICAL = {0: "compute", 1: "egress", 2: "ingress", 3: "loop latency"}


def build_plan(ctx, cand, outcome) -> Plan:
    """Re-simulate the winner with full detail and describe it for a runtime."""
    from opweave_planner.schedule import action_order, simulate_detail
    from opweave_planner.search.arrays import stage_arrays
    from opweave_planner.structure.templates import expand

    seq, arrays, req = ctx.seq, ctx.arrays, ctx.request
    splan = expand(seq, cand.template)
    st = stage_arrays(seq, splan)
    s, k, mu = splan.n_stages, st.k, cand.mu
    bh = [arrays.mb_grid[o.mb_index] for o in cand.owners]
    t = np.zeros(s)
    occ = np.zeros(s)
    lat = np.zeros(s)
    from opweave_planner.search.kernels import _range_sum

    link_bw, link_lat, intra = arrays.link([o.config for o in cand.owners], cand.gpus)
    for j in range(s):
        o = st.owner[j]
        own = cand.owners[o]
        t[j] = _range_sum(arrays.pref[own.config, own.mb_index], st.start[j], st.end[j])
        b = st.owner[(j + 1) % s]
        if b != o:
            occ[j] = st.payload[j] * max(bh[o], bh[b]) / link_bw
            lat[j] = link_lat
    t_rtt, comp, _egr, _ing, crit_kind, crit_idx = simulate_detail(st.owner, t, occ, lat, mu, k)
    owners = []
    rate = 0.0
    spend = busy_spend = 0.0
    gpus_total = 0
    for o, own in enumerate(cand.owners):
        cfg = arrays.configs[own.config]
        tp = cfg.parallel.tp
        usd_h = cfg.gpu.price_per_hour * tp
        resident = mu * bh[o]
        rate += usd_h / resident
        n = own.replicas
        gpus_total += n * tp
        spend += usd_h * n
        busy_spend += usd_h * n * float(comp[o])
        owners.append(OwnerOut(
            index=o, gpu=cfg.gpu.id, tensor_parallel=tp, expert_parallel=tp if cfg.parallel.moe_ep else 1,
            replicas=n, resident_batch=resident, microbatch=bh[o],
            stage_positions=[j for j in range(s) if st.owner[j] == o],
            usd_per_hour_per_replica=_round(usd_h), busy_fraction=_round(float(comp[o]), 6),
        ))
    usd_per_mtok = t_rtt * rate / 3.6e9 * 1e6
    stages = [StageOut(
        index=j, owner=int(st.owner[j]), operators=[seq.ops[i].name for i in splan.ops[j]],
        latency_ms=_round(t[j] / 1e3), transfer_ms=_round((occ[j] + lat[j]) / 1e3),
        payload_bytes_per_request=_round(float(st.payload[j]) if st.owner[(j + 1) % s] != st.owner[j] else 0.0),
    ) for j in range(s)]
    inter = 0.0 if intra else sum(st.payload[j] for j in range(s) if st.owner[(j + 1) % s] != st.owner[j])
    cut_ops = [seq.ops[splan.ops[0][0]].name] if s == 1 else []
    if s > 1:
        from opweave_planner.structure.blocks import detect_blocks
        from opweave_planner.structure.templates import subblock_keys
        from opweave_planner.structure.operators import SLOTS

        keys = subblock_keys(seq, detect_blocks(seq), cand.template.lsub)
        cut_ops = [f"layer+{keys[c][0]}.{SLOTS[keys[c][1]]}" for c in cand.template.cuts]
    hw = ctx.hw
    prov = Provenance(
        tool_version=__version__, model_sha256=seq.model.source_sha256, catalog_sha256=hw.sha256,
        profiles_sha256=profiles_hash(req.profiles_dir, [c.gpu.id for c in arrays.configs], req.backend),
        network={"inter_node_gbps": hw.network.inter_node_gbps,
                 "inter_node_latency_us": hw.network.inter_node_latency_us,
                 "intra_node_latency_us": hw.network.intra_node_latency_us},
        backend=req.backend,
    )
    order = [[f"{kind} {int(j)} {int(kk)}" for kind, j, kk in lst] for lst in action_order(st.owner, mu, k)]
    return Plan(
        schema_version=SCHEMA_VERSION, model=seq.model.name,
        workload=Workload(context_tokens=req.context, tpot_slo_ms=req.slo_ms),
        policy=req.space.policy, usd_per_million_tokens=_round(usd_per_mtok), tpot_ms=_round(t_rtt / 1e3),
        microbatches=mu, global_batch=cand.batch, gpus_total=gpus_total, num_stages=s,
        owners=owners,
        template=TemplateOut(subblock_layers=cand.template.lsub, cut_positions=list(cand.template.cuts),
                             cut_operators=cut_ops, owners=k),
        stages=stages, action_order=order,
        metrics=Metrics(
            inter_node_mib_per_token=_round(inter / 2**20),
            price_weighted_occupancy=_round(busy_spend / spend, 6),
            per_gpu_batch=_round(cand.batch / gpus_total),
            critical_resource=CRITICAL[int(crit_kind)] + (f" of owner {int(crit_idx)}" if crit_idx >= 0 else ""),
        ),
        search=SearchStats(templates=outcome.templates, exhaustive=not (req.use_pareto or req.use_bnb),
                           **outcome.counters),
        provenance=prov,
    )


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write via a temporary file in the same folder and rename: never half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def plan_bytes(plan: BaseModel) -> bytes:
    return dumps(plan.model_dump(mode="json"))
