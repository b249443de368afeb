"""Attention-FFN disaggregation (AFD): how many attention instances per FFN instance.

On the shared workload package (``opweave_planner.workload``: ``sampling`` holds the workloads
the simulator draws, ``law`` the per-slot stationary load). Modules: ``provisioning``
(mean-field and barrier-aware ratio rules), ``simulator`` (discrete-event bundle
simulation and barrier Monte Carlo), ``calibrate`` (latency coefficients from samples),
``request`` (the settings of ``afd ratio`` / ``afd simulate``, from which their CLI is generated).
Names are resolved lazily so importing one module does not compile the simulator; the
``calibrate`` function is reached through its module (the names would collide).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "LatencyCoefficients": "provisioning",
    "PAPER_SECTION_52": "provisioning",
    "kappa": "provisioning",
    "expected_excess": "provisioning",
    "barrier_load": "provisioning",
    "barrier_overhead": "provisioning",
    "tau_mf": "provisioning",
    "tau_gaussian": "provisioning",
    "per_instance_throughput": "provisioning",
    "optimal_ratio_mf": "provisioning",
    "optimal_ratio_gaussian": "provisioning",
    "ratio_table": "provisioning",
    "RatioOptimum": "provisioning",
    "simulate_bundle": "simulator",
    "SimulationResult": "simulator",
    "barrier_overhead_mc": "simulator",
    "fit_line": "calibrate",
    "Calibration": "calibrate",
    "LineFit": "calibrate",
    "calibrate_from_profiles": "calibrate",
}

__all__ = [*_EXPORTS]  # noqa: PLE0604 - names resolved lazily below


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
