"""Hostile model inputs: every bad config.json or --model value is one UserError line naming it.

Regression cases from issues 17 and 18 (wrong types, impossible sizes, missing family keys,
odd files, Hugging Face ids and the local hub cache), plus a hypothesis fuzz over mutated
bundled configs: a mutation yields either a model the operator builder accepts or a one-line
UserError naming a field, never another exception. The fuzz runs ten times the active
hypothesis profile's max_examples (at least 1000, about 3 s), so a larger profile runs it longer.
"""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import tomllib

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from opweave_planner.data import shipped_dir
from opweave_planner.errors import UserError
from opweave_planner.inputs import model as model_mod
from opweave_planner.inputs.model import bundled_hf_ids, bundled_models, load_model, parse_hf_config
from opweave_planner.structure.operators import build_sequence

WHERE = "models/x.json"
# A minimal Llama config ("B" in issue 18): 32 heads, 2 layers.
B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
     "num_hidden_layers": 2, "vocab_size": 1000, "num_attention_heads": 32,
     "num_key_value_heads": 8, "intermediate_size": 14336, "head_dim": 128}


def bundled_raw(name: str) -> dict:
    return json.loads((shipped_dir("models") / f"{name}.json").read_text())


def rejected(raw: dict, where: str = WHERE) -> str:
    """The one-line message parse_hf_config rejects `raw` with."""
    with pytest.raises(UserError) as info:
        parse_hf_config(raw, "x", where)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{where}: ")
    return msg


def with_(base: dict, **changes) -> dict:
    out = copy.deepcopy(base)
    for k, v in changes.items():
        if v is ...:
            out.pop(k, None)
        else:
            out[k] = v
    return out


# ----------------------------------------------------------------------------- config values

def test_valid_minimal_llama_is_accepted():
    spec = parse_hf_config(B, "b", WHERE)
    assert spec.n_layers == 2 and spec.layers[0].attention.n_kv_heads == 8


@pytest.mark.parametrize("value", [-1, 0, 3, 5, 64, [], "8", 8.0, True])
def test_kv_heads_must_divide_attention_heads(value):
    msg = rejected(with_(B, num_key_value_heads=value))
    assert msg == (f"{WHERE}: num_key_value_heads: expected a positive integer dividing "
                   f"num_attention_heads (32), got {value!r}")


@pytest.mark.parametrize("value", ["x", -128, 0, 1.5, [128], {"a": 1}, False])
def test_head_dim_must_be_a_positive_integer(value):
    assert rejected(with_(B, head_dim=value)) == (
        f"{WHERE}: head_dim: expected a positive integer, got {value!r}")


INT_KEYS = ["hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads",
            "num_key_value_heads", "intermediate_size", "head_dim"]


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("value", [[], {}, "12", 2.0, True])
def test_every_integer_key_rejects_other_types(key, value):
    assert f": {key}: expected a positive integer" in rejected(with_(B, **{key: value}))


@pytest.mark.parametrize("name, key, value", [
    ("qwen3-30b-a3b", "moe_intermediate_size", -768),
    ("qwen3-30b-a3b", "num_experts", -1),
    ("qwen3-30b-a3b", "num_experts", 0),
    ("qwen3-30b-a3b", "num_experts_per_tok", 129),
    ("qwen3-30b-a3b", "num_experts_per_tok", 0),
    ("qwen3-30b-a3b", "decoder_sparse_step", 0),
    ("qwen3-next-80b-a3b", "shared_expert_intermediate_size", -512),
    ("deepseek-v3", "n_shared_experts", -1),
    ("deepseek-v3", "n_routed_experts", "256"),
    ("deepseek-v3", "first_k_dense_replace", -3),
    ("deepseek-v3", "kv_lora_rank", -512),
    ("deepseek-v3", "kv_lora_rank", 0),
    ("deepseek-v3", "q_lora_rank", 0),
    ("deepseek-v3", "q_lora_rank", -1536),
    ("deepseek-v3", "qk_rope_head_dim", 0),
    ("gpt-oss-120b", "num_local_experts", 2.5),
    ("gpt-oss-120b", "sliding_window", -128),
    ("qwen3-next-80b-a3b", "linear_num_key_heads", 0),
    ("qwen3-next-80b-a3b", "linear_num_value_heads", 20),  # not a multiple of 16 key heads
    ("qwen3-next-80b-a3b", "linear_conv_kernel_dim", [4]),
])
def test_moe_mla_and_linear_sizes_are_checked(name, key, value):
    msg = rejected(with_(bundled_raw(name), **{key: value}))
    assert f": {key}: expected " in msg and msg.endswith(f"got {value!r}")


