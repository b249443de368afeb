"""The numba policy: how every kernel of the package is compiled, and how we know it is cached.

Two decorators say what a kernel is; nothing else in the package calls `numba.njit`.

- `entry`: a kernel Python calls (the search, the plan writer's evaluation, the simulator's
  public kernels, a few scalar rules the tests call). Numba builds its CPython wrapper.
- `kernel`: a kernel only other kernels call, compiled without a CPython wrapper. Numba links
  each callee's module, wrapper included, into every caller and re-optimises it there, and the
  wrapper that unboxes a whole Problem is large: the wrappers were about a quarter of the
  planner's cold compile. Calling one from Python crashes the interpreter (no exception), so
  tests/test_architecture.py checks, on a call graph of the package, tests and benchmarks,
  that nothing does. Where Python needs one too, a thin `entry` door calls it.

Options of either:

- `inline=True`: inlined into its caller before typing (a kernel with one call site, or a thin
  helper): one compiled module fewer, whose closure numba would otherwise re-optimise once more.
- `refcount=False` (`kernel` only): compiled without reference counting. Numba counts array
  references with atomic operations; in the search's inner loops that took about 40 % of the
  time (perf, gemma-3-27b on H100). Only for kernels that allocate nothing (they borrow their
  caller's arrays), and an inlined one only into a caller of the same kind, or the counting
  comes back.

LLVM optimises every kernel's IR at `OPT_LEVEL` (1), not numba's default 3: the passes over
each kernel's final module (every callee linked in, the search's ~2 M characters) are most of
the time numba spends in LLVM, and level 1 cut that time by about a quarter on a cold plan
while the warm searches ran as fast (docs/architecture.md: the measurements). Machine code
generation keeps numba's level; numba's own helpers compiled for a kernel (np.empty, argsort)
get the kernel's level; code outside the package is untouched.

Every kernel is cached on disk (`cache=True`) and none gets numba's C-callable (cfunc) wrapper:
it exists to pass a compiled function around as a value, which nothing here does, yet numba
builds it for every function and links it into each caller (dropping it cut the planner's cold
compile by about a tenth, 14.3 -> 12.9 s).

`shared(fn)` lets kernels call a plain-Python rule that Python code calls too (the rule is
written once, in a module that does not import numba).

Reliance on numba internals, stated once: `no_cpython_wrapper` and `no_cfunc_wrapper` are
undocumented `njit` options, `_nrt` a private one, the cache check below reads numba's cache
index format, `_restamp` sets its cache file's private `_source_stamp`,
`_tolerate_stale_index` wraps a dispatcher's private index reader,
`_unliteral_calls` its `get_call_template`, `_at_opt_level` its `compile` and the CPU
codegen's private `_pass_builder` (where numba reads NUMBA_OPT for every pass pipeline), and
`_skip_blas_probe` the BLAS check numba.np.arraymath runs at import (`_check_blas`, calling
numba.np.linalg's `ensure_blas`), and `_share_inline_copies` gives numba.core.ir.Block a
`__deepcopy__` that recognises the frame of the inliner's `copy_ir` (numba.core.inline_closurecall)
by its name and file, and `_compare_flags_by_their_settings` wraps TargetConfig's `__eq__`,
reading its private `_values`, and `_load_without_refresh` replaces numba.core.caching.Cache's
`load_overload` for our kernels (its private `_guard_against_spurious_io_errors` and
`_load_overload`, and numba.core.runtime's `rtsys`).
numba is pinned below 1 (pyproject.toml); a numba that drops an option
fails every kernel at its first compile with a KeyError naming it, and the test
`test_the_installed_numba_takes_every_option` says so first (docs/architecture.md: how to test
the newest numba).

Importing this module does not import numba (the decorators import it when applied), so the
cache check runs before a first compile and `opweave-plan --help` stays light.
"""

from __future__ import annotations

import ast
import hashlib
import io
import os
import pickle
import re
import sys
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path

