"""NDK execution, burst and event rules, with exact result codes."""

from __future__ import annotations

import os

import numpy as np
from ndk_helpers import F32, OK, add_model, compiled, execution

from nnhal.runtime import ndk as N
from nnhal.runtime.codes import NO_DURATION
from nnhal.runtime.codes import ResultCode as R

T = N.ANeuralNetworksOperandType


def test_create_on_unfinished_compilation_is_bad_state(device):
    code, c = N.ANeuralNetworksCompilation_createForDevices(add_model(), [device])
    assert N.ANeuralNetworksExecution_create(c)[0] == R.BAD_STATE
    assert N.ANeuralNetworksBurst_create(c)[0] == R.BAD_STATE


def test_set_input_rules(device):
    code, e = N.ANeuralNetworksExecution_create(compiled(device))
    x = np.zeros((1, 16), np.float32)
    f = N.ANeuralNetworksExecution_setInput
    assert f(e, 2, None, x, x.nbytes) == R.BAD_DATA  # no input 2
    assert f(e, 0, None, x, 60) == R.BAD_DATA  # length
    assert f(e, 0, None, None, 64) == R.BAD_DATA  # NULL with a length
    assert f(e, 0, T(8, [1, 16]), x, 64) == R.BAD_DATA  # another type
    assert f(e, 0, T(F32, [2, 8]), x, 64) == R.BAD_DATA  # other dimensions
    assert f(e, 0, T(F32, [1, 16]), x, 64) == OK
    assert f(None, 0, None, x, 64) == R.UNEXPECTED_NULL


def test_set_output_rules(device):
    code, e = N.ANeuralNetworksExecution_create(compiled(device))
    f = N.ANeuralNetworksExecution_setOutput
    assert f(e, 1, None, np.zeros(16, np.float32), 64) == R.BAD_DATA
    assert f(e, 0, None, bytes(64), 64) == R.BAD_DATA  # read-only
    assert f(e, 0, None, np.zeros(16, np.float32), 32) == R.BAD_DATA


def test_compute_with_an_argument_not_set_is_bad_data(device):
    code, e = N.ANeuralNetworksExecution_create(compiled(device))
    x = np.zeros((1, 16), np.float32)
    assert N.ANeuralNetworksExecution_setInput(e, 0, None, x, 64) == OK
    assert N.ANeuralNetworksExecution_compute(e) == R.BAD_DATA


def test_an_execution_runs_once_unless_reusable(device):
    c = compiled(device)
    e, *_ = execution(c)
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert N.ANeuralNetworksExecution_compute(e) == R.BAD_STATE
    assert N.ANeuralNetworksExecution_startCompute(e)[0] == R.BAD_STATE
    e, x, _y, out = execution(c)
    assert N.ANeuralNetworksExecution_setReusable(e, True) == OK
    assert N.ANeuralNetworksExecution_compute(e) == OK
    x[0, 0] = 100  # a reusable execution reads its input buffers again
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert out[0, 0] == 101


def test_modifying_a_started_execution_is_bad_state(device):
    e, x, _y, out = execution(compiled(device))
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert N.ANeuralNetworksExecution_setInput(e, 0, None, x, 64) == R.BAD_STATE
    assert N.ANeuralNetworksExecution_setOutput(e, 0, None, out, 64) == R.BAD_STATE
    assert N.ANeuralNetworksExecution_setReusable(e, True) == R.BAD_STATE
    assert N.ANeuralNetworksExecution_setLoopTimeout(e, 10) == R.BAD_STATE
    assert N.ANeuralNetworksExecution_setMeasureTiming(e, True) == R.BAD_STATE


def test_omitted_input_reaches_the_driver_as_no_value(device):
    e, *_ = execution(compiled(device))
    assert N.ANeuralNetworksExecution_setInput(e, 1, None, None, 0) == OK
    assert e.inputs[1].kind == "omitted"
    assert N.ANeuralNetworksExecution_compute(e) == R.BAD_DATA  # ADD needs it


def test_measure_timing_and_timeout_need_one_explicit_device(device):
    code, c = N.ANeuralNetworksCompilation_create(add_model())
    assert N.ANeuralNetworksCompilation_finish(c) == OK
    e, *_ = execution(c)
    assert N.ANeuralNetworksExecution_setMeasureTiming(e, True) == R.BAD_DATA
    assert N.ANeuralNetworksExecution_setTimeout(e, 10**9) == R.BAD_DATA
    e, *_ = execution(compiled(device))
    assert N.ANeuralNetworksExecution_setMeasureTiming(e, True) == OK
    assert N.ANeuralNetworksExecution_setTimeout(e, 10**9) == OK


