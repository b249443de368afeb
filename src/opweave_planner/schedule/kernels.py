"""Numba kernels of the schedule simulator: steady-state round-trip time of a decode plan.

The model and the static action order are documented in ``docs/simulator.md`` and in
``reference.py`` (the plain-Python twin these kernels are tested against).  In short:

* stage ``j`` runs on owner ``owner[j]`` for ``t[j]``; the boundary after stage ``j`` goes to
  stage ``(j + 1) % S``; it is a local hand-off (zero time) when both stages share an owner,
  otherwise a transfer that holds the sender's egress and the receiver's ingress endpoint
  for ``occ[j]`` and delivers ``lat[j]`` later;
* every resource runs its actions in the global order (iteration, stage j, microbatch k);
* an iteration is the max-plus map ``x(r) = F(x(r - 1))`` on the small state
  ``x = [compute free times (K) | egress free (K) | ingress free (K) | microbatch ready (mu)]``.

``F`` is max-plus linear and its matrix is irreducible over the state components that are
used, so ``x(r + c) = x(r) + c * T_rtt`` for every large ``r`` (max-plus cyclicity).  The
hot path iterates ``F`` on the state, renormalised each iteration so that microbatch 0's
ready time is 0, and stops when the normalised state repeats (to 1e-12 of the per-iteration
work) with some period ``c <= HISTORY - 1``; ``T_rtt`` is then the exact shift per cycle
divided by ``c``.  If that does not happen within ``MAX_ITERATIONS`` (near-ties between
cycle means make the transient long) the kernel falls back to the maximum cycle mean of the
one-iteration max-plus matrix (Karp), which is the same number by the cyclicity theorem.

All kernels take plain numpy arrays: ``owner`` int64[S] (0..n_owners-1), ``t``, ``occ``,
``lat`` float64[S] (any one unit, non-negative), ``mu >= 1``.  They do not validate their
inputs (``reference.check_inputs`` does).
"""

from __future__ import annotations

import numpy as np
from numba.extending import overload

from opweave_planner.jit import entry, kernel

#: Iterations of the periodicity search before falling back to the cycle-mean computation.
MAX_ITERATIONS = 64
#: Normalised states kept for the periodicity check; periods up to HISTORY - 1 are found.
HISTORY = 24
#: Relative tolerance (against the per-iteration work) for "the state repeated".
REPEAT_RTOL = 1e-12
#: A resource whose busy fraction is at least 1 - SATURATED_TOL counts as saturated.
SATURATED_TOL = 1e-9

CRIT_COMPUTE = 0
CRIT_EGRESS = 1
CRIT_INGRESS = 2
CRIT_LOOP = 3


def at(t, j, k):
    """Compute time of stage j for microbatch k: ``t[j]`` (one time per stage) or ``t[j, k]``
    (per stage and microbatch: microbatches of different contexts)."""
    return t[j] if t.ndim == 1 else t[j, k]


def stage_work(t, j, mu):
    """Compute time of stage j summed over the mu microbatches of one iteration."""
    return mu * t[j] if t.ndim == 1 else float(sum(t[j, k] for k in range(mu)))


@overload(at)
def _at(t, j, k):  # one source; numba compiles the 1-D case with t[j] hoisted out of the k loop
    if t.ndim == 1:
        return lambda t, j, k: t[j]
    return lambda t, j, k: t[j, k]


@overload(stage_work)
def _stage_work(t, j, mu):
    if t.ndim == 1:
        return lambda t, j, mu: mu * t[j]

    def per_microbatch(t, j, mu):
        w = 0.0
        for k in range(mu):
            w += t[j, k]
        return w

    return per_microbatch


@kernel
def scratch_sizes(n_stages, mu, n_owners):
    """Lengths (float64, int64) of the scratch buffers ``simulate_rtt_scratch`` needs."""
    n_state = 3 * n_owners + mu
    return n_state * (HISTORY + 1) + HISTORY, n_state


@entry
def make_scratch(n_stages, mu, n_owners):
    """Allocate the scratch buffers for one (shape, mu, n_owners); reuse them across calls."""
    nf, ni = scratch_sizes(n_stages, mu, n_owners)
    return np.empty(nf, np.float64), np.empty(ni, np.int64)


