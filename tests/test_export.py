"""`opweave-plan export`: launch files that carry the plan, refusals that name why, safe writes.

Colocated plans of every bundled model are made in-process on a small grid; manifests are checked
against the vendored Dynamo CRD and llm-d chart schemas (always), generated flags against the
runtimes' own argument parsers (only where a runtime is installed).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from opweave_planner import api
from opweave_planner.errors import InfeasibleError, UserError
from opweave_planner.export import TARGETS, build, export_plan
from opweave_planner.export import dynamo as dynamo_mod
from opweave_planner.export import llmd as llmd_mod
from opweave_planner.export.common import HF_REPOS, hf_repo
from opweave_planner.export.documents import strict_schema, to_yaml
from opweave_planner.inputs.model import bundled_models
from opweave_planner.plan import plan_bytes

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
VENDOR = ROOT / "src" / "opweave_planner" / "export" / "vendor"
MANY_STAGES = GOLDEN / "llama-3.1-8b_afd_h100+a100.json"  # 64 stages over 2 owners
QWEN_AFD = GOLDEN / "qwen3-30b-a3b_afd_h100+a100.json"
COLOCATED_TARGETS = ("vllm", "sglang", "dynamo", "llm-d")

_PLANS: dict[tuple, bytes | None] = {}


def _plan_bytes(model: str, policy: str = "colocated", gpus: str = "h100", **space) -> bytes | None:
    """A plan made in-process on a small grid (cached per session); None when none fits."""
    key = (model, policy, gpus, tuple(sorted(space.items())))
    if key not in _PLANS:
        req = api.make_request(model, "200ms", "8k", gpus=gpus, policy=policy, batches=(8, 16), **space)
        plan = api.plan(req).plan
        _PLANS[key] = plan_bytes(plan) if plan is not None else None
    return _PLANS[key]


def _write(tmp_path: Path, data: bytes | dict, name: str = "plan.json") -> str:
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return str(p)


def _colocated(model: str) -> bytes:
    data = _plan_bytes(model) or _plan_bytes(model, gpus="h200")
    if data is None:
        pytest.skip(f"no colocated plan of {model} fits 32 H100 or H200 GPUs")
    return data


def _replicas(model: str, n: int) -> dict:
    """The model's colocated plan with its one owner replicated n times (same resident batch)."""
    plan = json.loads(_colocated(model))
    own = plan["owners"][0]
    own["replicas"] = n
    plan["global_batch"] = own["resident_batch"] * n
    plan["gpus_total"] = own["tensor_parallel"] * n
    return plan


def _command(script: bytes, start: str = "exec ") -> list[str]:
    """The argv of the script's command line (continuations joined, ${VAR} expanded to a stand-in)."""
    text = script.decode().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith(start))
    line = re.sub(r"\$\{(\w+)[^}]*\}", lambda m: "10.0.0.1" if "HOST" in m.group(1) or "ADDRESS" in m.group(1)
                  else "1", line)
    argv = shlex.split(line)
    return argv[1:] if argv[0] == "exec" else argv


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]




def _crd_validator():
    jsonschema = pytest.importorskip("jsonschema")
    doc = json.loads((VENDOR / "dynamo-0.6.0" / "dynamographdeployments.v1alpha1.json").read_text())
    return jsonschema.Draft7Validator(strict_schema(doc["openAPIV3Schema"]))


def _chart_validator():
    jsonschema = pytest.importorskip("jsonschema")
    doc = json.loads((VENDOR / "llm-d-modelservice-v0.4.12" / "values.schema.json").read_text())
    return jsonschema.Draft7Validator(doc)


def _errors(validator, doc) -> list[str]:
    return [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]


# ----------------------------------------------------------------------------- colocated plans


