"""`opweave-plan theory`: the paper's closed-form cost model (Section 3, Appendix A).

Only typer and the standard library load at import time; the library and rich
load inside the command body so `opweave-plan --help` stays fast.
"""

from __future__ import annotations

import math
from typing import Any

import typer


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _ctx(tokens: float | None) -> str:
    if tokens is None:
        return "-"
    t = int(tokens)
    return f"{t // 1024}k" if t >= 1024 and t % 1024 == 0 else f"{t:,}"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


TP_CHOICES = (1, 2, 4, 8)
MAX_TP = 4096  # the planner's GPU budget bound: no group is larger
MAX_MICROBATCHES = 64  # the planner's --max-microbatches bound


def default_tp(model: Any, gpus: Any, contexts: list[int], tp_choices=TP_CHOICES,
               catalog: str | None = None, prices: str | None = None) -> int:
    """Smallest TP degree whose weight shard plus one request's KV at the smallest context fits
    every listed GPU (else the one that fits the most of them, ties to the smaller TP).

    TP 1 made the README's example print "weights don't fit" for a 70B model on both GPUs.
    """
    from opweave_planner import theory

    best, best_fits = tp_choices[0], -1
    for tp in tp_choices:
        mi, params = theory.build_inputs(model, gpus, tp=tp, catalog=catalog, prices=prices)
        need = mi.m_weights + mi.m_kv(contexts[0])
        fits = sum(g.memory > need for g in params)
        if fits == len(params):
            return tp
        if fits > best_fits:
            best, best_fits = tp, fits
    return best


def _render(res: dict[str, Any]) -> None:
    from rich.table import Table

    from opweave_planner.report import console

    con = console()
    inp = res["inputs"]
    kv = " + ".join(
        [f"{_bytes(t['bytes_per_token'])}/tok" + (f" x min(s,{t['window']})" if t["window"] else " x s")
         for t in inp["kv_terms"]] + ([_bytes(inp["kv_fixed_bytes"])] if inp["kv_fixed_bytes"] else []))
    con.print(f"[bold]{res['model']}[/bold]  TP{res['tp']} per GPU: M_weights {_bytes(inp['m_weights_bytes'])}, "
              f"P_act {inp['p_act'] / 1e9:.2f} B, m_kv(s) = {kv or '0'}")

    g = Table(title="GPU types (Theorem 3.1)", title_justify="left")
    for col in ("gpu", "$/h", "alpha $/GB", "gamma $/PFLOP", "b*", "G_hom bound", "G_hom>1 from", "coloc max ctx"):
        g.add_column(col, justify="right")
    for s in res["gpus"]:
        g.add_row(s["id"], _fmt(s["price_per_hour"]), _fmt(s["alpha_usd_per_gb"] * 1e6, ".3f") + "e-6",
                  _fmt(s["gamma_usd_per_pflop"] * 1e3, ".3f") + "e-3", _fmt(s["b_star"], ".0f"),
                  _fmt(s["g_hom_bound"], ".3f") if s["weights_fit"] else "weights don't fit",
                  _ctx(s["g_hom_onset_ctx"]), _ctx(s["coloc_max_ctx"]))
    con.print(g)

    if res["pairs"]:
        p = Table(title="GPU pairs (Theorem 3.2; type 1 = higher beta/F, attention side)", title_justify="left")
        for col in ("type1+type2", "eta", "dominant", "x* ", "s*", "peak gain", "bound", "c1/c2", "w*"):
            p.add_column(col, justify="right")
        for s in res["pairs"]:
            p.add_row(f"{s['type1']}+{s['type2']}", _fmt(s["eta"]), s["dominant"] or "-",
                      _bytes(s["x_star_bytes"]) if s["x_star_bytes"] is not None else "-",
                      _ctx(s["s_star_ctx"]), _fmt(s["peak_gain"], ".3f"), _fmt(s["bound"], ".3f"),
                      _fmt(s["cost_ratio"], ".3f"), _fmt(s["w_star"], ".3f"))
        con.print(p)

    c = Table(title=f"CAD balance (Appendix A.6, mu={res['microbatches']}"
                    + ("" if inp["uniform_layers"] else "; hybrid layers: indicative only") + ")",
              title_justify="left")
    for col in ("attn -> rest", "T_attn max ms", "T_rest min ms", "balanced?"):
        c.add_column(col, justify="right")
    for s in res["cad"]:
        c.add_row(f"{s['attn']} -> {s['rest']}", _fmt(s["t_attn_max_ms"]), _fmt(s["t_rest_min_ms"]),
                  "yes" if s["balanced_feasible"] else "no")
    con.print(c)

    t = Table(title="Over context length (CPT in $ per 1M tokens; '-' = colocation infeasible)",
              title_justify="left")
    t.add_column("ctx", justify="right")
    t.add_column("m_kv", justify="right")
    ids = [s["id"] for s in res["gpus"]]
    for gid in ids:
        t.add_column(f"{gid} b_bar", justify="right")
        t.add_column(f"{gid} G_hom", justify="right")
    t.add_column("best hom", justify="right")
    t.add_column("CPT hom", justify="right")
    if len(ids) > 1:
        t.add_column("het attn/gemm", justify="right")
        t.add_column("CPT het", justify="right")
        t.add_column("G_het", justify="right")
    for r in res["rows"]:
        cells = [_ctx(r["context"]), _bytes(r["m_kv_bytes"])]
        for gid in ids:
            v = r["gpus"][gid]
            cells += [_fmt(v["b_bar"], ".1f"), _fmt(v["g_hom"], ".3f")]
        cells += [r["best_hom"], _fmt(r["cpt_hom_best"], ".4f")]
        if len(ids) > 1:
            het = f"{r['het_attn']}/{r['het_gemm']}" + ("" if r["ods_feasible"] else " (!)")
            cells += [het, _fmt(r["cpt_het_best"], ".4f"), _fmt(r["g_het"], ".3f")]
        t.add_row(*cells)
    con.print(t)
    if any(not r["ods_feasible"] for r in res["rows"]):
        con.print("(!) the KV of one request or the weight shard does not fit that GPU at this TP degree")
    con.print(THEORY_TERMS, markup=False)


