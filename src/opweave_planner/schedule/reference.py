"""Plain-Python reference of the schedule simulator, written for clarity rather than speed.

Same model and semantics as ``kernels.py`` (which is tested against this file); see
``docs/simulator.md`` for the full description.

Model
-----
A decode iteration is the cyclic stage sequence j = 0..S-1.  Stage j computes on owner
``owner[j]`` for ``t[j]``.  Boundary j leads from stage j to stage (j + 1) mod S (boundary
S - 1 hands the token back to stage 0 of the next iteration).  If both stages have the same
owner the boundary is a local hand-off: no time, no endpoint.  Otherwise it is a transfer
that holds the sender's egress endpoint and the receiver's ingress endpoint together for
``occ[j]`` and delivers the data ``lat[j]`` after it ends.  ``mu`` microbatches circulate.
Each owner has one compute stream, one egress endpoint and one ingress endpoint.

Static action order
-------------------
Every resource runs its actions in the global order (iteration, stage j, microbatch k).
``action_order`` lists them per owner; the compute stream follows the "compute" entries,
the egress endpoint the "send" entries and the ingress endpoint the "recv" entries.  An
action starts as soon as its input is there and its resources have finished their previous
action:

* compute (j, k): input = arrival of boundary j - 1 for microbatch k (boundary S - 1 of the
  previous iteration for j = 0; all inputs of the first iteration are ready at 0);
* transfer (j, k): input = end of compute (j, k); resources = both endpoints.

This is the earliest-start schedule of a fixed order, a max-plus linear recurrence
``x(r) = F(x(r - 1))`` on the state x = (compute free times, egress free times, ingress free
times, per-microbatch ready times).  ``steady_state`` iterates it until the state repeats
shifted by a constant; ``rtt_by_cycle_mean`` computes the same number as the maximum cycle
mean of the one-iteration matrix (Karp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Normalised states kept for the periodicity check (periods up to this are detected).
HISTORY = 64
#: Iteration cap of ``steady_state``; reaching it raises ``SteadyStateNotReached`` (and
#: ``simulate_rtt`` falls back to ``rtt_by_cycle_mean``, like the kernel).
MAX_ITERATIONS = 64
#: Relative tolerance (against the per-iteration work) for "the state repeated".
REPEAT_RTOL = 1e-12
#: A resource whose busy fraction is at least 1 - SATURATED_TOL counts as saturated.
SATURATED_TOL = 1e-9

COMPUTE, SEND, RECV = "compute", "send", "recv"
CRITICAL_KINDS = ("compute", "egress", "ingress", "loop")


class SteadyStateNotReached(RuntimeError):
    """The schedule did not become periodic within the iteration cap."""


def check_inputs(owner, t, occ, lat, mu: int, n_owners: int) -> None:
    """Raise ValueError unless the arrays describe a valid plan for the simulator."""
    S = len(owner)
    if S < 1:
        raise ValueError("a plan needs at least one stage")
    if not (len(t) == len(occ) == len(lat) == S):
        raise ValueError(f"owner, t, occ, lat must all have length {S}")
    if not int(mu) >= 1:
        raise ValueError(f"mu must be >= 1, got {mu}")
    for j, o in enumerate(owner):
        if not 0 <= int(o) < n_owners:
            raise ValueError(f"owner[{j}] = {o} is not in 0..{n_owners - 1}")
    for name, arr in (("t", [v for row in t for v in _row(row)]), ("occ", occ), ("lat", lat)):
        for j, v in enumerate(arr):
            if not (math.isfinite(float(v)) and float(v) >= 0.0):
                raise ValueError(f"{name}[{j}] = {v} must be finite and >= 0")


def _row(v) -> list:
    """A stage's compute times: one number (every microbatch) or one per microbatch (exact
    numbers such as Fractions stay exact)."""
    return list(v) if hasattr(v, "__len__") else [v]


def compute_time(t, j: int, k: int) -> float:
    """Stage j's compute time for microbatch k: ``t[j]`` or, per microbatch, ``t[j][k]``."""
    row = _row(t[j])
    return row[k] if len(row) > 1 else row[0]


