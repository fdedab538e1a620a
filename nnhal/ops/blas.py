"""The thread count of the BLAS library numpy uses, read and set through ctypes.

numpy's wheels bundle OpenBLAS with prefixed symbol names (``scipy_openblas_set_num_threads64_``
in the 64-bit-integer build); a system OpenBLAS exports ``openblas_set_num_threads``. This
module finds whichever of them is loaded in the process, without threadpoolctl. Where none is
found (another BLAS, another platform) every function is a no-op and :func:`available` says so.

Usage::

    with blas_threads(1):
        ...  # GEMMs in here run on one thread

The count is process-wide (OpenBLAS has one thread pool), so a caller that limits it should do
so around whole executions, not per kernel from several threads at once.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np  # noqa: F401 - loads the BLAS library this module looks for

#: (setter, getter) symbol pairs, most specific first.
_SYMBOLS = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)

_lock = threading.Lock()
_found: tuple[object, object] | None = None
_searched = False


def _loaded_libraries() -> list[str]:
    """Paths of the shared objects mapped in this process whose name mentions BLAS."""
    paths: list[str] = []
    try:
        with open(f"/proc/{os.getpid()}/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].strip()
                    name = os.path.basename(path).lower()
                    if "blas" in name and ".so" in name and path not in paths:
                        paths.append(path)
    except OSError:
        pass
    return paths


def _bind(lib: ctypes.CDLL) -> tuple[object, object] | None:
    for set_name, get_name in _SYMBOLS:
        setter = getattr(lib, set_name, None)
        getter = getattr(lib, get_name, None)
        if setter is not None and getter is not None:
            setter.argtypes = [ctypes.c_int]
            setter.restype = None
            getter.argtypes = []
            getter.restype = ctypes.c_int
            return setter, getter
    return None


def _functions() -> tuple[object, object] | None:
    global _found, _searched
    if _searched:
        return _found
    with _lock:
        if not _searched:
            candidates: list[ctypes.CDLL] = []
            for path in _loaded_libraries():
                try:
                    candidates.append(ctypes.CDLL(path))
                except OSError:
                    continue
            try:
                candidates.append(ctypes.CDLL(None))  # symbols already global in the process
            except OSError:  # pragma: no cover - dlopen(NULL) does not fail on Linux
                pass
            for lib in candidates:
                _found = _bind(lib)
                if _found is not None:
                    break
            _searched = True
    return _found


def available() -> bool:
    """Whether a BLAS thread control was found."""
    return _functions() is not None


def get_threads() -> int | None:
    """The BLAS thread count, or None when no control was found."""
    fns = _functions()
    return None if fns is None else int(fns[1]())  # type: ignore[operator]


def set_threads(count: int) -> int | None:
    """Set the BLAS thread count (at least 1); returns the previous count, or None (no-op)."""
    fns = _functions()
    if fns is None:
        return None
    previous = int(fns[1]())  # type: ignore[operator]
    fns[0](max(1, int(count)))  # type: ignore[operator]
    return previous


@contextmanager
def blas_threads(count: int) -> Iterator[int | None]:
    """Limit BLAS to ``count`` threads inside the block, then restore the previous count.

    Yields the previous count (None when no control was found: then nothing changes)."""
    previous = set_threads(count)
    try:
        yield previous
    finally:
        if previous is not None:
            set_threads(previous)


_limit_lock = threading.Lock()  # not _lock: set_threads may take _lock on its first search
_depth = 0
_saved: int | None = None


def limit_enter(count: int) -> None:
    """Start a limit shared by every execution running at once: the first to enter sets the
    count, the last to leave (:func:`limit_exit`) restores what was there before. Executions
    on several threads thus never restore a count under one another."""
    global _depth, _saved
    with _limit_lock:
        if _depth == 0:
            _saved = set_threads(count)
        _depth += 1


def limit_exit() -> None:
    global _depth, _saved
    with _limit_lock:
        _depth -= 1
        if _depth == 0 and _saved is not None:
            set_threads(_saved)
            _saved = None
