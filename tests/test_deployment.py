"""The disaggregated deployment (issue 27): the prefill pool is the exact minimum over its
enumeration, a looser TTFT never costs more, the plan records both pools, and bad settings fail
in one line."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opweave_planner import api
from opweave_planner.deployment import PoolOption, choose_pool, least_instances, stable_instances
from opweave_planner.errors import UserError
from opweave_planner.latency.ttft import replay, ttft_stats
from opweave_planner.workload.arrivals import Arrivals, poisson

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def instances(draw):
    """Small random pools: arrivals, 1-3 (GPU, TP) options with per-request times, a TTFT."""
    n = draw(st.integers(20, 150))
    rate = draw(st.floats(0.5, 40.0))
    seed = draw(st.integers(0, 1000))
    arr = poisson(rate, n, 100, seed)
    rng = np.random.default_rng(seed)
    options = []
    for k in range(draw(st.integers(1, 3))):
        tp = draw(st.sampled_from((1, 2, 4)))
        mean = draw(st.floats(0.01, 1.0))
        service = rng.gamma(draw(st.floats(0.5, 8.0)), 1.0, n)
        service = service / service.mean() * mean
        handoff = np.full(n, draw(st.floats(0.0, 0.05)))
        price = draw(st.floats(0.5, 5.0)) * tp
        options.append(PoolOption(f"g{k}", tp, price, service, handoff))
    ttft = draw(st.floats(0.05, 3.0))
    pct = draw(st.sampled_from((50.0, 90.0, 95.0, 99.0)))
    return arr.times_s, options, ttft, pct


def _brute(times, options, ttft, pct, max_gpus):
    """Every stable (option, N) with N x TP <= max_gpus (utilisation rate x mean prefill / N < 1
    at the replay's rate): the cheapest that meets the SLO."""
    rate = (times.size - 1) / (times[-1] - times[0])
    best = None
    for opt in options:
        for n in range(1, max_gpus // opt.tp + 1):
            if rate * opt.service_s.mean() / n >= 1.0:
                continue
            s = ttft_stats(times, opt.service_s, n, opt.handoff_s, pct)
            if s.percentile_s <= ttft:
                key = (n * opt.usd_per_hour, n * opt.tp, opt.gpu, opt.tp)
                best = key if best is None or key < best else best
    return best


@settings(max_examples=60, **SETTINGS)
@given(instances(), st.integers(1, 24))
def test_pool_is_the_brute_force_minimum(inst, max_gpus):
    times, options, ttft, pct = inst
    got = choose_pool(times, options, ttft, pct, max_gpus)
    want = _brute(times, options, ttft, pct, max_gpus)
    if want is None:
        assert got is None
    else:
        o = got.option
        assert (got.instances * o.usd_per_hour, got.instances * o.tp, o.gpu, o.tp) == want
        assert got.stats.percentile_s <= ttft


@settings(max_examples=60, **SETTINGS)
@given(instances(), st.integers(1, 12))
def test_every_wait_is_non_increasing_in_the_servers(inst, n):
    """What the doubling + bisection rests on: one more server never lengthens any request's wait
    (so no TTFT percentile rises)."""
    times, options, _, _ = inst
    for opt in options:
        a, b = replay(times, opt.service_s, n), replay(times, opt.service_s, n + 1)
        assert np.all(b <= a + 1e-12)


@settings(max_examples=40, **SETTINGS)
@given(instances(), st.floats(1.0, 4.0))
def test_a_looser_ttft_never_costs_more(inst, factor):
    times, options, ttft, pct = inst
    tight, loose = choose_pool(times, options, ttft, pct, 64), choose_pool(times, options, ttft * factor, pct, 64)
    if tight is not None:
        assert loose is not None and loose.usd_per_hour <= tight.usd_per_hour


def test_least_instances_is_least():
    arr = poisson(20.0, 2000, 100, 3)
    opt = PoolOption("g", 1, 1.0, np.full(2000, 0.2), np.zeros(2000))
    n, s = least_instances(arr.times_s, opt, 0.5, 95.0, 64)
    assert s.percentile_s <= 0.5 < ttft_stats(arr.times_s, opt.service_s, n - 1, 0.0, 95.0).percentile_s
    assert n >= 4  # offered load 20 x 0.2 = 4 servers busy
    assert least_instances(arr.times_s, opt, 0.15, 95.0, 64) is None  # one prefill alone misses it


def test_least_instances_replays_a_few_counts_and_not_the_largest(monkeypatch):
    """Doubling from the least count: O(log N) replays, and the largest count only when the doubling
    reaches it (it used to be replayed first for every option)."""
    import opweave_planner.deployment as d

    arr = poisson(20.0, 2000, 100, 3)
    opt = PoolOption("g", 1, 1.0, np.full(2000, 0.2), np.zeros(2000))
    seen = []
    real = d._stats
    monkeypatch.setattr(d, "_stats", lambda t, o, n, p: (seen.append(n), real(t, o, n, p))[1])
    n, _ = least_instances(arr.times_s, opt, 0.5, 95.0, 1024, stable_instances(20.0, opt))
    assert 1024 not in seen and len(seen) <= 2 * 11
    assert seen[0] == 5  # starts at the stable count: 20/s x 0.2 s = 4 busy
    want, _ = least_instances(arr.times_s, opt, 0.5, 95.0, 64)  # from 1: the same least count
    assert n == want
    seen.clear()
    assert least_instances(arr.times_s, opt, 0.15, 95.0, 16, 5) is None and seen == []  # 0.2 s alone misses
    slow = PoolOption("g", 1, 1.0, np.full(2000, 0.2), np.zeros(2000))
    assert least_instances(arr.times_s, slow, 0.21, 95.0, 5, 5) is None and seen == [5]  # 5 servers: 1.0 busy


def test_a_short_burst_never_gets_an_over_utilised_pool():
    """Five requests in one second, 0.3 s each: one server meets a 2 s TTFT on this replay (its
    queue has no time to grow), but at 4 requests/s it is 1.2 x utilised and the M/G/c wait is
    infinite; the pool starts at the stable count, 2."""
    from opweave_planner.latency.ttft import mgc

    times = np.array([0.0, 0.01, 0.02, 0.03, 1.0])
    opt = PoolOption("g", 1, 1.0, np.full(5, 0.3), np.zeros(5))
    assert ttft_stats(times, opt.service_s, 1, 0.0, 95.0).percentile_s <= 2.0  # what used to be chosen
    assert not np.isfinite(mgc(4.0, 0.3, 0.0, 1).wait_mean_s)
    got = choose_pool(times, [opt], 2.0, 95.0, 8)
    rate = Arrivals(times, times, "").rate
    assert got.instances == stable_instances(rate, opt) == 2
    assert np.isfinite(mgc(rate, 0.3, 0.0, got.instances).wait_mean_s)


BASE = dict(model="llama-3.1-8b", slo="60ms", ctx="8k", gpus="h100")


@pytest.mark.parametrize("values, words", [
    (dict(ttft="-1s"), "--ttft"),
    (dict(ttft="fast", request_rate=2, prompt_len="6k"), "--ttft"),
    (dict(ttft="1s", request_rate=0, prompt_len="6k"), "--request-rate"),
    (dict(ttft="1s", request_rate="x", prompt_len="6k"), "--request-rate"),
    (dict(ttft="1s", request_rate=2, prompt_len="6k", ttft_percentile=100), "--ttft-percentile"),
    (dict(ttft="1s", request_rate=2, prompt_len="6k", arrivals="burst"), "--arrivals"),
    (dict(request_rate=2), "only applies with --ttft"),
    (dict(ttft_percentile=90), "only applies with --ttft"),
    (dict(ttft="1s", prompt_len="6k"), "needs an arrival rate"),
    (dict(ttft="1s", request_rate=2), "--prompt-len"),
    (dict(ttft="1s", request_rate=2, prompt_len="6k", target_tokens_per_s=1000), "not both"),
    (dict(ttft="1s", request_rate=2, prompt_len="6k", rate_scale=2), "--rate-scale"),
    (dict(ttft="1s", arrivals="trace", prompt_len="6k"), "needs --workload"),
])
def test_bad_deployment_settings_fail_in_one_line(values, words):
    with pytest.raises(UserError) as exc:
        api.make_request(**{**BASE, **values})
    msg = str(exc.value)
    assert words in msg and "\n" not in msg


def test_a_disaggregated_plan_records_both_pools():
    import orjson

    from opweave_planner import report
    from opweave_planner.contract import parse_plan
    from opweave_planner.plan import plan_bytes
    from opweave_planner.sizing import deployment_lines

    req = api.make_request(**BASE, policy="colocated", batches="8,16", max_owners=1, prompt_len="7k",
                           output_len="1k", ttft="800ms", request_rate=6, deployment_mode="disaggregated")
    doc = api.plan(req).plan
    dep, pool = doc.deployment, doc.deployment.prefill
    assert doc.schema_version == "1.13" and dep.mode == "disaggregated" and dep.aggregated is None
    assert dep.arrivals.rate == 6 and dep.target_tokens_per_s == 6 * 1024
    assert pool.ttft_ms <= 800 and pool.gpus == pool.instances * pool.tensor_parallel
    total = dep.usd_per_hour + pool.usd_per_hour
    assert dep.usd_per_hour_all_in == pytest.approx(total)
    per_m = 6 * 1024 * 3600 / 1e6
    assert dep.usd_per_million_output_tokens_all_in == pytest.approx(total / per_m, rel=1e-8)
    assert dep.usd_per_million_output_tokens_decode + dep.usd_per_million_output_tokens_prefill == pytest.approx(
        dep.usd_per_million_output_tokens_all_in, rel=1e-8)
    assert dep.binding_pool == ("prefill" if pool.usd_per_hour > dep.usd_per_hour else "decode")
    assert pool.cost_share == pytest.approx(pool.usd_per_hour / total)
    # one instance fewer of the chosen type misses the SLO (N is least)
    if pool.instances > 1:
        tighter = api.make_request(**BASE, policy="colocated", batches="8,16", max_owners=1, prompt_len="7k",
                                   output_len="1k", ttft=pool.ttft_ms * 0.999, request_rate=6)
        again = api.plan(tighter).plan.deployment.prefill
        assert (again.usd_per_hour, again.gpus) >= (pool.usd_per_hour, pool.gpus)
    data = plan_bytes(doc)
    assert parse_plan(orjson.loads(data), "p.json").deployment == dep
    bad = orjson.loads(data)
    bad["deployment"]["prefill"]["gpus"] += 1
    with pytest.raises(UserError, match="instances x tensor_parallel"):
        parse_plan(bad, "p.json")
    bad = orjson.loads(data)
    del bad["deployment"]["prefill"]
    with pytest.raises(UserError, match="come together"):
        parse_plan(bad, "p.json")
    lines = deployment_lines(dep)
    assert "decode pool" in lines[0] and any("all-in" in x for x in lines)
    assert "(decode pool)" in report.plan_headline(doc)


def test_a_plan_without_ttft_says_decode_only():
    from opweave_planner import report

    req = api.make_request(**BASE, policy="colocated", batches="8,16", max_owners=1, target_tokens_per_s=5000)
    doc = api.plan(req).plan
    assert doc.deployment.mode is None and doc.schema_version not in ("1.10", "1.11", "1.13")
    assert "(decode only)" in report.plan_headline(doc)


def test_poisson_prompts_from_a_law_workload_are_refused_at_the_request_edge():
    with pytest.raises(UserError) as exc:
        api.make_request(model="llama-3.1-8b", slo="60ms", gpus="h100", policy="colocated", batches="8,16",
                         max_owners=1, workload="lognormal:mean=2k,cv=1;out=geometric:mean=200", ttft="1s",
                         request_rate=2)
    assert "--request-rate with --ttft and --workload" in str(exc.value) and "\n" not in str(exc.value)


def test_trace_arrivals_at_one_instant_are_refused_at_the_request_edge(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": 5, "input_length": {600 + i}, "output_length": 50}}\n'
                             for i in range(20)))
    with pytest.raises(UserError) as exc:
        api.make_request(model="llama-3.1-8b", slo="60ms", gpus="h100", policy="colocated", batches="8,16",
                         max_owners=1, workload=str(trace), ttft="1s", arrivals="trace")
    assert "--arrivals trace" in str(exc.value) and "span no time" in str(exc.value)
    assert "\n" not in str(exc.value)


SMALL = dict(model="llama-3.1-8b", slo="60ms", gpus="h100", policy="colocated", batches="8,16", max_owners=1)


def test_poisson_prompts_come_from_the_shaped_workload(tmp_path):
    """A trace format without timestamps serves Poisson prompts (it used to be refused), and
    --scale-ctx shapes them as it shapes the decode workload."""
    from opweave_planner.compile import compile_request

    trace = tmp_path / "plain.csv"
    trace.write_text("prompt_tokens,output_tokens\n" + "".join(f"{500 + 37 * i},{40 + i}\n" for i in range(40)))
    plain = api.plan(api.make_request(**SMALL, workload=str(trace), ttft="1s", request_rate=2)).plan
    got = plain.deployment.arrivals.mean_prompt_tokens
    assert got == pytest.approx(500 + 37 * 19.5, rel=0.03)
    req = api.make_request(**SMALL, workload=str(trace), ttft="1s", request_rate=2, scale_ctx="4k")
    wl = compile_request(req).workload
    assert wl.scale > 2
    scaled = api.plan(req).plan.deployment.arrivals.mean_prompt_tokens
    assert scaled == pytest.approx(wl.mean_prompt, rel=0.03) and scaled > 2 * got


def test_a_bursty_trace_plan_reads_back(tmp_path):
    """A short bursty replay whose least replayed N would be over-utilised: the plan's pool is
    stable, its M/G/c check finite, and the file reads back."""
    import orjson

    from opweave_planner.contract import parse_plan
    from opweave_planner.plan import plan_bytes

    trace = tmp_path / "burst.jsonl"
    rows = [(0, 6000), (10, 6000), (20, 6000), (30, 6000), (40, 6000), (500, 6000)]
    trace.write_text("".join(f'{{"timestamp": {t}, "input_length": {n}, "output_length": 64}}\n' for t, n in rows))
    doc = api.plan(api.make_request(**SMALL, workload=str(trace), ttft="10s", arrivals="trace")).plan
    pool = doc.deployment.prefill
    assert pool.instances >= 2 and pool.utilisation < 1 and pool.mgc_wait_mean_ms >= 0  # 1 would be 1.42
    assert parse_plan(orjson.loads(plan_bytes(doc)), "p.json").deployment == doc.deployment


def test_the_pool_is_sized_with_the_compiled_problem(monkeypatch):
    """Given the compiled problem, sizing neither rebuilds the operator sequence nor compiles again."""
    import opweave_planner.compile as compile_pkg
    import opweave_planner.structure.operators as operators
    from opweave_planner import deployment

    req = api.make_request(**BASE, policy="colocated", batches="8,16", max_owners=1, prompt_len="7k",
                           output_len="1k", ttft="800ms", request_rate=6)
    ctx = compile_pkg.compile_request(req)
    doc = api.plan(req).plan
    bare = doc.model_copy(update={"deployment": None})

    def boom(*a, **kw):
        raise AssertionError("rebuilt what the compiled problem holds")

    monkeypatch.setattr(operators, "build_sequence", boom)
    monkeypatch.setattr(compile_pkg, "compile_request", boom)
    # the TPOT at load (contract.with_load) is compiled at other occupancies by design: not sizing's
    load = {"mean_occupancy_at_load": None, "tpot_p95_at_load_ms": None, "tpot_p95_full_occupancy_ms": None}
    assert doc.deployment.tpot_p95_at_load_ms is not None
    assert deployment.sized(bare, req, ctx.hw, ctx).deployment == doc.deployment.model_copy(update=load)
