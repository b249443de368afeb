"""`afd ratio` and `afd simulate` through typer's test runner."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest
from typer.testing import CliRunner

from opweave_planner.cli.afd import app
from opweave_planner.errors import UserError

runner = CliRunner()


def _json(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return orjson.loads(result.stdout)


def test_ratio_json_reports_both_rules_and_a_row_per_r():
    out = _json(["ratio", "--json", "--r", "1,2,8"])
    assert out["workload"]["theta"] == pytest.approx(599.0)
    assert out["mean_field"]["regime"] == "attention"
    assert out["mean_field"]["r"] == pytest.approx(out["mean_field"]["candidates"]["attention"])
    assert [row["r"] for row in out["table"]] == [1.0, 2.0, 8.0]
    assert out["table"][1]["kappa"] == pytest.approx(0.5641895835, abs=1e-9)
    assert out["gaussian"]["throughput"] < out["mean_field"]["throughput"]


def test_ratio_options_change_the_answer():
    base = _json(["ratio", "--json"])["mean_field"]["r"]
    heavier = _json(["ratio", "--json", "--decode-mean", "1000", "--alpha-f", "0.05"])[
        "mean_field"
    ]["r"]
    assert heavier > base


def test_ratio_table_output_mentions_both_ratios():
    result = runner.invoke(app, ["ratio", "--r", "4,8"])
    assert result.exit_code == 0
    assert "r*_mf" in result.stdout and "r*_G" in result.stdout and "7.57%" in result.stdout


def test_simulate_is_reproducible_and_reports_the_best_r():
    args = ["simulate", "--json", "--r", "1,2", "--batch", "16", "--requests", "100", "--seed", "7"]
    first = _json(args)
    assert first == _json(args)
    assert first["best_r"] in (1, 2) and len(first["results"]) == 2
    assert first["results"][0]["requests"] == 100


def test_simulate_monte_carlo_mode():
    out = _json(["simulate", "--mc", "--json", "--r", "2,4", "--trials", "500"])
    assert [row["r"] for row in out["rows"]] == [2, 4]
    assert all(abs(row["mc"] - row["clt"]) < 0.01 for row in out["rows"])


def test_trace_drives_the_workload(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("prompt,decode\n10,4\n0,1\n")
    out = _json(["ratio", "--json", "--trace", str(trace)])
    assert out["workload"]["source"] == "trace"
    assert out["workload"]["theta"] == pytest.approx((10 * 4 + 6) / 5)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["ratio", "--r", "1,x"], "--r: expected comma-separated positive numbers"),
        (["simulate", "--r", "1.5"], "--r: expected comma-separated positive integers"),
        (["ratio", "--batch", "0"], "--batch"),
        (["ratio", "--alpha-a", "-1"], "alpha_a"),
        (["ratio", "--decode-dist", "zipf"], "--decode-dist: expected geometric or fixed"),
        (["simulate", "--mc", "--trials", "0"], "--trials"),
    ],
)
def test_bad_input_raises_a_user_error(args, needle):
    result = runner.invoke(app, args)
    assert isinstance(result.exception, UserError)
    assert needle in str(result.exception)
    assert "\n" not in str(result.exception)


def test_bad_trace_row_is_named(tmp_path):
    trace = tmp_path / "bad.csv"
    trace.write_text("prompt,decode\n10,4\n5,0\n")
    result = runner.invoke(app, ["simulate", "--trace", str(trace)])
    assert isinstance(result.exception, UserError)
    assert "line 3" in str(result.exception)


def test_module_import_stays_light():
    code = (
        "import sys, opweave_planner.cli.afd; "
        "print(any(m in sys.modules for m in ('numpy', 'numba', 'scipy')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_ratio_and_simulate_calibrate_from_profiles():
    out = _json(
        [
            "ratio",
            "--json",
            "--model",
            "llama-3.1-8b",
            "--attn-gpu",
            "h100",
            "--ffn-gpu",
            "h100",
            "--ctx",
            "32k",
            "--r",
            "1,2,4",
        ]
    )
    cal = out["calibration"]
    assert out["coefficients"] == cal["coefficients"]
    assert cal["setup"]["model"] == "llama-3.1-8b" and cal["setup"]["context"] == 32768
    assert cal["setup"]["ffn_batches"] == [256, 512, 1024]
    for part in ("attention", "ffn", "communication"):
        assert {"rmse", "max_rel_error", "r2"} <= set(cal[part])
    sim = _json(
        [
            "simulate",
            "--json",
            "--model",
            "qwen3-30b-a3b",
            "--attn-gpu",
            "h100",
            "--ep",
            "--ffn-tp",
            "2",
            "--r",
            "1,2",
            "--requests",
            "600",
        ]
    )
    assert sim["calibration"]["setup"]["moe_ep"] is True
    assert sim["coefficients"] == sim["calibration"]["coefficients"]
    text = runner.invoke(app, ["ratio", "--model", "llama-3.1-8b", "--attn-gpu", "h100"])
    assert text.exit_code == 0 and "calibrated from profiles" in text.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--model", "llama-3.1-8b", "--attn-gpu", "h100", "--alpha-a", "1"], "not both"),
        (["--attn-gpu", "h100"], "only apply with --model"),
        (["--ep"], "only apply with --model"),
        (["--model", "llama-3.1-8b"], "--attn-gpu"),
        (["--model", "llama-3.1-8b", "--attn-gpu", "h100", "--ctx", "lots"], "--ctx"),
    ],
)
def test_calibration_option_conflicts_are_user_errors(args, needle):
    result = runner.invoke(app, ["ratio", *args])
    assert isinstance(result.exception, UserError)
    assert needle in str(result.exception)


def _table_text(args, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_ratio_table_headers_carry_units(monkeypatch):
    out = _table_text(["ratio", "--r", "4,8"], monkeypatch)
    for header in ("tau_mf (cycles)", "tau_G (cycles)", "thr_mf (tokens/cycle/inst)", "r (A per F)"):
        assert header in out
    assert "alpha_a = 0.00165 cycles/token" in out and "beta_f = 100 cycles" in out
    assert "tokens/cycle" in out.split("r*_mf", 1)[1].splitlines()[0]
    assert "…" not in out  # a pipe is not 80 columns: nothing truncated


def test_simulate_table_headers_carry_units(monkeypatch):
    out = _table_text(["simulate", "--r", "1,2", "--batch", "16", "--requests", "600"], monkeypatch)
    for header in ("throughput (tokens/cycle/inst)", "TPOT (cycles/token)", "T_80 (cycles)"):
        assert header in out
    assert "…" not in out


def test_calibrated_tables_are_in_microseconds(monkeypatch):
    out = _table_text(["ratio", "--model", "llama-3.1-8b", "--attn-gpu", "h100", "--r", "2"], monkeypatch)
    assert "tau_mf (us)" in out and "beta (us)" in out and "us/token" in out and "us/request" in out
    assert "RMSE (us)" in out


def test_given_coefficients_are_in_their_own_unit(monkeypatch):
    out = _table_text(["ratio", "--alpha-a", "1", "--r", "2"], monkeypatch)
    assert "tau_mf (t)" in out and "the unit of the --alpha-*/--beta-* values given" in out


def test_every_option_is_a_field_of_the_commands_request():
    """Each setting is declared once, on its request model; the CLI adds only --json."""
    from typer.main import get_command

    from opweave_planner.afd.request import RatioRequest, SimulateRequest

    commands = get_command(app).commands
    for name, model in (("ratio", RatioRequest), ("simulate", SimulateRequest)):
        assert {p.name for p in commands[name].params} == {*model.model_fields, "json"}


def test_the_request_validates_without_the_cli():
    from opweave_planner.afd.request import SimulateRequest

    req = SimulateRequest(r="1,2", context="8k", model="llama-3.1-8b", attn_gpu="h100")
    assert req.r == (1, 2) and req.context == 8192 and req.attn_tp == 1
    with pytest.raises(UserError, match="--ctx: only apply with --model"):
        SimulateRequest(context="8k")
    with pytest.raises(UserError, match="--attn-tp: expected an integer >= 1"):
        SimulateRequest(model="llama-3.1-8b", attn_gpu="h100", attn_tp=0)
