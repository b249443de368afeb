"""The workload package: grammar, trace formats, bad inputs, the stationary context law,
scaling and length limits, scenarios (common random numbers) and the KV tail."""

from __future__ import annotations

import hashlib
import itertools
import pickle
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opweave_planner.errors import UserError
from opweave_planner.inputs.units import parse_tokens
from opweave_planner.workload import spec as wl
from opweave_planner.workload import traces
from opweave_planner.workload.edge import trace_workload, workload_spec
from opweave_planner.workload.kv import kv_bytes, kv_quantile, kv_sum_bounds, kv_sum_quantile
from opweave_planner.workload.law import scenarios, stationary_moments, step_percentile
from opweave_planner.workload.reader import read_trace
from opweave_planner.workload.sampling import LengthDist, ParametricWorkload, load_trace
from opweave_planner.workload.shaping import apply_max_model_len, materialize
from opweave_planner.workload.spec import (
    FixedContextSpec,
    LawSpec,
    LengthLaw,
    TraceSpec,
    is_inline_law,
    parse_law,
    parse_percentile,
    parse_quantile,
)

SRC = str(Path(wl.__file__).resolve().parents[2])


def _steps(prompt, output):
    """Every decode step of every request listed: the brute-force stationary law."""
    return np.concatenate([p + np.arange(d) for p, d in zip(prompt, output)]).astype(np.int64)


def _write(tmp_path, text, name="trace.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _law(text, **kw):
    return materialize(workload_spec(workload=text, **kw))


# --------------------------------------------------------------------------- grammar


@pytest.mark.parametrize(
    "text, value",
    [("32k", 32768), ("1.5k", 1536), ("131072", 131072), (" 8K ", 8192), ("2m", 2 << 20),
     (".5k", 512), (4096, 4096), ("0.25k", 256)],
)
def test_parse_tokens(text, value):
    assert parse_tokens(text) == value


@pytest.mark.parametrize("text", ["0.3k", "0", "-1", "abc", "1.5", "k", "", "32kb", True, 0])
def test_parse_tokens_rejects_with_the_field(text):
    with pytest.raises(UserError, match="--max-model-len"):
        parse_tokens(text, "--max-model-len")


@pytest.mark.parametrize("value", [0, 100, -5, "abc", "nan", 100.0001])
def test_percentile_outside_open_interval_is_rejected(value):
    with pytest.raises(UserError, match="--slo-percentile"):
        parse_percentile(value)


@pytest.mark.parametrize("value", [0, 1, 1.5, -0.1, "x", "inf"])
def test_quantile_outside_open_interval_is_rejected(value):
    with pytest.raises(UserError, match="--kv-quantile"):
        parse_quantile(value)


def test_percentile_and_quantile_accept_inside():
    assert parse_percentile("95") == 95.0 and parse_percentile(99.9) == 99.9
    assert parse_quantile("0.999") == 0.999


# --------------------------------------------------------------------------- formats

PROMPTS = [374, 396, 0, 91]
OUTPUTS = [44, 109, 55, 1]
FORMATS = {
    "azure": ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
              + "".join(f"2023-11-16 18:15:4{i}.68,{p},{o}\n"
                        for i, (p, o) in enumerate(zip(PROMPTS, OUTPUTS)))),
    "burstgpt": ("b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 + "".join(f"{i}.0,ChatGPT,{p},{o},{p + o},Conversation log\n"
                           for i, (p, o) in enumerate(zip(PROMPTS, OUTPUTS)))),
    "mooncake": ("m.jsonl", "".join(
        f'{{"timestamp": {i}, "input_length": {p}, "output_length": {o}, "hash_ids": [0, {i}]}}\n'
        for i, (p, o) in enumerate(zip(PROMPTS, OUTPUTS)))),
    "vidur": ("v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n"
              + "".join(f"{i * 0.5},{p},{o}\n" for i, (p, o) in enumerate(zip(PROMPTS, OUTPUTS)))),
    "plain": ("p.csv", "output_tokens,prompt_tokens\n"
              + "".join(f"{o},{p}\n" for p, o in zip(PROMPTS, OUTPUTS))),
    "afd": ("d.csv", "id,prompt_len,decode_len\n"
            + "".join(f"r{i},{p},{o}\n" for i, (p, o) in enumerate(zip(PROMPTS, OUTPUTS)))),
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_format_is_recognised_from_its_header(tmp_path, fmt):
    name, text = FORMATS[fmt]
    path = _write(tmp_path, text, name)
    tr = read_trace(path)
    assert tr.format == fmt
    np.testing.assert_array_equal(tr.prompt, PROMPTS)
    np.testing.assert_array_equal(tr.output, OUTPUTS)
    assert tr.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert tr.prompt.dtype == np.int64 and tr.rows == 4


def test_every_registered_format_has_a_sample_here():
    assert set(FORMATS) == set(traces.FORMATS)


