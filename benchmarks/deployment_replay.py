"""Closed-loop replay of a whole deployment (issue 27): arrivals through the prefill pool, the KV
hand-off and the decode copies, step by step, against the plan's p95 TTFT and p95 TPOT.

Usage:  python benchmarks/deployment_replay.py --plan P.json [--trace T] [--seeds 1,2,3] [--requests N]

An event simulation of the deployment a plan file describes, written apart from the planner's
own queue (`latency.ttft.replay`) and snapshot law (`search.evaluate`); what it shares with them
is the physics: prefill times from `latency.prefill.prefill` and decode step times from the
plan's stage tables (`workload_replay._stage_tables`, the evaluator's `stage_time`) and
schedule recurrence (`schedule.kernels._one_iteration`).

* **Arrivals.** The plan's: a trace's own timestamps at the plan's `rate_scale` (`--trace`: another
  trace, same scale), or seeded Poisson at the plan's recorded rate, one run per `--seeds` value
  (the plan was sized on seed 0). A request is one row of the trace (its prompt and output),
  drawn uniformly for Poisson; prompts capped one token below the plan's window, as the plan does.
* **Prefill pool** (disaggregated): `instances` servers, first come first served, each request to
  the server that frees first (lowest index on ties), **one request at a time per instance** (no
  batching of prompts across requests: what the plan assumes). Service time: `latency.prefill`
  at the request's own prompt length (every distinct length evaluated, no knots) on the pool's
  (GPU, TP), chunked at the pool's chunk; then the hand-off (prompt KV over the plan's link),
  which does not hold the instance.
* **Decode copies.** Every replica of every copy (one-owner plans) is a unit with `mu`
  microbatches of at most `microbatch` requests (continuous batching). A request whose KV has
  arrived is routed to the unit with the fewest resident + queued requests (lowest index on
  ties) and joins a microbatch at that microbatch's next step boundary when it has a free slot
  (FCFS; otherwise it waits). Each step, every resident request's context is its prompt plus the
  tokens it has decoded; the stage times of a microbatch are the plan's stage tables at the
  microbatch's **current occupancy** n (the evaluator's own tables compiled for every n from 1 to
  the microbatch) and its current mean context (linear between the plan's context knots), and
  the unit advances one iteration of the max-plus schedule. A request decodes its output length
  in steps, then leaves (its slot is free at that boundary). An idle unit waits for its next
  request.
* **TTFT**, three figures per request, all from its arrival: `ttft_kv` = queue wait + prefill +
  hand-off (the plan's definition: the KV is at the decode pool), `ttft_join` = until it joins a
  decode batch (adds the wait for a step boundary and for a free slot), `ttft_token` = until its
  first decode step ends (what a client of a decode-side first token sees).
* **TPOT**: one sample per decoded token after a request's first, the time since its previous
  token (= the step times it sat through); also one sample per step (unweighted).

The plan's decode TPOT is for fully occupied replicas (B resident requests, the stationary context
law). A deployment sized to whole copies runs below full occupancy, so the replayed TPOT can be
lower; the report therefore also gives the plan's own evaluator at the replayed occupancy: the
snapshot periods at each occupancy n the replay visited, pooled with the replay's token weights
(`predicted @ occupancy`): the same context law and step model, only the occupancy taken from
the replay.

`--mode aggregated` replays a plan's aggregated deployment (`deployment.aggregated`, schema 1.11):
R colocated replicas, each step its running decodes first then the waiting prompts' chunks up to
the chunk budget (vLLM V1), at most `batch` requests resident (`aggregated_pool`); the step time
is the aggregated mode's public `latency.mixed.mixed_step_us` (`MixedStep`), which needs a tree
with that module. TTFT there = until the step that completes the prompt ends.
"""

from __future__ import annotations

import argparse
import heapq
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload_replay import _stage_tables  # the plan's stage tables, one definition

# ----------------------------------------------------------------------------- the engine

@dataclass
class DecodeModel:
    """What the engine needs of the decode side: per stage j and occupancy n (0..cap) the stage
    time at each context knot (µs), the hand-off vectors, and the plan's shape."""

    stage_owner: np.ndarray
    kt: np.ndarray  # [S, cap + 1, G] µs; kt[:, 0] = 0 (an empty microbatch does not run)
    knots: np.ndarray  # [G] context tokens
    occ: np.ndarray
    latv: np.ndarray
    mu: int
    cap: int  # requests per microbatch (the plan's microbatch)
    units: int  # copies x replicas

    def stage_times(self, n: np.ndarray, x: np.ndarray) -> np.ndarray:
        """t2[j, i] (µs): stage j for microbatch i with n[i] residents at mean context x[i]."""
        s_n = self.stage_owner.size
        t2 = np.zeros((s_n, self.mu))
        for i in range(self.mu):
            if n[i]:
                for j in range(s_n):
                    t2[j, i] = np.interp(x[i], self.knots, self.kt[j, n[i]])
        return t2


@dataclass
class Requests:
    """The replayed requests, in arrival order (s, tokens)."""

    arrival: np.ndarray
    prompt: np.ndarray  # the prompt the prefill pool sees (capped below the window)
    decode_prompt: np.ndarray  # the context a request starts decoding at (the plan's shaped workload)
    output: np.ndarray  # decode steps (0: not decoded, the window drops it)
    source: str = ""


