"""Issue 18: bad input never crashes, never passes as valid, never leaves the tool unable to
read its own output. One regression test per listed case (the model-config cases live with
inputs/model.py's tests). Runs go through the console-script guard in this process
(`conftest.run_cli`), so what is checked is the exit code and stderr a shell would see.

Every case passes; none is marked xfail (the changes they once waited for have landed).
"""

from __future__ import annotations

import builtins
import copy
import errno
import io
import json
import os
import time
from pathlib import Path

import orjson
import pytest
from conftest import AFD_PLAN, GOLDEN, TINY, assert_one_line_error, run_cli

from opweave_planner.contract import read_plan

# --------------------------------------------------------------------------- helpers


@pytest.fixture
def unreadable(monkeypatch):
    """Make opening the given paths fail with EACCES (tests run as root, where chmod 000 reads)."""
    blocked: set[str] = set()
    real_open, real_os_open = builtins.open, os.open

    def _blocked(file) -> bool:
        try:
            return os.path.abspath(os.fspath(file)) in blocked
        except TypeError:
            return False

    def fake_open(file, *a, **kw):
        if _blocked(file):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(file))
        return real_open(file, *a, **kw)

    def fake_os_open(file, *a, **kw):
        if _blocked(file):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(file))
        return real_os_open(file, *a, **kw)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)

    def block(path: Path) -> Path:
        blocked.add(os.path.abspath(path))
        return path

    return block


@pytest.fixture
def no_search(monkeypatch):
    """Fail the test if a search starts: a path must be checked before the work."""
    from opweave_planner import api

    def boom(*a, **kw):
        raise AssertionError("the search ran before the bad path was reported")

    monkeypatch.setattr(api, "plan", boom)


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    return path


def _tampered(tmp_path: Path, change) -> Path:
    doc = orjson.loads(AFD_PLAN.read_bytes())
    change(doc)
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(doc))  # json: ints beyond 64 bits too
    return path


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def change(doc):
        node = doc
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return change


# --------------------------------------------------------------------------- numbers on the command line

@pytest.mark.parametrize(("flag", "value"), [
    ("--network-bandwidth", "nan"), ("--network-bandwidth", "inf"), ("--network-bandwidth", "0"),
    ("--memory-reserve-gb", "nan"), ("--reserve-gb", "nan"), ("--reserve-gb", "inf"),
    ("--max-gpus", "99999999999999999999"), ("--max-gpus", "0"), ("--max-gpus", "-1"),
    ("--max-stages", "99999999999999999999"), ("--batches", "99999999999999999999"),
    ("--slo", "1e400ms"), ("--network-latency", "inf"), ("--network-latency", "nan"),
    ("--ctx", "99999999999999999999"),
])
def test_impossible_numbers_are_bad_input_naming_the_flag(flag, value, no_search):
    ran = run_cli(*TINY, flag, value)
    shown = "--memory-reserve-gb" if flag == "--reserve-gb" else flag
    assert_one_line_error(ran, 2, shown)


@pytest.mark.parametrize(("flag", "value"), [
    ("--max-gpus", "abc"), ("--max-owners", "1.5"), ("--reserve-gb", "abc"), ("--jobs", "x")])
def test_non_numeric_values_are_one_line(flag, value):
    ran = run_cli(*TINY, flag, value)
    line = assert_one_line_error(ran, 2, flag if flag != "--reserve-gb" else "--memory-reserve-gb")
    assert value in line
    assert "Usage:" not in ran.err and "╭" not in ran.err


@pytest.mark.parametrize("policy", ["cad", "afd"])
def test_a_two_owner_policy_under_two_gpus_blames_the_gpu_budget(policy, no_search):
    ran = run_cli(*TINY[:8], "--policy", policy, "--max-gpus", "1", "-q")
    line = assert_one_line_error(ran, 2, "--max-gpus", policy)
    assert "memory" not in line


@pytest.mark.parametrize(("flag", "value"), [("--max-gpus", True), ("--pareto", "no"),
                                             ("--moe-expert-parallel", 1), ("--memory-reserve-gb", True)])