def test_help_errors_and_docs_list_the_registered_formats(tmp_path):
    """The formats are declared once (workload/traces.py); every text that lists them reads it."""
    from opweave_planner.afd.request import AfdSetup
    from opweave_planner.inputs.request import PlanRequest

    root = Path(__file__).resolve().parents[1]
    table = traces.docs_table()
    assert table in (root / "docs" / "workloads.md").read_text(), f"docs/workloads.md's table should read:\n{table}"
    assert traces.listing() in PlanRequest.model_fields["workload"].description
    assert traces.listing() in AfdSetup.model_fields["trace"].description
    with pytest.raises(UserError) as err:
        read_trace(_write(tmp_path, "a,b\n1,2\n"))
    assert all(f"{f.label} {f.kind} ({f.pair})" in str(err.value) for f in traces.FORMATS.values())


def test_a_made_up_format_is_read_by_its_declaration_alone(tmp_path, monkeypatch):
    """Adding a CSV format is its TraceFormat: the reader, its errors, help and the inline-law
    rule follow."""
    made_up = traces.TraceFormat("example", "Example", ("in_tokens",), ("out_tokens", "gen_tokens"),
                                 "a made-up source", suffixes=(".csv", ".tsvx"))
    monkeypatch.setattr(traces, "FORMATS", MappingProxyType({**traces.FORMATS, "example": made_up}))
    tr = read_trace(_write(tmp_path, "id,GEN_TOKENS,In_Tokens\nr0,5,100\nr1,1,0\n"))
    assert tr.format == "example" and tr.prompt.tolist() == [100, 0] and tr.output.tolist() == [5, 1]
    with pytest.raises(UserError, match="line 2: output length must be an integer >= 1"):
        read_trace(_write(tmp_path, "in_tokens,out_tokens\n5,0\n", "bad.csv"))
    with pytest.raises(UserError, match=r"two columns of one kind \('out_tokens', 'gen_tokens'\)"):
        read_trace(_write(tmp_path, "in_tokens,out_tokens,gen_tokens\n5,1,1\n", "two.csv"))
    with pytest.raises(UserError, match=r"Example CSV \(in_tokens,out_tokens\)"):
        read_trace(_write(tmp_path, "a,b\n1,2\n", "unknown.csv"))
    assert "AFD (prompt,decode) or Example CSV, Mooncake JSONL" in traces.listing()
    assert "| `example` | one of `in_tokens` and one of `out_tokens`/`gen_tokens` | a made-up source |" in (
        traces.docs_table())
    assert not is_inline_law("fixed:5;out=fixed:1.tsvx") and is_inline_law("fixed:5;out=fixed:1")


def test_bom_crlf_and_blank_lines_are_tolerated(tmp_path):
    path = tmp_path / "w.csv"
    path.write_bytes(b"\xef\xbb\xbfprompt_tokens,output_tokens\r\n5,2\r\n\r\n7,3\r\n")
    tr = read_trace(path)
    np.testing.assert_array_equal(tr.prompt, [5, 7])
    np.testing.assert_array_equal(tr.output, [2, 3])


def test_long_trace_is_read_in_chunks(tmp_path):
    n = 150_000  # more than two read chunks
    rng = np.random.default_rng(3)
    p, o = rng.integers(0, 50_000, n), rng.integers(1, 900, n)
    body = "\n".join(f"{a},{b}" for a, b in zip(p, o))
    tr = read_trace(_write(tmp_path, "prompt_tokens,output_tokens\n" + body + "\n"))
    np.testing.assert_array_equal(tr.prompt, p)
    np.testing.assert_array_equal(tr.output, o)
    lines = "".join(f'{{"input_length": {a}, "output_length": {b}}}\n' for a, b in zip(p, o))
    tj = read_trace(_write(tmp_path, lines, "t.jsonl"))
    np.testing.assert_array_equal(tj.output, o)


