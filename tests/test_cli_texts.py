"""What the human-readable output says is true: diff and simulate name what differs, notes carry
the right quantity, errors name the flag the user typed (an audit of every command's text)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli

from opweave_planner import api
from opweave_planner.plan import plan_bytes

AZURE = Path(__file__).resolve().parent.parent / "examples" / "traces" / "azure-conv-sample.csv"
GOLDEN = Path(__file__).parent / "golden"
SMALL = dict(model="llama-3.1-8b", slo="60ms", batches="8,16", max_owners=1, tensor_parallel_sizes="1")


def _write(tmp_path: Path, name: str, **kw) -> Path:
    _outcome = api.plan(api.make_request(**{**SMALL, **kw}))
    doc, infeasible = _outcome.plan, _outcome.infeasible
    assert doc is not None, infeasible
    path = tmp_path / name
    path.write_bytes(plan_bytes(doc))
    return path


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("plans")
    return {"h100": _write(d, "h100.json", ctx="8k", gpus="h100"),
            "a100": _write(d, "a100.json", ctx="8k", gpus="a100"),
            "p95": _write(d, "p95.json", workload=str(AZURE), gpus="h100"),
            "p99": _write(d, "p99.json", workload=str(AZURE), gpus="h100", slo_percentile=99)}


def test_diff_names_the_request_settings_that_differ(plans):
    ran = run_cli("diff", plans["p95"], plans["p99"])
    assert ran.code == 1
    assert "request: slo-percentile 95 -> 99" in ran.out
    assert "ctx" not in ran.out.split("request:")[1].splitlines()[0]  # only what differs


def test_diff_says_a_price_one_plan_lacks_is_not_recorded(plans):
    ran = run_cli("diff", plans["h100"], plans["a100"])
    assert ran.code == 1 and "None" not in ran.out
    assert "note: price of a100: not recorded -> " in ran.out


def test_simulate_labels_each_side_of_tpot_by_what_it_is(plans):
    ran = run_cli("simulate", plans["p95"], "--slo-percentile", "99.9")
    assert "TPOT: " in ran.out and "ms (p95) -> " in ran.out and "ms (p99.9)" in ran.out
    ran = run_cli("simulate", plans["h100"], "--workload", AZURE)
    assert "ms (steady state) -> " in ran.out and "ms (p95)" in ran.out
    ran = run_cli("simulate", plans["p95"])
    assert "  p95 TPOT: " in ran.out and "inputs changed: none" in ran.out


def test_simulate_says_when_figures_moved_with_no_recorded_input(plans):
    # the 1.1 golden was written by an earlier latency model under the same inputs
    ran = run_cli("simulate", GOLDEN / "llama-3.1-8b_afd_h100+a100_v1.1.json")
    assert "inputs changed: none recorded; the figures differ" in ran.out
    assert "(+0.00%)" not in ran.out.splitlines()[1]  # the cost line moved


def test_simulate_warns_when_the_profiles_lack_a_plan_gpu(plans, tmp_path):
    import shutil

    from opweave_planner.data import profiles_root

    shutil.copytree(profiles_root(None) / "h100", tmp_path / "profiles" / "h100")  # no a100 tables
    ran = run_cli("simulate", plans["a100"], "--profiles", tmp_path / "profiles")
    assert "warning: a100: no measured kernel tables" in ran.err


def test_gpus_prints_catalog_names_verbatim(tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # a log's width (pytest-xdist sets COLUMNS=80)
    cat = tmp_path / "cat.toml"
    cat.write_text('[gpus.x1]\nname = "My [GPU] [bold]x"\nmemory_gb = 24\nbandwidth_gbps = 900\n'
                   'bf16_tflops = 100\nfp8_tflops = 200\nprice_per_hour = 1.0\ngpus_per_node = 8\n'
                   'intra_node_gbps = 450\n')
    ran = run_cli("gpus", "--catalog", cat)
    assert ran.code == 0, ran.err
    assert "My [GPU] [bold]x" in ran.out and "memory GiB" in ran.out


@pytest.mark.parametrize(("argv", "flag"), [
    (("afd", "ratio", "--prompt-dist", "bogus"), "--prompt-dist"),
    (("afd", "ratio", "--decode-dist", "bogus"), "--decode-dist"),
    (("afd", "simulate", "--start", "bogus", "--r", "1", "--requests", "600"), "--start"),
])
def test_afd_errors_name_the_flag_given(argv, flag):
    line = assert_one_line_error(run_cli(*argv), 2, flag)
    assert line.startswith(f"error: {flag}:")


def test_compare_with_a_workload_takes_scale_ctx_as_its_context(tmp_path):
    base = ("compare", "-m", "llama-3.1-8b", "--slo", "60ms", "--workload", AZURE, "--gpus", "h100",
            "--batches", "8,16", "--max-owners", "1", "--policies", "colocated", "-q", "--json")
    ran = run_cli(*base, "--scale-ctx", "2k")
    assert ran.code == 0, ran.err
    assert '"context": "2k"' in ran.out or '"context": 2048' in ran.out
    assert_one_line_error(run_cli(*base, "--scale-ctx", "2k", "--ctx", "4k"), 2, "--scale-ctx / --ctx")


def test_export_refuses_a_model_other_than_the_plans(plans, tmp_path):
    ran = run_cli("export", plans["h100"], "--to", "vllm", "--out", tmp_path / "x", "--model", "qwen3-30b-a3b")
    assert_one_line_error(ran, 2, "--model", "llama-3.1-8b")
    assert not (tmp_path / "x").exists()
    ran = run_cli("export", plans["h100"], "--to", "vllm", "--out", tmp_path / "y", "--alternative", "optimum")
    assert "--policy colocated" not in assert_one_line_error(ran, 2, "--alternative", "--prefer-simpler")


def test_diff_names_an_edited_law_file(tmp_path):
    law = tmp_path / "law.toml"
    law.write_text('[prompt]\ndist = "lognormal"\nmean = 1000\ncv = 1.0\n[output]\ndist = "geometric"\nmean = 100\n')
    old = _write(tmp_path, "old.json", workload=str(law), gpus="h100")
    law.write_text('[prompt]\ndist = "lognormal"\nmean = 2000\ncv = 1.0\n[output]\ndist = "geometric"\nmean = 100\n')
    new = _write(tmp_path, "new.json", workload=str(law), gpus="h100")
    ran = run_cli("diff", old, new)
    assert "request: prompt law lognormal:mean=1000,cv=1 -> lognormal:mean=2000,cv=1\n" in ran.out


def test_simulate_keeps_the_shaping_of_the_same_trace_at_another_path(tmp_path):
    import shutil

    plan = _write(tmp_path, "t.json", workload=str(AZURE), gpus="h100", max_model_len="2k", overflow="truncate")
    moved = tmp_path / "elsewhere.csv"
    shutil.copy(AZURE, moved)
    ran = run_cli("simulate", plan, "--workload", moved)
    assert ran.code == 0, ran.err
    assert "cost: " in ran.out and "(+0.00%)" in ran.out.splitlines()[1]
    other = tmp_path / "other.csv"  # another trace: its own shaping (the model's window, clip)
    other.write_text("prompt_tokens,output_tokens\n" + "3000,200\n" * 50)
    assert "(+0.00%)" not in run_cli("simulate", plan, "--workload", other).out.splitlines()[1]


def test_a_truncate_plan_stamped_below_1_4_is_refused(tmp_path):
    import json

    doc = json.loads((GOLDEN / "llama-3.1-8b_opweave_azure-truncate2k_h100+a100_v1.4.json").read_text())
    doc["schema_version"] = "1.3"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert_one_line_error(run_cli("simulate", bad), 2, "overflow 'truncate' needs schema_version 1.4")


def test_export_accepts_a_renamed_copy_of_the_plans_config(tmp_path):
    import shutil

    from opweave_planner.data import shipped_dir

    src = next(p for p in (shipped_dir("models")).glob("*.json") if "llama-3.1-8b" in p.name)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copy(src, tmp_path / "a" / "my-llama.json")
    shutil.copy(src, tmp_path / "b" / "config.json")
    plan = _write(tmp_path, "p.json", model=str(tmp_path / "a" / "my-llama.json"), ctx="8k", gpus="h100")
    ran = run_cli("export", plan, "--to", "vllm", "--out", tmp_path / "x", "--model", tmp_path / "b" / "config.json",
                  "--model-id", "meta-llama/Llama-3.1-8B-Instruct")
    assert ran.code == 0, ran.err