def test_get_duration_rules(device):
    e, *_ = execution(compiled(device))
    assert N.ANeuralNetworksExecution_setMeasureTiming(e, True) == OK
    assert N.ANeuralNetworksExecution_getDuration(e, 0)[0] == R.BAD_STATE
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert N.ANeuralNetworksExecution_getDuration(e, 4)[0] == R.BAD_DATA
    code, ns = N.ANeuralNetworksExecution_getDuration(e, 1)
    assert code == OK and ns != NO_DURATION and ns % 1000 == 0
    e, *_ = execution(compiled(device))  # not measured: UINT64_MAX
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert N.ANeuralNetworksExecution_getDuration(e, 0) == (OK, NO_DURATION)


def test_loop_timeout_above_the_maximum_is_clamped(device):
    e, *_ = execution(compiled(device))
    assert N.ANeuralNetworksExecution_setLoopTimeout(e, 10**12) == OK
    assert e.loop_timeout_ns == N.ANeuralNetworks_getMaximumLoopTimeout()


def test_output_rank_and_dimensions_rules(device):
    e, *_ = execution(compiled(device))
    assert N.ANeuralNetworksExecution_getOutputOperandRank(e, 0)[0] == R.BAD_STATE
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert N.ANeuralNetworksExecution_getOutputOperandRank(e, 0) == (OK, 2)
    assert N.ANeuralNetworksExecution_getOutputOperandRank(e, 1)[0] == R.BAD_DATA
    assert N.ANeuralNetworksExecution_getOutputOperandDimensions(e, 0) == (OK, [1, 16])


def test_output_dimensions_after_insufficient_size(device):
    c = compiled(device, add_model(out_dims=(0, 0)))
    small = np.zeros(4, np.float32)
    e, *_ = execution(c, out=small)
    assert N.ANeuralNetworksExecution_compute(e) == R.OUTPUT_INSUFFICIENT_SIZE
    assert N.ANeuralNetworksExecution_getOutputOperandDimensions(e, 0) == (OK, [1, 16])
    e, *_ = execution(c, out=np.zeros(16, np.float32))
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert N.ANeuralNetworksExecution_getOutputOperandDimensions(e, 0) == (OK, [1, 16])


def test_burst_of_another_compilation_is_bad_data(device):
    c1, c2 = compiled(device), compiled(device)
    code, burst = N.ANeuralNetworksBurst_create(c2)
    assert code == OK
    e, *_ = execution(c1)
    assert N.ANeuralNetworksExecution_burstCompute(e, burst) == R.BAD_DATA
    assert N.ANeuralNetworksExecution_burstCompute(e, None) == R.UNEXPECTED_NULL
    code, burst = N.ANeuralNetworksBurst_create(c1)
    assert N.ANeuralNetworksExecution_burstCompute(e, burst) == OK


def test_start_compute_with_dependencies_rules(device):
    code, c = N.ANeuralNetworksCompilation_create(add_model())
    assert N.ANeuralNetworksCompilation_finish(c) == OK
    e, *_ = execution(c)
    f = N.ANeuralNetworksExecution_startComputeWithDependencies
    assert f(e, [], 10**9)[0] == R.BAD_DATA  # a duration needs one explicit device
    e, *_ = execution(compiled(device))
    assert f(e, [None], 0)[0] == R.UNEXPECTED_NULL


def test_fenced_execution_with_a_timeout_runs(device):
    """As upstream's ExecutionBuilder::computeFenced: setTimeout is allowed (it becomes the
    deadline), unlike a duration on a compilation of several devices."""
    e, x, y, out = execution(compiled(device))
    assert N.ANeuralNetworksExecution_setTimeout(e, 10**9) == OK
    code, ev = N.ANeuralNetworksExecution_startComputeWithDependencies(e, [], 0)
    assert code == OK
    assert N.ANeuralNetworksEvent_wait(ev) == OK
    np.testing.assert_array_equal(out, x + y)
    N.ANeuralNetworksEvent_free(ev)


