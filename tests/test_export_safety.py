"""`export` writes scripts people run as root (issue 25): one regression test per root cause.

Every generated script is run with stub binaries first on `PATH` (`vllm`, `vllm-router`,
`python3`: each records its argv and exits; `python3 -` runs the real interpreter so the
benchmark's comparison runs too), with attacker payloads in every name that reaches it, and must
run only the stubs, with the hostile value arriving as one unchanged argument. Also: names are
refused where they enter, `--out` must be a folder the user could mean, only the tool's own
unchanged files are removed, and an export into an existing folder is all or nothing.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import AFD_PLAN, GOLDEN, TINY, assert_one_line_error, run_cli

from opweave_planner.errors import InternalError, UserError
from opweave_planner.export import MANIFEST, TARGETS, build, export_plan, write
from opweave_planner.export.documents import to_yaml
from opweave_planner.export.shell import Var, Word, comment, quote, shell_command

COLOCATED = GOLDEN / "llama-3.1-8b_colocated_h100.json"
MANY_STAGES = GOLDEN / "llama-3.1-8b_afd_h100+a100.json"
DISAGG = GOLDEN / "llama-3.1-8b_colocated_h100-isl7680-osl1024-ttft1s-rate8_v1.10.json"  # both pools
AUTO = GOLDEN / "llama-3.1-8b_colocated_h100-isl7680-osl1024-ttft1s-rate8-auto_v1.11.json"


def aggregated_doc() -> dict:
    """The v1.11 golden with its aggregated deployment as the mode (as --deployment-mode aggregated
    records it): the files run deployment.aggregated's replicas."""
    doc = json.loads(AUTO.read_bytes())
    doc["deployment"].update(mode="aggregated", deployment_mode="aggregated")
    return doc
STUBBED = ("vllm", "vllm-router", "python3")
_STUB = r"""#!/bin/bash
log=$(mktemp "$STUB_LOG/call.XXXXXXXX")
printf '%s\0' "${0##*/}" "$@" > "$log"
if [ "${0##*/}" = python3 ] && [ "${1-}" = - ]; then exec "$REAL_PYTHON" -I -S "$@"; fi
exit 0
"""
FAKE_RESULT = {"p50_tpot_ms": 10.0, "median_tpot_ms": 10.0, "p95_tpot_ms": 12.0, "p99_tpot_ms": 13.0,
               "p50_ttft_ms": 100.0, "median_ttft_ms": 100.0, "p95_ttft_ms": 200.0, "p99_ttft_ms": 250.0}


def payloads(marker: Path) -> list[str]:
    """What an attacker puts in a name: each would create `marker` if the shell ran it."""
    m = str(marker)
    return [f"$(touch {m})", f"`touch {m}`", f"x; touch {m}", f"x' ; touch {m}; '", f'x" ; touch {m}; "',
            f"${{IFS}}$(touch {m})", "x\\", f"x\\\n$(touch {m})", f"x\n$(touch {m})", f"x\r\n`touch {m}`",
            "$(vllm PWNED)", f"x && touch {m} #", f"--x $(touch {m})"]


