"""Execution paths of a prepared model, each behind one signature (:data:`PathFn`): sync, async,
burst, reusable and fenced; :func:`execution_paths` keeps the ones a prepared model offers, and
:func:`call_with_timeout` runs a call under a time limit."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nnhal.conformance.mutations.common import CALLBACK_TIMEOUT_S
from nnhal.hal.interfaces import IPreparedModel
from nnhal.hal.types import NO_TIMING, ErrorStatus, MeasureTiming, Request, Timing
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3


@dataclass
class PathResult:
    """What one execution path answered: the (first) status, shapes, timing, and any rule the
    path broke on its own (launch status disagreeing with the callback, callbacks twice...)."""

    status: ErrorStatus
    shapes: list[Any] = field(default_factory=list)
    timing: Timing = NO_TIMING
    launch: ErrorStatus | None = None
    problem: str = ""


PathFn = Callable[[IPreparedModel, Request, int, int | None], PathResult]


def _path_sync(pm: IPreparedModel, r: Request, measure: int, loop: int | None) -> PathResult:
    st, shapes, timing = pm.execute_synchronously(r, measure, None, loop)  # type: ignore[arg-type]
    return PathResult(ErrorStatus(st), list(shapes), timing)


def _path_async(pm: IPreparedModel, r: Request, measure: int, loop: int | None) -> PathResult:
    cb = ExecutionCallback()
    launch = execute_1_3(pm, r, measure, None, loop, cb)  # type: ignore[arg-type]
    st, shapes, timing = cb.wait(CALLBACK_TIMEOUT_S)
    problem = ""
    if cb.calls != 1:
        problem = f"callback called {cb.calls} times"
    elif launch != ErrorStatus.NONE and launch != st:
        problem = f"launch {ErrorStatus(launch).name} but callback {st.name}"
    return PathResult(st, shapes, timing, ErrorStatus(launch), problem)


def _path_burst(pm: IPreparedModel, r: Request, measure: int, loop: int | None) -> PathResult:
    st, burst = pm.configure_execution_burst()
    if st != ErrorStatus.NONE or burst is None:
        return PathResult(ErrorStatus.GENERAL_FAILURE, problem=f"no burst: {st}")
    st, shapes, timing = burst.execute(r, measure, None, loop)  # type: ignore[arg-type]
    return PathResult(ErrorStatus(st), list(shapes), timing)


class SharedBurst:
    """The burst path with one burst per prepared model, configured at its first request and
    kept for the next ones (:meth:`close` ends it).

    A burst is made to carry many requests; giving each mutant a fresh one costs, on a served
    driver, a pair of rings and a serving thread per mutant (most of the time of a remote
    request-mutation run). Every mutant still goes through the burst to the driver; sharing it
    also makes each mutant meet a burst that has already refused the earlier ones."""

    def __init__(self) -> None:
        self._pm: IPreparedModel | None = None
        self._burst: Any = None

    def __call__(self, pm: IPreparedModel, r: Request, measure: int, loop: int | None
                 ) -> PathResult:
        if self._pm is not pm or self._burst is None:
            self.close()
            st, burst = pm.configure_execution_burst()
            if st != ErrorStatus.NONE or burst is None:
                return PathResult(ErrorStatus.GENERAL_FAILURE, problem=f"no burst: {st}")
            self._pm, self._burst = pm, burst
        st, shapes, timing = self._burst.execute(r, measure, None, loop)
        return PathResult(ErrorStatus(st), list(shapes), timing)

    def close(self) -> None:
        burst, self._burst, self._pm = self._burst, None, None
        close = getattr(burst, "close", None)
        if callable(close):
            close()


def _path_reusable(pm: IPreparedModel, r: Request, measure: int, loop: int | None
                   ) -> PathResult:
    st, execution = pm.create_reusable_execution(r, measure, loop)  # type: ignore[arg-type]
    if st != ErrorStatus.NONE:
        problem = "failed creation returned an execution" if execution is not None else ""
        return PathResult(ErrorStatus(st), launch=ErrorStatus(st), problem=problem)
    if execution is None:
        return PathResult(ErrorStatus.GENERAL_FAILURE, problem="NONE without an execution")
    st, shapes, timing = execution.compute(None)
    return PathResult(ErrorStatus(st), list(shapes), timing, ErrorStatus.NONE)


def _path_fenced(pm: IPreparedModel, r: Request, measure: int, loop: int | None) -> PathResult:
    st, fence, cb = pm.execute_fenced(r, [], measure, None, loop, None)  # type: ignore[arg-type]
    st = ErrorStatus(st)
    if st != ErrorStatus.NONE:
        problem = "" if fence is None and cb is None else "failed but returned a fence/callback"
        return PathResult(st, launch=st, problem=problem)
    if fence is not None and hasattr(fence, "wait"):
        try:
            fence.wait(CALLBACK_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001
            return PathResult(ErrorStatus.GENERAL_FAILURE, problem=f"fence wait: {e}")
    if cb is None:
        return PathResult(ErrorStatus.GENERAL_FAILURE, problem="NONE without a callback")
    est, _t1, t2 = cb.get_execution_info()
    return PathResult(ErrorStatus(est), [], t2, ErrorStatus.NONE)


#: Every execution path this module knows, in order; :func:`execution_paths` keeps those a
#: prepared model offers. Add new paths here.
ALL_PATHS: dict[str, PathFn] = {
    "sync": _path_sync,
    "async": _path_async,
    "burst": _path_burst,
    "reusable": _path_reusable,
    "fenced": _path_fenced,
}


def execution_paths(pm: IPreparedModel, valid: Request | None = None) -> dict[str, PathFn]:
    """The paths ``pm`` implements: sync and async always; burst, reusable and fenced when the
    driver overrides them and (given a valid request) they do not answer GENERAL_FAILURE."""
    paths = {"sync": _path_sync, "async": _path_async}
    for name, method in (("burst", "configure_execution_burst"),
                         ("reusable", "create_reusable_execution"),
                         ("fenced", "execute_fenced")):
        if getattr(type(pm), method, None) is getattr(IPreparedModel, method):
            continue
        if valid is not None:
            try:
                res = ALL_PATHS[name](pm, valid, MeasureTiming.NO, None)
            except Exception:  # noqa: BLE001
                continue
            if res.status == ErrorStatus.GENERAL_FAILURE:
                continue
        paths[name] = ALL_PATHS[name]
    return paths


def call_with_timeout(fn: Callable[[], Any], timeout: float) -> Any:
    """Run ``fn`` in a helper thread; TimeoutError if it does not return in time."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=target, daemon=True, name="nnhal-timeout-call")
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"no answer within {timeout} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")
