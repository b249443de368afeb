"""Convert NVIDIA aiconfigurator perf data (parquet + systems/*.yaml) into our profile format.

Input layout (aiconfigurator-core 0.12.0 wheel, ``aiconfigurator_core/systems``)::

    <src>/systems/<gpu>.yaml
    <src>/systems/data/<gpu>/<family>/<backend>/<version>/<table>.parquet

Decode tables and the prefill side (context attention, context MLA, Gated DeltaNet) are kept
(see profiles/README.md). Per family the
backend version that matches the GEMM table's version is used, else the newest.
pyarrow is imported lazily: it is only needed here (``opweave-planner[import]``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from opweave_planner.errors import UserError
from opweave_planner.latency.plausibility import GEMM_FALLBACK, sol_floor, untrusted_gemm_dtypes
from opweave_planner.latency.roofline import dtype_bytes
from opweave_planner.latency.tables import FORMAT_VERSION, table_payload, write_json

__all__ = ["MOE_ROUTINGS", "gpu_id", "import_aiconfigurator", "parse_simple_yaml", "system_floor"]

_GEMM_DTYPES = ("bfloat16", "fp8", "fp8_block")
#: aiconfigurator's MoE `distribution` -> our routing name (power_law_1.01 is not kept)
MOE_ROUTINGS = {"balanced": "balanced", "power_law_1.2": "power-law"}
_MS_TO_US = 1000.0


def gpu_id(source_name: str) -> str:
    """Short lowercase GPU id: 'h100_sxm' -> 'h100', 'l40s' -> 'l40s'."""
    return source_name.lower().split("_")[0]


def _pyarrow():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError("reading parquet needs pyarrow: install opweave-planner[import]") from None
    return pq


def _read_rows(path: Path) -> list[dict]:
    return _pyarrow().read_table(path).to_pylist()


def _version_key(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.a-z]+", v) if p)


def parse_simple_yaml(text: str) -> dict:
    """Parse the indentation-nested ``key: value  # comment`` subset used by systems/*.yaml."""
    root: dict = {}
    stack: list[tuple[int, dict]] = [(-1, root)]
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, _, value = line.strip().partition(":")
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        value = value.strip().strip("'\"")
        if value == "":
            parent[key] = {}
            stack.append((indent, parent[key]))
        else:
            try:
                parent[key] = int(value)
            except ValueError:
                try:
                    parent[key] = float(value)
                except ValueError:
                    parent[key] = value
    return root


def _system_payload(yaml_path: Path, gpu: str, device: str, fixed: dict | None = None) -> dict:
    spec = parse_simple_yaml(yaml_path.read_text())
    g, node, misc = spec.get("gpu", {}), spec.get("node", {}), spec.get("misc", {})
    try:
        peaks = {
            dt: g[f"{dt}_tc_flops"] / 1e12
            for dt in ("bfloat16", "fp8", "int8")
            if f"{dt}_tc_flops" in g
        }
        payload = {
            "format_version": FORMAT_VERSION,
            "gpu": gpu,
            "device": device,
            "sm_version": g.get("sm_version"),
            "memory_bytes": int(g["mem_capacity"]),
            "memory_bandwidth_gbps": g["mem_bw"] / 1e9,
            "peak_tflops": peaks,
            "power_w": g.get("power"),
            "gpus_per_node": int(node["num_gpus_per_node"]),
            "intra_node_bandwidth_gbps": node["intra_node_bw"] / 1e9,
            "inter_node_bandwidth_gbps": node["inter_node_bw"] / 1e9,
            "pcie_bandwidth_gbps": node["pcie_bw"] / 1e9 if "pcie_bw" in node else None,
            "p2p_latency_us": node["p2p_latency"] * 1e6 if "p2p_latency" in node else None,
            "nccl_memory_bytes": {str(k): int(v) for k, v in misc.get("nccl_mem", {}).items()},
            "other_memory_bytes": int(misc.get("other_mem", 0)),
            "source": f"aiconfigurator-core 0.12.0 systems/{yaml_path.name}",
            **(fixed or {}),
        }
    except (KeyError, TypeError) as exc:
        raise UserError(f"{yaml_path}: missing or malformed hardware field {exc}") from None
    if "bfloat16" not in peaks:
        raise UserError(f"{yaml_path}: expected gpu.bfloat16_tc_flops")
    return payload