class Stubs:
    """A folder of stub binaries and the environment that puts them first on PATH."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.bin = work / "stub-bin"
        self.log = work / "stub-calls"
        self.results = work / "results"
        for folder in (self.bin, self.log, self.results):
            folder.mkdir(exist_ok=True)
        for name in STUBBED:
            path = self.bin / name
            path.write_text(_STUB)
            path.chmod(0o755)
        for name in ("tpot.json", "tpot.jsonl"):
            (self.results / name).write_text(json.dumps(FAKE_RESULT) + "\n")

    def env(self) -> dict[str, str]:
        env = {"PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
               "STUB_LOG": str(self.log), "REAL_PYTHON": sys.executable, "RESULT_DIR": str(self.results),
               "HOME": str(self.work), "HEAD_ADDRESS": "10.0.0.1", "AFD_HOST": "10.0.0.1", "LC_ALL": "C.UTF-8"}
        env.update({f"NODE{n}_HOST": f"10.0.0.{n + 1}" for n in range(16)})
        return env

    def run(self, script: Path) -> tuple[list[list[str]], str]:
        """Run one script; returns the stubs' argvs (in no particular order) and its stdout."""
        for old in self.log.iterdir():
            old.unlink()
        ran = subprocess.run(["bash", str(script)], env=self.env(), cwd=self.work, capture_output=True,
                             timeout=60)
        assert ran.returncode == 0, (script.name, ran.stderr.decode(errors="replace"))
        assert b"command not found" not in ran.stderr, ran.stderr
        calls = [p.read_bytes().split(b"\0")[:-1] for p in sorted(self.log.iterdir())]
        return [[a.decode("utf-8", "surrogateescape") for a in c] for c in calls], ran.stdout.decode()


def check_scripts(folder: Path, stubs: Stubs, model_id: str | None, markers: list[Path]) -> int:
    """`bash -n` passes on every script; running each runs only the stubs, the serve and
    benchmark commands get `model_id` as one unchanged argument, and no marker appears."""
    scripts = sorted(folder.glob("*.sh"))
    for script in scripts:
        syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, timeout=30)
        assert syntax.returncode == 0, (script.name, syntax.stderr)
        assert script.stat().st_mode & 0o100
        calls, out = stubs.run(script)
        assert calls and all(c[0] in STUBBED for c in calls), calls
        routers = [c for c in calls if "router" in c[0] or any("router" in a for a in c[:3])]
        compare = [c for c in calls if c[:2] == ["python3", "-"]]
        if script.name == "benchmark.sh":
            assert len(calls) == 2 and len(compare) == 1 and "at p95" in out, (calls, out)
        else:
            assert len(calls) == 1, calls
        if model_id is not None:
            for call in calls:
                if call not in routers and call not in compare:
                    assert call.count(model_id) == 1, (model_id, call)
        for marker in markers:
            assert not marker.exists(), f"{script.name} ran an injected command"
    return len(scripts)


def _plan(tmp_path: Path, name: str = "plan.json", **changes) -> Path:
    doc = json.loads(COLOCATED.read_bytes())
    doc.update(changes)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def replicated(n: int) -> dict:
    """The colocated golden plan with its one owner replicated n times (a router from 2, node 1 at 3)."""
    doc = json.loads(COLOCATED.read_bytes())
    own = doc["owners"][0]
    own["replicas"] = n
    doc["global_batch"] = own["resident_batch"] * n
    doc["gpus_total"] = own["tensor_parallel"] * n
    return doc


