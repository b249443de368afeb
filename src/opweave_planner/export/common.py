"""What every exporter shares: the loaded plan, placement, refusals, alternatives, YAML and scripts.

An exporter turns a plan into files for one runtime. It first decides whether that runtime can
run the plan's shape at all (`Refusal`, exit 3, one line naming why and what could run), then
renders bytes only from the plan and pinned per-version flag tables, so the same plan always
gives the same files.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from opweave_planner.atomic import printable
from opweave_planner.errors import InfeasibleError, InternalError, UserError

# Hugging Face repositories of the bundled models (models/SOURCES.md; a test keeps them equal).
# `hf_repo` prefers the model loader's own table where it has one (models/hf_ids.toml).
HF_REPOS = {
    "gemma-3-27b": "google/gemma-3-27b-it",
    "gemma-3-12b": "google/gemma-3-12b-it",
    "qwen3-next-80b-a3b": "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
}



def hf_repo(model: str) -> str | None:
    """The Hugging Face repository a bundled model's config was taken from, else None."""
    from opweave_planner.inputs import model as model_inputs

    table = getattr(model_inputs, "bundled_hf_ids", None)
    if table is not None:
        ids = table().get(model)
        if ids:
            return ids[0]
    return HF_REPOS.get(model)


# Kubernetes node label set by NVIDIA GPU feature discovery, and its value per catalog GPU id.
GPU_LABEL_KEY = "nvidia.com/gpu.product"
GPU_PRODUCTS = {
    "h100": "NVIDIA-H100-80GB-HBM3",
    "a100": "NVIDIA-A100-SXM4-80GB",
    "l40s": "NVIDIA-L40S",
    "h200": "NVIDIA-H200",
    "h20": "NVIDIA-H20",
    "b200": "NVIDIA-B200",
}

BASE_PORT = 8000  # the router (or the only replica) listens here; replica r of several on 8001 + r
BENCH_OUTPUT_TOKENS = 256  # decode tokens per benchmark request (the rest of the context is prompt)

# Alternative classes a plan file may carry (issue 15 item 1), in the order they are suggested.
ALTERNATIVE_NAMES = ("colocated", "two_owner", "single_gpu_type", "optimum")
_ALIASES = {"colocated": "colocated", "twoowner": "two_owner", "twostage": "two_owner", "max2stages": "two_owner",
            "le2stages": "two_owner", "2stage": "two_owner", "afd": "two_owner", "singlegputype": "single_gpu_type",
            "homogeneous": "single_gpu_type", "optimum": "optimum"}


class Refusal(InfeasibleError):
    """The target runtime cannot run this plan's shape (exit 3)."""


@dataclass(frozen=True)
class Replica:
    """One device group of an owner, placed on a node of its GPU type."""

    owner: int
    index: int
    node: int  # node number, counted across all owners (see Context._placement)
    devices: tuple[int, ...]  # CUDA device indices on that node

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(d) for d in self.devices)


