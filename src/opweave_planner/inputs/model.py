"""Model architecture, read from a Hugging Face `config.json` into a frozen spec.

Families are recognised by structure (attention kinds, MoE keys, MLA ranks);
`model_type` is only a hint for the few class defaults and per-family details
that configs omit. Every key read is type- and range-checked here, once, so a bad
config is rejected by name before anything runs; anything the planner cannot
model is rejected, never approximated.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import hashlib
import os
import re
import stat
import tomllib
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, Literal

import orjson

from opweave_planner.atomic import check_input_file
from opweave_planner.data import shipped_dir
from opweave_planner.errors import UserError, printable
from opweave_planner.frozen import Frozen
from opweave_planner.inputs.hf_cache import (
    HF_ID,
    cached_config,
    cached_ids,
    hf_hub_cache,
    repo_id,
    short_text,
)

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
# Any other model_type is read as a generic decoder with these class defaults.
_GENERIC_DEFAULTS: dict[str, Any] = {"tie_word_embeddings": False}
SUPPORTED_MODEL_TYPES = tuple(sorted(_FAMILY_DEFAULTS))  # with per-family details; others generic

# Bytes per weight element by storage format; mxfp4 carries one 8-bit scale per 32 values.
_DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0, "fp8": 1.0, "mxfp4": 4.25 / 8}


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
    # storage formats by name (the kernel tables are chosen by these, never guessed from bytes)
    act_dtype: str = "bfloat16"
    weight_dtype: str = "bfloat16"  # dense GEMM weights: bfloat16 | float16 | float32 | fp8_block | mxfp4
    expert_weight_dtype: str = "bfloat16"
    act_bytes: float = 2.0  # activations on the wire
    kv_bytes: float = 2.0  # KV cache / recurrent state element
    source_sha256: str = ""
    max_context: int = 0  # max_position_embeddings (0: unknown)
    # what the user gave as --model (a bundled name or Hugging Face id as typed, or the config
    # file's absolute path), so the same model can be loaded again
    source: str = ""

    @property
    def n_layers(self) -> int:
        return len(self.layers)


# Bounds no real model comes near; past them a plan could not be searched anyway.
MAX_LAYERS = 1024
MAX_SIZE = 1 << 24  # any width, head count, expert count or vocabulary
MAX_CONTEXT = 1 << 31
MAX_PARAMS = 1e14
MAX_CONFIG_BYTES = 16 << 20
_LAYER_KINDS = ("full_attention", "sliding_attention", "linear_attention")
_EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token")
_MISSING: Any = object()


def _show(value: Any) -> str:
    """A value as an error shows it: its repr, at most 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_kind(lo: int, hi: int | None = None) -> str:
    kind = "a positive integer" if lo == 1 else f"an integer >= {lo}"
    return kind if hi is None else f"{kind} at most {hi}"


