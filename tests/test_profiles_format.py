"""Profile format: round trip, validation messages, cached loading of the shipped tables."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from opweave_planner.data import shipped_dir
from opweave_planner.errors import UserError
from opweave_planner.latency.tables import (
    FORMAT_VERSION,
    available_gpus,
    load_profile_set,
    read_system,
    read_table,
    table_payload,
    write_json,
)

PROFILES = shipped_dir("profiles")


def _tiny_payload() -> dict:
    pts = {("bfloat16", 64, 32, m): 1.0 + m / 3 for m in (1, 2, 4)}
    pts[("bfloat16", 128, 32, 1)] = 2.5
    return table_payload("gemm", "tiny", "vllm", pts, backend_version="0", source="test")


def test_round_trip(tmp_path):
    path = tmp_path / "gemm.json"
    write_json(path, _tiny_payload())
    table = read_table(path)
    assert table.format_version == FORMAT_VERSION
    assert table.axes["m"] == (1, 2, 4)
    np.testing.assert_allclose(table.grids[("bfloat16", 64, 32)], [1.333, 1.667, 2.333])
    assert np.isnan(table.grids[("bfloat16", 128, 32)][1:]).all()
    write_json(tmp_path / "again.json", table.model_dump())
    assert read_table(tmp_path / "again.json").grids.keys() == table.grids.keys()


def test_payload_is_monotone_and_labels_moved_cells():
    pts = {("bfloat16", 8, 8, m): v for m, v in ((1, 5.0), (2, 4.0), (4, 6.0))}
    payload = table_payload("gemm", "g", "b", pts)
    # the dip is a spike: replaced by its neighbours' line, not turned into a plateau at 5
    assert payload["groups"][0]["latency_us"] == [5.0, 5.333, 6.0]
    assert payload["groups"][0]["labels"] == {"smoothed": [1]}
    assert "moved 1 by more than 3%" in payload["notes"]
    table = read_table_payload(payload)
    assert table.labels[("bfloat16", 8, 8)].tolist() == [0, 1, 0]


def read_table_payload(payload):
    from opweave_planner.latency.tables import GridTable

    return GridTable.model_validate(payload)


def test_payload_floors_cells_below_speed_of_light():
    pts = {("bfloat16", 8, 8, m): v for m, v in ((1, 1.0), (2, 2.0), (4, 3.0))}
    payload = table_payload("gemm", "g", "b", pts, floor=lambda key, coords: 0.9 * coords[0])
    assert payload["groups"][0]["latency_us"] == [1.0, 2.0, 3.6]
    assert payload["groups"][0]["labels"] == {"floored": [2]}


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.update(format_version=99), "format_version 99 is not supported"),
        (lambda d: d.update(kind="nope"), "kind"),
        (lambda d: d["groups"][0].update(latency_us=[1.0]), "shape"),
        (lambda d: d["groups"][0].update(latency_us=[-1.0, 1.0, 2.0]), "positive"),
        (lambda d: d.update(key_fields=["n", "k"]), "key_fields must be"),
        (lambda d: d["axes"].update(m=[4, 2, 1]), "strictly increasing"),
        (lambda d: d.update(surprise=1), "surprise"),
    ],
)
def test_bad_table_is_one_line_user_error(tmp_path, mutate, expected):
    data = _tiny_payload()
    mutate(data)
    path = tmp_path / "gemm.json"
    path.write_bytes(orjson.dumps(data))
    with pytest.raises(UserError) as err:
        read_table(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and expected in msg


def test_not_json_and_missing(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{nope")
    with pytest.raises(UserError, match="not valid JSON"):
        read_table(bad)
    with pytest.raises(UserError, match=r"missing\.json' does not exist"):
        read_system(tmp_path / "missing.json")
    import os

    os.mkfifo(tmp_path / "fifo.json")  # refused with its reason, never opened (it would block)
    with pytest.raises(UserError, match=r"fifo.json' is not a regular file \(a FIFO\)"):
        read_table(tmp_path / "fifo.json")


def test_shipped_profiles_load():
    assert {"h100", "h200", "a100", "l40s"} <= set(available_gpus(PROFILES))
    for gpu in ("h100", "h200", "a100", "l40s"):
        ps = load_profile_set(PROFILES, gpu, "vllm")
        assert {"gemm", "attention", "allreduce"} <= set(ps.tables)
        assert ps.system.memory_bandwidth_gbps > 500
        assert ps.system.peak("bfloat16") > 100
    assert load_profile_set(PROFILES, "h100") is load_profile_set(PROFILES, "h100", "vllm")


def test_unknown_gpu_or_backend():
    with pytest.raises(UserError, match="no profile for GPU 'b300'"):
        load_profile_set(PROFILES, "b300")
    with pytest.raises(UserError, match="no 'sglang' tables"):
        load_profile_set(PROFILES, "h100", "sglang")


def test_stacked_read_equals_the_group_by_group_read():
    """The one-conversion read of a table gives the grids and labels the per-group checks give."""
    for gpu in ("h100", "a100"):
        for kind in ("gemm", "attention", "moe"):
            table = load_profile_set(PROFILES, gpu).tables[kind]
            shape = tuple(a.size for a in table.axis_arrays)
            assert table._stacked(shape) is not None  # the shipped tables take the fast read
            grids, labels = table._one_by_one(shape)
            assert list(grids) == list(table.grids) and list(labels) == list(table.labels)
            for key, grid in grids.items():
                assert grid.tobytes() == table.grids[key].tobytes()
                assert labels[key].tobytes() == table.labels[key].tobytes()


def test_tables_are_read_on_first_use(tmp_path):
    """A profile set reads a kind's file when asked for it: a broken file the plan never reads
    costs nothing, and one it reads is the same one-line error as before."""
    import shutil

    shutil.copytree(PROFILES / "h100", tmp_path / "h100")
    (tmp_path / "h100" / "vllm" / "context_attention.json").write_text("{not json")
    (tmp_path / "h100" / "vllm" / "gemm.json").write_text('{"format_version": 99}')
    ps = load_profile_set(tmp_path, "h100")
    assert "context_attention" in ps.tables and "gemm" in ps.tables and "nope" not in ps.tables
    assert ps.tables.get("nope") is None
    assert ps.tables["attention"].kind == "attention"
    with pytest.raises(UserError, match="gemm.json: format_version 99 is not supported"):
        ps.tables["gemm"]
    with pytest.raises(UserError, match="context_attention.json: not valid JSON"):
        ps.table("context_attention")
