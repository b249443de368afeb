"""`--to vllm`: one `vllm serve` script per replica, a vllm-router script, and a benchmark.

vLLM runs colocated decode (TP inside a replica, replicas behind a router), so only a one-stage,
one-owner plan is accepted. A disaggregated plan (schema 1.10) gets its prefill pool too: prefill
and decode servers joined by vLLM's NixlConnector (`--kv-transfer-config`), vllm-router in its P/D
mode over all of them. Flag names per pinned version come from vLLM's own parser
(`vllm/engine/arg_utils.py`, `vllm/entrypoints/*/cli_args.py`, `vllm/benchmarks/serve.py`);
docs/export.md names the files.
"""

from __future__ import annotations

from types import MappingProxyType

from opweave_planner.export.base import Context, Target, share
from opweave_planner.export.bench import benchmark_vllm
from opweave_planner.export.common import (
    BASE_PORT,
    chunk_tokens_of,
    is_colocated,
    refuse,
    shape_words,
)
from opweave_planner.export.shell import Var, Word, assign, header, integer, script, shell_command

# Same flag names in both pinned releases; kept per version so a rename is a one-line change.
_SERVE = {
    "tp": "--tensor-parallel-size", "dp": "--data-parallel-size", "seqs": "--max-num-seqs",
    "len": "--max-model-len", "kv": "--kv-cache-dtype", "mem": "--gpu-memory-utilization",
    "ep": "--enable-expert-parallel", "host": "--host", "port": "--port",
    "chunked": "--enable-chunked-prefill", "batched": "--max-num-batched-tokens", "kvt": "--kv-transfer-config",
}
FLAGS = {"0.10.2": _SERVE, "0.26.0": _SERVE, "0.33.0": _SERVE}
ROUTER = "vllm-router"  # vllm-project/router, PyPI vllm-router 0.1.17 (vllm_router/router_args.py)
# a search under these limits returns only plans `fits` accepts (one stage has one owner)
COLOCATED_LIMITS = MappingProxyType({"max_stages": 1, "max_owners": 1})


def fits(plan_dict, name: str) -> bool:
    """Can vLLM run this alternative? Only colocated ones (one stage, one owner)."""
    if plan_dict is not None:  # read leniently from the file: any shape may be there
        owners = plan_dict.get("owners")
        return plan_dict.get("num_stages") == 1 and isinstance(owners, list) and len(owners) == 1
    return name == "colocated"


def check(ctx: Context) -> None:
    """Refuse any plan but a colocated one (the check of every target that serves it as vLLM does);
    an aggregated-mode plan runs its aggregated replicas, colocated whatever the decode plan's shape."""
    if ctx.aggregated is None and not is_colocated(ctx.plan):
        raise refuse(ctx, shape_words(ctx.plan))


def engine_args(ctx: Context, owner, flags: dict[str, str]) -> list[str]:
    """vLLM engine flags that carry the plan: TP/EP, max sequences, context, KV dtype, memory."""
    argv = [flags["tp"], str(owner.tensor_parallel)]
    if owner.expert_parallel > 1:
        argv.append(flags["ep"])
    argv += [flags["seqs"], str(owner.resident_batch),
             flags["len"], str(ctx.plan.workload.window),  # the window admitted, not the planned context
             # "auto" = the model's dtype (bf16/fp16): the planner sized the KV cache in it
             flags["kv"], "auto",
             flags["mem"], share(ctx.memory_fraction(owner))]
    return argv


# The KV hand-off of a disaggregated export: NIXL (in every flag-table release, vLLM's
# documented P/D connector; `kv_both` as its docs write it), one side channel per server.
KV_TRANSFER = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
NIXL_PORT = 5600  # VLLM_NIXL_SIDE_CHANNEL_PORT base; a server on devices [d, d+t) listens from 5600 + d


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def chunk_args(ctx: Context, gpu_id: str, release: str, flags: dict[str, str]) -> list[str]:
    """The prefill chunk the plan assumed (`chunk_tokens_of`) as vLLM's step budget; a plan that
    records none gets vLLM's own default made explicit where it is the latency model's
    (`default_chunk_tokens`: 8192 on >= 70 GiB GPUs other than A100, else 2048, as every table
    release sets it), nothing where the release's differs (0.33 gives >= 160 GiB GPUs 16384)."""
    chunk = chunk_tokens_of(ctx.plan, ctx.mode)
    if chunk is None:
        from opweave_planner.latency.prefill import default_chunk_tokens

        gpu = ctx.gpu(gpu_id)
        if _release(release) >= (0, 33) and gpu.memory_bytes >= 160 * 2**30:
            return []
        chunk = default_chunk_tokens(gpu)
    if chunk == 0:  # whole prompts in one step: a budget of the window (vLLM's V1 engine always chunks)
        return [flags["batched"], str(ctx.plan.workload.window)]
    return [flags["chunked"], flags["batched"], str(chunk)]