#: The options every kernel is compiled with.
BASE_OPTIONS = {"cache": True, "no_cfunc_wrapper": True}

#: LLVM's optimisation level for the package's kernels (numba's NUMBA_OPT, default 3, for the rest).
OPT_LEVEL = 1

#: The package's kernel modules a plan search compiles (relative to the package folder); the
#: first-run compile notice looks at their caches. tests/test_architecture.py checks that these
#: are exactly the kernel modules search.walk and search.evaluate import, themselves included.
PLAN_KERNELS = ("search/walk.py", "search/points.py", "search/bounds.py", "search/evaluate.py",
                "schedule/kernels.py")

PACKAGE = Path(__file__).resolve().parent

#: The kernels Python calls for each part of a plan, by module: what a request's first-run notice
#: checks (`request_cache_is_warm`). Each has exactly one signature (tests/test_compile_once.py),
#: so a fresh cache index of each means the part compiles nothing; the kernels they call are
#: linked into them and need no cache of their own.
ENTRIES = {
    "fixed-context search": {"search/walk.py": ("_search_fixed",), "search/evaluate.py": ("_detail_fixed",),
                             "search/bounds.py": ("phase_floors",)},
    "workload search": {"search/walk.py": ("_search_workload",), "search/evaluate.py": ("_detail_workload",)},
    "prefill replay": {"latency/ttft.py": ("replay",)},
    "aggregated replay": {"latency/mixed.py": ("replay", "step_times")},
}


def options(kind: str, *, inline: bool = False, refcount: bool = True) -> dict:
    """The njit options of a kernel of `kind` ('entry' or 'kernel')."""
    out = dict(BASE_OPTIONS)
    if kind == "kernel":
        out["no_cpython_wrapper"] = True
    if not refcount:
        out["_nrt"] = False
    if inline:
        out["inline"] = "always"
    return out


def _decorator(fn, opts: dict):
    def apply(f):
        import numba

        return _at_opt_level(_tolerate_stale_index(_restamp(_unliteral_calls(numba.njit(**opts)(f)))))

    return apply if fn is None else apply(fn)


def _unliteral_calls(dispatcher):
    """Compile a kernel called from another kernel for its arguments' plain types. Numba types a
    constant argument (`f(x, 0)`, a module constant) as a literal and compiled the callee once
    more per literal value (lower_bound at level 0, the trace scanner's error codes): one more
    signature per call site, each a whole compile of the callee and its own cache entry. Python
    callers already get plain types (numba unliterals them); no kernel here dispatches on a
    literal value."""
    get = getattr(dispatcher, "get_call_template", None)
    if get is None:  # NUMBA_DISABLE_JIT: a plain function
        return dispatcher
    from numba.core.types import unliteral

    def get_call_template(args, kws):
        return get(tuple(unliteral(a) for a in args), {k: unliteral(v) for k, v in kws.items()})

    dispatcher.get_call_template = get_call_template
    return dispatcher


#: The optimisation level of each compile in progress, innermost last (a kernel's callees
#: compile inside its compile, each at its own level).
_OPT_STACK: list[int] = []


def _at_opt_level(dispatcher, level: int = OPT_LEVEL):
    """Compile a kernel's LLVM IR at `level`: numba builds every pass pipeline (the function
    passes of each module, the module passes of the final module) through its codegen's
    `_pass_builder`, which reads NUMBA_OPT unless given a level; while one of our kernels
    compiles, it is given ours. Pipelines numba builds at a fixed level (its cheap inlining
    pass, at 0) keep it."""
    compile_ = getattr(dispatcher, "compile", None)
    if compile_ is None:  # NUMBA_DISABLE_JIT: a plain function
        return dispatcher
    _give_pass_builders_our_level()
    _share_inline_copies()
    _compare_flags_by_their_settings()
    _load_without_refresh()

    def compile(sig):
        _skip_blas_probe()
        _OPT_STACK.append(level)
        try:
            return compile_(sig)
        finally:
            _OPT_STACK.pop()

    dispatcher.compile = compile
    return dispatcher


