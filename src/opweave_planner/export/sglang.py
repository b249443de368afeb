"""`--to sglang`: one `sglang.launch_server` script per replica, an sglang-router script, a benchmark.

Flag names come from SGLang's own dataclass-derived parser (`sglang/srt/arg_groups/fields/*.py`:
a field `tp_size` is the flag `--tp-size`, see `arg_utils.py`), the router's from
`sglang_router/router_args.py`, the benchmark's from `sglang/benchmark/serving.py`. A
disaggregated plan (schema 1.10) gets `--disaggregation-mode prefill|decode` servers (NIXL
transfer backend, one bootstrap port per prefill server) behind sglang-router's P/D mode.
"""

from __future__ import annotations

from opweave_planner.export import vllm as _vllm
from opweave_planner.export.base import Context, Target, share
from opweave_planner.export.bench import (
    BENCH_VARS,
    Keys,
    bench_env,
    benchmark_vllm,
    compare_snippet,
    plan_tpot,
    plan_ttft,
    traffic,
)
from opweave_planner.export.common import BASE_PORT, chunk_tokens_of
from opweave_planner.export.shell import Word, comment, header, number, script, shell_command

_SERVER = {
    "model": "--model-path", "tp": "--tp-size", "ep": "--ep-size", "seqs": "--max-running-requests",
    "len": "--context-length", "kv": "--kv-cache-dtype", "mem": "--mem-fraction-static",
    "host": "--host", "port": "--port", "chunk": "--chunked-prefill-size", "mode": "--disaggregation-mode",
    "backend": "--disaggregation-transfer-backend", "bootstrap": "--disaggregation-bootstrap-port",
}
BOOTSTRAP_PORT = 8998  # SGLang's default --disaggregation-bootstrap-port; server k of a node takes 8998 + k
# the benchmark client per release: its module and result keys (0.5.4's bench_serving reports
# median and p99, no p95; 0.5.23 moved it to sglang.benchmark.serving and added p95)
CLIENT = {"0.5.4": ("sglang.bench_serving", Keys("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
                                                  "p99_tpot_ms", "p99")),
          "0.5.23": ("sglang.benchmark.serving", Keys("median_ttft_ms", "p95_ttft_ms", "median_tpot_ms",
                                                       "p95_tpot_ms"))}
FLAGS = dict.fromkeys(CLIENT, _SERVER)


def chunk_args(ctx: Context, flags: dict[str, str]) -> list[str]:
    """`--chunked-prefill-size`: the chunk the plan assumed (`chunk_tokens_of`; 0, whole prompts,
    is SGLang's -1); nothing for a plan that records none (SGLang's default follows its own GPU
    memory tiers, which are not the latency model's vLLM rule on A100, L40S or B200)."""
    chunk = chunk_tokens_of(ctx.plan, ctx.mode)
    if chunk is None:
        return []
    return [flags["chunk"], str(chunk) if chunk else "-1"]


def server_args(ctx: Context, flags: dict[str, str], group, port: int, batch: int | None) -> list[str]:
    """One `sglang.launch_server`: TP/EP, batch limit, window, KV dtype and the plan's memory."""
    argv = ["python3", "-m", "sglang.launch_server", flags["model"], ctx.model_id,
            flags["host"], "0.0.0.0", flags["port"], str(port),
            flags["tp"], str(group.tensor_parallel)]
    if getattr(group, "expert_parallel", 1) > 1:
        argv += [flags["ep"], str(group.expert_parallel)]
    if batch is not None:
        argv += [flags["seqs"], str(batch)]
    return argv + [flags["len"], str(ctx.plan.workload.window), flags["kv"], "auto",
                   flags["mem"], share(ctx.static_fraction(group))]


def render(ctx: Context) -> dict[str, bytes]:
    if ctx.prefill is not None:
        return render_disaggregated(ctx)
    flags = FLAGS[ctx.version]
    owner = ctx.owners[0]
    files: dict[str, bytes] = {}
    ports = _vllm.replica_ports(ctx, owner)
    placement = ctx.placement(owner)
    n = len(placement)
    for rep, port in zip(placement, ports):
        argv = server_args(ctx, flags, owner, port, owner.resident_batch) + chunk_args(ctx, flags)
        lines = header(ctx, f"SGLang replica {rep.index} of {n} (copy {rep.copy} of {ctx.copies}): run on "
                            f"{owner.gpu} node {rep.node} (GPUs {rep.cuda_visible_devices}), serves port {port}.")
        lines += [_vllm.cuda_devices(rep.cuda_visible_devices), "exec " + shell_command(argv)]
        files[f"serve-replica-{rep.index}.sh"] = script(lines)
    if n > 1:
        files["router.sh"] = _vllm.router(ctx, ["python3", "-m", "sglang_router.launch_router"], placement,
                                          ports, owner, "needs `pip install sglang-router`")
    files.update(benchmark(ctx))
    return files


