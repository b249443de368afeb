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

import numpy as np

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
    if ctx.over_max_stages(tmpl):
        return None, Counters()
    splan, req = ctx.stage_plan(tmpl), ctx.request
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


def _warm_worker(req: PlanRequest, ph: Phase) -> None:
    """Compile the request and load the search kernels in a worker (the colocated template's
    search, whose result the parent finds itself), so the rate after the first report is not
    the workers' start-up."""
    _worker_run(req, [0], ph, [False])


def _better(a: Candidate | None, b: Candidate | None) -> Candidate | None:
    """The smaller by (cost, GPUs, stages, template order); on an exact tie the first."""
    if a is None:
        return b
    if b is None:
        return a
    return a if a.order_key() <= b.order_key() else b


def _single_type(ctx: Compiled, cand: Candidate) -> bool:
    return len({int(ctx.tables.fabric.cfg_gpu[c]) for c in cand.selection.cfg}) == 1


# work estimate of one template, in units of about 50 us: a searched template builds its owners'
# point tables (per configuration, and per context knot under a workload) and walks them.
# Measured per searched template on gemma-3-27b at 32k (2-core box, session 17, with the
# pre-floor; benchmarks/bench_eta.py): a fixed context, 3 owners 0.14-0.16 / 0.20 / 0.21 ms over
# 4 / 8 / 16 configurations (2 owners 0.09-0.13 / 0.19 / 0.27 ms); the mooncake workload (33
# knots), 3 owners 1.14 / 5.37 ms over 4 / 16 (2 owners 1.07 / 5.05 ms). A template the floor
# skips costs the loop only (about 2 us: its floor was computed before the first report).
PER_CONFIG, PER_KNOT = 0.025, 0.068  # per owner: 1 + configs x (PER_CONFIG + PER_KNOT x knots)
SKIPPED_WORK = 0.04
# no ETA before this share of the estimated work is done after the first report (the colocated
# template, which carries cache loading); from there the rate of work is measured, not guessed
ETA_AFTER = 0.05


def template_work(n_configs: int, owners: int, searched: bool = True, knots: int = 0) -> float:
    """Estimated cost of one template whose owners choose among n_configs (with `knots` context
    knots of a workload); a template the floor (or --max-stages) skips costs SKIPPED_WORK."""
    return float(owners) * (1.0 + n_configs * (PER_CONFIG + PER_KNOT * knots)) if searched else SKIPPED_WORK


def progress_report(done: int, total: int) -> tuple[int, int]:
    """What `progress(done, total)` is told: the estimated work done and the estimated total
    (done plus what is left), in hundredths of a unit (integers, so every sum is exact). The
    total is foreseen from the template floors at the seeds known so far; a later seed only skips
    more, so it may shrink at a phase's end, never below done. The display's ETA is the rate
    since the first report, once ETA_AFTER of the total is done after it
    (`report.Progress(eta_after=ETA_AFTER)`)."""
    return done, max(done, total)


