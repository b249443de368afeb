"""`--to vllm-afd`: the attention/FFN pair of vLLM's AFD plugin (vllm-project/afd-plugin).

The plugin runs DeepSeek-V2/V3-family models only (its `afd_plugin/__init__.py` registers
`DeepseekV2ForCausalLM`/`DeepseekV3ForCausalLM`), two roles started as two `vllm serve`
deployments joined through `--additional-config '{"afd": {...}}'`, with the rule of its
P2pNcclAFDConnector (`afd_plugin/distributed/topology.py`): attention ranks >= FFN ranks and a
multiple of them. Ranks are data-parallel x tensor-parallel GPUs of a role. Overlap is vLLM's
dual-batch overlap (`--enable-dbo`): exactly two microbatches.
"""

from __future__ import annotations

import json

from opweave_planner.errors import InternalError, UserError
from opweave_planner.export import vllm as _vllm
from opweave_planner.export.base import Context, Refusal, Target
from opweave_planner.export.bench import benchmark_vllm
from opweave_planner.export.common import BASE_PORT, refuse
from opweave_planner.export.shell import (
    Var,
    Word,
    assign,
    comment,
    header,
    integer,
    script,
    shell_command,
)

PLUGIN_COMMIT = "2e4378f2d478313992e9a1b850c61b1e888a1145"
MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
CONNECTOR = "P2pNcclAFDConnector"
AFD_PORT = 6239
DP_RPC_PORT = 13345
# vLLM 0.26.0 `vllm/engine/arg_utils.py` (the engine flags are the same names as in _vllm.FLAGS);
# 0.26.0 is the vLLM release afd-plugin (commit 2e4378f) supports
FLAGS = {"0.26.0": {
    **_vllm.FLAGS["0.33.0"], "dbo": "--enable-dbo", "extra": "--additional-config",
    "dp_local": "--data-parallel-size-local", "dp_addr": "--data-parallel-address",
    "dp_rpc": "--data-parallel-rpc-port", "dp_start": "--data-parallel-start-rank", "headless": "--headless",
}}


def roles(plan) -> tuple[int, int] | None:
    """(attention owner, FFN owner) when the plan is an attention | FFN split, else None."""
    from opweave_planner.structure.operators import Side, operator_side  # the model layer: not for --help

    if len(plan.owners) != 2:
        return None
    side: dict[int, set[Side]] = {0: set(), 1: set()}
    for st in plan.stages:
        for op in st.operators:
            s = operator_side(op)
            if s != Side.OTHER:
                side[st.owner].add(s)
    if side[0] == {Side.ATTENTION} and side[1] == {Side.FFN}:
        return 0, 1
    if side[1] == {Side.ATTENTION} and side[0] == {Side.FFN}:
        return 1, 0
    return None


def _dict_fits(plan_dict) -> bool:
    from opweave_planner.contract import parse_plan

    try:
        return roles(parse_plan(plan_dict, "alternative")) is not None
    except UserError:
        return False


def fits(plan_dict, name: str) -> bool:
    return plan_dict is not None and _dict_fits(plan_dict)


def check(ctx: Context) -> None:
    """A DeepSeek-V2/V3 attention | FFN pair whose rank ratio the connector takes, at most μ = 2."""
    plan = ctx.plan
    agg = ctx.aggregated
    if agg is not None:  # the vllm target runs exactly this shape (its check accepts every aggregated plan)
        raise Refusal(f"vllm-afd cannot run an aggregated deployment ({agg.replicas} replicas of {agg.gpu} "
                      f"TP{agg.tensor_parallel} serving prefill and decode together, the plan's mode): it splits "
                      f"attention from FFN; use --to vllm")
    mt = getattr(ctx.spec, "model_type", None)
    if mt not in MODEL_TYPES:
        raise Refusal(f"vllm-afd cannot run {plan.model} (model_type {mt or 'unknown'}): the AFD plugin "
                      f"supports DeepSeek-V2/V3 models only; use --to vllm with a colocated plan")
    pair = roles(plan)
    if pair is None:
        words = ("a colocated plan" if plan.num_stages == 1 else
                 f"a {plan.num_stages}-stage plan over {len(plan.owners)} owners that is not an "
                 "attention | FFN split")
        raise refuse(ctx, words)
    a, f = (plan.owners[i] for i in pair)
    ra, rf = a.replicas * a.tensor_parallel, f.replicas * f.tensor_parallel
    if ra < rf or ra % rf:
        raise Refusal(f"vllm-afd cannot run {ra} attention ranks with {rf} FFN ranks: the "
                      f"{CONNECTOR} needs attention ranks >= FFN ranks and a multiple of them "
                      f"(owner {a.index}: {a.replicas}x TP{a.tensor_parallel}, owner {f.index}: "
                      f"{f.replicas}x TP{f.tensor_parallel})")
    if plan.microbatches > 2:
        raise Refusal(f"vllm-afd overlaps at most two microbatches (--enable-dbo); the plan interleaves "
                      f"{plan.microbatches}")


_HOST_SLOT = "\x00host\x00"  # where ${AFD_HOST} goes in the JSON (a NUL is in no other value)


