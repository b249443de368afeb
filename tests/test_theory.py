"""Analytical cost model (paper Section 3, Appendix A): theorems as properties, CLI."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import orjson
import pytest
import typer
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from opweave_planner import theory as T
from opweave_planner.cli.theory import theory_cmd
from opweave_planner.errors import UserError
from opweave_planner.inputs.hardware import load_hardware
from opweave_planner.inputs.model import load_model

GIB = float(1 << 30)
PROPS = settings(max_examples=150, deadline=None)

# A GPU: price (USD/s), bandwidth (B/s), peak FLOP/s, memory (bytes).
gpu_st = st.builds(
    T.GpuParams,
    id=st.just("g"),
    c=st.floats(0.2, 20.0).map(lambda h: h / 3600.0),
    beta=st.floats(2e11, 1e13),
    flops=st.floats(5e13, 5e15),
    memory=st.floats(16.0, 256.0).map(lambda g: g * GIB),
)
# A model relative to a GPU: weights occupy `frac` of memory; weights/(2 P_act) = `spread`
# (1 for a dense model, up to ~50 for a sparse MoE).
frac_st = st.floats(0.05, 0.95)
spread_st = st.floats(1.0, 50.0)


def _model_for(g: T.GpuParams, frac: float, spread: float) -> tuple[float, float]:
    m_weights = frac * g.memory
    return m_weights, m_weights / (2.0 * spread)


def _kv_grid(lo: float, hi: float, n: int = 80) -> list[float]:
    r = (hi / lo) ** (1.0 / (n - 1))
    return [lo * r**i for i in range(n)]


# --------------------------------------------------------------------------- #
# Theorem 3.1
# --------------------------------------------------------------------------- #

@PROPS
@given(g=gpu_st, frac=frac_st, spread=spread_st)
def test_theorem_3_1_homogeneous_gain(g, frac, spread):
    mw, p = _model_for(g, frac, spread)
    bs = T.b_star(mw, p, g.beta, g.flops)
    free = g.memory - mw
    bound = T.g_hom_bound(g.memory, mw)
    # m_kv from 1% of the threshold KV up to just past the colocation limit.
    grid = _kv_grid(0.01 * free / bs, 1.5 * free)
    prev = None
    for kv in grid:
        gain = T.g_hom(kv, p, mw, g.memory, g.beta, g.flops)
        bb = T.b_bar(g.memory, mw, kv)
        if bb < 1.0:
            assert math.isnan(gain)
            assert T.cpt_coloc(g.alpha, g.gamma, kv, p, g.memory, mw) == math.inf
            continue
        # The closed form agrees with the ratio of Eq. 4 to Eq. 1.
        ratio = T.cpt_coloc(g.alpha, g.gamma, kv, p, g.memory, mw) / T.cpt_hom(g.alpha, g.gamma, kv, p)
        assert gain == pytest.approx(ratio, rel=1e-9)
        assert gain >= 1.0
        assert gain < bound
        if bb >= bs:
            assert gain == 1.0
        else:
            assert gain > 1.0
            if prev is not None and prev[1] < bs:
                assert gain > prev[0]  # strictly increasing in m_kv, hence in s
        prev = (gain, bb)


@PROPS
@given(g=gpu_st, frac=frac_st, spread=spread_st)
def test_g_hom_bound_is_approached_at_the_colocation_limit(g, frac, spread):
    mw, p = _model_for(g, frac, spread)
    free = g.memory - mw
    gain = T.g_hom(free, p, mw, g.memory, g.beta, g.flops)  # b_bar = 1
    bound = T.g_hom_bound(g.memory, mw)
    assert 1.0 <= gain < bound
    assume(T.b_star(mw, p, g.beta, g.flops) > 1.0)
    kappa = 2 * p / g.flops
    assert gain == pytest.approx(bound * (free / g.beta) / (free / g.beta + kappa), rel=1e-12)


@pytest.mark.parametrize("name, tp", [("qwen3-235b-a22b", 8), ("gemma-3-27b", 1), ("qwen3-next-80b-a3b", 4)])
def test_g_hom_over_real_context_grid_is_monotone(name, tp):
    mi = T.model_inputs(load_model(name), tp)
    h100 = T.GpuParams.from_gpu(load_hardware().resolve("h100"))
    gains = [T.g_hom(mi.m_kv(s), mi.p_act, mi.m_weights, h100.memory, h100.beta, h100.flops)
             for s in T.parse_contexts("256..256k")]
    feasible = [x for x in gains if not math.isnan(x)]
    assert feasible and all(1.0 <= x < T.g_hom_bound(h100.memory, mi.m_weights) for x in feasible)
    assert feasible == sorted(feasible)


# --------------------------------------------------------------------------- #
# Theorem 3.2
# --------------------------------------------------------------------------- #

def _labelled(g1: T.GpuParams, g2: T.GpuParams) -> tuple[T.GpuParams, T.GpuParams]:
    return (g1, g2) if T.eta(g1.beta, g1.flops, g2.beta, g2.flops) >= 1 else (g2, g1)


@PROPS
@given(ga=gpu_st, gb=gpu_st, p=st.floats(1e8, 5e11))
def test_theorem_3_2_heterogeneous_gain(ga, gb, p):
    g1, g2 = _labelled(ga, gb)
    a, c = [g1.alpha, g2.alpha], [g1.gamma, g2.gamma]
    e = T.eta(g1.beta, g1.flops, g2.beta, g2.flops)
    bound = T.g_het_bound(e)
    dom = T.dominance(a[0], c[0], a[1], c[1])
    xs = T.x_star(p, a[0], c[0], a[1], c[1])
    scale = 2 * p * max(c) / min(a)  # KV bytes where the two terms are comparable
    grid = [0.0, *_kv_grid(1e-4 * scale, 1e4 * scale)]
    gains = [T.g_het(x, p, a, c) for x in grid]
    assert all(gn >= 1.0 - 1e-15 and gn <= bound * (1 + 1e-12) for gn in gains)
    assert gains[0] == pytest.approx(1.0, rel=1e-12)
    if dom is not None:
        assert xs is None
        assert all(gn == pytest.approx(1.0, rel=1e-12) for gn in gains)
        return
    # Crossed ordering under the eta >= 1 labelling.
    assert a[0] < a[1] and c[1] < c[0] and xs > 0
    # Strict monotonicity is only observable in floats when the types differ measurably.
    assume(min(a[1] / a[0], c[0] / c[1]) > 1 + 1e-6)
    peak = T.g_het(xs, p, a, c)
    assert peak == pytest.approx(T.g_het_peak(a[0], c[0], a[1], c[1]), rel=1e-9)
    assert peak <= bound * (1 + 1e-12)
    left = [gn for x, gn in zip(grid, gains) if x < xs]
    right = [gn for x, gn in zip(grid, gains) if x > xs]
    assert all(u < v for u, v in itertools.pairwise(left))  # strictly increasing before x*
    assert all(u > v for u, v in itertools.pairwise(right))  # strictly decreasing after x*
    assert all(gn <= peak * (1 + 1e-12) for gn in gains)  # unique peak at x*


@PROPS
@given(ga=gpu_st, gb=gpu_st, p=st.floats(1e8, 5e11))
def test_bound_is_attained_at_x_star_with_cost_ratio_w_star(ga, gb, p):
    g1, g2 = _labelled(ga, gb)
    e = T.eta(g1.beta, g1.flops, g2.beta, g2.flops)
    assume(e > 1.0 + 1e-6)
    w = T.w_star(g1.beta, g1.flops, g2.beta, g2.flops)
    g1 = T.GpuParams("g1", w * g2.c, g1.beta, g1.flops, g1.memory)
    a, c = [g1.alpha, g2.alpha], [g1.gamma, g2.gamma]
    assert T.dominance(a[0], c[0], a[1], c[1]) is None
    xs = T.x_star(p, a[0], c[0], a[1], c[1])
    assert T.g_het(xs, p, a, c) == pytest.approx(T.g_het_bound(e), rel=1e-9)
    assert T.g_het_peak(a[0], c[0], a[1], c[1]) == pytest.approx((1 + math.sqrt(e)) / 2, rel=1e-9)


@PROPS
@given(g=gpu_st, worse=st.tuples(st.floats(1.0, 3.0), st.floats(0.3, 1.0), st.floats(0.3, 1.0)),
       p=st.floats(1e8, 5e11))
def test_no_gain_under_dominance(g, worse, p):
    dearer, slower_bw, slower_f = worse
    h = T.GpuParams("h", g.c * dearer, g.beta * slower_bw, g.flops * slower_f, g.memory)
    assert T.dominance(g.alpha, g.gamma, h.alpha, h.gamma) == 1
    for x in [0.0, *_kv_grid(1e3, 1e12, 30)]:
        assert T.g_het(x, p, [g.alpha, h.alpha], [g.gamma, h.gamma]) == pytest.approx(1.0, rel=1e-12)


# --------------------------------------------------------------------------- #
# Paper numbers (Table 1, Section 7.4), CAD, inputs
# --------------------------------------------------------------------------- #

@pytest.mark.parametrize("pair, eta, bound", [(("h100", "l40s"), 1.42, 1.10), (("h100", "a100"), 1.93, 1.19)])
def test_section_7_4_eta_and_bounds(pair, eta, bound):
    mi, gpus = T.build_inputs("gemma-3-27b", list(pair))
    s = T.pair_summary(mi, *gpus)
    assert round(s["eta"], 2) == eta
    assert round(s["bound"], 2) == bound
    assert s["dominant"] is None and s["peak_gain"] <= s["bound"]


def test_cad_balance_condition():
    cb = T.cad_balance(80 * GIB, 3.35e12, 40e9, 3.35e12, microbatches=2)
    assert cb.feasible and cb.t_attn_max_s == pytest.approx(80 * GIB / (2 * 3.35e12))
    assert not T.cad_balance(80 * GIB, 3.35e12, 60e9, 3.35e12, microbatches=2).feasible
    with pytest.raises(UserError):
        T.cad_balance(1.0, 1.0, 1.0, 1.0, microbatches=0)


def test_model_inputs_sharding():
    spec = load_model("qwen3-235b-a22b")
    one, eight = T.model_inputs(spec, 1), T.model_inputs(spec, 8)
    # 4 KV heads at TP 8: each GPU keeps a whole (replicated) KV head of the QKV weights,
    # and every GPU keeps the routers, so TP 8 holds a little more than an eighth
    assert one.m_weights / 8 < eight.m_weights < 1.01 * one.m_weights / 8
    assert eight.p_act == pytest.approx(one.p_act / 8)
    assert 20e9 < one.p_act < 23e9  # "A22B": routed experts only, no embedding lookup
    # 4 KV heads: TP 8 keeps one head per GPU, so KV only divides by 4.
    assert eight.m_kv(4096) == pytest.approx(one.m_kv(4096) / 4)
    gemma = T.model_inputs(load_model("gemma-3-27b"), 1)
    assert not gemma.uniform_layers and any(w for w, _ in gemma.kv_terms)  # sliding windows capped
    nxt = T.model_inputs(load_model("qwen3-next-80b-a3b"), 1)
    assert nxt.kv_fixed > 0  # linear-attention state is constant per request


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-235b-a22b", "gemma-3-27b", "qwen3-next-80b-a3b"])
def test_theory_shards_like_the_search(name):
    """One sharding rule: theory's per-GPU weights and KV are the lookup's weight_shard/kv_shard."""
    from opweave_planner.latency.lookup import kv_shard, weight_shard
    from opweave_planner.structure.operators import build_sequence

    spec = load_model(name)
    seq = build_sequence(spec)
    for tp in (1, 2, 4, 8):
        mi = T.model_inputs(spec, tp)
        assert mi.m_weights == pytest.approx(sum(weight_shard(op, tp) for op in seq.ops), rel=1e-12)
        for ctx in (1024, 32768):
            want = sum(kv_shard(op, tp, ctx) for op in seq.ops)
            assert mi.m_kv(ctx) == pytest.approx(want, rel=1e-12)


def test_parse_contexts():
    assert T.parse_contexts("1k..8k") == [1024, 2048, 4096, 8192]
    assert T.parse_contexts("32k, 4096,1m") == [4096, 32768, 1 << 20]
    for bad in ("", "8k..1k", "abc", "0", "1.5"):
        with pytest.raises(UserError):
            T.parse_contexts(bad)


def test_zero_price_is_a_user_error(tmp_path):
    prices = tmp_path / "p.json"
    prices.write_text('{"l40s": 0}')
    with pytest.raises(UserError, match="positive"):
        T.build_inputs("gemma-3-27b", "h100,l40s", prices=str(prices))


# --------------------------------------------------------------------------- #
# CLI
# --------------------------------------------------------------------------- #

def _app() -> typer.Typer:
    app = typer.Typer(add_completion=False)
    app.command("theory")(theory_cmd)

    @app.callback()
    def _root() -> None:
        pass

    return app


runner = CliRunner()


def test_cli_json_reports_section_7_4_numbers():
    res = runner.invoke(_app(), ["theory", "--model", "gemma-3-27b", "--gpus", "h100,l40s,a100",
                                 "--ctx", "1k..16k", "--json"])
    assert res.exit_code == 0, res.output
    data = orjson.loads(res.stdout)
    assert res.stdout.encode() == orjson.dumps(data, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n"
    pairs = {frozenset((p["type1"], p["type2"])): p for p in data["pairs"]}
    hl, ha = pairs[frozenset(("h100", "l40s"))], pairs[frozenset(("h100", "a100"))]
    assert (round(hl["eta"], 2), round(hl["bound"], 2)) == (1.42, 1.10)
    assert (round(ha["eta"], 2), round(ha["bound"], 2)) == (1.93, 1.19)
    assert [r["context"] for r in data["rows"]] == [1024, 2048, 4096, 8192, 16384]
    assert all(r["g_het"] >= 1.0 for r in data["rows"])
    assert len(data["cad"]) == 9


def test_cli_table_and_errors():
    res = runner.invoke(_app(), ["theory", "--model", "llama-3.1-8b", "--gpus", "h100,h20", "--ctx", "4k,32k"],
                         env={"COLUMNS": "220"})
    assert res.exit_code == 0, res.output
    assert "G_het" in res.stdout and "CAD balance" in res.stdout and "32k" in res.stdout
    bad = runner.invoke(_app(), ["theory", "--model", "llama-3.1-8b", "--ctx", "lots"])
    assert isinstance(bad.exception, UserError) and "--ctx" in str(bad.exception)
    bad = runner.invoke(_app(), ["theory", "--model", "llama-3.1-8b", "--gpus", "tpu"])
    assert isinstance(bad.exception, UserError) and "--gpus" in str(bad.exception)


def test_cli_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "gains.png"
    res = runner.invoke(_app(), ["theory", "--model", "qwen3-235b-a22b", "--tp", "8", "--gpus", "h100,h20",
                                 "--ctx", "1k..64k", "--plot", str(out)])
    assert res.exit_code == 0, res.output
    assert out.stat().st_size > 1000


def test_plot_without_matplotlib_is_a_user_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    mi, gpus = T.build_inputs("llama-3.1-8b", "h100")
    with pytest.raises(UserError, match="matplotlib"):
        T.plot_gains(mi, gpus, 1024, 4096, str(tmp_path / "x.png"))


def test_cli_module_imports_only_typer_and_stdlib():
    code = ("import sys, opweave_planner.cli.theory; "
            "heavy = [m for m in ('numpy', 'rich', 'orjson', 'pydantic', 'opweave_planner.theory') "
            "if m in sys.modules]; print(heavy); sys.exit(bool(heavy))")
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
