"""The HIDL face's callback-style execution (``nnhal.hidl.execute``) over canonical prepared
models that implement only the canonical calls: launch statuses, the worker it runs on,
deadlines, timing, and the model that cannot check a request without running it."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from helpers import add_model, float_inputs

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import RequestBuilder
from nnhal.hal.interfaces import IPreparedModel, PreparedModelCallback
from nnhal.hal.types import NO_TIMING, ErrorStatus, MeasureTiming, Timing
from nnhal.hidl import ExecutionCallback, IHidlPreparedModel
from nnhal.hidl import execute as execute_1_3

E = ErrorStatus
MS = 1_000_000
TIMED = (E.NONE, [], Timing(5, 7))


class Canonical(IPreparedModel):
    """Only the canonical synchronous call, plus the hooks a test sets."""

    def __init__(self, result=TIMED, verdict=E.NONE, pool=None,
                 delay_s=0.0):
        self.result, self.verdict, self.pool, self.delay_s = result, verdict, pool, delay_s
        self.threads: list[str] = []

    def execute_synchronously(self, request, measure=MeasureTiming.NO, deadline=None,
                              loop_timeout=None):
        self.threads.append(threading.current_thread().name)
        time.sleep(self.delay_s)
        if isinstance(self.result, Exception):
            raise self.result
        return self.result

    def validate_request(self, request, measure, deadline, loop_timeout):
        if isinstance(self.verdict, Exception):
            raise self.verdict
        return self.verdict

    def executor(self):
        return self.pool


def launch(pm, deadline=None, measure=MeasureTiming.NO):
    cb = ExecutionCallback()
    status = execute_1_3(pm, object(), measure, deadline, None, cb)
    return status, cb


def test_runs_the_synchronous_call_on_a_thread_of_its_own_and_notifies_once():
    pm = Canonical()
    status, cb = launch(pm)
    assert status == E.NONE
    status, shapes, timing = cb.wait(5)
    assert status == E.NONE and shapes == [] and cb.calls == 1
    # Measured from the launch: the thread's start counts as time in the driver.
    assert timing.time_on_device == 5 and timing.time_in_driver >= 7
    assert pm.threads == ["nnhal-execute_1_3"]


def test_runs_on_the_models_executor_when_it_has_one():
    with ThreadPoolExecutor(1, thread_name_prefix="model-pool") as pool:
        pm = Canonical(pool=pool)
        status, cb = launch(pm)
        assert status == E.NONE and cb.wait(5)[0] == E.NONE
        assert pm.threads[0].startswith("model-pool")


def test_launch_refusals_are_returned_and_notified():
    for verdict, expected in ((E.INVALID_ARGUMENT, E.INVALID_ARGUMENT),
                              (RuntimeError("driver bug"), E.GENERAL_FAILURE)):
        pm = Canonical(verdict=verdict)
        status, cb = launch(pm)
        assert status == expected and cb.wait(5) == (expected, [], NO_TIMING)
        assert cb.calls == 1 and pm.threads == []
    # No callback: refused, nothing to notify, nothing run.
    pm = Canonical()
    assert execute_1_3(pm, object(), MeasureTiming.NO, None, None, None) == E.INVALID_ARGUMENT
    assert execute_1_3(pm, object(), MeasureTiming.NO, None, None, object()) == \
        E.INVALID_ARGUMENT
    assert pm.threads == []


def test_a_pool_that_refuses_the_work_is_a_general_failure():
    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    status, cb = launch(Canonical(pool=pool))
    assert status == E.GENERAL_FAILURE and cb.wait(5)[0] == E.GENERAL_FAILURE and cb.calls == 1


def test_deadlines_at_launch_and_in_the_queue():
    pm = Canonical()
    status, cb = launch(pm, deadline=time.monotonic_ns() - 1)
    assert status == E.NONE and cb.wait(5) == (E.MISSED_DEADLINE_PERSISTENT, [], NO_TIMING)
    assert pm.threads == []
    # Passed while the execution waited for the one busy worker: transient, never run.
    with ThreadPoolExecutor(1) as pool:
        busy = Canonical(pool=pool, delay_s=0.2)
        first, first_cb = launch(busy)
        second, second_cb = launch(busy, deadline=time.monotonic_ns() + 50 * MS)
        assert first == second == E.NONE
        assert second_cb.wait(5) == (E.MISSED_DEADLINE_TRANSIENT, [], NO_TIMING)
        assert first_cb.wait(5)[0] == E.NONE and len(busy.threads) == 1


def test_measured_time_in_driver_counts_the_wait_for_a_worker():
    with ThreadPoolExecutor(1) as pool:
        pm = Canonical(pool=pool, delay_s=0.1)
        _, first = launch(pm)
        _, second = launch(pm, measure=MeasureTiming.YES)
        assert first.wait(5)[0] == E.NONE
        status, _, timing = second.wait(5)
        # 7 us in the driver itself, plus about 100 ms queued behind the first.
        assert status == E.NONE and timing.time_on_device == 5
        assert timing.time_in_driver >= 7 + 50_000
    # Not measured (NO_TIMING) stays not measured.
    with ThreadPoolExecutor(1) as pool:
        pm = Canonical(result=(E.NONE, [], NO_TIMING), pool=pool, delay_s=0.05)
        launch(pm)
        assert launch(pm)[1].wait(5)[2] == NO_TIMING


def test_a_model_that_cannot_check_without_running_is_run_at_launch():
    pm = Canonical(result=(E.INVALID_ARGUMENT, [], NO_TIMING), verdict=None)
    status, cb = launch(pm)
    # Run on the caller's thread and notified before the launch returned.
    assert status == E.INVALID_ARGUMENT and cb.calls == 1
    assert pm.threads == [threading.current_thread().name]
    for result, expected in (((E.OUTPUT_INSUFFICIENT_SIZE, [], NO_TIMING),
                              E.OUTPUT_INSUFFICIENT_SIZE),
                             (RuntimeError("driver raised"), E.GENERAL_FAILURE)):
        status, cb = launch(Canonical(result=result, verdict=None))
        assert status == E.NONE and cb.calls == 1 and cb.status == expected


def test_a_prepared_model_that_carries_the_call_gets_it_as_it_is():
    class Native(Canonical, IHidlPreparedModel):
        def execute(self, request, measure, deadline, loop_timeout, callback):
            callback.notify(E.NONE, [], Timing(1, 2))
            return E.DEVICE_UNAVAILABLE

    pm = Native(verdict=E.INVALID_ARGUMENT)
    status, cb = launch(pm)
    assert status == E.DEVICE_UNAVAILABLE and cb.wait(5) == (E.NONE, [], Timing(1, 2))
    assert pm.threads == []


def test_a_driver_gets_the_call_without_code_of_its_own():
    """The reference driver implements no callback call: the face's is the one it answers."""
    device = ReferenceDevice()
    try:
        assert not hasattr(device, "execute") and not isinstance(device, IHidlPreparedModel)
        pcb = PreparedModelCallback()
        device.prepare_model(add_model(), callback=pcb)
        status, pm = pcb.wait(10)
        assert status == E.NONE and not hasattr(type(pm), "execute")
        a, b = float_inputs(7)
        rb = RequestBuilder([a, b], [16])
        cb = ExecutionCallback()
        assert execute_1_3(pm, rb.request, MeasureTiming.YES, None, None, cb) == E.NONE
        status, shapes, timing = cb.wait(10)
        assert status == E.NONE and shapes[0].dimensions == [2, 2]
        assert timing.time_on_device <= timing.time_in_driver
        np.testing.assert_array_equal(rb.output(0, np.float32, (2, 2)), a + b)
        rb.close()
    finally:
        device.close()
