"""`--to llm-d`: values for the llm-d-modelservice Helm chart (decode-only, vLLM) and a benchmark.

Keys follow the chart's `values.schema.json` vendored in `vendor/llm-d-modelservice-v0.4.12/`;
the chart's `vllmServe` model command adds `--port`, `--tensor-parallel-size` (from
`decode.parallelism.tensor`) and `--served-model-name`, and requests `tensor` GPUs per pod
(`templates/_helpers.tpl`), so the values carry the remaining vLLM flags only.
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


def values(ctx: Context) -> dict:
    """The Helm values as a plain dict (what values.yaml holds, key for key)."""
    owner = ctx.plan.owners[0]
    flags = _vllm.FLAGS[VLLM_OF[ctx.version]]
    args = _vllm.engine_args(ctx, owner, flags)[2:]  # the chart sets --tensor-parallel-size itself
    size_gib = 1
    if ctx.spec is not None:
        from opweave_planner.structure.operators import build_sequence

        size_gib = math.ceil(build_sequence(ctx.spec).weight_bytes() / 2**30 * 1.1)
    return {
        "multinode": False,
        "modelArtifacts": {
            "name": ctx.model_id,
            "uri": f"hf://{ctx.model_id}",
            "size": f"{size_gib}Gi",
            "authSecretName": "llm-d-hf-token",
            "labels": {"llm-d.ai/inference-serving": "true", "llm-d.ai/model": ctx.slug},
        },
        "routing": {"servicePort": BASE_PORT, "proxy": {"enabled": False}},
        "accelerator": {"type": "nvidia"},
        "decode": {
            "create": True,
            "replicas": ctx.groups(owner),  # every copy of the plan
            "parallelism": {"tensor": owner.tensor_parallel, "data": 1, "dataLocal": 1, "workers": 1},
            "nodeSelector": {GPU_LABEL_KEY: ctx.node_label(owner.gpu)},
            "containers": [{
                "name": "vllm",
                "image": ctx.image or IMAGE,
                "modelCommand": "vllmServe",
                "args": args,
                "ports": [{"containerPort": BASE_PORT, "protocol": "TCP"}],
                "mountModelVolume": True,
            }],
        },
        "prefill": {"create": False},
    }


def render(ctx: Context) -> dict[str, bytes]:
    files = {"values.yaml": to_yaml(values(ctx))}
    files.update(_vllm.benchmark_vllm(ctx, backend="openai", what="the llm-d decode pods (through your gateway, "
                                                                   "or kubectl port-forward to one pod for a single "
                                                                   "replica)"))
    return files


TARGET = Target(name="llm-d", summary="llm-d-modelservice Helm values (Kubernetes)", versions=tuple(VLLM_OF),
                default_version="0.4.12", fits=_vllm.fits, check=check, render=render,
                search_limits=_vllm.COLOCATED_LIMITS)
