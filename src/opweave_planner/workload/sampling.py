"""The workload as requests a decode slot serves: what the AFD simulator draws, and the θ, ν²
of the per-slot stationary load that provisioning needs.

A slot serves requests back to back; request ``n`` (prompt ``P_n``, decode lifetime
``D_n >= 1``) contributes load ``P_n + a`` at ages ``a = 0..D_n-1``. θ and ν² come from
closed forms (:class:`ParametricWorkload`: geometric or fixed lengths, prompt and decode
independent), or from the package's stationary law (:mod:`opweave_planner.workload.law`) of a
trace (the plug-in estimator, exact for the trace's empirical law) or of a length law. Each
draws fresh requests and stationary slot states.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from opweave_planner.atomic import check_input_file
from opweave_planner.errors import UserError
from opweave_planner.workload.edge import workload_spec
from opweave_planner.workload.law import stationary_moments
from opweave_planner.workload.reader import read_trace
from opweave_planner.workload.shaping import materialize, scaled_law
from opweave_planner.workload.spec import FixedContextSpec, LawSpec, TraceSpec

__all__ = ["LengthDist", "LawWorkload", "ParametricWorkload", "RequestWorkload", "TraceWorkload",
           "load_trace", "workload_from_spec", "workload_from_text"]

DistKind = Literal["geometric", "fixed"]
MAX_MEAN_LENGTH = 1 << 24  # tokens: beyond any model's context (and p^3 of a geometric law underflows)


@dataclass(frozen=True)
class LengthDist:
    """A length law on the positive integers: geometric on {1, 2, ...} or a fixed value.

    Geometric with mean ``m`` is the paper's choice for decode lifetimes (variance
    ``m(m-1)``); ``fixed`` is the zero-variance case useful for checks.
    """

    kind: DistKind
    mean: float

    def __post_init__(self) -> None:
        if self.kind not in ("geometric", "fixed"):
            raise UserError(
                f"length distribution: expected 'geometric' or 'fixed', got {self.kind!r}"
            )
        if isinstance(self.mean, bool) or not math.isfinite(self.mean) or not 1 <= self.mean <= MAX_MEAN_LENGTH:
            raise UserError(f"{self.kind} length mean: expected a number in [1, {MAX_MEAN_LENGTH}], "
                            f"got {self.mean}")
        if self.kind == "fixed" and self.mean != int(self.mean):
            raise UserError(f"fixed length: expected an integer, got {self.mean}")

    def moments(self) -> tuple[float, float, float]:
        """E[X], E[X^2], E[X^3] (the third is needed for the variance of the stationary age)."""
        m = float(self.mean)
        if self.kind == "fixed":
            return m, m * m, m**3
        p = 1.0 / m
        return m, (2.0 - p) / p**2, (p * p - 6.0 * p + 6.0) / p**3

    @property
    def variance(self) -> float:
        m1, m2, _ = self.moments()
        return m2 - m1 * m1

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, int(self.mean), dtype=np.int64)
        return rng.geometric(1.0 / self.mean, size=n).astype(np.int64)

    def sample_age(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(lifetime, age) of the request found in a slot at a random step (length-biased).

        Geometric: the age is geometric on {0, 1, ...} and the residual life independent
        geometric on {1, ...} (memorylessness), so the lifetime is their sum.
        Fixed ``d``: lifetime ``d``, age uniform on {0..d-1}.
        """
        if self.kind == "fixed":
            d = int(self.mean)
            return np.full(n, d, dtype=np.int64), rng.integers(0, d, size=n, dtype=np.int64)
        p = 1.0 / self.mean
        age = rng.geometric(p, size=n).astype(np.int64) - 1
        return age + rng.geometric(p, size=n).astype(np.int64), age


