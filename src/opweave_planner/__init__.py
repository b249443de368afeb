"""opweave-planner: cheapest operator-level disaggregated decode plans under a TPOT SLO."""

__version__ = "0.1.0"
