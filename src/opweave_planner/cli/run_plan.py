"""The main job's rendering: progress and summary on stderr, plan to stdout or a file."""

from __future__ import annotations

import sys
import time


def _estimated(req) -> list[str]:
    """Chosen GPU types whose catalog price is an estimate (the summary warns)."""
    from opweave_planner.inputs.hardware import load_hardware

    hw = load_hardware(req.catalog, req.prices)
    return [g for g in req.gpus if hw.resolve(g).price_estimated]


def unmeasured(profiles: str | None, gpus) -> list[str]:
    """GPU types with no measured latency tables in `profiles` (their figures are all fitted)."""
    from opweave_planner.data import profiles_root
    from opweave_planner.latency.tables import available_gpus

    have = set(available_gpus(profiles_root(profiles)))
    return [g for g in gpus if g not in have]


def compiled_parts(req) -> list[str]:
    """The parts of `jit.ENTRIES` planning `req` runs: its objective's search, and with --ttft the
    prefill replay and (unless --deployment-mode disaggregated) the aggregated replay."""
    parts = ["workload search" if req.stochastic else "fixed-context search"]
    if req.disaggregated:
        parts.append("prefill replay")
        if req.deployment_mode != "disaggregated":
            parts.append("aggregated replay")
    return parts


def run_plan(settings: dict, *, out, fmt, jobs, quiet) -> None:
    from opweave_planner import api, jit, report
    from opweave_planner.atomic import check_writable, write_atomic
    from opweave_planner.cli import heap
    from opweave_planner.errors import InfeasibleError
    from opweave_planner.plan import plan_bytes

    if out:
        check_writable(out, "--out")  # before a long search, not after it
    req = api.make_request(**settings)
    cold = jit.cold_parts(compiled_parts(req))
    report.announce_compile(not cold, enabled=not quiet, what=report.compile_notice(cold))
    from opweave_planner.search.driver import ETA_AFTER  # the search runs next

    heap.settle()  # the planner is loaded: freeze it, collect the search's garbage
    start = time.perf_counter()
    with report.Progress("search (estimated work)", enabled=not quiet, eta_after=ETA_AFTER) as bar:
        outcome = api.plan(req, jobs=jobs, progress=bar)
    elapsed = time.perf_counter() - start
    result, infeasible = outcome.plan, outcome.infeasible
    data = plan_bytes(outcome.document)
    if out:
        write_atomic(out, data, field="--out")
    elif infeasible is None and fmt == "json":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    if result is not None and (fmt == "table" or not quiet):
        report.render_plan_summary(result, unmeasured_gpus=unmeasured(req.profiles, req.gpus),
                                   estimated_price_gpus=_estimated(req),
                                   file=sys.stdout if fmt == "table" else None)
    if result is not None and result.deployment is not None and not quiet:
        from opweave_planner.sizing import deployment_lines

        print("\n".join(deployment_lines(result.deployment)), file=sys.stderr)
    if not quiet:
        print(f"search took {elapsed:.2f} s", file=sys.stderr)
    if infeasible is not None:
        raise InfeasibleError(infeasible.reason)