def test_top_k_above_expert_count_names_both():
    msg = rejected(with_(bundled_raw("qwen3-30b-a3b"), num_experts_per_tok=129))
    assert "at most num_experts (128)" in msg


def test_synonymous_keys_must_agree():
    msg = rejected(with_(bundled_raw("gpt-oss-120b"), experts_per_token=5))
    assert "experts_per_token: expected the same value as num_experts_per_tok (4), got 5" in msg


@pytest.mark.parametrize("value", [5, [48], [-1], ["1"], "0"])
def test_mlp_only_layers_is_a_list_of_layer_indices(value):
    msg = rejected(with_(bundled_raw("qwen3-30b-a3b"), mlp_only_layers=value))
    assert "mlp_only_layers: expected a list of layer indices below num_hidden_layers (48)" in msg


def test_mlp_only_layers_is_honoured():
    spec = parse_hf_config(with_(bundled_raw("qwen3-30b-a3b"), mlp_only_layers=[0, 47]), "q", WHERE)
    kinds = [lay.mlp.kind for lay in spec.layers]
    assert kinds[0] == kinds[47] == "dense" and kinds[1:47] == ["moe"] * 46


def test_model_type_must_be_a_string():
    assert rejected(with_(B, model_type=["llama"])) == (
        f"{WHERE}: model_type: expected a string, got ['llama']")


@pytest.mark.parametrize("quant, field", [
    ("fp8", "quantization_config: expected an object with quant_method, got 'fp8'"),
    ({"quant_method": "fp8", "weight_block_size": [0, 0]},
     "quantization_config.weight_block_size: expected two positive integers, got [0, 0]"),
    ({"quant_method": "fp8", "weight_block_size": [128]},
     "quantization_config.weight_block_size: expected two positive integers, got [128]"),
    ({"quant_method": "fp8", "weight_block_size": "128x128"}, "weight_block_size: expected two"),
    ({"quant_method": "mxfp4", "modules_to_not_convert": 5},
     "quantization_config.modules_to_not_convert: expected a list of module names, got 5"),
    ({"quant_method": "mxfp4", "modules_to_not_convert": [1]}, "modules_to_not_convert: expected"),
    ({"quant_method": "awq"}, "quantization_config.quant_method: expected fp8 or mxfp4"),
    ({"quant_method": ["fp8"]}, "quantization_config.quant_method: expected fp8 or mxfp4"),
    ({"fmt": "e4m3"}, "missing required key 'quantization_config.quant_method'"),
])
def test_quantization_config_is_checked(quant, field):
    assert field in rejected(with_(B, quantization_config=quant))


def test_fp8_block_size_defaults_to_128_squared():
    raw = with_(bundled_raw("deepseek-v3"))
    del raw["quantization_config"]["weight_block_size"]
    assert parse_hf_config(raw, "d", WHERE) == load_model("deepseek-v3").model_copy(
        update={"name": "d", "source_sha256": "", "source": ""})


@pytest.mark.parametrize("value", [0, -4, "4", 4.0])
def test_qwen3_next_full_attention_interval(value):
    raw = with_(bundled_raw("qwen3-next-80b-a3b"), layer_types=..., full_attention_interval=value)
    assert "full_attention_interval: expected a positive integer" in rejected(raw)


