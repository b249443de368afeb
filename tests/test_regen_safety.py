"""`regen` cannot be turned against the runner (issue 25): its cache record and plan files are
checked up front and never written through a link, a tampered record never reaches the
terminal raw, and workers die with their parent whatever signal ends it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest
from conftest import assert_one_line_error, run_cli

from opweave_planner import regen as regen_mod
from opweave_planner.regen import CACHE_FILE

ENTRY = ('[[entry]]\nmodels = ["llama-3.1-8b"]\ncontexts = ["8k"]\nslos = ["60ms"]\ngpus = ["h100"]\n'
         'policies = ["colocated"]\nmax_owners = 1\nbatches = [8, 16]\n')
NAME = "llama-3.1-8b_ctx8k_slo60ms_h100_colocated.json"
VICTIM = b"a file outside --out that regen must never touch\n"


@pytest.fixture
def matrix(tmp_path) -> Path:
    m = tmp_path / "m.toml"
    m.write_text(ENTRY)
    return m


@pytest.fixture
def victim(tmp_path) -> Path:
    v = tmp_path / "outside" / "victim"
    v.parent.mkdir()
    v.write_bytes(VICTIM)
    return v


@pytest.fixture
def no_plan(monkeypatch):
    """Fail if an entry is planned: the bad path must be reported before any work."""
    def boom(*a, **kw):
        raise AssertionError("planned before the bad path was reported")

    monkeypatch.setattr(regen_mod, "run_task", boom)
    monkeypatch.setattr(regen_mod, "run_job", boom)


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> Path:
    """A folder regen has filled once (the plan file and its cache record)."""
    root = tmp_path_factory.mktemp("planned")
    (root / "m.toml").write_text(ENTRY)
    ran = run_cli("regen", "--matrix", root / "m.toml", "--out", root / "plans", "-q")
    assert ran.code == 1, ran.err
    return root / "plans"


def _copy(planned: Path, tmp_path: Path, matrix: Path) -> Path:
    out = tmp_path / "plans"
    out.mkdir()
    for p in planned.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    return out


def _regen(matrix: Path, out: Path, *extra: str):
    return run_cli("regen", "--matrix", matrix, "--out", out, "-q", *extra)


def _no_raw_controls(text: str) -> None:
    for line in text.splitlines():
        assert not any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f or 0x202a <= ord(c) <= 0x202e for c in line), line


# --------------------------------------------------------------------------- the cache record

def _cache_states(out: Path, victim: Path) -> dict:
    def folder():
        (out / CACHE_FILE).mkdir()

    def link_out():
        (out / CACHE_FILE).symlink_to(victim)

    def link_in():
        (out / "mine").write_text("{}")
        (out / CACHE_FILE).symlink_to("mine")

    def loop():
        (out / CACHE_FILE).symlink_to(CACHE_FILE)

    def dangling():
        (out / CACHE_FILE).symlink_to(victim.parent / "nothing-here")

    def fifo():
        os.mkfifo(out / CACHE_FILE)

    return {"folder": (folder, "is not a file (it is a folder"), "link out of --out": (link_out, "is a symlink"),
            "link inside --out": (link_in, "is a symlink"), "link loop": (loop, "is a symlink"),
            "dangling link": (dangling, "is a symlink"), "fifo": (fifo, "is not a file (a FIFO")}


@pytest.mark.parametrize("state", ["folder", "link out of --out", "link inside --out", "link loop",
                                   "dangling link", "fifo"])
def test_an_unusable_cache_path_fails_before_planning(matrix, tmp_path, victim, no_plan, state):
    out = tmp_path / "plans"
    out.mkdir()
    make, reason = _cache_states(out, victim)[state]
    make()
    start = time.perf_counter()
    line = assert_one_line_error(_regen(matrix, out), 2, "--out", CACHE_FILE, reason)
    assert time.perf_counter() - start < 30  # a FIFO is never opened
    assert "\n" not in line
    assert victim.read_bytes() == VICTIM
    assert not (out / NAME).exists()
    assert os.path.lexists(out / CACHE_FILE)  # left as it was: the user decides


def test_an_unwritable_cache_fails_before_planning(matrix, tmp_path, monkeypatch, no_plan):
    out = tmp_path / "plans"
    out.mkdir()
    cache = out / CACHE_FILE
    cache.write_text("{}")
    real = os.access  # tests run as root, where access(2) ignores the mode bits
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if os.fspath(p) == str(cache)
                        and mode & os.W_OK else real(p, mode, **kw))
    assert_one_line_error(_regen(matrix, out), 2, "--out", CACHE_FILE, "permission denied")


def test_a_tampered_note_never_reaches_the_terminal_raw(planned, tmp_path, matrix, no_plan):
    out = _copy(planned, tmp_path, matrix)
    cache = orjson.loads((out / CACHE_FILE).read_bytes())
    evil = "\x1b[2J\x1b[31mEVIL\nsecond line\r\x07\u202egnp.exe\x9b31m"
    cache[NAME].update(note=evil, premium_pct="12 %", kept="yes")
    (out / CACHE_FILE).write_bytes(orjson.dumps(cache))
    for extra in ((), ("--json",)):
        ran = run_cli("regen", "--matrix", matrix, "--out", out, *extra)  # per-entry lines on stderr too
        assert ran.code == 0, ran.err  # the record still matches: not re-planned, nothing written
        _no_raw_controls(ran.out)
        _no_raw_controls(ran.err)
        assert "\\x1b[31mEVIL\\nsecond line" in ran.out + ran.err
    report = regen_mod.regen(matrix, out)
    f = report.files[0]
    assert f.kept is False and f.premium_pct is None and "\x1b" not in f.note


@pytest.mark.parametrize("content", [b"\xff\xfe garbage \x00\x1b[31m", b"[" * 200_000, b'{"a": ' * 5000,
                                     b'"a string"', b"[1, 2]", b'{"%s": 7}' % NAME.encode(),
                                     b'{"%s": {"fingerprint": 1, "sha256": []}}' % NAME.encode()])
def test_an_unreadable_record_replans_and_is_rewritten(planned, tmp_path, matrix, content):
    out = _copy(planned, tmp_path, matrix)
    before = (out / NAME).read_bytes()
    (out / CACHE_FILE).write_bytes(content)
    ran = _regen(matrix, out)
    assert ran.code == 0 and not ran.lines, ran.err  # re-planned: the same bytes, nothing changed
    assert (out / NAME).read_bytes() == before
    assert NAME in orjson.loads((out / CACHE_FILE).read_bytes())


def test_a_huge_record_is_not_read(planned, tmp_path, matrix):
    out = _copy(planned, tmp_path, matrix)
    with open(out / CACHE_FILE, "wb") as fh:
        fh.truncate(regen_mod.MAX_OWN_BYTES + 1)  # sparse: costs no disk
    ran = _regen(matrix, out)
    assert ran.code == 0, ran.err
    assert (out / CACHE_FILE).stat().st_size < 1 << 20


# --------------------------------------------------------------------------- plan files

@pytest.mark.parametrize("kind", ["link out", "link in", "fifo", "folder"])
def test_an_entry_that_is_not_a_plain_file_fails_before_planning(matrix, tmp_path, victim, no_plan, kind):
    """A pull request adding plans/x.json -> /etc/passwd must not make CI overwrite it."""
    out = tmp_path / "plans"
    out.mkdir()
    entry = out / NAME
    if kind == "link out":
        entry.symlink_to(victim)
    elif kind == "link in":
        (out / "elsewhere.json").write_text("{}")
        entry.symlink_to("elsewhere.json")
    elif kind == "fifo":
        os.mkfifo(entry)
    else:
        entry.mkdir()
    reason = "is a symlink" if kind.startswith("link") else "is not a file"
    line = assert_one_line_error(_regen(matrix, out), 2, "--out", f"entry {NAME}", reason)
    if kind == "link out":
        assert str(victim) in line
    assert victim.read_bytes() == VICTIM
    assert not (out / CACHE_FILE).exists()


def test_a_link_planted_during_the_run_is_replaced_not_followed(tmp_path, victim):
    out = tmp_path / "plans"
    out.mkdir()
    link = out / NAME
    link.symlink_to(victim)
    regen_mod._write_own(link, b"{}\n")
    assert not link.is_symlink() and link.read_bytes() == b"{}\n"
    assert victim.read_bytes() == VICTIM


def test_stale_links_and_special_files_are_neither_read_nor_pruned(planned, tmp_path, matrix, victim):
    out = _copy(planned, tmp_path, matrix)
    plan = out / NAME
    victim.write_bytes(plan.read_bytes())  # a plan, so a followed link would be reported and pruned
    (out / "old.json").symlink_to(victim)
    os.mkfifo(out / "pipe.json")
    (out / "zero.json").symlink_to("/dev/zero")
    start = time.perf_counter()
    ran = _regen(matrix, out, "--prune")
    assert time.perf_counter() - start < 60
    assert ran.code == 0, ran.err
    assert "old.json" not in ran.out and (out / "old.json").is_symlink() and victim.exists()


@pytest.mark.parametrize("kind", ["file", "fifo", "dangling", "loop", "under a file"])
def test_a_bad_out_fails_before_planning(matrix, tmp_path, no_plan, kind):
    out = tmp_path / "o"
    if kind == "file":
        out.write_text("x")
    elif kind == "fifo":
        os.mkfifo(out)
    elif kind == "dangling":
        out.symlink_to(tmp_path / "nowhere")
    elif kind == "loop":
        out.symlink_to(out)
    else:
        (tmp_path / "afile").write_text("x")
        out = tmp_path / "afile" / "o"
    reason = {"file": "is not a folder (a regular file)", "fifo": "is not a folder (a FIFO)",
              "dangling": "is a symlink to", "loop": "symlink loop", "under a file": "not a folder"}[kind]
    assert_one_line_error(_regen(matrix, out), 2, "--out", reason)


def test_matrix_strings_in_errors_are_printable(tmp_path):
    m = tmp_path / "m.toml"
    m.write_text('"\\u001b[31mzzz" = 1\n' + ENTRY.replace('"llama-3.1-8b"', '"\\u001b]0;pwned\\u0007"'))
    line = assert_one_line_error(_regen(m, tmp_path / "o"), 2)
    assert "\x1b" not in line and "\\x1b" in line
    m.write_text(ENTRY.replace('"llama-3.1-8b"', '"llama\\u001b[2J"'))
    line = assert_one_line_error(_regen(m, tmp_path / "o"), 2)
    assert "\x1b" not in line


# --------------------------------------------------------------------------- workers and signals

def _children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (from /proc; zombies do not count)."""
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != b"Z":
            kids.append(int(d))
    return kids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


