"""The Problem the search kernels read: a tree of small named tuples of plain arrays.

Parts: `Stages` (one template's stages and the configurations each owner may take), `Configs`
(per device-group configuration: latency, weight and KV prefix sums, price, memory), `Fabric`
(GPU types, node sizes, links), `Grid` (batches and microbatch sizes), `Limits` (SLO, budgets,
objective) and `Traffic` (the KV reserve, and a workload's context knots and scenarios). A
kernel takes the parts it reads, so the inner loops see small tuples.

Each field has one name across the parts, so Python builds, reads and replaces a Problem by
field name (`Problem(stage_owner=..., ...)`, `p.cfg_tp`, `p._replace(slo=...)`) or by part
(`Problem(stages=..., configs=...)`); kernels read the parts (`p.fabric.cfg_tp`).

Numba does not bounds-check, so every size rule is written on its field (`array(np.float64,
"C M N1")`) and `check_problem` asserts them all, once, in Python; `typed` fixes every dtype so
that numba compiles one specialisation. Time unit: microseconds; cost rate: USD per GPU-hour per
resident request. Imports no numba: the compile room builds Problems without it.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Annotated, NamedTuple

import numpy as np

PRUNE_EPS = 1e-12  # pruning / SLO margin: a candidate that could tie is never pruned


@dataclass(frozen=True)
class Shape:
    """An array field's dtype and dimensions: S stages, k owners, C configurations, M microbatch
    sizes, N1 operators + 1, G context knots, B+ at least the largest batch + 1, * any."""

    dtype: type
    dims: tuple[str, ...]


def array(dtype: type, dims: str):
    return Annotated[np.ndarray, Shape(dtype, tuple(dims.split()))]


class Stages(NamedTuple):
    """One template's stages over the request's configurations."""

    stage_owner: array(np.int64, "S")
    stage_start: array(np.int64, "S")  # first operator of the cyclic range [start, end)
    stage_end: array(np.int64, "S")
    payload: array(np.float64, "S")  # bytes per request sent after stage j
    cfg_ok: array(np.bool_, "k C")  # configs an owner may take
    k: int  # owners
    # per owner and config, the reserved units of n resident requests: Traffic.units where the owner's
    # KV is full attention only, else its own mix of window and full layers' (None: Traffic.units)
    kv_units: array(np.float64, "k C B+") = None


class Configs(NamedTuple):
    """Per configuration: what its operators cost and hold, and what it offers."""

    pref: array(np.float64, "C M N1")  # latency prefix sums per microbatch size
    mpref: array(np.float64, "C M N1")  # prefix sums of the measured part of the latency
    wpref: array(np.float64, "C N1")  # weight bytes per GPU
    kvpref: array(np.float64, "C N1")  # KV bytes per GPU per reserved unit (Stages.kv_units)
    cfg_price: array(np.float64, "C")  # USD per GPU-hour
    cfg_mem: array(np.float64, "C")  # usable bytes per GPU
    cfg_ws: array(np.float64, "C")  # workspace bytes per request per GPU
    cfg_stage_fixed: array(np.float64, "C")  # µs each stage costs per microbatch (dispatch)
    # KV/state bytes per GPU per request, not growing with the context (None: zeros)
    kvcpref: array(np.float64, "C N1") = None


class Fabric(NamedTuple):
    """GPU types, node sizes and links: what the link, GPU-count and node rules read."""

    cfg_tp: array(np.int64, "C")
    cfg_gpu: array(np.int64, "C")  # GPU type index
    cfg_node: array(np.int64, "C")  # GPUs per node
    cfg_intra_bw: array(np.float64, "C")  # intra-node bytes per µs
    cfg_transfer_fixed: array(np.float64, "C")  # µs of one NCCL send/recv call on the config's GPU
    bw: float  # inter-node bytes per µs
    lat: float  # inter-node latency, µs
    intra_lat: float  # intra-node latency, µs


class Grid(NamedTuple):
    """The global batches searched and the microbatch sizes b = B / (mu n) they produce."""

    mb_grid: array(np.int64, "M")  # microbatch size of each grid index
    mb_index: array(np.int64, "B+")  # grid index of a microbatch size, or -1
    batches: array(np.int64, "*")
    max_mu: int
    max_rep: int


class Limits(NamedTuple):
    slo: float  # µs
    max_gpus: float
    max_nodes: float  # nodes a plan may occupy (inf: no limit)
    latency_objective: bool  # minimise T_rtt instead of cost (owner rates sum to one)
    prune_factor: float  # (1 + slack)(1 + 1e-12): prune what exceeds the incumbent by more


class Traffic(NamedTuple):
    """Memory of n resident requests is units[n] x kvpref + n x kvcpref: a fixed context has
    units[n] = n and kvpref a request's whole KV; a workload reserves units[n] context tokens (a
    quantile of their sum, at least one request at the longest context) where an owner's KV is
    full attention only, and its own row of Stages.kv_units where it has window layers (kvpref:
    bytes per token below the window; the row counts a window layer at min(context, window)). A
    workload also has
    stage latencies at context knots and the scenarios' per-slot context prefix sums (all empty
    for a fixed context). None: a fixed context's value, filled by `typed`."""

    units: array(np.float64, "B+") = None
    knots: array(np.float64, "G") = None  # context knots (G = 0: a fixed context)
    kpref: array(np.float64, "C M G N1") = None  # latency prefix sums at each knot
    scen_cs: array(np.float64, "* B+") = None  # cumulative context over slots, per scenario
    # configs a and b differ by the same latency at every knot (dominance at one context is
    # dominance at all): True for a fixed context
    knot_free: array(np.bool_, "C C") = None
    pct: float = 0.0  # SLO percentile as a fraction (0.95)
    theta: float = 0.0  # stationary mean context (what the plan's stage figures are shown at)


