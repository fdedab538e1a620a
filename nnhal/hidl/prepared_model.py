"""HAL 1.3's callback-style execution (``execute_1_3`` with an IExecutionCallback): the HIDL
face's adapter over any canonical prepared model.

The canonical IPreparedModel has no asynchronous call (AIDL has none either): a driver
implements the synchronous one, and :func:`execute` builds HAL 1.3's on it, for every driver
at once (as upstream's HIDL adapter does), with these rules:

* no callback, or one without ``notify``: INVALID_ARGUMENT, nothing notified;
* the request is checked at launch (:meth:`~nnhal.hal.interfaces.IPreparedModel.validate_request`):
  a bad one is INVALID_ARGUMENT, returned and notified. A model that cannot check a request
  without running it (one adapted from AIDL) runs it at launch, on the caller's thread, and
  notifies before returning: INVALID_ARGUMENT is then the launch status too, as before;
* a deadline passed at launch: launched (NONE), then MISSED_DEADLINE_PERSISTENT through the
  callback, as VTS expects;
* else the synchronous call runs on the model's worker pool
  (:meth:`~nnhal.hal.interfaces.IPreparedModel.executor`, the pool of its priority, so that
  high-priority work does not queue behind low) or, for a model without one, a thread of its
  own, and its result is notified. A deadline that passes while the execution waits for a
  worker is MISSED_DEADLINE_TRANSIENT (it passed after the launch), and a measured
  ``time_in_driver`` counts from the launch, the wait included;
* a pool that refuses the work (its device was closed): GENERAL_FAILURE, returned and notified.

The callback is notified exactly once, and a client's exception in ``notify`` never reaches the
driver. A prepared model that carries the callback call itself (:class:`IHidlPreparedModel`: a
served driver's client, whose wire has the call) is passed the call as it is.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod

from nnhal.hal.interfaces import IPreparedModel
from nnhal.hal.types import (
    NO_TIME,
    NO_TIMING,
    ErrorStatus,
    MeasureTiming,
    OutputShape,
    Request,
    Timing,
)

__all__ = ["ExecutionCallback", "IExecutionCallback", "IHidlPreparedModel", "execute",
           "notify_execution"]


class IExecutionCallback(ABC):
    """IExecutionCallback (1.3): ``notify_1_3``."""

    @abstractmethod
    def notify(self, status: ErrorStatus, output_shapes: list[OutputShape],
               timing: Timing) -> None:
        """notify_1_3(status, outputShapes, timing)."""


class ExecutionCallback(IExecutionCallback):
    """A waitable IExecutionCallback that records how often it was notified."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self.calls = 0
        self.status = ErrorStatus.GENERAL_FAILURE
        self.output_shapes: list[OutputShape] = []
        self.timing: Timing = NO_TIMING

    def notify(self, status: ErrorStatus, output_shapes: list[OutputShape],
               timing: Timing) -> None:
        with self._lock:
            self.calls += 1
            if self.calls == 1:
                self.status, self.output_shapes, self.timing = (ErrorStatus(status),
                                                                list(output_shapes), timing)
        self._event.set()

    def wait(self, timeout: float | None = None
             ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        if not self._event.wait(timeout):
            raise TimeoutError("execution callback was not notified")
        return self.status, self.output_shapes, self.timing


class IHidlPreparedModel(ABC):
    """A prepared model that carries HAL 1.3's callback call itself, rather than through
    :func:`execute`'s adapter (the client of a served driver: the wire has the call, and the
    service answers it with the adapter over the driver)."""

    @abstractmethod
    def execute(self, request: Request, measure: MeasureTiming, deadline: int | None,
                loop_timeout: int | None, callback: IExecutionCallback) -> ErrorStatus:
        """execute_1_3(request, measure, deadline, loopTimeoutDuration, callback)."""


def notify_execution(callback: IExecutionCallback, status: ErrorStatus,
                     shapes: list[OutputShape], timing: Timing) -> None:
    """``callback.notify(status, shapes, timing)``, swallowing the client's exceptions."""
    try:
        callback.notify(status, shapes, timing)
    except Exception:  # noqa: BLE001 - a failing client callback must not kill the driver
        pass


def _since(timing: Timing, queued_ns: int) -> Timing:
    """``timing`` with the wait for a worker added to the time in driver (when measured)."""
    if queued_ns <= 0 or timing.time_in_driver == NO_TIME:
        return timing
    return Timing(time_on_device=timing.time_on_device,
                  time_in_driver=timing.time_in_driver + queued_ns // 1000)


def _run(prepared: IPreparedModel, request: Request, measure: MeasureTiming,
         deadline: int | None, loop_timeout: int | None
         ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
    try:
        return prepared.execute_synchronously(request, measure, deadline, loop_timeout)
    except Exception:  # noqa: BLE001 - the driver boundary: a raise is a failure
        return ErrorStatus.GENERAL_FAILURE, [], NO_TIMING


def execute(prepared: IPreparedModel | IHidlPreparedModel, request: Request,
            measure: MeasureTiming, deadline: int | None, loop_timeout: int | None,
            callback: IExecutionCallback) -> ErrorStatus:
    """``execute_1_3(request, measure, deadline, loopTimeoutDuration, callback)`` on
    ``prepared``: the launch status; the result comes through ``callback`` (see the module)."""
    if isinstance(prepared, IHidlPreparedModel):
        return prepared.execute(request, measure, deadline, loop_timeout, callback)
    started = time.monotonic_ns()
    if callback is None or not hasattr(callback, "notify"):
        return ErrorStatus.INVALID_ARGUMENT
    try:
        verdict = prepared.validate_request(request, measure, deadline, loop_timeout)
        status = ErrorStatus.NONE if verdict is None else ErrorStatus(verdict)
    except Exception:  # noqa: BLE001 - a driver that raises (or answers no status) failed
        status, verdict = ErrorStatus.GENERAL_FAILURE, ErrorStatus.GENERAL_FAILURE
    if verdict is None:  # no check without a run: run now, so that launch says INVALID
        status, shapes, timing = _run(prepared, request, measure, deadline, loop_timeout)
        notify_execution(callback, status, shapes, timing)
        return status if status == ErrorStatus.INVALID_ARGUMENT else ErrorStatus.NONE
    if status != ErrorStatus.NONE:
        notify_execution(callback, status, [], NO_TIMING)
        return status
    if deadline is not None and started > deadline:
        # Launched, then refused at once through the callback (as VTS expects).
        notify_execution(callback, ErrorStatus.MISSED_DEADLINE_PERSISTENT, [], NO_TIMING)
        return ErrorStatus.NONE

    def task() -> None:
        begun = time.monotonic_ns()
        if deadline is not None and begun > deadline:  # it passed while queued
            notify_execution(callback, ErrorStatus.MISSED_DEADLINE_TRANSIENT, [], NO_TIMING)
            return
        status, shapes, timing = _run(prepared, request, measure, deadline, loop_timeout)
        notify_execution(callback, status, shapes, _since(timing, begun - started))

    try:
        pool = prepared.executor()
        if pool is None:
            threading.Thread(target=task, name="nnhal-execute_1_3", daemon=True).start()
        else:
            pool.submit(task)
    except Exception:  # noqa: BLE001 - e.g. the pool was shut down
        notify_execution(callback, ErrorStatus.GENERAL_FAILURE, [], NO_TIMING)
        return ErrorStatus.GENERAL_FAILURE
    return ErrorStatus.NONE
