"""Worker pools: one per priority, so high-priority work never queues behind low."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from nnhal.hal.types import Priority


def _nothing() -> None:
    pass


class WorkerPools:
    """A device's worker threads for asynchronous preparations and executions: one pool of at
    most ``workers`` threads per priority, created on first use (or by :meth:`start`)."""

    def __init__(self, workers: int, name: str = "nnhal"):
        self._workers = workers
        self._name = name
        self._pools: dict[Priority, ThreadPoolExecutor] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start one worker of every priority now, so that the first preparation or execution
        of each priority does not pay for creating a thread."""
        for priority in Priority:
            self.for_priority(priority).submit(_nothing)

    def for_priority(self, priority: Priority) -> ThreadPoolExecutor:
        """The pool of ``priority``."""
        with self._lock:
            pool = self._pools.get(priority)
            if pool is None:
                pool = ThreadPoolExecutor(self._workers,
                                          thread_name_prefix=f"{self._name}-"
                                                             f"{priority.name.lower()}")
                self._pools[priority] = pool
            return pool

    def close(self) -> None:
        """Shut every pool down, waiting for the work already queued."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            p.shutdown(wait=True)