def test_request_rejects_bools_as_counts_and_words_as_switches(flag, value):
    from opweave_planner.errors import UserError
    from opweave_planner.inputs.request import make_request

    name = flag.lstrip("-").replace("-", "_")
    with pytest.raises(UserError, match=flag):
        make_request(model="llama-3.1-8b", slo="60ms", ctx="8k", **{name: value})


@pytest.mark.parametrize("argv", [
    ("afd", "ratio", "--prompt-mean", "1e308"), ("afd", "ratio", "--decode-mean", "1e308"),
    ("afd", "ratio", "--alpha-a", "1e308"), ("afd", "ratio", "--r", "1e308"),
    ("afd", "ratio", "--batch", "99999999999999999999"),
    ("afd", "simulate", "--requests", "1e20"), ("afd", "simulate", "--requests", "100000000000000000000"),
    ("afd", "simulate", "--requests", "10000000000"), ("afd", "simulate", "--r", "99999999"),
    ("afd", "simulate", "--mc", "--trials", "1e20"),
    ("afd", "simulate", "--mc", "--trials", "100000000000000000000"),
    ("afd", "simulate", "--mc", "--trials", "1000000000000"),
    ("afd", "simulate", "--seed", "-1"), ("afd", "simulate", "--seed", "99999999999999999999"),
    ("afd", "simulate", "--batches-in-flight", "1000000000"),
    ("theory", "--model", "llama-3.1-8b", "--tp", "99999999999999999999"),
    ("theory", "--model", "llama-3.1-8b", "--microbatches", "99999999999999999999"),
    ("theory", "--model", "llama-3.1-8b", "--ctx", "1k..99999999999999999999"),
], ids=lambda a: " ".join(a[:4]))
def test_counts_no_run_could_honour_are_rejected_at_once(argv):
    start = time.perf_counter()
    ran = run_cli(*argv, "--json")
    flag = next(a for a in argv[::-1] if a.startswith("--"))
    line = assert_one_line_error(ran, 2)
    assert flag in line or flag.removeprefix("--").replace("-", "_") in line, line
    assert time.perf_counter() - start < 20, "must not run (or hang) before rejecting the count"


def test_afd_bounds_leave_the_defaults_alone():
    from opweave_planner.afd import simulator as sim

    sim.check_bundle_work([1, 2, 4, 8, 16, 24, 32], 256, 2, 10_000, 500.0)
    sim.check_mc_work([1, 2, 4, 8, 16, 24, 32], 256, 50_000)


# --------------------------------------------------------------------------- files and paths

def test_unreadable_plan_file_is_one_line(tmp_path, afd_plan, unreadable):
    unreadable(afd_plan)
    for argv in (("simulate", afd_plan), ("diff", afd_plan, AFD_PLAN),
                 ("export", afd_plan, "--to", "vllm", "--out", tmp_path / "x")):
        line = assert_one_line_error(run_cli(*argv), 2, str(afd_plan))
        assert "not readable" in line or "Permission denied" in line


@pytest.mark.parametrize("flag", ["--prices", "--catalog"])
def test_unreadable_prices_or_catalog_names_the_flag(tmp_path, unreadable, flag, no_search):
    path = tmp_path / "table.json"
    path.write_text('{"h100": 2.0}' if flag == "--prices" else '{"gpus": {}}')
    unreadable(path)
    assert_one_line_error(run_cli(*TINY, flag, path), 2, flag, str(path))


@pytest.mark.parametrize("flag", ["--prices", "--catalog"])
def test_unreadable_prices_or_catalog_is_never_a_crash(tmp_path, unreadable, flag):
    path = tmp_path / "table.json"
    path.write_text('{"h100": 2.0}' if flag == "--prices" else '{"gpus": {}}')
    unreadable(path)
    assert_one_line_error(run_cli("gpus", flag, path), 2, str(path))