def additional_config(role: str, ranks: tuple[int, int], port: int = AFD_PORT) -> Word:
    """The plugin's `--additional-config` JSON as one word whose only expansion is `${AFD_HOST}`."""
    afd = {"afd": {"role": role, "connector": CONNECTOR, "host": _HOST_SLOT, "port": port,
                   "num_attention_ranks": ranks[0], "num_ffn_ranks": ranks[1]}}
    before, after = json.dumps(afd, separators=(",", ":")).split(json.dumps(_HOST_SLOT))
    return Word(before + '"', Var("AFD_HOST"), '"' + after)


def _role_scripts(ctx: Context, role: str, owner, ranks: tuple[int, int], port: int, copy: int,
                  afd_host: Var) -> dict[str, bytes]:
    """One script per node of one role of one copy (each copy is its own attention | FFN pair)."""
    flags = FLAGS[ctx.version]
    extra = additional_config(role, ranks, AFD_PORT + copy)
    placement = [r for r in ctx.placement(owner) if r.copy == copy]
    nodes = sorted({r.node for r in placement})
    files = {}
    for k, node in enumerate(nodes):
        here = [r for r in placement if r.node == node]
        devices = ",".join(str(d) for r in here for d in r.devices)
        argv = ["vllm", "serve", ctx.model_id, flags["dp"], str(owner.replicas),
                *_vllm.engine_args(ctx, owner, flags)]  # expert parallel only where the plan has it
        if ctx.plan.microbatches == 2:
            argv.append(flags["dbo"])
        argv += [flags["extra"], extra]
        if len(nodes) > 1:
            argv += [flags["dp_local"], str(len(here)), flags["dp_addr"], Var("HEAD_ADDRESS"),
                     flags["dp_rpc"], str(DP_RPC_PORT + copy)]
        if k > 0:
            argv += [flags["headless"], flags["dp_start"], str(here[0].index - copy * owner.replicas)]
        else:
            argv += [flags["host"], "0.0.0.0", flags["port"], str(port)]
        of = f" of copy {copy} ({ctx.copies} copies)" if ctx.copies > 1 else ""
        lines = header(ctx, f"AFD {role} role{of}, owner {owner.index} ({owner.replicas}x {owner.gpu} "
                            f"TP{owner.tensor_parallel}, {owner.resident_batch} requests per replica = DP rank): "
                            f"node {node} ({k + 1} of {len(nodes)} for this role), GPUs {devices}.")
        lines += [comment("AFD_HOST: the connector's rendezvous address, the same value on both roles."),
                  assign("AFD_HOST", afd_host)]
        if len(nodes) > 1:
            lines.append(assign("HEAD_ADDRESS", Var("HEAD_ADDRESS", required="set HEAD_ADDRESS to node "
                                                                              + integer(nodes[0]))))
        lines += ["export " + assign("VLLM_USE_V2_MODEL_RUNNER", "0", "the plugin supports model runner v1 only"),
                  _vllm.cuda_devices(devices),
                  "exec " + shell_command(argv)]
        prefix = f"copy-{copy}-" if ctx.copies > 1 else ""
        files[f"{prefix}{role}-node-{node}.sh"] = script(lines)
    return files


def render(ctx: Context) -> dict[str, bytes]:
    pair = roles(ctx.plan)
    if pair is None:
        raise InternalError("vllm-afd: render before check")
    ia, iff = pair
    a, f = ctx.plan.owners[ia], ctx.plan.owners[iff]
    ranks = (a.replicas * a.tensor_parallel, f.replicas * f.tensor_parallel)
    files = {}
    ports = []
    for c in range(ctx.copies):
        nodes = {r.node for o in (a, f) for r in ctx.placement(o) if r.copy == c}
        # one node: the roles meet on loopback; across nodes the address must be given
        host = (Var("AFD_HOST", default="127.0.0.1") if len(nodes) == 1 else
                Var("AFD_HOST", required="set AFD_HOST to the address of the attention role head node"))
        port = BASE_PORT + (2 * c + 1 if ctx.copies > 1 else 0)
        ports.append(port)
        files.update(_role_scripts(ctx, "attention", a, ranks, port, c, host))
        files.update(_role_scripts(ctx, "ffn", f, ranks, port + 1 if ctx.copies > 1 else BASE_PORT + 1, c, host))
    if ctx.copies > 1:
        heads = [next(r for r in ctx.placement(a) if r.copy == c) for c in range(ctx.copies)]
        files["router.sh"] = _vllm.router(ctx, [_vllm.ROUTER], heads, ports, a, "needs `pip install vllm-router`")
    files.update(benchmark_vllm(ctx, backend="vllm", what="the attention API server"
                                + ("s through router.sh" if ctx.copies > 1 else "")))
    return files


TARGET = Target(name="vllm-afd", summary="vLLM AFD plugin attention and FFN roles (DeepSeek-V2/V3)",
                versions=tuple(FLAGS), default_version="0.26.0", fits=fits, check=check, render=render,
                hint="re-plan a DeepSeek-V2/V3 model with --policy afd", needs_model=True)