@pytest.mark.parametrize("model", bundled_models())
def test_colocated_plan_of_every_bundled_model_exports_to_every_colocated_target(model, tmp_path):
    path = _write(tmp_path, _colocated(model))
    plan = json.loads(Path(path).read_bytes())
    owner = plan["owners"][0]
    for target in COLOCATED_TARGETS:
        out = tmp_path / target
        done = export_plan(path, target, str(out))
        assert set(done.files) == {p.name for p in out.iterdir()}
        for script in out.glob("*.sh"):
            subprocess.run(["bash", "-n", str(script)], check=True)
        if target in ("vllm", "sglang"):
            argv = _command((out / "serve-replica-0.sh").read_bytes())
            tp, seqs, ctx = (("--tensor-parallel-size", "--max-num-seqs", "--max-model-len") if target == "vllm"
                             else ("--tp-size", "--max-running-requests", "--context-length"))
            assert _flag(argv, tp) == str(owner["tensor_parallel"])
            assert _flag(argv, seqs) == str(owner["resident_batch"])
            assert _flag(argv, ctx) == str(plan["workload"]["context_tokens"])
            assert HF_REPOS[model] in argv
            bench = _command((out / "benchmark.sh").read_bytes(), start="vllm bench" if target == "vllm"
                             else "python3 -m sglang")
            assert _flag(bench, "--max-concurrency") == "1"  # ${CONCURRENCY}, defaulting to the global batch
            assert f'CONCURRENCY="${{CONCURRENCY:-{plan["global_batch"]}}}"' in (out / "benchmark.sh").read_text()
            assert repr(plan["tpot_ms"]) in (out / "benchmark.sh").read_text()


@pytest.mark.parametrize("model", bundled_models())
def test_dynamo_manifest_validates_against_the_vendored_crd(model, tmp_path):
    ctx, _files = build(_write(tmp_path, _colocated(model)), "dynamo")
    doc = dynamo_mod.manifest(ctx)
    assert _errors(_crd_validator(), doc) == []
    worker = doc["spec"]["services"][dynamo_mod.WORKER]
    owner = ctx.plan.owners[0]
    assert worker["replicas"] == owner.replicas
    assert worker["resources"]["limits"]["gpu"] == str(owner.tensor_parallel)
    assert worker["extraPodSpec"]["nodeSelector"] == {"nvidia.com/gpu.product": ctx.node_label(owner.gpu)}


@pytest.mark.parametrize("model", bundled_models())
def test_llmd_values_validate_against_the_vendored_chart_schema(model, tmp_path):
    ctx, _files = build(_write(tmp_path, _colocated(model)), "llm-d")
    doc = llmd_mod.values(ctx)
    assert _errors(_chart_validator(), doc) == []
    assert doc["decode"]["parallelism"]["tensor"] == ctx.plan.owners[0].tensor_parallel
    assert "--tensor-parallel-size" not in doc["decode"]["containers"][0]["args"]  # the chart adds it


def test_schema_checks_catch_a_misspelt_or_mistyped_field(tmp_path):
    ctx, _ = build(_write(tmp_path, _colocated("llama-3.1-8b")), "dynamo")
    doc = dynamo_mod.manifest(ctx)
    bad = copy.deepcopy(doc)
    bad["spec"]["services"][dynamo_mod.WORKER]["replica"] = 1
    assert _errors(_crd_validator(), bad)
    bad = copy.deepcopy(doc)
    bad["spec"]["services"][dynamo_mod.WORKER]["replicas"] = "1"
    assert _errors(_crd_validator(), bad)
    ctx, _ = build(_write(tmp_path, _colocated("llama-3.1-8b")), "llm-d")
    vals = llmd_mod.values(ctx)
    vals["decode"]["parallelism"]["tensorr"] = 2
    assert _errors(_chart_validator(), vals)


@pytest.mark.parametrize("target", ["dynamo", "llm-d"])
def test_yaml_files_read_back_to_the_validated_documents(target, tmp_path):
    yaml = pytest.importorskip("yaml")
    ctx, files = build(_write(tmp_path, _colocated("qwen3-30b-a3b")), target)
    name, doc = (("dynamographdeployment.yaml", dynamo_mod.manifest(ctx)) if target == "dynamo"
                 else ("values.yaml", llmd_mod.values(ctx)))
    assert yaml.safe_load(files[name]) == doc


def test_yaml_emitter_keeps_types_and_order():
    doc = {"b": "1", "a": ["on", 2, 0.5, True, None, {"k": "v", "n": {}}], "nvidia.com/gpu.product": "x",
           "on": []}
    text = to_yaml(doc).decode()
    assert text.splitlines()[0] == 'b: "1"'
    assert '"on": []' in text
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(text) == doc


