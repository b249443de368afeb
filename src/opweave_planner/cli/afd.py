"""`opweave-plan afd`: attention/FFN ratio rules and the bundle simulator.

Only typer and the standard library are imported here; numpy, numba and the afd modules
are imported inside the commands so that `opweave-plan --help` stays fast.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated, get_args

import typer

MAX_RATIO = 4096  # = afd.simulator.MAX_RATIO (kept here so --help needs no numpy)
MAX_BATCH = 1 << 16  # = afd.simulator.MAX_BATCH
_FLAGS = {"batch": "--batch", "k": "--batches-in-flight", "requests": "--requests", "r": "--r",
          "trials": "--trials"}
_COEF_KEYS = ("alpha_a", "beta_a", "alpha_f", "beta_f", "alpha_c", "beta_c")
_CAL_KEYS = ("model", "attn_gpu", "ffn_gpu", "attn_tp", "ffn_tp", "ep", "ctx", "profiles", "backend")


def _pick(args: dict, keys: tuple[str, ...]) -> dict:
    """The subset of a command's arguments one setup step needs (both commands share them)."""
    return {k: args[k] for k in keys}


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Attention-FFN disaggregation: provision the rA-1F ratio under stochastic workloads.",
)

_COEF_HELP = "(default: the paper's Section 5.2 value)"
Batch = Annotated[int, typer.Option("--batch", "-B", help="Requests per attention microbatch B.")]
AlphaA = Annotated[float | None, typer.Option(help=f"Attention time per token {_COEF_HELP}.")]
BetaA = Annotated[float | None, typer.Option(help=f"Attention fixed time {_COEF_HELP}.")]
AlphaF = Annotated[float | None, typer.Option(help=f"FFN time per request {_COEF_HELP}.")]
BetaF = Annotated[float | None, typer.Option(help=f"FFN fixed time {_COEF_HELP}.")]
AlphaC = Annotated[
    float | None, typer.Option(help=f"A<->F transfer time per request {_COEF_HELP}.")
]
BetaC = Annotated[float | None, typer.Option(help=f"A<->F transfer fixed time {_COEF_HELP}.")]
PromptMean = Annotated[float, typer.Option(help="Mean prompt length (parametric workload).")]
PromptDist = Annotated[
    str, typer.Option(help="Prompt length law: geometric (on 1,2,...) or fixed.")
]
DecodeMean = Annotated[
    float, typer.Option(help="Mean decode lifetime in steps (parametric workload).")
]
DecodeDist = Annotated[
    str, typer.Option(help="Decode lifetime law: geometric (on 1,2,...) or fixed.")
]
Trace = Annotated[
    Path | None,
    typer.Option(
        "--trace",
        help="Request trace (Azure, BurstGPT, Vidur or prompt_tokens,output_tokens CSV, Mooncake JSONL, "
             "or a prompt,decode CSV); replaces the parametric workload.",
    ),
]
_CAL = "Calibrate the coefficients from profiles"
Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help=f"{_CAL} for this model (instead of --alpha-*/--beta-*).",
    ),
]
AttnGpu = Annotated[str | None, typer.Option("--attn-gpu", help="GPU of attention instances.")]
FfnGpu = Annotated[
    str | None, typer.Option("--ffn-gpu", help="GPU of the FFN instance (default: --attn-gpu).")
]
AttnTp = Annotated[int | None, typer.Option("--attn-tp", help="TP degree per attention instance.")]
FfnTp = Annotated[int | None, typer.Option("--ffn-tp", help="TP degree of the FFN instance.")]
Ep = Annotated[bool, typer.Option("--ep", help="MoE experts split across the FFN's TP group.")]
Ctx = Annotated[
    str | None, typer.Option("--ctx", help="Largest per-request context sampled (default 32k).")
]
ProfilesDir = Annotated[
    str | None, typer.Option("--profiles", help="Profile folder (default: shipped).")
]
Backend = Annotated[str | None, typer.Option("--backend", help="Profile backend (vllm).")]
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