@kernel
def _used_components(owner, mu, n_owners, idx):
    """Write the indices of the state components that the schedule reads into ``idx``.

    Unused components (an owner with no stage, an endpoint with no transfer) never influence
    anything and are left out of the periodicity check.  Returns how many were written.
    """
    S = owner.shape[0]
    K = n_owners
    n_state = 3 * K + mu
    for i in range(n_state):
        idx[i] = 0
    for j in range(S):
        o = owner[j]
        o2 = owner[j + 1] if j + 1 < S else owner[0]
        idx[o] = 1
        if o != o2:
            idx[K + o] = 1
            idx[2 * K + o2] = 1
    for k in range(mu):
        idx[3 * K + k] = 1
    n = 0
    for i in range(n_state):
        if idx[i] != 0:
            idx[n] = i
            n += 1
    return n


@entry
def _one_iteration(owner, t, occ, lat, mu, n_owners, x):
    """Apply F in place: run every action of one iteration in the global (j, k) order.

    ``x`` = [compute free (K) | egress free (K) | ingress free (K) | ready (mu)], where
    ``ready[k]`` is when microbatch k's input to stage 0 of the next iteration is available.
    ``t`` is ``[S]`` or ``[S, >= mu]`` (see ``at``).
    """
    S = owner.shape[0]
    K = n_owners
    r0 = 3 * K
    for j in range(S):
        o = owner[j]
        o2 = owner[j + 1] if j + 1 < S else owner[0]
        cf = x[o]  # compute stream of the owner; kept in a register over the k loop
        if o == o2:
            for k in range(mu):
                cf = max(cf, x[r0 + k]) + at(t, j, k)
                x[r0 + k] = cf
        else:
            ef = max(x[K + o], x[2 * K + o2])  # both endpoints are held together
            oc = occ[j]
            lt = lat[j]
            for k in range(mu):
                cf = max(cf, x[r0 + k]) + at(t, j, k)
                ef = max(ef, cf) + oc
                x[r0 + k] = ef + lt
            x[K + o] = ef
            x[2 * K + o2] = ef
        x[o] = cf


@kernel
def _work_scale(owner, t, occ, lat, mu):
    """Total work of one iteration, mu * (sum t + sum occ) + sum lat (transfers only)."""
    S = owner.shape[0]
    w = 0.0
    for j in range(S):
        w += stage_work(t, j, mu)
        o2 = owner[j + 1] if j + 1 < S else owner[0]
        if owner[j] != o2:
            w += mu * occ[j] + lat[j]
    return w


@kernel
def _periodic_search(owner, t, occ, lat, mu, n_owners, fbuf, ibuf, max_iterations):
    """Iterate F until the normalised state repeats.

    Returns (t_rtt, iterations, period); period 0 means no repeat within ``max_iterations``
    (t_rtt is then NaN).  ``fbuf``/``ibuf`` come from ``make_scratch``.
    """
    K = n_owners
    n_state = 3 * K + mu
    r0 = 3 * K
    n_used = _used_components(owner, mu, n_owners, ibuf)
    x = fbuf[:n_state]
    # the ring of past states: row h at hist[h * n_state :], not a reshape, whose shape check
    # compiles numba's exception formatting (repr, string concatenation) into every caller
    hist = fbuf[n_state : n_state * (HISTORY + 1)]
    shift = fbuf[n_state * (HISTORY + 1) : n_state * (HISTORY + 1) + HISTORY]
    tol = REPEAT_RTOL * _work_scale(owner, t, occ, lat, mu)
    for i in range(n_state):
        x[i] = 0.0
        hist[i] = 0.0
    shift[0] = 0.0
    for r in range(1, max_iterations + 1):
        _one_iteration(owner, t, occ, lat, mu, n_owners, x)
        off = x[r0]
        for u in range(n_used):
            x[ibuf[u]] -= off
        slot = r % HISTORY
        # Compare with the states of iterations r - 1, r - 2, ... still in the ring.
        cmax = min(HISTORY - 1, r)
        for c in range(1, cmax + 1):
            prev = (r - c) % HISTORY
            same = True
            for u in range(n_used):
                i = ibuf[u]
                d = x[i] - hist[prev * n_state + i]
                if d > tol or d < -tol:
                    same = False
                    break
            if same:
                total = off
                for b in range(1, c):
                    total += shift[(r - b) % HISTORY]
                return total / c, r, c
        for u in range(n_used):
            i = ibuf[u]
            hist[slot * n_state + i] = x[i]
        shift[slot] = off
    return np.nan, max_iterations, 0


