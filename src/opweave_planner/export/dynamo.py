"""`--to dynamo`: a `DynamoGraphDeployment` (aggregated vLLM decode workers) and a benchmark.

The manifest follows the CRD vendored in `vendor/dynamo-0.6.0/` (ai-dynamo/dynamo
`deploy/cloud/operator/config/crd/bases/nvidia.com_dynamographdeployments.yaml`) and the shape of
Dynamo's own `components/backends/vllm/deploy/agg.yaml`; the worker (`python3 -m dynamo.vllm`)
takes vLLM's engine flags (`components/src/dynamo/vllm/args.py` adds `AsyncEngineArgs`), of the
vLLM release Dynamo 0.6.0 pins (0.10.2).
"""

from __future__ import annotations

from opweave_planner.export import vllm as _vllm
from opweave_planner.export.base import GPU_LABEL_KEY, Context, Target
from opweave_planner.export.documents import to_yaml

VLLM_OF = {"0.6.0": "0.10.2"}  # ai-dynamo/dynamo pyproject.toml extra `vllm` at 0.6.0
IMAGE = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:{version}"
WORKER = "VllmDecodeWorker"


def manifest(ctx: Context) -> dict:
    """The DynamoGraphDeployment as a plain dict (what the YAML file holds, key for key)."""
    owner = ctx.plan.owners[0]
    image = ctx.image or IMAGE.format(version=ctx.release or ctx.version)
    flags = _vllm.FLAGS[VLLM_OF[ctx.version]]
    name = ctx.slug
    gpus = str(owner.tensor_parallel)
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": name},
        "spec": {
            "backendFramework": "vllm",
            "services": {
                "Frontend": {
                    "dynamoNamespace": name,
                    "componentType": "frontend",
                    "replicas": 1,
                    "extraPodSpec": {"mainContainer": {"image": image}},
                },
                WORKER: {
                    "envFromSecret": "hf-token-secret",
                    "dynamoNamespace": name,
                    "componentType": "worker",
                    "subComponentType": "decode",
                    "replicas": ctx.groups(owner),  # every copy of the plan
                    "resources": {"requests": {"gpu": gpus}, "limits": {"gpu": gpus}},
                    "extraPodSpec": {
                        "nodeSelector": {GPU_LABEL_KEY: ctx.node_label(owner.gpu)},
                        "mainContainer": {
                            "image": image,
                            "workingDir": "/workspace/components/backends/vllm",
                            "command": ["python3", "-m", "dynamo.vllm"],
                            "args": ["--model", ctx.model_id, *_vllm.engine_args(ctx, owner, flags)],
                        },
                    },
                },
            },
        },
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
                search_limits=_vllm.COLOCATED_LIMITS)
