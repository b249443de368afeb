"""Closed-loop check of the workload planner (issues 13, 29): replay a trace through a plan.

Usage:  python benchmarks/workload_replay.py [--steps 10000] [--warmup 500] [--seed 1]
                                            [--kv-quantile 0.999] [--preemptions-per-request 1e-4]
                                            [--memory-only] [CASE ...]
        python benchmarks/workload_replay.py --plan PLAN.json [--trace TRACE] [--memory-only] ...

`--plan` replays any plan file (a workload plan, or a fixed-context one given `--trace`);
`--trace` replays another trace through the plan (its recorded shaping kept). `--memory-only`
skips the pipeline timing and only steps the resident requests (fast: for episode counts).

For each case the workload-aware plan is made (`api.plan`), then the trace is replayed
through its placement step by step with continuous batching:

* the plan's B slots start in the stationary state the planner assumes (a request drawn
  with probability proportional to its output length, at a uniform age), then evolve: every
  decode iteration each resident request's context grows by one token, and a request that
  has produced its last output token is replaced by a fresh one drawn from the trace
  (seeded), starting at its prompt length;
* every iteration's stage latencies come from the current contents of each microbatch (the
  plan's knot latency tables; a microbatch split over an owner's replicas waits for the
  slowest, as in the planner), and the pipeline advances by one iteration of the schedule's
  max-plus recurrence (`schedule.kernels._one_iteration`) with those times: a real time-
  varying schedule, not a steady state per snapshot;
* the step TPOT of a microbatch is the time between its consecutive tokens; the KV memory of
  each replica is summed over its resident requests every step, a sliding-window layer at
  min(context, window) per request, as a paged runtime holds it.

It prints the replayed p50/p95/p99 step TPOT against the plan's predicted figures, and the
peak replayed memory per GPU against the memory the plan reserved; it also counts the steps
above the GPU's usable memory (the budget of --gpu-memory-utilization less the runtime
reserve, which the exported launch configs hand the runtime), beyond which a runtime must
preempt: the reserve can sit below it when the batch grid leaves headroom. Target (issue 13):
predicted p95 within 5 % of the replayed one, and no step above the reserved memory.

Preemption episodes (issue 29): on every replica it counts the up-crossings of the reserved
and of the usable memory (a step at or below it followed by one above: a runtime preempts
there) and sets them against the counts the planner's event law predicts for the same
replica-steps (`workload.kv.kv_events` at the same capacities), with episodes per served request.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "examples" / "traces" / "mooncake-conversation-sample.jsonl"
AZURE = ROOT / "examples" / "traces" / "azure-conv-sample.csv"

CASES = {
    "gemma-60ms": dict(model="gemma-3-27b", slo="60ms", gpus="h100", workload=str(TRACE), scale_ctx="32k"),
    "gemma-25ms": dict(model="gemma-3-27b", slo="25ms", gpus="h100", workload=str(TRACE), scale_ctx="8k"),
    "qwen3-next-80ms": dict(model="qwen3-next-80b-a3b", slo="80ms", gpus="h100", workload=str(TRACE),
                            scale_ctx="32k"),
    # the 128k cohort: rescaling past the 256k window is possible only with prompts truncated
    "qwen3-next-128k": dict(model="qwen3-next-80b-a3b", slo="40ms", gpus="h100", workload=str(TRACE),
                            scale_ctx="128k", overflow="truncate"),
    "gemma-azure-60ms": dict(model="gemma-3-27b", slo="60ms", gpus="h100", workload=str(AZURE), scale_ctx="32k"),
    "qwen3-next-azure-80ms": dict(model="qwen3-next-80b-a3b", slo="80ms", gpus="h100", workload=str(AZURE),
                                  scale_ctx="32k"),
    "llama-azure-30ms": dict(model="llama-3.1-8b", slo="30ms", gpus="h100", workload=str(AZURE), scale_ctx="8k"),
}


def _stage_tables(prob, sel, tables):
    """kt[j, g]: stage j's time at knot g; per owner its stages, KV per reserved unit / per request,
    weights and workspace per GPU (the evaluator's own functions), and the KV mix that turns a
    context into reserved units (a sliding-window layer holds min(context, window), as a paged
    runtime does)."""
    from opweave_planner.compile.tables import owner_mixes
    from opweave_planner.search.evaluate import range_sum, stage_time

    s_n = prob.stage_owner.size
    kt = np.zeros((s_n, prob.knots.size))
    for j in range(s_n):
        o = prob.stage_owner[j]
        c, m = sel.cfg[o], sel.mb[o]
        for g in range(prob.knots.size):
            kt[j, g] = stage_time(prob.kpref[c, m, g], prob.stage_start[j], prob.stage_end[j],
                                  prob.cfg_stage_fixed[c])
    mem = []
    for o in range(prob.k):
        c = sel.cfg[o]
        js = [j for j in range(s_n) if prob.stage_owner[j] == o]
        w = sum(range_sum(prob.wpref[c], prob.stage_start[j], prob.stage_end[j]) for j in js)
        tok = sum(range_sum(prob.kvpref[c], prob.stage_start[j], prob.stage_end[j]) for j in js)
        req = sum(range_sum(prob.kvcpref[c], prob.stage_start[j], prob.stage_end[j]) for j in js)
        mix = owner_mixes(tables, prob.stage_owner, prob.stage_start, prob.stage_end, o)[c]
        mem.append((w, tok, req, float(prob.cfg_ws[c]), mix))
    return kt, mem


class Slots:
    """The B resident requests: prompt, output length and age of each, refilled from the trace."""

    def __init__(self, prompt, output, n, rng):
        self.p_all, self.o_all, self.rng = prompt, output, rng
        # stationary start: request chosen proportionally to its output length, uniform age
        w = output / output.sum()
        idx = rng.choice(output.size, n, p=w)
        self.p, self.d = prompt[idx].astype(np.int64), output[idx].astype(np.int64)
        self.age = (rng.random(n) * self.d).astype(np.int64)

    def contexts(self):
        return self.p + self.age

    def step(self):
        self.age += 1
        done = self.age >= self.d
        k = int(done.sum())
        if k:
            idx = self.rng.integers(0, self.p_all.size, k)
            self.p[done], self.d[done], self.age[done] = self.p_all[idx], self.o_all[idx], 0
        return k


def replay(plan, steps: int, warmup: int, seed: int):
    from opweave_planner.contract import plan_context
    from opweave_planner.schedule.kernels import _one_iteration
    from opweave_planner.search.evaluate import evaluate
    from opweave_planner.workload.kv import kv_bytes

    ctx, tmpl, sel = plan_context(plan, where="replay")
    prob = ctx.problem(tmpl, batches=(sel.batch,))
    ev = evaluate(prob, sel)
    kt, mem = _stage_tables(prob, sel, ctx.tables)
    wl = ctx.workload
    k, mu, B, s_n = prob.k, sel.mu, sel.batch, prob.stage_owner.size
    bh = [int(prob.mb_grid[m]) for m in sel.mb]
    per = B // mu
    groups = int(sel.replicas[0]) if k == 1 else 1
    rng = np.random.default_rng(seed)
    slots = Slots(wl.prompt, wl.output, B, rng)
    n_state = 3 * k + mu
    states = [np.zeros(n_state) for _ in range(groups)]
    last = [np.zeros(mu) for _ in range(groups)]
    tpots = []
    peak = np.zeros(k)
    reserved, usable = ev.memory_need, ev.memory_usable
    over = [0, 0, 0]  # replica-steps above the reserved memory, replica-steps, above the usable memory
    finished = 0
    occ, latv = ev.occ, ev.latv
    t2 = np.zeros((s_n, mu))
    for it in range(warmup + steps):
        c = slots.contexts().astype(np.float64)
        for o in range(k):  # memory of every replica of owner o: its mu x bh residents
            w, tok, req, ws, mix = mem[o]
            for r in range(int(sel.replicas[o])):
                mine = np.concatenate([c[i * per + r * bh[o]: i * per + (r + 1) * bh[o]] for i in range(mu)])
                need = w + tok * kv_bytes(mine, *mix).sum() + req * mine.size + ws * bh[o]
                peak[o] = max(peak[o], need)
                if it >= warmup:
                    over[0] += need > reserved[o] * (1 + 1e-8)
                    over[1] += 1
                    over[2] += need > usable[o] * (1 + 1e-8)
        for grp in range(groups):
            for i in range(mu):
                for j in range(s_n):
                    o = prob.stage_owner[j]
                    reps = [grp] if k == 1 else range(int(sel.replicas[o]))
                    x = max(c[i * per + r * bh[o]: i * per + (r + 1) * bh[o]].mean() for r in reps)
                    t2[j, i] = np.interp(x, prob.knots, kt[j])
            x = states[grp]
            _one_iteration(prob.stage_owner, t2, occ, latv, mu, k, x)
            ready = x[3 * k:].copy()
            if it >= warmup:
                tpots.extend(ready - last[grp])
            last[grp] = ready
        finished += slots.step()
    return np.array(tpots), peak, over, finished


def _replicas(sel, prob, mu: int):
    """Per (owner, replica): the slot indices it holds (its mu x bh residents)."""
    per = sel.batch // mu
    out = []
    for o in range(prob.k):
        bh = int(prob.mb_grid[sel.mb[o]])
        for r in range(int(sel.replicas[o])):
            out.append((o, np.concatenate([np.arange(i * per + r * bh, i * per + (r + 1) * bh) for i in range(mu)])))
    return out


def episodes(plan, steps: int, warmup: int, seed: int, trace: str | None = None) -> dict:
    """Up-crossings of each replica's reserved and usable memory along one replay (memory only),
    and the counts the event law predicts for as many replica-steps."""
    from opweave_planner.compile.traffic import EVENT_GRID
    from opweave_planner.contract import plan_context
    from opweave_planner.search.evaluate import evaluate
    from opweave_planner.workload.kv import kv_bytes, kv_events

    over = {} if trace is None else {"workload": trace}
    ctx, tmpl, sel = plan_context(plan, where="replay", **over)
    prob = ctx.problem(tmpl, batches=(sel.batch,))
    ev = evaluate(prob, sel)
    _kt, mem = _stage_tables(prob, sel, ctx.tables)
    wl = ctx.workload
    reps = _replicas(sel, prob, sel.mu)
    caps = []
    for o, idx in reps:
        _w, tok, _req, _ws, _mix = mem[o]
        res = float(prob.kv_units[o, sel.cfg[o], idx.size])
        use = res + (float(ev.memory_usable[o]) - float(ev.memory_need[o])) / tok if tok > 0 else np.inf
        caps.append((res, use))
    cap = np.array(caps)  # [replica, (reserve, usable)] in reserved units (the owner's KV mix)
    owner_of = np.array([o for o, _ in reps])
    sel_idx = [idx for _, idx in reps]
    rng = np.random.default_rng(seed)
    slots = Slots(wl.prompt, wl.output, sel.batch, rng)
    prev = None
    ups = np.zeros_like(cap)
    above = np.zeros_like(cap)
    finished = 0
    for it in range(warmup + steps):
        c = slots.contexts()
        s = np.array([kv_bytes(c[i], *mem[o][4]).sum() for (o, _), i in zip(reps, sel_idx, strict=True)])[:, None]
        if it >= warmup:
            above += s > cap
            if prev is not None:
                ups += (prev <= cap) & (s > cap)
        prev = s
        k = slots.step()
        if it >= warmup:
            finished += k
    pred = np.zeros_like(cap)
    for r, (o, idx) in enumerate(reps):
        law = kv_events(wl, idx.size, EVENT_GRID, *mem[o][4])
        pred[r] = [law.per_step(x) * steps for x in cap[r]]
    by_owner = np.array([ups[owner_of == o].sum(axis=0) for o in range(prob.k)])  # every owner serves every request
    return {"replica_steps": steps * len(reps), "ups": ups.sum(axis=0), "pred": pred.sum(axis=0),
            "above": above.sum(axis=0), "finished": finished, "owners": owner_of, "by_owner": by_owner,
            "per_request": by_owner.max(axis=0) / max(finished, 1), "mean_output": wl.mean_output,
            "gap_gib": [(float(ev.memory_usable[o]) - float(ev.memory_need[o])) / 2**30 for o in range(prob.k)]}


def print_episodes(name: str, e: dict) -> None:
    n = e["replica_steps"]
    for j, what in enumerate(("reserved", "usable")):
        print(f"  up-crossings of the {what} memory: {int(e['ups'][j]):,} replayed, {e['pred'][j]:,.1f} predicted "
              f"over {n:,} replica-steps ({e['above'][j] / n:.4%} of them above); "
              f"{e['per_request'][j]:.2e} per served request on the worst owner ({e['finished']:,} served)")
    print(f"  usable - reserved memory per GPU: {', '.join(f'{g:.2f} GiB' for g in e['gap_gib'])}")


def run_seeds(name: str, plan, a) -> None:
    """Episodes on each seed, then pooled (predicted counts scale with the replica-steps)."""
    seeds = [a.seed] if a.seeds is None else [int(x) for x in a.seeds.split(",")]
    runs = []
    for seed in seeds:
        e = episodes(plan, a.steps, a.warmup, seed, a.trace)
        runs.append(e)
        print(f" seed {seed}:")
        print_episodes(name, e)
    if len(runs) > 1:
        pool = dict(runs[0])
        for key in ("replica_steps", "ups", "pred", "above", "finished", "by_owner"):
            pool[key] = sum(r[key] for r in runs)
        pool["per_request"] = pool["by_owner"].max(axis=0) / max(pool["finished"], 1)
        worst = max(r["per_request"][1] for r in runs)
        print(f" pooled over {len(runs)} seeds (worst seed at usable memory: {worst:.2e} per request):")
        print_episodes(name, pool)


def run_case(name: str, spec: dict, steps: int, warmup: int, seed: int) -> dict:
    from opweave_planner import api

    t0 = time.perf_counter()
    req = api.make_request(**spec)
    _outcome = api.plan(req)
    plan, infeasible = _outcome.plan, _outcome.infeasible
    if plan is None:
        return {"case": name, "error": infeasible.reason}
    t_plan = time.perf_counter() - t0
    t0 = time.perf_counter()
    tp, peak, over, finished = replay(plan, steps, warmup, seed)
    q = {p: float(np.quantile(tp, p / 100, method="inverted_cdf")) / 1e3 for p in (50, 95, 99)}
    pred = plan.tpot
    reserved = [o.memory_bytes_per_gpu for o in plan.owners]
    return {
        "case": name, "plan": f"{plan.gpus_total} GPUs, {plan.num_stages} stages, B={plan.global_batch}, "
                              f"mu={plan.microbatches}, owners {[(o.gpu, o.tensor_parallel, o.replicas) for o in plan.owners]}",
        "pred": pred, "replay": q, "replay_mean": float(tp.mean()) / 1e3, "samples": int(tp.size),
        "p95_err_pct": (pred.p95_ms / q[95] - 1) * 100, "peak_gib": [float(x) / 2**30 for x in peak],
        "reserved_gib": [x / 2**30 for x in reserved],
        "memory_ok": all(p <= r * (1 + 1e-8) for p, r in zip(peak, reserved, strict=True)),
        "over": over, "kv_quantile": req.kv_quantile, "cost": plan.usd_per_million_tokens,
        "finished": finished, "t_plan": t_plan, "t_replay": time.perf_counter() - t0,
        "episodes": episodes(plan, steps, warmup, seed),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", default=["gemma-60ms", "gemma-25ms"], help=", ".join(CASES))
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kv-quantile", type=float, default=None,
                    help="plan the cases with this --kv-quantile (default: the planner's, 0.999)")
    ap.add_argument("--preemptions-per-request", type=float, default=None,
                    help="plan the cases with this target (default: the planner's, 1e-4)")
    ap.add_argument("--plan", default=None, help="replay this plan file instead of planning the cases")
    ap.add_argument("--trace", default=None, help="replay this trace (default: the plan's or case's own)")
    ap.add_argument("--memory-only", action="store_true", help="count memory episodes only (no TPOT replay)")
    ap.add_argument("--seeds", default=None, help="with --memory-only or --plan: replay each of these seeds "
                    "(comma list) and pool the counts")
    a = ap.parse_args(argv)
    ok = True
    if a.plan:
        from opweave_planner.contract import read_feasible_plan

        plan = read_feasible_plan(a.plan)
        print(f"{a.plan}: {plan.model}, {plan.gpus_total} GPUs, B={plan.global_batch}, "
              f"{plan.usd_per_million_tokens:.4f} USD/Mtok")
        run_seeds(a.plan, plan, a)
        return 0
    unknown = [c for c in a.cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case {unknown[0]}; expected one of {', '.join(CASES)}")
    for name in a.cases:
        spec = dict(CASES[name])
        if a.kv_quantile is not None:
            spec["kv_quantile"] = a.kv_quantile
        if a.preemptions_per_request is not None:
            spec["preemptions_per_request"] = a.preemptions_per_request
        if a.trace is not None:
            spec["workload"] = a.trace
        if a.memory_only:
            from opweave_planner import api

            plan = api.plan(api.make_request(**spec)).plan
            if plan is None:
                print(f"{name}: infeasible")
                continue
            print(f"{name}: {plan.gpus_total} GPUs, B={plan.global_batch}, owners "
                  f"{[(o.gpu, o.tensor_parallel, o.replicas, o.resident_batch) for o in plan.owners]}, "
                  f"{plan.usd_per_million_tokens:.4f} USD/Mtok")
            run_seeds(name, plan, a)
            continue
        r = run_case(name, spec, a.steps, a.warmup, a.seed)
        if "error" in r:
            print(f"{name}: infeasible: {r['error']}")
            continue
        p, q = r["pred"], r["replay"]
        print(f"{name}: {r['plan']}  (plan {r['t_plan']:.1f} s, replay {r['t_replay']:.1f} s, "
              f"{r['samples']:,} step samples, {r['finished']:,} requests finished)")
        print(f"  step TPOT ms   predicted p50 {p.p50_ms:.3f} p95 {p.p95_ms:.3f} p99 {p.p99_ms:.3f} "
              f"mean {p.mean_ms:.3f}")
        print(f"                 replayed  p50 {q[50]:.3f} p95 {q[95]:.3f} p99 {q[99]:.3f} "
              f"mean {r['replay_mean']:.3f}")
        print(f"  p95: predicted / replayed - 1 = {r['p95_err_pct']:+.2f} %  (target within 5 %)")
        for o, (pk, rs) in enumerate(zip(r["peak_gib"], r["reserved_gib"], strict=True)):
            print(f"  owner {o}: peak replayed memory {pk:.2f} GiB per GPU, reserved {rs:.2f} GiB "
                  f"({'ok' if pk <= rs * (1 + 1e-8) else f'EXCEEDED by {(pk / rs - 1) * 100:.1f} %'})")
        n_over, n_all, n_full = r["over"]
        print(f"  replica-steps above the reserved memory: {n_over:,} of {n_all:,} ({n_over / n_all:.4%}; the "
              f"reserve is the --kv-quantile {r['kv_quantile']} quantile of one snapshot; cost "
              f"{r['cost']:.4f} USD/Mtok)")
        print(f"  replica-steps above the GPU's usable memory (where a runtime must preempt): {n_full:,} "
              f"({n_full / n_all:.4%})")
        print_episodes(name, r["episodes"])
        ok &= abs(r["p95_err_pct"]) <= 5 and r["memory_ok"]
    print("all within target" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
