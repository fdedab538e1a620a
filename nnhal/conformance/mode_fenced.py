"""Conformance mode ``fenced``: every case through IPreparedModel::executeFenced.

Two fenced executions per case, launched before any fence they wait on is signalled:

1. measure NO, waiting on two fences that a timer signals a moment after the launch;
2. measure YES, chained: waiting on the fence returned by the first execution and on an
   already-signalled fence.

Neither may finish before its fences are signalled; each returned fence must complete, its
state must agree with the status from ``get_execution_info`` (signalled iff NONE), timing must
follow MeasureTiming, and the outputs are checked as in general mode. As upstream, a model
whose outputs are not fully specified (unknown or zero-sized dimensions) must be refused with
INVALID_ARGUMENT, and an ``expectFailure`` case must fail.
"""

from __future__ import annotations

import threading
from typing import Any

from nnhal.conformance.cases import BuiltRequest, Case, build_request, outputs_fully_specified
from nnhal.conformance.runner import (
    CALLBACK_TIMEOUT_S,
    CaseFailure,
    ExpectedFailureSeen,
    Options,
    check_outputs,
    prepare,
)
from nnhal.hal.fence import FenceState, SyncFence
from nnhal.hal.interfaces import IDevice, IPreparedModel
from nnhal.hal.types import NO_TIME, ErrorStatus, MeasureTiming, Timing

#: How long after the launch the timer signals the fences the first execution waits for.
SIGNAL_DELAY_S = 0.001


def _launch(pm: IPreparedModel, built: BuiltRequest, fences: list[SyncFence],
            measure: MeasureTiming, opts: Options, label: str
            ) -> tuple[ErrorStatus, SyncFence | None, Any]:
    status, fence, cb = pm.execute_fenced(built.request, fences, measure, None,
                                          opts.loop_timeout_ns, None)
    status = ErrorStatus(status)
    if status != ErrorStatus.NONE and (fence is not None or cb is not None):
        raise CaseFailure(f"{label}: launch failed with {status.name} but returned a fence or "
                          f"callback")
    if status == ErrorStatus.NONE and (fence is None or cb is None):
        raise CaseFailure(f"{label}: launched without a fence or callback")
    return status, fence, cb


def _finish(fence: SyncFence, cb: Any, measure: MeasureTiming, label: str) -> ErrorStatus:
    """Wait for the returned fence and check it against the callback's status and timing."""
    state = fence.wait(CALLBACK_TIMEOUT_S)
    if state == FenceState.ACTIVE:
        raise CaseFailure(f"{label}: returned fence not completed after {CALLBACK_TIMEOUT_S}s")
    status, launched, fenced = cb.get_execution_info()
    status = ErrorStatus(status)
    if (state == FenceState.SIGNALED) != (status == ErrorStatus.NONE):
        raise CaseFailure(f"{label}: fence {state.name} but execution status {status.name}")
    _check_timing(launched, fenced, measure, status, label)
    return status


def _check_timing(launched: Timing, fenced: Timing, measure: MeasureTiming,
                  status: ErrorStatus, label: str) -> None:
    times = (launched.time_on_device, launched.time_in_driver, fenced.time_on_device,
             fenced.time_in_driver)
    if measure != MeasureTiming.YES or status != ErrorStatus.NONE:
        if any(t != NO_TIME for t in times):
            raise CaseFailure(f"{label}: timing reported without being measured: {times}")
        return
    for name, t in (("launched", launched), ("fenced", fenced)):
        if NO_TIME not in (t.time_on_device, t.time_in_driver) and \
                t.time_on_device > t.time_in_driver:
            raise CaseFailure(f"{label}: timing{name} on device {t.time_on_device} > in "
                              f"driver {t.time_in_driver}")
    if NO_TIME not in (launched.time_in_driver, fenced.time_in_driver) and \
            fenced.time_in_driver > launched.time_in_driver:
        raise CaseFailure(f"{label}: time since fences {fenced.time_in_driver} exceeds time "
                          f"since launch {launched.time_in_driver}")


def _refuses_unspecified_outputs(pm: IPreparedModel, m: dict[str, Any], opts: Options) -> str:
    built = build_request(m)
    try:
        status, fence, _ = pm.execute_fenced(built.request, [], MeasureTiming.NO, None,
                                             opts.loop_timeout_ns, None)
        if fence is not None:
            fence.wait(CALLBACK_TIMEOUT_S)
            fence.close()
    finally:
        built.close()
    if ErrorStatus(status) != ErrorStatus.INVALID_ARGUMENT:
        raise CaseFailure(f"outputs not fully specified: executeFenced gave "
                          f"{ErrorStatus(status).name}, expected INVALID_ARGUMENT")
    return "unspecified outputs refused"


def run(device: IDevice, case: Case, opts: Options) -> str:
    m = case.data["model"]
    pm = prepare(device, case, m)
    if not outputs_fully_specified(m):
        return _refuses_unspecified_outputs(pm, m, opts)

    first, second = build_request(m), build_request(m)
    gates = [SyncFence(), SyncFence()]
    ready = SyncFence.signaled()
    owned: list[SyncFence] = [*gates, ready]
    timer = threading.Timer(SIGNAL_DELAY_S, lambda: [g.signal() for g in gates])
    try:
        status, fence1, cb1 = _launch(pm, first, gates, MeasureTiming.NO, opts, "fenced")
        if status != ErrorStatus.NONE:
            if case.expect_failure:
                raise ExpectedFailureSeen(f"executeFenced: {status.name}")
            raise CaseFailure(f"fenced: launch failed with {status.name}")
        owned.append(fence1)
        status, fence2, cb2 = _launch(pm, second, [fence1, ready], MeasureTiming.YES, opts,
                                      "chained")
        if status != ErrorStatus.NONE:
            raise CaseFailure(f"chained: launch on a pending fence failed with {status.name}")
        owned.append(fence2)
        if fence1.state != FenceState.ACTIVE or fence2.state != FenceState.ACTIVE:
            raise CaseFailure("an execution completed before its fences were signalled")
        timer.start()
        status1 = _finish(fence1, cb1, MeasureTiming.NO, "fenced")
        status2 = _finish(fence2, cb2, MeasureTiming.YES, "chained")
        if case.expect_failure:
            if status1 == ErrorStatus.NONE:
                raise CaseFailure("fenced: expected a failure, execution succeeded")
            if status2 == ErrorStatus.NONE:
                raise CaseFailure("chained: ran although the fence it waited on failed")
            raise ExpectedFailureSeen(f"fenced execution: {status1.name}")
        for label, status, built in (("fenced", status1, first), ("chained", status2, second)):
            if status != ErrorStatus.NONE:
                raise CaseFailure(f"{label}: execution failed with {status.name}")
            try:
                check_outputs(case, built, [])
            except CaseFailure as e:
                raise CaseFailure(f"{label}: {e}") from None
        return "fenced + chained"
    finally:
        for g in gates:  # never leave an execution waiting on a gate
            g.signal()
        if timer.ident is not None:
            timer.join()
        for f in owned:
            f.wait(CALLBACK_TIMEOUT_S)  # executions done before their memory is released
            f.close()
        first.close()
        second.close()
