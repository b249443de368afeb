"""The project's kernel-profile format: validated, frozen, cached.

A profile set is one GPU measured under one serving backend::

    <profiles>/<gpu>/system.json               hardware facts (SystemSpec)
    <profiles>/<gpu>/<backend>/<kind>.json     one GridTable per kernel family

Every file carries ``format_version`` (currently 1). A ``GridTable`` holds, for
each categorical key (e.g. GEMM ``(dtype, n, k)``), a dense grid of latencies in
microseconds over the table's continuous axes (e.g. ``m``), ``null`` where the
source did not measure. Kinds, keys and axes are listed in ``KIND_SCHEMA``; the
full description lives in ``profiles/README.md``.

Only numpy, orjson and pydantic are needed here; pyarrow is for the importer.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from opweave_planner.errors import UserError
from opweave_planner.inputs.hardware import SystemSpec
from opweave_planner.latency.monotone import KEEP_TOL, robust_monotone

__all__ = [
    "DECODE_KINDS",
    "FORMAT_VERSION",
    "KIND_SCHEMA",
    "PREFILL_KINDS",
    "GridTable",
    "ProfileSet",
    "SystemSpec",
    "available_gpus",
    "load_profile_set",
    "read_system",
    "read_table",
    "table_payload",
    "write_json",
]

FORMAT_VERSION = 1

Kind = Literal["gemm", "attention", "mla", "moe", "allreduce", "context_attention", "mla_context",
               "linear_attention"]

#: kind -> (categorical key fields, continuous axes in grid order)
KIND_SCHEMA: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gemm": (("dtype", "n", "k"), ("m",)),
    "attention": (
        ("kv_dtype", "n_heads", "n_kv_heads", "head_dim", "window"),
        ("batch", "kv_len"),
    ),
    "mla": (("kv_dtype", "gemm_dtype", "n_heads"), ("batch", "kv_len")),
    "moe": (("dtype", "hidden", "inter", "topk", "n_experts", "tp", "ep", "routing"), ("tokens",)),
    "allreduce": (("dtype", "n_gpus"), ("message_bytes",)),
    # the prefill side: one pass over `seq_len` new tokens per request, no cached prefix
    "context_attention": (
        ("kv_dtype", "n_heads", "n_kv_heads", "head_dim", "window"),
        ("batch", "seq_len"),
    ),
    "mla_context": (("kv_dtype", "gemm_dtype", "n_heads"), ("batch", "seq_len")),
    "linear_attention": (("n_k_heads", "k_dim", "n_v_heads", "v_dim"), ("batch", "seq_len")),
}

#: the families a decode plan reads (its profiles fingerprint covers these files only) and the
#: prefill side's, which a decode plan never reads
DECODE_KINDS = ("gemm", "attention", "mla", "moe", "allreduce")
PREFILL_KINDS = ("context_attention", "mla_context", "linear_attention")

_STRICT = ConfigDict(frozen=True, extra="forbid")


#: labels a cell can carry besides "measured": moved by the monotone fit, raised to speed of light
CELL_LABELS = ("smoothed", "floored")


class _Group(BaseModel):
    model_config = _STRICT

    key: tuple[str | int, ...]
    latency_us: list  # nested lists of float | None, depth = number of axes
    #: label -> flat (C-order) indices of cells that are not plain measurements (a factory:
    #: pydantic deep-copies a literal default for every group, a tenth of a table's read)
    labels: dict[Literal["smoothed", "floored"], list[int]] = Field(default_factory=dict)


class GridTable(BaseModel):
    """Latencies (µs per kernel call on one GPU) on a grid, per categorical key."""

    model_config = _STRICT

    format_version: int
    kind: Kind
    gpu: str
    backend: str
    backend_version: str = ""
    device: str = ""
    source: str = ""
    notes: str = ""
    key_fields: tuple[str, ...]
    axes: dict[str, tuple[float, ...]]
    groups: tuple[_Group, ...]

    _axes: tuple[np.ndarray, ...] = PrivateAttr()
    _grids: dict[tuple, np.ndarray] = PrivateAttr()
    _labels: dict[tuple, np.ndarray] = PrivateAttr()

    def model_post_init(self, _ctx: object) -> None:
        want_keys, want_axes = KIND_SCHEMA[self.kind]
        if self.key_fields != want_keys:
            raise ValueError(f"key_fields must be {list(want_keys)} for kind {self.kind}")
        if tuple(self.axes) != want_axes:
            raise ValueError(f"axes must be {list(want_axes)} for kind {self.kind}")
        axes = tuple(np.asarray(v, dtype=np.float64) for v in self.axes.values())
        for name, a in zip(want_axes, axes, strict=True):
            if a.size == 0 or not np.all(np.isfinite(a)) or np.any(np.diff(a) <= 0):
                raise ValueError(f"axis '{name}' must be non-empty and strictly increasing")
        shape = tuple(a.size for a in axes)
        grids, labels = self._stacked(shape) or self._one_by_one(shape)
        self._axes = axes
        self._grids = grids
        self._labels = labels

    def _stacked(self, shape: tuple[int, ...]) -> tuple[dict, dict] | None:
        """Every group's grid and labels from one numpy conversion (a shipped table has up to
        1,231 groups; one conversion and one check each was most of its read), or None when
        any group is malformed: `_one_by_one` then names the first, as it always did."""
        want_keys = KIND_SCHEMA[self.kind][0]
        keys = [g.key for g in self.groups]
        if not keys or any(len(k) != len(want_keys) for k in keys) or len(set(keys)) != len(keys):
            return None
        try:
            stack = np.array([g.latency_us for g in self.groups], dtype=np.float64)  # None -> nan
        except (TypeError, ValueError):
            return None
        if stack.shape != (len(keys), *shape):
            return None
        flat = stack.reshape(len(keys), -1)
        finite = np.isfinite(flat)
        if not finite.any(axis=1).all() or np.any(finite & (flat <= 0)):
            return None
        lab = np.zeros(stack.shape, dtype=np.int8)
        lab_flat = lab.reshape(len(keys), -1)
        for i, g in enumerate(self.groups):
            for code, name in enumerate(CELL_LABELS, start=1):
                idx = g.labels.get(name)
                if idx:
                    if min(idx) < 0 or max(idx) >= flat.shape[1]:
                        return None
                    lab_flat[i, idx] = code
        return dict(zip(keys, stack, strict=True)), dict(zip(keys, lab, strict=True))

    def _one_by_one(self, shape: tuple[int, ...]) -> tuple[dict, dict]:
        """Each group checked on its own: the first malformed one raises, naming itself."""
        want_keys = KIND_SCHEMA[self.kind][0]
        grids: dict[tuple, np.ndarray] = {}
        labels: dict[tuple, np.ndarray] = {}
        for i, g in enumerate(self.groups):
            if len(g.key) != len(want_keys):
                raise ValueError(f"groups[{i}].key must have {len(want_keys)} entries")
            try:
                grid = np.array(g.latency_us, dtype=np.float64)  # None -> nan
            except (TypeError, ValueError) as exc:
                raise ValueError(f"groups[{i}].latency_us is not a numeric grid") from exc
            if grid.shape != shape:
                raise ValueError(f"groups[{i}].latency_us has shape {grid.shape}, want {shape}")
            measured = grid[np.isfinite(grid)]
            if measured.size == 0 or np.any(measured <= 0):
                raise ValueError(f"groups[{i}].latency_us needs positive values (null = missing)")
            if g.key in grids:
                raise ValueError(f"groups[{i}].key {list(g.key)} is repeated")
            grids[g.key] = grid
            lab = np.zeros(shape, dtype=np.int8)
            for code, name in enumerate(CELL_LABELS, start=1):
                idx = np.asarray(g.labels.get(name, []), dtype=np.int64)
                if idx.size and (idx.min() < 0 or idx.max() >= grid.size):
                    raise ValueError(f"groups[{i}].labels.{name} has an index outside the grid")
                lab.reshape(-1)[idx] = code
            labels[g.key] = lab
        return grids, labels

    @property
    def axis_arrays(self) -> tuple[np.ndarray, ...]:
        """Continuous axes as float64 arrays, in grid order."""
        return self._axes

    @property
    def grids(self) -> dict[tuple, np.ndarray]:
        """key tuple -> float64 grid (nan where not measured). Do not mutate."""
        return self._grids

    @property
    def labels(self) -> dict[tuple, np.ndarray]:
        """key tuple -> int8 grid: 0 measured, 1 + index in CELL_LABELS otherwise. Do not mutate."""
        return self._labels


@dataclass(frozen=True, eq=False)
class ProfileSet:
    """Everything measured for one (GPU, backend): hardware facts and kernel tables."""

    gpu: str
    backend: str
    root: Path
    system: SystemSpec
    tables: Mapping[str, GridTable]  # read on first use (`_Tables`)
    #: scratch space for derived arrays (prepared grids, fitted efficiencies)
    cache: dict = field(default_factory=dict, repr=False)

    def table(self, kind: str) -> GridTable | None:
        return self.tables.get(kind)

    def with_system(self, updates: dict) -> ProfileSet:
        """This set costed on different hardware facts (a GPU description's), same tables.

        Returns `self` when nothing changes, so lookups keep their warm cache;
        the variant is memoised on `self`.
        """
        current = self.system.model_dump()
        if all(current.get(k) == v for k, v in updates.items()):
            return self
        ck = ("with_system", tuple(sorted((k, repr(v)) for k, v in updates.items())))
        got = self.cache.get(ck)
        if got is None:
            system = SystemSpec.model_validate({**current, **updates})
            got = ProfileSet(self.gpu, self.backend, self.root, system, self.tables)
            self.cache[ck] = got
        return got


def _load_json(path: Path) -> dict:
    from opweave_planner.atomic import read_input

    try:  # a FIFO, folder or device is refused with its reason, never opened
        data = orjson.loads(read_input(path))
    except orjson.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object at the top level")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise UserError(
            f"{path}: format_version {version!r} is not supported, expected {FORMAT_VERSION}"
        )
    return data


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "file"
    return f"{where}: {err['msg']}"


def read_table(path: Path) -> GridTable:
    """Read and validate one kernel table; malformed files raise a one-line UserError."""
    path = Path(path)
    data = _load_json(path)
    try:
        return GridTable.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"{path}: {_first_error(exc)}") from None


def read_system(path: Path) -> SystemSpec:
    """Read and validate one system.json."""
    path = Path(path)
    data = _load_json(path)
    try:
        spec = SystemSpec.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"{path}: {_first_error(exc)}") from None
    if "bfloat16" not in spec.peak_tflops:
        raise UserError(f"{path}: peak_tflops needs a 'bfloat16' entry")
    return spec


def _finite_or_none(x: float) -> float | None:
    return None if not math.isfinite(x) else x


def write_json(path: Path, payload: dict) -> None:
    """Write a profile file compactly (one line, no NaN: missing cells become null)."""
    from opweave_planner.atomic import write_atomic

    write_atomic(path, orjson.dumps(payload, option=orjson.OPT_SORT_KEYS) + b"\n")


def grid_to_lists(grid: np.ndarray, digits: int = 4) -> list:
    """Nested lists with values rounded to `digits` significant digits, nan -> None."""
    flat = [
        _finite_or_none(float(f"{v:.{digits}g}")) if math.isfinite(v) else None
        for v in grid.ravel().tolist()
    ]
    arr = np.array(flat, dtype=object).reshape(grid.shape)
    return arr.tolist()


def table_payload(
    kind: str,
    gpu: str,
    backend: str,
    points: dict[tuple, float],
    *,
    backend_version: str = "",
    device: str = "",
    source: str = "",
    notes: str = "",
    floor: Callable[[tuple, list[np.ndarray]], np.ndarray] | None = None,
) -> dict:
    """Build a GridTable JSON payload from ``{(*key, *coords): latency_us}``.

    Axes are the sorted distinct coordinates; every grid gets the robust
    monotone fit (`monotone.robust_monotone`), then, when `floor(key, coords)`
    is given (the speed-of-light time in µs), is raised to it; values are
    rounded to 4 significant digits. Cells moved by more than
    `monotone.KEEP_TOL` are labelled "smoothed", cells raised to the floor
    "floored"; the counts are recorded in ``notes``.
    """
    key_fields, axis_names = KIND_SCHEMA[kind]
    nk = len(key_fields)
    axes = [sorted({p[nk + i] for p in points}) for i in range(len(axis_names))]
    index = [{v: j for j, v in enumerate(a)} for a in axes]
    grids: dict[tuple, np.ndarray] = {}
    for p, lat in points.items():
        grid = grids.setdefault(p[:nk], np.full([len(a) for a in axes], np.nan))
        grid[tuple(index[i][c] for i, c in enumerate(p[nk:]))] = lat
    ax_arr = tuple(np.asarray(a, dtype=np.float64) for a in axes)
    mesh = np.meshgrid(*ax_arr, indexing="ij")
    groups = []
    n_smooth = n_floor = 0
    for k in sorted(grids, key=lambda k: tuple(str(x).zfill(12) for x in k)):
        raw = grids[k]
        fit = robust_monotone(raw, ax_arr)
        smoothed = np.isfinite(raw) & (np.abs(fit - raw) > KEEP_TOL * raw)
        floored = np.zeros(raw.shape, dtype=bool)
        if floor is not None:
            sol = np.asarray(floor(k, mesh), dtype=np.float64)
            floored = np.isfinite(fit) & (fit < sol)
            fit = np.where(floored, sol, fit)
        labels = {}
        if smoothed.any():
            labels["smoothed"] = np.flatnonzero(smoothed & ~floored).tolist()
        if floored.any():
            labels["floored"] = np.flatnonzero(floored).tolist()
        labels = {name: idx for name, idx in labels.items() if idx}
        n_smooth += len(labels.get("smoothed", []))
        n_floor += len(labels.get("floored", []))
        group = {"key": list(k), "latency_us": grid_to_lists(fit)}
        if labels:
            group["labels"] = labels
        groups.append(group)
    cells = sum(int(np.isfinite(g).sum()) for g in grids.values())
    note = (f"{cells} measured cells; robust monotone fit moved {n_smooth} by more than "
            f"{KEEP_TOL:.0%} (smoothed); {n_floor} raised to speed of light (floored)")
    return {
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "gpu": gpu,
        "backend": backend,
        "backend_version": backend_version,
        "device": device,
        "source": source,
        "notes": f"{notes}; {note}" if notes else note,
        "key_fields": list(key_fields),
        "axes": dict(zip(axis_names, axes, strict=True)),
        "groups": groups,
    }


def available_gpus(profiles_dir: Path) -> list[str]:
    """GPU ids with a system.json under `profiles_dir`, sorted."""
    root = Path(profiles_dir)
    return sorted(p.parent.name for p in root.glob("*/system.json"))


def load_profile_set(profiles_dir: Path, gpu: str, backend: str = "vllm") -> ProfileSet:
    """Load (and cache) the profile set for `gpu` under `backend`.

    Kernel families that have no file are simply absent; lookups then fall back
    to the calibrated roofline (see `interp`). Each table is read on first use. Raises UserError when the GPU or
    the backend folder does not exist.
    """
    return _load_cached(Path(os.path.realpath(profiles_dir)), gpu, backend)


@lru_cache(maxsize=64)
def _load_cached(root: Path, gpu: str, backend: str) -> ProfileSet:
    gpu_dir = root / gpu
    if not os.path.lexists(gpu_dir / "system.json"):  # anything there is read (and refused) below
        known = ", ".join(available_gpus(root)) or "none"
        raise UserError(f"{gpu_dir / 'system.json'}: no profile for GPU '{gpu}' (have: {known})")
    system = read_system(gpu_dir / "system.json")
    backend_dir = gpu_dir / backend
    if not backend_dir.is_dir():
        have = sorted(p.name for p in gpu_dir.iterdir() if p.is_dir()) or ["none"]
        raise UserError(f"{backend_dir}: no '{backend}' tables for {gpu} (have: {', '.join(have)})")
    present = {kind: backend_dir / f"{kind}.json" for kind in KIND_SCHEMA}
    tables = _Tables({kind: path for kind, path in present.items() if os.path.lexists(path)})
    return ProfileSet(gpu=gpu, backend=backend, root=root, system=system, tables=tables)


class _Tables(Mapping):
    """A profile set's kernel tables by kind, each read and validated when first asked for: a
    plan reads three or four families of its GPUs and, for a donor GPU, one (a shape its own
    table lacks), never the prefill side's; reading all eight of every profiled GPU was most of
    a small plan's table time. A kind is present when its file is (read or refused on use)."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self._paths = paths
        self._read: dict[str, GridTable] = {}

    def __getitem__(self, kind: str) -> GridTable:
        table = self._read.get(kind)
        if table is None:
            path = self._paths[kind]
            table = read_table(path)
            if table.kind != kind:
                raise UserError(f"{path}: kind is '{table.kind}', expected '{kind}'")
            self._read[kind] = table
        return table

    def get(self, kind: str, default=None):
        return self[kind] if kind in self._paths else default

    def __contains__(self, kind: object) -> bool:
        return kind in self._paths

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)
