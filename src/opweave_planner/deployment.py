"""The whole disaggregated deployment: a prefill pool sized for a TTFT SLO beside the decode plan.

The decode pool is the searched plan, sized by `sizing` for the output throughput the arrivals
imply (rate x mean output tokens). The prefill pool is N instances of one (GPU type, TP) group:
every request is prefilled on one instance (`latency.prefill`, chunked as the runtime chunks it)
and its KV handed to the decode pool over the inter-node link; TTFT = queueing wait + prefill +
hand-off, from a deterministic replay of the seeded arrival sequence through N servers
(`latency.ttft.replay`), with the M/G/c mean wait recorded beside it as a check.

Exact over the enumeration: for each (GPU type, TP) option that holds the weights and one
prompt's KV, N is the least integer whose replayed TTFT percentile meets the SLO. Every
request's wait is non-increasing in N (FCFS to the server that frees first: the sorted vector
of the servers' remaining work only shrinks when a server is added, Kiefer-Wolfowitz), so the
least N is found by doubling then bisection, and the pool's cost N x TP x price is the least
for that option; the cheapest option (then fewer GPUs, then GPU id, then TP) is the minimum over
the whole enumeration. The hand-off does not occupy the prefill instance (it is charged to the
request's TTFT only) and the link has no price in the catalog, so it costs 0 USD.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from opweave_planner.errors import UserError
from opweave_planner.inputs.request import MAX_GPU_BUDGET, PlanRequest
from opweave_planner.latency.ttft import TtftStats, mgc, ttft_stats
from opweave_planner.plan.io import rounded
from opweave_planner.plan.schema import ArrivalsOut, DisaggregatedInfeasibleOut, Plan, PrefillPoolOut
from opweave_planner.workload.arrivals import Arrivals, from_trace, poisson

__all__ = ["POISSON_REQUESTS", "POISSON_SEED", "PoolOption", "PoolChoice", "PoolMiss", "least_instances", "choose_pool",
           "prefill_pool", "arrivals_record", "sized", "stable_instances", "whole_deployment", "AtOccupancy", "OnGrid", "pooled_percentile", "open_occupancy",
           "load_tpot", "with_load_tpot", "has_load_figure"]

POISSON_REQUESTS = 20_000  # arrivals replayed for a Poisson rate (seeded: same plan bytes)
POISSON_SEED = 0
KNOTS = 48  # more distinct prompt lengths than this: prefill times interpolated, from log-spaced knots
LOAD_OCCUPANCIES = 16  # occupancies the load-aware TPOT evaluates (log-spaced in 1..microbatch)
KNOT_TOL = 1e-3  # refine an interval whose midpoint's prefill time is off its line by more than this


@dataclass(frozen=True, eq=False)
class PoolOption:
    """One (GPU type, TP) a prefill instance may be: its price and every request's times (s)."""

    gpu: str
    tp: int
    usd_per_hour: float  # one instance
    service_s: np.ndarray
    handoff_s: np.ndarray
    chunk_tokens: int = 0
    measured_share: float = 1.0  # of the prefill time, from measured or interpolated tables


@dataclass(frozen=True)
class PoolChoice:
    option: PoolOption
    instances: int
    stats: TtftStats

    @property
    def usd_per_hour(self) -> float:
        return self.instances * self.option.usd_per_hour


@dataclass(frozen=True)
class PoolMiss:
    """Why no prefill pool meets the TTFT SLO: the disaggregated mode's binding constraint."""

    binding: str  # ttft | memory | gpus (DisaggregatedInfeasibleOut.binding)
    reason: str
    lowest_ttft_s: float | None = None
    handoff_mean_s: float | None = None

    def out(self) -> DisaggregatedInfeasibleOut:
        ms = (lambda x: None if x is None else rounded(x * 1e3))
        return DisaggregatedInfeasibleOut(binding=self.binding, reason=self.reason,
                                          lowest_ttft_ms=ms(self.lowest_ttft_s), handoff_mean_ms=ms(self.handoff_mean_s))


