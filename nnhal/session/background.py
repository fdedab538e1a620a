"""Work a Session starts on a thread of its own without waiting for that thread to run.

Why: ``threading.Thread.start`` waits until the new thread has run (it hands the GIL over and
back), which costs 0.3-4 ms on busy cores, on the way of every open that hashes its file or
writes a cache entry. A :class:`Background` starts its thread and returns at once; the thread
takes the GIL when the caller next lets it go.
"""

from __future__ import annotations

import _thread
import threading
from collections.abc import Callable


class Background:
    """``fn()`` on a new thread: :meth:`join` waits for it (bounded by ``timeout``),
    :meth:`is_current` says whether the caller is that thread. ``fn`` must catch what it
    raises (what escapes is dropped). RuntimeError when no thread can be had."""

    __slots__ = ("_done", "_ident")

    def __init__(self, fn: Callable[[], object]) -> None:
        self._done = threading.Event()
        self._ident: int | None = None

        def run() -> None:
            self._ident = _thread.get_ident()
            try:
                fn()
            except BaseException:  # noqa: BLE001 - nowhere to raise it on a bare thread
                pass
            finally:
                self._done.set()

        _thread.start_new_thread(run, ())

    def join(self, timeout: float | None = None) -> bool:
        """True once ``fn`` returned; False when ``timeout`` passed first."""
        return self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def is_current(self) -> bool:
        return self._ident == _thread.get_ident()


__all__ = ["Background"]