@entry
def transition_matrix(owner, t, occ, lat, mu, n_owners):
    """One-iteration max-plus matrix over the used state components.

    Returns (A, idx): ``A[a, b]`` is the longest path weight from component ``idx[b]`` at
    iteration r - 1 to component ``idx[a]`` at iteration r (``-inf`` if none), i.e.
    ``x(r) = A (x) x(r - 1)``.  F is max-plus linear, so column b is F applied to the max-plus
    unit vector of component ``idx[b]``: the simulator's own iteration, nothing to keep in step.
    """
    n_state = 3 * n_owners + mu
    idx_all = np.empty(n_state, np.int64)
    n = _used_components(owner, mu, n_owners, idx_all)
    idx = idx_all[:n].copy()
    A = np.empty((n, n))
    x = np.empty(n_state)
    for b in range(n):
        for i in range(n_state):
            x[i] = -np.inf
        x[idx[b]] = 0.0
        _one_iteration(owner, t, occ, lat, mu, n_owners, x)
        for a in range(n):
            A[a, b] = x[idx[a]]
    return A, idx


@kernel
def max_cycle_mean(A):
    """Maximum cycle mean of the graph with edge b -> a of weight A[a, b] (Karp, all sources).

    Returns -inf for an acyclic graph.
    """
    n = A.shape[0]
    D = np.empty((n + 1, n))  # not np.full: its generic n-d fill is much more code to compile
    for v in range(n):
        D[0, v] = 0.0
    for k in range(1, n + 1):
        for a in range(n):
            best = -np.inf
            for b in range(n):
                w = A[a, b]
                if w > -np.inf and D[k - 1, b] > -np.inf:
                    cand = D[k - 1, b] + w
                    best = max(best, cand)
            D[k, a] = best
    lam = -np.inf
    for v in range(n):
        if D[n, v] == -np.inf:
            continue
        worst = np.inf
        for k in range(n):
            if D[k, v] > -np.inf:
                m = (D[n, v] - D[k, v]) / (n - k)
                worst = min(worst, m)
        lam = max(lam, worst)
    return lam


@entry
def rtt_by_cycle_mean(owner, t, occ, lat, mu, n_owners):
    """T_rtt as the maximum cycle mean of the one-iteration matrix (the fallback path)."""
    A, _ = transition_matrix(owner, t, occ, lat, mu, n_owners)
    return max_cycle_mean(A)


@entry
def simulate_rtt_info(owner, t, occ, lat, mu, n_owners, fbuf, ibuf, max_iterations):
    """T_rtt plus how it was found: (t_rtt, iterations, period, used_fallback)."""
    rtt, it, c = _periodic_search(owner, t, occ, lat, mu, n_owners, fbuf, ibuf, max_iterations)
    if c == 0:
        return rtt_by_cycle_mean(owner, t, occ, lat, mu, n_owners), it, 0, True
    return rtt, it, c, False


@entry(inline=True)
def simulate_rtt_scratch(owner, t, occ, lat, mu, n_owners, fbuf, ibuf):
    """``simulate_rtt`` with caller-owned scratch from ``make_scratch`` (no allocation)."""
    rtt, _, c = _periodic_search(owner, t, occ, lat, mu, n_owners, fbuf, ibuf, MAX_ITERATIONS)
    if c == 0:
        return rtt_by_cycle_mean(owner, t, occ, lat, mu, n_owners)
    return rtt