SLOW_REGEN = textwrap.dedent("""
    import sys, time
    import opweave_planner.regen as regen

    def run_task(task):  # an entry that takes a minute (picklable by name from __main__)
        time.sleep(60)

    regen.run_task = run_task
    from opweave_planner.cli.main import run
    sys.argv = ["opweave-plan", "regen", "--matrix", sys.argv[1], "--out", sys.argv[2], "--jobs", "2", "-q"]
    run()
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; prctl is Linux-only")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_workers_die_with_their_parent_on_any_signal(tmp_path, sig):
    m = tmp_path / "m.toml"
    m.write_text(ENTRY.replace('slos = ["60ms"]', 'slos = ["60ms", "50ms", "40ms"]'))
    proc = subprocess.Popen([sys.executable, "-c", SLOW_REGEN, str(m), str(tmp_path / "o")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(kids := _children(proc.pid)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "no workers started"
            time.sleep(0.1)
        time.sleep(0.5)  # the initializers have run (the tasks are sleeping)
        proc.send_signal(sig)
        proc.wait(30)
        deadline = time.monotonic() + 5
        while any(_alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [k for k in kids if _alive(k)]
        assert not left, f"workers {left} outlived their parent ({sig.name})"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for k in _children(proc.pid):
            os.kill(k, signal.SIGKILL)


def test_a_worker_whose_parent_is_already_gone_exits_at_once(tmp_path):
    """The getppid race: the parent died before the initializer set PR_SET_PDEATHSIG."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    code = ("from opweave_planner.procs import die_with_parent\n"
            f"die_with_parent({gone.pid})\nprint('still running')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 128 + signal.SIGKILL and "still running" not in res.stdout


@pytest.mark.parametrize("setting, needle", [("network_bandwidth = 1e-300", "--network-bandwidth: expected"),
                                             ('catalog = "cat.toml"', "gpus.h100.bandwidth_gbps: expected")])
def test_an_absurd_input_fails_before_out_is_created(tmp_path, no_plan, setting, needle):
    (tmp_path / "cat.toml").write_text("[gpus.h100]\nbandwidth_gbps = 1e-300\n")
    m = tmp_path / "m.toml"
    m.write_text(f"{setting}\n{ENTRY}")
    assert_one_line_error(_regen(m, tmp_path / "o"), 2, needle)
    assert not (tmp_path / "o").exists()
