"""One grammar for the quantities users type: durations, token counts, bandwidths.

Every command and file format parses these through here, so `--ctx 1.5k` means
the same to the planner, `theory`, `compare`, `afd` and a regen matrix.
"""

from __future__ import annotations

import math
import re

from opweave_planner.errors import UserError

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_DURATION = re.compile(rf"\s*{_NUMBER}\s*(ms|s|us|µs)\s*")
_BARE = re.compile(rf"\s*{_NUMBER}\s*")
_TOKENS = re.compile(rf"\s*{_NUMBER}\s*([kKmM]?)\s*")
_BANDWIDTH = re.compile(rf"\s*{_NUMBER}\s*(GBps|GB/s|GB|Gbps|Gb/s|Gbit/s)?\s*")

_DURATION_MS = {"ms": 1.0, "s": 1e3, "us": 1e-3, "µs": 1e-3}
_TOKEN_SCALE = {"": 1, "k": 1024, "m": 1024 * 1024}
MAX_TOKENS = 1 << 24  # 16M tokens: beyond any model's context window


def _finite_positive(value: float, text: object, field: str) -> float:
    if not math.isfinite(value):
        raise UserError(f"{field}: '{text}' must be a finite number")
    if value <= 0:
        raise UserError(f"{field}: '{text}' must be positive")
    return value


def parse_duration_ms(text: object, field: str = "--slo") -> float:
    """'60ms', '0.06s', '60000us' -> milliseconds; a bare number is ambiguous and rejected."""
    m = _DURATION.fullmatch(str(text))
    if not m:
        if _BARE.fullmatch(str(text)):
            raise UserError(f"{field}: '{text}' has no unit; write e.g. 60ms, 0.06s or 60000us")
        raise UserError(f"{field}: '{text}' is not a duration; expected e.g. 60ms, 0.06s or 60000us")
    return _finite_positive(float(m.group(1)) * _DURATION_MS[m.group(2)], text, field)


def parse_tokens(text: object, field: str = "--ctx") -> int:
    """'32k' -> 32768, '1.5k' -> 1536, '131072' -> 131072 (k = 1024); must be a whole count."""
    if isinstance(text, bool):
        raise UserError(f"{field}: '{text}' is not a token count; expected e.g. 32k or 131072")
    if isinstance(text, int):
        value = float(text)
    else:
        m = _TOKENS.fullmatch(str(text))
        if not m:
            raise UserError(f"{field}: '{text}' is not a token count; expected e.g. 32k, 1.5k or 131072")
        value = float(m.group(1)) * _TOKEN_SCALE[m.group(2).lower()]
    _finite_positive(value, text, field)
    if value != int(value):
        raise UserError(f"{field}: '{text}' is not a whole number of tokens")
    if value > MAX_TOKENS:
        raise UserError(f"{field}: '{text}' exceeds {MAX_TOKENS} tokens")
    return int(value)


def parse_bandwidth_gbps(text: object, field: str = "--network-bandwidth") -> float:
    """'4GBps', '4GB/s', '4' -> 4.0 GB/s; '100Gbps', '100Gb/s' -> 12.5 GB/s (bits)."""
    m = _BANDWIDTH.fullmatch(str(text))
    if not m:
        raise UserError(f"{field}: '{text}' is not a bandwidth; expected e.g. 4GBps, 4GB/s or 100Gbps")
    value = float(m.group(1))
    if m.group(2) in ("Gbps", "Gb/s", "Gbit/s"):
        value /= 8.0
    return _finite_positive(value, text, field)


def parse_latency_us(text: object, field: str = "--network-latency") -> float:
    """'5us', '0.2ms' -> microseconds; a bare number is read as microseconds."""
    if _BARE.fullmatch(str(text)):
        value = float(str(text))
        if not math.isfinite(value) or value < 0:
            raise UserError(f"{field}: '{text}' must be a finite non-negative number of microseconds")
        return value
    return parse_duration_ms(text, field) * 1e3


_SHARE = re.compile(rf"\s*{_NUMBER}\s*(%?)\s*")


def parse_share(text: object, field: str, below_one: bool = False) -> float:
    """'10%' or '0.1' -> 0.1; a share of something, 0 <= x (< 1 when `below_one`)."""
    if isinstance(text, bool):
        raise UserError(f"{field}: '{text}' is not a share; expected e.g. 0.1 or 10%")
    m = _SHARE.fullmatch(str(text))
    if not m:
        raise UserError(f"{field}: '{text}' is not a share; expected e.g. 0.1 or 10%")
    value = float(m.group(1)) / (100.0 if m.group(2) else 1.0)
    if not math.isfinite(value) or value < 0 or (below_one and value >= 1) or value > 10:
        bound = "in [0, 1)" if below_one else "between 0 and 10 (1000%)"
        raise UserError(f"{field}: '{text}' must be a share {bound}")
    return value


def label_tokens(n: int) -> str:
    """32768 -> '32k' (for file names and tables); other counts stay as digits."""
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)
