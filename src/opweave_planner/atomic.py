"""Atomic file output, and input paths checked for what they must be.

Every file the tool writes appears whole or not at all; every file or folder it reads goes
through one check first (`check_input_file` / `open_input` / `read_input`,
`check_input_folder`), so a bad path is one line naming the flag, the path and the real
reason (a folder, a FIFO or device, which is never opened and so never blocks, a dangling
symlink, a symlink loop, permission denied, a name too long, a NUL), never a traceback.

Files get the permissions a plain ``open(path, "w")`` would give them (0666 minus the
umask, or the mode of the file being replaced), a symlink is followed so its target
is rewritten and the link kept (or, with ``follow_symlinks=False``, the link itself is
replaced), and every OS failure becomes a one-line `UserError` naming the flag and the path.
Paths and strings from files are shown through `printable`, so no control character
reaches the terminal.
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO

from opweave_planner.errors import UserError, printable

NAME_MAX = 255  # bytes per path component on every filesystem we target


# what a non-regular file is, for the one line that refuses it
_KINDS = ((stat.S_ISDIR, "it is a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
#: a whole-file input read into memory (a catalog, a plan, a matrix) is at most this big by
#: default; callers pass a tighter bound for their kind
MAX_INPUT_BYTES = 256 << 20
def kind_of(mode: int) -> str:
    """Words for a non-regular file type: 'it is a folder', 'a FIFO', 'a character device'."""
    for test, words in _KINDS:
        if test(mode):
            return words
    return "not a plain file"


def _prefix(field: str | None) -> str:
    return f"{field}: " if field else ""


def _path_text(path: str | os.PathLike, where: str) -> str:
    """The path as text; an empty one or one holding a NUL (no OS call accepts it) refused."""
    text = os.fspath(path)
    if not text:
        raise UserError(f"{where}: empty path")
    if "\0" in text:
        raise UserError(f"{where} contains a NUL byte")
    return text


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
        raise UserError(f"{_prefix(field)}'{shown_path(text)}' is a symlink loop")
    return Path(real) if os.path.islink(text) else Path(os.path.abspath(text))


def check_writable(path: str | os.PathLike, field: str = "--out") -> Path:
    """Fail fast, before a long search, if ``path`` cannot be written; returns the real target.

    Checks: not a directory or other non-regular file, the folder exists and is a folder,
    names fit NAME_MAX, and the folder accepts a new file (probed, so a read-only mount or
    a full inode table is caught too).
    """
    where = _input_where(path, field)
    text = _path_text(path, where)
    if text.endswith(os.sep) or os.path.basename(text) in (".", ".."):
        raise UserError(f"{where} names a folder; give a file name")
    target = resolve_target(text, field)
    folder = target.parent
    for part in {Path(text).name, target.name}:
        size = len(os.fsencode(part))
        if size > _name_max(str(folder) if folder.is_dir() else "/"):
            raise UserError(f"{_prefix(field)}file name '{printable(part[:40])}…' is {size} bytes; "
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


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def _too_long(text: str, where: str) -> UserError:
    longest = max(os.fsencode(text).split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return UserError(f"{where}: a name in the path is {len(longest)} bytes; the limit is {NAME_MAX}")
    return UserError(f"{where}: the path is {len(os.fsencode(text))} bytes, too long for the system")


def check_writable_folder(path: str | os.PathLike, field: str = "--out", create: bool = True) -> Path:
    """Fail fast if ``path`` cannot hold new files: it is (or, with ``create``, becomes) a
    folder that accepts a new file (probed with a random name, so a planted link cannot
    catch the probe). Returns the folder's real path."""
    where = _input_where(path, field)
    text = _path_text(path, where)
    if os.path.lexists(text):
        st = _stat_input(text, where)
        if not stat.S_ISDIR(st.st_mode):
            kind = "a regular file" if stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)
            raise UserError(f"{where} is not a folder ({kind})")
    elif not create:
        raise UserError(f"{where} does not exist")
    else:
        try:
            os.makedirs(text, exist_ok=True)
        except NotADirectoryError:
            raise UserError(f"{where}: a part of the path is a file, not a folder") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UserError(f"{where}: the path goes through a symlink loop") from None
            if exc.errno == errno.ENAMETOOLONG:
                raise _too_long(text, where) from None
            raise UserError(f"{where}: cannot create the folder ({exc.strerror or exc})") from None
    real = Path(os.path.realpath(text))
    if not os.access(real, os.W_OK | os.X_OK):
        raise UserError(f"{where}: folder is not writable")
    probe = real / _temp_name("probe")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        raise UserError(f"{where}: cannot create a file in the folder ({exc.strerror or exc})") from None
    os.close(fd)
    probe.unlink(missing_ok=True)
    return real


