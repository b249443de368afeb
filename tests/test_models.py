"""Model specs: parameter counts against published sizes, HF loading, bad configs."""

from __future__ import annotations

import json

import pytest

from opweave_planner.errors import UserError
from opweave_planner.inputs.model import bundled_models, load_model, parse_hf_config
from opweave_planner.structure.operators import build_sequence

# Published sizes (model cards); tolerance 1%.
PUBLISHED = {
    "gemma-3-27b": (27.0e9, None),
    "gemma-3-12b": (11.8e9, None),  # text tower of the 12.2B multimodal model
    "llama-3.1-70b": (70.6e9, 70.6e9),
    "llama-3.1-8b": (8.03e9, 8.03e9),
    "qwen3-32b": (32.8e9, 32.8e9),
    "qwen3-235b-a22b": (235e9, 22e9),
    "qwen3-30b-a3b": (30.5e9, 3.3e9),
    "qwen3-next-80b-a3b": (80e9, None),
    "gpt-oss-120b": (116.8e9, 5.13e9),
    "deepseek-v3": (671e9, 37e9),
}


def test_every_required_model_is_bundled():
    assert set(PUBLISHED) <= set(bundled_models())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published(name):
    seq = build_sequence(load_model(name))
    total, active = PUBLISHED[name]
    assert seq.total_params() == pytest.approx(total, rel=0.01)
    if active is not None:
        got = seq.active_params()
        if name == "gpt-oss-120b":
            # OpenAI's 5.13B counts the unembedding but not the embedding lookup
            got -= load_model(name).vocab_size * load_model(name).hidden_size
            active = 5.13e9
        # "37B" and "3.3B" are published to two significant figures
        tol = 0.02 if name in ("deepseek-v3", "qwen3-30b-a3b") else 0.01
        assert got == pytest.approx(active, rel=tol)


def test_families_are_understood_structurally():
    kinds = lambda n: {lay.attention.kind for lay in load_model(n).layers}
    assert kinds("gemma-3-27b") == {"sliding", "full"}
    assert kinds("qwen3-next-80b-a3b") == {"linear", "full"}
    assert kinds("deepseek-v3") == {"mla"}
    ds = load_model("deepseek-v3")
    assert [lay.mlp.kind for lay in ds.layers[:4]] == ["dense", "dense", "dense", "moe"]
    gemma = load_model("gemma-3-27b")
    assert [lay.attention.kind for lay in gemma.layers[:6]] == ["sliding"] * 5 + ["full"]
    assert gemma.layers[0].attention.window == 1024
    oss = load_model("gpt-oss-120b")
    assert [lay.attention.kind for lay in oss.layers[:2]] == ["sliding", "full"]


def test_kv_cache_rules():
    gemma = build_sequence(load_model("gemma-3-27b"))
    # sliding layers stop growing past their window, full layers keep growing
    swa = next(op for op in gemma.ops if op.kind == "attn_sliding")
    full = next(op for op in gemma.ops if op.kind == "attn_full")
    assert swa.kv_bytes(4096) == swa.kv_bytes(1024) == 1024 * 2 * 16 * 128 * 2
    assert full.kv_bytes(4096) == 4 * full.kv_bytes(1024)
    nxt = build_sequence(load_model("qwen3-next-80b-a3b"))
    lin = next(op for op in nxt.ops if op.kind == "attn_linear")
    assert lin.kv_bytes(1) == lin.kv_bytes(131072) > 0
    ds = build_sequence(load_model("deepseek-v3"))
    mla = next(op for op in ds.ops if op.kind == "attn_mla")
    assert mla.kv_bytes_per_token == (512 + 64) * 2


def test_hf_config_from_file_with_nested_text_config(tmp_path):
    from opweave_planner.data import shipped_dir

    raw = json.loads((shipped_dir("models") / "gemma-3-12b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    spec = load_model(str(path))
    assert spec.n_layers == 48 and spec.tie_embeddings
    assert spec.layers[5].attention.kind == "full"


def test_raw_hf_config_gets_family_defaults(tmp_path):
    # gemma text config without the keys transformers fills in
    raw = {"model_type": "gemma3", "text_config": {
        "hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text",
        "num_attention_heads": 16, "num_hidden_layers": 48, "num_key_value_heads": 8,
        "sliding_window": 1024}}
    spec = parse_hf_config(raw, "g", "test")
    assert spec.vocab_size == 262208 and spec.layers[0].attention.head_dim == 256
    assert sum(lay.attention.kind == "full" for lay in spec.layers) == 8


@pytest.mark.parametrize("raw, needle", [
    ({"model_type": "llama", "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 2,
      "intermediate_size": 8}, "missing required key 'hidden_size'"),
    ({"model_type": "mamba", "architectures": ["MambaForCausalLM"], "hidden_size": 768,
      "num_hidden_layers": 24, "vocab_size": 50280, "state_size": 16},
     "missing required key 'num_attention_heads'"),
    ({"model_type": "llama", "hidden_size": -8, "num_hidden_layers": 2, "vocab_size": 10,
      "num_attention_heads": 2, "intermediate_size": 8}, "hidden_size: expected a positive integer, got -8"),
    ({"model_type": "qwen3", "hidden_size": 8, "num_hidden_layers": 2, "vocab_size": 10,
      "num_attention_heads": 2, "intermediate_size": 8, "use_sliding_window": True},
     "use_sliding_window=true"),
])
def test_bad_configs_are_rejected_with_the_key(raw, needle):
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        parse_hf_config(raw, "x", "cfg.json")


def test_malformed_json_and_unknown_model(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="malformed JSON"):
        load_model(str(bad))
    with pytest.raises(UserError, match="did you mean gemma-3-27b"):
        load_model("gemma-3-72b")
