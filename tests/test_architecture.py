"""Imports flow one way: cli -> orchestration -> api -> contract/sizing -> plan/theory/afd/report ->
search -> compile -> policies/latency/schedule -> structure -> workload/inputs, with jit and the helpers at
the bottom; no import circle; schedule imports only jit; the search's kernels see the numba policy, the simulator and
the Problem only (numeric kernels take arrays)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from opweave_planner import jit

PKG = Path(__file__).resolve().parents[1] / "src" / "opweave_planner"

# rank of each top-level unit; a module may import units of its own rank or lower only
RANK = {
    "errors": 0, "data": 0, "atomic": 0, "procs": 0, "inputs": 0, "jit": 0, "frozen": 0,
    "workload": 0,  # beside inputs: PlanRequest validates with its grammar, it reads inputs.units
    "structure": 1,
    "schedule": 2, "latency": 2, "policies": 2,
    "compile": 3,
    "search": 4,
    "plan": 5, "theory": 5, "afd": 5, "report": 5,
    "contract": 6, "sizing": 6,  # sizing: arithmetic over the plan package's Deployment
    "deployment": 6,  # the prefill pool beside the sized decode plan
    "aggregated": 6,  # chunked prefill inside colocated replicas, beside the disaggregated deployment
    "api": 7,
    "executor": 8, "compare": 8, "regen": 8, "regen_matrix": 8, "regen_files": 8, "export": 8,
    "cli": 9,
}
# the search's kernel modules (jit.PLAN_KERNELS) may import only the numba policy, the simulator,
# the search and the Problem the compile room defines
KERNEL_ALLOWED = ("opweave_planner.jit", "opweave_planner.schedule", "opweave_planner.search",
                  "opweave_planner.compile.problem")


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


def test_schedule_and_jit_import_nothing_of_ours_and_kernels_take_arrays():
    for path in (PKG / "schedule").glob("*.py"):
        assert all(unit_of(m) in ("schedule", "jit") for m in imports_of(path.read_text())), path
    assert not imports_of((PKG / "jit.py").read_text())
    for rel in jit.PLAN_KERNELS:
        bad = [m for m in imports_of((PKG / rel).read_text()) if not m.startswith(KERNEL_ALLOWED)]
        assert not bad, (rel, bad)
    for path in (PKG / "compile").glob("*.py"):  # Python builds, the compiled core executes
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in names if m.split(".")[0] == "numba" or m == "opweave_planner.jit"}, path


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


def test_search_builds_its_tuples_by_keyword():
    """No constructor call of more than six positional values in search/ (a swapped pair of
    same-typed fields would still compile)."""
    for path in sorted((PKG / "search").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id[:1].isupper():
                assert len(node.args) <= 6, f"{path.name}:{node.lineno}: {node.func.id} with {len(node.args)} values"


def test_plan_and_contract_use_nothing_private_from_search():
    for path in (*sorted((PKG / "plan").glob("*.py")), PKG / "contract.py"):
        name = path.relative_to(PKG)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opweave_planner.search"):
                assert not any(a.name.startswith("_") for a in node.names), (name, node.module)


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """module -> the modules of `sources` it imports, anywhere in its text (a TYPE_CHECKING or
    function-level import closes a circle as much as a top-level one). Importing a submodule
    runs its packages' __init__ too, unless the importer lives inside that package."""
    graph = {}
    for mod, source in sources.items():
        out = set()
        for name in imports_of(source):
            while name and name not in sources:  # "pkg.mod.name" -> "pkg.mod"
                name = name.rpartition(".")[0]
            while name:
                if name != mod and not mod.startswith(name + "."):
                    out.add(name)
                name = name.rpartition(".")[0] if name.rpartition(".")[0] in sources else ""
        graph[mod] = out
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other round a circle (Tarjan's strongly connected
    components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_sources() -> dict[str, str]:
    def name(p: Path) -> str:
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return {name(p): p.read_text() for p in PKG.rglob("*.py")}


def test_no_import_circle():
    assert circles(import_graph(package_sources())) == []


def test_the_circle_check_on_made_up_sources():
    src = {"a": "from opweave_planner.b import x\n", "b": "def f():\n    import opweave_planner.a\n",
           "c": "from opweave_planner.a import y\n", "q": "from opweave_planner.q.m import z\n",
           "q.m": "from opweave_planner.q.n import w\n", "q.n": "", "r": "from opweave_planner.q.n import w\n"}
    graph = import_graph({f"opweave_planner.{k}": v for k, v in src.items()})
    short = {k.removeprefix("opweave_planner."): {t.removeprefix("opweave_planner.") for t in v}
             for k, v in graph.items()}
    assert short["r"] == {"q.n", "q"}  # a submodule's package runs first
    assert short["q.m"] == {"q.n"}  # its own package is already loading
    assert circles(short) == [["a", "b"]]
    assert circles({**short, "q.n": {"r"}}) == [["a", "b"], ["q", "q.m", "q.n", "r"]]


# ---------------------------------------------------------------- the numba policy (jit.py)

ROOT = PKG.parents[1]
NP_ALLOCATORS = {"zeros", "empty", "ones", "full", "array", "arange", "zeros_like", "empty_like",
                 "ones_like", "full_like", "copy", "sort", "concatenate", "stack"}


def module_name(rel: str) -> str:
    return "opweave_planner." + rel.removesuffix(".py").replace("/", ".")


def kernel_table() -> dict[str, dict[str, dict]]:
    """module -> kernel name -> its kind, for every kernel module of the package."""
    return {module_name(rel): jit.kernels_of((PKG / rel).read_text()) for rel in jit.kernel_modules()}


def _local_names(tree: ast.AST, module: str | None, table) -> tuple[dict[str, tuple], dict[str, str]]:
    """(local name -> (module, kernel), local alias -> kernel module) of a source."""
    names = {n: (module, n) for n in table.get(module, {})}
    modules = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                if a.name in table.get(node.module, {}):
                    names[a.asname or a.name] = (node.module, a.name)
                if f"{node.module}.{a.name}" in table:
                    modules[a.asname or a.name] = f"{node.module}.{a.name}"
    return names, modules


def references(source: str, module: str | None, table) -> list[tuple[str | None, str, str, int]]:
    """(enclosing kernel or None for Python code, kernel module, kernel, line) of every use of
    a kernel in `source` (the module `module`, or None)."""
    tree = ast.parse(source)
    names, modules = _local_names(tree, module, table)
    mine = table.get(module, {})
    out = []

    def visit(node: ast.AST, caller: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef):
                inner = child.name if child.name in mine and caller is None else caller
                for dec in child.decorator_list:  # a decorator is no use of the decorated kernel
                    visit(dec, caller)
                for part in (child.args, *child.body):
                    visit(part, inner)
                continue
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load) and child.id in names:
                out.append((caller, *names[child.id], child.lineno))
            if (isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name)
                    and child.value.id in modules and child.attr in table[modules[child.value.id]]):
                out.append((caller, modules[child.value.id], child.attr, child.lineno))
            visit(child, caller)

    visit(tree, None)
    return out


