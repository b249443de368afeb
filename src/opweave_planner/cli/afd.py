"""`opweave-plan afd`: attention/FFN ratio rules and the bundle simulator.

Every option is generated from the request models of `afd/request.py` (`cli/options.py`), so a
setting is declared once. Only typer, pydantic and the standard library load at import; numpy,
numba and the afd modules are imported inside the commands so that `opweave-plan --help` stays fast.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from opweave_planner.afd.request import AfdSetup, RatioRequest, SimulateRequest
from opweave_planner.cli.options import all_settings, build, flag, with_settings

# how the simulator's work checks name the counts: their flags
_COUNTS = {"batch": "batch", "k": "batches_in_flight", "requests": "requests", "r": "r", "trials": "trials"}

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help, as cli/main.py
    help="Attention-FFN disaggregation: provision the rA-1F ratio under stochastic workloads.",
)

JsonOut = Annotated[
    bool, typer.Option("--json", help="Print JSON (sorted keys) instead of tables.")
]


def time_unit(cal, coefs: dict) -> str:
    """The time unit of every latency, tau and throughput: us when calibrated from profiles,
    the paper's cycles for its default coefficients, else the unit of the given --alpha/--beta."""
    if cal is not None:
        return "us"
    return "cycles" if all(v is None for v in coefs.values()) else "t"


def _per(unit: str) -> str:
    """The unit as a denominator: tokens/cycle, not tokens/cycles."""
    return "cycle" if unit == "cycles" else unit


def _unit_note(console, unit: str) -> None:
    if unit == "t":
        console.print("times in t = the unit of the --alpha-*/--beta-* values given "
                      "(the paper's defaults are cycles)")


def _setup(req: AfdSetup, max_ratio: int):
    """(coefficients, workload, calibration or None) of a validated request."""
    from opweave_planner.afd.provisioning import PAPER_SECTION_52, LatencyCoefficients
    from opweave_planner.workload.sampling import LengthDist, ParametricWorkload, load_trace

    cal = None
    if req.model is not None:
        from opweave_planner.afd.calibrate import calibrate_from_profiles

        cal = calibrate_from_profiles(
            req.model, req.attn_gpu, req.ffn_gpu or req.attn_gpu, attn_tp=req.attn_tp, ffn_tp=req.ffn_tp,
            moe_ep=req.ep, context=req.context, batch=req.batch, max_ratio=max_ratio,
            profiles_dir=req.profiles, backend=req.backend)
        coef = cal.coefficients
    else:
        coef = LatencyCoefficients(**{k: (PAPER_SECTION_52[k] if v is None else v)
                                      for k, v in req.coefficients().items()})
    if req.trace is not None:
        workload = load_trace(Path(req.trace))
    else:
        workload = ParametricWorkload(LengthDist(req.prompt_dist, req.prompt_mean),
                                      LengthDist(req.decode_dist, req.decode_mean))
    return coef, workload, cal


def _console(req: AfdSetup, cal):
    """The console, with the calibration and unit lines every table starts with; and the unit."""
    from opweave_planner.report import console as wide_console

    console = wide_console()
    unit = time_unit(cal, req.coefficients())
    if cal is not None:
        _print_calibration(console, cal)
    _unit_note(console, unit)
    return console, unit


def _print_calibration(console, cal) -> None:
    from rich.table import Table

    st = cal.setup
    side = "-ep" if st["moe_ep"] else ""
    console.print(
        f"calibrated from profiles: {st['model']}, attention {st['attn_gpu']} tp{st['attn_tp']}, "
        f"FFN {st['ffn_gpu']} tp{st['ffn_tp']}{side}, contexts {st['attention_contexts'][0]}"
        f"..{st['attention_contexts'][-1]}, B = {st['batch']}; unit: {st['unit']}"
    )
    table = Table("component", "alpha", "alpha unit", "beta (us)", "samples", "RMSE (us)",
                  "max rel err", "R^2")
    per = {"attention": "us/token", "ffn": "us/request", "communication": "us/request"}
    for name in ("attention", "ffn", "communication"):
        fit = getattr(cal, name)
        table.add_row(
            name,
            f"{fit.slope:.5g}",
            per[name],
            f"{fit.intercept:.5g}",
            str(fit.samples),
            f"{fit.rmse:.4g}",
            f"{100 * fit.max_rel_error:.2f}%",
            f"{fit.r2:.5f}",
        )
    console.print(table)


def _emit_json(obj) -> None:
    import orjson

    sys.stdout.write(
        orjson.dumps(
            obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
        ).decode()
        + "\n"
    )


