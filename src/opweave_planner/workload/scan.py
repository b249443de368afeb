"""The trace reader's numba kernels: CSV records and JSON lines of a block of bytes parsed into
two int64 arrays, with no Python object per row (reader.py feeds them blocks and turns where
they stop into errors). Compiled and cached like the search's; tests/test_fuzz_traces.py checks
them against Python's csv module and orjson, docs/workloads.md says what they accept and refuse.
"""

from __future__ import annotations

import numpy as np

from opweave_planner import jit
from opweave_planner.workload.traces import JSONL

#: longest length a trace may give (2^40 tokens; keeps every sum well inside int64)
MAX_LENGTH = 1 << 40
#: longest line of a trace (a CSV record, quoted line ends included): real lines are under
#: a few KiB (a Mooncake line with its hash_ids), and it bounds what one line can cost
MAX_LINE = 1 << 22
#: longest prompt or output field of a CSV trace, in bytes (quotes and blanks included)
MAX_FIELD = 4096
_JSON_DEPTH = 64  # deeper JSON lines go to orjson (which allows 1024)

# what a scan kernel stopped at (info[0]); info[1:4] = position, rows, line; info[4:] the detail
_MORE, _FULL, _SLOW, _NUL, _UTF8, _LONG, _COLUMNS, _VALUE, _FIELD, _QUOTE, _TWICE = range(11)
_INPUT = np.frombuffer(JSONL.prompt[0].encode(), np.uint8)  # the JSONL format's two keys
_OUTPUT = np.frombuffer(JSONL.output[0].encode(), np.uint8)
_TRUE, _FALSE, _NULL = (np.frombuffer(word, np.uint8) for word in (b"true", b"false", b"null"))


@jit.kernel(refcount=False)
def _space(c):
    """ASCII whitespace as str.isspace() has it (what a blank line and a padded number hold)."""
    return c == 32 or 9 <= c <= 13 or 28 <= c <= 31


@jit.kernel(refcount=False)
def _utf8(buf, i, n):
    """Length of the UTF-8 character that starts with byte buf[i] >= 0x80: 2-4, 0 if it is
    none (Python's strict decoder: no overlong form, surrogate or code point past U+10FFFF),
    -1 if the buffer ends inside it."""
    c = buf[i]
    lo, hi = 0x80, 0xBF  # the second byte's range; the others are always 0x80..0xBF
    if 0xC2 <= c <= 0xDF:
        k = 2
    elif 0xE0 <= c <= 0xEF:
        k = 3
        lo = 0xA0 if c == 0xE0 else 0x80
        hi = 0x9F if c == 0xED else 0xBF
    elif 0xF0 <= c <= 0xF4:
        k = 4
        lo = 0x90 if c == 0xF0 else 0x80
        hi = 0x8F if c == 0xF4 else 0xBF
    else:
        return 0
    for j in range(1, k):
        if i + j >= n:
            return -1
        b = buf[i + j]
        if not ((lo if j == 1 else 0x80) <= b <= (hi if j == 1 else 0xBF)):
            return 0
    return k


@jit.kernel(refcount=False)
def _fail(info, status, line, a, b, c, d):
    info[0] = status
    info[4] = line
    info[5] = a
    info[6] = b
    info[7] = c
    info[8] = d