def receiver(owner, j: int) -> int:
    """Owner of the stage after boundary j."""
    return int(owner[(j + 1) % len(owner)])


def is_transfer(owner, j: int) -> bool:
    """True when boundary j crosses owners (a transfer), False for a local hand-off."""
    return int(owner[j]) != receiver(owner, j)


def action_order(owner, mu: int, n_owners: int) -> list[list[tuple[str, int, int]]]:
    """Per owner, its actions of one iteration in the static order.

    Each entry is (kind, stage j, microbatch k) with kind "compute" (stage j on this owner),
    "send" (boundary j, this owner's egress) or "recv" (boundary j, this owner's ingress).
    Entries are sorted by (j, k), compute before send.  Every iteration repeats the list; a
    "recv" of boundary S - 1 feeds stage 0 of the next iteration.
    """
    S = len(owner)
    order: list[list[tuple[str, int, int]]] = [[] for _ in range(n_owners)]
    for j in range(S):
        src = int(owner[j])
        for k in range(mu):
            order[src].append((COMPUTE, j, k))
            if is_transfer(owner, j):
                order[src].append((SEND, j, k))
                order[receiver(owner, j)].append((RECV, j, k))
    return order


@dataclass
class State:
    """Times at the end of an iteration (the whole state of the recurrence)."""

    compute_free: list[float]
    egress_free: list[float]
    ingress_free: list[float]
    ready: list[float]  # when microbatch k's input to stage 0 of the next iteration arrives

    def as_list(self) -> list[float]:
        return self.compute_free + self.egress_free + self.ingress_free + self.ready

    @staticmethod
    def from_list(values: list[float], n_owners: int) -> State:
        K = n_owners
        return State(values[:K], values[K : 2 * K], values[2 * K : 3 * K], values[3 * K :])


def used_components(owner, mu: int, n_owners: int) -> list[int]:
    """Positions in ``State.as_list()`` that the schedule ever reads."""
    K = n_owners
    used = set(range(3 * K, 3 * K + mu))
    for j in range(len(owner)):
        used.add(int(owner[j]))
        if is_transfer(owner, j):
            used.add(K + int(owner[j]))
            used.add(2 * K + receiver(owner, j))
    return sorted(used)


def run_iteration(owner, t, occ, lat, mu: int, n_owners: int, state: State) -> State:
    """Run one iteration the way a runtime following ``action_order`` would.

    Each resource (compute stream, egress, ingress of every owner) has a queue of actions;
    an action runs when it heads all of its queues and its input exists.  Returns the state
    at the end of the iteration; ``state`` is not modified.  Works with -inf entries too
    (used by ``transition_matrix``).
    """
    S = len(owner)
    order = action_order(owner, mu, n_owners)
    queues = {}
    for o in range(n_owners):
        queues[("compute", o)] = [(j, k) for kind, j, k in order[o] if kind == COMPUTE]
        queues[("egress", o)] = [(j, k) for kind, j, k in order[o] if kind == SEND]
        queues[("ingress", o)] = [(j, k) for kind, j, k in order[o] if kind == RECV]
    free = {}
    for o in range(n_owners):
        free[("compute", o)] = state.compute_free[o]
        free[("egress", o)] = state.egress_free[o]
        free[("ingress", o)] = state.ingress_free[o]

    computed: dict[tuple[int, int], float] = {}  # (j, k) -> compute end
    arrived: dict[tuple[int, int], float] = {}  # (j, k) -> data of boundary j at stage j + 1

    def input_time(j: int, k: int) -> float | None:
        if j == 0:
            return state.ready[k]
        return arrived.get((j - 1, k))

    remaining = sum(len(q) for q in queues.values())
    while remaining:
        progressed = False
        for o in range(n_owners):
            cq = queues[("compute", o)]
            if cq:
                j, k = cq[0]
                inp = input_time(j, k)
                if inp is not None:
                    end = max(inp, free[("compute", o)]) + compute_time(t, j, k)
                    free[("compute", o)] = end
                    computed[(j, k)] = end
                    if not is_transfer(owner, j):
                        arrived[(j, k)] = end
                    cq.pop(0)
                    remaining -= 1
                    progressed = True
            eq = queues[("egress", o)]
            if eq:
                j, k = eq[0]
                dst = receiver(owner, j)
                iq = queues[("ingress", dst)]
                if iq and iq[0] == (j, k) and (j, k) in computed:
                    start = max(computed[(j, k)], free[("egress", o)], free[("ingress", dst)])
                    end = start + occ[j]
                    free[("egress", o)] = end
                    free[("ingress", dst)] = end
                    arrived[(j, k)] = end + lat[j]
                    eq.pop(0)
                    iq.pop(0)
                    remaining -= 2
                    progressed = True
        if not progressed:  # impossible for this order; kept as a loud guard
            raise RuntimeError("static action order deadlocked")
    return State(
        [free[("compute", o)] for o in range(n_owners)],
        [free[("egress", o)] for o in range(n_owners)],
        [free[("ingress", o)] for o in range(n_owners)],
        [arrived[(S - 1, k)] for k in range(mu)],
    )


