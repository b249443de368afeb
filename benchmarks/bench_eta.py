"""How true the progress ETA is: first ETA shown / real time left, per command (issue 30).

    python benchmarks/bench_eta.py [--rounds 1] [--only NAME ...] [--baseline /work/main]

Each command runs as a whole process with stderr a pipe (not a terminal, so the progress
prints its plain lines: every 5 s or each 10 % of the total). Every stderr line is stamped as
it arrives; a line with an ETA is compared with the time left until the phase's final line
("... done in ..."; for regen, its last entry line "[270/270] ..."). Printed per command: the first ETA line's ETA, the real time left then,
their ratio (goal: within 2x, i.e. 0.5-2.0), and the range of the ratio over every ETA line.
Wall clock on purpose (an ETA is wall time); on a shared machine the load changes under a
run, which moves the ratio: say so when quoting it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NEW = Path(__file__).resolve().parents[1]
RUN = "import sys; from opweave_planner.cli.main import run; sys.argv[0] = 'opweave-plan'; run()"
BASE = ("--model", "gemma-3-27b", "--slo", "60ms", "--ctx", "32k")
COMMANDS = {
    "readme1": BASE,
    "h100": (*BASE, "--gpus", "h100"),
    "h100,a100": (*BASE, "--gpus", "h100,a100"),
    "workload": ("--model", "gemma-3-27b", "--slo", "60ms", "--gpus", "h100", "--workload",
                 "examples/traces/mooncake-conversation-sample.jsonl", "--scale-ctx", "32k"),
    "workload-all": ("--model", "gemma-3-27b", "--slo", "60ms", "--workload",
                     "examples/traces/mooncake-conversation-sample.jsonl", "--scale-ctx", "32k"),
    "readme1-j2": (*BASE, "--jobs", "2"),
    "workload-all-j2": ("--model", "gemma-3-27b", "--slo", "60ms", "--workload",
                        "examples/traces/mooncake-conversation-sample.jsonl", "--scale-ctx", "32k", "--jobs", "2"),
    "regen": ("regen", "--matrix", "examples/matrix.toml", "--jobs", "2", "--out", "{tmp}"),
}
ETA = re.compile(r"ETA ((?:\d+ h \d+ min)|(?:\d+ min \d+ s)|(?:[\d.]+ s))")
DONE = re.compile(r": [\d,]+(?:/[\d,]+)? done in ")


def seconds(text: str) -> float:
    """`report.format_duration` read back."""
    if m := re.fullmatch(r"(\d+) h (\d+) min", text):
        return int(m[1]) * 3600 + int(m[2]) * 60
    if m := re.fullmatch(r"(\d+) min (\d+) s", text):
        return int(m[1]) * 60 + int(m[2])
    return float(text.removesuffix(" s"))


def stamped_stderr(tree: Path, args: tuple[str, ...]) -> list[tuple[float, str]]:
    """(seconds since start, line) for every stderr line of one run."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), COLUMNS="200")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", RUN, *args], env=env, cwd=tree, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, bufsize=1)
    lines = [(time.perf_counter() - t0, line.rstrip("\n")) for line in proc.stderr]
    if proc.wait() not in (0, 1, 3):
        raise SystemExit(f"{' '.join(args)} failed in {tree}:\n" + "\n".join(ln for _t, ln in lines[-20:]))
    return lines


def ratios(lines: list[tuple[float, str]]) -> tuple[list[tuple[float, float, float]], float | None]:
    """[(time, ETA, real time left)] of every ETA line before the final line, and its time."""
    end = next((t for t, ln in lines if DONE.search(ln)), None)
    if end is None:  # regen: its last entry line
        end = next((t for t, ln in reversed(lines) if re.match(r"\[(\d+)/\1\] ", ln)), None)
    out = []
    for t, ln in lines:
        m = ETA.search(ln)
        if m and end is not None and t < end:
            out.append((t, seconds(m[1]), end - t))
    return out, end


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--only", nargs="*", choices=sorted(COMMANDS), help="commands to run (default: all)")
    ap.add_argument("--baseline", type=Path, help="another checkout to run the same commands in")
    args = ap.parse_args(argv)
    trees = ([args.baseline.resolve()] if args.baseline else []) + [NEW]
    print(f"{'tree':<10}{'command':<11}{'first ETA at':>13}{'ETA':>10}{'real left':>11}{'ratio':>8}"
          f"{'ETA lines':>10}{'ratio range':>15}{'phase end':>11}")
    worst = 0.0
    for _ in range(args.rounds):
        for name in args.only or COMMANDS:
            for tree in trees:
                with tempfile.TemporaryDirectory() as tmp:
                    cmd = tuple(a.replace("{tmp}", tmp) for a in COMMANDS[name])
                    rows, end = ratios(stamped_stderr(tree, cmd))
                label = "baseline" if tree != NEW else "this"
                if not rows:
                    print(f"{label:<10}{name:<11}{'no ETA line':>13}{'':>54}{end or 0:>10.1f}s", flush=True)
                    continue
                t, eta, left = rows[0]
                rs = [e / max(r, 1e-9) for _t, e, r in rows]
                if tree == NEW:
                    worst = max(worst, rs[0], 1 / rs[0])
                print(f"{label:<10}{name:<11}{t:>12.1f}s{eta:>9.1f}s{left:>10.1f}s{rs[0]:>8.2f}{len(rows):>10}"
                      f"{min(rs):>7.2f}-{max(rs):<7.2f}{end:>10.1f}s", flush=True)
    print(f"worst first-ETA factor of this tree (max of ratio, 1/ratio): {worst:.2f} (goal <= 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