class _Config:
    """A merged config (text_config folded in, class defaults beneath) with checked getters.

    Each getter rejects a wrong type or range with a one-line UserError naming the file and
    the field as the user wrote it (`text_config.head_dim` for a nested key).
    """

    def __init__(self, raw: dict[str, Any], where: str) -> None:
        self.where = where
        self.nested: set[str] = set()
        cfg = dict(raw)
        text = raw.get("text_config")
        if text is not None:
            if not isinstance(text, dict):
                raise self.bad("text_config", "an object", text)
            cfg = {k: v for k, v in raw.items() if k not in ("text_config", "vision_config")}
            cfg.update(text)
            self.nested = set(text)
        self.values = {k: v for k, v in cfg.items() if v is not None}

    def defaults(self, values: dict[str, Any]) -> None:
        self.values = {**values, **self.values}

    def has(self, key: str) -> bool:
        return key in self.values

    def label(self, key: str) -> str:
        head = re.split(r"[.\[]", key, maxsplit=1)[0]
        return f"text_config.{key}" if head in self.nested else key

    def bad(self, key: str, expected: str, value: Any) -> UserError:
        return UserError(f"{self.where}: {self.label(key)}: expected {expected}, got {_show(value)}")

    def missing(self, key: str, expected: str) -> UserError:
        return UserError(f"{self.where}: missing required key '{self.label(key)}' (expected {expected})")

    def integer(self, key: str, default: Any = _MISSING, lo: int = 1, hi: int = MAX_SIZE,
                expected: str | None = None) -> int:
        if key not in self.values:
            if default is _MISSING:
                raise self.missing(key, expected or _int_kind(lo))
            return default
        value = self.values[key]
        if not _is_int(value) or not lo <= value <= hi:
            too_big = _is_int(value) and value > hi
            raise self.bad(key, expected or _int_kind(lo, hi if too_big else None), value)
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.values.get(key, default)
        if not isinstance(value, bool):
            raise self.bad(key, "true or false", value)
        return value

    def string(self, key: str, default: str) -> str:
        value = self.values.get(key, default)
        if not isinstance(value, str):
            raise self.bad(key, "a string", value)
        return value

    def int_list(self, key: str, lo: int, hi: int, expected: str) -> list[int]:
        value = self.values.get(key, [])
        if not isinstance(value, list) or not all(_is_int(v) and lo <= v <= hi for v in value):
            raise self.bad(key, expected, value)
        return value

    def first_of(self, keys: tuple[str, ...], **limits: Any) -> tuple[str, int] | None:
        """(key, value) of the first of several synonymous keys present; all present must agree."""
        present = [(k, self.integer(k, **limits)) for k in keys if self.has(k)]
        for k, v in present[1:]:
            if v != present[0][1]:
                raise self.bad(k, f"the same value as {present[0][0]} ({present[0][1]})", v)
        return present[0] if present else None


def _dtype_name(c: _Config) -> str:
    return c.string("torch_dtype" if c.has("torch_dtype") else "dtype", "bfloat16")


def _dtype_bytes(c: _Config) -> float:
    key = "torch_dtype" if c.has("torch_dtype") else "dtype"
    dtype = c.string(key, "bfloat16")
    base = _DTYPE_BYTES.get(dtype)
    if base is None:
        raise c.bad(key, "bfloat16, float16 or float32", dtype)
    return base


def _quant(c: _Config, base: float, base_name: str) -> tuple[float, float, str, str]:
    """(dense GEMM bytes, routed-expert bytes, their format names) from quantization_config."""
    dense, expert = _quant_bytes(c, base)
    names = {base: base_name, _DTYPE_BYTES["mxfp4"]: "mxfp4"}
    return dense, expert, names.get(dense, "fp8_block"), names.get(expert, "fp8_block")


def _quant_bytes(c: _Config, base: float) -> tuple[float, float]:
    """(dense GEMM bytes, routed-expert bytes) per weight from quantization_config."""
    q = c.values.get("quantization_config", {})
    if not isinstance(q, dict):
        raise c.bad("quantization_config", "an object with quant_method", q)
    if not q:
        return base, base
    method = q.get("quant_method")
    if method is None:
        raise c.missing("quantization_config.quant_method", "fp8 or mxfp4")
    if method == "fp8":
        block = q.get("weight_block_size")
        if block is None:
            block = [128, 128]
        if not (isinstance(block, list) and len(block) == 2
                and all(_is_int(b) and 1 <= b <= MAX_SIZE for b in block)):
            raise c.bad("quantization_config.weight_block_size", "two positive integers", block)
        scale = 4.0 / (block[0] * block[1])  # one fp32 scale per block
        return 1.0 + scale, 1.0 + scale
    if method == "mxfp4":
        excluded = q.get("modules_to_not_convert") or []
        if not isinstance(excluded, list) or not all(isinstance(m, str) for m in excluded):
            raise c.bad("quantization_config.modules_to_not_convert", "a list of module names", excluded)
        dense = base if "self_attn" in " ".join(excluded) else _DTYPE_BYTES["mxfp4"]
        return dense, _DTYPE_BYTES["mxfp4"]
    expected = "fp8 or mxfp4 (others are not modeled yet)"
    raise c.bad("quantization_config.quant_method", expected, method)