THEORY_TERMS = ("terms: b* = batch at which the GEMMs turn compute-bound; b_bar = largest batch that fits "
                "beside the weights; G_hom = colocated / homogeneous-disaggregated cost per token; eta = "
                "beta1*F2/(beta2*F1) of a pair; x* (at context s*) = KV bytes where the pair's gain peaks; "
                "CPT = cost per token; details: docs/theory.md")


def theory_cmd(
    model: str = typer.Option(..., "--model", "-m", help="Bundled model name or path to a Hugging Face config.json"),
    gpus: str = typer.Option("h100,l40s", "--gpus", help="Comma-separated GPU ids to compare"),
    ctx: str = typer.Option("1k..256k", "--ctx", help="Context lengths: LO..HI doubling, or a list (k = 1024)"),
    tp: int = typer.Option(None, "--tp", help="Tensor/expert-parallel degree sharding weights, P_act and KV "
                           "(default: the smallest of 1, 2, 4, 8 at which the weights and one request fit "
                           "every listed GPU)"),
    microbatches: int = typer.Option(2, "--microbatches", help="Micro-batches mu for the CAD balance test"),
    prices: str = typer.Option(None, "--prices", help="TOML/JSON object: GPU id -> USD per GPU-hour"),
    catalog: str = typer.Option(None, "--catalog", help="TOML/JSON file adding or overriding GPU types"),
    as_json: bool = typer.Option(False, "--json", help="Emit JSON (sorted keys) instead of tables"),
    plot: str = typer.Option(None, "--plot", help="Also write G_hom(s) and G_het(s) with bounds to FILE"),
) -> None:
    """Analytical cost model: when disaggregation pays off, and by how much at most."""
    import sys

    import orjson

    from opweave_planner import theory
    from opweave_planner.errors import UserError
    from opweave_planner.inputs.units import MAX_TOKENS

    contexts = theory.parse_contexts(ctx)
    if contexts[-1] > MAX_TOKENS:
        raise UserError(f"--ctx: {contexts[-1]} tokens exceeds {MAX_TOKENS} tokens")
    if tp is not None and not 1 <= tp <= MAX_TP:
        raise UserError(f"--tp: expected an integer in [1, {MAX_TP}], got {tp}")
    if not 1 <= microbatches <= MAX_MICROBATCHES:
        raise UserError(f"--microbatches: expected an integer in [1, {MAX_MICROBATCHES}], got {microbatches}")
    if tp is None:
        from opweave_planner.inputs.model import load_model

        spec = load_model(model)
        tp = default_tp(spec, gpus, contexts, catalog=catalog, prices=prices)
        model = spec
        print(f"--tp not given: using TP{tp} (the smallest of 1, 2, 4, 8 at which the weights and "
              f"one {contexts[0]:,}-token request fit every listed GPU)", file=sys.stderr)
    mi, params = theory.build_inputs(model, gpus, tp=tp, catalog=catalog, prices=prices)
    res = theory.analyze(mi, params, contexts, microbatches=microbatches)
    if plot:
        theory.plot_gains(mi, params, contexts[0], contexts[-1], plot)
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(res, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n")
        sys.stdout.flush()
    else:
        _render(res)
        if plot:
            typer.echo(f"wrote {plot}")
