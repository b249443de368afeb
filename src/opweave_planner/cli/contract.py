"""`opweave-plan schema | simulate | diff | regen`: plan files as a contract, and CI regeneration.

Command functions only; `cli/main.py` registers them. Module import pulls in typer and the
standard library only (the library modules load inside the command bodies).
"""

from __future__ import annotations

import sys

import typer

from opweave_planner.cli.options import with_settings


def _emit(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


def schema_cmd(
    out: str = typer.Option(None, "--out", "-o", help="Write the schema here (atomically) instead of stdout"),
) -> None:
    """Print the JSON Schema of plan files (generated from the plan model)."""
    from opweave_planner.contract import schema_bytes
    from opweave_planner.plan import write_atomic

    data = schema_bytes()
    if out:
        write_atomic(out, data)
    else:
        _emit(data)


SIMULATE_OVERRIDES = ("prices", "catalog", "profiles", "network_bandwidth", "network_latency", "model", "ctx",
                      "prompt_len", "output_len",
                      "workload", "scale_ctx", "max_model_len", "overflow", "slo_percentile", "kv_quantile",
                      "preemptions_per_request",
                      "scenarios", "seed",
                      # the deployment: the target load, and the whole deployment's TTFT and arrivals
                      "target_tokens_per_s", "target_concurrency", "ttft", "ttft_percentile", "request_rate",
                      "arrivals", "rate_scale")


@with_settings(SIMULATE_OVERRIDES)
def simulate_cmd(
    plan: str = typer.Argument(..., help="Plan file (JSON) written by opweave-plan"),
    out: str = typer.Option(None, "--out", "-o", help="Also write the re-simulated plan file here"),
    as_json: bool = typer.Option(False, "--json", help="Emit JSON (the plan's own key names)"),
    settings: dict | None = None,  # (overrides of the plan's recorded request)
) -> None:
    """Re-evaluate a plan under new prices, network, profiles or traffic without searching (each
    setting defaults to what the plan recorded; --prices overrides only the GPUs it names;
    --workload or --ctx checks the same placement against other request lengths). A plan's
    deployment is re-sized: decode copies for the target load and, with --ttft, the prefill pool
    chosen again for the TTFT under the new prices, rates or arrivals (docs/deployment.md);
    --out keeps the deployment and the alternatives.

    Exit 0 when it still meets its SLO and fits memory, 1 when it does not, 2 on bad input.
    """
    from opweave_planner.atomic import shown_path
    from opweave_planner.contract import evaluate_plan, read_feasible_plan
    from opweave_planner.plan import dumps, plan_bytes, write_atomic

    doc = read_feasible_plan(plan)
    ev = evaluate_plan(doc, where=shown_path(plan), **settings)  # the path may hold control characters
    if out:
        write_atomic(out, plan_bytes(ev.plan))
    info = ev.to_dict()
    if as_json:
        _emit(dumps(info))
    else:
        old, new = info["previous"], info
        w = info["workload"]

        from opweave_planner.contract import pct
        from opweave_planner.report import workload_words

        print(f"{info['model']} {workload_words(w)}, SLO {w['tpot_slo_ms']:g} ms, policy {info['policy']}, "
              f"{info['gpus_total']} GPUs")
        print(f"  cost: {old['usd_per_million_tokens']:.6g} -> {new['usd_per_million_tokens']:.6g} USD per million "
              f"tokens{pct(old['usd_per_million_tokens'], new['usd_per_million_tokens'])}")
        def basis(d: dict) -> str:  # what tpot_ms is: a percentile of step TPOT, or the steady state
            return f"p{d['tpot']['percentile']:g}" if d.get("tpot") else "steady state"

        a, b = old["tpot_ms"], new["tpot_ms"]
        if basis(old) == basis(new):
            label = "TPOT" if not new.get("tpot") else f"{basis(new)} TPOT"
            print(f"  {label}: {a:.6g} -> {b:.6g} ms{pct(a, b)}")
        else:
            print(f"  TPOT: {a:.6g} ms ({basis(old)}) -> {b:.6g} ms ({basis(new)}){pct(a, b)}")
        print(f"  meets SLO: {'yes' if info['meets_slo'] else 'NO'}; fits memory: "
              f"{'yes' if info['fits_memory'] else 'NO'}")
        for o in info["owners"]:
            print(f"  owner {o['index']}: {o['replicas']}x {o['gpu']} TP{o['tensor_parallel']}, "
                  f"{o['usd_per_hour_per_replica']:.4g} USD/h per replica, memory "
                  f"{o['memory_bytes_per_gpu'] / 2**30:.2f} of {o['usable_memory_bytes_per_gpu'] / 2**30:.2f} GiB per GPU")
            e = o.get("kv_events")
            if e:
                print(f"    KV overflow: {e['per_request_at_reserve']:.2g} per request at the reserve "
                      f"({e['per_replica_hour_at_reserve']:.2g} per replica-hour, {e['share_above_reserve']:.3%} of "
                      f"steps above), {e['per_request_at_usable']:.2g} at the usable memory "
                      f"({e['per_replica_hour_at_usable']:.2g} forced preemptions per replica-hour)")
        changed = ", ".join(info["inputs_changed"])
        if not changed and (old["usd_per_million_tokens"], old["tpot_ms"]) != (new["usd_per_million_tokens"],
                                                                               new["tpot_ms"]):
            changed = ("none recorded; the figures differ, so the file was written by another latency model "
                       "than this opweave-planner's (or edited)")
        print(f"  inputs changed: {changed or 'none'}")
        _deployment_words(ev.previous, ev.plan)
        from opweave_planner.cli.run_plan import unmeasured
        from opweave_planner.report import data_quality_warning

        gpus = [o["gpu"] for o in info["owners"]]
        warn = data_quality_warning(gpus, unmeasured(settings.get("profiles"), gpus))
        if warn:
            print(warn, file=sys.stderr)
    if not (ev.meets_slo and ev.fits_memory):
        raise typer.Exit(1)


def _deployment_words(old, new) -> None:
    """The re-sized deployment's summary lines, then what it deploys old -> new
    (`contract.deployment_record`): the all-in USD/M of a whole deployment and its TTFT, an
    aggregated one's TPOT (the plans' own cost and TPOT lines cover the decode plan alone)."""
    if new.deployment is None:
        if old.deployment is not None:
            print("  deployment: not re-sized (the new request names no target load or TTFT)")
        return
    from opweave_planner.contract import deployment_record, deployment_words, pct, ttft_words
    from opweave_planner.sizing import deployment_lines

    for line in deployment_lines(new.deployment):
        print(f"  {line}")
    ro, rn = deployment_record(old), deployment_record(new)
    if ro["mode"] != rn["mode"]:
        print(f"  deployment: {deployment_words(ro)} -> {deployment_words(rn)}")
    if ro["mode"] != rn["mode"] or rn["mode"] == "decode only":
        return
    a, b = ro["usd_per_million_output_tokens"], rn["usd_per_million_output_tokens"]
    parts = [f"all-in ({rn['mode']}): {a:.6g} -> {b:.6g} USD per million output tokens{pct(a, b)}", ttft_words(ro, rn)]
    if rn["mode"] == "aggregated":
        parts.append(f"p{rn['tpot_percentile']:g} TPOT: {ro['tpot_ms']:.6g} -> {rn['tpot_ms']:.6g} ms"
                     f"{pct(ro['tpot_ms'], rn['tpot_ms'])}")
    print("  " + "; ".join(parts))


def diff_cmd(
    old: str = typer.Argument(..., help="Old plan file"),
    new: str = typer.Argument(..., help="New plan file"),
    as_json: bool = typer.Option(False, "--json", help="Emit JSON"),
) -> None:
    """Explain what changed between two plan files (placement, GPUs, batch, cost, TPOT).

    Exit 0 when equivalent, 1 when the plan changed, 2 on bad input.
    """
    from opweave_planner.contract import diff_plans, read_plan
    from opweave_planner.plan import dumps

    result = diff_plans(read_plan(old), read_plan(new))
    if as_json:
        _emit(dumps(result))
    else:
        if result["equivalent"]:
            print("equivalent: same placement, GPUs, batch, cost and TPOT")
        for c in result["changes"]:
            print(c["summary"])
        if result["inputs_changed"]:
            print(f"inputs changed: {', '.join(result['inputs_changed'])}")
        for note in result["notes"]:
            print(f"note: {note}")
    if not result["equivalent"]:
        raise typer.Exit(1)


def regen_cmd(
    matrix: str = typer.Option(..., "--matrix", help="Matrix TOML: models x contexts x SLOs x GPU sets x policies"),
    out: str = typer.Option(..., "--out", "-o", help="Folder of plan files to update"),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Local worker processes (same bytes as 1)"),
    ray: str = typer.Option(None, "--ray", help="Run on a Ray cluster: ADDRESS, 'auto' or 'local' "
                                                "(needs the [ray] extra; same bytes as local)"),
    retries: int = typer.Option(1, "--retries", help="Retries of a failed or lost entry"),
    prune: bool = typer.Option(False, "--prune", help="Delete plan files in --out that the matrix no longer lists"),
    hysteresis: str = typer.Option("0%", "--hysteresis",
                                   help="Keep an entry's existing placement, re-evaluated under the new inputs, "
                                        "while it meets its SLO, fits memory and costs at most this much more "
                                        "than the new optimum (e.g. 5%; 0%: always the optimum)"),
    deployable: str = typer.Option(None, "--deployable",
                                   help="Only plans this export target runs (vllm, sglang, dynamo, llm-d, "
                                        "vllm-afd), for every entry naming no deployable of its own: the "
                                        "search runs under the target's limits (docs/regen.md)"),
    fail_on: str = typer.Option(None, "--fail-on",
                                help="Exit 3 when an entry is infeasible (--fail-on infeasible); an "
                                     "undeployable entry always exits 3"),
    as_json: bool = typer.Option(False, "--json", help="Emit the summary as JSON"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No per-entry lines on stderr"),
) -> None:
    """Plan every matrix entry; rewrite only files that changed (atomically). The summary lists
    topology changes (placement, GPUs, batch) apart from cost-only and provenance-only changes,
    and every infeasible entry with its binding constraint.

    Exit 1 when any plan file changed, 0 when none, 2 on bad input or a failed entry, 3 when an
    entry is undeployable or (--fail-on infeasible) infeasible.
    """
    from opweave_planner.errors import UserError
    from opweave_planner.plan import dumps
    from opweave_planner.regen import regen

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = regen(matrix, out, jobs=jobs, ray=ray, retries=retries, prune=prune, log=None if quiet else log,
                   hysteresis=hysteresis, deployable=deployable, fail_on=fail_on)
    if as_json:
        _emit(dumps(report.to_dict()))
    else:
        print("\n".join(report.lines()))
    failed = [f for f in report.files if f.status == "failed"]
    if failed:
        raise UserError(f"{len(failed)} of {report.entries} entries failed (the others were written): "
                        + "; ".join(f"{f.name}: {f.summary}" for f in failed))
    if report.exit_code:
        raise typer.Exit(report.exit_code)
