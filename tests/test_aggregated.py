"""The aggregated deployment: mixed-step physics against the decode and prefill models, the
step-level replay against a plain-Python scheduler, the search against a brute force, and the
invariants (a looser SLO never costs more; the two-mode choice is never dearer than one mode)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opweave_planner import aggregated as agg
from opweave_planner import api
from opweave_planner.errors import UserError
from opweave_planner.inputs.model import load_model
from opweave_planner.latency import mixed
from opweave_planner.latency.lookup import Parallel, op_latencies
from opweave_planner.latency.mixed import StepTables, mixed_step_us, replay_replica, step_tables
from opweave_planner.latency.prefill import chunk_schedule, prefill
from opweave_planner.structure.operators import build_sequence


@pytest.fixture(scope="module")
def h100():
    return api.gpu_catalog().resolve("h100", "--gpus")


@pytest.mark.parametrize("model, tp, ctx", [("qwen3-30b-a3b", 2, 8704), ("llama-3.1-8b", 1, 4096)])
def test_a_pure_decode_step_is_the_decode_tables_sum(h100, model, tp, ctx):
    seq = build_sequence(load_model(model))
    tab = step_tables(seq, h100, tp, ctx, 128, 1024, 2048)
    assert tab.knots[-1] == ctx and tab.knots.size == mixed.CONTEXT_KNOTS
    for b in (1, 7, 64, 128):
        want = op_latencies(seq, h100, Parallel(tp, False), ctx, (b,)).lat_us[:, 0].sum()
        assert tab.decode_step_us(b) == pytest.approx(want, rel=1e-12)
        assert mixed_step_us(tab, [b], [0, 0], [], [], [])[0] == pytest.approx(want, rel=1e-12)
        for k in tab.knots:  # at every knot: the decode tables at that context, exactly
            want = op_latencies(seq, h100, Parallel(tp, False), int(k), (b,)).lat_us[:, 0].sum()
            assert mixed_step_us(tab, [b], [0, 0], [], [], [], [k])[0] == pytest.approx(want, rel=1e-12)
        # between them: within 1.5 % (measured max 1.0 % for llama-3.1-8b, 0.5 % for qwen3-30b-a3b TP2, 8,704)
        for c in np.unique(np.geomspace(tab.knots[0], ctx, 23).round()):
            want = op_latencies(seq, h100, Parallel(tp, False), int(c), (b,)).lat_us[:, 0].sum()
            assert tab.decode_step_us(b, c) == pytest.approx(want, rel=0.015)


def test_decode_attention_grows_with_the_residents_context(h100):
    seq = build_sequence(load_model("llama-3.1-8b"))
    tab = step_tables(seq, h100, 1, 8704, 64, 1024, 2048)
    got = mixed_step_us(tab, [64] * 6, [0] * 7, [], [], [], [10, 64, 700, 3000, 8704, 20000])
    assert np.all(np.diff(got) >= 0) and got[-1] > 1.5 * got[1]
    assert got[0] == got[1] and got[-1] == got[-2]  # clipped to the first and last knot


@pytest.mark.parametrize("prompt, chunk", [(3000, 1024), (2048, 2048), (700, 512)])
def test_a_prompt_alone_takes_the_prefill_models_time(h100, prompt, chunk):
    seq = build_sequence(load_model("qwen3-30b-a3b"))
    tab = step_tables(seq, h100, 2, 4096, 64, 2048, 4096)
    steps = chunk_schedule(prompt, 1, chunk)
    segs = [seg for step in steps for seg in step]
    ptr = np.cumsum([0] + [len(step) for step in steps])
    got = mixed_step_us(tab, [0] * len(steps), ptr, [s[0] for s in segs], [s[1] for s in segs], [s[2] for s in segs])
    want = prefill(seq, h100, 2, prompt, chunk_tokens=chunk).prefill_ms
    assert got.sum() / 1e3 == pytest.approx(want, rel=1e-9)
    # the replay of that one request: TTFT is those steps
    r = replay_replica(tab, [0.0], [prompt], [1], 8, chunk)
    assert r.ttft_s[0] == pytest.approx(want / 1e3, rel=1e-9)


def test_a_mixed_step_costs_more_than_either_part(h100):
    seq = build_sequence(load_model("qwen3-30b-a3b"))
    tab = step_tables(seq, h100, 2, 8704, 64, 2048, 8192)
    pure = tab.decode_step_us(64)
    chunk = mixed_step_us(tab, [0], [0, 1], [1984], [4096], [False])[0]
    mixed = mixed_step_us(tab, [64], [0, 1], [1984], [4096], [False])[0]
    assert mixed > pure and mixed > chunk and mixed < pure + chunk  # the GEMMs share their weight reads


def test_bad_step_arrays_are_refused(h100):
    seq = build_sequence(load_model("llama-3.1-8b"))
    tab = step_tables(seq, h100, 1, 1024, 8, 64, 128)
    with pytest.raises(ValueError):
        mixed_step_us(tab, [9], [0, 0], [], [], [])  # more decodes than tabulated
    with pytest.raises(ValueError):
        mixed_step_us(tab, [1], [0, 1], [64], [0], [True])  # 65 tokens > 64
    with pytest.raises(ValueError):
        replay_replica(tab, [0.0], [200], [1], 8, 64)  # prompt beyond the tables


# ----------------------------------------------------------------------------- synthetic tables

def _tables(rng, max_batch=8, max_tokens=24, max_prompt=40) -> StepTables:
    def rising(n, scale):
        out = np.zeros(n + 1)
        out[1:] = np.cumsum(rng.uniform(0.2, 1.0, n)) * scale + 50 * scale
        return out

    pass_us = np.zeros((2, max_prompt + 1))
    pass_us[:, 1:] = np.cumsum(np.cumsum(rng.uniform(0.01, 0.1, (2, max_prompt)), axis=1), axis=1) * 100
    knots = np.array([4.0, 16.0, 64.0])
    dattn = np.stack([rising(max_batch, 100.0 * (1 + j)) for j in range(knots.size)])  # rising in context too
    return StepTables("h100", 1, 64, rising(max_tokens, 100.0), rising(max_tokens, 30.0), dattn,
                      pass_us, np.array([2.0, 1.0]), np.array([False, bool(rng.integers(2))]), knots)


def _reference(tab, arrivals, prompts, outputs, max_batch, chunk, until=math.inf):
    """The scheduler in plain Python, step times from the public step function."""
    n = len(arrivals)
    ttft, rem, decoding = [0.0] * n, [0] * n, []
    t, admitted, finished, partial = 0.0, 0, 0, None  # partial: [request, tokens done]
    steps = []
    while finished < n:
        arrived = sum(1 for a in arrivals if a <= t)
        if not decoding and partial is None and admitted == arrived:
            t = arrivals[admitted]
            continue
        d, budget = len(decoding), chunk - len(decoding)
        resident = d + (partial is not None)
        segs, ended = [], []
        if partial is None and budget > 0 and admitted < arrived and resident < max_batch:
            partial, admitted, resident = [admitted, 0], admitted + 1, resident + 1
        while partial is not None and budget > 0:
            r, done = partial
            take = min(prompts[r] - done, budget)
            segs.append((take, done, done + take == prompts[r]))
            budget -= take
            if done + take == prompts[r]:
                ended.append(r)
                partial = None
                if budget > 0 and admitted < arrived and resident < max_batch:
                    partial, admitted, resident = [admitted, 0], admitted + 1, resident + 1
            else:
                partial = [r, done + take]
        ctx = [prompts[r] + outputs[r] - rem[r] for r in decoding]  # prompt + tokens generated so far
        dur = mixed_step_us(tab, [d], [0, len(segs)], [s[0] for s in segs], [s[1] for s in segs],
                            [s[2] for s in segs], [sum(ctx) / d if d else 0.0])[0] * 1e-6
        if d and t <= until:
            steps.append((dur, d, bool(segs)))
        t += dur
        for r in list(decoding):
            rem[r] -= 1
            if rem[r] == 0:
                finished += 1
                decoding.remove(r)
        for r in ended:
            ttft[r] = t - arrivals[r]
            rem[r] = outputs[r] - 1
            if rem[r] == 0:
                finished += 1
            else:
                decoding.append(r)
    return ttft, steps


_instance = st.fixed_dictionaries({
    "seed": st.integers(0, 2**32 - 1),
    "n": st.integers(1, 25),
    "rate": st.floats(5.0, 400.0),
    "max_batch": st.integers(1, 8),
    "chunk": st.integers(8, 24),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_instance)
def test_the_replay_kernel_is_the_plain_scheduler(case):
    rng = np.random.default_rng(case["seed"])
    tab = _tables(rng)
    chunk = max(case["chunk"], case["max_batch"])
    arrivals = np.cumsum(rng.exponential(1 / case["rate"], case["n"]))
    prompts = rng.integers(1, 41, case["n"])
    outputs = rng.integers(1, 8, case["n"])
    until = float(arrivals[-1])
    got = replay_replica(tab, arrivals, prompts, outputs, case["max_batch"], chunk, until)
    ttft, steps = _reference(tab, list(arrivals), list(prompts), list(outputs), case["max_batch"], chunk, until)
    np.testing.assert_allclose(got.ttft_s, ttft, rtol=1e-12, atol=1e-15)
    assert len(steps) == got.step_s.size
    if steps:
        np.testing.assert_allclose(got.step_s, [s[0] for s in steps], rtol=1e-12)
        assert list(got.step_decodes) == [s[1] for s in steps] and list(got.step_mixed) == [s[2] for s in steps]
    assert np.all(got.ttft_s > 0)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.001, 1.0), min_size=1, max_size=30), st.integers(0, 2**31), st.floats(1, 100))
def test_weighted_percentile_is_the_token_percentile(values, seed, q):
    v = np.array(values)
    w = np.random.default_rng(seed).integers(1, 6, v.size)
    want = np.percentile(np.repeat(v, w), q, method="inverted_cdf")
    assert agg.weighted_percentile(v, w, q) == want
    rep = agg._Replayed(1, np.zeros(1), v, w, np.zeros(v.size, bool))
    for slo in (want, np.nextafter(want, 0)):  # meets() without a sort says the same
        assert rep.meets(slo, 1.0, q, 95) == (want <= slo)


def _search_case(case):
    rng = np.random.default_rng(case["seed"])
    tabs = [_tables(rng) for _ in range(2)]
    tabs[1] = StepTables("h100", 2, 64, tabs[1].linear_us * 0.6, tabs[1].head_us * 0.6,
                         tabs[1].decode_attention_us * 0.6, tabs[1].pass_us * 0.6, tabs[1].count, tabs[1].recurrent,
                         tabs[1].knots)
    cands = [agg.Candidate(t, b, c, 3.0 * t.tp) for t in tabs for b in (2, 4, 8) for c in (8, 16, 24) if c >= b]
    n = case["n"]
    times = np.cumsum(rng.exponential(1 / case["rate"], n))
    prompts = rng.integers(1, 41, n)
    outputs = rng.integers(1, case["out"] + 1, n)  # each request its own output
    return cands, times, prompts, outputs, n / float(times[-1])


def _brute(cands, times, prompts, outputs, rate, slo, ttft, max_gpus):
    best = None
    for c in cands:
        for r in range(1, max_gpus // c.tp + 1):
            if r < agg.stable_replicas(c, rate, float(outputs.mean()), agg.load_context(prompts, outputs)):
                continue
            if agg._replayed(c, times, prompts, outputs, r).meets(slo, ttft, 95.0, 90.0) and (
                    best is None or c.key(r) < best):
                best = c.key(r)
    return best


_search = st.fixed_dictionaries({
    "seed": st.integers(0, 2**32 - 1),
    "n": st.integers(4, 30),
    "rate": st.floats(5.0, 400.0),
    "out": st.integers(1, 6),
    "slo_ms": st.floats(12.0, 40.0),  # the synthetic steps take about 17-25 ms
    "ttft_ms": st.floats(10.0, 300.0),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_search)
def test_the_search_is_the_brute_force(case):
    cands, times, prompts, outputs, rate = _search_case(case)
    slo, ttft = case["slo_ms"] / 1e3, case["ttft_ms"] / 1e3
    got = agg.choose(cands, times, prompts, outputs, rate, float(outputs.mean()), slo, ttft, 95.0, 90.0, max_gpus=12)
    want = _brute(cands, times, prompts, outputs, rate, slo, ttft, 12)
    assert (None if got is None else got.candidate.key(got.figures.replicas)) == want
    if got is not None:
        assert got.figures.tpot_s <= slo and got.figures.ttft_s <= ttft
        # looser SLOs never cost more
        for looser in ((slo * 1.5, ttft), (slo, ttft * 1.5)):
            loose = agg.choose(cands, times, prompts, outputs, rate, float(outputs.mean()), *looser, 95.0, 90.0,
                               max_gpus=12)
            assert loose is not None and loose.usd_per_hour <= got.usd_per_hour


def _scan_every_candidate(cands, times, prompts, outputs, rate, slo, ttft, max_gpus, closest):
    """The scan before the best-first search: each candidate's R from its floor upward
    (`least_replicas`), cheapest floor first, skipping what cannot beat the best so far."""
    best = None
    closest.candidates += len(cands)
    alone: dict = {}
    mean_out, ctx = float(outputs.mean()), agg.load_context(prompts, outputs)
    floors = [(c.key(agg.stable_replicas(c, rate, mean_out, ctx)), i) for i, c in enumerate(cands)]
    for floor, i in sorted(floors):
        cand = cands[i]
        if best is not None and floor > best[0]:
            continue
        top = max_gpus // cand.tp
        if best is not None:
            while top >= 1 and cand.key(top) > best[0]:
                top -= 1
        fig = agg.least_replicas(cand, times, prompts, outputs, rate, mean_out, slo, ttft, 95.0, 90.0, top, closest,
                                 alone)
        if fig is not None and (best is None or cand.key(fig.replicas) < best[0]):
            best = (cand.key(fig.replicas), agg.Choice(cand, fig))
    return None if best is None else best[1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_search)
def test_the_best_first_search_is_the_scan_of_every_candidate(case):
    """Same choice, same figures (the binding of R - 1 included), never more replays; where
    nothing is found, the same replays (so the same reason)."""
    cands, times, prompts, outputs, rate = _search_case(case)
    slo, ttft = case["slo_ms"] / 1e3, case["ttft_ms"] / 1e3
    fast, slow = agg.Closest(), agg.Closest()
    got = agg.choose(cands, times, prompts, outputs, rate, float(outputs.mean()), slo, ttft, 95.0, 90.0,
                     max_gpus=12, closest=fast)
    want = _scan_every_candidate(cands, times, prompts, outputs, rate, slo, ttft, 12, slow)
    assert (got is None) == (want is None)
    assert fast.replays <= slow.replays
    if got is None:
        assert fast == slow
    else:
        assert got.candidate is want.candidate and got.figures == want.figures


# ----------------------------------------------------------------------------- a whole request

BASE = dict(model="llama-3.1-8b", slo="60ms", ctx="8704", gpus="h100", tensor_parallel_sizes="1,2",
            batches="8,16,32,64", policy="colocated", prompt_len="7680", output_len="1024", ttft="1s",
            request_rate=8)


@pytest.fixture(scope="module")
def auto_plan():
    req = api.make_request(**BASE)
    return req, api.plan(req).plan


def test_both_modes_are_searched_and_the_cheaper_is_chosen(auto_plan):
    from opweave_planner import report
    from opweave_planner.contract import recorded_request

    _req, doc = auto_plan
    dep = doc.deployment
    a = dep.aggregated
    assert doc.schema_version == "1.11" and dep.deployment_mode == "auto" and a is not None
    disagg = dep.usd_per_hour_all_in
    chosen = a.usd_per_hour if dep.mode == "aggregated" else disagg
    assert chosen <= a.usd_per_hour and chosen <= disagg  # one mode alone never beats the choice
    assert a.tpot_ms <= 60 and a.ttft_ms <= 1000 and a.gpus == a.replicas * a.tensor_parallel
    assert a.batch <= a.chunk_tokens and 0 < a.mixed_step_share <= 1
    assert a.tpot_ms >= a.decode_step_ms * 0.5  # the percentile sees the mixed steps, not below a light step
    line = report.deployment_mode_line(doc)
    assert f"{a.usd_per_hour:,.2f} USD/h" in line and f"{disagg:,.2f} USD/h" in line and "breaks" in line
    assert recorded_request(doc).deployment_mode == "auto"


def test_aggregated_forced_is_never_cheaper_than_auto(auto_plan):
    req, doc = auto_plan
    from opweave_planner.compile import compile_request

    forced_req = req.model_copy(update={"deployment_mode": "aggregated"})
    from opweave_planner.deployment import replayed_arrivals

    compiled = compile_request(forced_req, api.gpu_catalog())
    forced = agg.with_aggregated(doc, forced_req, api.gpu_catalog(), compiled.seq,
                                 replayed_arrivals(doc, forced_req, compiled))
    dep = forced.deployment
    assert dep.mode == "aggregated" and dep.deployment_mode == "aggregated"
    auto = doc.deployment
    auto_cost = auto.aggregated.usd_per_hour if auto.mode == "aggregated" else auto.usd_per_hour_all_in
    assert dep.aggregated.usd_per_hour >= auto_cost
    assert dep.aggregated == auto.aggregated  # the same search; only the choice differs


def test_one_replica_fewer_breaks_what_binding_names(auto_plan):
    req, doc = auto_plan
    a = doc.deployment.aggregated
    assert a.binding in ("throughput", "tpot", "ttft")
    if a.binding != "throughput":
        from opweave_planner.compile import compile_request
        from opweave_planner.deployment import replayed_arrivals

        arr, _rate, mean_out = replayed_arrivals(doc, req, compile_request(req, api.gpu_catalog()))
        cand = next(c for c in agg.candidates(req, build_sequence(load_model(req.model)), api.gpu_catalog(),
                                              doc.workload.context_tokens, int(arr.prompts.max()))
                    if (c.gpu, c.tp, c.batch, c.chunk) == (a.gpu, a.tensor_parallel, a.batch, a.chunk_tokens))
        out = np.full(arr.prompts.shape, round(mean_out))
        fewer = agg.figures(cand, arr.times_s, arr.prompts, out, a.replicas - 1, a.tpot_percentile, 95.0)
        if a.binding == "tpot":
            assert fewer.tpot_s * 1e3 > 60
        else:
            assert fewer.ttft_s * 1e3 > 1000 and fewer.tpot_s * 1e3 <= 60


@pytest.mark.parametrize("arrivals", [dict(arrivals="trace", rate_scale=40), dict(request_rate=20)])
def test_each_arrival_carries_its_own_output(arrivals):
    """Trace arrivals: each row's own output; Poisson: the drawn request's (prompt, output) pair."""
    from opweave_planner.compile import compile_request
    from opweave_planner.deployment import replayed_arrivals
    from opweave_planner.workload.reader import read_trace

    path = str(Path(__file__).parent.parent / "examples" / "traces" / "azure-conv-sample.csv")
    req = api.make_request(model="llama-3.1-8b", slo="60ms", workload=path, gpus="h100", policy="colocated",
                           ttft="1s", **arrivals)
    doc = api.plan(req).plan
    compiled = compile_request(req, api.gpu_catalog())
    arr, _rate, _mean = replayed_arrivals(doc, req, compiled)
    rows = read_trace(path)
    assert arr.outputs is not None and arr.outputs.shape == arr.prompts.shape
    if "arrivals" in arrivals:
        assert np.array_equal(arr.outputs, rows.output[arr.rows])
        assert np.array_equal(arr.prompts, np.minimum(rows.prompt[arr.rows], doc.workload.window - 1))
    else:
        wl = compiled.workload
        assert np.array_equal(arr.outputs, wl.output[arr.rows]) and np.array_equal(arr.prompts, wl.prompt[arr.rows])
    assert len(set(arr.outputs.tolist())) > 10  # not one mean for all


def test_the_1_10_files_replan_in_the_disaggregated_mode_only():
    from pathlib import Path

    from opweave_planner.contract import read_plan, recorded_request

    g = read_plan(Path(__file__).parent / "golden" / "llama-3.1-8b_colocated_h100-isl7680-osl1024-ttft1s-rate8_v1.10.json")
    assert recorded_request(g).deployment_mode == "disaggregated"


@pytest.mark.parametrize("values, words", [
    (dict(deployment_mode="mixed"), "--deployment-mode: 'mixed' unknown"),
    (dict(ttft=None, request_rate=None, deployment_mode="aggregated"), "only applies with --ttft"),
])
def test_bad_deployment_modes_fail_in_one_line(values, words):
    with pytest.raises(UserError) as exc:
        api.make_request(**{**BASE, **values})
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_trace_arrivals_under_a_prompt_scale_keep_their_rows_and_outputs():
    """--scale-ctx rescales the trace's prompts; the arrivals must keep their rows so each output
    pairs with its request (they were dropped: a (1, n) outputs array, a traceback in the
    aggregated replay)."""
    from opweave_planner.compile import compile_request
    from opweave_planner.deployment import replayed_arrivals
    from opweave_planner.workload.reader import read_trace

    path = str(Path(__file__).parent.parent / "examples" / "traces" / "azure-conv-sample.csv")
    req = api.make_request(model="llama-3.1-8b", slo="60ms", workload=path, gpus="h100", policy="colocated",
                           ttft="1s", arrivals="trace", rate_scale=40, scale_ctx="2k")
    doc = api.plan(req).plan
    assert doc.deployment.mode in ("aggregated", "disaggregated")
    compiled = compile_request(req, api.gpu_catalog())
    assert compiled.workload.scale != 1.0
    arr, _rate, _mean = replayed_arrivals(doc, req, compiled)
    assert arr.rows is not None and arr.outputs.shape == arr.prompts.shape
    assert np.array_equal(arr.outputs, np.maximum(read_trace(path).output, 1)[arr.rows])


# ----------------------------------------------------------------------------- the scan's two bounds

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_search)
def test_the_ttft_floor_is_below_every_replay_and_isolation_ends_the_scan(case):
    """`ttft_floor` never exceeds a replayed TTFT percentile, at any R; from `isolated_replicas`
    on, every R replays the same figures (so a scan may stop there)."""
    cands, times, prompts, outputs, _rate = _search_case(case)
    for cand in cands[::3]:
        iso = agg.isolated_replicas(cand, times, prompts, outputs)
        assert 1 <= iso <= times.size
        ref = agg._replayed(cand, times, prompts, outputs, iso).figures(95.0, 90.0)
        for r in sorted({1, 2, max(iso - 1, 1), iso, iso + 1, iso + 3, times.size + 2}):
            got = agg._replayed(cand, times, prompts, outputs, r)
            assert agg.ttft_floor(cand, prompts, 90.0) <= got.ttft_percentile(90.0) * (1 + 1e-12)
            if r >= iso:
                fig = got.figures(95.0, 90.0)
                assert fig.ttft_s == pytest.approx(ref.ttft_s, rel=1e-9)
                assert fig.tpot_s == pytest.approx(ref.tpot_s, rel=1e-9)
                assert fig.tpot_mean_s == pytest.approx(ref.tpot_mean_s, rel=1e-9)


def test_the_binding_comes_from_the_replay_that_refused_one_replica_fewer():
    rng = np.random.default_rng(7)
    cands, times, prompts, outputs, rate = _search_case({"seed": 7, "n": 30, "rate": 300.0, "out": 6})
    for cand in cands:
        fig = agg.least_replicas(cand, times, prompts, outputs, rate, float(outputs.mean()), 0.03, 0.15, 95.0, 90.0,
                                 12)
        if fig is None:
            continue
        floor = agg.stable_replicas(cand, rate, float(outputs.mean()), agg.load_context(prompts, outputs))
        if fig.replicas == floor:
            assert fig.binding == "throughput"
        else:
            fewer = agg._replayed(cand, times, prompts, outputs, fig.replicas - 1)
            assert not fewer.meets(0.03, 0.15, 95.0, 90.0)
            assert fig.binding == ("ttft" if fewer.tpot_met(0.03, 95.0) else "tpot")
    del rng


def test_a_search_that_finds_nothing_says_what_binds():
    cands, times, prompts, outputs, rate = _search_case({"seed": 3, "n": 12, "rate": 50.0, "out": 4})
    closest = agg.Closest()
    assert agg.choose(cands, times, prompts, outputs, rate, float(outputs.mean()), 0.03, 1e-4, 95.0, 90.0,
                      max_gpus=12, closest=closest) is None
    assert closest.replays == 0 and closest.reason(0.03, 1e-4, 95.0, 90.0, 12).startswith("ttft: ")
    closest = agg.Closest()
    assert agg.choose(cands, times, prompts, outputs, rate, float(outputs.mean()), 1e-4, 10.0, 95.0, 90.0,
                      max_gpus=12, closest=closest) is None
    assert closest.replays > 0 and closest.reason(1e-4, 10.0, 95.0, 90.0, 12).startswith("tpot: ")


# ----------------------------------------------------------------------------- only aggregated meets the TTFT

# a 1 GB/s link between the pools: a 7,680-token prompt's KV (1 GB for llama-3.1-8b) takes about
# 1 s to hand off, so no prefill pool meets a 1 s TTFT; the aggregated replicas hand nothing off
SLOW = dict(BASE, network_bandwidth="1GB/s")


def _cost(dep) -> float:
    return dep.aggregated.usd_per_hour if dep.mode == "aggregated" else dep.usd_per_hour_all_in


@pytest.fixture(scope="module")
def slow_auto():
    return api.plan(api.make_request(**SLOW)).plan


def test_auto_picks_aggregated_where_no_prefill_pool_meets_the_ttft(slow_auto):
    import orjson

    from opweave_planner.contract import parse_plan, recorded_request
    from opweave_planner.plan import plan_bytes

    doc = slow_auto
    dep = doc.deployment
    assert doc.schema_version == "1.14" and dep.mode == "aggregated" and dep.deployment_mode == "auto"
    assert dep.prefill is None and dep.usd_per_hour_all_in is None and dep.arrivals.rate == 8
    miss = dep.disaggregated_infeasible
    assert miss.binding == "ttft" and miss.lowest_ttft_ms > 1000 and miss.handoff_mean_ms > 900
    assert "hand-off" in miss.reason
    a = dep.aggregated
    assert a.ttft_ms <= 1000 and a.tpot_ms <= 60 and a.ttft_slo_ms == 1000 and a.ttft_percentile == 95
    back = parse_plan(orjson.loads(plan_bytes(doc)), "p.json")
    assert back.deployment == dep
    req = recorded_request(doc)
    assert (req.ttft, req.ttft_at, req.deployment_mode) == (1000, 95, "auto")
    bad = orjson.loads(plan_bytes(doc))
    del bad["deployment"]["disaggregated_infeasible"]
    with pytest.raises(UserError, match="disaggregated_infeasible"):
        parse_plan(bad, "p.json")


def test_forced_disaggregated_refuses_with_the_reason():
    with pytest.raises(UserError) as exc:
        api.plan(api.make_request(**SLOW, deployment_mode="disaggregated"))
    msg = str(exc.value)
    assert msg.startswith("--ttft: no prefill pool") and "hand-off" in msg and "\n" not in msg


def test_forced_aggregated_plans_no_prefill_pool_and_never_beats_auto(slow_auto, monkeypatch):
    from opweave_planner import deployment

    def boom(*a, **kw):
        raise AssertionError("--deployment-mode aggregated planned a prefill pool")

    monkeypatch.setattr(deployment, "prefill_pool", boom)
    doc = api.plan(api.make_request(**SLOW, deployment_mode="aggregated")).plan
    dep = doc.deployment
    assert dep.mode == "aggregated" and dep.deployment_mode == "aggregated" and dep.prefill is None
    assert dep.disaggregated_infeasible is None and doc.schema_version == "1.14"
    assert dep.aggregated.usd_per_hour >= _cost(slow_auto.deployment)
    assert dep.aggregated.model_dump(exclude={"ttft_slo_ms", "ttft_percentile"}) == \
        slow_auto.deployment.aggregated.model_dump(exclude={"ttft_slo_ms", "ttft_percentile"})


def test_a_looser_ttft_never_costs_more(slow_auto):
    loose = api.plan(api.make_request(**{**SLOW, "ttft": "2s"})).plan.deployment
    assert _cost(loose) <= _cost(slow_auto.deployment)


def test_neither_mode_names_both_binding_constraints():
    with pytest.raises(UserError) as exc:
        api.plan(api.make_request(**{**SLOW, "ttft": "100ms"}))
    msg = str(exc.value)
    assert msg.startswith("--ttft: neither deployment mode meets the SLOs") and "\n" not in msg
    assert "disaggregated: no prefill pool" in msg and "hand-off" in msg
    assert "aggregated: no aggregated deployment" in msg and "(ttft: " in msg


def test_tpot_is_held_at_the_plans_step_percentile_whatever_the_ttft_percentile(monkeypatch):
    """A fixed --ctx's `percentile` is 100 (its decode steps are all equal); the aggregated
    replicas hold step TPOT at p95, the method's step percentile, with --ttft-percentile 99 too."""
    req = api.make_request(**SLOW, ttft_percentile=99)
    assert req.percentile == 100 and req.ttft_at == 99 and agg.tpot_percentile(req) == 95
    seen = []
    real = agg.choose

    def spy(*args, **kw):
        seen.append(args[8:10])
        return real(*args, **kw)

    monkeypatch.setattr(agg, "choose", spy)
    doc = api.plan(req).plan
    a = doc.deployment.aggregated
    assert seen == [(95.0, 99.0)] and a.tpot_percentile == 95 and a.ttft_percentile == 99
    path = str(Path(__file__).parent.parent / "examples" / "traces" / "azure-conv-sample.csv")
    wl = api.make_request(model="llama-3.1-8b", slo="60ms", workload=path, gpus="h100", policy="colocated",
                          ttft="1s", request_rate=2, ttft_percentile=99, slo_percentile=90)
    assert agg.tpot_percentile(wl) == 90