def test_bad_row_deep_in_a_long_trace_is_found_by_line(tmp_path):
    rows = ["3,4"] * 70_000
    rows[69_990] = "3,x"
    path = _write(tmp_path, "prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    with pytest.raises(UserError, match="line 69992: output length"):
        read_trace(path)


@pytest.mark.parametrize(
    "name, text, needle",
    [
        ("e.csv", "", "empty file"),
        ("e.csv", "\n\n", "empty file"),
        ("h.csv", "prompt_tokens,output_tokens\n", "no data rows"),
        ("u.csv", "a,b\n1,2\n", "unknown header"),
        ("n.csv", "prompt_tokens,output_tokens\n12,abc\n", "line 2: output length must be an integer >= 1, got 'abc'"),
        ("f.csv", "prompt_tokens,output_tokens\n12.5,3\n", "line 2: prompt length"),
        ("g.csv", "prompt_tokens,output_tokens\n1,2\n-3,4\n", "line 3: prompt length must be an integer >= 0"),
        ("z.csv", "ContextTokens,GeneratedTokens\n5,0\n", "line 2: output length must be an integer >= 1, got '0'"),
        ("s.csv", "prompt_tokens,output_tokens\n1,2\n3\n", "line 3: expected 2 columns, got 1"),
        ("x.csv", "prompt_tokens,output_tokens\n1,2\n99999999999999999999,1\n", "line 3: prompt length 99999999999999999999 exceeds"),
        ("y.jsonl", '{"input_length": 5, "output_length": 99999999999999}\n', "line 1: output length 99999999999999 exceeds"),
        ("j.jsonl", '{"input_length": 5, "output_length": 0}\n', "line 1: output length"),
        ("k.jsonl", '{"input_length": -5, "output_length": 2}\n', "line 1: prompt length"),
        ("l.jsonl", '{"input_length": 5, "output_length": 2}\n{"input_length": "5"}\n', "line 2: expected a JSON object"),
        ("o.jsonl", '{"input_length": 5, "output_length": 2.5}\n', "line 1: output length"),
        ("p.jsonl", '{"input_length": 5, "output_length": 2}\n{oops\n', "line 2: not a JSON object"),
    ],
)
def test_bad_traces_give_one_line_naming_the_file(tmp_path, name, text, needle):
    path = _write(tmp_path, text, name)
    with pytest.raises(UserError, match=needle) as err:
        workload_spec(workload=str(path))
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg


def test_not_utf8_and_missing_file(tmp_path):
    path = tmp_path / "bin.csv"
    path.write_bytes(b"prompt_tokens,output_tokens\n\xff\xfe,1\n")
    with pytest.raises(UserError, match="not UTF-8"):
        read_trace(path)
    with pytest.raises(UserError, match="does not exist"):
        read_trace(tmp_path / "nope.csv")
    with pytest.raises(UserError, match="no such file"):
        workload_spec(workload=str(tmp_path / "nope.csv"))


def test_every_request_longer_than_max_model_len_is_an_error(tmp_path):
    path = _write(tmp_path, "prompt_tokens,output_tokens\n5000,10\n6000,3\n")
    for overflow in ("clip", "drop"):  # (truncate serves every request)
        with pytest.raises(UserError, match="every request is longer than --max-model-len") as e:
            workload_spec(workload=str(path), max_model_len="4k", overflow=overflow)
        assert str(path.resolve()) in str(e.value)


def test_file_changed_after_reading_is_detected(tmp_path):
    path = _write(tmp_path, "prompt_tokens,output_tokens\n5,1\n")
    spec = TraceSpec(path=str(path), format="plain", sha256="0" * 64, rows=1)
    with pytest.raises(UserError, match="sha256 differs"):
        materialize(spec)


def test_ctx_and_workload_are_exclusive():
    with pytest.raises(UserError, match="exactly one"):
        workload_spec()
    with pytest.raises(UserError, match="exactly one"):
        workload_spec(ctx="32k", workload="fixed:1;out=fixed:1")
    with pytest.raises(UserError, match="only apply to --workload"):
        workload_spec(ctx="32k", max_model_len="64k")


# --------------------------------------------------------------------------- laws


def test_inline_law_grammar():
    p, o = parse_law("lognormal:mean=12k,cv=1.2;out=geometric:mean=300")
    assert p == LengthLaw(dist="lognormal", mean=12288, cv=1.2)
    assert o == LengthLaw(dist="geometric", mean=300)
    p2, o2 = parse_law("prompt=fixed:1.5k; output=geometric:300")
    assert (p2.mean, o2.mean) == (1536, 300)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("lognormal:mean=12k;out=geometric:300", "needs cv"),
        ("poisson:3;out=geometric:300", "unknown law"),
        ("fixed:10", "needs a prompt and an output"),
        ("fixed:10;out=geometric:0.5", "must be >= 1"),
        ("fixed:10;out=fixed:0", "whole number >= 1"),
        ("fixed:0.3k;out=fixed:1", "whole number"),
        ("geometric:cv=2;out=fixed:1", "takes mean"),
        ("fixed:10;out=fixed:2;out=fixed:3", "one prompt= and one out="),
        ("lognormal:mean=1k,cv=-1;out=fixed:2", "cv"),
    ],
)
def test_bad_laws_are_one_line(text, needle):
    with pytest.raises(UserError, match=needle) as err:
        workload_spec(workload=text)
    assert "\n" not in str(err.value)


def test_toml_law_file(tmp_path):
    path = _write(tmp_path, '[prompt]\ndist = "lognormal"\nmean = "12k"\ncv = 1.2\n\n'
                  '[output]\ndist = "geometric"\nmean = 300\n', "law.toml")
    spec = workload_spec(workload=str(path))
    assert spec == workload_spec(workload="lognormal:mean=12k,cv=1.2;out=geometric:mean=300")
    bad = _write(tmp_path, '[prompt]\ndist = "fixed"\nmean = 5\n', "bad.toml")
    with pytest.raises(UserError, match=r"\[output\] table"):
        workload_spec(workload=str(bad))


