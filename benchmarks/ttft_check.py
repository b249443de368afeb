"""The prefill pool's TTFT replay (latency/ttft.py) against queueing theory and on the traces.

Part 1: Poisson arrivals through c servers (400k requests, the first tenth dropped), service
exponential (scv 1), deterministic (scv 0) or gamma (scv 0.25): the replay's mean and p95 wait
beside Allen-Cunneen's M/G/c. Part 2: the shipped traces' own timestamps (rate-scaled) through
qwen3-30b-a3b H100 TP1 prefill servers (one-pass prefill per request, prompts capped at 32k):
TTFT of the replay, and the M/G/c wait at the trace's mean rate and service moments.

    python benchmarks/ttft_check.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from opweave_planner.inputs.hardware import load_hardware
from opweave_planner.inputs.model import load_model
from opweave_planner.latency.prefill import prefill
from opweave_planner.latency.ttft import mgc, replay, service_times, ttft_stats
from opweave_planner.structure.operators import build_sequence
from opweave_planner.workload.arrivals import from_trace, poisson

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"


def theory() -> None:
    for c, scv, rho in [(1, 1.0, 0.7), (1, 0.0, 0.8), (4, 1.0, 0.8), (8, 0.25, 0.9)]:
        n, mean_s = 400_000, 0.2
        rate = rho * c / mean_s
        arr = poisson(rate, n, 1000, seed=11)
        rng = np.random.default_rng(12)
        if scv == 1.0:
            s = rng.exponential(mean_s, n)
        elif scv == 0.0:
            s = np.full(n, mean_s)
        else:
            s = rng.gamma(1 / scv, mean_s * scv, n)
        w = replay(arr.times_s, s, c)[n // 10:]
        f = mgc(rate, mean_s, scv, c)
        print(f"c={c} scv={scv} rho={rho}: replay wait mean {w.mean():.4f} p95 {np.percentile(w, 95):.4f} s; "
              f"M/G/c mean {f.wait_mean_s:.4f} p95 {f.wait_quantile_s:.4f} s")


def traces() -> None:
    seq, g = build_sequence(load_model("qwen3-30b-a3b")), load_hardware().resolve("h100")
    for name, scale in [("mooncake-conversation-sample.jsonl", 4.0), ("azure-conv-sample.csv", 40.0)]:
        arr = from_trace(TRACES / name, scale)
        s = service_times(np.minimum(arr.prompts, 32768), lambda n: prefill(seq, g, 1, n, 1, 0).prefill_ms / 1e3)
        for c in (1, 2, 4):
            st = ttft_stats(arr.times_s, s, c)
            f = mgc(arr.rate, s.mean(), s.var() / s.mean() ** 2, c)
            print(f"{name} x{scale:g} servers {c}: {arr.times_s.size} requests, {arr.rate:.2f}/s, utilisation "
                  f"{st.utilisation:.2f}: TTFT mean {st.mean_s:.3f} p95 {st.percentile_s:.3f} s; wait mean "
                  f"{st.wait_mean_s:.3f} p95 {st.wait_percentile_s:.3f}; M/G/c wait mean {f.wait_mean_s:.3f} "
                  f"p95 {f.wait_quantile_s:.3f}")


if __name__ == "__main__":
    theory()
    traces()
