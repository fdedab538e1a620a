"""The reference driver's IPreparedModel: an immutable plan plus the execution paths.

A prepared model is never mutated after preparation; every execution gets its own slot list,
so any number of executions may run concurrently on one prepared model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING

import numpy as np

from nnhal.executor import ExecutionError, ModelPlan, RunState, run_request
from nnhal.hal.checks import check_execution_args
from nnhal.hal.interfaces import IExecutionCallback, IPreparedModel
from nnhal.hal.types import (
    LOOP_TIMEOUT_DEFAULT_NS,
    NO_TIMING,
    ErrorStatus,
    MeasureTiming,
    MemoryPool,
    OutputShape,
    Priority,
    Request,
    Timing,
)
from nnhal.memory import MemoryError_, SharedMemory, shrunk_memory
from nnhal.ops.registry import OpError
from nnhal.validation import (
    BUFFER_POOL,
    ValidationError,
    validate_loop_timeout,
    validate_measure,
    validate_request,
)

if TYPE_CHECKING:
    from nnhal.driver.device import ReferenceDevice

Result = tuple[ErrorStatus, list[OutputShape], Timing]


def _us(ns: int) -> int:
    return max(0, ns // 1000)


class ReferencePreparedModel(IPreparedModel):
    """IPreparedModel of the reference CPU driver."""

    def __init__(self, device: ReferenceDevice, plan: ModelPlan, priority: Priority):
        self.device = device
        self.plan = plan
        self.priority = priority

    # ---- request checking (shared by every execution path) --------------------------------
    def resolve_pools(self, request: Request) -> tuple[list[object], list[int]]:
        """Map each request pool once: uint8 arrays for memory, buffers for tokens."""
        arrays: list[object] = []
        sizes: list[int] = []
        for i, pool in enumerate(request.pools):
            mem = pool.hidl_memory if isinstance(pool, MemoryPool) else pool
            token = pool.token if isinstance(pool, MemoryPool) else None
            if token is not None:
                buf = self.device.lookup_buffer(token)
                if buf is None:
                    raise ValidationError(f"request pool {i}: unknown buffer token {token}")
                arrays.append(buf)
                sizes.append(BUFFER_POOL)
                continue
            if not isinstance(mem, SharedMemory):
                raise ValidationError(f"request pool {i}: not a shared memory or token")
            try:
                arrays.append(mem.mapped())  # its size is checked when the run starts
            except MemoryError_ as e:
                raise ValidationError(f"request pool {i}: {e}") from e
            sizes.append(mem.size)
        return arrays, sizes

    def check_request(self, request: Request, measure: MeasureTiming,
                      loop_timeout: int | None, *, fenced: bool = False) -> list[object]:
        """Validate a request for this model; returns the mapped pools."""
        if not isinstance(request, Request):
            raise ValidationError("not a Request")
        validate_measure(measure)
        validate_loop_timeout(loop_timeout)
        pools, sizes = self.resolve_pools(request)
        validate_request(request, self.plan.signature, sizes, require_output_dims=fenced)
        for pool in pools:
            if not isinstance(pool, np.ndarray):
                pool.check_request_use(self, request)  # type: ignore[attr-defined]
        return pools

    # ---- the run itself -------------------------------------------------------------------
    def run(self, request: Request, pools: Sequence[object], measure: MeasureTiming,
            deadline: int | None, loop_timeout: int | None, started_ns: int) -> Result:
        """Run a validated request; never raises."""
        rt = RunState(deadline, LOOP_TIMEOUT_DEFAULT_NS if loop_timeout is None
                      else loop_timeout)
        device_start = time.monotonic_ns()
        try:
            rt.check_deadline()
            why = shrunk_memory(request.pools)  # a client shrank a memory: it would fault
            if why is not None:
                raise ExecutionError(ErrorStatus.INVALID_ARGUMENT, why)
            status, shapes = run_request(self.plan, request, pools, rt)
        except ExecutionError as e:  # failures fall through: driver buffers must see them
            self.device.log(f"execution failed: {e}")
            status, shapes = e.status, []
        except OpError as e:
            self.device.log(f"execution failed: {e}")
            status, shapes = e.status, []
        except Exception as e:  # noqa: BLE001 - the driver boundary: never raise
            self.device.log(f"execution failed: {type(e).__name__}: {e}")
            status, shapes = ErrorStatus.GENERAL_FAILURE, []
        for pool in pools:
            if not isinstance(pool, np.ndarray):
                pool.after_execution(self, request, status)  # type: ignore[attr-defined]
        if status != ErrorStatus.NONE or measure != MeasureTiming.YES:
            return status, shapes, NO_TIMING
        end = time.monotonic_ns()
        return status, shapes, Timing(time_on_device=_us(end - device_start),
                                      time_in_driver=_us(end - started_ns))

    def _invalid(self, e: Exception) -> Result:
        self.device.log(f"invalid request: {e}")
        return ErrorStatus.INVALID_ARGUMENT, [], NO_TIMING

    # ---- IPreparedModel -------------------------------------------------------------------
    def execute_synchronously(self, request: Request, measure: MeasureTiming = MeasureTiming.NO,
                              deadline: int | None = None, loop_timeout: int | None = None
                              ) -> Result:
        started = time.monotonic_ns()
        try:
            check_execution_args(request, measure, deadline, loop_timeout)
            pools = self.check_request(request, measure, loop_timeout)
        except Exception as e:  # noqa: BLE001 - any malformed request is INVALID_ARGUMENT
            return self._invalid(e)
        if deadline is not None and started > deadline:
            return ErrorStatus.MISSED_DEADLINE_PERSISTENT, [], NO_TIMING
        return self.run(request, pools, measure, deadline, loop_timeout, started)

    def execute(self, request: Request, measure: MeasureTiming, deadline: int | None,
                loop_timeout: int | None, callback: IExecutionCallback) -> ErrorStatus:
        started = time.monotonic_ns()
        if callback is None or not hasattr(callback, "notify"):
            return ErrorStatus.INVALID_ARGUMENT
        try:
            check_execution_args(request, measure, deadline, loop_timeout)
            pools = self.check_request(request, measure, loop_timeout)
        except Exception as e:  # noqa: BLE001
            self._invalid(e)
            _notify(callback, ErrorStatus.INVALID_ARGUMENT, [], NO_TIMING)
            return ErrorStatus.INVALID_ARGUMENT
        if deadline is not None and started > deadline:
            # Launched, then refused at once through the callback (as VTS expects).
            _notify(callback, ErrorStatus.MISSED_DEADLINE_PERSISTENT, [], NO_TIMING)
            return ErrorStatus.NONE

        def task() -> None:
            status, shapes, timing = self.run(request, pools, measure, deadline, loop_timeout,
                                              started)
            _notify(callback, status, shapes, timing)

        try:
            self.executor().submit(task)
        except Exception:  # noqa: BLE001 - e.g. the pool was shut down
            _notify(callback, ErrorStatus.GENERAL_FAILURE, [], NO_TIMING)
            return ErrorStatus.GENERAL_FAILURE
        return ErrorStatus.NONE

    def execute_fenced(self, request: Request, wait_for: Sequence[object],
                       measure: MeasureTiming = MeasureTiming.NO, deadline: int | None = None,
                       loop_timeout: int | None = None, duration: int | None = None
                       ) -> tuple[ErrorStatus, object, object]:
        from nnhal.driver.fence import execute_fenced  # fenced execution lives in fence.py

        return execute_fenced(self, request, wait_for, measure, deadline, loop_timeout, duration)

    def configure_execution_burst(self) -> tuple[ErrorStatus, object]:
        from nnhal.driver.burst import ReferenceBurst  # bursts live in burst.py

        return ErrorStatus.NONE, ReferenceBurst(self)

    def create_reusable_execution(self, request: Request,
                                  measure: MeasureTiming = MeasureTiming.NO,
                                  loop_timeout: int | None = None) -> tuple[ErrorStatus, object]:
        from nnhal.driver.execution import ReferenceExecution  # reusable executions

        return ReferenceExecution.create(self, request, measure, loop_timeout)

    def executor(self) -> Executor:
        return self.device.executor_for(self.priority)


def _notify(callback: IExecutionCallback, status: ErrorStatus, shapes: list[OutputShape],
            timing: Timing) -> None:
    try:
        callback.notify(status, shapes, timing)
    except Exception:  # noqa: BLE001 - a failing client callback must not kill the driver
        pass
