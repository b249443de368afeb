"""Fuzz the CLI (issue 18): random argument combinations per subcommand, tampered plan files,
hostile matrices. Every run must end with a documented exit code (never 4: an internal error
is a bug), no traceback, one error line naming the field or file, nothing half-written, and
every plan file it wrote must read back.

Runs go through the console-script guard in this process (conftest.run_cli) for speed; a few
go through the real entry point in a subprocess. Budgets scale with the hypothesis profile
(conftest.budget): the default `ci` profile keeps this file under about 90 s on 2 cores,
`--hypothesis-profile=long` runs 10x as many examples.
"""

from __future__ import annotations

import copy
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import AFD_PLAN, GOLDEN, budget, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from opweave_planner.contract import read_plan

ERROR_LINE = re.compile(r"^(error|infeasible): \S")
ALLOWED = {0, 1, 2, 3}  # in process: no signals, no closed pipe


def check(ran, out_dir: Path | None = None, allowed=ALLOWED) -> None:
    """The properties every run must have."""
    assert "Traceback" not in ran.err, ran.err
    assert ran.code != 4, f"internal error (a bug): {ran.err}"
    assert ran.code in allowed, (ran.code, ran.err)
    if ran.code in (2, 3):
        lines = [ln for ln in ran.lines if ln.startswith(("error:", "infeasible:", "internal error:"))]
        assert len(lines) == 1, ran.err
        assert ERROR_LINE.match(lines[0]), lines[0]
        body = lines[0].split(": ", 1)[1]
        # bad input names what is wrong: a flag, a key, a quoted value or a path (an
        # infeasibility line names the binding constraint instead)
        assert ran.code == 3 or re.search(r"--[a-z]|'[^']*'|\w+(\.\w+)*: |/", body), lines[0]
    if out_dir is not None and out_dir.is_dir():
        for path in out_dir.rglob("*"):
            assert not (path.name.startswith(".") and path.name.endswith(".tmp")), f"left {path}"
            if path.is_file() and path.suffix == ".json" and path.name != "export.json":
                read_plan(path)  # anything the tool writes, the tool reads back


def pick(values):
    """One of `values`, deep-copied: a drawn list or dict must never be shared (a tampering
    that nests a shared value into itself would make a cyclic document)."""
    return st.sampled_from(values).map(copy.deepcopy)


def mostly_valid(values, valid: int):
    """Draw from `values`, the first `valid` of which are good: about 2 in 3 draws are valid,
    so runs get past validation and the writers and readers are exercised too."""
    good, bad = values[:valid], values[valid:] or values[:valid]
    return st.one_of(pick(good), pick(good), pick(bad))


# --------------------------------------------------------------------------- the main command

PLAN_OPTIONS = {
    "--slo": ["60ms", "30ms", "0.5ms", "0.06s", "60000us", "1e400ms", "0ms", "-1ms", "60", "abc",
              "1e-300ms", ""],
    "--ctx": ["8k", "1k", "1", "1.5k", "0", "-1", "abc", "99999999999999999999", "200k", "1e400"],
    "--gpus": ["h100", "a100", "l40s", "H100", "h20", "zzz", "", ",", "h100,h100"],
    "--policy": ["colocated", "afd", "cad", "opweave", "zzz", "AFD"],
    "--batches": ["8,16", "8", "16", "0", "3", "abc", "65537", "8,,16", "", "-8", "1e3"],
    "--max-owners": ["1", "2", "0", "9", "x", "-1"],
    "--max-gpus": ["1", "2", "32", "0", "-1", "4097", "99999999999999999999", "2.5"],
    "--max-replicas": ["1", "2", "0", "65"],
    "--max-microbatches": ["1", "2", "0", "65"],
    "--max-stages": ["1", "2", "0", "100001"],
    "--tps": ["1", "1,2", "3", "0", "x", ""],
    "--reserve-gb": ["3.5", "0", "nan", "inf", "-1", "2000", "abc", "1e400"],
    "--network-bandwidth": ["32", "4GB/s", "100Gbps", "0", "nan", "-1", "x", "1e400"],
    "--network-latency": ["20", "0.02ms", "5us", "inf", "-5", "x", "1e400"],
    "--format": ["json", "table", "zzz"],
    "--jobs": ["1", "0", "-1", "x"],
    "--backend": ["vllm", "zzz", ""],
}
VALID = {"--slo": 5, "--ctx": 4, "--gpus": 4, "--policy": 4, "--batches": 3, "--max-owners": 2,
         "--max-gpus": 3, "--max-replicas": 2, "--max-microbatches": 2, "--max-stages": 2, "--tps": 2,
         "--reserve-gb": 2, "--network-bandwidth": 3, "--network-latency": 3, "--format": 2,
         "--jobs": 1, "--backend": 1}
