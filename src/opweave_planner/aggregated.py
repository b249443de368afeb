"""The aggregated deployment: R colocated replicas that serve prefill and decode together, with
chunked prefill inside the decode steps, sized for the arrivals under both SLOs.

A candidate is (GPU type, TP, resident batch B = vLLM's max_num_seqs, chunk = its
max_num_batched_tokens). Its arrivals are dealt round-robin to R replicas (request i to replica
i mod R) and each replica is replayed step by step (`latency.mixed.replay`): every step's time
is the colocated step at its decode batch plus its prefill chunk, so the TPOT percentile is over
the decode tokens of mixed and pure steps alike (each token waits its step), and TTFT is the
queue wait for the chunk budget plus the steps that carry the prompt's chunks.

Exact over the enumeration: R is feasible when R replicas can carry the decode load at all
(R >= `stable_replicas`, R x B / pure step at B >= rate x mean output) and the replay meets both
SLOs. The (candidate, R) pairs are replayed best first by cost R x TP x price (ties: fewer GPUs,
GPU id, TP, B, chunk), each candidate from that floor upward, so the first pair meeting both
SLOs is the cheapest feasible one (no monotonicity in R is assumed) and no dearer pair is
replayed. Two bounds end a candidate that cannot succeed, both valid for every R: `ttft_floor`
(no TTFT is below its prompt's tokens through the linear operators at their cheapest per-token
step) refuses a candidate without a replay, and from `isolated_replicas` on every replica serves
its requests one at a time, so every larger R replays the same figures. A brute force over every (candidate, R) checks it
(tests/test_aggregated.py).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from opweave_planner.errors import UserError
from opweave_planner.inputs.request import MAX_GPU_BUDGET, PlanRequest
from opweave_planner.latency.mixed import StepTables, replay_replica
from opweave_planner.plan.io import rounded
from opweave_planner.plan.schema import AggregatedOut, Plan

__all__ = ["Candidate", "Figures", "Choice", "Closest", "CHUNK_CHOICES", "STEP_PERCENTILE", "weighted_percentile",
           "stable_replicas", "ttft_floor", "isolated_replicas", "load_context", "figures", "least_replicas", "choose",
           "tpot_percentile", "with_aggregated"]

#: chunk budgets searched besides the runtime's default (vLLM's max_num_batched_tokens); a smaller
#: chunk makes a mixed step shorter and a prompt take more of them
CHUNK_CHOICES = (512, 1024, 2048, 4096, 8192)
#: the step-TPOT percentile of a fixed --ctx, whose decode plan has no percentile to name (its
#: full-occupancy steps are all equal): the method's p95 over decode tokens, as a workload's default
STEP_PERCENTILE = 95.0


@dataclass(frozen=True, eq=False)
class Candidate:
    """One aggregated replica shape and its price per hour (one replica)."""

    tables: StepTables
    batch: int
    chunk: int
    usd_per_hour: float

    @property
    def gpu(self) -> str:
        return self.tables.gpu

    @property
    def tp(self) -> int:
        return self.tables.tp

    def key(self, replicas: int) -> tuple:
        return (replicas * self.usd_per_hour, replicas * self.tp, self.gpu, self.tp, self.batch, self.chunk)


@dataclass(frozen=True)
class Figures:
    """A replay of the arrivals through R replicas of a candidate (times in s)."""

    replicas: int
    tpot_s: float  # the percentile over decode tokens
    tpot_mean_s: float
    ttft_s: float
    ttft_mean_s: float
    mixed_share: float  # of the steps with decodes, those that also carried a prefill chunk
    binding: str = ""  # what R - 1 replicas broke (least_replicas): throughput, tpot or ttft


@dataclass(frozen=True)
class Choice:
    candidate: Candidate
    figures: Figures

    @property
    def usd_per_hour(self) -> float:
        return self.figures.replicas * self.candidate.usd_per_hour


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The least value whose cumulative weight reaches q % of the total (the inverted CDF): the
    q-th percentile of the decode tokens when each step's time is weighted by its decodes."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order], dtype=np.float64)
    at = int(np.searchsorted(cum, q / 100.0 * cum[-1], side="left"))
    return float(values[order][min(at, values.size - 1)])


def load_context(prompts: np.ndarray, outputs: np.ndarray) -> float:
    """The mean context over the decode tokens: request i decodes outputs[i] - 1 tokens at
    contexts prompts[i] + 1 ... prompts[i] + outputs[i] - 1 (its first token ends its prefill)."""
    p, o = np.asarray(prompts, np.float64), np.asarray(outputs, np.float64)
    tokens = o - 1.0
    if tokens.sum() <= 0:
        return float(p.mean() + 1.0)
    return float((tokens * (p + o / 2.0)).sum() / tokens.sum())


def stable_replicas(cand: Candidate, rate: float, mean_output: float, context: float | None = None) -> int:
    """The fewest replicas that can carry the decode load at all: each emits at most B tokens per
    pure decode step at B (a mixed step is longer), so fewer than this queue without bound.
    `context`: the decode tokens' mean context (`load_context`; None: the tables' longest)."""
    per_replica = cand.batch / (cand.tables.decode_step_us(cand.batch, context) * 1e-6)
    return max(1, math.ceil(rate * mean_output / per_replica - 1e-9))


@dataclass(frozen=True, eq=False)
class _Replayed:
    """The pooled replay of R replicas: TTFT per request, decode steps (s, decodes, mixed)."""

    replicas: int
    ttft: np.ndarray
    dur: np.ndarray
    dec: np.ndarray
    mix: np.ndarray

    def ttft_percentile(self, ttft_pct: float) -> float:
        return float(np.percentile(self.ttft, ttft_pct))

    def tpot_met(self, slo_s: float, tpot_pct: float) -> bool:
        """TPOT without a sort: the inverted-CDF percentile is <= slo_s exactly when the decodes of
        steps within slo_s reach tpot_pct % of them."""
        total = float(self.dec.sum())
        return total == 0 or float(self.dec[self.dur <= slo_s].sum()) >= tpot_pct / 100.0 * total

    def within_share(self, slo_s: float) -> float:
        """The share of decode tokens whose step is within slo_s (1: no decodes)."""
        total = float(self.dec.sum())
        return 1.0 if total == 0 else float(self.dec[self.dur <= slo_s].sum()) / total

    def meets(self, slo_s: float, ttft_s: float, tpot_pct: float, ttft_pct: float) -> bool:
        """Both SLOs at their percentiles."""
        return self.ttft_percentile(ttft_pct) <= ttft_s and self.tpot_met(slo_s, tpot_pct)

    def figures(self, tpot_pct: float, ttft_pct: float, binding: str = "") -> Figures:
        if self.dur.size == 0:
            tpot = tpot_mean = 0.0
        else:
            tpot = weighted_percentile(self.dur, self.dec, tpot_pct)
            tpot_mean = float((self.dur * self.dec).sum() / self.dec.sum())
        return Figures(self.replicas, tpot, tpot_mean, self.ttft_percentile(ttft_pct),
                       float(self.ttft.mean()), float(self.mix.mean()) if self.mix.size else 0.0, binding)


def _replayed(cand: Candidate, times: np.ndarray, prompts: np.ndarray, outputs: np.ndarray,
              replicas: int) -> _Replayed:
    until = float(times[-1])
    got = [replay_replica(cand.tables, times[r::replicas], prompts[r::replicas], outputs[r::replicas], cand.batch,
                          cand.chunk, until) for r in range(min(replicas, times.size))]  # the rest idle
    return _Replayed(replicas, *(np.concatenate([getattr(g, k) for g in got])
                                 for k in ("ttft_s", "step_s", "step_decodes", "step_mixed")))


def figures(cand: Candidate, times: np.ndarray, prompts: np.ndarray, outputs: np.ndarray, replicas: int,
            tpot_pct: float, ttft_pct: float) -> Figures:
    """Replay round-robin through `replicas` replicas; TPOT counted over the steps that start
    before the last arrival (the drain after it is lighter than the load)."""
    return _replayed(cand, times, prompts, outputs, replicas).figures(tpot_pct, ttft_pct)


def _least_per_token(table: np.ndarray, most: int) -> float:
    """min over 1 <= t <= most of (the least table value at t tokens or more, up to most) / t."""
    part = table[1:most + 1]
    least_above = np.minimum.accumulate(part[::-1])[::-1]
    return float((least_above / np.arange(1, part.size + 1)).min())


def ttft_floor(cand: Candidate, prompts: np.ndarray, ttft_pct: float) -> float:
    """A lower bound (s) on the TTFT percentile at any replica count, request by request (so for
    the percentile too): the steps that carry a prompt's pieces p_1 + ... = P each hold between p_j
    and `chunk` tokens (decodes count against the budget), so their linear operators take at
    least P x the least time per token over such steps; a piece's attention is at least the
    prefix-free pass over prefix + piece less the pass over the prefix, which telescopes to one
    pass over P (a recurrent state: a pass over the piece, bounded per token as the linear part);
    the step the prompt ends in runs the LM head on at least one row. Waits and the other
    requests' work only add to it."""
    tab = cand.tables
    p = np.asarray(prompts, np.int64)
    floor = p * _least_per_token(tab.linear_us, cand.chunk) + float(tab.head_us[1:cand.chunk + 1].min())
    for k in range(tab.pass_us.shape[0]):
        if tab.recurrent[k]:
            floor = floor + tab.count[k] * p * _least_per_token(tab.pass_us[k], min(cand.chunk, tab.pass_us.shape[1] - 1))
        else:
            floor = floor + tab.count[k] * tab.pass_us[k, p]
    return float(np.percentile(floor * 1e-6, ttft_pct))


