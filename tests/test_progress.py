"""Progress on stderr: periodic plain lines in logs, a final line always, the compile notice,
and numba's on-disk cache read without importing numba."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opweave_planner import jit, report
from opweave_planner.jit import numba_cache_is_warm
from opweave_planner.report import Progress, announce_compile, format_duration

SRC = str(Path(__file__).resolve().parents[1] / "src")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _lines(buf: io.StringIO) -> list[str]:
    return buf.getvalue().splitlines()


def test_plain_lines_every_tenth_and_a_final_line():
    buf, clock = io.StringIO(), Clock()
    with Progress("templates", 100, file=buf, tty=False, clock=clock) as p:
        for i in range(1, 101):
            clock.t += 0.01
            p(i, 100)
    lines = _lines(buf)
    assert len(lines) == 10  # 10%, 20%, ..., 90% and the final line
    assert lines[0].startswith("templates: 10/100 (10%), elapsed ") and "ETA " in lines[0]
    assert lines[-1] == "templates: 100/100 done in 1.0 s"


def test_plain_lines_every_interval_when_progress_is_slow():
    buf, clock = io.StringIO(), Clock()
    with Progress("simulations", 1000, file=buf, tty=False, clock=clock, interval_s=5.0) as p:
        for i in range(1, 31):  # 3% in 30 s: no 10% step, so the 5 s timer speaks
            clock.t += 1.0
            p.update(i)
    lines = _lines(buf)
    assert len(lines) == 6 + 1
    assert lines[0] == "simulations: 5/1,000 (0%), elapsed 5.0 s, ETA 16 min 35 s"
    assert lines[-1] == "simulations: 30/1,000 done in 30.0 s"


def test_unknown_total_and_stopped_by_an_exception():
    buf, clock = io.StringIO(), Clock()
    with pytest.raises(KeyboardInterrupt), Progress("entries", file=buf, tty=False, clock=clock) as p:
        clock.t += 6
        p.advance(3)
        raise KeyboardInterrupt
    assert _lines(buf) == ["entries: 3 done, elapsed 6.0 s", "entries: stopped at 3 after 6.0 s"]


def test_disabled_prints_nothing():
    buf = io.StringIO()
    with Progress("templates", 10, file=buf, tty=False, enabled=False) as p:
        p(10)
        p.log("[1/1] x: 1 USD/Mtok")
    assert buf.getvalue() == ""


def test_log_lines_reset_the_timer_but_not_the_steps():
    buf, clock = io.StringIO(), Clock()
    with Progress("regen", 270, file=buf, tty=False, clock=clock) as p:
        for i in range(1, 11):
            clock.t += 2.0
            p.advance()
            p.log(report.entry_line(i, 270, f"m{i}", 1.0, status="unchanged"))
    lines = _lines(buf)
    assert lines[:2] == ["[1/270] m1: 1 USD/Mtok (unchanged)", "[2/270] m2: 1 USD/Mtok (unchanged)"]
    assert not any("elapsed" in ln for ln in lines[:-1])  # entry lines every 2 s are enough
    assert lines[-1] == "regen: 10/270 done in 20.0 s"


def test_on_a_terminal_a_bar_replaces_the_lines_and_the_final_line_stays():
    buf = io.StringIO()
    with Progress("templates", 50, file=buf, tty=True, interval_s=0.0) as p:
        for i in range(1, 51):
            p(i)
    out = buf.getvalue()
    assert "ETA" not in out and "(10%)" not in out
    assert out.strip().splitlines()[-1].startswith("templates: 50/50 done in ")


def test_progress_default_stream_is_stderr(capsys):
    with Progress("x", 1, tty=False) as p:
        p(1)
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.startswith("x: 1/1 done in ")


@pytest.mark.parametrize("s, text", [(4.23, "4.2 s"), (185, "3 min 05 s"), (3720, "1 h 02 min")])
def test_format_duration(s, text):
    assert format_duration(s) == text


def test_announce_compile_only_when_cold(capsys):
    assert announce_compile(True) is False
    assert announce_compile(False, enabled=False) is False
    assert capsys.readouterr().err == ""
    assert announce_compile(False) is True
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "compiling" in err and "first run" in err


# --------------------------------------------------------------------------- #
# numba cache
# --------------------------------------------------------------------------- #

MODULE = textwrap.dedent('''
    import numba
    from numba import njit


    @njit(cache=True)
    def add(a, b):
        return a + b


    @numba.njit(cache=True, nogil=True)
    def mul(a, b):
        return a * b


    @njit
    def not_cached(a):
        return a


    class K:
        @staticmethod
        def plain():
            return 1
''')


def _fake_index(folder: Path, module: Path, qualname: str, line: int, version: str,
                digest: bytes | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}{sys.abiflags}"
    path = folder / f"{module.stem}.{qualname}-{line}.{tag}.nbi"
    with path.open("wb") as f:
        pickle.dump(version, f)
        f.write(pickle.dumps((digest or b"\0" * 32, {})))
    return path


@pytest.fixture
def kmod(tmp_path):
    mod = tmp_path / "pkg" / "kern.py"
    mod.parent.mkdir()
    mod.write_text(MODULE)
    return mod


def test_finds_exactly_the_cached_functions_and_their_numba_line(kmod):
    assert jit._cached_functions(kmod.read_text()) == [("add", 6), ("mul", 11)]


def test_warm_when_a_fresh_index_exists_and_every_named_one_is_fresh(kmod, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    version = jit._numba_version()
    digest = hashlib.sha256(kmod.read_bytes()).digest()
    cache = kmod.parent / "__pycache__"
    both = ("add", "mul")
    assert jit.numba_cache_dir(kmod) == cache
    assert not numba_cache_is_warm(kmod)  # first run: nothing cached
    _fake_index(cache, kmod, "add", 6, version, digest)
    assert numba_cache_is_warm(kmod)  # mul may simply never be called
    assert not numba_cache_is_warm(kmod, functions=both)
    assert not numba_cache_is_warm(kmod, functions=("add", "nope"))
    _fake_index(cache, kmod, "mul", 11, version, digest)
    assert numba_cache_is_warm(kmod, functions=both)
    _fake_index(cache, kmod, "mul", 11, "0.0.1", digest)
    assert not numba_cache_is_warm(kmod, functions=both)  # another numba version recompiles
    for name, line in (("add", 6), ("mul", 11)):  # the source changed after both were cached
        os.utime(_fake_index(cache, kmod, name, line, version, b"\1" * 32), (1, 1))
    assert not numba_cache_is_warm(kmod)


def test_numba_cache_dir_env_and_user_wide_fallback(kmod, tmp_path, monkeypatch):
    folder = os.path.dirname(os.path.abspath(kmod))
    sub = "pkg_" + hashlib.sha1(folder.encode()).hexdigest()
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "nc")}
    assert jit.numba_cache_dir(kmod, env) == tmp_path / "nc" / sub
    monkeypatch.setattr(os, "access", lambda p, m, **k: False)
    if sys.platform.startswith("linux"):
        assert jit.numba_cache_dir(kmod, {"XDG_CACHE_HOME": str(tmp_path / "xdg")}) == \
            tmp_path / "xdg" / "numba" / sub


def test_agrees_with_numba_itself(kmod, tmp_path):
    """Compile for real in a child with NUMBA_CACHE_DIR: cold before, warm after."""
    pytest.importorskip("numba")
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{kmod.parent}",
           "NUMBA_CACHE_DIR": str(tmp_path / "nc")}
    check = ("import sys; from opweave_planner.jit import numba_cache_is_warm as w; "
             f"print(w({str(kmod)!r}), 'numba' in sys.modules)")
    run = lambda code: subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                      text=True, timeout=300, check=True).stdout.split()
    assert run(check) == ["False", "False"]
    run("import kern; kern.add(1, 2); kern.mul(2.0, 3.0)")
    assert run(check) == ["True", "False"]


def test_shipped_kernel_files_exist():
    files = jit.kernel_files()
    assert files and all(f.is_file() and jit._cached_functions(f.read_text()) for f in files)


def test_search_progress_is_work_weighted_and_always_gives_its_total():
    """The callback contract (api.plan): estimated work in hundredths of a unit, done
    non-decreasing, the total on every call and never below done, shrinking only as seeds skip
    more; it ends at done == total. The first call comes after the colocated template, with the
    floors' foresight: its total is within the work a search without the floor would do."""
    from opweave_planner import api
    from opweave_planner.search.driver import SKIPPED_WORK, progress_report, template_work

    assert progress_report(100, 10000) == (100, 10000)
    assert progress_report(10000, 9000) == (10000, 10000)
    # the fitted weights (measured ratios in search/driver.py): a fixed context 16 vs 4
    # configurations 1.3-1.5x, the 33-knot workload 4.7x; owners linearly; a skipped template 0.04
    assert 1.2 < template_work(16, 3) / template_work(4, 3) < 1.6
    assert 3.5 < template_work(16, 3, knots=33) / template_work(4, 3, knots=33) < 5.0
    assert template_work(4, 3) / template_work(4, 2) == pytest.approx(1.5)
    assert template_work(16, 3, searched=False) == SKIPPED_WORK
    for gpus in ("h100,a100", "h100"):
        calls = []
        req = api.make_request("llama-3.1-8b", "60ms", "8k", gpus=gpus, max_owners=3, batches=(1, 8),
                               max_replicas=1, tensor_parallel_sizes=(1,))
        api.plan(req, progress=lambda d, t: calls.append((d, t)))
        assert len(calls) > 2 and all(t is not None and t >= d for d, t in calls)
        assert calls[-1][0] == calls[-1][1]
        assert [d for d, _ in calls] == sorted(d for d, _ in calls)
        assert [t for _, t in calls] == sorted((t for _, t in calls), reverse=True)


