"""Model architecture, read from a Hugging Face `config.json` into a frozen spec.

Families are recognised by structure (attention kinds, MoE keys, MLA ranks),
with the few class defaults that Hugging Face configs omit filled in per
`model_type`. Anything the planner cannot model is rejected, never approximated.
"""

from __future__ import annotations

import difflib
import hashlib
from functools import cache
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict

from opweave_planner.data import shipped_dir
from opweave_planner.errors import UserError

AttentionKind = Literal["full", "sliding", "linear", "mla"]

# Class defaults that config.json files leave out (transformers' config classes).
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262208,
        "head_dim": 256,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "tie_word_embeddings": True,
        "max_position_embeddings": 131072,
    },
    "llama": {"tie_word_embeddings": False},
    "qwen3": {"tie_word_embeddings": False},
    "qwen3_moe": {"tie_word_embeddings": False, "decoder_sparse_step": 1, "mlp_only_layers": []},
    "qwen3_next": {
        "tie_word_embeddings": False,
        "full_attention_interval": 4,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
    "gpt_oss": {"tie_word_embeddings": False},
    "deepseek_v3": {"tie_word_embeddings": False, "moe_layer_freq": 1, "first_k_dense_replace": 0},
}
SUPPORTED_MODEL_TYPES = tuple(sorted(_FAMILY_DEFAULTS))

# Bytes per weight element by storage format; mxfp4 carries one 8-bit scale per 32 values.
_DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0, "fp8": 1.0, "mxfp4": 4.25 / 8}


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AttentionSpec(Frozen):
    kind: AttentionKind
    n_heads: int
    n_kv_heads: int
    head_dim: int
    window: int | None = None
    q_gate: bool = False  # query projection also emits an output gate (Qwen3-Next)
    qk_norm: bool = False
    bias: bool = False
    sinks: bool = False
    # linear attention (Gated DeltaNet)
    lin_k_heads: int = 0
    lin_v_heads: int = 0
    lin_k_dim: int = 0
    lin_v_dim: int = 0
    conv_kernel: int = 0
    # multi-head latent attention
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_dim: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0


class MlpSpec(Frozen):
    kind: Literal["dense", "moe"]
    intermediate: int = 0
    n_experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0  # total width of shared experts (0: none)
    shared_gate: bool = False
    bias: bool = False


class LayerSpec(Frozen):
    index: int
    attention: AttentionSpec
    mlp: MlpSpec


class ModelSpec(Frozen):
    name: str
    model_type: str
    hidden_size: int
    vocab_size: int
    tie_embeddings: bool
    layers: tuple[LayerSpec, ...]
    norms_per_layer: int = 2
    weight_bytes: float = 2.0  # dense GEMM weights
    expert_weight_bytes: float = 2.0  # routed-expert weights
    act_bytes: float = 2.0  # activations on the wire
    kv_bytes: float = 2.0  # KV cache / recurrent state element
    source_sha256: str = ""
    max_context: int = 0  # max_position_embeddings (0: unknown)

    @property
    def n_layers(self) -> int:
        return len(self.layers)