@pytest.mark.parametrize(
    "prompt, output",
    [(("geometric", 100), ("geometric", 500)), (("fixed", 30), ("geometric", 40)),
     (("geometric", 7), ("fixed", 25)), (("fixed", 0), ("fixed", 1))],
)
def test_law_moments_match_the_closed_forms(prompt, output):
    w = _law(f"{prompt[0]}:{prompt[1]};out={output[0]}:{output[1]}")
    ref = ParametricWorkload(LengthDist(*prompt), LengthDist(*output)) if prompt[1] else None
    if ref is not None:
        assert w.theta == pytest.approx(ref.theta, rel=1e-6)
        assert w.nu2 == pytest.approx(ref.nu2, rel=1e-6)
    else:
        assert (w.theta, w.nu2) == (0.0, 0.0)


def test_fixed_prompt_geometric_output_closed_form():
    # A is geometric on {0, 1, ...} with the output's p: theta = P + m - 1, nu^2 = m (m - 1)
    w = _law("fixed:1000;out=geometric:mean=200")
    assert w.theta == pytest.approx(1000 + 199, rel=1e-8)
    assert w.nu2 == pytest.approx(200 * 199, rel=1e-6)
    assert w.naive_mean == pytest.approx(1100, rel=1e-8)
    # fixed d: A uniform on 0..d-1
    f = _law("fixed:10;out=fixed:31")
    assert (f.theta, f.nu2) == pytest.approx((10 + 15, (31**2 - 1) / 12))
    assert (f.min_context, f.max_context) == (10, 40)
    np.testing.assert_allclose(f.pmf[10:41], 1 / 31)


def test_lognormal_law_has_its_mean_and_cv():
    w = _law("lognormal:mean=4k,cv=0.8;out=fixed:1")
    assert w.mean_prompt == pytest.approx(4096, rel=1e-4)
    assert w.theta == pytest.approx(4096, rel=1e-4)
    assert w.cv == pytest.approx(0.8, rel=1e-3)


def _product_atoms(prompt: LengthLaw, output: LengthLaw, cap=None):
    wp, wd = prompt.pmf(0, cap), output.pmf(1, None if cap is None else cap + 1)
    pp, dd = np.nonzero(np.outer(wp, wd))
    return pp, dd, (wp[pp] * wd[dd])


@pytest.mark.parametrize("overflow", ["clip", "drop"])
def test_law_length_limit_matches_the_joint_enumeration(overflow):
    prompt, output = LengthLaw(dist="geometric", mean=30), LengthLaw(dist="geometric", mean=25)
    L = 60
    pp, dd, ww = _product_atoms(prompt, output, L)
    over = pp + dd > L
    if overflow == "drop":
        keep = ~over
        p2, d2 = pp[keep], dd[keep]
    else:
        keep = pp < L
        p2, d2 = pp[keep], np.minimum(dd, L - pp)[keep]
    w2 = ww[keep]
    theta, nu2 = stationary_moments(p2, d2, w2)
    w = _law("geometric:30;out=geometric:25", max_model_len=L, overflow=overflow)
    assert w.theta == pytest.approx(theta, rel=1e-9)
    assert w.nu2 == pytest.approx(nu2, rel=1e-7)
    assert w.max_context <= L - 1
    assert w.mean_prompt == pytest.approx((p2 * w2).sum() / w2.sum(), rel=1e-9)
    assert w.mean_output == pytest.approx((d2 * w2).sum() / w2.sum(), rel=1e-9)
    assert w.dropped == pytest.approx(1 - w2.sum(), abs=1e-9)
    if overflow == "clip":
        assert w.clipped == pytest.approx(ww[over & (pp < L)].sum(), abs=1e-9)


# --------------------------------------------------------------------------- traces: exact law


def test_trace_law_matches_brute_force_enumeration(tmp_path):
    rng = np.random.default_rng(5)
    d = rng.integers(1, 60, size=300)
    p = 3 * d + rng.integers(0, 20, size=300)  # dependent lengths
    path = _write(tmp_path, "prompt_tokens,output_tokens\n"
                  + "".join(f"{a},{b}\n" for a, b in zip(p, d)))
    w = trace_workload(path)
    steps = _steps(p, d)
    assert w.theta == pytest.approx(steps.mean(), rel=1e-12)
    assert w.nu2 == pytest.approx(steps.var(), rel=1e-10)
    counts = np.bincount(steps, minlength=w.pmf.size)[: w.pmf.size] / steps.size
    np.testing.assert_allclose(w.pmf, counts, atol=1e-15)
    for q in (0.01, 0.25, 0.5, 0.9, 0.99, 0.999):
        assert w.quantile(q) == int(np.quantile(steps, q, method="inverted_cdf"))
    assert (w.min_context, w.max_context) == (steps.min(), steps.max())
    assert w.naive_mean == pytest.approx(p.mean() + d.mean() / 2)
    assert w.theta > w.naive_mean  # length-biasing with positively dependent lengths