def test_the_foresight_never_counts_less_work_than_a_phase_then_does(monkeypatch):
    """A later phase's seed is never dearer than the one foreseen for it, so the work foreseen for
    it (at the seeds known when each earlier phase starts) is at least what it then does, the
    skipped set foreseen a subset of the one it skips; --jobs 2 reports the same calls' totals."""
    from opweave_planner import api
    from opweave_planner.compile import compile_request
    from opweave_planner.search import driver

    # its mixed phase is seeded below the colocated cost (a single-type plan is cheaper)
    ctx = compile_request(api.make_request("gemma-3-27b", "60ms", "32k", gpus="h100,a100", max_owners=3,
                                           batches=(16, 64, 256), tensor_parallel_sizes=(1, 2, 4)))
    foreseen: dict[tuple, list[int]] = {}
    done: dict[tuple, int] = {}
    real = driver._Run.phase

    def phase(self, name, ph, later):
        for lp in later or ():
            foreseen.setdefault((lp.indices, lp.only_gpu), []).append(int(self.work(lp).sum()))
            assert self.prefloor.skipped(lp) <= self.prefloor.skipped(
                driver.Phase(lp.indices, lp.seed * 0.5, lp.slo_us, lp.latency_objective, lp.only_gpu))
        done[ph.indices, ph.only_gpu] = int(self.work(ph).sum())
        return real(self, name, ph, later)

    monkeypatch.setattr(driver._Run, "phase", phase)
    totals = {}
    for jobs in (1, 2):
        calls = []
        driver.run_search(ctx, jobs=jobs, progress=lambda d, t, c=calls: c.append((d, t)))
        totals[jobs] = calls
    assert foreseen and all(done[k] <= min(v) for k, v in foreseen.items())
    assert any(done[k] < max(v) for k, v in foreseen.items())  # a seed did tighten: the total shrank
    assert totals[1][-1] == totals[2][-1] and totals[1][-1][0] == totals[1][-1][1]
    assert {t for _, t in totals[1]} == {t for _, t in totals[2]}