@dataclass
class Result:
    ttft_kv: np.ndarray
    ttft_join: np.ndarray
    ttft_token: np.ndarray
    tpot_token: np.ndarray  # s, one per decoded token after the first
    tpot_step: np.ndarray  # s, one per microbatch step
    occupancy: np.ndarray  # [cap + 1] token-weighted step counts at each occupancy (tokens decoded there)
    step_occupancy: np.ndarray  # [cap + 1] steps at each occupancy
    wait_prefill: np.ndarray
    wait_slot: np.ndarray  # join - KV ready
    span_s: float = 0.0
    extra: dict = field(default_factory=dict)


def prefill_pool(arrival: np.ndarray, service: np.ndarray, servers: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of each request's prefill: FCFS, to the server that frees first (lowest index
    on ties), one request per server at a time (a heap, not the planner's kernel)."""
    free = [(0.0, k) for k in range(servers)]
    heapq.heapify(free)
    start = np.empty_like(arrival)
    for i in range(arrival.size):
        t, k = heapq.heappop(free)
        start[i] = max(t, arrival[i])
        heapq.heappush(free, (start[i] + service[i], k))
    return start, start + service


def decode_pool(ready: np.ndarray, req: Requests, dm: DecodeModel) -> dict:
    """Step-level continuous batching of the requests whose KV arrives at `ready` (s)."""
    from opweave_planner.schedule.kernels import _one_iteration
    n_req = ready.size
    k = int(dm.stage_owner.max()) + 1
    mu, cap, units = dm.mu, dm.cap, dm.units
    state = [np.zeros(3 * k + mu) for _ in range(units)]
    res = [[[] for _ in range(mu)] for _ in range(units)]  # resident request ids per microbatch
    pend = [deque() for _ in range(units)]
    load = np.zeros(units, np.int64)  # resident + queued per unit (the router's view)
    scheduled = [False] * units
    age = np.zeros(n_req, np.int64)
    last = np.zeros(n_req)
    join = np.full(n_req, np.nan)
    first = np.full(n_req, np.nan)
    tp_tok, tp_step = [], []
    occ_tok = np.zeros(cap + 1)
    occ_step = np.zeros(cap + 1)
    ctx0 = req.decode_prompt.astype(np.float64)
    out = req.output.astype(np.int64)
    order = np.argsort(ready, kind="stable")
    events: list[tuple[float, int, int]] = [(float(ready[r]), 0, int(r)) for r in order]  # (t, 0: ready | 1: unit)
    heapq.heapify(events)
    bound = [np.zeros(mu) for _ in range(units)]  # each microbatch's last step boundary
    while events:
        t, kind, who = heapq.heappop(events)
        if kind == 0:  # KV arrived: route to the least-loaded unit
            if out[who] == 0:  # the window drops it: prefilled, never decoded
                continue
            u = int(np.argmin(load))
            load[u] += 1
            pend[u].append(who)
            if not scheduled[u]:
                scheduled[u] = True
                x = state[u]
                np.maximum(x, t, out=x)  # an idle unit starts now
                bound[u][:] = t
                heapq.heappush(events, (t, 1, u))
            continue
        u = who
        x = state[u]
        n = np.zeros(mu, np.int64)
        mean = np.zeros(mu)
        for i in range(mu):  # admissions at each microbatch's boundary, FCFS among the arrived
            mb = res[u][i]
            q = pend[u]
            while q and len(mb) < cap and ready[q[0]] <= bound[u][i] + 1e-12:
                r = q.popleft()
                mb.append(r)
                join[r] = bound[u][i]
            n[i] = len(mb)
            if n[i]:
                mean[i] = float(np.mean(ctx0[mb] + age[mb]))
        if not n.any():  # nothing resident: idle until a request arrives (or one queued is ready)
            if pend[u]:
                t_next = float(ready[pend[u][0]])
                np.maximum(x, t_next, out=x)
                bound[u][:] = t_next
                heapq.heappush(events, (t_next, 1, u))
            else:
                scheduled[u] = False
            continue
        t2 = dm.stage_times(n, mean) / 1e6
        _one_iteration(dm.stage_owner, t2, dm.occ, dm.latv, mu, k, x)
        for i in range(mu):
            mb = res[u][i]
            if not mb:
                bound[u][i] = x[3 * k + i]
                continue
            end = x[3 * k + i]
            tp_step.append(end - bound[u][i])
            occ_step[n[i]] += 1
            res[u][i], gone, samples = _decode_tokens(mb, end, age, last, out, first, tp_tok)
            load[u] -= gone
            occ_tok[n[i]] += samples
            bound[u][i] = end
        heapq.heappush(events, (float(x[3 * k:].max()), 1, u))
    return {"join": join, "first": first, "tpot_token": np.array(tp_tok), "tpot_step": np.array(tp_step),
            "occupancy": occ_tok, "step_occupancy": occ_step}


def _decode_tokens(ids, end, age, last, out, first, tp_tok) -> tuple[list, int, int]:
    """Every request in `ids` decodes one token ending at `end`: a TPOT sample (the time since its
    previous token), or its first token (`first` still NaN). Returns (ids still decoding, how many
    finished, samples taken)."""
    keep, gone, samples = [], 0, 0
    for r in ids:
        if np.isnan(first[r]):
            first[r] = end
        else:
            tp_tok.append(end - last[r])
            samples += 1
        last[r] = end
        age[r] += 1
        if age[r] >= out[r]:
            gone += 1
        else:
            keep.append(r)
    return keep, gone, samples


class MixedStep:
    """The step time (s) `aggregated_pool` calls, `(decode_contexts, segments)` with segments of
    (new tokens, cached prefix, prompt ends here): the aggregated mode's public mixed step-time
    function (`latency.mixed.mixed_step_us`, branch s9-agg27) on its step tables, tabulated at a
    few decode contexts of its own and read linearly at the step's mean decode context (each table
    read at its longest context, `mixed_step_us` without `contexts`: this replay's own knots, not
    the planner's)."""

    def __init__(self, tables: list, contexts: np.ndarray):
        from opweave_planner.latency.mixed import mixed_step_us

        self.tables, self.contexts, self.f = tables, np.asarray(contexts, np.float64), mixed_step_us

    def __call__(self, ctxs: np.ndarray, segs: list) -> float:
        ptr = np.array([0, len(segs)], np.int64)
        new = np.array([g[0] for g in segs], np.int64)
        pre = np.array([g[1] for g in segs], np.int64)
        ends = np.array([g[2] for g in segs], np.bool_)
        dec = np.array([ctxs.size], np.int64)
        at = [float(self.f(t, dec, ptr, new, pre, ends)[0]) for t in self.tables]
        x = float(ctxs.mean()) if ctxs.size else self.contexts[0]
        return float(np.interp(x, self.contexts, at)) / 1e6


def aggregated_pool(arrival: np.ndarray, req: Requests, step_s, units: int, cap: int, chunk: int,
                    round_robin: bool = False) -> dict:
    """Colocated replicas serving prefill and decode in one step (vLLM V1's scheduler): each step
    takes every running decode first (one token of the budget each), then the waiting prompts'
    next chunks in arrival order up to `chunk` tokens per step, with at most `cap` requests in a
    replica (prefilling or decoding). `step_s(decode_contexts, segments)` is the step's time. A
    request's TTFT ends with the step that completes its prompt (that step samples its first
    token, the first of its output); it then decodes the rest of its output in steps, from context
    = its prompt. Routing: at arrival, to the replica with the fewest requests (resident + waiting;
    lowest index on ties), or (`round_robin`) request i to replica i mod units."""
    n_req = arrival.size
    load = np.zeros(units, np.int64)
    wait = [deque() for _ in range(units)]  # requests not yet holding a slot
    pre = [[] for _ in range(units)]  # holding a slot, prompt not done: [id, tokens done]
    dec = [[] for _ in range(units)]  # decoding ids
    busy = [False] * units
    age = np.zeros(n_req, np.int64)
    last = np.zeros(n_req)
    first = np.full(n_req, np.nan)
    tp_tok, tp_step, mixed = [], [], []
    events = [(float(arrival[r]), 0, int(r)) for r in range(n_req)]
    heapq.heapify(events)
    prompt, out = req.prompt.astype(np.int64), req.output.astype(np.int64)
    while events:
        t, kind, who = heapq.heappop(events)
        if kind == 0:
            u = who % units if round_robin else int(np.argmin(load))
            load[u] += 1
            wait[u].append(who)
            if not busy[u]:
                busy[u] = True
                heapq.heappush(events, (t, 1, u))
            continue
        u = who
        while wait[u] and len(pre[u]) + len(dec[u]) < cap:
            pre[u].append([wait[u].popleft(), 0])
        if not pre[u] and not dec[u]:
            busy[u] = False
            continue
        ctxs = np.array([req.decode_prompt[r] + age[r] for r in dec[u]], dtype=np.float64)
        room = chunk - len(dec[u])
        segs, took = [], []
        for item in pre[u]:
            if room <= 0:
                break
            r, got = item
            take = min(room, int(prompt[r]) - got)
            segs.append((take, got, take + got == prompt[r]))
            took.append((item, take))
            room -= take
        dt = float(step_s(ctxs, segs))
        end = t + dt
        tp_step.append(dt)
        mixed.append(bool(segs))
        keep, gone, _samples = _decode_tokens(dec[u], end, age, last, out, first, tp_tok)
        load[u] -= gone
        for item, take in took:
            item[1] += take
            r = item[0]
            if item[1] >= prompt[r]:
                first[r] = end
                last[r] = end
                age[r] = 1  # the step that ends the prompt samples the first output token
                if out[r] > 1:
                    keep.append(r)
                else:
                    load[u] -= 1
        pre[u] = [it for it in pre[u] if it[1] < prompt[it[0]]]
        dec[u] = keep
        heapq.heappush(events, (end, 1, u))
    return {"first": first, "tpot_token": np.array(tp_tok), "tpot_step": np.array(tp_step),
            "mixed": np.array(mixed)}


def replay(req: Requests, service: np.ndarray, handoff: np.ndarray, servers: int, dm: DecodeModel) -> Result:
    """The whole disaggregated deployment: prefill pool, hand-off, decode units."""
    start, end = prefill_pool(req.arrival, service, servers)
    ready = end + handoff
    d = decode_pool(ready, req, dm)
    a = req.arrival
    return Result(ttft_kv=ready - a, ttft_join=d["join"] - a, ttft_token=d["first"] - a,
                  tpot_token=d["tpot_token"], tpot_step=d["tpot_step"], occupancy=d["occupancy"],
                  step_occupancy=d["step_occupancy"], wait_prefill=start - a, wait_slot=d["join"] - ready,
                  span_s=float(np.nanmax(d["first"]) - a[0]))


# ----------------------------------------------------------------------------- from a plan file

def decode_model(plan, trace: str | None = None):
    """(DecodeModel, compiled context, problem for every occupancy, selection) of a one-owner plan."""
    from opweave_planner.compile import compile_request
    from opweave_planner.contract import plan_context
    from opweave_planner.errors import UserError
    from opweave_planner.search.evaluate import evaluate

    over = {} if trace is None else {"workload": trace}
    ctx, tmpl, sel = plan_context(plan, where="deployment replay", **over)
    if len(plan.owners) != 1:
        raise UserError(f"deployment replay: the plan has {len(plan.owners)} owners; expected a one-owner plan "
                        f"(several owners' replica barrier is not replayed here)")
    if ctx.context_knots == 0:
        raise UserError("deployment replay: the plan has a fixed --ctx; expected a --workload plan (its "
                        "requests' lengths are what the replay decodes)")
    prob = ctx.problem(tmpl, batches=(sel.batch,))
    ev = evaluate(prob, sel)
    bh = int(prob.mb_grid[sel.mb[0]])
    # the same request compiled with every batch up to B: its microbatch grid holds every n <= bh
    every = ctx.request.model_copy(update={"batches": tuple(range(1, sel.batch + 1))})
    allc = compile_request(every, ctx.hw, ctx.seq.model)
    grid = allc.tables.grid.mb_index
    pall = allc.problem(tmpl, batches=(sel.batch,))
    kt = np.zeros((prob.stage_owner.size, bh + 1, prob.knots.size))
    for n in range(1, bh + 1):
        kt[:, n], _mem = _stage_tables(pall, sel._replace(mb=np.array([grid[n]], np.int64)), allc.tables)
    assert np.allclose(kt[:, bh], _stage_tables(prob, sel, ctx.tables)[0]), "occupancy tables disagree with the plan's"
    units = plan.deployment.copies * int(sel.replicas[0])
    dm = DecodeModel(np.asarray(prob.stage_owner), kt, np.asarray(prob.knots), ev.occ, ev.latv, sel.mu, bh, units)
    return dm, ctx, allc, tmpl, sel


def requests_of(plan, ctx, trace: str | None, seed: int, n: int | None) -> Requests:
    """The plan's arrivals (a trace's timestamps at its rate scale, or seeded Poisson at its rate);
    each request one row of the trace: its raw prompt for the prefill pool (capped below the window,
    as the plan does), and what the shaped workload serves of it for the decode copies
    (`shaping.fit_requests` at the plan's prompt scale; a row the window drops is prefilled, as the
    plan counts it, but not decoded: output 0)."""
    from opweave_planner.errors import UserError
    from opweave_planner.workload.arrivals import from_trace, poisson
    from opweave_planner.workload.reader import read_trace
    from opweave_planner.workload.shaping import fit_requests

    rec = plan.deployment.arrivals
    wl = ctx.workload
    path = trace or ctx.request.workload
    if not np.all(np.diff(_file_times(path)) >= 0):
        raise UserError(f"deployment replay: {path} is not in timestamp order; expected a time-sorted trace")
    raw = from_trace(path)  # file order: the file is time-sorted and the sort is stable
    rows = read_trace(path)
    if not np.array_equal(rows.prompt, raw.prompts):
        raise UserError(f"deployment replay: {path}: the timestamped rows are not the trace's rows")
    p = np.rint(rows.prompt * wl.scale).astype(np.int64) if wl.scale != 1.0 else rows.prompt.astype(np.int64)
    o = rows.output.astype(np.int64)
    keep = np.ones(p.size, bool)
    if wl.spec.max_model_len is not None:
        p, o, keep, _ = fit_requests(p, o, wl.spec.max_model_len, wl.spec.overflow)
    if not (np.array_equal(p[keep], wl.prompt) and np.array_equal(o[keep], wl.output)):
        raise UserError(f"deployment replay: {path}: the rows, shaped, are not the plan's workload")
    o = np.where(keep, o, 0)
    if rec.process == "trace":
        times = from_trace(path, rec.rate_scale or 1.0).times_s
        idx = np.arange(times.size)
        if n is not None:
            times, idx = times[:n], idx[:n]
        source = f"{Path(path).name} x{rec.rate_scale or 1.0:g}"
    else:  # kept row indices drawn by the arrivals' own generator, as the plan draws the kept requests
        arr = poisson(rec.rate, n or rec.requests, np.nonzero(keep)[0], seed)
        times, idx, source = arr.times_s, arr.prompts, arr.source
    capped = np.maximum(np.minimum(raw.prompts[idx], max(plan.workload.window - 1, 1)), 1)
    return Requests(times, capped.astype(np.int64), p[idx], o[idx], source)


def _file_times(path) -> np.ndarray:
    """The trace's timestamps in file order (rows pair with the shaped workload's only if sorted)."""
    from opweave_planner.workload.arrivals import _csv, _jsonl

    f = Path(path)
    text = f.read_text(encoding="utf-8")
    return np.asarray((_jsonl if f.suffix == ".jsonl" else _csv)(f, text)[0])


def prefill_times(plan, ctx, prompts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(prefill s, hand-off s) of each request on the plan's prefill instance, every distinct length."""
    from opweave_planner.latency.prefill import prefill

    pool = plan.deployment.prefill
    gpu = ctx.hw.resolve(pool.gpu)
    net = ctx.hw.network
    r = ctx.request
    lengths, inv = np.unique(prompts, return_inverse=True)
    got = np.array([[e.prefill_ms / 1e3, e.handoff_ms / 1e3] for e in (
        prefill(ctx.seq, gpu, pool.tensor_parallel, int(p), chunk_tokens=pool.chunk_tokens,
                profiles_dir=r.profiles, backend=r.backend, moe_routing=r.moe_routing, moe_ep=False,
                link_gbps=net.inter_node_gbps, link_latency_us=net.inter_node_latency_us) for p in lengths)])
    return got[inv, 0], got[inv, 1]


def _q(x: np.ndarray, p: float) -> float:
    """A percentile over the requests that have the figure (NaN: not decoded)."""
    return float(np.nanpercentile(x, p))


def run_plan(path: str, trace: str | None, seeds: list[int], n: int | None, load: float = 1.0,
             instances: int | None = None) -> list:
    """Replay the plan's deployment once per seed (a trace: once). `load` > 1 and `instances` are a
    stress run, not the plan's deployment: arrivals `load` times faster through `instances` prefill
    servers (to fill the decode slots and check the replay against the plan's full-occupancy TPOT)."""
    from opweave_planner.contract import read_feasible_plan
    from opweave_planner.deployment import AtOccupancy, open_occupancy, pooled_percentile
    from opweave_planner.errors import UserError

    plan = read_feasible_plan(path)
    dep = plan.deployment
    if dep is None or dep.mode is None:
        raise UserError(f"{path}: deployment.mode is absent (a decode-only plan); expected a whole deployment "
                        f"(--ttft with a rate)")
    t0 = time.perf_counter()
    dm, ctx, allc, tmpl, sel = decode_model(plan, trace)
    t_model = time.perf_counter() - t0
    at = AtOccupancy(allc, tmpl, sel)
    runs = []
    for seed in (seeds if dep.arrivals.process == "poisson" else seeds[:1]):
        t0 = time.perf_counter()
        rq = requests_of(plan, ctx, trace, seed, n)
        rq.arrival = rq.arrival / load
        service, handoff = prefill_times(plan, ctx, rq.prompt)
        t_pre = time.perf_counter() - t0
        t0 = time.perf_counter()
        r = replay(rq, service, handoff, instances or dep.prefill.instances, dm)
        t_rep = time.perf_counter() - t0
        from opweave_planner.latency.ttft import ttft_stats

        servers, pct = instances or dep.prefill.instances, dep.prefill.ttft_percentile
        kernel = ttft_stats(rq.arrival, service, servers, handoff, pct).percentile_s  # the planner's queue
        kernel_up = ttft_stats(rq.arrival, service * 1.01, servers, handoff, pct).percentile_s  # its sensitivity
        occ_pred = pooled_percentile(at, dict(enumerate(r.occupancy.tolist())))
        decoded = rq.output > 0
        rate_u = (decoded.sum() - 1) / max(float(rq.arrival[decoded][-1] - rq.arrival[decoded][0]), 1e-12) / dm.units
        open_n, open_p95 = open_occupancy(at, np.arange(1, dm.cap + 1), rate_u / dm.mu,
                                          float(rq.output[decoded].mean()), dm.cap)
        mean_occ = float((np.arange(dm.cap + 1) * r.step_occupancy).sum() / r.step_occupancy.sum())
        runs.append({"seed": seed if dep.arrivals.process == "poisson" else None, "requests": rq.arrival.size,
                     "source": rq.source, "r": r, "occ_pred_s": occ_pred, "mean_occupancy": mean_occ, "kernel_ttft_s": kernel, "kernel_up_s": kernel_up,
                     "open_n": open_n, "open_p95_s": open_p95,
                     "t_model": t_model, "t_prefill": t_pre, "t_replay": t_rep})
    return [plan, dm, runs]


def report(path: str, plan, dm, runs) -> None:
    from opweave_planner.deployment import KNOT_TOL, KNOTS

    dep, pool, tp = plan.deployment, plan.deployment.prefill, plan.tpot
    print(f"{path}: {plan.model}, decode {dep.copies} cop{'y' if dep.copies == 1 else 'ies'} x "
          f"{plan.owners[0].replicas} replica(s) of {plan.owners[0].gpu} TP{plan.owners[0].tensor_parallel}, "
          f"{dm.mu} x {dm.cap} requests ({dm.units} units); prefill {pool.instances}x {pool.gpu} "
          f"TP{pool.tensor_parallel}, chunk {pool.chunk_tokens}; arrivals {dep.arrivals.process} at "
          f"{dep.arrivals.rate:.4g} req/s")
    for run in runs:
        r = run["r"]
        tag = f"seed {run['seed']}" if run["seed"] is not None else run["source"]
        print(f" {tag}: {run['requests']:,} requests over {r.span_s:.1f} s (prefill times {run['t_prefill']:.1f} s, "
              f"replay {run['t_replay']:.1f} s, decode tables {run['t_model']:.1f} s)")
        p = pool.ttft_percentile
        print(f"  TTFT p{p:g} ms: predicted {pool.ttft_ms:.1f}; replayed kv {_q(r.ttft_kv, p) * 1e3:.1f} "
              f"(ratio {pool.ttft_ms / 1e3 / _q(r.ttft_kv, p):.4f}), join {_q(r.ttft_join, p) * 1e3:.1f} "
              f"(ratio {pool.ttft_ms / 1e3 / _q(r.ttft_join, p):.4f}), first decode token "
              f"{_q(r.ttft_token, p) * 1e3:.1f} (ratio {pool.ttft_ms / 1e3 / _q(r.ttft_token, p):.4f})")
        print(f"  (the planner's queue, latency.ttft.replay, on this replay's per-length prefill times: p{p:g} "
              f"{run['kernel_ttft_s'] * 1e3:.1f} ms, with every prefill 1 % longer {run['kernel_up_s'] * 1e3:.1f} ms; "
              f"the plan's figure reads its prefill times off "
              f"lengths evaluated exactly past {KNOTS} distinct ones: {KNOTS} log-spaced, both sides of every chunk "
              f"step, and midpoints where the line is off by more than {KNOT_TOL:g}; linear between)")
        decoded = ~np.isnan(r.ttft_token)
        if not decoded.all():
            print(f"  ({int((~decoded).sum())} requests the window drops are prefilled, not decoded: kv p{p:g} over "
                  f"the decoded ones {_q(r.ttft_kv[decoded], p) * 1e3:.1f} ms)")
        print(f"  TTFT p50 ms: replayed kv {_q(r.ttft_kv, 50) * 1e3:.1f}, join {_q(r.ttft_join, 50) * 1e3:.1f}, "
              f"token {_q(r.ttft_token, 50) * 1e3:.1f}; mean kv {r.ttft_kv.mean() * 1e3:.1f} (predicted "
              f"{pool.ttft_mean_ms:.1f}); mean prefill wait {r.wait_prefill.mean() * 1e3:.1f} (predicted "
              f"{pool.wait_mean_ms:.1f}); slot wait mean {np.nanmean(r.wait_slot) * 1e3:.2f} p95 "
              f"{_q(r.wait_slot, 95) * 1e3:.2f}")
        q = _q(r.tpot_token, 95)
        print(f"  TPOT p95 ms: predicted {tp.p95_ms:.3f} (full occupancy {dm.cap}); replayed per token {q * 1e3:.3f} "
              f"(ratio {tp.p95_ms / 1e3 / q:.4f}), per step {_q(r.tpot_step, 95) * 1e3:.3f}; p50 per token "
              f"{_q(r.tpot_token, 50) * 1e3:.3f} (predicted {tp.p50_ms:.3f})")
        print(f"  occupancy: mean {run['mean_occupancy']:.1f} of {dm.cap} per step; predicted @ replayed "
              f"occupancy p95 {run['occ_pred_s'] * 1e3:.3f} ms (ratio {run['occ_pred_s'] / q:.4f}); open-system "
              f"prediction (Little + Poisson occupancy, no replay input): mean occupancy {run['open_n']:.1f}, p95 "
              f"{run['open_p95_s'] * 1e3:.3f} ms (ratio {run['open_p95_s'] / q:.4f})")


AGG_CONTEXT_KNOTS = 5  # decode contexts the mixed step tables are built at (linear between them)


AS_PLANNED = ("context", "outputs", "routing")


def run_aggregated(path: str, plan, trace: str | None, seeds: list[int], n: int | None,
                   as_planned: tuple[str, ...] = ()) -> list:
    """Replay the plan's aggregated deployment (`deployment.aggregated`) once per seed (a trace: once).
    `as_planned`: with some of the aggregated planner's own simplifications instead (`context`:
    every decode at the plan's context_tokens; `outputs`: every output the mean output; `routing`:
    round-robin), to check the engine against the plan and to split the gap into its causes."""
    from opweave_planner.contract import plan_context
    from opweave_planner.errors import UserError

    agg = plan.deployment.aggregated
    if agg is None:
        raise UserError(f"{path}: deployment.aggregated is absent; expected an aggregated deployment (schema 1.11)")
    try:
        from opweave_planner.latency.mixed import step_tables
    except ImportError:
        raise UserError("aggregated replay: this tree has no latency.mixed (the aggregated mode's step-time "
                        "function)") from None
    over = {} if trace is None else {"workload": trace}
    ctx, _tmpl, _sel = plan_context(plan, where="deployment replay", **over)
    if ctx.context_knots == 0:
        raise UserError("deployment replay: the plan has a fixed --ctx; expected a --workload plan")
    r_ = ctx.request
    gpu = ctx.hw.resolve(agg.gpu)
    runs = []
    memo: dict = {}
    for seed in (seeds if plan.deployment.arrivals.process == "poisson" else seeds[:1]):
        t0 = time.perf_counter()
        rq = requests_of(plan, ctx, trace, seed, n)
        live = rq.output > 0  # the rows the window drops decode nothing
        lo, hi = float(rq.decode_prompt[live].min()), float((rq.decode_prompt + rq.output)[live].max())
        knots = np.unique(np.geomspace(max(lo, 1.0), max(hi, 2.0), AGG_CONTEXT_KNOTS).round().astype(np.int64))
        if "context" in as_planned:
            knots = np.array([int(plan.workload.context_tokens)])
        if "outputs" in as_planned:
            mean_out = max(1, round(float(plan.deployment.arrivals.mean_output_tokens)))  # as the planner
            rq.output = np.full(rq.output.shape, mean_out, np.int64)
        top = int(rq.prompt.max())
        tabs = []
        for c in knots:
            key = (int(c), top)
            if key not in memo:
                memo[key] = step_tables(ctx.seq, gpu, agg.tensor_parallel, int(c), agg.batch, agg.chunk_tokens, top,
                                        profiles_dir=r_.profiles, backend=r_.backend, moe_routing=r_.moe_routing)
            tabs.append(memo[key])
        t_tab = time.perf_counter() - t0
        t0 = time.perf_counter()
        d = aggregated_pool(rq.arrival, rq, MixedStep(tabs, knots), agg.replicas, agg.batch, agg.chunk_tokens,
                            round_robin="routing" in as_planned)
        runs.append({"seed": seed if plan.deployment.arrivals.process == "poisson" else None,
                     "requests": rq.arrival.size, "source": rq.source, "ttft": d["first"] - rq.arrival,
                     "tpot_token": d["tpot_token"], "mixed": float(d["mixed"].mean()), "knots": knots,
                     "t_tables": t_tab, "t_replay": time.perf_counter() - t0})
    return runs


def report_aggregated(path: str, plan, runs) -> None:
    agg = plan.deployment.aggregated
    print(f"{path}: {plan.model}, aggregated {agg.replicas}x {agg.gpu} TP{agg.tensor_parallel}, batch {agg.batch}, "
          f"chunk {agg.chunk_tokens}; arrivals {plan.deployment.arrivals.process} at "
          f"{plan.deployment.arrivals.rate:.4g} req/s (plan's mode: {plan.deployment.mode})")
    p = plan.deployment.prefill.ttft_percentile
    for run in runs:
        tag = f"seed {run['seed']}" if run["seed"] is not None else run["source"]
        tt, q = _q(run["ttft"], p), _q(run["tpot_token"], agg.tpot_percentile)
        print(f" {tag}: {run['requests']:,} requests (step tables at contexts {run['knots'].tolist()}: "
              f"{run['t_tables']:.1f} s, replay {run['t_replay']:.1f} s)")
        print(f"  TTFT p{p:g} ms: predicted {agg.ttft_ms:.1f}; replayed {tt * 1e3:.1f} (ratio {agg.ttft_ms / 1e3 / tt:.4f})"
              f"; mean {np.nanmean(run['ttft']) * 1e3:.1f} (predicted {agg.ttft_mean_ms:.1f})")
        print(f"  TPOT p{agg.tpot_percentile:g} ms: predicted {agg.tpot_ms:.3f}; replayed per token {q * 1e3:.3f} "
              f"(ratio {agg.tpot_ms / 1e3 / q:.4f}); mean {run['tpot_token'].mean() * 1e3:.3f} (predicted "
              f"{agg.tpot_mean_ms:.3f}); mixed steps {run['mixed']:.3f} (predicted {agg.mixed_step_share:.3f})")
        print(f"| {Path(path).name} {tag} aggregated | {agg.ttft_ms:.1f} | {tt * 1e3:.1f} ({agg.ttft_ms / 1e3 / tt:.3f}) | "
              f"{agg.tpot_ms:.2f} | {q * 1e3:.2f} ({agg.tpot_ms / 1e3 / q:.3f}) |")


def compare_knots(path: str) -> None:
    """The plan's prefill times (deployment._options: refined interpolation past KNOTS distinct lengths)
    against every length's own (`prefill_times`), on the plan's first replayed arrivals."""
    from opweave_planner.contract import plan_context, read_feasible_plan
    from opweave_planner.deployment import _options

    plan = read_feasible_plan(path)
    ctx, _t, _s = plan_context(plan, where="deployment replay")
    rq = requests_of(plan, ctx, None, 1, None)
    t0 = time.perf_counter()
    exact, _h = prefill_times(plan, ctx, rq.prompt)
    t_exact = time.perf_counter() - t0
    full, _t, _s = plan_context(plan, where="deployment replay", searched=True)
    pool = plan.deployment.prefill
    t0 = time.perf_counter()
    options = _options(full.request, full.seq, full.hw, rq.prompt)
    t_plan = time.perf_counter() - t0
    opt = next(o for o in options if (o.gpu, o.tp) == (pool.gpu, pool.tensor_parallel))
    rel = np.abs(opt.service_s / exact - 1)
    print(f"  plan's prefill times vs every length's own: per request max |relative difference| {rel.max():.4f}, "
          f"mean {rel.mean():.6f}; of the mean {opt.service_s.mean() / exact.mean() - 1:+.5f} "
          f"({np.unique(rq.prompt).size} distinct lengths); the plan's times for all {len(options)} options "
          f"{t_plan:.2f} s, every length's own for this one option {t_exact:.2f} s")


def summary(path: str, plan, runs) -> None:
    """One markdown row per run: predicted vs replayed p95 TTFT (kv and first decode token) and
    p95 TPOT (raw, the evaluator at the replayed occupancy, the open-system prediction on every
    occupancy, and the plan's recorded `tpot_p95_at_load_ms` on its coarser grid)."""
    pool, tp = plan.deployment.prefill, plan.tpot
    p = pool.ttft_percentile
    at_load = plan.deployment.tpot_p95_at_load_ms  # the plan's own load-aware figure (schema 1.12)
    for run in runs:
        r = run["r"]
        tag = f"seed {run['seed']}" if run["seed"] is not None else run["source"]
        q = _q(r.tpot_token, 95)
        load = "-" if at_load is None else f"{at_load:.2f} ({at_load / 1e3 / q:.3f})"
        kv, tok, q = _q(r.ttft_kv, p), _q(r.ttft_token, p), _q(r.tpot_token, 95)
        print(f"| {Path(path).name} {tag} | {pool.ttft_ms:.1f} | {kv * 1e3:.1f} ({pool.ttft_ms / 1e3 / kv:.3f}) | "
              f"{tok * 1e3:.1f} ({pool.ttft_ms / 1e3 / tok:.3f}) | {tp.p95_ms:.2f} | {q * 1e3:.2f} "
              f"({tp.p95_ms / 1e3 / q:.3f}) | {run['occ_pred_s'] * 1e3:.2f} ({run['occ_pred_s'] / q:.3f}) | "
              f"{run['open_p95_s'] * 1e3:.2f} ({run['open_p95_s'] / q:.3f}) | {load} | "
              f"{run['mean_occupancy']:.1f} ({run['open_n']:.1f}) / {plan.owners[0].microbatch} |")


def main(argv=None) -> int:
    from opweave_planner.errors import UserError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, help="a disaggregated plan file (schema 1.10)")
    ap.add_argument("--trace", default=None, help="replay this trace instead of the plan's (same rate scale)")
    ap.add_argument("--seeds", default="1,2,3", help="Poisson arrivals: one replay per seed (comma list)")
    ap.add_argument("--requests", type=int, default=None, help="replay only the first N requests (trace) "
                    "or N Poisson arrivals (default: as many as the plan replayed)")
    ap.add_argument("--mode", choices=("disaggregated", "aggregated"), default="disaggregated",
                    help="which of the plan's deployments to replay (a schema-1.11 plan records both)")
    ap.add_argument("--as-planned", default="", help="aggregated: keep these of the planner's simplifications "
                    "(comma list of context: decodes at context_tokens, outputs: mean outputs, routing: "
                    "round-robin), to check the engine against the plan")
    ap.add_argument("--compare-knots", action="store_true", help="also compare the plan's interpolated "
                    "prefill times with every prompt length's own")
    ap.add_argument("--load", type=float, default=1.0, help="stress run: arrivals this many times faster "
                    "than the plan's (the predicted TTFT then does not apply)")
    ap.add_argument("--prefill-instances", type=int, default=None, help="stress run: this many prefill servers")
    a = ap.parse_args(argv)
    if not a.load > 0 or (a.prefill_instances is not None and a.prefill_instances < 1):
        print("error: --load expects a positive factor, --prefill-instances a positive count", file=sys.stderr)
        return 2
    try:
        seeds = [int(s) for s in a.seeds.split(",")]
        if a.mode == "aggregated":
            from opweave_planner.contract import read_feasible_plan

            plan = read_feasible_plan(a.plan)
            keep = tuple(a.as_planned.split(",")) if a.as_planned else ()
            if any(k not in AS_PLANNED for k in keep):
                print(f"error: --as-planned {a.as_planned}: expected a comma list of {', '.join(AS_PLANNED)}",
                      file=sys.stderr)
                return 2
            runs = run_aggregated(a.plan, plan, a.trace, seeds, a.requests, keep)
            if keep:
                print(f"AS PLANNED ({', '.join(keep)}): the aggregated planner's simplifications kept")
            report_aggregated(a.plan, plan, runs)
            return 0
        plan, dm, runs = run_plan(a.plan, a.trace, seeds, a.requests, a.load, a.prefill_instances)
    except (UserError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.load != 1.0 or a.prefill_instances is not None:
        print(f"STRESS RUN: arrivals x{a.load:g}, {a.prefill_instances or plan.deployment.prefill.instances} "
              f"prefill instances (not the plan's deployment; its TTFT prediction does not apply)")
    report(a.plan, plan, dm, runs)
    if a.compare_knots:
        compare_knots(a.plan)
    summary(a.plan, plan, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
