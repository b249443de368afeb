"""Atomic file output, and input paths checked for what they must be.

Every file the tool writes appears whole or not at all; every file or folder it reads is
checked first (exists, is a regular file / a folder, readable), so a bad path is one line
naming the flag and the path, never a traceback.

Files get the permissions a plain ``open(path, "w")`` would give them (0666 minus the
umask, or the mode of the file being replaced), a symlink is followed so its target
is rewritten and the link kept, and every OS failure becomes a one-line `UserError`
naming the flag and the path.
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import stat
from pathlib import Path

from opweave_planner.errors import UserError

NAME_MAX = 255  # bytes per path component on every filesystem we target


def _prefix(field: str | None) -> str:
    return f"{field}: " if field else ""


def _name_max(folder: str) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return NAME_MAX


def resolve_target(path: str | os.PathLike, field: str | None = None) -> Path:
    """The file a write to ``path`` must replace: a symlink's (final) target, else ``path``."""
    text = os.fspath(path)
    if not text:
        raise UserError(f"{_prefix(field)}empty path")
    real = os.path.realpath(text)
    if os.path.islink(real):  # realpath stops on a loop and returns a link
        raise UserError(f"{_prefix(field)}'{text}' is a symlink loop")
    return Path(real) if os.path.islink(text) else Path(os.path.abspath(text))


def check_writable(path: str | os.PathLike, field: str = "--out") -> Path:
    """Fail fast, before a long search, if ``path`` cannot be written; returns the real target.

    Checks: not a directory or other non-regular file, the folder exists and is a folder,
    names fit NAME_MAX, and the folder accepts a new file (probed, so a read-only mount or
    a full inode table is caught too).
    """
    text = os.fspath(path)
    where = f"{_prefix(field)}'{text}'"
    if not text:
        raise UserError(f"{_prefix(field)}empty path")
    if "\0" in text:
        raise UserError(f"{where} contains a NUL byte")
    if text.endswith(os.sep) or os.path.basename(text) in (".", ".."):
        raise UserError(f"{where} names a folder; give a file name")
    target = resolve_target(text, field)
    folder = target.parent
    for part in {Path(text).name, target.name}:
        size = len(os.fsencode(part))
        if size > _name_max(str(folder) if folder.is_dir() else "/"):
            raise UserError(f"{_prefix(field)}file name '{part[:40]}…' is {size} bytes; "
                            f"the limit is {NAME_MAX}")
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise UserError(f"{where}: a part of the path is a file, not a folder") from None
    except OSError as exc:
        raise UserError(f"{where}: {exc.strerror or exc}") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{where} is a directory; give a file name")
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{where} is not a regular file (omit the flag to write to stdout)")
    try:
        fst = os.stat(folder)
    except FileNotFoundError:
        raise UserError(f"{where}: folder '{folder}' does not exist") from None
    except NotADirectoryError:
        raise UserError(f"{where}: a part of the path is a file, not a folder") from None
    except OSError as exc:
        raise UserError(f"{where}: folder '{folder}': {exc.strerror or exc}") from None
    if not stat.S_ISDIR(fst.st_mode):
        raise UserError(f"{where}: '{folder}' is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"{where}: folder '{folder}' is not writable")
    probe = folder / _temp_name(target.name)
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise UserError(f"{where}: cannot create a file in '{folder}' ({exc.strerror or exc})") from None
    os.close(fd)
    probe.unlink(missing_ok=True)
    return target


def _stat_input(path: str | os.PathLike, where: str) -> os.stat_result:
    text = os.fspath(path)
    if not text:
        raise UserError(f"{where}: empty path")
    if "\0" in text:
        raise UserError(f"{where} contains a NUL byte")
    try:
        return os.stat(text)
    except FileNotFoundError:
        raise UserError(f"{where} does not exist") from None
    except NotADirectoryError:
        raise UserError(f"{where}: a part of the path is a file, not a folder") from None
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise UserError(f"{where}: name too long (the limit is {NAME_MAX} bytes per "
                            f"path component)") from None
        raise UserError(f"{where}: {exc.strerror or exc}") from None


def _input_where(path: str | os.PathLike, field: str | None) -> str:
    return f"{_prefix(field)}'{os.fspath(path)}'"


def check_input_file(path: str | os.PathLike, field: str | None = None) -> Path:
    """``path`` names an existing, readable regular file (not a folder, FIFO or device)."""
    where = _input_where(path, field)
    st = _stat_input(path, where)
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{where} is not a regular file (it is a folder)")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{where} is not a regular file")
    if not os.access(path, os.R_OK):
        raise UserError(f"{where} is not readable (permission denied)")
    return Path(path)


def read_input(path: str | os.PathLike, field: str | None = None) -> bytes:
    """The bytes of an input file, or a one-line `UserError` naming ``field`` and the path:
    missing, not a regular file (a folder, a FIFO: reading one would block), unreadable."""
    where = _input_where(path, field)
    check_input_file(path, field)
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except IsADirectoryError:
        raise UserError(f"{where} is not a regular file (it is a folder)") from None
    except OSError as exc:
        if isinstance(exc, PermissionError):
            raise UserError(f"{where} is not readable (permission denied)") from None
        raise UserError(f"{where} cannot be read ({exc.strerror or exc})") from None


def check_input_folder(path: str | os.PathLike, field: str | None = None) -> Path:
    """``path`` names an existing, readable folder."""
    where = _input_where(path, field)
    st = _stat_input(path, where)
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"{where} is not a folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise UserError(f"{where} is not readable (permission denied)")
    return Path(path)


def _temp_name(name: str) -> str:
    """A hidden sibling name that stays within NAME_MAX however long ``name`` is."""
    tail = f".{secrets.token_hex(6)}.tmp"
    room = NAME_MAX - 1 - len(tail)
    stem = os.fsencode(name)[:room].decode("utf-8", "ignore")
    return f".{stem}{tail}"


def _mode_for(target: Path) -> int | None:
    """Permission bits of the file being replaced (a plain open keeps them), else None."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        return None


def write_atomic(path: str | Path, data: bytes, field: str | None = None) -> Path:
    """Write via a temporary sibling and rename: never half-written; returns the file written.

    A symlink is followed (its target is replaced, the link stays). New files get
    0666 & ~umask, replaced files keep their mode. An OSError (full disk, read-only
    folder, ...) removes the temporary file and raises a one-line `UserError`.
    """
    target = resolve_target(path, field)
    where = f"{_prefix(field)}cannot write '{os.fspath(path)}'"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{where} ({exc.strerror or exc})") from None
    if target.is_dir():
        raise UserError(f"{where} (it is a directory)")
    tmp = target.parent / _temp_name(target.name)
    mode = _mode_for(target)
    try:
        # O_CREAT with 0666 lets the kernel apply the umask exactly as open() would
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        raise UserError(f"{where} ({exc.strerror or exc})") from None
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                if n <= 0:
                    raise OSError(errno.EIO, "short write")
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise UserError(f"{where} ({exc.strerror or exc})") from None
        raise
    _fsync_folder(target.parent)
    return target


def _fsync_folder(folder: Path) -> None:
    """Make the rename durable; best effort (not every filesystem allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_figure(fig, path: str | Path, field: str = "--plot", **kw) -> None:
    """Render a matplotlib figure in memory, then write it atomically (format from the suffix)."""
    suffix = Path(path).suffix.lstrip(".").lower() or "png"
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=suffix, **kw)
    except (OSError, ValueError) as exc:
        raise UserError(f"{field}: cannot write '{path}' ({exc})") from None
    write_atomic(path, buf.getvalue(), field=field)
