"""Fuzz the input paths and regen's output folder (issue 25): special files, link chains and
odd spellings in every path argument, and every state regen's cache record, plan files and
neighbours can be in. Every run ends with a documented exit code and no traceback; a refusal
is one line naming the flag and the real reason; nothing blocks; nothing outside --out is
touched; nothing raw reaches the terminal.

Budgets scale with the hypothesis profile (conftest.budget): the default `ci` profile keeps
this file near 30 s on 2 cores, `--hypothesis-profile=long` runs 10x as many examples.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import orjson
import pytest
from conftest import budget, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from test_input_paths import ARGS, REASONS, make, run_bounded

from opweave_planner import regen as regen_mod
from opweave_planner.regen import CACHE_FILE

CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]")  # anything but \t and \n


def _no_raw_controls(ran) -> None:
    for text in (ran.out, ran.err):
        assert not CONTROLS.search(text), repr(text[:400])


# --------------------------------------------------------------------------- path arguments

# the final thing a path leads to, and the reason the line must give
FINALS = {
    "folder": REASONS["folder"], "fifo": REASONS["fifo"], "dev-zero": REASONS["dev-zero"],
    "dev-null": REASONS["dev-zero"], "socket": r"\(a socket\)", "dangling": r"is a symlink to '[^']*', which does "
    r"not exist", "loop": REASONS["loop"], "missing": REASONS["missing"],
    "under a file": r"a part of the path is a file, not a folder", "long name": r"a name in the path is \d+ bytes",
}
FOLDER_FINALS = {**FINALS, "folder": None, "file": REASONS["file"]}  # for a path that names a folder
# what each argument's own reader is not yet asked to say (test_input_paths' xfail lists); a matrix
# names a workload by its name beside the matrix, so only kinds that can sit there are drawn
SKIP = {arg: set(xfails) for arg, (_f, _a, _k, xfails, _r) in ARGS.items()}
SKIP["matrix workloads"] = {"dev-zero", "dev-null", "socket", "under a file", "long name"}


def _build(final: str, folder: Path, hops: int, name: str) -> tuple[Path, list[Path]]:
    """A path leading (through `hops` symlinks) to `final`; returns it and the FIFOs made."""
    if final == "under a file":
        (folder / "afile").write_text("x")
        return folder / "afile" / name, []  # no link can lead under a file
    if final == "long name":
        return folder / ("n" * 300), []
    target = make(final, folder, f"{name}-end")
    fifos = [target] if final == "fifo" else []
    path = target
    for i in range(hops):
        link = folder / f"{name}-hop{i}"
        link.symlink_to(path)
        path = link
    return path, fifos


@st.composite
def path_cases(draw):
    arg = draw(st.sampled_from(sorted(ARGS)))
    finals = FOLDER_FINALS if ARGS[arg][2][0] == "file" else FINALS
    final = draw(st.sampled_from(sorted(k for k, v in finals.items() if v is not None and k not in SKIP[arg])))
    hops = 0 if final in ("missing", "under a file", "long name") else draw(st.integers(0, 3))
    name = draw(st.sampled_from(["input", "in put", "in\x1b[31mput", "ünï", "-input", "in\nput"]))
    return arg, final, hops, name


@settings(max_examples=budget(0.7))
@given(case=path_cases())
def test_special_files_in_any_path_argument(case):
    arg, final, hops, name = case
    flag, argv, kinds, _x, reasons = ARGS[arg]
    finals = FOLDER_FINALS if kinds[0] == "file" else FINALS
    if arg == "matrix workloads" and final == "missing":
        name = "input"  # the matrix writes the name into TOML as is
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if (arg.startswith("matrix") or arg == "--model") and not name.isprintable():
            name = "input"  # a TOML string cannot hold a raw control character; --model refuses one
        path, fifos = _build(final, folder, hops, name)
        ran = run_bounded(*argv(path), fifos=tuple(fifos))
        assert "Traceback" not in ran.err and ran.code == 2, (ran.code, ran.err)
        assert len(ran.lines) == 1 and ran.lines[0].startswith("error: "), ran.err
        _no_raw_controls(ran)
        line = ran.lines[0]
        assert flag in line, line
        reason = reasons.get(final, finals[final])
        assert re.search(reason, line), (reason, line)
        if final == "dangling":
            assert "nowhere" in line, line  # the link that is missing, at the end of the chain
        assert not (folder / "out").exists()


# --------------------------------------------------------------------------- regen's folder

ENTRY = ('[[entry]]\nmodels = ["llama-3.1-8b"]\ncontexts = ["8k"]\nslos = ["60ms"]\ngpus = ["h100"]\n'
         'policies = ["colocated"]\nmax_owners = 1\nbatches = [8, 16]\n')
NAME = "llama-3.1-8b_ctx8k_slo60ms_h100_colocated.json"
VICTIM = b"outside --out\n"


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> dict[str, bytes]:
    """What a real regen wrote once: the plan file and its cache record."""
    root = tmp_path_factory.mktemp("planned")
    (root / "m.toml").write_text(ENTRY)
    assert run_cli("regen", "--matrix", root / "m.toml", "--out", root / "plans", "-q").code == 1
    return {p.name: p.read_bytes() for p in (root / "plans").iterdir()}


HOSTILE = st.sampled_from(["\x1b[2J\x1b[31mEVIL", "a\nb\r\nc", "\u202egnp.exe", "\x9b31m", "\x00\x07", "x" * 5000,
                           "ok"])
JSON_ANY = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers(-10**18, 10**18)
                        | st.text(max_size=20) | HOSTILE,
                        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                                    max_size=4), max_leaves=12)


@st.composite
def cache_contents(draw, good: bytes):
    kind = draw(st.sampled_from(["tampered", "tampered", "bytes", "json", "nested", "valid"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "json":
        return orjson.dumps(draw(JSON_ANY))
    if kind == "nested":
        return draw(st.sampled_from([b"[", b'{"a":'])) * draw(st.integers(500, 50_000))
    record = orjson.loads(good)
    if kind == "tampered":
        fields = draw(st.dictionaries(st.sampled_from(["note", "premium_pct", "kept", "fingerprint", "sha256"]),
                                      JSON_ANY | HOSTILE, max_size=3))
        record[NAME] = {**record[NAME], **fields}
    return orjson.dumps(record)


SPECIALS = ["link out", "link in", "loop", "dangling", "fifo", "folder", "dev-zero"]


def _place(path: Path, state: str, victim: Path) -> None:
    if state == "link out":
        path.symlink_to(victim)
    elif state == "link in":
        (path.parent / f"{path.name}.real").write_bytes(b"{}")
        path.symlink_to(f"{path.name}.real")
    elif state == "loop":
        path.symlink_to(path.name)
    elif state == "dangling":
        path.symlink_to(victim.parent / "gone")
    elif state == "fifo":
        os.mkfifo(path)
    elif state == "folder":
        path.mkdir()
    elif state == "dev-zero":
        path.symlink_to("/dev/zero")


@st.composite
def regen_states(draw):
    return {"cache": draw(st.sampled_from(["absent", "file", "file", "file", *SPECIALS])),
            "entry": draw(st.sampled_from(["absent", "plan", "plan", "garbage", *SPECIALS])),
            "stale": draw(st.lists(st.sampled_from(["link out", "fifo", "dev-zero", "plan", "loop"]), max_size=2)),
            "prune": draw(st.booleans()), "json": draw(st.booleans()), "data": draw(st.data())}


@settings(max_examples=budget(0.6))
@given(state=regen_states())
def test_regen_cache_and_folder_states(planned, state):
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        root = Path(tmp)
        mp.setattr(regen_mod, "run_task", lambda task: planned[NAME])  # planning is not under test
        (root / "m.toml").write_text(ENTRY)
        victim = root / "outside" / "victim"
        victim.parent.mkdir()
        victim.write_bytes(VICTIM)
        out = root / "plans"
        out.mkdir()
        fifos = []
        cache, entry = out / CACHE_FILE, out / NAME
        if state["cache"] == "file":
            cache.write_bytes(state["data"].draw(cache_contents(planned[CACHE_FILE])))
        elif state["cache"] != "absent":
            _place(cache, state["cache"], victim)
        if state["entry"] == "plan":
            entry.write_bytes(planned[NAME])
        elif state["entry"] == "garbage":
            entry.write_bytes(b"\x1b[31m not a plan")
        elif state["entry"] != "absent":
            _place(entry, state["entry"], victim)
        for i, stale in enumerate(state["stale"]):
            path = out / f"stale{i}.json"
            if stale == "plan":
                path.write_bytes(planned[NAME])
            else:
                _place(path, stale, victim)
        fifos = [p for p in out.iterdir() if p.is_fifo()]
        argv = ["regen", "--matrix", root / "m.toml", "--out", out, "-q"]
        argv += ["--prune"] if state["prune"] else []
        argv += ["--json"] if state["json"] else []
        ran = run_bounded(*argv, fifos=tuple(fifos))

        assert "Traceback" not in ran.err and ran.code in (0, 1, 2), (ran.code, ran.err)
        _no_raw_controls(ran)
        assert victim.read_bytes() == VICTIM and sorted(os.listdir(victim.parent)) == ["victim"]
        bad_cache = state["cache"] in SPECIALS
        bad_entry = state["entry"] in SPECIALS
        if bad_cache or bad_entry:
            assert ran.code == 2 and len(ran.lines) == 1, ran.err
            assert "--out" in ran.lines[0] and (CACHE_FILE if bad_cache else f"entry {NAME}") in ran.lines[0]
            return
        assert ran.code in (0, 1) and not ran.lines, ran.err
        for path in (cache, entry):  # plain files inside --out, never links
            assert path.is_file() and not path.is_symlink()
        assert entry.read_bytes() == planned[NAME]
        assert NAME in orjson.loads(cache.read_bytes())
        for i, stale in enumerate(state["stale"]):
            path = out / f"stale{i}.json"
            if stale == "plan":
                assert path.exists() != state["prune"]
            else:
                assert os.path.lexists(path)  # not ours: never pruned, never followed
        assert not any(p.name.endswith(".tmp") for p in out.iterdir())