SWITCHES = ["--no-pareto", "--no-bnb", "--no-moe-expert-parallel", "--moe-expert-parallel"]
OUT_NAMES = ["plan.json", "sub/plan.json", ".", "p" * 300 + ".json", "afile/plan.json", "adir"]


@st.composite
def plan_argv(draw):
    chosen = draw(st.lists(pick(sorted(PLAN_OPTIONS)), max_size=4, unique=True))
    values = {flag: draw(mostly_valid(PLAN_OPTIONS[flag], VALID.get(flag, 1))) for flag in chosen}
    # keep every search tiny: one small GPU set and two batch sizes unless fuzzed
    base = {"--model": "llama-3.1-8b", "--slo": "60ms", "--ctx": "8k", "--gpus": "h100",
            "--policy": "colocated", "--batches": "8,16", "--max-owners": "1"}
    if values.get("--policy", "colocated") == "opweave":
        values["--max-owners"] = draw(pick(["1", "2"]))
    argv = [x for flag, v in {**base, **values}.items() for x in (flag, v)]
    argv += draw(st.lists(pick(SWITCHES), max_size=1))
    out = draw(st.one_of(st.none(), pick(OUT_NAMES)))
    return [*argv, "-q"], out


def _run_plan_case(tmp_path_factory, case, name):
    """Run one fuzzed main-command case in a fresh folder (with a file and a folder to collide
    with); check the universal rules; return (ran, folder, argv, out name)."""
    argv, out = case
    work = tmp_path_factory.mktemp(name)
    (work / "afile").write_text("x")
    (work / "adir").mkdir()
    if out is not None:
        argv = [*argv, "--out", str(work / out)]
    ran = run_cli(*argv)
    check(ran, work)
    return ran, work, argv, out


@settings(max_examples=budget(0.6))
@given(plan_argv())
def test_fuzz_plan_command(tmp_path_factory, case):
    ran, work, argv, out = _run_plan_case(tmp_path_factory, case, "plan")
    if ran.code == 0 and out is None and "--format" not in argv:
        doc = orjson.loads(ran.out)
        assert doc["schema_version"]
    if out is not None and ran.code in (0, 3):
        read_plan(work / out)  # the plan, or the infeasibility record, was written whole


# --------------------------------------------------------------------------- a workload instead of --ctx

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"
WORKLOAD_OPTIONS = {
    "--workload": [str(TRACES / "azure-conv-sample.csv"), str(TRACES / "law-mooncake-like.toml"),
                   "lognormal:mean=2k,cv=1;out=geometric:mean=50", "fixed:mean=1k;out=fixed:mean=10",
                   "nope.csv", "lognormal:mean=-1", "", "zzz:1", "fixed:mean=1k"],
    "--scale-ctx": ["2k", "1k", "0", "abc", "99999999999999999999"],
    "--max-model-len": ["16k", "8k", "1", "0", "x"],
    "--overflow": ["clip", "drop", "truncate", "wrap"],
    "--slo-percentile": ["95", "50", "99.9", "0", "100", "abc", "nan"],
    "--kv-quantile": ["0.999", "0.5", "0", "1", "x", "nan"],
    "--scenarios": ["16", "64", "3", "0", "x"],
    "--seed": ["0", "7", "-1", "x"],
}
WORKLOAD_VALID = {"--workload": 4, "--scale-ctx": 2, "--max-model-len": 2, "--overflow": 2,
                  "--slo-percentile": 3, "--kv-quantile": 2, "--scenarios": 2, "--seed": 2}