def prefill_args(ctx: Context, flags: dict[str, str], release: str) -> list[str]:
    """Engine flags of a prefill instance: its TP, the window, the plan's memory budget and chunk
    (the pool records no batch limit: vLLM's own)."""
    pool = ctx.prefill
    return [flags["tp"], str(pool.tensor_parallel), flags["len"], str(ctx.plan.workload.window),
            flags["kv"], "auto", flags["mem"], share(ctx.memory_fraction(pool)),
            *chunk_args(ctx, pool.gpu, release, flags)]


def replica_ports(ctx: Context, owner) -> list[int]:
    """Port of each group over every copy: 8000 for a lone one, else 8001, 8002, ... (router on 8000;
    a disaggregated export always has its P/D router there)."""
    n = ctx.groups(owner)
    return [BASE_PORT] if n == 1 and ctx.prefill is None else [BASE_PORT + 1 + r for r in range(n)]


def prefill_ports(ctx: Context) -> list[int]:
    """Ports of the prefill instances, after the decode groups'."""
    first = BASE_PORT + 1 + ctx.groups(ctx.owners[0])
    return [first + i for i in range(len(ctx.prefill_placement))]


def node_host(node: int) -> Var:
    """Where the router reaches node `node`: `$NODE<n>_HOST`, which node 0 may leave unset."""
    name = f"NODE{integer(node)}_HOST"
    return Var(name, default="127.0.0.1") if node == 0 else Var(name, required=f"set {name}")


def worker_url(node: int, port: int) -> Word:
    return Word("http://", node_host(node), f":{integer(port)}")


def cuda_devices(devices: str) -> str:
    return "export " + assign("CUDA_VISIBLE_DEVICES", devices)


def nixl_env(rep) -> list[str]:
    """The NIXL side channel of one server: its node's address (the peer connects to it) and a port
    no other server on that node uses."""
    return ["export " + assign("VLLM_NIXL_SIDE_CHANNEL_HOST", node_host(rep.node)),
            "export " + assign("VLLM_NIXL_SIDE_CHANNEL_PORT", str(NIXL_PORT + rep.devices[0]))]


def render(ctx: Context) -> dict[str, bytes]:
    if ctx.prefill is not None:
        return render_disaggregated(ctx)
    flags = FLAGS[ctx.version]
    owner = ctx.owners[0]
    files: dict[str, bytes] = {}
    ports = replica_ports(ctx, owner)
    placement = ctx.placement(owner)
    n = len(placement)
    engine = [*engine_args(ctx, owner, flags), *chunk_args(ctx, owner.gpu, ctx.version, flags)]
    for rep, port in zip(placement, ports):
        argv = ["vllm", "serve", ctx.model_id, flags["host"], "0.0.0.0", flags["port"], str(port), *engine]
        lines = header(ctx, f"vLLM replica {rep.index} of {n} (copy {rep.copy} of {ctx.copies}): run on "
                            f"{owner.gpu} node {rep.node} (GPUs {rep.cuda_visible_devices}), serves port {port}.")
        lines += [cuda_devices(rep.cuda_visible_devices), "exec " + shell_command(argv)]
        files[f"serve-replica-{rep.index}.sh"] = script(lines)
    if n > 1:
        files["router.sh"] = router(ctx, [ROUTER], placement, ports, owner,
                                    "needs `pip install vllm-router`")
    if data_parallel_applies(ctx, owner):
        devices = ",".join(str(d) for rep in placement for d in rep.devices)
        argv = ["vllm", "serve", ctx.model_id, flags["host"], "0.0.0.0", flags["port"], str(BASE_PORT),
                flags["dp"], str(n), *engine]
        lines = header(ctx, f"Instead of serve-replica-*.sh + router.sh: one vLLM server with "
                            f"{n} data-parallel engines on {owner.gpu} node 0 (GPUs {devices}), "
                            f"load-balanced by vLLM itself, port {BASE_PORT}.")
        lines += [cuda_devices(devices), "exec " + shell_command(argv)]
        files["serve-data-parallel.sh"] = script(lines)
    files.update(benchmark_vllm(ctx, backend="vllm"))
    return files