def _stats(times: np.ndarray, opt: PoolOption, n: int, percentile: float) -> TtftStats:
    return ttft_stats(times, opt.service_s, n, opt.handoff_s, percentile)


def stable_instances(rate: float, opt: PoolOption) -> int:
    """The least N whose utilisation rate x mean prefill / N is below 1: fewer instances than this
    fall ever further behind (the M/G/c wait is infinite), even where a short bursty replay ends
    before its queue shows it."""
    return math.floor(rate * float(opt.service_s.mean())) + 1


def unqueued_percentile(opt: PoolOption, percentile: float) -> float:
    """The TTFT percentile with no wait (prefill + hand-off): the floor any N approaches."""
    return float(np.percentile(opt.service_s + opt.handoff_s, percentile))


def least_instances(times: np.ndarray, opt: PoolOption, ttft_s: float, percentile: float,
                    max_instances: int, min_instances: int = 1) -> tuple[int, TtftStats] | None:
    """The least N in [min_instances, max_instances] whose replayed TTFT percentile is <= ttft_s
    (None: none is). The percentile is non-increasing in N (every wait is), so doubling from
    min_instances then bisection finds it in O(log N) replays, the largest N replayed only when
    the doubling reaches it. An option whose unqueued prefill + hand-off alone misses the SLO
    (every wait is >= 0, so no N does better) is refused without a replay."""
    lo = max(int(min_instances), 1)
    if max_instances < lo or unqueued_percentile(opt, percentile) > ttft_s:
        return None
    bad, n = lo - 1, lo  # bad: the largest count known to miss
    while True:  # doubling the step above lo: the first count that meets it
        st = _stats(times, opt, n, percentile)
        if st.percentile_s <= ttft_s:
            good, good_stats = n, st
            break
        if n >= max_instances:
            return None
        bad, n = n, min(lo + 2 * (n - lo + 1) - 1, max_instances)
    while good - bad > 1:
        mid = (bad + good) // 2
        st = _stats(times, opt, mid, percentile)
        if st.percentile_s <= ttft_s:
            good, good_stats = mid, st
        else:
            bad = mid
    return good, good_stats


