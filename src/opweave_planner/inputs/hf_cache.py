"""The offline Hugging Face hub cache: where it is, the repo ids it holds and the config.json
a cached repository answers with (read only, never contacted; --model resolves ids here)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from opweave_planner.errors import UserError, printable

# A Hugging Face repository id ("org/name", or a legacy bare name) as the hub cache stores it.
HF_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")


def short_text(text: str) -> str:
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def hf_hub_cache() -> Path:
    """The local Hugging Face hub cache, located as huggingface_hub does (it is never contacted)."""
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def repo_id(cache_dir_name: str) -> str:
    return cache_dir_name.removeprefix("models--").replace("--", "/", 1)


def cached_ids() -> list[str]:
    """The repo ids in the hub cache (only printable ones: they are offered in an error line)."""
    try:
        return sorted(repo_id(p.name) for p in hf_hub_cache().iterdir()
                      if p.name.startswith("models--") and printable(p.name) == p.name)
    except OSError:
        return []


def cached_config(repo_id: str) -> Path | None:
    """config.json of `repo_id` in the hub cache: the snapshot refs/main names, else the newest.

    Case-insensitive; ties on mtime are broken by path, so the answer is deterministic. None when
    the repository is not in the cache; a repository there without a usable config.json (a
    regular file in a snapshot) is an error that says so, not an unknown model.
    """
    want = ("models--" + repo_id.replace("/", "--")).lower()
    try:
        repos = sorted(p for p in hf_hub_cache().iterdir() if p.name.lower() == want)
    except OSError:
        return None
    best: tuple[bool, int, str] | None = None
    for repo in repos:
        main = read_ref(repo / "refs" / "main")
        try:
            snapshots = list((repo / "snapshots").iterdir())
        except OSError:
            continue
        for snap in snapshots:
            cfg = snap / "config.json"
            try:
                if not stat.S_ISREG(os.stat(cfg).st_mode):
                    continue
                key = (snap.name == main, snap.stat().st_mtime_ns, str(cfg))
            except OSError:
                continue
            best = key if best is None or key > best else best
    if best is None and repos:
        raise UserError(f"--model: '{short_text(repo_id)}' is in the local Hugging Face cache ({repos[0]}) but no "
                        f"snapshot of it holds a usable config.json (a regular file); nothing is downloaded: "
                        f"fetch it again, or give the config.json's path")
    return Path(best[2]) if best else None


MAX_REF_BYTES = 4096  # refs/main holds one commit hash


def read_ref(path: Path) -> str | None:
    """The revision a cache ref names, None when there is none; read through the input check, so
    a FIFO or device there is refused in one line instead of blocking the read."""
    from opweave_planner.atomic import read_input

    if not os.path.lexists(path):
        return None
    return read_input(path, "--model", limit=MAX_REF_BYTES).decode("utf-8", "replace").strip()