def test_unreadable_matrix_names_the_flag(tmp_path, unreadable):
    path = tmp_path / "m.toml"
    path.write_text("[[entry]]\n")
    unreadable(path)
    ran = run_cli("regen", "--matrix", path, "--out", tmp_path / "o")
    assert_one_line_error(ran, 2, "--matrix", str(path))


def test_a_fifo_matrix_is_not_a_regular_file(tmp_path, fifo):
    ran = run_cli("regen", "--matrix", fifo, "--out", tmp_path / "o")
    assert_one_line_error(ran, 2, "--matrix", "is not a regular file")


@pytest.mark.parametrize("body", ['gpus = ["h100"]\n', 'network = 5\n'])
def test_catalog_of_the_wrong_shape_is_bad_input(tmp_path, body):
    path = tmp_path / "cat.toml"
    path.write_text(body)
    assert_one_line_error(run_cli("gpus", "--catalog", path), 2, str(path))


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_folder_or_fifo_passed_as_a_plan_is_not_a_regular_file(tmp_path, fifo, kind):
    path = tmp_path if kind == "folder" else fifo
    for argv in (("simulate", path), ("diff", AFD_PLAN, path)):
        assert_one_line_error(run_cli(*argv), 2, str(path), "is not a regular file")


def test_a_fifo_trace_is_not_read(fifo):
    start = time.perf_counter()
    ran = run_cli("afd", "ratio", "--trace", fifo, "--json")
    assert_one_line_error(ran, 2, str(fifo), "is not a regular file")
    assert time.perf_counter() - start < 10  # opening a FIFO for reading would block


@pytest.mark.parametrize("flag", ["--prices", "--catalog"])
def test_a_fifo_passed_as_prices_is_not_a_regular_file(fifo, flag):
    assert_one_line_error(run_cli("gpus", flag, fifo), 2, flag, "is not a regular file")


@pytest.mark.parametrize("make", ["missing", "empty", "file", "tables-missing"])
def test_a_profiles_folder_without_tables_is_an_error_naming_it(tmp_path, make, no_search):
    folder = tmp_path / "profiles"
    if make == "empty":
        folder.mkdir()
    elif make == "file":
        folder.write_text("x")
    elif make == "tables-missing":
        (folder / "h100").mkdir(parents=True)  # a GPU folder without system.json
    for argv in ((*TINY, "--profiles", folder),
                 ("profiles", "show", "--model", "llama-3.1-8b", "--gpu", "h100", "--profiles", folder),
                 ("afd", "ratio", "--model", "llama-3.1-8b", "--attn-gpu", "h100", "--profiles", folder)):
        assert_one_line_error(run_cli(*argv), 2, "--profiles", str(folder))


def test_a_regen_matrix_naming_a_missing_profiles_folder_is_bad_input(tmp_path):
    m = tmp_path / "m.toml"
    m.write_text('profiles = "nope"\n[[entry]]\nmodels = ["llama-3.1-8b"]\ncontexts = ["8k"]\n'
                 'slos = ["60ms"]\ngpus = ["h100"]\npolicies = ["colocated"]\n')
    assert_one_line_error(run_cli("regen", "--matrix", m, "--out", tmp_path / "o"), 2, "--profiles")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("case", ["folder", "under-a-file", "long-name", "fifo", "dot"])
def test_bad_out_paths_fail_before_the_search(tmp_path, case, no_search):
    (tmp_path / "afile").write_text("x")
    out = {"folder": tmp_path, "under-a-file": tmp_path / "afile" / "plan.json",
           "long-name": tmp_path / ("p" * 300 + ".json"), "fifo": tmp_path / "fifo",
           "dot": tmp_path / "."}[case]
    if case == "fifo":
        os.mkfifo(out)
    assert_one_line_error(run_cli(*TINY, "--out", out), 2, "--out")


