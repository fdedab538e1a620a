"""Sync fences: the HAL handle that executeFenced waits for and returns.

A :class:`SyncFence` is a one-shot event with three states (active, signalled, error). Its state
lives in the process, guarded by a condition; a file descriptor (an eventfd on Linux, a pipe
elsewhere) mirrors it and becomes readable once the fence leaves the active state, so a fence
can be polled with ``select``/``poll`` and could later be handed to another process.

Fenced execution itself (waiting for fences, running, completing the returned fence) is driver
machinery: :mod:`nnhal.drivers.common.fenced`.
"""

from __future__ import annotations

import enum
import os
import stat
import threading
import weakref
from collections.abc import Callable


class FenceState(enum.IntEnum):
    """The state of a sync fence, as ``syncWait`` reports it."""

    ACTIVE = 0
    SIGNALED = 1
    ERROR = 2


#: What ``/proc/self/fd`` shows for the descriptors that are sync fences: nnhal's own (an
#: eventfd) and the kernel's sync_file (what a GPU, camera or display driver exports). Both
#: become readable once signalled and never by data someone writes.
_FENCE_LINKS = ("anon_inode:[eventfd]", "anon_inode:sync_file")


def is_sync_fence_fd(fd: int) -> bool:
    """Whether ``fd`` is a sync fence that can be waited on: a pipe, socket or file would make
    a "fence" that signals when someone writes, or never."""
    if isinstance(fd, bool) or not isinstance(fd, int) or fd < 0:
        return False
    try:
        return os.readlink(f"/proc/self/fd/{fd}") in _FENCE_LINKS
    except OSError:
        if os.path.isdir("/proc/self/fd"):
            return False  # /proc is there: the descriptor is not open
    try:  # no /proc: an anonymous inode (eventfd), or the pipe of _open_fds' fallback
        mode = stat.S_IFMT(os.fstat(fd).st_mode)
    except OSError:
        return False
    return mode == 0 or (mode == stat.S_IFIFO and not hasattr(os, "eventfd"))


def _open_fds() -> tuple[int, int]:
    """(read fd, write fd) of the fence's readiness mirror; one fd when eventfd exists."""
    if hasattr(os, "eventfd"):
        fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        return fd, fd
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


def _close_fds(fds: list[int]) -> None:
    for fd in set(fds):
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
    fds[:] = [-1, -1]


class SyncFence:
    """A sync fence: starts active, completes once (signalled or error), then never changes.

    Thread-safe. ``close()`` releases the file descriptor (also done when the object is
    collected); the state keeps working after close, so a driver still holding a closed fence
    can signal it and in-process waiters still wake up.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._state = FenceState.ACTIVE
        self._callbacks: list[Callable[[SyncFence], None]] = []
        self._fds = list(_open_fds())
        # Closes the fds if the fence is dropped without close(): no leak either way.
        self._finalizer = weakref.finalize(self, _close_fds, self._fds)

    @classmethod
    def signaled(cls) -> SyncFence:
        """An already-signalled fence (what an empty handle in ``waitFor`` would mean)."""
        fence = cls()
        fence.signal()
        return fence

    # ---- state ------------------------------------------------------------------------------
    @property
    def state(self) -> FenceState:
        with self._cond:
            return self._state

    def fileno(self) -> int:
        """The fd that becomes readable when the fence completes; -1 once closed."""
        return self._fds[0]

    @property
    def closed(self) -> bool:
        return self._fds[0] < 0

    def wait(self, timeout_s: float | None = None) -> FenceState:
        """Wait until the fence completes or ``timeout_s`` passes (None: forever).

        Returns the state: ACTIVE means the wait timed out.
        """
        with self._cond:
            self._cond.wait_for(lambda: self._state != FenceState.ACTIVE, timeout_s)
            return self._state

    def signal(self) -> bool:
        """Complete the fence successfully; False if it had already completed."""
        return self._complete(FenceState.SIGNALED)

    def set_error(self) -> bool:
        """Complete the fence in error; False if it had already completed."""
        return self._complete(FenceState.ERROR)

    def add_done_callback(self, fn: Callable[[SyncFence], None]) -> None:
        """Call ``fn(fence)`` once the fence completes: now if it already has, otherwise from
        the thread that completes it. ``fn`` must be quick and must not raise."""
        with self._cond:
            if self._state == FenceState.ACTIVE:
                self._callbacks.append(fn)
                return
        fn(self)

    def _complete(self, state: FenceState) -> bool:
        with self._cond:
            if self._state != FenceState.ACTIVE:
                return False
            self._state = state
            callbacks, self._callbacks = self._callbacks, []
            fd = self._fds[1]
            if fd >= 0:
                try:
                    os.write(fd, (1).to_bytes(8, "little") if fd == self._fds[0] else b"\1")
                except OSError:
                    pass
            self._cond.notify_all()
        for fn in callbacks:
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - one bad waiter must not stop the others
                pass
        return True

    # ---- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Release the file descriptor; idempotent."""
        with self._cond:
            self._finalizer()

    def __enter__(self) -> SyncFence:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SyncFence({self._state.name}, fd={self._fds[0]})"


def signaled_fence() -> SyncFence:
    """An already-signalled fence."""
    return SyncFence.signaled()
