"""Where the main command's time goes, and how it compares with an older revision (issue 16).

    python benchmarks/bench_main_command.py [--rounds 3] [--old /tmp/opweave-old] [--regen]

Rows (whole process, `opweave-plan --model gemma-3-27b --slo 60ms --ctx 32k --quiet`, warm
numba cache unless stated; median of --rounds, old and new interleaved when --old is given):

* every profiled GPU type (the README's first command), `--gpus h100`, `--gpus h100,a100`;
* the same with `--jobs 2` (speed-up against `--jobs 1`);
* a first run with an empty numba cache (compilation included);
* with --regen: `regen --matrix examples/matrix.toml --jobs 2` into an empty folder, then the
  unchanged rerun (several minutes on two cores).

Then the per-phase split of one in-process search per GPU set (latency arrays, then each phase of
`search.driver.run_search`: colocated, two-owner, single-type, mixed) with the search counters.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NEW = Path(__file__).resolve().parents[1]
RUN = "import sys; from opweave_planner.cli.main import run; sys.argv[0] = 'opweave-plan'; run()"
BASE = ("--model", "gemma-3-27b", "--slo", "60ms", "--ctx", "32k", "--quiet")
SETS = (("all profiled types", ()), ("--gpus h100", ("--gpus", "h100")), ("--gpus h100,a100", ("--gpus", "h100,a100")))
WORKLOAD = ("--model", "gemma-3-27b", "--slo", "60ms", "--gpus", "h100", "--workload",
            "examples/traces/mooncake-conversation-sample.jsonl", "--scale-ctx", "32k", "--quiet")


def _seconds(tree: Path, args: tuple[str, ...], cache: str | None = None) -> tuple[float, float]:
    """(wall, CPU) seconds of one whole process: CPU (user + system, its workers included) is
    what a shared, noisy machine changes least."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    if cache:
        env["NUMBA_CACHE_DIR"] = cache
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run([sys.executable, "-c", RUN, *args], env=env, cwd=tree, capture_output=True, text=True)
    if res.returncode not in (0, 1, 3):
        raise SystemExit(f"{' '.join(args)} failed in {tree}:\n{res.stderr[-2000:]}")
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - t0, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def _row(label: str, fn, trees: list[Path], rounds: int) -> None:
    runs: dict[Path, list[tuple[float, float]]] = {t: [] for t in trees}
    for _ in range(rounds):
        for t in trees:
            runs[t].append(fn(t))
    wall = [statistics.median(w for w, _c in runs[t]) for t in trees]
    cpu = [statistics.median(c for _w, c in runs[t]) for t in trees]
    ratio = f"{wall[0] / wall[1]:>8.2f}x {cpu[0] / cpu[1]:>6.2f}x" if len(trees) == 2 and wall[1] and cpu[1] else ""
    cells = "".join(f"{w:>9.2f} /{c:>6.2f}" for w, c in zip(wall, cpu, strict=True))
    print(f"{label:<50}{cells}{ratio}", flush=True)


def phases(gpus: str | None) -> None:
    from opweave_planner import api
    from opweave_planner.compile import compile_request
    from opweave_planner.search.driver import run_search

    req = api.make_request("gemma-3-27b", "60ms", "32k", gpus=gpus)
    t0 = time.perf_counter()
    ctx = compile_request(req)
    t_ctx = time.perf_counter() - t0
    out = run_search(ctx)
    print(f"  {gpus or 'all profiled types'}: latency arrays and templates {t_ctx:.2f} s")
    for name, n, sec in out.phases:
        print(f"    {name:<22}{n:>7} templates {sec:>8.2f} s")
    c = out.counters
    print(f"    counters: {c.candidates:,} candidates, {c.simulations:,} simulations, "
          f"{c.pruned_by_bound:,} pruned by bound, {c.pruned_by_frontier:,} by frontier")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--old", type=Path, help="root of an older checkout to run side by side")
    ap.add_argument("--regen", action="store_true", help="also time regen of examples/matrix.toml")
    args = ap.parse_args(argv)
    trees = [args.old.resolve(), NEW] if args.old else [NEW]
    for t in trees:  # warm each tree's numba cache
        _seconds(t, (*BASE, "--gpus", "h100"))
    head = "".join(f"{('old' if i == 0 and args.old else 'new') + ' wall / cpu':>16}" for i in range(len(trees)))
    print(f"{'row (whole process, s, median of ' + str(args.rounds) + ')':<50}{head}"
          f"{'  old/new wall, cpu' if args.old else ''}")
    for label, extra in SETS:
        _row(label, lambda t, e=extra: _seconds(t, (*BASE, *e)), trees, args.rounds)
    _row("--gpus h100 --workload mooncake --scale-ctx 32k", lambda t: _seconds(t, WORKLOAD), trees, args.rounds)
    for label, extra in SETS[:1]:
        _row(label + ", --jobs 2", lambda t, e=extra: _seconds(t, (*BASE, *e, "--jobs", "2")), trees, args.rounds)

    def cold(t: Path) -> float:
        with tempfile.TemporaryDirectory() as cache:
            return _seconds(t, (*BASE, "--gpus", "h100"), cache)

    _row("--gpus h100, empty numba cache (compile)", cold, trees, 1)
    if args.regen:
        def regen_pair(t: Path) -> float:
            with tempfile.TemporaryDirectory() as out:
                first = _seconds(t, ("regen", "--matrix", "examples/matrix.toml", "--out", out, "--jobs", "2", "-q")
                                 if t == NEW else ("regen", "--matrix", "examples/matrix.toml", "--out", out, "--jobs", "2"))
                print(f"{'  regen, cold plans, --jobs 2':<50}{first[0]:>9.2f} /{first[1]:>6.2f}", flush=True)
                return _seconds(t, ("regen", "--matrix", "examples/matrix.toml", "--out", out, "--jobs", "2"))

        _row("regen rerun, nothing changed", regen_pair, [NEW], 1)
    print("per-phase split (this tree, in process):")
    for _label, extra in SETS:
        phases(extra[1] if extra else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
