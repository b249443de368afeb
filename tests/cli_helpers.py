"""Run the real console entry point in a subprocess (exit codes, stderr, no traceback)."""

from __future__ import annotations

import subprocess
import sys

CLI = [sys.executable, "-c", "from opweave_planner.cli.main import run; run()"]


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=300)
