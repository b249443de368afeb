"""`regen`: a small matrix, run twice, after a price edit, locally in parallel and on Ray."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from cli_helpers import cli

from opweave_planner.executor import LOST, LocalExecutor, RayExecutor
from opweave_planner.regen import CACHE_FILE, load_matrix, regen

MATRIX = """
prices = "prices.toml"
[space]
max_owners = 2
batches = [8, 16, 32, 64]
max_replicas = 2
tps = [1, 2]

[[entry]]
models = ["llama-3.1-8b"]
contexts = ["8k"]
slos = ["30ms"]
gpus = ["h100", "a100"]
policies = ["colocated", "afd"]

[[entry]]
models = "qwen3-30b-a3b"
contexts = "8k"
slos = "40ms"
gpus = "h100,a100"
policies = ["afd", "opweave"]
"""


@pytest.fixture
def matrix(tmp_path) -> Path:
    (tmp_path / "prices.toml").write_text("h100 = 3.49\na100 = 1.74\n")
    m = tmp_path / "matrix.toml"
    m.write_text(MATRIX)
    return m


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_ino) for p in sorted(folder.glob("*.json"))}


def test_regen_twice_then_price_edit_rewrites_exactly_the_affected(matrix, tmp_path):
    out = tmp_path / "plans"
    first = regen(matrix, out)
    assert first.exit_code == 1 and first.count("new") == 6
    before = snapshot(out)
    (out / CACHE_FILE).unlink()  # re-plan every entry (otherwise unchanged inputs skip the search)
    again = regen(matrix, out, jobs=2)  # parallel: byte-identical, so nothing to rewrite
    assert again.exit_code == 0 and again.count("unchanged") == 6
    assert snapshot(out) == before
    (tmp_path / "prices.toml").write_text("h100 = 3.49\na100 = 1.914\n")  # a100 +10%
    edited = regen(matrix, out)
    assert edited.exit_code == 1
    after = snapshot(out)
    rewritten = {n for n in after if after[n] != before[n]}
    affected = {n for n in before if "a100" in n}  # entries whose searched GPU set holds a100
    assert rewritten == affected and {f.name for f in edited.files if f.status == "changed"} == affected
    for n in set(before) - affected:
        assert after[n] == before[n]  # same bytes, same inode: not rewritten
    assert any("cost:" in f.summary for f in edited.files if f.status == "changed")


def test_unchanged_inputs_skip_the_search_and_any_change_replans(matrix, tmp_path, monkeypatch):
    from opweave_planner import api

    out = tmp_path / "plans"
    regen(matrix, out)
    before = snapshot(out)
    real_plan = api.plan

    def no_search(*a, **kw):
        raise AssertionError("re-planned an entry whose inputs did not change")

    monkeypatch.setattr(api, "plan", no_search)
    again = regen(matrix, out)
    assert again.exit_code == 0 and again.count("unchanged") == 6 and snapshot(out) == before
    assert all("not re-planned" in f.note for f in again.files)
    # a hand-edited file, or a price change, is re-planned (and only those entries)
    monkeypatch.setattr(api, "plan", real_plan)
    edited = sorted(out.glob("*.json"))[0]
    edited.write_bytes(edited.read_bytes() + b" ")
    (tmp_path / "prices.toml").write_text("h100 = 3.49\na100 = 1.914\n")
    seen = []
    monkeypatch.setattr(api, "plan", lambda req, **kw: (seen.append(req), real_plan(req, **kw))[1])
    third = regen(matrix, out)
    assert third.exit_code == 1
    replanned = {str(r.gpus) for r in seen}
    assert len(seen) == sum("a100" in n for n in before) + ("a100" not in edited.name)
    assert all("a100" in g for g in replanned - {str(load_matrix(matrix)[0].request.gpus)})
    assert edited.read_bytes() != before[edited.name][0] + b" "  # restored to the planner's bytes


def test_regen_cli_exit_codes_and_stale_files(matrix, tmp_path):
    out = tmp_path / "plans"
    r1 = cli("regen", "--matrix", str(matrix), "--out", str(out), "--jobs", "2")
    assert r1.returncode == 1 and "6 new" in r1.stdout, r1.stderr
    plan_file = sorted(out.glob("*.json"))[0]
    (out / "old_entry.json").write_bytes(plan_file.read_bytes())  # a plan the matrix no longer lists
    (out / "unrelated.json").write_text("{}")  # not ours: never reported, never pruned
    r2 = cli("regen", "--matrix", str(matrix), "--out", str(out))
    assert r2.returncode == 0 and "not in the matrix" in r2.stdout, r2.stderr
    assert "unrelated" not in r2.stdout
    assert r2.stderr.count("(unchanged") == 6  # one line per entry
    r3 = cli("regen", "--matrix", str(matrix), "--out", str(out), "--prune")
    assert r3.returncode == 1 and not (out / "old_entry.json").exists()
    assert (out / "unrelated.json").exists()


@pytest.mark.parametrize("edit, needle", [
    (lambda s: s.replace('"llama-3.1-8b"', '"llama-9"'), "unknown model 'llama-9'"),
    (lambda s: s.replace('slos = ["30ms"]', 'slos = ["30"]'), "has no unit"),
    (lambda s: s.replace("max_owners = 2", "max_owners = 0"), "--max-owners: input should be greater than or equal to 1"),
    (lambda s: s.replace('policies = ["colocated", "afd"]', 'policies = ["colocated", "colocated"]'), "duplicates"),
    (lambda s: s + "\nbogus = 1\n", "unknown key 'bogus'"),
    (lambda s: s.replace('prices = "prices.toml"', 'prices = "missing.toml"'), "does not exist"),
    (lambda s: "[[entry", "is not valid TOML"),
])
def test_regen_bad_input_is_one_line_exit_2(matrix, tmp_path, edit, needle):
    matrix.write_text(edit(matrix.read_text()))
    res = cli("regen", "--matrix", str(matrix), "--out", str(tmp_path / "plans"))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert not (tmp_path / "plans").exists()


def test_matrix_names_and_paths(matrix):
    tasks = load_matrix(matrix)
    assert [t.name for t in tasks][:2] == ["llama-3.1-8b_ctx8k_slo30ms_h100_colocated.json",
                                           "llama-3.1-8b_ctx8k_slo30ms_h100_afd.json"]
    assert all(t.request.prices == str((matrix.parent / "prices.toml").resolve()) for t in tasks)


def test_bundled_example_matrix_loads():
    tasks = load_matrix(Path(__file__).parents[1] / "examples" / "matrix.toml")
    assert len(tasks) > 50 and len({t.request.model for t in tasks}) == 10


# ----------------------------------------------------------------------------- executor

def flaky(arg):
    """Fails (raise or crash) the first time it sees a marker path, succeeds afterwards."""
    mode, marker, value = arg
    if mode != "ok" and not os.path.exists(marker):
        Path(marker).write_text("x")
        if mode == "crash":
            os._exit(13)
        raise RuntimeError("transient failure")
    if mode == "always":
        raise RuntimeError("permanent failure")
    return value * 2


@pytest.mark.parametrize("jobs", [1, 3])
def test_local_executor_retries_and_reports_per_entry(tmp_path, jobs):
    items = [("ok", "", 1), ("raise", str(tmp_path / f"r{jobs}"), 2), ("always", str(tmp_path / f"a{jobs}"), 3),
             ("ok", "", 4)]
    if jobs > 1:
        items.append(("crash", str(tmp_path / "c"), 5))
    res = LocalExecutor(jobs, retries=1).map(flaky, items, [f"e{i}" for i in range(len(items))])
    assert [r.key for r in res] == [f"e{i}" for i in range(len(items))]
    assert res[0].ok and res[0].value == 2 and res[3].ok and res[3].value == 8
    assert res[1].ok and res[1].value == 4 and res[1].attempts == 2
    assert not res[2].ok and "permanent failure" in res[2].error and res[2].attempts == 2
    if jobs > 1:
        assert res[4].ok and res[4].value == 10 and res[4].attempts == 2  # lost worker, retried


def test_crash_without_retries_is_reported_as_lost(tmp_path):
    res = LocalExecutor(2, retries=0).map(flaky, [("crash", str(tmp_path / "c"), 1), ("ok", "", 2)])
    assert not res[0].ok and res[0].error == LOST


# ----------------------------------------------------------------------------- Ray

@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    cloudpickle = pytest.importorskip("ray.cloudpickle")

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test helpers travel by value
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield ray
    ray.shutdown()


def test_regen_on_ray_is_byte_identical_to_local(local_ray, matrix, tmp_path):
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert regen(matrix, local, jobs=1).exit_code == 1
    report = regen(matrix, remote, ray="auto")
    assert report.exit_code == 1 and report.executor == "Ray (auto)"
    assert {n: b for n, (b, _) in snapshot(local).items()} == {n: b for n, (b, _) in snapshot(remote).items()}
    assert regen(matrix, remote, ray="auto").exit_code == 0


def test_regen_hysteresis_on_ray_is_byte_identical_to_local(local_ray, matrix, tmp_path):
    import shutil

    first = tmp_path / "first"
    assert regen(matrix, first).exit_code == 1
    (tmp_path / "prices.toml").write_text("h100 = 3.49\na100 = 2.0\n")  # moves both qwen optima
    local, remote = tmp_path / "local", tmp_path / "ray"
    shutil.copytree(first, local)
    shutil.copytree(first, remote)
    a = regen(matrix, local, hysteresis="20%")
    b = regen(matrix, remote, ray="auto", hysteresis="20%")
    assert [f.name for f in a.kept] == [f.name for f in b.kept] == [
        "qwen3-30b-a3b_ctx8k_slo40ms_h100+a100_afd.json", "qwen3-30b-a3b_ctx8k_slo40ms_h100+a100_opweave.json"]
    assert {n: v for n, (v, _) in snapshot(local).items()} == {n: v for n, (v, _) in snapshot(remote).items()}


def test_ray_executor_retries_and_keeps_successes(local_ray, tmp_path):
    items = [("raise", str(tmp_path / "r"), 1), ("always", str(tmp_path / "a"), 2), ("ok", "", 3),
             ("crash", str(tmp_path / "c"), 4)]
    res = RayExecutor("auto", retries=1).map(flaky, items)
    assert res[0].ok and res[0].value == 2
    assert not res[1].ok and "permanent failure" in res[1].error
    assert res[2].ok and res[2].value == 6
    assert res[3].ok and res[3].value == 8  # lost worker, retried by Ray


def test_workers_get_the_heaviest_entries_first(matrix):
    """With several workers the opweave search over two GPU types starts first and the
    one-template colocated entries last, so no long entry runs alone at the end; the order
    is a permutation (every entry once) and ties keep the matrix order."""
    from opweave_planner.regen import expected_cost, heaviest_first

    tasks = load_matrix(matrix)
    order = [tasks[i] for i in heaviest_first(tasks)]
    assert sorted(t.name for t in order) == sorted(t.name for t in tasks)
    assert str(order[0].request.policy) == "opweave" and len(order[0].request.gpus) == 2
    assert all(str(t.request.policy) == "colocated" for t in order[-2:])
    costs = [expected_cost(t) for t in order]
    assert costs == sorted(costs, reverse=True)
    same = [t.name for t in order if expected_cost(t) == expected_cost(order[-1])]
    assert same == [t.name for t in tasks if t.name in same]  # ties: matrix order
