"""The batch caps (compile/space.py): the searched batch set and exactness over it.

On random small instances whose microbatch grid holds every integer (a fine batch grid):

(a) the kernel, given the one-stage template's batch set grid + caps (another template's: the
    grid), equals a plain-Python brute force over that set (tests/test_search_exact.py's harness);
(b) the caps are what docs/search.md#batches says, found by brute force over every integer
    batch with the evaluator: the largest memory-feasible batch of every (configuration, mu)
    of one whole-model replica, and its largest and cheapest SLO-feasible batch;
(c) for the one-stage template with the cost objective the search over grid + caps is as
    cheap as a brute force over *every* integer batch up to the grid's largest;
(d) loosening the SLO never raises the one-stage template's cost, its caps recomputed.

Then the two plans of issue 30 that the coarse grid missed, by default.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import test_search_exact as harness  # the brute force, the kernel runner and the instances
from hypothesis import event, given, settings
from hypothesis import strategies as st

from opweave_planner.compile.problem import memory_need, stage_time
from opweave_planner.compile.space import batch_caps, batch_set, largest_fitting
from opweave_planner.search.evaluate import evaluate, owner_need
from opweave_planner.search.state import selection

EPS = 1e-12
REL = 1e-9


@st.composite
def fine_instances(draw, one_stage=None):
    """A test_search_exact instance whose microbatch grid is every integer up to its top batch,
    latencies drawn per (config, microbatch, operator); half of them (or as asked) one-stage."""
    inst = draw(harness.instances())
    if one_stage if one_stage is not None else draw(st.booleans()):
        n_ops = inst["pref"].shape[2] - 1
        inst.update(stage_owner=np.array([0], np.int64), stage_start=np.array([0], np.int64),
                    stage_end=np.array([n_ops], np.int64), payload=np.zeros(1), k=1,
                    cfg_ok=np.ones((1, inst["cfg_tp"].size), bool))
    top = draw(st.integers(2, 16))
    grid = sorted(draw(st.sets(st.integers(1, top), min_size=1, max_size=4)) | {top})
    n_cfg, n_ops = inst["pref"].shape[0], inst["pref"].shape[2] - 1
    pref = np.zeros((n_cfg, top, n_ops + 1))
    for c in range(n_cfg):
        for m in range(top):
            pref[c, m, 1:] = np.cumsum([draw(st.integers(0, 8)) / 2 for _ in range(n_ops)])
    inst.update(pref=pref, mb_index=np.array([-1, *range(top)], np.int64), batches=np.array(grid, np.int64),
                latency_objective=draw(st.integers(0, 4)) == 0)
    return inst


def request_of(inst, slo=None):
    """What batch_caps reads of a PlanRequest, for an instance (its SLO in µs)."""
    return SimpleNamespace(batches=tuple(int(b) for b in inst["batches"]), max_microbatches=inst["max_mu"],
                           slo_ms=(inst["slo"] if slo is None else slo) / 1e3)


def caps_of(inst, slo=None):
    """The instance's caps, computed as compile/tables.searched_batches computes a request's."""
    prob = harness.problem_of(inst)
    n_ops = inst["pref"].shape[2] - 1
    w, kv, kvc = prob.wpref[:, -1], prob.kvpref[:, -1], prob.kvcpref[:, -1]

    def fits(c, mu, b):
        return memory_need(prob.units, w[c], kv[c], kvc[c], prob.cfg_ws[c], mu, b) <= prob.cfg_mem[c]

    def stream(c, top):
        return np.array([stage_time(prob.pref[c, prob.mb_index[b]], 0, n_ops, prob.cfg_stage_fixed[c])
                         for b in range(1, top + 1)])

    return batch_caps(request_of(inst, slo), inst["cfg_tp"].size, fits, stream)


def searched(inst, slo=None):
    """The instance with its searched batch set: the grid, + the caps if one-stage."""
    caps, req = caps_of(inst, slo), request_of(inst, slo)
    one_stage = inst["stage_owner"].size == 1
    batches = batch_set(req, caps.memory, caps.slo) if one_stage else req.batches
    return dict(inst, batches=np.array(batches, np.int64), **({} if slo is None else {"slo": slo}))


@settings(max_examples=160, **harness.SETTINGS)
@given(fine_instances())
def test_kernel_exact_over_grid_and_caps(inst):
    wide = searched(inst)
    event(f"{wide['batches'].size - inst['batches'].size} caps off the grid")
    best, feasible = harness.brute_force(wide)
    harness.assert_kernel_matches(wide, best, feasible)


def _colocated(inst):
    """The instance's one-stage problem (every configuration allowed): one whole-model replica."""
    n_ops = inst["pref"].shape[2] - 1
    return harness.problem_of(dict(inst, stage_owner=np.array([0], np.int64), stage_start=np.array([0], np.int64),
                           stage_end=np.array([n_ops], np.int64), payload=np.zeros(1), k=1,
                           cfg_ok=np.ones((1, inst["cfg_tp"].size), bool), latency_objective=False))


