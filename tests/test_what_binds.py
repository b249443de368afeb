"""What a user sees, second pass (issue 31 items 1-3, 6): what binds the optimum and what
relaxing it gives, alternatives once per distinct plan, --help at 80 columns, and the README's
test command showing pytest's summary line."""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from opweave_planner import api
from opweave_planner.plan import Binding
from opweave_planner.report import alternative_lines, binding_line, summary_lines

ROOT = Path(__file__).resolve().parent.parent
# one GPU type, TP1, one template: each search is well under a second once compiled
SPACE = dict(gpus="h100", policy="colocated", tensor_parallel_sizes=(1,), max_microbatches=1)


def _plan(slo, ctx, **kw):
    out = api.plan(api.make_request("llama-3.1-8b", slo, ctx, **{**SPACE, **kw}))
    assert out.plan is not None, out.infeasible
    return out


def test_a_memory_bound_plan_says_memory_binds_with_the_figures_and_the_next_batch_cost():
    # 32k context on one H100: a few requests' KV fill the GPU; the SLO is far off
    out = _plan(60, "32k", batches=(4, 8, 12, 16), max_replicas=2)
    plan, b = out.plan, out.plan.binding
    assert out.binding == Binding.MEMORY and plan.schema_version == "1.9"
    assert plan.tpot_ms < 60 and b.next_batch > plan.global_batch
    assert b.memory_used_gib <= b.memory_usable_gib < b.memory_next_gib
    owner = plan.owners[b.memory_owner]
    assert b.memory_used_gib == pytest.approx(owner.memory_bytes_per_gpu / 2**30, rel=1e-6)
    # the relief is this template's optimum at exactly that batch: a search over it alone agrees
    at = _plan(60, "32k", batches=(b.next_batch,), max_replicas=2, batch_caps=False).plan
    assert b.next_usd_per_million_tokens == pytest.approx(at.usd_per_million_tokens, rel=1e-9)
    assert b.next_gpus_total == at.gpus_total and b.next_usd_per_million_tokens >= plan.usd_per_million_tokens
    line = binding_line(plan)
    assert line.startswith(f"binds: memory at B={plan.global_batch}: owner {b.memory_owner} uses ")
    assert f"B={b.next_batch} would need {b.memory_next_gib:.1f} GiB" in line


def test_simulate_judges_the_binding_in_the_space_the_plan_was_searched_over():
    # re-evaluated under its own inputs, a plan says what it said: the next batch of its searched
    # set, not "the batch set" of a context compiled for its one batch
    from opweave_planner.contract import evaluate_plan

    plan = _plan(60, "32k", batches=(4, 8, 12, 16), max_replicas=2).plan
    again = evaluate_plan(plan).plan
    assert again.binding == plan.binding and again.binding.constraint == Binding.MEMORY.value


def test_without_room_for_more_replicas_the_gpu_cap_binds():
    out = _plan(60, "32k", batches=(4, 8, 12, 16), max_replicas=2, max_gpus=1)
    assert out.binding == Binding.GPUS and out.plan.binding.next_gpus_total > 1
    assert "the GPU cap (--max-gpus)" in binding_line(out.plan)


def test_an_slo_bound_plan_names_the_slo_that_would_allow_the_next_batch_and_its_cost():
    loose = _plan(1000, "8k", batches=(8, 16, 32), max_replicas=1).plan
    assert loose.global_batch == 32 and loose.binding.constraint == "batches"
    slo = loose.tpot_ms * 0.999  # just below what B=32 needs
    out = _plan(slo, "8k", batches=(8, 16, 32), max_replicas=1)
    plan, b = out.plan, out.plan.binding
    assert out.binding == Binding.SLO and plan.global_batch < 32 and b.next_batch == 32
    assert b.next_tpot_ms == pytest.approx(loose.tpot_ms, rel=1e-6) and b.next_tpot_ms > slo
    assert b.memory_next_gib <= b.memory_usable_gib
    assert b.next_usd_per_million_tokens < plan.usd_per_million_tokens
    # relaxing the SLO as the line says gives that batch at that cost
    relaxed = math.ceil(b.next_tpot_ms)
    line = binding_line(plan)
    assert f"an SLO of {relaxed} ms would allow it at {b.next_usd_per_million_tokens:.4f} USD/M tokens" in line
    again = _plan(relaxed, "8k", batches=(8, 16, 32), max_replicas=1).plan
    assert again.global_batch == 32
    assert again.usd_per_million_tokens == pytest.approx(b.next_usd_per_million_tokens, rel=1e-9)