def choose_pool(times: np.ndarray, options: list[PoolOption], ttft_s: float, percentile: float,
                max_gpus: int = MAX_GPU_BUDGET, rate: float | None = None) -> PoolChoice | None:
    """The cheapest stable pool over the options (ties: fewer GPUs, GPU id, TP); None if none meets
    it. `rate`: the arrival rate the pool is sized for (default: the replay's own, requests - 1 over
    its span); each option's N starts at its stable count for it."""
    if rate is None:
        rate = Arrivals(times, times, "").rate
    best: tuple | None = None
    for opt in options:
        got = least_instances(times, opt, ttft_s, percentile, max_gpus // opt.tp, stable_instances(rate, opt))
        if got is None:
            continue
        n, st = got
        key = (n * opt.usd_per_hour, n * opt.tp, opt.gpu, opt.tp)
        if best is None or key < best[0]:
            best = (key, PoolChoice(opt, n, st))
    return None if best is None else best[1]


# ----------------------------------------------------------------------------- from a request

def _mean_output(plan: Plan, req: PlanRequest) -> float:
    dist = plan.workload.distribution
    if dist is not None:
        return float(dist.mean_output)
    return float(req.lengths[1])


def _arrivals(req: PlanRequest, mean_output: float, window: int, workload) -> tuple[Arrivals, float]:
    """The replayed arrivals and the rate the pools are sized for (prompts capped below the window).

    Prompts come from the compiled, shaped workload (`workload`: `--scale-ctx` and
    `--max-model-len` applied): Poisson draws from its kept requests; a trace's own arrivals take
    the trace's timestamps (`from_trace`) with each prompt scaled by the same `--scale-ctx` factor.
    The request edge (`PlanRequest._deployment_settings`) refused a law workload and a trace
    whose timestamps span no time; the checks here only guard a request built otherwise."""
    from opweave_planner.workload.shaping import _scaled  # the one --scale-ctx rule

    if req.arrivals == "trace":
        arr = from_trace(req.workload, req.rate_scale or 1.0)
        rate = arr.rate
        if arr.times_s.size < 2 or not np.isfinite(rate):
            raise UserError(f"--arrivals trace: the timestamps of {req.workload} span no time; expected "
                            f"requests at distinct times (or give --request-rate)")
        if workload.scale != 1.0:
            arr = Arrivals(arr.times_s, _scaled(arr.prompts, workload.scale), arr.source, arr.rows)
    else:
        rate = req.request_rate if req.request_rate is not None else req.target_tokens_per_s / mean_output
        if req.workload is None:
            prompts = req.lengths[0]
        elif workload.prompt is None:
            given = "--request-rate" if req.request_rate is not None else "--target-tokens-per-s"
            raise UserError(f"{given} with --ttft and --workload: Poisson prompts are drawn from a trace's "
                            f"requests; {req.workload} is a length law")
        else:
            prompts = workload.prompt
        arr = poisson(rate, POISSON_REQUESTS, prompts, POISSON_SEED)
    capped = np.minimum(arr.prompts, max(window - 1, 1))
    return Arrivals(arr.times_s, np.maximum(capped, 1), arr.source, arr.rows, _outputs(req, arr, workload)), float(rate)


def _outputs(req: PlanRequest, arr: Arrivals, workload) -> np.ndarray | None:
    """Each arrival's output tokens as the shaped workload serves it: the fixed --output-len, the
    drawn request's (Poisson from a trace's kept requests), or the trace row's own under
    --max-model-len (`shaping.fit_requests`; a row it drops is prefilled and not decoded: 1, its
    first token only)."""
    if req.workload is None:
        return np.full(arr.prompts.size, max(1, int(req.lengths[1])), dtype=np.int64)
    if arr.rows is None:  # rows not known: the mean output stands in (aggregated.with_aggregated)
        return None
    if req.arrivals != "trace":
        return np.asarray(workload.output, dtype=np.int64)[arr.rows]
    from opweave_planner.workload.reader import read_trace
    from opweave_planner.workload.shaping import _scaled, fit_requests

    rows = read_trace(req.workload)
    if rows.output.size != arr.prompts.size:  # rows without a timestamp: the rows do not pair
        return None
    o = rows.output.astype(np.int64)
    if workload.spec.max_model_len is not None:
        _p, o, keep, _ = fit_requests(_scaled(rows.prompt, workload.scale), o, workload.spec.max_model_len, workload.spec.overflow)
        o = np.where(keep, o, 1)
    return np.maximum(o, 1)[arr.rows]


def _times(lengths: np.ndarray, one, chunk: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prefill s, hand-off s, measured share) per distinct sorted length: exact for few lengths, else
    linear between evaluated lengths, refined until each interval's midpoint is within KNOT_TOL.

    Prefill time is not smooth in the prompt length: it steps where ceil(P / chunk) does (one more
    step) and kinks or jumps where a kernel table changes rows (llama-3.1-8b on h100: +4 ms between
    2,303 and 2,307 tokens). So every chunk boundary's two neighbours are evaluated (no interval
    spans a step), and an interval whose midpoint misses the line is halved; a jump costs about
    log2(lengths) evaluations, a smooth stretch one."""
    n = lengths.size
    if n <= KNOTS:
        got = np.array([one(int(x)) for x in lengths])
        return got[:, 0], got[:, 1], got[:, 2]
    memo: dict[int, tuple] = {}

    def at(i: int) -> tuple:
        if i not in memo:
            memo[i] = one(int(lengths[i]))
        return memo[i]

    seeds = set(np.searchsorted(lengths, np.geomspace(lengths[0], lengths[-1], KNOTS)).clip(0, n - 1).tolist())
    seeds |= {0, n - 1}
    if chunk > 0:  # both sides of every step of ceil(P / chunk)
        edge = np.nonzero(np.diff((lengths - 1) // chunk))[0]
        seeds |= set(edge.tolist()) | set((edge + 1).tolist())
    order = sorted(seeds)
    for i in order:
        at(i)
    todo = list(zip(order[:-1], order[1:]))
    while todo:  # an interval is accepted when its midpoint lies on its line
        a, b = todo.pop()
        if b - a < 2:
            continue
        m = (a + b) // 2
        fa, fb, fm = at(a)[0], at(b)[0], at(m)[0]
        if abs(fa + (fb - fa) * (lengths[m] - lengths[a]) / (lengths[b] - lengths[a]) - fm) > KNOT_TOL * fm:
            todo += [(a, m), (m, b)]
    idx = np.array(sorted(memo))
    got = np.array([memo[i] for i in idx])
    return tuple(np.interp(lengths, lengths[idx], got[:, k]) for k in range(3))


def _options(req: PlanRequest, seq, hw, prompts: np.ndarray) -> list[PoolOption]:
    from opweave_planner.compile.tables import configurations, usable_per_gpu
    from opweave_planner.latency.prefill import default_chunk_tokens, prefill

    lengths, inverse = np.unique(prompts, return_inverse=True)
    need = seq.weight_bytes() + seq.kv_bytes(int(lengths[-1]))
    gbps, lat_us = hw.network.inter_node_gbps, hw.network.inter_node_latency_us  # --network-* applied
    out = []
    for cfg in configurations(seq, hw, req):  # the searched (GPU type, TP) that fit a node
        gpu, tp = cfg.gpu, cfg.parallel.tp
        if cfg.parallel.moe_ep or need > tp * usable_per_gpu(gpu, tp, req):
            continue

        def one(n, gpu=gpu, tp=tp):
            e = prefill(seq, gpu, tp, n, profiles_dir=req.profiles, backend=req.backend,
                        moe_routing=req.moe_routing, moe_ep=False, link_gbps=gbps, link_latency_us=lat_us)
            return e.prefill_ms / 1e3, e.handoff_ms / 1e3, e.measured_share

        service, handoff, share = _times(lengths, one, default_chunk_tokens(gpu))
        service = service[inverse]
        measured = float((share[inverse] * service).sum() / service.sum())
        out.append(PoolOption(gpu.id, tp, tp * gpu.price_per_hour, service, handoff[inverse],
                              default_chunk_tokens(gpu), measured))
    return out


def replayed_arrivals(plan: Plan, req: PlanRequest, compiled) -> tuple[Arrivals, float, float]:
    """The arrivals both modes are replayed with, their rate and the mean output per request: one
    rule for the disaggregated pool and the aggregated replicas."""
    mean_out = _mean_output(plan, req)
    arr, rate = _arrivals(req, mean_out, plan.workload.window, compiled.workload)
    return arr, rate, mean_out


def arrivals_record(req: PlanRequest, arrivals) -> ArrivalsOut:
    """The arrivals both modes are sized for, recorded as a workload is."""
    arr, rate, mean_out = arrivals
    return ArrivalsOut(
        process=req.arrivals, request_rate=req.request_rate, rate=rounded(rate), rate_scale=req.rate_scale,
        target_tokens_per_s=req.target_tokens_per_s if req.arrivals == "poisson" else None,
        requests=int(arr.times_s.size), seed=POISSON_SEED if req.arrivals == "poisson" else None,
        mean_prompt_tokens=rounded(float(arr.prompts.mean())), mean_output_tokens=rounded(mean_out))


def prefill_pool(req: PlanRequest, seq, hw, arrivals) -> tuple[list[PoolOption], PoolChoice | PoolMiss]:
    """The enumerated (GPU type, TP) options and the cheapest pool meeting the TTFT SLO, or what
    binds when none does."""
    arr, rate, _mean = arrivals
    options = _options(req, seq, hw, arr.prompts)
    ttft_s, pct = req.ttft / 1e3, req.ttft_at
    choice = choose_pool(arr.times_s, options, ttft_s, pct, rate=rate)
    if choice is not None:
        return options, choice
    where = (f"no prefill pool of {','.join(req.gpus)} TP {','.join(map(str, req.tensor_parallel_sizes))} within "
             f"{MAX_GPU_BUDGET} GPUs meets p{pct:g} TTFT {req.ttft:g} ms")
    if not options:
        return options, PoolMiss("memory", f"{where} (no searched (GPU type, TP) holds the weights and one "
                                           f"prompt's KV)")
    fastest = min(options, key=lambda o: (unqueued_percentile(o, pct), o.gpu, o.tp))
    floor, handoff = unqueued_percentile(fastest, pct), float(fastest.handoff_s.mean())
    if floor > ttft_s:
        why = (f"an unqueued prefill + hand-off alone takes {floor * 1e3:.0f} ms at p{pct:g}, the hand-off "
               f"{handoff * 1e3:.0f} ms of it on average")
        return options, PoolMiss("ttft", f"{where} ({why})", floor, handoff)
    why = (f"the fastest unqueued prefill + hand-off, {floor * 1e3:.0f} ms at p{pct:g}, leaves too little for the "
           f"queue of any pool within the budget")
    return options, PoolMiss("gpus", f"{where} ({why})", floor, handoff)


def sized(doc: Plan, req: PlanRequest, hw, compiled=None) -> Plan:
    """`doc` with its deployment for the request's target load, if it names one; with --ttft the
    whole deployment, sized with `compiled`'s operator sequence and shaped workload (None:
    compiled for it). The one place a deployment mode is chosen: `api.plan` and `simulate` both
    come here. --deployment-mode disaggregated: the prefill pool beside the decode copies (none
    meeting the TTFT: refused); aggregated: the aggregated replicas, no prefill pool planned;
    auto: both, the cheaper meeting both SLOs is `deployment.mode`, and where no prefill pool
    meets the TTFT the aggregated deployment alone, the disaggregated side's binding constraint
    recorded (neither: refused, naming both)."""
    from opweave_planner.compile.space import node_size
    from opweave_planner.plan import plan_version
    from opweave_planner.sizing import size_deployment

    per_node = {g.id: node_size(g, req) for g in hw.gpus}
    if req.disaggregated:
        from opweave_planner.aggregated import with_aggregated

        if compiled is None:
            from opweave_planner.compile import compile_request

            compiled = compile_request(req, hw)
        arrivals = replayed_arrivals(doc, req, compiled)
        decode = _decode_copies(doc, req, per_node, arrivals)
        record = arrivals_record(req, arrivals)
        if req.deployment_mode == "aggregated":  # the decode copies are the only disaggregated figures kept
            return with_aggregated(decode, req, hw, compiled.seq, arrivals, record=record)
        options, got = prefill_pool(req, compiled.seq, hw, arrivals)
        if isinstance(got, PoolMiss):
            if req.deployment_mode == "disaggregated":
                raise UserError(f"--ttft: {got.reason}")
            return with_aggregated(decode, req, hw, compiled.seq, arrivals, got, record)
        doc = _with_pool(decode, req, arrivals, options, got)
        if req.deployment_mode == "disaggregated":
            return doc
        # both modes: the cheaper meeting both SLOs is deployment.mode
        return with_aggregated(doc, req, hw, compiled.seq, arrivals)
    if req.target_tokens_per_s is None and req.target_concurrency is None:
        return doc
    dep = size_deployment(doc, target_tokens_per_s=req.target_tokens_per_s,
                          target_concurrency=req.target_concurrency, gpus_per_node=per_node)
    doc = doc.model_copy(update={"deployment": dep})
    return doc.model_copy(update={"schema_version": plan_version(doc)})


def _decode_copies(plan: Plan, req: PlanRequest, gpus_per_node: dict[str, int], arrivals) -> Plan:
    """`plan` with its decode copies sized for the arrivals' output rate (rate x mean output)."""
    from opweave_planner.plan import plan_version
    from opweave_planner.sizing import size_deployment

    _arr, rate, mean_out = arrivals
    dep = size_deployment(plan, target_tokens_per_s=rate * mean_out, target_concurrency=req.target_concurrency,
                          gpus_per_node=gpus_per_node)
    doc = plan.model_copy(update={"deployment": dep})
    return doc.model_copy(update={"schema_version": plan_version(doc)})