@st.composite
def workload_argv(draw):
    chosen = draw(st.lists(pick(sorted(WORKLOAD_OPTIONS)), max_size=4, unique=True))
    values = {flag: draw(mostly_valid(WORKLOAD_OPTIONS[flag], WORKLOAD_VALID[flag])) for flag in chosen}
    base = {"--model": "llama-3.1-8b", "--slo": "60ms", "--workload": WORKLOAD_OPTIONS["--workload"][0],
            "--gpus": "h100", "--policy": "colocated", "--batches": "8,16", "--max-owners": "1",
            "--scenarios": "16"}
    argv = [x for flag, v in {**base, **values}.items() for x in (flag, v)]
    if draw(st.booleans()):
        argv += ["--ctx", "8k"]  # both: refused in one line
    out = draw(st.one_of(st.none(), pick(OUT_NAMES)))
    return [*argv, "-q"], out


@settings(max_examples=budget(0.2))
@given(workload_argv())
def test_fuzz_workload_plan_command(tmp_path_factory, case):
    ran, work, _argv, out = _run_plan_case(tmp_path_factory, case, "wplan")
    if out is not None and ran.code in (0, 3):
        doc = read_plan(work / out)  # the plan, or the infeasibility record, was written whole
        assert doc.workload.distribution is not None


# --------------------------------------------------------------------------- tampered plans

JUNK = [None, True, False, 0, -1, 1, 3, 2**63, 10**30, 1.5, -0.5, 0.0, 1e308, "", "x", "1",
        "compute 0 0", "opweave", [], {}, [1], ["x"], [[]], {"a": 1}, {"h100": -1.0}]


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:3]):
            yield from _paths(v, (*prefix, i))


BASE_PLANS = sorted(p for p in GOLDEN.glob("*.json") if orjson.loads(p.read_bytes())["schema_version"] != "1.0")


@st.composite
def tampered(draw):
    source = draw(pick(BASE_PLANS))
    doc = orjson.loads(source.read_bytes())
    paths = [p for p in _paths(doc) if p]
    for _ in range(draw(st.integers(1, 3))):
        path = draw(pick(paths))
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = draw(pick(["set", "set", "set", "delete", "extra"]))
            if action == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif action == "extra" and isinstance(parent, dict):
                parent[draw(pick(["zzz", "feasible", "index"]))] = draw(pick(JUNK))
            elif isinstance(parent, (dict, list)):
                parent[path[-1]] = draw(pick(JUNK))
        except (KeyError, IndexError, TypeError):
            continue
    return source, doc


def _write(path: Path, doc) -> Path:
    try:
        path.write_bytes(orjson.dumps(doc))
    except TypeError:  # an int beyond 64 bits: write it as JSON text all the same
        import json

        path.write_text(json.dumps(doc))
    return path


@settings(max_examples=budget(1.0))
@given(tampered(), st.lists(pick([("--network-bandwidth", "4"), ("--network-latency", "0"),
                                  ("--json",), ("--network-bandwidth", "nan")]), max_size=2))
def test_fuzz_tampered_plans_simulate_and_diff(tmp_path_factory, few_arrivals, case, extra):
    # few_arrivals: a deployment plan re-simulates its pools on 2,000 Poisson arrivals, not
    # 20,000 (what this checks, exit codes and files, holds at any count; a fifth of the
    # examples start from a deployment plan, and their replays were most of this test's time)
    source, doc = case
    work = tmp_path_factory.mktemp("tamper")
    path = _write(work / "plan.json", doc)
    out = work / "out"
    out.mkdir()
    flags = [x for e in extra for x in e]
    check(run_cli("simulate", path, *flags, "--out", out / "again.json"), out)
    check(run_cli("diff", source, path))
    check(run_cli("diff", path, path, "--json"))