def _skip_blas_probe():
    """Load numba's array implementations without importing scipy.linalg. Numba installs them
    (numba.np.arraymath) on its first compile or cache load, and that module checks at import
    that BLAS is there by importing scipy.linalg.cython_blas: all of scipy.linalg, which clones
    every numpy submodule (f2py, testing), 0.2-0.45 s of each plan's CPU although no kernel here
    uses BLAS (np.dot, @, np.linalg). The check runs with a stand-in that asks only whether scipy
    is installed (a dependency: the check's answer is the same); numba's BLAS overloads call
    the real check again when a kernel uses them."""
    if "numba.np.arraymath" in sys.modules:
        return
    from importlib.util import find_spec

    from numba.np import linalg

    def scipy_is_installed():
        if find_spec("scipy") is None:
            raise ImportError("scipy is required for linear algebra")

    probe, linalg.ensure_blas = linalg.ensure_blas, scipy_is_installed
    try:
        from numba.np import arraymath
    finally:
        linalg.ensure_blas = probe
    arraymath.ensure_blas = probe  # the name it imported, for any later caller


def _share_inline_copies():
    """Copy a kernel's IR for inlining (`inline=True`) in one piece, not block by block. Numba's
    inliner deep-copies the callee's IR one block at a time, each with a fresh memo, so every
    block copies the whole variable scope again (and the inliner then compares those copies
    with one another): quadratic in the callee's size. `_search`, its callees already inlined,
    took 1.8 s of a 25.7 s cold plan to copy, every inlining 3.1 s. Inside that copy loop
    (numba's `copy_ir`) the blocks now share one memo, as a deep copy of the whole block map
    would: one scope copy that every block refers to. Any other deep copy of a block keeps
    numba's own memo; each `copy_ir` call gets a fresh one (its frame is held to tell them
    apart, so no later call can reuse it by address)."""
    import copy

    from numba.core import inline_closurecall, ir

    if getattr(ir.Block, "opweave_shared_copy", False):
        return
    where = inline_closurecall.__file__
    held: dict = {"frame": None, "memo": None}

    def __deepcopy__(self, memo):
        frame = sys._getframe(2)  # 0: here, 1: copy.deepcopy, 2: whoever asked for the copy
        if frame.f_code.co_name == "copy_ir" and frame.f_code.co_filename == where:
            if held["frame"] is not frame:
                held["frame"], held["memo"] = frame, {}
            memo = held["memo"]
        got = memo.get(id(self))
        if got is not None:
            return got
        new = ir.Block.__new__(ir.Block)
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            setattr(new, name, copy.deepcopy(value, memo))
        return new

    ir.Block.__deepcopy__ = __deepcopy__
    ir.Block.opweave_shared_copy = True


def _compare_flags_by_their_settings():
    """Two compile configurations (numba's TargetConfig: its Flags) of one type with the same
    options set are equal without listing all their options. Numba's typing keys every
    overload it has built by the flags in force and compares them on each lookup: 133,000
    comparisons in a cold --gpus h100 plan at 7.7 us each (both sides' 22 options, each read
    through a property), about 1 s. Same type and same settings imply the same values, defaults
    included, so the answer is unchanged; any other pair is compared by numba's own rule."""
    from numba.core import targetconfig

    cls = targetconfig.TargetConfig
    if getattr(cls.__eq__, "opweave_settings", False):
        return
    full = cls.__eq__

    def __eq__(self, other):
        if type(self) is type(other) and self._values == other._values:
            return True
        return full(self, other)

    __eq__.opweave_settings = True
    cls.__eq__ = __eq__  # assigned after the class is made: its __hash__ stays numba's


