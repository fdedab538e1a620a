"""Sync fences and IPreparedModel::executeFenced."""

import os
import select
import threading
import time

import numpy as np
import pytest
from helpers import add_model, float_inputs
from test_qos import infinite_loop_model, loop_request, prepare

from nnhal.drivers.common.fenced import FencedExecutionCallback
from nnhal.hal.builder import RequestBuilder
from nnhal.hal.fence import FenceState, SyncFence, signaled_fence
from nnhal.hal.types import NO_TIME, NO_TIMING, ErrorStatus, MeasureTiming, Timing

MISSED = (ErrorStatus.MISSED_DEADLINE_TRANSIENT, ErrorStatus.MISSED_DEADLINE_PERSISTENT)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def readable(fence: SyncFence) -> bool:
    return bool(select.select([fence.fileno()], [], [], 0)[0])


# ---- SyncFence ------------------------------------------------------------------------------

def test_fence_wait_times_out_then_sees_signal_from_another_thread():
    with SyncFence() as fence:
        assert fence.state == FenceState.ACTIVE
        assert fence.wait(0.01) == FenceState.ACTIVE
        assert not readable(fence)
        t = threading.Timer(0.01, fence.signal)
        t.start()
        assert fence.wait(5) == FenceState.SIGNALED
        t.join()
        assert readable(fence)
        # Completed once and for all.
        assert not fence.signal() and not fence.set_error()
        assert fence.state == FenceState.SIGNALED


def test_fence_error_state_and_readiness():
    with SyncFence() as fence:
        assert fence.set_error()
        assert fence.wait(0) == FenceState.ERROR and fence.state == FenceState.ERROR
        assert readable(fence)
        assert not fence.signal() and fence.state == FenceState.ERROR


def test_signaled_helper_and_done_callbacks():
    seen = []
    with signaled_fence() as done, SyncFence() as pending:
        assert done.state == FenceState.SIGNALED and done.wait(0) == FenceState.SIGNALED
        done.add_done_callback(lambda f: seen.append(("done", f.state)))
        pending.add_done_callback(lambda f: seen.append(("pending", f.state)))
        assert seen == [("done", FenceState.SIGNALED)]
        pending.set_error()
        assert seen[-1] == ("pending", FenceState.ERROR) and len(seen) == 2


