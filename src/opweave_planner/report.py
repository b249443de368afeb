"""Rendering: rich tables for people, orjson for machines. No computation here."""

from __future__ import annotations

import sys
from typing import Any

import orjson


def dumps(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, 2-space indent, trailing newline (byte-stable)."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def emit_json(obj: Any) -> None:
    sys.stdout.buffer.write(dumps(obj))
    sys.stdout.flush()


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{n:,.0f} B"
        n /= 1024
    return f"{n}"


def render_inspect(info: dict[str, Any]) -> None:
    from rich.table import Table

    con = _console()
    t = Table(title=f"{info['model']} ({info['model_type']})", show_header=False)
    t.add_row("layers", str(info["layers"]))
    t.add_row("total parameters", f"{info['total_params'] / 1e9:,.2f} B")
    t.add_row("active parameters / token", f"{info['active_params'] / 1e9:,.2f} B")
    t.add_row("weight bytes", human_bytes(info["weight_bytes"]))
    for ctx, b in info["kv_bytes_per_request"].items():
        t.add_row(f"KV/state per request @ {int(ctx) // 1024}k", human_bytes(b))
    f = info["kv_formula"]
    parts = [f"{f['bytes_per_context_token_unbounded']:,.0f} B x ctx"]
    parts += [f"{b:,.0f} B x min(ctx, {w})" for w, b in f["windowed_layers"].items()]
    if f["fixed_state_bytes"]:
        parts.append(f"{f['fixed_state_bytes']:,.0f} B fixed state")
    t.add_row("KV/state formula", " + ".join(parts))
    lp = info["layer_pattern"]
    if lp["prefix"]:
        t.add_row("prefix", lp["prefix"])
    t.add_row("block", f"({lp['block']}) x {lp['blocks']}")
    if lp["tail"]:
        t.add_row("truncated tail", lp["tail"])
    t.add_row("decode operators", str(info["operators"]))
    con.print(t)
    if "partition" in info:
        p = info["partition"]
        bt = Table(title="partition block and sub-block templates (cyclic, C(N, K))")
        for col in ("L_sub", "N ops", "K=1", "K=2", "K=3"):
            bt.add_column(col, justify="right")
        for s in p["subblocks"]:
            bt.add_row(str(s["layers"]), str(s["operators"]), *[str(v) for v in s["templates"].values()])
        con.print(f"prefix {p['prefix_layers']} layers, block {p['block_layers']} layers x "
                  f"{p['full_blocks']}, truncated tail {p['tail_layers']} layers")
        con.print(bt)


def render_gpus(hw) -> None:
    from rich.table import Table

    t = Table(title="GPU catalog in effect")
    for col in ("id", "name", "memory GB", "bandwidth GB/s", "BF16 TFLOPS", "USD/GPU-h", "GPUs/node"):
        t.add_column(col)
    for g in hw.gpus:
        t.add_row(g.id, g.name, f"{g.memory_gb:g}", f"{g.bandwidth_gbps:,g}", f"{g.bf16_tflops:,g}",
                  f"{g.price_per_hour:.2f}", str(g.gpus_per_node))
    con = _console()
    con.print(t)
    n = hw.network
    con.print(f"network: {n.inter_node_gbps:g} GB/s, {n.inter_node_latency_us:g} us latency between nodes")


def render_plan_summary(plan) -> None:
    """A one-screen summary of a plan on stderr."""
    from rich.table import Table

    con = _console(stderr=True)
    con.print(f"{plan.model} @ {plan.workload.context_tokens} tokens, SLO {plan.workload.tpot_slo_ms:g} ms, "
              f"policy {plan.policy}: {plan.usd_per_million_tokens:.4f} USD/M tokens, TPOT "
              f"{plan.tpot_ms:.2f} ms, {plan.gpus_total} GPUs, {plan.num_stages} stages, "
              f"B={plan.global_batch}, mu={plan.microbatches}")
    t = Table()
    for col in ("owner", "gpu", "TP", "EP", "replicas", "resident batch", "microbatch", "stages", "busy"):
        t.add_column(col, justify="right")
    for o in plan.owners:
        t.add_row(str(o.index), o.gpu, str(o.tensor_parallel), str(o.expert_parallel), str(o.replicas),
                  str(o.resident_batch), str(o.microbatch), str(len(o.stage_positions)), f"{o.busy_fraction:.0%}")
    con.print(t)


def render_profile_table(info: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(title=f"{info['model']} on {info['gpu']} TP{info['tensor_parallel']} "
                    f"@ {info['context_tokens']} tokens: latency in µs [source]")
    t.add_column("operator (first of its kind)", no_wrap=True)
    t.add_column("x", justify="right")
    for mb in info["microbatches"]:
        t.add_column(f"b={mb}", justify="right")
    short = {"measured": "M", "interpolated": "I", "clamped": "C", "fitted": "F", "roofline": "R"}
    for r in info["operators"]:
        t.add_row(r["operator"].removeprefix("layers."), str(r["count"]),
                  *[f"{v:,.1f} {short[s]}" for v, s in zip(r["latency_us"], r["source"], strict=True)])
    t.add_row("decode step (ms)", "", *[f"{v:.3f}" for v in info["decode_step_ms"]])
    con = _console()
    con.print(t)
    con.print("sources: M measured, I interpolated, C clamped at a table edge, F fitted roofline, R default roofline")
    if info["not_measured_kinds"]:
        con.print(f"not (fully) measured: {', '.join(info['not_measured_kinds'])}")
