"""What every `benchmark.sh` shares: the plan's traffic, the sample file, the comparison.

A benchmark replays the traffic the plan was made for, so its figures can be read against the
plan's: a fixed-context plan's fixed prompt and output lengths, or a workload plan's lengths drawn
(seeded by the plan's own seed) from the recorded, shaped workload and written next to the script
(`benchmark-sample.jsonl`, nothing downloaded); concurrency is the deployment's resident batch,
arrivals come at the deployment's target rate where it sized for one.

The comparison is a fixed Python program fed as a quoted here-doc (`<<'EOF'`: nothing in it
expands); the figures it compares reach it as quoted arguments, never as program text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from opweave_planner.errors import InternalError, UserError
from opweave_planner.export.common import BASE_PORT
from opweave_planner.export.shell import (
    ShellWord,
    Var,
    Word,
    assign,
    comment,
    integer,
    number,
    quote,
)

BENCH_OUTPUT_TOKENS = 256  # decode tokens of a fixed-context benchmark request without --output-len
SAMPLE = "benchmark-sample.jsonl"
HASH_BLOCK = 512  # prompt tokens per hash id in the sample (vLLM's --timed-trace-chunk-hash-size)
WAVES = 4  # a workload sample holds this many requests per resident slot (the client refills slots)
MAX_SAMPLE = 4096
# the variables a benchmark command reads (bench_env sets them, each overridable from the caller)
BENCH_VARS = {name: Var(name) for name in ("HOST", "PORT", "INPUT_LEN", "OUTPUT_LEN", "NUM_PROMPTS",
                                            "CONCURRENCY", "RESULT_DIR", "SAMPLE")}
_HEREDOC_END = "EOF"
_COMPARE = (
    "import json, sys",
    "path, p50_plan, p95_plan, slo = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])",
    "with open(path) as fh:",
    "    lines = [ln for ln in fh.read().splitlines() if ln.strip()]",
    "r = json.loads(lines[-1])  # a JSON file, or the last record of a JSONL file",
    "t50, tq = float(r[{ttft50!r}]), float(r[{ttftq!r}])",
    "p50, pq = float(r[{p50!r}]), float(r[{pq!r}])",
    "ttft_plan, ttft_slo, ttft_pct = (float(x) for x in sys.argv[5:8]) if len(sys.argv) > 5 else (0, 0, 0)",
    "if not ttft_plan:",
    '    print(f"TTFT p50 {{t50:.1f}} ms, {q} {{tq:.1f}} ms (the plan is decode only: no TTFT figure)")',
    "else:",
    '    print(f"TTFT p50 {{t50:.1f}} ms, {q} {{tq:.1f}} ms vs plan p{{ttft_pct:g}} {{ttft_plan:.1f}} ms "',
    '          f"({{100 * (tq / ttft_plan - 1):+.1f}} %); TTFT SLO {{ttft_slo:g}} ms: "',
    '          f"{{\'met\' if tq <= ttft_slo else \'MISSED\'}} at {q}")',
    "tpot_pct, mid = (float(sys.argv[8]), sys.argv[9] + ' ') if len(sys.argv) > 9 else (95.0, '')",
    'print(f"TPOT p50 {{p50:.2f}} ms vs plan {{mid}}{{p50_plan:.2f}} ms ({{100 * (p50 / p50_plan - 1):+.1f}} %), "',
    '      f"{q} {{pq:.2f}} ms vs plan p{{tpot_pct:g}} {{p95_plan:.2f}} ms ({{100 * (pq / p95_plan - 1):+.1f}} %); "',
    '      f"SLO {{slo:g}} ms: {{\'met\' if pq <= slo else \'MISSED\'}} at {q}")',
)
_RESULT_KEY = re.compile(r"[a-z0-9_]+")


@dataclass(frozen=True)
class Keys:
    """Result keys of a benchmark client: TTFT and TPOT at p50 and the upper percentile `q`."""

    ttft50: str
    ttftq: str
    p50: str
    pq: str
    q: str = "p95"


VLLM_KEYS = Keys("p50_ttft_ms", "p95_ttft_ms", "p50_tpot_ms", "p95_tpot_ms")


@dataclass(frozen=True)
class Traffic:
    """The requests a benchmark sends: lengths, arrival times (None: closed loop), concurrency."""

    prompts: tuple[int, ...]
    outputs: tuple[int, ...]
    arrivals: tuple[float, ...] | None  # seconds from the start, at the deployment's rate
    concurrency: int
    fixed: bool  # every request the same lengths (a fixed-context plan)
    source: str  # where the lengths came from, one line for the script's comment
    planned_rate: float | None = None  # the rate the plan replayed (deployment.arrivals), when it is sent

    @property
    def rate(self) -> float | None:
        if self.planned_rate is not None:
            return self.planned_rate
        if self.arrivals is None or len(self.arrivals) < 2:
            return None
        return (len(self.arrivals) - 1) / self.arrivals[-1] if self.arrivals[-1] > 0 else None

    def summary(self) -> dict:
        n = len(self.prompts)
        return {"requests": n, "concurrency": self.concurrency, "fixed": self.fixed, "source": self.source,
                "mean_prompt": round(sum(self.prompts) / n, 1), "max_prompt": max(self.prompts),
                "mean_output": round(sum(self.outputs) / n, 1), "max_output": max(self.outputs),
                "max_request": max(p + o for p, o in zip(self.prompts, self.outputs)),
                "request_rate": None if self.rate is None else round(self.rate, 6)}


def _fixed_lengths(plan) -> tuple[int, int]:
    w = plan.workload
    if w.prompt_tokens is not None:
        return w.prompt_tokens, w.output_tokens
    out = min(BENCH_OUTPUT_TOKENS, max(2, w.context_tokens // 2))
    return w.context_tokens - out, out


def _drawn(dist, n: int):
    """`n` (prompt, output) pairs drawn from the plan's shaped workload with its seed, or None
    when the workload cannot be read here (a trace moved or changed since)."""
    import numpy as np

    from opweave_planner.workload.edge import workload_spec
    from opweave_planner.workload.shaping import materialize, scaled_law

    try:
        spec = workload_spec(workload=dist.workload, scale_ctx=dist.scale_ctx, max_model_len=dist.max_model_len,
                             overflow=dist.overflow)
        law = materialize(spec)
    except (UserError, OSError):
        return None
    if dist.sha256 is not None and getattr(spec, "sha256", dist.sha256) != dist.sha256:
        return None
    rng = np.random.default_rng(dist.seed)
    if law.prompt is not None:
        idx = rng.integers(0, law.prompt.size, n)
        return law.prompt[idx].astype(int).tolist(), law.output[idx].astype(int).tolist()
    # a law: prompt from its (scaled) prompt law, output from its output law, then the window
    limit = dist.max_model_len
    prompt_law = spec.prompt if law.scale == 1.0 else scaled_law(spec.prompt, law.scale)
    wp = np.asarray(prompt_law.pmf(0, limit), dtype=float)
    wd = np.asarray(spec.output.pmf(1, None if limit is None else limit + 1), dtype=float)
    prompts, outputs = [], []
    while len(prompts) < n:
        p = int(rng.choice(wp.size, p=wp / wp.sum()))
        o = int(rng.choice(wd.size, p=wd / wd.sum()))
        if o < 1:
            continue
        if limit is not None and p + o > limit:
            if dist.overflow == "drop" or p >= limit:
                continue
            o = limit - p  # clip the output to the window
        prompts.append(max(p, 1))
        outputs.append(o)
    return prompts, outputs


def traffic(ctx) -> Traffic:
    """The plan's traffic for `ctx`'s deployment (every copy: concurrency = copies x B)."""

    plan = ctx.plan
    agg = ctx.aggregated
    conc = agg.replicas * agg.batch if agg is not None else ctx.copies * plan.global_batch
    dist = plan.workload.distribution
    if dist is None:
        p, o = _fixed_lengths(plan)
        n = conc if agg is None else min(MAX_SAMPLE, WAVES * conc)  # arrivals at a rate: a longer run
        prompts, outputs, fixed = [p] * n, [o] * n, True
        source = f"fixed lengths: prompt {p}, output {o} tokens"
    else:
        n = min(MAX_SAMPLE, WAVES * conc)
        drawn = _drawn(dist, n)
        if drawn is None:
            p, o = max(1, round(dist.mean_prompt)), max(1, round(dist.mean_output))
            prompts, outputs, fixed = [p] * n, [o] * n, True
            source = (f"the plan's workload {dist.workload} is not readable here: its mean lengths "
                      f"(prompt {p}, output {o} tokens) instead")
        else:
            prompts, outputs = drawn
            fixed = False
            source = f"{n} requests drawn (seed {dist.seed}) from the shaped workload {dist.workload}"
    arrivals, planned = None, None
    dep = ctx.deployment
    if agg is not None and dep.arrivals is not None:  # the arrivals the aggregated replicas were replayed with
        from opweave_planner.workload.arrivals import poisson

        planned = dep.arrivals.rate
        seed = dep.arrivals.seed or 0
        arrivals = tuple(float(f"{t:.6f}") for t in poisson(planned, len(prompts), prompts, seed).times_s)
    elif dep is not None and dep.target_tokens_per_s is not None:
        rate = dep.target_tokens_per_s / (sum(outputs) / len(outputs))  # requests per second
        from opweave_planner.workload.arrivals import poisson

        seed = 0 if dist is None else dist.seed
        arrivals = tuple(float(f"{t:.6f}") for t in poisson(rate, len(prompts), prompts, seed + 1).times_s)
    return Traffic(tuple(prompts), tuple(outputs), arrivals, conc, fixed, source, planned)


def sample_bytes(t: Traffic) -> bytes:
    """The sample in vLLM's timed_trace form (Mooncake's keys): one JSON object per request, its
    prompt as distinct hash blocks (no shared prefix for a cache to reuse)."""
    import orjson

    lines, next_id = [], 0
    for i, (p, o) in enumerate(zip(t.prompts, t.outputs)):
        blocks = math.ceil(p / HASH_BLOCK)
        ts = 0.0 if t.arrivals is None else t.arrivals[i]
        lines.append(orjson.dumps({"timestamp": ts, "input_length": p, "output_length": o,
                                   "hash_ids": list(range(next_id, next_id + blocks))},
                                  option=orjson.OPT_SORT_KEYS))
        next_id += blocks
    return b"\n".join(lines) + b"\n"


def plan_ttft(ctx) -> tuple[float, float, float] | None:
    """The TTFT the plan predicts for the deployment the files run, (ms, SLO ms, percentile): a
    disaggregated plan's replayed prefill-pool TTFT where its pool is exported, an aggregated-mode
    plan's replayed aggregated TTFT, else None."""
    agg, pool = ctx.aggregated, ctx.deployment.prefill if ctx.deployment is not None else None
    if agg is not None and pool is not None:  # the SLO and percentile are the request's, recorded on the pool
        return agg.ttft_ms, pool.ttft_slo_ms, pool.ttft_percentile
    if agg is not None and agg.ttft_slo_ms is not None:  # schema 1.14: no pool, the replicas record them
        return agg.ttft_ms, agg.ttft_slo_ms, agg.ttft_percentile
    pool = ctx.prefill
    if pool is None or not ctx.target.writes_prefill:
        return None
    return pool.ttft_ms, pool.ttft_slo_ms, pool.ttft_percentile


