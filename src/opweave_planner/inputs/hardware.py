"""GPU catalog, prices and network: validated once at the edge into frozen models.

One GPU description (`GpuType`) is what every cost path reads: the roofline,
the table lookups (their speed-of-light scaling and fallbacks), the memory
budget and the search. Its physical facts come, in increasing priority, from
the shipped catalog (`profiles/catalog.toml`: names, prices, and facts of GPUs
without profiles), the profiles' measured hardware data
(`profiles/<gpu>/system.json`, `SystemSpec`: memory capacity, bandwidth,
peaks, node, links, NCCL/runtime memory, fixed costs), and a user
`--catalog`, whose fields override both everywhere.
"""

from __future__ import annotations

import hashlib
import math
import tomllib
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from opweave_planner.data import profiles_root, shipped_dir
from opweave_planner.errors import UserError

GIB = 1 << 30
#: fixed costs of GPUs whose profiles do not say (H100's measured values, see docs/profiles.md)
DEFAULT_KERNEL_FLOOR_US = 2.452
DEFAULT_TRANSFER_FIXED_US = 5.14
#: framework reserve of GPUs whose profiles do not say (aiconfigurator's other_mem, 3.5 GiB)
DEFAULT_OTHER_MEMORY_BYTES = int(3.5 * GIB)
#: NCCL buffers by TP size of GPUs whose profiles do not say (aiconfigurator's nccl_mem,
#: the same on all four profiled GPUs)
DEFAULT_NCCL_MEMORY_BYTES = {"1": 0, "2": 358612992, "4": 411041792, "8": 411041792}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SystemSpec(_Frozen):
    """`profiles/<gpu>/system.json`: measured hardware facts. Bandwidths GB/s (1e9 B/s), peaks TFLOPS."""

    format_version: int
    gpu: str
    device: str
    sm_version: int | None = None
    memory_bytes: int
    memory_bandwidth_gbps: float
    #: dtype -> dense tensor-core peak in TFLOPS (bfloat16 always present)
    peak_tflops: dict[str, float]
    power_w: float | None = None
    gpus_per_node: int
    intra_node_bandwidth_gbps: float
    inter_node_bandwidth_gbps: float
    pcie_bandwidth_gbps: float | None = None
    p2p_latency_us: float | None = None
    #: tensor-parallel size (as a string key) -> bytes NCCL keeps per GPU
    nccl_memory_bytes: dict[str, int] = {}
    #: framework/runtime bytes reserved per GPU besides weights, KV and NCCL
    other_memory_bytes: int = 0
    #: fastest measured kernel on this GPU (µs): the floor of any small kernel
    kernel_floor_us: float | None = None
    #: fastest measured 2-GPU NCCL collective (µs): the fixed cost of one send/recv
    transfer_fixed_us: float | None = None
    source: str = ""

    def peak(self, dtype: str) -> float:
        """Peak TFLOPS for `dtype`, falling back to the bfloat16 peak."""
        return self.peak_tflops.get(_compute_dtype(dtype), self.peak_tflops["bfloat16"])


def _compute_dtype(dtype: str) -> str:
    if dtype.startswith("fp8"):
        return "fp8"
    if dtype in ("int8",):
        return "int8"
    return "bfloat16"


