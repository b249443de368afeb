"""What regen writes into --out besides plans: the rule for its own files (plain files only,
never through a link) and the cache record that lets an unchanged entry skip its search."""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import orjson

from opweave_planner.errors import UserError, printable

# ----------------------------------------------------------------------------- files in --out
#
# The rule (docs/regen.md): regen writes only plain files directly inside --out and never
# through a link. A symlink, folder, FIFO or device where its cache record or an entry's
# file goes is refused up front, before any planning, with one line naming it; a link that
# appears during the run is replaced itself (write_atomic without following links), so a
# committed `plans/x.json -> /etc/passwd` can never make regen write outside --out. Existing
# files are read without following a link and without blocking, and at most MAX_OWN_BYTES.

MAX_OWN_BYTES = 64 << 20  # a plan file or the cache record is far smaller


def _own_file_problem(path: Path) -> str | None:
    """Why regen may not write ``path`` (words after the path), None when it may."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be checked ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = printable(os.readlink(path))
        except OSError:
            target = "?"
        return (f"is a symlink (to '{target}'); regen writes only plain files inside --out, never through "
                "a link (remove it)")
    if not stat.S_ISREG(st.st_mode):
        from opweave_planner.atomic import kind_of

        return f"exists and is not a file ({kind_of(st.st_mode)}; remove it)"
    if not os.access(path, os.R_OK | os.W_OK):
        return "is not readable and writable (permission denied)"
    return None


def check_own_file(path: Path, what: str) -> None:
    """One line naming ``what`` when regen may not write ``path`` (see the rule above)."""
    problem = _own_file_problem(path)
    if problem:
        raise UserError(f"--out: {what}: '{printable(path)}' {problem}")


def _write_own(path: Path, data: bytes) -> None:
    """Atomically, replacing a link itself rather than writing through it."""
    from opweave_planner.atomic import write_atomic

    write_atomic(path, data, field="--out", follow_symlinks=False)


# what regen last wrote into --out, per file: the entry's input fingerprint and the file's sha256
CACHE_FILE = ".opweave-regen-cache"


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """sha256 of the installed package (code and shipped data): a new release, or any edit,
    re-plans every entry."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".nbi", ".nbc"):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def fingerprint(req, hysteresis: float = 0.0, deployable: str | None = None) -> str:
    """Everything a plan depends on: the code, the request, and the content of every input it
    reads (model file, the searched GPU types' catalog entries, prices and profile files, the
    network, a workload file), and the runtime the plan must run on. Equal fingerprints give
    equal plan bytes."""
    from types import SimpleNamespace

    from opweave_planner.compile import hardware_for
    from opweave_planner.inputs.model import load_model
    from opweave_planner.plan import provenance
    from opweave_planner.workload.reader import trace_sha256
    from opweave_planner.workload.spec import named_file

    prov = provenance(hardware_for(req), SimpleNamespace(model=load_model(req.model)), req.gpus, req.profiles,
                      req.backend)
    parts = [code_hash(), req.model_dump_json(), prov.model_dump_json(), repr(float(hysteresis)), repr(deployable)]
    path = None if req.workload is None else named_file(req.workload)
    if path is not None:  # a trace's sha256 is cached from the request's own read; a law is small
        parts.append(trace_sha256(path) or _stream_sha(path))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _stream_sha(path: Path) -> str:
    """sha256 of an input of any size (a trace may be gigabytes), read in chunks; a file that
    cannot be read gives a value no readable file has (planning it then fails anyway)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return "unreadable"
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return "not a regular file"
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return "unreadable"
    return h.hexdigest()


def _file_sha(path: Path) -> str | None:
    data = _previous(path)
    return None if data is None else hashlib.sha256(data).hexdigest()


def _load_cache(out: Path) -> dict:
    """The record as written, or {} when it is missing or unreadable (garbage, nested too deep,
    too big): then every entry is simply re-planned and the record rewritten."""
    data = _previous(out / CACHE_FILE)
    try:
        cache = orjson.loads(data) if data else {}
    except (orjson.JSONDecodeError, RecursionError):
        return {}
    return cache if isinstance(cache, dict) else {}


def _record(seen: Any) -> dict | None:
    """One file's cache record with every field of the type regen wrote, or None. The record
    may have been edited by anyone who can write --out: its note is shown only made printable,
    a premium only as a finite number."""
    if not isinstance(seen, dict):
        return None
    fp, sha = seen.get("fingerprint"), seen.get("sha256")
    if not (isinstance(fp, str) and isinstance(sha, str)):
        return None
    pct = seen.get("premium_pct")
    if isinstance(pct, bool) or not isinstance(pct, (int, float)) or pct != pct or abs(pct) == float("inf"):
        pct = None
    note = seen.get("note")
    return {"fingerprint": fp, "sha256": sha, "kept": seen.get("kept") is True,
            "premium_pct": None if pct is None else float(pct),
            "note": printable(note)[:500] if isinstance(note, str) else ""}


def _previous(path: Path) -> bytes | None:
    """The bytes a file in --out holds now, None when there is none regen could have written:
    missing, a link, not a regular file (never opened, so a FIFO never blocks), unreadable or
    over MAX_OWN_BYTES."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_OWN_BYTES:
            return None
        fd = os.open(path, flags)
    except (OSError, ValueError):
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None
            data = fh.read(MAX_OWN_BYTES + 1)
    except OSError:
        return None
    return data if len(data) <= MAX_OWN_BYTES else None
