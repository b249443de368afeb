"""The trace reader and workload shaping (issue 25): one regression test per root cause.

Each bad input is refused by a one-line `UserError` naming the file and, where it has one,
the line; nothing reaches stderr but that line; the CLI exits 2, never 4.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error, run_cli

import opweave_planner.workload.reader as W
from opweave_planner.errors import UserError
from opweave_planner.workload.edge import workload_spec
from opweave_planner.workload.reader import read_trace
from opweave_planner.workload.shaping import materialize

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "traces"
PLAN = ("--model", "llama-3.1-8b", "--slo", "60ms", "--gpus", "h100", "--policy", "colocated",
        "--batches", "8,16", "-q")
HEADER = b"prompt_tokens,output_tokens\n"


def _file(tmp_path: Path, data: bytes, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _refused(path: Path, *needles: str) -> str:
    with pytest.raises(UserError) as err:
        read_trace(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg, msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


# --------------------------------------------------------------------------- the shipped traces

# recorded with the reader before issue 25 (text lines through the csv module and orjson):
# format, rows, sha256 of the file, of the prompt array and of the output array (int64 LE)
SHIPPED = {
    "azure-conv-sample.csv": (
        "azure", 1937, "44e36681a48f805555d125d9d643e5b458204aa244077c3a37a8b89f15450c74",
        "e0c1ea560b56137f56b85859cf4f9b9a44b55b33e8c48b0695b9b5a3571382d2",
        "286d704a22ab4072f97dd64b7d4c0c7d62ab0342e3c106b5f0b8acbc24843aea"),
    "mooncake-conversation-sample.jsonl": (
        "mooncake", 2006, "1b4a696ffd6d5f233717bac2c8816c1b713ad4e7b07fc14c4d1bc7c2b19ce48a",
        "aa8dab5c1cc41da2a5961e58ed9c9a3dfe6ba22f500bcfe9bd9dada211912aa7",
        "b9a3d9d746f824a3ceaab90c179eaa01c499e1e789f92027245f85c05fa53400"),
}


def _digests(tr) -> tuple:
    return (tr.format, tr.rows, tr.sha256, hashlib.sha256(tr.prompt.astype("<i8").tobytes()).hexdigest(),
            hashlib.sha256(tr.output.astype("<i8").tobytes()).hexdigest())


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_traces_read_exactly_as_before(name):
    tr = read_trace(EXAMPLES / name)
    assert tr.prompt.dtype == np.int64 and tr.output.dtype == np.int64
    assert _digests(tr) == SHIPPED[name]


@pytest.mark.parametrize("name", sorted(SHIPPED))
@pytest.mark.parametrize("block, rows", [(1, 3), (2, 1000), (7, 5), (4093, 64)])
def test_any_block_and_chunk_size_gives_the_same_trace(monkeypatch, name, block, rows):
    """Records, \\r\\n pairs and UTF-8 characters cut by a block's end, output chunks filled."""
    monkeypatch.setattr(W, "_BLOCK", block)
    monkeypatch.setattr(W, "_ROWS", rows)
    assert _digests(read_trace(EXAMPLES / name)) == SHIPPED[name]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_csv_and_jsonl_with_every_line_end(tmp_path, eol):
    """Old-Mac \\r line ends were read as one line (exit 4)."""
    csv_ = _file(tmp_path, eol.join([b"prompt_tokens,output_tokens", b"5,2", b"", b"7,3", b""]))
    jsonl = _file(tmp_path, eol.join([b'{"input_length": 5, "output_length": 2}', b"",
                                      b'{"input_length": 7, "output_length": 3}']), "t.jsonl")
    for path, fmt in ((csv_, "plain"), (jsonl, "mooncake")):
        tr = read_trace(path)
        assert tr.format == fmt and tr.prompt.tolist() == [5, 7] and tr.output.tolist() == [2, 3]
        assert tr.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    bad = _file(tmp_path, b"prompt_tokens,output_tokens\r\r1,2\r3,x\r", "bad.csv")
    _refused(bad, "line 4: output length")  # lines are counted over \r too


def test_quoted_fields_follow_the_csv_module(tmp_path):
    data = (b'note,prompt_tokens,output_tokens\n"a, ""quoted""\nline",5,2\nplain,"7",3\n'
            b'x"y,  9 ,\t4\n')
    tr = read_trace(_file(tmp_path, data))
    assert tr.prompt.tolist() == [5, 7, 9] and tr.output.tolist() == [2, 3, 4]
    _refused(_file(tmp_path, HEADER + b'1,2\n"3,4\n', "q.csv"), "line 3: a quoted field is never closed")


# --------------------------------------------------------------------------- lengths of lines and fields


