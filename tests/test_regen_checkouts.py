"""Plans of the same inputs made in two checkouts are the same bytes (issue 31): a plan records
its trace and a model's config.json relative to the working directory, and `diff` identifies a
trace by its sha256."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson

from opweave_planner import api
from opweave_planner.contract import diff_plans, read_plan
from opweave_planner.plan import plan_bytes
from opweave_planner.regen import regen

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "examples" / "traces" / "azure-conv-sample.csv"
SPACE = dict(max_owners=1, batches="8,16", tensor_parallel_sizes="1", max_replicas=1)
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


def test_two_checkouts_write_identical_bytes_and_diff_sees_one_workload(tmp_path, monkeypatch):
    a, b = _checkout(tmp_path / "clone-a"), _checkout(tmp_path / "deeper" / "clone-b")
    for root in (a, b):  # each CI run works in its own checkout, the matrix named relative to it
        monkeypatch.chdir(root)
        assert regen("matrix.toml", "plans").exit_code == 1
    files = sorted(p.name for p in (a / "plans").glob("*.json"))
    assert len(files) == 2 and files == sorted(p.name for p in (b / "plans").glob("*.json"))
    for name in files:
        assert (a / "plans" / name).read_bytes() == (b / "plans" / name).read_bytes(), name
    by_path = next(n for n in files if n != NAME)
    assert orjson.loads((a / "plans" / by_path).read_bytes())["model_source"] == "cfg/llama-3.1-8b.json"
    pa = a / "plans" / NAME
    dist = orjson.loads(pa.read_bytes())["workload"]["distribution"]
    assert dist["workload"] == "traces/azure.csv" and dist["sha256"]
    # a plan of clone-b's trace made from outside it records it by absolute path: still one workload
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    trace = b / "traces" / "azure.csv"
    plan = api.plan(api.make_request("llama-3.1-8b", "30ms", workload=str(trace), gpus="h100",
                                     policy="colocated", **SPACE)).plan
    doc = orjson.loads(plan_bytes(plan))
    assert doc["workload"]["distribution"]["workload"] == str(trace.resolve())
    d = diff_plans(read_plan(pa), plan)
    assert d["equivalent"] and not [c for c in d["changes"] if c["aspect"] == "request"], d
    assert any("(same sha256)" in n for n in d["notes"]), d["notes"]
