"""`compare`: dominance, JSON round-trip, table rendering, baseline stage counts."""

from __future__ import annotations

import io
import subprocess
import sys

import orjson
import pytest

from opweave_planner import api
from opweave_planner.compare import (
    BASELINES,
    compare,
    iter_violations,
    network_grid,
    parse_bandwidth_gbps,
)
from opweave_planner.errors import UserError
from opweave_planner.plan import dumps

SMALL = dict(max_owners=2, batches=(1, 2, 4, 8, 16, 32, 64), max_replicas=2)


@pytest.fixture(scope="module")
def small():
    # 3.5 ms is met by colocated/opweave on H100 but not by AFD/CAD (one transfer per half-layer)
    return compare("llama-3.1-8b", ["8k"], ["3.5ms", "60ms"], gpus="h100", **SMALL)


def test_dominance(small):
    assert iter_violations(small) == []
    for c in small["cells"]:
        ours = c["policies"]["opweave"]
        assert ours["feasible"]
        for p in BASELINES:
            e = c["policies"][p]
            if e["feasible"]:
                assert ours["usd_per_million_tokens"] <= e["usd_per_million_tokens"] * (1 + 1e-9)
        assert c["ratio"] is not None and c["ratio"] >= 1 - 1e-9
        assert c["ratio"] == pytest.approx(c["best_baseline_usd"] / ours["usd_per_million_tokens"], rel=1e-6)


def test_infeasible_cells_carry_reason(small):
    tight = small["cells"][0]
    assert tight["slo_ms"] == 3.5
    bad = [p for p, e in tight["policies"].items() if not e["feasible"]]
    assert bad, "expected some policy to miss a 3.5 ms SLO"
    for p in bad:
        assert tight["policies"][p]["usd_per_million_tokens"] is None
        assert "SLO" in tight["policies"][p]["reason"]


def test_json_round_trip(small):
    again = orjson.loads(dumps(small))
    assert again == small
    assert dumps(again) == dumps(small)


def test_table_renders_with_infeasible_and_ratio(small):
    from rich.console import Console

    from opweave_planner.cli.compare import INFEASIBLE, render_compare

    buf = io.StringIO()
    render_compare(small, Console(file=buf, width=200, highlight=False))
    text = buf.getvalue()
    assert INFEASIBLE in text
    assert all(f"{c['ratio']:.2f}×" in text for c in small["cells"])
    for p in ("opweave", "colocated", "afd", "cad"):
        assert p in text


def test_heterogeneous_not_dearer_than_homogeneous():
    r = compare("llama-3.1-8b", ["8k"], ["60ms"], gpus="h100,a100", policies="opweave,colocated", **SMALL)
    c = r["cells"][0]
    assert set(c["homogeneous"]) == {"h100", "a100"}
    assert c["hetero_ratio"] is not None and c["hetero_ratio"] >= 1 - 1e-9
    assert iter_violations(r) == []


def test_network_sweep_reoptimizes_each_setting():
    nets = network_grid([5.0, 500.0], [1.0])
    assert nets == [(None, 5.0), (None, 500.0), (1.0, None)]
    r = compare("llama-3.1-8b", "8k", "60ms", gpus="h100", policies=["opweave", "afd"], networks=nets, **SMALL)
    assert len(r["cells"]) == 3
    assert [c["network"] for c in r["cells"]] == [
        {"gbps": None, "latency_us": 5.0}, {"gbps": None, "latency_us": 500.0}, {"gbps": 1.0, "latency_us": None}]
    assert iter_violations(r) == []


@pytest.mark.parametrize("model,stages", [("gemma-3-27b", 124), ("qwen3-next-80b-a3b", 96)])
def test_baseline_stage_counts(model, stages):
    for policy, want in (("afd", stages), ("cad", stages), ("colocated", 1)):
        _outcome = api.plan(api.make_request(model, "80ms", "8k", gpus="h100", policy=policy, **SMALL))
        plan, inf = _outcome.plan, _outcome.infeasible
        assert inf is None, inf and inf.reason
        assert plan.num_stages == want, (policy, plan.num_stages)