def _stat_input(path: str | os.PathLike, where: str) -> os.stat_result:
    """os.stat of an input path, every failure one line with its real reason (a dangling link
    is not "missing", a loop is not a crash); nothing is opened, so a FIFO never blocks."""
    text = _path_text(path, where)
    try:
        return os.stat(text)
    except FileNotFoundError:
        link = _link_target(text)
        if link is not None:
            raise UserError(f"{where} is a symlink to '{printable(link)}', which does not exist") from None
        raise UserError(f"{where} does not exist") from None
    except NotADirectoryError:
        raise UserError(f"{where}: a part of the path is a file, not a folder") from None
    except PermissionError:
        raise UserError(f"{where} cannot be reached (permission denied on a folder of the path)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"{where} is a symlink loop" if _link_target(text) is not None
                            else f"{where}: the path goes through a symlink loop") from None
        if exc.errno == errno.ENAMETOOLONG:
            raise _too_long(text, where) from None
        raise UserError(f"{where}: {exc.strerror or exc}") from None
    except ValueError as exc:  # e.g. a path the OS cannot encode
        raise UserError(f"{where}: {exc}") from None


def _link_target(text: str) -> str | None:
    """What the symlink ``text`` finally points to (through a chain of links, so the name
    shown is the one that is missing), None when ``text`` is not a symlink."""
    try:
        target = os.readlink(text)
    except (OSError, ValueError):
        return None
    here = text
    for _ in range(40):  # the kernel's own limit on a chain
        nxt = os.path.join(os.path.dirname(here), target)
        try:
            further = os.readlink(nxt)
        except (OSError, ValueError):
            return target
        here, target = nxt, further
    return target


def shown_path(path: str | os.PathLike) -> str:
    """A path as an error line shows it: printable, and a very long one cut in the middle
    (the line must still hold the reason after it)."""
    text = printable(os.fspath(path))
    return text if len(text) <= 240 else f"{text[:120]}…{text[-80:]} ({len(text)} characters)"


def _input_where(path: str | os.PathLike, field: str | None) -> str:
    return f"{_prefix(field)}'{shown_path(path)}'"


def _regular(path: str | os.PathLike, field: str | None) -> os.stat_result:
    where = _input_where(path, field)
    st = _stat_input(path, where)
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{where} is not a regular file ({kind_of(st.st_mode)})")
    if not os.access(path, os.R_OK):
        raise UserError(f"{where} is not readable (permission denied)")
    return st


def check_input_file(path: str | os.PathLike, field: str | None = None) -> Path:
    """``path`` names an existing, readable regular file (not a folder, FIFO or device).

    The one check every input path goes through: the one-line error names ``field`` and the
    path and gives the real reason (a folder, a FIFO, a dangling symlink, a symlink loop,
    permission denied, a name too long, a NUL). Nothing is opened.
    """
    _regular(path, field)
    return Path(path)


