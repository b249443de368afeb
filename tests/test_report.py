"""What a user reads: the plan summary on stderr (terminal or not), per-entry lines, tables
that do not wrap in logs, a fast import, and the `theory` default TP."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from test_theory import _app as _theory_app  # the same one-command typer app
from typer.testing import CliRunner

from opweave_planner import report
from opweave_planner.plan import Plan

GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.fixture
def plan() -> Plan:
    return Plan.model_validate(orjson.loads((GOLDEN / "llama-3.1-8b_afd_h100+a100_v1.1.json").read_bytes()))


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)


def test_measured_share_is_latency_weighted():
    stages = [{"latency_ms": 3.0, "measured_fraction": 1.0}, {"latency_ms": 1.0, "measured_fraction": 0.0}]
    assert report.measured_share(stages) == pytest.approx(0.75)
    assert report.measured_share([{"latency_ms": 1.0, "measured_fraction": None}]) is None
    assert report.measured_share([{"latency_ms": 0.0, "measured_fraction": 1.0}]) is None


def test_measured_share_of_a_real_plan(plan):
    lat = [s.latency_ms for s in plan.stages]
    expected = sum(s.latency_ms * s.measured_fraction for s in plan.stages) / sum(lat)
    assert report.measured_share(plan.stages) == pytest.approx(expected)
    assert report.measured_share(orjson.loads(plan.model_dump_json())["stages"]) == pytest.approx(expected)


def test_summary_goes_to_stderr_when_not_a_terminal(plan, capsys):
    report.render_plan_summary(plan)
    cap = capsys.readouterr()
    assert cap.out == ""
    head = cap.err.splitlines()[0]
    assert f"{plan.usd_per_million_tokens:.4f} USD/M tokens" in head
    assert f"TPOT {plan.tpot_ms:.2f} ms" in head
    assert f"{plan.gpus_total} GPUs" in head and f"{plan.num_stages} stages" in head
    share = report.measured_share(plan.stages)
    assert f"measured share of the plan's latency: {share:.0%}" in cap.err
    assert "warning" not in cap.err and "alternatives" not in cap.err


def test_summary_names_the_gpu_mix(plan):
    mix = report.gpu_mix(plan.owners)
    assert all(o.gpu in mix and f"TP{o.tensor_parallel}" in mix for o in plan.owners)
    assert report.gpu_mix([{"gpu": "h200", "tensor_parallel": 2, "replicas": 1, "expert_parallel": 1},
                           {"gpu": "h200", "tensor_parallel": 8, "replicas": 2, "expert_parallel": 1}]) \
        == "h200 TP2 x1 + TP8 x2"


def test_summary_warns_about_unmeasured_or_estimated_chosen_gpus(plan, capsys):
    chosen = sorted({o.gpu for o in plan.owners})
    report.render_plan_summary(plan, unmeasured_gpus=[chosen[0], "b200"], estimated_price_gpus=["h20", chosen[-1]])
    warn = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning: ")]
    assert len(warn) == 1
    assert f"{chosen[0]}: no measured kernel tables" in warn[0] and f"{chosen[-1]}: price is an estimate" in warn[0]
    assert "b200" not in warn[0] and "h20," not in warn[0]  # only the plan's own GPU types


def test_summary_alternatives_slot(plan, capsys):
    report.render_plan_summary(plan, alternatives=[("colocated", plan.usd_per_million_tokens * 1.5, 41.0),
                                                   ("cad", None, None)])
    line = next(ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("alternatives: "))
    assert "colocated" in line and "1.50x this plan's cost" in line and "TPOT 41.00 ms" in line
    assert "cad infeasible" in line


def test_summary_does_not_wrap_at_80_columns_in_a_pipe(plan):
    buf = io.StringIO()
    report.render_plan_summary(plan, file=buf)
    head = buf.getvalue().splitlines()[0]
    assert len(head) > 80 and head == report.plan_headline(plan)


def test_non_terminal_console_is_wide_unless_columns_is_set(monkeypatch):
    assert report.console(file=io.StringIO()).width == report.WIDE
    monkeypatch.setenv("COLUMNS", "100")
    assert report.console(file=io.StringIO()).width == 100


def test_wide_table_cells_are_not_truncated_in_a_pipe():
    from rich.table import Table

    buf = io.StringIO()
    t = Table(*[f"a rather long column header {i}" for i in range(6)])
    t.add_row(*[f"cell value number {i} that is long" for i in range(6)])
    report.console(file=buf).print(t)
    out = buf.getvalue()
    assert "…" not in out and "a rather long column header 5" in out
    assert all(f"cell value number {i} that is long" in out for i in range(6))


@pytest.mark.parametrize("kw, line", [
    ({"usd_per_mtok": 1.3972, "status": "unchanged"}, "[37/270] gemma-3-27b 32k 60ms: 1.397 USD/Mtok (unchanged)"),
    ({"usd_per_mtok": 1.3972, "measured": 0.09, "status": "changed"},
     "[37/270] gemma-3-27b 32k 60ms: 1.397 USD/Mtok, 9% measured (changed)"),
    ({"reason": "the lowest achievable TPOT is 5.5 ms > SLO 2 ms"},
     "[37/270] gemma-3-27b 32k 60ms: infeasible: the lowest achievable TPOT is 5.5 ms > SLO 2 ms"),
])
def test_entry_line(kw, line):
    assert report.entry_line(37, 270, "gemma-3-27b 32k 60ms", **kw) == line


def test_import_stays_light():
    code = ("import sys, opweave_planner.report; "
            "print([m for m in ('numpy', 'numba', 'rich', 'scipy', 'pydantic') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- #
# theory: a default TP that fits
# --------------------------------------------------------------------------- #

def test_theory_readme_example_defaults_to_a_tp_that_fits():
    res = CliRunner().invoke(_theory_app(), ["theory", "--model", "llama-3.1-70b", "--gpus", "h100,l40s"])
    assert res.exit_code == 0, res.output
    assert "weights don't fit" not in res.stdout and "TP4 per GPU" in res.stdout
    assert "(!)" not in res.stdout
    assert "…" not in res.stdout  # not truncated at 80 columns either


def test_theory_explicit_tp_is_kept_and_default_tp_is_the_smallest_that_fits():
    from opweave_planner.cli.theory import default_tp

    res = CliRunner().invoke(_theory_app(), ["theory", "--model", "llama-3.1-70b", "--gpus", "h100", "--tp", "1",
                                             "--json"])
    assert res.exit_code == 0 and orjson.loads(res.stdout)["tp"] == 1
    assert default_tp("llama-3.1-8b", "h100,l40s", [1024]) == 1
    assert default_tp("llama-3.1-70b", "h100", [1024]) == 2
    assert default_tp("llama-3.1-70b", "h100,l40s", [1024]) == 4