PARTS = {"stages": Stages, "configs": Configs, "fabric": Fabric, "grid": Grid, "limits": Limits,
         "traffic": Traffic}


def _spec(hint) -> tuple[type, tuple[str, ...] | None]:
    """(dtype, dims) of an array field, (type, None) of a scalar one."""
    if typing.get_origin(hint) is Annotated:
        shape = typing.get_args(hint)[1]
        return shape.dtype, shape.dims
    return hint, None


#: per part, (field, dtype or type, dims or None) of each of its fields, in order
SPECS = {part: tuple((f, *_spec(h)) for f, h in typing.get_type_hints(part, include_extras=True).items())
         for part in PARTS.values()}
#: per part, (index, field, dims) of each of its array fields
ARRAYS = {part: tuple((i, f, dims) for i, (f, _kind, dims) in enumerate(spec) if dims is not None)
          for part, spec in SPECS.items()}
#: field name -> index of its part
PART_OF = {f: i for i, part in enumerate(PARTS.values()) for f in part._fields}


def _parts(given: dict, current=None) -> list:
    """The parts of a Problem from part and field keywords (consumed from `given`)."""
    out = []
    for i, (name, part) in enumerate(PARTS.items()):
        whole = given.pop(name, None if current is None else current[i])
        fields = {f: given.pop(f) for f in part._fields if f in given} if given else {}
        out.append(part(**fields) if whole is None else whole._replace(**fields) if fields else whole)
    if given:
        raise TypeError(f"a Problem has no field {sorted(given)[0]!r}")
    return out


class _Tree(NamedTuple):
    stages: Stages
    configs: Configs
    fabric: Fabric
    grid: Grid
    limits: Limits
    traffic: Traffic


class Problem(_Tree):
    """One template's search problem (see the module docstring); built by keyword only."""

    __slots__ = ()

    def __new__(cls, **given):
        if given.keys() == PARTS.keys() and None not in given.values():  # every part whole (per template)
            return tuple.__new__(cls, (given["stages"], given["configs"], given["fabric"], given["grid"],
                                       given["limits"], given["traffic"]))
        return tuple.__new__(cls, _parts(given))

    def _replace(self, **given) -> Problem:
        return tuple.__new__(type(self), _parts(given, self))

    def __getattr__(self, name: str):
        at = PART_OF.get(name)
        if at is None:
            raise AttributeError(name)
        return getattr(tuple.__getitem__(self, at), name)


def _fixed_context(p: Problem) -> dict:
    """The values of the fields a fixed context leaves None."""
    c_n, m_n, n1 = p.configs.pref.shape
    top = int(np.max(p.grid.batches))
    workload = p.traffic.knots is not None and len(p.traffic.knots) > 0
    units = np.arange(top + 1, dtype=np.float64) if p.traffic.units is None else np.asarray(p.traffic.units)
    return {"kvcpref": lambda: np.zeros_like(p.configs.kvpref), "units": lambda: units,
            "kv_units": lambda: np.broadcast_to(units, (p.stages.k, c_n, units.size)),
            "knots": lambda: np.zeros(0), "kpref": lambda: np.zeros((c_n, m_n, 0, n1)),
            "scen_cs": lambda: np.zeros((0, top + 1)), "knot_free": lambda: np.full((c_n, c_n), not workload, np.bool_)}


def typed_part(part):
    """`part` with every field at its annotated dtype, arrays C-contiguous and writable: numba
    types a read-only array apart, so a read-only field (a workload's cached KV reserve row)
    made every kernel taking the part compile again for it."""
    return part._make(_typed(v, kind) if dims is not None else kind(v)
                      for (_f, kind, dims), v in zip(SPECS[type(part)], part, strict=True))


def _typed(v, kind):
    """`np.require(v, kind, ("C", "W"))`: `v` itself where it already is such an array (what
    np.require returns then, without its 3 µs of flag parsing: a template's Stages has seven)."""
    if type(v) is np.ndarray and v.dtype == kind and v.flags.c_contiguous and v.flags.writeable:
        return v
    return np.require(v, kind, ("C", "W"))


def typed(p: Problem) -> Problem:
    """Every field at its annotated dtype (numba then compiles one specialisation, and its cache
    hits); the fields a fixed context leaves None get their values."""
    if p.configs.kvcpref is None or any(v is None for v in p.traffic) or p.stages.kv_units is None:
        missing = {name: make() for name, make in _fixed_context(p).items() if getattr(p, name) is None}
        p = p._replace(**missing)
    return p._make(typed_part(part) for part in p)


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(f"inconsistent search problem: {what}")