def _load_without_refresh():
    """Load a cached kernel of ours after starting only what its machine code links against (the
    reference-counting runtime, `rtsys.initialize`), not numba's every lowering and typing
    registry. Numba refreshes its contexts before every cache load: on the first, in each
    process, that imports and installs all of them (0.3 s of `--gpus h100`'s 0.41 s pre-floor,
    warm: the registries' imports 0.21 s, the typing context 0.11 s), though loading machine
    code types and lowers nothing. A compile still refreshes them (numba's compiler does so
    itself), and a load outside our kernels keeps numba's own path."""
    from numba.core import caching

    cls = caching.Cache
    if getattr(cls.load_overload, "opweave_light", False):
        return
    full = cls.load_overload

    def load_overload(self, sig, target_context):
        if not _OPT_STACK:
            return full(self, sig, target_context)
        from numba.core.runtime import rtsys

        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)

    load_overload.opweave_light = True
    cls.load_overload = load_overload


def _give_pass_builders_our_level():
    from numba.core import codegen

    build = codegen.CPUCodegen._pass_builder
    if getattr(build, "opweave_level", False):
        return

    def _pass_builder(self, **kwargs):
        if _OPT_STACK and "opt" not in kwargs:
            kwargs["opt"] = _OPT_STACK[-1]
        return build(self, **kwargs)

    _pass_builder.opweave_level = True
    codegen.CPUCodegen._pass_builder = _pass_builder


def _restamp(dispatcher):
    """Validate a kernel's cache with `source_stamp` of its module: numba stamps an index with the
    SHA-256 of the kernel's own file only, yet a kernel's machine code has every callee, rule and
    constant it reaches through other modules compiled in. An edit to bounds.py alone left
    walk.py's cached search (the template floor inlined) running the old floor until its cache
    was deleted; a checkout, pull or upgrade that changes only a callee did the same."""
    cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    if cache_file is not None and hasattr(cache_file, "_source_stamp"):
        cache_file._source_stamp = _stamp(Path(dispatcher.py_func.__code__.co_filename).resolve())
    return dispatcher


@lru_cache(maxsize=None)
def _stamp(module_file: Path) -> bytes:
    return source_stamp(module_file)


def source_stamp(module_file: str | os.PathLike) -> bytes:
    """SHA-256 over a module's source and that of every module of its package it imports, directly
    or not (`from opweave_planner.x import y` and `import opweave_planner.x` anywhere in the file,
    function bodies included): what numba may compile into its kernels. Files in path order."""
    return _digest(*source_files(module_file))


def _digest(root: Path | None, files: list[Path]) -> bytes:
    """`source_stamp` of the files `source_files` names."""
    if root is None:
        return hashlib.sha256(files[0].read_bytes()).digest()
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.digest()


def source_files(module_file: str | os.PathLike) -> tuple[Path | None, list[Path]]:
    """(the folder holding the package, the files `source_stamp` reads, sorted); (None, [the file])
    for a module outside the package."""
    module_file = Path(module_file).resolve()
    root = _package_root(module_file)
    if root is None:
        return None, [module_file]
    seen, todo = {module_file}, [module_file]
    while todo:
        for dep in _imported_files(todo.pop(), root):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return root, sorted(seen)


def _package_root(module_file: Path) -> Path | None:
    """The folder holding the `opweave_planner` package that `module_file` is part of."""
    for parent in module_file.parents:
        if parent.name == "opweave_planner" and (parent / "jit.py").is_file():
            return parent.parent
    return None


_FROM = re.compile(r"\bfrom\s+(opweave_planner(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n#]*)")
_IMPORT = re.compile(r"\bimport\s+(opweave_planner(?:\.\w+)+)")


