"""Imports flow one way: cli -> orchestration -> api -> search/plan/theory/afd -> latency -> structure -> inputs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "opweave_planner"

# rank of each top-level unit; a module may import units of its own rank or lower only
RANK = {
    "errors": 0, "data": 0, "atomic": 0, "inputs": 0,
    "structure": 1,
    "schedule": 2, "latency": 2, "policies": 2,
    "search": 3,
    "plan": 4, "theory": 4, "afd": 4, "report": 4,
    "api": 5,
    "executor": 6, "compare": 6, "contract": 6, "regen": 6,
    "cli": 7,
}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("opweave_planner"):
            out.add(node.module)
            for alias in node.names:
                out.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("opweave_planner"))
    return out


MODULES = sorted(p for p in PKG.rglob("*.py") if p.name != "__init__.py" or p.parent != PKG)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_flow_one_way(path):
    rel = path.relative_to(PKG)
    unit = rel.parts[0].removesuffix(".py")
    if unit == "__init__":
        return
    assert unit in RANK, f"{rel}: add its unit to RANK"
    for mod in _imports(path):
        target = _unit(mod)
        if target in ("", "__version__") or target not in RANK:
            continue
        assert RANK[target] <= RANK[unit], f"{rel} imports {mod} ({target} ranks above {unit})"


def test_schedule_imports_nothing_of_ours_and_kernels_take_arrays():
    for path in (PKG / "schedule").glob("*.py"):
        assert all(_unit(m) == "schedule" for m in _imports(path)), path
    kernels = _imports(PKG / "search" / "kernels.py")
    assert {_unit(m) for m in kernels} <= {"schedule"}


def test_library_never_imports_the_cli():
    for path in MODULES:
        if path.relative_to(PKG).parts[0] != "cli":
            assert not any(_unit(m) == "cli" for m in _imports(path)), path
