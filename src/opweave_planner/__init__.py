"""opweave-planner: cheapest operator-level disaggregated decode plans under a TPOT SLO."""

import os as _os

__version__ = "0.1.0"

# Numba formats an error message for every overload it tries and rejects while typing (about
# 16,000 in a cold plan), each wrapped in colorama's init/deinit for highlighting: plain text
# instead. Numba reads this when numba.core.errors is first imported, so it is set here, before
# any module of the package can import numba (jit.py holds the rest of the numba policy).
# Nothing here shows numba's messages to a user; a user's own setting wins.
_os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")
