"""`compile_request`: a request compiled for the search, once per process.

Everything the search reads is built here, in Python, before the first kernel: the model's
operators, the workload (read and shaped), its arrays (scenarios, knots, KV reserve), the
configuration tables and the templates. `Compiled.problem` then assembles one template's
`Problem` from the shared parts and the template's stages. `api.plan`, `simulate`
(contract.plan_context), the search workers and regen's fingerprint use this one constructor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from opweave_planner.compile.problem import (
    PRUNE_EPS,
    Limits,
    Problem,
    check_problem,
    typed_part,
)
from opweave_planner.compile.tables import Tables, build_tables, owner_units, searched_batches, stages
from opweave_planner.compile.traffic import build_traffic, kv_reserve, workload_of
from opweave_planner.inputs.hardware import Hardware, load_hardware
from opweave_planner.inputs.model import ModelSpec, load_model
from opweave_planner.inputs.request import PlanRequest
from opweave_planner.policies import templates_for
from opweave_planner.structure.operators import OperatorSequence, build_sequence
from opweave_planner.structure.templates import StagePlan, Template, expand, expand_all
from opweave_planner.workload.law import ContextLaw


@dataclass(frozen=True, eq=False)
class Compiled:
    """One request compiled for the search (see the module docstring)."""

    request: PlanRequest
    hw: Hardware
    seq: OperatorSequence
    workload: ContextLaw  # a fixed context, or the stationary law of the trace / law
    tables: Tables  # its Problem parts already typed (`typed_part`)
    _cache: dict = field(default_factory=dict, init=False, repr=False)  # stage plans; whether checked

    @cached_property
    def templates(self) -> tuple[Template, ...]:
        """The request's policy's templates, in search order (built on first use: simulate needs none)."""
        req = self.request
        return tuple(templates_for(self.seq, req.policy, req.max_owners))

    @property
    def context_tokens(self) -> int:
        """The length every request must fit: --ctx, or the workload's longest request (prompt +
        output: its last token is produced at context max_context, so max_context + 1)."""
        req = self.request
        return req.ctx if req.ctx is not None else int(self.workload.max_context) + 1

    @property
    def context_knots(self) -> int:
        """How many context knots the workload's latencies are looked up at (0: a fixed context)."""
        return int(self.tables.traffic.knots.size)

    def stage_plan(self, template: Template) -> StagePlan:
        """The template's plan; once `templates` is built (the search reads every one's plan) the
        first call expands them all together (`expand_all`)."""
        plans = self._cache.get("plans")
        if plans is None:
            every = self.__dict__.get("templates", ())
            plans = self._cache["plans"] = dict(zip(every, expand_all(self.seq, every), strict=True))
        got = plans.get(template)
        if got is None:
            got = plans[template] = expand(self.seq, template)
        return got

    def over_max_stages(self, template: Template) -> bool:
        """Whether --max-stages leaves `template` out: the search skips it before any bound."""
        most = self.request.max_stages
        return most is not None and self.stage_plan(template).n_stages > most

    def problem(self, template: Template, *, slo_us: float | None = None, latency_objective: bool = False,
                batches: tuple[int, ...] | None = None, only_gpu: int | None = None) -> Problem:
        """The template's Problem under this request (`only_gpu`: every owner restricted to one
        GPU type index; `batches`: another batch grid, e.g. a plan's own)."""
        req, t = self.request, self.tables
        slo = req.slo_ms * 1e3 if slo_us is None else slo_us
        limits = self._cache.setdefault("limits", {})
        lim = limits.get((slo, latency_objective))
        fresh = lim is None  # typed and checked once per distinct limits, not per template
        if fresh:
            slack = 0.0 if req.prefer_simpler is None else req.prefer_simpler
            lim = limits[slo, latency_objective] = typed_part(Limits(
                slo=slo, max_gpus=req.max_gpus, max_nodes=float("inf") if req.max_nodes is None else req.max_nodes,
                latency_objective=latency_objective, prune_factor=(1.0 + slack) * (1.0 + PRUNE_EPS)))
        splan = self.stage_plan(template)
        one = splan.n_stages == 1  # the batch caps and their microbatches: one-stage plans only
        configs, own, traffic = ((t.colocated_configs, t.colocated_grid, t.colocated_traffic) if one
                                 else (t.per_config, t.grid, t.traffic))
        grid = own if batches is None else own._replace(batches=np.array(batches, np.int64))
        st, seen = self._stages(template, splan)
        if only_gpu is not None:
            st = st._replace(cfg_ok=st.cfg_ok & (t.fabric.cfg_gpu == only_gpu)[None, :])
        p = Problem(stages=st, configs=configs, fabric=t.fabric, grid=grid, limits=lim, traffic=traffic)
        # the shared parts are typed once and checked with the first template of each kind; per
        # template, its own stages on its first Problem (a later one of the same template, e.g.
        # restricted to one GPU type, has the same arrays but cfg_ok, of the same shape)
        if not self._cache.get(("checked", one)):
            check_problem(p)
            self._cache["checked", one] = True
            return p
        return check_problem(p, (() if seen else ("stages",)) + (("limits",) if fresh else ())
                             + (() if batches is None else ("grid",)))

    def _stages(self, template: Template, splan: StagePlan):
        """(the template's typed Stages over every GPU type, whether built before): the small
        arrays are kept per template (the search builds each template's Problem once per phase),
        the reserve rows ([k, C, B+], large) by `_units`."""
        kept = self._cache.setdefault("stages", {})
        st = kept.get(template)
        if st is None:
            st = typed_part(stages(self.seq, splan, self.tables, memo=self._cache.setdefault("mixes", {})))
            kept[template] = st._replace(kv_units=None)
            return st, False
        return st._replace(kv_units=self._units(st, splan.n_stages == 1)), True

    def _units(self, st, one: bool) -> np.ndarray:
        """Stages.kv_units of a template built before. Without sliding-window reserves (a fixed
        context, or a model without window layers) every owner's row in every configuration is
        the reserve itself, so templates of equal owner count share one array (read only by the
        kernels; the README command's are under 1 MB in all); with them each owner has its own
        mix, rebuilt each time (tables.owner_units: a row per template would be [k, C, B+] each)."""
        if not self.tables.kv_windows:
            shared = self._cache.setdefault("units", {})
            units = shared.get((st.k, one))
            if units is None:
                units = shared[st.k, one] = np.ascontiguousarray(
                    owner_units(self.tables, st.stage_owner, st.stage_start, st.stage_end, st.k, one,
                                self._cache.setdefault("mixes", {})), np.float64)
            return units
        units = owner_units(self.tables, st.stage_owner, st.stage_start, st.stage_end, st.k, one,
                            self._cache.setdefault("mixes", {}))
        return np.ascontiguousarray(units, np.float64)