def _require(cfg: dict[str, Any], key: str, where: str, kind: type = int) -> Any:
    if key not in cfg or cfg[key] is None:
        raise UserError(f"{where}: missing required key '{key}' ({kind.__name__} expected)")
    value = cfg[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise UserError(f"{where}: key '{key}' must be a positive integer, got {value!r}")
    return value


def _layer_types(cfg: dict[str, Any], mt: str, n_layers: int, where: str) -> list[str]:
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers:
            raise UserError(f"{where}: 'layer_types' must list {n_layers} entries")
        return list(types)
    if mt == "gemma3_text":
        p = int(cfg["sliding_window_pattern"])
        return ["full_attention" if (i + 1) % p == 0 else "sliding_attention" for i in range(n_layers)]
    if mt == "qwen3_next":
        p = int(cfg["full_attention_interval"])
        return ["full_attention" if (i + 1) % p == 0 else "linear_attention" for i in range(n_layers)]
    if mt == "gpt_oss":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
    if cfg.get("use_sliding_window"):
        raise UserError(
            f"{where}: use_sliding_window=true (per-layer window by max_window_layers) "
            "is not modeled yet; expected use_sliding_window=false"
        )
    return ["full_attention"] * n_layers


def _quant_bytes(cfg: dict[str, Any], base: float) -> tuple[float, float]:
    """(dense GEMM bytes, routed-expert bytes) per weight from quantization_config."""
    q = cfg.get("quantization_config") or {}
    method = q.get("quant_method")
    if method is None:
        return base, base
    if method == "fp8":
        block = q.get("weight_block_size") or [128, 128]
        scale = 4.0 / (block[0] * block[1])  # one fp32 scale per block
        return 1.0 + scale, 1.0 + scale
    if method == "mxfp4":
        excluded = " ".join(q.get("modules_to_not_convert") or [])
        dense = base if "self_attn" in excluded else _DTYPE_BYTES["mxfp4"]
        return dense, _DTYPE_BYTES["mxfp4"]
    raise UserError(f"quantization_config.quant_method '{method}' is not modeled yet; expected fp8 or mxfp4")


def parse_hf_config(raw: dict[str, Any], name: str, where: str, sha: str = "") -> ModelSpec:
    """Turn a Hugging Face config dict (nested `text_config` allowed) into a ModelSpec."""
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a JSON object")
    cfg = dict(raw)
    if isinstance(raw.get("text_config"), dict):
        cfg = {k: v for k, v in raw.items() if k not in ("text_config", "vision_config")}
        cfg.update(raw["text_config"])
    mt = cfg.get("model_type")
    if mt == "gemma3":
        mt = "gemma3_text"
    if mt not in _FAMILY_DEFAULTS:
        raise UserError(
            f"{where}: model_type {mt!r} is not supported yet; expected one of "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    cfg = {**_FAMILY_DEFAULTS[mt], **{k: v for k, v in cfg.items() if v is not None}}
    hidden = _require(cfg, "hidden_size", where)
    n_layers = _require(cfg, "num_hidden_layers", where)
    vocab = _require(cfg, "vocab_size", where)
    n_heads = _require(cfg, "num_attention_heads", where)
    n_kv = int(cfg.get("num_key_value_heads", n_heads))
    head_dim = int(cfg.get("head_dim") or hidden // n_heads)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    base = _DTYPE_BYTES.get(dtype)
    if base is None:
        raise UserError(f"{where}: torch_dtype {dtype!r} not understood; expected bfloat16 or float16")
    dense_b, expert_b = _quant_bytes(cfg, base)
    types = _layer_types(cfg, mt, n_layers, where)

    n_experts = int(cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 0)
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0)
    if n_experts and not top_k:
        raise UserError(f"{where}: MoE config lacks 'num_experts_per_tok' (positive integer expected)")
    moe_inter = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
    if n_experts and mt == "gpt_oss":
        moe_inter = int(cfg["intermediate_size"])
    shared = 0
    if cfg.get("shared_expert_intermediate_size"):
        shared = int(cfg["shared_expert_intermediate_size"])
    elif cfg.get("n_shared_experts"):
        shared = int(cfg["n_shared_experts"]) * moe_inter
    first_dense = int(cfg.get("first_k_dense_replace") or 0)
    sparse_step = int(cfg.get("decoder_sparse_step") or cfg.get("moe_layer_freq") or 1)
    mlp_only = set(cfg.get("mlp_only_layers") or [])
    is_mla = bool(cfg.get("kv_lora_rank"))

    layers = []
    for i, lt in enumerate(types):
        if is_mla:
            att = AttentionSpec(
                kind="mla", n_heads=n_heads, n_kv_heads=n_heads,
                head_dim=int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"]),
                q_lora_rank=int(cfg.get("q_lora_rank") or 0), kv_lora_rank=int(cfg["kv_lora_rank"]),
                qk_nope_dim=int(cfg["qk_nope_head_dim"]), qk_rope_dim=int(cfg["qk_rope_head_dim"]),
                v_head_dim=int(cfg["v_head_dim"]),
            )
        elif lt == "linear_attention":
            att = AttentionSpec(
                kind="linear", n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
                lin_k_heads=_require(cfg, "linear_num_key_heads", where),
                lin_v_heads=_require(cfg, "linear_num_value_heads", where),
                lin_k_dim=_require(cfg, "linear_key_head_dim", where),
                lin_v_dim=_require(cfg, "linear_value_head_dim", where),
                conv_kernel=int(cfg.get("linear_conv_kernel_dim") or 4),
            )
        elif lt in ("full_attention", "sliding_attention"):
            window = None
            if lt == "sliding_attention":
                window = _require(cfg, "sliding_window", where)
            att = AttentionSpec(
                kind="full" if window is None else "sliding", n_heads=n_heads, n_kv_heads=n_kv,
                head_dim=head_dim, window=window,
                q_gate=mt == "qwen3_next",
                qk_norm=mt in ("qwen3", "qwen3_moe", "qwen3_next", "gemma3_text"),
                bias=bool(cfg.get("attention_bias")), sinks=mt == "gpt_oss",
            )
        else:
            raise UserError(f"{where}: layer type {lt!r} of layer {i} is not modeled yet")
        moe_here = n_experts > 0 and i >= first_dense and (i + 1) % sparse_step == 0 and i not in mlp_only
        if moe_here:
            mlp = MlpSpec(
                kind="moe", n_experts=n_experts, top_k=top_k, expert_intermediate=moe_inter,
                shared_intermediate=shared, shared_gate=mt == "qwen3_next", bias=mt == "gpt_oss",
            )
        else:
            mlp = MlpSpec(kind="dense", intermediate=_require(cfg, "intermediate_size", where))
        layers.append(LayerSpec(index=i, attention=att, mlp=mlp))
    return ModelSpec(
        name=name, model_type=mt, hidden_size=hidden, vocab_size=vocab,
        tie_embeddings=bool(cfg.get("tie_word_embeddings")), layers=tuple(layers),
        norms_per_layer=4 if mt == "gemma3_text" else 2,
        weight_bytes=dense_b, expert_weight_bytes=expert_b, act_bytes=base, kv_bytes=base,
        source_sha256=sha, max_context=int(cfg.get("max_position_embeddings") or 0),
    )


def bundled_models() -> list[str]:
    return sorted(p.stem for p in shipped_dir("models").glob("*.json"))


@cache
def load_model(name_or_path: str) -> ModelSpec:
    """Load a bundled model by name, or any Hugging Face config.json by path."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise UserError(f"--model: file '{name_or_path}' does not exist")
        name = path.parent.name if path.name == "config.json" else path.stem
    else:
        path = shipped_dir("models") / f"{name_or_path}.json"
        name = name_or_path
        if not path.is_file():
            known = bundled_models()
            close = difflib.get_close_matches(name_or_path, known, n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}?" if close else f"bundled: {', '.join(known)}"
            raise UserError(f"--model: unknown model '{name_or_path}'; {hint}")
    data = path.read_bytes()
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise UserError(f"{path}: malformed JSON ({exc.args[0].split(':')[0]})") from None
    return parse_hf_config(raw, name, str(path), hashlib.sha256(data).hexdigest())
