"""Imports flow one way: cli -> api -> orchestration -> plan/contract -> search -> policies/latency
-> structure -> inputs; schedule imports nothing of ours; numeric kernels see arrays only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "opweave_planner"

# rank of each top-level unit; a module may import units of its own rank or lower only
RANK = {
    "errors": 0, "data": 0, "atomic": 0, "procs": 0, "inputs": 0,
    "structure": 1,
    "schedule": 2, "latency": 2, "policies": 2,
    "search": 3,
    "plan": 4, "theory": 4, "afd": 4, "report": 4, "sizing": 4,
    "contract": 5,
    "api": 6,
    "executor": 7, "compare": 7, "regen": 7, "export": 7,
    "cli": 8,
}
# modules that run inside numba: they may import only numeric code and the Problem tuples
KERNEL_MODULES = ("search/evaluate.py", "search/points.py", "search/bounds.py", "search/walk.py")
KERNEL_ALLOWED = {"schedule", "search"}


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports_of(source: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("opweave_planner"):
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("opweave_planner"))
    return out


def violations(unit: str, source: str, rank: dict[str, int] = RANK) -> list[str]:
    """Imports of `source` (a module of `unit`) that point up the stack, or to unknown units."""
    bad = []
    for mod in sorted(imports_of(source)):
        target = unit_of(mod)
        if target in ("", "__version__"):
            continue
        if target not in rank:
            bad.append(f"{mod}: unit '{target}' has no rank")
        elif rank[target] > rank[unit]:
            bad.append(f"{mod} ({target} ranks above {unit})")
    return bad


MODULES = sorted(p for p in PKG.rglob("*.py") if p.name != "__init__.py" or p.parent != PKG)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_flow_one_way(path):
    rel = path.relative_to(PKG)
    unit = rel.parts[0].removesuffix(".py")
    if unit == "__init__":
        return
    assert unit in RANK, f"{rel}: add its unit to RANK"
    assert not violations(unit, path.read_text()), f"{rel}: {violations(unit, path.read_text())}"


def test_schedule_imports_nothing_of_ours_and_kernels_take_arrays():
    for path in (PKG / "schedule").glob("*.py"):
        assert all(unit_of(m) == "schedule" for m in imports_of(path.read_text())), path
    for rel in KERNEL_MODULES:
        units = {unit_of(m) for m in imports_of((PKG / rel).read_text())}
        assert units <= KERNEL_ALLOWED, (rel, units)


def test_library_never_imports_the_cli():
    for path in MODULES:
        if path.relative_to(PKG).parts[0] != "cli":
            assert not any(unit_of(m) == "cli" for m in imports_of(path.read_text())), path


def test_the_checker_itself_on_made_up_sources():
    """The checker must flag an upward import, an unknown unit and a relative-looking miss."""
    up = "from opweave_planner.search.walk import search_template\n"
    assert violations("structure", up) == ["opweave_planner.search.walk (search ranks above structure)",
                                           "opweave_planner.search.walk.search_template (search ranks above "
                                           "structure)"]
    assert violations("search", up) == []
    assert violations("plan", "import opweave_planner.cli.main\n") == [
        "opweave_planner.cli.main (cli ranks above plan)"]
    assert violations("plan", "from opweave_planner.nowhere import x\n")[0].startswith(
        "opweave_planner.nowhere: unit 'nowhere' has no rank")
    # imports inside functions count as much as top-level ones
    nested = "def f():\n    from opweave_planner.api import plan\n    return plan\n"
    assert violations("search", nested)
    assert imports_of("import numpy\nfrom . import x\n") == set()


def test_search_functions_stay_small():
    """The search is small numba functions over named tuples, not one long kernel."""
    for path in sorted((PKG / "search").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                length = node.end_lineno - node.lineno + 1
                params = len(node.args.args) + len(node.args.kwonlyargs)
                assert length <= 80 and params <= 8, f"{path.name}:{node.name}: {length} lines, {params} parameters"


def test_plan_and_contract_use_nothing_private_from_search():
    for name in ("plan.py", "contract.py"):
        tree = ast.parse((PKG / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opweave_planner.search"):
                assert not any(a.name.startswith("_") for a in node.names), (name, node.module)