def whole_deployment(plan: Plan, req: PlanRequest, hw, gpus_per_node: dict[str, int], compiled=None) -> Plan:
    """`plan` with its disaggregated deployment: decode copies for rate x mean output, the
    cheapest prefill pool meeting the TTFT SLO (none: refused, naming what binds), and the
    all-in costs.

    `compiled`: the request's compiled problem (`compile.Compiled`), whose operator sequence and
    shaped workload the pool is sized with (None: compiled here). `req` names the prefill pool's
    enumeration (its GPU types and TP degrees)."""
    if compiled is None:
        from opweave_planner.compile import compile_request

        compiled = compile_request(req, hw)
    arrivals = replayed_arrivals(plan, req, compiled)
    options, got = prefill_pool(req, compiled.seq, hw, arrivals)
    if isinstance(got, PoolMiss):
        raise UserError(f"--ttft: {got.reason}")
    return _with_pool(_decode_copies(plan, req, gpus_per_node, arrivals), req, arrivals, options, got)


def _with_pool(plan: Plan, req: PlanRequest, arrivals, options: list[PoolOption], choice: PoolChoice) -> Plan:
    """`plan` (its decode copies sized) with the prefill pool `choice` and the all-in costs."""
    from opweave_planner.plan import plan_version

    arr, rate, mean_out = arrivals
    dep = plan.deployment
    tokens = rate * mean_out
    pct = req.ttft_at
    opt, n, st = choice.option, choice.instances, choice.stats
    rho = rate * float(opt.service_s.mean())
    scv = float(opt.service_s.var() / opt.service_s.mean() ** 2)
    check = mgc(rate, float(opt.service_s.mean()), scv, n, pct / 100)
    prefill_usd = choice.usd_per_hour
    total = dep.usd_per_hour + prefill_usd
    out_m = tokens * 3600 / 1e6
    in_m = rate * float(arr.prompts.mean()) * 3600 / 1e6
    pool = PrefillPoolOut(
        gpu=opt.gpu, tensor_parallel=opt.tp, instances=n, gpus=n * opt.tp, usd_per_hour=rounded(prefill_usd),
        chunk_tokens=opt.chunk_tokens, ttft_slo_ms=req.ttft, ttft_percentile=pct,
        ttft_ms=rounded(st.percentile_s * 1e3), ttft_mean_ms=rounded(st.mean_s * 1e3),
        wait_mean_ms=rounded(st.wait_mean_s * 1e3), prefill_mean_ms=rounded(float(opt.service_s.mean()) * 1e3),
        handoff_mean_ms=rounded(float(opt.handoff_s.mean()) * 1e3), utilisation=rounded(rho / n),
        mgc_wait_mean_ms=rounded(check.wait_mean_s * 1e3), cost_share=rounded(prefill_usd / total) if total else 0.0,
        measured_share=rounded(opt.measured_share),
        options=len(options))
    dep = dep.model_copy(update={
        "mode": "disaggregated", "arrivals": arrivals_record(req, arrivals), "prefill": pool,
        "usd_per_hour_all_in": rounded(total),
        "usd_per_million_output_tokens_all_in": rounded(total / out_m),
        "usd_per_million_output_tokens_decode": rounded(dep.usd_per_hour / out_m),
        "usd_per_million_output_tokens_prefill": rounded(prefill_usd / out_m),
        "usd_per_million_input_tokens": rounded(prefill_usd / in_m),
        "binding_pool": "prefill" if prefill_usd > dep.usd_per_hour else "decode"})
    doc = plan.model_copy(update={"deployment": dep})
    return doc.model_copy(update={"schema_version": plan_version(doc)})


