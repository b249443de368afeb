"""The plan records the runtime reserve each GPU type was searched with (issue 25): a catalog may
give GPU types their own reserve, and simulate/regen must judge the plan under that, not under a
single recorded 3.5 GiB read back as an explicit setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from opweave_planner import api
from opweave_planner.contract import evaluate_plan, read_plan, recorded_request
from opweave_planner.latency.memory import GIB
from opweave_planner.plan import plan_version

GOLDEN = Path(__file__).parent / "golden"
CATALOG = GOLDEN / "catalog-reserve.toml"  # a100: 5 GiB, h100: the profiled 3.5 GiB
PLAN = GOLDEN / "llama-3.1-8b_afd_h100+a100-reserve5_v1.5.json"
SMALL = dict(max_owners=2, batches=(8, 16), max_replicas=1, tensor_parallel_sizes=(1,))


def test_catalog_reserves_are_recorded_per_gpu_type():
    plan = read_plan(PLAN)
    space = plan.search.space
    assert plan.schema_version == "1.5"
    assert space.memory_reserve_gb_by_gpu == {"a100": 5.0, "h100": 3.5}
    assert space.reserve_gb("a100") == 5.0 and space.reserve_gb("h100") == 3.5
    assert space.memory_reserve_gb == 5.0  # the largest, for a reader that knows only the scalar
    assert recorded_request(plan).memory_reserve_gb is None  # the catalog's own, not an override


def test_simulate_judges_the_plan_under_its_own_reserves():
    plan = read_plan(PLAN)
    own = evaluate_plan(plan, catalog=str(CATALOG))
    flat = evaluate_plan(plan, catalog=str(CATALOG), memory_reserve_gb=3.5)
    gpus = [o.gpu for o in plan.owners]
    for gpu, (_, usable), (_, usable_flat) in zip(gpus, own.memory, flat.memory, strict=True):
        want = 1.5 * GIB if gpu == "a100" else 0.0
        assert usable_flat - usable == pytest.approx(want, rel=1e-9, abs=1.0), gpu
    assert own.plan.usd_per_million_tokens == plan.usd_per_million_tokens
    assert own.plan.tpot_ms == plan.tpot_ms


@pytest.mark.parametrize("reserve", [None, 4.0])
def test_one_reserve_keeps_the_scalar_and_the_old_stamp(reserve):
    catalog = None if reserve is None else str(CATALOG)  # an explicit reserve wins over the catalog
    plan = api.plan(api.make_request("llama-3.1-8b", 60, 8192, gpus="h100,a100", policy="colocated",
                                        catalog=catalog, memory_reserve_gb=reserve, **SMALL)).plan
    space = plan.search.space
    assert space.memory_reserve_gb_by_gpu is None
    assert space.memory_reserve_gb == (3.5 if reserve is None else reserve)
    # the reserve keys add nothing: 1.2 but for the plan's 1.9 binding record
    assert plan.schema_version == "1.9" and plan_version(plan.model_copy(update={"binding": None})) == "1.2"