def test_fixed_context_is_todays_behaviour():
    spec = workload_spec(ctx="32k")
    assert spec == FixedContextSpec(context=32768)
    w = materialize(spec)
    assert (w.theta, w.nu2, w.min_context, w.max_context) == (32768.0, 0.0, 32768, 32768)
    assert w.is_fixed and w.quantile(0.999) == 32768
    assert (w.sample(0, 5) == 32768).all()
    assert (scenarios(w, 3, 4, seed=1) == 32768).all()
    assert kv_sum_quantile(w, 8, 0.999, 100.0, [(1024, 10.0)], 7.0) == 8 * (100 * 32768 + 10240 + 7)
    assert w.describe()["context_tokens"] == 32768


def test_specs_are_hashable_picklable_and_materialised_once(tmp_path):
    path = _write(tmp_path, "prompt_tokens,output_tokens\n5,2\n9,4\n")
    specs = [workload_spec(ctx="1.5k"), workload_spec(workload=str(path), max_model_len="1k"),
             workload_spec(workload="geometric:50;out=geometric:20")]
    for spec in specs:
        assert hash(spec) == hash(pickle.loads(pickle.dumps(spec)))
        assert pickle.loads(pickle.dumps(spec)) == spec
        assert materialize(spec) is materialize(spec)
        w2 = pickle.loads(pickle.dumps(materialize(spec)))
        assert w2.theta == materialize(spec).theta
    with pytest.raises(Exception):  # noqa: B017 - frozen
        specs[0].context = 3  # type: ignore[misc]
    assert isinstance(specs[1], TraceSpec) and isinstance(specs[2], LawSpec)


def test_afd_load_trace_reads_the_new_formats(tmp_path):
    name, text = FORMATS["mooncake"]
    w = load_trace(_write(tmp_path, text, name))
    np.testing.assert_array_equal(w.decode, OUTPUTS)
    assert w.describe()["format"] == "mooncake" and len(w.describe()["sha256"]) == 64


# --------------------------------------------------------------------------- shaping


def test_clip_and_drop_counts():
    p = np.array([10, 90, 100, 150, 40])
    o = np.array([5, 20, 1, 3, 60])
    p1, o1, clipped, dropped = apply_max_model_len(p, o, 100, "clip")
    # 90+20 clipped to 10 outputs; 100 and 150 leave no room: dropped; 40+60 = 100 fits
    np.testing.assert_array_equal(p1, [10, 90, 40])
    np.testing.assert_array_equal(o1, [5, 10, 60])
    assert (clipped, dropped) == (1, 2)
    p2, _, clipped, dropped = apply_max_model_len(p, o, 100, "drop")
    np.testing.assert_array_equal(p2, [10, 40])
    assert (clipped, dropped) == (0, 3)


def test_truncate_keeps_every_request_and_its_output():
    p = np.array([10, 90, 100, 150, 40, 5])
    o = np.array([5, 20, 1, 3, 60, 120])
    p1, o1, clipped, dropped = apply_max_model_len(p, o, 100, "truncate")
    # the prompt keeps its last 100 - output tokens; an output alone past the limit keeps 99
    np.testing.assert_array_equal(p1, [10, 80, 99, 97, 40, 1])
    np.testing.assert_array_equal(o1, [5, 20, 1, 3, 60, 99])
    assert (clipped, dropped) == (4, 0)
    assert np.all(p1 + o1 <= 100) and np.all(p1 >= 1)


def test_truncate_builds_a_cohort_clipping_cannot(tmp_path):
    # heavy-tailed prompts: rescaling to a high mean under the limit drops most requests with
    # clip; truncate serves all of them, the long histories cut to the window
    rng = np.random.default_rng(5)
    p, d = np.rint(rng.lognormal(8.5, 1.2, 3000)).astype(int) + 1, rng.integers(1, 600, 3000)
    path = _write(tmp_path, "prompt_tokens,output_tokens\n" + "".join(f"{a},{b}\n" for a, b in zip(p, d)))
    with pytest.raises(UserError, match="keeps only"):
        workload_spec(workload=str(path), scale_ctx="64k", max_model_len="128k")
    w = trace_workload(path, scale_ctx="64k", max_model_len="128k", overflow="truncate")
    assert w.theta == pytest.approx(64 * 1024, abs=0.5)
    d_ = w.describe()
    assert d_["requests"] == 3000 and d_["dropped"] == 0 and 0 < d_["clipped"] < 3000
    assert w.max_context <= 128 * 1024 - 1
    np.testing.assert_array_equal(w.output, d)  # outputs served whole
    with pytest.raises(UserError, match=r"serves whole only .* of the requests"):  # the window shapes it
        workload_spec(workload=str(path), scale_ctx="110k", max_model_len="128k", overflow="truncate")


