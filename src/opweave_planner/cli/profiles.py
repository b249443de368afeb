"""`opweave-plan profiles import` and `opweave-plan profile`: build profile folders.

Only typer and the standard library are imported here; the library modules
(numpy, pyarrow, torch) load inside the command bodies so `--help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Kernel latency profiles: import measured tables, time a prefill.",
)


@app.callback()
def _group() -> None:
    """Kernel latency profiles: import measured tables."""


@app.command("import")
def import_cmd(
    src_dir: Annotated[
        Path, typer.Argument(help="aiconfigurator 'systems' folder (or its parent).")
    ],
    out: Annotated[Path, typer.Option("--out", help="Profiles folder to write (e.g. profiles/).")],
    backend: Annotated[
        str, typer.Option("--backend", help="Serving backend's tables to convert.")
    ] = "vllm",
    gpus: Annotated[
        list[str] | None,
        typer.Option("--gpus", help="GPU ids to convert (h100, h200, a100, l40s); default: all."),
    ] = None,
) -> None:
    """Convert aiconfigurator parquet measurements into the project's profile format."""
    from opweave_planner.latency.importers import import_aiconfigurator

    wanted = [g for item in gpus or [] for g in item.split(",") if g]
    written = import_aiconfigurator(src_dir, out, backend=backend, gpus=wanted or None)
    total = sum(p.stat().st_size for p in written)
    typer.echo(f"wrote {len(written)} files ({total / 1e6:.2f} MB) under {out}")


def profile_cmd(
    out: Annotated[Path, typer.Option("--out", help="Profiles folder to write into.")],
    gpu: Annotated[str, typer.Option("--gpu", help="Short id for this GPU type, e.g. h20.")],
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="Measure the GEMM and attention shapes this model needs."),
    ] = None,
    tp: Annotated[
        list[int] | None,
        typer.Option("--tp", help="With --model: tensor-parallel degrees whose shard shapes to measure."),
    ] = None,
    gemm: Annotated[
        list[str] | None, typer.Option("--gemm", help="GEMM shape N:K per GPU (repeatable).")
    ] = None,
    attention: Annotated[
        list[str] | None,
        typer.Option(
            "--attention", help="Decode attention HEADS:KV_HEADS:HEAD_DIM[:WINDOW] (repeatable)."
        ),
    ] = None,
    allreduce_gpus: Annotated[
        list[int] | None,
        typer.Option(
            "--allreduce-gpus", help="All-reduce group sizes to time (needs that many GPUs)."
        ),
    ] = None,
    backend: Annotated[
        str, typer.Option("--backend", help="Backend folder name to write.")
    ] = "torch",
    device: Annotated[str, typer.Option("--device", help="'cuda' or 'cpu' (dry run).")] = "cuda",
    quick: Annotated[bool, typer.Option("--quick", help="Fewer batch/context points.")] = False,
    bandwidth_gbps: Annotated[
        float | None,
        typer.Option(
            "--bandwidth-gbps", help="Datasheet memory bandwidth (default: measured copy)."
        ),
    ] = None,
    peak_tflops: Annotated[
        float | None,
        typer.Option("--peak-tflops", help="Datasheet bf16 peak (default: measured GEMM)."),
    ] = None,
) -> None:
    """Measure GEMM, decode attention and all-reduce kernels with PyTorch on this machine."""
    from opweave_planner.latency.profiler import ProfilePlan, TorchRunner, parse_shapes, run_profile

    gemm_shapes = parse_shapes(gemm or ([] if model else ["4096:4096"]), (2,), "gemm")
    attn = tuple(
        s if len(s) == 4 else (*s, 0)
        for s in parse_shapes(attention or ([] if model else ["32:8:128"]), (3, 4), "attention")
    )
    if model:
        from opweave_planner.inputs.model import load_model
        from opweave_planner.latency.lookup import kernel_shapes
        from opweave_planner.structure.operators import build_sequence

        seq = build_sequence(load_model(model))
        g_set, a_set = dict.fromkeys(gemm_shapes), dict.fromkeys(attn)
        for degree in tp or [1]:
            g, a = kernel_shapes(seq, degree)
            g_set.update(dict.fromkeys(g))
            a_set.update(dict.fromkeys(a))
        gemm_shapes, attn = tuple(g_set), tuple(a_set)
    plan = ProfilePlan(
        gemm_shapes=gemm_shapes, attention_shapes=attn, allreduce_gpus=tuple(allreduce_gpus or ())
    )
    if quick:
        plan = ProfilePlan(
            gemm_shapes=gemm_shapes,
            attention_shapes=attn,
            allreduce_gpus=plan.allreduce_gpus,
            m_values=(1, 8, 64, 512),
            batches=(1, 8, 64),
            kv_lens=(128, 2048),
            message_bytes=(2**12, 2**20),
        )
    overrides: dict = {}
    if bandwidth_gbps:
        overrides["memory_bandwidth_gbps"] = bandwidth_gbps
    if peak_tflops:
        overrides["peak_tflops"] = {"bfloat16": peak_tflops}
    runner = TorchRunner(device=device, overrides=overrides)
    typer.echo(f"measuring {plan.n_kernels()} kernels on {device}")
    written = run_profile(plan, runner, out, gpu, backend=backend, progress=typer.echo)
    typer.echo(f"wrote {len(written)} files under {out / gpu}")