def test_several_replicas_get_their_own_devices_ports_and_a_router(tmp_path):
    n = 3
    plan = _replicas("llama-3.1-70b", n)  # H100 TP4 replicas
    out = tmp_path / "out"
    export_plan(_write(tmp_path, plan), "vllm", str(out))
    cmds = [_command((out / f"serve-replica-{r}.sh").read_bytes()) for r in range(n)]
    ports = [_flag(c, "--port") for c in cmds]
    assert ports == ["8001", "8002", "8003"]
    devices = [re.search(r"CUDA_VISIBLE_DEVICES=(\S+)", (out / f"serve-replica-{r}.sh").read_text()).group(1)
               for r in range(n)]
    assert devices == ["0,1,2,3", "4,5,6,7", "0,1,2,3"]  # two per 8-GPU node, the third on node 1
    router = (out / "router.sh").read_text()
    assert "NODE1_HOST" in router and router.count("http://") == n
    manifest = json.loads((out / "export.json").read_text())
    assert [p["node"] for p in manifest["placement"]] == [0, 0, 1]
    sgl = tmp_path / "sgl"
    export_plan(_write(tmp_path, plan), "sglang", str(sgl))
    assert _command((sgl / "router.sh").read_bytes())[:3] == ["python3", "-m", "sglang_router.launch_router"]


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("target", COLOCATED_TARGETS)
def test_many_stage_plan_is_refused_with_the_re_plan_hint(target, tmp_path):
    with pytest.raises(InfeasibleError) as exc:
        build(str(MANY_STAGES), target)
    msg = str(exc.value)
    assert exc.value.exit_code == 3 and "\n" not in msg
    assert msg == f"{target} cannot run a 64-stage operator pipeline over 2 owners; re-plan with --policy colocated"


def _with_alternative(tmp_path, entry: dict) -> str:
    doc = json.loads(MANY_STAGES.read_bytes())
    doc["alternatives"] = {"colocated": entry}
    return _write(tmp_path, doc, "with-alternatives.json")


def test_refusal_names_the_alternative_and_its_cost_delta(tmp_path):
    base = json.loads(MANY_STAGES.read_bytes())["usd_per_million_tokens"]
    path = _with_alternative(tmp_path, {"usd_per_million_tokens": base * 1.006, "tpot_ms": 10.0})
    with pytest.raises(InfeasibleError) as exc:
        build(path, "dynamo")
    assert str(exc.value) == ("dynamo cannot run a 64-stage operator pipeline over 2 owners; the colocated "
                              "alternative (+0.6 %) can: use --alternative colocated")


def test_alternative_colocated_exports_the_embedded_plan(tmp_path):
    colocated = json.loads((GOLDEN / "llama-3.1-8b_colocated_h100.json").read_bytes())
    path = _with_alternative(tmp_path, {"plan": colocated})
    out = tmp_path / "out"
    done = export_plan(path, "vllm", str(out), alternative="colocated")
    assert done.alternative == "colocated"
    argv = _command((out / "serve-replica-0.sh").read_bytes())
    assert _flag(argv, "--tensor-parallel-size") == str(colocated["owners"][0]["tensor_parallel"])
    assert json.loads((out / "export.json").read_text())["alternative"] == "colocated"


def test_alternative_missing_or_without_a_plan_is_a_bad_input(tmp_path):
    with pytest.raises(UserError) as exc:
        build(str(MANY_STAGES), "vllm", alternative="colocated")
    assert exc.value.exit_code == 2 and "no 'colocated' alternative" in str(exc.value)
    path = _with_alternative(tmp_path, {"usd_per_million_tokens": 1.0})
    with pytest.raises(UserError) as exc:
        build(path, "vllm", alternative="colocated")
    assert exc.value.exit_code == 2 and "carries no plan" in str(exc.value)
    with pytest.raises(UserError) as exc:
        build(path, "vllm", alternative="cheapest")
    assert "unknown alternative 'cheapest'" in str(exc.value)


# ----------------------------------------------------------------------------- vllm-afd


def _deepseek_afd(tps: tuple[int, ...] = (8,)) -> dict:
    data = _plan_bytes("deepseek-v3", policy="afd", gpus="h200", tensor_parallel_sizes=tps)
    assert data is not None
    return json.loads(data)