def python_files() -> list[tuple[Path, str | None]]:
    files = [*PKG.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
    return [(f, module_name(str(f.relative_to(PKG))) if f.is_relative_to(PKG) else None) for f in files]


def call_graph(table) -> list[tuple[str | None, str | None, str, str, int, str]]:
    """(caller module or None, caller kernel or None, callee module, callee kernel, line, file)."""
    out = []
    for path, module in python_files():
        for caller, mod, name, line in references(path.read_text(), module, table):
            out.append((module if caller else None, caller, mod, name, line, path.name))
    return out


def kind_violations(table, graph) -> list[str]:
    """Where a kernel's kind does not fit its use (see jit.py)."""
    bad = []
    from_python = {(m, n) for cm, _c, m, n, _ln, _f in graph if cm is None}
    callers: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for cm, c, m, n, _ln, _f in graph:
        if cm is not None:
            callers.setdefault((m, n), set()).add((cm, c))
    for cm, _c, m, n, ln, f in graph:
        if cm is None and table[m][n]["kind"] == "kernel":
            bad.append(f"{f}:{ln}: Python uses {n}, a kernel without a CPython wrapper (it would crash)")
    for m, kernels in table.items():
        for n, kind in kernels.items():
            if kind["kind"] == "entry" and (m, n) not in from_python:
                bad.append(f"{m}.{n}: an entry no Python code calls (make it a kernel: no wrapper to link)")
            if kind["inline"] and not callers.get((m, n)):
                bad.append(f"{m}.{n}: inline, but no kernel calls it")
            if kind["inline"] and kind["refcount"]:  # its counting would vanish in such a caller
                for cm, c in sorted(callers.get((m, n), ())):
                    if not table[cm][c]["refcount"]:
                        bad.append(f"{m}.{n}: counts references but is inlined into {c} (refcount=False)")
    return bad


def allocations(source: str, names: set[str]) -> list[str]:
    """Calls of numpy allocators in the bodies of the functions `names` of `source`."""
    bad = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            for call in ast.walk(node):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and isinstance(call.func.value, ast.Name) and call.func.value.id in ("np", "numpy")
                        and call.func.attr in NP_ALLOCATORS):
                    bad.append(f"{node.name}: np.{call.func.attr}")
    return bad


