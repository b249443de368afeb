"""`--to sglang`: one `sglang.launch_server` script per replica, an sglang-router script, a benchmark.

Flag names come from SGLang's own dataclass-derived parser (`sglang/srt/arg_groups/fields/*.py`:
a field `tp_size` is the flag `--tp-size`, see `arg_utils.py`), the router's from
`sglang_router/router_args.py`, the benchmark's from `sglang/benchmark/serving.py`.
"""

from __future__ import annotations

from opweave_planner.export import vllm as _vllm
from opweave_planner.export.base import Context, Target
from opweave_planner.export.bench import BENCH_VARS, bench_env, compare_tpot_snippet
from opweave_planner.export.common import BASE_PORT
from opweave_planner.export.shell import Word, header, script, shell_command

FLAGS = {"0.5.23": {
    "model": "--model-path", "tp": "--tp-size", "ep": "--ep-size", "seqs": "--max-running-requests",
    "len": "--context-length", "kv": "--kv-cache-dtype", "mem": "--mem-fraction-static",
    "host": "--host", "port": "--port",
}}
# SGLang's static pool (weights + KV) excludes activations and CUDA graphs, which need headroom
# beyond the planner's workspace estimate; its own defaults stay at or below this share.
MAX_STATIC_FRACTION = 0.90


def render(ctx: Context) -> dict[str, bytes]:
    flags = FLAGS[ctx.version]
    owner = ctx.plan.owners[0]
    files: dict[str, bytes] = {}
    ports = _vllm.replica_ports(owner)
    placement = ctx.placement(owner)
    for rep, port in zip(placement, ports):
        argv = ["python3", "-m", "sglang.launch_server", flags["model"], ctx.model_id,
                flags["host"], "0.0.0.0", flags["port"], str(port),
                flags["tp"], str(owner.tensor_parallel)]
        if owner.expert_parallel > 1:
            argv += [flags["ep"], str(owner.expert_parallel)]
        argv += [flags["seqs"], str(owner.resident_batch),
                 flags["len"], str(ctx.plan.workload.context_tokens),
                 flags["kv"], "auto",
                 flags["mem"], f"{min(MAX_STATIC_FRACTION, ctx.memory_fraction(owner)):.2f}"]
        lines = header(ctx, f"SGLang replica {rep.index} of {owner.replicas}: run on {owner.gpu} node "
                            f"{rep.node} (GPUs {rep.cuda_visible_devices}), serves port {port}.")
        lines += [_vllm.cuda_devices(rep.cuda_visible_devices), "exec " + shell_command(argv)]
        files[f"serve-replica-{rep.index}.sh"] = script(lines)
    if owner.replicas > 1:
        urls = [_vllm.worker_url(rep.node, port) for rep, port in zip(placement, ports)]
        argv = ["python3", "-m", "sglang_router.launch_router", "--host", "0.0.0.0",
                "--port", str(BASE_PORT), "--policy", "round_robin", "--worker-urls", *urls]
        lines = header(ctx, f"Router in front of the {owner.replicas} replicas (round robin keeps "
                            f"{owner.resident_batch} requests on each); needs `pip install sglang-router`.")
        lines.append("exec " + shell_command(argv))
        files["router.sh"] = script(lines)
    files["benchmark.sh"] = benchmark(ctx)
    return files


def benchmark(ctx: Context) -> bytes:
    """SGLang's own client (`sglang.benchmark.serving`): p50/p95 TPOT against the plan's."""
    v = BENCH_VARS
    result = Word(v["RESULT_DIR"], "/tpot.jsonl")
    argv = ["python3", "-m", "sglang.benchmark.serving", "--backend", "sglang",
            "--host", v["HOST"], "--port", v["PORT"], "--model", ctx.model_id,
            "--dataset-name", "random", "--random-input-len", v["INPUT_LEN"],
            "--random-output-len", v["OUTPUT_LEN"], "--random-range-ratio", "1.0",
            "--num-prompts", v["NUM_PROMPTS"], "--max-concurrency", v["CONCURRENCY"],
            "--output-file", result]
    lines = header(ctx, "Benchmark the deployment with SGLang's own client and compare TPOT with the plan.")
    lines += bench_env(ctx.plan)
    lines.append(shell_command(argv))
    lines += compare_tpot_snippet(ctx.plan, "median_tpot_ms", "p95_tpot_ms", result)
    return script(lines)


TARGET = Target(name="sglang", summary="sglang.launch_server per replica, sglang-router", versions=tuple(FLAGS),
                default_version="0.5.23", fits=_vllm.fits, check=_vllm.check, render=render,
                search_limits=_vllm.COLOCATED_LIMITS)