def test_vllm_afd_exports_a_deepseek_attention_ffn_pair(tmp_path):
    plan = _deepseek_afd()
    out = tmp_path / "afd"
    done = export_plan(_write(tmp_path, plan), "vllm-afd", str(out))
    assert {"attention-node-0.sh", "ffn-node-1.sh", "benchmark.sh"} <= set(done.files)
    att = _command((out / "attention-node-0.sh").read_bytes())
    ffn = _command((out / "ffn-node-1.sh").read_bytes())
    cfg_a = json.loads(_flag(att, "--additional-config"))["afd"]
    cfg_f = json.loads(_flag(ffn, "--additional-config"))["afd"]
    a, f = plan["owners"]
    assert (cfg_a["role"], cfg_f["role"]) == ("attention", "ffn")
    ranks = (a["replicas"] * a["tensor_parallel"], f["replicas"] * f["tensor_parallel"])
    assert (cfg_a["num_attention_ranks"], cfg_a["num_ffn_ranks"]) == ranks
    assert {k: v for k, v in cfg_a.items() if k != "role"} == {k: v for k, v in cfg_f.items() if k != "role"}
    assert _flag(att, "--max-num-seqs") == str(a["resident_batch"])
    assert ("--enable-dbo" in att) == (plan["microbatches"] == 2)


def test_vllm_afd_refuses_attention_ranks_that_are_not_a_multiple_of_ffn_ranks(tmp_path):
    plan = _deepseek_afd(tps=(1, 2, 4, 8))
    a, f = plan["owners"]
    ra, rf = a["replicas"] * a["tensor_parallel"], f["replicas"] * f["tensor_parallel"]
    if ra >= rf and ra % rf == 0:  # make the rule fail: 8 attention ranks against 16 FFN ranks
        a.update(replicas=1, tensor_parallel=8)
        f.update(replicas=2, tensor_parallel=8, resident_batch=plan["global_batch"] // 2,
                 microbatch=plan["global_batch"] // 2 // plan["microbatches"])
        plan["gpus_total"] = 24
        ra, rf = 8, 16
    with pytest.raises(InfeasibleError) as exc:
        build(_write(tmp_path, plan), "vllm-afd")
    assert f"{ra} attention ranks with {rf} FFN ranks" in str(exc.value)
    assert "multiple" in str(exc.value)


def test_vllm_afd_refuses_other_models_colocated_plans_and_deep_overlap(tmp_path):
    with pytest.raises(InfeasibleError, match=r"qwen3-30b-a3b \(model_type qwen3_moe\).*DeepSeek-V2/V3"):
        build(str(QWEN_AFD), "vllm-afd")
    with pytest.raises(InfeasibleError, match="vllm-afd cannot run a colocated plan; re-plan a DeepSeek"):
        build(_write(tmp_path, _colocated("deepseek-v3")), "vllm-afd")
    plan = _deepseek_afd()
    plan["microbatches"] = 4
    for o in plan["owners"]:
        o["microbatch"] = o["resident_batch"] // 4
    with pytest.raises(InfeasibleError, match="at most two microbatches"):
        build(_write(tmp_path, plan), "vllm-afd")


def test_other_targets_refuse_the_afd_pair(tmp_path):
    with pytest.raises(InfeasibleError, match="vllm cannot run a 122-stage operator pipeline over 2 owners"):
        build(_write(tmp_path, _deepseek_afd()), "vllm")


# ----------------------------------------------------------------------------- bad inputs and writes


def _one_line_user_error(fn) -> str:
    with pytest.raises(UserError) as exc:
        fn()
    assert exc.value.exit_code == 2 and "\n" not in str(exc.value)
    return str(exc.value)


def test_bad_inputs_are_one_line_exit_2_and_write_nothing(tmp_path):
    good = str(GOLDEN / "llama-3.1-8b_colocated_h100.json")
    out = tmp_path / "out"
    msg = _one_line_user_error(lambda: export_plan(good, "tensorrt", str(out)))
    assert msg.startswith("--to: unknown target 'tensorrt'; expected one of vllm, sglang, dynamo, llm-d, vllm-afd")
    msg = _one_line_user_error(lambda: export_plan(good, "vllm", str(out), runtime_version="0.9.0"))
    assert msg == ("--runtime-version: vllm 0.9.0 is not supported; expected a release from 0.10.2 to 0.33.x "
                   "(flag tables: 0.10.2, 0.26.0, 0.33.0)")
    doc = json.loads(Path(good).read_bytes())
    doc["schema_version"] = "2.0"
    other = _write(tmp_path, doc, "v2.json")
    assert "unknown schema_version '2.0'" in _one_line_user_error(lambda: export_plan(other, "vllm", str(out)))
    infeasible = str(GOLDEN / "llama-3.1-8b_infeasible.json")
    assert "infeasibility record" in _one_line_user_error(lambda: export_plan(infeasible, "vllm", str(out)))
    assert not out.exists()
    afile = tmp_path / "a-file"
    afile.write_text("x")
    assert "is not a folder" in _one_line_user_error(lambda: export_plan(good, "vllm", str(afile)))
    under = afile / "sub"
    assert "not a writable folder" in _one_line_user_error(lambda: export_plan(good, "vllm", str(under)))
    proc = "/proc/opweave-export-test/out"  # not creatable, even by root
    assert _one_line_user_error(lambda: export_plan(good, "vllm", proc)).startswith("--out:")
    assert afile.read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "v2.json"]