def test_parsing_and_errors():
    assert parse_bandwidth_gbps("4GBps") == 4.0
    assert parse_bandwidth_gbps("4") == 4.0
    assert parse_bandwidth_gbps("100Gbps") == 12.5
    with pytest.raises(UserError):
        parse_bandwidth_gbps("fast")
    with pytest.raises(UserError, match="--policies"):
        compare("llama-3.1-8b", "8k", "60ms", gpus="h100", policies="opweave,pd")


def test_cli_module_imports_only_typer_and_stdlib():
    code = ("import sys; import opweave_planner.cli.compare; "
            "bad = [m for m in ('numpy', 'numba', 'rich', 'orjson', 'matplotlib') if m in sys.modules]; "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_cli_json_and_plot(tmp_path):
    import typer
    from typer.testing import CliRunner

    from opweave_planner.cli.compare import compare_cmd

    app = typer.Typer()
    app.command("compare")(compare_cmd)
    app.command("noop")(lambda: None)
    res = CliRunner().invoke(app, ["compare", "--model", "llama-3.1-8b", "--ctx", "8k", "--slo", "60ms",
                                   "--gpus", "h100", "--policies", "opweave,colocated", "--max-gpus", "4",
                                   "--network-latency", "5,500us", "--json", "-q"])
    assert res.exit_code == 0, res.output
    doc = orjson.loads(res.stdout)
    assert [c["network"]["latency_us"] for c in doc["cells"]] == [5.0, 500.0]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("matplotlib not installed")
    png = tmp_path / "frontier.png"
    res = CliRunner().invoke(app, ["compare", "--model", "llama-3.1-8b", "--ctx", "8k", "--slo", "60ms",
                                   "--gpus", "h100", "--policies", "opweave,afd", "--max-gpus", "4",
                                   "--plot", str(png), "-q"])
    assert res.exit_code == 0, res.output
    assert png.read_bytes().startswith(b"\x89PNG") and b"Software" not in png.read_bytes()
    # the frontier of the JSON document above: one panel per network cell, a series per policy
    from opweave_planner.cli.compare import frontier_series, plot_compare

    panels = frontier_series(doc)
    assert list(panels) == ["ctx 8k, default / 5us", "ctx 8k, default / 500us"]
    for cell, series in zip(doc["cells"], panels.values()):
        for p in ("opweave", "colocated"):
            usd = cell["policies"][p]["usd_per_million_tokens"]
            assert series[f"{p} on h100"] == ([] if usd is None else [(60.0, usd)])
    a, b = tmp_path / "a.svg", tmp_path / "b.svg"
    plot_compare(doc, str(a))
    plot_compare(doc, str(b))
    assert a.read_bytes() == b.read_bytes() and b"<dc:date>" not in a.read_bytes()  # deterministic


def test_parallel_executor_gives_identical_result(small):
    """Independent searches run through the shared executor; 2 processes == in-process."""
    again = compare("llama-3.1-8b", ["8k"], ["3.5ms", "60ms"], gpus="h100", jobs=2, **SMALL)
    assert dumps(again) == dumps(small)


def test_every_option_is_a_field_of_a_request():
    """compare's options are CompareRequest's fields and PlanRequest's unswept ones, each once."""
    import typer
    from typer.main import get_command

    from opweave_planner.cli.compare import SWEPT, compare_cmd
    from opweave_planner.compare import CompareRequest
    from opweave_planner.inputs.request import PlanRequest

    app = typer.Typer()
    app.command("compare")(compare_cmd)
    app.command("noop")(lambda: None)
    names = [p.name for p in get_command(app).commands["compare"].params]
    assert len(names) == len(set(names))
    own = {"as_json", "plot", "jobs", "ray", "quiet"}
    assert set(names) == {*CompareRequest.model_fields, *(set(PlanRequest.model_fields) - set(SWEPT)), *own}


def test_compare_request_shares_a_trailing_unit():
    from opweave_planner.compare import CompareRequest

    req = CompareRequest(model="m", network_bandwidth="1,2,100Gbps", network_latency="5,0.5ms", ctx="8k")
    assert req.network_bandwidth == (0.125, 0.25, 12.5) and req.network_latency == (5000.0, 500.0)  # "5" takes the ms too
    assert req.ctx == (8192,) and CompareRequest(model="m").ctx == (8192, 32768, 131072)
    with pytest.raises(UserError, match="--policies: unknown policy 'pd'"):
        CompareRequest(model="m", policies="opweave,pd")