def _layer_types(c: _Config, mt: str, n_layers: int) -> list[str]:
    """Each layer's attention kind: listed, or derived from a pattern field or the family."""
    if c.has("layer_types"):
        types = c.values["layer_types"]
        if not isinstance(types, list) or len(types) != n_layers:
            raise c.bad("layer_types", f"a list of {n_layers} layer types (num_hidden_layers)", types)
        for i, t in enumerate(types):
            if t not in _LAYER_KINDS:
                raise c.bad(f"layer_types[{i}]", "full_attention, sliding_attention or linear_attention "
                            "(others are not modeled yet)", t)
        return list(types)
    if c.has("sliding_window_pattern"):  # Gemma 3: every p-th layer is global
        p = c.integer("sliding_window_pattern")
        return ["full_attention" if (i + 1) % p == 0 else "sliding_attention" for i in range(n_layers)]
    if c.has("full_attention_interval"):  # Qwen3-Next: every p-th layer is full, the rest linear
        p = c.integer("full_attention_interval")
        return ["full_attention" if (i + 1) % p == 0 else "linear_attention" for i in range(n_layers)]
    if c.has("linear_num_value_heads"):
        raise c.missing("layer_types", "which layers are linear_attention: layer_types or "
                        "full_attention_interval")
    if mt == "gpt_oss":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
    if c.flag("use_sliding_window"):
        raise UserError(
            f"{c.where}: use_sliding_window=true (per-layer window by max_window_layers) "
            "is not modeled yet; expected use_sliding_window=false"
        )
    if mt not in _FAMILY_DEFAULTS and c.has("sliding_window") and not c.has("use_sliding_window"):
        return ["sliding_attention"] * n_layers  # Mistral-style: one window on every layer
    return ["full_attention"] * n_layers