@dataclass
class Context:
    """Everything an exporter may read: the plan, its raw JSON and the resolved options."""

    plan: Any  # opweave_planner.plan.Plan
    raw: dict[str, Any]
    path: str
    target: str
    version: str
    model_id: str
    spec: Any  # ModelSpec or None when the plan's model cannot be loaded
    hw: Any  # Hardware (the shipped catalog plus --catalog)
    labels: dict[str, str] = field(default_factory=dict)  # GPU id -> node label value
    image: str | None = None
    alternative: str | None = None  # the alternative being exported, if any
    base_cost: float | None = None  # cost of the file's main plan (for deltas)

    def gpu(self, gid: str):
        return self.hw.resolve(gid, f"{self.path}: owners[].gpu")

    def placement(self, owner) -> list[Replica]:
        return self._placement[owner.index]

    @cached_property
    def _placement(self) -> dict[int, list[Replica]]:
        """Every owner's groups on numbered nodes, TP groups never split across nodes.

        When the plan's stages hand off inside one node (one GPU type, every GPU in one node, as
        the planner's link model assumed) all owners share node 0, owners' devices in order;
        otherwise each owner's groups fill their own nodes first fit, nodes numbered across owners.
        """
        plan = self.plan
        gpn = {o.index: self.gpu(o.gpu).gpus_per_node for o in plan.owners}
        shared = (len({o.gpu for o in plan.owners}) == 1 and plan.gpus_total <= gpn[0])
        out: dict[int, list[Replica]] = {}
        first_node = offset = 0
        for o in plan.owners:
            tp = o.tensor_parallel
            per_node = max(1, gpn[o.index] // tp)
            reps = []
            for r in range(o.replicas):
                if shared:
                    reps.append(Replica(o.index, r, 0, tuple(range(offset, offset + tp))))
                    offset += tp
                else:
                    local = (r % per_node) * tp
                    reps.append(Replica(o.index, r, first_node + r // per_node, tuple(range(local, local + tp))))
            out[o.index] = reps
            if not shared:
                first_node += math.ceil(o.replicas / per_node)
        return out

    def memory_fraction(self, owner) -> float:
        """Share of GPU memory the runtime may take: what the planner treated as usable.

        The planner keeps `memory_reserve_gb` GiB per GPU for the framework (per GPU type when the
        plan records `memory_reserve_gb_by_gpu`, schema 1.5); the runtime's own
        budget (weights + KV + activations) is the rest, rounded down to 0.01 and capped at 0.95.
        """
        cap = self.gpu(owner.gpu).memory_bytes
        reserve = self.plan.search.space.reserve_gb(owner.gpu) * 2**30  # what the search held back there
        return min(0.95, math.floor((cap - reserve) / cap * 100) / 100)

    def node_label(self, gid: str) -> str:
        if gid in self.labels:
            return self.labels[gid]
        if gid in GPU_PRODUCTS:
            return GPU_PRODUCTS[gid]
        raise UserError(f"--node-label: no {GPU_LABEL_KEY} value known for GPU type '{gid}'; "
                        f"pass --node-label {gid}=VALUE")

    @property
    def slug(self) -> str:
        """A DNS-1035 label for the deployment (model and GPU count): Services are named after it."""
        name = re.sub(r"[^a-z0-9-]+", "-", f"{self.plan.model}-{self.plan.gpus_total}gpu".lower()).strip("-")
        if not name[:1].isalpha():
            name = f"m-{name}"
        return name[:52].rstrip("-")


# ----------------------------------------------------------------------------- names where they enter

# A Hugging Face repository id as the Hub accepts one (huggingface_hub's validate_repo_id, ASCII):
# `org/name`, or a legacy root id such as `gpt2`; each part letters, digits, '_', '-', '.',
# starting and ending with a letter, digit or '_', no '--' or '..', at most 96 characters a part.
_HF_PART = r"(?!.*(?:--|\.\.))[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_HF_REPO_ID = re.compile(rf"(?:{_HF_PART}/)?{_HF_PART}")
MAX_MODEL_ID = 4096  # PATH_MAX
MODEL_ID_EXPECTED = ("a Hugging Face repo id (org/name or a root id such as gpt2: letters, digits, "
                     "'-', '_', '.') or a weights path (absolute, or starting with ./ or ../)")


def check_model_id(mid: Any, field: str = "--model-id") -> str:
    """The model a script serves: a Hub repo id or a path, so a runtime never reads it as an option,
    and one printable line, so no script or manifest holding it can be made to say more."""
    if not isinstance(mid, str) or not mid:
        raise UserError(f"{field}: empty; expected {MODEL_ID_EXPECTED}")
    if not clean(mid):
        raise UserError(f"{field}: '{shown(mid)}' holds a control character (a newline, NUL, ...); "
                        f"expected {MODEL_ID_EXPECTED}")
    if len(mid) > MAX_MODEL_ID:
        raise UserError(f"{field}: {len(mid)} characters; expected at most {MAX_MODEL_ID}, "
                        f"{MODEL_ID_EXPECTED}")
    if mid.startswith("-"):
        raise UserError(f"{field}: '{shown(mid)}' starts with '-' (a runtime would read it as an option); "
                        f"expected {MODEL_ID_EXPECTED}")
    if mid.startswith(("/", "./", "../")) or (_HF_REPO_ID.fullmatch(mid) and not mid.endswith(".git")):
        return mid
    raise UserError(f"{field}: '{shown(mid)}' is not {MODEL_ID_EXPECTED}")


def check_text(value: Any, where: str, what: str) -> None:
    """A name a plan file or an option gives that exports write into comments, manifests or the
    terminal: one line of printable text (other types are left to the schema's own check)."""
    if isinstance(value, str) and not clean(value):
        raise UserError(f"{where}: '{shown(value)}' holds a control character (a newline, NUL, ...); "
                        f"expected {what} as one line of printable text")


def check_plan_names(doc: Any, path: str, prefix: str = "") -> None:
    """The plan's strings that reach the files (model, policy, GPU types), checked on the raw
    document before anything else reads it; errors name the file and the field (`prefix`: where
    an alternative's plan sits in the file)."""
    if not isinstance(doc, dict):
        return
    where = f"{path}: {prefix}"
    check_text(doc.get("model"), f"{where}model", "a model name")
    check_text(doc.get("policy"), f"{where}policy", "a policy name")
    owners = doc.get("owners")
    for i, owner in enumerate(owners if isinstance(owners, list) else []):
        if isinstance(owner, dict):
            check_text(owner.get("gpu"), f"{where}owners[{i}].gpu", "a GPU type")


def shape_words(plan) -> str:
    """'a 20-stage operator pipeline over 3 owners' / 'a 2-stage plan' / 'a colocated plan'."""
    k = len(plan.owners)
    if plan.num_stages == 1:
        return "a colocated plan"
    return f"a {plan.num_stages}-stage operator pipeline over {k} owner{'s' if k != 1 else ''}"


def is_colocated(plan) -> bool:
    return plan.num_stages == 1 and len(plan.owners) == 1


# ----------------------------------------------------------------------------- alternatives

def normalise_alternative(name: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    if key not in _ALIASES:
        raise UserError(f"--alternative: unknown alternative '{name}'; expected one of "
                        f"{', '.join(ALTERNATIVE_NAMES)}")
    return _ALIASES[key]


def alternatives(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The plan file's `alternatives` section, read defensively (absent before schema 1.2).

    Accepts `{name: entry}` or `[{name|class: ..., ...}]`; an entry is the alternative plan itself
    or a summary with `usd_per_million_tokens` and optionally the plan under `plan`.
    """
    section = raw.get("alternatives")
    out: dict[str, dict[str, Any]] = {}
    if isinstance(section, dict):
        items = list(section.items())
    elif isinstance(section, list):
        items = [(e.get("name") or e.get("class") or e.get("kind"), e) for e in section if isinstance(e, dict)]
    else:
        return out
    for name, entry in items:
        if not isinstance(name, str) or not isinstance(entry, dict):
            continue
        try:
            out[normalise_alternative(name)] = entry
        except UserError:
            continue
    return out


# Keys an embedded alternative may leave to the main plan: the same request, inputs and search.
INHERITED_KEYS = ("schema_version", "model", "workload", "search", "provenance")


def alternative_plan(entry: dict[str, Any], main: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The full plan object of an alternative entry, if it embeds one.

    Keys it omits that describe the request rather than the placement (`INHERITED_KEYS`) are
    taken from the main plan file `main`.
    """
    if isinstance(entry.get("plan"), dict):
        plan = entry["plan"]
    elif "stages" in entry and "owners" in entry:
        plan = {k: v for k, v in entry.items() if k not in ("name", "class", "kind", "cost_delta_pct",
                                                            "tpot_delta_pct")}
    else:
        return None
    if main:
        plan = {**{k: main[k] for k in INHERITED_KEYS if k in main and k not in plan}, **plan}
    return plan


def cost_delta(entry: dict[str, Any], base_cost: float | None) -> str:
    """'+0.6 %' from the entry's own delta, or its cost against the main plan's."""
    for key in ("cost_delta_pct", "cost_delta_percent", "usd_delta_pct"):
        if isinstance(entry.get(key), (int, float)):
            return f"{entry[key]:+.1f} %"
    plan = alternative_plan(entry) or {}
    cost = entry.get("usd_per_million_tokens", plan.get("usd_per_million_tokens"))
    if isinstance(cost, (int, float)) and base_cost:
        return f"{(cost / base_cost - 1) * 100:+.1f} %"
    return "cost unknown"


# ----------------------------------------------------------------------------- the shell writer
#
# Every generated script is code people run as root, so it is written from three kinds of line
# only: comments (`comment`: any text, made one printable line), fixed template lines whose only
# interpolations are checked integers (`integer`), and commands and assignments whose every word
# goes through `quote`. `quote` single-quotes any `str` (shlex.quote), so no input string can
# expand, end a quote or start a new command; the only expansions a script makes are `Var`s, which
# input never is: exporter code names them, and their names and defaults are plain words.

_VAR_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
_VAR_TEXT = re.compile(r"[A-Za-z0-9 ._/-]*")  # a `${NAME:-default}` or `${NAME:?message}` argument


class Var:
    """A `${NAME}` (`${NAME:-default}`, `${NAME:?message}`) the script expands on purpose.

    Checked on construction, so even exporter code cannot hide a command substitution in one.
    """

    __slots__ = ("text",)

    def __init__(self, name: str, default: str | None = None, required: str | None = None) -> None:
        if not _VAR_NAME.fullmatch(name) or (default is not None and required is not None):
            raise ValueError(f"not a script variable: {name!r}")
        op, arg = (":-", default) if default is not None else (":?", required) if required is not None \
            else ("", "")
        if not _VAR_TEXT.fullmatch(arg):
            raise ValueError(f"not a plain default or message: {arg!r}")
        self.text = "${" + name + op + arg + "}"

    def __repr__(self) -> str:
        return f"Var({self.text})"


class Word(tuple):
    """One shell word joined from fixed text and `Var`s, e.g. `"http://${HOST}:${PORT}"`."""

    def __new__(cls, *parts: str | Var) -> Word:
        return super().__new__(cls, parts)


ShellWord = str | Var | Word
_DOUBLE_QUOTED = str.maketrans({c: "\\" + c for c in '\\"$`'})


def quote(word: ShellWord) -> str:
    """The word as bash reads it back unchanged: any `str` single-quoted (it never expands), a
    `Var` or `Word` double-quoted with everything but its `Var`s escaped."""
    if isinstance(word, Var):
        return f'"{word.text}"'
    if isinstance(word, Word):
        return '"' + "".join(p.text if isinstance(p, Var) else _plain(p).translate(_DOUBLE_QUOTED)
                             for p in word) + '"'
    return shlex.quote(_plain(word))


def _plain(text: str) -> str:
    """A string may become a script word if it is one line of printable text: a NUL cannot be in a
    script at all, and a control character would hide the word from a reader of the file."""
    if not isinstance(text, str) or not clean(text):
        raise InternalError(f"generated script: refused the word {printable(str(text))!r}; input "
                            f"names are checked where they enter")
    return text


def clean(text: str) -> bool:
    """One line of text a terminal shows as it is: nothing `printable` would escape (no control
    character, line separator or bidi override)."""
    return printable(text) == text


def shown(text: str, limit: int = 80) -> str:
    """A user's value as an error line quotes it: printable, and cut to `limit` characters."""
    text = printable(text)
    return text if len(text) <= limit else f"{text[:limit - 20]}... ({len(text)} characters)"


def comment(text: str) -> str:
    return "# " + printable(text)


def integer(value: Any) -> str:
    """An int for a template line; anything else (a string from a tampered plan) is a bug here."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InternalError(f"generated script: expected an integer, got {type(value).__name__}")
    return str(value)


def number(value: Any) -> str:
    """A plan figure as a script word: the repr of a real number, never text."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InternalError(f"generated script: expected a number, got {type(value).__name__}")
    return repr(value)


def assign(name: str, value: ShellWord, note: str = "") -> str:
    """`NAME=value` (`export NAME=value` for a name the runtime reads), quoted like any word."""
    Var(name)  # the name is checked like a Var's
    return f"{name}={quote(value)}" + (f"  {comment(note)}" if note else "")


def _is_flag(word: ShellWord) -> bool:
    return isinstance(word, str) and word.startswith("-")


def shell_command(argv: list[ShellWord], indent: str = "  ") -> str:
    """One argument (or flag with its value) per continued line, every word through `quote`."""
    i = 0
    while i < len(argv) and (not _is_flag(argv[i]) or (argv[i] == "-m" and i == 1)):
        i += 1 + (argv[i] == "-m")
    parts: list[str] = [" ".join(quote(w) for w in argv[:i])] if i else []
    while i < len(argv):
        word = argv[i]
        if _is_flag(word) and i + 1 < len(argv) and not _is_flag(argv[i + 1]):
            parts.append(f"{quote(word)} {quote(argv[i + 1])}")
            i += 2
        else:
            parts.append(quote(word))
            i += 1
    return (" \\\n" + indent).join(parts)


def script(lines: list[str]) -> bytes:
    """The script file; a last check that no line holds a control character (only `quote`d words,
    `comment`s and template lines reach here, so one would be a bug in this package)."""
    text = "#!/usr/bin/env bash\n" + "\n".join(lines).rstrip("\n") + "\n"
    if not all(clean(line) for line in text.split("\n")):
        raise InternalError("generated script: a line holds a control character")
    return text.encode()


def header(ctx: Context, what: str) -> list[str]:
    """What the script is and which plan it came from, as comments (names made printable)."""
    p = ctx.plan
    alt = f", alternative '{ctx.alternative}'" if ctx.alternative else ""
    return [
        comment(what),
        comment(f"Generated by opweave-plan export --to {ctx.target} (runtime {ctx.version}) from {p.model} "
                f"plan ({p.policy}{alt}):"),
        comment(f"  {integer(p.gpus_total)} GPUs, global batch {integer(p.global_batch)}, context "
                f"{integer(p.workload.context_tokens)} tokens, predicted TPOT {p.tpot_ms:.6g} ms (SLO "
                f"{p.workload.tpot_slo_ms:g} ms)."),
        "set -euo pipefail",
    ]


def json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")


def to_yaml(obj: Any) -> bytes:
    """Block-style YAML of dicts/lists/scalars, keys in insertion order, strings double-quoted.

    Deterministic and dependency-free; every string is a double-quoted scalar with every
    non-printable character escaped, so no value is ever re-typed by a YAML reader (`"1"` stays a
    string, `"on"` is not a boolean) and none can break a line (YAML also breaks at U+2028).
    """
    lines: list[str] = []
    if isinstance(obj, dict):
        _yaml_map(obj, 0, lines)
    elif isinstance(obj, list):
        _yaml_list(obj, 0, lines)
    else:
        lines.append(_yaml_scalar(obj))
    return ("\n".join(lines) + "\n").encode()


def _yaml_string(text: str) -> str:
    """A YAML double-quoted scalar: `\\`, `"` and every non-printable character escaped."""
    out = []
    for c in text:
        if c in '\\"':
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        else:
            n = ord(c)
            out.append(f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")
    return '"' + "".join(out) + '"'


def _yaml_scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format(v, ".9g") if math.isfinite(v) else ".nan" if v != v else ".inf" if v > 0 else "-.inf"
    if isinstance(v, str):
        return _yaml_string(v)
    if isinstance(v, dict) and not v:
        return "{}"
    if isinstance(v, list) and not v:
        return "[]"
    raise TypeError(f"cannot write {type(v).__name__} as YAML")


def _yaml_key(k: str) -> str:
    plain = _PLAIN_KEY.fullmatch(k) and k.lower() not in ("true", "false", "null", "yes", "no", "on", "off")
    return k if plain else _yaml_string(k)


_IMPLICIT_KEY_MAX = 1000  # YAML limits an implicit key to 1024 characters; past that `? key` is explicit


def _yaml_map(d: dict, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    for k, v in d.items():
        key = _yaml_key(str(k))
        if len(key) > _IMPLICIT_KEY_MAX:  # `? key` on its line, then `: value`
            lines.append(f"{pad}? {key}")
            key = ""
        if isinstance(v, dict) and v:
            lines.append(f"{pad}{key}:")
            _yaml_map(v, indent + 2, lines)
        elif isinstance(v, list) and v:
            lines.append(f"{pad}{key}:")
            _yaml_list(v, indent + 2, lines)
        else:
            lines.append(f"{pad}{key}: {_yaml_scalar(v)}")


def _yaml_list(items: list, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    for item in items:
        if isinstance(item, dict) and item:
            sub: list[str] = []
            _yaml_map(item, indent + 2, sub)
            lines.append(f"{pad}- {sub[0].lstrip()}")
            lines.extend(sub[1:])
        elif isinstance(item, list) and item:
            raise TypeError("nested lists are not written")
        else:
            lines.append(f"{pad}- {_yaml_scalar(item)}")


# The benchmark's comparison, a fixed Python program fed as a quoted here-doc (`<<'EOF'`: nothing in
# it expands); the figures it compares reach it as quoted arguments, never as program text.
_HEREDOC_END = "EOF"
_COMPARE = (
    "import json, sys",
    "path, predicted, slo = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])",
    "with open(path) as fh:",
    "    lines = [ln for ln in fh.read().splitlines() if ln.strip()]",
    "r = json.loads(lines[-1])  # a JSON file, or the last record of a JSONL file",
    "p50, p95 = float(r[{p50!r}]), float(r[{p95!r}])",
    'print(f"TPOT p50 {{p50:.2f}} ms, p95 {{p95:.2f}} ms; plan predicts {{predicted:.2f}} ms "',
    '      f"(p50 {{100 * (p50 / predicted - 1):+.1f}} %), SLO {{slo:g}} ms: "',
    '      f"{{\'met\' if p95 <= slo else \'MISSED\'}} at p95")',
)
_RESULT_KEY = re.compile(r"[a-z0-9_]+")


def compare_tpot_snippet(plan, p50_key: str, p95_key: str, result: ShellWord) -> list[str]:
    """Bash lines that read the benchmark's JSON result and print measured vs predicted TPOT."""
    if not (_RESULT_KEY.fullmatch(p50_key) and _RESULT_KEY.fullmatch(p95_key)):
        raise InternalError(f"benchmark result keys {p50_key!r}, {p95_key!r} are not plain names")
    body = [line.format(p50=p50_key, p95=p95_key) for line in _COMPARE]
    if _HEREDOC_END in body:
        raise InternalError("the benchmark's here-doc holds its own terminator")
    argv = ["python3", "-", result, number(plan.tpot_ms), number(plan.workload.tpot_slo_ms)]
    return [" ".join(quote(w) for w in argv) + f" <<'{_HEREDOC_END}'", *body, _HEREDOC_END]


def bench_env(plan) -> list[str]:
    """The benchmark's workload: `global_batch` concurrent requests filling the plan's context."""
    ctx_tokens = plan.workload.context_tokens
    out = min(BENCH_OUTPUT_TOKENS, max(2, ctx_tokens // 2))
    return [
        assign("HOST", Var("HOST", default="127.0.0.1")),
        assign("PORT", Var("PORT", default=integer(BASE_PORT))),
        assign("OUTPUT_LEN", Var("OUTPUT_LEN", default=integer(out))),
        f'INPUT_LEN="${{INPUT_LEN:-$(( {integer(ctx_tokens)} - OUTPUT_LEN ))}}"',
        assign("CONCURRENCY", Var("CONCURRENCY", default=integer(plan.global_batch)), "the plan\'s global batch"),
        'NUM_PROMPTS="${NUM_PROMPTS:-$CONCURRENCY}"  # one wave: every request decodes alongside the others',
        assign("RESULT_DIR", Var("RESULT_DIR", default="bench-results")),
        'mkdir -p "$RESULT_DIR"',
    ]


def refuse(ctx: Context, why: str, fits) -> Refusal:
    """A one-line refusal naming why and which alternative (if the file has one) this target can run.

    `fits(plan_dict_or_None, name)` says whether the target could run that alternative.
    """
    found = alternatives(ctx.raw)
    for name in ALTERNATIVE_NAMES:
        entry = found.get(name)
        if entry is None or name == ctx.alternative:
            continue
        if fits(alternative_plan(entry, ctx.raw), name):
            delta = cost_delta(entry, ctx.base_cost if ctx.base_cost is not None
                               else ctx.plan.usd_per_million_tokens)
            return Refusal(f"{ctx.target} cannot run {why}; the {name.replace('_', '-')} alternative "
                           f"({delta}) can: use --alternative {name}")
    return Refusal(f"{ctx.target} cannot run {why}; {hint_for(ctx.target)}")


def hint_for(target: str) -> str:
    if target == "vllm-afd":
        return "re-plan a DeepSeek-V2/V3 model with --policy afd"
    return "re-plan with --policy colocated"
