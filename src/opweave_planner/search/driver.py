"""Algorithm 1: for each template, search all (B, mu) in numba; keep the best plan.

The colocated template is searched first; its cost seeds every other
template's incumbent, so pruning does not depend on how templates are split
across worker processes and `--jobs N` returns the same bytes as `--jobs 1`.
Across templates the winner is the smallest (cost, GPUs, stages, template order).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from dataclasses import dataclass, field

from opweave_planner.compile import Compiled, compile_request
from opweave_planner.inputs.request import PlanRequest
from opweave_planner.procs import deferred_interrupts, process_pool
from opweave_planner.search.prefloor import PreFloor
from opweave_planner.search.state import Counters, Selection
from opweave_planner.structure.templates import Template


@dataclass
class Candidate:
    """The best plan of one template: where it is, what it costs, and its Selection."""

    template_index: int
    template: Template
    cost: float  # cost rate x µs
    t_rtt_us: float
    gpus: int
    n_stages: int
    selection: Selection

    def order_key(self) -> tuple:
        return (self.cost, self.gpus, self.n_stages, self.template_index)


# simpler plan classes reported beside the optimum (plan file `alternatives`)
ALTERNATIVES = ("colocated", "two_owner", "single_gpu_type")


@dataclass
class SearchOutcome:
    best: Candidate | None
    counters: Counters = field(default_factory=Counters)
    templates: int = 0
    # the cheapest plan of each simpler class (None: the class has no feasible plan)
    alternatives: dict[str, Candidate | None] = field(default_factory=dict)
    # every template's best found within the prune factor (what --prefer-simpler chooses from)
    found: list[Candidate] = field(default_factory=list)
    # (phase, templates, seconds) in the order they ran (benchmarks/bench_main_command.py)
    phases: list[tuple[str, int, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Phase:
    """One pass over some templates with a fixed seed (fixed per phase, so --jobs gives the
    same bytes): `only_gpu` restricts every owner to one GPU type index."""

    indices: tuple[int, ...]
    seed: float
    slo_us: float
    latency_objective: bool
    only_gpu: int | None = None


def _search_one(ctx: Compiled, index: int, ph: Phase, floored: bool = False):
    from opweave_planner.search.walk import search_template

    tmpl = ctx.templates[index]
    splan, req = ctx.stage_plan(tmpl), ctx.request
    if req.max_stages is not None and splan.n_stages > req.max_stages:
        return None, Counters()
    prob = ctx.problem(tmpl, slo_us=ph.slo_us, latency_objective=ph.latency_objective, only_gpu=ph.only_gpu)
    res = search_template(prob, ph.seed, req.pareto, req.bnb, floored)
    cand = None
    if res.found:
        cand = Candidate(template_index=index, template=tmpl, cost=res.cost, t_rtt_us=res.t_rtt,
                         gpus=round(res.gpus), n_stages=splan.n_stages, selection=res.selection)
    return cand, res.counters


# a template the floor prunes: no candidate, one pruned_by_bound (as the kernel counts it)
_FLOORED = (None, Counters(pruned_by_bound=1))

_WORKER: dict = {}


def _worker_run(req: PlanRequest, indices: list[int], ph: Phase, floored: list[bool]):
    ctx = _WORKER.get(req)
    if ctx is None:
        ctx = _WORKER[req] = compile_request(req)
    return [_search_one(ctx, i, ph, f) for i, f in zip(indices, floored, strict=True)]


def _better(a: Candidate | None, b: Candidate | None) -> Candidate | None:
    """The smaller by (cost, GPUs, stages, template order); on an exact tie the first."""
    if a is None:
        return b
    if b is None:
        return a
    return a if a.order_key() <= b.order_key() else b


def _single_type(ctx: Compiled, cand: Candidate) -> bool:
    return len({int(ctx.tables.fabric.cfg_gpu[c]) for c in cand.selection.cfg}) == 1


# work estimate of one template: its owners' point tables are built per configuration at
# every (B, mu) and joined across owners, so about owners x configs^1.25. Fitted on
# gemma-3-27b at 32k (2-core box, median ms per template): 4 configs 0.20 / 0.31 ms for 2 / 3
# owners, 16 configs 1.1 / 1.8 ms, i.e. 17-19 us per unit in all four; the previous 2 + configs x
# owners read the 16-config phase 1.7x too cheap
CONFIG_EXPONENT = 1.25
# no ETA before this share of the estimated work is done after the first report (the colocated
# template, which carries cache loading); from there the rate of work is measured, not guessed
ETA_AFTER = 0.05


def template_work(n_configs: int, owners: int) -> float:
    """Estimated cost of searching one template whose owners choose among n_configs."""
    return float(owners) * float(n_configs) ** CONFIG_EXPONENT


def progress_report(done_work: float, total_work: float, templates: int) -> tuple[int, int]:
    """What `progress(done, total)` is told: the work done as template-equivalents of the
    estimated work (so an ETA from it scales with work, not with template count) and the total,
    always the template count. The display's ETA is the rate since the first report, once
    ETA_AFTER of the total is done after it (`report.Progress(eta_after=ETA_AFTER)`)."""
    if total_work <= 0.0:
        return templates, templates
    return min(templates, round(templates * done_work / total_work)), templates


class _Run:
    """The phases of one search, sharing a progress count and the interrupt check."""

    def __init__(self, ctx: Compiled, jobs: int, progress, check, total: int, stack=None,
                 total_work: float = 0.0) -> None:
        self.ctx, self.jobs, self.progress, self.check = ctx, jobs, progress, check
        self.done, self.total = 0, total
        self.done_work, self.total_work = 0.0, total_work
        self.stack, self.pool = stack, None  # one worker pool for every phase (workers keep their context)
        self.counters = Counters()
        self.prefloor = PreFloor(ctx)  # in the parent: every --jobs skips the same templates
        self.timings: list[tuple[str, int, float]] = []

    def phase(self, name: str, ph: Phase) -> list[Candidate]:
        """Run one phase; the candidates it found, in template order."""
        start = time.perf_counter()
        try:
            return self._phase(ph)
        finally:
            self.timings.append((name, len(ph.indices), time.perf_counter() - start))

    def _phase(self, ph: Phase) -> list[Candidate]:
        # templates the floor prunes, decided unbuilt: what the search kernel would return for them
        pruned = self.prefloor.pruned(ph)
        checked = self.prefloor.checked(ph)  # the kept ones of these need no floor in the kernel
        kept = [i for i in ph.indices if i not in pruned]
        if self.jobs <= 1 or len(kept) < 2 * self.jobs:
            runs = ([(i, _FLOORED if i in pruned else _search_one(self.ctx, i, ph, i in checked))]
                    for i in ph.indices)
        else:
            if self.pool is None:
                self.pool = self.stack.enter_context(process_pool(self.jobs))
            runs = _pooled(self.ctx, kept, self.jobs, ph, self.pool, checked)
            if pruned:
                runs = itertools.chain([[(i, _FLOORED) for i in ph.indices if i in pruned]], runs)
        found: dict[int, Candidate] = {}
        work, floored = _phase_work(self.ctx, ph), 0
        try:
            for results in runs:
                for i, (cand, counters) in results:
                    if counters is _FLOORED[1]:
                        floored += 1  # one pruned_by_bound each, added once below
                    else:
                        self.counters += counters
                    if cand is not None:
                        found[i] = cand
                    self.done += 1
                    self.done_work += work(i)
                if self.progress:
                    self.progress(*progress_report(self.done_work, self.total_work, self.total))
                self.check()
        finally:
            self.counters += Counters(pruned_by_bound=floored)
        return [found[i] for i in sorted(found)]


def _pooled(ctx: Compiled, rest: list[int], jobs: int, ph: Phase, pool, checked: frozenset[int]):
    """Chunks of templates on worker processes, yielded in a fixed order (same bytes as jobs=1)."""
    chunks = [rest[i::jobs * 4] for i in range(jobs * 4)]
    futures = [(ch, pool.submit(_worker_run, ctx.request, ch, Phase(tuple(ch), ph.seed, ph.slo_us,
                                                                      ph.latency_objective, ph.only_gpu),
                                [i in checked for i in ch]))
               for ch in chunks if ch]
    for ch, fut in futures:
        yield list(zip(ch, fut.result(), strict=True))


def _phase_work(ctx: Compiled, ph: Phase):
    """index -> `template_work` of that template in phase `ph` (its configuration count found once
    per phase, not per template: 52,402 calls of the README command)."""
    gpu_of = ctx.tables.fabric.cfg_gpu
    n_cfg = len(gpu_of) if ph.only_gpu is None else sum(1 for g in gpu_of if int(g) == ph.only_gpu)
    return lambda index: template_work(n_cfg, ctx.templates[index].k)


def _min_cost(cands) -> float:
    return min((c.cost for c in cands if c is not None), default=math.inf)


def run_search(ctx: Compiled, jobs: int = 1, progress=None, slo_ms: float | None = None,
               latency_objective: bool = False) -> SearchOutcome:
    """Search every template of the compiled request's policy; deterministic for any `jobs`.

    Phases, each with a fixed seed: (1) the colocated template, exact; (2) two-owner templates
    seeded by it, exact up to the colocated cost; (3) with several GPU types, every template
    restricted to one type, seeded by the cheapest single-type plan so far (the single-GPU-type
    alternative, and a tight seed); (4) the remaining templates over every type, seeded by the
    cheapest plan found. A seed only prunes candidates dearer than a plan already found, so the
    optimum (and, on ties, which plan wins) is that of one unseeded pass. Ctrl-C and SIGTERM
    are deferred to between kernel calls; worker processes die with their parent.
    """
    slo_us = (ctx.request.slo_ms if slo_ms is None else slo_ms) * 1e3
    n = len(ctx.templates)
    gpu_of = ctx.tables.fabric.cfg_gpu
    types = sorted({int(g) for g in gpu_of})
    owners = [t.k for t in ctx.templates]
    two = tuple(i for i in range(1, n) if owners[i] == 2)
    rest = tuple(i for i in range(1, n) if owners[i] > 2)
    total = 1 + len(two) + len(rest) + ((n - 1) * len(types) if len(types) > 1 else 0)
    every = Phase(tuple(range(n)), math.inf, slo_us, latency_objective)
    work_of = _phase_work(ctx, every)
    work = sum(work_of(i) for i in (0, *two, *rest))
    if len(types) > 1:
        works = [_phase_work(ctx, Phase((), math.inf, slo_us, latency_objective, only_gpu=g)) for g in types]
        work += sum(w(i) for w in works for i in range(1, n))
    with deferred_interrupts() as check, contextlib.ExitStack() as stack:
        run = _Run(ctx, jobs, progress, check, total, stack, work)
        colocated = run.phase("colocated", Phase((0,), math.inf, slo_us, latency_objective))
        c_cost = _min_cost(colocated)
        two_found = run.phase("two-owner", Phase(two, c_cost, slo_us, latency_objective))
        mixed = colocated + two_found
        singles: list[Candidate] = [c for c in mixed if _single_type(ctx, c)]
        if len(types) > 1:
            for g in types:
                singles += run.phase(f"single type {ctx.tables.configs[list(gpu_of).index(g)].gpu.id}",
                                     Phase(tuple(range(1, n)), _min_cost(singles), slo_us, latency_objective,
                                           only_gpu=g))
        mixed += run.phase("mixed", Phase(rest, min(_min_cost(mixed), _min_cost(singles)), slo_us,
                                          latency_objective))
    best = None
    for c in mixed:
        best = _better(best, c)
    for c in singles:  # a single-type plan wins only if strictly ahead of every mixed one
        if best is None or c.order_key() < best.order_key():
            best = c
    alternatives = {"colocated": _first(colocated), "two_owner": _first(colocated + two_found),
                    "single_gpu_type": _first(singles) if len(types) > 1 else best}
    return SearchOutcome(best=best, counters=run.counters, templates=n, alternatives=alternatives,
                         found=mixed + singles, phases=run.timings)


def _first(cands: list[Candidate]) -> Candidate | None:
    best = None
    for c in cands:
        best = _better(best, c)
    return best