def open_input(path: str | os.PathLike, field: str | None = None, limit: int | None = None) -> BinaryIO:
    """A checked input file opened for binary reading (for streaming readers).

    Opened without blocking and re-checked on the descriptor, so a file swapped for a FIFO
    after the check is refused too; ``limit`` bounds its size in bytes.
    """
    where = _input_where(path, field)
    st = _regular(path, field)
    if limit is not None and st.st_size > limit:
        raise UserError(f"{where} is {_size(st.st_size)}; expected at most {_size(limit)}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except PermissionError:
        raise UserError(f"{where} is not readable (permission denied)") from None
    except OSError as exc:
        raise UserError(f"{where} cannot be read ({exc.strerror or exc})") from None
    fst = os.fstat(fd)
    if not stat.S_ISREG(fst.st_mode):  # replaced between the check and the open
        os.close(fd)
        raise UserError(f"{where} is not a regular file ({kind_of(fst.st_mode)})")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_input(path: str | os.PathLike, field: str | None = None, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of an input file, or a one-line `UserError` naming ``field`` and the path
    (see `check_input_file`); a file over ``limit`` bytes is refused before it is read."""
    where = _input_where(path, field)
    with open_input(path, field, limit) as fh:
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise UserError(f"{where} cannot be read ({exc.strerror or exc})") from None
    if len(data) > limit:  # it grew after the check
        raise UserError(f"{where} is over {_size(limit)}; expected at most {_size(limit)}")
    return data


def check_input_folder(path: str | os.PathLike, field: str | None = None) -> Path:
    """``path`` names an existing, readable folder (same reasons as `check_input_file`)."""
    where = _input_where(path, field)
    st = _stat_input(path, where)
    if not stat.S_ISDIR(st.st_mode):
        kind = "a regular file" if stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)
        raise UserError(f"{where} is not a folder ({kind})")
    if not os.access(path, os.R_OK | os.X_OK):
        raise UserError(f"{where} is not readable (permission denied)")
    return Path(path)


def _temp_name(name: str) -> str:
    """A hidden sibling name that stays within NAME_MAX however long ``name`` is."""
    tail = f".{secrets.token_hex(6)}.tmp"
    room = NAME_MAX - 1 - len(tail)
    stem = os.fsencode(name)[:room].decode("utf-8", "ignore")
    return f".{stem}{tail}"


def _mode_for(target: Path, follow_symlinks: bool = True) -> int | None:
    """Permission bits of the file being replaced (a plain open keeps them), else None
    (also for a link that is itself replaced: its target's mode is not ours to copy)."""
    try:
        st = os.stat(target, follow_symlinks=follow_symlinks)
    except OSError:
        return None
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None


def write_atomic(path: str | Path, data: bytes, field: str | None = None,
                 follow_symlinks: bool = True) -> Path:
    """Write via a temporary sibling and rename: never half-written; returns the file written.

    A symlink is followed (its target is replaced, the link stays) unless
    ``follow_symlinks`` is False: then the link itself is replaced by the file, so a link
    planted where the file goes can never redirect the write (regen's rule). New files get
    0666 & ~umask, replaced files keep their mode. An OSError (full disk, read-only
    folder, ...) removes the temporary file and raises a one-line `UserError`.
    """
    if follow_symlinks:
        target = resolve_target(path, field)
    elif not os.fspath(path):
        raise UserError(f"{_prefix(field)}empty path")
    else:
        target = Path(os.path.abspath(os.fspath(path)))
    where = f"{_prefix(field)}cannot write '{shown_path(path)}'"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{where} ({exc.strerror or exc})") from None
    if (target.is_dir() if follow_symlinks else os.path.isdir(target) and not os.path.islink(target)):
        raise UserError(f"{where} (it is a directory)")
    tmp = target.parent / _temp_name(target.name)
    mode = _mode_for(target, follow_symlinks)
    try:
        # O_CREAT with 0666 lets the kernel apply the umask exactly as open() would
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        raise UserError(f"{where} ({exc.strerror or exc})") from None
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            write_fd(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise UserError(f"{where} ({exc.strerror or exc})") from None
        raise
    fsync_folder(target.parent)
    return target


def write_fd(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (short writes completed), then fsync: whole on disk or an OSError."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        view = view[n:]
    os.fsync(fd)


def fsync_folder(folder: Path) -> None:
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