class RequestWorkload:
    """What the AFD simulator and provisioning read of a workload, whatever it is made from."""

    theta: float
    nu2: float
    mean_prompt: float
    mean_decode: float

    @property
    def nu(self) -> float:
        return math.sqrt(max(self.nu2, 0.0))

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` fresh requests (prompt, decode), i.i.d."""
        raise NotImplementedError

    def sample_stationary(
        self, rng: np.random.Generator, n: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` independent slot states (prompt, decode, age) from the stationary law."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {
            "theta": self.theta,
            "nu2": self.nu2,
            "mean_prompt": self.mean_prompt,
            "mean_decode": self.mean_decode,
        }


class ParametricWorkload(RequestWorkload):
    """Independent prompt and decode laws; closed-form theta and nu^2."""

    def __init__(self, prompt: LengthDist, decode: LengthDist) -> None:
        self.prompt = prompt
        self.decode = decode
        d1, d2, d3 = decode.moments()
        mean_age = (d2 - d1) / (2.0 * d1)
        mean_age_sq = (2.0 * d3 - 3.0 * d2 + d1) / (6.0 * d1)
        self.mean_prompt = prompt.mean
        self.mean_decode = d1
        self.theta = prompt.mean + mean_age
        self.nu2 = prompt.variance + (mean_age_sq - mean_age * mean_age)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self.prompt.sample(rng, n), self.decode.sample(rng, n)

    def sample_stationary(self, rng, n):
        # Prompt is independent of decode, so length-biasing by D leaves its law unchanged.
        prompt = self.prompt.sample(rng, n)
        decode, age = self.decode.sample_age(rng, n)
        return prompt, decode, age

    def describe(self) -> dict:
        return {
            **super().describe(),
            "source": "parametric",
            "prompt": {"dist": self.prompt.kind, "mean": self.prompt.mean},
            "decode": {"dist": self.decode.kind, "mean": self.decode.mean},
        }


class TraceWorkload(RequestWorkload):
    """The empirical law of a request trace: bootstrap draws and plug-in moments."""

    def __init__(self, prompt: np.ndarray, decode: np.ndarray, name: str = "trace") -> None:
        self.prompt = np.ascontiguousarray(prompt, dtype=np.int64)
        self.decode = np.ascontiguousarray(decode, dtype=np.int64)
        if self.prompt.shape != self.decode.shape or self.prompt.ndim != 1 or self.prompt.size == 0:
            raise UserError(f"{name}: expected equal-length, non-empty prompt and decode arrays")
        if (self.prompt < 0).any() or (self.decode < 1).any():
            raise UserError(f"{name}: expected prompt >= 0 and decode >= 1 for every request")
        self.name = name
        self.format: str | None = None
        self.sha256: str | None = None
        self.theta, self.nu2 = stationary_moments(self.prompt, self.decode)
        self.mean_prompt = float(self.prompt.mean())
        self.mean_decode = float(self.decode.mean())
        self._cum_decode = np.cumsum(self.decode, dtype=np.float64)

    def sample(self, rng, n):
        idx = rng.integers(0, self.prompt.size, size=n)
        return self.prompt[idx], self.decode[idx]

    def sample_stationary(self, rng, n):
        # A random step lies in request i with probability D_i / sum(D); its age is uniform.
        u = rng.random(n) * self._cum_decode[-1]
        idx = np.minimum(np.searchsorted(self._cum_decode, u, side="right"), self.prompt.size - 1)
        decode = self.decode[idx]
        age = np.floor(rng.random(n) * decode).astype(np.int64)
        return self.prompt[idx], decode, np.minimum(age, decode - 1)

    def describe(self) -> dict:
        return {
            **super().describe(),
            "source": "trace",
            "trace": self.name,
            "requests": int(self.prompt.size),
            **({"format": self.format, "sha256": self.sha256} if self.sha256 else {}),
        }