def _check_shapes(part, size: dict) -> None:
    """Every array field's shape against its dims (the message is formatted on a failure only:
    a template's Stages is checked on its first Problem, thousands a plan)."""
    for at, name, dims in ARRAYS[type(part)]:
        value = part[at]
        shape = value.shape
        if len(shape) != len(dims):
            _check(False, f"{name} has {value.ndim} dimensions, not {len(dims)} ({' '.join(dims)})")
        for axis, (dim, n) in enumerate(zip(dims, shape, strict=True)):
            if dim == "B+":
                if n < size[dim]:
                    _check(False, f"{name} does not cover every batch (axis {axis}: {n} < {size[dim]})")
            elif dim != "*" and n != size[dim]:
                _check(False, f"{name} axis {axis} is {n}, not {dim} = {size[dim]}")


def check_problem(p: Problem, parts: tuple[str, ...] = tuple(PARTS)) -> Problem:
    """Assert every size rule the kernels rely on (they do not bounds-check), of the named parts
    (the compile room checks the parts its templates share once, the rest per template)."""
    if not parts:
        return p
    st, grid = p.stages, p.grid
    c_n, m_n, n1 = p.configs.pref.shape
    size = {"S": st.stage_owner.shape[0], "k": st.k, "C": c_n, "M": m_n, "N1": n1, "G": p.traffic.knots.shape[0],
            "B+": int(grid.batches.max()) + 1 if grid.batches.size else 0}
    for name in parts:
        _check_shapes(getattr(p, name), size)
    if "stages" in parts:  # as lists: a numpy reduction costs more than the whole list of a template
        owner, start, end = st.stage_owner.tolist(), st.stage_start.tolist(), st.stage_end.tolist()
        _check(size["S"] >= 1 and st.k >= 1, "no stage or no owner")
        _check(min(owner) == 0 and max(owner) == st.k - 1, "owners are not 0..k-1")
        _check(min(start) >= 0 and max(start) < n1 and min(end) >= 0 and max(end) < n1,
               "stage ranges outside the operator sequence")
    if "grid" in parts:
        mb = grid.mb_grid
        _check(grid.batches.size >= 1 and int(grid.batches.min()) >= 1, "empty or non-positive batch grid")
        _check(not mb.size or (int(mb.min()) >= 0 and int(mb.max()) < grid.mb_index.shape[0] and bool(
            (grid.mb_index[mb] == np.arange(mb.size)).all())), "mb_index and mb_grid disagree")
        _check(grid.max_mu >= 1 and grid.max_rep >= 1, "max_mu / max_rep below 1")
    if "traffic" in parts and size["G"]:
        tr = p.traffic
        _check(size["G"] >= 2 and bool((np.diff(tr.knots) > 0).all()), "knots not increasing")
        _check(tr.scen_cs.shape[0] >= 1, "a workload without scenarios")
        _check(0.0 < tr.pct <= 1.0, "percentile outside (0, 1]")
    return p


def objective_flags(p: Problem) -> tuple[bool | None, bool | None]:
    """(fixed, workload): which objective a Problem's kernels compile, as two flags of which
    exactly one is None. Numba drops a branch `if flag is not None` at compile time only when
    the flag is None (a True flag is a run-time value), so each objective sits under its own
    flag and a run compiles the kernels of its own objective only, not both."""
    return (None, True) if p.traffic.knots.shape[0] else (True, None)


def order_index(n, pct):
    """k of the percentile's order statistic x_(k) of n samples: k = ceil(n pct), numpy's
    'inverted_cdf' (never an interpolation, so a pointwise lower bound stays one). Plain Python
    for the compile room; the kernels call it through `jit.shared` (search/evaluate.py)."""
    k = math.ceil(n * pct - 1e-9)
    return min(max(k, 1), n)


# The rules below are plain Python so the compile room (its batch caps, compile/space.py) applies
# the same physics as the kernels, which call them through `jit.shared` (search/evaluate.py).

def memory_need(units, weights, kv_per_unit, kv_per_request, workspace_per_request, mu, bh):
    """Bytes per GPU of a replica holding mu x bh resident requests (units: the owner's row of
    Stages.kv_units; the batch caps pass the whole-model replica's row, KvReserve.row)."""
    n = mu * bh
    return weights + units[n] * kv_per_unit + n * kv_per_request + bh * workspace_per_request


def range_sum(pref, start, end):
    """Sum over the cyclic operator range [start, end) from a prefix-sum row."""
    if end > start:
        return pref[end] - pref[start]
    return pref[pref.shape[0] - 1] - pref[start] + pref[end]


def stage_time(pref_row, start, end, fixed):
    """A stage's compute time per microbatch: its operators' latencies plus the fixed
    dispatch cost every stage pays however small (a graph launch after its input arrives)."""
    return range_sum(pref_row, start, end) + fixed