@settings(max_examples=budget(0.3))
@given(tampered(), pick(["vllm", "sglang", "dynamo", "llm-d", "vllm-afd", "zzz"]))
def test_fuzz_export_of_tampered_plans(tmp_path_factory, case, target):
    _source, doc = case
    work = tmp_path_factory.mktemp("export")
    path = _write(work / "plan.json", doc)
    ran = run_cli("export", path, "--to", target, "--out", work / "out")
    check(ran, work / "out")


# --------------------------------------------------------------------------- hostile matrices

def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


MATRIX_KEYS = ["models", "contexts", "slos", "gpus", "policies", "max_owners", "batches", "max_gpus",
               "tensor_parallel_sizes", "tps", "network_latency", "network_bandwidth", "memory_reserve_gb",
               "moe_expert_parallel", "prices", "profiles", "space", "zzz", "max_stages", "pareto"]
MATRIX_JUNK = [*(j for j in JUNK if j is not None and j != 10**30), float("nan"), float("inf"),
               ["llama-3.1-8b"], ["8k", 0], ["60ms", 60], ["h100", ["h100"]], ["colocated", "zzz"],
               [1000000000], [3], "nope.toml", "nope/"]


MATRIX_GOOD = {"max_owners": [1, 2], "batches": [[8], [8, 16]], "max_gpus": [1, 4, 32],
               "tensor_parallel_sizes": [[1], [1, 2]], "tps": [[1, 2]], "network_latency": [20, "5us"],
               "network_bandwidth": [32, "100Gbps"], "memory_reserve_gb": [3.5, 0], "policies": [["afd"]],
               "moe_expert_parallel": [False], "max_stages": [1, 4], "pareto": [False],
               "slos": [["60ms", "1ms"]], "contexts": [["8k", "4k"]], "gpus": [["a100"]]}