def load_trace(path: str | Path) -> TraceWorkload:
    """Read a request trace through :func:`opweave_planner.workload.reader.read_trace`: any
    format of :data:`opweave_planner.workload.traces.FORMATS`, recognised from the header; a
    request's output tokens are its decode lifetime. Every data row must give a prompt length
    >= 0 and a decode length >= 1; the first bad row is reported by its line number in the file
    (the header is line 1).
    """
    check_input_file(path, "--trace")  # a folder or FIFO: one line, and a FIFO is never opened
    trace = read_trace(path)
    w = TraceWorkload(trace.prompt, trace.output, name=str(Path(path)))
    w.format = trace.format
    w.sha256 = trace.sha256
    return w


class LawWorkload(RequestWorkload):
    """Independent prompt and decode laws of :mod:`opweave_planner.workload.spec`
    (``fixed``, ``geometric``, ``lognormal``), as discretised there.

    theta and nu^2 are those of the materialised stationary law; requests are drawn from the
    discretised pmfs by inverse CDF, slot states with the decode length-biased
    (``P(D = d) d / E[D]``), the prompt independent and the age uniform on ``0..D-1``.
    """

    def __init__(self, spec: LawSpec) -> None:
        if spec.max_model_len is not None:
            raise UserError(
                "afd workload: --max-model-len with a parametric law is not supported "
                "(prompt and decode would no longer be independent); use a trace"
            )
        stat = materialize(spec)
        self.spec = spec
        self.prompt_law = scaled_law(spec.prompt, stat.scale) if spec.scale_ctx else spec.prompt
        wp, wd = self.prompt_law.pmf(0), spec.output.pmf(1)
        self._cp = np.cumsum(wp) / wp.sum()
        self._cd = np.cumsum(wd) / wd.sum()
        biased = wd * np.arange(wd.size)
        self._cb = np.cumsum(biased) / biased.sum()
        self.theta, self.nu2 = stat.theta, stat.nu2
        self.mean_prompt, self.mean_decode = stat.mean_prompt, stat.mean_output

    @staticmethod
    def _draw(cdf: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
        idx = np.searchsorted(cdf, rng.random(n), side="right")
        return np.minimum(idx, cdf.size - 1).astype(np.int64)

    def sample(self, rng, n):
        return self._draw(self._cp, rng, n), self._draw(self._cd, rng, n)

    def sample_stationary(self, rng, n):
        prompt = self._draw(self._cp, rng, n)
        decode = self._draw(self._cb, rng, n)
        age = np.minimum(np.floor(rng.random(n) * decode).astype(np.int64), decode - 1)
        return prompt, decode, age

    def describe(self) -> dict:
        return {
            **super().describe(),
            "source": "law",
            "prompt": self.prompt_law.label(),
            "decode": self.spec.output.label(),
        }


def workload_from_spec(spec: FixedContextSpec | TraceSpec | LawSpec) -> RequestWorkload:
    """The AFD workload of a spec from :func:`opweave_planner.workload.edge.workload_spec`.

    A trace keeps :class:`TraceWorkload`'s sampling (so an unshaped trace gives exactly what
    :func:`load_trace` gives), with ``scale_ctx``/``max_model_len`` applied to its requests;
    a law becomes a :class:`LawWorkload`; a fixed context is not a request workload.
    """
    if isinstance(spec, FixedContextSpec):
        raise UserError("afd workload: a fixed --ctx has no request lengths; give a trace or law")
    if isinstance(spec, LawSpec):
        return LawWorkload(spec)
    stat = materialize(spec)
    w = TraceWorkload(stat.prompt, stat.output, name=spec.path)
    w.format, w.sha256 = spec.format, spec.sha256
    return w


def workload_from_text(text: str, **shaping) -> RequestWorkload:
    """``--workload`` for ``afd``: a trace file of any supported format, a ``.toml`` law file
    or an inline law (``shaping``: ``scale_ctx``, ``max_model_len``, ``overflow``)."""
    return workload_from_spec(workload_spec(workload=text, **shaping))