def test_fenced_execution_with_an_output_of_unknown_size_is_bad_data(device):
    """Fenced executions have no dynamic output shapes: an output of unknown dimensions is
    BAD_DATA before anything runs."""
    c = compiled(device, add_model(out_dims=(0, 0)))
    out = np.zeros((1, 16), np.float32)
    x = np.ones((1, 16), np.float32)
    code, e = N.ANeuralNetworksExecution_create(c)
    assert N.ANeuralNetworksExecution_setInput(e, 0, None, x, x.nbytes) == OK
    assert N.ANeuralNetworksExecution_setInput(e, 1, None, x, x.nbytes) == OK
    assert N.ANeuralNetworksExecution_setOutput(e, 0, None, out, out.nbytes) == OK
    code, ev = N.ANeuralNetworksExecution_startComputeWithDependencies(e, [], 0)
    assert code == R.BAD_DATA
    assert ev is None
    # With the output's dimensions given, the same model runs fenced.
    t = N.ANeuralNetworksOperandType(F32, [1, 16])
    code, e3 = N.ANeuralNetworksExecution_create(c)
    assert N.ANeuralNetworksExecution_setInput(e3, 0, None, x, x.nbytes) == OK
    assert N.ANeuralNetworksExecution_setInput(e3, 1, None, x, x.nbytes) == OK
    assert N.ANeuralNetworksExecution_setOutput(e3, 0, t, out, out.nbytes) == OK
    code, ev = N.ANeuralNetworksExecution_startComputeWithDependencies(e3, [], 0)
    assert code == OK and N.ANeuralNetworksEvent_wait(ev) == OK
    np.testing.assert_array_equal(out, x + x)


def test_fenced_execution_chains_and_exposes_its_fence(device):
    c = compiled(device)
    fd = os.memfd_create("t")
    os.ftruncate(fd, 64)
    code, mem = N.ANeuralNetworksMemory_createFromFd(64, 3, fd, 0)
    os.close(fd)
    e1, *_ = execution(c)
    assert N.ANeuralNetworksExecution_setOutputFromMemory(e1, 0, None, mem, 0, 64) == OK
    code, ev1 = N.ANeuralNetworksExecution_startComputeWithDependencies(e1, [], 0)
    assert code == OK
    code, e2 = N.ANeuralNetworksExecution_create(c)
    out2 = np.zeros((1, 16), np.float32)
    one = np.ones((1, 16), np.float32)
    assert N.ANeuralNetworksExecution_setInputFromMemory(e2, 0, None, mem, 0, 64) == OK
    assert N.ANeuralNetworksExecution_setInput(e2, 1, None, one, 64) == OK
    assert N.ANeuralNetworksExecution_setOutput(e2, 0, None, out2, 64) == OK
    code, ev2 = N.ANeuralNetworksExecution_startComputeWithDependencies(e2, [ev1], 0)
    assert code == OK
    assert N.ANeuralNetworksEvent_wait(ev2) == OK
    assert out2[0, 3] == 5.0  # (3 + 1) + 1
    code, fd = N.ANeuralNetworksEvent_getSyncFenceFd(ev2)
    assert code == OK and fd >= 0
    code, ev3 = N.ANeuralNetworksEvent_createFromSyncFenceFd(fd)
    assert code == OK and N.ANeuralNetworksEvent_wait(ev3) == OK
    N.ANeuralNetworksEvent_free(ev3)


def test_event_rules(device):
    assert N.ANeuralNetworksEvent_createFromSyncFenceFd(-1)[0] == R.BAD_DATA
    assert N.ANeuralNetworksEvent_wait(None) == R.UNEXPECTED_NULL
    e, *_ = execution(compiled(device))
    code, ev = N.ANeuralNetworksExecution_startCompute(e)
    assert code == OK
    assert N.ANeuralNetworksEvent_getSyncFenceFd(ev)[0] == R.BAD_DATA  # not fenced
    assert N.ANeuralNetworksEvent_wait(ev) == OK
    assert N.ANeuralNetworksEvent_wait(ev) == OK  # waiting again gives the same


def test_event_wait_returns_the_execution_failure(device):
    e, *_ = execution(compiled(device, add_model(out_dims=(0, 0))),
                      out=np.zeros(2, np.float32))
    code, ev = N.ANeuralNetworksExecution_startCompute(e)
    assert code == OK
    assert N.ANeuralNetworksEvent_wait(ev) == R.OUTPUT_INSUFFICIENT_SIZE


def test_an_expired_execution_timeout_is_a_missed_deadline(device):
    e, *_ = execution(compiled(device))
    assert N.ANeuralNetworksExecution_setTimeout(e, 1) == OK
    code = N.ANeuralNetworksExecution_compute(e)
    assert code in (R.MISSED_DEADLINE_TRANSIENT, R.MISSED_DEADLINE_PERSISTENT)
    assert N.ANeuralNetworksExecution_getOutputOperandRank(e, 0)[0] == R.BAD_STATE


