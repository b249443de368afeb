"""One compile per install: the kernels' signatures do not depend on the request.

Different models (dense, MoE), batch grids, TP sets, GPU sets, policies and a workload are
planned in one process; after the first request of each objective (a fixed context, a
workload) no numba dispatcher of the package may gain a signature, or a new model, `--batches`
or GPU set would compile again (and the first-run notice would be untrue).
"""

from __future__ import annotations

import sys
from pathlib import Path

from opweave_planner import api

TRACE = str(Path(__file__).resolve().parents[1] / "examples" / "traces" / "mooncake-conversation-sample.jsonl")
SMALL = dict(max_owners=2, max_replicas=1)


def _signatures() -> dict[str, int]:
    from numba.core.dispatcher import Dispatcher

    out = {}
    for name, mod in list(sys.modules.items()):
        if not name.startswith("opweave_planner") or mod is None:
            continue
        for attr, obj in vars(mod).items():
            if isinstance(obj, Dispatcher):
                out[f"{name}.{attr}"] = len(obj.signatures)
    return out


def _grown(before: dict[str, int], after: dict[str, int]) -> dict[str, tuple[int, int]]:
    return {k: (before.get(k, 0), n) for k, n in after.items() if n > before.get(k, 0) and k in before}


def _plan(model, slo, ctx=None, **kw):
    return api.plan(api.make_request(model, slo, ctx, **{**SMALL, **kw}))


def test_kernels_compile_once_across_different_requests():
    _plan("llama-3.1-8b", "60ms", "8k", gpus="h100", batches=(1, 8), tensor_parallel_sizes=(1,))
    first = _signatures()
    assert any(n > 0 for n in first.values())
    _plan("qwen3-30b-a3b", "50ms", "8k", gpus="h100,a100", batches=(4, 16, 32), tensor_parallel_sizes=(1, 2, 4))
    _plan("gemma-3-27b", "80ms", "32k", gpus="l40s,h200", batches=(2, 6, 24), tensor_parallel_sizes=(2, 8),
          max_replicas=2)
    _plan("llama-3.1-8b", "40ms", "4k", gpus="a100", batches=(3, 64), policy="afd", tensor_parallel_sizes=(1, 2))
    assert _grown(first, _signatures()) == {}
    _plan("llama-3.1-8b", "60ms", gpus="h100", workload=TRACE, scale_ctx=8192, batches=(1, 8),
          tensor_parallel_sizes=(1,))
    with_workload = _signatures()
    _plan("qwen3-30b-a3b", "80ms", gpus="h100,a100", workload=TRACE, scale_ctx=16384, batches=(4, 32),
          tensor_parallel_sizes=(1, 2))
    _plan("gemma-3-27b", "70ms", "16k", gpus="h200", batches=(5, 40), tensor_parallel_sizes=(4,))
    assert _grown(with_workload, _signatures()) == {}