def _header(console, coef, workload, batch, unit: str = "cycles") -> None:
    w = workload.describe()
    console.print(
        f"workload: theta = {w['theta']:.4g}, nu^2 = {w['nu2']:.6g} "
        f"(mean prompt {w['mean_prompt']:.4g}, mean decode {w['mean_decode']:.4g}); B = {batch}"
    )
    per = {"alpha_a": f"{unit}/token", "alpha_f": f"{unit}/request", "alpha_c": f"{unit}/request"}
    console.print("coefficients: " + ", ".join(f"{k} = {v:g} {per.get(k, unit)}"
                                               for k, v in coef.as_dict().items()))


def _ratio_report(coef, workload, batch, ratios) -> dict:
    from opweave_planner.afd import provisioning as pv

    mu_a, sigma_a = pv.attention_moments(coef, batch, workload.theta, workload.nu)
    mf = pv.optimal_ratio_mf(coef, batch, workload.theta)
    gauss = pv.optimal_ratio_gaussian(coef, batch, workload.theta, workload.nu)
    table = pv.ratio_table(coef, batch, workload.theta, workload.nu, ratios)
    rows = [{k: float(v[i]) for k, v in table.items()} for i in range(len(ratios))]
    return {
        "batch": batch,
        "coefficients": coef.as_dict(),
        "workload": workload.describe(),
        "mu_a": mu_a,
        "sigma_a": sigma_a,
        "mean_field": {
            "r": mf.r,
            "regime": mf.regime,
            "balance": mf.balance,
            "tau": mf.tau,
            "throughput": mf.throughput,
            "candidates": mf.candidates,
        },
        "gaussian": {
            "r": gauss.r,
            "regime": gauss.regime,
            "tau": gauss.tau,
            "throughput": gauss.throughput,
        },
        "table": rows,
    }


@app.command()
@with_settings(all_settings(model=RatioRequest), model=RatioRequest, first=True)
def ratio(json: JsonOut = False, settings: dict | None = None) -> None:
    """Optimal attention/FFN ratio: r*_mf with its regime, r*_G, and a table over r."""
    req = build(RatioRequest, settings)
    ratios = list(req.r)
    coef, workload, cal = _setup(req, max_ratio=max(1, math.ceil(max(ratios))))
    report = _ratio_report(coef, workload, req.batch, ratios)
    if cal is not None:
        report["calibration"] = cal.as_dict()
    if json:
        _emit_json(report)
        return
    console, unit = _console(req, cal)
    _header(console, coef, workload, req.batch, unit)
    _render_ratio(console, report, unit)


def _render_ratio(console, report: dict, unit: str) -> None:

    mf, g = report["mean_field"], report["gaussian"]
    console.print(f"mu_A = {report['mu_a']:.6g} {unit}, sigma_A = {report['sigma_a']:.6g} {unit}")
    console.print(
        f"r*_mf = {mf['r']:.4g} ({mf['regime']} regime, {mf['balance']}), "
        f"throughput/instance {mf['throughput']:.4g} tokens/{_per(unit)}"
    )
    console.print(
        f"r*_G  = {g['r']:.4g} (barrier-aware), throughput/instance {g['throughput']:.4g} "
        f"tokens/{_per(unit)}"
    )
    _print_table(console, report["table"], [
        ("r (A per F)", lambda row: f"{row['r']:g}"),
        ("kappa_r", lambda row: f"{row['kappa']:.4f}"),
        ("sync overhead", lambda row: f"{100 * row['barrier_overhead']:.2f}%"),
        (f"tau_mf ({unit})", lambda row: f"{row['tau_mf']:.5g}"),
        (f"tau_G ({unit})", lambda row: f"{row['tau_g']:.5g}"),
        (f"thr_mf (tokens/{_per(unit)}/inst)", lambda row: f"{row['throughput_mf']:.4f}"),
        (f"thr_G (tokens/{_per(unit)}/inst)", lambda row: f"{row['throughput_g']:.4f}"),
    ])
    console.print(RATIO_TERMS, markup=False)


RATIO_TERMS = ("terms: r = attention instances per FFN instance; mu_A, sigma_A = mean and spread of the "
               "attention step; kappa_r = expected maximum of r standard normals (the barrier's excess); "
               "tau_mf / tau_G = step time, mean-field / barrier-aware (Gaussian); thr = tokens per instance; "
               "details: docs/afd.md")


def _print_table(console, rows: list[dict], columns: list[tuple[str, Callable[[dict], str]]]) -> None:
    """A rich table with a row per report row: each column a header and how it shows a row."""
    from rich.table import Table

    table = Table(*(header for header, _ in columns))
    for row in rows:
        table.add_row(*(show(row) for _, show in columns))
    console.print(table)


