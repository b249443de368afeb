"""Request arrivals: a Poisson process at a rate, or a trace's own timestamps replayed faster or
slower, each arrival with its prompt length.

The decode planner reads a trace's lengths only; queueing at the prefill pool (TTFT) needs when
requests arrive too. Azure CSVs carry a `TIMESTAMP` column (ISO date-time), Mooncake JSON lines
a `timestamp` key (milliseconds). Times are seconds from the first arrival, sorted, float64;
numpy and the standard library only (no numba here).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from opweave_planner.atomic import open_input
from opweave_planner.errors import UserError

__all__ = ["Arrivals", "poisson", "from_trace"]


@dataclass(frozen=True, eq=False)
class Arrivals:
    """Arrival times (s, non-decreasing, first at 0 for a trace) and each request's prompt tokens;
    `rows`: each arrival's row of the file (a trace) or of the length pool drawn from (Poisson),
    so that its other lengths can be looked up (None: not known)."""

    times_s: np.ndarray
    prompts: np.ndarray
    source: str
    rows: np.ndarray | None = None
    outputs: np.ndarray | None = None  # each request's output tokens, where its workload gives them

    @property
    def rate(self) -> float:
        """Mean arrival rate over the span (requests/s)."""
        span = float(self.times_s[-1] - self.times_s[0]) if self.times_s.size > 1 else 0.0
        return (self.times_s.size - 1) / span if span > 0 else float("inf")


def poisson(rate: float, n: int, prompts, seed: int = 0) -> Arrivals:
    """`n` Poisson arrivals at `rate` requests/s, seeded; `prompts` is one length for all or an
    array the lengths are drawn from uniformly (with replacement) by the same generator."""
    if not (np.isfinite(rate) and rate > 0):
        raise UserError(f"--request-rate: {rate!r}; expected a positive number of requests per second")
    if n < 1:
        raise UserError(f"arrivals: {n} requests; expected at least 1")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, n)
    times = np.cumsum(gaps) - gaps[0]
    pool = np.atleast_1d(np.asarray(prompts, dtype=np.int64))
    rows = np.arange(n) if pool.size == n else (np.zeros(n, np.int64) if pool.size == 1 else rng.choice(pool.size, n))
    return Arrivals(times, pool[rows].astype(np.int64), f"poisson {rate:g}/s seed {seed}", rows)


def from_trace(path: str | Path, rate_scale: float = 1.0) -> Arrivals:
    """A trace's timestamps, divided by `rate_scale` (2: the same requests twice as fast)."""
    if not (np.isfinite(rate_scale) and rate_scale > 0):
        raise UserError(f"--rate-scale: {rate_scale!r}; expected a positive factor")
    p = Path(path)
    with open_input(p, "--workload") as fh:  # the one input-path check (folders, FIFOs, links)
        raw = fh.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{p}: byte {exc.start} is not UTF-8; expected a UTF-8 trace with timestamps") from None
    if p.suffix == ".jsonl":
        times, prompts = _jsonl(p, text)
    else:
        times, prompts = _csv(p, text)
    if not times:
        raise UserError(f"{p}: no requests with a timestamp")
    t = np.asarray(times, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    t = (t[order] - t[order][0]) / rate_scale
    return Arrivals(t, np.asarray(prompts, dtype=np.int64)[order], f"{p.name} x{rate_scale:g}", order)


def _jsonl(p: Path, text: str) -> tuple[list[float], list[int]]:
    times, prompts = [], []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ts, n = float(row["timestamp"]) / 1e3, int(row["input_length"])
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{p}:{i}: expected an object with numeric 'timestamp' (ms) and 'input_length'") from None
        times.append(ts)
        prompts.append(n)
    return times, prompts


def _csv(p: Path, text: str) -> tuple[list[float], list[int]]:
    rows = csv.reader(text.splitlines())
    header = [h.strip().lower() for h in next(rows, [])]
    if "timestamp" not in header or "contexttokens" not in header:
        raise UserError(f"{p}: expected CSV columns TIMESTAMP and ContextTokens (an Azure trace)")
    it, ip = header.index("timestamp"), header.index("contexttokens")
    times, prompts = [], []
    for i, row in enumerate(rows, start=2):
        try:
            stamp = row[it].strip()
            head, _, frac = stamp.partition(".")  # Azure writes 7 fractional digits
            t = dt.datetime.fromisoformat(head).replace(tzinfo=dt.UTC).timestamp()
            times.append(t + (float(f"0.{frac}") if frac else 0.0))
            prompts.append(int(row[ip]))
        except (ValueError, IndexError):
            raise UserError(f"{p}:{i}: expected an ISO date-time TIMESTAMP and an integer ContextTokens") from None
    return times, prompts
