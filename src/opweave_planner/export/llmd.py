"""`--to llm-d`: values for the llm-d-modelservice Helm chart (decode-only, vLLM) and a benchmark.

Keys follow the chart's `values.schema.json` vendored in `vendor/llm-d-modelservice-v0.4.12/`;
the chart's `vllmServe` model command adds `--port`, `--tensor-parallel-size` (from
`decode.parallelism.tensor`) and `--served-model-name`, and requests `tensor` GPUs per pod
(`templates/_helpers.tpl`), so the values carry the remaining vLLM flags only. A disaggregated
plan (schema 1.10) fills the chart's `prefill` pool too, both pools with vLLM's NixlConnector
and the chart's routing sidecar (`routing.proxy`, connector `nixlv2`) in front of each decode pod,
as llm-d's P/D guide writes them.
"""

from __future__ import annotations

import math

from opweave_planner.errors import UserError
from opweave_planner.export import vllm as _vllm
from opweave_planner.export.base import GPU_LABEL_KEY, Context, Target
from opweave_planner.export.common import BASE_PORT
from opweave_planner.export.documents import to_yaml

VLLM_OF = {"0.4.12": "0.33.0"}  # flags written; the image's vLLM must accept them
IMAGE = "ghcr.io/llm-d/llm-d-cuda:v0.4.0"  # the chart's appVersion


def check(ctx: Context) -> None:
    """vLLM's shapes, and a Hub repo id: the chart downloads the model from the Hub (hf://)."""
    _vllm.check(ctx)
    if ctx.model_id.startswith(("/", "./", "../")):
        raise UserError(f"--model-id: llm-d's modelArtifacts.uri is written as hf://<repo id>, so "
                        f"'{ctx.model_id}' (a path) cannot be served from it; pass the Hugging Face "
                        f"repo id, or export --to vllm for local weights")


PROXY_PORT = 8200  # the sidecar's targetPort: the decode vLLM listens there, the sidecar on 8000


def _container(ctx: Context, args: list[str], port: int) -> dict:
    return {
        "name": "vllm",
        "image": ctx.image or IMAGE,
        "modelCommand": "vllmServe",
        "args": args,
        "ports": [{"containerPort": port, "protocol": "TCP"}],
        "mountModelVolume": True,
    }


def values(ctx: Context) -> dict:
    """The Helm values as a plain dict (what values.yaml holds, key for key)."""
    owner, pool = ctx.owners[0], ctx.prefill
    release = VLLM_OF[ctx.version]
    flags = _vllm.FLAGS[release]
    args = _vllm.engine_args(ctx, owner, flags)[2:]  # the chart sets --tensor-parallel-size itself
    if pool is None:
        args += _vllm.chunk_args(ctx, owner.gpu, release, flags)
    else:
        args += [flags["kvt"], _vllm.KV_TRANSFER]
    size_gib = 1
    if ctx.spec is not None:
        from opweave_planner.structure.operators import build_sequence

        size_gib = math.ceil(build_sequence(ctx.spec).weight_bytes() / 2**30 * 1.1)
    prefill: dict = {"create": False}
    if pool is not None:
        prefill = {
            "create": True,
            "replicas": len(ctx.prefill_placement),
            "parallelism": {"tensor": pool.tensor_parallel, "data": 1, "dataLocal": 1, "workers": 1},
            "nodeSelector": {GPU_LABEL_KEY: ctx.node_label(pool.gpu)},
            "containers": [_container(ctx, _vllm.prefill_args(ctx, flags, release)[2:]
                                      + [flags["kvt"], _vllm.KV_TRANSFER], BASE_PORT)],
        }
    proxy = {"enabled": False} if pool is None else {"enabled": True, "connector": "nixlv2",
                                                      "targetPort": PROXY_PORT}
    return {
        "multinode": False,
        "modelArtifacts": {
            "name": ctx.model_id,
            "uri": f"hf://{ctx.model_id}",
            "size": f"{size_gib}Gi",
            "authSecretName": "llm-d-hf-token",
            "labels": {"llm-d.ai/inference-serving": "true", "llm-d.ai/model": ctx.slug},
        },
        "routing": {"servicePort": BASE_PORT, "proxy": proxy},
        "accelerator": {"type": "nvidia"},
        "decode": {
            "create": True,
            "replicas": ctx.groups(owner),  # every copy of the plan
            "parallelism": {"tensor": owner.tensor_parallel, "data": 1, "dataLocal": 1, "workers": 1},
            "nodeSelector": {GPU_LABEL_KEY: ctx.node_label(owner.gpu)},
            "containers": [_container(ctx, args, BASE_PORT if pool is None else PROXY_PORT)],
        },
        "prefill": prefill,
    }


def render(ctx: Context) -> dict[str, bytes]:
    files = {"values.yaml": to_yaml(values(ctx))}
    files.update(_vllm.benchmark_vllm(ctx, backend="openai", what="the llm-d decode pods (through your gateway, "
                                                                   "or kubectl port-forward to one pod for a single "
                                                                   "replica)"))
    return files


TARGET = Target(name="llm-d", summary="llm-d-modelservice Helm values (Kubernetes)", versions=tuple(VLLM_OF),
                default_version="0.4.12", fits=_vllm.fits, check=check, render=render,
                search_limits=_vllm.COLOCATED_LIMITS, writes_prefill=True)