def _attention_specs(c: _Config, mt: str, hidden: int, n_heads: int, n_kv: int,
                     kinds: set[str]) -> dict[str, AttentionSpec]:
    """The attention of each layer type in use; MLA (kv_lora_rank set) replaces them all."""
    if c.has("kv_lora_rank") or mt == "deepseek_v3":
        kv_lora = c.integer("kv_lora_rank")
        q_lora = c.integer("q_lora_rank", expected="a positive integer (MLA without a query "
                           "low-rank projection is not modeled yet)")
        nope, rope = c.integer("qk_nope_head_dim"), c.integer("qk_rope_head_dim")
        mla = AttentionSpec(
            kind="mla", n_heads=n_heads, n_kv_heads=n_heads, head_dim=nope + rope,
            q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_nope_dim=nope,
            qk_rope_dim=rope, v_head_dim=c.integer("v_head_dim"),
        )
        return dict.fromkeys(kinds, mla)
    if not c.has("head_dim") and hidden < n_heads:
        raise c.missing("head_dim", f"a positive integer; hidden_size {hidden} is smaller than "
                        f"num_attention_heads {n_heads}")
    head_dim = c.integer("head_dim", hidden // n_heads)
    common = {"n_heads": n_heads, "n_kv_heads": n_kv, "head_dim": head_dim}
    specs: dict[str, AttentionSpec] = {}
    if "linear_attention" in kinds:
        k_heads = c.integer("linear_num_key_heads")
        v_heads = c.integer("linear_num_value_heads",
                            expected=f"a positive multiple of linear_num_key_heads ({k_heads})")
        if v_heads % k_heads:
            raise c.bad("linear_num_value_heads",
                        f"a positive multiple of linear_num_key_heads ({k_heads})", v_heads)
        specs["linear_attention"] = AttentionSpec(
            kind="linear", **common, lin_k_heads=k_heads, lin_v_heads=v_heads,
            lin_k_dim=c.integer("linear_key_head_dim"), lin_v_dim=c.integer("linear_value_head_dim"),
            conv_kernel=c.integer("linear_conv_kernel_dim", 4),
        )
    softmax = {
        "q_gate": mt == "qwen3_next", "qk_norm": mt in ("qwen3", "qwen3_moe", "qwen3_next", "gemma3_text"),
        "bias": c.flag("attention_bias"), "sinks": mt == "gpt_oss",
    }
    if "full_attention" in kinds:
        specs["full_attention"] = AttentionSpec(kind="full", **common, **softmax)
    if "sliding_attention" in kinds:
        window = c.integer("sliding_window", hi=MAX_CONTEXT)
        specs["sliding_attention"] = AttentionSpec(kind="sliding", **common, window=window, **softmax)
    return specs


def _mlp_specs(c: _Config, mt: str, n_layers: int) -> tuple[MlpSpec | None, set[int]]:
    """The routed-expert MLP (None: dense model) and the layers that use it."""
    experts = c.first_of(_EXPERT_KEYS)
    if experts is None:
        return None, set()
    n_key, n_experts = experts
    top = c.first_of(_TOP_K_KEYS, hi=n_experts, expected=f"a positive integer at most {n_key} ({n_experts})")
    if top is None:
        raise c.missing("num_experts_per_tok", f"a positive integer at most {n_key} ({n_experts})")
    if mt == "gpt_oss" or not c.has("moe_intermediate_size"):
        moe_inter = c.integer("intermediate_size")
    else:
        moe_inter = c.integer("moe_intermediate_size")
    shared = c.integer("shared_expert_intermediate_size", 0, lo=0)
    if not shared:
        shared = c.integer("n_shared_experts", 0, lo=0) * moe_inter
    first_dense = c.integer("first_k_dense_replace", 0, lo=0, hi=n_layers)
    step_key = "decoder_sparse_step" if c.has("decoder_sparse_step") else "moe_layer_freq"
    step = c.integer(step_key, 1, hi=n_layers)
    mlp_only = set(c.int_list("mlp_only_layers", 0, n_layers - 1,
                              f"a list of layer indices below num_hidden_layers ({n_layers})"))
    moe = MlpSpec(
        kind="moe", n_experts=n_experts, top_k=top[1], expert_intermediate=moe_inter,
        shared_intermediate=shared, shared_gate=mt == "qwen3_next", bias=mt == "gpt_oss",
    )
    return moe, {i for i in range(first_dense, n_layers) if (i + 1) % step == 0 and i not in mlp_only}


def _rough_params(hidden: int, vocab: int, layers: list[LayerSpec]) -> float:
    """An upper-bound-style parameter count, only to reject implausible sizes early."""
    total = 2.0 * vocab * hidden
    for lay in layers:
        a, f = lay.attention, lay.mlp
        if a.kind == "mla":
            total += hidden * (a.q_lora_rank + a.kv_lora_rank + a.qk_rope_dim) + a.n_heads * (
                a.q_lora_rank * a.head_dim + a.kv_lora_rank * (a.qk_nope_dim + a.v_head_dim)
                + a.v_head_dim * hidden)
        elif a.kind == "linear":
            total += hidden * (2 * a.lin_k_heads * a.lin_k_dim + 3 * a.lin_v_heads * a.lin_v_dim)
        else:
            total += 2.0 * hidden * a.head_dim * (a.n_heads + a.n_kv_heads)
        total += 3.0 * hidden * (f.intermediate + f.n_experts * f.expert_intermediate + f.shared_intermediate)
    return total


def _check_decoder_only(c: _Config) -> None:
    """A config of an unknown model_type is read generically only if it is a causal decoder."""
    if c.flag("is_encoder_decoder"):
        raise c.bad("is_encoder_decoder", "false (only decoder-only models are modeled)", True)
    archs = c.values.get("architectures", [])
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise c.bad("architectures", "a list of class names", archs)
    if archs and not any(a.endswith(("ForCausalLM", "ForConditionalGeneration")) for a in archs):
        raise c.bad("architectures", "a decoder-only ...ForCausalLM architecture", archs)


def parse_hf_config(raw: Any, name: str, where: str, sha: str = "", source: str = "") -> ModelSpec:
    """Turn a Hugging Face config dict (nested `text_config` allowed) into a ModelSpec."""
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a JSON object")
    c = _Config(raw, where)
    mt = c.string("model_type", "")
    if mt == "gemma3":
        mt = "gemma3_text"
    if mt not in _FAMILY_DEFAULTS:
        _check_decoder_only(c)
    c.defaults(_FAMILY_DEFAULTS.get(mt, _GENERIC_DEFAULTS))
    hidden = c.integer("hidden_size")
    n_layers = c.integer("num_hidden_layers", hi=MAX_LAYERS)
    vocab = c.integer("vocab_size")
    n_heads = c.integer("num_attention_heads")
    divides = f"a positive integer dividing num_attention_heads ({n_heads})"
    n_kv = c.integer("num_key_value_heads", n_heads, expected=divides)
    if n_heads % n_kv:
        raise c.bad("num_key_value_heads", divides, n_kv)
    base = _dtype_bytes(c)
    dense_b, expert_b, dense_name, expert_name = _quant(c, base, _dtype_name(c))
    types = _layer_types(c, mt, n_layers)
    attention = _attention_specs(c, mt, hidden, n_heads, n_kv, set(types))
    moe, moe_layers = _mlp_specs(c, mt, n_layers)
    dense = None
    if len(moe_layers) < n_layers:
        dense = MlpSpec(kind="dense", intermediate=c.integer("intermediate_size"))
    layers = [LayerSpec(index=i, attention=attention[lt], mlp=moe if i in moe_layers else dense)
              for i, lt in enumerate(types)]
    params = _rough_params(hidden, vocab, layers)
    if params > MAX_PARAMS:
        raise UserError(f"{where}: hidden_size, num_hidden_layers, vocab_size and the head, FFN and "
                        f"expert sizes describe about {params:.2g} parameters; expected at most "
                        f"{MAX_PARAMS:.0e}")
    return ModelSpec(
        name=name, model_type=mt, hidden_size=hidden, vocab_size=vocab,
        tie_embeddings=c.flag("tie_word_embeddings"), layers=tuple(layers),
        norms_per_layer=4 if mt == "gemma3_text" else 2,
        weight_bytes=dense_b, expert_weight_bytes=expert_b, act_bytes=base, kv_bytes=base,
        act_dtype=_dtype_name(c), weight_dtype=dense_name, expert_weight_dtype=expert_name,
        source_sha256=sha, max_context=c.integer("max_position_embeddings", 0, lo=0, hi=MAX_CONTEXT),
        source=source,
    )


# ----------------------------------------------------------------------------- finding a config

_EXPECTED_MODEL = "a bundled model name, a Hugging Face id or a path to a config.json"


def bundled_models() -> list[str]:
    return sorted(p.stem for p in shipped_dir("models").glob("*.json"))


@cache
def bundled_hf_ids() -> dict[str, list[str]]:
    """Bundled name -> the Hugging Face ids it answers to (models/hf_ids.toml)."""
    table = tomllib.loads((shipped_dir("models") / "hf_ids.toml").read_text())["hf_ids"]
    return {name: list(ids) for name, ids in table.items()}


@cache
def _bundled_names() -> dict[str, str]:
    """Every lower-cased name or HF id a bundled config answers to -> its bundled name."""
    names = {n.lower(): n for n in bundled_models()}
    for name, ids in bundled_hf_ids().items():
        names.update({i.lower(): name for i in ids})
    return names


@cache
def _bundled_by_sha() -> dict[str, str]:
    return {hashlib.sha256(p.read_bytes()).hexdigest(): p.stem
            for p in shipped_dir("models").glob("*.json")}


def _file_kind(path: Path, text: str) -> str | None:
    """'file', 'dir' or None (nothing there: a model name or Hub id, perhaps) without opening
    anything; a special file, a dangling link, a loop or a bad path on the way is refused by the
    one input check with its real reason (a plain name that is no path is left to the lookup)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if not os.path.islink(path):
            return None
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG and os.sep not in text:
            return None
    else:
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
            return "file" if stat.S_ISREG(mode) else "dir"
    check_input_file(path, "--model")  # raises with the reason
    raise UserError(f"--model: '{short_text(text)}' is not a regular file; expected a config.json")


def _unknown(text: str) -> UserError:
    names = bundled_models()
    ids = sorted({i for v in bundled_hf_ids().values() for i in v} | set(cached_ids()))
    by_lower = {p.lower(): p for p in names + ids}
    close = difflib.get_close_matches(text.lower(), list(by_lower), n=3, cutoff=0.5)
    hint = (f"did you mean {', '.join(by_lower[c] for c in close)}?" if close
            else f"expected {_EXPECTED_MODEL}; bundled: {', '.join(names)}")
    where = ""
    if "/" in text and HF_ID.fullmatch(text):
        where = f" (not bundled and not in the local Hugging Face cache {hf_hub_cache()}; nothing is downloaded)"
    return UserError(f"--model: unknown model '{short_text(text)}'{where}; {hint}")


def _locate(text: str) -> tuple[Path, str | None, str]:
    """(config file, its name or None to derive one, source) for a --model value; nothing is opened."""
    if isinstance(text, os.PathLike):
        text = os.fspath(text)
    if not isinstance(text, str):
        raise UserError(f"--model: expected {_EXPECTED_MODEL}, got {_show(text)}")
    if not text.strip():
        raise UserError(f"--model: empty; expected {_EXPECTED_MODEL}")
    if "\0" in text:
        raise UserError(f"--model: {short_text(text)!r} contains a NUL character; expected {_EXPECTED_MODEL}")
    if printable(text) != text:  # the file's name becomes the model's, written into plans and scripts
        raise UserError(f"--model: {short_text(text)!r} holds a control character (a newline, ...); expected "
                        f"{_EXPECTED_MODEL} as one line of printable text: rename the file")
    path = Path(text)
    with contextlib.suppress(RuntimeError):  # ~user of an unknown user: taken literally
        path = path.expanduser()
    kind = _file_kind(path, text)
    if kind == "dir":
        inner = path / "config.json"
        if _file_kind(inner, text) != "file":
            raise UserError(f"--model: '{short_text(text)}' is not a regular file (a directory without "
                            "config.json); expected a config.json or a folder holding one")
        return inner, None, os.path.abspath(inner)
    if kind == "file":
        return path, None, os.path.abspath(path)
    if path.suffix.lower() == ".json" or text.startswith(("/", ".", "~")) or not HF_ID.fullmatch(text):
        if os.sep in text or path.suffix.lower() == ".json":
            raise UserError(f"--model: file '{short_text(text)}' does not exist")
        raise _unknown(text)
    name = _bundled_names().get(text.lower())
    if name is not None:
        return shipped_dir("models") / f"{name}.json", name, text
    cfg = cached_config(text)
    if cfg is None:
        raise _unknown(text)
    return cfg, repo_id(cfg.parts[-4]), text


def _read(path: Path, where: str) -> bytes:
    """The file's bytes, refusing anything but a regular file of sane size (never blocks on a FIFO:
    opened without blocking, then checked on the descriptor)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise UserError(f"{where}: is not a regular file; expected a config.json")
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise UserError(f"{where}: cannot read the model config ({exc.strerror or exc})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise UserError(f"{where}: larger than {MAX_CONFIG_BYTES >> 20} MiB; expected a config.json")
    return data


def _derive_name(path: str, raw: Any, sha: str) -> str:
    """A name for a config given by path that does not depend on the folder holding it.

    Byte-identical to a bundled config: that name; in a hub-cache snapshot: the repository id;
    a file called other than config.json: its stem (plus a hash if a bundled model is called
    that); else `<model_type>-<12 hex digits of its SHA-256>`.
    """
    if sha in _bundled_by_sha():
        return _bundled_by_sha()[sha]
    p = Path(path)
    if p.name == "config.json" and len(p.parts) >= 4 and p.parts[-3] == "snapshots" \
            and p.parts[-4].startswith("models--"):
        return repo_id(p.parts[-4])
    if p.name != "config.json":
        return f"{p.stem}-{sha[:8]}" if p.stem.lower() in _bundled_names() else p.stem
    text = raw.get("text_config") if isinstance(raw, dict) else None
    mt = (text if isinstance(text, dict) else raw if isinstance(raw, dict) else {}).get("model_type")
    label = mt if isinstance(mt, str) and re.fullmatch(r"[\w.-]{1,64}", mt) else "model"
    return f"{label}-{sha[:12]}"


@lru_cache(maxsize=64)
def _spec(data: bytes, name: str | None, where: str, source: str) -> ModelSpec:
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise UserError(f"{where}: malformed JSON ({exc.args[0].split(':')[0]})") from None
    sha = hashlib.sha256(data).hexdigest()
    return parse_hf_config(raw, name or _derive_name(source, raw, sha), where, sha, source)


def load_model(name_or_path: str) -> ModelSpec:
    """Load a model by bundled name, Hugging Face id (bundled or in the local cache) or config path.

    `source` records what was given (a file as its absolute path) so a plan can load it again.
    """
    path, name, source = _locate(name_or_path)
    where = str(path)
    return _spec(_read(path, where), name, where, source)
