"""Locate shipped data (models/, profiles/) in a wheel install or a source checkout."""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def shipped_dir(name: str) -> Path:
    """Return the directory holding shipped `name` ('models' or 'profiles').

    Wheels carry the folders under opweave_planner/_shipped/; an editable or
    source checkout finds them at the repository root.
    """
    pkg = Path(__file__).resolve().parent
    for candidate in (pkg / "_shipped" / name, pkg.parent.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"shipped data folder '{name}' not found next to {pkg}")


def profiles_root(profiles_dir: str | Path | None) -> Path:
    """The profile folder in effect: the user's --profiles, else the shipped one."""
    return Path(profiles_dir) if profiles_dir else shipped_dir("profiles")
