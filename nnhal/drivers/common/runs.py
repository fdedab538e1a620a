"""Running a checked request on a prepared model: what the shared machinery needs of a
driver's prepared model (:class:`Runner`, :class:`PreparedRunner`), and runs of one execution
at a time.

The canonical IBurst and IExecution allow one execution at a time: :func:`run_exclusive` runs
while holding a lock, and a caller that cannot get it before its own deadline gets
MISSED_DEADLINE_TRANSIENT. :class:`ExclusiveRuns` is a prepared model whose every run holds a
lock, for a fenced computation of a reusable execution.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, Protocol

from nnhal.hal.request_pool import RequestPool
from nnhal.hal.types import (
    NO_TIMING,
    ErrorStatus,
    MeasureTiming,
    OutputShape,
    Request,
    Subgraph,
    Timing,
)

#: What an execution returns: (status, output shapes, timing).
Result = tuple[ErrorStatus, list[OutputShape], Timing]


class DriverLog(Protocol):
    """Where a driver's diagnostics go (a device)."""

    def log(self, message: str) -> None: ...


class Runner(Protocol):
    """A prepared model as the shared machinery runs it."""

    @property
    def device(self) -> DriverLog: ...

    def executor(self) -> Executor:
        """The worker pool of the prepared model's priority."""
        ...

    def run(self, request: Request, pools: Sequence[RequestPool], measure: MeasureTiming,
            deadline: int | None, loop_timeout: int | None, started_ns: int) -> Result:
        """Run a checked request; never raises."""
        ...


class PreparedRunner(Runner, Protocol):
    """A prepared model as fenced execution, bursts and reusable executions use it: it also
    maps and checks requests (see :mod:`nnhal.drivers.common.request_checks`)."""

    @property
    def signature(self) -> Subgraph:
        """The main inputs and outputs requests are checked against."""
        ...

    def resolve_pools(self, request: Request) -> tuple[list[RequestPool], list[int]]:
        """The request's pools mapped, and their sizes."""
        ...

    def check_request(self, request: Request, measure: MeasureTiming,
                      loop_timeout: int | None, *, fenced: bool = False,
                      resolve: Callable[[Request], tuple[list[RequestPool], list[int]]]
                      | None = None) -> list[RequestPool]:
        """The request checked, its pools mapped by ``resolve`` (default: resolve_pools)."""
        ...


def run_exclusive(lock: threading.Lock, pm: Runner, request: Request,
                  pools: Sequence[RequestPool], measure: MeasureTiming, deadline: int | None,
                  loop_timeout: int | None, started: int, prepared: object = None) -> Result:
    """``pm.run`` while holding ``lock``; a caller that cannot get it before its deadline
    gets MISSED_DEADLINE_TRANSIENT. ``prepared`` (the request bound by the prepared model,
    when it binds requests) is passed on. Never raises."""
    if not lock.acquire(blocking=False):
        if deadline is None:
            lock.acquire()
        else:
            wait_s = min(max(0.0, (deadline - time.monotonic_ns()) / 1e9), threading.TIMEOUT_MAX)
            if not lock.acquire(timeout=wait_s):
                return ErrorStatus.MISSED_DEADLINE_TRANSIENT, [], NO_TIMING
    try:
        if prepared is None:
            return pm.run(request, pools, measure, deadline, loop_timeout, started)
        return pm.run(request, pools, measure, deadline, loop_timeout, started,
                      prepared)  # type: ignore[call-arg]
    finally:
        lock.release()


class ExclusiveRuns:
    """The prepared model as a fenced task uses it, each run holding the execution's lock."""

    def __init__(self, pm: Runner, lock: threading.Lock):
        self.pm = pm
        self.device = pm.device
        self._lock = lock

    def executor(self) -> Executor:
        return self.pm.executor()

    def run(self, *args: Any) -> Result:
        with self._lock:
            return self.pm.run(*args)
