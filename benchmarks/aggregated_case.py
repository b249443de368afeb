"""Both deployment modes on docs/deployment.md's qwen3-30b-a3b case (ISL 7,680 / OSL 1,024, TPOT
30 ms, TTFT 1 s, 20,000 output tokens/s, H100), the aggregated answer per (chunk, TP), and which
mode wins as the prompt length and the SLOs move. Markdown tables.

    PYTHONPATH=src python benchmarks/aggregated_case.py [--sweep]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from opweave_planner import aggregated as agg
from opweave_planner import api
from opweave_planner.compile import compile_request
from opweave_planner.deployment import replayed_arrivals
from opweave_planner.inputs.model import load_model
from opweave_planner.structure.operators import build_sequence

BASE = dict(model="qwen3-30b-a3b", slo="30ms", ctx="8704", prompt_len="7680", output_len="1024", gpus="h100",
            target_tokens_per_s=20000, ttft="1s")
SWEEP = (  # (label, overrides)
    ("ISL 7,680, TPOT 30 ms, TTFT 1 s", {}),
    ("ISL 7,680, TPOT 50 ms, TTFT 1 s", dict(slo="50ms")),
    ("ISL 7,680, TPOT 30 ms, TTFT 300 ms", dict(ttft="300ms")),
    ("ISL 1,024, TPOT 30 ms, TTFT 1 s", dict(ctx="2048", prompt_len="1024")),
    ("ISL 1,024, TPOT 50 ms, TTFT 1 s", dict(ctx="2048", prompt_len="1024", slo="50ms")),
)


def _modes(doc) -> str:
    d = doc.deployment
    a = d.aggregated
    disagg = (f"{d.gpus_total} + {d.prefill.gpus} = {d.gpus_total + d.prefill.gpus} GPUs, "
              f"{d.usd_per_hour_all_in:.2f} USD/h")
    aggr = "none" if a is None else (f"{a.replicas}x TP{a.tensor_parallel} B={a.batch} chunk {a.chunk_tokens} = "
                                     f"{a.gpus} GPUs, {a.usd_per_hour:.2f} USD/h (binds {a.binding})")
    return f"{disagg} | {aggr} | {d.mode}"


def per_chunk(req, doc, tpot_at: float | None) -> None:
    """The cheapest aggregated deployment at each (chunk, TP), TPOT held at `tpot_at` (None: the
    plan's, the TTFT percentile with --ctx)."""
    tpot_at = req.ttft_at if tpot_at is None else tpot_at
    arr, rate, mean_out = replayed_arrivals(doc, req, compile_request(req, api.gpu_catalog()))
    out = arr.outputs if arr.outputs is not None else np.full(arr.prompts.shape, round(mean_out), dtype=np.int64)
    cands = agg.candidates(req, build_sequence(load_model(req.model)), api.gpu_catalog(),
                           doc.workload.context_tokens, int(arr.prompts.max()))
    print(f"| chunk | TP | B | replicas | GPUs | pure step at B (ms) | p{tpot_at:g} TPOT (ms) | mean TPOT (ms) | "
          f"p{req.ttft_at:g} TTFT (ms) | mixed steps | USD/h |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for chunk in sorted({c.chunk for c in cands}):
        for tp in sorted({c.tp for c in cands}):
            sub = [c for c in cands if c.chunk == chunk and c.tp == tp]
            got = agg.choose(sub, arr.times_s, arr.prompts, out, rate, mean_out, req.slo_ms / 1e3, req.ttft / 1e3,
                             tpot_at, req.ttft_at) if sub else None
            if got is None:
                print(f"| {chunk} | {tp} | - | - | - | - | - | - | - | - | none within the budget |")
                continue
            c, f = got.candidate, got.figures
            print(f"| {chunk} | {tp} | {c.batch} | {f.replicas} | {f.replicas * tp} | "
                  f"{c.tables.decode_step_us(c.batch) / 1e3:.2f} | {f.tpot_s * 1e3:.2f} | {f.tpot_mean_s * 1e3:.2f} | "
                  f"{f.ttft_s * 1e3:.1f} | {f.mixed_share:.0%} | {got.usd_per_hour:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true", help="also the when-each-mode-wins sweep")
    ap.add_argument("--tpot-at", type=float, default=None,
                    help="what-if: hold this TPOT percentile in the per-chunk table (50: the median)")
    args = ap.parse_args()
    req = api.make_request(**BASE)
    t = time.perf_counter()
    doc = api.plan(req).plan
    print(f"auto, {time.perf_counter() - t:.1f} s: disaggregated | aggregated | chosen")
    print(_modes(doc))
    print()
    per_chunk(req, doc, args.tpot_at)
    if args.sweep:
        print()
        print("| case | disaggregated | aggregated | chosen |")
        print("|---|---|---|---|")
        for label, over in SWEEP:
            d = api.plan(api.make_request(**{**BASE, **over})).plan
            print(f"| {label} | {_modes(d)} |")


if __name__ == "__main__":
    main()
