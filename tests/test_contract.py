"""Plan files as a contract: schema, golden files, loading, re-simulation and diff."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from types import UnionType
from typing import get_args, get_origin

import orjson
import pytest
from cli_helpers import cli

from opweave_planner import api
from opweave_planner.contract import (
    diff_plans,
    evaluate_plan,
    parse_plan,
    plan_schema,
    read_plan,
    recorded_request,
    schema_bytes,
    shipped_schema_bytes,
)
from opweave_planner.errors import UserError
from opweave_planner.inputs.request import PlanRequest, space_fields
from opweave_planner.plan import (
    FLAG_AT,
    SCHEMA_VERSION,
    TABLE,
    Infeasible,
    Plan,
    SpaceOut,
    plan_bytes,
    space_values,
)

GOLDEN = Path(__file__).parent / "golden"
SMALL = dict(max_owners=2, batches=(8, 16, 32, 64), max_replicas=2, tensor_parallel_sizes=(1, 2))
# The commands as the lead registers them (`opweave-plan schema|simulate|diff|regen`), with
# the real entry point's error handling.


def one_line_error(res: subprocess.CompletedProcess, needle: str) -> None:
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.stderr


def make(model, slo, ctx, gpus, policy) -> Plan | Infeasible:
    _outcome = api.plan(api.make_request(model, slo, ctx, gpus=gpus, policy=policy, **SMALL))
    plan, infeasible = _outcome.plan, _outcome.infeasible
    return plan if plan is not None else infeasible


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan | Infeasible]:
    return {
        "colocated": make("llama-3.1-8b", "30ms", "8k", "h100", "colocated"),
        "afd": make("qwen3-30b-a3b", "40ms", "8k", "h100,a100", "afd"),
        "mixed": make("llama-3.1-8b", "30ms", "8k", "h100,a100", "afd"),
        "infeasible": make("llama-3.1-8b", "1ms", "8k", "a100", "colocated"),
    }


@pytest.fixture(scope="module")
def validator():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(shipped_schema_bytes())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def write(tmp_path: Path, name: str, doc) -> Path:
    p = tmp_path / name
    p.write_bytes(doc if isinstance(doc, bytes) else plan_bytes(doc))
    return p


# ----------------------------------------------------------------------------- schema

def test_shipped_schema_is_the_generated_one():
    assert shipped_schema_bytes() == schema_bytes(), (
        "regenerate: python -c 'from opweave_planner.contract import *; SCHEMA_FILE.write_bytes(schema_bytes())'"
        " and bump schema_version (MINOR for an added optional key, MAJOR otherwise)")
    assert plan_schema()["x-schema-version"] == SCHEMA_VERSION


def test_schema_validates_every_emitted_plan(plans, validator):
    assert isinstance(plans["infeasible"], Infeasible)
    for doc in plans.values():
        validator.validate(orjson.loads(plan_bytes(doc)))


def test_golden_files_still_validate_and_load(validator):
    """Goldens written by an older 1.x keep validating: only additive (MINOR) changes allowed."""
    files = sorted(GOLDEN.glob("*.json"))
    assert len(files) >= 3
    for f in files:
        obj = orjson.loads(f.read_bytes())
        validator.validate(obj)
        doc = read_plan(f)
        assert plan_bytes(doc) == f.read_bytes()  # canonical bytes round-trip


def _broken(base: dict) -> list[tuple[str, dict, str]]:
    cases = []

    def case(label, needle, fn):
        d = copy.deepcopy(base)
        fn(d)
        cases.append((label, d, needle))

    case("missing key", "tpot_ms", lambda d: d.pop("tpot_ms"))
    case("wrong type", "owners.0.replicas", lambda d: d["owners"][0].update(replicas="two"))
    case("extra key", "surprise", lambda d: d.update(surprise=1))
    case("negative", "usd_per_million_tokens", lambda d: d.update(usd_per_million_tokens=-1.0))
    case("no stages", "stages", lambda d: d.update(stages=[]))
    case("major 2", "unknown schema_version '2.0'", lambda d: d.update(schema_version="2.0"))
    case("newer minor", "unknown schema_version '1.99'", lambda d: d.update(schema_version="1.99"))
    return cases


def test_hand_broken_plans_rejected(plans, validator, tmp_path):
    base = orjson.loads(plan_bytes(plans["afd"]))
    for label, doc, needle in _broken(base):
        if label != "newer minor":  # 1.99 matches the version pattern; only readers refuse it
            assert not validator.is_valid(doc), label
        with pytest.raises(UserError, match=needle.replace(".", r"\.")) as info:
            read_plan(write(tmp_path, f"{label}.json", orjson.dumps(doc)))
        assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(UserError, match="not valid JSON"):
        read_plan(write(tmp_path, "junk.json", b"{not json"))
    with pytest.raises(UserError, match="expected a JSON object"):
        read_plan(write(tmp_path, "list.json", b"[]"))
    with pytest.raises(UserError, match="no schema_version"):
        read_plan(write(tmp_path, "nov.json", b"{}"))
    with pytest.raises(UserError, match="does not exist"):
        read_plan(tmp_path / "absent.json")
    bad = copy.deepcopy(base)
    bad["owners"][0]["replicas"] += 1
    with pytest.raises(UserError, match="inconsistent plan: owners\\[0\\] serves"):
        parse_plan(bad, "x.json")


@pytest.mark.parametrize("edit, needle", [
    (lambda st: st[1]["operators"].pop(), "missing"),
    (lambda st: st[1]["operators"].append(st[0]["operators"][0]), "repeated (stages 0, 1)"),
    (lambda st: st[0]["operators"].__setitem__(0, "layers.99.magic"), "is not in the model"),
    (lambda st: st[0]["operators"].reverse(), "differs from the template's expansion"),
])
def test_operators_inconsistent_with_model_rejected(plans, tmp_path, edit, needle):
    doc = orjson.loads(plan_bytes(plans["afd"]))
    assert len(doc["stages"]) > 2
    edit(doc["stages"])
    plan = read_plan(write(tmp_path, "p.json", orjson.dumps(doc)))
    with pytest.raises(UserError, match="inconsistent with model qwen3-30b-a3b") as info:
        evaluate_plan(plan, where="p.json")
    assert needle in str(info.value)
    res = cli("simulate", str(tmp_path / "p.json"))
    one_line_error(res, needle)


# ----------------------------------------------------------------------------- re-evaluation

@pytest.mark.parametrize("key", ["colocated", "afd", "mixed"])
def test_resimulating_unchanged_plan_reproduces_it_exactly(plans, key):
    plan = plans[key]
    ev = evaluate_plan(plan)
    assert plan_bytes(ev.plan) == plan_bytes(plan)
    assert ev.meets_slo and ev.fits_memory and ev.inputs_changed == []


def test_price_rise_changes_cost_as_the_objective_says(plans, tmp_path):
    plan = plans["mixed"]
    prices = tmp_path / "prices.toml"
    h100 = plan.provenance.prices_usd_per_gpu_hour["h100"]
    prices.write_text(f"h100 = {h100 * 1.1!r}\n")
    ev = evaluate_plan(plan, prices=str(prices))
    new = ev.plan
    # objective: USD/M tokens = T_rtt * sum_o (price_o * tp_o / resident_o) / 3.6e9 * 1e6
    def rate(p: Plan, bump: float) -> float:
        return sum(o.usd_per_hour_per_replica * (bump if o.gpu == "h100" else 1.0) / o.resident_batch
                   for o in p.owners)

    assert new.tpot_ms == plan.tpot_ms
    expect = plan.tpot_ms * 1e3 * rate(plan, 1.1) / 3.6e9 * 1e6
    assert new.usd_per_million_tokens == pytest.approx(expect, rel=1e-8)
    assert plan.usd_per_million_tokens == pytest.approx(plan.tpot_ms * 1e3 * rate(plan, 1.0) / 3.6e3, rel=1e-8)
    if any(o.gpu == "h100" for o in plan.owners):
        assert new.usd_per_million_tokens > plan.usd_per_million_tokens
    assert ev.inputs_changed == ["prices"]
    assert new.provenance.prices_usd_per_gpu_hour["a100"] == plan.provenance.prices_usd_per_gpu_hour["a100"]
    d = diff_plans(plan, new)
    assert [c["aspect"] for c in d["changes"]] == (["usd_per_million_tokens"] if new != plan else [])


def test_slower_network_and_cli_json(plans, tmp_path):
    path = write(tmp_path, "mixed.json", plans["mixed"])  # h100 + a100: stages cross the network
    assert plans["mixed"].metrics.stage_link == "inter_node"
    res = cli("simulate", str(path), "--json", "--network-bandwidth", "0.05", "--network-latency", "5000")
    assert res.returncode in (0, 1), res.stderr
    info = json.loads(res.stdout)
    for key in ("usd_per_million_tokens", "tpot_ms", "meets_slo", "fits_memory", "workload", "gpus_total"):
        assert key in info
    assert info["tpot_ms"] > plans["mixed"].tpot_ms
    assert info["meets_slo"] is (res.returncode == 0) and info["meets_slo"] is False
    assert info["inputs_changed"] == ["network"]
    same = cli("simulate", str(path))
    assert same.returncode == 0 and "inputs changed: none" in same.stdout, same.stderr


# ----------------------------------------------------------------------------- diff and CLI

def test_diff_words_json_and_exit_codes(plans, tmp_path):
    a = write(tmp_path, "a.json", plans["colocated"])
    b = write(tmp_path, "b.json", plans["mixed"])
    same = cli("diff", str(a), str(a))
    assert same.returncode == 0 and "equivalent" in same.stdout
    changed = cli("diff", str(a), str(b), "--json")
    assert changed.returncode == 1, changed.stderr
    d = json.loads(changed.stdout)
    assert d["equivalent"] is False
    aspects = {c["aspect"] for c in d["changes"]}
    assert {"request", "usd_per_million_tokens"} <= aspects
    words = cli("diff", str(a), str(b))
    assert words.returncode == 1 and "cost:" in words.stdout
    inf = write(tmp_path, "inf.json", plans["infeasible"])
    r = diff_plans(plans["colocated"], plans["infeasible"])
    assert not r["equivalent"] and r["changes"][-1]["aspect"] == "feasibility"
    one_line_error(cli("simulate", str(inf)), "infeasibility record")
    one_line_error(cli("diff", str(a), str(tmp_path / "nope.json")), "does not exist")


def test_schema_command_prints_shipped_schema():
    res = cli("schema")
    assert res.returncode == 0 and res.stdout.encode() == shipped_schema_bytes()


# ----------------------------------------------------------------------------- the request table

def _declared(model, dotted: str) -> bool:
    """Whether the plan models declare a dotted key (a dict's keys are open)."""
    for key in dotted.split("."):
        if model is dict:
            return True
        if key not in getattr(model, "model_fields", {}):
            return False
        kind = model.model_fields[key].annotation
        (kind,) = [a for a in get_args(kind) if a is not type(None)] if isinstance(kind, UnionType) else [kind]
        model = get_origin(kind) or kind
    return True


def test_every_row_names_a_request_field_and_a_plan_key():
    assert len({r.at for r in TABLE}) == len(TABLE)
    for row in TABLE:
        assert row.field is None or row.field in PlanRequest.model_fields, row
        assert _declared(Plan, row.at), row
    assert FLAG_AT["--max-gpus"] == "search.space.max_gpus" and FLAG_AT["--slo"] == "workload.tpot_slo_ms"


def test_the_space_model_is_the_tables_space_rows():
    rows = [r for r in TABLE if r.at.startswith("search.space.")]
    assert list(SpaceOut.model_fields) == [r.at.removeprefix("search.space.") for r in rows]
    assert {r.field for r in rows if r.field} == set(space_fields())  # PlanRequest marks the same ones
    for r in rows:  # a key added after 1.0 is absent from older files
        assert SpaceOut.model_fields[r.at.removeprefix("search.space.")].is_required() is (r.since == 0), r


@pytest.mark.parametrize("key", ["colocated", "mixed"])
def test_the_recorded_request_records_the_same_space(plans, key):
    plan = plans[key]
    assert SpaceOut(**space_values(recorded_request(plan))) == plan.search.space
