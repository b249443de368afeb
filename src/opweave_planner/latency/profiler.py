"""Measure the kernels a model needs on the local GPU and write them in our profile format.

The pipeline is split so that everything except the timing runs without torch:

* `ProfilePlan` lists what to measure (GEMM (n, k) shapes over token counts,
  decode-attention shapes over batch x KV length, all-reduce sizes);
* a *runner* times one kernel call and reports hardware facts. `TorchRunner`
  does it with PyTorch (``opweave-planner[profile]``, imported lazily; CUDA
  events on a GPU, wall clock on ``device="cpu"`` for tests); any object with
  the same methods works, e.g. a fake in the tests;
* `run_profile` walks the plan and writes ``<out>/<gpu>/system.json`` and
  ``<out>/<gpu>/<backend>/{gemm,attention,allreduce}.json`` through the same
  `table_payload` the importer uses (monotone, rounded, versioned).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from opweave_planner.errors import UserError
from opweave_planner.latency.tables import FORMAT_VERSION, table_payload, write_json

__all__ = ["KernelRunner", "ProfilePlan", "TorchRunner", "parse_shapes", "run_profile"]


class KernelRunner(Protocol):
    """Times single kernel calls (µs) and describes the device."""

    def gemm(self, m: int, n: int, k: int, dtype: str) -> float: ...

    def attention(
        self,
        batch: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        kv_len: int,
        window: int,
        kv_dtype: str,
    ) -> float: ...

    def allreduce(self, n_gpus: int, message_bytes: int) -> float: ...

    def system_facts(self) -> dict: ...


@dataclass(frozen=True)
class ProfilePlan:
    """What to measure. Shapes are per GPU (after sharding)."""

    gemm_shapes: tuple[tuple[int, int], ...] = ()  # (n, k)
    m_values: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    attention_shapes: tuple[tuple[int, int, int, int], ...] = ()  # (heads, kv heads, dim, window)
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    kv_lens: tuple[int, ...] = (128, 512, 2048, 8192, 32768)
    allreduce_gpus: tuple[int, ...] = ()
    message_bytes: tuple[int, ...] = tuple(2**p for p in range(10, 29, 2))
    dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    #: skip attention cells whose KV cache would exceed this many bytes
    max_kv_bytes: float = 16e9

    def n_kernels(self) -> int:
        return (
            len(self.gemm_shapes) * len(self.m_values)
            + len(self.attention_shapes) * len(self.batches) * len(self.kv_lens)
            + len(self.allreduce_gpus) * len(self.message_bytes)
        )


def run_profile(
    plan: ProfilePlan,
    runner: KernelRunner,
    out_dir: Path,
    gpu: str,
    backend: str = "torch",
    progress: Callable[[str], None] | None = None,
) -> list[Path]:
    """Measure `plan` with `runner`; write system.json and the kernel tables. Returns paths."""
    facts = dict(runner.system_facts())
    device = str(facts.get("device", ""))
    facts.update(format_version=FORMAT_VERSION, gpu=gpu)
    facts.setdefault("source", "opweave-planner profiler")
    base = Path(out_dir) / gpu
    written = [base / "system.json"]
    write_json(written[0], facts)
    source = f"opweave-planner profiler ({type(runner).__name__})"
    kb = 1 if plan.kv_dtype.startswith("fp8") else 2

    def emit(kind: str, points: dict) -> None:
        if points:
            path = base / backend / f"{kind}.json"
            write_json(
                path, table_payload(kind, gpu, backend, points, device=device, source=source)
            )
            written.append(path)
        if progress:
            progress(f"{kind}: {len(points)} kernels")

    emit(
        "gemm",
        {
            (plan.dtype, n, k, m): runner.gemm(m, n, k, plan.dtype)
            for n, k in plan.gemm_shapes
            for m in plan.m_values
        },
    )
    attn = {}
    for nh, nkv, hd, window in plan.attention_shapes:
        for b in plan.batches:
            for s in plan.kv_lens:
                if b * s * 2 * nkv * hd * kb > plan.max_kv_bytes:
                    continue
                attn[(plan.kv_dtype, nh, nkv, hd, window, b, s)] = runner.attention(
                    b, nh, nkv, hd, s, window, plan.kv_dtype
                )
    emit("attention", attn)
    emit(
        "allreduce",
        {
            (plan.dtype, g, nbytes): runner.allreduce(g, nbytes)
            for g in plan.allreduce_gpus
            for nbytes in plan.message_bytes
        },
    )
    return written


def _torch():
    try:
        import torch
    except ImportError:
        raise UserError("profiling needs PyTorch: install opweave-planner[profile]") from None
    return torch


@dataclass
class TorchRunner:
    """Times kernels with PyTorch: median of `iters` calls after `warmup` calls."""

    device: str = "cuda"
    warmup: int = 3
    iters: int = 10
    #: user-supplied facts override measured ones (e.g. datasheet bandwidth)
    overrides: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.torch = _torch()
        if self.device.startswith("cuda") and not self.torch.cuda.is_available():
            raise UserError("no CUDA device visible to PyTorch: use --device cpu to dry-run")

    def _dtype(self, name: str):
        t = self.torch
        return {"bfloat16": t.bfloat16, "float16": t.float16, "float32": t.float32}.get(
            name, t.bfloat16 if self.device != "cpu" else t.float32
        )

    def _time(self, fn: Callable[[], object]) -> float:
        t = self.torch
        for _ in range(self.warmup):
            fn()
        samples = []
        if self.device.startswith("cuda"):
            for _ in range(self.iters):
                start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1000.0)
        else:
            for _ in range(self.iters):
                t0 = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t0) * 1e6)
        return float(statistics.median(samples))

    def gemm(self, m: int, n: int, k: int, dtype: str) -> float:
        t = self.torch
        dt = self._dtype(dtype)
        x = t.randn(m, k, device=self.device, dtype=dt)
        w = t.randn(n, k, device=self.device, dtype=dt)
        return self._time(lambda: t.nn.functional.linear(x, w))

    def attention(self, batch, n_heads, n_kv_heads, head_dim, kv_len, window, kv_dtype):
        t = self.torch
        dt = self._dtype(kv_dtype)
        span = min(kv_len, window) if window else kv_len
        q = t.randn(batch, n_heads, 1, head_dim, device=self.device, dtype=dt)
        k = t.randn(batch, n_kv_heads, span, head_dim, device=self.device, dtype=dt)
        v = t.randn_like(k)
        sdpa = t.nn.functional.scaled_dot_product_attention
        return self._time(lambda: sdpa(q, k, v, enable_gqa=n_heads != n_kv_heads))

    def allreduce(self, n_gpus: int, message_bytes: int) -> float:
        """Single-process reduce + broadcast over `n_gpus` local GPUs (NCCL via torch.cuda.comm)."""
        t = self.torch
        if not self.device.startswith("cuda") or t.cuda.device_count() < n_gpus:
            raise UserError(f"all-reduce over {n_gpus} GPUs needs {n_gpus} visible CUDA devices")
        elems = max(message_bytes // 2, 1)
        bufs = [t.ones(elems, device=f"cuda:{i}", dtype=t.bfloat16) for i in range(n_gpus)]
        devices = list(range(n_gpus))

        def op():
            total = t.cuda.comm.reduce_add(bufs, destination=0)
            t.cuda.comm.broadcast(total, devices)

        return self._time(op)

    def system_facts(self) -> dict:
        t = self.torch
        facts: dict = {
            "gpus_per_node": 1,
            "intra_node_bandwidth_gbps": 64.0,
            "inter_node_bandwidth_gbps": 25.0,
        }
        if self.device.startswith("cuda"):
            props = t.cuda.get_device_properties(0)
            facts.update(
                device=props.name,
                memory_bytes=int(props.total_memory),
                sm_version=props.major * 10 + props.minor,
                gpus_per_node=t.cuda.device_count(),
            )
        else:
            facts.update(device="cpu", memory_bytes=8 * 2**30)
        nbytes = 2**28 if self.device.startswith("cuda") else 2**24
        src = t.empty(nbytes // 4, device=self.device, dtype=t.float32)
        copy_us = self._time(src.clone)
        facts["memory_bandwidth_gbps"] = 2 * nbytes / copy_us / 1e3
        size = 4096 if self.device.startswith("cuda") else 256
        gemm_us = self.gemm(size, size, size, "bfloat16")
        facts["peak_tflops"] = {"bfloat16": 2 * size**3 / gemm_us / 1e6}
        facts["source"] = "opweave-planner profiler: bandwidth and peak measured (copy, GEMM)"
        facts.update(self.overrides)
        return facts


def parse_shapes(specs: Sequence[str], arity: tuple[int, ...], what: str) -> tuple[tuple, ...]:
    """Parse 'A:B[:C...]' strings into int tuples; `arity` lists the allowed lengths."""
    out = []
    for spec in specs:
        try:
            parts = tuple(int(p) for p in spec.split(":"))
        except ValueError:
            parts = ()
        if len(parts) not in arity or any(p < 0 for p in parts):
            forms = " or ".join(":".join(["N"] * a) for a in arity)
            raise UserError(f"--{what} '{spec}': expected {forms} of non-negative integers")
        out.append(parts)
    return tuple(out)
