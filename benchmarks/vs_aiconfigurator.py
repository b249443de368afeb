"""Our colocated decode-step (and, with --prefill, prefill) latency against aiconfigurator's.

Both sides are built on the same measured database (aiconfigurator-core 0.12.0,
vLLM backend); the comparison isolates how each turns kernel tables into a
decode step. For every grid point that fits in memory by our budget
(`latency.memory.usable_bytes`), it runs

    aiconfigurator cli estimate --estimate-mode static_gen --backend vllm
        --model-path <config dir> --system <h100_sxm|a100_sxm|l40s>
        --isl <ctx> --osl 2 --batch-size <b> --tp-size <tp> [--moe-tp-size <tp>]

and compares its TPOT with `api.profile_table(model, gpu, tp, ctx)`'s decode
step at that batch (error = ours / theirs - 1). aiconfigurator is not a
dependency: without it the script says so and exits 0. Results (with
aiconfigurator's per-op breakdown of each point) are cached in
``benchmarks/results/vs_aiconfigurator.json``; ``--table`` prints the summary
from the cache only.

With ``--prefill`` it compares our one-pass prefill (`latency.prefill.prefill`, chunk 0)
with ``aiconfigurator cli estimate --estimate-mode static_ctx`` (its TTFT: the context phase
of one batch) per (model, GPU, TP, ISL), batch 1, cached in
``benchmarks/results/vs_aiconfigurator_prefill.json``.

With ``--deployment`` it compares whole deployments on docs/deployment.md's qwen3-30b-a3b case
(``--sweep``: every case of ``aggregated_case.py --sweep``): ours disaggregated and aggregated
(`api.plan`) against a fresh ``aiconfigurator cli recommend`` of both modes, GPUs, USD/h at our
catalog's price, TTFT, TPOT and tokens/s/GPU in one table (``aic_deployment.py``). Without
aiconfigurator (or with ``--table``) it reads the answers recorded in
``benchmarks/results/vs_aiconfigurator_deployment.json``.

    pip install aiconfigurator   # 0.12.0, into any environment; --aic points at its CLI
    python benchmarks/vs_aiconfigurator.py [--aic PATH] [--table] [--prefill]
    PYTHONPATH=src python benchmarks/vs_aiconfigurator.py --deployment [--sweep] [--aic-python PY] [--table]
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from opweave_planner import api
from opweave_planner.data import shipped_dir
from opweave_planner.inputs.hardware import load_hardware
from opweave_planner.inputs.model import load_model
from opweave_planner.latency.lookup import kv_shard, weight_shard
from opweave_planner.latency.memory import usable_bytes
from opweave_planner.structure.operators import build_sequence

MODELS = ("llama-3.1-8b", "qwen3-32b", "llama-3.1-70b", "qwen3-30b-a3b")
GPUS = {"h100": "h100_sxm", "a100": "a100_sxm", "l40s": "l40s"}
TPS = (1, 2, 4, 8)
BATCHES = (1, 8, 32, 128)
CONTEXTS = (8192, 32768)
CACHE = Path(__file__).parent / "results" / "vs_aiconfigurator.json"
# prefill: aiconfigurator's static context phase (TTFT of one pass over the batch's prompts)
PREFILL_ISLS = (2048, 8192)
PREFILL_TPS = (1, 2, 4, 8)
PREFILL_CACHE = Path(__file__).parent / "results" / "vs_aiconfigurator_prefill.json"


def fits(model: str, gpu: str, tp: int, batch: int, ctx: int) -> bool:
    """Weights + KV of `batch` requests within our per-GPU budget."""
    g = load_hardware().resolve(gpu)
    seq = build_sequence(load_model(model))
    need = sum(weight_shard(op, tp) for op in seq.ops) + batch * sum(kv_shard(op, tp, ctx) for op in seq.ops)
    return need <= usable_bytes(g, tp)


#: estimate mode -> (its figure, that figure's key here, the per-op prefix in --detail time)
_MODES = {"static_gen": ("TPOT", "tpot_ms", "generation_"), "static_ctx": ("TTFT", "ttft_ms", "context_")}


def run_aic(aic: str, model_dir: Path, system: str, tp: int, batch: int, ctx: int, moe: bool,
            mode: str = "static_gen") -> dict:
    """aiconfigurator's static estimate: decode TPOT (static_gen) or the TTFT of one context
    pass (static_ctx), with its per-op split."""
    figure, key, prefix = _MODES[mode]
    cmd = [aic, "cli", "estimate", "--model-path", str(model_dir), "--system", system,
           "--backend", "vllm", "--estimate-mode", mode, "--isl", str(ctx), "--osl", "2",
           "--batch-size", str(batch), "--tp-size", str(tp), "--detail", "time"]
    if moe:
        cmd += ["--moe-tp-size", str(tp), "--moe-ep-size", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600).stdout
    m = re.search(rf"{figure}:\s+([\d.]+) ms", out)
    ops = {name: float(ms) for name, ms in re.findall(rf"^\s+{prefix}(\w+)\s+([\d.]+) ms", out, re.M)}
    return {key: float(m.group(1)) if m else None, "ops_ms": ops}


def prefill_fits(model: str, gpu: str, tp: int, batch: int, isl: int) -> bool:
    """The weights and the batch's prompt KV within our per-GPU budget."""
    return fits(model, gpu, tp, batch, isl)