def render_disaggregated(ctx: Context) -> dict[str, bytes]:
    """`serve-decode-<r>.sh` and `serve-prefill-<i>.sh` (`--disaggregation-mode`, NIXL), `router.sh`
    (sglang-router `--pd-disaggregation`, each prefill server with its bootstrap port)."""
    flags = FLAGS[ctx.version]
    owner, pool = ctx.owners[0], ctx.prefill
    files: dict[str, bytes] = {}
    decode = list(zip(ctx.placement(owner), _vllm.replica_ports(ctx, owner)))
    prefill = [(rep, port, BOOTSTRAP_PORT + rep.devices[0] // pool.tensor_parallel)
               for rep, port in zip(ctx.prefill_placement, _vllm.prefill_ports(ctx))]
    for rep, port in decode:
        argv = server_args(ctx, flags, owner, port, owner.resident_batch) + [
            flags["mode"], "decode", flags["backend"], "nixl"]
        lines = header(ctx, f"SGLang decode server {rep.index} of {len(decode)} (copy {rep.copy} of {ctx.copies}): "
                            f"run on {owner.gpu} node {rep.node} (GPUs {rep.cuda_visible_devices}), port {port}; "
                            f"takes the prompt's KV from a prefill server over NIXL (needs `pip install nixl`).")
        lines += [_vllm.cuda_devices(rep.cuda_visible_devices), "exec " + shell_command(argv)]
        files[f"serve-decode-{rep.index}.sh"] = script(lines)
    for rep, port, boot in prefill:
        argv = server_args(ctx, flags, pool, port, None) + chunk_args(ctx, flags) + [
            flags["mode"], "prefill", flags["backend"], "nixl", flags["bootstrap"], str(boot)]
        lines = header(ctx, f"SGLang prefill server {rep.index} of {len(prefill)} (the plan's prefill pool): run on "
                            f"{pool.gpu} node {rep.node} (GPUs {rep.cuda_visible_devices}), port {port}, "
                            f"bootstrap port {boot}; needs `pip install nixl`.")
        lines += [_vllm.cuda_devices(rep.cuda_visible_devices), "exec " + shell_command(argv)]
        files[f"serve-prefill-{rep.index}.sh"] = script(lines)
    argv = ["python3", "-m", "sglang_router.launch_router", "--host", "0.0.0.0", "--port", str(BASE_PORT),
            "--pd-disaggregation", "--policy", "round_robin"]
    for rep, port, boot in prefill:
        argv += ["--prefill", _vllm.worker_url(rep.node, port), str(boot)]
    for rep, port in decode:
        argv += ["--decode", _vllm.worker_url(rep.node, port)]
    lines = header(ctx, f"P/D router in front of {len(prefill)} prefill and {len(decode)} decode servers (round "
                        f"robin keeps {owner.resident_batch} requests on each decode server); needs "
                        f"`pip install sglang-router`.")
    lines.append("exec " + shell_command(argv))
    files["router.sh"] = script(lines)
    files.update(benchmark(ctx))
    return files


def benchmark(ctx: Context) -> dict[str, bytes]:
    """SGLang's own client at fixed lengths (`random-ids`: random token ids, nothing downloaded),
    the release's module and result keys; a workload sample through vLLM's timed_trace client
    (SGLang's trace datasets build prompts of other lengths than the sample's)."""
    t = traffic(ctx)
    if not t.fixed:
        return benchmark_vllm(ctx, backend="openai", what="the SGLang deployment (its OpenAI endpoint)")
    module, keys = CLIENT[ctx.version]
    v = BENCH_VARS
    result = Word(v["RESULT_DIR"], "/tpot.jsonl")
    argv = ["python3", "-m", module, "--backend", "sglang",
            "--host", v["HOST"], "--port", v["PORT"], "--model", ctx.model_id,
            "--dataset-name", "random-ids", "--random-input-len", v["INPUT_LEN"],
            "--random-output-len", v["OUTPUT_LEN"], "--random-range-ratio", "1.0",
            "--num-prompts", v["NUM_PROMPTS"], "--max-concurrency", v["CONCURRENCY"]]
    if t.rate is not None:
        argv += ["--request-rate", number(t.rate)]
    argv += ["--output-file", result]
    lines = header(ctx, "Benchmark the deployment with SGLang's own client on the plan's traffic and compare "
                        "TTFT and TPOT with the plan.")
    if keys.q != "p95":
        lines.append(comment(f"SGLang {ctx.version}'s client reports median and {keys.q}, no p95: "
                             f"{keys.q} is compared."))
    lines += bench_env(ctx, t)
    lines.append(shell_command(argv))
    lines += compare_snippet(ctx.plan, keys, result, plan_ttft(ctx), plan_tpot(ctx))
    return {"benchmark.sh": script(lines)}


TARGET = Target(name="sglang", summary="sglang.launch_server per replica, sglang-router", versions=tuple(FLAGS),
                default_version="0.5.23", fits=_vllm.fits, check=_vllm.check, render=render,
                search_limits=_vllm.COLOCATED_LIMITS, writes_prefill=True)
