"""Exports say what the plan says: every copy, the plan's memory budget, the window it admits,
the resident batch, flags of the chosen release's own parser, and a benchmark of its traffic.

Plans are made in-process on small grids (cached per session); the flag tables are the checked-in
`export/flag_tables.json` that `benchmarks/gen_flag_tables.py` generates from the runtimes' wheels.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from opweave_planner import api
from opweave_planner.errors import InfeasibleError, UserError
from opweave_planner.export import TARGETS, build, resolve_version
from opweave_planner.export.bench import SAMPLE
from opweave_planner.plan import plan_bytes

ROOT = Path(__file__).resolve().parents[1]


def _check_exports():
    """benchmarks/check_exports.py as a module (its offline part is what this file checks)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_exports", ROOT / "benchmarks" / "check_exports.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CHECK = _check_exports()
commands, _table = CHECK.commands, CHECK.table_of
GOLDEN = ROOT / "tests" / "golden"
TABLES = json.loads((ROOT / "src" / "opweave_planner" / "export" / "flag_tables.json").read_text())
TRACE = ROOT / "examples" / "traces" / "mooncake-conversation-sample.jsonl"
COLOCATED = ("vllm", "sglang", "dynamo", "llm-d")
_PLANS: dict[str, bytes] = {}


def _plan(name: str) -> bytes:
    """Small plans of each kind the exporters meet (made once per session)."""
    if name not in _PLANS:
        kw = {"gpus": "h100", "policy": "colocated", "batches": (8, 16, 32)}
        if name == "sized":  # a deployment of several copies, ISL/OSL given
            req = api.make_request("llama-3.1-8b", "60ms", "8k", prompt_len="7680", output_len="1024",
                                   target_tokens_per_s=20000, **kw)
        elif name == "memory":  # searched under a lower budget and a headroom
            req = api.make_request("llama-3.1-8b", "60ms", "8k", gpu_memory_utilization=0.8,
                                   memory_headroom="5%", **kw)
        elif name == "workload":  # the Mooncake sample, shaped, sized for a rate
            req = api.make_request("llama-3.1-8b", "60ms", workload=str(TRACE), scale_ctx="8k",
                                   max_model_len="32k", scenarios=16, target_tokens_per_s=5000, **kw)
        elif name in ("agg", "agg-auto"):  # the aggregated mode: its replicas are what runs (forced: schema
            # 1.14, no prefill pool planned; auto: 1.11, the cheaper of both modes, the pool beside it)
            req = api.make_request("llama-3.1-8b", "60ms", "8704", gpus="h100", policy="colocated",
                                   tensor_parallel_sizes="1,2", batches=(8, 16, 32, 64), prompt_len="7680",
                                   output_len="1024", ttft="1s", request_rate=8,
                                   deployment_mode="aggregated" if name == "agg" else "auto")
        else:
            raise KeyError(name)
        _PLANS[name] = plan_bytes(api.plan(req).plan)
    return _PLANS[name]


DISAGG = GOLDEN / "llama-3.1-8b_colocated_h100-isl7680-osl1024-ttft1s-rate8_v1.10.json"  # --ttft 1s --request-rate 8


def _file(tmp_path: Path, name: str) -> str:
    if name == "disagg":  # a disaggregated deployment (schema 1.10): decode copies and a prefill pool
        return str(DISAGG)
    p = tmp_path / f"{name}.json"
    p.write_bytes(_plan(name))
    return str(p)


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _exports():
    for target in COLOCATED:
        for version in TARGETS[target].versions:
            for plan in ("sized", "memory", "workload", "disagg", "agg"):
                yield target, version, plan