@app.command("prefill")
def prefill_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="Model name, HF id or config.json path.")],
    gpu: Annotated[str, typer.Option("--gpu", help="GPU type of the prefill group.")],
    prompt: Annotated[str, typer.Option("--prompt", help="Prompt length in tokens: 8k, 1.5k or 8192.")],
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size of the group (1, 2, 4, 8).")] = 1,
    batch: Annotated[int, typer.Option("--batch", help="Prompts prefilled together (arriving at once).")] = 1,
    chunk_tokens: Annotated[
        int | None,
        typer.Option("--chunk-tokens", help="Tokens per prefill step (vLLM max_num_batched_tokens); "
                     "0: one pass over every prompt; default: vLLM serve's default for the GPU."),
    ] = None,
    link_bandwidth: Annotated[
        str, typer.Option("--link-bandwidth", help="Link to the decode pool for the KV hand-off: GB/s or 100Gbps.")
    ] = "32",
    link_latency: Annotated[
        str, typer.Option("--link-latency", help="That link's latency: us or 0.02ms.")
    ] = "20",
    ep: Annotated[bool, typer.Option("--ep", help="Experts split across the TP group.")] = False,
    profiles_dir: Annotated[str | None, typer.Option("--profiles")] = None,
    backend: Annotated[str, typer.Option("--backend")] = "vllm",
    catalog: Annotated[str | None, typer.Option("--catalog", help="TOML/JSON file adding GPU types")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Time to prefill prompts on one (GPU, TP) group, chunked as the runtime chunks them, and
    the KV hand-off to the decode pool, with the source of every part."""
    from opweave_planner.errors import UserError
    from opweave_planner.inputs.hardware import load_hardware
    from opweave_planner.inputs.model import load_model
    from opweave_planner.inputs.units import parse_bandwidth_gbps, parse_latency_us, parse_tokens
    from opweave_planner.latency.prefill import prefill
    from opweave_planner.report import emit_json
    from opweave_planner.structure.operators import build_sequence

    tokens = parse_tokens(prompt, "--prompt")
    if not 1 <= tokens <= 1 << 21:
        raise UserError(f"--prompt: {tokens} tokens; expected 1 to 2097152")
    if not 1 <= batch <= 4096:
        raise UserError(f"--batch: {batch}; expected 1 to 4096 prompts")
    if chunk_tokens is not None and not 0 <= chunk_tokens <= 1 << 20:
        raise UserError(f"--chunk-tokens: {chunk_tokens}; expected 0 (one pass) to 1048576")
    bw = parse_bandwidth_gbps(link_bandwidth, "--link-bandwidth")
    lat = parse_latency_us(link_latency, "--link-latency")
    g = load_hardware(catalog).resolve(gpu, "--gpu")
    if tp not in (1, 2, 4, 8) or tp > g.gpus_per_node:
        raise UserError(f"--tp: {tp} not supported on {g.id}; expected 1, 2, 4 or 8 within a node")
    spec = load_model(model)
    est = prefill(build_sequence(spec), g, tp, tokens, batch, chunk_tokens, link_gbps=bw, link_latency_us=lat,
                  profiles_dir=profiles_dir, backend=backend, moe_ep=ep)
    out = {
        "model": spec.name, "gpu": g.id, "tensor_parallel": tp, "prompt_tokens": tokens, "batch": batch,
        "chunk_tokens": est.chunk_tokens, "steps": est.steps,
        "prefill_ms": round(est.prefill_ms, 4), "handoff_ms": round(est.handoff_ms, 4),
        "total_ms": round(est.total_ms, 4), "kv_bytes_per_request": int(est.kv_bytes_per_request),
        "measured_share": round(est.measured_share, 4),
        "breakdown": [{"operator": str(k), "ms": round(v, 4), "source": est.sources[k]}
                      for k, v in est.breakdown_ms.items()],
    }
    if as_json:
        emit_json(out)
        return
    mode = "one pass" if est.chunk_tokens == 0 else f"chunks of {est.chunk_tokens} tokens, {est.steps} steps"
    typer.echo(f"{spec.name} on {g.id} TP{tp}: {batch} x {tokens}-token prompt(s), {mode}")
    for row in out["breakdown"]:
        typer.echo(f"  {row['operator']:<16} {row['ms']:>10.3f} ms  [{row['source']}]")
    typer.echo(f"  prefill {est.prefill_ms:.3f} ms (measured share {100 * est.measured_share:.0f}%), KV hand-off "
               f"{est.handoff_ms:.3f} ms ({est.kv_bytes_per_request * batch / 1e9:.3f} GB at {bw:g} GB/s), "
               f"total {est.total_ms:.3f} ms")
