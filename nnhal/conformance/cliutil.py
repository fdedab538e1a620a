"""Small helpers the ``nnhal conformance`` and ``nnhal mutations`` commands share: one-line
errors, the K/N shard argument, and whether a report file can be written."""

from __future__ import annotations

import sys
from pathlib import Path


def error(prog: str, message: str, status: int = 2) -> int:
    """Print one line on stderr, ``<prog>: <message>``; return the exit status."""
    print(f"{prog}: {message}", file=sys.stderr)
    return status


def parse_shard(text: str) -> tuple[int, int] | None:
    """``K/N`` with 0 <= K < N, or None."""
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        return None
    return (k, n) if 0 <= k < n else None


def writable_problem(path: Path) -> str | None:
    """Why a report cannot be written to ``path``, or None. Tries to open it for appending
    (and removes the file again if that created it), so it answers for the real user and
    file system, not from permission bits."""
    path = Path(path)
    if path.is_dir():
        return "it is a folder"
    folder = path.absolute().parent
    if not folder.is_dir():
        existing = folder
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if existing.exists() and not existing.is_dir():
            return f"{existing} is a file, not a folder"
        return f"folder {folder} does not exist"
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        return e.strerror or str(e)
    if not existed:
        path.unlink(missing_ok=True)
    return None