def _replicated(tmp_path: Path, n: int, name: str = "replicas.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(replicated(n)))
    return path


# ----------------------------------------------------------------------------- the shell writer


def test_quote_round_trips_any_printable_string_through_bash(tmp_path):
    marker = tmp_path / "PWNED"
    words = [*(p for p in payloads(marker) if p.isprintable()), "", "'", '"', "\\", "$", "`", "!", "~",
             "*", "-", "--help", "a b", "é", "日本", "\u00e9x", "${HOME}", "$HOME", "'$(x)'"]
    text = "".join(f"printf '%s\\0' {quote(w)}\n" for w in words)
    ran = subprocess.run(["bash", "-c", text], capture_output=True, timeout=30, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.decode().split("\0")[:-1] == words
    assert not marker.exists()


def test_only_exporter_variables_expand():
    assert quote(Var("HOST")) == '"${HOST}"'
    assert quote(Word("http://", Var("NODE1_HOST", required="set NODE1_HOST"), ":8001")) == \
        '"http://${NODE1_HOST:?set NODE1_HOST}:8001"'
    assert quote(Word('{"a":"$(x)`y`\\', Var("AFD_HOST"), '"}')) == '"{\\"a\\":\\"\\$(x)\\`y\\`\\\\${AFD_HOST}\\"}"'
    assert quote("${HOST}") == "'${HOST}'"  # a string is never an expansion, whatever it says
    for bad in (("x; id",), ("HOST", "$(id)"), ("HOST", None, "`id`"), ("HOST", "a}b")):
        with pytest.raises(ValueError):
            Var(*bad)


def test_control_characters_never_reach_a_script_line():
    assert comment("a\nb\r\n\x1b[31m\u2028c") == "# a\\nb\\r\\n\\x1b[31m\\u2028c"
    for bad in ("a\nb", "a\0b", "a\rb", "\x1b", "\u2028"):
        with pytest.raises(InternalError):
            quote(bad)
        with pytest.raises(InternalError):
            shell_command(["vllm", "serve", bad])


def test_yaml_escapes_control_characters_in_keys_and_values():
    yaml = pytest.importorskip("yaml")
    doc = {"a\nb": "x\ny\u2028z\x85\x1b\ud7ff", "k: v\n- x": ["\t", "é日本", '"\\'], "on": "off", "ok": 1.5}
    text = to_yaml(doc).decode()
    assert all(line.isprintable() for line in text.splitlines())
    assert len(text.splitlines()) == 7
    assert yaml.safe_load(text) == doc


# ----------------------------------------------------------------------------- names where they enter


@pytest.mark.parametrize("model_id", ["${HOME}", "${x", "$(touch /tmp/opweave-PWNED)", "`id`", "org/m\\",
                                      "", "-x", "--help", "a\0b", "org/a\nb", "org/a\r\nb", "gpt-",
                                      "org/a--b", "org/.a", "org/a.git", "~/models/x", "org/" + "a" * 97,
                                      "/" + "a" * 5000, "x/y/z", " org/m"])
def test_model_id_must_be_a_repo_id_or_a_path(model_id, tmp_path):
    ran = run_cli("export", COLOCATED, "--to", "vllm", "--out", tmp_path / "out", "--model-id", model_id)
    line = assert_one_line_error(ran, 2, "--model-id:")
    assert line.isprintable()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model_id", ["org/name", "Qwen/Qwen3-30B-A3B", "a_b/c.d-e", "gpt2", "/models/x", "./m",
                                      "../m y", "/m/$(touch PWNED)", "/m/`id`", "/m/x'\"\\", "/日本/m"])
def test_good_model_ids_reach_every_script_as_one_unchanged_argument(model_id, tmp_path):
    stubs = Stubs(tmp_path)
    path = model_id.startswith(("/", "./", "../"))
    for target in ("vllm", "sglang", "dynamo") + (() if path else ("llm-d",)):
        out = tmp_path / target
        agg = tmp_path / "agg.json"
        agg.write_text(json.dumps(aggregated_doc()))
        # a disaggregated plan's prefill, decode, P/D router; an aggregated-mode plan's replicas
        for plan in (_replicated(tmp_path, 2), DISAGG, agg):
            ran = run_cli("export", plan, "--to", target, "--out", out, "--model-id", model_id)
            assert ran.code == 0, ran.err
            assert check_scripts(out, stubs, model_id, [tmp_path / "PWNED"]) >= 1


@pytest.mark.parametrize("name", ["m\n$(touch {m})", "m\r\n`touch {m}`", "m\x00", "m\x1b[2J", "m\u2028x"])
def test_a_plan_model_name_with_a_control_character_is_refused(name, tmp_path):
    marker = tmp_path / "PWNED"
    path = _plan(tmp_path, model=name.format(m=marker))
    for target in TARGETS:
        ran = run_cli("export", path, "--to", target, "--out", tmp_path / "out", "--model-id", "org/m")
        assert_one_line_error(ran, 2, f"{path}: model:", "control character")
    assert not (tmp_path / "out").exists() and not marker.exists()


def test_a_gpu_name_with_a_control_character_is_refused(tmp_path):
    doc = json.loads(COLOCATED.read_bytes())
    doc["owners"][0]["gpu"] = "h100\n$(id)"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    assert_one_line_error(run_cli("export", path, "--to", "vllm", "--out", tmp_path / "o"), 2,
                          "owners[0].gpu:")