def test_the_eta_is_the_rate_since_the_first_report_and_waits_for_eta_after():
    """Setup before the first report (compiling, cache loading: 10 s here) is not a sample of
    the rate: the ETA reads 1 s per unit from the first report on, where the rate since the start
    would read 11 / 6 per unit; none until eta_after of the total has moved since the first."""
    buf, clock = io.StringIO(), Clock()
    with Progress("search", 100, file=buf, tty=False, clock=clock, interval_s=1.0, eta_after=0.2) as p:
        clock.t += 10.0
        p(1, 100)  # the first report: no rate yet
        for done in (11, 21, 31):
            clock.t += 10.0
            p(done, 100)
    lines = _lines(buf)
    assert lines[0].endswith("ETA estimating") and lines[1].endswith("ETA estimating")  # 0, then 10 % moved
    assert lines[2].endswith("ETA 1 min 19 s")  # 20 units in 20 s: 79 left
    assert lines[3].endswith("ETA 1 min 09 s")
    plain = io.StringIO()
    with Progress("search", 100, file=plain, tty=False, clock=Clock(), interval_s=0.0) as p:
        p(5, 100)
    assert "estimating" in plain.getvalue()  # one report is no rate, even with eta_after 0


def test_the_bar_shows_the_same_eta_as_the_lines():
    buf, clock = io.StringIO(), Clock()
    with Progress("search", 100, file=buf, tty=True, clock=clock, eta_after=0.1) as p:
        clock.t += 10.0
        p(1, 100)
        assert p._bar.tasks[0].fields["eta"] == "-:--:--"
        clock.t += 10.0
        p(21, 100)
        assert p._bar.tasks[0].fields["eta"] == "39.5 s" == f"{p.eta_seconds():.1f} s"