def test_a_one_stage_plan_names_the_next_integer_batch_not_the_next_grid_point():
    """Its search is exact over every integer batch (the caps), so what binds is judged at
    B + 1, the --max-num-seqs a user would try next; it read the grid point 64 before."""
    grid = (8, 16, 32, 64)
    slo = _plan(1000, "8k", batches=(48,), max_replicas=1, batch_caps=False).plan.tpot_ms * 0.9999
    out = _plan(slo, "8k", batches=grid, max_replicas=1)
    plan, b = out.plan, out.plan.binding
    assert 32 < plan.global_batch < 64 and out.binding == Binding.SLO
    assert b.next_batch == plan.global_batch + 1
    # B + 1 alone, searched without caps: the same shape, the TPOT the binding names, over the SLO
    at = _plan(1000, "8k", batches=(b.next_batch,), max_replicas=1, batch_caps=False).plan
    assert at.tpot_ms == pytest.approx(b.next_tpot_ms, rel=1e-6) and at.tpot_ms > slo
    assert at.usd_per_million_tokens == pytest.approx(b.next_usd_per_million_tokens, rel=1e-6)
    assert f"binds: the SLO: B={plan.global_batch + 1} with this shape" in binding_line(plan)

    # without the caps the search covers the grid only, so the next batch it could choose is 64
    grid_only = _plan(slo, "8k", batches=grid, max_replicas=1, batch_caps=False).plan
    assert grid_only.global_batch == 32 and grid_only.binding.next_batch == 64


def test_next_batch_steps_by_the_shapes_split_on_every_integer_or_on_the_grid():
    from opweave_planner.plan.binding import next_batch

    grid = (8, 16, 32, 64)
    assert next_batch(grid, 40, [1], every_integer=True) == 41
    assert next_batch(grid, 40, [2, 3], every_integer=True) == 42  # mu x replicas of each owner divide it
    assert next_batch(grid, 63, [2], every_integer=True) == 64
    assert next_batch(grid, 64, [1], every_integer=True) is None  # past the grid's largest: "batches"
    assert next_batch(grid, 40, [1]) == 64 and next_batch(grid, 16, [3]) is None  # multi-stage: the grid


def test_the_summary_carries_the_binding_line_and_a_legend_of_its_terms():
    plan = _plan(60, "32k", batches=(4, 8, 12, 16), max_replicas=2).plan
    lines = summary_lines(plan)
    assert any(x.startswith("binds: memory") for x in lines)
    legend = lines[-1]
    for term in ("B =", "mu =", "owner =", "resident batch =", "two owners =", "θ, CV =", "measured share =",
                 "docs/consuming-a-plan.md"):
        assert term in legend, term


def _fake(owners, cost=1.0):
    return {"owners": owners, "template": {"cuts": []}, "stages": [], "global_batch": 8, "microbatches": 1,
            "usd_per_million_tokens": cost}


def _alt(plan, delta):
    return {"plan": plan, "usd_per_million_tokens": plan["usd_per_million_tokens"], "cost_delta_pct": delta,
            "tpot_ms": 20.0, "tpot_delta_pct": 0.0, "gpus_total": 1, "num_stages": 1}


