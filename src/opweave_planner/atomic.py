"""Atomic file output: every file the tool writes appears whole or not at all."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

from opweave_planner.errors import UserError


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write via a temporary file in the same folder and rename: never half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_figure(fig, path: str | Path, field: str = "--plot", **kw) -> None:
    """Render a matplotlib figure in memory, then write it atomically (format from the suffix)."""
    suffix = Path(path).suffix.lstrip(".").lower() or "png"
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=suffix, **kw)
        write_atomic(path, buf.getvalue())
    except (OSError, ValueError) as exc:
        raise UserError(f"{field}: cannot write '{path}' ({exc})") from None