def test_qwen3_next_pattern_is_derived_without_layer_types():
    raw = with_(bundled_raw("qwen3-next-80b-a3b"), layer_types=...)
    assert parse_hf_config(raw, "n", WHERE).layers == load_model("qwen3-next-80b-a3b").layers


@pytest.mark.parametrize("name, key", [
    ("deepseek-v3", "qk_nope_head_dim"), ("deepseek-v3", "qk_rope_head_dim"),
    ("deepseek-v3", "v_head_dim"), ("deepseek-v3", "q_lora_rank"), ("deepseek-v3", "kv_lora_rank"),
    ("gpt-oss-120b", "intermediate_size"), ("qwen3-30b-a3b", "num_experts_per_tok"),
    ("qwen3-next-80b-a3b", "linear_key_head_dim"), ("gpt-oss-120b", "sliding_window"),
    ("llama-3.1-8b", "intermediate_size"), ("llama-3.1-8b", "vocab_size"),
])
def test_family_keys_are_required(name, key):
    raw = bundled_raw(name)
    (raw.get("text_config") or raw).pop(key)
    msg = rejected(raw)
    assert re.search(rf"missing required key '(text_config\.)?{key}'", msg), msg


@pytest.mark.parametrize("value", ["no", 0, 1, "false", [True]])
def test_tie_word_embeddings_is_a_bool(value):
    assert rejected(with_(B, tie_word_embeddings=value)) == (
        f"{WHERE}: tie_word_embeddings: expected true or false, got {value!r}")


def test_tie_word_embeddings_false_and_true():
    assert not parse_hf_config(with_(B, tie_word_embeddings=False), "b", WHERE).tie_embeddings
    assert parse_hf_config(with_(B, tie_word_embeddings=True), "b", WHERE).tie_embeddings


def test_huge_layer_count_is_rejected_at_once():
    assert rejected(with_(B, num_hidden_layers=1_000_000)) == (
        f"{WHERE}: num_hidden_layers: expected a positive integer at most 1024, got 1000000")


@pytest.mark.parametrize("changes", [
    {"hidden_size": 1 << 24, "intermediate_size": 1 << 24},
    {"num_hidden_layers": 1024, "hidden_size": 1 << 20, "head_dim": 1 << 16},
])
def test_total_parameters_are_bounded(changes):
    msg = rejected(with_(B, **changes))
    assert "hidden_size, num_hidden_layers" in msg and "expected at most 1e+14" in msg


def test_each_size_is_bounded():
    assert "vocab_size: expected a positive integer at most 16777216" in rejected(
        with_(B, vocab_size=10**30))


def test_nested_text_config_fields_are_named_as_written():
    raw = bundled_raw("gemma-3-27b")
    raw["text_config"]["head_dim"] = "x"
    assert ": text_config.head_dim: expected a positive integer, got 'x'" in rejected(raw)
    raw["text_config"] = [1]
    assert ": text_config: expected an object" in rejected(raw)


@pytest.mark.parametrize("types, needle", [
    (["full_attention"], "layer_types: expected a list of 2 layer types"),
    ("full_attention", "layer_types: expected a list of 2 layer types"),
    (["full_attention", "chunked_attention"], "layer_types[1]: expected full_attention"),
    (["full_attention", ["x"]], "layer_types[1]: expected full_attention"),
])
def test_layer_types_are_checked(types, needle):
    assert needle in rejected(with_(B, layer_types=types))


@pytest.mark.parametrize("key, value, needle", [
    ("torch_dtype", "int4", "torch_dtype: expected bfloat16, float16 or float32, got 'int4'"),
    ("torch_dtype", 16, "torch_dtype: expected a string, got 16"),
    ("attention_bias", "yes", "attention_bias: expected true or false"),
    ("use_sliding_window", 1, "use_sliding_window: expected true or false"),
    ("max_position_embeddings", -1, "max_position_embeddings: expected an integer >= 0"),
])
def test_other_read_keys_are_type_checked(key, value, needle):
    assert needle in rejected(with_(B, **{key: value}))