def test_an_alternatives_model_name_with_a_newline_is_refused(tmp_path):
    doc = json.loads(MANY_STAGES.read_bytes())
    colocated = json.loads(COLOCATED.read_bytes())
    colocated["model"] = "llama-3.1-8b\n$(touch PWNED)"
    doc["alternatives"] = {"colocated": {"plan": colocated}}
    path = tmp_path / "alts.json"
    path.write_text(json.dumps(doc))
    ran = run_cli("export", path, "--to", "vllm", "--out", tmp_path / "out", "--alternative", "colocated")
    assert_one_line_error(ran, 2, "alternatives.colocated.model:", "control character")
    assert not (tmp_path / "out").exists()


def test_a_config_whose_file_name_holds_a_newline_makes_no_plan(tmp_path):
    folder = tmp_path / "cfg"
    folder.mkdir()
    for name in ("a\nb.json", "a\r\nb.json", "x\n$(touch PWNED)\n.json"):
        cfg = folder / name
        cfg.write_bytes((GOLDEN.parent.parent / "models" / "llama-3.1-8b.json").read_bytes())
        argv = [*TINY]
        argv[argv.index("--model") + 1] = str(cfg)
        ran = run_cli(*argv, "--out", tmp_path / "plan.json")
        assert_one_line_error(ran, 2, "--model:", "control character")
        assert not (tmp_path / "plan.json").exists()
        ran = run_cli("export", COLOCATED, "--to", "vllm", "--out", tmp_path / "o", "--model", cfg)
        assert_one_line_error(ran, 2, "--model:")


@pytest.mark.parametrize("flag,value", [("--image", "img\n- evil"), ("--node-label", "h100=a\nb")])
def test_kubernetes_names_with_control_characters_are_refused(flag, value, tmp_path):
    ran = run_cli("export", COLOCATED, "--to", "dynamo", "--out", tmp_path / "o", flag, value)
    assert_one_line_error(ran, 2, f"{flag}:")


def test_the_writer_holds_even_past_the_checks(tmp_path):
    """A hostile model name or id that got past every check still cannot add a line or a command."""
    marker = tmp_path / "PWNED"
    stubs = Stubs(tmp_path)
    for target, plan in (("vllm", _replicated(tmp_path, 3)), ("sglang", _replicated(tmp_path, 2))):
        for evil in payloads(marker):
            ctx, _ = build(str(plan), target)
            ctx.plan = ctx.plan.model_copy(update={"model": evil})
            ctx.model_id = "/m/" + evil
            if not evil.isprintable():
                with pytest.raises(InternalError):
                    TARGETS[target].render(ctx)
                ctx.model_id = "/m/x"
            files = TARGETS[target].render(ctx)
            out = tmp_path / "past" / target
            out.mkdir(parents=True, exist_ok=True)
            for name, data in files.items():
                (out / name).write_bytes(data)
                (out / name).chmod(0o755)
                if name.endswith(".sh"):
                    assert data.decode().count("\n# Generated by") == 1
            check_scripts(out, stubs, ctx.model_id, [marker])


# ----------------------------------------------------------------------------- --out


@pytest.mark.parametrize("out", ["/", "//", "/..", "/./", "", " "])
def test_out_must_be_a_folder_the_user_could_mean(out, tmp_path):
    ran = run_cli("export", COLOCATED, "--to", "vllm", "--out", out)
    assert_one_line_error(ran, 2, "--out:")
    assert not Path("/serve-replica-0.sh").exists()


def test_out_with_a_control_character_is_refused(tmp_path):
    ran = run_cli("export", COLOCATED, "--to", "vllm", "--out", tmp_path / "a\nb")
    assert_one_line_error(ran, 2, "--out:", "control character")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- what is removed


