"""The search stays exact under the workload objective (percentile TPOT, mean-TPOT cost).

Random small instances of `tests/test_search_exact.py` get a workload: a few context
knots with nondecreasing per-operator latencies, seeded scenarios of per-slot contexts, a
KV reserve per resident count, and the branch-and-bound tables built by the shipped rule
(`search.traffic.lower_tables` at `search.traffic.lower_context`). The kernel (every
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

from opweave_planner.schedule.reference import simulate_rtt as ref_simulate_rtt
from opweave_planner.search.evaluate import evaluate, order_index
from opweave_planner.search.traffic import lower_context, lower_tables


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
    inst.update(pref=pref, knots=knots, kpref=kpref, scen_cs=cs, pct=pct, units=units, kvcpref=kvcpref,
                theta=float(ctx.mean()), c_lb=c_lb)
    return inst


def workload_problem(inst):
    p = problem_of(inst)
    return p._replace(units=inst["units"], kvcpref=inst["kvcpref"], knots=inst["knots"], kpref=inst["kpref"],
                      scen_cs=inst["scen_cs"], pct=inst["pct"], theta=inst["theta"])


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