def _model_dirs(tmp: str):
    """(model, its config folder for aiconfigurator, whether it is MoE) for every compared model."""
    for model in MODELS:
        mdir = Path(tmp) / model
        mdir.mkdir()
        (mdir / "config.json").write_bytes((shipped_dir("models") / f"{model}.json").read_bytes())
        yield model, mdir, any(op.kind == "moe_up" for op in build_sequence(load_model(model)).ops)


def collect_prefill(aic: str, cache: dict, batch: int = 1) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        for model, mdir, moe in _model_dirs(tmp):
            for (gpu, system), tp, isl in itertools.product(GPUS.items(), PREFILL_TPS, PREFILL_ISLS):
                key = f"{model}|{gpu}|{tp}|{batch}|{isl}"
                if key in cache or not prefill_fits(model, gpu, tp, batch, isl):
                    continue
                cache[key] = {"aic": run_aic(aic, mdir, system, tp, batch, isl, moe, "static_ctx")}
                PREFILL_CACHE.write_text(json.dumps(cache, indent=1, sort_keys=True))
    return cache


def ours(model: str, gpu: str, tp: int, batch: int, ctx: int) -> dict:
    info = api.profile_table(model, gpu, tp, ctx, microbatches=(batch,))
    by_kind: dict[str, float] = {}
    for row in info["operators"]:
        by_kind[row["kind"]] = by_kind.get(row["kind"], 0.0) + row["latency_us"][0] * row.get("count", 1) / 1e3
    return {"step_ms": info["decode_step_ms"][0], "ops_ms": by_kind}


