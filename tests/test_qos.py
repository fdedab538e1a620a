"""Quality of service: deadlines, loop timeouts, timing rules and priorities."""

import time

import numpy as np
import pytest
from helpers import add_model, float_inputs

from nnhal.conformance.cases import build_model
from nnhal.drivers.reference import ReferenceDevice
from nnhal.executor import RunError, RunState
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    LOOP_TIMEOUT_MAXIMUM_NS,
    NO_TIME,
    NO_TIMING,
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    Model,
    OperandType,
    OperationType,
    Priority,
)
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3

MISSED = (ErrorStatus.MISSED_DEADLINE_TRANSIENT, ErrorStatus.MISSED_DEADLINE_PERSISTENT)
UNLIMITED = 2**64 - 1
MS = 1_000_000


def prepare(device, model: Model, priority: Priority = Priority.MEDIUM):
    cb = PreparedModelCallback()
    launch = device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, priority, None,
                                  [], [], b"", cb)
    status, pm = cb.wait(10)
    assert launch == ErrorStatus.NONE and status == ErrorStatus.NONE and cb.calls == 1
    return pm


def _operand(t: str, lifetime: str, dims: list[int], data: list | None = None,
             consumers: int = 1) -> dict:
    return {"name": None, "type": t, "dimensions": dims, "scale": 0.0, "zeroPoint": 0,
            "numberOfConsumers": consumers, "lifetime": lifetime, "channelQuant": None,
            "isIgnored": False, "data": data or []}


def infinite_loop_model() -> Model:
    """out = WHILE (i >= n) { i = i + 1 } on inputs i = n = 0: the condition never turns
    false."""
    f = "TENSOR_FLOAT32"
    cond = {"name": "cond",
            "operands": [_operand(f, "SUBGRAPH_INPUT", [1]), _operand(f, "SUBGRAPH_INPUT", [1]),
                         _operand("TENSOR_BOOL8", "SUBGRAPH_OUTPUT", [1], consumers=0)],
            "operations": [{"type": "GREATER_EQUAL", "inputs": [0, 1], "outputs": [2]}],
            "inputIndexes": [0, 1], "outputIndexes": [2]}
    body = {"name": "body",
            "operands": [_operand(f, "SUBGRAPH_INPUT", [1]),
                         _operand(f, "SUBGRAPH_INPUT", [1], consumers=0),
                         _operand(f, "SUBGRAPH_OUTPUT", [1], consumers=0),
                         _operand(f, "CONSTANT_COPY", [1], [1.0]),
                         _operand("INT32", "CONSTANT_COPY", [], [0])],
            "operations": [{"type": "ADD", "inputs": [0, 3, 4], "outputs": [2]}],
            "inputIndexes": [0, 1], "outputIndexes": [2]}
    main = {"name": "main",
            "operands": [_operand("SUBGRAPH", "SUBGRAPH", [], [0]),
                         _operand("SUBGRAPH", "SUBGRAPH", [], [1]),
                         _operand(f, "SUBGRAPH_INPUT", [1]), _operand(f, "SUBGRAPH_INPUT", [1]),
                         _operand(f, "SUBGRAPH_OUTPUT", [1], consumers=0)],
            "operations": [{"type": "WHILE", "inputs": [0, 1, 2, 3], "outputs": [4]}],
            "inputIndexes": [2, 3], "outputIndexes": [4]}
    return build_model({"main": main, "referenced": [cond, body], "isRelaxed": False})


def loop_request() -> RequestBuilder:
    zero = np.zeros(1, np.float32)
    return RequestBuilder([zero, zero], [4])


def chain_model(length: int = 50) -> Model:
    """x + x + ... (50 additions): many operations, to see the deadline checked between them."""
    b = ModelBuilder()
    x = b.input(OperandType.TENSOR_FLOAT32, (4,))
    act = b.scalar(OperandType.INT32, 0)
    cur = x
    for _ in range(length - 1):
        nxt = b.operand(OperandType.TENSOR_FLOAT32, (4,))
        b.operation(OperationType.ADD, [cur, x, act], [nxt])
        cur = nxt
    out = b.output(OperandType.TENSOR_FLOAT32, (4,))
    b.operation(OperationType.ADD, [cur, x, act], [out])
    return b.build()