def _manifest(folder: Path, files: dict[str, str]) -> None:
    doc = json.loads((folder / MANIFEST).read_text())
    doc["files"].update(files)
    (folder / MANIFEST).write_text(json.dumps(doc))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_only_unchanged_files_the_tool_wrote_are_removed(tmp_path):
    out = tmp_path / "out"
    export_plan(str(_replicated(tmp_path, 2)), "vllm", str(out))
    assert (out / "router.sh").exists()
    (out / "router.sh").write_text("#!/bin/bash\n# my edits\n")  # changed since: kept
    (out / "notes.sh").write_text("user's")  # listed with a hash it does not have: kept
    (out / "data.txt").write_text("user's")  # not a name an exporter writes: never touched
    (out / "victim").write_text("user's")
    (tmp_path / "outside.sh").write_text("user's")
    target = out / "serve-replica-1.sh"
    _manifest(out, {"notes.sh": _sha(b"other"), "data.txt": _sha(b"user's"), "../outside.sh": _sha(b"user's"),
                    "victim": _sha(b"user's"), "/etc/passwd": "0" * 64, "x" * 300 + ".sh": "0" * 64})
    ran = run_cli("export", COLOCATED, "--to", "vllm", "--out", out)
    assert ran.code == 0, ran.err
    assert not target.exists()  # ours and unchanged: removed
    for name in ("router.sh", "notes.sh", "data.txt", "victim"):
        assert (out / name).exists(), name
    assert (tmp_path / "outside.sh").read_text() == "user's"
    notes = [ln for ln in ran.lines if ln.startswith("note:")]
    assert len(notes) == 1 and "notes.sh" in notes[0] and "router.sh" in notes[0], ran.err


def test_a_listed_link_is_kept_and_never_followed(tmp_path):
    out = tmp_path / "out"
    export_plan(str(_replicated(tmp_path, 2)), "vllm", str(out))
    (tmp_path / "precious").write_bytes((out / "router.sh").read_bytes())
    (out / "router.sh").unlink()
    (out / "router.sh").symlink_to(tmp_path / "precious")
    export_plan(str(COLOCATED), "vllm", str(out))
    assert (out / "router.sh").is_symlink() and (tmp_path / "precious").exists()


def test_a_link_in_place_of_a_file_is_replaced_not_written_through(tmp_path):
    out = tmp_path / "out"
    export_plan(str(COLOCATED), "vllm", str(out))
    (tmp_path / "precious").write_text("keep me")
    (out / "benchmark.sh").unlink()
    (out / "benchmark.sh").symlink_to(tmp_path / "precious")
    export_plan(str(COLOCATED), "vllm", str(out))
    assert (tmp_path / "precious").read_text() == "keep me"
    assert not (out / "benchmark.sh").is_symlink()


@pytest.mark.parametrize("manifest", [b"[" * 100_000, b'{"files": ' * 50_000, b"\xff\xfe", b"{}" * 2_000_000,
                                      b'{"files": {"serve-replica-0.sh": 1}}', b"null", b'{"files": []}'])
def test_an_unreadable_previous_manifest_lists_nothing(manifest, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / MANIFEST).write_bytes(manifest)
    (out / "router.sh").write_text("user's")
    ran = run_cli("export", COLOCATED, "--to", "vllm", "--out", out)
    assert ran.code == 0, ran.err
    assert (out / "router.sh").read_text() == "user's"
    assert json.loads((out / MANIFEST).read_text())["target"] == "vllm"


def test_a_fifo_previous_manifest_does_not_block(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / MANIFEST)
    ran = run_cli("export", COLOCATED, "--to", "vllm", "--out", out)
    assert ran.code == 0, ran.err
    assert (out / MANIFEST).is_file()


# ----------------------------------------------------------------------------- all or nothing


