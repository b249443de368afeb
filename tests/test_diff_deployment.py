"""`diff` and `simulate` say what each kind of plan deploys: a decode-only plan says so, an
aggregated one shows its replicas' TTFT and TPOT, a disaggregated one both pools and its TTFT."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli

from opweave_planner import report
from opweave_planner.contract import diff_plans, read_plan

GOLDEN = Path(__file__).parent / "golden"
DECODE = GOLDEN / "llama-3.1-8b_colocated_h100-isl7680-osl1024_v1.7.json"  # no deployment
NOCAPS = GOLDEN / "llama-3.1-8b_colocated_h100-nocaps_v1.12.json"  # decode only, another plan than v1.9's
CAPS = GOLDEN / "llama-3.1-8b_colocated_h100_v1.9.json"
DISAGG = GOLDEN / "llama-3.1-8b_colocated_h100-isl7680-osl1024-ttft1s-rate8_v1.13.json"
AGG = GOLDEN / "llama-3.1-8b_colocated_h100-isl7680-osl1024-ttft1s-rate8-net1GBs_v1.14.json"  # no prefill pool


def _edited(tmp_path: Path, src: Path, name: str, edit) -> Path:
    doc = json.loads(src.read_bytes())
    edit(doc)
    out = tmp_path / name
    out.write_text(json.dumps(doc))
    return out


def test_diff_of_a_disaggregated_and_an_aggregated_plan_shows_both_deployments():
    ran = run_cli("diff", DISAGG, AGG)
    assert ran.code == 1
    line = next(x for x in ran.out.splitlines() if x.startswith("deployment: "))
    old, new = line.split(" -> ", 1)[0], line.split(" -> ")[-1]
    assert "disaggregated: decode 4 copies of the plan = 4 GPUs + prefill 2x h100 TP1 = 2 GPUs" in old
    assert "p95 TTFT 671.938 ms" in old
    assert new.startswith("aggregated: 6x h100 TP1 (B=32, chunk 512) = 6 GPUs")
    assert "p95 TTFT 390.52 ms" in new and "p95 TPOT 22.6434 ms" in new
    assert "p95 TTFT: 671.938 -> 390.52 ms (-41.88%)" in ran.out
    # the plans' own cost is the decode plan's: the decode pool, then decode only beside aggregated replicas
    assert "USD per million tokens, decode pool -> decode only; mode aggregated" in ran.out


def test_diff_of_an_aggregated_plan_without_a_prefill_pool_has_a_ttft_line(tmp_path):
    def slower(doc):
        doc["deployment"]["aggregated"]["ttft_ms"] = 420.0
        doc["deployment"]["aggregated"]["tpot_ms"] = 23.0

    ran = run_cli("diff", AGG, _edited(tmp_path, AGG, "slower.json", slower))
    assert ran.code == 1 and "equivalent" not in ran.out
    assert "p95 TTFT: 390.52 -> 420 ms (+7.55%)" in ran.out
    line = ran.out.splitlines()[0]
    assert line.startswith("deployment: aggregated: ") and "p95 TPOT 22.6434 ms -> aggregated: " in line
    assert line.endswith("p95 TTFT 420 ms, p95 TPOT 23 ms")


def test_diff_of_decode_only_plans_says_decode_only():
    ran = run_cli("diff", CAPS, NOCAPS)
    assert ran.code == 1
    assert "USD per million tokens, decode only" in ran.out and "decode pool" not in ran.out
    assert "TTFT" not in ran.out and "deployment:" not in ran.out  # neither deploys more than decode copies


def test_a_deployment_added_to_the_same_decode_plan_is_not_equivalent():
    """Same decode plan, one side a whole deployment: diff said 'equivalent' (exit 0) before."""
    d = diff_plans(read_plan(str(DECODE)), read_plan(str(DISAGG)))
    assert not d["equivalent"]
    dep = next(c for c in d["changes"] if c["aspect"] == "deployment")
    assert dep["old"]["mode"] == "decode only" and dep["new"]["mode"] == "disaggregated"
    assert dep["summary"].startswith("deployment: decode only (no deployment sized) -> disaggregated: ")
    assert [c["aspect"] for c in d["changes"]].count("ttft_ms") == 0  # one side has no TTFT


def test_records_of_each_kind():
    from opweave_planner.contract import deployment_record

    agg, dis = deployment_record(read_plan(str(AGG))), deployment_record(read_plan(str(DISAGG)))
    assert (agg["mode"], agg["gpus"], agg["ttft_ms"], agg["tpot_percentile"]) == ("aggregated", 6, 390.519626, 95.0)
    assert (dis["mode"], dis["gpus"], dis["usd_per_hour"]) == ("disaggregated", 6, 20.94)
    assert deployment_record(read_plan(str(DECODE)))["ttft_ms"] is None


def test_headline_of_an_aggregated_plan_is_not_a_decode_pool():
    doc = json.loads(AGG.read_bytes())
    assert "(decode only; mode aggregated)" in report.plan_headline(doc)
    assert "decode pool" not in report.plan_headline(doc)


def test_simulate_of_an_aggregated_plan_shows_its_ttft_and_tpot():
    ran = run_cli("simulate", AGG, "--request-rate", "9")
    assert "deployment (decode only; mode aggregated) for 9,216 tokens/s" in ran.out
    line = next(x for x in ran.out.splitlines() if x.startswith("  all-in (aggregated): "))
    assert "0.710042 -> " in line and "p95 TTFT: 390.52 -> " in line and "p95 TPOT: 22.6434 -> " in line
