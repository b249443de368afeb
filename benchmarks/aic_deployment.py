"""The whole-deployment comparison behind `vs_aiconfigurator.py --deployment`: our planner's two
deployment modes (through `opweave_planner.api`, as `aggregated_case.py` plans them) beside a
fresh `aiconfigurator cli recommend` on the same traffic, in one markdown table per case.

aiconfigurator is an optional tool, never a dependency: when it can be run (an executable, a
Python that has it, or this interpreter) each case is asked afresh and the answers are recorded
in ``benchmarks/results/vs_aiconfigurator_deployment.json`` with the command, aiconfigurator's
version and the date; otherwise the recorded answers are read. Every GPU is priced from our
catalog on both sides, so USD/h compares GPU counts at one price, not two price lists.
"""

from __future__ import annotations

import csv
import datetime as dt
import importlib.util
import json
import math
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aggregated_case import BASE, SWEEP

from opweave_planner import api
from opweave_planner.data import shipped_dir

RESULT = Path(__file__).parent / "results" / "vs_aiconfigurator_deployment.json"
SYSTEMS = {"h100": "h100_sxm", "a100": "a100_sxm", "l40s": "l40s", "h200": "h200_sxm"}
BACKEND = "vllm"  # the backend whose tables our profiles were imported from
#: run aiconfigurator's console entry point from a given interpreter
_ENTRY = "import sys; from aiconfigurator.main import main; sys.argv[0] = 'aiconfigurator'; sys.exit(main())"
MODEL_DIR = "MODEL_DIR"  # stands for a folder holding models/<model>.json as config.json, in recorded commands


def case_key(over: dict) -> str:
    """A stable name for a case: its overrides of BASE (``base`` for none)."""
    return ",".join(f"{k}={over[k]}" for k in sorted(over)) or "base"


def traffic(over: dict) -> dict:
    """The question aiconfigurator is asked for a case: our request's lengths, SLOs and rate."""
    r = {**BASE, **over}
    osl = int(r["output_len"])
    return {"model": r["model"], "system": SYSTEMS[r["gpus"]], "isl": int(r["prompt_len"]), "osl": osl,
            "ttft_ms": api.parse_duration_ms(r["ttft"]), "tpot_ms": api.parse_duration_ms(r["slo"]),
            "request_rate": r["target_tokens_per_s"] / osl, "target_tokens_per_s": float(r["target_tokens_per_s"])}


def aic_command(aic: str | None, aic_python: str | None) -> tuple[list[str], str | None] | None:
    """(the command that runs aiconfigurator, the Python it runs in when known), or None."""
    if aic_python:
        return [aic_python, "-c", _ENTRY], aic_python
    if aic:
        return [aic], None
    if importlib.util.find_spec("aiconfigurator") is not None:
        return [sys.executable, "-c", _ENTRY], sys.executable
    return None


def _versions(python: str | None) -> dict:
    if python is None:
        return {}
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps({p: m.version(p) for p in ('aiconfigurator', 'aiconfigurator-core')}))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout) if out.returncode == 0 else {}


#: the columns of best_config_topn.csv kept per mode (the rest are its generator's settings)
_KEEP = {
    "agg": ("total_gpus_needed", "replicas_needed", "num_total_gpus", "request_rate", "ttft", "tpot",
            "tokens/s", "tokens/s/gpu", "tokens/s/user", "concurrency", "parallel", "bs", "backend", "version"),
    "disagg": ("total_gpus_needed", "replicas_needed", "num_total_gpus", "request_rate", "ttft", "tpot",
               "tokens/s", "tokens/s/gpu", "tokens/s/user", "concurrency", "(p)workers", "(p)parallel", "(p)bs",
               "(d)workers", "(d)parallel", "(d)bs", "(p)backend", "(p)version", "(d)backend", "(d)version"),
}


def _top(csv_path: Path, mode: str) -> dict:
    """Rank 1 of aiconfigurator's table for a mode (ranked by GPUs needed), numbers as numbers."""
    with csv_path.open() as f:
        row = next(csv.DictReader(f))
    out = {}
    for k in _KEEP[mode]:
        v = row[k]
        try:
            out[k] = int(v) if re.fullmatch(r"-?\d+", v) else float(v)
        except ValueError:
            out[k] = v
    return out


