"""Sync fences and fenced execution (IPreparedModel::executeFenced, IFencedExecutionCallback).

A :class:`SyncFence` is a one-shot event with three states (active, signalled, error). Its state
lives in the process, guarded by a condition; a file descriptor (an eventfd on Linux, a pipe
elsewhere) mirrors it and becomes readable once the fence leaves the active state, so a fence
can be polled with ``select``/``poll`` and could later be handed to another process.

A fenced execution never occupies a worker while it waits: each fence in ``waitFor`` calls back
when it completes, and only when the last one is signalled is the run queued on the prepared
model's worker pool. A deadline that passes while the execution still waits aborts it from a
timer, so the returned fence never stays active forever because of a deadline.
"""

from __future__ import annotations

import enum
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from nnhal.hal import checks
from nnhal.hal.interfaces import IFencedExecutionCallback
from nnhal.hal.types import NO_TIMING, ErrorStatus, MeasureTiming, Request, Timing
from nnhal.validation import ValidationError

if TYPE_CHECKING:
    from nnhal.driver.prepared_model import ReferencePreparedModel


class FenceState(enum.IntEnum):
    """The state of a sync fence, as ``syncWait`` reports it."""

    ACTIVE = 0
    SIGNALED = 1
    ERROR = 2


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


def check_wait_for(wait_for: Sequence[object]) -> list[SyncFence]:
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


def execute_fenced(pm: ReferencePreparedModel, request: Request, wait_for: Sequence[object],
                   measure: MeasureTiming = MeasureTiming.NO, deadline: int | None = None,
                   loop_timeout: int | None = None, duration: int | None = None
                   ) -> FencedResult:
    """IPreparedModel::executeFenced for the reference prepared model; never raises."""
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

    def __init__(self, pm: ReferencePreparedModel, request: Request, pools: list[object],
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
