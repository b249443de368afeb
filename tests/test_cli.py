"""The CLI: bad input gives one stderr line, exit 2, no traceback; the main job runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_helpers import cli


def one_line_error(res: subprocess.CompletedProcess, code: int, needle: str) -> None:
    assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert any(needle in ln for ln in lines), res.stderr
    if code == 2 and lines and lines[0].startswith("error:"):
        assert len(lines) == 1


def test_help_lists_commands():
    res = cli("--help")
    assert res.returncode == 0
    for name in ("inspect", "gpus", "profiles", "theory", "compare", "afd"):
        assert name in res.stdout


def test_help_does_not_import_numba():
    code = "import sys, opweave_planner.cli.main; print('numba' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.strip() == "False False"


def test_the_console_script_collects_again_once_the_search_starts(tmp_path):
    """`run()` holds the cyclic collector while the planner loads (cli/heap.py); the search, and
    every subcommand, runs with it on; a library caller's collector is left as it is."""
    code = ("import gc, sys\n"
            "from opweave_planner.cli import heap\n"
            "from opweave_planner.search import driver\n"
            "seen = []\n"
            "real = driver.run_search\n"
            "driver.run_search = lambda *a, **k: (seen.append(gc.isenabled()), real(*a, **k))[1]\n"
            "heap.settle(); assert gc.isenabled() and not gc.get_freeze_count()  # not held: a no-op\n"
            "from opweave_planner.cli.main import run\n"
            "sys.argv = ['opweave-plan', *sys.argv[1:]]\n"
            "try:\n    run()\nexcept SystemExit as e:\n    print(e.code, seen, gc.isenabled(), gc.get_freeze_count() > 0)\n")
    args = ("--model", "llama-3.1-8b", "--slo", "60ms", "--ctx", "8k", "--gpus", "h100", "--quiet", "--out", str(tmp_path / "p.json"))
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    assert out.stdout.split() == ["0", "[True]", "True", "True"], out.stderr
    code = ("import gc, sys\nfrom opweave_planner.cli.main import run\nsys.argv = ['opweave-plan', 'gpus', '--json']\n"
            "try:\n    run()\nexcept SystemExit as e:\n    print(e.code, gc.isenabled(), file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stderr.split() == ["0", "True"], out.stderr


def test_inspect_json():
    res = cli("inspect", "--model", "gemma-3-27b", "--blocks", "--json")
    info = json.loads(res.stdout)
    assert info["partition"]["block_layers"] == 6 and info["partition"]["tail_layers"] == 2
    assert abs(info["total_params"] / 27.0e9 - 1) < 0.01


@pytest.mark.parametrize("args, needle", [
    (("inspect", "--model", "gemma-3-72b"), "unknown model 'gemma-3-72b'; did you mean"),
    (("--model", "gemma-3-27b", "--slo", "60", "--ctx", "32k"), "has no unit"),
    (("--model", "gemma-3-27b", "--slo", "fast", "--ctx", "32k"), "is not a duration"),
    (("--model", "gemma-3-27b", "--slo", "60ms", "--ctx", "lots"), "is not a token count"),
    (("--model", "gemma-3-27b", "--slo", "60ms", "--ctx", "32k", "--gpus", "h900"), "unknown GPU 'h900'"),
    (("--model", "gemma-3-27b", "--slo", "60ms", "--ctx", "1m"), "exceeds"),
    (("--model", "gemma-3-27b", "--slo", "60ms", "--ctx", "32k", "--policy", "magic"), "unknown policy"),
    (("gpus", "--prices", "nope.json"), "does not exist"),
])
def test_bad_inputs(args, needle):
    one_line_error(cli(*args), 2, needle)


@pytest.mark.parametrize("content, needle", [
    ('{"h100": -1}', "must be non-negative"),
    ('{"h100": "cheap"}', "must be a number"),
    ('{"h999": 2.0}', "unknown GPU 'h999'"),
    ("{not json", "is not valid JSON"),
])
def test_bad_price_files(tmp_path, content, needle):
    f = tmp_path / "prices.json"
    f.write_text(content)
    one_line_error(cli("gpus", "--prices", str(f)), 2, needle)


def test_prices_override_and_toml(tmp_path):
    f = tmp_path / "prices.toml"
    f.write_text('h100_sxm = 2.5\nl40s = 0.9\n')
    res = cli("gpus", "--prices", str(f), "--json")
    gpus = {g["id"]: g for g in json.loads(res.stdout)["gpus"]}
    assert gpus["h100"]["price_per_hour"] == 2.5 and gpus["l40s"]["price_per_hour"] == 0.9


def test_bad_model_configs(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{oops")
    one_line_error(cli("inspect", "--model", str(bad)), 2, "malformed JSON")
    bad.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    one_line_error(cli("inspect", "--model", str(bad)), 2, "missing required key 'hidden_size'")


def test_catalog_adds_gpu(tmp_path):
    cat = tmp_path / "cat.toml"
    cat.write_text('[gpus.mi300x]\nname = "AMD MI300X"\nmemory_gb = 192\nbandwidth_gbps = 5300\n'
                   'bf16_tflops = 1307\nfp8_tflops = 2615\nprice_per_hour = 3.0\ngpus_per_node = 8\n'
                   'intra_node_gbps = 448\n')
    res = cli("gpus", "--catalog", str(cat), "--json")
    assert "mi300x" in [g["id"] for g in json.loads(res.stdout)["gpus"]]
    cat.write_text('[gpus.x]\nname = "X"\nmemory_gb = -1\n')
    one_line_error(cli("gpus", "--catalog", str(cat)), 2, "gpus.x")


def test_plan_is_written_atomically_and_deterministic(tmp_path):
    args = ("--model", "llama-3.1-8b", "--slo", "60ms", "--ctx", "8k", "--gpus", "h100",
            "--policy", "colocated", "-q")
    a = cli(*args, "--out", str(tmp_path / "a.json"))
    b = cli(*args, "--out", str(tmp_path / "b.json"))
    assert a.returncode == b.returncode == 0, a.stderr
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    plan = json.loads((tmp_path / "a.json").read_text())
    assert plan["num_stages"] == 1 and plan["tpot_ms"] <= 60
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_infeasible_exit_3_names_the_binding_constraint(tmp_path):
    res = cli("--model", "llama-3.1-8b", "--slo", "0.5ms", "--ctx", "8k", "--gpus", "h100",
              "--policy", "colocated", "-q", "--out", str(tmp_path / "p.json"))
    assert res.returncode == 3
    assert "lowest achievable TPOT" in res.stderr and "Traceback" not in res.stderr
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["feasible"] is False and "SLO" in doc["reason"]
