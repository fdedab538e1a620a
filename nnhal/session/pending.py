"""The Session cache entries this process is writing (see :mod:`nnhal.session.cache`).

A Session prepared on a miss returns (and runs) before its drivers have written their cache
files (:func:`~nnhal.drivers.common.compilation_cache.late_saves`): the entry that names
those files is written afterwards, on a thread of its own, once they are. A second open of the
same key in this process waits for it; close() joins it; exit waits, bounded. A process that
dies meanwhile leaves no entry (entries are renamed into place whole), and driver caches
that do not verify (their model cache is written last): the next open is a miss.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from nnhal.drivers.common.compilation_cache import SAVE_WAIT_S
from nnhal.session.background import Background


class PendingSaves:
    """The Session cache entries this process is writing, each on a thread of its own: it
    waits for the drivers' late saves (their cache files, which the entry names), then writes
    the entry. A second open of the same key waits for it; exit waits, bounded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[bytes, Background] = {}
        self._atexit = False

    def start(self, opened: Any, session: Any) -> Background:
        comp = session.compilation
        hals = [session.device] if session.device is not None else \
            [st.device.hal for st in (comp.steps if comp is not None else [])
             if st.device is not None]
        key = opened.key if opened.key is not None else opened.files()

        def work() -> None:
            from nnhal.session import cache as sc

            try:
                for hal in dict.fromkeys(hals):
                    wait = getattr(hal, "wait_cache_saves", None)
                    if wait is not None and not wait(SAVE_WAIT_S):
                        sc.log.info("session cache entry not written: a driver's cache "
                                    "save did not finish in %.0f s", SAVE_WAIT_S)
                        return
                opened.save(session)
            except Exception as e:  # noqa: BLE001 - caching never fails a Session
                sc.log.info("session cache entry not written: %s: %s", type(e).__name__, e)
            finally:
                with self._lock:
                    if self._threads.get(key) is t:
                        del self._threads[key]

        with self._lock:
            if not self._atexit:
                import atexit

                atexit.register(self.join_all)
                self._atexit = True
            # Started without waiting for it to run (it waits for the first run anyway); it
            # takes the lock above to drop itself, so it is in the table before it can.
            t = self._threads[key] = Background(work)
        return t

    def wait(self, key: bytes, timeout: float = SAVE_WAIT_S) -> None:
        with self._lock:
            t = self._threads.get(key)
        if t is not None and not t.is_current():
            t.join(timeout)

    def join_all(self, timeout: float = SAVE_WAIT_S) -> None:
        """Wait (at most ``timeout`` in all) for every entry being written."""
        end = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads.values())
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))


_PENDING = PendingSaves()


def start(opened: Any, session: Any) -> Background:
    """Write ``session``'s entry (``opened.save``) once its drivers' saves are done."""
    return _PENDING.start(opened, session)


def wait(key: bytes, timeout: float = SAVE_WAIT_S) -> None:
    """Wait for the entry of ``key`` when this process is writing it."""
    _PENDING.wait(key, timeout)