def test_exactly_one_completion_wins_a_race():
    for _ in range(20):
        with SyncFence() as fence:
            wins = []
            barrier = threading.Barrier(8)

            def racer(k: int, fence=fence, wins=wins, barrier=barrier) -> None:
                barrier.wait()
                if (fence.signal() if k % 2 else fence.set_error()):
                    wins.append(k)

            threads = [threading.Thread(target=racer, args=(k,)) for k in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(wins) == 1
            assert fence.state == (FenceState.SIGNALED if wins[0] % 2 else FenceState.ERROR)


def test_closing_releases_fds_and_state_survives_close():
    before = open_fds()
    fences = [SyncFence() for _ in range(32)]
    assert open_fds() >= before + 32
    for f in fences[::2]:
        f.signal()
    for f in fences:
        f.close()
        f.close()  # idempotent
    assert open_fds() == before
    assert fences[0].closed and fences[0].fileno() == -1
    # A closed fence still completes and wakes in-process waiters.
    assert fences[1].signal() and fences[1].wait(0) == FenceState.SIGNALED
    # A fence dropped without close() gives its fd back too.
    SyncFence()
    assert open_fds() == before


def test_callback_before_completion_reports_general_failure():
    cb = FencedExecutionCallback()
    assert cb.get_execution_info() == (ErrorStatus.GENERAL_FAILURE, NO_TIMING, NO_TIMING)
    cb._finish(ErrorStatus.NONE, Timing(1, 2), Timing(1, 1))
    assert cb.get_execution_info() == (ErrorStatus.NONE, Timing(1, 2), Timing(1, 1))


# ---- executeFenced --------------------------------------------------------------------------

@pytest.fixture
def add_pm(device):
    return prepare(device, add_model())


def test_fenced_with_signaled_and_no_fences(add_pm):
    a, b = float_inputs(3)
    for wait_for in ([], [signaled_fence(), signaled_fence()]):
        rb = RequestBuilder([a, b], [16])
        status, fence, cb = add_pm.execute_fenced(rb.request, wait_for)
        assert status == ErrorStatus.NONE
        assert fence.wait(5) == FenceState.SIGNALED
        assert cb.get_execution_info() == (ErrorStatus.NONE, NO_TIMING, NO_TIMING)
        np.testing.assert_array_equal(rb.output(0, np.float32, (2, 2)), a + b)
        for f in [fence, *wait_for]:
            f.close()
        rb.close()


def test_fenced_waits_for_pending_fences(add_pm):
    a, b = float_inputs(4)
    rb = RequestBuilder([a, b], [16])
    gates = [SyncFence(), SyncFence()]
    status, fence, cb = add_pm.execute_fenced(rb.request, gates, MeasureTiming.YES)
    assert status == ErrorStatus.NONE
    gates[0].signal()
    assert fence.wait(0.05) == FenceState.ACTIVE  # one gate still closed
    assert cb.get_execution_info()[0] == ErrorStatus.GENERAL_FAILURE  # not done yet
    assert not rb.output(0, np.float32, (2, 2)).any()
    gates[1].signal()
    assert fence.wait(5) == FenceState.SIGNALED
    status, launched, fenced = cb.get_execution_info()
    assert status == ErrorStatus.NONE
    np.testing.assert_array_equal(rb.output(0, np.float32, (2, 2)), a + b)
    # Launched counts the 50 ms spent waiting for the gates; fenced does not.
    assert NO_TIME not in (launched.time_in_driver, fenced.time_in_driver)
    assert launched.time_in_driver >= fenced.time_in_driver + 40_000
    assert launched.time_on_device <= fenced.time_in_driver
    for f in [fence, *gates]:
        f.close()
    rb.close()


def test_fenced_chained_on_a_returned_fence(add_pm):
    a, b = float_inputs(5)
    first, second = RequestBuilder([a, b], [16]), RequestBuilder([b, b], [16])
    gate = SyncFence()
    s1, f1, _ = add_pm.execute_fenced(first.request, [gate])
    s2, f2, cb2 = add_pm.execute_fenced(second.request, [f1])
    assert s1 == s2 == ErrorStatus.NONE
    assert f2.wait(0.02) == FenceState.ACTIVE
    gate.signal()
    assert f2.wait(5) == FenceState.SIGNALED and f1.state == FenceState.SIGNALED
    assert cb2.get_execution_info()[0] == ErrorStatus.NONE
    np.testing.assert_array_equal(second.output(0, np.float32, (2, 2)), b + b)
    for f in (gate, f1, f2):
        f.close()
    first.close()
    second.close()


def test_fenced_refuses_bad_arguments(add_pm):
    rb = RequestBuilder(list(float_inputs(6)), [16])
    errored = SyncFence()
    errored.set_error()
    for wait_for in ([errored], [3], [None], [signaled_fence(), "fence"]):
        assert add_pm.execute_fenced(rb.request, wait_for) == \
            (ErrorStatus.INVALID_ARGUMENT, None, None)
    for kwargs in ({"duration": -1}, {"loop_timeout": 16_000_000_000}, {"measure": 7}):
        assert add_pm.execute_fenced(rb.request, [], **kwargs) == \
            (ErrorStatus.INVALID_ARGUMENT, None, None)
    errored.close()
    rb.close()


def test_fenced_needs_fully_specified_outputs(device):
    pm = prepare(device, add_model(out_dims=(0, 0)))
    rb = RequestBuilder(list(float_inputs(7)), [16])
    assert pm.execute_fenced(rb.request, []) == (ErrorStatus.INVALID_ARGUMENT, None, None)
    rb.close()


def test_fence_going_to_error_fails_the_execution(add_pm):
    rb = RequestBuilder(list(float_inputs(8)), [16])
    gate = SyncFence()
    status, fence, cb = add_pm.execute_fenced(rb.request, [gate], MeasureTiming.YES)
    assert status == ErrorStatus.NONE
    gate.set_error()
    assert fence.wait(5) == FenceState.ERROR
    assert cb.get_execution_info() == (ErrorStatus.GENERAL_FAILURE, NO_TIMING, NO_TIMING)
    fence.close()
    gate.close()
    rb.close()


def test_fenced_deadline_already_passed(add_pm):
    rb = RequestBuilder(list(float_inputs(9)), [16])
    status, fence, cb = add_pm.execute_fenced(rb.request, [], deadline=time.monotonic_ns() - 1)
    assert status in MISSED and fence is None and cb is None
    rb.close()


def test_fenced_deadline_passing_while_waiting_sets_fence_to_error(add_pm):
    rb = RequestBuilder(list(float_inputs(10)), [16])
    gate = SyncFence()
    status, fence, cb = add_pm.execute_fenced(rb.request, [gate], MeasureTiming.YES,
                                              deadline=time.monotonic_ns() + 20_000_000)
    assert status == ErrorStatus.NONE
    assert fence.wait(5) == FenceState.ERROR  # the gate was never signalled
    status, launched, fenced = cb.get_execution_info()
    assert status in MISSED and launched == fenced == NO_TIMING
    gate.signal()  # too late: nothing runs
    assert not rb.output(0, np.float32, (2, 2)).any()
    fence.close()
    gate.close()
    rb.close()


def test_fenced_duration_aborts_an_endless_loop(device, caplog):
    pm = prepare(device, infinite_loop_model())
    rb = loop_request()
    gate = SyncFence()
    caplog.set_level("DEBUG", logger="nnhal.drivers")
    status, fence, cb = pm.execute_fenced(rb.request, [gate], MeasureTiming.YES,
                                          loop_timeout=15_000_000_000, duration=30_000_000)
    assert status == ErrorStatus.NONE
    gate.signal()
    assert fence.wait(10) == FenceState.ERROR
    status, launched, fenced = cb.get_execution_info()
    assert status in MISSED and launched == fenced == NO_TIMING
    assert "deadline" in caplog.text  # the duration stopped it, not the 15 s loop timeout
    for f in (gate, fence):
        f.close()
    rb.close()


def test_fenced_executions_leak_no_fds(add_pm):
    rb = RequestBuilder(list(float_inputs(11)), [16])
    warm = add_pm.execute_fenced(rb.request, [])[1]  # start the worker pool's threads
    warm.wait(5)
    warm.close()
    before = open_fds()
    for _ in range(10):
        gate = SyncFence()
        status, fence, _ = add_pm.execute_fenced(rb.request, [gate])
        gate.signal()
        assert fence.wait(5) == FenceState.SIGNALED
        gate.close()
        fence.close()
    assert open_fds() == before
    rb.close()