def test_unwritable_folder_is_refused(tmp_path):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders; the /proc case covers a folder that cannot be made")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        msg = _one_line_user_error(lambda: export_plan(str(GOLDEN / "llama-3.1-8b_colocated_h100.json"),
                                                       "vllm", str(ro / "out")))
        assert "not a writable folder" in msg
    finally:
        ro.chmod(0o700)


def test_same_plan_same_bytes_and_reexport_replaces_stale_files(tmp_path):
    plan = json.loads(_colocated("llama-3.1-70b"))
    path = _write(tmp_path, plan)
    a, b = tmp_path / "a", tmp_path / "b"
    export_plan(path, "sglang", str(a))
    export_plan(path, "sglang", str(b))
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    # a two-replica export first, then the one-replica plan into the same folder: router.sh goes
    two = _replicas("llama-3.1-70b", 2)
    c = tmp_path / "c"
    export_plan(_write(tmp_path, two, "two.json"), "sglang", str(c))
    assert (c / "router.sh").exists()
    export_plan(path, "sglang", str(c))
    assert sorted(p.name for p in c.iterdir()) == names
    assert all((a / n).read_bytes() == (c / n).read_bytes() for n in names)
    assert (c / "serve-replica-0.sh").stat().st_mode & 0o111


def test_hf_repos_match_models_sources():
    table = dict(re.findall(r"^\| (\S+)\.json \| (\S+)", (ROOT / "models" / "SOURCES.md").read_text(), re.M))
    assert table == HF_REPOS
    assert set(HF_REPOS) == set(bundled_models())
    assert {m: hf_repo(m) for m in bundled_models()} == HF_REPOS  # the loader's table, where it has one
    assert hf_repo("not-a-bundled-model") is None


def test_targets_and_pins_are_the_documented_ones():
    pins = {name: t.versions for name, t in TARGETS.items()}
    assert pins == {"vllm": ("0.10.2", "0.26.0", "0.33.0"), "sglang": ("0.5.4", "0.5.23"), "dynamo": ("0.6.0",),
                    "llm-d": ("0.4.12",), "vllm-afd": ("0.26.0",)}
    doc = (ROOT / "docs" / "export.md").read_text()
    for target, versions in pins.items():
        for v in versions:
            assert f"`{target}` {v}" in doc, (target, v)


def test_every_target_module_is_registered_and_its_declaration_is_checked():
    import importlib
    import pkgutil

    from opweave_planner import export
    from opweave_planner.export.base import Target

    declared = {}
    for info in pkgutil.iter_modules(export.__path__):
        mod = importlib.import_module(f"opweave_planner.export.{info.name}")
        if isinstance(getattr(mod, "TARGET", None), Target):
            declared[mod.TARGET.name] = mod.TARGET
    assert declared == dict(TARGETS)
    good = TARGETS["vllm"]
    for bad in ({"name": "vLLM"}, {"versions": ()}, {"versions": ("latest",)}, {"default_version": "9.9"},
                {"summary": ""}, {"summary": "two\nlines"}, {"summary": "rich [markup]"}):
        with pytest.raises(ValueError):
            dataclasses.replace(good, **bad)


def test_help_and_docs_list_the_registry():
    from opweave_planner.cli import export as export_cli
    from opweave_planner.export import registry

    doc = (ROOT / "docs" / "export.md").read_text()
    assert registry.docs_table() in doc, f"docs/export.md's table of targets should read:\n{registry.docs_table()}"
    params = inspect.signature(export_cli.export_cmd).parameters
    assert params["to"].default.help == registry.to_help()
    assert params["runtime_version"].default.help == registry.version_help()
    for name, t in TARGETS.items():
        assert f"{name}: {t.summary}" in registry.to_help()
        assert all(v in registry.version_help() for v in t.versions)