class GpuType(_Frozen):
    """One GPU type as every cost path sees it (see the module docstring for precedence)."""

    id: str
    name: str
    aliases: tuple[str, ...] = ()
    memory_gb: float = Field(gt=0)  # GiB
    bandwidth_gbps: float = Field(gt=0)
    bf16_tflops: float = Field(gt=0)
    fp8_tflops: float = Field(gt=0)
    price_per_hour: float = Field(ge=0)
    price_estimated: bool = False  # the catalog's price is our estimate, not a market quote
    gpus_per_node: int = Field(ge=1)
    intra_node_gbps: float = Field(gt=0)
    int8_tflops: float | None = Field(default=None, gt=0)
    #: NCCL buffer bytes per GPU by TP size, ((tp, bytes), ...) sorted; a TOML/JSON table is accepted
    nccl_memory_bytes: tuple[tuple[int, int], ...] = tuple(
        (int(k), v) for k, v in DEFAULT_NCCL_MEMORY_BYTES.items())
    #: runtime bytes per GPU outside weights/KV/NCCL (CUDA context, graphs, allocator)
    other_memory_bytes: int = Field(default=DEFAULT_OTHER_MEMORY_BYTES, ge=0)
    #: per-kernel launch floor (µs) of small kernels (elementwise passes)
    kernel_floor_us: float = Field(default=DEFAULT_KERNEL_FLOOR_US, ge=0)
    #: fixed cost (µs) of one stage-to-stage transfer call (NCCL send/recv)
    transfer_fixed_us: float = Field(default=DEFAULT_TRANSFER_FIXED_US, ge=0)
    #: where the physical facts came from
    facts: str = "catalog"

    @field_validator("nccl_memory_bytes", mode="before")
    @classmethod
    def _nccl_table(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return tuple(sorted((int(k), int(b)) for k, b in v.items()))
        return v

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * GIB

    def peak(self, dtype: str) -> float:
        """Dense tensor-core TFLOPS for a GEMM dtype (bf16 for anything not fp8/int8)."""
        cd = _compute_dtype(dtype)
        if cd == "fp8":
            return self.fp8_tflops
        if cd == "int8":
            return self.int8_tflops or self.fp8_tflops
        return self.bf16_tflops

    def system_updates(self) -> dict:
        """The SystemSpec fields this description fixes (applied to the profile set it costs with)."""
        peaks = {"bfloat16": self.bf16_tflops, "fp8": self.fp8_tflops}
        if self.int8_tflops:
            peaks["int8"] = self.int8_tflops
        return {
            "memory_bytes": round(self.memory_bytes),
            "memory_bandwidth_gbps": self.bandwidth_gbps,
            "peak_tflops": peaks,
            "gpus_per_node": self.gpus_per_node,
            "intra_node_bandwidth_gbps": self.intra_node_gbps,
            "nccl_memory_bytes": {str(k): b for k, b in self.nccl_memory_bytes},
            "other_memory_bytes": self.other_memory_bytes,
            "kernel_floor_us": self.kernel_floor_us,
            "transfer_fixed_us": self.transfer_fixed_us,
        }


def facts_from_system(spec: SystemSpec) -> dict[str, Any]:
    """GpuType fields given by a profile's system.json (the measured memory capacity included)."""
    fp8 = spec.peak_tflops.get("fp8")
    out: dict[str, Any] = {
        "memory_gb": spec.memory_bytes / GIB,
        "bandwidth_gbps": spec.memory_bandwidth_gbps,
        "bf16_tflops": spec.peak_tflops["bfloat16"],
        "gpus_per_node": spec.gpus_per_node,
        "intra_node_gbps": spec.intra_node_bandwidth_gbps,
        "nccl_memory_bytes": dict(spec.nccl_memory_bytes),
        "other_memory_bytes": spec.other_memory_bytes,
        "facts": f"profiles/{spec.gpu}/system.json",
    }
    if fp8:
        out["fp8_tflops"] = fp8
    if spec.peak_tflops.get("int8"):
        out["int8_tflops"] = spec.peak_tflops["int8"]
    if spec.kernel_floor_us is not None:
        out["kernel_floor_us"] = spec.kernel_floor_us
    if spec.transfer_fixed_us is not None:
        out["transfer_fixed_us"] = spec.transfer_fixed_us
    return out


def read_system_json(path: Path) -> SystemSpec | None:
    """A validated system.json, or None when absent; malformed files are a one-line UserError."""
    if not path.is_file():
        return None
    try:
        spec = SystemSpec.model_validate(orjson.loads(path.read_bytes()))
    except (orjson.JSONDecodeError, ValidationError) as exc:
        raise UserError(f"{path}: not a valid system.json ({str(exc).splitlines()[0]})") from None
    if "bfloat16" not in spec.peak_tflops:
        raise UserError(f"{path}: peak_tflops needs a 'bfloat16' entry")
    return spec


class Network(_Frozen):
    inter_node_gbps: float = Field(default=32.0, gt=0)
    inter_node_latency_us: float = Field(default=20.0, ge=0)
    intra_node_latency_us: float = Field(default=10.0, ge=0)


class Hardware(_Frozen):
    """The catalog in effect (after --catalog additions and --prices overrides)."""

    gpus: tuple[GpuType, ...]
    network: Network
    sha256: str = ""

    def ids(self) -> list[str]:
        return [g.id for g in self.gpus]

    def resolve(self, name: str, field: str = "--gpus") -> GpuType:
        key = name.strip().lower()
        for g in self.gpus:
            if key == g.id or key in g.aliases:
                return g
        raise UserError(f"{field}: unknown GPU '{name}'; expected one of {', '.join(self.ids())}")

    def with_network(self, **kw: float | None) -> Hardware:
        net = self.network.model_copy(update={k: v for k, v in kw.items() if v is not None})
        Network.model_validate(net.model_dump())
        return self.model_copy(update={"network": net})


def read_table_file(path: str | Path, field: str) -> dict[str, Any]:
    """Read a JSON or TOML object; errors name the file and the flag."""
    from opweave_planner.atomic import read_input

    p = Path(path)
    data = read_input(p, field)
    try:
        obj = tomllib.loads(data.decode()) if p.suffix == ".toml" else orjson.loads(data)
    except (tomllib.TOMLDecodeError, orjson.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{field}: '{path}' is not valid {'TOML' if p.suffix == '.toml' else 'JSON'} ({exc})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{field}: '{path}' must hold an object mapping names to values")
    return obj


def _gpu_from(gid: str, entry: dict[str, Any], where: str) -> GpuType:
    try:
        return GpuType(id=gid.lower(), **entry)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise UserError(f"{where}: gpus.{gid}.{loc}: {err['msg']}") from None


def _parse_catalog(obj: dict[str, Any], where: str) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Raw per-GPU field tables (validated once merged) and the network table."""
    unknown = set(obj) - {"format_version", "gpus", "network"}
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; expected gpus, network")
    gpus = {}
    table = obj.get("gpus") or {}
    if not isinstance(table, dict):
        raise UserError(f"{where}: 'gpus' must be a table of [gpus.<id>] tables, got {type(table).__name__}")
    if not isinstance(obj.get("network") or {}, dict):
        raise UserError(f"{where}: 'network' must be a table of network fields")
    for gid, entry in table.items():
        if not isinstance(entry, dict):
            raise UserError(f"{where}: gpus.{gid} must be a table of fields")
        gpus[gid.lower()] = dict(entry)
    return gpus, obj.get("network") or {}


def _merge(shipped: dict[str, dict], user: dict[str, dict], root: Path,
           where: dict[str, str]) -> dict[str, GpuType]:
    """shipped catalog < profiles' system.json < user catalog, field by field, then validated."""
    out = {}
    for gid in [*shipped, *(g for g in user if g not in shipped)]:
        entry = dict(shipped.get(gid, {}))
        spec = read_system_json(root / gid / "system.json")
        if spec is not None:
            entry.update(facts_from_system(spec))
        if gid in user:
            entry.update(user[gid])
            if set(user[gid]) - {"name", "aliases", "price_per_hour", "price_estimated"}:
                entry["facts"] = f"{entry.get('facts', 'catalog')} + --catalog"
        out[gid] = _gpu_from(gid, entry, where.get(gid, "catalog"))
    return out


def parse_prices(obj: dict[str, Any], hw_ids: list[str], aliases: dict[str, str], where: str) -> dict[str, float]:
    prices = {}
    for key, value in obj.items():
        gid = aliases.get(str(key).lower())
        if gid is None:
            raise UserError(f"--prices: '{where}' has unknown GPU '{key}'; expected one of {', '.join(hw_ids)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UserError(f"--prices: '{where}' price of '{key}' must be a number (USD per GPU-hour), got {value!r}")
        if value < 0:
            raise UserError(f"--prices: '{where}' price of '{key}' must be non-negative, got {value}")
        prices[gid] = float(value)
    return prices


def load_hardware(catalog: str | None = None, prices: str | None = None,
                  profiles_dir: str | Path | None = None) -> Hardware:
    """Shipped catalog + the profiles' system.json facts + an optional user catalog, and prices.

    A user catalog entry for a known GPU may give only the fields it changes;
    a new GPU needs every field unless `profiles_dir` has its system.json.
    """
    base_path = shipped_dir("profiles") / "catalog.toml"
    digest = hashlib.sha256(base_path.read_bytes())
    shipped, net = _parse_catalog(read_table_file(base_path, "catalog"), str(base_path))
    user: dict[str, dict] = {}
    where = {gid: str(base_path) for gid in shipped}
    if catalog:
        user, extra_net = _parse_catalog(read_table_file(catalog, "--catalog"), catalog)
        where.update(dict.fromkeys(user, catalog))
        net = {**net, **extra_net}
        digest.update(Path(catalog).read_bytes())
    root = profiles_root(profiles_dir)
    gpus = _merge(shipped, user, root, where)
    for gid in sorted(gpus):
        sysf = root / gid / "system.json"
        if sysf.is_file():
            digest.update(sysf.read_bytes())
    if prices:
        aliases = {a: g.id for g in gpus.values() for a in (g.id, *g.aliases)}
        for gid, price in parse_prices(read_table_file(prices, "--prices"), list(gpus), aliases, prices).items():
            gpus[gid] = gpus[gid].model_copy(update={"price_per_hour": price, "price_estimated": False})
        digest.update(Path(prices).read_bytes())
    try:
        network = Network(**net)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UserError(f"catalog: network.{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    return Hardware(gpus=tuple(gpus.values()), network=network, sha256=digest.hexdigest())
