"""The main job's rendering: progress on stderr, plan to stdout or a file, exit codes."""

from __future__ import annotations

import sys
import time


def run_plan(settings: dict, *, out, fmt, jobs, quiet) -> None:
    from opweave_planner import api, report
    from opweave_planner.errors import InfeasibleError
    from opweave_planner.plan import plan_bytes, write_atomic

    req = api.make_request(**settings)
    show = not quiet and sys.stderr.isatty()
    start = time.perf_counter()
    if show:
        from rich.progress import Progress

        with Progress(transient=True, console=report._console(stderr=True)) as bar:
            task = bar.add_task("templates", total=None)
            result, infeasible = api.plan(req, jobs=jobs, progress=lambda d, t: bar.update(task, completed=d, total=t))
    else:
        result, infeasible = api.plan(req, jobs=jobs)
    elapsed = time.perf_counter() - start
    doc = result if result is not None else infeasible
    data = plan_bytes(doc)
    if out:
        write_atomic(out, data)
    elif infeasible is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    if not quiet:
        if result is not None and (fmt == "table" or sys.stderr.isatty()):
            report.render_plan_summary(result)
        print(f"search took {elapsed:.2f} s", file=sys.stderr)
    if infeasible is not None:
        raise InfeasibleError(f"infeasible: {infeasible.reason}")