def _state(folder: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every entry's content (a link's target, '<dir>' for a folder), mode and inode."""
    def content(p: Path) -> bytes:
        return os.readlink(p).encode() if p.is_symlink() else b"<dir>" if p.is_dir() else p.read_bytes()
    return {p.name: (content(p), p.lstat().st_mode, p.lstat().st_ino) for p in folder.iterdir()}


class _Failing:
    """`real`, but its n-th call (and with `always_after` every later one) raises ENOSPC."""

    def __init__(self, real, n: int, always_after: bool = False) -> None:
        self.real, self.n, self.always_after, self.calls = real, n, always_after, 0

    def __call__(self, *a, **kw):
        self.calls += 1
        if self.calls == self.n or (self.always_after and self.calls > self.n):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.real(*a, **kw)


@pytest.fixture
def existing(tmp_path):
    """An earlier export (2 replicas: a router too) plus a user's file, and the next export's files."""
    out = tmp_path / "out"
    export_plan(str(_replicated(tmp_path, 2)), "vllm", str(out))
    (out / "my-notes.txt").write_text("mine")
    _, files = build(str(COLOCATED), "vllm")  # one replica: router.sh and serve-replica-1.sh go
    return out, files


@pytest.mark.parametrize("call,n", [(c, k) for c in ("write", "fsync", "mkdir", "link", "replace")
                                    for k in (1, 2, 3)] + [("rename", 1), ("rename", 2)])
def test_a_full_disk_into_an_existing_folder_leaves_the_old_files_exactly(existing, monkeypatch, call, n):
    out, files = existing
    before = _state(out)
    failing = _Failing(getattr(os, call), n)
    monkeypatch.setattr(os, call, failing)
    try:
        write(str(out), files)
    except UserError as exc:
        monkeypatch.undo()
        assert exc.exit_code == 2 and str(exc).startswith(f"--out: cannot write '{out}'"), str(exc)
        assert "No space left on device" in str(exc)
        assert _state(out) == before
    else:  # a hard link that failed is replaced by a rename; any other call must fail the export
        monkeypatch.undo()
        assert call == "link" or failing.calls < n, (call, failing.calls)
        assert {name: (out / name).read_bytes() for name in files} == files
        assert not (out / "router.sh").exists() and (out / "my-notes.txt").read_text() == "mine"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_a_failed_undo_keeps_the_previous_files_and_says_where(existing, monkeypatch):
    out, files = existing
    before = _state(out)
    monkeypatch.setattr(os, "replace", _Failing(os.replace, 2, always_after=True))
    with pytest.raises(UserError, match="the previous files are kept in") as exc:
        write(str(out), files)
    monkeypatch.undo()
    kept = Path(str(exc.value).rsplit("kept in '", 1)[1].rstrip("'"))
    restored = {p.name: p.read_bytes() for p in kept.iterdir()}
    changed = [n for n in before if n not in restored and (out / n).read_bytes() != before[n][0]]
    assert not changed  # every file that differs now has its previous bytes in the staging folder
    assert all(before[n][0] == data for n, data in restored.items())


def test_a_full_disk_into_a_new_folder_leaves_nothing(tmp_path, monkeypatch):
    _, files = build(str(COLOCATED), "vllm")
    for n in range(1, len(files) + 1):
        monkeypatch.setattr(os, "write", _Failing(os.write, n))
        with pytest.raises(UserError, match="No space left on device"):
            write(str(tmp_path / "new"), files)
        monkeypatch.undo()
        assert list(tmp_path.iterdir()) == []


def test_files_get_the_permissions_a_plain_write_gives(tmp_path):
    old = os.umask(0o027)
    try:
        for out in (tmp_path / "new", tmp_path / "new"):  # a new folder, then the same one again
            export_plan(str(COLOCATED), "vllm", str(out))
            modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
            assert modes == {"benchmark.sh": 0o750, "serve-replica-0.sh": 0o750, "export.json": 0o640}
            assert out.stat().st_mode & 0o777 == 0o750
    finally:
        os.umask(old)


def test_a_folder_in_place_of_a_file_is_refused_before_anything_changes(tmp_path):
    out = tmp_path / "out"
    export_plan(str(COLOCATED), "vllm", str(out))
    (out / "benchmark.sh").unlink()
    (out / "benchmark.sh").mkdir()
    before = _state(out)
    ran = run_cli("export", COLOCATED, "--to", "vllm", "--out", out)
    assert_one_line_error(ran, 2, "--out:", "is a folder")
    assert _state(out) == before


# ----------------------------------------------------------------------------- the recorded reserve


def test_memory_share_uses_the_reserve_the_gpu_type_was_searched_with(tmp_path):
    """Schema 1.5 records each GPU type's reserve: the runtime gets what the search left usable."""
    doc = json.loads(COLOCATED.read_bytes())
    doc["schema_version"] = "1.5"
    doc["search"]["space"]["memory_reserve_gb_by_gpu"] = {"h100": 20.0}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    from opweave_planner.inputs.hardware import load_hardware
    from opweave_planner.latency.memory import nccl_bytes

    tp = doc["owners"][0]["tensor_parallel"]
    gpu = load_hardware().resolve("h100", "h100")
    for reserve, plan in ((20.0, path), (3.5, COLOCATED)):
        _, files = build(str(plan), "vllm")  # vLLM's budget is the searched share: it takes out the reserve itself
        words = files["serve-replica-0.sh"].decode().replace("\\\n", " ").split()  # one argv, flags in any order
        assert words[words.index("--gpu-memory-utilization") + 1] == "0.9"
        _, files = build(str(plan), "sglang")  # SGLang's static pool: the usable bytes the search left
        static = (0.9 * gpu.memory_bytes - reserve * 2**30 - nccl_bytes(gpu, tp)) / gpu.memory_bytes
        assert f"--mem-fraction-static {math.floor(static * 1e4) / 1e4:g}\n" in files["serve-replica-0.sh"].decode()


