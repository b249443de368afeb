"""Fuzz `export` with hostile names (issue 25): the generators that found the injections.

Model ids, plan model names and alternatives' names are drawn from control characters, quotes,
`$`, backticks, backslashes, here-doc terminators, unicode, leading dashes and very long text,
with attacker payloads (`$(touch MARKER)`, backticks, `; touch MARKER`) mixed in, and flow into
every exporter. Every run must end with exit 0, 2 or 3, one error line naming the flag, field or
file, and nothing written on an error; on success every script passes `bash -n` and, run with
stub binaries first on PATH, runs only the stubs (the marker never appears), every YAML file
reads back, and the model id reaches each command as one unchanged argument.

Budgets scale with the hypothesis profile (conftest.budget); the default `ci` profile keeps this
file under about 40 s on 2 cores.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import AFD_PLAN, budget, run_cli
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_export_safety import DISAGG, MANY_STAGES, Stubs, aggregated_doc, check_scripts, replicated
from test_fuzz_cli import check

from opweave_planner.export.documents import to_yaml
from opweave_planner.export.shell import clean, quote

MARK = "{M}"  # replaced by the run's marker path
PAYLOADS = [f"$(touch {MARK})", f"`touch {MARK}`", f"; touch {MARK}", f"' ; touch {MARK}; '",
            f'" ; touch {MARK}; "', f"\ntouch {MARK}\n", f"\r\ntouch {MARK}", f"\nEOF\ntouch {MARK}\n",
            f"${{IFS}}$(touch {MARK})", f"&& touch {MARK} #", "$(vllm PWNED)"]
SPECIAL = ["$", "`", "\\", "'", '"', "!", ";", "&", "|", "<", ">", "(", ")", "{", "}", "*", "?", "~", "#",
           " ", "\t", "\n", "\r", "\r\n", "\x00", "\x1b[2J", "\x7f", "\x85", "\u2028", "\u202e", "${", "$(",
           "-", "--", "--help", "EOF", "'EOF'", "/", "./", "..", "é", "日本", "\U0001f600", "\ud800"]


def hostile(max_atoms: int = 8, printable: bool = False):
    """Text an attacker or a broken tool could put in a name; `printable`: only what passes the
    name checks (no control character), so it gets as far as the scripts."""
    specials, payloads = SPECIAL, PAYLOADS
    chars = st.characters()
    if printable:
        specials = [t for t in SPECIAL if clean(t)]
        payloads = [t for t in PAYLOADS if clean(t)]
        chars = st.characters(exclude_categories=("Cc", "Cf", "Cs", "Zl", "Zp"))
    atom = st.one_of(st.sampled_from(specials), st.sampled_from(payloads), chars,
                     st.text(alphabet="abc-_./", max_size=6))
    long = st.text(alphabet=chars, min_size=200, max_size=3000) if printable else \
        st.one_of(st.text(min_size=200, max_size=5000), st.just("a" * 5000))
    return st.one_of(st.lists(atom, min_size=1, max_size=max_atoms).map("".join),
                     st.lists(atom, min_size=1, max_size=max_atoms).map("".join), long)


def model_ids():
    """Ids a user could pass: about two in three a path of hostile but printable text (accepted:
    the scripts must carry it unchanged), the rest hostile text bare, as org/name or an option."""
    accepted = st.one_of(hostile(printable=True).map(lambda t: "/models/" + t),
                         hostile(printable=True).map(lambda t: "./" + t),
                         st.sampled_from(["org/m", "Qwen/Qwen3-30B-A3B", "/models/llama", "./weights"]))
    refused = st.one_of(hostile(), hostile().map(lambda t: "/models/" + t), hostile().map(lambda t: "org/" + t),
                        hostile().map(lambda t: "-" + t))
    return st.one_of(accepted, accepted, refused)


_DEEPSEEK: list = []


def _deepseek_afd() -> dict:
    """A DeepSeek-V3 attention | FFN plan, the only shape vllm-afd renders (made once); if the
    planner stops finding it, this fails rather than skipping the whole fuzz test."""
    if not _DEEPSEEK:
        from test_export import _plan_bytes

        data = _plan_bytes("deepseek-v3", policy="afd", gpus="h200", tensor_parallel_sizes=(8,))
        assert data is not None, "no DeepSeek-V3 AFD plan on H200 TP8: the vllm-afd fuzz has nothing to export"
        _DEEPSEEK.append(json.loads(data))
    return _DEEPSEEK[0]


PLANS = {"one": lambda: replicated(1), "two": lambda: replicated(2), "three": lambda: replicated(3),
         "deepseek-afd": _deepseek_afd, "llama-afd": lambda: json.loads(AFD_PLAN.read_bytes()),
         "disagg": lambda: json.loads(DISAGG.read_bytes()),  # prefill + decode pools, P/D router
         "agg": aggregated_doc}  # deployment.mode aggregated: its replicas, no prefill pool


def _run_export(tmp_path_factory, doc: dict, target: str, extra: list[str], model_id: str | None):
    """Export `doc` with hostile values (markers filled in), check the universal rules, and on
    success run every script with stubs."""
    work = tmp_path_factory.mktemp("fx")
    marker = work / "PWNED"
    def fill(value: str) -> str:
        return value.replace(MARK, str(marker))

    doc = json.loads(json.dumps(doc).replace(MARK, json.dumps(str(marker))[1:-1]))
    plan = work / "plan.json"
    plan.write_text(json.dumps(doc))
    out = work / "out"
    argv = ["export", str(plan), "--to", target, "--out", str(out), *map(fill, extra)]
    if model_id is not None:
        argv += ["--model-id", fill(model_id)]
    ran = run_cli(*argv)
    event(f"{target}: exit {ran.code}")  # --hypothesis-show-statistics: how many got as far as running
    check(ran, out, allowed={0, 2, 3})
    if ran.code != 0:
        assert not out.exists(), ran.err
        assert not marker.exists()
        return ran
    mid = fill(model_id) if model_id is not None else None
    assert check_scripts(out, Stubs(work), mid, [marker]) >= 1
    yaml = pytest.importorskip("yaml")
    for path in out.glob("*.yaml"):
        text = path.read_text()
        assert all(line.isprintable() for line in text.splitlines()), path.name
        loaded = yaml.safe_load(text)
        if mid is not None:
            assert mid in _strings(loaded), (path.name, mid)
    assert not marker.exists()
    return ran


def _strings(obj) -> set[str]:
    if isinstance(obj, dict):
        return {s for v in obj.values() for s in _strings(v)}
    if isinstance(obj, list):
        return {s for v in obj for s in _strings(v)}
    return {obj} if isinstance(obj, str) else set()


# (plan, target) pairs: mostly ones the target can run, so the scripts are rendered and run
RUNNABLE = [(p, t) for p in ("one", "two", "three", "disagg", "agg") for t in ("vllm", "sglang", "dynamo", "llm-d")]
REFUSED = [("one", "vllm-afd"), ("llama-afd", "vllm-afd"), ("deepseek-afd", "vllm"), ("llama-afd", "dynamo"),
           ("agg", "vllm-afd")]
SHAPES = st.sampled_from(RUNNABLE + [("deepseek-afd", "vllm-afd")] * 3 + REFUSED)  # sampled evenly


@settings(max_examples=budget(0.3))
@given(SHAPES, model_ids())
def test_fuzz_hostile_model_ids_into_every_exporter(tmp_path_factory, shape, model_id):
    plan, target = shape
    _run_export(tmp_path_factory, PLANS[plan](), target, [], model_id)


@settings(max_examples=budget(0.2))
@given(st.sampled_from(RUNNABLE), st.one_of(hostile(printable=True), hostile(printable=True), hostile()),
       st.one_of(st.just("org/m"), st.just("org/m"), st.none(), model_ids()),
       st.sampled_from(["model", "model", "model", "policy", "gpu", "prefill gpu"]))
def test_fuzz_hostile_plan_names_into_every_exporter(tmp_path_factory, shape, name, model_id, field):
    plan, target = shape
    doc = PLANS[plan]()
    if field == "gpu":
        doc["owners"][0]["gpu"] = name
    elif field == "prefill gpu":  # the pool's GPU type (prefill or aggregated replicas; else the owner's)
        dep = doc.get("deployment") or {}
        pool = dep.get("aggregated") if dep.get("mode") == "aggregated" else dep.get("prefill")
        (pool if pool is not None else doc["owners"][0])["gpu"] = name
    else:
        doc[field] = name
    _run_export(tmp_path_factory, doc, target, [], model_id)


@settings(max_examples=budget(0.1))
@given(st.sampled_from(["vllm", "sglang", "dynamo", "llm-d"]), st.one_of(hostile(printable=True), hostile()),
       st.one_of(st.just("org/m"), model_ids()))
def test_fuzz_hostile_alternative_names(tmp_path_factory, target, name, model_id):
    doc = json.loads(MANY_STAGES.read_bytes())
    alt = replicated(2)
    alt["model"] = name
    doc["alternatives"] = {"colocated": {"plan": alt}}
    _run_export(tmp_path_factory, doc, target, ["--alternative", "colocated"], model_id)


@settings(max_examples=budget(0.5))
@given(st.lists(hostile(), min_size=1, max_size=20))
def test_fuzz_quote_round_trips_every_clean_string(tmp_path_factory, words):
    """Whatever the string, bash reads the quoted word back unchanged and runs nothing."""
    work = tmp_path_factory.mktemp("q")
    marker = work / "PWNED"
    words = [w.replace(MARK, str(marker)) for w in words if clean(w)]
    text = "".join(f"printf '%s\\0' {quote(w)}\n" for w in words)
    ran = subprocess.run(["bash", "-c", text], capture_output=True, timeout=30, cwd=work)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1] == words
    assert not marker.exists()


@settings(max_examples=budget(0.5))
@given(st.dictionaries(hostile(4), st.one_of(hostile(4), st.lists(hostile(4), max_size=3)), max_size=5))
def test_fuzz_yaml_reads_back_whatever_the_strings(doc):
    yaml = pytest.importorskip("yaml")
    doc = {k: v for k, v in doc.items() if "\ud800" not in k + json.dumps(v)}  # not encodable as UTF-8
    text = to_yaml(doc).decode()
    assert all(line.isprintable() for line in text.splitlines())
    assert yaml.safe_load(text) == (doc or None)