def collect(aic: str, cache: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        for model, mdir, moe in _model_dirs(tmp):
            for (gpu, system), tp, batch, ctx in itertools.product(GPUS.items(), TPS, BATCHES, CONTEXTS):
                key = f"{model}|{gpu}|{tp}|{batch}|{ctx}"
                if key in cache or not fits(model, gpu, tp, batch, ctx):
                    continue
                cache[key] = {"aic": run_aic(aic, mdir, system, tp, batch, ctx, moe)}
                CACHE.write_text(json.dumps(cache, indent=1, sort_keys=True))
    return cache


def summary(cache: dict) -> list[tuple]:
    rows = []
    for key, rec in sorted(cache.items()):
        theirs = rec["aic"]["tpot_ms"]
        if not theirs:
            continue
        model, gpu, tp, batch, ctx = key.split("|")
        mine = ours(model, gpu, int(tp), int(batch), int(ctx))
        rows.append((model, gpu, int(tp), int(batch), int(ctx), mine["step_ms"], theirs,
                     mine["step_ms"] / theirs - 1.0, mine["ops_ms"], rec["aic"]["ops_ms"]))
    return rows


def ours_prefill(model: str, gpu: str, tp: int, batch: int, isl: int) -> dict:
    """Our one-pass prefill (`--chunk-tokens 0`, as aiconfigurator's static context phase)."""
    from opweave_planner.latency.prefill import prefill

    g = load_hardware().resolve(gpu)
    est = prefill(build_sequence(load_model(model)), g, tp, isl, batch, 0)
    return {"prefill_ms": est.prefill_ms, "ops_ms": {str(k): v for k, v in est.breakdown_ms.items()},
            "measured_share": est.measured_share}


def prefill_summary(cache: dict) -> list[tuple]:
    rows = []
    for key, rec in sorted(cache.items()):
        theirs = rec["aic"]["ttft_ms"]
        if not theirs:
            continue
        model, gpu, tp, batch, isl = key.split("|")
        mine = ours_prefill(model, gpu, int(tp), int(batch), int(isl))
        rows.append((model, gpu, int(tp), int(batch), int(isl), mine["prefill_ms"], theirs,
                     mine["prefill_ms"] / theirs - 1.0, mine["ops_ms"], rec["aic"]["ops_ms"]))
    return rows


def print_prefill_table(rows: list[tuple]) -> None:
    if not rows:
        print("no cached prefill points")
        return
    err = np.array([abs(r[7]) for r in rows])
    signed = np.array([r[7] for r in rows])
    print(f"prefill points {len(rows)}: |error| median {100 * np.median(err):.1f}%  "
          f"p90 {100 * np.percentile(err, 90):.1f}%  max {100 * err.max():.1f}%; "
          f"signed median {100 * np.median(signed):+.1f}%")
    for label, pick in ([(g, lambda r, g=g: r[1] == g) for g in GPUS]
                        + [(m, lambda r, m=m: r[0] == m) for m in MODELS]
                        + [(f"isl {i}", lambda r, i=i: r[4] == i) for i in PREFILL_ISLS]):
        e = np.array([abs(r[7]) for r in rows if pick(r)])
        if e.size:
            print(f"  {label}: n={e.size} median {100 * np.median(e):.1f}% p90 {100 * np.percentile(e, 90):.1f}%"
                  f" max {100 * e.max():.1f}%")
    print("every point (ours vs aiconfigurator, ms):")
    for r in rows:
        print(f"  {r[0]} {r[1]} tp{r[2]} b{r[3]} isl{r[4]}: {r[5]:.2f} vs {r[6]:.2f} ({100 * r[7]:+.1f}%)")
    print("worst points, parts (ms):")
    for r in sorted(rows, key=lambda r: -abs(r[7]))[:5]:
        print(f"  {r[0]} {r[1]} tp{r[2]} isl{r[4]} {100 * r[7]:+.1f}%")
        print(f"    ours: {', '.join(f'{k} {v:.2f}' for k, v in sorted(r[8].items(), key=lambda kv: -kv[1])[:7])}")
        print(f"    aic:  {', '.join(f'{k} {v:.2f}' for k, v in sorted(r[9].items(), key=lambda kv: -kv[1])[:9])}")


def peer_moe_floor_ms(model: str, gpu: str, tp: int, batch: int) -> float:
    """Speed-of-light time of one step's fused MoE kernels (every MoE layer): the fewest expert
    weights `batch` tokens can touch (top-k per layer, the most skewed routing) over DRAM
    bandwidth, or the FLOPs over peak. A what-if floor for the peer's MoE rows, which
    aiconfigurator's default (silicon) mode reads raw; 0 for a dense model."""
    from opweave_planner.latency import roofline as rf

    spec, g = load_model(model), load_hardware().resolve(gpu)
    total = 0.0
    for layer in spec.layers:
        m = layer.mlp
        if m is None or m.kind != "moe":
            continue
        nbytes, flops = rf.moe_work(batch, spec.hidden_size, m.expert_intermediate, m.top_k, m.n_experts, tp,
                                    dtype=spec.expert_weight_dtype, routing="power-law")
        total += float(rf.sol_us(nbytes, flops, g.bandwidth_gbps, g.bf16_tflops)) / 1e3
    return total


def _stats(errors) -> str:
    e = np.abs(np.asarray(errors))
    return (f"|error| median {100 * np.median(e):.1f}%  p90 {100 * np.percentile(e, 90):.1f}%  "
            f"max {100 * e.max():.1f}%")


def print_table(rows: list[tuple]) -> None:
    # what-if: the peer's fused MoE floored at its speed of light (the peer reads it raw)
    floored = []
    for r in rows:
        moe = r[9].get("moe", 0.0)
        floor = peer_moe_floor_ms(r[0], r[1], r[2], r[3]) if moe else 0.0
        floored.append(r[5] / (r[6] + max(0.0, floor - moe)) - 1.0)
    raised = sum(1 for r, f in zip(rows, floored, strict=True) if f != r[7])
    err = np.array([abs(r[7]) for r in rows])
    signed = np.array([r[7] for r in rows])
    print(f"points {len(rows)}: |error| median {100 * np.median(err):.1f}%  p90 {100 * np.percentile(err, 90):.1f}%"
          f"  max {100 * err.max():.1f}%; signed median {100 * np.median(signed):+.1f}%")
    for gpu in GPUS:
        e = np.array([abs(r[7]) for r in rows if r[1] == gpu])
        if e.size:
            print(f"  {gpu}: n={e.size} median {100 * np.median(e):.1f}% p90 {100 * np.percentile(e, 90):.1f}%"
                  f" max {100 * e.max():.1f}%")
    for model in MODELS:
        e = np.array([abs(r[7]) for r in rows if r[0] == model])
        if e.size:
            print(f"  {model}: n={e.size} median {100 * np.median(e):.1f}% p90 {100 * np.percentile(e, 90):.1f}%"
                  f" max {100 * e.max():.1f}%")
    print(f"what-if, aiconfigurator's fused MoE floored at speed of light (raises it at {raised} points): "
          f"{_stats(floored)}")
    print("worst points (ours vs aiconfigurator, ms):")
    for r in sorted(rows, key=lambda r: -abs(r[7]))[:10]:
        print(f"  {r[0]} {r[1]} tp{r[2]} b{r[3]} ctx{r[4]}: {r[5]:.3f} vs {r[6]:.3f} ({100 * r[7]:+.1f}%)")
        print(f"    ours: {', '.join(f'{k} {v:.3f}' for k, v in sorted(r[8].items(), key=lambda kv: -kv[1])[:6])}")
        print(f"    aic:  {', '.join(f'{k} {v:.3f}' for k, v in sorted(r[9].items(), key=lambda kv: -kv[1])[:6])}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aic", default=shutil.which("aiconfigurator"), help="aiconfigurator executable")
    ap.add_argument("--table", action="store_true", help="summarise the cache, run nothing")
    ap.add_argument("--prefill", action="store_true",
                    help="prefill latency (static context phase) per (model, GPU, TP, ISL) instead of decode")
    ap.add_argument("--deployment", action="store_true",
                    help="whole deployments (GPUs, USD/h, TTFT, TPOT, tokens/s/GPU) on the qwen3-30b-a3b case")
    ap.add_argument("--aic-python", default=None,
                    help="with --deployment: a Python that has aiconfigurator (e.g. a separate venv's)")
    ap.add_argument("--sweep", action="store_true", help="with --deployment: every aggregated_case.py --sweep case")
    args = ap.parse_args(argv)
    if args.deployment:
        import aic_deployment

        aic_deployment.main(args.aic, args.aic_python, args.sweep, args.table)
        return
    if args.prefill:
        cache = json.loads(PREFILL_CACHE.read_text()) if PREFILL_CACHE.is_file() else {}
        if not args.table:
            if not args.aic:
                print("aiconfigurator is not installed (pip install aiconfigurator); nothing compared")
                return
            cache = collect_prefill(args.aic, cache)
        print_prefill_table(prefill_summary(cache))
        return
    cache = json.loads(CACHE.read_text()) if CACHE.is_file() else {}
    if not args.table:
        if not args.aic:
            print("aiconfigurator is not installed (pip install aiconfigurator); nothing compared")
            return
        cache = collect(args.aic, cache)
    print_table(summary(cache))


if __name__ == "__main__":
    main()