def render_disaggregated(ctx: Context) -> dict[str, bytes]:
    """`serve-decode-<r>.sh` per decode group of every copy, `serve-prefill-<i>.sh` per prefill
    instance, NIXL between them, `router.sh` (vllm-router's P/D mode) over all of them."""
    flags = FLAGS[ctx.version]
    owner, pool = ctx.owners[0], ctx.prefill
    files: dict[str, bytes] = {}
    decode = list(zip(ctx.placement(owner), replica_ports(ctx, owner)))
    prefill = list(zip(ctx.prefill_placement, prefill_ports(ctx)))
    def server(rep, port: int, engine: list[str], what: str) -> bytes:
        argv = ["vllm", "serve", ctx.model_id, flags["host"], "0.0.0.0", flags["port"], str(port), *engine,
                flags["kvt"], KV_TRANSFER]
        lines = header(ctx, f"{what}, port {port}; the prompt's KV goes from prefill to decode over NIXL "
                            f"(needs `pip install nixl`).")
        return script(lines + [cuda_devices(rep.cuda_visible_devices), *nixl_env(rep), "exec " + shell_command(argv)])

    for rep, port in decode:
        files[f"serve-decode-{rep.index}.sh"] = server(
            rep, port, engine_args(ctx, owner, flags),
            f"vLLM decode server {rep.index} of {len(decode)} (copy {rep.copy} of {ctx.copies}): run on "
            f"{owner.gpu} node {rep.node} (GPUs {rep.cuda_visible_devices})")
    for rep, port in prefill:
        files[f"serve-prefill-{rep.index}.sh"] = server(
            rep, port, prefill_args(ctx, flags, ctx.version),
            f"vLLM prefill server {rep.index} of {len(prefill)} (the plan's prefill pool): run on {pool.gpu} "
            f"node {rep.node} (GPUs {rep.cuda_visible_devices})")
    argv = [ROUTER, "--host", "0.0.0.0", "--port", str(BASE_PORT), "--vllm-pd-disaggregation",
            "--kv-connector", "nixl", "--policy", "round_robin"]
    for rep, port in prefill:
        argv += ["--prefill", worker_url(rep.node, port)]
    for rep, port in decode:
        argv += ["--decode", worker_url(rep.node, port)]
    lines = header(ctx, f"P/D router in front of {len(prefill)} prefill and {len(decode)} decode servers (round "
                        f"robin keeps {owner.resident_batch} requests on each decode server); needs "
                        f"`pip install vllm-router`.")
    lines.append("exec " + shell_command(argv))
    files["router.sh"] = script(lines)
    files.update(benchmark_vllm(ctx, backend="vllm"))
    return files


def router(ctx: Context, program: list[str], placement, ports, owner, needs: str) -> bytes:
    """The router over every group of every copy (round robin: each keeps its resident batch)."""
    urls = [worker_url(rep.node, port) for rep, port in zip(placement, ports)]
    argv = [*program, "--host", "0.0.0.0", "--port", str(BASE_PORT), "--policy", "round_robin",
            "--worker-urls", *urls]
    lines = header(ctx, f"Router in front of the {len(placement)} replicas of {ctx.copies} "
                        f"cop{'y' if ctx.copies == 1 else 'ies'} (round robin keeps {owner.resident_batch} "
                        f"requests on each); {needs}.")
    lines.append("exec " + shell_command(argv))
    return script(lines)


def data_parallel_applies(ctx: Context, owner) -> bool:
    """vLLM's data parallelism equals the plan's independent replicas only for a dense model whose
    replicas share one node: for MoE models vLLM steps DP ranks in lockstep and spreads the
    experts over DP x TP GPUs, which is not what the plan sized."""
    dense = ctx.spec is not None and all(layer.mlp.kind == "dense" for layer in ctx.spec.layers)
    return ctx.groups(owner) > 1 and dense and all(r.node == 0 for r in ctx.placement(owner))


TARGET = Target(name="vllm", summary="vllm serve per replica, vllm-router", versions=tuple(FLAGS),
                default_version="0.33.0", fits=fits, check=check, render=render,
                search_limits=COLOCATED_LIMITS, writes_prefill=True)
