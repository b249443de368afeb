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
    help="Kernel latency profiles: import measured tables.",
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
