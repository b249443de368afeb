"""`opweave-plan export PLAN --to TARGET --out DIR`: launch files for a serving runtime.

Command function only; `cli/main.py` registers it. The targets, their pins and the help that
lists them come from `export.registry` (light: the exporters load their inputs inside the
command body).
"""

from __future__ import annotations

import typer

from opweave_planner.export.registry import to_help, version_help


def export_cmd(
    plan: str = typer.Argument(..., help="Plan file (JSON) written by opweave-plan"),
    to: str = typer.Option(..., "--to", help=to_help()),
    out: str = typer.Option(..., "--out", "-o", help="Folder to write the launch files into"),
    runtime_version: str = typer.Option(None, "--runtime-version", help=version_help()),
    alternative: str = typer.Option(None, "--alternative",
                                    help="Export the plan file's alternative of this class instead "
                                         "(colocated, two_owner, single_gpu_type, optimum)"),
    model_id: str = typer.Option(None, "--model-id",
                                 help="Hugging Face repo or weights path to serve (default: the bundled "
                                      "model's repo)"),
    model: str = typer.Option(None, "--model", "-m",
                              help="Model name or config.json (default: the plan's model)"),
    node_label: list[str] = typer.Option([], "--node-label",
                                         help="GPU=VALUE: nvidia.com/gpu.product value of a GPU type "
                                              "(repeatable; Kubernetes targets)"),
    image: str = typer.Option(None, "--image", help="Container image (Kubernetes targets)"),
    catalog: str = typer.Option(None, "--catalog", help="TOML/JSON file adding GPU types"),
    deployment_mode: str = typer.Option(None, "--deployment-mode",
                                        help="aggregated or disaggregated: export that mode of a plan that "
                                             "searched both (default: the plan's deployment.mode)"),
) -> None:
    """Write launch scripts / manifests that run a plan on a serving runtime, plus a benchmark.

    Exit 0 written, 2 bad input, 3 the runtime cannot run the plan's shape (the reason and a
    runnable alternative are named). Writes are all or nothing; a file a previous export wrote and
    this one does not is removed only if it is unchanged (docs/export.md).
    """
    from opweave_planner.export import export_plan

    done = export_plan(plan, to, out, runtime_version=runtime_version, alternative=alternative,
                       model_id=model_id, model=model, node_labels=tuple(node_label), image=image,
                       catalog=catalog, deployment_mode=deployment_mode)
    alt = f" (alternative {done.alternative})" if done.alternative else ""
    typer.echo(f"{done.target} {done.version}{alt}: wrote {len(done.files)} files to {done.out}"
               + "".join(f"; {note}" for note in done.notes), err=True)
    if done.kept:
        typer.echo(f"note: kept {', '.join(done.kept)}: the previous export wrote them, but they "
                   f"have changed since, so they were not removed", err=True)
    for name in done.files:
        typer.echo(name)
