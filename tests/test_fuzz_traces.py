"""Fuzz the trace reader (issue 25): generated trace bytes (line ends, encodings, digits, NULs,
long fields, quotes, blank lines, headers) fed to `read_trace` and to the CLI.

Every read either returns what an independent reference reads from the same bytes (Python's
csv module with ``newline=''``, orjson per line, lengths as ASCII digits) or refuses with one
`UserError` line naming the file; a file built valid is read exactly as built. Every CLI run
ends with exit 0-3, never 4, no traceback, and one error line naming the file. Budgets scale
with the hypothesis profile (conftest.budget); the default `ci` profile keeps this file under
about 40 s on 2 cores.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import re
from pathlib import Path

import orjson
import pytest
from conftest import budget, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from opweave_planner.errors import UserError
from opweave_planner.workload.reader import MAX_LENGTH, read_trace
from opweave_planner.workload.traces import FORMATS, JSONL

PLAN = ("--model", "llama-3.1-8b", "--slo", "60ms", "--gpus", "h100", "--policy", "colocated",
        "--batches", "8,16")
EOLS = ["\n", "\r\n", "\r"]
# lengths Python's int() or a lax reader would take, and plain junk
HOSTILE = ["\u0661\u0662", "\uff11\uff12", "1_000", "1\x002", "+5", "-0", "-3", "0x10", "1e3", "12.0",
           "", "abc", "\u00a012", "1 2", "99999999999999999999", "1099511627777", "0" * 5000 + "1", "\x00"]
JSON_HOSTILE = ['"5"', "5.0", "true", "-1", "1e3", "null", "[1]", "{}", "0", "99999999999999999999",
                '"\u0661"', "007", "-0"]
CSV = [f for f in FORMATS.values() if not f.jsonl]
# each CSV format's header; of one that takes several names, two of its mixed pairs
HEADERS = [pair for f in CSV for pair in ([(f.prompt[0], f.output[0])] if len(f.prompt) == len(f.output) == 1
                                          else [(f.prompt[0], f.output[1]), (f.prompt[1], f.output[0])])]
HEADERS = [(p.lower(), o.lower()) for p, o in HEADERS]
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
_names = itertools.count()


@st.composite
def length(draw, minimum: int) -> tuple[str, int | None]:
    """(text, value): a valid length (maybe padded), or a hostile one (value None)."""
    if draw(st.integers(0, 11)):
        v = draw(st.integers(minimum, 70_000))
        return draw(st.sampled_from(["", " ", "\t", "0"])) + str(v) + draw(st.sampled_from(["", " "])), v
    return draw(st.sampled_from(HOSTILE)), None


@st.composite
def csv_trace(draw) -> tuple[str, list | None]:
    """(text, expected rows or None when the file is not built valid)."""
    valid = True
    pc, oc = draw(st.sampled_from(HEADERS))
    cols = [pc, oc, *draw(st.lists(st.sampled_from(["ts", "model", "note"]), unique=True, max_size=3))]
    cols = draw(st.permutations(cols))
    cols = [c.upper() if draw(st.integers(0, 4)) == 0 else c for c in cols]
    spoil = draw(st.integers(0, 12))
    if spoil == 0:  # a repeated name, another format's columns, an unknown header
        cols = cols + draw(st.sampled_from([[cols[0]], ["ContextTokens", "GeneratedTokens"], ["prompt_len"]]))
        valid = False
    elif spoil == 1:
        cols = ["a", "b"]
        valid = False
    eol = draw(st.sampled_from(EOLS))
    quoting = draw(st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL, csv.QUOTE_NONNUMERIC]))

    def record(cells: list[str]) -> str:  # quoted where \r or \n would end it, then our line end
        one = io.StringIO()
        csv.writer(one, lineterminator="\r\n", quoting=quoting).writerow(cells)
        return one.getvalue().removesuffix("\r\n") + eol

    out = io.StringIO()
    out.write(draw(st.sampled_from(["", eol, " " + eol])))  # blank lines before the header
    out.write(record(cols))
    rows = []
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.integers(0, 8)) == 0:
            out.write(draw(st.sampled_from([eol, "  " + eol, "," * (len(cols) - 1) + eol])))
        cells, got = [], {}
        for c in cols:
            low = c.lower()
            if low in (pc, oc):
                text, v = draw(length(0 if low == pc else 1))
                got[low] = v
                cells.append(text)
            else:
                cells.append(draw(st.one_of(TEXT, st.sampled_from(['a,b', 'say "hi"', "two\nlines", "x" * 140_000]))))
        if None in got.values():
            valid = False
        rows.append((got.get(pc), got.get(oc)))
        if draw(st.integers(0, 15)) == 0:  # a row cut short, or raw text where csv would quote
            out.write(",".join(cells[:1]) + eol)
            valid = False
        else:
            out.write(record(cells))
    text = out.getvalue()
    if draw(st.booleans()):
        text = text.removesuffix(eol)
    return text, rows if valid and rows else None


@st.composite
def jsonl_trace(draw) -> tuple[str, list | None]:
    valid, rows, lines = True, [], []
    eol = draw(st.sampled_from(EOLS))
    for i in range(draw(st.integers(1, 8))):
        if draw(st.integers(0, 8)) == 0:
            lines.append(draw(st.sampled_from(["", "  ", "\t"])))
        p, o = draw(st.integers(0, 70_000)), draw(st.integers(1, 70_000))
        obj = {"timestamp": i, "input_length": p, "output_length": o}
        if draw(st.booleans()):
            obj["hash_ids"] = draw(st.lists(st.integers(0, 10**6), max_size=6))
        if draw(st.booleans()):
            obj["text"] = draw(TEXT)
        keys = draw(st.permutations(list(obj)))
        obj = {k: obj[k] for k in keys}
        kind = draw(st.integers(0, 10))
        if kind == 0:  # a hostile length value
            key = draw(st.sampled_from(["input_length", "output_length"]))
            line = orjson.dumps(obj).decode().replace(f'"{key}":{obj[key]}', f'"{key}": {draw(st.sampled_from(JSON_HOSTILE))}')
            valid = False
        elif kind == 1:  # not a JSON object with both keys
            line = draw(st.sampled_from(["{oops", "[1, 2]", '{"input_length": 5}', "x", '{"a": ' * 70 + "1" + "}" * 70]))
            valid = False
        elif kind == 2:  # ASCII-escaped text, spaced separators: the exact parser's lines
            line = json.dumps(obj, ensure_ascii=True)
        else:
            line = orjson.dumps(obj).decode()
        rows.append((p, o))
        lines.append(draw(st.sampled_from(["", " ", "\t"])) + line)
    text = eol.join(lines) + draw(st.sampled_from(["", eol]))
    return text, rows if valid else None


@st.composite
def trace_file(draw) -> tuple[bytes, str, list | None]:
    """(bytes, suffix, expected rows or None)."""
    text, rows = draw(st.one_of(csv_trace(), jsonl_trace()))
    suffix = ".jsonl" if text.lstrip(" \t\r\n").startswith("{") else ".csv"
    enc = draw(st.sampled_from(["utf-8"] * 20 + ["utf-8-sig", "utf-16", "utf-16-le", "latin-1"]))
    try:
        data = text.encode(enc)
    except UnicodeEncodeError:
        data, enc = text.encode("utf-8"), "utf-8"
    if (enc not in ("utf-8", "utf-8-sig") and not text.isascii()) or enc.startswith("utf-16"):
        rows = None
    if draw(st.integers(0, 10)) == 0 and data:  # a NUL or a stray byte somewhere
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + draw(st.sampled_from([b"\x00", b"\xff", b"\xc3", b"\r"])) + data[at:]
        rows = None
    return data, suffix, rows


# --------------------------------------------------------------------------- the reference


def _ascii_int(text: str, minimum: int) -> int | None:
    s = text.strip(" \t\n\r\v\f\x1c\x1d\x1e\x1f")
    return int(s) if re.fullmatch(r"[0-9]+", s) and minimum <= int(s) <= MAX_LENGTH else None


def reference(data: bytes) -> tuple[str, list] | None:
    """(format, rows) another way, None where it refuses (the reader may refuse more)."""
    if b"\x00" in data:
        return None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    lines = re.split(r"\r\n|\r|\n", text)
    first = next((ln for ln in lines if ln.strip(" \t\v\f\x1c\x1d\x1e\x1f")), None)
    if first is None:
        return None
    rows = []
    if first.lstrip(" \t\v\f\x1c\x1d\x1e\x1f").startswith("{"):
        for line in lines:
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                return None
            if not isinstance(obj, dict):
                return None
            got = [obj.get(k) for k in ("input_length", "output_length")]
            if any(isinstance(v, bool) or not isinstance(v, int) for v in got):
                return None
            if not (0 <= got[0] <= MAX_LENGTH and 1 <= got[1] <= MAX_LENGTH):
                return None
            rows.append(tuple(got))
        return JSONL.name, rows
    csv.field_size_limit(1 << 30)
    records = [r for r in csv.reader(io.StringIO(text, newline="")) if any(c.strip() for c in r)]
    header = [h.strip().lower() for h in records[0]]
    pairs = []
    for f in CSV:
        named = [[c for c in map(str.lower, names) if c in header] for names in (f.prompt, f.output)]
        if all(named):
            pairs.append((named[0][0], named[1][0]))
    if len(pairs) != 1:
        return None
    ip, io_ = header.index(pairs[0][0]), header.index(pairs[0][1])
    for r in records[1:]:
        if len(r) <= max(ip, io_):
            return None
        p, o = _ascii_int(r[ip], 0), _ascii_int(r[io_], 1)
        if p is None or o is None:
            return None
        rows.append((p, o))
    return "csv", rows


def _write(tmp_path: Path, case) -> tuple[Path, bytes, list | None]:
    data, suffix, rows = case
    path = tmp_path / f"trace-{next(_names)}{suffix}"  # a new name: no stamp cache can mix two examples
    path.write_bytes(data)
    return path, data, rows


# --------------------------------------------------------------------------- the properties


@settings(max_examples=budget(2.0))
@given(trace_file())
def test_read_trace_reads_what_the_reference_reads_or_refuses_in_one_line(tmp_path, case):
    path, data, rows = _write(tmp_path, case)
    try:
        tr = read_trace(path)
    except UserError as exc:
        msg = str(exc)
        assert "\n" not in msg and str(path) in msg, msg
        assert rows is None, f"a valid file refused: {msg}"
        return
    got = list(zip(tr.prompt.tolist(), tr.output.tolist()))
    assert tr.sha256 == hashlib.sha256(data).hexdigest()
    if rows is not None:
        assert got == rows
    ref = reference(data)
    assert ref is not None, "read a file the reference refuses"
    assert (ref[0] == JSONL.name) == (tr.format == JSONL.name) and got == ref[1]


@settings(max_examples=budget(0.5))
@given(trace_file())
def test_the_cli_ends_cleanly_on_any_trace(tmp_path, case):
    path, _data, rows = _write(tmp_path, case)
    ran = run_cli(*PLAN, "--workload", str(path), "-q")
    assert "Traceback" not in ran.err, ran.err
    assert ran.code in (0, 1, 2, 3), (ran.code, ran.err)
    if ran.code == 2:
        errors = [ln for ln in ran.lines if ln.startswith("error:")]
        assert len(errors) == 1 and len(ran.lines) == 1, ran.err
        assert str(path) in errors[0], errors[0]
    elif rows is not None:
        assert ran.code in (0, 3), ran.err


@pytest.mark.parametrize("text", ["prompt_tokens,output_tokens\r1,2\r", "prompt_tokens,output_tokens\n\u0661,2\n"])
def test_the_reference_itself(tmp_path, text):
    """The reference reads \\r line ends and refuses non-ASCII digits, as the reader does."""
    ref = reference(text.encode())
    assert (ref == ("csv", [(1, 2)])) if "\r" in text else ref is None