def test_a_driver_that_raises_is_a_dead_object(device, monkeypatch):
    c = compiled(device)

    def broken(*args, **kwargs):
        raise RuntimeError("driver died")

    monkeypatch.setattr(c.prepared, "execute_synchronously", broken)
    e, *_ = execution(c)
    assert N.ANeuralNetworksExecution_compute(e) == R.DEAD_OBJECT


def test_a_running_execution_cannot_start_again(device):
    e, *_ = execution(compiled(device))
    assert N.ANeuralNetworksExecution_setReusable(e, True) == OK
    code, ev = N.ANeuralNetworksExecution_startCompute(e)
    assert code == OK
    assert N.ANeuralNetworksExecution_compute(e) == R.BAD_STATE  # not waited for yet
    assert N.ANeuralNetworksEvent_wait(ev) == OK
    assert N.ANeuralNetworksExecution_compute(e) == OK  # reusable, and done


def test_a_burst_in_use_is_bad_state(device):
    c = compiled(device)
    code, burst = N.ANeuralNetworksBurst_create(c)
    e, *_ = execution(c)
    with burst.lock:  # another thread's burstCompute holds it
        assert N.ANeuralNetworksExecution_burstCompute(e, burst) == R.BAD_STATE
    assert N.ANeuralNetworksExecution_burstCompute(e, burst) == OK


def test_sync_fence_fd_must_be_a_fence(tmp_path):
    """Only a descriptor that is a sync fence (eventfd, sync_file) makes an event; a pipe
    nobody writes, a file, fd 0 or a closed fd is BAD_DATA."""
    r, w = os.pipe()
    f = os.open(tmp_path / "f", os.O_CREAT | os.O_RDWR)
    try:
        for fd in (r, w, f, 0, 4095, True):
            assert N.ANeuralNetworksEvent_createFromSyncFenceFd(fd)[0] == R.BAD_DATA, fd
    finally:
        for fd in (r, w, f):
            os.close(fd)


def test_waits_on_a_foreign_fence_are_bounded(device, monkeypatch):
    """A fence that never signals: Event_wait gives up after FOREIGN_FENCE_TIMEOUT_S, free
    does not wait at all, and an execution depending on it fails at its deadline (or after
    the fence timeout) instead of waiting for it for minutes."""
    import time

    from nnhal.runtime import execution as ex_mod

    monkeypatch.setattr(ex_mod, "FOREIGN_FENCE_TIMEOUT_S", 0.3)
    never = os.eventfd(0)
    try:
        code, ev = N.ANeuralNetworksEvent_createFromSyncFenceFd(never)
        assert code == OK
        t = time.monotonic()
        assert N.ANeuralNetworksEvent_wait(ev) == R.OP_FAILED
        assert time.monotonic() - t < 5
        code, ev2 = N.ANeuralNetworksEvent_createFromSyncFenceFd(never)
        t = time.monotonic()
        N.ANeuralNetworksEvent_free(ev2)
        assert time.monotonic() - t < 0.25  # below the fence timeout: no wait
        c = compiled(device)
        for timeout_ns, want in ((50_000_000, R.MISSED_DEADLINE_TRANSIENT), (0, R.OP_FAILED)):
            code, dep = N.ANeuralNetworksEvent_createFromSyncFenceFd(never)
            e, *_ = execution(c)
            if timeout_ns:
                assert N.ANeuralNetworksExecution_setTimeout(e, timeout_ns) == OK
            t = time.monotonic()
            code, _ = N.ANeuralNetworksExecution_startComputeWithDependencies(e, [dep], 0)
            assert time.monotonic() - t < 5
            assert code == want
            N.ANeuralNetworksEvent_free(dep)
        N.ANeuralNetworksEvent_free(ev)
    finally:
        os.close(never)


def test_layouts_past_the_free_lists_bound_give_their_memory_back(device):
    """A compilation keeps at most 4 finished layouts per argument layout; one more gives its
    memories back instead of being kept (eight threads on one compilation reach this)."""
    from nnhal.hal.request_layout import ArgSlot, RequestLayout

    c = compiled(device)
    given: list = []
    for _ in range(6):
        c.give_layout(("k",), RequestLayout([ArgSlot(64)], [ArgSlot(64)], give=given.append))
    assert len(given) == 4  # the fifth and sixth layouts' input and output memories
    assert c.take_layout(("k",)) is not None
    N.ANeuralNetworksCompilation_free(c)
    for m in given:
        m.close()
