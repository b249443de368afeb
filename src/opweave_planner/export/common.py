"""What exporters share beyond `base`: names where they enter, the plan's alternatives, refusals.

An exporter turns a plan into files for one runtime. It first decides whether that runtime can
run the plan's shape at all (`Refusal`, exit 3, one line naming why and what could run), then
renders bytes only from the plan and pinned per-version flag tables, so the same plan always
gives the same files. Scripts are written through `shell`, manifests through `documents`.
"""

from __future__ import annotations

import re
from typing import Any

from opweave_planner.errors import UserError, printable
from opweave_planner.export.base import Context, Refusal
from opweave_planner.export.shell import clean

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



def chunk_tokens_of(plan, mode: str | None = None) -> int | None:
    """The prefill chunk (tokens per scheduler step) the plan's prefill times assume, where it
    records one: an aggregated-mode plan's step budget (schema 1.11, `deployment.aggregated.
    chunk_tokens`, decodes and prefill chunks together), else a disaggregated plan's prefill pool
    (schema 1.10, `deployment.prefill.chunk_tokens`; 0 = whole prompts in one step). None: the plan
    models no prefill. `mode`: the deployment mode exported (`Context.mode`; None: the plan's).
    Every exporter reads the chunk here, so a plan key that records another mode's chunk is added
    in this one place."""
    dep = plan.deployment
    mode = mode or getattr(dep, "mode", None)
    if dep is not None and mode == "aggregated" and dep.aggregated is not None:
        return dep.aggregated.chunk_tokens
    pool = getattr(dep, "prefill", None) if dep is not None else None
    return None if pool is None else pool.chunk_tokens


BASE_PORT = 8000  # the router (or the only replica) listens here; replica r of several on 8001 + r

# Alternative classes a plan file may carry (issue 15 item 1), in the order they are suggested.
ALTERNATIVE_NAMES = ("colocated", "two_owner", "single_gpu_type", "optimum")
_ALIASES = {"colocated": "colocated", "twoowner": "two_owner", "twostage": "two_owner", "max2stages": "two_owner",
            "le2stages": "two_owner", "2stage": "two_owner", "afd": "two_owner", "singlegputype": "single_gpu_type",
            "homogeneous": "single_gpu_type", "optimum": "optimum"}


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


def shown(text: str, limit: int = 80) -> str:
    """A user's value as an error line quotes it: printable, and cut to `limit` characters."""
    text = printable(text)
    return text if len(text) <= limit else f"{text[:limit - 20]}... ({len(text)} characters)"


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


def refuse(ctx: Context, why: str) -> Refusal:
    """A one-line refusal naming why and which alternative (if the file has one) the target can run
    (its `fits`), else the target's own hint."""
    if ctx.probing:
        return Refusal(f"{ctx.target.name} cannot run {why}")
    found = alternatives(ctx.raw)
    for name in ALTERNATIVE_NAMES:
        entry = found.get(name)
        if entry is None or name == ctx.alternative:
            continue
        if ctx.target.fits(alternative_plan(entry, ctx.raw), name) and _passes(ctx, entry, name):
            delta = cost_delta(entry, ctx.base_cost if ctx.base_cost is not None
                               else ctx.plan.usd_per_million_tokens)
            return Refusal(f"{ctx.target.name} cannot run {why}; the {name.replace('_', '-')} alternative "
                           f"({delta}) can: use --alternative {name}")
    return Refusal(f"{ctx.target.name} cannot run {why}; {ctx.target.hint}")


def _passes(ctx: Context, entry: dict[str, Any], name: str) -> bool:
    """Whether the target's whole check accepts the alternative (a refusal never suggests an
    alternative that is itself refused); a summary without a plan is judged by `fits` alone."""
    from dataclasses import replace

    from opweave_planner.contract import parse_plan

    doc = alternative_plan(entry, ctx.raw)
    if doc is None:
        return True
    try:
        plan = parse_plan(doc, f"{ctx.path} alternatives.{name}")
        ctx.target.check(replace(ctx, plan=plan, alternative=name, probing=True))
    except (Refusal, UserError):
        return False
    return True