def test_a_field_longer_than_the_csv_module_allows_is_read(tmp_path):
    """The csv module refuses a field over 131072 characters (exit 4); a text column may hold one."""
    text = b'"' + b"word, " * 40_000 + b'"'
    tr = read_trace(_file(tmp_path, b"prompt_tokens,output_tokens,prompt_text\n1,2," + text + b"\n3,4,x\n"))
    assert tr.prompt.tolist() == [1, 3]


def test_a_length_field_is_bounded(tmp_path):
    _refused(_file(tmp_path, HEADER + b"0" * 5000 + b"1,2\n"), "line 2", "prompt field is longer than 4096")
    assert read_trace(_file(tmp_path, HEADER + b"0" * 4000 + b"1,2\n", "ok.csv")).prompt.tolist() == [1]


@pytest.mark.parametrize("name, head", [("e.csv", b"prompt_tokens,output_tokens,text\n1,2,"),
                                        ("e.jsonl", b'{"input_length": 1, "output_length": 2, "s": "')])
def test_one_enormous_line_is_refused_at_once(tmp_path, name, head):
    """A 20 MB line without a newline: the old reader was quadratic in it (300 MB: 159 s)."""
    path = _file(tmp_path, head + b"x" * (20 << 20), name)
    t = time.perf_counter()
    _refused(path, "line 2" if name.endswith(".csv") else "line 1", "longer than 4 MiB")
    assert time.perf_counter() - t < 10


def test_an_enormous_header_is_refused(tmp_path):
    _refused(_file(tmp_path, b"prompt_tokens,output_tokens" + b",x" * (3 << 20) + b"\n1,2\n"),
             "line 1", "longer than 4 MiB")


# --------------------------------------------------------------------------- what a length may be


@pytest.mark.parametrize("value", ["\u0661\u0662", "\uff11\uff12", "1_000", "1\x002", "+5", "-0", "-3",
                                   "0x10", "1e3", "12.0", "", "abc", "\u00a012", "1 2"])
def test_only_ascii_decimal_integers_are_lengths(tmp_path, value):
    """Python's int() takes Arabic-Indic and full-width digits, '1_000', signs and blanks."""
    msg = _refused(_file(tmp_path, HEADER + b"3,4\n" + value.encode() + b",5\n"), "line 3")
    assert ("NUL byte" if "\x00" in value else "prompt length must be an integer >= 0") in msg


@pytest.mark.parametrize("value", ['"\u0661"', "1_000", "+5", "-1", "1e3", "2.0", '"7"', "true", "007"])
def test_jsonl_lengths_are_json_integers(tmp_path, value):
    path = _file(tmp_path, b'{"input_length": 1, "output_length": 1}\n'
                 + f'{{"input_length": {value}, "output_length": 3}}\n'.encode(), "t.jsonl")
    _refused(path, "line 2")


def test_padded_and_quoted_lengths_are_accepted(tmp_path):
    tr = read_trace(_file(tmp_path, HEADER + b' 5 ,\t6\n"7",8\n0009,1\n'))
    assert tr.prompt.tolist() == [5, 7, 9] and tr.output.tolist() == [6, 8, 1]


def test_a_length_past_2_to_the_40_is_refused(tmp_path):
    _refused(_file(tmp_path, HEADER + b"1099511627777,1\n"), "line 2: prompt length 1099511627777 exceeds 2^40")
    assert read_trace(_file(tmp_path, HEADER + b"1099511627776,1\n", "ok.csv")).prompt[0] == 1 << 40


# --------------------------------------------------------------------------- encodings and bytes


@pytest.mark.parametrize("data, needle", [
    ("prompt_tokens,output_tokens\n1,2\n".encode("utf-16"), "UTF-16"),
    ("prompt_tokens,output_tokens\n1,2\n".encode("utf-16-le"), "line 1: a NUL byte"),
    (HEADER + b"1,2\n3,4,\x00\n", "line 3: a NUL byte"),
    (HEADER + b"1,2\n3,4,\xff\n", "line 3: not UTF-8"),
    (HEADER + b"1,2\n3,4,\xed\xa0\x80\n", "line 3: not UTF-8"),  # a surrogate
    (b'{"input_length": 1, "output_length": 2, "s": "\xc0\xaf"}\n', "line 1: not UTF-8"),  # overlong
])
def test_text_that_is_not_utf8_is_refused_by_line(tmp_path, data, needle):
    _refused(_file(tmp_path, data), needle)


def test_a_utf8_bom_and_text_columns_are_fine(tmp_path):
    path = _file(tmp_path, b"\xef\xbb\xbfprompt_tokens,output_tokens,who\n1,2,J\xc3\xbcrgen \xf0\x9f\x99\x82\n")
    tr = read_trace(path)
    assert tr.prompt.tolist() == [1] and tr.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- headers