def iteration_work(owner, t, occ, lat, mu: int) -> float:
    """mu * (sum t + sum occ) + sum lat over transfers: the scale of one iteration."""
    w = sum(compute_time(t, j, k) for j in range(len(owner)) for k in range(mu))
    for j in range(len(owner)):
        if is_transfer(owner, j):
            w += mu * float(occ[j]) + float(lat[j])
    return w


@dataclass(frozen=True)
class SteadyState:
    t_rtt: float
    iterations: int  # iterations simulated until the repeat was seen
    period: int  # c: the state repeats every c iterations, shifted by c * t_rtt


def steady_state(
    owner, t, occ, lat, mu: int, n_owners: int, max_iterations: int = MAX_ITERATIONS
) -> SteadyState:
    """Iterate from the all-zero state until the state repeats shifted by a constant.

    States are normalised so that microbatch 0's ready time is 0; the shifts removed are
    remembered.  When the normalised state equals (to REPEAT_RTOL of the iteration work) the
    one c iterations earlier, the schedule is periodic from there on with period c, and
    T_rtt is the total shift over those c iterations divided by c.
    """
    check_inputs(owner, t, occ, lat, mu, n_owners)
    used = used_components(owner, mu, n_owners)
    ref = 3 * n_owners  # microbatch 0's ready time
    tol = REPEAT_RTOL * iteration_work(owner, t, occ, lat, mu)
    state = State([0.0] * n_owners, [0.0] * n_owners, [0.0] * n_owners, [0.0] * mu)
    history = [[0.0] * len(used)]  # normalised used components, one entry per iteration
    shifts = [0.0]
    for r in range(1, max_iterations + 1):
        values = run_iteration(owner, t, occ, lat, mu, n_owners, state).as_list()
        shift = values[ref]
        values = [v - shift for v in values]
        now = [values[i] for i in used]
        for c in range(1, min(r, HISTORY) + 1):
            if all(abs(a - b) <= tol for a, b in zip(now, history[r - c])):
                total = shift + sum(shifts[r - c + 1 : r])
                return SteadyState(total / c, r, c)
        history.append(now)
        shifts.append(shift)
        state = State.from_list(values, n_owners)
    raise SteadyStateNotReached(
        f"no periodic state within {max_iterations} iterations (S={len(owner)}, mu={mu})"
    )


def simulate_rtt(owner, t, occ, lat, mu: int, n_owners: int) -> float:
    """Steady-state time between consecutive iterations of one microbatch.

    The periodicity search answers almost every plan within a few iterations; when two
    cycle means nearly tie the transient can last millions of iterations, and the same
    number is computed as the maximum cycle mean instead.
    """
    try:
        return steady_state(owner, t, occ, lat, mu, n_owners).t_rtt
    except SteadyStateNotReached:
        return rtt_by_cycle_mean(owner, t, occ, lat, mu, n_owners)


