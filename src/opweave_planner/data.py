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


def check_profiles_dir(profiles_dir: str | Path, field: str = "--profiles") -> Path:
    """A user's profile folder: it must exist, be a folder and hold at least one GPU's tables
    (``<gpu>/system.json``); otherwise every latency would silently come from the roofline."""
    import os

    from opweave_planner.atomic import check_input_file, check_input_folder, shown_path
    from opweave_planner.errors import UserError

    root = check_input_folder(profiles_dir, field)
    try:
        there = sorted(p / "system.json" for p in root.iterdir() if os.path.lexists(p / "system.json"))
    except OSError as exc:
        raise UserError(f"{field}: '{shown_path(profiles_dir)}' cannot be read ({exc.strerror or exc})") from None
    if there and not any(p.is_file() for p in there):  # only FIFOs, folders or dangling links: say which
        check_input_file(there[0], field)
    if not there:
        raise UserError(f"{field}: '{shown_path(profiles_dir)}' holds no latency profiles (expected "
                        f"<gpu>/system.json and <gpu>/<backend>/*.json, as in the shipped profiles/)")
    return root


def profiles_root(profiles_dir: str | Path | None) -> Path:
    """The profile folder in effect: the user's --profiles (checked), else the shipped one."""
    return check_profiles_dir(profiles_dir) if profiles_dir else shipped_dir("profiles")
