"""The prefill model (latency/prefill.py) and `profiles prefill`: chunking, the prefix rule,
sources, the KV hand-off, the command's JSON and its one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from opweave_planner.data import shipped_dir
from opweave_planner.inputs.hardware import load_hardware
from opweave_planner.inputs.model import load_model
from opweave_planner.latency import interp as I
from opweave_planner.latency.prefill import chunk_schedule, default_chunk_tokens, prefill
from opweave_planner.latency.tables import load_profile_set
from opweave_planner.structure.operators import build_sequence


@pytest.fixture(scope="module")
def qwen():
    return build_sequence(load_model("qwen3-32b"))


def _gpu(g):
    return load_hardware().resolve(g)


def test_chunk_schedule_covers_every_prompt_in_order():
    steps = chunk_schedule(5000, 3, 2048)
    assert all(sum(s[0] for s in st) <= 2048 for st in steps)
    assert sum(s[0] for st in steps for s in st) == 15000
    assert len(steps) == -(-15000 // 2048)
    ends = [s for st in steps for s in st if s[2]]
    assert len(ends) == 3 and all(e[0] + e[1] == 5000 for e in ends)
    assert chunk_schedule(8192, 4, 0) == [[(8192, 0, True)] * 4]


def test_default_chunk_is_vllm_serves():
    assert default_chunk_tokens(_gpu("h100")) == 8192
    assert default_chunk_tokens(_gpu("a100")) == 2048 and default_chunk_tokens(_gpu("l40s")) == 2048


def test_one_pass_parts_sum_and_sources(qwen):
    est = prefill(qwen, _gpu("h100"), 4, 8192, 1, 0)
    assert est.steps == 1 and est.prefill_ms == pytest.approx(sum(est.breakdown_ms.values()))
    assert est.sources["attn_full"] == "measured" and est.sources["ffn_up"] == "interpolated"
    assert est.measured_share == 1.0
    assert est.kv_bytes_per_request == qwen.kv_bytes(8192)
    assert est.handoff_ms == pytest.approx(qwen.kv_bytes(8192) / 32e9 * 1e3 + 0.02)
    # the same GPU, more work: longer prompts, bigger batches, fewer GPUs cost more
    assert prefill(qwen, _gpu("h100"), 4, 16384, 1, 0).prefill_ms > est.prefill_ms
    assert prefill(qwen, _gpu("h100"), 4, 8192, 2, 0).prefill_ms > est.prefill_ms
    assert prefill(qwen, _gpu("h100"), 2, 8192, 1, 0).prefill_ms > est.prefill_ms


def test_prefix_costs_the_difference_of_two_passes(qwen):
    """Attention of a chunk after a prefix: T(p + c) - T(p), at least T(c); chunking a prompt
    therefore never makes its attention cheaper than the one pass by more than the launches."""
    ps = load_profile_set(shipped_dir("profiles"), "h100", "vllm")
    t, _ = I.context_attention(ps, 1, 16, 2, 128, np.array([2048.0, 4096.0]))
    one = prefill(qwen, _gpu("h100"), 4, 4096, 1, 0).breakdown_ms["attn_full"]
    two = prefill(qwen, _gpu("h100"), 4, 4096, 1, 2048).breakdown_ms["attn_full"]
    assert two == pytest.approx(one * max(t[0] + (t[1] - t[0]), 2 * t[0]) / t[1], rel=1e-6)


def test_sliding_and_linear_models_cost_their_own_kernels():
    g = _gpu("h100")
    gemma = prefill(build_sequence(load_model("gemma-3-27b")), g, 2, 8192, 1, 0)
    assert {"attn_sliding", "attn_full"} <= set(gemma.breakdown_ms)
    nxt = prefill(build_sequence(load_model("qwen3-next-80b-a3b")), g, 4, 8192, 1, 2048)
    assert nxt.breakdown_ms["attn_linear"] > 0 and nxt.steps == 4


def test_cli_json_and_errors(capsys):
    from opweave_planner.cli.main import run

    def call(*args):
        import sys

        sys.argv = ["opweave-plan", "profiles", "prefill", *args]
        with pytest.raises(SystemExit) as exc:
            run()
        return exc.value.code

    assert call("--model", "qwen3-32b", "--gpu", "h100", "--tp", "4", "--prompt", "8k", "--json") in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert out["chunk_tokens"] == 8192 and out["prefill_ms"] > 0
    assert out["prefill_ms"] == pytest.approx(sum(r["ms"] for r in out["breakdown"]), abs=1e-3)
    assert {r["source"] for r in out["breakdown"]} <= set(I.SOURCE_NAMES)
    for bad, word in ((["--prompt", "8q"], "--prompt"), (["--prompt", "8k", "--tp", "3"], "--tp"),
                      (["--prompt", "8k", "--chunk-tokens", "-1"], "--chunk-tokens"),
                      (["--prompt", "8k", "--link-bandwidth", "fast"], "--link-bandwidth")):
        assert call("--model", "qwen3-32b", "--gpu", "h100", *bad) == 2
        err = capsys.readouterr().err
        assert word in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