def test_head_dim_default_needs_enough_hidden_size():
    msg = rejected(with_(B, head_dim=..., hidden_size=16))
    assert "missing required key 'head_dim'" in msg and "smaller than num_attention_heads 32" in msg


# ----------------------------------------------------------------------------- structure

def llama_as(model_type: str, **changes) -> dict:
    raw = with_(bundled_raw("llama-3.1-8b"), model_type=model_type, **changes)
    raw["architectures"] = [f"{model_type.capitalize()}ForCausalLM"]
    return raw


@pytest.mark.parametrize("model_type", ["mistral", "qwen2", "granite"])
def test_llama_architecture_under_another_model_type_is_generic_dense(model_type):
    spec = parse_hf_config(llama_as(model_type), "m", WHERE)
    llama = load_model("llama-3.1-8b")
    assert spec.model_type == model_type
    assert spec.layers == llama.layers and spec.hidden_size == llama.hidden_size
    assert not spec.tie_embeddings


def test_mistral_sliding_window_applies_to_every_layer():
    spec = parse_hf_config(llama_as("mistral", sliding_window=4096), "m", WHERE)
    assert {(lay.attention.kind, lay.attention.window) for lay in spec.layers} == {("sliding", 4096)}
    qwen2 = parse_hf_config(llama_as("qwen2", sliding_window=4096, use_sliding_window=False), "q", WHERE)
    assert {lay.attention.kind for lay in qwen2.layers} == {"full"}


def test_structure_is_recognised_without_a_known_model_type():
    # an MoE with MLA under a made-up name reads exactly like deepseek-v3
    raw = with_(bundled_raw("deepseek-v3"), model_type="kimi_like", architectures=["KimiForCausalLM"],
                first_k_dense_replace=3)
    assert parse_hf_config(raw, "k", WHERE).layers == load_model("deepseek-v3").layers
    # no model_type at all: a plain dense decoder
    assert parse_hf_config(with_(B, model_type=...), "b", WHERE).model_type == ""


@pytest.mark.parametrize("changes, needle", [
    ({"model_type": "mamba", "num_attention_heads": ..., "num_key_value_heads": ...},
     "missing required key 'num_attention_heads'"),
    ({"model_type": "bert", "architectures": ["BertForMaskedLM"]},
     "architectures: expected a decoder-only ...ForCausalLM architecture"),
    ({"model_type": "t5", "is_encoder_decoder": True}, "is_encoder_decoder: expected false"),
    ({"model_type": "mystery", "linear_num_value_heads": 32},
     "missing required key 'layer_types' (expected which layers are linear_attention"),
    ({"model_type": "mystery", "layer_types": ["linear_attention"] * 2},
     "missing required key 'linear_num_key_heads'"),
    ({"kv_lora_rank": 512}, "missing required key 'q_lora_rank'"),
    ({"num_experts": 8}, "missing required key 'num_experts_per_tok'"),
])
def test_unsupported_structure_names_the_missing_field(changes, needle):
    assert needle in rejected(with_(B, **changes))


# ----------------------------------------------------------------------------- files

@pytest.fixture
def fresh_hub(tmp_path, monkeypatch):
    """An empty Hugging Face home, so the user's real cache never leaks into a test."""
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf" / "hub"


def load_error(text: str) -> str:
    with pytest.raises(UserError) as info:
        load_model(text)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_name_over_255_characters(fresh_hub):
    assert load_error("m" * 300).startswith("--model: unknown model 'mmmmm")
    assert "does not exist" in load_error("m" * 300 + ".json")
    # a path with a name over the limit says so (the one input check), not 'does not exist'
    assert "a name in the path is 300 bytes; the limit is 255" in load_error("/tmp/" + "m" * 300 + "/config.json")


def test_directory_and_fifo_are_not_regular_files(tmp_path):
    assert "is not a regular file" in load_error(str(tmp_path))
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    assert "is not a regular file" in load_error(str(fifo))  # and does not block


def test_directory_holding_a_config_is_read(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(B))
    spec = load_model(str(tmp_path))
    assert spec.source == str(tmp_path / "config.json") and spec.n_layers == 2


