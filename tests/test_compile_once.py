"""One compile per install: the kernels' signatures do not depend on the request.

Different models (dense, MoE, windowed, an HF config file), batch grids, TP sets, GPU sets,
policies, workloads (two trace formats) and whole deployments (--ttft: the prefill replay and the
aggregated replay) are planned in one process; after the first request of each kind (a fixed
context, a workload, a deployment) no numba dispatcher of the package may gain a signature, or a
new model, `--batches` or GPU set would compile again (and the first-run notice would be untrue).
Every entry Python calls has one signature (every other dispatcher one, or one per objective),
so no two kinds of request write different entries into one entry's cache index (two processes
compiling at once could otherwise drop each other's entry). A child
process with a fresh cache checks the notice: it names exactly what compiles, and a warm run of
other requests of the same kinds compiles nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from opweave_planner import api

ROOT = Path(__file__).resolve().parents[1]
TRACE = str(ROOT / "examples" / "traces" / "mooncake-conversation-sample.jsonl")
CSV_TRACE = str(ROOT / "examples" / "traces" / "azure-conv-sample.csv")
SMALL = dict(max_owners=2, max_replicas=1)
# dispatchers with two signatures by design: _swap for int64 and float64 arrays; the simulator's
# kernels for stage times per stage (a fixed context) and per stage and microbatch (a workload)
SEVERAL = {"opweave_planner.search.points._swap": 2,
           **{f"opweave_planner.schedule.kernels.{k}": 2 for k in (
               "_one_iteration", "_periodic_search", "_work_scale", "rtt_by_cycle_mean", "transition_matrix")}}
# a llama-style HF config (12 layers: another operator count than any bundled model)
HF_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
             "num_hidden_layers": 12, "vocab_size": 32000, "num_attention_heads": 32,
             "num_key_value_heads": 8, "intermediate_size": 14336, "head_dim": 128,
             "max_position_embeddings": 32768}
DEPLOYMENT = dict(prompt_len=7680, output_len=1024, ttft="1s")


def _dispatchers():
    from numba.core.dispatcher import Dispatcher

    for name, mod in list(sys.modules.items()):
        if not name.startswith("opweave_planner") or mod is None:
            continue
        for attr, obj in list(vars(mod).items()):
            if isinstance(obj, Dispatcher) and obj.py_func.__module__ == name:
                yield f"{name}.{attr}", obj


def _signatures() -> dict[str, int]:
    return {name: len(d.signatures) for name, d in _dispatchers()}


def _grown(before: dict[str, int], after: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Dispatchers that gained a signature, those of modules imported since included."""
    return {k: (before.get(k, 0), n) for k, n in after.items() if n > before.get(k, 0)}


def _plan(model, slo, ctx=None, **kw):
    return api.plan(api.make_request(model, slo, ctx, **{**SMALL, **kw}))


def _too_many_signatures():
    """Dispatchers with more signatures than SEVERAL allows them (one, unless listed there); with
    a warm cache only the loaded entries count any."""
    return {k: n for k, n in _signatures().items() if n > SEVERAL.get(k, 1)}


def _entry_signatures():
    """Signatures of each entry the first-run notice checks (jit.ENTRIES)."""
    from opweave_planner import jit

    names = {f"opweave_planner.{rel[:-3].replace('/', '.')}.{f}" for part in jit.ENTRIES.values()
             for rel, fs in part.items() for f in fs}
    got = _signatures()
    return {n: got.get(n) for n in sorted(names)}


def test_kernels_compile_once_across_different_requests(tmp_path):
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps(HF_CONFIG))
    _plan("llama-3.1-8b", "60ms", "8k", gpus="h100", batches=(1, 8), tensor_parallel_sizes=(1,))
    first = _signatures()
    assert any(n > 0 for n in first.values())
    _plan("qwen3-30b-a3b", "50ms", "8k", gpus="h100,a100", batches=(4, 16, 32), tensor_parallel_sizes=(1, 2, 4))
    _plan("gemma-3-27b", "80ms", "32k", gpus="l40s,h200", batches=(2, 6, 24), tensor_parallel_sizes=(2, 8),
          max_replicas=2)
    _plan(str(hf), "40ms", "8k", gpus="a100", batches=(3, 17, 100), max_owners=3)
    _plan("qwen3-32b", "60ms", "16k", gpus="h200", tensor_parallel_sizes=(8,), max_owners=1)
    _plan("llama-3.1-8b", "40ms", "4k", gpus="a100", batches=(3, 64), policy="afd", tensor_parallel_sizes=(1, 2))
    assert _grown(first, _signatures()) == {}
    _plan("llama-3.1-8b", "60ms", gpus="h100", workload=TRACE, scale_ctx=8192, batches=(1, 8),
          tensor_parallel_sizes=(1,))
    with_workload = _signatures()
    _plan("qwen3-30b-a3b", "80ms", gpus="h100,a100", workload=TRACE, scale_ctx=16384, batches=(4, 32),
          tensor_parallel_sizes=(1, 2))
    _plan("gemma-3-27b", "70ms", gpus="h200", workload=TRACE, scale_ctx="32k", batches=(6, 40),
          tensor_parallel_sizes=(4, 8))
    _plan("gemma-3-27b", "70ms", "16k", gpus="h200", batches=(5, 40), tensor_parallel_sizes=(4,))
    assert _grown(with_workload, _signatures()) == {}
    _plan("llama-3.1-8b", "60ms", gpus="h100", workload=CSV_TRACE, batches=(2, 8), tensor_parallel_sizes=(1,))
    with_csv = _signatures()
    _plan("qwen3-32b", "80ms", gpus="a100", workload=CSV_TRACE, scale_ctx=4096, batches=(3, 9),
          tensor_parallel_sizes=(2, 4))
    assert _grown(with_csv, _signatures()) == {}
    _plan("llama-3.1-8b", "30ms", "8704", gpus="h100", target_tokens_per_s=20000, batches=(16, 64),
          tensor_parallel_sizes=(1,), **DEPLOYMENT)
    with_deployment = _signatures()
    _plan("qwen3-30b-a3b", "50ms", "6k", gpus="h100,a100", request_rate=5, prompt_len=2048, output_len=256,
          ttft="2s", batches=(8, 24), tensor_parallel_sizes=(1, 2))
    _plan("llama-3.1-8b", "60ms", gpus="h100", workload=CSV_TRACE, ttft="1s", request_rate=3, batches=(4, 16),
          tensor_parallel_sizes=(1, 2))
    assert _grown(with_deployment, _signatures()) == {}
    assert _too_many_signatures() == {}
    assert set(_entry_signatures().values()) == {1}


