"""GPU catalog, prices and network: validated once at the edge into frozen models."""

from __future__ import annotations

import hashlib
import math
import tomllib
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from opweave_planner.data import shipped_dir
from opweave_planner.errors import UserError

GIB = 1 << 30


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuType(_Frozen):
    id: str
    name: str
    aliases: tuple[str, ...] = ()
    memory_gb: float = Field(gt=0)
    bandwidth_gbps: float = Field(gt=0)
    bf16_tflops: float = Field(gt=0)
    fp8_tflops: float = Field(gt=0)
    price_per_hour: float = Field(ge=0)
    gpus_per_node: int = Field(ge=1)
    intra_node_gbps: float = Field(gt=0)

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * GIB


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
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{field}: file '{path}' does not exist")
    data = p.read_bytes()
    try:
        obj = tomllib.loads(data.decode()) if p.suffix == ".toml" else orjson.loads(data)
    except (tomllib.TOMLDecodeError, orjson.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{field}: '{path}' is not valid {'TOML' if p.suffix == '.toml' else 'JSON'} ({exc})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{field}: '{path}' must hold an object mapping names to values")
    return obj


def _gpu_from(gid: str, entry: Any, where: str) -> GpuType:
    if not isinstance(entry, dict):
        raise UserError(f"{where}: gpus.{gid} must be a table of fields")
    try:
        return GpuType(id=gid.lower(), **entry)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise UserError(f"{where}: gpus.{gid}.{loc}: {err['msg']}") from None


def _parse_catalog(obj: dict[str, Any], where: str) -> tuple[dict[str, GpuType], dict[str, Any]]:
    unknown = set(obj) - {"format_version", "gpus", "network"}
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; expected gpus, network")
    gpus = {gid.lower(): _gpu_from(gid, e, where) for gid, e in (obj.get("gpus") or {}).items()}
    return gpus, obj.get("network") or {}


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


def load_hardware(catalog: str | None = None, prices: str | None = None) -> Hardware:
    """Shipped catalog, plus an optional user catalog (adds/overrides GPU types) and prices."""
    base_path = shipped_dir("profiles") / "catalog.toml"
    digest = hashlib.sha256(base_path.read_bytes())
    gpus, net = _parse_catalog(read_table_file(base_path, "catalog"), str(base_path))
    if catalog:
        extra, extra_net = _parse_catalog(read_table_file(catalog, "--catalog"), catalog)
        gpus.update(extra)
        net = {**net, **extra_net}
        digest.update(Path(catalog).read_bytes())
    if prices:
        aliases = {a: g.id for g in gpus.values() for a in (g.id, *g.aliases)}
        for gid, price in parse_prices(read_table_file(prices, "--prices"), list(gpus), aliases, prices).items():
            gpus[gid] = gpus[gid].model_copy(update={"price_per_hour": price})
        digest.update(Path(prices).read_bytes())
    try:
        network = Network(**net)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UserError(f"catalog: network.{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    return Hardware(gpus=tuple(gpus.values()), network=network, sha256=digest.hexdigest())