def test_unreadable_file_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(B))
    real_open = os.open

    def denied(p, *a, **kw):
        if os.fspath(p) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(p, *a, **kw)

    monkeypatch.setattr(os, "open", denied)
    assert load_error(str(path)) == f"{path}: cannot read the model config (Permission denied)"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of mode")
def test_unreadable_file_by_mode(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(B))
    path.chmod(0)
    assert "Permission denied" in load_error(str(path))


@pytest.mark.parametrize("content, needle", [
    (b"{oops", "malformed JSON"), (b"[1, 2]", "expected a JSON object"),
    (b"\xff\xfe", "malformed JSON"), (b"", "malformed JSON"),
])
def test_file_contents_that_are_not_a_config(tmp_path, content, needle):
    path = tmp_path / "m.json"
    path.write_bytes(content)
    assert needle in load_error(str(path))


def test_oversized_file_is_refused_before_parsing(tmp_path, monkeypatch):
    monkeypatch.setattr(model_mod, "MAX_CONFIG_BYTES", 100)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(B))
    assert "larger than" in load_error(str(path))


def test_source_and_name_do_not_depend_on_the_folder(tmp_path):
    for sub in ("a", "b/dir"):
        (tmp_path / sub).mkdir(parents=True)
        (tmp_path / sub / "config.json").write_text(json.dumps(B))
    a, b = load_model(str(tmp_path / "a" / "config.json")), load_model(str(tmp_path / "b/dir/config.json"))
    assert a.name == b.name == f"llama-{a.source_sha256[:12]}"
    assert a.source == str(tmp_path / "a" / "config.json") and os.path.isabs(b.source)
    assert load_model(a.source) == a  # the recorded source loads the same model again


def test_relative_path_source_is_absolute(tmp_path, monkeypatch):
    (tmp_path / "mine.json").write_text(json.dumps(B))
    monkeypatch.chdir(tmp_path)
    spec = load_model("mine.json")
    assert spec.name == "mine" and spec.source == str(tmp_path / "mine.json")


def test_file_copies_of_bundled_configs(tmp_path):
    exact = tmp_path / "config.json"
    exact.write_bytes((shipped_dir("models") / "llama-3.1-8b.json").read_bytes())
    assert load_model(str(exact)).name == "llama-3.1-8b"
    edited = tmp_path / "llama-3.1-8b.json"
    edited.write_text(json.dumps(with_(bundled_raw("llama-3.1-8b"), num_hidden_layers=4)))
    spec = load_model(str(edited))
    assert spec.name == f"llama-3.1-8b-{spec.source_sha256[:8]}" and spec.n_layers == 4


@pytest.mark.parametrize("value, needle", [
    ("", "--model: empty"), ("  ", "--model: empty"), (3, "--model: expected a bundled model name"),
    ("a\0b.json", "contains a NUL character"),
])
def test_empty_or_odd_model_values(value, needle):
    assert needle in load_error(value)


def test_path_objects_are_accepted(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(B))
    assert load_model(tmp_path / "config.json").source == str(tmp_path / "config.json")


def test_bundled_source_is_what_was_typed():
    assert load_model("llama-3.1-8b").source == "llama-3.1-8b"
    assert load_model("LLAMA-3.1-8B").name == "llama-3.1-8b"


# ----------------------------------------------------------------------------- Hugging Face ids

@pytest.mark.parametrize("hf_id, name", [
    ("google/gemma-3-27b-it", "gemma-3-27b"), ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("META-LLAMA/llama-3.1-8b-instruct", "llama-3.1-8b"), ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
    ("meta-llama/Meta-Llama-3.1-70B-Instruct", "llama-3.1-70b"),
])
def test_bundled_configs_answer_to_their_hf_ids(hf_id, name, fresh_hub):
    spec = load_model(hf_id)
    assert spec.name == name and spec.source == hf_id
    assert spec.model_copy(update={"source": name}) == load_model(name)


