"""Reading a trace file: its bytes streamed in blocks, hashed as they are read (the plan records
the sha256) and parsed by the kernels of scan.py; the first bad row becomes one line naming
the file and the line. A small per-process cache keyed by the file's stamp lets a request be
validated before and after the model's window is known with one read.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from opweave_planner.atomic import check_input_file
from opweave_planner.errors import UserError
from opweave_planner.workload.scan import (
    _COLUMNS,
    _FIELD,
    _FULL,
    _LONG,
    _MORE,
    _NUL,
    _QUOTE,
    _SLOW,
    _TWICE,
    _UTF8,
    MAX_FIELD,
    MAX_LENGTH,
    MAX_LINE,
    _scan_csv,
    _scan_jsonl,
)
from opweave_planner.workload.spec import LAW_SUFFIX
from opweave_planner.workload.traces import JSONL, csv_columns, words

__all__ = ["MAX_FIELD", "MAX_LENGTH", "MAX_LINE", "Trace", "file_stamp", "read_trace", "trace_sha256"]

_BLOCK = 1 << 22  # bytes read (and hashed) at a time
_ROWS = 1 << 18  # rows a scan kernel fills per call
_BOM = b"\xef\xbb\xbf"
_BLANKS = re.compile(rb"[ \t\n\r\v\f\x1c-\x1f]*")  # ASCII whitespace, as str.isspace() has it
_EOL = re.compile(rb"\r\n|\r|\n")
_NUL_TEXT = "a NUL byte; expected UTF-8 text (a UTF-16 file?)"


@dataclass(frozen=True, eq=False)
class Trace:
    """Per-request prompt and output lengths of a trace file (int64 arrays)."""

    path: str
    format: str
    sha256: str
    prompt: np.ndarray
    output: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.prompt.size)


def _bad_value(path: Path, line: int, what: str, minimum: int, value: str, huge: bool) -> UserError:
    shown = value if len(value) <= 40 else value[:40] + "..."
    if huge:
        return UserError(f"trace {path} line {line}: {what} length {shown} exceeds 2^40 tokens")
    odd = "_" in value or any(ch.isdigit() and not "0" <= ch <= "9" for ch in value)
    hint = " (ASCII digits 0-9 only)" if odd else ""
    return UserError(f"trace {path} line {line}: {what} length must be an integer >= {minimum}, "
                     f"got {shown!r}{hint}")


def _line_ends(data: bytes) -> int:
    """How many lines ``data`` ends (\\n, \\r\\n and a lone \\r count one each)."""
    return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


class _Source:
    """A trace file read in blocks, every byte hashed once as it is read (the plan records the
    sha256), with the unparsed rest of the last block kept in ``buf``."""

    def __init__(self, handle, path: Path) -> None:
        self.handle, self.path = handle, path
        self.digest = hashlib.sha256()
        self.buf, self.pos, self.final, self.seen = b"", 0, False, 0
        self.size = os.fstat(handle.fileno()).st_size

    def more(self) -> None:
        """Append the next block to the unparsed rest (the tail is at most MAX_LINE long)."""
        block = self.handle.read(_BLOCK)
        self.digest.update(block)
        self.final = not block
        self.seen += len(block)
        self.buf = self.buf[self.pos:] + block
        self.pos = 0

    def rows_expected(self, rows: int) -> int:
        """The file's rows at the density of those parsed so far, 5 % over."""
        parsed = max(1, self.seen - (len(self.buf) - self.pos))
        return int(rows * max(self.size, self.seen) / parsed * 1.05)

    def first_line(self) -> tuple[int, int]:
        """Skip the byte-order mark and blank lines: (line number, first byte) of the first
        other line, which then starts at ``pos``."""
        self.more()
        while len(self.buf) < len(_BOM) and not self.final:
            self.more()
        if self.buf[:2] in (b"\xff\xfe", b"\xfe\xff"):
            raise UserError(f"trace {self.path}: UTF-16 or UTF-32 text; expected UTF-8")
        if self.buf.startswith(_BOM):
            self.pos = 3
        line = 1
        while True:
            j = _BLANKS.match(self.buf, self.pos).end()
            if j < len(self.buf) or self.final:
                break
            keep = j - 1 if self.buf.endswith(b"\r") else j  # its \n may start the next block
            line += _line_ends(self.buf[self.pos:keep])
            self.pos = keep
            self.more()
        if j == len(self.buf):
            raise UserError(f"trace {self.path}: empty file; expected a header line and requests")
        start = max(self.pos, self.buf.rfind(b"\n", self.pos, j) + 1, self.buf.rfind(b"\r", self.pos, j) + 1)
        line += _line_ends(self.buf[self.pos:start])
        self.pos = start
        return line, self.buf[j]

    def header(self, line: int) -> list[str]:
        """The CSV header at ``pos`` (one line), ``pos`` moved past it."""
        while True:
            m = _EOL.search(self.buf, self.pos)
            if self.final or (m and m.end() < len(self.buf)):  # (a final \r may pair with a \n)
                break
            if (m.start() if m else len(self.buf)) - self.pos > MAX_LINE:
                break
            self.more()
        end = m.start() if m else len(self.buf)
        if end - self.pos > MAX_LINE:
            raise UserError(f"trace {self.path} line {line}: longer than {MAX_LINE >> 20} MiB; "
                            "expected a header line")
        raw = self.buf[self.pos:end]
        self.pos = m.end() if m else end
        if b"\0" in raw:
            raise UserError(f"trace {self.path} line {line}: {_NUL_TEXT}")
        try:
            text = raw.decode("utf-8")
            return next(csv.reader([text], strict=True))
        except UnicodeDecodeError:
            raise UserError(f"trace {self.path} line {line}: not UTF-8 text") from None
        except csv.Error as exc:
            raise UserError(f"trace {self.path} line {line}: the header is not one line of CSV "
                            f"({exc})") from None