# ---- deadlines ------------------------------------------------------------------------------

def test_deadline_checked_between_operations(device):
    pm = prepare(device, chain_model())
    x = np.ones(4, np.float32)
    np.testing.assert_array_equal(pm.plan.main.run([x], RunState())[0], x * 51)
    with pytest.raises(RunError) as e:
        pm.plan.main.run([x], RunState(deadline_ns=time.monotonic_ns() - 1))
    assert e.value.status in MISSED


def test_passed_deadline_refused_on_every_path(device):
    past = time.monotonic_ns() - 1
    cb = PreparedModelCallback()
    device.prepare_model(add_model(), ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM,
                         past, [], [], b"", cb)
    assert cb.wait(5)[0] in MISSED and cb.prepared_model is None and cb.calls == 1

    pm = prepare(device, add_model())
    rb = RequestBuilder(list(float_inputs(0)), [16])
    status, shapes, timing = pm.execute_synchronously(rb.request, MeasureTiming.YES, past)
    assert status in MISSED and shapes == [] and timing == NO_TIMING
    ecb = ExecutionCallback()
    # As VTS expects: launched (NONE), then the callback carries the missed deadline.
    assert execute_1_3(pm, rb.request, MeasureTiming.YES, past, None, ecb) == ErrorStatus.NONE
    assert ecb.wait(5) == (ecb.status, [], NO_TIMING) and ecb.status in MISSED
    status, fence, fcb = pm.execute_fenced(rb.request, [], MeasureTiming.YES, past)
    assert status in MISSED and fence is None and fcb is None
    rb.close()


def test_unlimited_deadline_runs_normally(device):
    cb = PreparedModelCallback()
    assert device.prepare_model(add_model(), ExecutionPreference.SUSTAINED_SPEED, Priority.HIGH,
                                UNLIMITED, [], [], b"", cb) == ErrorStatus.NONE
    status, pm = cb.wait(5)
    assert status == ErrorStatus.NONE
    a, b = float_inputs(1)
    rb = RequestBuilder([a, b], [16])
    assert pm.execute_synchronously(rb.request, MeasureTiming.NO, UNLIMITED)[0] == \
        ErrorStatus.NONE
    ecb = ExecutionCallback()
    assert execute_1_3(pm, rb.request, MeasureTiming.NO, UNLIMITED, None, ecb) == ErrorStatus.NONE
    assert ecb.wait(5)[0] == ErrorStatus.NONE
    status, fence, _ = pm.execute_fenced(rb.request, [], MeasureTiming.NO, UNLIMITED)
    assert status == ErrorStatus.NONE and fence.wait(5).name == "SIGNALED"
    fence.close()
    np.testing.assert_array_equal(rb.output(0, np.float32, (2, 2)), a + b)
    rb.close()


def test_deadline_expiring_inside_an_endless_loop(device, caplog):
    pm = prepare(device, infinite_loop_model())
    rb = loop_request()
    caplog.set_level("DEBUG", logger="nnhal.drivers")
    soon = time.monotonic_ns() + 30 * MS
    status, _, timing = pm.execute_synchronously(rb.request, MeasureTiming.YES, soon,
                                                 LOOP_TIMEOUT_MAXIMUM_NS)
    assert status in MISSED and timing == NO_TIMING
    cb = ExecutionCallback()
    soon = time.monotonic_ns() + 30 * MS
    assert execute_1_3(pm, rb.request, MeasureTiming.YES, soon, LOOP_TIMEOUT_MAXIMUM_NS, cb) == \
        ErrorStatus.NONE
    status, _, timing = cb.wait(10)
    assert status in MISSED and timing == NO_TIMING
    # Both stopped by the deadline, long before the 15 s loop timeout.
    assert caplog.text.count("deadline passed") == 2 and "loop timeout" not in caplog.text
    rb.close()


def test_loop_timeout_bounds(device):
    pm = prepare(device, infinite_loop_model())
    rb = loop_request()
    status, _, _ = pm.execute_synchronously(rb.request, MeasureTiming.NO, None, 10 * MS)
    assert status in MISSED
    for bad in (LOOP_TIMEOUT_MAXIMUM_NS + 1, -1):
        assert pm.execute_synchronously(rb.request, MeasureTiming.NO, None, bad)[0] == \
            ErrorStatus.INVALID_ARGUMENT
    rb.close()