def test_hf_ids_match_sources_table():
    """models/hf_ids.toml lists every bundled model, first with the SOURCES.md repository."""
    sources = (shipped_dir("models") / "SOURCES.md").read_text()
    table = dict(re.findall(r"^\| ([\w.-]+)\.json \| (\S+)", sources, re.M))
    ids = bundled_hf_ids()
    assert set(ids) == set(table) == set(bundled_models())
    assert {name: v[0] for name, v in ids.items()} == table
    flat = [i.lower() for v in ids.values() for i in v]
    assert len(flat) == len(set(flat))
    raw = tomllib.loads((shipped_dir("models") / "hf_ids.toml").read_text())
    assert set(raw) == {"hf_ids"}


def make_snapshot(hub, repo_dir: str, rev: str, raw: dict, mtime: int):
    snap = hub / repo_dir / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(raw))
    os.utime(snap, (mtime, mtime))
    return snap / "config.json"


def test_local_hub_cache_newest_snapshot_offline(fresh_hub, monkeypatch):
    make_snapshot(fresh_hub, "models--acme--Tiny-LM", "aaa", with_(B, num_hidden_layers=2), 1000)
    newest = make_snapshot(fresh_hub, "models--acme--Tiny-LM", "bbb", with_(B, num_hidden_layers=3), 2000)
    make_snapshot(fresh_hub, "models--acme--Tiny-LM", "ccc", with_(B, num_hidden_layers=4), 1500)

    def no_network(*a, **kw):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    spec = load_model("acme/tiny-lm")
    assert spec.n_layers == 3 and spec.name == "acme/Tiny-LM" and spec.source == "acme/tiny-lm"
    assert load_model(str(newest)).name == "acme/Tiny-LM"  # the snapshot path names the repo too


def test_local_hub_cache_prefers_refs_main(fresh_hub):
    make_snapshot(fresh_hub, "models--acme--m", "old", with_(B, num_hidden_layers=2), 1000)
    make_snapshot(fresh_hub, "models--acme--m", "new", with_(B, num_hidden_layers=3), 2000)
    (fresh_hub / "models--acme--m" / "refs").mkdir()
    (fresh_hub / "models--acme--m" / "refs" / "main").write_text("old\n")
    assert load_model("acme/m").n_layers == 2


def test_hub_cache_location_follows_huggingface_hub(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert model_mod.hf_hub_cache() == tmp_path / "elsewhere"
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert model_mod.hf_hub_cache() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "h"))
    assert model_mod.hf_hub_cache() == tmp_path / "h" / "hub"


def test_bad_config_in_the_cache_names_the_snapshot_file(fresh_hub):
    path = make_snapshot(fresh_hub, "models--acme--bad", "r1", with_(B, head_dim=-128), 1000)
    assert load_error("acme/bad") == f"{path}: head_dim: expected a positive integer, got -128"


@pytest.mark.parametrize("text, needle", [
    ("google/gemma-3-27b", "did you mean google/gemma-3-27b-it"),
    ("meta-llama/Llama-3.1-8B", "did you mean meta-llama/Llama-3.1-8B-Instruct"),
    ("gemma-3-72b", "unknown model 'gemma-3-72b'; did you mean gemma-3-27b"),
    ("acme/nothing-like-it", "not in the local Hugging Face cache"),
])
def test_unknown_ids_get_one_line_did_you_mean(text, needle, fresh_hub):
    assert needle in load_error(text)


def test_cached_ids_are_suggested(fresh_hub):
    make_snapshot(fresh_hub, "models--acme--Tiny-LM", "aaa", B, 1000)
    assert "did you mean acme/Tiny-LM" in load_error("acme/Tiny-LN")


# ----------------------------------------------------------------------------- fuzz