def plan_tpot(ctx) -> tuple[float, float, float, str] | None:
    """The TPOT the aggregated replicas were replayed at, (mean ms, ms at the percentile, the
    percentile, 'mean'), when that is the plan's mode; None: the decode plan's (`compare_snippet`)."""
    agg = ctx.aggregated
    return None if agg is None else (agg.tpot_mean_ms, agg.tpot_ms, agg.tpot_percentile, "mean")


def compare_snippet(plan, keys: Keys, result: ShellWord, ttft: tuple[float, float, float] | None = None,
                    tpot: tuple[float, float, float, str] | None = None) -> list[str]:
    """Bash lines that read the benchmark's JSON result and print TTFT and TPOT p50 / upper
    percentile against the plan's (a workload plan's p50 and p95 step TPOT, else its TPOT; TTFT
    where the plan predicts one, `plan_ttft`)."""
    names = (keys.ttft50, keys.ttftq, keys.p50, keys.pq, keys.q)
    if not all(_RESULT_KEY.fullmatch(k) for k in names):
        raise InternalError(f"benchmark result keys {names!r} are not plain names")
    body = [line.format(ttft50=keys.ttft50, ttftq=keys.ttftq, p50=keys.p50, pq=keys.pq, q=keys.q)
            for line in _COMPARE]
    if _HEREDOC_END in body:
        raise InternalError("the benchmark's here-doc holds its own terminator")
    p50, p95 = (plan.tpot.p50_ms, plan.tpot.p95_ms) if plan.tpot is not None else (plan.tpot_ms, plan.tpot_ms)
    if tpot is not None:
        p50, p95 = tpot[0], tpot[1]
    argv = ["python3", "-", result, number(p50), number(p95), number(plan.workload.tpot_slo_ms)]
    if ttft is not None or tpot is not None:
        argv += [number(x) for x in ttft] if ttft is not None else ["0", "0", "0"]
    if tpot is not None:
        argv += [number(tpot[2]), tpot[3]]
    return [" ".join(quote(w) for w in argv) + f" <<'{_HEREDOC_END}'", *body, _HEREDOC_END]