def _parse_ratios(text: str, integers: bool) -> list:
    from opweave_planner.errors import UserError

    kind = "positive integers" if integers else "positive numbers"
    values = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = int(part) if integers else float(part)
        except ValueError:
            raise UserError(f"--r: expected comma-separated {kind}, got {part!r}") from None
        if not 0 < value < float("inf"):
            raise UserError(f"--r: expected comma-separated {kind}, got {part!r}")
        if value > MAX_RATIO:
            raise UserError(f"--r: {part} attention instances per FFN is above the {MAX_RATIO} a "
                            f"bundle can have")
        values.append(value)
    if not values:
        raise UserError(f"--r: expected comma-separated {kind}")
    return values


def _calibrate(calib: dict, coefs: dict, batch: int, max_ratio: int):
    """Profile calibration from the --model options, or None when --model is absent."""
    from opweave_planner.errors import UserError

    flags = {
        "--attn-gpu": calib["attn_gpu"],
        "--ffn-gpu": calib["ffn_gpu"],
        "--attn-tp": calib["attn_tp"],
        "--ffn-tp": calib["ffn_tp"],
        "--ep": calib["ep"] or None,
        "--ctx": calib["ctx"],
        "--profiles": calib["profiles"],
        "--backend": calib["backend"],
    }
    given = [k for k, v in flags.items() if v is not None]
    if calib["model"] is None:
        if given:
            raise UserError(f"{', '.join(given)}: only apply with --model (profile calibration)")
        return None
    explicit = ["--" + k.replace("_", "-") for k, v in coefs.items() if v is not None]
    if explicit:
        raise UserError(
            f"--model and {', '.join(explicit)}: give the coefficients directly or calibrate "
            "them from profiles, not both"
        )
    if calib["attn_gpu"] is None:
        raise UserError("--model: also give --attn-gpu (and --ffn-gpu if it differs)")
    from opweave_planner.afd.calibrate import calibrate_from_profiles
    from opweave_planner.api import parse_tokens

    return calibrate_from_profiles(
        calib["model"],
        calib["attn_gpu"],
        calib["ffn_gpu"] or calib["attn_gpu"],
        attn_tp=calib["attn_tp"] or 1,
        ffn_tp=calib["ffn_tp"] or 1,
        moe_ep=calib["ep"],
        context=parse_tokens(calib["ctx"] or "32k", "--ctx"),
        batch=batch,
        max_ratio=max_ratio,
        profiles_dir=calib["profiles"],
        backend=calib["backend"] or "vllm",
    )


