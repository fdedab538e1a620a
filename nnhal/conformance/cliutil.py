"""Small helpers the ``nnhal conformance`` and ``nnhal mutations`` commands share: one-line
errors, the K/N shard argument, and whether a report file can be written."""

from __future__ import annotations

import argparse
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


def add_mutations_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``nnhal mutations``."""
    p.add_argument("--specs", help="conformance folder (default: $NNHAL_CONFORMANCE or "
                                   "../shared/conformance)")
    p.add_argument("--filter", help="fnmatch pattern on case names")
    p.add_argument("--what", choices=("model", "request", "both"), default="both")
    p.add_argument("--limit", type=int, help="mutants sampled per case (default: all)")
    p.add_argument("--every", type=int, default=1, help="take every N-th case")
    p.add_argument("--shard", default="0/1", metavar="K/N",
                   help="run the K-th of N interleaved shards of the cases (default 0/1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="reference",
                   help="device to check (a registered name; default: reference)")
    p.add_argument("--show-failures", type=int, default=20, metavar="N",
                   help="print the first N failures of each run (default 20)")
