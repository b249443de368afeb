"""Every input path of the CLI goes through the one input-path check (issue 25): a folder, a FIFO,
/dev/zero, a dangling link, a symlink loop or a missing file is exit 2 and one line naming the
flag, the path and the real reason, nothing else on stderr, and nothing blocks (a FIFO is
never opened). Runs are in-process (conftest.run_cli) in a thread: one that blocks on a
FIFO is released by opening the FIFO's other end, and then fails.

Each argument's entry can list kinds its reader is not yet asked to say (an xfail, strict); today
every list is empty: all readers go through atomic.check_input_file / read_input / open_input.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
from pathlib import Path

import pytest
from conftest import AFD_PLAN, TINY, run_cli

from opweave_planner.atomic import read_input
from opweave_planner.errors import UserError

KINDS = ("folder", "fifo", "dev-zero", "dangling", "loop", "missing")
FOLDER_KINDS = ("file", "fifo", "dev-zero", "dangling", "loop", "missing")  # for a path that names a folder
REASONS = {
    "folder": r"is not a regular file \(it is a folder\)",
    "file": r"is not a folder \(a regular file\)",
    "fifo": r"\(a FIFO\)",
    "dev-zero": r"\(a character device\)",
    "dangling": r"is a symlink to '[^']*nowhere', which does not exist",
    "loop": r"is a symlink loop",
    "missing": r"does not exist",
}
BLOCK_S = 20.0  # a run still going after this is blocked on something it opened


def make(kind: str, folder: Path, name: str = "input") -> Path:
    """A path of `kind` inside `folder` (or /dev/zero, /dev/null)."""
    path = folder / name
    if kind == "folder":
        path.mkdir()
    elif kind == "file":
        path.write_text("x = 1\n")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind in ("dev-zero", "dev-null"):
        return Path(f"/dev/{kind[4:]}")
    elif kind == "socket":  # (a temporary folder's path is well inside AF_UNIX's 108 bytes)
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
    elif kind == "dangling":
        path.symlink_to(folder / "nowhere")
    elif kind == "loop":
        path.symlink_to(path.name)
    return path


def run_bounded(*argv, fifos: tuple[Path, ...] = ()):
    """run_cli in a thread; if it has not finished after BLOCK_S, open every FIFO's write end
    to release a reader blocked on it, then fail the test."""
    box = {}
    worker = threading.Thread(target=lambda: box.setdefault("ran", run_cli(*argv)), daemon=True)
    worker.start()
    worker.join(BLOCK_S)
    if worker.is_alive():
        for f in fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(10)
        pytest.fail(f"blocked for {BLOCK_S:.0f} s on a special file: {argv}")
    return box["ran"]


def check_refused(ran, flag: str, path: Path, reason: str) -> str:
    """Exit 2, no traceback, stderr is exactly one error line naming the flag, the path and the
    reason."""
    assert "Traceback" not in ran.err, ran.err
    assert ran.code == 2, (ran.code, ran.err)
    assert len(ran.lines) == 1 and ran.lines[0].startswith("error: "), ran.err
    line = ran.lines[0]
    assert flag in line and str(path) in line, line
    assert re.search(reason, line), (reason, line)
    return line


def _home(p: Path) -> Path:
    """The nearest folder above `p` (it may lie under a file): where a run's --out goes."""
    return next(d for d in p.parents if d.is_dir())


def _plan_argv(flag: str):
    return lambda p: [*TINY, flag, p]


def _workload_argv(p):
    argv = list(TINY)
    i = argv.index("--ctx")
    del argv[i:i + 2]
    return [*argv, "--workload", p]


def _matrix_argv(key: str):
    def build(p):
        m = _home(p) / "m.toml"
        if key == "workloads":
            body = (f'[[entry]]\nmodels = ["llama-3.1-8b"]\nworkloads = ["{p.name}"]\nslos = ["60ms"]\n'
                    'gpus = ["h100"]\npolicies = ["colocated"]\nmax_owners = 1\nbatches = [8]\n')
        else:
            body = (f'{key} = "{p}"\n[[entry]]\nmodels = ["llama-3.1-8b"]\ncontexts = ["8k"]\nslos = ["60ms"]\n'
                    'gpus = ["h100"]\npolicies = ["colocated"]\nmax_owners = 1\nbatches = [8]\n')
        m.write_text(body)
        return ["regen", "--matrix", m, "--out", m.parent / "out", "-q"]
    return build