@pytest.mark.parametrize("target,version,plan", list(_exports()))
def test_export_realises_the_plan(target, version, plan, tmp_path):
    """Per export: replicas x TP = the plan's GPUs (every copy), memory budget = the plan's,
    --max-model-len = the admitted window, --max-num-seqs = the resident batch; every flag is
    one of the chosen release's parser."""
    from opweave_planner.contract import read_plan
    from opweave_planner.inputs.hardware import load_hardware
    from opweave_planner.latency.memory import nccl_bytes, usable_bytes

    path = _file(tmp_path, plan)
    doc = read_plan(path)
    _ctx, files = build(path, target, runtime_version=version)
    own, dep = doc.owners[0], doc.deployment
    pool = None if dep is None else dep.prefill
    decode_gpus = doc.gpus_total if dep is None else dep.gpus_total
    agg = dep.aggregated if dep is not None and dep.mode == "aggregated" else None
    if agg is not None:  # the aggregated replicas, not the decode plan, and no prefill pool
        from types import SimpleNamespace

        assert agg.gpu == own.gpu and (agg.tensor_parallel, agg.batch) != (own.tensor_parallel, own.resident_batch)
        own = SimpleNamespace(gpu=agg.gpu, tensor_parallel=agg.tensor_parallel, resident_batch=agg.batch)
        decode_gpus, pool = agg.gpus, None
    gpus = decode_gpus + (0 if pool is None else pool.gpus)  # both pools
    man = json.loads(files["export.json"])
    assert man["deployment"]["gpus_total"] == gpus
    assert man["deployment"]["copies"] == (1 if dep is None or agg is not None else dep.copies)
    if agg is not None:
        rec = man["deployment"]["aggregated"]
        assert man["deployment"]["mode"] == man["deployment"]["plan_mode"] == "aggregated"
        assert (rec["replicas"], rec["gpus"], rec["max_num_seqs"], rec["chunk_tokens"]) == (
            agg.replicas, agg.gpus, agg.batch, agg.chunk_tokens)
        assert man["deployment"]["nodes_total"] == math.ceil(agg.replicas / (8 // agg.tensor_parallel))
    elif dep is not None:
        prefill_nodes = 0 if pool is None else math.ceil(pool.instances / (8 // pool.tensor_parallel))
        assert man["deployment"]["nodes_total"] == dep.nodes_total + prefill_nodes
    servers = [a for a in commands(files) if a[1] == "serve" or "launch_server" in a[2]]
    batch_flag = "--max-running-requests" if target == "sglang" else "--max-num-seqs"
    decode = [a for a in servers if batch_flag in a]
    prefill = [a for a in servers if batch_flag not in a]  # the plan records no prefill batch limit
    if target in ("vllm", "sglang"):
        groups = [a for a in decode if "--data-parallel-size" not in a]  # serve-data-parallel.sh: instead
        assert len(groups) * own.tensor_parallel == decode_gpus
        assert len(prefill) == (0 if pool is None else pool.instances)
    else:
        import yaml

        y = yaml.safe_load(files[next(n for n in files if n.endswith(".yaml"))])
        if target == "dynamo":
            reps = y["spec"]["services"]["VllmDecodeWorker"]["replicas"]
            pre = y["spec"]["services"].get("VllmPrefillWorker", {}).get("replicas", 0)
        else:
            reps, pre = y["decode"]["replicas"], y["prefill"].get("replicas", 0)
        assert reps * own.tensor_parallel == decode_gpus
        assert pre == (0 if pool is None else pool.instances)
        assert len(prefill) == (0 if pool is None else 1)  # one service / pool of pods
    space = doc.search.space
    for argv in servers:
        group = own if argv in decode else pool
        gpu = load_hardware().resolve(group.gpu, "gpu")
        usable = usable_bytes(gpu, group.tensor_parallel, utilization=space.gpu_memory_utilization,
                              reserve_gb=space.reserve_gb(group.gpu)) * (1 - (space.memory_headroom or 0))
        if group is own and agg is None:
            assert own.memory_bytes_per_gpu <= usable
        if target == "sglang":
            frac, width = float(_flag(argv, "--mem-fraction-static")), "--context-length"
            assert math.isclose(frac * gpu.memory_bytes, usable, rel_tol=0, abs_tol=1e-4 * gpu.memory_bytes)
        else:
            frac, width = float(_flag(argv, "--gpu-memory-utilization")), "--max-model-len"
            budget = frac * gpu.memory_bytes - space.reserve_gb(group.gpu) * 2**30 - nccl_bytes(gpu, group.tensor_parallel)
            assert math.isclose(budget, usable, rel_tol=0, abs_tol=1e-4 * gpu.memory_bytes)
            if not space.memory_headroom:
                assert frac == space.gpu_memory_utilization
        if group is own:
            assert _flag(argv, batch_flag) == str(own.resident_batch)
        if agg is not None:  # the step budget the aggregated replay assumed
            assert int(_flag(argv, "--chunked-prefill-size" if target == "sglang" else "--max-num-batched-tokens")) \
                == agg.chunk_tokens
        elif group is not own:  # the chunk the pool's prefill times assume
            chunk = "--chunked-prefill-size" if target == "sglang" else "--max-num-batched-tokens"
            assert int(_flag(argv, chunk)) == pool.chunk_tokens
        assert int(_flag(argv, width)) == doc.workload.window
    for argv in commands(files):
        runtime, release, command = _table(target, version, argv)
        known = set(TABLES[runtime][release][command])
        if target == "dynamo" and command == "serve":  # Dynamo's worker adds its own (--is-prefill-worker)
            known |= set(TABLES["dynamo"][version]["worker"])
        used = {a for a in argv if a.startswith("--")}
        assert used <= known, (runtime, release, command, used - known)


def test_the_window_is_prompt_plus_output_and_the_workload_window_is_its_limit(tmp_path):
    from opweave_planner.contract import read_plan

    sized = read_plan(_file(tmp_path, "sized"))
    assert (sized.workload.context_tokens, sized.workload.window) == (8192, 8704)
    from opweave_planner.plan import plan_version

    # 1.7 keys; stamped 1.9 for the binding record every plan now carries
    assert sized.schema_version == "1.9" and plan_version(sized.model_copy(update={"binding": None})) == "1.7"
    work = read_plan(_file(tmp_path, "workload"))
    assert work.workload.window == work.workload.distribution.max_model_len == 32768
    assert work.workload.max_model_len is None  # no new key: its window was recorded since 1.3
    with pytest.raises(UserError, match="--prompt-len: only applies with --ctx"):
        api.make_request("llama-3.1-8b", "60ms", workload=str(TRACE), prompt_len="1k")
    with pytest.raises(UserError, match="--output-len: 8192 tokens leaves no room"):
        api.make_request("llama-3.1-8b", "60ms", "8k", output_len="8k")
    req = api.make_request("llama-3.1-8b", "60ms", "8k", output_len="512")
    assert req.lengths == (7680, 512)


def test_diff_names_the_window_apart_from_the_planned_context(tmp_path):
    from opweave_planner.contract import diff_plans, read_plan

    old = read_plan(GOLDEN / "llama-3.1-8b_colocated_h100.json")
    new = read_plan(GOLDEN / "llama-3.1-8b_colocated_h100-isl7680-osl1024_v1.7.json")
    words = diff_plans(old, new)["changes"][0]["summary"]
    assert "window 8192 -> 8704" in words and "ctx" not in words
    assert "prompt-len none -> 7680" in words


def test_a_plan_without_sizing_exports_one_copy_and_says_so(tmp_path):
    from opweave_planner.export import export_plan

    done = export_plan(str(GOLDEN / "llama-3.1-8b_colocated_h100.json"), "vllm", str(tmp_path / "o"))
    assert "records no deployment sizing" in done.notes[0]
    man = json.loads((tmp_path / "o" / "export.json").read_text())
    assert man["deployment"]["sized"] is False and man["deployment"]["copies"] == 1
    assert "(it records no sizing)" in (tmp_path / "o" / "serve-replica-0.sh").read_text()


@pytest.mark.parametrize("target", COLOCATED)
def test_a_disaggregated_plan_exports_both_pools_and_says_so(target, tmp_path):
    from opweave_planner.export import export_plan

    pool = json.loads(DISAGG.read_text())["deployment"]["prefill"]
    done = export_plan(str(DISAGG), target, str(tmp_path / "o"))
    words = f"its prefill pool ({pool['instances']}x {pool['gpu']} TP{pool['tensor_parallel']}, chunk"
    assert any(words in note for note in done.notes), done.notes
    man = json.loads((tmp_path / "o" / "export.json").read_text())["deployment"]
    assert words in man["note"] and man["mode"] == "disaggregated"
    assert man["prefill"]["instances"] == pool["instances"] and man["prefill"]["chunk_tokens"] == pool["chunk_tokens"]


def test_a_target_without_a_prefill_export_still_says_it_leaves_the_pool_out(tmp_path):
    """The note for a target that writes no prefill pool (none today: a guard for the next one)."""
    from dataclasses import replace

    from opweave_planner.export import sizing_note

    ctx, _files = build(str(DISAGG), "vllm")
    pool = ctx.prefill
    ctx = replace(ctx, target=replace(ctx.target, writes_prefill=False))
    assert f"prefill pool ({pool.instances}x {pool.gpu} TP{pool.tensor_parallel}) is not exported" in sizing_note(ctx)


@pytest.mark.parametrize("target", ["vllm", "sglang"])
def test_the_pd_router_fronts_every_prefill_and_decode_server(target):
    """One router in P/D mode over all of them; prefill servers on their own nodes, NIXL side
    channels (vLLM) and bootstrap ports (SGLang) distinct on each node."""
    from opweave_planner.contract import read_plan

    dep = read_plan(DISAGG).deployment
    _ctx, files = build(str(DISAGG), target)
    prefill = sorted(n for n in files if n.startswith("serve-prefill-"))
    decode = sorted(n for n in files if n.startswith("serve-decode-"))
    assert len(prefill) == dep.prefill.instances and len(decode) == dep.owners[0].replicas  # every copy
    assert not any(n.startswith("serve-replica-") for n in files)
    router = commands({"router.sh": files["router.sh"]})[0]
    assert ("--vllm-pd-disaggregation" if target == "vllm" else "--pd-disaggregation") in router
    assert router.count("--prefill") == len(prefill) and router.count("--decode") == len(decode)
    place = json.loads(files["export.json"])["placement"]
    pre_nodes = {r["node"] for r in place if r["owner"] == "prefill"}
    dec_nodes = {r["node"] for r in place if r["owner"] != "prefill"}
    assert pre_nodes and not pre_nodes & dec_nodes  # the plan's hand-off crosses nodes
    ports = [(r["node"], d) for r in place for d in r["devices"]]
    assert len(ports) == len(set(ports))  # no GPU serves twice
    if target == "vllm":
        for name in prefill + decode:
            text = files[name].decode()
            assert "--kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}'" in text
        side = [(r["node"], 5600 + r["devices"][0]) for r in place]
        assert len(side) == len(set(side))
    else:
        boots = [router[i + 2] for i, a in enumerate(router) if a == "--prefill"]
        assert len(boots) == len(set(boots)) == len(prefill)


def test_aggregated_exports_carry_the_chunk_the_plan_assumed(tmp_path):
    """chunk_tokens_of: a 1.10 plan's prefill chunk; a plan that records none gets vLLM's own
    default made explicit where it is the latency model's, nothing where the release's differs,
    and SGLang nothing."""
    from opweave_planner.export.common import chunk_tokens_of
    from opweave_planner.export.vllm import FLAGS, chunk_args
    from opweave_planner.latency.prefill import default_chunk_tokens

    ctx, files = build(_file(tmp_path, "sized"), "vllm")
    assert chunk_tokens_of(ctx.plan) is None
    serve = commands({"s.sh": files["serve-replica-0.sh"]})[0]
    assert "--enable-chunked-prefill" in serve
    assert int(_flag(serve, "--max-num-batched-tokens")) == default_chunk_tokens(ctx.gpu("h100")) == 8192
    flags = FLAGS["0.33.0"]
    assert chunk_args(ctx, "a100", "0.33.0", flags)[-1] == "2048"
    assert chunk_args(ctx, "b200", "0.26.0", flags)[-1] == str(default_chunk_tokens(ctx.gpu("b200")))
    assert chunk_args(ctx, "b200", "0.33.0", flags) == []  # 0.33 defaults >= 160 GiB GPUs to 16384
    _ctx, files = build(_file(tmp_path, "sized"), "sglang")
    assert "--chunked-prefill-size" not in files["serve-replica-0.sh"].decode()
    disagg = build(str(DISAGG), "vllm")[0]
    assert chunk_tokens_of(disagg.plan) == disagg.prefill.chunk_tokens == 8192


def test_a_sized_plan_exports_every_copy_behind_one_router(tmp_path):
    from opweave_planner.contract import read_plan

    path = _file(tmp_path, "sized")
    dep = read_plan(path).deployment
    assert dep.copies > 1
    _ctx, files = build(path, "vllm")
    serve = sorted(n for n in files if n.startswith("serve-replica-"))
    assert len(serve) == dep.owners[0].replicas
    router = commands({"router.sh": files["router.sh"]})[0]
    assert len(router) - router.index("--worker-urls") - 1 == len(serve)
    devices = {(json.loads(files["export.json"])["placement"][i]["node"],
                tuple(json.loads(files["export.json"])["placement"][i]["devices"])) for i in range(len(serve))}
    assert len(devices) == len(serve)  # no two groups share a GPU


def test_benchmark_replays_the_shaped_workload_deterministically(tmp_path):
    from opweave_planner.contract import read_plan

    path = _file(tmp_path, "workload")
    plan = read_plan(path)
    _ctx, files = build(path, "vllm")
    again = build(path, "vllm")[1]
    assert files[SAMPLE] == again[SAMPLE]
    rows = [json.loads(line) for line in files[SAMPLE].splitlines()]
    conc = plan.deployment.copies * plan.global_batch
    assert len(rows) == min(4096, 4 * conc)
    assert max(r["input_length"] + r["output_length"] for r in rows) <= plan.workload.window
    assert len({r["input_length"] for r in rows}) > 10  # drawn, not one fixed length
    mean = sum(r["input_length"] for r in rows) / len(rows)
    assert abs(mean / plan.workload.distribution.mean_prompt - 1) < 0.25
    times = [r["timestamp"] for r in rows]
    assert times == sorted(times) and times[-1] > 0  # Poisson arrivals at the target rate
    rate = (len(times) - 1) / times[-1]
    want = plan.deployment.target_tokens_per_s / (sum(r["output_length"] for r in rows) / len(rows))
    assert abs(rate / want - 1) < 0.2
    argv = commands({"benchmark.sh": files["benchmark.sh"]})[0]
    assert _flag(argv, "--dataset-name") == "timed_trace"
    script = files["benchmark.sh"].decode()
    assert f'CONCURRENCY="${{CONCURRENCY:-{conc}}}"' in script
    assert "sharegpt" not in script.lower() and "http" not in script.replace("http://${HOST}", "")


def test_sglang_benchmark_uses_the_releases_client_and_downloads_nothing(tmp_path):
    path = str(GOLDEN / "llama-3.1-8b_colocated_h100.json")
    for version, module, key in (("0.5.4", "sglang.bench_serving", "p99_tpot_ms"),
                                 ("0.5.23", "sglang.benchmark.serving", "p95_tpot_ms")):
        files = build(path, "sglang", runtime_version=version)[1]
        argv = commands({"benchmark.sh": files["benchmark.sh"]})[0]
        assert argv[2] == module and _flag(argv, "--dataset-name") == "random-ids"
        assert repr(key) in files["benchmark.sh"].decode()


def test_runtime_versions_are_ranges_over_the_flag_tables():
    vllm = TARGETS["vllm"]
    assert resolve_version(vllm, None) == ("0.33.0", "0.33.0")
    assert resolve_version(vllm, "0.20.1") == ("0.20.1", "0.10.2")
    assert resolve_version(vllm, "v0.33.2") == ("0.33.2", "0.33.0")
    assert resolve_version(TARGETS["sglang"], "0.5.10.post1")[1] == "0.5.4"
    for bad in ("0.9.2", "0.34.0", "latest"):
        with pytest.raises(UserError, match="--runtime-version"):
            resolve_version(vllm, bad)
    for target in TARGETS.values():  # every table a target writes for is generated and checked in
        runtime = "vllm" if target.name in ("vllm", "vllm-afd") else target.name
        if runtime in TABLES:
            assert set(target.versions) <= set(TABLES[runtime]), target.name


def _deepseek_afd() -> dict:
    if "afd" not in _PLANS:
        req = api.make_request("deepseek-v3", "200ms", "8k", gpus="h200", policy="afd", batches=(8, 16),
                               tensor_parallel_sizes=(8,))
        _PLANS["afd"] = plan_bytes(api.plan(req).plan)
    return json.loads(_PLANS["afd"])


def test_a_refusal_never_suggests_an_alternative_that_is_refused(tmp_path):
    """A two-owner alternative that is an attention | FFN pair the connector cannot run (fewer
    attention ranks than FFN ranks) is not suggested; one it can run is."""
    from opweave_planner.export.common import refuse

    good = _deepseek_afd()
    bad = json.loads(json.dumps(good))
    ffn = bad["owners"][1]
    ffn["replicas"], ffn["resident_batch"], ffn["microbatch"] = 2, ffn["resident_batch"] // 2, ffn["microbatch"] // 2
    bad["gpus_total"] = sum(o["replicas"] * o["tensor_parallel"] for o in bad["owners"])
    p = tmp_path / "p.json"
    p.write_text(json.dumps(good))
    ctx, _files = build(str(p), "vllm-afd")
    for alt, suggested in ((bad, False), (good, True)):
        ctx.raw = {**good, "alternatives": {"two_owner": {"usd_per_million_tokens": 1.0, "plan": alt}}}
        words = str(refuse(ctx, "a colocated plan"))
        assert ("--alternative two_owner" in words) == suggested, words
    with pytest.raises(InfeasibleError, match="attention ranks"):
        p.write_text(json.dumps(bad))
        build(str(p), "vllm-afd")


def test_vllm_afd_keeps_the_plans_expert_parallelism_and_asks_for_afd_host_across_nodes(tmp_path):
    plan = _deepseek_afd()
    p = tmp_path / "p.json"
    p.write_text(json.dumps(plan))
    files = build(str(p), "vllm-afd")[1]
    for name in ("attention-node-0.sh", "ffn-node-1.sh"):
        script = files[name].decode()
        ep = plan["owners"][0 if "attention" in name else 1]["expert_parallel"] > 1
        assert ("--enable-expert-parallel" in script) == ep
        assert 'AFD_HOST="${AFD_HOST:?' in script  # the roles are on two nodes: no loopback default


def test_a_plan_from_a_hub_cache_id_serves_that_id(tmp_path):
    from opweave_planner.contract import read_plan
    from opweave_planner.export import _hub_id

    plan = read_plan(GOLDEN / "llama-3.1-8b_colocated_h100.json")
    assert _hub_id(plan.model_copy(update={"model": "org/some-model"})) == "org/some-model"
    assert _hub_id(plan) is None  # a bundled name: its repository comes from the table
    assert _hub_id(plan.model_copy(update={"model": "org/m", "model_source": "/x/config.json"})) is None


def test_flag_tables_hold_every_flag_the_exporters_name():
    from opweave_planner.export import sglang, vllm, vllm_afd

    for version, flags in vllm.FLAGS.items():
        assert set(flags.values()) <= set(TABLES["vllm"][version]["serve"]), version
    for version, flags in vllm_afd.FLAGS.items():
        assert set(flags.values()) <= set(TABLES["vllm"][version]["serve"]), version
    for version, flags in sglang.FLAGS.items():
        assert set(flags.values()) <= set(TABLES["sglang"][version]["server"]), version
    assert "--enable-dbo" not in TABLES["vllm"]["0.10.2"]["serve"]  # the tables are not one list


def test_check_exports_offline_part_finds_no_rejection_and_catches_one(tmp_path):
    """The script's offline part over the goldens and an aggregated-mode plan, every target: flags
    in the tables, manifests valid; a flag no release has is caught."""
    tables, schemas = json.loads(CHECK.TABLES.read_text()), CHECK.validators()
    checked = 0
    for plan in (GOLDEN / "llama-3.1-8b_colocated_h100.json",
                 GOLDEN / "llama-3.1-8b_colocated_h100-isl7680-osl1024_v1.7.json", Path(_file(tmp_path, "agg"))):
        for name in COLOCATED:
            for version in TARGETS[name].versions:
                _ctx, files = build(str(plan), name, runtime_version=version)
                uses, bad = CHECK.offline(files, name, version, tables, schemas)
                assert uses > 10 and bad == [], (plan.name, name, version, bad)
                checked += 1
    assert checked == 3 * sum(len(TARGETS[n].versions) for n in COLOCATED)
    _uses, bad = CHECK.offline({"x.sh": b"exec vllm serve m --no-such-flag 1\n"}, "vllm", "0.33.0", tables, schemas)
    assert bad == ["vllm 0.33.0 serve: --no-such-flag"]


@pytest.mark.parametrize("target", COLOCATED)
def test_a_disaggregated_benchmark_compares_ttft_with_the_plan(target, tmp_path):
    """The benchmark of both pools carries the plan's replayed TTFT, SLO and percentile; a
    decode-only plan's says it has no TTFT figure."""
    import subprocess

    pool = json.loads(DISAGG.read_text())["deployment"]["prefill"]
    _ctx, files = build(str(DISAGG), target)
    text = files["benchmark.sh"].decode()
    head = next(line for line in text.splitlines() if line.startswith("python3 - "))
    assert head.split()[-4:-1] == [repr(pool["ttft_ms"]), repr(pool["ttft_slo_ms"]), repr(pool["ttft_percentile"])]
    if target != "vllm":
        return
    res = tmp_path / "r"
    res.mkdir()
    (res / "tpot.json").write_text(json.dumps({"p50_ttft_ms": 500, "p95_ttft_ms": 1100, "p50_tpot_ms": 15,
                                               "p95_tpot_ms": 16}))
    snippet = text[text.index("python3 - "):]
    out = subprocess.run(["bash", "-c", snippet], env={"RESULT_DIR": str(res), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    assert f"vs plan p95 {pool['ttft_ms']:.1f} ms" in out and "TTFT SLO 1000 ms: MISSED at p95" in out
    _ctx, files = build(str(GOLDEN / "llama-3.1-8b_colocated_h100.json"), target)
    snippet = files["benchmark.sh"].decode()
    out = subprocess.run(["bash", "-c", snippet[snippet.index("python3 - "):]],
                         env={"RESULT_DIR": str(res), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    assert "the plan is decode only: no TTFT figure" in out


@pytest.mark.parametrize("target", COLOCATED)
def test_an_aggregated_mode_plan_exports_its_replicas_and_benchmarks_its_arrivals(target, tmp_path):
    """deployment.mode == aggregated: the files run deployment.aggregated (every replica behind one
    router, no prefill pool, no decode-plan server) and benchmark.sh sends the plan's arrival rate
    and compares with the aggregated TTFT and TPOT; vllm-afd refuses, naming a target that runs it."""
    import subprocess

    from opweave_planner.contract import read_plan
    from opweave_planner.export import export_plan

    path = _file(tmp_path, "agg")
    dep = read_plan(path).deployment
    agg = dep.aggregated
    _ctx, files = build(path, target)
    assert not any(n.startswith(("serve-prefill-", "serve-decode-")) for n in files)
    if target in ("vllm", "sglang"):
        serve = sorted(n for n in files if n.startswith("serve-replica-"))
        assert len(serve) == agg.replicas
        if agg.replicas > 1:
            router = commands({"router.sh": files["router.sh"]})[0]
            assert len(router) - router.index("--worker-urls") - 1 == agg.replicas
    text = files["benchmark.sh"].decode()
    head = next(line for line in text.splitlines() if line.startswith("python3 - ")).split()
    assert head[3:5] == [repr(agg.tpot_mean_ms), repr(agg.tpot_ms)]
    slo = dep.prefill.ttft_slo_ms if dep.prefill is not None else agg.ttft_slo_ms  # 1.14: recorded on agg
    assert head[6:8] == [repr(agg.ttft_ms), repr(slo)]
    bench = next(a for a in commands(files) if "--request-rate" in a)
    assert float(_flag(bench, "--request-rate")) == dep.arrivals.rate
    assert json.loads(files["export.json"])["benchmark"]["concurrency"] == agg.replicas * agg.batch
    if target == "vllm":
        res = tmp_path / "r"
        res.mkdir()
        (res / "tpot.json").write_text(json.dumps({"p50_ttft_ms": 400, "p95_ttft_ms": 500, "p50_tpot_ms": 18,
                                                   "p95_tpot_ms": 70}))
        out = subprocess.run(["bash", "-c", text[text.index("python3 - "):]],
                             env={"RESULT_DIR": str(res), "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, check=True).stdout
        assert f"vs plan mean {agg.tpot_mean_ms:.2f} ms" in out and f"vs plan p95 {agg.tpot_ms:.2f} ms" in out
        assert f"vs plan p95 {agg.ttft_ms:.1f} ms" in out and "SLO 60 ms: MISSED at p95" in out
    done = export_plan(path, target, str(tmp_path / "o"))
    assert any(f"{agg.replicas} replicas of {agg.gpu} TP{agg.tensor_parallel}" in n for n in done.notes)
    with pytest.raises(InfeasibleError, match=r"vllm-afd cannot run an aggregated deployment.*use --to vllm$"):
        build(path, "vllm-afd")


def test_the_other_deployment_mode_exports_on_request(tmp_path):
    """build(deployment_mode=...): a plan that searched both modes exports either; a mode the plan
    does not record, or an unknown one, is one line naming the option."""
    from opweave_planner.contract import read_plan

    auto = GOLDEN / "llama-3.1-8b_colocated_h100-isl7680-osl1024-ttft1s-rate8-auto_v1.11.json"
    dep = read_plan(auto).deployment
    assert dep.mode == "disaggregated"
    _ctx, files = build(str(auto), "vllm", deployment_mode="aggregated")
    agg = dep.aggregated
    serve = sorted(n for n in files if n.startswith("serve-replica-"))
    assert len(serve) == agg.replicas and not any(n.startswith("serve-prefill-") for n in files)
    argv = commands({"s.sh": files[serve[0]]})[0]
    assert int(_flag(argv, "--max-num-batched-tokens")) == agg.chunk_tokens
    assert int(_flag(argv, "--max-num-seqs")) == agg.batch
    man = json.loads(files["export.json"])["deployment"]
    assert (man["plan_mode"], man["exported_mode"], man["gpus_total"]) == ("disaggregated", "aggregated", agg.gpus)
    with pytest.raises(UserError, match="records no disaggregated deployment"):  # forced: no prefill pool planned
        build(_file(tmp_path, "agg"), "sglang", deployment_mode="disaggregated")
    path = _file(tmp_path, "agg-auto")
    other = read_plan(path).deployment
    assert other.mode == "aggregated" and other.prefill is not None
    _ctx, files = build(path, "sglang", deployment_mode="disaggregated")
    assert len([n for n in files if n.startswith("serve-prefill-")]) == other.prefill.instances
    assert json.loads(files["export.json"])["deployment"]["gpus_total"] == other.gpus_total + other.prefill.gpus
    from conftest import assert_one_line_error, run_cli

    ran = run_cli("export", auto, "--to", "dynamo", "--out", tmp_path / "o", "--deployment-mode", "aggregated")
    assert ran.code == 0 and "(--deployment-mode aggregated;" in ran.err, ran.err
    ran = run_cli("export", GOLDEN / "llama-3.1-8b_colocated_h100.json", "--to", "vllm", "--out", tmp_path / "n",
                  "--deployment-mode", "aggregated")
    assert_one_line_error(ran, 2, "--deployment-mode:", "records no aggregated deployment")
    assert not (tmp_path / "n").exists()
    with pytest.raises(UserError, match="--deployment-mode: 'mixed' unknown"):
        build(path, "vllm", deployment_mode="mixed")
    with pytest.raises(UserError, match="records no aggregated deployment"):
        build(_file(tmp_path, "sized"), "vllm", deployment_mode="aggregated")


def test_the_aggregated_memory_budget_is_the_one_its_search_used(tmp_path):
    """The usable bytes an export's memory flags derive from (Context.usable_bytes over the
    recorded space) equal those the aggregated search fitted each replica's weights and KV in
    (compile.tables.usable_per_gpu over the recorded request), so the flags are the plan's budget."""
    from opweave_planner.compile.tables import usable_per_gpu
    from opweave_planner.contract import read_plan, recorded_request

    path = _file(tmp_path, "agg")
    plan = read_plan(path)
    ctx, _files = build(path, "vllm")
    group = ctx.owners[0]
    req = recorded_request(plan)
    assert math.isclose(ctx.usable_bytes(group), usable_per_gpu(ctx.gpu(group.gpu), group.tensor_parallel, req),
                        rel_tol=1e-9)