@jit.entry
def _scan_csv(buf, pos, final, line, cols, out_p, out_o, row, info):
    """Records of buf[pos:] parsed as the csv module's excel dialect does (``"`` quotes a field,
    ``""`` inside is one quote, a quote elsewhere is text), a record ending at \\n, \\r\\n or \\r
    outside quotes; the prompt and output columns ``cols`` of each non-blank record go to
    out_p/out_o as ASCII decimal integers. Stops at the first bad record, at a record the
    buffer cuts (unless ``final``) or when out_* are full; info says which (_MORE...)."""
    n = buf.size
    val = np.zeros(2, np.int64)
    phase = np.zeros(2, np.int64)  # 0 leading blanks, 1 digits, 2 trailing blanks, 3 not a number
    span = np.zeros(4, np.int64)  # first and last byte + 1 of the prompt and output fields
    need = max(cols[0], cols[1])
    status = _MORE
    while pos < n and status == _MORE:
        if row == out_p.size:
            status = _FULL
            break
        start, first = pos, line
        field, state, blank, cut = 0, 0, True, False  # state: 0 field start, 1 unquoted, 2 quoted, 3 quote in quoted
        val[:] = 0
        phase[:] = 0
        slot = 0 if cols[0] == 0 else (1 if cols[1] == 0 else -1)
        if slot >= 0:
            span[2 * slot] = pos
        while True:
            if state <= 1 and pos < n:  # fast runs: text of another column, or a length's digits
                j = pos
                if slot < 0:
                    stop = min(n, start + MAX_LINE + 1)
                    while j < stop and 32 < buf[j] < 127 and buf[j] != 44 and buf[j] != 34:
                        j += 1
                elif phase[slot] <= 1:
                    stop = min(n, span[2 * slot] + MAX_FIELD)
                    v = val[slot]
                    while j < stop and 48 <= buf[j] <= 57:
                        if v <= MAX_LENGTH:
                            v = v * 10 + (buf[j] - 48)
                        j += 1
                    if j > pos:
                        val[slot] = v
                        phase[slot] = 1
                if j > pos:
                    pos, state, blank = j, 1, False
            if pos - start > MAX_LINE:
                _fail(info, _LONG, first, 0, 0, 0, 0)
                status = _LONG
                break
            if pos >= n:
                if not final:
                    cut = True
                elif state == 2:
                    _fail(info, _QUOTE, first, 0, 0, 0, 0)
                    status = _QUOTE
                break
            c = buf[pos]
            width = 1
            if c == 0:
                _fail(info, _NUL, line, 0, 0, 0, 0)
                status = _NUL
                break
            if c >= 0x80:
                width = _utf8(buf, pos, n)
                if width < 0 and not final:
                    cut = True
                    break
                if width <= 0:
                    _fail(info, _UTF8, line, 0, 0, 0, 0)
                    status = _UTF8
                    break
            if state != 2 and (c == 10 or c == 13):  # the record's end
                if slot >= 0:
                    span[2 * slot + 1] = pos
                if c == 13 and pos + 1 >= n and not final:
                    cut = True  # \r\n split by the buffer's end
                    break
                pos += 2 if c == 13 and pos + 1 < n and buf[pos + 1] == 10 else 1
                line += 1
                break
            if state == 2:
                if c == 34:
                    state = 3
                    pos += 1
                    continue
                if c == 13 and pos + 1 >= n and not final:
                    cut = True
                    break
                if c == 10 or (c == 13 and (pos + 1 >= n or buf[pos + 1] != 10)):
                    line += 1
            elif c == 44:  # the field's end
                if slot >= 0:
                    span[2 * slot + 1] = pos
                field += 1
                slot = 0 if cols[0] == field else (1 if cols[1] == field else -1)
                if slot >= 0:
                    span[2 * slot] = pos + 1
                state = 0
                pos += 1
                continue
            elif c == 34 and state == 0:
                state = 2
                pos += 1
                continue
            elif c == 34 and state == 3:
                state = 2
            else:
                state = 1
            # a character of the field's text
            space = width == 1 and _space(c)
            if not space:
                blank = False
            if slot >= 0:
                if pos + width - span[2 * slot] > MAX_FIELD:
                    _fail(info, _FIELD, first, slot, 0, 0, 0)
                    status = _FIELD
                    break
                ph = phase[slot]
                if 48 <= c <= 57 and ph <= 1:
                    phase[slot] = 1
                    if val[slot] <= MAX_LENGTH:
                        val[slot] = val[slot] * 10 + (c - 48)
                elif space:
                    if ph == 1:
                        phase[slot] = 2
                else:
                    phase[slot] = 3
            pos += width
        if status != _MORE:
            break
        if cut:
            pos, line = start, first
            break
        if blank:
            continue
        if field + 1 <= need:
            _fail(info, _COLUMNS, first, field + 1, 0, 0, 0)
            status = _COLUMNS
            break
        for k in range(2):
            if phase[k] == 0 or phase[k] == 3 or val[k] > MAX_LENGTH or val[k] < k:
                huge = 1 if phase[k] != 0 and phase[k] != 3 and val[k] > MAX_LENGTH else 0
                _fail(info, _VALUE, first, k, span[2 * k], span[2 * k + 1], huge)
                status = _VALUE
                break
        if status != _MORE:
            break
        out_p[row] = val[0]
        out_o[row] = val[1]
        row += 1
    info[0] = status
    info[1] = pos
    info[2] = row
    info[3] = line


