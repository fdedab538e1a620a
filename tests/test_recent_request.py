"""The request a prepared model ran last is recognised without checking it again
(executeSynchronously and bursts): anything a client changes in that very request object, or
any plain argument beside it, is still checked, and still refused when invalid."""

import numpy as np
import pytest
from helpers import add_model, float_inputs

from nnhal.hal.builder import RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    DataLocation,
    ErrorStatus,
    MeasureTiming,
    MemoryPool,
    RequestArgument,
)
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3
from nnhal.memory import SharedMemory

E = ErrorStatus
DIMS = (4, 4)


@pytest.fixture
def pm(device):
    cb = PreparedModelCallback()
    device.prepare_model(add_model(DIMS), callback=cb)
    status, pm = cb.wait(30)
    assert status == E.NONE
    return pm


@pytest.fixture
def rb():
    a, b = float_inputs(5, DIMS)
    builder = RequestBuilder([a, b], [a.nbytes])
    builder.expected = a + b
    yield builder
    builder.close()


def _paths(pm):
    _, burst = pm.configure_execution_burst()

    def run_async(req, **kw):
        cb = ExecutionCallback()
        launched = execute_1_3(pm, req, kw.pop("measure", MeasureTiming.NO),
                               kw.pop("deadline", None), kw.pop("loop_timeout", None), cb)
        status = cb.wait(30)[0]
        assert launched == E.NONE or launched == status
        return status

    return {"sync": lambda req, **kw: pm.execute_synchronously(req, **kw)[0],
            "burst": lambda req, **kw: burst.execute(req, **kw)[0],
            "async": run_async}


def _output(rb):
    return rb.output(0, np.float32, DIMS)


def _mutations():
    """(name, change to the request run last, the status it must then get)."""
    def loc(which, k, **changes):
        def change(req):
            arg = getattr(req, which)[k]
            fields = dict(pool_index=arg.location.pool_index, offset=arg.location.offset,
                          length=arg.location.length)
            fields.update(changes)
            arg.location = DataLocation(**fields)
        return change

    def dims(which, value):
        def change(req):
            getattr(req, which)[0].dimensions = value
        return change

    def field(which, name, value):
        def change(req):
            setattr(getattr(req, which)[0], name, value)
        return change

    invalid = [
        ("input offset past the pool", loc("inputs", 1, offset=10**6)),
        ("pool index unknown", loc("inputs", 0, pool_index=7)),
        ("offset a bool", loc("inputs", 0, offset=True)),
        ("offset a float", loc("inputs", 0, offset=0.0)),
        ("offset negative", loc("inputs", 0, offset=-4)),
        ("dimensions wrong", dims("inputs", [4, 5])),
        ("dimensions of bools", dims("inputs", [True, 4])),
        ("dimensions of rank 3", dims("outputs", [4, 4, 1])),
        ("hasNoValue an int", field("inputs", "has_no_value", 1)),
        ("required input given no value", field("inputs", "has_no_value", True)),
        ("argument replaced by a tuple", lambda req: req.inputs.__setitem__(0, (False,))),
        ("location a tuple", field("outputs", "location", (1, 0, 64))),
        ("an input too many", lambda req: req.inputs.append(RequestArgument(
            False, DataLocation(0, 0, 64), []))),
        ("an output missing", lambda req: req.outputs.clear()),
        ("a pool missing", lambda req: req.pools.pop()),
        ("pool a token no one allocated", lambda req: req.pools.__setitem__(
            1, MemoryPool.of_token(12345))),
        ("pool holding nothing", lambda req: req.pools.__setitem__(1, MemoryPool())),
        ("pool a smaller memory", lambda req: req.pools.__setitem__(
            0, SharedMemory.ashmem(16))),
    ]
    other = [
        ("output length too small", loc("outputs", 0, length=8), E.OUTPUT_INSUFFICIENT_SIZE),
        # Lists or tuples: both are accepted, the changed request is simply run.
        ("dimensions a tuple", dims("outputs", (4, 4)), E.NONE),
        ("pools a tuple", lambda req: setattr(req, "pools", tuple(req.pools)), E.NONE),
        ("inputs a tuple", lambda req: setattr(req, "inputs", tuple(req.inputs)), E.NONE),
    ]
    return [(name, change, E.INVALID_ARGUMENT) for name, change in invalid] + other


@pytest.mark.parametrize("path", ["sync", "burst", "async"])
@pytest.mark.parametrize("name,change,expected", _mutations(), ids=[m[0] for m in _mutations()])
def test_request_changed_after_a_run_is_checked_again(device, pm, rb, path, name, change,
                                                      expected):
    run = _paths(pm)[path]
    assert run(rb.request) == E.NONE
    assert run(rb.request) == E.NONE  # recognised now
    change(rb.request)
    assert run(rb.request) == expected, name
    # As a prepared model that never ran the request answers.
    cb = PreparedModelCallback()
    device.prepare_model(add_model(DIMS), callback=cb)
    assert _paths(cb.wait(30)[1])[path](rb.request) == expected


@pytest.mark.parametrize("path", ["sync", "burst", "async"])
@pytest.mark.parametrize("kw", [dict(measure=2), dict(measure=-1), dict(measure="YES"),
                                dict(loop_timeout=15_000_000_001), dict(loop_timeout=-1),
                                dict(loop_timeout=1.5), dict(deadline=-1),
                                dict(deadline=2**64), dict(deadline=1.0)],
                         ids=repr)
def test_plain_arguments_still_checked(pm, rb, path, kw):
    run = _paths(pm)[path]
    assert run(rb.request) == E.NONE
    assert run(rb.request, **kw) == E.INVALID_ARGUMENT


@pytest.mark.parametrize("path", ["sync", "burst", "async"])
def test_recognised_request_sees_new_inputs_and_valid_changes(pm, rb, path):
    run = _paths(pm)[path]
    assert run(rb.request) == E.NONE
    np.testing.assert_array_equal(_output(rb), rb.expected)
    # New input values in the same memory are read.
    a, b = float_inputs(6, DIMS)
    for arg, arr in zip(rb.request.inputs, (a, b)):
        rb.input_memory.write(arg.location.offset, arr)
    assert run(rb.request) == E.NONE
    np.testing.assert_array_equal(_output(rb), a + b)
    # A valid change (the dimensions spelled out, a new output memory) is followed.
    rb.request.inputs[0].dimensions = list(DIMS)
    out = SharedMemory.ashmem(64)
    try:
        rb.request.pools[1] = MemoryPool.of(out)
        assert run(rb.request) == E.NONE
        np.testing.assert_array_equal(out.array().view(np.float32).reshape(DIMS), a + b)
        assert run(rb.request, measure=MeasureTiming.YES, loop_timeout=10**9,
                   deadline=2**63) == E.NONE
    finally:
        out.close()


@pytest.mark.parametrize("path", ["sync", "burst", "async"])
def test_closed_memory_refused(pm, rb, path):
    run = _paths(pm)[path]
    assert run(rb.request) == E.NONE
    rb.output_memory.close()
    assert run(rb.request) == E.INVALID_ARGUMENT


def test_recognised_only_by_the_model_that_ran_it(device, pm, rb):
    cb = PreparedModelCallback()
    device.prepare_model(add_model((4, 5)), callback=cb)
    other = cb.wait(30)[1]
    assert pm.execute_synchronously(rb.request)[0] == E.NONE
    assert other.execute_synchronously(rb.request)[0] == E.INVALID_ARGUMENT
