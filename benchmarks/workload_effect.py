"""What planning for the workload changes (issue 13, item 8).

Usage:  python benchmarks/workload_effect.py [--scales 8k,32k,128k] [--cases gemma,qwen] [--jobs 1]

The Mooncake conversation trace sample (examples/traces) is rescaled so that its stationary
mean decode context θ is 8k, 32k and 128k (the way the OpWeave paper built its cohorts from
one dataset). For gemma-3-27b (25 / 60 ms) and qwen3-next-80b-a3b (40 / 80 ms) on H100:

* the plan made for one fixed context `--ctx θ` is re-evaluated under the trace
  (`contract.evaluate_plan(plan, workload=...)`, same placement): its p95 step TPOT, whether
  that meets the SLO, and whether its memory holds the trace's KV tail;
* the workload-aware plan (`--workload trace --scale-ctx θ`): its cost and p95.

Requests longer than the model's window (a runtime's default max-model-len) have their
output clipped there (`--overflow clip`). Where clipping cannot build the cohort (rescaling
would push more than half of the prompts past the window, e.g. 128k on qwen3-next), the
cohort is built with `--overflow truncate` instead: the prompt keeps its most recent tokens,
as a chat frontend trims a long history; each row says which. A cohort whose θ the window
cannot reach at all (128k on gemma-3-27b, whose window is 128k) is reported as such.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "examples" / "traces" / "mooncake-conversation-sample.jsonl"
CASES = {"gemma": ("gemma-3-27b", ("25ms", "60ms")), "qwen": ("qwen3-next-80b-a3b", ("40ms", "80ms"))}


def _workload_request(model: str, slo: str, scale: str):
    """(request, overflow): clip, or truncate where clipping cannot build the cohort."""
    from opweave_planner import api
    from opweave_planner.errors import UserError

    try:
        return api.make_request(model=model, slo=slo, gpus="h100", workload=str(TRACE), scale_ctx=scale), "clip"
    except UserError as exc:
        if "keeps only" not in str(exc):
            raise
    return api.make_request(model=model, slo=slo, gpus="h100", workload=str(TRACE), scale_ctx=scale,
                            overflow="truncate"), "truncate"


def one(model: str, slo: str, scale: str, jobs: int) -> dict:
    from opweave_planner import api
    from opweave_planner.compile.traffic import workload_of
    from opweave_planner.contract import evaluate_plan
    from opweave_planner.errors import UserError

    row: dict = {"model": model, "slo": slo, "scale": scale}
    try:
        wreq, row["overflow"] = _workload_request(model, slo, scale)
    except UserError as exc:
        row["error"] = str(exc)
        return row
    t0 = time.perf_counter()
    _outcome = api.plan(wreq, jobs=jobs)
    wplan, winf = _outcome.plan, _outcome.infeasible
    row["t_workload"] = time.perf_counter() - t0
    theta = round(workload_of(wreq).theta)
    t0 = time.perf_counter()
    _outcome = api.plan(api.make_request(model=model, slo=slo, gpus="h100", ctx=theta), jobs=jobs)
    dplan, dinf = _outcome.plan, _outcome.infeasible
    row["t_fixed"] = time.perf_counter() - t0
    row["theta"] = theta
    if dplan is not None:
        ev = evaluate_plan(dplan, workload=str(TRACE), scale_ctx=scale, overflow=row["overflow"])
        row["fixed"] = dict(cost=dplan.usd_per_million_tokens, tpot=dplan.tpot_ms, p95=ev.plan.tpot_ms,
                            meets=ev.meets_slo, fits=ev.fits_memory, gpus=dplan.gpus_total,
                            stages=dplan.num_stages, batch=dplan.global_batch)
    else:
        row["fixed"] = {"infeasible": dinf.reason}
    if wplan is not None:
        row["aware"] = dict(cost=wplan.usd_per_million_tokens, p95=wplan.tpot_ms, mean=wplan.tpot.mean_ms,
                            gpus=wplan.gpus_total, stages=wplan.num_stages, batch=wplan.global_batch)
    else:
        row["aware"] = {"infeasible": winf.reason}
    return row


def _fmt(row: dict) -> str:
    head = f"{row['model']:<20} {row['slo']:>5} θ={row['scale']:>4}"
    if row.get("overflow") == "truncate":
        head += " (prompts truncated to the window)"
    if "error" in row:
        return f"{head}  n/a: {row['error']}"
    f, a = row["fixed"], row["aware"]
    if "infeasible" in f:
        fixed = f"--ctx plan: infeasible ({f['infeasible'][:60]})"
    else:
        verdict = ("meets SLO" if f["meets"] else "MISSES SLO") + (", fits" if f["fits"] else ", OUT OF MEMORY")
        fixed = (f"--ctx plan {f['cost']:.4f} $/Mtok, TPOT {f['tpot']:.2f} ms -> under trace p95 "
                 f"{f['p95']:.2f} ms ({verdict}), {f['gpus']} GPUs B={f['batch']}")
    if "infeasible" in a:
        aware = f"workload plan: infeasible ({a['infeasible'][:60]})"
    else:
        aware = (f"workload plan {a['cost']:.4f} $/Mtok, p95 {a['p95']:.2f} ms (mean {a['mean']:.2f}), "
                 f"{a['gpus']} GPUs B={a['batch']}")
    return f"{head}  {fixed}\n{'':>33}{aware}  [search {row['t_fixed']:.1f} s / {row['t_workload']:.1f} s]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="8k,32k,128k")
    ap.add_argument("--cases", default="gemma,qwen")
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args(argv)
    for case in a.cases.split(","):
        model, slos = CASES[case]
        for slo in slos:
            for scale in a.scales.split(","):
                print(_fmt(one(model, slo, scale, a.jobs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