class _Run:
    """The phases of one search, sharing a progress count and the interrupt check."""

    def __init__(self, ctx: Compiled, jobs: int, progress, check, stack=None) -> None:
        self.ctx, self.jobs, self.progress, self.check = ctx, jobs, progress, check
        self.done_work = 0  # hundredths of a unit (`work`)
        self.stack, self.pool = stack, None  # one worker pool for every phase (workers keep their context)
        self.counters = Counters()
        self.prefloor = PreFloor(ctx)  # in the parent: every --jobs skips the same templates
        self.timings: list[tuple[str, int, float]] = []
        self._works: dict[tuple, tuple] = {}

    def start_workers(self, ph: Phase) -> list:
        """With --jobs N and progress shown, start the pool now and warm each worker on `ph` (the
        colocated phase) beside the parent's own colocated search: futures to wait for before the
        first report, so the ETA's rate is not the workers' start-up (first ETA of the README
        command at --jobs 2: 6.0x the time left with the pool started lazily, 1.6x warmed; about
        0.5 s more worker CPU, the same wall time). Without progress the pool starts lazily."""
        if self.jobs <= 1:
            return []
        self.pool = self.stack.enter_context(process_pool(self.jobs))
        return [self.pool.submit(_warm_worker, self.ctx.request, ph) for _ in range(self.jobs)]

    def foresee(self, phases: list[Phase]) -> None:
        """Compute the floors of every phase now, before the first report: each phase's seed is
        not known yet, but its floors do not depend on it (the ETA then foresees which templates
        a seed skips, and their cost is setup, not a sample of the rate)."""
        start = time.perf_counter()
        for ph in phases:
            if self.prefloor.applies(0.0, ph.latency_objective):
                self.prefloor.cut(ph.indices, ph.slo_us, ph.only_gpu, math.inf)
        self.timings.append(("pre-floor", sum(len(ph.indices) for ph in phases), time.perf_counter() - start))

    def work(self, ph: Phase) -> np.ndarray:
        """Estimated work of each template of `ph` at its seed, in hundredths (SKIPPED_WORK where
        its floor or --max-stages skips it)."""
        got = self._works.get(ph.indices)
        if got is None:
            ctx = self.ctx
            over = np.array([ctx.over_max_stages(ctx.templates[i]) for i in ph.indices], np.bool_)
            pos = {i: j for j, i in enumerate(ph.indices)}
            got = self._works[ph.indices] = (over, pos, np.array([ctx.templates[i].k for i in ph.indices]))
        over, pos, owners = got
        gpu_of = self.ctx.tables.fabric.cfg_gpu
        n_cfg = len(gpu_of) if ph.only_gpu is None else int((gpu_of == ph.only_gpu).sum())
        skip = over.copy()
        if self.prefloor.applies(ph.seed, ph.latency_objective):
            cands, cut = self.prefloor.cut(ph.indices, ph.slo_us, ph.only_gpu, ph.seed)
            skip[[pos[i] for i, c in zip(cands, cut, strict=True) if c]] = True
        work = np.where(skip, SKIPPED_WORK, template_work(n_cfg, 1, knots=self.ctx.context_knots) * owners)
        return np.rint(100.0 * work).astype(np.int64)  # hundredths: integer sums, exact in any order

    def forecast(self, later: list[Phase]) -> int:
        """Estimated work of phases still to run, at the seeds known now (theirs are no dearer)."""
        return int(sum(int(self.work(ph).sum()) for ph in later)) if self.progress else 0

    def report(self, later: list[Phase]) -> None:
        """A phase ended: its finds set the later seeds, so the foreseen total is new."""
        if self.progress:
            self.progress(*progress_report(self.done_work, self.done_work + self.forecast(later)))

    def phase(self, name: str, ph: Phase, later: list[Phase] | None) -> list[Candidate]:
        """Run one phase; the candidates it found, in template order. `later`: the phases after
        it, at the seeds known now (the progress total); None: report only at its end."""
        start = time.perf_counter()
        try:
            return self._phase(ph, later)
        finally:
            self.timings.append((name, len(ph.indices), time.perf_counter() - start))

    def _phase(self, ph: Phase, later: list[Phase] | None) -> list[Candidate]:
        # templates the floor prunes, decided unbuilt: what the search kernel would return for them
        pruned = self.prefloor.pruned(ph)
        checked = self.prefloor.checked(ph)  # the kept ones of these need no floor in the kernel
        # no report until the phase ends with later None (the colocated one: the later seeds are
        # unknown until it has), none at all without a progress callback
        work, total = {}, None
        if self.progress:
            works = self.work(ph)
            work = dict(zip(ph.indices, works.tolist(), strict=True))
            if later is not None:
                total = self.done_work + int(works.sum()) + self.forecast(later)
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
        floored = 0
        try:
            for results in runs:
                for i, (cand, counters) in results:
                    if counters is _FLOORED[1]:
                        floored += 1  # one pruned_by_bound each, added once below
                    else:
                        self.counters += counters
                    if cand is not None:
                        found[i] = cand
                    self.done_work += work.get(i, 0)
                if total is not None:
                    self.progress(*progress_report(self.done_work, total))
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
    steps = [("colocated", (0,), None), ("two-owner", two, None)]
    if len(types) > 1:
        steps += [(f"single type {ctx.tables.configs[list(gpu_of).index(g)].gpu.id}", tuple(range(1, n)), g)
                  for g in types]
    steps.append(("mixed", rest, None))
    mixed: list[Candidate] = []  # colocated, two-owner and mixed finds
    singles: list[Candidate] = []  # every single-type find
    found: dict[str, list[Candidate]] = {}

    def at_seed(step) -> Phase:
        """A step's phase at the seed its rule gives now: a single-type phase the cheapest
        single-type plan, any other the cheapest plan (the colocated one, two-owner's seed)."""
        _name, indices, g = step
        seed = _min_cost(singles) if g is not None else min(_min_cost(mixed), _min_cost(singles))
        return Phase(indices, seed, slo_us, latency_objective, only_gpu=g)

    with deferred_interrupts() as check, contextlib.ExitStack() as stack:
        run = _Run(ctx, jobs, progress, check, stack)
        warming = run.start_workers(at_seed(steps[0])) if progress else []
        run.foresee([at_seed(st) for st in steps[1:]])
        for k, step in enumerate(steps):
            name, _indices, g = step
            got = found[name] = run.phase(name, at_seed(step), [at_seed(st) for st in steps[k + 1:]] if k else None)
            if g is not None:
                singles += got
            else:  # the mixed phase's finds are not single-type alternatives (seeded by them)
                mixed += got
                singles += [c for c in got if name != "mixed" and _single_type(ctx, c)]
            for fut in warming:  # the first report waits for the workers' start-up: setup, not rate
                fut.result()
            warming = []
            run.report([at_seed(st) for st in steps[k + 1:]])
    colocated, two_found = found["colocated"], found["two-owner"]
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