def _fixed_costs(data_dir: Path, gemm_path: Path | None) -> dict:
    """Measured fixed costs: the fastest bf16 GEMM call (a small kernel's launch + tail) and
    the fastest 2-GPU NCCL all_gather (the fixed cost of one collective / send-recv call)."""
    out = {}
    if gemm_path is not None:
        lat = [r["latency"] for r in _read_rows(gemm_path) if r["gemm_dtype"] == "bfloat16"]
        if lat:
            out["kernel_floor_us"] = round(min(lat) * _MS_TO_US, 3)
    nccl, _ = _pick(data_dir, "comm", "nccl", "nccl_perf", None)
    if nccl is not None:
        lat = [r["latency"] for r in _read_rows(nccl) if r["op_name"] == "all_gather" and r["num_gpus"] == 2]
        if lat:
            out["transfer_fixed_us"] = round(min(lat) * _MS_TO_US, 3)
    return out


def system_floor(kind: str, system: dict):
    """The speed-of-light floor of a family on the GPU described by a system.json payload."""
    return sol_floor(kind, system["memory_bandwidth_gbps"], system["intra_node_bandwidth_gbps"],
                     system["peak_tflops"])


def _pick(data_dir: Path, family: str, backend: str, table: str, prefer: str | None):
    base = data_dir / family / backend
    versions = (
        [p.name for p in base.iterdir() if (p / f"{table}.parquet").is_file()]
        if base.is_dir()
        else []
    )
    if not versions:
        return None, None
    version = prefer if prefer in versions else max(versions, key=_version_key)
    return base / version / f"{table}.parquet", version


def _min_into(points: dict, key: tuple, latency_us: float) -> None:
    """Several kernels measured for one shape: keep the fastest (the runtime picks it)."""
    old = points.get(key)
    if old is None or latency_us < old:
        points[key] = latency_us


def _points(kind: str, rows: Iterable[dict]) -> tuple[dict, str]:
    pts: dict[tuple, float] = {}
    note = ""
    if kind == "gemm":
        for r in rows:
            if r["gemm_dtype"] in _GEMM_DTYPES:
                _min_into(pts, (r["gemm_dtype"], r["n"], r["k"], r["m"]), r["latency"] * _MS_TO_US)
        bad = untrusted_gemm_dtypes(pts)
        pts = {p: v for p, v in pts.items() if p[0] not in bad}
        kept = sorted({p[0] for p in pts})
        note = f"dtypes kept: {', '.join(kept)}"
        for dt, ratio in bad.items():
            note += (f"; {dt} dropped as implausible (median m<=16 latency {ratio:.1f}x the "
                     f"same-shape {GEMM_FALLBACK[dt]}; lookups use {GEMM_FALLBACK[dt]}, labelled fitted)")
    elif kind == "attention":
        for r in rows:
            if r.get("beam_width", 1) != 1 or r.get("isl", 1) != 1:
                continue
            key = (
                r["kv_cache_dtype"],
                r["num_heads"],
                r["num_key_value_heads"],
                r["head_dim"],
                r.get("window_size") or 0,
                r["batch_size"],
                r["step"] + 1,
            )
            _min_into(pts, key, r["latency"] * _MS_TO_US)
        note = "kv_len = step + 1 (cached tokens plus the new one)"
    elif kind == "mla":
        for r in rows:
            gemm_dtype = r.get("gemm_type") or r.get("mla_dtype")
            key = (r["kv_cache_dtype"], gemm_dtype, r["num_heads"], r["batch_size"], r["step"])
            _min_into(pts, key, r["latency"] * _MS_TO_US)
        note = "DeepSeek-V3 MLA module; kv_len = step as stored"
    elif kind == "moe":
        for r in rows:
            routing = MOE_ROUTINGS.get(r.get("distribution", "balanced"))
            if routing is None:
                continue
            key = (
                r["moe_dtype"],
                r["hidden_size"],
                r["inter_size"],
                r["topk"],
                r["num_experts"],
                r["moe_tp_size"],
                r["moe_ep_size"],
                routing,
                r["num_tokens"],
            )
            _min_into(pts, key, r["latency"] * _MS_TO_US)
        note = "routing: distribution=balanced -> balanced, power_law_1.2 -> power-law"
    elif kind == "context_attention":
        for r in rows:
            if r.get("beam_width", 1) != 1 or r.get("step", 0) != 0:
                continue
            key = (r["kv_cache_dtype"], r["num_heads"], r["num_key_value_heads"], r["head_dim"],
                   r.get("window_size") or 0, r["batch_size"], r["isl"])
            _min_into(pts, key, r["latency"] * _MS_TO_US)
        note = "prefill attention over seq_len = isl new tokens per request (step 0: no cached prefix)"
    elif kind == "mla_context":
        for r in rows:
            if r.get("step", 0) != 0:
                continue
            gemm_dtype = r.get("gemm_type") or r.get("mla_dtype")
            key = (r["kv_cache_dtype"], gemm_dtype, r["num_heads"], r["batch_size"], r["isl"])
            _min_into(pts, key, r["latency"] * _MS_TO_US)
        note = "DeepSeek-V3 MLA prefill module; seq_len = isl (no cached prefix)"
    elif kind == "linear_attention":
        cells: dict[tuple, dict[str, float]] = {}
        for r in rows:
            if r.get("phase") != "context":
                continue
            key = (r["num_k_heads"], r["head_k_dim"], r["num_v_heads"], r["head_v_dim"],
                   r["batch_size"], r["seq_len"])
            kernels = cells.setdefault(key, {})
            src = str(r.get("kernel_source", ""))
            lat = r["latency"] * _MS_TO_US
            kernels[src] = min(lat, kernels.get(src, lat))
        for key, kernels in cells.items():
            _min_into(pts, key, sum(kernels.values()))
        note = ("Gated DeltaNet prefill: conv1d + chunked delta rule summed per cell; "
                "seq_len = new tokens per request")
    elif kind == "allreduce":
        rows = list(rows)
        graph = [r for r in rows if "graph" in str(r.get("kernel_source", ""))]
        for r in graph or rows:
            dt = r["allreduce_dtype"]
            key = (dt, r["num_gpus"], int(r["message_size"] * dtype_bytes(dt)))
            _min_into(pts, key, r["latency"] * _MS_TO_US)
        note = "CUDA-graph variant; message_bytes = message_size (elements) * dtype size"
    return pts, note


