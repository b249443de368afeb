"""The search stays exact under the workload objective (percentile TPOT, mean-TPOT cost).

Random small instances of `tests/test_search_exact.py` get a workload: a few context
knots with nondecreasing per-operator latencies, seeded scenarios of per-slot contexts, a
KV reserve per resident count, and the branch-and-bound tables built by the shipped rule
(`compile.traffic.lower_tables` at `compile.traffic.lower_context`). The kernel (every
combination of frontier and bounds) must return the brute force's optimum, the brute force
scoring every candidate with the one evaluator. The evaluator's scenario periods are
themselves re-derived here from the plain-Python reference simulator with per-microbatch
stage times, so the scoring is audited too.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_search_exact import (
    SETTINGS,
    assert_kernel_matches,
    brute_force,
    instances,
    problem_of,
    run_kernel,
)

from opweave_planner.compile.tables import knot_free
from opweave_planner.compile.traffic import lower_context, lower_tables
from opweave_planner.schedule.reference import simulate_rtt as ref_simulate_rtt
from opweave_planner.search.evaluate import evaluate, order_index


@st.composite
def workload_instances(draw):
    inst = draw(instances())
    n_cfg, n_mb, n1 = inst["pref"].shape
    n_ops = n1 - 1
    g_n = draw(st.integers(2, 4))
    knots = np.cumsum([1.0] + [float(draw(st.integers(1, 8))) for _ in range(g_n - 1)])
    # per (config, microbatch, knot, operator) latency, nondecreasing in the context
    at = np.zeros((n_cfg, n_mb, g_n, n_ops))
    for c in range(n_cfg):
        for m in range(n_mb):
            for i in range(n_ops):
                steps = [draw(st.integers(0, 4)) / 2 for _ in range(g_n)]
                at[c, m, :, i] = np.cumsum(steps)
    kpref = np.zeros((n_cfg, n_mb, g_n, n1))
    kpref[..., 1:] = np.cumsum(at, axis=3)
    n_scen = draw(st.integers(1, 6))
    top = int(max(inst["batches"]))
    ctx = np.array([[draw(st.integers(int(knots[0]), int(knots[-1]))) for _ in range(top)]
                    for _ in range(n_scen)], float)
    cs = np.zeros((n_scen, top + 1))
    cs[:, 1:] = np.cumsum(ctx, axis=1)
    pct = draw(st.sampled_from([0.5, 0.8, 0.95, 1.0]))
    c_lb = lower_context(cs, inst["batches"], inst["max_mu"], inst["max_rep"], pct)
    pref = np.zeros((n_cfg, n_mb, n1))
    pref[..., 1:] = np.cumsum(lower_tables(np.moveaxis(at, 2, 3), knots, c_lb), axis=2)
    unit = draw(st.integers(0, 2)) / 4
    units = np.array([n * unit + (draw(st.integers(0, 2)) / 4 if n else 0.0) for n in range(top + 1)])
    kvcpref = np.zeros((n_cfg, n1))
    for c in range(n_cfg):
        kvcpref[c, 1:] = np.cumsum([draw(st.integers(0, 1)) / 4 for _ in range(n_ops)])
    # some configs differ by a context-free amount (as TP vs EP experts do): frontier dominance
    # may then skip the knots (compile.tables.knot_free decides, here as in the planner)
    if n_cfg > 1 and draw(st.booleans()):
        at[1] = at[0] + np.array([draw(st.integers(-2, 2)) / 2 for _ in range(n_ops)])[None, None, :]
        at[1] = np.maximum(at[1], 0.0)
        kpref[1, ..., 1:] = np.cumsum(at[1], axis=2)
        pref[1, ..., 1:] = np.cumsum(lower_tables(np.moveaxis(at[1], 1, 2), knots, c_lb), axis=1)
    inst.update(pref=pref, knots=knots, kpref=kpref, scen_cs=cs, pct=pct, units=units, kvcpref=kvcpref,
                theta=float(ctx.mean()), c_lb=c_lb, knot_free=knot_free(list(at), n_cfg))
    return inst


def workload_problem(inst):
    p = problem_of(inst)
    return p._replace(units=inst["units"], kvcpref=inst["kvcpref"], knots=inst["knots"], kpref=inst["kpref"],
                      scen_cs=inst["scen_cs"], pct=inst["pct"], theta=inst["theta"], knot_free=inst["knot_free"])


def _interp(knots, values, x):
    return float(np.interp(x, knots, values))


def reference_samples(p, sel, ev):
    """The scenario periods recomputed in plain Python (reference simulator, per-microbatch)."""
    k, s_n, mu, B = p.k, p.stage_owner.size, sel.mu, sel.batch
    bh = [int(p.mb_grid[m]) for m in sel.mb]
    kt = [[p.kpref[sel.cfg[p.stage_owner[j]], sel.mb[p.stage_owner[j]], g, p.stage_end[j]] -
           p.kpref[sel.cfg[p.stage_owner[j]], sel.mb[p.stage_owner[j]], g, p.stage_start[j]]
           if p.stage_end[j] > p.stage_start[j] else None for g in range(p.knots.size)] for j in range(s_n)]
    for j in range(s_n):  # cyclic ranges
        if kt[j][0] is None:
            o = p.stage_owner[j]
            row = p.kpref[sel.cfg[o], sel.mb[o]]
            kt[j] = [row[g, -1] - row[g, p.stage_start[j]] + row[g, p.stage_end[j]] for g in range(p.knots.size)]
        kt[j] = [v + p.cfg_stage_fixed[sel.cfg[p.stage_owner[j]]] for v in kt[j]]
    out = []
    groups = int(sel.replicas[0]) if k == 1 else 1
    per = B // mu
    for s in range(p.scen_cs.shape[0]):
        ctx = np.diff(p.scen_cs[s])
        for grp in range(groups):
            t2 = []
            for j in range(s_n):
                o = p.stage_owner[j]
                row = []
                for i in range(mu):
                    reps = [grp] if k == 1 else range(int(sel.replicas[o]))
                    x = max(ctx[i * per + r * bh[o]: i * per + (r + 1) * bh[o]].mean() for r in reps)
                    row.append(_interp(p.knots, kt[j], x))
                t2.append(row)
            out.append(ref_simulate_rtt(list(p.stage_owner), t2, list(ev.occ), list(ev.latv), mu, k))
    return sorted(out)


def workload_brute_force(inst):
    p = workload_problem(inst)
    return brute_force(inst, problem=p)


@settings(max_examples=300, **SETTINGS)
@given(workload_instances())
def test_kernel_equals_brute_force_under_a_workload(inst):
    best, feasible = workload_brute_force(inst)
    event("infeasible" if best is None else "feasible")
    assert_kernel_matches(inst, best, feasible, problem=workload_problem(inst))


def _optimum(inst):
    """(problem, selection, evaluation) of the unconstrained optimum, or None."""
    p = workload_problem(inst)
    got = run_kernel(inst, False, False, problem=p, slo=math.inf)
    if got is None:
        return None
    return p, got["selection"], evaluate(p, got["selection"])


@settings(max_examples=60, **SETTINGS)
@given(workload_instances())
def test_scenario_periods_match_the_reference_simulator(inst):
    found = _optimum(inst)
    if found is None:
        return
    p, sel, ev = found
    ref = reference_samples(p, sel, ev)
    assert np.allclose(ev.samples, ref, rtol=1e-9, atol=1e-12)
    kk = order_index(len(ref), p.pct)
    assert math.isclose(ev.t_rtt, ref[kk - 1], rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(ev.t_mean, sum(ref) / len(ref), rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=150, **SETTINGS)
@given(workload_instances())
def test_bounds_tables_are_below_every_scenario(inst):
    """The lower-bound stage times never exceed the mean over microbatches of any scenario's
    per-microbatch stage times (what makes the bounds valid for the mean and the percentile)."""
    found = _optimum(inst)
    if found is None:
        return
    p, sel, ev = found
    # the bound's loop term (sum of LB stage times) never exceeds any sampled period
    lb = sum(p.pref[sel.cfg[p.stage_owner[j]], sel.mb[p.stage_owner[j]], p.stage_end[j]]
             - p.pref[sel.cfg[p.stage_owner[j]], sel.mb[p.stage_owner[j]], p.stage_start[j]]
             for j in range(p.stage_owner.size) if p.stage_end[j] > p.stage_start[j])
    assert lb <= ev.t_mean * (1 + 1e-9) + 1e-12
    assert lb <= ev.t_rtt * (1 + 1e-9) + 1e-12


def test_frontier_dominance_compares_every_knot():
    """Config B is faster than A at the bound's context but slower at long contexts: B must not
    drop A from the frontier (knot_free False), or the search returns a dearer plan."""
    at = np.zeros((2, 2, 2, 1))  # [config, microbatch size, knot, operator]
    at[0, :, :, 0] = [4.0, 4.0]  # A: the same at every context
    at[1, :, :, 0] = [1.0, 10.0]  # B: fast when short, slow when long
    knots = np.array([1.0, 10.0])
    cs = np.array([[0.0, 1.0, 11.0]])  # one snapshot: slot 0 at context 1, slot 1 at 10
    c_lb = lower_context(cs, (2,), 1, 2, 0.5)
    assert c_lb == 1.0
    pref = np.zeros((2, 2, 2))
    pref[..., 1:] = np.cumsum(lower_tables(np.moveaxis(at, 2, 3), knots, c_lb), axis=2)
    kpref = np.zeros((2, 2, 2, 2))
    kpref[..., 1:] = np.cumsum(at, axis=3)
    inst = dict(stage_owner=np.array([0]), stage_start=np.array([0]), stage_end=np.array([1]),
                payload=np.zeros(1), k=1, pref=pref, wpref=np.zeros((2, 2)), kvpref=np.zeros((2, 2)),
                cfg_tp=np.array([1, 1]), cfg_price=np.array([1.0, 1.0]), cfg_mem=np.array([10.0, 10.0]),
                cfg_ws=np.zeros(2), cfg_ok=np.ones((1, 2), bool), cfg_gpu=np.array([0, 0]),
                cfg_node=np.array([8, 8]), cfg_intra_bw=np.array([4.0, 4.0]), intra_lat=0.0,
                mb_index=np.array([-1, 0, 1]), batches=np.array([2]), max_mu=1, max_rep=2, max_gpus=8.0,
                bw=1.0, lat=0.0, slo=5.0, units=np.arange(3.0), kvcpref=np.zeros((2, 2)), knots=knots,
                kpref=kpref, scen_cs=cs, pct=0.5, theta=5.5, knot_free=knot_free(list(at), 2))
    assert not inst["knot_free"][0, 1]
    best, _feasible = workload_brute_force(inst)
    assert best == (2.0, 1.0, (2, 1, ((0, 1),)))  # A, one replica of b = 2: mean 4 x rate 1/2
    got = run_kernel(inst, True, True, problem=workload_problem(inst))
    assert (got["cost"], got["ident"]) == (2.0, (2, 1, ((0, 1),)))
    wrong = workload_problem({**inst, "knot_free": np.ones((2, 2), bool)})
    assert run_kernel(inst, True, False, problem=wrong)["ident"] != got["ident"]  # the check is live