def test_truncate_is_refused_for_a_length_law():
    with pytest.raises(UserError, match="--overflow truncate: applies to a request trace"):
        workload_spec(workload="lognormal:mean=2k,cv=1.2;out=geometric:300", max_model_len="8k",
                      overflow="truncate")
    with pytest.raises(UserError, match="--overflow truncate"):  # the spec itself, built in code
        LawSpec(prompt=LengthLaw(dist="fixed", mean=10.0), output=LengthLaw(dist="fixed", mean=5.0),
                max_model_len=12, overflow="truncate")
    with pytest.raises(UserError, match="--overflow: 'wrap'"):
        apply_max_model_len(np.array([5]), np.array([5]), 8, "wrap")


def test_trace_describe_counts_what_was_kept(tmp_path):
    path = _write(tmp_path, "prompt_tokens,output_tokens\n10,5\n90,20\n100,1\n150,3\n40,60\n")
    w = trace_workload(path, max_model_len=100, overflow="clip")
    d = w.describe()
    assert (d["rows"], d["requests"], d["clipped"], d["dropped"]) == (5, 3, 1, 2)
    assert d["max_context"] == 99
    assert w.theta == pytest.approx(_steps([10, 90, 40], [5, 10, 60]).mean())


@pytest.mark.parametrize("target", ["8k", "32k", "128k"])
def test_scale_ctx_hits_its_target_on_a_trace(tmp_path, target):
    rng = np.random.default_rng(11)
    p, d = rng.integers(100, 20_000, 2000), rng.geometric(1 / 300, 2000)
    path = _write(tmp_path, "prompt_tokens,output_tokens\n"
                  + "".join(f"{a},{b}\n" for a, b in zip(p, d)))
    w = trace_workload(path, scale_ctx=target)
    assert w.theta == pytest.approx(parse_tokens(target), abs=0.5)
    np.testing.assert_array_equal(w.output, d)  # only prompts are rescaled
    np.testing.assert_array_equal(w.prompt, np.rint(p * w.scale).astype(np.int64))
    # with a length limit the target holds for what is kept
    c = trace_workload(path, scale_ctx=target, max_model_len="256k")
    assert c.theta == pytest.approx(parse_tokens(target), abs=0.5)


@pytest.mark.parametrize(
    "text, kw",
    [("lognormal:mean=2k,cv=1.2;out=geometric:300", {"scale_ctx": "8k"}),
     ("lognormal:mean=2k,cv=1.2;out=geometric:300", {"scale_ctx": "8k", "max_model_len": "32k"}),
     ("geometric:2k;out=geometric:100", {"scale_ctx": "1k"})],
)
def test_scale_ctx_hits_its_target_on_a_law(text, kw):
    w = _law(text, **kw)
    assert w.theta == pytest.approx(parse_tokens(kw["scale_ctx"]), rel=1e-6)


def test_scale_ctx_that_keeps_too_few_requests_is_rejected(tmp_path):
    rng = np.random.default_rng(4)
    p, d = rng.integers(100, 20_000, 500), rng.integers(1, 300, 500)
    path = _write(tmp_path, "prompt_tokens,output_tokens\n"
                  + "".join(f"{a},{b}\n" for a, b in zip(p, d)))
    with pytest.raises(UserError, match=r"keeps only .* of the requests") as e:
        workload_spec(workload=str(path), scale_ctx="24k", max_model_len="32k")
    assert str(path.resolve()) in str(e.value)
    with pytest.raises(UserError, match="keeps only"):
        workload_spec(workload="geometric:1k;out=fixed:10", scale_ctx="15k", max_model_len="32k")


def test_scale_ctx_below_the_output_part_is_rejected(tmp_path):
    path = _write(tmp_path, "prompt_tokens,output_tokens\n10,5000\n")
    with pytest.raises(UserError, match="--scale-ctx: 1024 tokens is not above") as e:
        workload_spec(workload=str(path), scale_ctx="1k")
    assert str(path.resolve()) in str(e.value)


# --------------------------------------------------------------------------- sampling


@pytest.fixture(scope="module")
def small_law():
    return _law("lognormal:mean=3k,cv=1.0;out=geometric:200")


def test_sampler_draws_the_stationary_law(small_law):
    y = small_law.sample(np.random.default_rng(2), 400_000)
    assert y.mean() == pytest.approx(small_law.theta, rel=0.01)
    assert y.var() == pytest.approx(small_law.nu2, rel=0.03)
    assert y.min() >= small_law.min_context and y.max() <= small_law.max_context


def test_sampler_is_deterministic_and_common_across_plans(small_law):
    a = scenarios(small_law, 64, 8, seed=7)
    b = scenarios(small_law, 64, 8, seed=7)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (64, 8) and a.dtype == np.int64
    # a plan with fewer slots or more scenarios sees the same contexts where they overlap
    np.testing.assert_array_equal(scenarios(small_law, 64, 3, seed=7), a[:, :3])
    np.testing.assert_array_equal(scenarios(small_law, 128, 8, seed=7)[:64], a)
    assert not np.array_equal(scenarios(small_law, 64, 8, seed=8), a)
    np.testing.assert_array_equal(small_law.sample(5, 10), small_law.sample(5, 10))


