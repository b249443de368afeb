"""Golden plans are re-planned from the request they record and compared byte for byte.

Goldens of the current schema versions must re-plan exactly: any change of a figure, a key
or a rounding fails here, and a deliberate change regenerates them in a commit that says why.
A file is stamped with the lowest version covering its keys, so today's planner writes 1.2
(a fixed context), 1.5 (GPU types searched with different runtime reserves, from a
catalog), 1.6 (an infeasibility record) and 1.8 (a workload distribution, which now records its
preemption target and the owners' KV overflow episodes) files, and since 1.9 every plan says what
binds its batch (`binding`); all of them are re-planned, a golden from before 1.9 compared without
that key and with its own stamp (checked). The
1.3 and 1.4 workload goldens were re-planned deliberately into their 1.8 twins (issue 29: the
reserve is max(preemption target, kv quantile)) and stay as read-compatibility fixtures. A
workload golden records its trace by the path it was made with (absolute, before issue 31; a
plan now records it relative to the working directory): it is re-planned from the shipped example
trace (same sha256) and compared with that one path put back.
Goldens of older 1.x versions stay as read-compatibility fixtures (tests/test_contract.py):
they were written by earlier latency models (1.0 predates the vocab-sharded embedding fix,
f70f3d1; the 1.1 file predates the 1.2 latency-fidelity work) and are only validated and
round-tripped.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from opweave_planner import api
from opweave_planner.contract import read_plan, recorded_request
from opweave_planner.plan import SCHEMA_VERSION, Infeasible, plan_bytes, plan_version

GOLDEN = Path(__file__).parent / "golden"
# keys each MINOR version added (stripped from a fresh plan compared with an older golden)
ADDED_IN = {1: [("stages", "measured_fraction")], 2: [("search", "space", "max_stages")],
            6: [("binding",), ("lowest_tpot_ms",)]}


def _strip(obj: dict, minor: int) -> dict:
    for since, paths in ADDED_IN.items():
        if since <= minor:
            continue
        for path in paths:
            nodes = [obj]
            for key in path[:-1]:
                nodes = [n[key] for n in nodes if key in n]
                nodes = [x for n in nodes for x in (n if isinstance(n, list) else [n])]
            for n in nodes:
                n.pop(path[-1], None)
    return obj


CURRENT = ("1.2", "1.5", "1.6", "1.7", "1.8", "1.9", "1.12", "1.13", SCHEMA_VERSION)  # what the planner writes today
BINDING_MINOR = 9  # a fresh plan carries `binding`; a golden from before it is compared without
# goldens made with a --catalog (plans record its hash, not its path): re-planned with it
CATALOGS = {"llama-3.1-8b_afd_h100+a100-reserve5_v1.5.json": GOLDEN / "catalog-reserve.toml"}
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "traces"


def _golden_files() -> list[Path]:
    return sorted(p for p in GOLDEN.glob("*.json")
                  if orjson.loads(p.read_bytes())["schema_version"] in CURRENT)


def test_there_are_goldens_of_every_minor():
    minors = {orjson.loads(p.read_bytes())["schema_version"] for p in GOLDEN.glob("*.json")}
    assert {"1.0", "1.1", "1.2", "1.3", SCHEMA_VERSION} <= minors, minors
    assert len(_golden_files()) >= 6


@pytest.mark.parametrize("path", _golden_files(), ids=lambda p: p.name)
def test_golden_replans_to_the_same_bytes(path: Path):
    golden = read_plan(path)
    dist = golden.workload.distribution
    trace = None if dist is None else str(EXAMPLES / Path(dist.workload).name)
    catalog = CATALOGS.get(path.name)
    # the same trace elsewhere keeps its recorded shaping
    req = recorded_request(golden, workload=trace, catalog=None if catalog is None else str(catalog))
    if isinstance(golden, Infeasible):
        # an infeasibility record keeps no searched space: this one was written by
        # test_contract.make (its SMALL space); its reason names the GPU set
        from test_contract import SMALL

        gpus = golden.reason.rsplit("GPUs ", 1)[-1].rstrip(")")
        req = api.make_request(golden.model, golden.workload.tpot_slo_ms, golden.workload.context_tokens,
                               gpus=gpus, policy=golden.policy, **SMALL)
    _outcome = api.plan(api.resolve_request(req))
    plan, infeasible = _outcome.plan, _outcome.infeasible
    fresh = orjson.loads(plan_bytes(plan if plan is not None else infeasible))
    minor = int(golden.schema_version.split(".")[1])
    fresh = _strip(fresh, minor)
    if plan is not None and minor < BINDING_MINOR:
        # written before plans said what binds them: the rest must match, stamped as it was
        assert plan_version(plan.model_copy(update={"binding": None})) == golden.schema_version
        fresh.pop("binding", None)  # (_strip drops it already below 1.6: the 1.6 infeasibility key)
        fresh["schema_version"] = golden.schema_version
    # an older file (or an infeasibility record from before 1.6 named its binding constraint):
    # compare what it carries
    if golden.schema_version not in CURRENT or (isinstance(golden, Infeasible) and minor < 6):
        fresh["schema_version"] = golden.schema_version
    from opweave_planner.plan import dumps

    if dist is not None:
        for doc in [fresh, *(a["plan"] for a in fresh.get("alternatives", {}).values())]:
            # recorded relative to the working directory when the trace lies under it
            assert Path(doc["workload"]["distribution"]["workload"]).resolve() == Path(trace).resolve()
            doc["workload"]["distribution"]["workload"] = dist.workload
    assert dumps(fresh) == path.read_bytes()
