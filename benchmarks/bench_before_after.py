"""Speed of this tree against an older revision, measured side by side in one run.

    git worktree add /tmp/opweave-old <REV>        # the revision to compare against
    python benchmarks/bench_before_after.py --old /tmp/opweave-old [--rounds 3]

Every figure runs in a fresh subprocess with PYTHONPATH pointing at each tree's src/, old
and new interleaved round by round (so machine load hits both alike); the median of the
rounds is reported with the ratio new / old (time: < 1 is faster; rate: > 1 is faster):

* plan h100      whole `opweave-plan --model gemma-3-27b --slo 60ms --ctx 32k --gpus h100`,
                 warm numba cache;
* search Full    the search time (search_s) that each tree's own
                 benchmarks/bench_search_ablation.py prints for Full on H100, full grid;
* simulator      sims/s of each tree's benchmarks/bench_simulator.py (21 and 124 stages);
* cold compile   the planner path on a tiny request with an empty NUMBA_CACHE_DIR, minus the
                 same request with a warm cache (numba compilation of the search kernels);
* cold compile, workload   the same for gemma-3-27b, 60 ms, the shipped Mooncake sample at
                 --scale-ctx 32k, --gpus h100 (the workload objective's kernels); skipped
                 when the old tree has no workload planner.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NEW = Path(__file__).resolve().parents[1]
PLAN = ("--model", "gemma-3-27b", "--slo", "60ms", "--ctx", "32k", "--gpus", "h100", "--quiet")
# flags both the old and the new CLI take; the colocated search compiles the same kernels
TINY = ("--model", "llama-3.1-8b", "--slo", "60ms", "--ctx", "8k", "--gpus", "h100", "--quiet",
        "--policy", "colocated", "--max-gpus", "8")
TRACE = "examples/traces/mooncake-conversation-sample.jsonl"
WORKLOAD = ("--model", "gemma-3-27b", "--slo", "60ms", "--workload", TRACE, "--scale-ctx", "32k", "--gpus", "h100",
            "--quiet")
RUN = "import sys; from opweave_planner.cli.main import run; sys.argv[0] = 'opweave-plan'; run()"


def _env(tree: Path, cache: str | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    if cache:
        env["NUMBA_CACHE_DIR"] = cache
    return env


def _timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if res.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(cmd)} failed in {cwd}:\n{res.stderr[-2000:]}")
    return dt, res.stdout


def plan_seconds(tree: Path) -> float:
    return _timed([sys.executable, "-c", RUN, *PLAN], _env(tree), tree)[0]


def search_seconds(tree: Path) -> float:
    _, out = _timed([sys.executable, "benchmarks/bench_search_ablation.py", "--hardware", "H100"], _env(tree), tree)
    row = next(ln for ln in out.splitlines() if ln.startswith("H100") and " Full " in ln)
    return float(row.split()[7])


def simulator_rates(tree: Path) -> tuple[float, float]:
    _, out = _timed([sys.executable, "benchmarks/bench_simulator.py", "--rounds", "3"], _env(tree), tree)
    rates = [float(m.group(1).replace(",", "")) for m in re.finditer(r"^\S.*?\s\d+\s+\d+\s+([\d,]+)\s", out, re.M)]
    return rates[0], rates[1]


def cold_compile_seconds(tree: Path, request: tuple[str, ...] = TINY) -> float:
    with tempfile.TemporaryDirectory() as cache:
        cold = _timed([sys.executable, "-c", RUN, *request], _env(tree, cache), tree)[0]
        warm = _timed([sys.executable, "-c", RUN, *request], _env(tree, cache), tree)[0]
    return cold - warm


def has_workloads(tree: Path) -> bool:
    return (tree / "src" / "opweave_planner" / "inputs" / "workload.py").is_file() and (tree / TRACE).is_file()


FIGURES = (
    ("plan h100 (s)", lambda t: (plan_seconds(t),), ("",), "time"),
    ("search Full H100 (s)", lambda t: (search_seconds(t),), ("",), "time"),
    ("simulator (sims/s)", simulator_rates, (" 21 stages", " 124 stages"), "rate"),
    ("cold compile (s)", lambda t: (cold_compile_seconds(t),), ("",), "time"),
    ("cold compile, workload (s)", lambda t: (cold_compile_seconds(t, WORKLOAD),), ("",), "time"),
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, type=Path, help="root of the older checkout (has src/)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", help="comma list of figure name prefixes to run")
    args = ap.parse_args(argv)
    old = args.old.resolve()
    # warm both trees' numba caches (and catch a broken tree early)
    for tree in (old, NEW):
        plan_seconds(tree)
    print(f"old: {old}\nnew: {NEW}\nrounds: {args.rounds} (median; old and new interleaved)")
    print(f"{'figure':<34}{'old':>12}{'new':>12}{'new/old':>10}")
    for name, fn, parts, kind in FIGURES:
        if args.only and not any(name.startswith(p) for p in args.only.split(",")):
            continue
        if "workload" in name and not has_workloads(old):
            print(f"{name:<34}{'(old tree has no workload planner)':>34}")
            continue
        runs: dict[str, list[tuple[float, ...]]] = {"old": [], "new": []}
        for _ in range(args.rounds):
            runs["old"].append(fn(old))
            runs["new"].append(fn(NEW))
        for i, part in enumerate(parts):
            a = statistics.median(r[i] for r in runs["old"])
            b = statistics.median(r[i] for r in runs["new"])
            ratio = b / a if a else float("nan")
            better = "faster" if (ratio < 1) == (kind == "time") else "slower"
            print(f"{name + part:<34}{a:>12,.3f}{b:>12,.3f}{ratio:>10.3f}  ({better})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