def _field_text(raw: bytes) -> str:
    """A CSV field's text (unquoted, stripped) for an error message."""
    text = raw.decode("utf-8", "replace")
    with contextlib.suppress(csv.Error, StopIteration, IndexError):
        text = next(csv.reader([text]))[0] if text.lstrip(" \t").startswith('"') else text
    return text.strip()


def _json_line(raw: bytes, path: Path, line: int) -> tuple[int, int] | None:
    """(input_length, output_length) of a JSON line the kernel leaves to orjson, None for a
    blank one; or the one-line error naming the line."""
    if not raw.decode("utf-8").strip():
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise UserError(f"trace {path} line {line}: not a JSON object") from None
    keys = (JSONL.prompt[0], JSONL.output[0])
    if not isinstance(obj, dict) or not all(k in obj for k in keys):
        raise UserError(f"trace {path} line {line}: expected a JSON object with {keys[0]} and {keys[1]}")
    values = []
    for key, minimum, what in zip(keys, (0, 1), words(JSONL.name)):
        v = obj[key]
        whole = isinstance(v, int) and not isinstance(v, bool)
        if not whole or not minimum <= v <= MAX_LENGTH:
            raise _bad_value(path, line, what, minimum, str(v), whole and v > MAX_LENGTH)
        values.append(v)
    return values[0], values[1]


_PROBLEMS = {
    _NUL: _NUL_TEXT, _UTF8: "not UTF-8 text", _QUOTE: "a quoted field is never closed",
    _LONG: f"longer than {MAX_LINE >> 20} MiB; expected one request per line",
    _TWICE: f"{JSONL.prompt[0]} or {JSONL.output[0]} given twice",
}


def _scan_error(src: _Source, info: np.ndarray, fmt: str, width: int) -> UserError:
    status, line = int(info[0]), int(info[4])
    where = f"trace {src.path} line {line}"
    if status in _PROBLEMS:
        return UserError(f"{where}: {_PROBLEMS[status]}")
    if status == _COLUMNS:
        return UserError(f"{where}: expected {width} columns, got {int(info[5])}")
    what = words(fmt)[int(info[5])]
    if status == _FIELD:
        return UserError(f"{where}: the {what} field is longer than {MAX_FIELD} bytes")
    text = _field_text(src.buf[int(info[6]):int(info[7])])
    return _bad_value(src.path, line, what, int(info[5]), text, bool(info[8]))


def _scan(src: _Source, line: int, fmt: str, cols: tuple[int, int], width: int):
    """Run the format's kernel over the file from ``src.pos``; (prompt, output) arrays.

    The kernels write into two arrays that grow once they are full, to the rows the file's
    size promises (so a large file is copied about once, and the peak stays near the result)."""
    out_p, out_o = np.empty(_ROWS, np.int64), np.empty(_ROWS, np.int64)
    info = np.zeros(9, np.int64)
    col = np.array(cols, np.int64)
    row = 0
    while True:
        buf = np.frombuffer(src.buf, np.uint8)
        if fmt == JSONL.name:
            _scan_jsonl(buf, src.pos, src.final, line, out_p, out_o, row, info)
        else:
            _scan_csv(buf, src.pos, src.final, line, col, out_p, out_o, row, info)
        status, src.pos, row, line = (int(x) for x in info[:4])
        if status == _FULL:
            out_p, out_o = (_grown(a, max(2 * a.size, src.rows_expected(row))) for a in (out_p, out_o))
        elif status == _SLOW:
            got = _json_line(src.buf[int(info[5]):int(info[6])], src.path, line)
            if got is not None:
                out_p[row], out_o[row] = got
                row += 1
            src.pos, line = int(info[7]), line + 1
        elif status != _MORE:
            raise _scan_error(src, info, fmt, width)
        elif src.final:
            break
        else:
            src.more()
    if out_p.size > row + row // 8:  # more room than rows (a small file, a bad guess): trim
        return out_p[:row].copy(), out_o[:row].copy()
    return out_p[:row], out_o[:row]