def test_alternatives_are_one_line_per_distinct_plan_with_every_name():
    this, coloc, two = _fake(["a"]), _fake(["b"], 1.1), _fake(["c"], 1.05)
    plan = {**this, "alternatives": {"colocated": _alt(coloc, 10), "single_gpu_type": _alt(coloc, 10),
                                     "two_owner": _alt(two, 5)}}
    lines = alternative_lines(plan)
    assert lines[0].startswith("simpler alternatives")
    assert [x.split(":")[0].strip() for x in lines[1:]] == ["colocated = single GPU type", "two owners"]
    same = {**this, "alternatives": {"colocated": _alt(this, 0), "single_gpu_type": _alt(this, 0),
                                     "two_owner": _alt(this, 0)}}
    assert alternative_lines(same) == ["this plan is also the cheapest colocated = single GPU type = two owners plan"]


def test_prefer_simpler_shows_the_optimum_as_the_optimum():
    this, best = _fake(["a"], 1.0), _fake(["m"], 0.98)
    plan = {**this, "alternatives": {"colocated": _alt(this, 0), "two_owner": _alt(this, 0),
                                     "single_gpu_type": _alt(best, -2), "optimum": _alt(best, -2)}}
    lines = alternative_lines(plan)
    head = lines.index("the optimum (cheapest; --prefer-simpler chose the simpler plan above):")
    assert lines[head + 1].strip().startswith("optimum = single GPU type:")
    assert not any(x.startswith("simpler alternatives") for x in lines)  # the rest is this plan
    assert "this plan is also the cheapest colocated = two owners plan" in lines


def _help(*argv: str) -> str:
    env = {**os.environ, "COLUMNS": "80"}
    res = subprocess.run([sys.executable, "-c", "from opweave_planner.cli.main import run; run()", *argv,
                          "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout  # a pipe, not a terminal


def test_help_at_80_columns_in_a_pipe_shows_every_option_whole_and_flags_without_a_type():
    from opweave_planner.cli.options import flags
    from opweave_planner.inputs.request import PlanRequest

    text = _help()
    assert max(map(len, text.splitlines())) <= 80 and "…" not in text and "<bool>" not in text
    # every spelling in the option column (before the help text), e.g. "--tensor-parallel-sizes, --tps"
    names = {n for line in text.splitlines() if line.startswith("  -")
             for n in re.findall(r"--[\w-]+", re.split(r"\s{2,}", line.strip())[0])}
    for name in PlanRequest.model_fields:
        for spelling in (f for f in flags(PlanRequest, name) if f.startswith("--")):
            assert spelling.split("/")[0] in names, spelling
    assert re.search(r"^  -q, --quiet +No progress", text, re.M)  # a flag: no value type
    assert "\\[" not in text  # no markup escapes left in plain help
    for sub in (("afd", "ratio"), ("compare",), ("regen",)):
        text = _help(*sub)
        assert max(map(len, text.splitlines())) <= 80 and "<bool>" not in text and "…" not in text, sub
        assert "\\[" not in text, sub


def test_theory_and_afd_ratio_print_a_legend_of_their_symbols():
    from opweave_planner.cli.afd import RATIO_TERMS
    from opweave_planner.cli.theory import THEORY_TERMS

    for term in ("b* =", "G_hom =", "eta =", "x* ", "docs/theory.md"):
        assert term in THEORY_TERMS
    for term in ("kappa_r =", "tau_mf", "docs/afd.md"):
        assert term in RATIO_TERMS
    from conftest import run_cli

    ran = run_cli("afd", "ratio", "--r", "1,2")  # the default coefficients
    assert ran.code == 0, ran.err
    assert "kappa_r = expected maximum" in " ".join(ran.out.split())


def test_the_readme_test_command_prints_the_summary_line_and_skip_reasons():
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"^python3 -m pip install -e '\.\[[a-z,]+\]' && (python3 -m pytest.*)$", readme,
                        re.M).group(1)
    addopts = shlex.split(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
                          ["addopts"])
    args = shlex.split(command)[3:] + addopts
    quiet = sum(a.count("q") for a in args if re.fullmatch(r"-q+", a)) - args.count("-v")
    assert quiet <= 1, args  # -qq drops the "N passed, M skipped" line
    assert any(re.fullmatch(r"-r\w*s\w*", a) for a in args), args  # each skip's reason
    assert command in (ROOT / ".ci" / "run").read_text()  # CI runs it as written
