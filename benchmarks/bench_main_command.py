"""Every row of issue 30's goal table, this tree beside a baseline tree in the same run.

    python benchmarks/bench_main_command.py [--rounds 3] [--baseline /work/main] [--regen]

Rows (whole process, `opweave-plan --model gemma-3-27b --slo 60ms --ctx 32k --quiet`, warm
numba cache unless stated, each tree's bytecode compiled first as an install has it; median of
--rounds, baseline and this tree interleaved; wall and CPU seconds, CPU being what a shared
machine changes least; the last columns are baseline/this):

* every profiled GPU type (the README's first command), `--gpus h100`, `--gpus h100,a100`;
* `--gpus h100 --workload examples/traces/mooncake-conversation-sample.jsonl --scale-ctx 32k`;
* the README command with `--jobs 2`;
* first runs with an empty numba cache (`--gpus h100`, and the README command): compilation
  included, --cold-rounds rounds (1 unless given; a single cold run varies by about 2 s here);
* with --regen (several minutes on two cores): `regen --matrix examples/matrix.toml --jobs 2`
  into an empty folder (cold plans), twice, then the unchanged rerun.

Then the per-phase split of one search per GPU set in each tree (compile_request, then each
phase of `search.driver.run_search`: colocated, two-owner, single-type, mixed), with counters.
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
    print(f"  {gpus or 'all profiled types'}: compile_request (latency arrays) {t_ctx:.2f} s")
    for name, n, sec in out.phases:
        print(f"    {name:<22}{n:>7} templates {sec:>8.2f} s")
    c = out.counters
    print(f"    counters: {c.candidates:,} candidates, {c.simulations:,} simulations, "
          f"{c.pruned_by_bound:,} pruned by bound, {c.pruned_by_frontier:,} by frontier")


PHASES = "import sys, bench_main_command as b; [b.phases(g) for g in sys.argv[1:] or [None]]"


def phases_in(tree: Path, gpus: str | None) -> str:
    """`phases(gpus)` run in `tree`, on its own package (the function reads only api.make_request,
    compile_request and run_search, which every tree since issue 16 has)."""
    env = dict(os.environ, PYTHONPATH=f"{tree / 'src'}{os.pathsep}{NEW / 'benchmarks'}")
    res = subprocess.run([sys.executable, "-c", PHASES, *([gpus] if gpus else [])], env=env, cwd=tree,
                         capture_output=True, text=True)
    return res.stdout if res.returncode == 0 else f"  failed: {res.stderr[-500:]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", "--old", type=Path, dest="baseline",
                    help="root of another checkout (e.g. /work/main) to run side by side")
    ap.add_argument("--regen", action="store_true", help="also time regen of examples/matrix.toml (minutes)")
    ap.add_argument("--cold-rounds", type=int, default=1,
                    help="rounds of the empty-cache rows (about 25 s each per tree; median, interleaved)")
    args = ap.parse_args(argv)
    base = args.baseline.resolve() if args.baseline else None
    trees = [base, NEW] if base else [NEW]
    for t in trees:
        # bytecode beside each tree's sources, as `pip install .` leaves an install: without it
        # (an editable install under PYTHONDONTWRITEBYTECODE, as on the development box) every
        # process compiles the package's modules from source, about 0.15-0.25 s of each row
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(t / "src")], env=env, check=True)
    for t in trees:  # warm each tree's numba cache, both objectives (a fixed context, a workload)
        _seconds(t, (*BASE, "--gpus", "h100"))
        _seconds(t, WORKLOAD)
    head = "".join(f"{('baseline' if i == 0 and base else 'this') + ' wall / cpu':>16}" for i in range(len(trees)))
    print(f"{'row (whole process, s, median of ' + str(args.rounds) + ')':<50}{head}"
          f"{'  base/this wall, cpu' if base else ''}")
    for label, extra in SETS:
        _row(label, lambda t, e=extra: _seconds(t, (*BASE, *e)), trees, args.rounds)
    _row("--gpus h100 --workload mooncake --scale-ctx 32k", lambda t: _seconds(t, WORKLOAD), trees, args.rounds)
    for label, extra in SETS[:1]:
        _row(label + ", --jobs 2", lambda t, e=extra: _seconds(t, (*BASE, *e, "--jobs", "2")), trees, args.rounds)
    for label, extra in (SETS[1], SETS[0]):
        def cold(t: Path, e=extra) -> tuple[float, float]:
            with tempfile.TemporaryDirectory() as cache:
                return _seconds(t, (*BASE, *e), cache)

        _row(f"{label}, empty numba cache (compile)", cold, trees, args.cold_rounds)
    if args.regen:
        matrix = ("regen", "--matrix", "examples/matrix.toml", "--jobs", "2")

        def regen_cold(t: Path) -> tuple[float, float]:
            with tempfile.TemporaryDirectory() as out:
                return _seconds(t, (*matrix, "--out", out))

        def regen_rerun(t: Path) -> tuple[float, float]:
            with tempfile.TemporaryDirectory() as out:
                _seconds(t, (*matrix, "--out", out))
                return _seconds(t, (*matrix, "--out", out))

        _row("regen, shipped matrix, --jobs 2, cold plans (x2)", regen_cold, trees, 2)
        _row("regen rerun, nothing changed", regen_rerun, trees, 1)
    for t in trees:
        print(f"per-phase split ({'baseline ' if t == base else 'this tree '}{t}, in process):")
        for _label, extra in SETS:
            print(phases_in(t, extra[1] if extra else None), end="", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