def test_scenarios_are_identical_in_another_process(tmp_path):
    code = (
        "import hashlib;from opweave_planner.workload.edge import workload_spec;"
        "from opweave_planner.workload.shaping import materialize;"
        "from opweave_planner.workload.law import scenarios;"
        "w=materialize(workload_spec(workload='lognormal:mean=3k,cv=1.0;out=geometric:200'));"
        "print(hashlib.sha256(scenarios(w,50,16,seed=3).tobytes()).hexdigest())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}, check=True)
    w = _law("lognormal:mean=3k,cv=1.0;out=geometric:200")
    assert out.stdout.strip() == hashlib.sha256(scenarios(w, 50, 16, seed=3).tobytes()).hexdigest()


# --------------------------------------------------------------------------- KV


def test_kv_bytes_caps_windows_and_adds_state():
    c = np.array([0, 500, 1024, 5000])
    got = kv_bytes(c, 10.0, [(1024, 3.0), (512, 1.0)], fixed=100.0)
    want = 10 * c + 3 * np.minimum(c, 1024) + np.minimum(c, 512) + 100
    np.testing.assert_allclose(got, want)
    assert kv_bytes(7, 0.0, (), 55.0) == 55.0  # linear attention: constant state


def test_kv_sum_quantile_matches_exhaustive_enumeration(tmp_path):
    p, d = np.array([0, 40, 100]), np.array([30, 10, 5])
    path = _write(tmp_path, "prompt_tokens,output_tokens\n"
                  + "".join(f"{a},{b}\n" for a, b in zip(p, d)))
    w = trace_workload(path)
    per, win, fix = 3.0, [(20, 5.0)], 11.0
    steps = _steps(p, d)
    x = kv_bytes(steps, per, win, fix)
    for q in (0.1, 0.5, 0.97):
        assert kv_quantile(w, q, per, win, fix) == np.quantile(x, q, method="inverted_cdf")
    for n in (1, 2, 3):
        sums = np.array([sum(t) for t in itertools.product(x, repeat=n)])
        for q in (0.5, 0.9, 0.999):
            true = np.quantile(sums, q, method="inverted_cdf")
            lo, hi = kv_sum_bounds(w, n, q, per, win, fix)
            assert lo - 1e-6 <= true <= hi + 1e-6
            assert hi - lo <= n * (x.max() - x.min()) / 255 + 1e-9


def test_kv_sum_methods_agree_on_a_long_tailed_law(small_law):
    kv = dict(per_token=81920.0, windows=[(1024, 425984.0)], fixed=0.0)  # gemma-3-27b
    for n in (4, 64):
        lo, hi = kv_sum_bounds(small_law, n, 0.999, **kv)
        assert (hi - lo) / hi < 5e-3  # <= range / ((G - 1) mean); this law has range/mean ~ 100
        mc = kv_sum_quantile(small_law, n, 0.999, **kv, method="mc", samples=100_000, seed=0)
        assert mc == pytest.approx(hi, rel=0.02)
        cf = kv_sum_quantile(small_law, n, 0.999, **kv, method="cornish-fisher")
        # Cornish-Fisher is an expansion in 1/sqrt(n): +23 % at n = 4 on this tail, 0.1 % at 64
        assert cf == pytest.approx(hi, rel=0.3 if n == 4 else 0.01)
        normal = kv_sum_quantile(small_law, n, 0.999, **kv, method="normal")
        assert normal < hi  # the CLT misses the right skew
        assert n * float(kv_bytes(small_law.theta, **kv)) < hi
    assert kv_sum_quantile(small_law, 4, 0.999, **kv) == kv_sum_bounds(small_law, 4, 0.999, **kv)[1]
    with pytest.raises(UserError, match="outside"):
        kv_sum_quantile(small_law, 4, 1.0, **kv)
    with pytest.raises(UserError, match="method"):
        kv_sum_quantile(small_law, 4, 0.9, **kv, method="magic")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- properties

lengths = st.lists(
    st.tuples(st.integers(0, 5000), st.integers(1, 400)), min_size=1, max_size=40
)


@settings(max_examples=60, deadline=None)
@given(lengths)
def test_trace_law_properties(rows):
    p = np.array([r[0] for r in rows], dtype=np.int64)
    d = np.array([r[1] for r in rows], dtype=np.int64)
    theta, nu2 = stationary_moments(p, d)
    biased_prompt = float((d * p).sum() / d.sum())
    # θ = length-biased prompt mean + mean age: never below it (nor below the shortest prompt);
    # against the plain prompt mean this holds only when lengths are independent
    assert theta >= biased_prompt - 1e-9 and theta >= p.min() - 1e-9
    assert theta <= (p + d - 1).max() + 1e-9 and nu2 >= 0
    steps = _steps(p, d)
    assert theta == pytest.approx(steps.mean(), rel=1e-9, abs=1e-9)
    assert nu2 == pytest.approx(steps.var(), rel=1e-7, abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(lengths, st.lists(st.floats(0.001, 0.999), min_size=2, max_size=6))
def test_quantiles_are_monotone_and_invert_the_cdf(tmp_path_factory, rows, qs):
    path = tmp_path_factory.mktemp("h") / "t.csv"
    path.write_text("prompt_tokens,output_tokens\n" + "".join(f"{a},{b}\n" for a, b in rows))
    w = trace_workload(path)
    qs = np.sort(np.array(qs))
    v = w.quantile(qs)
    assert (np.diff(v) >= 0).all()
    assert (w.cdf(v) >= qs - 1e-12).all() and (w.cdf(v - 1) < qs + 1e-12).all()
    assert w.min_context <= v.min() and v.max() <= w.max_context


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["fixed", "geometric"]), st.integers(1, 300),
       st.sampled_from(["fixed", "geometric"]), st.integers(1, 300))