@kernel
def simulate_rtt_per_microbatch(owner, t2, occ, lat, mu, n_owners, fbuf, ibuf):
    """Steady-state period when stage j of microbatch k computes for ``t2[j, k]`` (``[S, >= mu]``):
    microbatches of different contexts. An iteration still runs every microbatch once, so the
    period is the time between consecutive tokens of each of them."""
    return simulate_rtt_scratch(owner, t2, occ, lat, mu, n_owners, fbuf, ibuf)


@entry
def simulate_rtt(owner, t, occ, lat, mu, n_owners):
    """Steady-state time between consecutive iterations of one microbatch (unit of inputs)."""
    fbuf, ibuf = make_scratch(owner.shape[0], mu, n_owners)
    return simulate_rtt_scratch(owner, t, occ, lat, mu, n_owners, fbuf, ibuf)


@entry
def simulate_many(owner, T, OCC, LAT, mu, n_owners):
    """``simulate_rtt`` for every row of T, OCC, LAT (float64[n, S]) with one shared owner."""
    n = T.shape[0]
    out = np.empty(n)
    fbuf, ibuf = make_scratch(owner.shape[0], mu, n_owners)
    for i in range(n):
        out[i] = simulate_rtt_scratch(owner, T[i], OCC[i], LAT[i], mu, n_owners, fbuf, ibuf)
    return out


@kernel
def busy_fractions(owner, t, occ, mu, n_owners, t_rtt):
    """Per-owner compute, egress and ingress busy fractions for a given T_rtt."""
    S = owner.shape[0]
    comp = np.zeros(n_owners)
    egr = np.zeros(n_owners)
    ing = np.zeros(n_owners)
    for j in range(S):
        o = owner[j]
        o2 = owner[j + 1] if j + 1 < S else owner[0]
        comp[o] += mu * t[j]
        if o != o2:
            egr[o] += mu * occ[j]
            ing[o2] += mu * occ[j]
    if t_rtt > 0.0:
        comp /= t_rtt
        egr /= t_rtt
        ing /= t_rtt
    else:
        comp[:] = 0.0
        egr[:] = 0.0
        ing[:] = 0.0
    return comp, egr, ing


@kernel
def critical_resource(comp, egr, ing):
    """(kind, index) of the busiest saturated resource, or (CRIT_LOOP, -1) if none is.

    Saturated: busy fraction >= 1 - SATURATED_TOL.  Fractions within SATURATED_TOL of the
    largest tie; ties go to compute before egress before ingress, then to the lower owner.
    """
    # three explicit passes, not a loop over the tuple (comp, egr, ing): numba compiles that
    # into a far larger function
    top = max(_largest(comp), _largest(egr), _largest(ing))
    if top < 1.0 - SATURATED_TOL:
        return CRIT_LOOP, -1
    cut = top - SATURATED_TOL
    o = _first_at_least(comp, cut)
    if o >= 0:
        return CRIT_COMPUTE, o
    o = _first_at_least(egr, cut)
    if o >= 0:
        return CRIT_EGRESS, o
    o = _first_at_least(ing, cut)
    if o >= 0:
        return CRIT_INGRESS, o
    return CRIT_LOOP, -1


@kernel
def _largest(arr):
    """The largest entry (-inf for none): a loop, not arr.max(), which compiles numba's generic reduction."""
    top = -np.inf
    for o in range(arr.shape[0]):
        top = max(top, arr[o])
    return top


@kernel
def _first_at_least(arr, cut):
    """Index of the first entry >= cut, -1 if none: the lowest owner wins a tie."""
    for o in range(arr.shape[0]):
        if arr[o] >= cut:
            return o
    return -1


@entry
def simulate_detail(owner, t, occ, lat, mu, n_owners):
    """(t_rtt, owner_busy, egress_busy, ingress_busy, critical_kind, critical_index).

    critical_kind: 0 compute stream, 1 egress endpoint, 2 ingress endpoint (index = owner),
    3 no saturated resource (the loop latency / dependency chain binds; index -1).
    """
    t_rtt = simulate_rtt(owner, t, occ, lat, mu, n_owners)
    comp, egr, ing = busy_fractions(owner, t, occ, mu, n_owners, t_rtt)
    kind, index = critical_resource(comp, egr, ing)
    return t_rtt, comp, egr, ing, kind, index
