"""`opweave-plan compare`: every policy for every (context, SLO[, network]) cell.

Its options are generated from `compare.CompareRequest` (the swept settings) and `PlanRequest`
(the rest). Only typer, pydantic and the standard library are imported at module import time;
the search, rich and (optionally) matplotlib are imported inside the command.
Register with `app.command("compare")(compare_cmd)`.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import typer

from opweave_planner.cli.options import all_settings, build, with_settings
from opweave_planner.compare import CompareRequest

INFEASIBLE = "✗"


def _money(x: float | None) -> str:
    return INFEASIBLE if x is None else f"${x:.3f}"


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def _net_label(net: dict[str, Any]) -> str:
    if net.get("gbps") is None and net.get("latency_us") is None:
        return "default"
    b = "default" if net.get("gbps") is None else f"{net['gbps']:g}GB/s"
    la = "default" if net.get("latency_us") is None else f"{net['latency_us']:g}us"
    return f"{b} / {la}"


def render_compare(result: dict[str, Any], console=None) -> None:
    """Rich tables: cost per policy with ratios; Figure 10-11 metrics; hetero vs homogeneous."""
    from rich.table import Table

    from opweave_planner.report import console as wide_console

    con = console or wide_console()
    pols = result["policies"]
    sweep = len(result["networks"]) > 1 or any(v is not None for v in result["networks"][0].values())
    def cell_table(title: str) -> Table:
        """A table with one row per cell: context, SLO, (network), then one column per policy."""
        tab = Table(title=title)
        tab.add_column("ctx", justify="right")
        tab.add_column("SLO", justify="right")
        if sweep:
            tab.add_column("network")
        for p in pols:
            tab.add_column(p, justify="right")
        return tab

    t = cell_table(f"{result['model']} on {'+'.join(result['gpus'])}: USD per million output tokens")
    t.add_column("best baseline")
    t.add_column("opweave ×cheaper", justify="right")
    for c in result["cells"]:
        row = [c["context"], f"{c['slo_ms']:g} ms"] + ([_net_label(c["network"])] if sweep else [])
        row += [_money(c["policies"][p]["usd_per_million_tokens"]) for p in pols]
        row += [c["best_baseline"] or INFEASIBLE, _ratio(c["ratio"])]
        t.add_row(*row)
    con.print(t)

    m = cell_table("Plan shape (Figures 10-11): stages | inter-node MiB/token | price-weighted occupancy | per-GPU batch")
    for c in result["cells"]:
        row = [c["context"], f"{c['slo_ms']:g} ms"] + ([_net_label(c["network"])] if sweep else [])
        for p in pols:
            e = c["policies"][p]
            if not e["feasible"]:
                row.append(INFEASIBLE)
            else:
                row.append(f"{e['num_stages']} | {e['inter_node_mib_per_token']:.3g} | "
                           f"{100 * e['price_weighted_occupancy']:.0f}% | {e['per_gpu_batch']:.3g}")
        m.add_row(*row)
    con.print(m)

    if any("homogeneous" in c for c in result["cells"]):
        h = Table(title="Heterogeneous vs homogeneous opweave (Section 7.4), USD per million tokens")
        h.add_column("ctx", justify="right")
        h.add_column("SLO", justify="right")
        if sweep:
            h.add_column("network")
        h.add_column("+".join(result["gpus"]), justify="right")
        for g in result["gpus"]:
            h.add_column(f"{g} only", justify="right")
        h.add_column("hetero ×cheaper", justify="right")
        h.add_column("GPU mix")
        for c in result["cells"]:
            row = [c["context"], f"{c['slo_ms']:g} ms"] + ([_net_label(c["network"])] if sweep else [])
            ours = c["policies"]["opweave"]
            row.append(_money(ours["usd_per_million_tokens"]))
            row += [_money(c["homogeneous"][g]["usd_per_million_tokens"]) for g in result["gpus"]]
            row.append(_ratio(c["hetero_ratio"]))
            row.append(", ".join(f"{n}×{g}" for g, n in ours.get("gpu_mix", {}).items()) or INFEASIBLE)
            h.add_row(*row)
        con.print(h)
    infeasible = [(c, p) for c in result["cells"] for p in pols if not c["policies"][p]["feasible"]]
    for c, p in infeasible[:8]:
        con.print(f"{INFEASIBLE} {p} at ctx {c['context']}, SLO {c['slo_ms']:g} ms: {c['policies'][p]['reason']}")
    if len(infeasible) > 8:
        con.print(f"… {len(infeasible) - 8} more infeasible cells (see --json)")


def _pyplot():
    """matplotlib.pyplot on the file backend, or the one-line error that --plot needs it."""
    from opweave_planner.errors import UserError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot needs matplotlib, which is not installed; pip install matplotlib "
                        "(or drop --plot)") from None
    return plt


# fixed metadata, so the same comparison draws the same bytes (no date, no version stamp)
_METADATA = {"svg": {"Date": None, "Creator": None}, "pdf": {"CreationDate": None, "ModDate": None,
                                                             "Creator": None, "Producer": None},
             "png": {"Software": None}}


def frontier_series(result: dict[str, Any]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Per panel (context[, network]), per series (a policy on the GPU set, or opweave on one GPU
    type alone), the (TPOT SLO ms, USD per million tokens) points that are feasible, by SLO."""
    gpus = "+".join(result["gpus"])
    sweep = len(result["networks"]) > 1
    panels: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for c in result["cells"]:
        title = f"ctx {c['context']}" + (f", {_net_label(c['network'])}" if sweep else "")
        series = panels.setdefault(title, {})
        entries = [(f"{p} on {gpus}", c["policies"][p]) for p in result["policies"]]
        entries += [(f"opweave on {g} only", e) for g, e in (c.get("homogeneous") or {}).items()]
        for label, e in entries:
            points = series.setdefault(label, [])
            if e.get("feasible") and e.get("usd_per_million_tokens") is not None:
                points.append((float(c["slo_ms"]), float(e["usd_per_million_tokens"])))
    for series in panels.values():
        for points in series.values():
            points.sort()
    return panels