def _setup(
    batch,
    coefs: dict,
    prompt_mean,
    prompt_dist,
    decode_mean,
    decode_dist,
    trace,
    calib: dict | None = None,
    max_ratio: int = 32,
):
    """Validate shared options and build (coefficients, workload, calibration or None)."""
    from opweave_planner.afd.provisioning import PAPER_SECTION_52, LatencyCoefficients
    from opweave_planner.afd.workload import DistKind, LengthDist, ParametricWorkload, load_trace
    from opweave_planner.errors import UserError

    if not 1 <= batch <= MAX_BATCH:
        raise UserError(f"--batch: expected an integer in [1, {MAX_BATCH}], got {batch}")
    cal = _calibrate(calib, coefs, batch, max_ratio) if calib is not None else None
    if cal is not None:
        coef = cal.coefficients
    else:
        values = {k: (PAPER_SECTION_52[k] if v is None else v) for k, v in coefs.items()}
        coef = LatencyCoefficients(**values)
    if trace is not None:
        workload = load_trace(trace)
    else:
        laws = []
        for flag, kind, mean in (("--prompt-mean", prompt_dist, prompt_mean),
                                 ("--decode-mean", decode_dist, decode_mean)):
            if kind not in get_args(DistKind):  # name the law's own flag, not the mean's
                raise UserError(f"{flag.replace('-mean', '-dist')}: expected {' or '.join(get_args(DistKind))}, "
                                f"got {kind!r}")
            try:
                laws.append(LengthDist(kind, mean))
            except UserError as exc:
                raise UserError(f"{flag}: {exc}") from None
        workload = ParametricWorkload(*laws)
    return coef, workload, cal


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
def ratio(
    r: Annotated[
        str, typer.Option("--r", help="Ratios for the table, comma-separated.")
    ] = "1,2,4,8,16,24,32",
    batch: Batch = 256,
    alpha_a: AlphaA = None,
    beta_a: BetaA = None,
    alpha_f: AlphaF = None,
    beta_f: BetaF = None,
    alpha_c: AlphaC = None,
    beta_c: BetaC = None,
    prompt_mean: PromptMean = 100.0,
    prompt_dist: PromptDist = "geometric",
    decode_mean: DecodeMean = 500.0,
    decode_dist: DecodeDist = "geometric",
    trace: Trace = None,
    model: Model = None,
    attn_gpu: AttnGpu = None,
    ffn_gpu: FfnGpu = None,
    attn_tp: AttnTp = None,
    ffn_tp: FfnTp = None,
    ep: Ep = False,
    ctx: Ctx = None,
    profiles: ProfilesDir = None,
    backend: Backend = None,
    json: JsonOut = False,
) -> None:
    """Optimal attention/FFN ratio: r*_mf with its regime, r*_G, and a table over r."""
    args = dict(locals())
    ratios = _parse_ratios(r, integers=False)
    coef, workload, cal = _setup(
        batch,
        _pick(args, _COEF_KEYS),
        prompt_mean,
        prompt_dist,
        decode_mean,
        decode_dist,
        trace,
        _pick(args, _CAL_KEYS),
        max_ratio=max(1, math.ceil(max(ratios))),
    )
    report = _ratio_report(coef, workload, batch, ratios)
    if cal is not None:
        report["calibration"] = cal.as_dict()
    if json:
        _emit_json(report)
        return
    from rich.table import Table

    from opweave_planner.report import console as _console

    console = _console()
    unit = time_unit(cal, _pick(args, _COEF_KEYS))
    if cal is not None:
        _print_calibration(console, cal)
    _unit_note(console, unit)
    _header(console, coef, workload, batch, unit)
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
    table = Table(
        "r (A per F)",
        "kappa_r",
        "sync overhead",
        f"tau_mf ({unit})",
        f"tau_G ({unit})",
        f"thr_mf (tokens/{_per(unit)}/inst)",
        f"thr_G (tokens/{_per(unit)}/inst)",
    )
    for row in report["table"]:
        table.add_row(
            f"{row['r']:g}",
            f"{row['kappa']:.4f}",
            f"{100 * row['barrier_overhead']:.2f}%",
            f"{row['tau_mf']:.5g}",
            f"{row['tau_g']:.5g}",
            f"{row['throughput_mf']:.4f}",
            f"{row['throughput_g']:.4f}",
        )
    console.print(table)