# ----------------------------------------------------------------------------- TPOT at the deployment's load

class AtOccupancy:
    """The plan's own evaluator (`search.evaluate`: stationary context law, snapshot periods) with
    every microbatch holding n requests instead of the plan's: its sorted periods and mean (s),
    cached per n. `compiled` must hold microbatch n in its grid (batches n x mu x replicas)."""

    def __init__(self, compiled, tmpl, sel):
        self.compiled, self.tmpl, self.sel, self.memo = compiled, tmpl, sel, {}

    def __call__(self, n: int) -> tuple[np.ndarray, float]:
        from opweave_planner.search.evaluate import evaluate

        if n not in self.memo:
            sel = self.sel
            b = int(n) * sel.mu * int(sel.replicas[0])
            s = sel._replace(batch=b, mb=np.array([self.compiled.tables.grid.mb_index[n]], np.int64))
            ev = evaluate(self.compiled.problem(self.tmpl, batches=(b,)), s)
            samples = np.asarray(ev.samples) if ev.samples.size else np.array([ev.t_rtt])  # a fixed --ctx: one period
            self.memo[n] = (np.sort(samples) / 1e6, float(ev.t_mean) / 1e6)
        return self.memo[n]


def pooled_percentile(at, weight: dict[int, float], pct: float = 95.0) -> float:
    """The `pct` percentile (s) of the evaluator's periods at each occupancy n, pooled with weight[n]."""
    vals, wts = [], []
    for n, w in sorted(weight.items()):
        if w > 0:
            v, _mean = at(int(n))
            vals.append(v)
            wts.append(np.full(v.size, w / v.size))
    from opweave_planner.aggregated import weighted_percentile  # the one weighted (inverted-CDF) percentile

    return weighted_percentile(np.concatenate(vals), np.concatenate(wts), pct)


