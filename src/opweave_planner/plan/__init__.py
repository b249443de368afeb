"""The plan file: its models (schema), its bytes and version stamp (io), how a search result
becomes one (build), and the one table between a request and the keys that record it (request).

The public API is what each module lists in its `__all__`; callers import it from here.
Modules inside the package import each other directly (request <- schema <- io <- build), so
loading one never runs this file's imports in a circle.
"""

from opweave_planner.plan import build, io, outcome, request, schema
from opweave_planner.plan.build import *  # noqa: F403
from opweave_planner.plan.io import *  # noqa: F403
from opweave_planner.plan.outcome import *  # noqa: F403
from opweave_planner.plan.request import *  # noqa: F403
from opweave_planner.plan.schema import *  # noqa: F403

__all__ = []
__all__ += schema.__all__
__all__ += io.__all__
__all__ += build.__all__
__all__ += request.__all__
__all__ += outcome.__all__