def test_a_new_target_is_one_declaration(tmp_path, monkeypatch):
    """What build needs of a target is its declaration: a made-up one exports and refuses by it."""
    import opweave_planner.export as export
    from opweave_planner.export.base import Target
    from opweave_planner.export.common import is_colocated, refuse
    from opweave_planner.export.shell import header, script

    def check(ctx):
        if not is_colocated(ctx.plan):
            raise refuse(ctx, "that shape")

    toy = Target(name="toy", summary="a toy", versions=("1.0", "1.1"), default_version="1.1",
                 fits=lambda plan, name: name == "colocated", check=check, hint="try --to vllm",
                 render=lambda ctx: {"toy.sh": script(header(ctx, "toy"))})
    monkeypatch.setattr(export, "TARGETS", {**TARGETS, "toy": toy})
    ctx, files = build(str(GOLDEN / "llama-3.1-8b_colocated_h100.json"), "toy")
    assert sorted(files) == ["export.json", "toy.sh"] and ctx.version == "1.1"
    assert b"--to toy (runtime 1.1)" in files["toy.sh"]
    assert json.loads(files["export.json"])["target"] == "toy"
    with pytest.raises(InfeasibleError, match=r"^toy cannot run that shape; try --to vllm$"):
        build(str(MANY_STAGES), "toy")


# ----------------------------------------------------------------------------- CLI

_CLI = ("import sys; from opweave_planner.cli import main, export; "
        "main.app.command('export')(export.export_cmd); main.run()")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _CLI, "export", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_exit_codes_and_one_line_errors(tmp_path):
    good = str(GOLDEN / "llama-3.1-8b_colocated_h100.json")
    ok = _cli(good, "--to", "vllm", "--out", str(tmp_path / "o"))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split() == ["benchmark.sh", "export.json", "serve-replica-0.sh"]
    bad = _cli(good, "--to", "nope", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: --to:")
    refused = _cli(str(MANY_STAGES), "--to", "dynamo", "--out", str(tmp_path / "y"))
    assert refused.returncode == 3 and refused.stderr.count("\n") == 1
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


# ----------------------------------------------------------------------------- runtime parsers (optional)


def test_vllm_flags_parse_with_the_installed_vllm(tmp_path):
    pytest.importorskip("vllm")
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.benchmarks.serve import add_cli_args

    _, files = build(_write(tmp_path, _colocated("qwen3-30b-a3b")), "vllm")
    argv = _command(files["serve-replica-0.sh"])
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[2:])
    assert ns.model_tag == HF_REPOS["qwen3-30b-a3b"] and ns.max_num_seqs >= 1 and ns.kv_cache_dtype == "auto"
    bench = FlexibleArgumentParser()
    add_cli_args(bench)
    bench.parse_args(_command(files["benchmark.sh"], start="vllm bench")[3:])
    _, afd = build(_write(tmp_path, _deepseek_afd(), "afd.json"), "vllm-afd")
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(_command(afd["attention-node-0.sh"])[2:])
    assert ns.enable_expert_parallel


def test_sglang_flags_parse_with_the_installed_sglang(tmp_path):
    server_args = pytest.importorskip("sglang.srt.server_args")
    _, files = build(_write(tmp_path, _colocated("qwen3-30b-a3b")), "sglang")
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(_command(files["serve-replica-0.sh"])[3:])
    assert ns.model_path == HF_REPOS["qwen3-30b-a3b"] and ns.kv_cache_dtype == "auto"


@pytest.mark.parametrize("target,module", [("vllm", "vllm_router.router_args"),
                                           ("sglang", "sglang_router.router_args")])
def test_router_flags_parse_with_the_installed_router(target, module, tmp_path):
    router_args = pytest.importorskip(module)
    _, files = build(_write(tmp_path, _replicas("llama-3.1-8b", 2)), target)
    argv = _command(files["router.sh"])
    parser = argparse.ArgumentParser()
    router_args.RouterArgs.add_cli_args(parser, use_router_prefix=False)
    ns = parser.parse_args(argv[1:] if target == "vllm" else argv[3:])
    assert ns.policy == "round_robin" and len(ns.worker_urls) == 2