def isolated_replicas(cand: Candidate, times: np.ndarray, prompts: np.ndarray, outputs: np.ndarray,
                      alone: dict | None = None) -> int:
    """The least R from which, dealt round-robin, each request reaches its replica after the one
    before it there has left (an upper bound on its stay alone: its prompt replayed alone, then
    one pure decode step at the slowest context knot per further token), so every replica serves
    its requests one at a time and every larger R replays the same figures. `alone`: a memo of
    the lone prefill times per (tables, chunk, prompt)."""
    tab = cand.tables
    memo = {} if alone is None else alone
    lengths, inverse = np.unique(prompts, return_inverse=True)
    lone = np.empty(lengths.size)
    for j, p in enumerate(lengths.tolist()):
        key = (id(tab), cand.chunk, int(p))
        if key not in memo:
            memo[key] = float(replay_replica(tab, [0.0], [int(p)], [1], 1, cand.chunk).ttft_s[0])
        lone[j] = memo[key]
    step = max(tab.decode_step_us(1, float(k)) for k in tab.knots) * 1e-6
    stay = (lone[inverse] + (np.asarray(outputs, np.float64) - 1.0) * step) * (1 + 1e-9) + 1e-12

    def apart(r: int) -> bool:  # non-decreasing in r: the times are sorted
        return r >= times.size or bool(np.all(times[r:] - times[:-r] > stay[:-r]))

    lo, hi = 1, max(int(times.size), 1)
    while lo < hi:
        mid = (lo + hi) // 2
        if apart(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass
class Closest:
    """What a search came nearest to, over every candidate and replay it ran: the reason a search
    that found nothing gives (`reason`)."""

    candidates: int = 0
    replays: int = 0
    ttft_s: float = math.inf  # the lowest replayed TTFT percentile
    floor_s: float = math.inf  # the lowest `ttft_floor` of a candidate refused without a replay
    within: float = 0.0  # the largest share of decode tokens within the TPOT SLO
    over_budget: int = 0  # candidates whose decode-load floor exceeds the GPU budget

    def saw(self, got: _Replayed, slo_s: float, ttft_pct: float) -> None:
        self.replays += 1
        self.ttft_s = min(self.ttft_s, got.ttft_percentile(ttft_pct))
        self.within = max(self.within, got.within_share(slo_s))

    def reason(self, slo_s: float, ttft_s: float, tpot_pct: float, ttft_pct: float, max_gpus: int) -> str:
        if self.candidates == 0:
            return "memory: no searched (GPU type, TP, batch) holds the weights and its batch's KV"
        if self.replays == 0:
            if self.floor_s < math.inf:
                return (f"ttft: a prompt's tokens through the linear operators alone take {self.floor_s * 1e3:.0f} ms "
                        f"at p{ttft_pct:g}, over the SLO")
            return f"throughput: the decode load needs more than {max_gpus} GPUs"
        if self.ttft_s > ttft_s:
            return f"ttft: the lowest p{ttft_pct:g} TTFT of any candidate and replica count is {self.ttft_s * 1e3:.0f} ms"
        if self.within < tpot_pct / 100.0:
            return (f"tpot: at most {self.within:.1%} of decode tokens take {slo_s * 1e3:g} ms or less "
                    f"(p{tpot_pct:g} needs {tpot_pct:g} %)")
        return (f"tpot and ttft: each is met at some replica count, never both (lowest p{ttft_pct:g} TTFT "
                f"{self.ttft_s * 1e3:.0f} ms, at most {self.within:.1%} of decode tokens within the TPOT SLO)")


def least_replicas(cand: Candidate, times, prompts, outputs, rate: float, mean_output: float, slo_s: float,
                   ttft_s: float, tpot_pct: float, ttft_pct: float, max_replicas: int,
                   closest: Closest | None = None, alone: dict | None = None) -> Figures | None:
    """The least R in [stable_replicas, max_replicas] whose replay meets both SLOs (None: none),
    its figures naming what R - 1 broke, from the replay that refused R - 1. `closest`: gathers
    the nearest misses; `alone`: `isolated_replicas`' memo."""
    closest = Closest() if closest is None else closest
    floor = stable_replicas(cand, rate, mean_output, load_context(prompts, outputs))
    if max_replicas < floor:
        closest.over_budget += 1
        return None
    bound = ttft_floor(cand, prompts, ttft_pct)
    if bound > ttft_s:
        closest.floor_s = min(closest.floor_s, bound)
        return None
    top, binding = max_replicas, "throughput"
    for r in range(floor, max_replicas + 1):
        if r > top:
            return None  # from `top` on every R replays as `top` did: it missed
        got = _replayed(cand, times, prompts, outputs, r)
        closest.saw(got, slo_s, ttft_pct)
        ttft_ok, tpot_ok = got.ttft_percentile(ttft_pct) <= ttft_s, got.tpot_met(slo_s, tpot_pct)
        if ttft_ok and tpot_ok:
            return got.figures(tpot_pct, ttft_pct, binding)
        binding = "ttft" if tpot_ok else "tpot"  # what this R, one fewer than the next, breaks
        if r == floor and max_replicas > floor:
            top = min(max_replicas, max(isolated_replicas(cand, times, prompts, outputs, alone), floor))
    return None


def choose(cands: list[Candidate], times, prompts, outputs, rate: float, mean_output: float, slo_s: float,
           ttft_s: float, tpot_pct: float, ttft_pct: float, max_gpus: int = MAX_GPU_BUDGET,
           closest: Closest | None = None) -> Choice | None:
    """The cheapest (candidate, R) meeting both SLOs (ties: fewer GPUs, GPU id, TP, B, chunk).

    Best first over the pairs: every candidate's least admissible R (`stable_replicas`, past
    `ttft_floor`) is queued by its key, the cheapest pair is replayed, and a miss queues the
    same candidate at R + 1 (up to `isolated_replicas` and the budget). Keys are distinct and grow
    with R, so the first pair that meets both SLOs is the least key over every feasible pair: the
    full scan's answer without replaying any pair dearer than it, and without assuming the
    figures are monotone in R (they are not in general: round-robin at R + 1 regroups the
    requests). `closest`: gathers what a search that finds nothing came nearest to."""
    closest = Closest() if closest is None else closest
    closest.candidates += len(cands)
    alone: dict = {}
    ctx = load_context(prompts, outputs)
    heap: list[tuple] = []
    for i, cand in enumerate(cands):
        floor, most = stable_replicas(cand, rate, mean_output, ctx), max_gpus // cand.tp
        if most < floor:
            closest.over_budget += 1
            continue
        bound = ttft_floor(cand, prompts, ttft_pct)
        if bound > ttft_s:
            closest.floor_s = min(closest.floor_s, bound)
            continue
        heapq.heappush(heap, (cand.key(floor), i, floor, most, "throughput"))
    while heap:
        _key, i, r, top, binding = heapq.heappop(heap)
        cand = cands[i]
        got = _replayed(cand, times, prompts, outputs, r)
        closest.saw(got, slo_s, ttft_pct)
        ttft_ok, tpot_ok = got.ttft_percentile(ttft_pct) <= ttft_s, got.tpot_met(slo_s, tpot_pct)
        if ttft_ok and tpot_ok:
            return Choice(cand, got.figures(tpot_pct, ttft_pct, binding))
        if binding == "throughput" and top > r:  # r is the floor: from `isolated_replicas` on, R replays as it does
            top = min(top, max(isolated_replicas(cand, times, prompts, outputs, alone), r))
        if r < top:  # what r, one fewer than the next, breaks
            heapq.heappush(heap, (cand.key(r + 1), i, r + 1, top, "ttft" if tpot_ok else "tpot"))
    return None


# ----------------------------------------------------------------------------- from a request

def candidates(req: PlanRequest, seq, hw, context: int, max_prompt: int) -> list[Candidate]:
    """Every searched (GPU type, TP) that fits a node, x every searched batch B whose weights and
    B requests' KV at the decode context fit its usable memory, x every chunk in CHUNK_CHOICES (and
    the runtime's default) of at least B tokens."""
    from opweave_planner.compile.tables import configurations, usable_per_gpu
    from opweave_planner.latency.lookup import kv_shard, weight_shard
    from opweave_planner.latency.mixed import step_tables
    from opweave_planner.latency.prefill import default_chunk_tokens

    out = []
    for cfg in configurations(seq, hw, req):
        gpu, tp = cfg.gpu, cfg.parallel.tp
        if cfg.parallel.moe_ep:
            continue
        weights = sum(weight_shard(op, tp) for op in seq.ops)
        kv = sum(kv_shard(op, tp, context) for op in seq.ops)
        room = usable_per_gpu(gpu, tp, req) - weights
        batches = [b for b in sorted(set(req.batches)) if kv * b <= room]
        chunks = sorted(set(CHUNK_CHOICES) | {default_chunk_tokens(gpu)})
        if not batches:
            continue
        tables = step_tables(seq, gpu, tp, context, max(batches), max(chunks), max_prompt, profiles_dir=req.profiles,
                             backend=req.backend, moe_routing=req.moe_routing)
        for b in batches:
            out.extend(Candidate(tables, b, c, tp * gpu.price_per_hour) for c in chunks if c >= b)
    return out


def tpot_percentile(req: PlanRequest) -> float:
    """The percentile of step TPOT the aggregated replicas hold to the SLO: the plan's own TPOT
    percentile (--slo-percentile, 95 by default, with a workload; `STEP_PERCENTILE` for a fixed
    --ctx, where `req.percentile` is 100 because the decode plan's steps are all equal), never the
    TTFT's."""
    return req.percentile if req.stochastic else STEP_PERCENTILE


def with_aggregated(plan: Plan, req: PlanRequest, hw, seq, arrivals, miss=None, record=None) -> Plan:
    """`plan` with the aggregated deployment beside its disaggregated one, and `deployment.mode`
    the cheaper one meeting both SLOs (or the one --deployment-mode names).

    `plan.deployment`: the disaggregated deployment already planned, or (no prefill pool: `miss`
    says why none meets the TTFT, or --deployment-mode aggregated planned none) the decode
    copies alone, sized for the same arrivals. `seq`: the request's operator sequence;
    `arrivals`: (arrivals, rate, mean output) as `deployment.replayed_arrivals` gives them to
    both modes; `miss`: `deployment.PoolMiss`; `record`: the arrivals' `ArrivalsOut`
    (`deployment.arrivals_record`), which a deployment without a prefill pool carries itself."""
    from opweave_planner.plan import plan_version

    dep = plan.deployment
    pooled = dep.prefill is not None
    arr, rate, mean_out = arrivals
    outputs = arr.outputs if arr.outputs is not None else np.full(arr.prompts.shape, max(1, round(mean_out)),
                                                                  dtype=np.int64)
    context = int(plan.workload.context_tokens)
    cands = candidates(req, seq, hw, context, int(arr.prompts.max()))
    slo_s, ttft_s = req.slo_ms / 1e3, req.ttft / 1e3
    tpot_pct = tpot_percentile(req)
    args = (arr.times_s, arr.prompts, outputs, rate, mean_out, slo_s, ttft_s, tpot_pct, req.ttft_at)
    closest = Closest()
    choice = choose(cands, *args, closest=closest)  # the replicas together within the budget the prefill pool has
    if choice is None:
        where = (f"no aggregated deployment of {','.join(req.gpus)} TP {','.join(map(str, req.tensor_parallel_sizes))} "
                 f"within {MAX_GPU_BUDGET} GPUs meets p{tpot_pct:g} TPOT {req.slo_ms:g} ms and p{req.ttft_at:g} TTFT "
                 f"{req.ttft:g} ms ({closest.reason(slo_s, ttft_s, tpot_pct, req.ttft_at, MAX_GPU_BUDGET)})")
        if req.deployment_mode == "aggregated":
            raise UserError(f"--deployment-mode aggregated: {where}")
        if not pooled:
            raise UserError(f"--ttft: neither deployment mode meets the SLOs: disaggregated: {miss.reason}; "
                            f"aggregated: {where}")
        doc = plan.model_copy(update={"deployment": dep.model_copy(update={"deployment_mode": req.deployment_mode})})
        return doc.model_copy(update={"schema_version": plan_version(doc)})
    cand, fig = choice.candidate, choice.figures
    usd = choice.usd_per_hour
    out_m = rate * mean_out * 3600 / 1e6
    agg = AggregatedOut(
        gpu=cand.gpu, tensor_parallel=cand.tp, batch=cand.batch, chunk_tokens=cand.chunk, replicas=fig.replicas,
        gpus=fig.replicas * cand.tp, usd_per_hour=rounded(usd), usd_per_million_output_tokens=rounded(usd / out_m),
        tpot_percentile=tpot_pct, tpot_ms=rounded(fig.tpot_s * 1e3), tpot_mean_ms=rounded(fig.tpot_mean_s * 1e3),
        decode_step_ms=rounded(cand.tables.decode_step_us(cand.batch) / 1e3),
        mixed_step_share=rounded(fig.mixed_share), ttft_ms=rounded(fig.ttft_s * 1e3),
        ttft_mean_ms=rounded(fig.ttft_mean_s * 1e3), binding=fig.binding, options=len(cands),
        ttft_slo_ms=None if pooled else req.ttft, ttft_percentile=None if pooled else req.ttft_at)
    update = {"aggregated": agg, "deployment_mode": req.deployment_mode}
    if not pooled:  # the aggregated deployment alone: its arrivals, and why there is no prefill pool
        update.update(mode="aggregated", arrivals=record,
                      disaggregated_infeasible=None if miss is None else miss.out())
    elif req.deployment_mode == "aggregated":
        update["mode"] = "aggregated"
    else:  # ties: the disaggregated plan (the decode plan as searched)
        disagg = (dep.usd_per_hour_all_in, dep.gpus_total + dep.prefill.gpus)
        update["mode"] = "aggregated" if (usd, agg.gpus) < disagg else "disaggregated"
    doc = plan.model_copy(update={"deployment": dep.model_copy(update=update)})
    return doc.model_copy(update={"schema_version": plan_version(doc)})
