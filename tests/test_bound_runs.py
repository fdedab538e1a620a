"""Runs of a request bound once (reusable executions, repeated requests): when every step
writes into the request's memory, the whole run is decided at binding (RequestPlan.fixed) and
must give what the generic run gives."""

import time

import numpy as np
import pytest
from helpers import float_inputs

from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import ErrorStatus, OperandType, OperationType

E = ErrorStatus
T = OperandType
DIMS = (3, 5)


def two_outputs_model():
    """s = a + b (RELU) and p = s * b: two model outputs, the second reading the first."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, DIMS)
    y = b.input(T.TENSOR_FLOAT32, DIMS)
    relu = b.scalar(T.INT32, 1)
    none = b.scalar(T.INT32, 0)
    s = b.output(T.TENSOR_FLOAT32, DIMS)
    p = b.output(T.TENSOR_FLOAT32, DIMS)
    b.operation(OperationType.ADD, [x, y, relu], [s])
    b.operation(OperationType.MUL, [s, y, none], [p])
    return b.build()


@pytest.fixture
def pm(device):
    cb = PreparedModelCallback()
    device.prepare_model(two_outputs_model(), callback=cb)
    status, pm = cb.wait(30)
    assert status == E.NONE
    return pm


@pytest.fixture
def rb():
    a, b = float_inputs(11, DIMS)
    builder = RequestBuilder([a, b], [a.nbytes, a.nbytes])
    s = np.maximum(a + b, 0)
    builder.expected = [s, s * b]
    yield builder
    builder.close()


def outputs(rb):
    return [rb.output(k, np.float32, DIMS) for k in range(2)]


def test_fixed_run_matches_generic(pm, rb):
    status, execution = pm.create_reusable_execution(rb.request)
    assert status == E.NONE
    assert execution._prepared.fixed is not None  # decided at binding
    for deadline in (None, time.monotonic_ns() + 10**10):  # a deadline: the generic way
        rb.output_memory.array()[:] = 0
        status, shapes, _ = execution.compute(deadline)
        assert status == E.NONE
        assert [s.dimensions for s in shapes] == [list(DIMS)] * 2
        for got, want in zip(outputs(rb), rb.expected):
            np.testing.assert_array_equal(got, want)
    # New inputs are read at each run.
    a, b = float_inputs(12, DIMS)
    for arg, arr in zip(rb.request.inputs, (a, b)):
        rb.input_memory.write(arg.location.offset, arr)
    assert execution.compute()[0] == E.NONE
    s = np.maximum(a + b, 0)
    np.testing.assert_array_equal(outputs(rb)[1], s * b)


def test_fixed_run_kernel_failure_is_general_failure(pm, rb):
    status, execution = pm.create_reusable_execution(rb.request)
    fixed = execution._prepared.fixed
    step, _, ins, outs = fixed[1]

    def broken(ins, outs, rt):
        raise ValueError("broken kernel")

    fixed[1] = (step, broken, ins, outs)
    assert execution.compute()[0] == E.GENERAL_FAILURE
    fixed[1] = (step, lambda ins, outs, rt: ins.clear(), ins, outs)  # may change its list
    assert execution.compute()[0] == E.NONE
    assert len(fixed[1][2]) == 3


def test_overlapping_outputs_not_fixed(pm, rb):
    """Both outputs at one place in the pool: not written in place, so not fixed."""
    rb.request.outputs[1].location = rb.request.outputs[0].location
    status, execution = pm.create_reusable_execution(rb.request)
    assert status == E.NONE and execution._prepared.fixed is None
    assert execution.compute()[0] == E.NONE
    np.testing.assert_array_equal(outputs(rb)[0], rb.expected[1])  # the last one written