@pytest.mark.parametrize("header, needle", [
    (b"prompt_tokens,output_tokens,Prompt_Tokens", "column 'Prompt_Tokens' appears twice"),
    (b"ts,ts,prompt_tokens,output_tokens", "column 'ts' appears twice"),
    (b"ContextTokens,GeneratedTokens,prompt_tokens,output_tokens", "two formats, azure"),
    (b"num_prefill_tokens,num_decode_tokens,Request tokens,Response tokens", "two formats, burstgpt"),
    (b"prompt_tokens,output_tokens,decode", "two formats, plain"),
    (b"prompt,prompt_len,decode", "two columns of one kind ('prompt', 'prompt_len')"),
])
def test_repeated_or_ambiguous_headers_are_refused(tmp_path, header, needle):
    """The first match was taken silently."""
    _refused(_file(tmp_path, header + b"\n1,2,3,4\n"), needle)


def test_json_lengths_given_twice_are_refused(tmp_path):
    path = _file(tmp_path, b'{"input_length": 1, "output_length": 2, "input_length": 3}\n', "t.jsonl")
    _refused(path, "line 1: input_length or output_length given twice")


# --------------------------------------------------------------------------- input paths


def test_workload_paths_are_refused_for_the_right_reason(tmp_path):
    loop = tmp_path / "loop.csv"
    os.symlink(loop, loop)
    (tmp_path / "afile").write_text("x")
    for path in (tmp_path, loop, tmp_path / "afile" / "t.csv"):
        with pytest.raises(UserError) as err:
            workload_spec(workload=str(path))
        assert "--workload" in str(err.value) and str(path) in str(err.value)
        assert "no such file" not in str(err.value)
    assert W.file_stamp(loop) is None  # Path.resolve() raises RuntimeError on a loop (3.11)
    law = "lognormal:mean=12k,cv=1.2;out=geometric:mean=300" + " " * 300  # not a path: too long for one
    assert workload_spec(workload=law).kind == "law"


# --------------------------------------------------------------------------- shaping edges, end to end


def _plan(*args: str):
    ran = run_cli(*PLAN, *args)
    assert "Traceback" not in ran.err and "Warning" not in ran.err, ran.err
    return ran


def test_scale_ctx_where_nothing_fits_at_scale_one(tmp_path):
    """Every prompt past the window: the solver answered scale 0 (exit 4); the scale that
    brings them inside it exists."""
    path = _file(tmp_path, HEADER + b"200000,10\n300000,20\n")
    w = materialize(workload_spec(workload=str(path), scale_ctx="8k", max_model_len="128k"))
    assert 0 < w.scale < 0.05 and abs(w.theta - 8192) < 1 and w.dropped == 0
    ran = _plan("--workload", str(path), "--scale-ctx", "8k")
    assert ran.code == 0, ran.err


@pytest.mark.parametrize("extra, needle", [
    (("--max-model-len", "128k", "--overflow", "drop"), "no request fits --max-model-len even with an empty prompt"),
    ((), "is not above"),
])
def test_scale_ctx_nothing_can_reach_is_an_input_error(tmp_path, extra, needle):
    path = _file(tmp_path, HEADER + b"10,200000\n20,300000\n")
    assert_one_line_error(_plan("--workload", str(path), "--scale-ctx", "8k", *extra), 2, "--scale-ctx", needle)


def test_scale_ctx_at_the_outputs_own_mean_is_refused_not_scale_zero(tmp_path):
    path = _file(tmp_path, HEADER + b"10,5\n")
    t0 = materialize(workload_spec(workload=str(path))).theta - 10  # the context with empty prompts
    with pytest.raises(UserError, match="is not above"):
        workload_spec(workload=str(path), scale_ctx=str(int(t0)))


def test_a_law_under_a_tiny_max_model_len_is_an_input_error_without_warnings(recwarn):
    ran = _plan("--workload", "lognormal:mean=12k,cv=1.2;out=geometric:mean=300", "--max-model-len", "2")
    assert_one_line_error(ran, 2, "--max-model-len 2", "no request fits")
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    assert len(ran.lines) == 1


def test_a_request_far_past_the_window_is_shaped_by_the_window(tmp_path):
    """Library side: the trace reads without a limit (shape=False) and the model's window
    (131072 for llama-3.1-8b) drops the request, as --max-model-len would."""
    path = _file(tmp_path, HEADER + b"100,10\n20000000,20\n")
    spec = workload_spec(workload=str(path), shape=False)
    assert spec.rows == 2
    with pytest.raises(UserError, match="give --max-model-len"):
        materialize(spec)
    w = materialize(workload_spec(workload=str(path), max_model_len=131072))
    assert (w.requests, w.dropped, w.max_context) == (1, 1, 109)


def test_a_request_far_past_the_window_plans_with_the_default_limit(tmp_path):
    path = _file(tmp_path, HEADER + b"100,10\n20000000,20\n")
    ran = _plan("--workload", str(path))
    assert ran.code == 0, ran.err
