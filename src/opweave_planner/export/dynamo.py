"""`--to dynamo`: a `DynamoGraphDeployment` (aggregated vLLM decode workers) and a benchmark.

The manifest follows the CRD vendored in `vendor/dynamo-0.6.0/` (ai-dynamo/dynamo
`deploy/cloud/operator/config/crd/bases/nvidia.com_dynamographdeployments.yaml`) and the shape of
Dynamo's own `components/backends/vllm/deploy/agg.yaml`; the worker (`python3 -m dynamo.vllm`)
takes vLLM's engine flags (`components/src/dynamo/vllm/args.py` adds `AsyncEngineArgs`), of the
vLLM release Dynamo 0.6.0 pins (0.10.2). A disaggregated plan (schema 1.10) adds its prefill pool
as a `VllmPrefillWorker` service (`--is-prefill-worker`, Dynamo's own flag in
`components/src/dynamo/vllm/args.py`; its default `--connector nixl` joins the two pools), as
Dynamo's `components/backends/vllm/deploy/disagg.yaml` does.
"""

from __future__ import annotations

from opweave_planner.export import vllm as _vllm
from opweave_planner.export.base import GPU_LABEL_KEY, Context, Target
from opweave_planner.export.documents import to_yaml

VLLM_OF = {"0.6.0": "0.10.2"}  # ai-dynamo/dynamo pyproject.toml extra `vllm` at 0.6.0
IMAGE = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:{version}"
WORKER = "VllmDecodeWorker"
PREFILL_WORKER = "VllmPrefillWorker"


def _worker(ctx: Context, name: str, image: str, sub: str, replicas: int, gpu: str, tp: int,
            args: list[str]) -> dict:
    gpus = str(tp)
    return {
        "envFromSecret": "hf-token-secret",
        "dynamoNamespace": name,
        "componentType": "worker",
        "subComponentType": sub,
        "replicas": replicas,
        "resources": {"requests": {"gpu": gpus}, "limits": {"gpu": gpus}},
        "extraPodSpec": {
            "nodeSelector": {GPU_LABEL_KEY: ctx.node_label(gpu)},
            "mainContainer": {
                "image": image,
                "workingDir": "/workspace/components/backends/vllm",
                "command": ["python3", "-m", "dynamo.vllm"],
                "args": ["--model", ctx.model_id, *args],
            },
        },
    }


def manifest(ctx: Context) -> dict:
    """The DynamoGraphDeployment as a plain dict (what the YAML file holds, key for key)."""
    owner = ctx.owners[0]
    image = ctx.image or IMAGE.format(version=ctx.release or ctx.version)
    release = VLLM_OF[ctx.version]
    flags = _vllm.FLAGS[release]
    name = ctx.slug
    decode = _vllm.engine_args(ctx, owner, flags)
    if ctx.prefill is None:  # aggregated: the decode workers prefill too, at the plan's chunk
        decode += _vllm.chunk_args(ctx, owner.gpu, release, flags)
    services = {
        "Frontend": {
            "dynamoNamespace": name,
            "componentType": "frontend",
            "replicas": 1,
            "extraPodSpec": {"mainContainer": {"image": image}},
        },
        # every copy of the plan
        WORKER: _worker(ctx, name, image, "decode", ctx.groups(owner), owner.gpu, owner.tensor_parallel, decode),
    }
    pool = ctx.prefill
    if pool is not None:
        services[PREFILL_WORKER] = _worker(ctx, name, image, "prefill", len(ctx.prefill_placement), pool.gpu,
                                           pool.tensor_parallel,
                                           ["--is-prefill-worker", *_vllm.prefill_args(ctx, flags, release)])
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": name},
        "spec": {"backendFramework": "vllm", "services": services},
    }


def render(ctx: Context) -> dict[str, bytes]:
    doc = manifest(ctx)
    name = doc["metadata"]["name"]
    files = {"dynamographdeployment.yaml": to_yaml(doc)}
    files.update(_vllm.benchmark_vllm(ctx, backend="openai", what=f"the Dynamo frontend (kubectl port-forward "
                                                                  f"svc/{name}-frontend 8000:8000)"))
    return files


TARGET = Target(name="dynamo", summary="Dynamo DynamoGraphDeployment (Kubernetes)", versions=tuple(VLLM_OF),
                default_version="0.6.0", fits=_vllm.fits, check=_vllm.check, render=render,
                search_limits=_vllm.COLOCATED_LIMITS, writes_prefill=True)