def test_unbundled_model_needs_a_model_id_and_node_labels_can_be_overridden(tmp_path):
    plan = json.loads((GOLDEN / "llama-3.1-8b_colocated_h100.json").read_bytes())
    plan["model"] = "my-finetune"
    path = _write(tmp_path, plan)
    assert "--model-id" in _one_line_user_error(lambda: build(path, "vllm"))
    _, files = build(path, "vllm", model_id="/models/my-finetune")
    assert _command(files["serve-replica-0.sh"])[2] == "/models/my-finetune"
    ctx, _ = build(path, "dynamo", model_id="org/ft", node_labels=("H100=NVIDIA-H100-PCIe",))
    worker = dynamo_mod.manifest(ctx)["spec"]["services"][dynamo_mod.WORKER]
    assert worker["extraPodSpec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-PCIe"}
    assert "not GPU=VALUE" in _one_line_user_error(lambda: build(path, "dynamo", model_id="x",
                                                                 node_labels=("h100",)))


def test_embedded_alternative_may_leave_request_keys_to_the_main_plan(tmp_path):
    colocated = json.loads((GOLDEN / "llama-3.1-8b_colocated_h100.json").read_bytes())
    for key in ("schema_version", "search", "provenance"):
        del colocated[key]
    path = _with_alternative(tmp_path, {"name": "colocated", **colocated})
    with pytest.raises(InfeasibleError, match=r"the colocated alternative \(\+?-?[0-9.]+ %\) can"):
        build(path, "sglang")
    ctx, files = build(path, "sglang", alternative="colocated")
    assert ctx.plan.num_stages == 1 and "serve-replica-0.sh" in files


def test_kubernetes_names_are_dns_labels(tmp_path):
    plan = json.loads((GOLDEN / "llama-3.1-8b_colocated_h100.json").read_bytes())
    for model, expect in (("llama-3.1-8b", "llama-3-1-8b-2gpu"), ("3B_Model.v2", "m-3b-model-v2-2gpu"),
                          ("x" * 60, "x" * 52)):
        plan["model"] = model
        ctx, _ = build(_write(tmp_path, plan), "dynamo", model_id="org/m")
        assert ctx.slug == expect
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", ctx.slug) and len(ctx.slug) <= 52


def test_vllm_data_parallel_launch_only_for_a_dense_model_on_one_node(tmp_path):
    _, files = build(_write(tmp_path, _replicas("llama-3.1-70b", 2)), "vllm")  # 2x TP4 on one node
    argv = _command(files["serve-data-parallel.sh"])
    assert (_flag(argv, "--data-parallel-size"), _flag(argv, "--tensor-parallel-size")) == ("2", "4")
    assert _flag(argv, "--max-num-seqs") == str(json.loads(_colocated("llama-3.1-70b"))["owners"][0]["resident_batch"])
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in files["serve-data-parallel.sh"].decode()
    _, files = build(_write(tmp_path, _replicas("llama-3.1-70b", 3)), "vllm")  # spills onto node 1
    assert "serve-data-parallel.sh" not in files
    _, files = build(_write(tmp_path, _replicas("qwen3-30b-a3b", 2)), "vllm")  # MoE
    assert "serve-data-parallel.sh" not in files and "router.sh" in files


def test_expert_parallel_owner_turns_on_each_runtimes_expert_parallelism(tmp_path):
    plan = json.loads(_colocated("qwen3-235b-a22b"))
    own = plan["owners"][0]
    own["expert_parallel"] = own["tensor_parallel"]
    path = _write(tmp_path, plan)
    _, files = build(path, "vllm")
    assert "--enable-expert-parallel" in _command(files["serve-replica-0.sh"])
    _, files = build(path, "sglang")
    assert _flag(_command(files["serve-replica-0.sh"]), "--ep-size") == str(own["tensor_parallel"])
    ctx, _ = build(path, "dynamo")
    doc = dynamo_mod.manifest(ctx)
    assert "--enable-expert-parallel" in doc["spec"]["services"][dynamo_mod.WORKER]["extraPodSpec"]["mainContainer"]["args"]
    assert _errors(_crd_validator(), doc) == []
    ctx, _ = build(path, "llm-d")
    vals = llmd_mod.values(ctx)
    assert "--enable-expert-parallel" in vals["decode"]["containers"][0]["args"]
    assert _errors(_chart_validator(), vals) == []