@settings(max_examples=160, **harness.SETTINGS)
@given(fine_instances())
def test_caps_are_the_largest_feasible_batches(inst):
    """By brute force over every integer microbatch with the evaluator (not the caps' formula)."""
    prob, caps, top = _colocated(inst), caps_of(inst), int(inst["batches"].max())
    slo = inst["slo"] * (1 + EPS)
    for c in range(inst["cfg_tp"].size):
        for mu in range(1, inst["max_mu"] + 1):
            fit = [b for b in range(1, top // mu + 1) if owner_need(prob, 0, c, mu, b) <= prob.cfg_mem[c]]
            assert fit == list(range(1, len(fit) + 1))  # memory is monotone in b
            if not fit:
                continue
            assert mu * fit[-1] in caps.memory
            ev = {b: evaluate(prob, selection(mu * b, mu, [c], [1], [prob.mb_index[b]])) for b in fit}
            ok = [b for b in fit if ev[b].t_rtt <= slo]
            event("SLO cap below the memory cap" if ok and ok[-1] < fit[-1] else "memory binds or nothing meets SLO")
            if not ok:
                continue
            assert mu * ok[-1] in caps.slo
            least = min(ev[b].cost for b in ok)
            cheapest = max(b for b in ok if math.isclose(ev[b].cost, least, rel_tol=REL, abs_tol=1e-12))
            assert any(math.isclose(ev[cap // mu].cost, least, rel_tol=REL, abs_tol=1e-12) for cap in caps.slo
                       if cap % mu == 0 and cap // mu in ev), (cheapest, sorted(caps.slo))


@settings(max_examples=160, **harness.SETTINGS)
@given(fine_instances(one_stage=True))
def test_one_stage_search_as_cheap_as_every_integer_batch(inst):
    inst = dict(inst, latency_objective=False)
    every = dict(inst, batches=np.arange(1, int(inst["batches"].max()) + 1, dtype=np.int64))
    best, _ = harness.brute_force(every)
    got = harness.run_kernel(searched(inst), True, True)
    assert (got is None) == (best is None), (got, best)
    if best is not None:
        grid = harness.run_kernel(inst, True, True)
        event("a cap beats the grid" if grid is None or grid["cost"] > got["cost"] * (1 + REL) else "the grid's optimum")
        assert math.isclose(got["cost"], best[0], rel_tol=REL, abs_tol=1e-12), (got, best)


@settings(max_examples=100, **harness.SETTINGS)
@given(fine_instances(one_stage=True), st.integers(0, 120))
def test_loosening_the_slo_never_raises_cost_with_caps(inst, extra):
    inst = dict(inst, latency_objective=False)
    tight = harness.run_kernel(searched(inst), True, True)
    loose = harness.run_kernel(searched(inst, inst["slo"] + extra / 2), True, True)
    if tight is not None:
        assert loose is not None and loose["cost"] <= tight["cost"] * (1 + REL), (tight, loose)


# ---------------------------------------------------------------------------- issue 30's two plans

def _plan(model, slo, ctx, **values):
    from opweave_planner import api

    out = api.plan(api.make_request(model, slo, ctx, **values))
    assert out.plan is not None, out
    return out.plan


def test_issue_30_plans_take_the_batch_the_grid_missed():
    """qwen3-32b on H100 at 8k/30 ms stopped at B = 192 where B = 224 (TP8) fits and is cheaper;
    llama-3.1-70b on H200 at 32k/60 ms at B = 64 where B = 80 is. By default, now no dearer than
    either, and cheaper than the grid's plan re-planned at its own batch."""
    q = _plan("qwen3-32b", "30ms", "8k", gpus="h100")
    q192 = _plan("qwen3-32b", "30ms", "8k", gpus="h100", tensor_parallel_sizes=(8,), batches=(192,), policy="colocated")
    q224 = _plan("qwen3-32b", "30ms", "8k", gpus="h100", tensor_parallel_sizes=(8,), batches=(224,), policy="colocated")
    assert q.usd_per_million_tokens <= q224.usd_per_million_tokens < q192.usd_per_million_tokens
    assert q.global_batch not in q.search.space.batches  # a cap, off the grid
    ll = _plan("llama-3.1-70b", "60ms", "32k", gpus="h200")
    l64 = _plan("llama-3.1-70b", "60ms", "32k", gpus="h200", tensor_parallel_sizes=(8,), batches=(64,), policy="colocated")
    l80 = _plan("llama-3.1-70b", "60ms", "32k", gpus="h200", tensor_parallel_sizes=(8,), batches=(80,), policy="colocated")
    assert ll.usd_per_million_tokens <= l80.usd_per_million_tokens < l64.usd_per_million_tokens
    assert ll.global_batch not in ll.search.space.batches
    # --no-batch-caps searches the grid alone: the plan the issue found, recorded as such (1.12)
    grid = _plan("llama-3.1-70b", "60ms", "32k", gpus="h200", batch_caps=False)
    assert grid.global_batch == 64 and grid.usd_per_million_tokens == l64.usd_per_million_tokens
    assert grid.search.space.batch_caps is False and grid.schema_version == "1.12"
    assert ll.search.space.batch_caps is None


@settings(max_examples=400, **harness.SETTINGS)
@given(st.integers(0, 300), st.integers(0, 300), st.one_of(st.none(), st.integers(-5, 320)))
def test_a_guess_only_changes_which_batches_are_probed(top, last, guess):
    """largest_fitting with any guess returns what bisection alone does, for every monotone fits."""
    probes = []

    def fits(b):
        assert 1 <= b <= top  # never probes outside [1, hi]
        probes.append(b)
        return b <= last

    got = largest_fitting(fits, top, guess)
    assert got == min(last, top)
    if guess is not None and 1 < guess <= top and guess == got < top:
        assert len(probes) == 3  # fits(1), the guess, the one past it