def plot_compare(result: dict[str, Any], path: str) -> None:
    """The cost-versus-TPOT frontier: for each TPOT SLO of the sweep, the cheapest plan of every
    policy and GPU set (needs matplotlib). Same result, same bytes (fixed metadata and SVG ids)."""
    plt = _pyplot()
    import matplotlib

    panels = frontier_series(result)
    with matplotlib.rc_context({"svg.hashsalt": "opweave-plan", "svg.fonttype": "path"}):
        fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
        for ax, (title, series) in zip(axes[0], panels.items()):
            for i, (label, points) in enumerate(series.items()):
                style = "-" if " only" not in label else "--"
                if points:
                    xs, ys = zip(*points)
                    ax.plot(xs, ys, style, marker="os^vD<>p"[i % 8], label=label)
                else:  # in the legend, so a series no SLO of the sweep admits is not silently missing
                    ax.plot([], [], style, label=f"{label} (infeasible)")
            slos = sorted({float(c["slo_ms"]) for c in result["cells"]})
            ax.set_xticks(slos)
            ax.set_xticklabels([f"{x:g}" for x in slos])
            ax.set_xlabel("TPOT SLO (ms)")
            ax.set_ylabel("USD per million output tokens")
            ax.set_ylim(bottom=0)
            ax.set_title(title, fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"{result['model']}: cheapest plan meeting each TPOT SLO", fontsize=11)
        fig.tight_layout()
        from pathlib import Path

        from opweave_planner.atomic import save_figure

        suffix = Path(path).suffix.lstrip(".").lower() or "png"
        try:
            save_figure(fig, path, metadata=_METADATA.get(suffix))
        finally:
            plt.close(fig)


# compare sweeps these itself (CompareRequest's lists and network grids; `policy` as --policies);
# every other PlanRequest setting is shared by all cells
SWEPT = (*(n for n in all_settings(model=CompareRequest) if n in all_settings()), "policy")


@with_settings(all_settings(model=CompareRequest), model=CompareRequest, into="sweep", first=True)
@with_settings(all_settings(exclude=SWEPT))
def compare_cmd(
    as_json: bool = typer.Option(False, "--json", help="Emit the comparison as one JSON document"),
    plot: str = typer.Option(None, "--plot", help="Also draw the cost-versus-TPOT frontier (every policy and "
                                                  "GPU set across the SLOs) to this image file, .svg/.png/.pdf "
                                                  "(needs the [plot] extra)"),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Independent searches run in parallel processes (same result as 1)"),
    ray: str = typer.Option(None, "--ray", help="Run the searches on a Ray cluster: ADDRESS, 'auto' or 'local' (needs the ray extra)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress on stderr"),
    sweep: dict | None = None,  # CompareRequest's settings, from with_settings
    settings: dict | None = None,  # every other PlanRequest setting, from with_settings
) -> None:
    """Compare opweave against colocated, AFD and CAD for every context and SLO (Figures 9-14)."""
    from opweave_planner.errors import UserError

    if jobs < 1:
        raise UserError("--jobs: expected a positive integer")
    if plot:
        _pyplot()  # before the searches, not after them
    from opweave_planner import compare as cmp

    settings = {k: v for k, v in (settings or {}).items() if v is not None}
    if settings.get("workload") is not None and "scale_ctx" in settings:
        # with a workload each compared context is a --scale-ctx target: one flag, not two
        if sweep["ctx"] is not None:
            raise UserError("--scale-ctx / --ctx: with --workload, compare rescales the trace to each --ctx "
                            "value; give the targets as --ctx only")
        sweep = {**sweep, "ctx": str(settings.pop("scale_ctx"))}
    req = build(CompareRequest, sweep)
    start = time.perf_counter()

    def progress(msg: str) -> None:
        if not quiet:  # one line per search, terminal or not (CI logs see progress too)
            print(msg, file=sys.stderr, flush=True)

    result = cmp.compare_grid(req, jobs=jobs, ray_address=ray, progress=progress, **settings)
    if plot:
        plot_compare(result, plot)
    if as_json:
        from opweave_planner.report import emit_json

        emit_json(result)
    else:
        render_compare(result)
    if not quiet:
        print(f"compare took {time.perf_counter() - start:.1f} s", file=sys.stderr)
