"""regen's summary hides nothing (issue 31): infeasible entries with their binding constraint and
an exit status for them, provenance-only changes apart from cost changes, and `deployable`:
plans a named runtime runs, searched under that exporter's own limits and checked by its rule."""

from __future__ import annotations

import orjson
import pytest
from cli_helpers import cli
from test_regen import MATRIX

from opweave_planner.export.registry import runs
from opweave_planner.regen import CACHE_FILE, regen

HEAD = MATRIX[:MATRIX.index("[[entry]]")]  # test_regen's small space and prices file

# one feasible colocated entry on a two-type set (it uses one type) and one no plan meets
SUMMARY = HEAD + """
[[entry]]
models = "llama-3.1-8b"
contexts = "8k"
slos = ["30ms", "1ms"]
gpus = "h100,a100"
policies = "colocated"
"""

# llama-3.1-8b at 32k / 60 ms: the cheapest plan of this space's grid is a 64-stage pipeline
# (with the batch caps a one-stage plan at a cap is cheaper)
PIPELINE = HEAD + """
[[entry]]
models = "llama-3.1-8b"
contexts = "32k"
slos = "60ms"
gpus = "h100,a100"
policies = "opweave"
batch_caps = false
"""
PIPELINE_FILE = "llama-3.1-8b_ctx32k_slo60ms_h100+a100_opweave.json"


def _folder(tmp_path, text: str):
    (tmp_path / "prices.toml").write_text("h100 = 3.49\na100 = 1.74\n")
    m = tmp_path / "matrix.toml"
    m.write_text(text)
    return m


def _doc(path) -> dict:
    return orjson.loads(path.read_bytes())


def test_infeasible_listed_with_binding_and_fail_on(tmp_path):
    m, out = _folder(tmp_path, SUMMARY), tmp_path / "plans"
    rep = regen(m, out)
    bad = "llama-3.1-8b_ctx8k_slo1ms_h100+a100_colocated.json"
    assert [f.name for f in rep.infeasible] == [bad]
    assert rep.to_dict()["infeasible"][0]["binding"] == "slo" == _doc(out / bad)["binding"]
    text = "\n".join(rep.lines())
    assert "1 infeasible" in text.splitlines()[0]
    assert f"{bad}: slo: " in text and "SLO 1 ms" in text
    assert "other: 1" in text  # the feasible new file; the infeasible one is not listed twice
    assert rep.exit_code == 1  # files written; infeasibility fails the job only when asked
    (out / CACHE_FILE).unlink()
    again = regen(m, out, fail_on="infeasible")
    assert again.exit_code == 3 and "  infeasible (no plan meets the request): 1" in again.lines()
    # an entry skipped by the cache record is still reported infeasible
    cached = cli("regen", "--matrix", str(m), "--out", str(out), "--fail-on", "infeasible", "-q", "--json")
    assert cached.returncode == 3 and orjson.loads(cached.stdout)["counts"]["infeasible"] == 1
    wrong = cli("regen", "--matrix", str(m), "--out", str(out), "--fail-on", "slow")
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines() == [
        "error: --fail-on: unknown condition 'slow'; expected infeasible or undeployable (comma-separated)"]


def test_price_of_an_unused_gpu_is_a_provenance_only_change(tmp_path):
    m, out = _folder(tmp_path, SUMMARY), tmp_path / "plans"
    regen(m, out)
    name = "llama-3.1-8b_ctx8k_slo30ms_h100+a100_colocated.json"
    before = _doc(out / name)
    used = {o["gpu"] for o in before["owners"]}
    unused = ({"h100", "a100"} - used).pop()  # one colocated owner: one type is not used
    prices = {"h100": 3.49, "a100": 1.74}
    prices[unused] *= 1.1
    (tmp_path / "prices.toml").write_text("".join(f"{g} = {p}\n" for g, p in prices.items()))
    rep = regen(m, out)
    after = _doc(out / name)
    assert after["usd_per_million_tokens"] == before["usd_per_million_tokens"] and after != before
    d = rep.to_dict()
    assert d["changes"] == {"topology": [], "cost_only": [], "provenance_only": [name]}
    text = "\n".join(rep.lines())
    assert "provenance-only changes" in text and "cost-only changes" not in text
    assert f"price of {unused}" in text and "same plan, same cost and TPOT" in text


def test_deployable_searches_for_what_the_runtime_runs(tmp_path):
    m, out = _folder(tmp_path, PIPELINE), tmp_path / "plans"
    regen(m, out)
    pipeline = _doc(out / PIPELINE_FILE)
    assert pipeline["num_stages"] > 1 and not runs("vllm", pipeline)  # the case the key is for
    # the hysteresis case of issue 31: a kept or proposed pipeline no exporter runs is prevented
    r = cli("regen", "--matrix", str(m), "--out", str(out), "--deployable", "vllm", "--hysteresis", "5%", "-q")
    assert r.returncode == 1, r.stderr
    plan = _doc(out / PIPELINE_FILE)
    assert plan["num_stages"] == 1 and len(plan["owners"]) == 1 and runs("vllm", plan)
    assert plan["search"]["space"]["max_stages"] == 1
    assert "topology changes" in r.stdout and "searched over a different space" in r.stdout
    assert plan["usd_per_million_tokens"] >= pipeline["usd_per_million_tokens"]  # the price of running it
    # the matrix key wins over the flag; "any" asks for nothing
    m.write_text(PIPELINE.replace('[[entry]]', '[[entry]]\ndeployable = "any"'))
    regen(m, out, deployable="vllm")
    assert _doc(out / PIPELINE_FILE) == pipeline


def test_undeployable_is_not_written_and_exits_3(tmp_path):
    text = SUMMARY.replace('slos = ["30ms", "1ms"]', 'slos = "30ms"') + 'deployable = "vllm-afd"\n'
    m, out = _folder(tmp_path, text), tmp_path / "plans"
    rep = regen(m, out)
    assert rep.exit_code == 3 and rep.count("undeployable") == 1
    assert "undeployable llama-3.1-8b_ctx8k_slo30ms_h100+a100_colocated.json: vllm-afd cannot run" in \
        "\n".join(rep.lines())
    assert not list(out.glob("*.json"))


@pytest.mark.parametrize("where", ["top", "flag"])
def test_unknown_runtime_is_one_line(tmp_path, where):
    m = _folder(tmp_path, ('deployable = "vlm"\n' if where == "top" else "") + SUMMARY)
    r = cli("regen", "--matrix", str(m), "--out", str(tmp_path / "plans"),
            *(["--deployable", "vlm"] if where == "flag" else []))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "unknown runtime 'vlm'; expected one of vllm, " in lines[0]
    assert ("--deployable" if where == "flag" else "matrix.toml: deployable") in lines[0]


def test_deployable_takes_the_tighter_limits(tmp_path):
    from opweave_planner.regen import load_matrix

    m = _folder(tmp_path, PIPELINE.replace("[[entry]]", '[[entry]]\nmax_stages = 2\nmax_owners = 1'))
    (plain,) = load_matrix(m)
    (vllm,) = load_matrix(m, "vllm")
    (afd,) = load_matrix(m, "vllm-afd")  # no limit expresses an attention | FFN split: a filter
    assert (plain.request.max_stages, plain.request.max_owners, plain.deployable) == (2, 1, None)
    assert (vllm.request.max_stages, vllm.request.max_owners, vllm.deployable) == (1, 1, "vllm")
    assert afd.request == plain.request and afd.deployable == "vllm-afd"