def test_priority_and_preference_validated(device):
    for pref, prio in ((ExecutionPreference.LOW_POWER, 7), (9, Priority.LOW)):
        cb = PreparedModelCallback()
        assert device.prepare_model(add_model(), pref, prio, None, [], [], b"", cb) == \
            ErrorStatus.INVALID_ARGUMENT
        assert cb.wait(5) == (ErrorStatus.INVALID_ARGUMENT, None)


# ---- timing ---------------------------------------------------------------------------------

def test_timing_only_when_measured_and_successful(device):
    pm = prepare(device, add_model())
    loop = prepare(device, infinite_loop_model())
    rb = RequestBuilder(list(float_inputs(2)), [16])
    lrb = loop_request()

    def sync(p, r, measure):
        status, _, timing = p.execute_synchronously(r.request, measure, None, 5 * MS)
        return status, timing

    def asynchronous(p, r, measure):
        cb = ExecutionCallback()
        assert execute_1_3(p, r.request, measure, None, 5 * MS, cb) == ErrorStatus.NONE
        status, _, timing = cb.wait(10)
        return status, timing

    def fenced(p, r, measure):
        status, fence, cb = p.execute_fenced(r.request, [], measure, None, 5 * MS)
        assert status == ErrorStatus.NONE
        fence.wait(10)
        fence.close()
        status, launched, after_fence = cb.get_execution_info()
        assert (launched == NO_TIMING) == (after_fence == NO_TIMING)
        return status, launched

    for run in (sync, asynchronous, fenced):
        status, timing = run(pm, rb, MeasureTiming.YES)
        assert status == ErrorStatus.NONE, run.__name__
        assert NO_TIME not in (timing.time_on_device, timing.time_in_driver), run.__name__
        assert timing.time_on_device <= timing.time_in_driver
        assert run(pm, rb, MeasureTiming.NO) == (ErrorStatus.NONE, NO_TIMING), run.__name__
        status, timing = run(loop, lrb, MeasureTiming.YES)  # fails: loop timeout
        assert status in MISSED and timing == NO_TIMING, run.__name__
    rb.close()
    lrb.close()


# ---- priority -------------------------------------------------------------------------------

def test_high_priority_not_starved_by_busy_low_priority_workers():
    device = ReferenceDevice(workers=2)
    try:
        loop = prepare(device, infinite_loop_model(), Priority.LOW)
        low_add = prepare(device, add_model(), Priority.LOW)
        high_add = prepare(device, add_model(), Priority.HIGH)
        lrb = loop_request()
        # Four LOW loops of 1.5 s each on two LOW workers: LOW is busy for about 3 s, long
        # enough that a loaded machine still runs HIGH before any LOW loop times out.
        low = [ExecutionCallback() for _ in range(4)]
        for cb in low:
            assert execute_1_3(loop, lrb.request, MeasureTiming.NO, None, 1500 * MS, cb) == \
                ErrorStatus.NONE
        a, b = float_inputs(3)
        queued_low, high = RequestBuilder([a, b], [16]), RequestBuilder([b, b], [16])
        low_cb, high_cb = ExecutionCallback(), ExecutionCallback()
        assert execute_1_3(low_add, queued_low.request, MeasureTiming.NO, None, None, low_cb) == \
            ErrorStatus.NONE
        assert execute_1_3(high_add, high.request, MeasureTiming.NO, None, None, high_cb) == \
            ErrorStatus.NONE
        assert high_cb.wait(10)[0] == ErrorStatus.NONE
        # HIGH finished while every LOW execution, even the quick one, was still waiting.
        assert all(cb.calls == 0 for cb in low) and low_cb.calls == 0
        np.testing.assert_array_equal(high.output(0, np.float32, (2, 2)), b + b)
        assert all(cb.wait(10)[0] in MISSED for cb in low)
        assert low_cb.wait(10)[0] == ErrorStatus.NONE
        for r in (lrb, queued_low, high):
            r.close()
    finally:
        device.close()
