"""What every driver's IPreparedModel shares: request checking, recognising the request run
last, the synchronous and fenced paths, bursts and reusable executions (HAL 1.3's
callback-style call is the HIDL face's, over the synchronous one: :mod:`nnhal.hidl`).

A driver subclasses :class:`PreparedModelBase` and gives two things: :meth:`execute_checked`
(run one validated request on its engine) and, optionally, :meth:`request_plan` (bind a
validated request once, for runs of it again and again). Everything around a run (deadline,
shrunk memories, driver buffers told how it ended, timing, never raising) is done here, once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any, Protocol

import numpy as np

from nnhal.drivers.common.burst import DriverBurst
from nnhal.drivers.common.execution import ReusableExecution
from nnhal.drivers.common.fenced import FencedResult, execute_fenced
from nnhal.drivers.common.request_checks import (
    BoundRequests,
    Recent,
    Resolver,
    check_request,
    request_key,
    resolve_pools,
    same_request,
    snapshot_request,
)
from nnhal.drivers.common.runs import Result
from nnhal.drivers.common.tokens import TokenRegistry
from nnhal.executor import RunError, RunState
from nnhal.hal.checks import UINT64_MAX, check_execution_args
from nnhal.hal.interfaces import IPreparedModel
from nnhal.hal.request_pool import RequestBuffer, RequestPool
from nnhal.hal.types import (
    LOOP_TIMEOUT_DEFAULT_NS,
    LOOP_TIMEOUT_MAXIMUM_NS,
    NO_TIMING,
    ErrorStatus,
    MeasureTiming,
    OutputShape,
    Priority,
    Request,
    Subgraph,
    Timing,
)
from nnhal.memory import shrunk_memory
from nnhal.memory.pool import shrunk_watched
from nnhal.ops.resolver import OpError


class PreparingDevice(Protocol):
    """The device as its prepared models see it."""

    buffers: TokenRegistry[RequestBuffer]

    def log(self, message: str) -> None: ...

    def executor_for(self, priority: Priority) -> Executor: ...


#: The run state of every execution without deadline or loop timeout (nothing changes it).
_PLAIN_RUN = RunState(None, LOOP_TIMEOUT_DEFAULT_NS)
_NO, _YES = MeasureTiming.NO, MeasureTiming.YES
_NONE = ErrorStatus.NONE


class PreparedModelBase(IPreparedModel):
    """An IPreparedModel over any engine: subclasses give :meth:`execute_checked` and
    :attr:`signature`, and may bind requests (:meth:`request_plan`).

    A bound request (what :meth:`request_plan` returns) must have ``request`` (the snapshot it
    was made from), ``watch`` (memories to check for shrinking, see
    :func:`~nnhal.memory.pool.shrunk_watched`) and ``buffers`` (whether a pool is a driver
    buffer).
    """

    def __init__(self, device: PreparingDevice, priority: Priority):
        self.device = device
        self.priority = priority
        #: Requests recently bound (see :meth:`bind`): a request made again with the same
        #: values and memories (a new Request object each time) is not validated and bound
        #: again.
        self._bound = BoundRequests()
        #: The request bound last, recognised without validating it again (see :meth:`recent`).
        #: Why here, when a served request was decoded once already: the driver checks what
        #: any caller sends (in process, the service, the runtime), and a caller may change
        #: a request object between calls; comparing it with this snapshot is the check.
        self._recent: Recent | None = None

    # ---- what a driver gives ----------------------------------------------------------------
    @property
    def signature(self) -> Subgraph:
        """The main inputs and outputs, as requests are checked against them."""
        raise NotImplementedError

    def execute_checked(self, request: Request, pools: Sequence[RequestPool], rt: RunState,
                        prepared: Any) -> tuple[ErrorStatus, list[OutputShape]]:
        """Run a validated request (bound in ``prepared`` when not None); may raise
        RunError / OpError (their status is the result) or anything else
        (GENERAL_FAILURE)."""
        raise NotImplementedError

    def request_plan(self, request: Request, pools: Sequence[RequestPool]) -> Any:
        """A validated request bound to this model for runs of it again and again
        (``request`` must not change afterwards: pass a snapshot); None: runs take the
        generic way."""
        return None

    # ---- request checking (shared by every execution path) --------------------------------
    def resolve_pools(self, request: Request) -> tuple[list[RequestPool], list[int]]:
        """Map each request pool once: uint8 arrays for memory, buffers for tokens."""
        return resolve_pools(request, self.device.buffers)

    def check_request(self, request: Request, measure: MeasureTiming,
                      loop_timeout: int | None, *, fenced: bool = False,
                      resolve: Resolver | None = None) -> list[RequestPool]:
        """Validate a request for this model; returns the pools ``resolve`` mapped (by
        default :meth:`resolve_pools`; a burst maps its cached memories itself)."""
        return check_request(self, self.signature, resolve or self.resolve_pools, request,
                             measure, loop_timeout, fenced=fenced)

    def bound(self, key: tuple[object, ...], pools: list[RequestPool]) -> Any:
        """The request validated and bound earlier with argument values ``key`` (see
        :func:`request_key`) and these very pools; None if there is none."""
        return self._bound.get(key, pools)

    def bind(self, request: Request, pools: list[RequestPool],
             key: tuple[object, ...] | None = None) -> Any:
        """A *validated* request bound, found again or made (from a snapshot of the request)
        and kept for the next identical request; None when a pool is a driver buffer (such
        requests take the generic way)."""
        for pool in pools:
            if not isinstance(pool, np.ndarray):
                return None
        if key is None:
            key = request_key(request)
        found = self._bound.get(key, pools)
        if found is None:
            found = self.request_plan(snapshot_request(request), pools)
            if found is not None:
                self._bound.put(key, pools, found)
        if found is not None:
            self._recent = Recent.of(found.request, pools, found)
        return found

    def recent(self, request: object, measure: object, deadline: object,
               loop_timeout: object) -> Recent | None:
        """The request bound last, when ``request`` has its very argument values and
        memories (see :func:`same_request`) and the other arguments are plainly valid (measure
        a MeasureTiming, deadline and loop timeout None or ints in range): such a request needs
        neither checking nor mapping again. None means "check it the usual way"."""
        found = self._recent
        if found is None or (measure is not _NO and measure is not _YES):
            return None
        if deadline is not None and not (type(deadline) is int and
                                         0 <= deadline <= UINT64_MAX):  # type: ignore[operator]
            return None
        if loop_timeout is not None and not (type(loop_timeout) is int and
                                             0 <= loop_timeout <=  # type: ignore[operator]
                                             LOOP_TIMEOUT_MAXIMUM_NS):
            return None
        return found if same_request(request, found) else None

    # ---- the run itself -------------------------------------------------------------------
    def run(self, request: Request, pools: Sequence[RequestPool], measure: MeasureTiming,
            deadline: int | None, loop_timeout: int | None, started_ns: int,
            prepared: Any = None) -> Result:
        """Run a validated request (bound in ``prepared`` when given); never raises."""
        rt = _PLAIN_RUN if deadline is None and loop_timeout is None else RunState(
            deadline, LOOP_TIMEOUT_DEFAULT_NS if loop_timeout is None else loop_timeout)
        timed = measure == _YES
        device_start = time.monotonic_ns() if timed else 0
        try:
            if deadline is not None:
                rt.check_deadline()
            # A client shrank a memory: touching it would fault.
            if prepared is None:
                why = shrunk_memory(request.pools)
            else:
                why = shrunk_watched(prepared.watch) if prepared.watch else None
            if why is not None:
                raise RunError(ErrorStatus.INVALID_ARGUMENT, why)
            status, shapes = self.execute_checked(request, pools, rt, prepared)
        except RunError as e:  # failures fall through: driver buffers must see them
            self.device.log(f"execution failed: {e}")
            status, shapes = e.status, []
        except OpError as e:
            self.device.log(f"execution failed: {e}")
            status, shapes = e.status, []
        except Exception as e:  # noqa: BLE001 - the driver boundary: never raise
            self.device.log(f"execution failed: {type(e).__name__}: {e}")
            status, shapes = ErrorStatus.GENERAL_FAILURE, []
        if prepared is None or prepared.buffers:
            for pool in pools:
                if not isinstance(pool, np.ndarray):
                    pool.after_execution(self, request, status)
        if not timed or status != _NONE:
            return status, shapes, NO_TIMING
        end = time.monotonic_ns()
        # Microseconds, inline: this runs after the clock stopped and before the caller's
        # reply, on every measured execution.
        return status, shapes, Timing(max(0, (end - device_start) // 1000),
                                      max(0, (end - started_ns) // 1000))

    def _invalid(self, e: Exception) -> Result:
        self.device.log(f"invalid request: {e}")
        return ErrorStatus.INVALID_ARGUMENT, [], NO_TIMING

    def _checked(self, request: Request, measure: MeasureTiming, deadline: int | None,
                 loop_timeout: int | None) -> tuple[list[RequestPool], Any]:
        """The request's pools and its binding: the ones of the request run last when it is
        that request again, else checked and bound now (raises on an invalid request)."""
        recent = self.recent(request, measure, deadline, loop_timeout)
        if recent is not None:
            return recent.pools, recent.bound
        check_execution_args(request, measure, deadline, loop_timeout)
        pools = self.check_request(request, measure, loop_timeout)
        return pools, self.bind(request, pools)

    # ---- IPreparedModel -------------------------------------------------------------------
    def execute_synchronously(self, request: Request, measure: MeasureTiming = MeasureTiming.NO,
                              deadline: int | None = None, loop_timeout: int | None = None
                              ) -> Result:
        started = time.monotonic_ns()
        try:
            found = self._recent
            if found is not None and deadline is None and loop_timeout is None and \
                    (measure is _NO or measure is _YES) and same_request(request, found):
                # The request run last, again (the common case, inlined: see recent()).
                return self.run(request, found.pools, measure, None, None, started, found.bound)
            pools, prepared = self._checked(request, measure, deadline, loop_timeout)
        except Exception as e:  # noqa: BLE001 - any malformed request is INVALID_ARGUMENT
            return self._invalid(e)
        if deadline is not None and started > deadline:
            return ErrorStatus.MISSED_DEADLINE_PERSISTENT, [], NO_TIMING
        return self.run(request, pools, measure, deadline, loop_timeout, started, prepared)

    def validate_request(self, request: Request, measure: MeasureTiming,
                         deadline: int | None, loop_timeout: int | None) -> ErrorStatus:
        """Checked and bound now (see :meth:`bind`), so that the run of it that follows (the
        HIDL face's callback call runs the synchronous one) recognises it at once."""
        try:
            self._checked(request, measure, deadline, loop_timeout)
        except Exception as e:  # noqa: BLE001 - any malformed request is INVALID_ARGUMENT
            self._invalid(e)
            return ErrorStatus.INVALID_ARGUMENT
        return ErrorStatus.NONE

    def execute_fenced(self, request: Request, wait_for: Sequence[object],
                       measure: MeasureTiming = MeasureTiming.NO, deadline: int | None = None,
                       loop_timeout: int | None = None, duration: int | None = None
                       ) -> FencedResult:
        return execute_fenced(self, request, wait_for, measure, deadline, loop_timeout, duration)

    def configure_execution_burst(self) -> tuple[ErrorStatus, DriverBurst]:
        return ErrorStatus.NONE, DriverBurst(self)

    def create_reusable_execution(self, request: Request,
                                  measure: MeasureTiming = MeasureTiming.NO,
                                  loop_timeout: int | None = None
                                  ) -> tuple[ErrorStatus, ReusableExecution | None]:
        return ReusableExecution.create(self, request, measure, loop_timeout)

    def executor(self) -> Executor:
        return self.device.executor_for(self.priority)
