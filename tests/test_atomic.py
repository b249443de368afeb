"""Atomic output: umask-following modes, symlinks kept, bad paths caught up front, no debris."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from opweave_planner import atomic
from opweave_planner.atomic import check_writable, write_atomic
from opweave_planner.errors import UserError


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def _debris(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_file_mode_follows_the_umask(tmp_path, umask, mask, expected):
    umask(mask)
    out = tmp_path / "plan.json"
    write_atomic(out, b"{}\n")
    assert _mode(out) == expected
    assert out.read_bytes() == b"{}\n"


def test_replacing_keeps_the_existing_mode_like_a_plain_open(tmp_path, umask):
    out = tmp_path / "plan.json"
    out.write_bytes(b"old")
    os.chmod(out, 0o640)
    write_atomic(out, b"new")
    assert out.read_bytes() == b"new" and _mode(out) == 0o640


def test_symlink_target_is_written_and_the_link_kept(tmp_path):
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    target = real_dir / "plan.json"
    target.write_bytes(b"old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    written = write_atomic(link, b"new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == b"new" and written == target
    assert _debris(real_dir) == [] and _debris(tmp_path) == []
    assert check_writable(link) == target


def test_dangling_symlink_creates_its_target(tmp_path):
    target = tmp_path / "new.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_atomic(link, b"x")
    assert link.is_symlink() and target.read_bytes() == b"x"


def test_check_writable_accepts_a_new_file_and_leaves_nothing(tmp_path):
    assert check_writable(tmp_path / "plan.json", "--out") == tmp_path / "plan.json"
    assert list(tmp_path.iterdir()) == []


def test_a_255_byte_name_is_fine(tmp_path):
    name = "p" * 250 + ".json"
    write_atomic(tmp_path / name, b"x")
    assert (tmp_path / name).read_bytes() == b"x"


def _bad_paths(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    return {
        "directory": (tmp_path, "is a directory"),
        "missing folder": (tmp_path / "nope" / "plan.json", "does not exist"),
        "under a file": (afile / "plan.json", "not a folder"),
        "long name": (tmp_path / ("x" * 256), "256 bytes"),
        "fifo": (_fifo(tmp_path), "not a regular file"),
        "empty": ("", "empty path"),
        "symlink loop": (loop, "symlink loop"),
        "trailing slash": (f"{tmp_path}/new/", "names a folder"),
    }


def _fifo(tmp_path):
    p = tmp_path / "fifo"
    os.mkfifo(p)
    return p


@pytest.mark.parametrize("case", ["directory", "missing folder", "under a file", "long name", "fifo",
                                  "empty", "symlink loop", "trailing slash"])
def test_check_writable_rejects_bad_paths_with_one_line(tmp_path, case):
    path, needle = _bad_paths(tmp_path)[case]
    with pytest.raises(UserError) as err:
        check_writable(path, "--out")
    msg = str(err.value)
    assert msg.startswith("--out: ") and needle in msg and "\n" not in msg


def test_check_writable_rejects_a_read_only_folder(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root ignores mode bits: simulate what access(2) says for others
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, m, **k: False if str(p) == str(ro) else real(p, m, **k))
    else:
        ro.chmod(0o555)
    try:
        with pytest.raises(UserError, match=r"^--out: .*not writable"):
            check_writable(ro / "plan.json", "--out")
    finally:
        ro.chmod(0o755)


def test_check_writable_probe_catches_what_access_misses(tmp_path, monkeypatch):
    """A read-only mount or exhausted inodes pass access(2) but fail to create a file."""
    real_open = os.open

    def refuse(path, flags, mode=0o777, **kw):
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(UserError, match="Read-only file system"):
        check_writable(tmp_path / "plan.json", "--out")


@pytest.mark.parametrize("victim", ["write", "fsync"])
def test_full_disk_is_one_line_and_leaves_no_temp_file(tmp_path, monkeypatch, victim):
    out = tmp_path / "plan.json"
    out.write_bytes(b"old")

    def enospc(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, victim, enospc)
    with pytest.raises(UserError) as err:
        write_atomic(out, b"new" * 1000, field="--out")
    monkeypatch.undo()
    assert str(err.value) == f"--out: cannot write '{out}' (No space left on device)"
    assert out.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_short_writes_are_completed(tmp_path, monkeypatch):
    real = os.write
    monkeypatch.setattr(atomic.os, "write", lambda fd, data: real(fd, bytes(data[:7])))
    write_atomic(tmp_path / "p.json", b"0123456789" * 10)
    assert (tmp_path / "p.json").read_bytes() == b"0123456789" * 10


def test_interrupt_during_write_leaves_no_temp_file(tmp_path, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(tmp_path / "p.json", b"x")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_write_into_a_directory_path_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="directory"):
        write_atomic(tmp_path, b"x", field="--out")


# --------------------------------------------------------------------------- no-follow writes, folders

def test_write_without_following_replaces_the_link_itself(tmp_path, umask):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    os.chmod(victim, 0o600)
    link = tmp_path / "plan.json"
    link.symlink_to(victim)
    assert write_atomic(link, b"new", follow_symlinks=False) == link
    assert not link.is_symlink() and link.read_bytes() == b"new"
    assert victim.read_bytes() == b"keep"
    assert _mode(link) == 0o644  # a new file's mode, not the link target's
    assert _debris(tmp_path) == []


def test_write_without_following_over_a_link_to_a_folder(tmp_path):
    (tmp_path / "d").mkdir()
    link = tmp_path / "x.json"
    link.symlink_to("d")
    write_atomic(link, b"x", follow_symlinks=False)
    assert link.is_file() and not link.is_symlink() and (tmp_path / "d").is_dir()


def test_check_writable_folder(tmp_path):
    from opweave_planner.atomic import check_writable_folder

    assert check_writable_folder(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert (tmp_path / "a" / "b").is_dir() and list((tmp_path / "a" / "b").iterdir()) == []
    (tmp_path / "f").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for path, needle in [(tmp_path / "f", "is not a folder (a regular file)"),
                         (tmp_path / "f" / "sub", "a part of the path is a file"),
                         (tmp_path / "dangling", "is a symlink to"), ("", "empty path"),
                         (tmp_path / ("n" * 300), "a name in the path is 300 bytes")]:
        with pytest.raises(UserError) as err:
            check_writable_folder(path, "--out")
        assert str(err.value).startswith("--out: ") and needle in str(err.value), str(err.value)
    with pytest.raises(UserError, match="does not exist"):
        check_writable_folder(tmp_path / "new", "--out", create=False)


def test_printable_escapes_every_control_character():
    from opweave_planner.errors import printable

    assert printable("plain µ—ü text") == "plain µ—ü text"
    assert printable("a\x1b[31mb\nc\r\x00\x7f\x9b\u202e\u2028") == "a\\x1b[31mb\\nc\\r\\x00\\x7f\\x9b\\u202e\\u2028"
    assert printable("x\udcff") == "x\\udcff"  # an undecodable byte of a file name


def test_open_input_refuses_a_file_swapped_for_a_fifo(tmp_path, monkeypatch):
    """Between the check and the open, a regular file turns into a FIFO: still never blocks."""
    from opweave_planner.atomic import open_input

    path = tmp_path / "in.toml"
    path.write_text("x")
    real_open = os.open

    def swap(p, flags, *a, **k):
        if os.fspath(p) == str(path):
            path.unlink()
            os.mkfifo(path)
        return real_open(p, flags, *a, **k)

    monkeypatch.setattr(atomic.os, "open", swap)
    with pytest.raises(UserError, match=r"is not a regular file \(a FIFO\)"):
        open_input(path, "--flag")