_SOURCES = {  # kind -> (family folder, candidate table names in preference order)
    "gemm": ("gemm", ("gemm_perf",)),
    "attention": ("attention", ("generation_attention_perf",)),
    "mla": ("mla", ("mla_generation_module_perf", "generation_mla_perf")),
    "moe": ("moe", ("moe_perf",)),
    "allreduce": ("comm", ("custom_allreduce_perf",)),
    "context_attention": ("attention", ("context_attention_perf",)),
    "mla_context": ("mla", ("mla_context_module_perf", "context_mla_perf")),
    "linear_attention": ("linear_attention", ("gdn_perf",)),
}


def import_aiconfigurator(
    src_dir: Path,
    out_dir: Path,
    backend: str = "vllm",
    gpus: Iterable[str] | None = None,
) -> list[Path]:
    """Convert `src_dir` (an aiconfigurator ``systems`` folder or its parent) into `out_dir`.

    `gpus` filters by short id (h100) or source name (h100_sxm). Returns the
    files written. Raises UserError when nothing matches.
    """
    src = Path(src_dir)
    systems = src / "systems" if (src / "systems").is_dir() else src
    if not (systems / "data").is_dir():
        raise UserError(f"{src}: expected an aiconfigurator 'systems' folder with data/")
    wanted = {g.lower() for g in gpus} if gpus else None
    written: list[Path] = []
    for data_dir in sorted(p for p in (systems / "data").iterdir() if p.is_dir()):
        name = data_dir.name
        gid = gpu_id(name)
        if wanted is not None and gid not in wanted and name.lower() not in wanted:
            continue
        yaml_path = systems / f"{name}.yaml"
        if not yaml_path.is_file():
            continue
        gemm_path, prefer = _pick(data_dir, "gemm", backend, "gemm_perf", None)
        device = ""
        fixed = _fixed_costs(data_dir, gemm_path)
        system = _system_payload(yaml_path, gid, device, fixed)
        for kind, (family, tables) in _SOURCES.items():
            for table in tables:
                path, version = _pick(data_dir, family, backend, table, prefer)
                if path is not None:
                    break
            if path is None:
                continue
            rows = _read_rows(path)
            device = device or str(rows[0].get("device", "")) if rows else device
            pts, note = _points(kind, rows)
            if not pts:
                continue
            rel = path.relative_to(systems.parent if systems.name == "systems" else systems)
            payload = table_payload(
                kind,
                gid,
                backend,
                pts,
                backend_version=version,
                device=device,
                source=f"aiconfigurator-core 0.12.0: {rel.as_posix()}",
                notes=note,
                floor=system_floor(kind, system),
            )
            out = Path(out_dir) / gid / backend / f"{kind}.json"
            write_json(out, payload)
            written.append(out)
        if gemm_path is None and not device:
            continue
        out = Path(out_dir) / gid / "system.json"
        write_json(out, _system_payload(yaml_path, gid, device, fixed))
        written.append(out)
    if not written:
        raise UserError(f"{src}: no tables for backend '{backend}' and GPUs {sorted(wanted or [])}")
    return written
