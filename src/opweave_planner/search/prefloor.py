"""The pre-floor: which templates of a phase the template floor prunes, before their Problems.

`bounds.template_floor` skips a template whose floor exceeds the seed, but only after the driver
built its Problem and dispatched the search kernel (about 66 µs a template; with a tight seed
most templates of a phase end there). The floor factorises by owner: an owner's staircase f_o
depends only on its stages' operator ranges, the configurations it may take and the shared
parts of the phase (configurations, grid, SLO) and its KV mix's reserve rows, and the same
owners recur across thousands of templates. So each distinct owner's staircase is built once
per phase and each template's floor is their merge (`bounds.phase_floors`, the same kernels as
`template_floor`, so the same floors bit for bit and the same templates pruned; each still
counts one `pruned_by_bound`). A floor does not depend on the seed, so each phase's floors are
computed once (the driver asks for every phase's before its first report) and compared with a
seed by the kernels' own `floor_prunes` rule: the driver foresees which templates a later
phase will skip (its progress total). It runs in the parent, so every `--jobs` skips the
same set. Nothing to do for the latency objective (floor 0), without branch and bound, with an
infinite seed, or for a one-stage template (its own grid: the kernel decides).
"""

from __future__ import annotations

import math

import numpy as np

from opweave_planner.compile.tables import owner_mixes, owner_ok, owner_units


