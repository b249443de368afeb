"""Plans of the same trace made in two checkouts are the same bytes (issue 31): a plan records
its trace relative to the working directory, and `diff` identifies a trace by its sha256."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
from cli_helpers import cli

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "examples" / "traces" / "azure-conv-sample.csv"
MATRIX = ('max_owners = 1\nbatches = [8, 16]\ntps = [1]\nmax_replicas = 1\n'
          '[[entry]]\nmodels = "llama-3.1-8b"\nworkloads = ["traces/azure.csv"]\nslos = "30ms"\n'
          'gpus = "h100"\npolicies = "colocated"\n'
          # a model given by its config.json (recorded in model_source)
          '[[entry]]\nmodels = "cfg/llama-3.1-8b.json"\ncontexts = "8k"\nslos = "30ms"\n'
          'gpus = "h100"\npolicies = "colocated"\n')
NAME = "llama-3.1-8b_wl-azure_slo30ms_h100_colocated.json"


def _checkout(root: Path) -> Path:
    (root / "traces").mkdir(parents=True)
    shutil.copy(TRACE, root / "traces" / "azure.csv")
    (root / "cfg").mkdir()
    shutil.copy(ROOT / "models" / "llama-3.1-8b.json", root / "cfg" / "llama-3.1-8b.json")
    (root / "matrix.toml").write_text(MATRIX)
    return root


def test_two_checkouts_write_identical_bytes_and_diff_sees_one_workload(tmp_path):
    a, b = _checkout(tmp_path / "clone-a"), _checkout(tmp_path / "deeper" / "clone-b")
    for root in (a, b):  # each CI run works in its own checkout, the matrix named relative to it
        r = cli("regen", "--matrix", "matrix.toml", "--out", "plans", "-q", cwd=root)
        assert r.returncode == 1, r.stderr
    pa, pb = a / "plans" / NAME, b / "plans" / NAME
    files = sorted(p.name for p in (a / "plans").glob("*.json"))
    assert len(files) == 2 and files == sorted(p.name for p in (b / "plans").glob("*.json"))
    for name in files:
        assert (a / "plans" / name).read_bytes() == (b / "plans" / name).read_bytes(), name
    by_path = next(n for n in files if n != NAME)
    assert orjson.loads((a / "plans" / by_path).read_bytes())["model_source"] == "cfg/llama-3.1-8b.json"
    dist = orjson.loads(pa.read_bytes())["workload"]["distribution"]
    assert dist["workload"] == "traces/azure.csv" and dist["sha256"]
    same = cli("diff", str(pa), str(pb))
    assert same.returncode == 0 and "workload" not in same.stdout, same.stdout
    # a plan of clone-b made from outside it records the trace by absolute path: still one workload
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = cli("--model", "llama-3.1-8b", "--workload", str(b / "traces" / "azure.csv"), "--slo", "30ms",
            "--gpus", "h100", "--policy", "colocated", "--max-owners", "1", "--batches", "8,16",
            "--tensor-parallel-sizes", "1", "--max-replicas", "1", "--out", str(tmp_path / "abs.json"),
            cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    absolute = orjson.loads((tmp_path / "abs.json").read_bytes())["workload"]["distribution"]["workload"]
    assert absolute == str((b / "traces" / "azure.csv").resolve())
    moved = cli("diff", str(pa), str(tmp_path / "abs.json"))
    assert "workload traces/azure.csv ->" not in moved.stdout and "request:" not in moved.stdout, moved.stdout
    assert "(same sha256)" in moved.stdout, moved.stdout