READ_KEYS = sorted({
    *INT_KEYS, "model_type", "torch_dtype", "quantization_config", "layer_types",
    "sliding_window", "sliding_window_pattern", "full_attention_interval", "use_sliding_window",
    "num_experts", "n_routed_experts", "num_local_experts", "num_experts_per_tok",
    "experts_per_token", "moe_intermediate_size", "shared_expert_intermediate_size",
    "n_shared_experts", "first_k_dense_replace", "decoder_sparse_step", "moe_layer_freq",
    "mlp_only_layers", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
    "v_head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim", "attention_bias", "tie_word_embeddings",
    "max_position_embeddings", "architectures", "text_config", "is_encoder_decoder",
})
QUANT_KEYS = ["quant_method", "weight_block_size", "modules_to_not_convert"]
HOSTILE = st.one_of(
    st.integers(-(2**70), 2**70), st.sampled_from([0, -1, 1, 2, 3, 5, 64, 1024, 1025, 2**24 + 1]),
    st.floats(allow_nan=False), st.booleans(), st.none(), st.text(max_size=5),
    st.lists(st.integers(-2, 300), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from(["full_attention", "linear_attention", "fp8", "mxfp4", "llama", "qwen3_next"]),
)
MUTATION = st.tuples(st.sampled_from(["set", "delete", "scale"]), st.sampled_from(READ_KEYS + QUANT_KEYS),
                     HOSTILE, st.sampled_from([0, -1, 2, 1000, 10**9]), st.booleans())


def named_field(msg: str, where: str) -> str:
    """The config key an error message names first ('' if none)."""
    m = (re.match(rf"{re.escape(where)}: missing required key '([^']+)'", msg)
         or re.match(rf"{re.escape(where)}: ([\w.\[\]]+)[:=,]", msg))
    return re.sub(r"\[\d+\]", "", m.group(1)).removeprefix("text_config.") if m else ""


def mutate(raw: dict, op: str, key: str, value, factor: int, top: bool) -> None:
    nested = raw.get("text_config")
    target = nested if isinstance(nested, dict) and not top else raw
    if key in QUANT_KEYS:
        target = target.get("quantization_config")
        if not isinstance(target, dict):
            return
    if op == "delete":
        target.pop(key, None)
    elif op == "scale" and isinstance(target.get(key), int) and not isinstance(target.get(key), bool):
        target[key] = target[key] * factor
    else:
        target[key] = value


@settings(max_examples=max(1000, settings.default.max_examples * 10), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(bundled_models()), st.lists(MUTATION, min_size=1, max_size=4))
def test_fuzz_mutated_bundled_configs(name, mutations):
    raw = bundled_raw(name)
    for m in mutations:
        mutate(raw, *m)
    try:
        spec = parse_hf_config(raw, "fuzz", "fuzz.json")
    except UserError as exc:
        msg = str(exc)
        assert "\n" not in msg and msg.startswith("fuzz.json: "), msg
        head, _, sub = named_field(msg, "fuzz.json").partition(".")
        assert head in READ_KEYS and (not sub or sub in QUANT_KEYS), msg
        event("rejected")
        return
    event("accepted")
    seq = build_sequence(spec)
    assert seq.total_params() > 0 and seq.weight_bytes() > 0
    assert seq.kv_bytes(1) >= 0 and seq.kv_bytes(4096) >= seq.kv_bytes(1)
    assert all(op.params >= 0 and op.flops >= 0 and op.out_bytes > 0 for op in seq.ops)


# ----------------------------------------------------------------------------- through the CLI

def test_cli_answers_bad_model_inputs_in_one_line(tmp_path, fresh_hub):
    from cli_helpers import cli

    bad = tmp_path / "config.json"
    bad.write_text(json.dumps(with_(B, num_key_value_heads=5)))
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (str(bad), f"{bad}: num_key_value_heads: expected a positive integer dividing"),
        (str(empty), "is not a regular file"), (str(fifo), "is not a regular file"),
        ("x" * 300, "unknown model"), ("acme/none", "not in the local Hugging Face cache"),
    ]
    for value, needle in cases:
        res = cli("inspect", "--model", value)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and needle in lines[0], res.stderr
    ok = cli("inspect", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["model"] == "llama-3.1-8b"