def test_a_read_only_out_folder_fails_before_the_search(tmp_path, monkeypatch, no_search):
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if os.fspath(p) == str(tmp_path)
                        and mode & os.W_OK else real(p, mode, **kw))
    assert_one_line_error(run_cli(*TINY, "--out", tmp_path / "plan.json"), 2, "--out", "not writable")


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    real = os.write

    def full(fd, data):
        if os.fstat(fd).st_size + len(data) > 100:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", full)
    ran = run_cli(*TINY, "--out", tmp_path / "plan.json")
    assert_one_line_error(ran, 2, "--out", "No space left")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cmd", ["schema", "simulate"])
def test_other_writers_check_out_too(tmp_path, cmd):
    (tmp_path / "afile").write_text("x")
    argv = ("schema",) if cmd == "schema" else ("simulate", AFD_PLAN)
    for out in (tmp_path, tmp_path / "afile" / "x.json"):
        assert_one_line_error(run_cli(*argv, "--out", out), 2, str(out))


# --------------------------------------------------------------------------- plan-file tampering

TAMPERINGS = {
    "inter_node_gbps 0": _set("provenance", "network", "inter_node_gbps", 0),
    "inter_node_gbps negative": _set("provenance", "network", "inter_node_gbps", -3.0),
    "latency negative": _set("provenance", "network", "inter_node_latency_us", -1.0),
    "unknown network key": _set("provenance", "network", "zzz", 1.0),
    "negative price": _set("provenance", "prices_usd_per_gpu_hour", "h100", -1.0),
    "price of another GPU": _set("provenance", "prices_usd_per_gpu_hour", {"l40s": 1.0}),
    "owner price off": lambda d: d["owners"][0].update(usd_per_hour_per_replica=123.0),
    "action_order garbage": _set("action_order", [["garbage"], ["x y z"]]),
    "action_order stage out of range": lambda d: d["action_order"][0].append("compute 999 0"),
    "action_order of another owner": lambda d: d["action_order"][0].append(d["action_order"][1][0]),
    "policy zzz": _set("policy", "zzz"),
    "true as global_batch": _set("global_batch", True),
    "true as tensor_parallel": lambda d: d["owners"][0].update(tensor_parallel=True),
    "string as microbatches": _set("microbatches", "1"),
    "float as microbatches": _set("microbatches", 1.0),
    "1 as exhaustive": _set("search", "exhaustive", 1),
    "string as moe_expert_parallel": _set("search", "space", "moe_expert_parallel", "no"),
    "huge global_batch": _set("global_batch", 10**30),
    "overflowing float": _set("tpot_ms", "1e400"),
    "tp outside the space": _set("search", "space", "tensor_parallel_sizes", [3]),
    "over the GPU budget": _set("search", "space", "max_gpus", 1),
    "expert_parallel odd": lambda d: d["owners"][0].update(expert_parallel=3),
    "stage_link none": _set("metrics", "stage_link", "none"),
    "local transfer": lambda d: d["stages"][1].update(owner=d["stages"][0]["owner"]),
    "context beyond the grammar": _set("workload", "context_tokens", 10**9),
    "feasible true": _set("feasible", True),
}


@pytest.mark.parametrize("name", TAMPERINGS)
def test_tampered_plans_are_rejected_by_simulate_and_diff(tmp_path, name):
    path = _tampered(tmp_path, TAMPERINGS[name])
    if name == "overflowing float":
        path.write_bytes(path.read_bytes().replace(b'"1e400"', b"1e400"))
    for argv in (("simulate", path), ("diff", AFD_PLAN, path)):
        line = assert_one_line_error(run_cli(*argv), 2, str(path))
        assert "--" not in line.split(str(path), 1)[1], f"blames a flag nobody passed: {line}"


def test_nan_or_inf_never_gets_into_a_plan():
    from pydantic import ValidationError

    from opweave_planner.plan import Plan

    doc = orjson.loads(AFD_PLAN.read_bytes())
    for key in ("tpot_ms", "usd_per_million_tokens"):
        for bad in (float("nan"), float("inf")):
            with pytest.raises(ValidationError):
                Plan.model_validate({**copy.deepcopy(doc), key: bad})


def test_plan_policy_names_are_the_request_policies():
    import typing

    from opweave_planner.inputs.request import Policy
    from opweave_planner.plan import PolicyName

    assert set(typing.get_args(PolicyName)) == {p.value for p in Policy}


