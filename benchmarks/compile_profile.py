"""Where numba's cold compile of a plan goes: per kernel, signatures, typing, lowering, IR size.

Usage:  python benchmarks/compile_profile.py [--workload] [--top 25]
        python benchmarks/compile_profile.py --request "model=gemma-3-27b slo=60ms ctx=32k gpus=h100"
        PYTHONPATH=<other checkout>/src python benchmarks/compile_profile.py   # another tree

Plans one request with an empty NUMBA_CACHE_DIR (a temporary folder) and prints, from numba's
own records: the number of compiled signatures; per kernel its exclusive typing and lowering
time (lowering includes LLVM; nested compiles are subtracted from typing, where numba runs
them); per kernel the CPU seconds of LLVM's three steps (function passes on its own IR, the
module passes over its final module with every callee linked in, machine code), read by timing
numba's codegen methods; and the size of the LLVM IR of each Python entry point's final module
with its largest functions, each up to its closing brace (a callee's module is linked into
every caller, so this is what gets optimised and turned into machine code once per entry point). Without --workload the request is the cold-
compile request of bench_before_after.py (fixed context); with it, its workload request;
--request gives any request as PlanRequest field=value pairs (README command 1: "model=gemma-3-27b
slo=60ms ctx=32k"). The plan's time is printed as wall and as this process's CPU time.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import re
import sys
import tempfile
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", action="store_true", help="profile the workload request instead")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--request", help="PlanRequest fields as space-separated field=value pairs")
    ap.add_argument("--ir-out", help="also write each entry point's final-module IR to this folder")
    a = ap.parse_args(argv)
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp()
    from numba.core import event
    from numba.core.registry import CPUDispatcher

    stack: list[list] = []
    nested: dict[int, float] = collections.defaultdict(float)

    class Listener(event.Listener):
        def on_start(self, ev):
            stack.append([ev.data["dispatcher"], time.perf_counter()])

        def on_end(self, ev):
            _disp, t0 = stack.pop()
            if stack:
                nested[id(stack[-1][0])] += time.perf_counter() - t0

    event.register("numba:compile", Listener())
    llvm = _time_llvm_steps()
    inlined = _time_inlining()
    from opweave_planner import api

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if a.request:
        fields = dict(kv.split("=", 1) for kv in a.request.split())
        req = api.make_request(**fields)
    elif a.workload:
        req = api.make_request("gemma-3-27b", "60ms", gpus="h100", scale_ctx="32k",
                               workload=os.path.join(root, "examples", "traces", "mooncake-conversation-sample.jsonl"))
    else:
        req = api.make_request("llama-3.1-8b", "60ms", "8k", gpus="h100", policy="colocated", max_gpus=8)
    t0, c0 = time.perf_counter(), time.process_time()
    api.plan(req)
    print(f"plan with an empty cache: {time.perf_counter() - t0:.2f} s wall, {time.process_time() - c0:.2f} s CPU")
    rows, entries = [], []
    sigs = 0
    for obj in gc.get_objects():
        if not (isinstance(obj, CPUDispatcher) and obj.overloads):
            continue
        ours = obj.py_func.__module__.startswith("opweave_planner")
        name = f"{obj.py_func.__module__.split('.')[-1]}.{obj.py_func.__qualname__}"
        typing = lowering = 0.0
        for cres in obj.overloads.values():
            sigs += ours
            for times in cres.metadata.get("pipeline_times", {}).values():
                for key, t in times.items():
                    if "type_inference" in key:
                        typing += t.run
                    elif "native_lowering" in key:
                        lowering += t.run
            if not cres.fndesc.llvm_func_name.startswith("cpython") and not obj.targetoptions.get(
                    "no_cpython_wrapper") and ours:
                entries.append((name, cres.library.get_llvm_str()))
        rows.append((typing - nested[id(obj)] + lowering, typing - nested[id(obj)], lowering, name, len(obj.overloads)))
    print(f"compiled signatures of the package's kernels: {sigs}")
    print(f"{'exclusive s':>11} {'typing':>7} {'lowering':>8}  kernel (signatures)")
    for total, typ, low, name, n in sorted(rows, reverse=True)[:a.top]:
        print(f"{total:>11.2f} {typ:>7.2f} {low:>8.2f}  {name} ({n})")
    print(f"LLVM CPU s per kernel (all {sum(map(sum, llvm.values())):.2f} s): function passes, module passes, "
          "machine code")
    for name, (fp, mp, mc) in sorted(llvm.items(), key=lambda kv: -sum(kv[1]))[:a.top // 2]:
        print(f"  {fp:6.2f} {mp:6.2f} {mc:6.2f}  {name}")
    print(f"inlining (inline=True callees copied into callers; jit._share_inline_copies): "
          f"{sum(inlined.values()):.2f} s over {len(inlined)} callees, the largest: "
          + ", ".join(f"{name} {t:.2f} s" for name, t in sorted(inlined.items(), key=lambda kv: -kv[1])[:4]))
    print("entry points Python calls: final-module IR characters, largest functions")
    for name, ir in sorted(entries, key=lambda e: -len(e[1]))[:6]:
        funcs = sorted(((len(f), re.search(r'@"?([^"(]+)', f).group(1))
                        for f in re.findall(r"^define .*?^}$", ir, re.M | re.S)), reverse=True)[:4]
        print(f"  {name}: {len(ir):,}; " + ", ".join(f"{fn[:48]}… {n:,}" for n, fn in funcs))
    if a.ir_out:
        os.makedirs(a.ir_out, exist_ok=True)
        for name, ir in entries:
            with open(os.path.join(a.ir_out, f"{name}.ll"), "w") as f:
                f.write(ir)
    return 0


def _time_inlining() -> dict[str, float]:
    """Seconds numba's inliner spends copying each callee into its callers (InlineWorker.inline_ir)."""
    from numba.core import inline_closurecall

    spent: dict[str, float] = collections.defaultdict(float)
    worker = inline_closurecall.InlineWorker
    inline_ir = worker.inline_ir

    def timed(self, caller_ir, block, i, callee_ir, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inline_ir(self, caller_ir, block, i, callee_ir, *args, **kwargs)
        finally:
            spent[callee_ir.func_id.func_qualname] += time.perf_counter() - t0

    worker.inline_ir = timed
    return spent


def _time_llvm_steps() -> dict[str, list[float]]:
    """Wrap numba's three LLVM steps of a code library with CPU timers, keyed by the library's
    kernel (the name numba gives it); a profiling harness, not the package, so it may."""
    from numba.core import codegen

    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])

    def timed(cls, method, slot):
        inner = getattr(cls, method)

        def run(self, *args):
            t0 = time.process_time()
            try:
                return inner(self, *args)
            finally:
                out[self.name.split("$")[0]][slot] += time.process_time() - t0

        setattr(cls, method, run)

    timed(codegen.CPUCodeLibrary, "_optimize_functions", 0)
    timed(codegen.CPUCodeLibrary, "_optimize_final_module", 1)
    timed(codegen.JITCodeLibrary, "_finalize_specific", 2)
    return out


if __name__ == "__main__":
    sys.exit(main())
