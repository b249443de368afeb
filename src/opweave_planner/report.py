"""Rendering: rich tables for people, canonical JSON on stdout for machines, progress on stderr.

No computation here, and nothing heavy at import time (numpy, numba and rich load
inside the functions) so that `opweave-plan --help` stays fast.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

WIDE = 400
"""Console width when the output is not a terminal: tables are never wrapped or cut in logs."""


def emit_json(obj: Any) -> None:
    from opweave_planner.plan.io import dumps  # canonical bytes are the plan file's

    sys.stdout.buffer.write(dumps(obj))
    sys.stdout.flush()


def console(stderr: bool = False, file=None):
    """A rich Console: terminal width on a terminal, `WIDE` and no soft wrapping in a pipe/file.

    An explicit COLUMNS in the environment still wins (tests and users can pin it).
    """
    from rich.console import Console

    con = Console(stderr=stderr, file=file, highlight=False)
    if not con.is_terminal and not os.environ.get("COLUMNS"):  # rich ignores an empty one
        con = Console(stderr=stderr, file=file, highlight=False, width=WIDE, soft_wrap=True)
    return con


_console = console  # the name callers used before


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
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="GPU catalog in effect")
    for col in ("id", "name", "memory GiB", "bandwidth GB/s", "BF16 TFLOPS", "USD/GPU-h", "GPUs/node"):
        t.add_column(col)
    for g in hw.gpus:  # ids and names come from user catalogs: no rich markup in them
        t.add_row(escape(g.id), escape(g.name), f"{g.memory_gb:.4g}", f"{g.bandwidth_gbps:,g}",
                  f"{g.bf16_tflops:,g}", f"{g.price_per_hour:.2f}", str(g.gpus_per_node))
    con = _console()
    con.print(t)
    n = hw.network
    con.print(f"network: {n.inter_node_gbps:g} GB/s, {n.inter_node_latency_us:g} us latency between nodes")


def _get(obj: Any, key: str, default: Any = None) -> Any:
    """Attribute or key: plans arrive as pydantic models or as parsed JSON."""
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def measured_share(stages: Iterable[Any]) -> float | None:
    """Latency-weighted mean of the stages' `measured_fraction` (weights: `latency_ms`).

    None when a stage lacks the field (plans before schema 1.1) or the plan has no latency.
    """
    total = weighted = 0.0
    for st in stages:
        frac, lat = _get(st, "measured_fraction"), _get(st, "latency_ms")
        if frac is None or lat is None:
            return None
        total += lat
        weighted += lat * frac
    return weighted / total if total > 0 else None


def gpu_mix(owners: Iterable[Any]) -> str:
    """'h200 TP2 x1 + TP8 x2' / 'a100 TP4 x4 + h100 TP4 x1': the device groups, by GPU type."""
    by_gpu: dict[str, list[str]] = {}
    for o in owners:
        ep = _get(o, "expert_parallel", 1)
        part = f"TP{_get(o, 'tensor_parallel')}" + (f" EP{ep}" if ep and ep > 1 else "")
        by_gpu.setdefault(_get(o, "gpu"), []).append(f"{part} x{_get(o, 'replicas')}")
    return " + ".join(f"{g} {' + '.join(parts)}" for g, parts in sorted(by_gpu.items()))


def data_quality_warning(chosen_gpus: Iterable[str], unmeasured_gpus: Iterable[str] = (),
                         estimated_price_gpus: Iterable[str] = ()) -> str | None:
    """One warning line for chosen GPU types without measured tables or with an estimated price."""
    chosen = sorted(set(chosen_gpus))
    no_tables = [g for g in chosen if g in set(unmeasured_gpus)]
    estimated = [g for g in chosen if g in set(estimated_price_gpus)]
    parts = []
    if no_tables:
        parts.append(f"{', '.join(no_tables)}: no measured kernel tables (latency from the roofline fit)")
    if estimated:
        parts.append(f"{', '.join(estimated)}: price is an estimate (set it with --prices)")
    return "warning: " + "; ".join(parts) if parts else None


def workload_words(wl: Any) -> str:
    """'@ 32768 tokens', or for a workload '@ workload θ 32,768 tokens (CV 0.92, max 131071)'."""
    dist = _get(wl, "distribution")
    if not dist:
        return f"@ {_get(wl, 'context_tokens')} tokens"
    return (f"@ workload θ {_get(dist, 'theta'):,.0f} tokens (CV {_get(dist, 'cv'):.2f}, max "
            f"{_get(wl, 'context_tokens')})")


def tpot_words(plan: Any) -> str:
    """'TPOT 28.14 ms', or 'p95 TPOT 25.63 ms (mean 23.55)' for a workload plan."""
    stats = _get(plan, "tpot")
    if not stats:
        return f"TPOT {_get(plan, 'tpot_ms'):.2f} ms"
    return f"p{_get(stats, 'percentile'):g} TPOT {_get(plan, 'tpot_ms'):.2f} ms (mean {_get(stats, 'mean_ms'):.2f})"


def kv_event_words(plan: Any) -> str | None:
    """The KV overflow line of a workload plan (schema 1.8), its worst owner's figures in words;
    None when the plan records none."""
    dist = _get(_get(plan, "workload"), "distribution")
    owners = [o for o in _get(plan, "owners") or [] if _get(o, "kv_events")]
    if not owners or not dist:
        return None
    ev = [_get(o, "kv_events") for o in owners]
    worst = max(ev, key=lambda e: (_get(e, "per_request_at_usable"), _get(e, "per_request_at_reserve")))
    return (f"KV memory: {_get(worst, 'per_request_at_usable'):.2g} forced preemptions per request at the "
            f"usable memory ({_get(worst, 'per_replica_hour_at_usable'):.2g} per replica-hour), "
            f"{_get(worst, 'per_request_at_reserve'):.2g} crossings of the reserve per request "
            f"(target {_get(dist, 'preemptions_per_request'):g}), "
            f"{_get(worst, 'share_above_reserve'):.3%} of steps above the reserve "
            f"(kv-quantile {_get(dist, 'kv_quantile'):g})")


# what a plan's own cost (and its decode copies) covers, by deployment mode: the decode pool of a
# disaggregated deployment; an aggregated one runs its own replicas, so there it is decode only too
COST_SCOPE = {None: "decode only", "disaggregated": "decode pool",
              "aggregated": "decode only; mode aggregated"}


def _cost_scope(plan: Any) -> str:
    """What the plan's cost covers (COST_SCOPE of its deployment's mode)."""
    dep = _get(plan, "deployment")
    return COST_SCOPE[_get(dep, "mode") if dep is not None else None]


_BINDS = {"throughput": "the decode load (throughput)", "tpot": "the TPOT SLO", "ttft": "the TTFT SLO"}


def deployment_mode_line(plan: Any) -> str | None:
    """The whole deployment's mode, both modes' costs and which SLO binds each (None: decode only)."""
    dep = _get(plan, "deployment")
    mode = _get(dep, "mode") if dep is not None else None
    if mode is None:
        return None
    agg = _get(dep, "aggregated")
    setting = _get(dep, "deployment_mode")
    if _get(dep, "prefill") is None:  # schema 1.14: no prefill pool meets the TTFT, or none was planned
        miss = _get(dep, "disaggregated_infeasible")
        disagg = ("disaggregated not searched (--deployment-mode aggregated)" if miss is None else
                  f"disaggregated infeasible ({_get(miss, 'binding')} binds: {_get(miss, 'reason')})")
    else:
        disagg_gpus = _get(dep, "gpus_total") + _get(_get(dep, "prefill"), "gpus")
        disagg = (f"disaggregated {disagg_gpus} GPUs, {_get(dep, 'usd_per_hour_all_in'):,.2f} USD/h (the "
                  f"{_get(dep, 'binding_pool')} pool binds the cost; decode held to the TPOT SLO, prefill to the "
                  f"TTFT SLO)")
    if agg is None:
        other = ("aggregated not searched (--deployment-mode disaggregated)" if setting is None else
                 "no aggregated deployment meets both SLOs")
        return f"deployment mode: disaggregated; {disagg}; {other}"
    a = (f"aggregated {_get(agg, 'replicas')}x {_get(agg, 'gpu')} TP{_get(agg, 'tensor_parallel')} = "
         f"{_get(agg, 'gpus')} GPUs, {_get(agg, 'usd_per_hour'):,.2f} USD/h (B={_get(agg, 'batch')}, chunk "
         f"{_get(agg, 'chunk_tokens'):,} tokens, {_get(agg, 'mixed_step_share'):.0%} of decode steps mixed; "
         f"p{_get(agg, 'tpot_percentile'):g} TPOT {_get(agg, 'tpot_ms'):.2f} ms, TTFT {_get(agg, 'ttft_ms'):,.1f} ms; "
         f"one replica fewer breaks {_BINDS[_get(agg, 'binding')]})")
    first, second = (a, disagg) if mode == "aggregated" else (disagg, a)
    why = ("--deployment-mode aggregated" if setting != "auto" else "auto: the cheaper" if _get(dep, "prefill") is not None
           else "auto: the only one meeting both SLOs")
    return f"deployment mode: {mode} ({why}): {first}; other mode: {second}"


def plan_headline(plan: Any) -> str:
    wl = _get(plan, "workload")
    owners = _get(plan, "owners") or []
    return (f"{_get(plan, 'model')} {workload_words(wl)}, SLO {_get(wl, 'tpot_slo_ms'):g} ms, "
            f"policy {_get(plan, 'policy')}: {_get(plan, 'usd_per_million_tokens'):.4f} USD/M tokens "
            f"({_cost_scope(plan)}), "
            f"{tpot_words(plan)}, {_get(plan, 'gpus_total')} GPUs ({gpu_mix(owners)}), "
            f"{_get(plan, 'num_stages')} stages, B={_get(plan, 'global_batch')}, "
            f"mu={_get(plan, 'microbatches')}")


def _next_plan_words(b: Any, cost: float | None) -> str:
    usd = _get(b, "next_usd_per_million_tokens")
    if usd is None:
        return ""
    rel = f" ({(usd / cost - 1) * 100:+.2f} %)" if cost else ""
    return (f"{usd:.4f} USD/M tokens{rel}, TPOT {_get(b, 'next_tpot_ms'):.2f} ms, "
            f"{_get(b, 'next_gpus_total')} GPUs")


def binding_line(plan: Any) -> str | None:
    """'binds: memory ...': what keeps the plan at its batch and what the next batch would take
    (the plan's `binding`, schema 1.9; None for older files)."""
    b = _get(plan, "binding")
    if b is None:
        return None
    kind, nxt, batch = _get(b, "constraint"), _get(b, "next_batch"), _get(plan, "global_batch")
    if kind == "batches":
        return (f"binds: the batch set: B={batch} is the largest searched batch this plan's shape can "
                f"split (--batches with larger sizes searches further)")
    cost = _get(plan, "usd_per_million_tokens")
    o = _get(b, "memory_owner")
    mem = (f"owner {o} uses {_get(b, 'memory_used_gib'):.1f} of {_get(b, 'memory_usable_gib'):.1f} GiB usable "
           f"per GPU; B={nxt} would need {_get(b, 'memory_next_gib'):.1f} GiB")
    nextp = _next_plan_words(b, cost)
    if kind == "slo":
        slo = _get(_get(plan, "workload"), "tpot_slo_ms")
        return (f"binds: the SLO: B={nxt} with this shape runs at TPOT {_get(b, 'next_tpot_ms'):.2f} ms > "
                f"SLO {slo:g} ms; an SLO of {math.ceil(_get(b, 'next_tpot_ms'))} ms would allow it at {nextp} "
                f"(memory: {mem})")
    if kind == "cost":
        return f"binds: cost: B={nxt} fits memory and meets the SLO with this shape but costs {nextp} ({mem})"
    cap = {"gpus": "the GPU cap (--max-gpus)", "nodes": "the node cap (--max-nodes)"}.get(kind)
    if cap:
        return (f"binds: {cap}: at B={batch} memory is full ({mem}); more replicas would take {nextp}, "
                f"over the cap")
    return (f"binds: memory at B={batch}: {mem}"
            + (f"; the cheapest B={nxt} plan of this template (more replicas): {nextp}" if nextp else
               f"; no B={nxt} plan of this template fits"))


ALTERNATIVE_WORDS = {"colocated": "colocated", "single_gpu_type": "single GPU type",
                     "two_owner": "two owners", "optimum": "optimum"}
"""How the summary names the plan file's `alternatives` keys."""


def _shape(doc: Any) -> bytes:
    """What makes two plans the same deployment: owners, template, stages, batch and mu."""
    import orjson

    def dump(v):
        if isinstance(v, list):
            return [dump(x) for x in v]
        return v.model_dump(mode="json") if hasattr(v, "model_dump") else v

    return orjson.dumps({k: dump(_get(doc, k)) for k in ("owners", "template", "stages", "global_batch",
                                                        "microbatches")}, option=orjson.OPT_SORT_KEYS)


def alternative_lines(plan: Any) -> list[str]:
    """The plan's alternatives, one line per distinct plan with every name it answers to
    (`colocated = single GPU type = two owners`); names whose plan is this plan are said so, and
    with --prefer-simpler the optimum comes first under its own heading, not as a simpler plan."""
    alts = _get(plan, "alternatives") or {}
    if not alts:
        return []
    own = _shape(plan)
    groups: dict[bytes, list[str]] = {}
    for name in sorted(alts, key=lambda n: (n != "optimum", ALTERNATIVE_WORDS.get(n, n))):
        groups.setdefault(_shape(_get(alts[name], "plan")), []).append(name)
    lines, simpler = [], []
    for key, names in groups.items():
        words = " = ".join(ALTERNATIVE_WORDS.get(n, n) for n in names)
        if key == own:
            lines.append(f"this plan is also the cheapest {words} plan")
            continue
        alt = alts[names[0]]
        n_st = _get(alt, "num_stages")
        row = (f"  {words + ':':<17} {_get(alt, 'usd_per_million_tokens'):.4f} USD/M tokens "
               f"({_get(alt, 'cost_delta_pct'):+.2f} %), TPOT {_get(alt, 'tpot_ms'):.2f} ms "
               f"({_get(alt, 'tpot_delta_pct'):+.1f} %), {_get(alt, 'gpus_total')} GPUs, "
               f"{n_st} stage{'s' if n_st != 1 else ''}")
        if "optimum" in names:
            lines += ["the optimum (cheapest; --prefer-simpler chose the simpler plan above):", row]
        else:
            simpler.append(row)
    if simpler:
        lines += ["simpler alternatives (same search; cost and TPOT relative to this plan):", *simpler]
    return lines


def summary_lines(plan: Any, *, alternatives: Sequence[tuple[str, float | None, float | None]] = (),
                  unmeasured_gpus: Iterable[str] = (), estimated_price_gpus: Iterable[str] = ()
                  ) -> list[str]:
    """The text lines of the summary (headline, measured share, warning, alternatives)."""
    lines = [plan_headline(plan)]
    share = measured_share(_get(plan, "stages") or [])
    lines.append("measured share of the plan's latency: "
                 + ("unknown (plan written before schema 1.1)" if share is None else
                    f"{share:.0%} (latency-weighted over stages; the rest is a fitted roofline or "
                    f"clamped at a table edge)"))
    events = kv_event_words(plan)
    if events:
        lines.append(events)
    why = binding_line(plan)
    if why:
        lines.append(why)
    mode = deployment_mode_line(plan)
    if mode:
        lines.append(mode)
    warn = data_quality_warning((_get(o, "gpu") for o in _get(plan, "owners") or []),
                                unmeasured_gpus, estimated_price_gpus)
    if warn:
        lines.append(warn)
    if alternatives:
        cost = _get(plan, "usd_per_million_tokens")
        alts = []
        for name, usd, tpot in alternatives:
            if usd is None:
                alts.append(f"{name} infeasible")
                continue
            rel = f", {usd / cost:.2f}x this plan's cost" if cost else ""
            alts.append(f"{name} {usd:.4f} USD/M tokens" + (f", TPOT {tpot:.2f} ms" if tpot is not None else "")
                        + rel)
        lines.append("alternatives: " + "; ".join(alts))
    lines += alternative_lines(plan)
    lines.append(SUMMARY_TERMS)
    return lines


SUMMARY_TERMS = ("terms: B = requests decoding at once (global batch); mu = microbatches in flight; owner = "
                 "a device-group type (replicas x TP GPUs) running some stages; resident batch = requests "
                 "one replica holds (mu x microbatch); two owners = at most two device-group types; "
                 "θ, CV = the workload's mean context and its coefficient of variation; measured share = "
                 "latency from measured kernel tables; details: docs/consuming-a-plan.md")


def render_plan_summary(plan, *, alternatives: Sequence[tuple[str, float | None, float | None]] = (),
                        unmeasured_gpus: Iterable[str] = (), estimated_price_gpus: Iterable[str] = (),
                        file=None) -> None:
    """A one-screen summary of a plan on stderr, terminal or not (the caller decides --quiet).

    ``alternatives``: (name, USD/M tokens or None if infeasible, TPOT ms or None), e.g. the
    colocated plan; ``unmeasured_gpus`` / ``estimated_price_gpus``: GPU ids the caller knows
    have no measured tables / an estimated price (only the plan's chosen types are named).
    """
    from rich.table import Table

    con = console(stderr=file is None, file=file)
    lines = summary_lines(plan, alternatives=alternatives, unmeasured_gpus=unmeasured_gpus,
                          estimated_price_gpus=estimated_price_gpus)
    con.print(lines[0], markup=False)
    t = Table()
    for col in ("owner", "gpu", "TP", "EP", "replicas", "resident batch", "microbatch", "stages", "busy"):
        t.add_column(col, justify="right", no_wrap=True)
    for o in _get(plan, "owners") or []:
        t.add_row(str(_get(o, "index")), _get(o, "gpu"), str(_get(o, "tensor_parallel")),
                  str(_get(o, "expert_parallel")), str(_get(o, "replicas")), str(_get(o, "resident_batch")),
                  str(_get(o, "microbatch")), str(len(_get(o, "stage_positions") or [])),
                  f"{_get(o, 'busy_fraction'):.0%}")
    con.print(t)
    for line in lines[1:]:
        con.print(line, markup=False)


def entry_line(index: int, total: int, label: str, usd_per_mtok: float | None = None, *,
               status: str | None = None, measured: float | None = None, tpot_ms: float | None = None,
               reason: str | None = None) -> str:
    """One per-entry progress line for compare/regen.

    ``[37/270] gemma-3-27b 32k 60ms: 1.397 USD/Mtok, 9% measured (unchanged)``
    """
    if usd_per_mtok is None:
        body = "infeasible" + (f": {' '.join(reason.split())}" if reason else "")
    else:
        body = f"{usd_per_mtok:.4g} USD/Mtok"
        if tpot_ms is not None:
            body += f", TPOT {tpot_ms:.3g} ms"
        if measured is not None:
            body += f", {measured:.0%} measured"
    return f"[{index}/{total}] {label}: {body}" + (f" ({status})" if status else "")

def render_profile_table(info: dict[str, Any]) -> None:
    from rich.table import Table

    from opweave_planner.latency.interp import SOURCE_LEGEND, SOURCE_SHORT

    t = Table(title=f"{info['model']} on {info['gpu']} TP{info['tensor_parallel']} "
                    f"@ {info['context_tokens']} tokens: latency in µs \\[source]")
    t.add_column("operator (first of its kind)", no_wrap=True)
    t.add_column("x", justify="right")
    for mb in info["microbatches"]:
        t.add_column(f"b={mb}", justify="right")
    for r in info["operators"]:
        t.add_row(r["operator"].removeprefix("layers."), str(r["count"]),
                  *[f"{v:,.1f} {SOURCE_SHORT[s]}" for v, s in zip(r["latency_us"], r["source"], strict=True)])
    t.add_row("decode step (ms)", "", *[f"{v:,.3f}" for v in info["decode_step_ms"]])
    con = _console()
    con.print(t)
    con.print(f"sources: {SOURCE_LEGEND}")
    if info["not_measured_kinds"]:
        con.print(f"not (fully) measured: {', '.join(info['not_measured_kinds'])}")


# --------------------------------------------------------------------------- #
# Progress on stderr
# --------------------------------------------------------------------------- #

def format_duration(seconds: float) -> str:
    """'4.2 s', '3 min 05 s', '1 h 02 min': short, for logs."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = round(seconds)
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class RateEta:
    """Time left at the rate of progress since the first report, not since the start: what
    ran before it (compiling, the first template's cache loading) is setup, not a sample of
    the rate (regen, whose entries run side by side, reports 0 at its start instead). None
    until `eta_after` of the total has moved since the first report."""

    def __init__(self, eta_after: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.eta_after, self._clock = eta_after, clock
        self.done, self.total = 0.0, None
        self._first: tuple[float, float] | None = None

    def update(self, done: float, total: float | None = None) -> None:
        self.done = done
        if total is not None:
            self.total = total
        if self._first is None:
            self._first = (self._clock(), done)

    def seconds(self) -> float | None:
        if not self.total or self._first is None:
            return None
        t0, d0 = self._first
        moved = self.done - d0
        if moved <= 0 or moved < self.eta_after * self.total:
            return None
        return (self._clock() - t0) * max(self.total - self.done, 0) / moved


class Progress:
    """Progress of one long phase on stderr: a rich bar on a terminal, plain lines otherwise.

    Plain mode prints ``phase: done/total (pct), elapsed, ETA`` every ``interval_s`` or
    each ``step`` of the total, whichever comes first, and always a final line (also on a
    terminal, where the bar is transient). Usable as the ``progress(done, total)``
    callback itself: ``with Progress("templates") as p: api.plan(req, progress=p)``.
    The ETA is `RateEta`'s, the rate since the first report; ``eta_after``: no ETA (plain:
    "ETA estimating"; the bar: "-:--:--") until this share of the total is done after the first
    report (`search.driver.ETA_AFTER`).
    """

    def __init__(self, phase: str, total: int | None = None, *, enabled: bool = True,
                 file=None, tty: bool | None = None, interval_s: float = 5.0, step: float = 0.10,
                 clock: Callable[[], float] = time.monotonic, eta_after: float = 0.0) -> None:
        self.phase = phase
        self.total = total
        self.eta_after = eta_after
        self.done = 0
        self.enabled = enabled
        self._file = file
        self._tty = tty
        self.interval_s = interval_s
        self.step = step
        self._clock = clock
        self._lock = threading.Lock()
        self._bar = None
        self._task = None
        self._start = self._last = 0.0
        self._next_fraction = step
        self._eta = RateEta(eta_after, clock)

    # -- plumbing -------------------------------------------------------------
    @property
    def file(self):
        return self._file if self._file is not None else sys.stderr

    @property
    def is_tty(self) -> bool:
        if self._tty is not None:
            return self._tty
        try:
            return self.file.isatty()
        except (AttributeError, ValueError):
            return False

    def _write(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # progress must never break the command
            print(line, file=self.file, flush=True)

    def elapsed(self) -> float:
        return self._clock() - self._start

    # -- context ---------------------------------------------------------------
    def __enter__(self) -> Progress:
        self._start = self._last = self._clock()
        if self.enabled and self.is_tty:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as Bar

            # the ETA column is ours (`eta_seconds`): rich's own rate counts the setup time
            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"), transient=True,
                            console=console(stderr=self._file is None, file=self._file))
            self._bar.start()
            self._task = self._bar.add_task(self.phase, total=self.total, eta="-:--:--")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self.enabled:
            self._write(self.final_line(stopped=exc_type is not None))

    # -- updates -----------------------------------------------------------------
    def __call__(self, done: int, total: int | None = None) -> None:
        self.update(done, total)

    def update(self, done: int, total: int | None = None) -> None:
        """Absolute progress (matches api.plan's ``progress(done, total)`` callback)."""
        with self._lock:
            now = self._clock()
            self.done = done
            if total is not None:
                self.total = total
            self._eta.update(done, self.total)
            if not self.enabled:
                return
            if self._bar is not None:
                eta = self.eta_seconds()
                self._bar.update(self._task, completed=done, total=self.total,
                                 eta="-:--:--" if eta is None else format_duration(eta))
                return
            frac = done / self.total if self.total else None
            due = now - self._last >= self.interval_s
            if frac is not None and frac >= self._next_fraction and frac < 1.0:
                due = True
            if due:
                self._last = now
                if frac is not None:
                    while self._next_fraction <= frac:
                        self._next_fraction += self.step
                self._write(self.status_line())

    def advance(self, n: int = 1) -> None:
        self.update(self.done + n)

    def log(self, line: str) -> None:
        """A line of its own (e.g. `entry_line`), above the bar on a terminal; counts as a sign of life."""
        if not self.enabled:
            return
        with self._lock:
            if self._bar is not None:
                self._bar.console.print(line, markup=False, highlight=False)
            else:
                self._last = self._clock()
                self._write(line)

    # -- text ----------------------------------------------------------------------
    def eta_seconds(self) -> float | None:
        """Seconds left at the rate since the first report; None before `eta_after` of the
        total is done after it (or with no total)."""
        return self._eta.seconds()

    def eta_shown(self) -> bool:
        """Whether an ETA is shown yet (`eta_seconds`)."""
        return self.eta_seconds() is not None

    def status_line(self) -> str:
        el = self.elapsed()
        if not self.total:
            return f"{self.phase}: {self.done:,} done, elapsed {format_duration(el)}"
        frac = self.done / self.total
        eta = self.eta_seconds()
        eta = "estimating" if eta is None else format_duration(eta)
        return (f"{self.phase}: {self.done:,}/{self.total:,} ({frac:.0%}), elapsed {format_duration(el)}, "
                f"ETA {eta}")

    def final_line(self, stopped: bool = False) -> str:
        count = f"{self.done:,}/{self.total:,}" if self.total else f"{self.done:,}"
        if stopped:
            return f"{self.phase}: stopped at {count} after {format_duration(self.elapsed())}"
        return f"{self.phase}: {count} done in {format_duration(self.elapsed())}"


# 11-13 s (a fixed context) and 16 s (a workload) of compilation on the 2-core development
# machine (benchmarks/bench_before_after.py, "cold compile" rows), 24 s for the README's first
# command's whole search in a fresh environment
COMPILE_NOTICE = ("compiling the numba search kernels (first run only; typically 10-30 s, "
                  "cached for later runs)")


def compile_notice(parts) -> str:
    """The notice naming what will compile (`jit.cold_parts`): the first run of each kind of
    request compiles its own kernels (a fixed context, a workload, the deployment replays)."""
    return (f"compiling numba kernels for the {' and the '.join(parts)} (first run of this kind of request "
            "only; typically 30-60 s, cached for later runs)")


def announce_compile(kernels_cached: bool, *, enabled: bool = True, file=None,
                     what: str = COMPILE_NOTICE) -> bool:
    """One stderr line before numba compiles for the first time; the caller decides (see
    `jit.kernels_cache_is_warm`). Returns whether it printed."""
    if kernels_cached or not enabled:
        return False
    try:
        print(what, file=file or sys.stderr, flush=True)
    except (OSError, ValueError):
        return False
    return True
