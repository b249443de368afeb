"""Planning for a workload end to end (issue 13): determinism, invariants, the plan record,
`simulate --workload`, and workloads in regen matrices and compare grids."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from conftest import run_cli

from opweave_planner import api
from opweave_planner.compile.traffic import workload_of
from opweave_planner.contract import evaluate_plan, read_plan
from opweave_planner.plan import plan_bytes, plan_version

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"
AZURE = TRACES / "azure-conv-sample.csv"
MOONCAKE = TRACES / "mooncake-conversation-sample.jsonl"
SMALL = dict(model="llama-3.1-8b", gpus="h100", batches="8,16,32,64", max_replicas=2, max_owners=2,
             tensor_parallel_sizes="1,2", max_stages=3)


def _plan(**kw):
    _outcome = api.plan(api.make_request(**{**SMALL, **kw}))
    doc, infeasible = _outcome.plan, _outcome.infeasible
    assert doc is not None, infeasible
    return doc


def _stamp(doc) -> str:
    """The version a plan's workload keys need: its stamp but for the 1.9 binding every plan carries."""
    assert doc.schema_version == "1.9"
    return plan_version(doc.model_copy(update={"binding": None}))


def test_a_truncated_trace_is_a_1_8_file_and_says_what_was_cut():
    doc = _plan(slo="60ms", workload=str(AZURE), max_model_len="2k", overflow="truncate", max_stages=1)
    d = doc.workload.distribution
    assert _stamp(doc) == "1.8" and d.overflow == "truncate"  # 1.4's value, 1.8's event record
    assert d.dropped == 0 and d.requests == d.rows and d.clipped > 0 and d.max_context <= 2047
    clip = _plan(slo="60ms", workload=str(AZURE), max_model_len="2k", max_stages=1)
    assert _stamp(clip) == "1.8" and clip.workload.distribution.dropped > 0


def test_a_workload_plan_records_its_workload_and_tpot_distribution():
    doc = _plan(slo="30ms", workload=str(MOONCAKE), scale_ctx="8k")
    assert _stamp(doc) == "1.8"
    d = doc.workload.distribution
    assert d.source == "trace" and d.format == "mooncake" and len(d.sha256) == 64
    assert d.rows == 2006 and d.requests + d.dropped == d.rows
    assert abs(d.theta - 8192) < 1 and d.slo_percentile == 95 and d.kv_quantile == 0.999
    assert d.preemptions_per_request == 1e-4
    assert all(o.kv_events.per_request_at_reserve <= 1e-4 for o in doc.owners)
    assert d.scenarios == 256 and d.seed == 0 and d.context_knots >= 2
    assert doc.workload.context_tokens == d.max_context + 1  # prompt + output: what max-model-len must admit
    t = doc.tpot
    assert doc.tpot_ms == t.p95_ms <= doc.workload.tpot_slo_ms
    assert t.p50_ms <= t.p95_ms <= t.p99_ms <= t.max_ms
    assert t.mean_ms <= t.max_ms
    # the cost uses the mean step TPOT (throughput is B / mean)
    rate = sum(o.usd_per_hour_per_replica * o.replicas for o in doc.owners)
    assert doc.usd_per_million_tokens == pytest.approx(rate * t.mean_ms / 3.6e6 / doc.global_batch * 1e6,
                                                      rel=1e-6)


def test_same_workload_same_bytes_across_runs_and_jobs():
    req = api.make_request(**SMALL, slo="30ms", workload=str(AZURE))
    a = api.plan(req).plan
    b = api.plan(req, jobs=2).plan
    assert plan_bytes(a) == plan_bytes(b)
    c = api.plan(api.make_request(**SMALL, slo="30ms", workload=str(AZURE), seed=1)).plan
    assert c.workload.distribution.seed == 1  # another seed: other snapshots, recorded as such


def test_loosening_the_slo_or_its_percentile_never_raises_cost():
    base = dict(workload=str(MOONCAKE), scale_ctx="8k")
    tight = _plan(slo="22ms", **base)
    for loose in (_plan(slo="30ms", **base), _plan(slo="22ms", slo_percentile=80, **base)):
        assert loose.usd_per_million_tokens <= tight.usd_per_million_tokens * (1 + 1e-12)


def test_a_lower_kv_quantile_never_raises_cost():
    base = dict(slo="30ms", workload=str(MOONCAKE), scale_ctx="8k")
    strict = _plan(**base, kv_quantile=0.9999)
    lax = _plan(**base, kv_quantile=0.9)
    assert lax.usd_per_million_tokens <= strict.usd_per_million_tokens * (1 + 1e-12)