def bench_env(ctx, t: Traffic) -> list[str]:
    """The benchmark's settings as overridable variables, with what they replay as comments."""
    agg = ctx.aggregated
    if agg is not None:
        held = f"{agg.replicas} aggregated replicas x max-num-seqs {agg.batch}; "
    else:
        held = (f"{ctx.copies} cop{'y' if ctx.copies == 1 else 'ies'} x the plan's resident batch "
                f"{ctx.plan.global_batch}; ")
    if t.rate is None:
        pace = "closed loop (no arrival rate in the plan)."
    elif t.planned_rate is not None and ctx.deployment.arrivals.process == "poisson":
        pace = f"Poisson arrivals at {t.rate:.4g} requests/s (the plan's arrivals, deployment.arrivals)."
    elif t.planned_rate is not None:  # the plan replayed a trace's own timestamps, which are not sent
        pace = (f"Poisson arrivals at {t.rate:.4g} requests/s: the mean rate of the trace timestamps the "
                f"plan replayed (deployment.arrivals), not their bursts.")
    else:
        pace = (f"Poisson arrivals at {t.rate:.4g} requests/s (the deployment's target "
                f"{ctx.deployment.target_tokens_per_s:g} tokens/s).")
    lines = [comment(f"Traffic: {t.source}."), comment(f"Concurrency {t.concurrency} = {held}{pace}")]
    lines += [
        assign("HOST", Var("HOST", default="127.0.0.1")),
        assign("PORT", Var("PORT", default=integer(BASE_PORT))),
        assign("CONCURRENCY", Var("CONCURRENCY", default=integer(t.concurrency)), "copies x resident batch"),
        assign("NUM_PROMPTS", Var("NUM_PROMPTS", default=integer(len(t.prompts)))),
    ]
    if t.fixed:
        lines += [assign("INPUT_LEN", Var("INPUT_LEN", default=integer(t.prompts[0]))),
                  assign("OUTPUT_LEN", Var("OUTPUT_LEN", default=integer(t.outputs[0])))]
    else:
        lines.append('SAMPLE="${SAMPLE:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/' + SAMPLE + '}"'
                     "  # the requests to replay, written by the export")
    lines += [assign("RESULT_DIR", Var("RESULT_DIR", default="bench-results")), 'mkdir -p "$RESULT_DIR"']
    return lines