class OnGrid:
    """The evaluator `at` read at any occupancy from its values at `grid` (sorted, 1..cap): between
    two grid points each order statistic and the mean linear in n (quantiles interpolated, not
    distributions mixed: a mixture of the neighbours would widen the tail). On every integer's
    grid it is `at` itself."""

    def __init__(self, at, grid):
        self.at, self.grid = at, np.asarray(grid, np.int64)

    def __call__(self, k: int) -> tuple[np.ndarray, float]:
        g = self.grid
        j = int(np.searchsorted(g, k))
        if j < g.size and g[j] == k:
            return self.at(int(k))
        lo, hi = int(g[j - 1]), int(g[j])
        (vl, ml), (vh, mh) = self.at(lo), self.at(hi)
        if vl.size != vh.size:  # a common probability grid
            q = (np.arange(max(vl.size, vh.size)) + 0.5) / max(vl.size, vh.size)
            vl, vh = np.quantile(vl, q, method="inverted_cdf"), np.quantile(vh, q, method="inverted_cdf")
        f = (k - lo) / (hi - lo)
        return (1 - f) * vl + f * vh, (1 - f) * ml + f * mh


def open_occupancy(at, grid, rate: float, mean_output: float, cap: int,
                   pct: float = 95.0) -> tuple[float, float]:
    """(mean occupancy N, TPOT percentile s) of one microbatch fed `rate` requests/s, from the
    evaluator `at` at the occupancies `grid` (sorted, from 1 to `cap`; between them `OnGrid`).

    N solves Little's law N = rate x mean output x mean TPOT(N) (the least fixed point, by
    iteration from 1: the right side is nondecreasing in N; mean TPOT linear between integers);
    the occupancy a token sees is then n Poisson(n; N) / N (an M/G/inf system: residents of an
    open system with ample slots are Poisson), beyond `cap` lumped at cap; the TPOT percentile is
    pooled over it. At full load (N = cap) it is the evaluator's at cap."""
    on = OnGrid(at, grid)

    def mean_at(x: float) -> float:
        lo = min(max(int(np.floor(x)), 1), cap)
        hi = min(lo + 1, cap)
        w = min(max(x - lo, 0.0), 1.0)
        return (1 - w) * on(lo)[1] + w * on(hi)[1]

    n = 1.0
    for _ in range(200):
        nxt = min(rate * mean_output * mean_at(n), float(cap))
        if abs(nxt - n) < 1e-6:
            break
        n = nxt
    if n >= cap:
        return float(cap), pooled_percentile(on, {int(cap): 1.0}, pct)
    ks = np.arange(max(1, int(n - 6 * np.sqrt(n) - 2)), int(n + 6 * np.sqrt(n) + 3))
    lg = np.array([math.lgamma(k + 1.0) for k in ks])
    pmf = np.exp(ks * math.log(n) - n - lg) * ks
    weight: dict[int, float] = {}
    for k, w in zip(np.minimum(ks, cap).tolist(), pmf.tolist()):
        weight[k] = weight.get(k, 0.0) + w
    return n, pooled_percentile(on, weight, pct)