def test_simulate_checks_a_fixed_context_plan_against_a_trace(tmp_path):
    fixed = _plan(slo="30ms", ctx="8k")
    path = tmp_path / "fixed.json"
    path.write_bytes(plan_bytes(fixed))
    assert evaluate_plan(read_plan(path)).inputs_changed == []
    ev = evaluate_plan(read_plan(path), workload=str(MOONCAKE), scale_ctx="8k")
    assert ev.plan.tpot is not None and ev.plan.workload.distribution.sha256
    assert ev.inputs_changed == ["workload"]
    assert ev.plan.tpot_ms >= ev.plan.tpot.p50_ms
    ran = run_cli("simulate", path, "--workload", MOONCAKE, "--scale-ctx", "8k", "--json")
    info = orjson.loads(ran.out)
    assert ran.code == (0 if info["meets_slo"] and info["fits_memory"] else 1)
    assert info["tpot"]["percentile"] == 95
    # and a workload plan back at one context
    wl = _plan(slo="30ms", workload=str(MOONCAKE), scale_ctx="8k")
    back = evaluate_plan(wl, ctx="8k")
    assert back.plan.tpot is None and back.plan.workload.context_tokens == 8192


def test_regen_and_compare_take_workloads(tmp_path):
    from opweave_planner.compare import compare
    from opweave_planner.regen import load_matrix, regen

    shutil.copy(AZURE, tmp_path / "azure.csv")
    matrix = tmp_path / "matrix.toml"
    matrix.write_text('max_owners = 1\nbatches = [8, 16]\ntps = [1]\nmax_replicas = 1\n'
                      '[[entry]]\nmodels = "llama-3.1-8b"\nworkloads = ["azure.csv"]\nslos = "30ms"\n'
                      'gpus = "h100"\npolicies = "colocated"\nslo_percentile = 90\n')
    tasks = load_matrix(matrix)
    assert [t.name for t in tasks] == ["llama-3.1-8b_wl-azure_slo30ms_h100_colocated.json"]
    out = tmp_path / "plans"
    report = regen(matrix, out)
    assert report.written == 1 and report.exit_code == 1
    doc = read_plan(out / tasks[0].name)
    assert doc.workload.distribution.slo_percentile == 90
    assert regen(matrix, out).written == 0  # unchanged inputs: same bytes
    bad = tmp_path / "bad.toml"
    bad.write_text('[[entry]]\nmodels = "llama-3.1-8b"\ncontexts = "8k"\nworkloads = "azure.csv"\n'
                   'slos = "30ms"\ngpus = "h100"\npolicies = "colocated"\n')
    from opweave_planner.errors import UserError

    with pytest.raises(UserError, match=r"contexts .* or workloads"):
        load_matrix(bad)
    grid = compare("llama-3.1-8b", "4k", "30ms", gpus="h100", policies="colocated", workload=str(MOONCAKE),
                   batches=(8, 16), max_owners=1, tensor_parallel_sizes=(1,), max_replicas=1)
    cell = grid["cells"][0]
    assert cell["policies"]["colocated"].get("usd_per_million_tokens") is not None


def test_a_one_token_workload_plans():
    doc = _plan(slo="30ms", workload="fixed:0;out=fixed:1", scenarios=16)
    assert doc.workload.distribution.max_context <= 1 and doc.tpot is not None


def test_a_sized_workload_plan_stays_1_8_and_sizes_on_the_mean(tmp_path):
    doc = _plan(slo="30ms", workload=str(AZURE), policy="colocated", target_tokens_per_s=5000)
    assert _stamp(doc) == "1.8" and doc.deployment is not None
    per_copy = doc.global_batch * 1000 / doc.tpot.mean_ms
    assert doc.deployment.tokens_per_s_per_copy == pytest.approx(per_copy, rel=1e-6)


def test_a_trace_edited_while_the_process_runs_is_read_again(tmp_path):
    trace = tmp_path / "t.csv"
    shutil.copy(AZURE, trace)
    first = workload_of(api.make_request(**SMALL, slo="30ms", workload=str(trace)))
    rows = trace.read_text().splitlines()
    trace.write_text("\n".join([rows[0], *rows[1:200]]) + "\n")
    second = workload_of(api.make_request(**SMALL, slo="30ms", workload=str(trace)))
    assert second.requests == 199 and second.spec.sha256 != first.spec.sha256


def test_a_trace_is_read_once_per_file_version(tmp_path, monkeypatch):
    """Validating the request and resolving the model's window see one read of the file; an
    edit of the file is read again."""
    from opweave_planner import api
    from opweave_planner.workload import reader as W

    trace = tmp_path / "t.csv"
    trace.write_text("prompt_tokens,output_tokens\n" + "".join(f"{500 + 7 * i},{20 + i}\n" for i in range(50)))
    reads = []
    real = W.read_trace
    monkeypatch.setattr(W, "read_trace", lambda p: reads.append(p) or real(p))
    req = api.resolve_request(api.make_request(model="llama-3.1-8b", slo="60ms", gpus="h100",
                                               workload=str(trace)))
    workload_of(req)
    assert len(reads) == 1
    trace.write_text(trace.read_text() + "900,30\n")
    workload_of(api.make_request(model="llama-3.1-8b", slo="60ms", gpus="h100", workload=str(trace)))
    assert len(reads) == 2
