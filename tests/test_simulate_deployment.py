"""`simulate` re-evaluates a plan's deployment (issue 27, item 7): the decode copies and a
disaggregated plan's prefill pool are re-sized under new prices, rates, arrivals and TTFT, and
`--out` keeps the deployment and the alternatives."""

from __future__ import annotations

import orjson
import pytest
from conftest import run_cli

from opweave_planner import api
from opweave_planner.contract import evaluate_plan, read_plan
from opweave_planner.plan import plan_bytes

BASE = dict(model="llama-3.1-8b", slo="60ms", ctx="8k", gpus="h100", policy="colocated", batches="8,16",
            max_owners=1, prompt_len="7k", output_len="1k", ttft="800ms")


@pytest.fixture(scope="module")
def disaggregated():
    return api.plan(api.make_request(**BASE, request_rate=6)).plan


def test_an_unchanged_plan_re_simulates_to_its_own_bytes(disaggregated):
    assert plan_bytes(evaluate_plan(disaggregated).plan) == plan_bytes(disaggregated)


def test_another_rate_re_simulates_to_the_plan_made_at_it(disaggregated):
    """The decode search does not see the rate, so simulate at 9 requests/s (a new rate source,
    TTFT and percentile) writes what planning at them writes, byte for byte."""
    new = evaluate_plan(disaggregated, request_rate=9.0, ttft=500.0, ttft_percentile=90.0).plan
    fresh = api.plan(api.make_request(**{**BASE, "ttft": "500ms"}, request_rate=9, ttft_percentile=90)).plan
    assert new.deployment.arrivals.rate == 9 and new.deployment.prefill.ttft_percentile == 90
    assert plan_bytes(new) == plan_bytes(fresh)
    by_tokens = evaluate_plan(disaggregated, target_tokens_per_s=9 * 1024.0).plan.deployment
    assert by_tokens.arrivals.rate == pytest.approx(9) and by_tokens.arrivals.request_rate is None


def test_a_price_change_re_costs_both_pools(disaggregated, tmp_path):
    """One GPU type: doubling its price doubles every all-in figure and leaves the pools alone."""
    old = disaggregated.deployment
    price = disaggregated.provenance.prices_usd_per_gpu_hour["h100"]
    prices = tmp_path / "p.toml"
    prices.write_text(f"h100 = {2 * price!r}\n")
    new = evaluate_plan(disaggregated, prices=str(prices)).plan.deployment
    assert (new.prefill.instances, new.prefill.gpu, new.prefill.tensor_parallel) == (
        old.prefill.instances, old.prefill.gpu, old.prefill.tensor_parallel)
    assert new.prefill.ttft_ms == old.prefill.ttft_ms
    for key in ("usd_per_hour_all_in", "usd_per_million_output_tokens_all_in", "usd_per_million_input_tokens"):
        assert getattr(new, key) == pytest.approx(2 * getattr(old, key), rel=1e-8)


def test_a_decode_only_sizing_is_kept():
    req = api.make_request(model="llama-3.1-8b", slo="60ms", ctx="8k", gpus="h100", policy="colocated",
                           batches="8,16", max_owners=1, target_tokens_per_s=5000, target_concurrency=40)
    doc = api.plan(req).plan
    again = evaluate_plan(doc).plan
    assert again.deployment == doc.deployment and plan_bytes(again) == plan_bytes(doc)
    more = evaluate_plan(doc, target_tokens_per_s=20000.0).plan.deployment
    assert more.target_tokens_per_s == 20000 and more.target_concurrency == 40 and more.copies > doc.deployment.copies


def test_simulate_out_keeps_the_deployment_and_the_alternatives(tmp_path):
    plan = tmp_path / "p.json"
    ran = run_cli("--model", "llama-3.1-8b", "--slo", "60ms", "--ctx", "8k", "--gpus", "h100", "--batches", "8,16",
                  "--max-owners", "2", "--prompt-len", "7k", "--output-len", "1k", "--ttft", "800ms",
                  "--request-rate", "6", "-q", "--out", str(plan))
    assert ran.code == 0, ran.err
    doc = read_plan(plan)
    assert doc.alternatives and doc.deployment.mode == "disaggregated"
    out = tmp_path / "again.json"
    ran = run_cli("simulate", str(plan), "--out", str(out))
    assert ran.code == 0, ran.err
    assert out.read_bytes() == plan.read_bytes()  # deployment and alternatives, unchanged inputs
    assert "p95 TTFT" in ran.out and "USD/M output tokens" in ran.out and "all-in:" in ran.out
    ran = run_cli("simulate", str(plan), "--request-rate", "12", "--out", str(out), "--json")
    assert ran.code == 0, ran.err
    info = orjson.loads(ran.out)
    assert info["deployment"]["arrivals"]["rate"] == 12 and info["previous"]["deployment"]["arrivals"]["rate"] == 6
    again = read_plan(out)
    assert again.deployment.arrivals.rate == 12 and set(again.alternatives) == set(doc.alternatives)
    assert all(a.plan.deployment is None for a in again.alternatives.values())  # listed unsized, as planned