# a missing --workload may be a mistyped inline law: the reader says so
WORKLOAD_REASONS = {"missing": r"no such file \(and not an inline law"}
# flag named in the line, argv builder, kinds (file or folder paths), {kind: xfail reason}, reasons
ARGS = {
    "--workload": ("--workload", _workload_argv, KINDS, {}, WORKLOAD_REASONS),
    "--catalog": ("--catalog", _plan_argv("--catalog"), KINDS, {}, {}),
    "--prices": ("--prices", _plan_argv("--prices"), KINDS, {}, {}),
    "--profiles": ("--profiles", _plan_argv("--profiles"), FOLDER_KINDS, {}, {}),
    "--model": ("--model", lambda p: ["--model", p, *TINY[2:]], KINDS, {},
                {"folder": r"is not a regular file \(a directory without config.json\)"}),
    "gpus --catalog": ("--catalog", lambda p: ["gpus", "--catalog", p], KINDS, {}, {}),
    "gpus --prices": ("--prices", lambda p: ["gpus", "--prices", p], KINDS, {}, {}),
    "regen --matrix": ("--matrix", lambda p: ["regen", "--matrix", p, "--out", _home(p) / "out", "-q"], KINDS,
                       {}, {}),
    "matrix prices": ("--prices", _matrix_argv("prices"), KINDS, {}, {}),
    "matrix catalog": ("--catalog", _matrix_argv("catalog"), KINDS, {}, {}),
    "matrix profiles": ("--profiles", _matrix_argv("profiles"), FOLDER_KINDS, {}, {}),
    "matrix workloads": ("--workload", _matrix_argv("workloads"), KINDS, {}, WORKLOAD_REASONS),
    "simulate PLAN": ("plan file", lambda p: ["simulate", p], KINDS, {}, {}),
    "simulate --catalog": ("--catalog", lambda p: ["simulate", AFD_PLAN, "--catalog", p], KINDS, {}, {}),
    "simulate --prices": ("--prices", lambda p: ["simulate", AFD_PLAN, "--prices", p], KINDS, {}, {}),
    "diff OLD": ("plan file", lambda p: ["diff", p, AFD_PLAN], KINDS, {}, {}),
    "diff NEW": ("plan file", lambda p: ["diff", AFD_PLAN, p], KINDS, {}, {}),
    "export PLAN": ("plan file", lambda p: ["export", p, "--to", "vllm", "--out", _home(p) / "out"], KINDS, {}, {}),
}
# the matrix names /dev/zero by absolute path; a workload entry by a name relative to the matrix
_NOT_FOR = {("matrix workloads", "dev-zero")}


def _cases():
    for arg, (_flag, _argv, kinds, xfails, _reasons) in ARGS.items():
        for kind in kinds:
            if (arg, kind) in _NOT_FOR:
                continue
            marks = [pytest.mark.xfail(strict=True, reason=xfails[kind])] if kind in xfails else []
            yield pytest.param(arg, kind, id=f"{arg}-{kind}", marks=marks)


@pytest.mark.parametrize("arg, kind", list(_cases()))
def test_every_path_argument_refuses_special_files_with_the_real_reason(tmp_path, arg, kind):
    flag, argv, _kinds, _x, reasons = ARGS[arg]
    path = make(kind, tmp_path)
    ran = run_bounded(*argv(path), fifos=(path,) if kind == "fifo" else ())
    check_refused(ran, flag, path, reasons.get(kind, REASONS[kind]))
    assert not (tmp_path / "out").exists()  # nothing written


OTHER = {"under a file": r"a part of the path is a file, not a folder",
         "long name": r"a name in the path is 300 bytes; the limit is 255"}
# the matrix names a workload by its name beside the matrix, so no path under a file can be written
_OTHER_NOT_FOR = {("matrix workloads", "under a file")}


def _other_cases():
    for kind in OTHER:
        for arg in ARGS:
            if (arg, kind) not in _OTHER_NOT_FOR:
                yield pytest.param(arg, kind, id=f"{arg}-{kind}")


@pytest.mark.parametrize("arg, kind", list(_other_cases()))
def test_every_path_argument_names_a_bad_path_on_the_way(tmp_path, arg, kind):
    flag, argv, _kinds, _x, _reasons = ARGS[arg]
    if kind == "under a file":
        (tmp_path / "afile").write_text("x")
        path = tmp_path / "afile" / "input"
    else:
        path = tmp_path / ("n" * 300)
    check_refused(run_bounded(*argv(path)), flag, path if kind != "long name" else tmp_path, OTHER[kind])