def transition_matrix(owner, t, occ, lat, mu: int, n_owners: int):
    """(A, used): x(r)[used[a]] = max_b A[a][b] + x(r-1)[used[b]], with -inf for no path.

    Column b is one iteration run from the max-plus unit vector of component used[b].
    """
    used = used_components(owner, mu, n_owners)
    n_state = 3 * n_owners + mu
    A = [[-math.inf] * len(used) for _ in used]
    for b, comp in enumerate(used):
        unit = [-math.inf] * n_state
        unit[comp] = 0  # an int zero keeps exact (Fraction) inputs exact
        out = run_iteration(owner, t, occ, lat, mu, n_owners, State.from_list(unit, n_owners))
        values = out.as_list()
        for a, row in enumerate(used):
            A[a][b] = values[row]
    return A, used


def max_cycle_mean(A) -> float:
    """Karp's maximum cycle mean of the graph with edge b -> a weighted A[a][b].

    Exact when the weights are Fractions (tests use that as an independent oracle).
    """
    n = len(A)
    D = [[0] * n] + [[-math.inf] * n for _ in range(n)]
    for k in range(1, n + 1):
        for a in range(n):
            D[k][a] = max(D[k - 1][b] + A[a][b] for b in range(n))
    best = -math.inf
    for v in range(n):
        if D[n][v] == -math.inf:
            continue
        means = [(D[n][v] - D[k][v]) / (n - k) for k in range(n) if D[k][v] > -math.inf]
        best = max(best, min(means))
    return best


def rtt_by_cycle_mean(owner, t, occ, lat, mu: int, n_owners: int) -> float:
    """T_rtt as the maximum cycle mean of the one-iteration max-plus matrix."""
    check_inputs(owner, t, occ, lat, mu, n_owners)
    A, _ = transition_matrix(owner, t, occ, lat, mu, n_owners)
    return max_cycle_mean(A)


def busy_fractions(owner, t, occ, mu: int, n_owners: int, t_rtt: float):
    """Per-owner (compute, egress, ingress) busy fractions: work per iteration / T_rtt."""
    compute = [0.0] * n_owners
    egress = [0.0] * n_owners
    ingress = [0.0] * n_owners
    for j in range(len(owner)):
        compute[int(owner[j])] += mu * float(t[j])
        if is_transfer(owner, j):
            egress[int(owner[j])] += mu * float(occ[j])
            ingress[receiver(owner, j)] += mu * float(occ[j])
    if t_rtt <= 0.0:
        return [0.0] * n_owners, [0.0] * n_owners, [0.0] * n_owners
    return (
        [c / t_rtt for c in compute],
        [e / t_rtt for e in egress],
        [i / t_rtt for i in ingress],
    )


def critical_resource(compute, egress, ingress) -> tuple[int, int]:
    """(kind, index) of the busiest saturated resource; (3, -1) when none is saturated.

    Kinds: 0 compute, 1 egress, 2 ingress, 3 loop (no resource saturated).  Busy fractions
    within SATURATED_TOL tie; ties go to the earlier kind, then the lower owner.
    """
    threshold = 1.0 - SATURATED_TOL
    saturated = [
        (f, kind, o)
        for kind, fracs in enumerate((compute, egress, ingress))
        for o, f in enumerate(fracs)
        if f >= threshold
    ]
    if not saturated:
        return 3, -1
    top = max(f for f, _, _ in saturated)
    kind, o = min((kind, o) for f, kind, o in saturated if f >= top - SATURATED_TOL)
    return kind, o


def simulate_detail(owner, t, occ, lat, mu: int, n_owners: int):
    """(t_rtt, owner_busy, egress_busy, ingress_busy, critical_kind, critical_index)."""
    t_rtt = simulate_rtt(owner, t, occ, lat, mu, n_owners)
    compute, egress, ingress = busy_fractions(owner, t, occ, mu, n_owners, t_rtt)
    kind, index = critical_resource(compute, egress, ingress)
    return t_rtt, compute, egress, ingress, kind, index
