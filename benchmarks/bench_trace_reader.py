"""Speed and peak memory of the trace reader (issue 25 acceptance; a benchmark, not a test).

Usage:  python benchmarks/bench_trace_reader.py [--rows 1000000,10000000] [--seed 0] [--keep DIR]

Writes seeded traces into a temporary folder: an Azure-style CSV (timestamp, ContextTokens,
GeneratedTokens) and a Mooncake-style JSONL (timestamp, input_length, output_length and a
hash_ids list of four block ids), 10^6 and 10^7 rows each. Each is read by
`workload.reader.read_trace` in a child process of its own, after untimed reads of the two
small example traces (imports, both kernels loaded from numba's cache), so its peak RSS is
that process's alone; `over base` is the peak less the child's RSS before the timed read. Rows/s counts the whole read:
the file's bytes, their sha256, parsing and validation, the int64 arrays.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "traces"
SMALL = (EXAMPLES / "azure-conv-sample.csv", EXAMPLES / "mooncake-conversation-sample.jsonl")
CHUNK = 500_000  # rows written at a time

# peak RSS from VmHWM: ru_maxrss of a child starts at its parent's RSS at fork on Linux
CHILD = """
import json, resource, sys, time
from opweave_planner.workload.reader import read_trace

def peak_kib():
    try:
        with open("/proc/self/status") as fh:
            return next(int(ln.split()[1]) for ln in fh if ln.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

read_trace(sys.argv[1]), read_trace(sys.argv[2])
base = peak_kib()
if sys.argv[3] != "-":
    t = time.perf_counter()
    tr = read_trace(sys.argv[3])
    dt = time.perf_counter() - t
    print(json.dumps({"rows": tr.rows, "s": dt, "sum": int(tr.prompt.sum() + tr.output.sum())}))
print(json.dumps({"base_kib": base, "peak_kib": peak_kib()}))
"""


def lengths(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Mooncake-like lengths: lognormal prompts (mean about 12k), geometric outputs (mean 340)."""
    prompt = np.minimum(np.rint(rng.lognormal(9.0, 0.9, n)), 1 << 20).astype(np.int64)
    return prompt, rng.geometric(1 / 340, n).astype(np.int64)


def write_csv(path: Path, prompt: np.ndarray, output: np.ndarray) -> None:
    with path.open("w", encoding="ascii", newline="") as fh:
        fh.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for lo in range(0, prompt.size, CHUNK):
            fh.write("".join(f"2023-11-16 18:{(i // 60) % 60:02d}:{i % 60:02d}.{i % 10_000_000:07d},{p},{o}\n"
                             for i, p, o in zip(range(lo, lo + CHUNK), prompt[lo:lo + CHUNK].tolist(),
                                                output[lo:lo + CHUNK].tolist())))


def write_jsonl(path: Path, prompt: np.ndarray, output: np.ndarray) -> None:
    with path.open("w", encoding="ascii", newline="") as fh:
        for lo in range(0, prompt.size, CHUNK):
            fh.write("".join(f'{{"timestamp": {i * 3}, "input_length": {p}, "output_length": {o}, '
                             f'"hash_ids": [{i}, {i + 1}, {i + 2}, {i + 3}]}}\n'
                             for i, p, o in zip(range(lo, lo + CHUNK), prompt[lo:lo + CHUNK].tolist(),
                                                output[lo:lo + CHUNK].tolist())))


def child(path: Path | str) -> dict:
    """Run CHILD on `path` ('-': no timed read); its JSON lines merged."""
    out = subprocess.run([sys.executable, "-c", CHILD, *map(str, SMALL), str(path)], capture_output=True,
                         text=True, check=True)
    merged: dict = {}
    for line in out.stdout.splitlines():
        merged.update(json.loads(line))
    return merged


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1000000,10000000", help="comma-separated row counts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", help="write the traces into this folder and keep them")
    a = ap.parse_args(argv)
    sizes = [int(s) for s in a.rows.split(",")]
    base = child("-")
    print(f"child process after imports and the small reads: peak RSS {base['peak_kib'] / 1024:.0f} MiB")
    print(f"{'trace':<10}{'rows':>12}{'file MiB':>10}{'read s':>9}{'rows/s':>13}{'MiB/s':>8}"
          f"{'peak RSS MiB':>14}{'over base':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(a.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for n in sizes:
            prompt, output = lengths(np.random.default_rng(a.seed), n)
            for kind, writer in (("csv", write_csv), ("jsonl", write_jsonl)):
                path = folder / f"trace-{n}.{kind}"
                writer(path, prompt, output)
                got = child(path)
                assert got["rows"] == n and got["sum"] == int(prompt.sum() + output.sum()), got
                mib = path.stat().st_size / 2**20
                print(f"{kind:<10}{n:>12,}{mib:>10.0f}{got['s']:>9.2f}{n / got['s']:>13,.0f}"
                      f"{mib / got['s']:>8.0f}{got['peak_kib'] / 1024:>14.0f}"
                      f"{(got['peak_kib'] - got['base_kib']) / 1024:>11.0f}", flush=True)
                if not a.keep:
                    path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
