"""`--to sglang`: one `sglang.launch_server` script per replica, an sglang-router script, a benchmark.

Flag names come from SGLang's own dataclass-derived parser (`sglang/srt/arg_groups/fields/*.py`:
a field `tp_size` is the flag `--tp-size`, see `arg_utils.py`), the router's from
`sglang_router/router_args.py`, the benchmark's from `sglang/benchmark/serving.py`.
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
    traffic,
)
from opweave_planner.export.shell import Word, comment, header, number, script, shell_command

_SERVER = {
    "model": "--model-path", "tp": "--tp-size", "ep": "--ep-size", "seqs": "--max-running-requests",
    "len": "--context-length", "kv": "--kv-cache-dtype", "mem": "--mem-fraction-static",
    "host": "--host", "port": "--port",
}
# the benchmark client per release: its module and result keys (0.5.4's bench_serving reports
# median and p99, no p95; 0.5.23 moved it to sglang.benchmark.serving and added p95)
CLIENT = {"0.5.4": ("sglang.bench_serving", Keys("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
                                                  "p99_tpot_ms", "p99")),
          "0.5.23": ("sglang.benchmark.serving", Keys("median_ttft_ms", "p95_ttft_ms", "median_tpot_ms",
                                                       "p95_tpot_ms"))}
FLAGS = dict.fromkeys(CLIENT, _SERVER)


def render(ctx: Context) -> dict[str, bytes]:
    flags = FLAGS[ctx.version]
    owner = ctx.plan.owners[0]
    files: dict[str, bytes] = {}
    ports = _vllm.replica_ports(ctx, owner)
    placement = ctx.placement(owner)
    n = len(placement)
    for rep, port in zip(placement, ports):
        argv = ["python3", "-m", "sglang.launch_server", flags["model"], ctx.model_id,
                flags["host"], "0.0.0.0", flags["port"], str(port),
                flags["tp"], str(owner.tensor_parallel)]
        if owner.expert_parallel > 1:
            argv += [flags["ep"], str(owner.expert_parallel)]
        argv += [flags["seqs"], str(owner.resident_batch),
                 flags["len"], str(ctx.plan.workload.window),
                 flags["kv"], "auto",
                 flags["mem"], share(ctx.static_fraction(owner))]
        lines = header(ctx, f"SGLang replica {rep.index} of {n} (copy {rep.copy} of {ctx.copies}): run on "
                            f"{owner.gpu} node {rep.node} (GPUs {rep.cuda_visible_devices}), serves port {port}.")
        lines += [_vllm.cuda_devices(rep.cuda_visible_devices), "exec " + shell_command(argv)]
        files[f"serve-replica-{rep.index}.sh"] = script(lines)
    if n > 1:
        files["router.sh"] = _vllm.router(ctx, ["python3", "-m", "sglang_router.launch_router"], placement,
                                          ports, owner, "needs `pip install sglang-router`")
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
    lines += compare_snippet(ctx.plan, keys, result)
    return {"benchmark.sh": script(lines)}


TARGET = Target(name="sglang", summary="sglang.launch_server per replica, sglang-router", versions=tuple(FLAGS),
                default_version="0.5.23", fits=_vllm.fits, check=_vllm.check, render=render,
                search_limits=_vllm.COLOCATED_LIMITS)