def test_golden_plans_still_read():
    for path in sorted(AFD_PLAN.parent.glob("*.json")):
        read_plan(path)


def test_a_plan_made_from_a_config_path_simulates_without_model(tmp_path):
    cfg = tmp_path / "mymodel" / "config.json"
    cfg.parent.mkdir()
    cfg.write_bytes((Path(__file__).parents[1] / "models" / "llama-3.1-8b.json").read_bytes())
    out = tmp_path / "plan.json"
    ran = run_cli("--model", cfg, *TINY[2:], "--out", out)
    assert ran.code == 0, ran.err
    assert run_cli("simulate", out).code == 0


# --------------------------------------------------------------------------- regen matrices

ENTRY = ('[[entry]]\nmodels = ["llama-3.1-8b"]\ncontexts = ["8k"]\nslos = ["60ms"]\ngpus = ["h100"]\n'
         'policies = ["colocated"]\nmax_owners = 1\nbatches = [8, 16]\n')
MATRICES = {
    "network_latency x": ('network_latency = "x"\n' + ENTRY, "--network-latency"),
    "network_bandwidth list": ("network_bandwidth = [1]\n" + ENTRY, "--network-bandwidth"),
    "tensor_parallel_sizes 3": (ENTRY + "tensor_parallel_sizes = [3]\n", "--tensor-parallel-sizes"),
    "legacy tps 3": (ENTRY + "tps = [3]\n", "--tensor-parallel-sizes"),
    "legacy space tps 3": ("[space]\ntps = [3]\n" + ENTRY, "--tensor-parallel-sizes"),
    "batches 1e9": (ENTRY.replace("batches = [8, 16]", "batches = [1000000000]"), "--batches"),
    "max_gpus true": (ENTRY + "max_gpus = true\n", "--max-gpus"),
    "moe_expert_parallel no": (ENTRY + 'moe_expert_parallel = "no"\n', "--moe-expert-parallel"),
    "memory_reserve_gb nan": (ENTRY + "memory_reserve_gb = nan\n", "--memory-reserve-gb"),
    "space an int": ("space = 5\n" + ENTRY, "space"),
    "entry an int": ("entry = [5]\n", "entry 1"),
    "models a table": (ENTRY.replace('models = ["llama-3.1-8b"]', "models = {a = 1}"), "models"),
    "prices an int": ("prices = 5\n" + ENTRY, "prices"),
    "unknown key": ("zzz = 1\n" + ENTRY, "zzz"),
}


@pytest.mark.parametrize("name", MATRICES)
def test_hostile_matrices_are_one_line_without_python_internals(tmp_path, name):
    text, needle = MATRICES[name]
    m = tmp_path / "m.toml"
    m.write_text(text)
    line = assert_one_line_error(run_cli("regen", "--matrix", m, "--out", tmp_path / "o", "-q"), 2, needle)
    for internal in ("object is not", "PosixPath", "NoneType", "Error:", "<class"):
        assert internal not in line, line
    assert not (tmp_path / "o").exists()


def test_regen_a_folder_where_a_plan_should_go(tmp_path):
    m = tmp_path / "m.toml"
    m.write_text(ENTRY)
    out = tmp_path / "o"
    (out / "llama-3.1-8b_ctx8k_slo60ms_h100_colocated.json").mkdir(parents=True)
    line = assert_one_line_error(run_cli("regen", "--matrix", m, "--out", out, "-q"), 2)
    assert "is not a file" in line


def test_regen_out_under_a_file_fails_before_planning(tmp_path, monkeypatch):
    from opweave_planner import regen

    monkeypatch.setattr(regen, "run_task", lambda task: (_ for _ in ()).throw(AssertionError("planned")))
    (tmp_path / "afile").write_text("x")
    m = tmp_path / "m.toml"
    m.write_text(ENTRY)
    ran = run_cli("regen", "--matrix", m, "--out", tmp_path / "afile" / "sub", "-q")
    assert_one_line_error(ran, 2, "--out")
    assert "planned" not in ran.err