@lru_cache(maxsize=None)
def _imported_files(module_file: Path, root: Path) -> tuple[Path, ...]:
    """The package's source files `module_file` imports (a name imported from a package may be one
    of its modules). Read by pattern, not parsed (a few ms for the package, where ast took 70): a
    match in a docstring only adds a file, which can only make a stale cache less likely."""
    text = module_file.read_text(encoding="utf-8")
    names = _IMPORT.findall(text)
    for module, imported in _FROM.findall(text):
        names.append(module)
        names += [f"{module}.{n}" for n in re.findall(r"\w+", imported) if n != "as"]
    out = []
    for name in names:
        base = root.joinpath(*name.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                out.append(path.resolve())
    return tuple(out)


def _tolerate_stale_index(dispatcher):
    """Read an on-disk index numba cannot unpickle as an empty one. Numba unpickles a kernel's
    index before it checks the index is fresh, so an index that names a class since moved or
    renamed (a Problem part, a Scratch) raised ModuleNotFoundError inside the first call instead
    of recompiling (and rewriting the index); upgrading over a warm cache did exactly that."""
    cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    load = getattr(cache_file, "_load_index", None)
    if load is None:  # NUMBA_DISABLE_JIT, or a numba without these internals: its own behaviour
        return dispatcher

    def load_index():
        try:
            return load()
        except Exception:  # whatever the unpickling raised, the index is unusable
            return {}

    cache_file._load_index = load_index
    return dispatcher


def entry(fn: Callable | None = None, *, inline: bool = False):
    """A kernel Python calls: `@entry` or `@entry(inline=True)`."""
    return _decorator(fn, options("entry", inline=inline))


def kernel(fn: Callable | None = None, *, inline: bool = False, refcount: bool = True):
    """A kernel only kernels call (no CPython wrapper): `@kernel`, `@kernel(inline=True)`,
    `@kernel(refcount=False)`."""
    return _decorator(fn, options("kernel", inline=inline, refcount=refcount))


def shared(fn: Callable) -> Callable:
    """Let kernels call the plain-Python rule `fn` (compiled into each caller); returns `fn`."""
    from numba.extending import register_jitable

    return register_jitable(fn)


#: Decorator names that make a cached kernel (the cache check and the architecture test read them).
DECORATORS = (entry.__name__, kernel.__name__)


# --------------------------------------------------------------------------- the kernels' kinds

def decorator_kind(dec: ast.expr) -> dict | None:
    """{'kind', 'inline', 'refcount'} of a decorator of ours (`@entry`, `@kernel(...)`, also as
    `jit.entry`), or None."""
    target = dec.func if isinstance(dec, ast.Call) else dec
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    if name not in DECORATORS:
        return None
    kw = {k.arg: k.value.value for k in getattr(dec, "keywords", ()) if isinstance(k.value, ast.Constant)}
    return {"kind": name, "inline": bool(kw.get("inline", False)), "refcount": bool(kw.get("refcount", True))}


def kernels_of(source: str) -> dict[str, dict]:
    """name -> kind of every top-level kernel a module defines with our decorators."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            kinds = [k for k in map(decorator_kind, node.decorator_list) if k]
            if kinds:
                out[node.name] = kinds[0]
    return out


def kernel_modules(root: Path = PACKAGE) -> list[str]:
    """Every module of the package that defines a kernel (relative paths)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                  if "jit" in p.read_text() and kernels_of(p.read_text()))


# --------------------------------------------------------------------------- numba's on-disk cache,
# read without importing numba

def kernel_files(names: Iterable[str] = PLAN_KERNELS) -> list[Path]:
    return [PACKAGE / n for n in names]


def _cached_functions(source: str) -> list[tuple[str, int]]:
    """(qualname, first line) of every function decorated by one of ours or by
    ``@njit(cache=True, ...)``/``@jit(cache=True, ...)``."""
    out: list[tuple[str, int]] = []

    def cached(dec: ast.expr) -> bool:
        if decorator_kind(dec):
            return True
        if not isinstance(dec, ast.Call):
            return False
        f = dec.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        return name in ("njit", "jit", "generated_jit", "vectorize", "guvectorize") and any(
            k.arg == "cache" and isinstance(k.value, ast.Constant) and k.value.value is True
            for k in dec.keywords)

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(map(cached, node.decorator_list)):
                out.append((prefix + node.name, node.decorator_list[0].lineno))
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(ast.parse(source).body, "")
    return out


