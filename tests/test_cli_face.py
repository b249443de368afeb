"""What a user sees (issue 17): version, -h, summaries and progress off a terminal, --format table,
help texts that keep their bracketed words."""

from __future__ import annotations

import json
import re

from cli_helpers import cli

from opweave_planner import __version__

TINY = ("--model", "llama-3.1-8b", "--slo", "60ms", "--ctx", "8k", "--gpus", "h100", "--batches", "8,16",
        "--max-owners", "2")


def test_version_and_short_help():
    res = cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"opweave-planner {__version__}"
    short = cli("-h")
    assert short.returncode == 0 and "--model" in short.stdout and "Usage" in short.stdout


def test_summary_and_progress_reach_a_log_that_is_not_a_terminal():
    res = cli(*TINY)  # stderr is a pipe here, as in `2> log`
    assert res.returncode == 0, res.stderr
    json.loads(res.stdout)  # the plan on stdout
    assert "search (estimated work):" in res.stderr and "done in" in res.stderr  # plain progress lines
    text = " ".join(res.stderr.split())
    assert "USD/M tokens" in text and "measured share of the plan's latency" in text
    # this tiny plan is itself colocated: its alternatives are one plan, named once with every name
    assert "this plan is also the cheapest colocated = single GPU type = two owners plan" in res.stderr
    assert "binds: " in res.stderr


def test_quiet_prints_nothing_on_stderr():
    res = cli(*TINY, "--quiet")
    assert res.returncode == 0 and res.stderr == ""


def test_format_table_writes_the_summary_not_the_json():
    res = cli(*TINY, "--format", "table", "--quiet")
    assert res.returncode == 0, res.stderr
    assert not res.stdout.lstrip().startswith("{") and "USD/M tokens" in res.stdout
    assert len(res.stdout.splitlines()) < 40  # a summary, not the 1,500-line plan


def test_regen_help_keeps_the_ray_extra_in_its_text():
    res = cli("regen", "--help")
    assert res.returncode == 0 and "[ray]" in res.stdout


def test_unmeasured_tables_and_estimated_prices_are_warned_about():
    res = cli("--model", "llama-3.1-8b", "--slo", "60ms", "--ctx", "8k", "--gpus", "b200", "--batches", "8,16",
              "--max-owners", "1")
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stderr.split())  # a COLUMNS setting may wrap the line
    assert "b200: no measured kernel tables" in text and "b200: price is an estimate" in text
    measured = cli("--model", "llama-3.1-8b", "--slo", "60ms", "--ctx", "8k", "--gpus", "h100", "--batches", "8,16",
                   "--max-owners", "1")
    assert "warning:" not in measured.stderr


def test_profiles_show_prints_every_source_it_reports():
    # floored (L40S MoE, L2-resident micro-benchmark) and fitted cells: the human table, not --json
    res = cli("profiles", "show", "--model", "qwen3-30b-a3b", "--gpu", "l40s", "--tp", "2", "--ctx", "8k",
              "--microbatches", "1,8")
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "[source]" in text and "L floored at speed of light" in text
    assert " L " in res.stdout and " F " in res.stdout and " M " in res.stdout


def test_every_source_has_a_tag_and_a_legend_entry():
    from opweave_planner.latency.interp import SOURCE_LEGEND, SOURCE_NAMES, SOURCE_SHORT

    assert set(SOURCE_SHORT) == set(SOURCE_NAMES)
    tags = re.findall(r"(?:^|, )([A-Z]) [a-z]", SOURCE_LEGEND)
    assert sorted(tags) == sorted(SOURCE_SHORT.values())
