"""theta and nu^2: closed forms, the trace estimator, stationary sampling, trace validation."""

from __future__ import annotations

import numpy as np
import pytest

from opweave_planner.errors import UserError
from opweave_planner.workload.law import stationary_moments
from opweave_planner.workload.sampling import (
    LengthDist,
    ParametricWorkload,
    TraceWorkload,
    load_trace,
)


def _brute_force(prompt, decode):
    """Mean and variance of the per-step load over the expanded trace (every step listed)."""
    loads = np.concatenate([p + np.arange(d) for p, d in zip(prompt, decode)]).astype(float)
    return loads.mean(), loads.var()


def test_geometric_closed_form_matches_corollary():
    w = ParametricWorkload(LengthDist("geometric", 100), LengthDist("geometric", 500))
    mu_out = 499
    assert w.theta == pytest.approx(100 + mu_out)
    assert w.nu2 == pytest.approx(100 * 99 + mu_out * (mu_out + 1))


@pytest.mark.parametrize(
    "prompt, decode",
    [
        (("geometric", 100), ("geometric", 500)),
        (("fixed", 30), ("geometric", 40)),
        (("geometric", 7), ("fixed", 25)),
    ],
)
def test_closed_form_agrees_with_trace_estimator_on_large_traces(prompt, decode):
    w = ParametricWorkload(LengthDist(*prompt), LengthDist(*decode))
    p, d = w.sample(np.random.default_rng(123), 400_000)
    theta, nu2 = stationary_moments(p, d)
    assert theta == pytest.approx(w.theta, rel=0.01)
    assert nu2 == pytest.approx(w.nu2, rel=0.02)


def test_estimator_is_exact_for_the_trace_law_with_dependent_lengths():
    rng = np.random.default_rng(5)
    d = rng.integers(1, 60, size=300)
    p = 3 * d + rng.integers(0, 20, size=300)  # long prompts come with long decodes
    theta, nu2 = stationary_moments(p, d)
    mean, var = _brute_force(p, d)
    assert theta == pytest.approx(mean, rel=1e-12)
    assert nu2 == pytest.approx(var, rel=1e-10)
    # Not the arrival average: length-biasing makes theta exceed mean(P) + mean(D-1)/2.
    assert theta > p.mean() + (d.mean() - 1) / 2 + 1


@pytest.mark.parametrize(
    "workload",
    [
        ParametricWorkload(LengthDist("geometric", 50), LengthDist("geometric", 80)),
        ParametricWorkload(LengthDist("fixed", 10), LengthDist("fixed", 31)),
        TraceWorkload(np.array([5, 100, 0, 40]), np.array([1, 9, 30, 4])),
    ],
)
def test_stationary_sampler_has_the_stationary_moments(workload):
    p, d, age = workload.sample_stationary(np.random.default_rng(9), 400_000)
    assert (age >= 0).all() and (age < d).all()
    y = (p + age).astype(float)
    assert y.mean() == pytest.approx(workload.theta, rel=0.01)
    assert y.var() == pytest.approx(workload.nu2, rel=0.03)


def _write(tmp_path, text):
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_load_trace_reads_columns_in_any_order(tmp_path):
    w = load_trace(_write(tmp_path, "decode_len,id,prompt_len\n3,a,10\n1,b,0\n\n5,c,2\n"))
    np.testing.assert_array_equal(w.prompt, [10, 0, 2])
    np.testing.assert_array_equal(w.decode, [3, 1, 5])
    assert (w.theta, w.nu2) == pytest.approx(_brute_force(w.prompt, w.decode))


@pytest.mark.parametrize(
    "text, needle",
    [
        ("prompt,decode\n1,2\n-4,3\n", "line 3: prompt length must be an integer >= 0"),
        ("prompt,decode\n1,2\n4,3\n7,0\n", "line 4: decode length must be an integer >= 1"),
        ("prompt,decode\n1,2.5\n", "line 2: decode length"),
        ("prompt,decode\n1,\n", "line 2: decode length"),
        ("prompt,decode\n1,2\n9\n", "line 3: expected 2 columns, got 1"),
        ("prompt,output\n1,2\n", "unknown header"),
        ("prompt,decode\n", "no data rows"),
        ("", "empty file"),
    ],
)
def test_bad_traces_are_rejected_with_the_line(tmp_path, text, needle):
    with pytest.raises(UserError, match=needle):
        load_trace(_write(tmp_path, text))


def test_missing_trace_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"nope\.csv' does not exist"):
        load_trace(tmp_path / "nope.csv")


@pytest.mark.parametrize("kind, mean", [("geometric", 0.5), ("fixed", 2.5), ("poisson", 3)])
def test_bad_length_laws_are_rejected(kind, mean):
    with pytest.raises(UserError):
        LengthDist(kind, mean)


def test_law_workload_matches_the_closed_form_and_samples_its_law():
    from opweave_planner.workload.sampling import workload_from_text

    w = workload_from_text("geometric:100;out=geometric:500")
    ref = ParametricWorkload(LengthDist("geometric", 100), LengthDist("geometric", 500))
    assert w.theta == pytest.approx(ref.theta, rel=1e-6)
    assert w.nu2 == pytest.approx(ref.nu2, rel=1e-6)
    for law in ("geometric:100;out=geometric:500", "lognormal:mean=2k,cv=1.0;out=geometric:200",
                "fixed:30;out=fixed:25"):
        w = workload_from_text(law)
        p, d, age = w.sample_stationary(np.random.default_rng(4), 400_000)
        assert (age >= 0).all() and (age < d).all()
        y = (p + age).astype(float)
        assert y.mean() == pytest.approx(w.theta, rel=0.01)
        assert y.var() == pytest.approx(w.nu2, rel=0.03)
        fp, fd = w.sample(np.random.default_rng(4), 200_000)
        assert fp.mean() == pytest.approx(w.mean_prompt, rel=0.01)
        assert fd.mean() == pytest.approx(w.mean_decode, rel=0.01)
        assert w.describe()["source"] == "law"


def test_workload_from_text_reads_traces_like_load_trace(tmp_path):
    from opweave_planner.workload.sampling import workload_from_text

    path = _write(tmp_path, "prompt_tokens,output_tokens\n10,4\n300,9\n5,1\n")
    a, b = load_trace(path), workload_from_text(str(path))
    np.testing.assert_array_equal(a.prompt, b.prompt)
    np.testing.assert_array_equal(a.decode, b.decode)
    assert (a.theta, a.nu2) == (b.theta, b.nu2)
    s = workload_from_text(str(path), scale_ctx=400)
    assert s.theta == pytest.approx(400, abs=0.5)
    with pytest.raises(UserError, match="not supported"):
        workload_from_text("fixed:10;out=fixed:2", max_model_len=100)
