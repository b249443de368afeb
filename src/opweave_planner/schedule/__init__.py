"""Schedule simulator: steady-state round-trip time of an operator-disaggregated decode plan.

``kernels`` holds the numba kernels the search calls; ``reference`` is the plain-Python twin
they are tested against, plus ``action_order`` (the static order a runtime follows).
See ``docs/simulator.md``.
"""

from opweave_planner.schedule.kernels import (
    CRIT_COMPUTE,
    CRIT_EGRESS,
    CRIT_INGRESS,
    CRIT_LOOP,
    make_scratch,
    rtt_by_cycle_mean,
    simulate_detail,
    simulate_many,
    simulate_rtt,
    simulate_rtt_info,
    simulate_rtt_scratch,
)
from opweave_planner.schedule.reference import SteadyStateNotReached, action_order

__all__ = [
    "CRIT_COMPUTE",
    "CRIT_EGRESS",
    "CRIT_INGRESS",
    "CRIT_LOOP",
    "SteadyStateNotReached",
    "action_order",
    "make_scratch",
    "rtt_by_cycle_mean",
    "simulate_detail",
    "simulate_many",
    "simulate_rtt",
    "simulate_rtt_info",
    "simulate_rtt_scratch",
]
