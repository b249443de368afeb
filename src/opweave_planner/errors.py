"""User-facing errors: one line, a field or file, and what was expected.

The CLI turns these into a single stderr line and an exit code; the library
raises them so tests can assert on messages without a subprocess.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (exit code 2)."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class InfeasibleError(UserError):
    """No plan satisfies the constraints; the message names the binding one (exit code 3)."""

    exit_code = 3