@app.command()
def simulate(
    r: Annotated[
        str, typer.Option("--r", help="Attention instances per FFN, comma-separated integers.")
    ] = ("1,2,4,8,16,24,32"),
    batch: Batch = 256,
    alpha_a: AlphaA = None,
    beta_a: BetaA = None,
    alpha_f: AlphaF = None,
    beta_f: BetaF = None,
    alpha_c: AlphaC = None,
    beta_c: BetaC = None,
    prompt_mean: PromptMean = 100.0,
    prompt_dist: PromptDist = "geometric",
    decode_mean: DecodeMean = 500.0,
    decode_dist: DecodeDist = "geometric",
    trace: Trace = None,
    model: Model = None,
    attn_gpu: AttnGpu = None,
    ffn_gpu: FfnGpu = None,
    attn_tp: AttnTp = None,
    ffn_tp: FfnTp = None,
    ep: Ep = False,
    ctx: Ctx = None,
    profiles: ProfilesDir = None,
    backend: Backend = None,
    requests: Annotated[
        int, typer.Option(help="Completed requests per attention instance.")
    ] = 10_000,
    seed: Annotated[
        int, typer.Option(help="Random seed; the same seed gives the same output.")
    ] = 0,
    batches_in_flight: Annotated[
        int, typer.Option(help="Batches cycling through A and F (paper: 2).")
    ] = 2,
    start: Annotated[
        str, typer.Option(help="Initial slots: stationary or cold (all fresh).")
    ] = "stationary",
    mc: Annotated[
        bool, typer.Option("--mc", help="Monte Carlo barrier overhead (Table 1) instead.")
    ] = False,
    trials: Annotated[int, typer.Option(help="Monte Carlo trials per r (with --mc).")] = 50_000,
    json: JsonOut = False,
) -> None:
    """Simulate the rA-1F bundle for each r (with --mc: the barrier Monte Carlo instead)."""
    args = dict(locals())
    from opweave_planner.errors import UserError

    ratios = _parse_ratios(r, integers=True)
    from opweave_planner.afd import simulator as sim

    sim.check_seed(seed, "--seed")
    if mc:
        sim.check_mc_work(ratios, batch, trials, _FLAGS)
    elif not 1 <= batches_in_flight <= sim.MAX_BATCHES_IN_FLIGHT:
        raise UserError(f"--batches-in-flight: expected an integer in [1, {sim.MAX_BATCHES_IN_FLIGHT}], "
                        f"got {batches_in_flight}")
    coef, workload, cal = _setup(
        batch,
        _pick(args, _COEF_KEYS),
        prompt_mean,
        prompt_dist,
        decode_mean,
        decode_dist,
        trace,
        _pick(args, _CAL_KEYS),
        max_ratio=max(ratios),
    )
    from opweave_planner.afd import provisioning as pv

    if not mc:
        sim.check_bundle_work(ratios, batch, batches_in_flight, requests, workload.mean_decode, _FLAGS)
    if mc:
        got = sim.barrier_overhead_mc(workload, batch, ratios, trials=trials, seed=seed)
        clt = pv.barrier_overhead(batch, workload.theta, workload.nu, ratios)
        report = {
            "batch": batch,
            "workload": workload.describe(),
            "seed": seed,
            "trials": trials,
            "rows": [
                {"r": k, "mc": float(a), "clt": float(b)} for k, a, b in zip(ratios, got, clt)
            ],
        }
    else:
        rows = []
        for k in ratios:
            res = sim.simulate_bundle(
                coef,
                workload,
                k,
                batch,
                requests,
                seed=seed,
                batches_in_flight=batches_in_flight,
                start=start,
            )
            rows.append(res.as_dict())
        best = max(rows, key=lambda row: row["throughput_per_instance"])
        report = {
            "batch": batch,
            "coefficients": coef.as_dict(),
            "workload": workload.describe(),
            "seed": seed,
            "requests_per_instance": requests,
            "batches_in_flight": batches_in_flight,
            "start": start,
            "results": rows,
            "best_r": best["r"],
            "r_mf": pv.optimal_ratio_mf(coef, batch, workload.theta).r,
            "r_g": pv.optimal_ratio_gaussian(coef, batch, workload.theta, workload.nu).r,
        }
    if cal is not None:
        report["calibration"] = cal.as_dict()
    if json:
        _emit_json(report)
        return
    from rich.table import Table

    from opweave_planner.report import console as _console

    console = _console()
    unit = time_unit(cal, _pick(args, _COEF_KEYS))
    if cal is not None:
        _print_calibration(console, cal)
    _unit_note(console, unit)
    w = workload.describe()
    console.print(
        f"workload: theta = {w['theta']:.4g}, nu^2 = {w['nu2']:.6g}; B = {batch}; seed = {seed}"
    )
    if mc:
        table = Table("r (A per F)", "MC overhead", "CLT overhead", "difference (pp)")
        for row in report["rows"]:
            table.add_row(
                str(row["r"]),
                f"{100 * row['mc']:.2f}%",
                f"{100 * row['clt']:.2f}%",
                f"{100 * (row['mc'] - row['clt']):+.2f}",
            )
        console.print(table)
        return
    table = Table(
        "r (A per F)",
        f"throughput (tokens/{_per(unit)}/inst)",
        f"TPOT ({unit}/token)",
        "idle A",
        "idle F",
        "barrier",
        f"T_80 ({unit})",
    )
    for row in report["results"]:
        table.add_row(
            str(row["r"]),
            f"{row['throughput_per_instance']:.4f}",
            f"{row['tpot']:.5g}",
            f"{100 * row['idle_attention']:.1f}%",
            f"{100 * row['idle_ffn']:.1f}%",
            f"{100 * row['barrier_overhead']:.2f}%",
            f"{row['t_stable']:.6g}",
        )
    console.print(table)
    console.print(
        f"best simulated r = {report['best_r']}; r*_mf = {report['r_mf']:.4g}; "
        f"r*_G = {report['r_g']:.4g}"
    )