def _grown(a: np.ndarray, size: int) -> np.ndarray:
    out = np.empty(size, a.dtype)
    out[: a.size] = a
    return out


def read_trace(path: str | Path) -> Trace:
    """Read a request trace (format recognised from the header), streaming, with its sha256.

    Formats: those of :data:`opweave_planner.workload.traces.FORMATS`. Every request needs a
    prompt length >= 0 and an output length >= 1 in ASCII digits; the first bad row is reported
    by its line (the file's lines, the header's included, counted from 1). The bytes are parsed in blocks by
    numba kernels (linear in the file, no Python object per row); see docs/workloads.md for
    what is accepted and refused.
    """
    path = Path(path)
    check_input_file(path, "trace")
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise UserError(f"trace {path}: cannot open ({exc.strerror})") from None
    with handle:
        src = _Source(handle, path)
        line, lead = src.first_line()
        if lead == ord("{"):
            fmt, cols, width = JSONL.name, (0, 1), 2
        else:
            header = src.header(line)
            fmt, ip, io = csv_columns(header, path)
            cols, width, line = (ip, io), len(header), line + 1
        prompt, output = _scan(src, line, fmt, cols, width)
    if prompt.size == 0:
        raise UserError(f"trace {path}: no data rows; expected at least one request")
    return Trace(str(path), fmt, src.digest.hexdigest(), prompt, output)


_TRACES: dict[tuple[str, str], Trace] = {}


def _keep(cache: dict, key, value):
    """Store in one of this module's small caches, dropping the oldest of more than eight."""
    if len(cache) >= 8:
        cache.pop(next(iter(cache)))
    cache[key] = value
    return value


def _remember(tr: Trace, path: str) -> Trace:
    """Keep the last few traces read, under their resolved path (a spec re-reads none)."""
    tr = Trace(path, tr.format, tr.sha256, tr.prompt, tr.output)
    return _keep(_TRACES, (path, tr.sha256), tr)


def file_stamp(path: str | os.PathLike | None) -> tuple[str, int, int] | None:
    """(resolved path, mtime ns, size) of a file, None when it is not one (a law, no workload):
    a cache key under which a file edited in a running process is another file."""
    try:
        resolved = str(Path(path).resolve()) if path else None
        st = os.stat(resolved) if resolved else None
    except (OSError, RuntimeError, ValueError):  # a symlink loop raises RuntimeError on 3.11
        return None
    return None if st is None else (resolved, st.st_mtime_ns, st.st_size)


def trace_sha256(workload: str | os.PathLike) -> str | None:
    """The sha256 of a trace file (read once, as a request would), None for a law or an inline
    law: tells whether another path holds the same trace."""
    path = Path(workload).expanduser()
    try:
        if not path.is_file() or path.suffix.lower() == LAW_SUFFIX:
            return None
    except (OSError, ValueError):  # a name too long (is_file raises ENAMETOOLONG on 3.11)
        return None
    return read_once(path).sha256


def read_once(path: Path) -> Trace:
    """`read_trace` once per file version per process: a request is validated before and after
    the model's window is known, and both see the same file."""
    key = file_stamp(path)
    if key is None:
        return read_trace(path)  # not a readable file: read_trace says why, in one line
    return _BY_STAMP[key] if key in _BY_STAMP else _keep(_BY_STAMP, key, _remember(read_trace(path), key[0]))


_BY_STAMP: dict[tuple[str, int, int], Trace] = {}


def read_checked(path: str, sha256: str) -> Trace:
    """The trace a spec names, re-read unless cached, refused if its bytes changed since."""
    if (path, sha256) in _TRACES:
        return _TRACES[(path, sha256)]
    tr = read_trace(path)
    if tr.sha256 != sha256:
        raise UserError(f"trace {path}: file changed since it was read (sha256 differs)")
    return _remember(tr, path)

