"""Shared test fixtures: in-process CLI runs and the hypothesis profiles.

Hypothesis profiles (``--hypothesis-profile=NAME``):

* ``ci`` (default): the bounded budget the fuzz suite runs with in CI (tests/test_fuzz_cli.py
  measured 42 s at a budget of 200 on the 2-core box; cut to 120 to keep CI under its ten
  minutes on slower CI machines); no deadline, since a first call compiles.
* ``long``: about 17x that budget, for a deliberate hunt, e.g.
  ``python -m pytest tests/test_fuzz_cli.py --hypothesis-profile=long`` (about 5 minutes on the 2-core box: 8,644 examples).
* ``dev``: a handful of examples per test, for editing the fuzz suite itself.

Tests that fix their own ``max_examples`` keep it under every profile; the fuzz tests take
``budget(share)`` of the active profile.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - hypothesis is a test extra
    settings = None

PROFILES = {"ci": 120, "long": 2000, "dev": 16}  # reference example budgets (see budget())

if settings is not None:
    _common = dict(deadline=None, print_blob=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                          HealthCheck.data_too_large, HealthCheck.filter_too_much])
    for _name, _n in PROFILES.items():
        settings.register_profile(_name, max_examples=_n, **_common)


def pytest_configure(config):
    # `--hypothesis-profile=NAME` (the hypothesis plugin's option) wins; else the CI budget
    if settings is not None and not config.getoption("hypothesis_profile", None):
        settings.load_profile("ci")


def budget(share: float) -> int:
    """Examples for one fuzz test: `share` of the active profile's reference budget, so
    `--hypothesis-profile=long` scales every fuzz test by the same factor."""
    return max(2, round(settings.default.max_examples * share))


GOLDEN = Path(__file__).parent / "golden"
# a two-owner AFD plan over h100 + a100 (every kind of action, a real hand-off)
AFD_PLAN = GOLDEN / "llama-3.1-8b_afd_h100+a100_v1.1.json"
# a tiny search: one GPU type, one policy, two batch sizes, one owner (about a second)
TINY = ("--model", "llama-3.1-8b", "--slo", "60ms", "--ctx", "8k", "--gpus", "h100",
        "--policy", "colocated", "--batches", "8,16", "--max-owners", "1", "-q")
DOCUMENTED_CODES = {0, 1, 2, 3, 130, 141, 143}  # 4 is documented too, but is always a bug


@dataclass
class Ran:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def run_cli(*argv: str) -> Ran:
    """`opweave-plan ARGV` in this process through the console-script guard."""
    from opweave_planner.cli.guard import invoke
    from opweave_planner.cli.main import app

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = invoke(app, [str(a) for a in argv], prog_name="opweave-plan", install_signals=False)
    out.flush()
    return Ran(code, out.buffer.getvalue().decode("utf-8", "replace"), err.getvalue())


def assert_one_line_error(ran: Ran, code: int = 2, *needles: str) -> str:
    """Exit `code`, no traceback, exactly one stderr line starting with error:/infeasible:,
    holding every needle; returns the line."""
    assert "Traceback" not in ran.err, ran.err
    assert ran.code == code, (ran.code, ran.err)
    lines = [ln for ln in ran.lines if ln.startswith(("error:", "infeasible:", "internal error:"))]
    assert len(lines) == 1, ran.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def cli():
    return run_cli


#: Poisson arrivals a deployment replays under `few_arrivals` (the planner replays
#: deployment.POISSON_REQUESTS = 20,000): a tenth, still thousands of requests over every replica.
#: OPWEAVE_TEST_ARRIVALS=20000 runs those tests at the planner's own count.
FEW_ARRIVALS = int(os.environ.get("OPWEAVE_TEST_ARRIVALS", "2000"))


@contextlib.contextmanager
def _few_arrivals():
    from opweave_planner import deployment

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(deployment, "POISSON_REQUESTS", FEW_ARRIVALS)
        yield FEW_ARRIVALS


@pytest.fixture
def few_arrivals():
    """Deployments in this test replay FEW_ARRIVALS seeded Poisson arrivals, not 20,000: for
    tests whose checks hold at any arrival count (exit codes, re-plan = re-simulate, the same
    bytes twice), whose time went to the aggregated replay of each replica count."""
    with _few_arrivals() as n:
        yield n


@pytest.fixture
def afd_plan(tmp_path) -> Path:
    path = tmp_path / "afd-plan.json"
    shutil.copyfile(AFD_PLAN, path)
    return path