@jit.kernel(refcount=False)
def _json_string(buf, i, e):
    """Index after the JSON string that starts at buf[i] == '"', -1 if it is not a plain one
    (a \\u escape, a control character, no closing quote: orjson decides)."""
    j = i + 1
    while j < e:
        c = buf[j]
        if c == 34:
            return j + 1
        if c == 92:
            if j + 1 >= e:
                return -1
            x = buf[j + 1]
            if not (x == 34 or x == 92 or x == 47 or x == 98 or x == 102 or x == 110 or x == 114
                    or x == 116):
                return -1
            j += 2
        elif c < 32:
            return -1
        else:
            j += 1
    return -1


@jit.kernel(refcount=False)
def _json_number(buf, i, e):
    """Index after the JSON number at buf[i], -1 if it is none or one orjson might refuse
    (an exponent of three digits may overflow a double; 40 characters bound the mantissa)."""
    j = i
    if j < e and buf[j] == 45:
        j += 1
    if j < e and buf[j] == 48:
        j += 1
    elif j < e and 49 <= buf[j] <= 57:
        while j < e and 48 <= buf[j] <= 57:
            j += 1
    else:
        return -1
    if j < e and buf[j] == 46:
        j += 1
        k = j
        while j < e and 48 <= buf[j] <= 57:
            j += 1
        if j == k:
            return -1
    if j < e and (buf[j] == 101 or buf[j] == 69):
        j += 1
        if j < e and (buf[j] == 43 or buf[j] == 45):
            j += 1
        k = j
        while j < e and 48 <= buf[j] <= 57:
            j += 1
        if j == k or j - k > 2:
            return -1
    return j if j - i <= 40 else -1


@jit.kernel(refcount=False)
def _json_length(buf, i, e, minimum):
    """(value, index after it) of a length written as a plain JSON integer in minimum..2^40,
    (-1, -1) otherwise (a float, a sign, a string...: orjson and the old checks decide)."""
    j, v = i, 0
    while j < e and 48 <= buf[j] <= 57 and j - i <= 13:
        v = v * 10 + (buf[j] - 48)
        j += 1
    if j == i or j - i > 13 or (buf[i] == 48 and j - i > 1) or v < minimum or v > MAX_LENGTH:
        return -1, -1
    if j < e and (buf[j] == 46 or buf[j] == 101 or buf[j] == 69):
        return -1, -1
    return v, j


@jit.kernel(refcount=False)
def _same(buf, i, j, word):
    if j - i != word.size:
        return False
    for k in range(word.size):  # noqa: SIM110 (a loop: numba compiles no generator here)
        if buf[i + k] != word[k]:
            return False
    return True