def _decoded_share(req: PlanRequest, workload) -> float:
    """The share of the arrivals the decode copies serve: a trace's rows the window drops are
    prefilled (the prefill pool counts them) but never decoded; Poisson draws only kept requests."""
    if req.arrivals != "trace" or not workload.dropped:
        return 1.0
    return workload.requests / (workload.requests + workload.dropped)


def full_p95_ms(plan: Plan) -> float:
    """The plan's p95 TPOT with every microbatch full (a fixed --ctx: its one period)."""
    return plan.tpot.p95_ms if plan.tpot is not None else plan.tpot_ms


def load_grid(cap: int, points: int = LOAD_OCCUPANCIES) -> np.ndarray:
    """Log-spaced occupancies 1..cap (both ends), at most `points` of them."""
    return np.unique(np.geomspace(1, max(cap, 1), min(points, max(cap, 1))).round().astype(np.int64))


def has_load_figure(plan: Plan) -> bool:
    """Whether `load_tpot` gives a figure: a disaggregated deployment of one owner (several
    owners' replica barrier couples their occupancies)."""
    dep = plan.deployment
    return dep is not None and dep.mode == "disaggregated" and len(plan.owners) == 1


def load_tpot(plan: Plan, ctx, tmpl, sel, grid: np.ndarray | None = None) -> tuple[float, float] | None:
    """(mean occupancy per microbatch, p95 TPOT ms) of `plan`'s decode copies at its deployment's
    decoded arrival rate (`open_occupancy` over the evaluator at `grid`, default `load_grid`);
    `ctx, tmpl, sel`: the plan's placement compiled for its owners (`contract.plan_context`).
    None without a disaggregated deployment, or for several owners (their replica barrier couples
    the occupancies)."""
    from opweave_planner.compile import compile_request

    dep = plan.deployment
    if not has_load_figure(plan):
        return None
    cap = int(plan.owners[0].microbatch)
    grid = load_grid(cap) if grid is None else np.asarray(grid, np.int64)
    per = sel.mu * int(sel.replicas[0])
    at_grid = ctx.request.model_copy(update={"batches": tuple(int(g) * per for g in grid)})
    at = AtOccupancy(compile_request(at_grid, ctx.hw, ctx.seq.model), tmpl, sel)
    rate = dep.arrivals.rate * _decoded_share(ctx.request, ctx.workload)
    n, p = open_occupancy(at, grid, rate / (dep.copies * per), dep.arrivals.mean_output_tokens, cap)
    return n, p * 1e3


def with_load_tpot(plan: Plan, ctx, tmpl, sel) -> Plan:
    """`plan` with its deployment's TPOT at load recorded (schema 1.13) beside the full-occupancy
    guarantee; unchanged where `load_tpot` has no figure."""
    from opweave_planner.plan import plan_version

    got = load_tpot(plan, ctx, tmpl, sel)
    if got is None:
        return plan
    dep = plan.deployment.model_copy(update={
        "mean_occupancy_at_load": rounded(got[0]), "tpot_p95_at_load_ms": rounded(got[1]),
        "tpot_p95_full_occupancy_ms": full_p95_ms(plan)})
    doc = plan.model_copy(update={"deployment": dep})
    return doc.model_copy(update={"schema_version": plan_version(doc)})
