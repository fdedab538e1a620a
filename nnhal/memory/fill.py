"""A file's bytes copied into fresh memory on a native thread while the caller already reads
that memory (``fill.c``: the kernel's userfaultfd makes a page touched before its turn wait
for its bytes, and only that page).

Why: reading a large model into fresh memory costs its page faults (8-10 ms for 14 MB here),
and the open that follows reads only its tables at first. With a fill the open goes on at
once, the copy costs less (no fault per page), and a touched page is filled out of turn.

Where that cannot be had (not Linux, no C compiler, userfaultfd refused, as it is in many
containers, or ``NNHAL_NATIVE=0``) :func:`start` returns None and the caller reads the plain
way; :func:`status` says why. The library is compiled at first use into nnhal's per-user
cache, like the reference driver's kernels.
"""

from __future__ import annotations

import _thread
import atexit
import ctypes
import errno
import os
import platform
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("fill.c")
FLAGS = ("-O2", "-fPIC", "-shared", "-pthread")
#: A fill smaller than this is not worth a thread: read the plain way.
MIN_BYTES = 1 << 20

#: Seconds a fill let go of is waited for (on a thread of its own), and exit waits in all.
DROP_WAIT_S = 120.0
EXIT_WAIT_S = 10.0

_lock = threading.Lock()
_state: dict[str, object] = {}
#: The fills started, while anything holds them: exit waits for those not done.
_running: weakref.WeakSet[Filling] = weakref.WeakSet()


class Filling:
    """One fill under way (:func:`start`); it keeps the memory it writes alive until done."""

    __slots__ = ("_lib", "_handle", "_keep", "_result", "_waiting", "__weakref__")

    def __init__(self, lib: ctypes.CDLL, handle: int, keep: object) -> None:
        self._lib, self._handle, self._keep = lib, handle, keep
        self._result: tuple[int, int, int] | None = None
        #: Held by the one thread waiting in the library: the handle is freed by whoever
        #: sees the fill done, and no other thread may be inside a call on it then.
        self._waiting = threading.Lock()

    def wait(self, timeout: float) -> tuple[int, int, int] | None:
        """(errno, bytes read, faults served out of turn) once every page is filled (errno 0:
        every byte is the file's; ENODATA: the file got shorter, ESTALE: longer), or None when
        ``timeout`` seconds passed first."""
        if self._result is not None:
            return self._result
        end = time.monotonic() + max(0.0, timeout)
        if not self._waiting.acquire(timeout=max(0.0, timeout)):
            return None
        try:
            if self._result is None:
                ms = max(0, min(int((end - time.monotonic()) * 1000), 2**31 - 1))
                if not self._lib.nnhal_fill_wait(self._handle, ms):
                    return None
                got, served = ctypes.c_longlong(), ctypes.c_int()
                err = self._lib.nnhal_fill_result(self._handle, ctypes.byref(got),
                                                  ctypes.byref(served))
                self._lib.nnhal_fill_free(self._handle)
                self._result, self._keep = (err, got.value, served.value), None
            return self._result
        finally:
            self._waiting.release()

    def want(self, offsets: np.ndarray) -> None:
        """Copy in now the pages holding these byte offsets (int64, into the filled range),
        those not there yet: one call where reading them would fault once each. Nothing when
        another thread waits for the fill (it may free it) or it is done."""
        if self._result is not None or not self._waiting.acquire(blocking=False):
            return
        try:
            if self._result is None:
                arr = np.ascontiguousarray(offsets, np.int64)
                self._lib.nnhal_fill_want(self._handle, arr.ctypes.data, arr.size)
        finally:
            self._waiting.release()

    def park(self) -> None:
        """The owner lets go: a thread of its own waits for the fill, holding it and the
        memory it writes until done (never freed under the copy)."""
        if self._result is None:
            try:
                _thread.start_new_thread(self.wait, (DROP_WAIT_S,))
            except RuntimeError:  # no thread to be had (interpreter exit): wait here
                self.wait(DROP_WAIT_S)


def _drain(timeout: float = EXIT_WAIT_S) -> None:
    """At exit: wait for the fills under way (their memory must outlive the copy into it:
    what module teardown frees could be written after)."""
    end = time.monotonic() + timeout
    with _lock:
        fills = list(_running)
    for f in fills:
        f.wait(max(0.0, end - time.monotonic()))


def start(fd: int, offset: int, address: int, length: int, end: int, keep: object
          ) -> Filling | None:
    """Fill ``length`` bytes at ``address`` (page-aligned, owned by ``keep``; what it holds is
    dropped) from ``offset`` of file ``fd``, which must end at ``end``; None when that cannot
    be done here (read the plain way)."""
    if length < MIN_BYTES:
        return None
    lib = _library()
    if lib is None:
        return None
    handle = lib.nnhal_fill_start(fd, offset, address, length, end)
    if not handle:
        e = ctypes.get_errno()
        with _lock:  # refused once (EPERM, ENOSYS): refused for the process, said once
            if e != errno.ENOMEM:
                _state["lib"] = None
                _state["why"] = f"userfaultfd: {os.strerror(e)}"
        return None
    started = Filling(lib, handle, keep)
    with _lock:
        if not _state.get("atexit"):
            atexit.register(_drain)
            _state["atexit"] = True
        _running.add(started)
    return started


def available() -> bool:
    """Whether fills can be tried here (the library is built now when it is not yet)."""
    return _library() is not None


def status() -> str:
    """Why fills are not used in this process, or "" (also when none was tried yet)."""
    with _lock:
        return str(_state.get("why", ""))


def _library() -> ctypes.CDLL | None:
    with _lock:
        if "lib" not in _state:
            _state["lib"], _state["why"] = _load()
        return _state["lib"]  # type: ignore[return-value]


def _load() -> tuple[ctypes.CDLL | None, str]:
    if not sys.platform.startswith("linux"):
        return None, f"Linux only (this is {sys.platform})"
    from nnhal.core import native

    off = native.switched_off()
    if off:
        return None, off
    try:
        src = SOURCE.read_bytes()
    except OSError as e:
        return None, f"source missing: {e}"
    # Keyed by the source, not by the compiler (asking its version is a process per open):
    # this code has no arithmetic a compiler could change, so any build of it does the same.
    lib, why = native.build_cached("fill", [src, " ".join(FLAGS).encode(),
                                            platform.machine().encode()],
                                   SOURCE, FLAGS, use_errno=True)
    if lib is None:
        return None, why
    lib.nnhal_fill_start.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p,
                                     ctypes.c_size_t, ctypes.c_longlong]
    lib.nnhal_fill_start.restype = ctypes.c_void_p
    lib.nnhal_fill_wait.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.nnhal_fill_wait.restype = ctypes.c_int
    lib.nnhal_fill_result.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.nnhal_fill_result.restype = ctypes.c_int
    lib.nnhal_fill_want.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    lib.nnhal_fill_want.restype = None
    lib.nnhal_fill_free.argtypes = [ctypes.c_void_p]
    lib.nnhal_fill_free.restype = ctypes.c_int
    return lib, ""


__all__ = ["MIN_BYTES", "Filling", "available", "start", "status"]