def hardware_for(req: PlanRequest) -> Hardware:
    """The request's catalog and prices, with its network."""
    return load_hardware(req.catalog, req.prices).with_network(
        inter_node_gbps=req.network_bandwidth, inter_node_latency_us=req.network_latency)


def compile_request(req: PlanRequest, hw: Hardware | None = None, model: ModelSpec | None = None) -> Compiled:
    """Compile `req` (its hardware and model default to the request's own)."""
    hw = hw or hardware_for(req)
    seq = build_sequence(model or load_model(req.model))
    wl = workload_of(req)
    reserve = kv_reserve(req, wl) if req.stochastic else None
    batches, colocated = searched_batches(seq, hw, req, wl if req.stochastic else None, reserve)  # grid + caps
    wa = build_traffic(req, wl, colocated, reserve) if req.stochastic else None
    tables = build_tables(seq, hw, req, wa, batches, colocated)
    return Compiled(request=req, hw=hw, seq=seq, workload=wl, tables=tables._replace(
        per_config=typed_part(tables.per_config), fabric=typed_part(tables.fabric), grid=typed_part(tables.grid),
        traffic=typed_part(tables.traffic), colocated_configs=typed_part(tables.colocated_configs),
        colocated_grid=typed_part(tables.colocated_grid), colocated_traffic=typed_part(tables.colocated_traffic)))