def test_rate_eta_counts_from_the_first_report_in_any_units():
    """regen's entry lines use it in expected-cost units: a first entry after 30 s of worker
    start-up, then 10 units a second."""
    from opweave_planner.report import RateEta

    clock = Clock()
    eta = RateEta(0.05, clock)
    assert eta.seconds() is None
    clock.t += 30.0
    eta.update(100.0, 1000.0)
    assert eta.seconds() is None  # one report: no rate
    clock.t += 1.0
    eta.update(110.0, 1000.0)
    assert eta.seconds() is None  # 1 % moved, under eta_after
    clock.t += 9.0
    eta.update(200.0, 1000.0)
    assert eta.seconds() == pytest.approx(80.0)  # 800 units at 10 per second; since the start: 2x


def test_a_kernels_cache_is_stale_when_any_module_it_imports_changes(tmp_path, monkeypatch):
    """numba stamps an index with its own file's hash; `jit.source_stamp` covers every package
    module the file imports, so an edit to bounds.py alone makes walk.py's cached search cold
    (it has the floor compiled in) and leaves a module that does not import it warm."""
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    pkg = tmp_path / "src" / "opweave_planner"
    shutil.copytree(Path(jit.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__", "_shipped"))
    walk, other = pkg / "search" / "walk.py", pkg / "latency" / "ttft.py"
    before = {f: jit.source_stamp(f) for f in (walk, other)}
    assert before[walk] != hashlib.sha256(walk.read_bytes()).digest()  # more than its own bytes
    version = jit._numba_version()
    (name, line), = [q for q in jit._cached_functions(walk.read_text()) if q[0] == "_search_fixed"]
    _fake_index(walk.parent / "__pycache__", walk, name, line, version, before[walk])
    assert numba_cache_is_warm(walk, functions=(name,))
    bounds = pkg / "search" / "bounds.py"
    bounds.write_text(bounds.read_text() + "\n# an edit\n")
    jit._imported_files.cache_clear()
    assert jit.source_stamp(walk) != before[walk]
    assert jit.source_stamp(other) == before[other]
    assert not numba_cache_is_warm(walk, functions=(name,))


def test_every_kernel_is_stamped_with_its_imports():
    pytest.importorskip("numba")
    from opweave_planner.search import walk

    stamp = walk._search_fixed._cache._cache_file._source_stamp
    assert stamp == jit.source_stamp(walk.__file__)
