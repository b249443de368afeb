"""`regen --hysteresis X%`: keep an entry's placement while it stays feasible and within X % of the
new optimum; cost-only (and provenance-only) changes reported apart from topology changes; hysteresis 0 is plain regen."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from cli_helpers import cli

from opweave_planner.contract import diff_plans, evaluate_plan, parse_plan
from opweave_planner.errors import UserError
from opweave_planner.regen import (
    TOPOLOGY_ASPECTS,
    parse_hysteresis,
    premium_pct,
    regen,
    within_hysteresis,
)

MATRIX = """
prices = "prices.toml"
[space]
max_owners = 2
batches = [8, 16, 32, 64]
max_replicas = 2
tensor_parallel_sizes = [1, 2]

[[entry]]
models = "qwen3-30b-a3b"
contexts = "8k"
slos = "40ms"
gpus = "h100,a100"
policies = ["afd", "opweave"]

[[entry]]
models = "llama-3.1-8b"
contexts = "8k"
slos = "30ms"
gpus = ["h100", "h100,a100"]
policies = "afd"
"""
PRICES = "h100 = 3.49\na100 = {a100}\n"
QWEN_OPWEAVE = "qwen3-30b-a3b_ctx8k_slo40ms_h100+a100_opweave.json"
QWEN_AFD = "qwen3-30b-a3b_ctx8k_slo40ms_h100+a100_afd.json"
LLAMA_H100 = "llama-3.1-8b_ctx8k_slo30ms_h100_afd.json"
# with the shipped tables, a100 1.74 -> 2.00 moves both qwen optima by less than 5 %
KEPT_AT_2 = sorted([QWEN_AFD, QWEN_OPWEAVE])
LLAMA_MIXED = "llama-3.1-8b_ctx8k_slo30ms_h100+a100_afd.json"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The matrix planned once at a100 = 1.74 USD/h (the files every test starts from)."""
    root = tmp_path_factory.mktemp("base")
    (root / "prices.toml").write_text(PRICES.format(a100=1.74))
    (root / "matrix.toml").write_text(MATRIX)
    assert regen(root / "matrix.toml", root / "plans").count("new") == 4
    return root / "plans"