class PreFloor:
    """The pre-floor of one compiled request; owners are interned once across its phases."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self._ids: dict[tuple, int] = {}  # an owner's (start, end) stage ranges -> its id
        self._ranges: list[tuple] = []
        self._ok: list[np.ndarray] = []  # per owner id: its cfg_ok row over every GPU type
        self._unit_of: list[int] = []  # per owner id: its reserve rows' id
        self._unit_ids: dict[tuple, int] = {}  # an owner's KV mix per configuration -> its rows' id
        self._units: list[np.ndarray] = []  # per rows' id: the owner's Stages.kv_units row [C, B+]
        self._owners: dict[int, tuple[int, ...]] = {}  # template index -> its owners' ids
        self._checked: tuple = (None, frozenset())  # (phase, the indices `pruned` floored in it)
        self._layouts: dict[tuple[int, ...], tuple] = {}  # template indices -> `phase_floors` arrays
        self._floors: dict[tuple, tuple] = {}  # (indices, SLO, GPU type) -> (searched indices, floors, factor)

    def applies(self, seed: float, latency_objective: bool) -> bool:
        return self.ctx.request.bnb and not latency_objective and math.isfinite(seed)

    def pruned(self, ph) -> frozenset[int]:
        """The indices of `ph` (a driver.Phase) whose template floor exceeds its seed; the phase
        about to run (`checked` answers for it)."""
        cands, got = self._skips(ph)
        self._checked = (ph, frozenset(cands))
        return got

    def checked(self, ph) -> frozenset[int]:
        """The indices of `ph` whose floor the last `pruned(ph)` computed: the search kernel need
        not floor the kept ones again (the same kernels, the same bits, the same seed)."""
        return self._checked[1] if self._checked[0] == ph else frozenset()

    def skipped(self, ph) -> frozenset[int]:
        """`pruned` of a phase that may never run as such (the driver foresees later phases)."""
        return self._skips(ph)[1]

    def _skips(self, ph) -> tuple[tuple[int, ...], frozenset[int]]:
        """(the indices whose floor decides, those of them the seed's floor skips) of `ph`."""
        if not self.applies(ph.seed, ph.latency_objective):
            return (), frozenset()
        cands, cut = self.cut(ph.indices, ph.slo_us, ph.only_gpu, ph.seed)
        return cands, frozenset(i for i, c in zip(cands, cut, strict=True) if c)

    def cut(self, indices, slo_us: float, only_gpu: int | None, seed: float):
        """(the multi-stage indices of `indices`, whether each one's floor prunes it at `seed`):
        the floors are computed once per (indices, SLO, GPU type) and compared with any seed, so
        the driver can foresee which templates of a later phase a seed will skip (its ETA)."""
        from opweave_planner.search.bounds import floor_prunes

        key = (indices, slo_us, only_gpu)
        got = self._floors.get(key)
        if got is None:
            cands = tuple(self._searched(indices))
            floors, factor = self.floors(cands, slo_us, only_gpu)[0::2] if cands else (np.empty(0), 1.0)
            got = self._floors[key] = (cands, floors, factor)
        cands, floors, factor = got
        # the kernels' own rule on the array (plain numpy arithmetic: the same bits)
        return cands, floor_prunes(floors, seed, factor)

    def _searched(self, indices):
        """The templates whose floor decides: _search_one skips one over --max-stages before
        any bound, and a one-stage template has its own grid (the kernel decides)."""
        ctx = self.ctx
        for i in indices:
            t = ctx.templates[i]
            if ctx.stage_plan(t).n_stages > 1 and not ctx.over_max_stages(t):
                yield i

    def floors(self, indices, slo_us: float, only_gpu: int | None, seed: float = math.inf):
        """(floors, pruned, prune factor) of multi-stage templates `indices` (tests compare the
        floors with `walk.template_floor_of` of each template's Problem)."""
        from opweave_planner.search.bounds import FloorParts, phase_floors

        ctx = self.ctx
        # the shared parts every multi-stage template's Problem gets: from one of them
        p = ctx.problem(ctx.templates[indices[0]], slo_us=slo_us, only_gpu=only_gpu)
        ok, st_off, ranges, t_off, t_own, units, u_units = self._layout(tuple(indices))
        if only_gpu is not None:
            ok = ok & (ctx.tables.fabric.cfg_gpu == only_gpu)[None, :]
        floors, pruned = phase_floors(FloorParts(configs=p.configs, fabric=p.fabric, grid=p.grid, limits=p.limits),
                                      (units, u_units), ok, st_off, ranges, t_off, t_own, float(seed))
        return floors, pruned, float(p.limits.prune_factor)

    def _layout(self, indices: tuple[int, ...]) -> tuple:
        """(ok, st_off, ranges, t_off, t_own, units, u_units) of `phase_floors` for these templates,
        built once per index set (the single-type phases share one)."""
        got = self._layouts.get(indices)
        if got is not None:
            return got
        t_own, t_off = [], [0]
        local: dict[int, int] = {}
        for i in indices:
            for u in self._owners_of(i):
                t_own.append(local.setdefault(u, len(local)))
            t_off.append(len(t_own))
        used = sorted(local, key=local.get)
        st_off, ranges, rows = [0], [], {}
        for u in used:
            ranges += self._ranges[u]
            st_off.append(len(ranges))
            rows.setdefault(self._unit_of[u], len(rows))
        i64 = np.int64
        units = np.stack([self._units[r] for r in rows])  # the rows these owners read, in first use order
        got = self._layouts[indices] = (np.array([self._ok[u] for u in used], np.bool_), np.array(st_off, i64),
                                        np.array(ranges, i64).reshape(-1, 2), np.array(t_off, i64),
                                        np.array(t_own, i64), units,
                                        np.array([rows[self._unit_of[u]] for u in used], i64))
        return got

    def _owners_of(self, index: int) -> tuple[int, ...]:
        got = self._owners.get(index)
        if got is not None:
            return got
        ctx = self.ctx
        plan = ctx.stage_plan(ctx.templates[index])
        per: list[list[tuple[int, int]]] = [[] for _ in range(max(plan.owner) + 1)]
        n = ctx.seq.n
        for o, s, e in zip(plan.owner, plan.start, plan.end, strict=True):
            per[o].append((s, n if e == 0 else e))  # as tables.stages: a stage ending at lm_head ends at N
        ids = []
        for ranges in per:
            key = tuple(ranges)
            u = self._ids.get(key)
            if u is None:
                u = self._ids[key] = len(self._ranges)
                self._ranges.append(key)
                arr = np.array(key, np.int64).reshape(-1, 2)
                self._ok.append(owner_ok(ctx.tables, np.zeros(len(key), np.int64), arr[:, 0], arr[:, 1], 1)[0])
                self._unit_of.append(self._unit_row(arr))
            ids.append(u)
        got = self._owners[index] = tuple(ids)
        return got

    def _unit_row(self, arr: np.ndarray) -> int:
        """The id of the reserve rows an owner of stage ranges `arr` [S, 2] reads: those its Problem
        gets (tables.owner_units, one per KV mix of its configurations)."""
        tables, zeros = self.ctx.tables, np.zeros(arr.shape[0], np.int64)
        key = tuple(owner_mixes(tables, zeros, arr[:, 0], arr[:, 1], 0))
        got = self._unit_ids.get(key)
        if got is None:
            got = self._unit_ids[key] = len(self._units)
            self._units.append(owner_units(tables, zeros, arr[:, 0], arr[:, 1], 1, False)[0])
        return got
