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
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any

import orjson
from pydantic import (
    AfterValidator,
    BeforeValidator,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticCustomError

from opweave_planner.data import profiles_root, shipped_dir
from opweave_planner.errors import UserError, printable
from opweave_planner.frozen import Frozen

GIB = 1 << 30
TIB = 1 << 40
#: a catalog, prices file or system.json is a few KiB; anything near this is not one
MAX_TABLE_BYTES = 16 << 20

#: physical range of each kind of GPU figure: (low, high, unit, high is exclusive). Generous
#: (every shipped GPU sits far inside); a value outside is a typo or a unit slip, and would
#: only overflow the cost model (a bandwidth of 1e-300 GB/s makes every time infinite).
BOUNDS: dict[str, tuple[float, float, str, bool]] = {
    "bandwidth": (1.0, 1e5, "GB/s", False),  # HBM: 1 TB/s to 8 TB/s today
    "link": (0.001, 1e5, "GB/s", False),  # NVLink, PCIe, the network (down to 1 MB/s)
    "tflops": (0.1, 1e5, "TFLOPS", False),
    "memory_gib": (1.0, 16384.0, "GiB", False),
    "memory_bytes": (GIB, 16 * TIB, "bytes", False),
    "reserve_bytes": (0, 16 * TIB, "bytes", False),  # runtime and NCCL bytes per GPU
    "price": (0.0, 1e4, "USD per GPU-hour", False),  # 0: a GPU already paid for
    "gpus_per_node": (1, 1024, "GPUs", False),
    "tp": (1, 1024, "GPUs", False),
    "latency_us": (0.0, 1e6, "us", True),  # kernel floors, fixed costs, latencies: below 1 s
    "power": (1.0, 1e5, "W", False),
}


def _fmt(x: float, unit: str = "") -> str:
    if unit == "bytes":
        for name, shift in (("TiB", 40), ("GiB", 30)):
            if x >= 1 << shift and x % (1 << shift) == 0:
                return f"{int(x) >> shift} {name}"
    return f"{x:.0f}" if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def bounds_text(kind: str) -> str:
    """'1 to 100000 GB/s' (or '0 to below 1000000 us', '1 GiB to 16 TiB')."""
    lo, hi, unit, open_hi = BOUNDS[kind]
    tail = "" if unit == "bytes" else f" {unit}"
    return f"{_fmt(lo, unit)} to {'below ' if open_hi else ''}{_fmt(hi, unit)}{tail}"


def within(kind: str, value: float) -> bool:
    """`value` lies in the physical range of `kind` (NaN, infinities and booleans never do)."""
    lo, hi, _unit, open_hi = BOUNDS[kind]
    if isinstance(value, bool):
        return False
    try:
        x = float(value)
    except (OverflowError, TypeError, ValueError):  # an integer of 400 digits
        return False
    return math.isfinite(x) and lo <= x and (x < hi if open_hi else x <= hi)


def _invalid(message: str) -> PydanticCustomError:
    """A validation error whose message is exactly ``message`` (no 'Value error, ' prefix),
    whoever formats it (this module, latency/tables.py)."""
    return PydanticCustomError("out_of_range", message)


def _shown(value: Any) -> str:
    """A number as an error line shows it (an integer of 400 digits is not printed whole)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**16:
        return f"an integer of {len(str(abs(value)))} digits"
    return repr(value)


def _ranged(tp: Any, kind: str) -> Any:
    """`tp` that must lie in the physical range of `kind`, with the range in the error
    (checked before coercion too, so 1e20 bytes is out of range, not 'too big an integer')."""
    def check(value):
        if isinstance(value, bool):  # pydantic would read true as 1.0
            raise _invalid(f"expected a number, got {str(value).lower()}")
        if isinstance(value, (int, float)) and not within(kind, value):
            raise _invalid(f"expected {bounds_text(kind)}, got {_shown(value)}")
        return value
    return Annotated[tp, BeforeValidator(check), AfterValidator(check)]


Bandwidth = _ranged(float, "bandwidth")
Link = _ranged(float, "link")
Tflops = _ranged(float, "tflops")
Micros = _ranged(float, "latency_us")
GpusPerNode = _ranged(int, "gpus_per_node")
ReserveBytes = _ranged(int, "reserve_bytes")


def _nccl_checked(table: Any) -> Any:
    """TP size -> bytes: positive TP sizes, byte counts in the reserve range."""
    pairs = table.items() if isinstance(table, dict) else table
    for k, v in pairs:
        if not within("tp", int(k)):
            raise _invalid(f"TP size {k!r}: expected {bounds_text('tp')}")
        if isinstance(v, bool) or not within("reserve_bytes", v):
            raise _invalid(f"TP {k}: expected {bounds_text('reserve_bytes')}, got {_shown(v)}")
    return table


def first_error(exc: ValidationError) -> str:
    """'<key>: <what was expected>' for the first error of a validation (pydantic's prefix off)."""
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg
#: fixed costs of GPUs whose profiles do not say (H100's measured values, see docs/profiles.md)
DEFAULT_KERNEL_FLOOR_US = 2.452
DEFAULT_TRANSFER_FIXED_US = 5.14
#: framework reserve of GPUs whose profiles do not say (aiconfigurator's other_mem, 3.5 GiB)
DEFAULT_OTHER_MEMORY_BYTES = int(3.5 * GIB)
#: NCCL buffers by TP size of GPUs whose profiles do not say (aiconfigurator's nccl_mem,
#: the same on all four profiled GPUs)
DEFAULT_NCCL_MEMORY_BYTES = {"1": 0, "2": 358612992, "4": 411041792, "8": 411041792}


class SystemSpec(Frozen):
    """`profiles/<gpu>/system.json`: measured hardware facts. Bandwidths GB/s (1e9 B/s), peaks TFLOPS."""

    format_version: int
    gpu: str
    device: str
    sm_version: int | None = None
    memory_bytes: _ranged(int, "memory_bytes")
    memory_bandwidth_gbps: Bandwidth
    #: dtype -> dense tensor-core peak in TFLOPS (bfloat16 always present)
    peak_tflops: dict[str, Tflops]
    power_w: _ranged(float, "power") | None = None
    gpus_per_node: GpusPerNode
    intra_node_bandwidth_gbps: Link
    inter_node_bandwidth_gbps: Link
    pcie_bandwidth_gbps: Link | None = None
    p2p_latency_us: Micros | None = None
    #: tensor-parallel size (as a string key) -> bytes NCCL keeps per GPU
    nccl_memory_bytes: Annotated[dict[str, int], AfterValidator(_nccl_checked)] = {}  # noqa: RUF012 (pydantic copies it)
    #: framework/runtime bytes reserved per GPU besides weights, KV and NCCL
    other_memory_bytes: ReserveBytes = 0
    #: fastest measured kernel on this GPU (µs): the floor of any small kernel
    kernel_floor_us: Micros | None = None
    #: fastest measured 2-GPU NCCL collective (µs): the fixed cost of one send/recv
    transfer_fixed_us: Micros | None = None
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


class GpuType(Frozen):
    """One GPU type as every cost path sees it (see the module docstring for precedence)."""

    id: str
    name: str
    aliases: tuple[str, ...] = ()
    memory_gb: _ranged(float, "memory_gib")  # GiB
    bandwidth_gbps: Bandwidth
    bf16_tflops: Tflops
    fp8_tflops: Tflops
    price_per_hour: _ranged(float, "price")
    price_estimated: bool = False  # the catalog's price is our estimate, not a market quote
    gpus_per_node: GpusPerNode
    intra_node_gbps: Link
    int8_tflops: Tflops | None = None
    #: NCCL buffer bytes per GPU by TP size, ((tp, bytes), ...) sorted; a TOML/JSON table is accepted
    nccl_memory_bytes: Annotated[tuple[tuple[int, int], ...], AfterValidator(_nccl_checked)] = tuple(
        (int(k), v) for k, v in DEFAULT_NCCL_MEMORY_BYTES.items())
    #: runtime bytes per GPU outside weights/KV/NCCL (CUDA context, graphs, allocator)
    other_memory_bytes: ReserveBytes = DEFAULT_OTHER_MEMORY_BYTES
    #: per-kernel launch floor (µs) of small kernels (elementwise passes)
    kernel_floor_us: Micros = DEFAULT_KERNEL_FLOOR_US
    #: fixed cost (µs) of one stage-to-stage transfer call (NCCL send/recv)
    transfer_fixed_us: Micros = DEFAULT_TRANSFER_FIXED_US
    #: where the physical facts came from
    facts: str = "catalog"

    @field_validator("nccl_memory_bytes", mode="before")
    @classmethod
    def _nccl_table(cls, v: Any) -> Any:
        if isinstance(v, dict):
            try:
                return tuple(sorted((int(k), int(b)) for k, b in v.items()))
            except (TypeError, ValueError, OverflowError):
                raise _invalid("expected a table of TP size = bytes per GPU") from None
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
    got = _read_system(path)
    return None if got is None else got[0]


def _read_system(path: Path) -> tuple[SystemSpec, bytes] | None:
    """(spec, the bytes it was read from), read once: None when nothing is there; a folder,
    FIFO, dangling link or out-of-range figure is a one-line error naming the file and key."""
    from opweave_planner.atomic import read_input

    if not os.path.lexists(path):
        return None
    data = read_input(path, None, MAX_TABLE_BYTES)
    where = printable(path)
    try:
        spec = SystemSpec.model_validate(orjson.loads(data))
    except orjson.JSONDecodeError as exc:
        raise UserError(f"{where}: not a valid system.json ({exc})") from None
    except ValidationError as exc:
        raise UserError(f"{where}: not a valid system.json ({first_error(exc)})") from None
    if "bfloat16" not in spec.peak_tflops:
        raise UserError(f"{where}: peak_tflops needs a 'bfloat16' entry")
    return spec, data


class Network(Frozen):
    inter_node_gbps: Link = 32.0
    inter_node_latency_us: Micros = 20.0
    intra_node_latency_us: Micros = 10.0


#: the flag that sets each Network field on the command line
NETWORK_FLAGS = {"inter_node_gbps": "--network-bandwidth", "inter_node_latency_us": "--network-latency"}


class Hardware(Frozen):
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
        """This catalog on another network; a value outside its physical range names its flag."""
        given = {k: v for k, v in kw.items() if v is not None}
        try:
            net = Network.model_validate({**self.network.model_dump(), **given})
        except ValidationError as exc:
            err = exc.errors()[0]
            key = str(err["loc"][0]) if err["loc"] else ""
            flag = NETWORK_FLAGS.get(key, f"network.{key}")
            raise UserError(f"{flag}: {str(err['msg']).removeprefix('Value error, ')}") from None
        return self.model_copy(update={"network": net})


def read_table_file(path: str | Path, field: str) -> dict[str, Any]:
    """Read a JSON or TOML object; errors name the file and the flag."""
    return _read_table(path, field)[0]


def _read_table(path: str | Path, field: str) -> tuple[dict[str, Any], bytes]:
    """(object, the bytes it was parsed from): read once, so the digest covers what was parsed."""
    from opweave_planner.atomic import read_input

    p = Path(path)
    data = read_input(p, field, MAX_TABLE_BYTES)
    where = f"{field}: '{printable(path)}'"
    kind = "TOML" if p.suffix == ".toml" else "JSON"
    try:
        obj = tomllib.loads(data.decode()) if kind == "TOML" else orjson.loads(data)
    except (tomllib.TOMLDecodeError, orjson.JSONDecodeError, ValueError, RecursionError) as exc:  # ValueError:
        # an integer over Python's 4300-digit conversion limit, or bytes that are not UTF-8
        raise UserError(f"{where} is not valid {kind} ({exc})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{where} must hold an object mapping names to values")
    return obj, data


def _gpu_from(gid: str, entry: dict[str, Any], where: str) -> GpuType:
    try:
        return GpuType(id=gid.lower(), **entry)
    except ValidationError as exc:
        raise UserError(f"{where}: gpus.{gid}.{first_error(exc)}") from None


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


def _merge(shipped: dict[str, dict], user: dict[str, dict], root: Path, where: dict[str, str],
           read: dict[Path, bytes]) -> dict[str, GpuType]:
    """shipped catalog < profiles' system.json < user catalog, field by field, then validated
    (a bad value is blamed on the file it came from). `read` collects each system.json's bytes."""
    out = {}
    for gid in [*shipped, *(g for g in user if g not in shipped)]:
        entry = dict(shipped.get(gid, {}))
        sysf = root / gid / "system.json"
        got = _read_system(sysf)
        if got is not None:
            entry.update(facts_from_system(got[0]))
            read[sysf] = got[1]
        if gid in user:
            entry.update(user[gid])
            if set(user[gid]) - {"name", "aliases", "price_per_hour", "price_estimated"}:
                entry["facts"] = f"{entry.get('facts', 'catalog')} + --catalog"
        try:
            out[gid] = GpuType(id=gid.lower(), **entry)
        except ValidationError as exc:
            key = str(exc.errors()[0]["loc"][0]) if exc.errors()[0]["loc"] else ""
            blame = where["--catalog"] if key in user.get(gid, {}) else where.get(gid, "catalog")
            raise UserError(f"{blame}: gpus.{gid}.{first_error(exc)}") from None
    return out


def parse_prices(obj: dict[str, Any], hw_ids: list[str], aliases: dict[str, str], where: str) -> dict[str, float]:
    """GPU id -> USD per GPU-hour, every price in range (see BOUNDS['price'])."""

    where = printable(where)
    prices = {}
    for key, value in obj.items():
        gid = aliases.get(str(key).lower())
        if gid is None:
            raise UserError(f"--prices: '{where}' has unknown GPU '{printable(key)}'; expected one of "
                            f"{', '.join(hw_ids)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"--prices: '{where}' price of '{printable(key)}' must be a number (USD per GPU-hour), "
                            f"got {printable(repr(value))[:80]}")
        if not within("price", value):
            raise UserError(f"--prices: '{where}' price of '{printable(key)}' must be non-negative and at most "
                            f"{_fmt(BOUNDS['price'][1])} USD per GPU-hour, got {_shown(value)}")
        prices[gid] = float(value)
    return prices


def load_hardware(catalog: str | None = None, prices: str | None = None,
                  profiles_dir: str | Path | None = None) -> Hardware:
    """Shipped catalog + the profiles' system.json facts + an optional user catalog, and prices.

    A user catalog entry for a known GPU may give only the fields it changes;
    a new GPU needs every field unless `profiles_dir` has its system.json.
    """

    base_path = shipped_dir("profiles") / "catalog.toml"
    obj, data = _read_table(base_path, "catalog")
    digest = hashlib.sha256(data)
    shipped, net = _parse_catalog(obj, str(base_path))
    user: dict[str, dict] = {}
    where = {gid: str(base_path) for gid in shipped}
    net_where = str(base_path)
    if catalog:
        obj, data = _read_table(catalog, "--catalog")
        where["--catalog"] = f"--catalog: '{printable(catalog)}'"
        user, extra_net = _parse_catalog(obj, where["--catalog"])
        where.update(dict.fromkeys((g for g in user if g not in shipped), where["--catalog"]))
        if extra_net:
            net_where = where["--catalog"]
        net = {**net, **extra_net}
        digest.update(data)
    root = profiles_root(profiles_dir)
    read: dict[Path, bytes] = {}
    gpus = _merge(shipped, user, root, where, read)
    for gid in sorted(gpus):
        sysf = root / gid / "system.json"
        if sysf in read:
            digest.update(read[sysf])
    if prices:
        obj, data = _read_table(prices, "--prices")
        aliases = {a: g.id for g in gpus.values() for a in (g.id, *g.aliases)}
        for gid, price in parse_prices(obj, list(gpus), aliases, prices).items():
            gpus[gid] = gpus[gid].model_copy(update={"price_per_hour": price, "price_estimated": False})
        digest.update(data)
    try:
        network = Network(**net)
    except ValidationError as exc:
        raise UserError(f"{net_where}: network.{first_error(exc)}") from None
    return Hardware(gpus=tuple(gpus.values()), network=network, sha256=digest.hexdigest())
