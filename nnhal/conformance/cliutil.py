"""What the ``nnhal`` commands share about their arguments: one-line errors, the K/N shard
argument, whether a file can be read or written, and argparse types that check a number's
range, a file or a device while the arguments are parsed, so that a bad one is a usage error
(one line, exit status 2) before any work starts. Light: numpy and the drivers load only
when a device is checked."""

from __future__ import annotations

import argparse
import math
import os
import stat
import sys
from collections.abc import Callable
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


def readable_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be read as a file, or None. Checked without blocking: a FIFO, a
    socket or a device is refused before anything opens it."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "no such file"
    except (OSError, ValueError) as e:
        return getattr(e, "strerror", None) or str(e)
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    if not stat.S_ISREG(mode):
        return "not a regular file (a FIFO, socket or device)"
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as e:
        return e.strerror or str(e)
    return None


def writable_problem(path: str | os.PathLike[str]) -> str | None:
    """Why a file cannot be written to ``path``, or None. Tries to open it for appending
    without blocking (and removes the file again if that created it), so it answers for the
    real user and file system, not from permission bits; a FIFO or socket is refused (writing
    would wait for a reader)."""
    try:
        path = Path(path)
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except (OSError, ValueError) as e:
        return getattr(e, "strerror", None) or str(e)
    if mode is not None and stat.S_ISDIR(mode):
        return "it is a folder"
    if mode is not None and (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return "it is a FIFO or socket, not a file"
    folder = path.absolute().parent
    if not folder.is_dir():
        existing = folder
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if existing.exists() and not existing.is_dir():
            return f"{existing} is a file, not a folder"
        return f"folder {folder} does not exist"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o666)
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    if mode is None:
        path.unlink(missing_ok=True)
    return None


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range ({low} to {high})")
        return value
    return parse


def float_in(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] (never NaN or infinity)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"{text} is out of range ({low:g} to {high:g})")
        return value
    return parse


def input_file(text: str) -> str:
    """An argparse type: a path :func:`readable_problem` finds no problem with."""
    problem = readable_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    return text


def output_file(text: str) -> str:
    """An argparse type: a path :func:`writable_problem` finds no problem with."""
    problem = writable_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"cannot write {text}: {problem}")
    return text


def device(text: str) -> str:
    """An argparse type: a device name that can be opened now (a registered driver, or a
    ``remote:`` service that answers); else the registry's reason."""
    from nnhal.drivers import registry

    why = registry.reason(text)
    if why is not None:
        raise argparse.ArgumentTypeError(why if why.startswith("unknown device") else
                                         f"device '{text}' is not available: {why}")
    return text


#: Bounds of counts a person types (runs, jobs, failures shown): far above any real use,
#: low enough that a typo cannot make a command run for days.
MAX_COUNT = 1_000_000


def add_hal_argument(p: argparse.ArgumentParser) -> None:
    """``--hal``: the face every call of the run crosses (:mod:`nnhal.conformance.faces`)."""
    from nnhal.conformance.faces import DEFAULT_FACE, FACES

    p.add_argument("--hal", choices=FACES, default=DEFAULT_FACE,
                   help=f"reach the device through this HAL face: {' or '.join(FACES)} "
                        f"(default {DEFAULT_FACE})")


def add_mutations_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``nnhal mutations``."""
    p.add_argument("--specs", help="conformance folder (default: $NNHAL_CONFORMANCE or "
                                   "../shared/conformance)")
    p.add_argument("--filter", help="fnmatch pattern on case names")
    p.add_argument("--what", choices=("model", "request", "both"), default="both")
    p.add_argument("--limit", type=int_in(1, MAX_COUNT),
                   help="mutants sampled per case (default: all)")
    p.add_argument("--every", type=int_in(1, MAX_COUNT), default=1,
                   help="take every N-th case")
    p.add_argument("--shard", default="0/1", metavar="K/N",
                   help="run the K-th of N interleaved shards of the cases (default 0/1)")
    p.add_argument("--seed", type=int_in(0, 2**64 - 1), default=0)
    p.add_argument("--device", default="reference",
                   help="device to check (a registered name; default: reference)")
    add_hal_argument(p)
    p.add_argument("--show-failures", type=int_in(0, MAX_COUNT), default=20, metavar="N",
                   help="print the first N failures of each run (default 20)")