CHILD = r"""
import json, os, sys
from opweave_planner import api, jit
from opweave_planner.cli.run_plan import compiled_parts
requests = json.loads(sys.argv[1])
out = {"cold_before": [], "cold_after": [], "compiled": []}
for r in requests:
    req = api.make_request(**r)
    out["cold_before"].append(jit.cold_parts(compiled_parts(req)))
    api.plan(req)
    out["cold_after"].append(jit.cold_parts(compiled_parts(req)))
from numba.core.dispatcher import Dispatcher
for name, mod in list(sys.modules.items()):
    if name.startswith("opweave_planner") and mod is not None:
        for attr, obj in list(vars(mod).items()):
            if isinstance(obj, Dispatcher) and obj.py_func.__module__ == name and obj.stats.cache_misses:
                out["compiled"].append(f"{name}.{attr}")
out["workload_cold"] = jit.cold_parts(["workload search"])
print(json.dumps(out))
"""


def _child(requests, cache: Path) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", CHILD, json.dumps(requests)], env=env, capture_output=True,
                         text=True, timeout=1800, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_notice_names_what_compiles_and_a_warm_run_compiles_nothing(tmp_path):
    """A fresh cache: a deployment request is cold in all three of its parts, and warm after it
    ran; then, in a new process, a fixed-context request of another model, grid and GPU set and
    another deployment find everything cached, and compile nothing (numba's own cache-miss
    counts), while the workload search, never run, is still reported cold."""
    small = dict(max_owners=2, max_replicas=1, **DEPLOYMENT)
    first = _child([dict(model="llama-3.1-8b", slo="30ms", ctx="8704", gpus="h100", target_tokens_per_s=20000,
                         batches=[16, 64], tensor_parallel_sizes=[1], **small)], tmp_path)
    assert first["cold_before"] == [["fixed-context search", "prefill replay", "aggregated replay"]]
    assert first["cold_after"] == [[]]
    assert first["compiled"]  # it did compile, into tmp_path
    second = _child([dict(model="qwen3-30b-a3b", slo="50ms", ctx="8k", gpus="h100,a100", batches=[4, 12, 48],
                          tensor_parallel_sizes=[1, 2], max_owners=2, max_replicas=1),
                     dict(model="gemma-3-27b", slo="60ms", ctx="16k", gpus="h200", request_rate=2,
                          batches=[8, 24], tensor_parallel_sizes=[4, 8], **small)], tmp_path)
    assert second["cold_before"] == [[], []]
    assert second["compiled"] == []
    assert second["workload_cold"] == ["workload search"]


KERN = '''
from opweave_planner.jit import entry, kernel


@kernel
def square(x):
    return x * x


@entry
def door(x):
    return square(x) + 1.0
'''


def test_kernels_compile_at_the_package_level_and_other_code_at_numbas(tmp_path, monkeypatch):
    """Every pass pipeline of a compile of ours (the kernel's, its entry's) is built at
    jit.OPT_LEVEL, except the cheap inlining pass numba always builds at 0; a plain njit
    function compiled after them gets numba's own level again."""
    import importlib

    import numba
    from numba.core import codegen, config

    from opweave_planner import jit

    (tmp_path / "optmod.py").write_text(KERN)
    monkeypatch.syspath_prepend(str(tmp_path))
    levels: list[int] = []
    build = codegen.create_pass_builder

    def spy(tm, opt, **kw):
        levels.append(int(opt))
        return build(tm, opt=opt, **kw)

    monkeypatch.setattr(codegen, "create_pass_builder", spy)
    assert importlib.import_module("optmod").door(3.0) == 10.0
    assert levels and set(levels) <= {0, jit.OPT_LEVEL} and jit.OPT_LEVEL in levels
    levels.clear()
    assert numba.njit(lambda x: x - 1.0)(3.0) == 2.0
    assert int(config.OPT) in levels and set(levels) <= {0, int(config.OPT)}