def test_independent_laws_theta_at_least_prompt_mean(pd, pm, od, om):
    w = _law(f"{pd}:{pm};out={od}:{om}")
    assert w.theta >= w.mean_prompt - 1e-6
    assert (np.diff(w.quantile([0.1, 0.5, 0.9, 0.99])) >= 0).all()


EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "traces"


@pytest.mark.parametrize(
    "name, fmt, rows, theta, cv",
    [("azure-conv-sample.csv", "azure", 1937, 1217.5, 0.549),
     ("mooncake-conversation-sample.jsonl", "mooncake", 2006, 13484.2, 1.223)],
)
def test_shipped_example_traces_match_their_readme(name, fmt, rows, theta, cv):
    w = trace_workload(EXAMPLES / name)
    d = w.describe()
    assert (d["format"], d["rows"], d["requests"]) == (fmt, rows, rows)
    assert d["theta"] == pytest.approx(theta, abs=0.05)
    assert d["cv"] == pytest.approx(cv, abs=5e-4)
    assert set(d["context_quantiles"]) == {"p50", "p90", "p95", "p99", "p99.9"}
    assert d["naive_mean"] == pytest.approx(w.mean_prompt + w.mean_output / 2)


def test_shipped_example_law_file():
    w = materialize(workload_spec(workload=str(EXAMPLES / "law-mooncake-like.toml")))
    assert w.theta == pytest.approx(12627.0, abs=0.5)
    d = w.describe()
    assert d["prompt"] == "lognormal:mean=12288,cv=1.2" and d["output"] == "geometric:mean=340"


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e3), st.floats(0, 1e3)), min_size=1, max_size=60),
       st.floats(0.5, 99.5))
def test_step_percentile_is_an_order_statistic_and_monotone(pairs, p):
    values = np.array([a + b for a, b in pairs])
    lower = np.array([a for a, _ in pairs])  # pointwise lower bound on the same scenarios
    got = float(step_percentile(values, p))
    assert got in set(values.tolist())
    k = int(np.ceil(len(values) * p / 100))
    assert got == np.sort(values)[max(k, 1) - 1]
    assert float(step_percentile(lower, p)) <= got


def test_step_percentile_rejects_bad_levels_and_works_along_an_axis():
    x = np.arange(20.0).reshape(2, 10)
    np.testing.assert_array_equal(step_percentile(x, 95), [9.0, 19.0])
    np.testing.assert_array_equal(step_percentile(x, 50), [4.0, 14.0])
    with pytest.raises(UserError, match="outside"):
        step_percentile(x, 100)


def test_stationary_law_is_the_long_run_law_of_continuous_batching(tmp_path):
    """Replay: 64 slots, each refilled at once from the trace; contexts grow by one per step.
    After a warm-up the time-averaged context law is the renewal-reward law."""
    rng = np.random.default_rng(8)
    p, d = rng.integers(0, 3000, 400), rng.geometric(1 / 80, 400)
    path = _write(tmp_path, "prompt_tokens,output_tokens\n"
                  + "".join(f"{a},{b}\n" for a, b in zip(p, d)))
    w = trace_workload(path)
    slots, steps = 64, 12_000
    pick = rng.integers(0, p.size, slots)
    ctx, left = p[pick].copy(), d[pick].copy()
    seen = []
    for t in range(steps):
        if t >= 2_000:
            seen.append(ctx.copy())
        ctx += 1
        left -= 1
        done = left == 0
        if done.any():
            new = rng.integers(0, p.size, int(done.sum()))
            ctx[done], left[done] = p[new], d[new]
    y = np.concatenate(seen)
    assert y.mean() == pytest.approx(w.theta, rel=0.02)
    assert y.std() == pytest.approx(w.nu, rel=0.03)
    for q in (0.5, 0.9, 0.99):
        assert np.quantile(y, q) == pytest.approx(w.quantile(q), rel=0.03)