@app.command()
@with_settings(all_settings(model=SimulateRequest), model=SimulateRequest, first=True)
def simulate(json: JsonOut = False, settings: dict | None = None) -> None:
    """Simulate the rA-1F bundle for each r (with --mc: the barrier Monte Carlo instead)."""
    req = build(SimulateRequest, settings)
    from opweave_planner.afd import simulator as sim

    ratios = list(req.r)
    names = {key: flag(SimulateRequest, name) for key, name in _COUNTS.items()}
    if req.mc:
        sim.check_mc_work(ratios, req.batch, req.trials, names)
    coef, workload, cal = _setup(req, max_ratio=max(ratios))
    if not req.mc:
        sim.check_bundle_work(ratios, req.batch, req.batches_in_flight, req.requests, workload.mean_decode, names)
    report = _mc_report(req, workload, ratios) if req.mc else _bundle_report(req, coef, workload, ratios)
    if cal is not None:
        report["calibration"] = cal.as_dict()
    if json:
        _emit_json(report)
        return
    console, unit = _console(req, cal)
    w = workload.describe()
    console.print(
        f"workload: theta = {w['theta']:.4g}, nu^2 = {w['nu2']:.6g}; B = {req.batch}; seed = {req.seed}"
    )
    (_render_mc if req.mc else _render_bundle)(console, report, unit)


def _mc_report(req: SimulateRequest, workload, ratios: list[int]) -> dict:
    """The barrier Monte Carlo against the CLT overhead, per r."""
    from opweave_planner.afd import provisioning as pv
    from opweave_planner.afd import simulator as sim

    got = sim.barrier_overhead_mc(workload, req.batch, ratios, trials=req.trials, seed=req.seed)
    clt = pv.barrier_overhead(req.batch, workload.theta, workload.nu, ratios)
    return {
        "batch": req.batch,
        "workload": workload.describe(),
        "seed": req.seed,
        "trials": req.trials,
        "rows": [{"r": k, "mc": float(a), "clt": float(b)} for k, a, b in zip(ratios, got, clt)],
    }


def _bundle_report(req: SimulateRequest, coef, workload, ratios: list[int]) -> dict:
    """One bundle simulation per r, the best simulated r and both ratio rules."""
    from opweave_planner.afd import provisioning as pv
    from opweave_planner.afd import simulator as sim

    rows = [sim.simulate_bundle(coef, workload, k, req.batch, req.requests, seed=req.seed,
                                batches_in_flight=req.batches_in_flight, start=req.start).as_dict()
            for k in ratios]
    best = max(rows, key=lambda row: row["throughput_per_instance"])
    return {
        "batch": req.batch,
        "coefficients": coef.as_dict(),
        "workload": workload.describe(),
        "seed": req.seed,
        "requests_per_instance": req.requests,
        "batches_in_flight": req.batches_in_flight,
        "start": req.start,
        "results": rows,
        "best_r": best["r"],
        "r_mf": pv.optimal_ratio_mf(coef, req.batch, workload.theta).r,
        "r_g": pv.optimal_ratio_gaussian(coef, req.batch, workload.theta, workload.nu).r,
    }


def _render_mc(console, report: dict, unit: str) -> None:
    _print_table(console, report["rows"], [
        ("r (A per F)", lambda row: str(row["r"])),
        ("MC overhead", lambda row: f"{100 * row['mc']:.2f}%"),
        ("CLT overhead", lambda row: f"{100 * row['clt']:.2f}%"),
        ("difference (pp)", lambda row: f"{100 * (row['mc'] - row['clt']):+.2f}"),
    ])


def _render_bundle(console, report: dict, unit: str) -> None:
    _print_table(console, report["results"], [
        ("r (A per F)", lambda row: str(row["r"])),
        (f"throughput (tokens/{_per(unit)}/inst)", lambda row: f"{row['throughput_per_instance']:.4f}"),
        (f"TPOT ({unit}/token)", lambda row: f"{row['tpot']:.5g}"),
        ("idle A", lambda row: f"{100 * row['idle_attention']:.1f}%"),
        ("idle F", lambda row: f"{100 * row['idle_ffn']:.1f}%"),
        ("barrier", lambda row: f"{100 * row['barrier_overhead']:.2f}%"),
        (f"T_80 ({unit})", lambda row: f"{row['t_stable']:.6g}"),
    ])
    console.print(
        f"best simulated r = {report['best_r']}; r*_mf = {report['r_mf']:.4g}; "
        f"r*_G = {report['r_g']:.4g}"
    )
