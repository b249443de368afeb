"""The disaggregated deployment (issue 27): the prefill pool is the exact minimum over its
enumeration, a looser TTFT never costs more, the plan records both pools, and bad settings fail
in one line."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opweave_planner import api
from opweave_planner.deployment import PoolOption, choose_pool, least_instances
from opweave_planner.errors import UserError
from opweave_planner.latency.ttft import ttft_stats
from opweave_planner.workload.arrivals import poisson

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
    """Every (option, N) with N x TP <= max_gpus: the cheapest that meets the SLO."""
    best = None
    for opt in options:
        for n in range(1, max_gpus // opt.tp + 1):
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
    assert doc.schema_version == "1.10" and dep.mode == "disaggregated" and dep.aggregated is None
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
    assert doc.deployment.mode is None and doc.schema_version != "1.10"
    assert "(decode only)" in report.plan_headline(doc)


def test_poisson_prompts_from_a_law_workload_are_refused_in_one_line():
    req = api.make_request(model="llama-3.1-8b", slo="60ms", gpus="h100", policy="colocated", batches="8,16",
                           max_owners=1, workload="lognormal:mean=2k,cv=1;out=geometric:mean=200", ttft="1s",
                           request_rate=2)
    with pytest.raises(UserError) as exc:
        api.plan(req)
    assert "--request-rate with --ttft and --workload" in str(exc.value) and "\n" not in str(exc.value)


def test_trace_arrivals_at_one_instant_are_refused_in_one_line(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": 5, "input_length": {600 + i}, "output_length": 50}}\n'
                             for i in range(20)))
    req = api.make_request(model="llama-3.1-8b", slo="60ms", gpus="h100", policy="colocated", batches="8,16",
                           max_owners=1, workload=str(trace), ttft="1s", arrivals="trace")
    with pytest.raises(UserError) as exc:
        api.plan(req)
    assert "span no time" in str(exc.value) and "\n" not in str(exc.value)
