"""The disaggregated deployment of docs/deployment.md's qwen3-30b-a3b case (ISL 7,680 / OSL
1,024, TPOT 30 ms, 20,000 output tokens/s, H100) at several TTFT SLOs: the prefill pool chosen,
its replayed p95 TTFT, both pools' GPUs and the all-in costs, one markdown row per SLO.

    PYTHONPATH=src python benchmarks/deployment_sweep.py
"""

from __future__ import annotations

from opweave_planner import api

BASE = dict(model="qwen3-30b-a3b", slo="30ms", ctx="8704", prompt_len="7680", output_len="1024", gpus="h100",
            target_tokens_per_s=20000)
SLOS = ("1s", "300ms", "200ms", "150ms", "120ms", "100ms")


def main() -> None:
    print("| --ttft | prefill pool | p95 TTFT (ms) | utilisation | decode GPUs | total GPUs | USD/h all-in | "
          "USD/M output all-in | USD/M input | binds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for ttft in SLOS:
        d = api.plan(api.make_request(**BASE, ttft=ttft, deployment_mode="disaggregated")).plan.deployment
        p = d.prefill
        print(f"| {ttft} | {p.instances}x TP{p.tensor_parallel} = {p.gpus} | {p.ttft_ms:.1f} | {p.utilisation:.2f} | "
              f"{d.gpus_total} | {d.gpus_total + p.gpus} | {d.usd_per_hour_all_in:.2f} | "
              f"{d.usd_per_million_output_tokens_all_in:.4f} | {d.usd_per_million_input_tokens:.4f} | "
              f"{d.binding_pool} |")


if __name__ == "__main__":
    main()
