"""Imports flow one way: cli -> api -> orchestration -> plan/contract -> search -> policies/latency
-> structure -> inputs; schedule imports nothing of ours; numeric kernels see arrays only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from opweave_planner.report import CACHED_DECORATORS

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


# ---------------------------------------------------------------- kernels without a CPython wrapper

WRAPPERLESS_DECORATORS = {"inner", "hot", "_inner", "inner_inline", "hot_inline"}  # no_cpython_wrapper=True
NUMBA_FILES = ("search/evaluate.py", "search/points.py", "search/bounds.py", "search/walk.py",
               "schedule/kernels.py")


def _decorators(fn: ast.FunctionDef) -> list[str]:
    return [ast.unparse(d) for d in fn.decorator_list]


def _compiled(fn: ast.FunctionDef) -> bool:
    return any(d in CACHED_DECORATORS or "njit" in d or d.startswith("overload") for d in _decorators(fn))


def wrapperless_functions() -> dict[str, set[str]]:
    """module -> names of its kernels compiled without a CPython wrapper."""
    out = {}
    for rel in NUMBA_FILES:
        module = "opweave_planner." + rel.removesuffix(".py").replace("/", ".")
        tree = ast.parse((PKG / rel).read_text())
        out[module] = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                       and (set(_decorators(n)) & WRAPPERLESS_DECORATORS
                            or any("no_cpython_wrapper=True" in d for d in _decorators(n)))}
    return out


def python_uses_of_wrapperless(source: str, module: str | None, table: dict[str, set[str]]) -> list[str]:
    """Lines of `source` (the module `module`, or None) where Python code, not a kernel, calls or
    passes around a wrapper-less kernel: that would crash the interpreter, not raise."""
    tree = ast.parse(source)
    names: dict[str, str] = {}  # local name -> kernel it is
    modules: dict[str, str] = {}  # local alias -> kernel module
    if module in table:
        names.update({n: n for n in table[module]})
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                if node.module in table and a.name in table[node.module]:
                    names[a.asname or a.name] = a.name
                if f"{node.module}.{a.name}" in table:
                    modules[a.asname or a.name] = f"{node.module}.{a.name}"
    bad = []

    def visit(node: ast.AST, in_kernel: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef):
                visit(child, in_kernel or _compiled(child))
                continue
            if not in_kernel:
                if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load) and child.id in names:
                    bad.append(f"line {child.lineno}: {child.id}")
                if (isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name)
                        and child.value.id in modules and child.attr in table[modules[child.value.id]]):
                    bad.append(f"line {child.lineno}: {child.value.id}.{child.attr}")
            visit(child, in_kernel)

    visit(tree, False)
    return bad


def test_the_cache_check_knows_every_wrapperless_decorator():
    assert set(CACHED_DECORATORS) >= WRAPPERLESS_DECORATORS


def test_python_never_calls_a_kernel_compiled_without_its_wrapper():
    table = wrapperless_functions()
    assert sum(map(len, table.values())) > 10  # the scan found the decorated kernels
    root = PKG.parents[1]
    files = [*PKG.rglob("*.py"), *(root / "tests").rglob("*.py"), *(root / "benchmarks").rglob("*.py")]
    for path in files:
        module = None
        if path.is_relative_to(PKG):
            module = "opweave_planner." + ".".join(path.relative_to(PKG).with_suffix("").parts)
        assert not python_uses_of_wrapperless(path.read_text(), module, table), (path, python_uses_of_wrapperless(
            path.read_text(), module, table))


def test_the_wrapper_check_on_made_up_sources():
    table = {"opweave_planner.search.evaluate": {"plan_gpus"}, "opweave_planner.schedule.kernels": {"_inner_f"}}
    direct = "from opweave_planner.search.evaluate import plan_gpus\nx = plan_gpus(1, 2, 3)\n"
    assert python_uses_of_wrapperless(direct, None, table) == ["line 2: plan_gpus"]
    alias = "from opweave_planner.schedule import kernels as K\nK._inner_f(1)\n"
    assert python_uses_of_wrapperless(alias, None, table) == ["line 2: K._inner_f"]
    inside = ("from opweave_planner.search.evaluate import plan_gpus\n@inner\ndef f(p):\n"
              "    return plan_gpus(p, 1, 2)\n")
    assert python_uses_of_wrapperless(inside, None, table) == []
    own = "def g():\n    return plan_gpus\n"  # the kernel's own module, from Python code
    assert python_uses_of_wrapperless(own, "opweave_planner.search.evaluate", table) == ["line 2: plan_gpus"]
