"""The compile room: a request -> what the search kernels read (see compiled.py).

Below the search (which imports the Problem it defines) and above the inputs, structure,
latency and policies it reads; it imports no numba.
"""

from opweave_planner.compile.compiled import Compiled, compile_request, hardware_for

__all__ = ["Compiled", "compile_request", "hardware_for"]