def run_recommend(base: list[str], python: str | None, over: dict) -> dict:
    """One fresh `aiconfigurator cli recommend` for a case: its pick, both modes' rank-1 rows, and
    how it was run."""
    t = traffic(over)
    args = ["cli", "recommend", "--model-path", MODEL_DIR, "--system", t["system"], "--backend", BACKEND,
            "--isl", str(t["isl"]), "--osl", str(t["osl"]), "--ttft", f"{t['ttft_ms']:g}",
            "--tpot", f"{t['tpot_ms']:g}", "--target-request-rate", f"{t['request_rate']:.10g}"]
    with tempfile.TemporaryDirectory() as tmp:
        mdir = Path(tmp) / t["model"]
        mdir.mkdir()
        (mdir / "config.json").write_bytes((shipped_dir("models") / f"{t['model']}.json").read_bytes())
        save = Path(tmp) / "out"
        argv = [a if a != MODEL_DIR else str(mdir) for a in args] + ["--save-dir", str(save)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.perf_counter()
        proc = subprocess.run(base + argv, capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - wall
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise RuntimeError(f"aiconfigurator exited {proc.returncode}: {log[-2000:]}")
        modes = {m: _top(next(save.glob(f"*/{m}/best_config_topn.csv")), m) for m in ("agg", "disagg")}
    version = re.search(r"Loading AIConfigurator version: (\S+)", log)
    chosen = re.search(r"Best Experiment Chosen: (\w+)", log)
    perf_db = sorted(set(re.findall(r"Perf-DB version: (\S+)", log)))
    return {
        "command": "aiconfigurator " + shlex.join(args),
        "model_dir": f"{MODEL_DIR}/config.json is models/{t['model']}.json",
        "traffic": t,
        "aiconfigurator_version": version.group(1) if version else None,
        "packages": _versions(python),
        "perf_db_versions": perf_db,
        "database_mode": "HYBRID (recommend's default)",
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
        "wall_s": round(wall, 1),
        "chosen": chosen.group(1) if chosen else None,
        "modes": modes,
    }


def replicas_for(rate: float, per_replica_rate: float) -> int:
    """aiconfigurator sizes in whole replicas (an agg worker, or an xPyD group): the least count
    whose summed request rate reaches the target."""
    return math.ceil(rate / per_replica_rate - 1e-9)


def _aic_rows(rec: dict, price: float) -> list[tuple]:
    t = rec["traffic"]
    rows = []
    for mode, label in (("disagg", "aiconfigurator, disaggregated"), ("agg", "aiconfigurator, aggregated")):
        m = rec["modes"][mode]
        n = replicas_for(t["request_rate"], m["request_rate"])
        gpus = n * m["num_total_gpus"]
        if (n, gpus) != (m["replicas_needed"], m["total_gpus_needed"]):
            raise RuntimeError(f"{label}: ceil({t['request_rate']:.4g} / {m['request_rate']}) x "
                               f"{m['num_total_gpus']} = {gpus}, but it reports {m['total_gpus_needed']}")
        if mode == "disagg":
            shape = (f"{n} x ({m['(p)workers']} prefill {m['(p)parallel']} bs {m['(p)bs']} + {m['(d)workers']} "
                     f"decode {m['(d)parallel']} bs {m['(d)bs']})")
        else:
            shape = f"{n} x {m['parallel']} bs {m['bs']}"
        if rec["chosen"] == mode:
            label += " (its pick)"
        rows.append((label, gpus, shape, gpus * price, f"{m['ttft']:.1f}", f"{m['tpot']:.2f}",
                     t["target_tokens_per_s"] / gpus, m["tokens/s/gpu"]))
    return rows


def _our_rows(doc, target: float) -> list[tuple]:
    d = doc.deployment
    p, a = d.prefill, d.aggregated
    gpus = d.gpus_total + p.gpus
    shape = ", ".join(f"decode {o.replicas}x {o.gpu} TP{o.tensor_parallel}" for o in d.owners)
    prefill_tok_s = p.instances * 1e3 / p.prefill_mean_ms * d.arrivals.mean_output_tokens
    tpot = f"{doc.tpot_ms:.2f} full batch"
    if d.tpot_p95_at_load_ms is not None:
        tpot += f"; p95 {d.tpot_p95_at_load_ms:.2f} at load"
    pick = " (chosen)" if d.mode == "disaggregated" else ""
    rows = [(f"opweave, disaggregated{pick}", gpus,
             f"prefill {p.instances}x {p.gpu} TP{p.tensor_parallel} + {shape} B={doc.global_batch}",
             d.usd_per_hour_all_in, f"p{p.ttft_percentile:g} {p.ttft_ms:.1f} (mean {p.ttft_mean_ms:.1f})", tpot,
             target / gpus, min(d.tokens_per_s, prefill_tok_s) / gpus)]
    if a is not None:
        pick = " (chosen)" if d.mode == "aggregated" else ""
        rows.append((f"opweave, aggregated{pick}", a.gpus,
                     f"{a.replicas}x {a.gpu} TP{a.tensor_parallel} B={a.batch} chunk {a.chunk_tokens}",
                     a.usd_per_hour, f"p{p.ttft_percentile:g} {a.ttft_ms:.1f} (mean {a.ttft_mean_ms:.1f})",
                     f"p{a.tpot_percentile:g} {a.tpot_ms:.2f} (mean {a.tpot_mean_ms:.2f})", target / a.gpus, None))
    else:
        rows.append(("opweave, aggregated", "-", "none meets both SLOs", None, "-", "-", None, None))
    return rows


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_case(label: str, doc, rec: dict | None, price: float) -> None:
    t = doc.deployment.target_tokens_per_s
    print(f"### {label} ({t:,.0f} output tokens/s)")
    print()
    print("| deployment | GPUs | shape | USD/h | TTFT (ms) | TPOT (ms) | tokens/s/GPU at the target | "
          "tokens/s/GPU at capacity |")
    print("|---|---|---|---|---|---|---|---|")
    rows = _our_rows(doc, t) + (_aic_rows(rec, price) if rec else [])
    for name, gpus, shape, usd, ttft, tpot, at_target, at_cap in rows:
        print(f"| {name} | {gpus} | {shape} | {_fmt(usd, '.2f')} | {ttft} | {tpot} | {_fmt(at_target, '.0f')} | "
              f"{_fmt(at_cap, '.0f')} |")
    if rec is None:
        print("| aiconfigurator | - | not recorded for this case (run with aiconfigurator installed) | | | | | |")
        print()
        return
    r = rec["traffic"]["request_rate"]
    print()
    pkgs = ", ".join(f"{k} {v}" for k, v in rec["packages"].items()) or f"aiconfigurator {rec['aiconfigurator_version']}"
    print(f"{pkgs}, backend {BACKEND}, perf database {', '.join(rec['perf_db_versions'])}, {rec['database_mode']}, "
          f"run {rec['date_utc']} ({rec['cpu_s']} s CPU): `{rec['command']}` ({rec['model_dir']}).")
    for mode in ("disagg", "agg"):
        m = rec["modes"][mode]
        n = replicas_for(r, m["request_rate"])
        print(f"- {mode}: replicas = ceil({r:.4g} req/s / {m['request_rate']:g} req/s per {m['num_total_gpus']}-GPU "
              f"replica) = {n} -> {n * m['num_total_gpus']} GPUs; its {m['tokens/s/gpu']:.0f} tokens/s/GPU is one "
              f"replica at its operating point ({m['tokens/s']:.0f} tokens/s / {m['num_total_gpus']}); "
              f"{m['tokens/s'] * n:.0f} tokens/s deployed for {t:,.0f} asked ({m['tokens/s'] * n / t - 1:+.0%}).")
    print()


def main(aic: str | None, aic_python: str | None, sweep: bool, table_only: bool) -> None:
    cases = SWEEP if sweep else SWEEP[:1]
    recorded = json.loads(RESULT.read_text()) if RESULT.is_file() else {}
    cmd = None if table_only else aic_command(aic, aic_python)
    if cmd is None:
        print(f"aiconfigurator not run: reading {RESULT.relative_to(Path(__file__).parent.parent)}")
    else:
        for _, over in cases:
            recorded[case_key(over)] = run_recommend(*cmd, over)
            RESULT.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    price = api.gpu_catalog().resolve(BASE["gpus"]).price_per_hour
    print(f"Every GPU at our catalog's {BASE['gpus']} price, {price:g} USD/GPU-h.")
    print()
    for label, over in cases:
        t0 = time.perf_counter()
        doc = api.plan(api.make_request(**{**BASE, **over})).plan
        print(f"<!-- our plan: {time.perf_counter() - t0:.1f} s wall -->")
        print_case(label, doc, recorded.get(case_key(over)), price)