# --------------------------------------------------------------------------- round trip

def test_everything_the_tool_writes_it_reads_back(tmp_path):
    """plan (stdout and --out), infeasibility record, schema, simulate --out, regen entries, export."""
    import jsonschema

    from opweave_planner.contract import schema_bytes
    from opweave_planner.plan import Infeasible, Plan

    plan = tmp_path / "plan.json"
    ran = run_cli(*TINY, "--out", plan)
    assert ran.code == 0, ran.err
    assert isinstance(read_plan(plan), Plan)
    ran = run_cli(*TINY)
    assert ran.code == 0 and ran.out.encode() == plan.read_bytes()

    record = tmp_path / "infeasible.json"
    ran = run_cli(*TINY[:3], "0.5ms", *TINY[4:], "--out", record)
    assert ran.code == 3, ran.err
    assert isinstance(read_plan(record), Infeasible)

    schema = tmp_path / "schema.json"
    assert run_cli("schema", "--out", schema).code == 0
    assert schema.read_bytes() == schema_bytes()
    validator = jsonschema.Draft202012Validator(orjson.loads(schema.read_bytes()))
    for path in (plan, record):
        validator.validate(orjson.loads(path.read_bytes()))

    again = tmp_path / "simulated.json"
    ran = run_cli("simulate", plan, "--out", again)
    assert ran.code == 0, ran.err
    assert again.read_bytes() == plan.read_bytes()
    ran = run_cli("simulate", AFD_PLAN, "--out", again, "--network-bandwidth", "4")
    assert ran.code in (0, 1), ran.err
    assert isinstance(read_plan(again), Plan)
    assert run_cli("diff", plan, again).code == 1

    m = tmp_path / "m.toml"
    m.write_text(ENTRY.replace('slos = ["60ms"]', 'slos = ["60ms", "0.5ms"]'))
    out = tmp_path / "plans"
    ran = run_cli("regen", "--matrix", m, "--out", out, "-q")
    assert ran.code == 1, ran.err
    from opweave_planner.regen import CACHE_FILE

    written = sorted(p for p in out.iterdir() if p.name != CACHE_FILE)  # and regen's own record
    assert len(written) == 2 and len(list(out.iterdir())) == 3
    for path in written:
        read_plan(path)
    assert run_cli("regen", "--matrix", m, "--out", out, "-q").code == 0  # reads its own files

    exported = tmp_path / "export"
    ran = run_cli("export", plan, "--to", "vllm", "--out", exported)
    assert ran.code == 0, ran.err
    manifest = orjson.loads((exported / "export.json").read_bytes())
    import hashlib

    assert manifest["plan"]["sha256"] == hashlib.sha256(plan.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- found here, owned elsewhere

def test_profiles_show_bounds_its_microbatches():
    ran = run_cli("profiles", "show", "--model", "llama-3.1-8b", "--gpu", "h100",
                  "--microbatches", "99999999999999999999", "--json")
    assert_one_line_error(ran, 2, "--microbatches")


def test_compare_blames_the_gpu_budget_for_a_two_owner_policy():
    ran = run_cli("compare", "--model", "llama-3.1-8b", "--gpus", "h100", "--ctx", "8k", "--slo", "60ms",
                  "--batches", "8,16", "--max-owners", "1", "--policies", "colocated,cad", "--max-gpus", "1",
                  "--json")
    assert "Traceback" not in ran.err
    cad = [ln for ln in ran.err.splitlines() if " cad " in ln]
    assert cad and "--max-gpus" in cad[0] and "memory" not in cad[0], ran.err


def test_simulate_out_of_a_plan_whose_space_omits_an_owner_gpu_reads_back(tmp_path):
    """Found by the fuzz suite: a hand-edited searched space without an owner's GPU type made
    `simulate --out` write a plan (no price for that GPU) that `read_plan` rejected."""
    import orjson

    from opweave_planner.contract import evaluate_plan, read_plan
    from opweave_planner.plan import plan_bytes

    golden = Path(__file__).parent / "golden" / "llama-3.1-8b_afd_h100+a100_v1.2.json"
    doc = orjson.loads(golden.read_bytes())
    used = {o["gpu"] for o in doc["owners"]}
    doc["search"]["space"]["gpus"] = [g for g in doc["search"]["space"]["gpus"] if g not in used][:1] or ["l40s"]
    edited = tmp_path / "edited.json"
    edited.write_bytes(orjson.dumps(doc))
    out = tmp_path / "again.json"
    out.write_bytes(plan_bytes(evaluate_plan(read_plan(edited), where=str(edited)).plan))
    again = read_plan(out)
    assert used <= set(again.provenance.prices_usd_per_gpu_hour)


# --------------------------------------------------------------------------- workloads (issue 13)

WORKLOAD_BASE = ("--model", "llama-3.1-8b", "--slo", "30ms", "--gpus", "h100")
EXAMPLE_TRACE = Path(__file__).resolve().parent.parent / "examples" / "traces" / "azure-conv-sample.csv"


@pytest.mark.parametrize(("body", "needle"), [
    ("prompt_tokens,output_tokens\n", "no data rows"),
    ("foo,bar\n1,2\n", "unknown header"),
    ("prompt_tokens,output_tokens\n10,abc\n", "line 2"),
    ("prompt_tokens,output_tokens\n-5,3\n", "prompt length must be an integer >= 0"),
    ("prompt_tokens,output_tokens\n10,0\n", "output length must be an integer >= 1"),
])
def test_a_bad_trace_is_one_line_naming_the_file_and_nothing_is_written(tmp_path, body, needle, no_search):
    trace = tmp_path / "trace.csv"
    trace.write_text(body)
    out = tmp_path / "plan.json"
    ran = run_cli(*WORKLOAD_BASE, "--workload", trace, "--out", out)
    assert_one_line_error(ran, 2, str(trace), needle)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["trace.csv"]


@pytest.mark.parametrize("overflow", ["clip", "drop"])
def test_every_request_longer_than_max_model_len_is_bad_input(tmp_path, overflow, no_search):
    trace = tmp_path / "long.csv"
    trace.write_text("prompt_tokens,output_tokens\n100000,10\n200000,5\n")
    ran = run_cli(*WORKLOAD_BASE, "--workload", trace, "--max-model-len", "8k", "--overflow", overflow)
    assert_one_line_error(ran, 2, str(trace), "--max-model-len")


@pytest.mark.parametrize(("flag", "value"), [
    ("--slo-percentile", "0"), ("--slo-percentile", "100"), ("--slo-percentile", "-5"),
    ("--slo-percentile", "abc"), ("--kv-quantile", "0"), ("--kv-quantile", "1"), ("--kv-quantile", "1.5"),
    ("--overflow", "wrap"), ("--scale-ctx", "0"), ("--scenarios", "3"),
])
def test_out_of_range_workload_settings_name_the_flag(flag, value, no_search):
    ran = run_cli(*WORKLOAD_BASE, "--workload", EXAMPLE_TRACE, flag, value)
    assert_one_line_error(ran, 2, flag)


@pytest.mark.parametrize("argv", [
    ("--ctx", "8k", "--workload", str(EXAMPLE_TRACE)), ("--ctx", "8k", "--slo-percentile", "90"),
    ("--ctx", "8k", "--scale-ctx", "32k"), ("--ctx", "8k", "--max-model-len", "16k"),
    ("--ctx", "8k", "--seed", "3"), ("--ctx", "8k", "--scenarios", "64"), ("--ctx", "8k", "--kv-quantile", "0.5"),
])
def test_workload_settings_need_a_workload(argv, no_search):
    ran = run_cli(*WORKLOAD_BASE, *argv)
    assert_one_line_error(ran, 2, argv[2])


def test_a_missing_workload_file_is_one_line(tmp_path, no_search):
    ran = run_cli(*WORKLOAD_BASE, "--workload", tmp_path / "nope.csv")
    assert_one_line_error(ran, 2, "nope.csv")


# --------------------------------------------------------------------------- the whole deployment (issue 27)
# checked at the request edge, before the decode search (they used to surface only after it)


@pytest.mark.parametrize(("rows", "argv", "needles"), [
    (None, ("--workload", "lognormal:mean=2k,cv=1;out=geometric:mean=200", "--request-rate", "2"),
     ("--request-rate with --ttft and --workload", "length law")),
    (None, ("--workload", "lognormal:mean=2k,cv=1;out=geometric:mean=200", "--target-tokens-per-s", "900"),
     ("--target-tokens-per-s with --ttft and --workload",)),
    ('{"timestamp": 5, "input_length": 600, "output_length": 50}\n' * 5, ("--arrivals", "trace"),
     ("--arrivals trace", "span no time")),
    ('{"timestamp": 5, "input_length": 600, "output_length": 50}\n', ("--arrivals", "trace"),
     ("--arrivals trace", "1 timestamped request")),
    ("prompt_tokens,output_tokens\n600,50\n700,60\n", ("--arrivals", "trace"),
     ("--arrivals trace", "expected CSV columns TIMESTAMP")),
])
def test_deployment_inputs_fail_before_the_search(rows, argv, needles, tmp_path, no_search):
    if rows is not None:
        trace = tmp_path / ("t.jsonl" if rows.startswith("{") else "t.csv")
        trace.write_text(rows)
        argv = ("--workload", str(trace), *argv)
    ran = run_cli(*WORKLOAD_BASE, "--ttft", "1s", *argv)
    assert_one_line_error(ran, 2, *needles)


def test_an_alternative_that_cannot_be_sized_is_an_error_not_one_copy(tmp_path):
    """The main plan records a target load; an alternative it cannot be sized on (here a TP2 owner
    on a 1-GPU node) used to export one copy, saying the plan 'records no sizing'."""
    golden = GOLDEN / "llama-3.1-8b_colocated_h100-isl7680-osl1024-ttft1s-rate8_v1.10.json"
    doc = json.loads(golden.read_text())
    alt = {k: v for k, v in copy.deepcopy(doc).items() if k != "deployment"}
    alt["search"]["space"]["gpus_per_node"] = 1
    owner = alt["owners"][0]  # a TP2 owner, which a 1-GPU node cannot hold
    owner["tensor_parallel"], alt["gpus_total"] = 2, 2
    owner["usd_per_hour_per_replica"] *= 2
    doc["alternatives"] = {"colocated": {"usd_per_million_tokens": alt["usd_per_million_tokens"],
                                         "tpot_ms": alt["tpot_ms"], "cost_delta_pct": 0.0, "tpot_delta_pct": 0.0,
                                         "num_stages": 1, "gpus_total": alt["gpus_total"], "plan": alt}}
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(doc))
    ran = run_cli("export", plan, "--to", "vllm", "--out", tmp_path / "o", "--alternative", "colocated")
    assert_one_line_error(ran, 2, "--alternative colocated", "8192 tokens/s", "does not fit")
    assert not (tmp_path / "o").exists()


def test_an_alternative_with_an_out_of_range_network_is_one_line(tmp_path):
    """simulate re-evaluates each alternative from its own recorded figures, so they are checked
    like the plan's (a fuzzed 1e308 GB/s in an alternative's network was an internal error)."""
    doc = orjson.loads((GOLDEN / "llama-3.1-8b_opweave_azure-truncate2k_h100+a100_v1.8.json").read_bytes())
    name, alt = next(iter(doc["alternatives"].items()))
    alt["plan"]["provenance"]["network"]["inter_node_gbps"] = 1e308
    path = tmp_path / "plan.json"
    path.write_bytes(orjson.dumps(doc))
    ran = run_cli("simulate", path, "--out", tmp_path / "again.json")
    assert_one_line_error(ran, 2, f"alternatives.{name}.plan", "inter_node_gbps")
    assert not (tmp_path / "again.json").exists()