def _user_cache_root(environ) -> Path:
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "numba"
    base = environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "numba"


def _subpath(module_file: str) -> str:
    folder = os.path.dirname(os.path.abspath(module_file))
    return "_".join([os.path.split(folder)[-1], hashlib.sha1(folder.encode()).hexdigest()])


def numba_cache_dir(module_file: str | os.PathLike, environ=None) -> Path:
    """Where numba caches ``module_file``'s functions: NUMBA_CACHE_DIR/<dir>_<sha1>, else a
    writable ``__pycache__`` next to it, else the user-wide cache (~/.cache/numba/<dir>_<sha1>)."""
    environ = os.environ if environ is None else environ
    module_file = os.fspath(module_file)
    if environ.get("NUMBA_CACHE_DIR"):
        return Path(environ["NUMBA_CACHE_DIR"]) / _subpath(module_file)
    in_tree = Path(os.path.dirname(os.path.abspath(module_file))) / "__pycache__"
    probe = in_tree if in_tree.exists() else in_tree.parent
    if os.access(probe, os.W_OK | os.X_OK):
        return in_tree
    return _user_cache_root(environ) / _subpath(module_file)


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):  # the index header is a plain str; refuse anything else
        raise pickle.UnpicklingError("unexpected object in a numba index header")


def _numba_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("numba")
    except metadata.PackageNotFoundError:
        return None


def _index_is_fresh(index: Path, version: str | None, digest: bytes, src_mtime: float) -> bool:
    try:
        stream = io.BytesIO(index.read_bytes())
        header = _NoGlobals(stream).load()
        rest = stream.read()
        mtime = index.stat().st_mtime
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError):
        return False
    return header == version and (digest in rest or mtime >= src_mtime)


def numba_cache_is_warm(module_file: str | os.PathLike, environ=None,
                        functions: Iterable[str] | None = None) -> bool:
    """Whether numba will load ``module_file``'s kernels from its cache instead of compiling.

    An index (``*.nbi``) is fresh when the installed numba wrote it for this source (its
    `source_stamp` is in the index, as `_restamp` makes numba >= 0.6x stamp it; older numba stamps
    mtime, so an index newer than every file `source_files` names counts). Warm: every one of ``functions`` (qualnames) has
    a fresh index, or, by default, at least one cached function does; functions a
    command never calls never get an index, and after a source edit the ones it calls are
    rewritten first. Never imports numba.
    """
    module_file = Path(module_file)
    try:
        source = module_file.read_bytes()
        cached = _cached_functions(source.decode("utf-8"))
        root, files = source_files(module_file)
        src_mtime = max(f.stat().st_mtime for f in files)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False
    if functions is not None:
        wanted = set(functions)
        cached = [(q, ln) for q, ln in cached if q in wanted]
        if len(cached) < len(wanted):
            return False  # a name that is not a cached function of this module
    if not cached:
        return True
    version = _numba_version()
    folder = numba_cache_dir(module_file, environ)
    digest = _digest(root, files)
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"
    fresh = [_index_is_fresh(folder / f"{module_file.stem}.{q}-{ln}.{tag}.nbi", version, digest, src_mtime)
             for q, ln in cached]
    return all(fresh) if functions is not None else any(fresh)


def kernels_cache_is_warm(names: Iterable[str] = PLAN_KERNELS, environ=None) -> bool:
    """`numba_cache_is_warm` over the plan search's kernel modules (some function of each)."""
    return all(numba_cache_is_warm(f, environ) for f in kernel_files(names))


def cold_parts(parts: Iterable[str], environ=None) -> list[str]:
    """The parts (keys of ENTRIES) some of whose entry kernels are not cached: what will compile."""
    return [part for part in parts
            if not all(numba_cache_is_warm(PACKAGE / rel, environ, functions=names)
                       for rel, names in ENTRIES[part].items())]