def workspace(base: Path, folder: Path, a100: float, matrix: str = MATRIX) -> Path:
    """A matrix folder holding a copy of the base plans, with an edited a100 price."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prices.toml").write_text(PRICES.format(a100=a100))
    (folder / "matrix.toml").write_text(matrix)
    shutil.copytree(base, folder / "plans")
    return folder / "matrix.toml"


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.json"))}


def plan(data: bytes):
    return parse_plan(orjson.loads(data), "test")


def topology(a: bytes, b: bytes) -> list[str]:
    return [c["aspect"] for c in diff_plans(plan(a), plan(b))["changes"] if c["aspect"] in TOPOLOGY_ASPECTS]


def by_name(report) -> dict:
    return {f.name: f for f in report.files}


# ----------------------------------------------------------------------------- decisions

def test_keep_within_hysteresis_writes_the_reevaluated_placement(base, tmp_path):
    """a100 1.74 -> 2.00: the qwen opweave optimum moves, 1.46 % cheaper; 5 % keeps the old one."""
    matrix = workspace(base, tmp_path, 2.0)
    before = files(base)
    fresh = tmp_path / "fresh"  # the new optimum of every entry (a plain regen into an empty folder)
    regen(matrix, fresh)
    optimum = files(fresh)
    assert topology(before[QWEN_OPWEAVE], optimum[QWEN_OPWEAVE])  # the price edit moves this optimum

    report = regen(matrix, tmp_path / "plans", hysteresis="5%")
    after, f = files(tmp_path / "plans"), by_name(report)[QWEN_OPWEAVE]
    assert f.kept and f.status == "changed" and f.kind == "cost"
    assert not topology(before[QWEN_OPWEAVE], after[QWEN_OPWEAVE])  # placement, GPUs, batch unchanged
    kept, best = plan(after[QWEN_OPWEAVE]), plan(optimum[QWEN_OPWEAVE])
    assert kept.provenance.prices_usd_per_gpu_hour["a100"] == 2.0  # prices and cost are current
    again = evaluate_plan(plan(before[QWEN_OPWEAVE]), prices=str(tmp_path / "prices.toml"))
    assert kept == again.plan and again.meets_slo and again.fits_memory
    pct = premium_pct(kept.usd_per_million_tokens, best.usd_per_million_tokens)
    assert 0 < pct <= 5 and f.premium_pct == pct
    assert f.note == f"kept: previous placement costs {pct:.2f} % more than the new optimum (<= 5 %)"
    assert kept.provenance == best.provenance and kept.search.space == best.search.space
    # every other entry holds exactly its new optimum
    assert {n: b for n, b in after.items() if n not in KEPT_AT_2} == \
           {n: b for n, b in optimum.items() if n not in KEPT_AT_2}
    assert [x.name for x in report.kept] == KEPT_AT_2


def test_replace_beyond_hysteresis_writes_the_new_optimum(base, tmp_path):
    """a100 1.74 -> 2.10: the old qwen opweave placement is now 6.53 % dearer than the optimum."""
    matrix = workspace(base, tmp_path, 2.1)
    report = regen(matrix, tmp_path / "plans", hysteresis="5%")
    fresh = tmp_path / "fresh"
    regen(matrix, fresh)
    f = by_name(report)[QWEN_OPWEAVE]
    assert not f.kept and f.kind == "topology" and f.premium_pct > 5
    assert f.note == (f"replaced: previous placement costs {f.premium_pct:.2f} % more than the new optimum "
                      "(> 5 %)")
    assert files(tmp_path / "plans")[QWEN_OPWEAVE] == files(fresh)[QWEN_OPWEAVE]
    # a wider band keeps it
    matrix2 = workspace(base, tmp_path / "wide", 2.1)
    wide = by_name(regen(matrix2, tmp_path / "wide" / "plans", hysteresis="7%"))[QWEN_OPWEAVE]
    assert wide.kept and wide.premium_pct == f.premium_pct


def test_decision_at_the_boundary(base, tmp_path):
    matrix = workspace(base, tmp_path / "probe", 2.1)
    pct = by_name(regen(matrix, tmp_path / "probe" / "plans", hysteresis="100%"))[QWEN_OPWEAVE].premium_pct
    assert pct is not None and 1 < pct < 99
    for delta, kept in ((-0.005, False), (0.005, True)):
        m = workspace(base, tmp_path / f"d{delta}", 2.1)
        f = by_name(regen(m, tmp_path / f"d{delta}" / "plans", hysteresis=f"{pct + delta:.4f}%"))[QWEN_OPWEAVE]
        assert f.kept is kept, (pct, delta, f.note)
    # the rule itself: inclusive, on the files' own figures; 0 never keeps
    assert within_hysteresis(1.05, 1.0, 5.0) and not within_hysteresis(1.0500001, 1.0, 5.0)
    assert within_hysteresis(1.0, 1.0, 0.001) and not within_hysteresis(1.0, 1.0, 0.0)
    assert within_hysteresis(0.99, 1.0, 1.0)  # a re-evaluation cheaper than the search's answer
    assert premium_pct(1.05, 1.0) == pytest.approx(5.0) and premium_pct(1.0, 0.0) == float("inf")


def test_previous_placement_missing_its_slo_is_replaced(base, tmp_path):
    """Inter-node latency 20 -> 500 us: the mixed llama AFD plan re-evaluates to > 30 ms."""
    slow = MATRIX.replace('prices = "prices.toml"', 'prices = "prices.toml"\nnetwork_latency = 500')
    matrix = workspace(base, tmp_path, 1.74, slow)
    f = by_name(regen(matrix, tmp_path / "plans", hysteresis="100%"))[LLAMA_MIXED]
    assert not f.kept and f.kind == "topology"
    assert f.note.startswith("replaced: previous placement misses the SLO (") and f.note.endswith(" > 30 ms)")


def test_a_different_search_space_is_never_kept(base, tmp_path):
    narrow = MATRIX.replace("batches = [8, 16, 32, 64]", "batches = [8, 16, 32]")
    matrix = workspace(base, tmp_path, 2.0, narrow)
    report = regen(matrix, tmp_path / "plans", hysteresis="100%")
    assert not report.kept
    moved = [f for f in report.files if f.kind == "topology"]
    assert moved and all(f.note == "replaced: the previous plan was searched over a different space" for f in moved)


def test_unreadable_or_infeasible_previous_files_get_the_optimum(base, tmp_path):
    matrix = workspace(base, tmp_path, 2.0)
    out = tmp_path / "plans"
    (out / QWEN_OPWEAVE).write_text("{not json")
    infeasible = {"schema_version": "1.1", "model": "qwen3-30b-a3b", "feasible": False, "policy": "afd",
                  "workload": {"context_tokens": 8192, "tpot_slo_ms": 40.0}, "reason": "made up"}
    (out / QWEN_AFD).write_bytes(orjson.dumps(infeasible))
    report = regen(matrix, out, hysteresis="50%")
    fresh = tmp_path / "fresh"
    regen(matrix, fresh)
    assert files(out) == files(fresh) and not report.kept
    f = by_name(report)
    assert f[QWEN_OPWEAVE].summary == "previous file was not a readable plan" and f[QWEN_OPWEAVE].kind == "topology"
    assert f[QWEN_AFD].summary.startswith("feasibility: infeasible (made up) -> feasible")


def test_a_previous_plan_that_cannot_be_reevaluated_is_replaced(base, tmp_path):
    matrix = workspace(base, tmp_path, 2.0)  # at 2.0 the qwen opweave placement would be kept
    out = tmp_path / "plans"
    doc = orjson.loads((out / QWEN_OPWEAVE).read_bytes())
    doc["stages"][0]["operators"][0] = "bogus"
    (out / QWEN_OPWEAVE).write_bytes(orjson.dumps(doc))
    f = by_name(regen(matrix, out, hysteresis="5%"))[QWEN_OPWEAVE]
    assert not f.kept and f.note.startswith("replaced: previous placement not re-evaluated (")
    assert "operator 'bogus' is not in the model" in f.note


# ----------------------------------------------------------------------------- determinism, hysteresis 0

def test_deterministic_and_stable_on_rerun(base, tmp_path):
    runs = []
    for i in range(2):
        m = workspace(base, tmp_path / str(i), 2.0)
        regen(m, tmp_path / str(i) / "plans", hysteresis="5%")
        runs.append(files(tmp_path / str(i) / "plans"))
    assert runs[0] == runs[1]
    # a second regen over the kept files writes nothing and still reports the kept placement
    again = regen(tmp_path / "0" / "matrix.toml", tmp_path / "0" / "plans", hysteresis="5%")
    assert again.exit_code == 0 and again.count("unchanged") == 4
    assert [f.name for f in again.kept] == KEPT_AT_2 and files(tmp_path / "0" / "plans") == runs[0]
    assert f"  kept placements, file unchanged: {len(KEPT_AT_2)}" in again.lines()


def test_hysteresis_zero_is_plain_regen(base, tmp_path):
    matrix = workspace(base, tmp_path, 2.0)
    fresh = tmp_path / "fresh"
    regen(matrix, fresh)
    for i, h in enumerate((0, "0%", "0", 0.0)):
        shutil.rmtree(tmp_path / "plans")
        shutil.copytree(base, tmp_path / "plans")
        report = regen(matrix, tmp_path / "plans", hysteresis=h)
        assert files(tmp_path / "plans") == files(fresh), h  # every file its new optimum
        assert not report.kept and all(not f.note and f.premium_pct is None for f in report.files)
        assert "hysteresis" not in report.lines()[0]
        if i == 0:
            assert by_name(report)[QWEN_OPWEAVE].kind == "topology"  # what 5 % would have kept


# ----------------------------------------------------------------------------- report

def test_report_lists_topology_and_cost_changes_apart(base, tmp_path):
    matrix = workspace(base, tmp_path, 2.1)
    report = regen(matrix, tmp_path / "plans", hysteresis="5%")
    d = report.to_dict()
    topo, cost, prov = d["changes"]["topology"], d["changes"]["cost_only"], d["changes"]["provenance_only"]
    assert QWEN_OPWEAVE in topo and LLAMA_H100 not in topo + cost + prov  # h100-only entry: unchanged
    assert not set(topo) & set(cost) and len(topo) + len(cost) + len(prov) == d["counts"]["changed"]
    before, after = files(base), files(tmp_path / "plans")
    for name in topo:
        assert topology(before[name], after[name])
    for name in cost + prov:
        assert not topology(before[name], after[name])
    lines = report.lines()
    assert lines[0].startswith(f"regen: 4 entries via in-process: {len(topo) + len(cost) + len(prov)} changed "
                               f"({len(topo)} topology, {len(cost)} cost only, {len(prov)} provenance only)")
    assert lines[0].endswith(f"; hysteresis 5 %: {len(d['kept'])} placement(s) kept")
    t = lines.index(f"  topology changes (placement, GPUs or batch): {len(topo)}")
    assert [ln.split()[1] for ln in lines[t + 1:t + 1 + len(topo)]] == [n + ":" for n in topo]
    if cost:
        c = lines.index(f"  cost-only changes (same placement, new cost or TPOT): {len(cost)}")
        assert c > t and [ln.split()[1] for ln in lines[c + 1:c + 1 + len(cost)]] == [n + ":" for n in cost]
    row = next(r for r in d["files"] if r["name"] == QWEN_OPWEAVE)
    assert row["change"] == "topology" and row["kept"] is False and row["premium_pct"] > 5


# ----------------------------------------------------------------------------- CLI

@pytest.mark.parametrize("value", ["-1", "abc", "200%", "5", "nan%", "-0.5%", ""])
def test_bad_hysteresis_is_one_line_exit_2(base, tmp_path, value):
    matrix = workspace(base, tmp_path, 2.0)
    before = files(tmp_path / "plans")
    res = cli("regen", "--matrix", str(matrix), "--out", str(tmp_path / "plans"), "--hysteresis", value)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1 and "--hysteresis" in lines[0], res.stderr
    assert "Traceback" not in res.stderr and files(tmp_path / "plans") == before


@pytest.mark.parametrize("text, value", [("5%", 5.0), (" 0.6 % ", 0.6), ("0", 0.0), ("100%", 100.0), (2.5, 2.5)])
def test_parse_hysteresis(text, value):
    assert parse_hysteresis(text) == value


def test_parse_hysteresis_rejects_a_bare_number_as_ambiguous():
    with pytest.raises(UserError, match=r"--hysteresis: '5' has no unit; write a percentage such as 5%"):
        parse_hysteresis("5")


def test_cli_hysteresis_json_and_parallel_bytes(base, tmp_path):
    matrix = workspace(base, tmp_path, 2.0)
    res = cli("regen", "--matrix", str(matrix), "--out", str(tmp_path / "plans"), "--hysteresis", "5%",
              "--jobs", "2", "--json")
    assert res.returncode == 1, res.stderr
    d = orjson.loads(res.stdout)
    assert d["kept"] == KEPT_AT_2 and d["hysteresis_pct"] == 5.0
    assert "kept: previous placement costs" in res.stderr  # the per-entry progress line says so
    serial = workspace(base, tmp_path / "serial", 2.0)
    regen(serial, tmp_path / "serial" / "plans", hysteresis="5%")
    assert files(tmp_path / "plans") == files(tmp_path / "serial" / "plans")  # --jobs 2: same bytes


def test_shipped_workflow_regenerates_with_5_percent_hysteresis():
    import re
    import shlex

    text = (Path(__file__).parents[1] / "examples" / "regen-workflow.yml").read_text()
    (line,) = [ln for ln in text.splitlines() if ln.strip().startswith("opweave-plan regen ")]
    args = shlex.split(line.split("|")[0])
    assert parse_hysteresis(args[args.index("--hysteresis") + 1]) == 5.0
    assert re.search(r"--matrix examples/matrix\.toml --out plans/", line)
