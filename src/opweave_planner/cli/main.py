"""`opweave-plan`: parse arguments, call the library API, render. Nothing else.

Heavy imports (numpy, numba, the search) happen inside command bodies so that
`--help` stays fast.
"""

from __future__ import annotations

import sys

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,
    pretty_exceptions_enable=False,
    help="Plan the cheapest operator-level disaggregated decode deployment that meets a TPOT SLO.",
)


def run() -> None:
    """Console-script entry: map library errors to one stderr line and an exit code."""
    from opweave_planner.errors import UserError

    try:
        app(standalone_mode=False)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:  # click usage errors and friends
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if isinstance(exc, click.exceptions.Abort):
            sys.exit(1)
        raise


@app.command()
def inspect(
    model: str = typer.Option(..., "--model", "-m", help="Bundled model name or path to a Hugging Face config.json"),
    blocks: bool = typer.Option(False, "--blocks", help="Also print the partition block, sub-blocks and template counts"),
    as_json: bool = typer.Option(False, "--json", help="Emit JSON instead of a table"),
) -> None:
    """Parameters, weight bytes, KV/state per request and the layer pattern of a model."""
    from opweave_planner import api, report

    info = api.inspect_model(model, blocks=blocks)
    report.emit_json(info) if as_json else report.render_inspect(info)


@app.command()
def gpus(
    catalog: str = typer.Option(None, "--catalog", help="TOML/JSON file adding or overriding GPU types"),
    prices: str = typer.Option(None, "--prices", help="TOML/JSON object: GPU id -> USD per GPU-hour"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """List the GPU catalog in effect (after --catalog and --prices)."""
    from opweave_planner import api, report

    hw = api.gpu_catalog(catalog, prices)
    report.emit_json(hw.model_dump()) if as_json else report.render_gpus(hw)