def test_every_kernel_kind_fits_its_use():
    """entry: Python calls it; kernel: only kernels do; inline: some kernel calls it; what is
    inlined into a refcount=False kernel is refcount=False too (and so allocates nothing)."""
    table = kernel_table()
    assert sum(map(len, table.values())) > 40  # the scan found the decorated kernels
    graph = call_graph(table)
    assert any(cm is None for cm, *_ in graph) and any(cm for cm, *_ in graph)
    assert kind_violations(table, graph) == []


def test_kernels_without_reference_counting_allocate_nothing():
    for module, kernels in kernel_table().items():
        hot = {n for n, kind in kernels.items() if not kind["refcount"]}
        path = PKG / (module.removeprefix("opweave_planner.").replace(".", "/") + ".py")
        assert allocations(path.read_text(), hot) == [], module


def test_only_jit_spells_the_numba_options():
    for path in MODULES:
        rel = str(path.relative_to(PKG))
        if rel == "jit.py":
            continue
        assert "njit" not in path.read_text(), f"{rel}: decorate with jit.entry / jit.kernel"


def test_the_plan_kernels_are_what_the_search_imports():
    """jit.PLAN_KERNELS (the compile notice's cache check) = the kernel modules that search.walk
    and search.evaluate import, transitively."""
    kernels = set(jit.kernel_modules())
    seen, todo = set(), ["search/walk.py", "search/evaluate.py"]
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        for mod in imports_of((PKG / rel).read_text()):
            dotted = mod.removeprefix("opweave_planner.").replace(".", "/")
            for cand in (f"{dotted}.py", f"{dotted}/__init__.py"):
                if (PKG / cand).is_file():
                    todo.append(cand)
    assert set(jit.PLAN_KERNELS) == seen & kernels


def test_the_installed_numba_takes_every_option():
    """Each kind jit.py compiles, compiled and called here: a numba that renames or drops
    `_nrt`, `no_cpython_wrapper` or `no_cfunc_wrapper` fails this test first."""
    pytest.importorskip("numba")

    def twice(x):
        return 2 * x

    plain = jit.kernel(twice)
    inline = jit.kernel(inline=True)(twice)
    hot = jit.kernel(refcount=False)(twice)
    hot_inline = jit.kernel(inline=True, refcount=False)(twice)
    door_inline = jit.entry(inline=True)(twice)

    def door(x):
        return plain(x) + inline(x) + hot(x) + hot_inline(x) + door_inline(x)

    assert jit.entry(door)(1.5) == 15.0
    assert door_inline(2) == 4
    rule = jit.shared(lambda x: x + 1)
    assert rule(1) == 2 and jit.entry(lambda x: rule(x) + 1)(1) == 3