@jit.kernel(refcount=False)
def _json_lengths(buf, s, e, stack):
    """(code, input_length, output_length) of the JSON line buf[s:e]: code 0 read, 1 a blank
    line, 2 anything unusual (orjson and the old checks decide), 3 a length key given twice.

    A validating parser for the common case: an object whose two lengths are plain
    integers, every string without \\u escapes, nesting under _JSON_DEPTH."""
    i = s
    while i < e and _space(buf[i]):
        i += 1
    if i == e:
        return 1, 0, 0
    i = s
    while i < e and (buf[i] == 32 or buf[i] == 9):
        i += 1
    if buf[i] != 123:
        return 2, 0, 0
    vin, vout, key, twice = -1, -1, -1, False
    depth, state = 0, 0  # state: 0 a value, 1 a value or ']', 2 a key, 3 a key or '}', 4 ':', 5 after a value
    while True:
        while i < e and (buf[i] == 32 or buf[i] == 9):
            i += 1
        if i == e or (depth == 0 and state == 5):
            break
        c = buf[i]
        if (c == 93 and state == 1) or (c == 125 and state == 3):  # [] or {}
            depth -= 1
            i += 1
            state = 5
            continue
        if state <= 1:
            if key >= 0:  # the value of input_length or output_length
                v, j = _json_length(buf, i, e, key)
                if j < 0:
                    return 2, 0, 0
                if (vin if key == 0 else vout) >= 0:
                    twice = True
                if key == 0:
                    vin = v
                else:
                    vout = v
                i, key, state = j, -1, 5
                continue
            if c == 123 or c == 91:
                if depth == _JSON_DEPTH:
                    return 2, 0, 0
                stack[depth] = c
                depth += 1
                i += 1
                state = 3 if c == 123 else 1
                continue
            if c == 34:
                i = _json_string(buf, i, e)
            elif c == 116 and _same(buf, i, min(e, i + 4), _TRUE):
                i += 4
            elif c == 102 and _same(buf, i, min(e, i + 5), _FALSE):
                i += 5
            elif c == 110 and _same(buf, i, min(e, i + 4), _NULL):
                i += 4
            elif c == 45 or 48 <= c <= 57:
                i = _json_number(buf, i, e)
            else:
                return 2, 0, 0
            if i < 0:
                return 2, 0, 0
            state = 5
        elif state <= 3:
            if c != 34:
                return 2, 0, 0
            j = _json_string(buf, i, e)
            if j < 0:
                return 2, 0, 0
            key = -1
            if depth == 1:
                key = 0 if _same(buf, i + 1, j - 1, _INPUT) else (1 if _same(buf, i + 1, j - 1, _OUTPUT) else -1)
            i, state = j, 4
        elif state == 4:
            if c != 58:
                return 2, 0, 0
            i += 1
            state = 0
        else:
            top = stack[depth - 1]
            if c == 44:
                state = 2 if top == 123 else 0
            elif (c == 125 and top == 123) or (c == 93 and top == 91):
                depth -= 1
            else:
                return 2, 0, 0
            i += 1
    if depth != 0 or state != 5 or i != e or vin < 0 or vout < 0:
        return 2, 0, 0
    return (3 if twice else 0), vin, vout


@jit.entry
def _scan_jsonl(buf, pos, final, line, out_p, out_o, row, info):
    """JSON lines of buf[pos:] (ending at \\n, \\r\\n or \\r), their input and output lengths
    to out_p/out_o; stops at a line for orjson (_SLOW: info[5:8] its start, end and the next
    line's start), at a bad byte, at a line the buffer cuts (unless final), when full."""
    n = buf.size
    stack = np.zeros(_JSON_DEPTH, np.uint8)
    status = _MORE
    while pos < n:
        if row == out_p.size:
            status = _FULL
            break
        start, end, nxt = pos, -1, -1
        stop = min(n, start + MAX_LINE)
        while True:
            while pos < stop and 13 < buf[pos] < 0x80:  # the common bytes, in a tight loop
                pos += 1
            if pos >= n:
                break
            c = buf[pos]
            if c == 10 or c == 13:
                if c == 13 and pos + 1 >= n and not final:
                    break
                end = pos
                nxt = pos + 2 if c == 13 and pos + 1 < n and buf[pos + 1] == 10 else pos + 1
                break
            if pos - start >= MAX_LINE:
                status = _LONG
                break
            if c == 0:
                status = _NUL
                break
            width = 1
            if c >= 0x80:
                width = _utf8(buf, pos, n)
                if width < 0 and not final:
                    break
                if width <= 0:
                    status = _UTF8
                    break
            pos += width
        if status != _MORE:
            _fail(info, status, line, 0, 0, 0, 0)
            break
        if end < 0:
            if not final:
                pos = start
                break
            end, nxt = n, n
        code, a, b = _json_lengths(buf, start, end, stack)
        if code == 2 or code == 3:
            status = _SLOW if code == 2 else _TWICE
            _fail(info, status, line, start, end, nxt, 0)
            pos = start
            break
        if code == 0:
            out_p[row] = a
            out_o[row] = b
            row += 1
        line += 1
        pos = nxt
    info[0] = status
    info[1] = pos
    info[2] = row
    info[3] = line

