"""`opweave-plan`: parse arguments, call the library API, render. Nothing else.

Heavy imports (numpy, numba, the search) happen inside command bodies so that
`--help` stays fast.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys

from opweave_planner.cli import heap

if os.path.basename(sys.argv[0]).split(".")[0].removesuffix("-script") == "opweave-plan":
    # the console script imports this module before `run` holds the collector: hold it already for
    # typer's and the request model's import (84 young collections, 0.03-0.06 s of a plan's CPU)
    heap.hold()

import typer
from typer.core import TyperGroup

from opweave_planner.cli.options import all_settings, with_settings


class _LazyGroup(TyperGroup):
    """The main group: a subcommand (`SUBCOMMANDS`) is imported and built when it is named."""

    def list_commands(self, ctx) -> list[str]:
        return [*(n for n in self.commands if n not in SUBCOMMANDS), *SUBCOMMANDS]

    def get_command(self, ctx, cmd_name: str):
        if cmd_name not in self.commands and cmd_name in SUBCOMMANDS:
            into = typer.Typer(rich_markup_mode=None)  # as `app`: built the way it builds them
            SUBCOMMANDS[cmd_name](into)
            built = typer.main.get_group(into).commands.get(cmd_name)
            if built is not None:
                self.commands[cmd_name] = built
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in SUBCOMMANDS:
            for name in SUBCOMMANDS:  # a typo: typer's "did you mean" reads every name
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)


app = typer.Typer(
    cls=_LazyGroup,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: full option names at any width, flags without a type
    help="Plan the cheapest operator-level disaggregated decode deployment that meets a TPOT SLO.",
)


@app.callback(invoke_without_command=True)
@with_settings(all_settings())
def main(
    cli: typer.Context,
    out: str = typer.Option(None, "--out", "-o", help="Write the plan JSON here (atomically) instead of stdout"),
    fmt: str = typer.Option("json", "--format", help="json | table (table goes to stderr as well)"),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Worker processes (same result as 1)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress, notices or summary on stderr"),
    version: bool = typer.Option(False, "--version", help="Print the version and exit", is_eager=True),
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of an internal error"),
    settings: dict | None = None,  # (filled by with_settings from PlanRequest)
) -> None:
    """Emit the cheapest plan whose TPOT meets the SLO (run with --model, --slo and --ctx, or
    --workload TRACE for request-length traffic: the SLO then holds at p95 step TPOT)."""
    if version:
        from opweave_planner import __version__

        print(f"opweave-planner {__version__}")
        raise typer.Exit(0)
    if cli.invoked_subcommand is not None:
        heap.settle()  # a subcommand collects as it always did
        return
    from opweave_planner.errors import UserError

    required = (("--model", "model"), ("--slo", "slo"), ("--ctx", "ctx"))
    missing = [flag for flag, name in required if settings[name] is None
               and not (name == "ctx" and settings["workload"] is not None)]
    if len(missing) == 3 and not any(v is not None for v in settings.values()):
        print(cli.get_help())
        raise typer.Exit(0)
    if missing:
        raise UserError(f"{', '.join(missing)} required; e.g. opweave-plan --model gemma-3-27b --slo 60ms --ctx 32k "
                        f"(or --workload TRACE instead of --ctx)")
    if fmt not in ("json", "table"):
        raise UserError(f"--format: '{fmt}' unknown; expected json or table")
    if jobs < 1:
        raise UserError("--jobs: expected a positive integer")
    from opweave_planner.cli.run_plan import run_plan

    run_plan(settings, out=out, fmt=fmt, jobs=jobs, quiet=quiet)


def run() -> None:
    """Console-script entry: every ending maps to one stderr line and a documented exit code."""
    from opweave_planner.cli.guard import run_cli

    heap.hold()  # until the search starts (cli/heap.py)
    run_cli(app, prog_name="opweave-plan")


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


@functools.cache
def _profiles_app() -> typer.Typer:
    """`profiles`, with its `show` (once per process: the sub-app is its module's)."""
    from opweave_planner.cli import profiles as profiles_cli

    @profiles_cli.app.command("show")
    def profiles_show(
        model: str = typer.Option(..., "--model", "-m"),
        gpu: str = typer.Option(..., "--gpu"),
        tp: int = typer.Option(1, "--tp"),
        context: str = typer.Option("32k", "--ctx"),
        ep: bool = typer.Option(False, "--ep", help="Experts split across the TP group"),
        profiles_dir: str = typer.Option(None, "--profiles"),
        backend: str = typer.Option("vllm", "--backend"),
        catalog: str = typer.Option(None, "--catalog", help="TOML/JSON file adding GPU types"),
        microbatches: str = typer.Option("1,4,16,64,256", "--microbatches", help="Microbatch sizes (comma list)"),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Per-operator latency across microbatch sizes, with where each number comes from."""
        from opweave_planner import api, report
        from opweave_planner.errors import UserError

        try:
            sizes = tuple(int(x) for x in microbatches.split(",") if x.strip())
        except ValueError:
            sizes = ()
        if not sizes or min(sizes) < 1 or max(sizes) > 1 << 16:
            raise UserError(f"--microbatches: '{microbatches}' must be positive integers up to 65536, e.g. 1,8,64")
        info = api.profile_table(model, gpu, tp, context, microbatches=sizes, moe_ep=ep,
                                 profiles_dir=profiles_dir, backend=backend, catalog=catalog)
        report.emit_json(info) if as_json else report.render_profile_table(info)

    profiles_cli.app.rich_markup_mode = None  # plain help like the rest (see `app`)
    return profiles_cli.app


def _command(module: str, attr: str, name: str, optional: bool = False, **kw):
    """Registers `cli.<module>.<attr>` as command `name`; an optional one whose module does not
    import (or lacks it) is left out."""

    def register(into: typer.Typer) -> None:
        try:
            mod = importlib.import_module(f"opweave_planner.cli.{module}")
        except ImportError:
            if optional:
                return
            raise
        if hasattr(mod, attr) or not optional:
            into.command(name, **kw)(getattr(mod, attr))

    return register


def _afd(into: typer.Typer) -> None:
    try:
        from opweave_planner.cli import afd
    except ImportError:
        return
    into.add_typer(afd.app, name="afd")


#: The subcommands, in the order help lists them after `inspect` and `gpus`: each registers on a
#: Typer only when it is named (or help lists them), so the main job never imports their modules
#: (0.16-0.19 s CPU of a plan: export's targets, afd's and compare's requests).
SUBCOMMANDS = {
    "profile": _command("profiles", "profile_cmd", "profile",
                        help="Measure a model's kernels on the local CUDA GPU (needs the profile extra: PyTorch)"),
    "schema": _command("contract", "schema_cmd", "schema"),
    "simulate": _command("contract", "simulate_cmd", "simulate"),
    "diff": _command("contract", "diff_cmd", "diff"),
    "regen": _command("contract", "regen_cmd", "regen"),
    "export": _command("export", "export_cmd", "export"),
    "theory": _command("theory", "theory_cmd", "theory", optional=True),
    "compare": _command("compare", "compare_cmd", "compare", optional=True),
    "profiles": lambda into: into.add_typer(_profiles_app(), name="profiles",
                                            help="Import, show and measure latency profiles"),
    "afd": _afd,
}