def test_an_index_naming_a_moved_class_is_recompiled(tmp_path):
    """Numba unpickles a cache index before checking it is fresh: an index naming a module that
    no longer exists (a class moved, an upgrade over a warm cache) must mean 'compile again'."""
    import os
    import pickle
    import subprocess
    import sys

    pytest.importorskip("numba")
    mod = tmp_path / "kern.py"
    mod.write_text("from opweave_planner import jit\n\n\n@jit.entry\ndef twice(x):\n    return 2 * x\n")
    env = {**os.environ, "PYTHONPATH": f"{PKG.parent}{os.pathsep}{tmp_path}", "NUMBA_CACHE_DIR": str(tmp_path / "nc")}
    run = ["import kern; print(kern.twice(2))"]
    assert subprocess.run([sys.executable, "-c", *run], env=env, capture_output=True, text=True,
                          timeout=300, check=True).stdout.split() == ["4"]
    [index] = list(jit.numba_cache_dir(mod, env).glob("kern.twice-*.nbi"))
    index.write_bytes(pickle.dumps(jit._numba_version()) + b"cno_such_module_of_ours\nGone\n.")
    done = subprocess.run([sys.executable, "-c", *run], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["4"], done.stderr[-2000:]
    assert b"no_such_module_of_ours" not in index.read_bytes()  # rewritten by the recompile


def test_the_kind_check_on_made_up_sources():
    table = {"opweave_planner.search.evaluate": {"plan_gpus": {"kind": "kernel", "inline": False, "refcount": True},
                                                 "door": {"kind": "entry", "inline": False, "refcount": True}},
             "opweave_planner.schedule.kernels": {"_inner_f": {"kind": "kernel", "inline": True, "refcount": True}}}
    table[mod := "opweave_planner.search.evaluate"]["plan_gpus"]["refcount"] = False
    direct = "from opweave_planner.search.evaluate import plan_gpus\nx = plan_gpus(1, 2, 3)\n"
    assert references(direct, None, table) == [(None, "opweave_planner.search.evaluate", "plan_gpus", 2)]
    alias = "from opweave_planner.schedule import kernels as K\nK._inner_f(1)\n"
    assert references(alias, None, table) == [(None, "opweave_planner.schedule.kernels", "_inner_f", 2)]
    inside = ("from opweave_planner.schedule.kernels import _inner_f\n@kernel\ndef plan_gpus(p):\n"
              "    return _inner_f(p)\n")
    assert references(inside, mod, table) == [("plan_gpus", "opweave_planner.schedule.kernels", "_inner_f", 4)]
    own = "def g():\n    return plan_gpus\n"  # the kernel's own module, from Python code
    assert references(own, mod, table) == [(None, mod, "plan_gpus", 2)]
    graph = [(None, None, mod, "plan_gpus", 2, "x.py"), (mod, "plan_gpus", "opweave_planner.schedule.kernels",
                                                            "_inner_f", 4, "y.py")]
    assert kind_violations(table, graph) == [
        "x.py:2: Python uses plan_gpus, a kernel without a CPython wrapper (it would crash)",
        f"{mod}.door: an entry no Python code calls (make it a kernel: no wrapper to link)",
        "opweave_planner.schedule.kernels._inner_f: counts references but is inlined into plan_gpus "
        "(refcount=False)"]
    assert allocations("def f(a):\n    b = np.zeros(3)\n    return a\n", {"f"}) == ["f: np.zeros"]
