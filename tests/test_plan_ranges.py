"""A plan file's recorded network and prices are what simulate rebuilds the hardware from: a
tampered figure outside the catalog's physical range is an inconsistent plan (exit 2, one line
naming the key), never an internal error (found by the long fuzz profile: a bandwidth of 9.2e18)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from conftest import run_cli

GOLDEN = Path(__file__).parent / "golden" / "llama-3.1-8b_afd_h100+a100-reserve5_v1.5.json"


def _tamper(doc: dict, key: str, value: float) -> None:
    if key == "price":
        doc["provenance"]["prices_usd_per_gpu_hour"]["h100"] = value
        for o in doc["owners"]:
            if o["gpu"] == "h100":
                o["usd_per_hour_per_replica"] = value * o["tensor_parallel"]
    else:
        doc["provenance"]["network"][key] = value


@pytest.mark.parametrize("key, value, where", [
    ("inter_node_gbps", 9.223372036854776e18, "provenance.network.inter_node_gbps"),
    ("inter_node_gbps", 1e-300, "provenance.network.inter_node_gbps"),
    ("inter_node_latency_us", 1e18, "provenance.network.inter_node_latency_us"),
    ("intra_node_latency_us", 1e18, "provenance.network.intra_node_latency_us"),
    ("price", 1e18, "provenance.prices_usd_per_gpu_hour.h100"),
])
@pytest.mark.parametrize("command", ["simulate", "diff"])
def test_out_of_range_recorded_figures_are_an_inconsistent_plan(tmp_path, key, value, where, command):
    doc = orjson.loads(GOLDEN.read_bytes())
    _tamper(doc, key, value)
    bad = tmp_path / "plan.json"
    bad.write_bytes(orjson.dumps(doc))
    argv = ["simulate", bad] if command == "simulate" else ["diff", GOLDEN, bad]
    ran = run_cli(*argv)
    assert ran.code == 2, ran.err
    lines = [ln for ln in ran.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "inconsistent plan" in lines[0] and where in lines[0], ran.err