def test_llmd_refuses_a_weights_path(tmp_path):
    """The chart fetches hf://<id>: a path would be written as a Hub id that does not exist."""
    ran = run_cli("export", _replicated(tmp_path, 1), "--to", "llm-d", "--out", tmp_path / "o",
                  "--model-id", "/models/x")
    assert_one_line_error(ran, 2, "--model-id:")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("owners", [None, 3, "x", {"a": 1}])
def test_a_malformed_alternative_is_no_crash_when_a_refusal_looks_for_one(tmp_path, owners):
    """A refusal scans the file's alternatives for one the target can run; a lenient read must
    survive any shape there (owners: null crashed with exit 4)."""
    doc = json.loads(AFD_PLAN.read_bytes())
    doc["alternatives"] = {"colocated": {"plan": {"num_stages": 1, "owners": owners}}}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    ran = run_cli("export", plan, "--to", "vllm", "--out", tmp_path / "o")
    assert ran.code == 3, ran.err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("pool", ["prefill", "aggregated"])
@pytest.mark.parametrize("gpu,words", [("h100\n$(touch {m})", "deployment.{pool}.gpu: String should match"),
                                       ("nosuchgpu", "deployment.{pool}.gpu: unknown GPU 'nosuchgpu'")])
def test_a_bad_prefill_pool_gpu_is_one_line_naming_the_field(gpu, words, pool, tmp_path):
    """The prefill pool's (or the aggregated replicas') GPU type reaches scripts (comments) and node
    labels: refused where it enters."""
    marker = tmp_path / "PWNED"
    doc = json.loads(DISAGG.read_bytes()) if pool == "prefill" else aggregated_doc()
    words = words.replace("{pool}", pool)
    doc["deployment"][pool]["gpu"] = gpu.replace("{m}", str(marker))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    for target in ("vllm", "sglang", "dynamo", "llm-d"):
        ran = run_cli("export", plan, "--to", target, "--out", tmp_path / "out")
        line = assert_one_line_error(ran, 2, str(plan))
        assert words in line
        assert not (tmp_path / "out").exists() and not marker.exists()
