"""`regen` matrices take the whole deployment's settings as axes (issue 27, item 7): a list of
TTFTs, rates or lengths is one more axis of the cross product and the file name carries it; a
price edit re-plans the deployment as `simulate` re-evaluates it."""

from __future__ import annotations

import pytest

from opweave_planner.contract import evaluate_plan, read_plan
from opweave_planner.errors import UserError
from opweave_planner.regen import CACHE_FILE, load_matrix, regen

MATRIX = """
prices = "prices.toml"
batches = [8, 16]
max_owners = 1
prompt_len = "7k"
output_len = "1k"

[[entry]]
models = "llama-3.1-8b"
contexts = "8k"
slos = "60ms"
gpus = "h100"
policies = "colocated"
ttft = ["800ms", "2s"]
request_rate = [4, 6]
ttft_percentile = 90
"""


@pytest.fixture
def matrix(tmp_path):
    (tmp_path / "prices.toml").write_text("h100 = 3.49\n")
    m = tmp_path / "matrix.toml"
    m.write_text(MATRIX)
    return m


def test_deployment_axes_expand_and_name_their_files(matrix):
    names = sorted(t.name for t in load_matrix(matrix))
    assert names == [f"llama-3.1-8b_ctx8k-isl7k-osl1k_slo60ms_ttft{t}ms-p90-rate{r}_h100_colocated.json"
                     for t in (2000, 800) for r in (4, 6)]
    reqs = {(t.request.ttft, t.request.request_rate, t.request.ttft_percentile) for t in load_matrix(matrix)}
    assert reqs == {(t, float(r), 90.0) for t in (800.0, 2000.0) for r in (4, 6)}


def test_a_matrix_entry_makes_a_whole_deployment_and_a_price_edit_re_simulates_it(matrix, tmp_path, few_arrivals):
    out = tmp_path / "plans"
    first = regen(matrix, out)
    assert first.exit_code == 1 and first.count("new") == 4
    name = "llama-3.1-8b_ctx8k-isl7k-osl1k_slo60ms_ttft800ms-p90-rate6_h100_colocated.json"
    old = read_plan(out / name)
    # auto: both modes searched; a disaggregated winner records its TPOT at load (1.13)
    assert old.schema_version == ("1.13" if old.deployment.mode == "disaggregated" else "1.11")
    assert old.deployment.arrivals.rate == 6 and old.deployment.prefill.ttft_slo_ms == 800
    (tmp_path / "prices.toml").write_text("h100 = 4.2\n")
    edited = regen(matrix, out)
    assert edited.exit_code == 1 and edited.count("changed") == 4
    new = read_plan(out / name)
    assert new.deployment.usd_per_hour_all_in > old.deployment.usd_per_hour_all_in
    # the re-planned file is what simulate makes of the old one under the new price
    again = evaluate_plan(old, prices=str(tmp_path / "prices.toml")).plan
    assert again.deployment == new.deployment
    (out / CACHE_FILE).unlink()
    assert regen(matrix, out).exit_code == 0  # deterministic: the same bytes again


def test_a_bad_listed_setting_names_the_entry(matrix):
    matrix.write_text(MATRIX.replace('request_rate = [4, 6]', 'request_rate = [4, -1]'))
    with pytest.raises(UserError) as exc:
        load_matrix(matrix)
    assert "request_rate -1" in str(exc.value) and "--request-rate" in str(exc.value)
    matrix.write_text(MATRIX.replace('request_rate = [4, 6]', 'request_rate = []'))
    with pytest.raises(UserError, match="non-empty list"):
        load_matrix(matrix)


HYSTERESIS = """
prices = "prices.toml"
max_owners = 2
batches = [8, 16, 32, 64]
max_replicas = 2
tensor_parallel_sizes = [1, 2]
target_tokens_per_s = {tokens}

[[entry]]
models = "qwen3-30b-a3b"
contexts = "8k"
slos = "40ms"
gpus = "h100,a100"
policies = "afd"
"""


def test_a_kept_placement_is_re_sized_for_the_entry_s_new_load(tmp_path):
    """Hysteresis keeps a placement re-evaluated under the entry's inputs, its target load
    included: the kept file is sized for the new target, not the one it was made for (a100
    1.74 -> 2.00 moves this optimum by less than 5 %, tests/test_regen_hysteresis.py)."""
    (tmp_path / "prices.toml").write_text("h100 = 3.49\na100 = 1.74\n")
    m = tmp_path / "matrix.toml"
    m.write_text(HYSTERESIS.format(tokens=5000))
    out = tmp_path / "plans"
    assert regen(m, out).count("new") == 1
    name = "qwen3-30b-a3b_ctx8k_slo40ms_h100+a100_afd.json"
    before = read_plan(out / name)
    assert before.deployment.target_tokens_per_s == 5000
    (tmp_path / "prices.toml").write_text("h100 = 3.49\na100 = 2.00\n")
    m.write_text(HYSTERESIS.format(tokens=9000))
    report = regen(m, out, hysteresis="5%")
    kept = read_plan(out / name)
    assert [f.name for f in report.kept] == [name]
    assert kept.deployment.target_tokens_per_s == 9000 and kept.deployment.copies >= before.deployment.copies
    assert (kept.template, kept.global_batch) == (before.template, before.global_batch)  # the placement kept