@st.composite
def matrix(draw):
    entry = {"models": ["llama-3.1-8b"], "contexts": ["8k"], "slos": ["60ms"], "gpus": ["h100"],
             "policies": ["colocated"], "max_owners": 1, "batches": [8, 16]}
    top: dict = {}
    for _ in range(draw(st.integers(1, 3))):
        key = draw(pick(MATRIX_KEYS))
        value = draw(st.one_of(pick(MATRIX_JUNK), pick(MATRIX_GOOD.get(key, MATRIX_JUNK))))
        (top if draw(st.booleans()) and key not in ("models", "contexts", "slos", "gpus", "policies")
         else entry)[key] = value
    if draw(st.integers(0, 9)) == 0:
        entry.pop(draw(pick(sorted(entry))))
    lines = [f"{k} = {_toml_value(v)}" for k, v in top.items()]
    lines += ["[[entry]]"] + [f"{k} = {_toml_value(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"


@settings(max_examples=budget(0.4))
@given(matrix(), pick(["plans", "afile", "afile/sub", "p" * 300]))
def test_fuzz_hostile_matrices(tmp_path_factory, text, out_name):
    work = tmp_path_factory.mktemp("regen")
    (work / "afile").write_text("x")
    m = work / "m.toml"
    m.write_text(text)
    ran = run_cli("regen", "--matrix", m, "--out", work / out_name, "-q")
    check(ran, work / "plans")
    for internal in ("object is not", "PosixPath", "NoneType", "<class"):
        assert internal not in ran.err, ran.err


# --------------------------------------------------------------------------- afd, theory, compare, ...

AFD_COMMON = {
    "--batch": ["1", "8", "256", "0", "-1", "65537", "99999999999999999999", "x"],
    "--alpha-a": ["0.00165", "0", "-1", "nan", "inf", "1e308", "1e12"],
    "--beta-f": ["100", "0", "-1", "nan"],
    "--alpha-f": ["0", "0.083"],
    "--alpha-c": ["0", "0.022"],
    "--prompt-mean": ["100", "1", "0.5", "1e308", "nan", "-1", "16777216"],
    "--decode-mean": ["50", "1", "1e308", "inf", "16777217"],
    "--prompt-dist": ["geometric", "fixed", "zzz"],
    "--decode-dist": ["geometric", "fixed", "zzz"],
}
AFD_RATIO = {"--r": ["1,2,4", "1", "0", "-1", "1e308", "nan", "x", "", "4096", "4097", "0.5"]}
AFD_SIM = {
    "--r": ["1,2", "1", "0", "x", "99999999", "4097", "1.5"],
    "--requests": ["600", "0", "1e20", "100000000000000000000", "10000000000", "8388609"],
    "--seed": ["0", "7", "-1", "99999999999999999999"],
    "--batches-in-flight": ["1", "2", "0", "65", "1000000000"],
    "--start": ["stationary", "cold", "zzz"],
    "--trials": ["10", "0", "1e20", "100000000000000000000", "1000000000000"],
}


AFD_VALID = {"--batch": 3, "--alpha-a": 2, "--beta-f": 2, "--alpha-f": 2, "--alpha-c": 2,
             "--prompt-mean": 2, "--decode-mean": 2, "--prompt-dist": 2, "--decode-dist": 2,
             "--r": 2, "--requests": 1, "--seed": 2, "--batches-in-flight": 2, "--start": 2,
             "--trials": 1}


@st.composite
def afd_argv(draw):
    sub = draw(pick(["ratio", "simulate"]))
    table = {**AFD_COMMON, **(AFD_RATIO if sub == "ratio" else AFD_SIM)}
    chosen = draw(st.lists(pick(sorted(table)), max_size=4, unique=True))
    # small valid defaults keep a run short; fuzzed values are tiny or rejected
    values = {"--batch": "8", "--r": "1,2"} if sub == "simulate" else {}
    if sub == "simulate":
        values.update({"--requests": "600", "--trials": "10", "--decode-mean": "50"})
    values.update({flag: draw(mostly_valid(table[flag], AFD_VALID.get(flag, 1))) for flag in chosen})
    argv = ["afd", sub, *(x for f, v in values.items() for x in (f, v))]
    if sub == "simulate" and draw(st.booleans()):
        argv.append("--mc")
    return [*argv, "--json"]


@settings(max_examples=budget(0.4))
@given(afd_argv())
def test_fuzz_afd(argv):
    check(run_cli(*argv))


THEORY = {"--tp": ["1", "2", "3", "0", "-1", "16", "99999999999999999999", "x"],
          "--microbatches": ["1", "2", "0", "64", "65", "99999999999999999999"],
          "--ctx": ["1k..8k", "4k,32k", "0..1k", "8k..1k", "1k..99999999999999999999", "", ",", "1e400", "x"],
          "--gpus": ["h100,l40s", "h100", "zzz", "", "h100,h100", "h20,b200"],
          "--model": ["llama-3.1-8b", "qwen3-30b-a3b", "zzz", ""]}


@settings(max_examples=budget(0.4))
@given(st.dictionaries(pick(sorted(THEORY)), st.integers(0, 99), max_size=3), st.booleans())
def test_fuzz_theory(choice, as_json):
    values = {"--model": "llama-3.1-8b", **{f: THEORY[f][i % len(THEORY[f])] for f, i in choice.items()}}
    argv = ["theory", *(x for f, v in values.items() for x in (f, v))]
    check(run_cli(*argv, *(["--json"] if as_json else [])))


PROFILES_SHOW = {"--tp": ["1", "2", "3", "0", "16", "x"], "--ctx": ["8k", "0", "abc", "99999999999", "1e400"],
                 "--microbatches": ["1,4", "0", "a", "", "1,,4", "-1", "65536"],
                 "--gpu": ["h100", "a100", "zzz", "h20"], "--backend": ["vllm", "zzz"],
                 "--model": ["llama-3.1-8b", "qwen3-30b-a3b", "zzz"]}


@settings(max_examples=budget(0.3))
@given(st.dictionaries(pick(sorted(PROFILES_SHOW)), st.integers(0, 99), max_size=3), st.booleans())
def test_fuzz_profiles_show(choice, ep):
    values = {"--model": "llama-3.1-8b", "--gpu": "h100",
              **{f: PROFILES_SHOW[f][i % len(PROFILES_SHOW[f])] for f, i in choice.items()}}
    argv = ["profiles", "show", *(x for f, v in values.items() for x in (f, v)), "--json"]
    check(run_cli(*argv, *(["--ep"] if ep else [])))


COMPARE = {"--ctx": ["8k", "8k,16k", "0", "", "abc"], "--slo": ["60ms", "60ms,30ms", "0ms", "abc", ""],
           "--policies": ["colocated", "afd,cad", "zzz", ""], "--max-gpus": ["1", "2", "32", "0"]}


@settings(max_examples=budget(0.2))
@given(st.dictionaries(pick(sorted(COMPARE)), st.integers(0, 99), max_size=2))
def test_fuzz_compare(choice):
    values = {"--model": "llama-3.1-8b", "--gpus": "h100", "--ctx": "8k", "--slo": "60ms",
              "--batches": "8,16", "--max-owners": "1", "--policies": "colocated,afd",
              **{f: COMPARE[f][i % len(COMPARE[f])] for f, i in choice.items()}}
    check(run_cli("compare", *(x for f, v in values.items() for x in (f, v)), "--json"))


@settings(max_examples=budget(0.2))
@given(pick(["llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3", "zzz", "", "adir", "afile", "fifo",
             "a" * 300, "missing/config.json", "../../etc/passwd"]),
       st.booleans(), st.booleans())
def test_fuzz_inspect(tmp_path_factory, model, blocks, as_json):
    work = tmp_path_factory.mktemp("inspect")
    (work / "adir").mkdir()
    (work / "afile").write_text("not json")
    if model == "fifo":
        os.mkfifo(work / "fifo")
    target = str(work / model) if model in ("adir", "afile", "fifo", "a" * 300) else model
    argv = ["inspect", "--model", target, *(["--blocks"] if blocks else []), *(["--json"] if as_json else [])]
    check(run_cli(*argv))


# --------------------------------------------------------------------------- the real entry point

CLI = [sys.executable, "-c", "from opweave_planner.cli.main import run; run()"]


@pytest.mark.parametrize("argv", [
    ("--model", "llama-3.1-8b", "--slo", "60ms", "--ctx", "8k", "--max-gpus", "0"),
    ("afd", "simulate", "--mc", "--trials", "100000000000000000000"),
    ("simulate", "{tampered}"),
    ("regen", "--matrix", "{tampered}", "--out", "{tmp}"),
    ("diff", str(AFD_PLAN), str(AFD_PLAN)),
], ids=["max-gpus-0", "mc-trials", "simulate-tampered", "regen-not-toml", "diff-same"])
def test_real_entry_point(tmp_path, argv):
    bad = tmp_path / "bad.json"
    doc = orjson.loads(AFD_PLAN.read_bytes())
    doc["provenance"]["network"]["inter_node_gbps"] = 0
    bad.write_bytes(orjson.dumps(doc))
    argv = [a.replace("{tampered}", str(bad)).replace("{tmp}", str(tmp_path / "o")) for a in argv]
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("OPWEAVE_DEBUG", None)
    done = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=120, env=env)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == (0 if argv[0] == "diff" else 2), done.stderr
    if done.returncode == 2:
        assert len([ln for ln in done.stderr.splitlines() if ln.startswith("error:")]) == 1, done.stderr
