"""benchmarks/aic_deployment.py: the recorded aiconfigurator answers are answers to the question our
cases ask, and converting its per-replica figures to GPUs for the target rate reproduces the count it
reports (so the table's GPUs are its, not ours re-derived)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def ad():
    sys.path.insert(0, str(BENCH))
    try:
        import aic_deployment

        yield aic_deployment
    finally:
        sys.path.remove(str(BENCH))


def test_whole_replicas_reach_the_rate(ad):
    assert ad.replicas_for(19.53125, 9.406) == 3
    assert ad.replicas_for(19.53125, 5.377) == 4
    assert ad.replicas_for(20.0, 5.0) == 4  # an exact multiple needs no extra replica
    assert ad.replicas_for(20.0, 25.0) == 1


def test_recorded_answers_are_for_our_cases_and_convert_to_its_gpu_counts(ad):
    recorded = json.loads(ad.RESULT.read_text())
    cases = {ad.case_key(over): over for _, over in ad.SWEEP}
    assert "base" in recorded
    for key, rec in recorded.items():
        assert key in cases, key
        t = ad.traffic(cases[key])
        assert rec["traffic"] == t
        cmd = rec["command"].split()
        for flag, value in (("--isl", t["isl"]), ("--osl", t["osl"]), ("--system", t["system"])):
            assert cmd[cmd.index(flag) + 1] == str(value)
        assert float(cmd[cmd.index("--ttft") + 1]) == t["ttft_ms"]
        assert float(cmd[cmd.index("--tpot") + 1]) == t["tpot_ms"]
        assert float(cmd[cmd.index("--target-request-rate") + 1]) == pytest.approx(t["request_rate"], rel=1e-9)
        assert rec["aiconfigurator_version"] and rec["date_utc"]
        rows = ad._aic_rows(rec, 2.0)  # raises where ceil(rate / per-replica rate) x GPUs differs from its count
        for row, mode in zip(rows, ("disagg", "agg"), strict=True):
            m = rec["modes"][mode]
            assert row[1] == m["total_gpus_needed"] and row[3] == 2.0 * m["total_gpus_needed"]
            assert row[6] == pytest.approx(t["target_tokens_per_s"] / m["total_gpus_needed"])


def test_a_count_it_did_not_report_is_refused(ad):
    rec = json.loads(ad.RESULT.read_text())["base"]
    rec["modes"]["agg"]["request_rate"] *= 2  # half the replicas would do: no longer its answer
    with pytest.raises(RuntimeError, match="aiconfigurator, aggregated"):
        ad._aic_rows(rec, 1.0)


def test_top_row_reads_numbers_as_numbers(ad, tmp_path):
    cols = ad._KEEP["agg"]
    values = {k: "1" for k in cols} | {"request_rate": "5.377", "parallel": "tp1pp1dp4etp4ep1", "backend": "vllm",
                                       "version": "0.24.0"}
    p = tmp_path / "best_config_topn.csv"
    p.write_text(",".join(cols) + ",extra\n" + ",".join(values[k] for k in cols) + ",x\n"
                 + ",".join("9" for _ in cols) + ",y\n")
    got = ad._top(p, "agg")
    assert got["total_gpus_needed"] == 1 and isinstance(got["total_gpus_needed"], int)
    assert got["request_rate"] == 5.377 and got["parallel"] == "tp1pp1dp4etp4ep1" and got["version"] == "0.24.0"
    assert "extra" not in got
