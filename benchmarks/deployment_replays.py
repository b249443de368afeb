"""Replays the prefill-pool search runs (`deployment._stats` calls) and their time, on
docs/deployment.md's qwen3-30b-a3b case (ISL 7,680 / OSL 1,024, TPOT 30 ms, 20,000 output
tokens/s, H100) at several TTFT SLOs. Run it on two trees to compare searches:

    PYTHONPATH=src python benchmarks/deployment_replays.py

(The times are upper bounds on a shared machine.)
"""

from __future__ import annotations

import time

from opweave_planner import api, deployment

BASE = dict(model="qwen3-30b-a3b", slo="30ms", ctx="8704", prompt_len="7680", output_len="1024", gpus="h100",
            target_tokens_per_s=20000)
SLOS = ("1s", "300ms", "150ms", "100ms")


def main() -> None:
    real = deployment._stats
    seen: list[tuple[int, float]] = []

    def counted(times, opt, n, pct):
        t0 = time.perf_counter()
        out = real(times, opt, n, pct)
        seen.append((n, time.perf_counter() - t0))
        return out

    deployment._stats = counted
    print("| --ttft | pool | replays | largest N replayed | replay time (s) |")
    print("|---|---|---|---|---|")
    for ttft in SLOS:
        seen.clear()
        p = api.plan(api.make_request(**BASE, ttft=ttft)).plan.deployment.prefill
        print(f"| {ttft} | {p.instances}x TP{p.tensor_parallel} | {len(seen)} | {max(n for n, _ in seen)} | "
              f"{sum(t for _, t in seen):.3f} |")


if __name__ == "__main__":
    main()