def test_a_fifo_in_the_hugging_face_cache_is_refused_not_read(tmp_path, monkeypatch):
    """An offline hub cache whose refs/main is a FIFO blocked inspect and plan forever."""
    import json

    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    repo = tmp_path / "hf" / "hub" / "models--org--b"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    bundled = Path(__file__).parents[1] / "models" / "llama-3.1-8b.json"
    (snap / "config.json").write_text(json.dumps(json.loads(bundled.read_text())))
    (repo / "refs").mkdir()
    os.mkfifo(repo / "refs" / "main")
    ran = run_bounded("inspect", "--model", "org/b", fifos=(repo / "refs" / "main",))
    check_refused(ran, "refs", repo / "refs" / "main", REASONS["fifo"])


# --------------------------------------------------------------------------- the check itself

@pytest.mark.parametrize("kind", KINDS)
def test_read_input_gives_the_real_reason(tmp_path, kind):
    path = make(kind, tmp_path)
    with pytest.raises(UserError) as err:
        read_input(path, "--flag")
    msg = str(err.value)
    assert msg.startswith(f"--flag: '{path}'") and re.search(REASONS[kind], msg), msg


def test_read_input_other_reasons(tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases = {
        "under a file": (afile / "x", "a part of the path is a file, not a folder"),
        "long name": (tmp_path / ("n" * 300), "a name in the path is 300 bytes; the limit is 255"),
        "long path": ("/" + "/".join(["d" * 200] * 30), "too long"),
        "nul": (f"{tmp_path}/a\0b", "contains a NUL byte"),
        "empty": ("", "empty path"),
        "loop on the way": (tmp_path / "loop" / "x", "goes through a symlink loop"),
    }
    (tmp_path / "loop").symlink_to("loop")
    for name, (path, needle) in cases.items():
        with pytest.raises(UserError) as err:
            read_input(path, "--flag")
        msg = str(err.value)
        assert msg.startswith("--flag: ") and needle in msg and "\n" not in msg, (name, msg)


def test_read_input_permission_denied(tmp_path, monkeypatch):
    path = tmp_path / "secret.toml"
    path.write_text("x = 1\n")
    real = os.access  # as root access(2) says yes to everything: simulate another user
    monkeypatch.setattr(os, "access", lambda p, m, **k: False if os.fspath(p) == str(path) else real(p, m, **k))
    with pytest.raises(UserError, match=r"^--flag: '.*secret.toml' is not readable \(permission denied\)$"):
        read_input(path, "--flag")


def test_read_input_bounds_the_size(tmp_path):
    path = tmp_path / "huge.toml"
    with open(path, "wb") as fh:
        fh.truncate(10 << 30)  # a sparse 10 GiB "catalog"
    with pytest.raises(UserError, match=r"is 10.0 GiB; expected at most 16.0 MiB"):
        read_input(path, "--catalog", 16 << 20)
    ran = run_cli("gpus", "--catalog", path)
    check_refused(ran, "--catalog", path, "is 10.0 GiB; expected at most")


def test_a_path_with_control_characters_is_shown_escaped(tmp_path):
    path = tmp_path / "a\x1b[31mb\nc.toml"
    ran = run_cli("gpus", "--catalog", path)
    assert ran.code == 2 and len(ran.lines) == 1, ran.err
    assert "\x1b" not in ran.err and "a\\x1b[31mb\\nc.toml" in ran.err


# --------------------------------------------------------------------------- catalog bounds

# key, a value below its range, one above, the range as the error states it
CATALOG_BOUNDS = [
    ("bandwidth_gbps", "1e-300", "1e6", "expected 1 to 100000 GB/s"),
    ("bf16_tflops", "0.001", "1e9", "expected 0.1 to 100000 TFLOPS"),
    ("fp8_tflops", "0", "inf", "expected 0.1 to 100000 TFLOPS"),
    ("int8_tflops", "-1", "nan", "expected 0.1 to 100000 TFLOPS"),
    ("memory_gb", "0.5", "1e5", "expected 1 to 16384 GiB"),
    ("price_per_hour", "-0.01", "20000", "expected 0 to 10000 USD per GPU-hour"),
    ("gpus_per_node", "0", "4096", "expected 1 to 1024 GPUs"),
    ("intra_node_gbps", "1e-9", "1e7", "expected 0.001 to 100000 GB/s"),
    ("kernel_floor_us", "-1", "1e6", "expected 0 to below 1000000 us"),
    ("transfer_fixed_us", "-5", "3e6", "expected 0 to below 1000000 us"),
    ("other_memory_bytes", "-1", "1e20", "expected 0 to 16 TiB"),
]


@pytest.mark.parametrize("key, low, high, expected", CATALOG_BOUNDS)
def test_catalog_figures_outside_physical_ranges_name_the_key(tmp_path, key, low, high, expected):
    for value in (low, high):
        cat = tmp_path / "cat.toml"
        cat.write_text(f"[gpus.h100]\n{key} = {value}\n")
        ran = run_cli(*TINY, "--catalog", cat)
        line = check_refused(ran, "--catalog", cat, re.escape(f"gpus.h100.{key}: {expected}, got "))
        assert "Warning" not in ran.err, line


def test_absurd_but_finite_bandwidth_leaks_no_numpy_warning(tmp_path):
    """1e-300 GB/s used to pass and overflow the roofline (RuntimeWarning on stderr)."""
    import warnings

    cat = tmp_path / "cat.toml"
    cat.write_text("[gpus.h100]\nbandwidth_gbps = 1e-300\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ran = run_cli(*TINY, "--catalog", cat)
    assert ran.code == 2 and len(ran.lines) == 1 and "bandwidth_gbps" in ran.err, ran.err


def test_a_new_gpu_and_the_network_table_are_bounded_too(tmp_path):
    cat = tmp_path / "cat.toml"
    cat.write_text('[gpus.x]\nname = "X"\nmemory_gb = 24\nbandwidth_gbps = 900\nbf16_tflops = 100\n'
                   'fp8_tflops = 200\nprice_per_hour = 1\ngpus_per_node = 8\nintra_node_gbps = 1e-300\n')
    check_refused(run_cli("gpus", "--catalog", cat), "--catalog", cat, r"gpus\.x\.intra_node_gbps: expected")
    cat.write_text("[network]\ninter_node_latency_us = 1e300\n")
    check_refused(run_cli("gpus", "--catalog", cat), "--catalog", cat,
                  r"network\.inter_node_latency_us: expected 0 to below 1000000 us")
    cat.write_text("[gpus.h100]\nnccl_memory_bytes = { 2 = 1e30 }\n")
    check_refused(run_cli("gpus", "--catalog", cat), "--catalog", cat, r"nccl_memory_bytes: .*expected 0 to 16 TiB")
    cat.write_text("[gpus.h100]\nbandwidth_gbps = true\n")
    check_refused(run_cli("gpus", "--catalog", cat), "--catalog", cat, "expected a number, got true")


@pytest.mark.parametrize("value", ["-1", "1e5", "nan", "1" + "0" * 400])
def test_prices_outside_the_range_name_the_gpu(tmp_path, value):
    prices = tmp_path / "p.toml"
    prices.write_text(f"h100 = {value}\n")
    check_refused(run_cli("gpus", "--prices", prices), "--prices", prices,
                  r"price of 'h100' must be non-negative and at most 10000 USD per GPU-hour, got ")


def test_a_profile_system_json_outside_the_ranges_names_its_file(tmp_path):
    import json
    import shutil

    root = Path(__file__).parents[1] / "profiles"
    prof = tmp_path / "profiles"
    shutil.copytree(root / "h100", prof / "h100")
    spec = json.loads((prof / "h100" / "system.json").read_text())
    spec["memory_bandwidth_gbps"] = 1e-300
    (prof / "h100" / "system.json").write_text(json.dumps(spec))
    ran = run_cli(*TINY, "--profiles", prof)
    check_refused(ran, "system.json", prof / "h100" / "system.json", r"memory_bandwidth_gbps: expected 1 to 100000 GB/s")
    assert "Warning" not in ran.err
    from opweave_planner.inputs.hardware import load_hardware

    os.remove(prof / "h100" / "system.json")
    os.mkfifo(prof / "h100" / "system.json")
    with pytest.raises(UserError, match=REASONS["fifo"]):  # never opened
        load_hardware(profiles_dir=prof)


@pytest.mark.parametrize("flag, value, needle", [("--network-bandwidth", "1e-300", "expected 0.001 to 100000 GB/s"),
                                                  ("--network-latency", "1e300", "expected 0 to below 1000000 us")])
def test_network_flags_outside_the_ranges_name_the_flag(flag, value, needle):
    ran = run_cli(*TINY, flag, value)
    assert ran.code == 2 and len(ran.lines) == 1, ran.err
    assert ran.lines[0].startswith(f"error: {flag}: ") and needle in ran.lines[0], ran.err


def test_every_shipped_gpu_and_example_is_inside_the_ranges():
    from opweave_planner.inputs.hardware import load_hardware

    examples = Path(__file__).parents[1] / "examples"
    hw = load_hardware(prices=str(examples / "prices.toml"))
    assert {"h100", "a100", "l40s", "h200", "h20", "b200"} <= set(hw.ids())
    golden = Path(__file__).parent / "golden" / "catalog-reserve.toml"
    assert load_hardware(catalog=str(golden)).resolve("a100").other_memory_bytes == 5 << 30