def benchmark_vllm(ctx, backend: str, what: str = "the deployment") -> dict[str, bytes]:
    """`vllm bench serve` replaying the plan's traffic; prints TTFT and TPOT p50/p95 against the plan.

    Fixed lengths use its `random` dataset (random token ids: nothing downloaded); a workload
    sample its `timed_trace` dataset (vLLM >= 0.26.0's client) over the sample file."""
    from opweave_planner.export.shell import header, script, shell_command

    v = BENCH_VARS
    t = traffic(ctx)
    argv = ["vllm", "bench", "serve", "--backend", backend,
            "--base-url", Word("http://", v["HOST"], ":", v["PORT"]), "--model", ctx.model_id]
    if t.fixed:
        argv += ["--dataset-name", "random", "--random-input-len", v["INPUT_LEN"],
                 "--random-output-len", v["OUTPUT_LEN"]]
    else:
        argv += ["--dataset-name", "timed_trace", "--dataset-path", v["SAMPLE"],
                 "--timed-trace-chunk-hash-size", str(HASH_BLOCK)]
    argv += ["--num-prompts", v["NUM_PROMPTS"], "--max-concurrency", v["CONCURRENCY"], "--ignore-eos"]
    if t.fixed and t.rate is not None:
        argv += ["--request-rate", number(t.rate)]
    argv += ["--percentile-metrics", "ttft,tpot", "--metric-percentiles", "50,95",
             "--save-result", "--result-dir", v["RESULT_DIR"], "--result-filename", "tpot.json"]
    lines = header(ctx, f"Benchmark {what} with vLLM's own client (vllm bench serve) on the plan's traffic "
                        "and compare TTFT and TPOT with the plan.")
    if not t.fixed:
        lines.append(comment("Needs the client of vLLM 0.26.0 or newer (its timed_trace dataset) where this runs."))
    lines += bench_env(ctx, t)
    lines.append(shell_command(argv))
    lines += compare_snippet(ctx.plan, VLLM_KEYS, Word(v["RESULT_DIR"], "/tpot.json"), plan_ttft(ctx), plan_tpot(ctx))
    files = {"benchmark.sh": script(lines)}
    if not t.fixed:
        files[SAMPLE] = sample_bytes(t)
    return files
