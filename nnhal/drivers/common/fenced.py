"""Fenced execution (IPreparedModel::executeFenced, IExecution::computeFenced,
IFencedExecutionCallback), for any prepared model that offers a run method.

A fenced execution never occupies a worker while it waits: each fence in ``waitFor`` calls back
when it completes, and only when the last one is signalled is the run queued on the prepared
model's worker pool. A deadline that passes while the execution still waits aborts it from a
timer, so the returned fence never stays active forever because of a deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from nnhal.drivers.common.runs import PreparedRunner, Runner
from nnhal.hal import checks
from nnhal.hal.fence import FenceState, SyncFence
from nnhal.hal.interfaces import IFencedExecutionCallback
from nnhal.hal.request_pool import RequestPool
from nnhal.hal.types import NO_TIMING, ErrorStatus, MeasureTiming, Request, Timing
from nnhal.validation import ValidationError


class FencedExecutionCallback(IFencedExecutionCallback):
    """IFencedExecutionCallback of one fenced execution.

    As the HAL says, ``get_execution_info`` is to be called once the returned fence has
    completed; called earlier it returns GENERAL_FAILURE without timing. ``timeout_s`` lets an
    in-process caller block until the execution finishes instead.
    """

    def __init__(self) -> None:
        self._done = threading.Event()
        self._info: tuple[ErrorStatus, Timing, Timing] = (ErrorStatus.GENERAL_FAILURE,
                                                          NO_TIMING, NO_TIMING)

    def get_execution_info(self, timeout_s: float | None = 0.0
                           ) -> tuple[ErrorStatus, Timing, Timing]:
        if timeout_s != 0.0:
            self._done.wait(timeout_s)
        if not self._done.is_set():
            return ErrorStatus.GENERAL_FAILURE, NO_TIMING, NO_TIMING
        return self._info

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def _finish(self, status: ErrorStatus, launched: Timing, fenced: Timing) -> None:
        if not self._done.is_set():
            self._info = (ErrorStatus(status), launched, fenced)
            self._done.set()


FencedResult = tuple[ErrorStatus, SyncFence | None, FencedExecutionCallback | None]


def _us(ns: int) -> int:
    return max(0, ns // 1000)


def check_wait_for(wait_for: Sequence[object] | None) -> list[SyncFence]:
    """The ``waitFor`` fences, refusing anything that is not a usable fence."""
    if wait_for is None:
        return []
    try:
        fences = list(wait_for)
    except TypeError:
        raise ValidationError("waitFor is not a sequence of sync fences") from None
    for i, fence in enumerate(fences):
        if not isinstance(fence, SyncFence):
            raise ValidationError(f"waitFor[{i}] is not a sync fence")
        if fence.state == FenceState.ERROR:
            raise ValidationError(f"waitFor[{i}] is in error state")
    return fences


def check_duration(duration: int | None) -> None:
    if duration is not None and (not isinstance(duration, int) or isinstance(duration, bool)
                                 or duration < 0):
        raise ValidationError(f"invalid timeout duration {duration!r}")


def execute_fenced(pm: PreparedRunner, request: Request, wait_for: Sequence[object],
                   measure: MeasureTiming = MeasureTiming.NO, deadline: int | None = None,
                   loop_timeout: int | None = None, duration: int | None = None
                   ) -> FencedResult:
    """IPreparedModel::executeFenced for prepared model ``pm``; never raises."""
    started = time.monotonic_ns()
    try:
        checks.check_execution_args(request, measure, deadline, loop_timeout)
        checks.check_duration(duration)
        pools = pm.check_request(request, measure, loop_timeout, fenced=True)
        fences = check_wait_for(wait_for)
        check_duration(duration)
    except Exception as e:  # noqa: BLE001 - every bad argument is INVALID_ARGUMENT
        pm.device.log(f"invalid fenced execution: {e}")
        return ErrorStatus.INVALID_ARGUMENT, None, None
    if deadline is not None and started > deadline:
        return ErrorStatus.MISSED_DEADLINE_PERSISTENT, None, None
    task = FencedTask(pm, request, pools, MeasureTiming(measure), deadline, loop_timeout,
                       duration, started, fences)
    if not task.launch():
        task.fence.close()
        return ErrorStatus.GENERAL_FAILURE, None, None
    return ErrorStatus.NONE, task.fence, task.callback


class FencedTask:
    """One fenced execution: waits for its fences, runs once, completes fence and callback."""

    def __init__(self, pm: Runner, request: Request, pools: list[RequestPool],
                 measure: MeasureTiming, deadline: int | None, loop_timeout: int | None,
                 duration: int | None, started: int, fences: list[SyncFence]):
        self.pm = pm
        self.request = request
        self.pools = pools
        self.measure = measure
        self.deadline = deadline
        self.loop_timeout = loop_timeout
        self.duration = duration
        self.started = started
        self.fence = SyncFence()
        self.callback = FencedExecutionCallback()
        self._lock = threading.Lock()
        self._pending = len(fences)
        self._settled = False  # the run was queued, or the execution failed while waiting
        self._timer: threading.Timer | None = None
        self._fences = fences

    def launch(self) -> bool:
        """Start waiting; False if the work could not be queued at all."""
        if not self._fences:
            return self._queue(self.started, at_launch=True)
        delay = None if self.deadline is None else (self.deadline - time.monotonic_ns()) / 1e9
        if delay is not None and delay < threading.TIMEOUT_MAX:
            self._timer = threading.Timer(max(0.0, delay), self._deadline_passed)
            self._timer.daemon = True
            self._timer.start()
        for fence in self._fences:
            fence.add_done_callback(self._fence_done)
        return True

    def _claim(self) -> bool:
        """Exactly one of fence completion, error and deadline gets to settle the task."""
        with self._lock:
            if self._settled:
                return False
            self._settled = True
        if self._timer is not None:
            self._timer.cancel()
        return True

    def _fence_done(self, fence: SyncFence) -> None:
        if fence.state == FenceState.ERROR:
            if self._claim():
                self._fail(ErrorStatus.GENERAL_FAILURE, "a waitFor fence went to error")
            return
        with self._lock:
            self._pending -= 1
            last = self._pending == 0
        if last and self._claim():
            self._queue(time.monotonic_ns(), at_launch=False)

    def _deadline_passed(self) -> None:
        if self._claim():
            self._fail(ErrorStatus.MISSED_DEADLINE_TRANSIENT,
                       "deadline passed while waiting for fences")

    def _queue(self, fenced_ns: int, at_launch: bool) -> bool:
        try:
            self.pm.executor().submit(self._run, fenced_ns)
        except Exception:  # noqa: BLE001 - e.g. the device was closed
            if at_launch:
                return False
            self._fail(ErrorStatus.GENERAL_FAILURE, "could not queue the execution")
        return True

    def _fail(self, status: ErrorStatus, why: str) -> None:
        self.pm.device.log(f"fenced execution failed: {why}")
        self.callback._finish(status, NO_TIMING, NO_TIMING)
        self.fence.set_error()

    def _run(self, fenced_ns: int) -> None:
        deadline = self.deadline
        if self.duration is not None:
            limit = fenced_ns + self.duration
            deadline = limit if deadline is None else min(deadline, limit)
        status, _shapes, timing = self.pm.run(self.request, self.pools, self.measure, deadline,
                                              self.loop_timeout, fenced_ns)
        if status != ErrorStatus.NONE:
            self._fail(status, status.name)
            return
        launched = fenced = NO_TIMING
        if self.measure == MeasureTiming.YES and timing.time_on_device != NO_TIMING.time_on_device:
            end = time.monotonic_ns()
            launched = Timing(timing.time_on_device, _us(end - self.started))
            fenced = Timing(timing.time_on_device, _us(end - fenced_ns))
        # Info first, then the fence: whoever wakes on the fence finds the result ready.
        self.callback._finish(ErrorStatus.NONE, launched, fenced)
        self.fence.signal()
