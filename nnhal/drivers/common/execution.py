"""Reusable executions (canonical IExecution): a request validated once, computed many times.

Creation copies the request's structure (so later changes by the client cannot bypass the
validation), validates it and maps its pools once. ``compute`` then only re-checks what can
change between computations and is cheap to check: that no request memory was closed and that
every driver-managed buffer may still be used (not freed, inputs initialized with compatible
dimensions).

At most one computation runs on an execution at a time (IExecution says so): a second caller
waits for the first to finish, or until its own deadline passes (MISSED_DEADLINE_TRANSIENT).
An execution made by a burst shares the burst's one-at-a-time rule and, as upstream's
burst executions do, refuses ``compute_fenced`` with GENERAL_FAILURE.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from nnhal.drivers.common.fenced import FencedTask, check_duration, check_wait_for
from nnhal.drivers.common.request_checks import snapshot_request
from nnhal.drivers.common.runs import ExclusiveRuns, PreparedRunner, Result, run_exclusive
from nnhal.hal import checks
from nnhal.hal.fence import SyncFence
from nnhal.hal.interfaces import IExecution, IFencedExecutionCallback
from nnhal.hal.request_pool import RequestPool
from nnhal.hal.types import (
    NO_TIMING,
    ErrorStatus,
    MeasureTiming,
    MemoryPool,
    Request,
)
from nnhal.memory import SharedMemory
from nnhal.validation import BUFFER_POOL, ValidationError, validate_request


class ExecutionBurst(Protocol):
    """A burst as the reusable executions it creates see it."""

    #: Held by the one execution running on the burst.
    execution_lock: threading.Lock

    def resolve_pools(self, request: Request) -> tuple[list[RequestPool], list[int]]: ...

    def holds_for(self, request: Request) -> list[Any]: ...


class ReusableExecution(IExecution):
    """A reusable execution of one validated request on a prepared model."""

    def __init__(self, pm: PreparedRunner, request: Request, pools: list[RequestPool],
                 measure: MeasureTiming, loop_timeout: int | None, *,
                 burst: ExecutionBurst | None = None, holds: Sequence[object] = ()):
        self._pm = pm
        self._request = request
        self._pools = pools
        self._measure = MeasureTiming(measure)
        self._loop_timeout = loop_timeout
        self._burst = burst
        # Cache holds of the burst's memories: they stay cached while this execution lives.
        self._holds = tuple(holds)
        self._lock = burst.execution_lock if burst is not None else threading.Lock()
        mems = (p.hidl_memory if isinstance(p, MemoryPool) else p for p in request.pools)
        self._memories = [m for m in mems if isinstance(m, SharedMemory)]
        self._buffers = [p for p in pools if not isinstance(p, np.ndarray)]
        # Fenced computations need fully specified outputs: decided once, here.
        sizes = [p.size if isinstance(p, np.ndarray) else BUFFER_POOL for p in pools]
        try:
            validate_request(request, pm.signature, sizes, require_output_dims=True)
            self._fenced_error: str | None = None
        except ValidationError as e:
            self._fenced_error = str(e)
        # The request bound once: input views, output destinations (when the driver binds).
        bind = getattr(pm, "request_plan", None)
        self._prepared = bind(request, pools) if bind is not None else None
        #: Bound, and no driver buffer to check before each computation.
        self._plain = self._prepared is not None and not self._buffers

    @classmethod
    def create(cls, pm: PreparedRunner, request: Request, measure: MeasureTiming,
               loop_timeout: int | None, burst: ExecutionBurst | None = None
               ) -> tuple[ErrorStatus, ReusableExecution | None]:
        """createReusableExecution: validate once; INVALID_ARGUMENT if the request is bad."""
        try:
            checks.check_execution_args(request, measure, None, loop_timeout)
            req = snapshot_request(request)
            if burst is not None:
                pools = pm.check_request(req, measure, loop_timeout,
                                         resolve=burst.resolve_pools)
                holds = burst.holds_for(req)
            else:
                pools, holds = pm.check_request(req, measure, loop_timeout), []
            return ErrorStatus.NONE, cls(pm, req, pools, measure, loop_timeout, burst=burst,
                                         holds=holds)
        except Exception as e:  # noqa: BLE001 - every bad argument is INVALID_ARGUMENT
            pm.device.log(f"invalid reusable execution: {e}")
            return ErrorStatus.INVALID_ARGUMENT, None

    def _recheck(self) -> str | None:
        """What may have changed since creation; a reason to refuse, or None."""
        for mem in self._memories:
            if mem.closed:
                return f"{mem!r} was closed"
        for buf in self._buffers:
            try:
                buf.check_request_use(self._pm, self._request)
            except ValidationError as e:
                return str(e)
        return None

    def _check_call(self, deadline: object, started: int) -> ErrorStatus:
        if deadline is not None and (not isinstance(deadline, int) or isinstance(deadline, bool)):
            self._pm.device.log(f"invalid deadline {deadline!r}")
            return ErrorStatus.INVALID_ARGUMENT
        why = self._recheck()
        if why is not None:
            self._pm.device.log(f"reusable execution refused: {why}")
            return ErrorStatus.INVALID_ARGUMENT
        if deadline is not None and started > deadline:
            return ErrorStatus.MISSED_DEADLINE_PERSISTENT
        return ErrorStatus.NONE

    # ---- IExecution -----------------------------------------------------------------------
    def compute(self, deadline: int | None = None) -> Result:
        started = time.monotonic_ns()
        if deadline is None and self._plain:  # the common case: bound, no driver buffers
            for mem in self._memories:
                if mem.closed:
                    break
            else:
                lock = self._lock
                if lock.acquire(blocking=False):
                    try:
                        return self._pm.run(self._request, self._pools,  # type: ignore[call-arg]
                                            self._measure, None, self._loop_timeout, started,
                                            self._prepared)
                    finally:
                        lock.release()
        try:
            if deadline is None and not self._buffers:  # the common case, checked quickly
                status = ErrorStatus.NONE
                for mem in self._memories:
                    if mem.closed:
                        status = self._check_call(deadline, started)
                        break
            else:
                checks.check_deadline(deadline)
                status = self._check_call(deadline, started)
        except Exception as e:  # noqa: BLE001 - the driver boundary: never raise
            self._pm.device.log(f"reusable execution refused: {type(e).__name__}: {e}")
            status = ErrorStatus.INVALID_ARGUMENT
        if status != ErrorStatus.NONE:
            return status, [], NO_TIMING
        return run_exclusive(self._lock, self._pm, self._request, self._pools, self._measure,
                             deadline, self._loop_timeout, started, self._prepared)

    def compute_fenced(self, wait_for: Sequence[object], deadline: int | None = None,
                       timeout_after_fence: int | None = None
                       ) -> tuple[ErrorStatus, SyncFence | None, IFencedExecutionCallback | None]:
        if self._burst is not None:
            return ErrorStatus.GENERAL_FAILURE, None, None  # as upstream's burst executions
        started = time.monotonic_ns()
        try:
            checks.check_deadline(deadline)
            checks.check_duration(timeout_after_fence, "timeoutDurationAfterFence")
            if self._fenced_error is not None:
                raise ValidationError(self._fenced_error)
            fences = check_wait_for(wait_for)
            check_duration(timeout_after_fence)
            status = self._check_call(deadline, started)
        except Exception as e:  # noqa: BLE001 - every bad argument is INVALID_ARGUMENT
            self._pm.device.log(f"invalid fenced computation: {e}")
            return ErrorStatus.INVALID_ARGUMENT, None, None
        if status != ErrorStatus.NONE:
            return status, None, None
        task = FencedTask(ExclusiveRuns(self._pm, self._lock),
                           self._request, self._pools, self._measure, deadline,
                           self._loop_timeout, timeout_after_fence, started, fences)
        if not task.launch():
            task.fence.close()
            return ErrorStatus.GENERAL_FAILURE, None, None
        return ErrorStatus.NONE, task.fence, task.callback


def create_reusable_execution(pm: PreparedRunner, request: Request,
                              measure: MeasureTiming = MeasureTiming.NO,
                              loop_timeout: int | None = None
                              ) -> tuple[ErrorStatus, ReusableExecution | None]:
    """IPreparedModel::createReusableExecution for a prepared model."""
    return ReusableExecution.create(pm, request, measure, loop_timeout)
