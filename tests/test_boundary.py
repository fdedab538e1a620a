"""Arguments checked at the HAL boundary: every entry point refuses a wrongly typed or
out-of-range field or argument with INVALID_ARGUMENT (through the callback too, exactly once),
never raises, and never writes a byte of a rejected request's outputs.

Each test corrupts one field of a valid structure (a deep copy) or one argument of a valid
call, and checks the answer; the uncorrupted call is checked to succeed and to write the
outputs, so a sentinel left intact means something.
"""

from __future__ import annotations

import copy
import math
import os
import time

import numpy as np
import pytest
from helpers import add_model
from hypothesis import given, settings
from hypothesis import strategies as st

from nnhal.hal import checks
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.fence import SyncFence
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    BufferDesc,
    BufferRole,
    DataLocation,
    ErrorStatus,
    ExecutionPreference,
    ExtensionNameAndPrefix,
    MeasureTiming,
    MemoryPool,
    Model,
    OperandLifeTime,
    OperandType,
    OperationType,
    Priority,
    Request,
    RequestArgument,
    Subgraph,
    SymmPerChannelQuantParams,
)
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3
from nnhal.memory import SharedMemory

E = ErrorStatus
T = OperandType
INVALID = ErrorStatus.INVALID_ARGUMENT
SENTINEL = 0xA5
DIMS = (2, 2)
NBYTES = 16
WAIT_S = 30

# Bad values by HAL field kind. Each is wrong by its Python type or by its range.
BAD_UINT32 = ["1", 1.0, 1.5, True, False, -1, 2**32, 2**64, None, [1]]
BAD_INT32 = ["0", 0.0, 0.5, True, 2**31, -(2**31) - 1, None]
BAD_SCALE = ["0.5", True, None, math.nan, math.inf, -math.inf, 1e39, 10**400, [0.5], b"x"]
BAD_BOOL = ["yes", 0, 1, 1.0, None]
BAD_DIMS = [["2", 2], [2.0, 2], [2.5, 2], [True, 2], [-1, 2], [2**32, 2], [None, 2], None,
            "22", 22, {2: 2}]
BAD_TIME = ["soon", 1.5, 1e18, True, False, -1, 2**64, b"1", [1]]
BAD_LOOP_TIMEOUT = BAD_TIME + [15_000_000_001]  # beyond the 15 s maximum
BAD_MEASURE = ["0", 0.0, 1.0, True, False, -1, 2, 2**32, None, Priority.HIGH]
BAD_ENUM3 = ["1", 1.0, 1.5, True, -1, 3, 2**32, None]  # preference and priority


def _ids(values):
    return [f"{type(v).__name__}:{v!r}"[:40] for v in values]


def bad(values):
    return pytest.mark.parametrize("value", values, ids=_ids(values))


# ---- models and requests -------------------------------------------------------------------

def two_output_model() -> Model:
    """out0 = x + y, out1 = x * y: two inputs, two outputs (operands 0, 1 | 3, 4)."""
    b = ModelBuilder()
    x, y = b.input(T.TENSOR_FLOAT32, DIMS), b.input(T.TENSOR_FLOAT32, DIMS)
    act = b.scalar(T.INT32, 0)
    s, p = b.output(T.TENSOR_FLOAT32, DIMS), b.output(T.TENSOR_FLOAT32, DIMS)
    b.operation(OperationType.ADD, [x, y, act], [s])
    b.operation(OperationType.MUL, [x, y, act], [p])
    return b.build()


def prepare(device, model) -> object:
    cb = PreparedModelCallback()
    assert device.prepare_model(model, callback=cb) == E.NONE
    status, pm = cb.wait(WAIT_S)
    assert status == E.NONE
    return pm


class Req:
    """A valid request of the two-output model; outputs filled with a sentinel."""

    def __init__(self):
        self.inp = SharedMemory.ashmem(2 * NBYTES)
        self.inp.write(0, np.arange(8, dtype=np.float32))
        self.out = SharedMemory.ashmem(2 * NBYTES)
        self.request = Request(
            [RequestArgument(False, DataLocation(0, 0, NBYTES), []),
             RequestArgument(False, DataLocation(0, NBYTES, NBYTES), [])],
            [RequestArgument(False, DataLocation(1, 0, NBYTES), []),
             RequestArgument(False, DataLocation(1, NBYTES, NBYTES), [])],
            [self.inp, self.out])
        self.reset()

    def reset(self) -> None:
        self.out.array()[:] = SENTINEL

    def untouched(self) -> bool:
        return bool((self.out.array() == SENTINEL).all())

    def copy(self) -> Request:
        """A deep copy of the structure sharing the memories."""
        return copy.deepcopy(self.request, {id(self.inp): self.inp, id(self.out): self.out})

    def close(self) -> None:
        self.inp.close()
        self.out.close()


@pytest.fixture(scope="module")
def dev():
    from nnhal.drivers.reference import ReferenceDevice

    d = ReferenceDevice()
    yield d
    d.close()


@pytest.fixture(scope="module")
def pm(dev):
    return prepare(dev, two_output_model())


@pytest.fixture
def req():
    r = Req()
    yield r
    r.close()


# ---- the execution paths -------------------------------------------------------------------

def _fenced_result(status, fence, callback):
    if status != E.NONE:
        assert fence is None and callback is None
        return status
    assert fence.wait(WAIT_S) != 0
    return callback.get_execution_info(WAIT_S)[0]


def _async(pm, request, measure, deadline, loop_timeout):
    cb = ExecutionCallback()
    launch = execute_1_3(pm, request, measure, deadline, loop_timeout, cb)
    if launch != E.NONE:
        assert cb.calls == 1 and cb.status == launch  # notified before returning
        return launch
    status = cb.wait(WAIT_S)[0]
    time.sleep(0.001)
    assert cb.calls == 1
    return status


def run_path(path, pm, request, measure=MeasureTiming.NO, deadline=None, loop_timeout=None,
             duration=None, wait_for=()):
    """Status of one execution through ``path``; every bad argument goes where it belongs."""
    if path == "execute_synchronously":
        return pm.execute_synchronously(request, measure, deadline, loop_timeout)[0]
    if path == "execute":
        return _async(pm, request, measure, deadline, loop_timeout)
    if path == "execute_fenced":
        return _fenced_result(*pm.execute_fenced(request, wait_for, measure, deadline,
                                                 loop_timeout, duration))
    if path in ("burst.execute", "burst.create_reusable_execution"):
        status, burst = pm.configure_execution_burst()
        assert status == E.NONE
        if path == "burst.execute":
            return burst.execute(request, measure, deadline, loop_timeout)[0]
        status, ex = burst.create_reusable_execution(request, measure, loop_timeout)
        return status if status != E.NONE else ex.compute(deadline)[0]
    if path == "create_reusable_execution":
        status, ex = pm.create_reusable_execution(request, measure, loop_timeout)
        if status != E.NONE:
            assert ex is None
            return status
        if duration is not None or wait_for != ():
            return _fenced_result(*ex.compute_fenced(wait_for, deadline, duration))
        return ex.compute(deadline)[0]
    raise AssertionError(path)


REQUEST_PATHS = ["execute_synchronously", "execute", "execute_fenced",
                 "create_reusable_execution", "burst.execute",
                 "burst.create_reusable_execution"]
TIMED_PATHS = REQUEST_PATHS  # every one takes a deadline (reusable: at compute)


def expect_rejected(path, pm, r, **kw):
    r.reset()
    status = run_path(path, pm, kw.pop("request", r.request), **kw)
    assert status == INVALID, status
    assert r.untouched(), f"{path} wrote a rejected request's output"


@pytest.mark.parametrize("path", REQUEST_PATHS)
def test_valid_request_runs_on_every_path(pm, req, path):
    """The control: the uncorrupted request succeeds and overwrites the sentinel."""
    assert run_path(path, pm, req.request) == E.NONE
    got = req.out.array().view(np.float32)
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(got, np.concatenate([x[:4] + x[4:], x[:4] * x[4:]]))
    assert run_path(path, pm, req.request, MeasureTiming.YES, time.monotonic_ns() + 10**10,
                    2_000_000_000) == E.NONE


# ---- request fields ------------------------------------------------------------------------

ARGS = [("inputs", 0), ("inputs", 1), ("outputs", 0), ("outputs", 1)]


def _set_location(request, kind, k, field, value):
    arg = getattr(request, kind)[k]
    kw = {f: getattr(arg.location, f) for f in ("pool_index", "offset", "length")}
    kw[field] = value
    arg.location = DataLocation(**kw)


@pytest.mark.parametrize("path", REQUEST_PATHS)
@pytest.mark.parametrize("kind,k", ARGS)
@pytest.mark.parametrize("field", ["pool_index", "offset", "length"])
@bad(BAD_UINT32)
def test_location_fields(pm, req, path, kind, k, field, value):
    request = req.copy()
    _set_location(request, kind, k, field, value)
    expect_rejected(path, pm, req, request=request)


@pytest.mark.parametrize("path", REQUEST_PATHS)
@pytest.mark.parametrize("kind,k", ARGS)
@bad(BAD_DIMS)
def test_argument_dimensions(pm, req, path, kind, k, value):
    request = req.copy()
    getattr(request, kind)[k].dimensions = value
    expect_rejected(path, pm, req, request=request)


@pytest.mark.parametrize("path", REQUEST_PATHS)
@pytest.mark.parametrize("kind,k", ARGS)
@bad(BAD_BOOL)
def test_has_no_value(pm, req, path, kind, k, value):
    request = req.copy()
    getattr(request, kind)[k].has_no_value = value
    expect_rejected(path, pm, req, request=request)


WRONG_OBJECTS = [None, "x", 5, DataLocation(0, 0, 16), (False, DataLocation(0, 0, 16), [])]


@pytest.mark.parametrize("path", REQUEST_PATHS)
@pytest.mark.parametrize("kind,k", ARGS)
@bad(WRONG_OBJECTS)
def test_argument_and_location_kinds(pm, req, path, kind, k, value):
    request = req.copy()
    getattr(request, kind)[k] = value  # not a RequestArgument
    expect_rejected(path, pm, req, request=request)
    if isinstance(value, DataLocation):
        return
    request = req.copy()
    getattr(request, kind)[k].location = value  # not a DataLocation
    expect_rejected(path, pm, req, request=request)


@pytest.mark.parametrize("path", REQUEST_PATHS)
@pytest.mark.parametrize("field", ["inputs", "outputs", "pools"])
@bad([None, "ab", 5, {0: 0}])
def test_request_lists(pm, req, path, field, value):
    request = req.copy()
    setattr(request, field, value)
    expect_rejected(path, pm, req, request=request)


def _pool_corruptions(r):
    return [None, b"x" * 32, bytearray(32), 5, "x", r.out.array(), DataLocation(),
            MemoryPool(), MemoryPool(hidl_memory=r.out, token=1),
            MemoryPool.of_token(-1), MemoryPool.of_token(1.5), MemoryPool.of_token(2**32),
            MemoryPool.of_token("1"), MemoryPool.of_token(True), MemoryPool.of(5)]


@pytest.mark.parametrize("path", REQUEST_PATHS)
@pytest.mark.parametrize("i", [0, 1])
@pytest.mark.parametrize("n", range(15))
def test_request_pools(pm, req, path, i, n):
    request = req.copy()
    request.pools[i] = _pool_corruptions(req)[n]
    expect_rejected(path, pm, req, request=request)


@pytest.mark.parametrize("path", REQUEST_PATHS)
@bad([None, "request", 5, RequestArgument(), Subgraph([], [], [], [])])
def test_request_kind(pm, req, path, value):
    expect_rejected(path, pm, req, request=value)


def test_an_earlier_output_is_not_written_when_a_later_one_is_bad(pm, req):
    """The probe's case: output 1 fractional, output 0 valid: nothing written on any path."""
    for value in (0.5, 16.5, 16.0):
        for field in ("offset", "length"):
            request = req.copy()
            _set_location(request, "outputs", 1, field, value)
            for path in REQUEST_PATHS:
                expect_rejected(path, pm, req, request=request)


def test_numpy_integer_dimensions_are_accepted(pm, req):
    request = req.copy()
    request.inputs[0].dimensions = [np.uint32(2), np.int64(2)]
    request.outputs[0].dimensions = (2, 2)
    for path in REQUEST_PATHS:
        req.reset()
        assert run_path(path, pm, request) == E.NONE
        assert not req.untouched()


# ---- measure, deadline, loop timeout, duration, waitFor ------------------------------------

@pytest.mark.parametrize("path", REQUEST_PATHS)
@bad(BAD_MEASURE)
def test_measure(pm, req, path, value):
    expect_rejected(path, pm, req, measure=value)


@pytest.mark.parametrize("path", TIMED_PATHS)
@bad(BAD_TIME)
def test_deadline(pm, req, path, value):
    expect_rejected(path, pm, req, deadline=value)


@pytest.mark.parametrize("path", REQUEST_PATHS)
@bad(BAD_LOOP_TIMEOUT)
def test_loop_timeout(pm, req, path, value):
    expect_rejected(path, pm, req, loop_timeout=value)


@pytest.mark.parametrize("path", ["execute_fenced", "create_reusable_execution"])
@bad(BAD_TIME)
def test_fenced_duration(pm, req, path, value):
    expect_rejected(path, pm, req, duration=value)


@pytest.mark.parametrize("path", ["execute_fenced", "create_reusable_execution"])
@bad(["x", 5, [None], [5], [object()], [SyncFence.signaled(), "x"]])
def test_wait_for(pm, req, path, value):
    expect_rejected(path, pm, req, wait_for=value, duration=10**9)


def test_compute_fenced_deadline(pm, req):
    status, ex = pm.create_reusable_execution(req.request)
    assert status == E.NONE
    for value in BAD_TIME:
        req.reset()
        assert ex.compute_fenced([], value, None) == (INVALID, None, None)
        assert req.untouched()


def test_callback_kinds(pm, req):
    for cb in (None, "callback", 5, object()):
        assert execute_1_3(pm, req.request, MeasureTiming.NO, None, None, cb) == INVALID
    assert req.untouched()


# ---- IBurst.cache_memory, configureExecutionBurst ------------------------------------------

def test_burst_cache_memory_wrong_kinds(pm, req):
    status, burst = pm.configure_execution_burst()
    assert status == E.NONE
    for memory in (None, "x", 5, b"x" * 16, req.out.array(), MemoryPool.of_token(1),
                   MemoryPool()):
        assert burst.cache_memory(memory) is None
    assert burst.cached_count == 0
    assert burst.cache_memory(req.out) is not None


# ---- IBuffer and IDevice::allocate ---------------------------------------------------------

@pytest.fixture(scope="module")
def add_pm(dev):
    return prepare(dev, add_model(DIMS))


def _alloc(dev, desc, models, ins, outs):
    status, buf, token = dev.allocate(desc, models, ins, outs)
    return status, buf, token


def test_allocate_control(dev, add_pm):
    status, buf, token = _alloc(dev, BufferDesc([2, 2]), [add_pm], [BufferRole(0, 0)],
                                [BufferRole(0, 0)])
    assert status == E.NONE and buf is not None and token > 0


@bad([None, "x", [2, 2], BufferDesc(None), BufferDesc("22")] +
     [BufferDesc(d) for d in BAD_DIMS if isinstance(d, list)])
def test_allocate_desc(dev, add_pm, value):
    assert _alloc(dev, value, [add_pm], [BufferRole(0, 0)], []) == (INVALID, None, 0)


@bad([None, "x", 5, {0: 0}])
def test_allocate_prepared_models(dev, add_pm, value):
    assert _alloc(dev, BufferDesc([]), value, [BufferRole(0, 0)], []) == (INVALID, None, 0)


def _bad_roles():
    roles = [None, "x", 5, [None], ["x"], [(0, 0)]]
    roles += [[BufferRole(v, 0)] for v in BAD_UINT32]
    roles += [[BufferRole(0, v)] for v in BAD_UINT32]
    roles += [[BufferRole(0, 0, v)] for v in BAD_SCALE]
    return roles


@pytest.mark.parametrize("which", ["input", "output"])
@bad(_bad_roles())
def test_allocate_roles(dev, add_pm, which, value):
    ins, outs = (value, []) if which == "input" else ([], value)
    assert _alloc(dev, BufferDesc([]), [add_pm], ins, outs) == (INVALID, None, 0)


@pytest.fixture
def buffer(dev, add_pm):
    status, buf, _ = _alloc(dev, BufferDesc([2, 2]), [add_pm], [BufferRole(0, 0)],
                            [BufferRole(0, 0)])
    assert status == E.NONE
    src = SharedMemory.from_bytes(np.arange(4, dtype=np.float32).tobytes())
    assert buf.copy_from(src, [2, 2]) == E.NONE
    yield buf, src
    src.close()


@bad([None, "x", 5, b"x" * 16, bytearray(16), MemoryPool(), np.zeros(16, np.uint8)])
def test_copy_to_and_from_memory_kinds(buffer, value):
    buf, _src = buffer
    assert buf.copy_to(value) == INVALID
    assert buf.copy_from(value, [2, 2]) == INVALID


@bad(BAD_DIMS + [(2, 2.0)])
def test_copy_from_dimensions(buffer, value):
    buf, src = buffer
    assert buf.copy_from(src, value) == INVALID


# ---- IDevice: models, preference, priority, deadline ----------------------------------------

def _model_corruptions():
    """(name, function(model, value), bad values): one field each, in a valid model."""
    def op(i, field):
        return lambda m, v: setattr(m.main.operands[i], field, v)

    def loc(i, field):
        def set_(m, v):
            o = m.main.operands[i]
            kw = {f: getattr(o.location, f) for f in ("pool_index", "offset", "length")}
            kw[field] = v
            o.location = DataLocation(**kw)
        return set_

    def operation(field, k=None):
        def set_(m, v):
            o = m.main.operations[0]
            if k is None:
                setattr(o, field, v)
            else:
                getattr(o, field)[k] = v
        return set_

    def subgraph(field, k=None):
        def set_(m, v):
            if k is None:
                setattr(m.main, field, v)
            else:
                getattr(m.main, field)[k] = v
        return set_

    return [
        ("operand.type", op(0, "type"), BAD_UINT32),
        ("operand.dimensions", op(0, "dimensions"), BAD_DIMS),
        ("operand.numberOfConsumers", op(0, "number_of_consumers"), BAD_UINT32),
        ("operand.scale", op(0, "scale"), BAD_SCALE),
        ("operand.zeroPoint", op(0, "zero_point"), BAD_INT32 + [10.5, "10"]),
        ("operand.lifetime", op(0, "lifetime"), BAD_INT32 + [1.0]),
        ("operand.location", op(2, "location"), [None, (0, 0, 4), "loc"]),
        ("operand.location.poolIndex", loc(2, "pool_index"), BAD_UINT32),
        ("operand.location.offset", loc(2, "offset"), BAD_UINT32),
        ("operand.location.length", loc(2, "length"), BAD_UINT32),
        ("operand.extraParams", op(0, "extra_params"),
         ["x", 5, [1.0], SymmPerChannelQuantParams([0.5, "1"], 0),
          SymmPerChannelQuantParams([0.5, 0.5], 0.0), SymmPerChannelQuantParams(None, 0)]),
        ("operand", lambda m, v: m.main.operands.__setitem__(0, v), [None, "x", 5]),
        ("operation.type", operation("type"), BAD_UINT32),
        ("operation.inputs", operation("inputs"), [None, "012", 5]),
        ("operation.inputs[1]", operation("inputs", 1), BAD_UINT32),
        ("operation.outputs", operation("outputs"), [None, "3", 3]),
        ("operation.outputs[0]", operation("outputs", 0), BAD_UINT32),
        ("operation", lambda m, v: m.main.operations.__setitem__(0, v), [None, "x"]),
        ("subgraph.operands", subgraph("operands"), [None, "x", 5]),
        ("subgraph.operations", subgraph("operations"), [None, "x", 5]),
        ("subgraph.inputIndexes", subgraph("input_indexes"), [None, "01", 5]),
        ("subgraph.inputIndexes[1]", subgraph("input_indexes", 1), BAD_UINT32),
        ("subgraph.outputIndexes", subgraph("output_indexes"), [None, "3", 3]),
        ("subgraph.outputIndexes[0]", subgraph("output_indexes", 0), BAD_UINT32),
        ("model.main", lambda m, v: setattr(m, "main", v), [None, "x", Model]),
        ("model.referenced", lambda m, v: setattr(m, "referenced", v),
         [None, "x", [None], ["x"]]),
        ("model.operandValues", lambda m, v: setattr(m, "operand_values", v),
         [None, "abcd", [0, 0, 0, 0]]),
        ("model.pools", lambda m, v: setattr(m, "pools", v),
         [None, "x", [None], [b"x" * 16], [5]]),
        ("model.relaxComputationFloat32toFloat16",
         lambda m, v: setattr(m, "relax_computation_float32_to_float16", v), BAD_BOOL),
        ("model.extensionNameToPrefix",
         lambda m, v: setattr(m, "extension_name_to_prefix", v),
         [None, "x", [("com.example", 1)], [ExtensionNameAndPrefix(5, 1)],
          [ExtensionNameAndPrefix("com.example", 1.5)],
          [ExtensionNameAndPrefix("com.example", 2**16)],
          [ExtensionNameAndPrefix("com.example", True)]]),
    ]


MODEL_CASES = [(name, fn, v) for name, fn, values in _model_corruptions() for v in values]


def _quant_model():
    return add_model(DIMS, quant=True)  # scale 0.5, zeroPoint 10 on the inputs


@pytest.mark.parametrize("name,fn,value", MODEL_CASES,
                         ids=[f"{n}={_ids([v])[0]}" for n, _f, v in MODEL_CASES])
def test_model_fields(dev, name, fn, value):
    model = _quant_model()
    fn(model, value)
    if name != "model.pools" or not isinstance(value, list):
        with pytest.raises(checks.InvalidArgument):
            checks.check_model_fields(model)
    # (A pool's kind is checked where the driver maps it: checks.py knows no memory class.)
    assert dev.get_supported_operations(model) == (INVALID, [])
    cb = PreparedModelCallback()
    assert dev.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM,
                             None, [], [], b"", cb) == INVALID
    assert cb.calls == 1 and cb.status == INVALID and cb.prepared_model is None


def test_valid_models_pass_the_field_checks(dev):
    for model in (_quant_model(), add_model(DIMS), two_output_model()):
        checks.check_model_fields(model)
        assert dev.get_supported_operations(model)[0] == E.NONE
    model = _quant_model()
    model.main.operands[0].dimensions = [np.uint32(2), np.int64(2)]  # numpy ints are fine
    model.main.operands[0].scale = 1  # an int scale is a float
    assert dev.get_supported_operations(model)[0] == E.NONE


def test_model_field_messages_name_the_field():
    model = _quant_model()
    model.main.operands[0].zero_point = 10.5
    with pytest.raises(checks.InvalidArgument, match=r"main operand 0: zeroPoint must be an "
                                                     r"int32, got 10.5"):
        checks.check_model_fields(model)
    model = _quant_model()
    model.main.operands[1].scale = "0.5"
    with pytest.raises(checks.InvalidArgument, match="main operand 1: scale must be a finite"):
        checks.check_model_fields(model)


def test_per_channel_quant_fields():
    b = ModelBuilder()
    x = b.input(T.TENSOR_QUANT8_ASYMM, [1, 3, 3, 2], 0.5, 0)
    w = b.constant(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, np.ones((2, 1, 1, 2), np.int8),
                   channel_quant=SymmPerChannelQuantParams([0.5, 0.25], 0))
    bias = b.constant(T.TENSOR_INT32, np.zeros(2, np.int32))
    pads = [b.scalar(T.INT32, 0) for _ in range(6)]
    out = b.output(T.TENSOR_QUANT8_ASYMM, [1, 3, 3, 2], 1.0, 0)
    b.operation(OperationType.CONV_2D, [x, w, bias, *pads], [out])
    model = b.build()
    checks.check_model_fields(model)
    for scales, dim in (([0.5, "1"], 0), ([0.5, math.nan], 0), ([0.5, True], 0),
                        ((0.5, 1e39), 0), ([0.5, 0.25], 0.0), ([0.5, 0.25], -1),
                        ([0.5, 0.25], 2**32), (None, 0)):
        m = copy.deepcopy(model, {id(p): p for p in model.pools})
        m.main.operands[1].extra_params = SymmPerChannelQuantParams(scales, dim)
        with pytest.raises(checks.InvalidArgument, match="channelQuant"):
            checks.check_model_fields(m)


def test_referenced_subgraphs_are_walked_without_recursion():
    model = add_model(DIMS)
    sg = model.main
    model.referenced = [Subgraph(list(sg.operands), list(sg.operations),
                                 list(sg.input_indexes), list(sg.output_indexes))
                        for _ in range(5000)]
    checks.check_model_fields(model)
    model.referenced[4321].operands[0] = copy.copy(sg.operands[0])
    model.referenced[4321].operands[0].dimensions = [2, 2.5]
    with pytest.raises(checks.InvalidArgument, match=r"subgraph 4321 operand 0: dimensions\[1\]"):
        checks.check_model_fields(model)


def _no_input_model() -> Model:
    b = ModelBuilder()
    c1 = b.constant(T.TENSOR_FLOAT32, np.ones(4, np.float32))
    c2 = b.constant(T.TENSOR_FLOAT32, np.ones(4, np.float32))
    act = b.scalar(T.INT32, 0)
    out = b.output(T.TENSOR_FLOAT32, [4])
    b.operation(OperationType.ADD, [c1, c2, act], [out])
    return b.build()


def _no_output_model() -> Model:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [4])
    act = b.scalar(T.INT32, 0)
    t = b.operand(T.TENSOR_FLOAT32, [4])
    b.operation(OperationType.ADD, [x, x, act], [t])
    return b.build()


@pytest.mark.parametrize("make", [_no_input_model, _no_output_model])
def test_model_without_inputs_or_outputs(dev, make):
    model = make()
    assert dev.get_supported_operations(model) == (INVALID, [])
    cb = PreparedModelCallback()
    assert dev.prepare_model(model, callback=cb) == INVALID
    assert cb.calls == 1 and cb.status == INVALID


PREPARE_ARGS = ([("preference", v) for v in BAD_ENUM3] + [("priority", v) for v in BAD_ENUM3] +
                [("deadline", v) for v in BAD_TIME])


@pytest.mark.parametrize("field,value", PREPARE_ARGS,
                         ids=[f"{f}={_ids([v])[0]}" for f, v in PREPARE_ARGS])
def test_prepare_model_arguments(dev, field, value):
    kw = {"preference": ExecutionPreference.FAST_SINGLE_ANSWER, "priority": Priority.MEDIUM,
          "deadline": None, field: value}
    cb = PreparedModelCallback()
    status = dev.prepare_model(_quant_model(), kw["preference"], kw["priority"],
                               kw["deadline"], [], [], b"", cb)
    assert status == INVALID
    assert cb.calls == 1 and cb.status == INVALID


def test_prepare_model_callback_kinds(dev):
    for cb in (None, "callback", 5, object()):
        assert dev.prepare_model(_quant_model(), 1, 1, None, [], [], b"", cb) == INVALID


# ---- caching arguments ---------------------------------------------------------------------

TOKEN = bytes(range(32))


@pytest.fixture
def cache_files(tmp_path):
    files = [open(tmp_path / name, "w+b") for name in ("model", "data")]  # noqa: SIM115
    yield files
    for f in files:
        f.close()


def _closed_fd():
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    return r


BAD_HANDLES = [2**31, 2**32, 2**63, 2**64, -1, 1.5, "3", None, True, b"3", [3, 4], []]


@pytest.mark.parametrize("which", ["model", "data"])
@bad(BAD_HANDLES + ["closed"])
def test_prepare_model_bad_cache_handle_prepares_without_saving(dev, cache_files, which,
                                                                value):
    """As upstream: unusable cache handles mean "prepare, do not save", never a failure."""
    if value == "closed":
        value = _closed_fd()
    mc, dc = [cache_files[0]], [cache_files[1]]
    if which == "model":
        mc = [value]
    else:
        dc = [value]
    cb = PreparedModelCallback()
    status = dev.prepare_model(_quant_model(), 1, 1, None, mc, dc, TOKEN, cb)
    assert status == E.NONE
    assert cb.wait(WAIT_S)[0] == E.NONE and cb.calls == 1
    assert all(os.fstat(f.fileno()).st_size == 0 for f in cache_files)  # nothing saved


@pytest.mark.parametrize("which", ["model", "data"])
@bad([None, "x", 5, [None, None], [[3, 4]]])
def test_prepare_model_bad_cache_vectors_prepare_without_saving(dev, cache_files, which,
                                                                 value):
    mc, dc = [cache_files[0]], [cache_files[1]]
    if which == "model":
        mc = value
    else:
        dc = value
    cb = PreparedModelCallback()
    assert dev.prepare_model(_quant_model(), 1, 1, None, mc, dc, TOKEN, cb) == E.NONE
    assert cb.wait(WAIT_S)[0] == E.NONE and cb.calls == 1
    assert all(os.fstat(f.fileno()).st_size == 0 for f in cache_files)


@bad([b"", bytes(31), bytes(33), "x" * 32, 32, None, 1.5, [0] * 31, [256] * 32, [0.0] * 32,
      np.zeros(32, np.int64)])
def test_bad_token(dev, cache_files, value):
    """prepareModel with cache files: prepared, not saved; prepareModelFromCache: refused."""
    with pytest.raises(checks.InvalidArgument):
        checks.check_token(value)
    mc, dc = [cache_files[0]], [cache_files[1]]
    cb = PreparedModelCallback()
    assert dev.prepare_model(_quant_model(), 1, 1, None, mc, dc, value, cb) == E.NONE
    assert cb.wait(WAIT_S)[0] == E.NONE and cb.calls == 1
    assert all(os.fstat(f.fileno()).st_size == 0 for f in cache_files)
    cb = PreparedModelCallback()
    assert dev.prepare_model_from_cache(None, mc, dc, value, cb) == INVALID
    assert cb.calls == 1 and cb.status == INVALID


def test_token_forms():
    for good in (TOKEN, bytearray(TOKEN), memoryview(TOKEN), list(TOKEN), tuple(TOKEN),
                 np.frombuffer(TOKEN, np.uint8)):
        assert checks.check_token(good) == TOKEN


@pytest.fixture
def saved(dev, cache_files):
    mc, dc = [cache_files[0]], [cache_files[1]]
    cb = PreparedModelCallback()
    assert dev.prepare_model(_quant_model(), 1, 1, None, mc, dc, TOKEN, cb) == E.NONE
    assert cb.wait(WAIT_S)[0] == E.NONE
    assert os.fstat(mc[0].fileno()).st_size > 0
    return mc, dc


def _restore(dev, deadline, mc, dc, token=TOKEN):
    cb = PreparedModelCallback()
    launch = dev.prepare_model_from_cache(deadline, mc, dc, token, cb)
    status = cb.wait(WAIT_S)[0]
    time.sleep(0.001)
    assert cb.calls == 1
    if launch != E.NONE:
        assert status == launch
    return status


def test_restore_control(dev, saved):
    assert _restore(dev, None, *saved) == E.NONE
    assert _restore(dev, time.monotonic_ns() + 10**10, *saved) == E.NONE


@bad(BAD_TIME)
def test_restore_deadline(dev, saved, value):
    assert _restore(dev, value, *saved) == INVALID


@pytest.mark.parametrize("which", ["model", "data"])
@bad(BAD_HANDLES + ["closed"])
def test_restore_bad_handles(dev, saved, which, value):
    """Out-of-range, negative or wrongly typed handles and wrong counts: INVALID_ARGUMENT; a
    closed descriptor (a number in range that names nothing): GENERAL_FAILURE, as the cache
    module answers any file it cannot read."""
    closed = value == "closed"
    if closed:
        value = _closed_fd()
    mc, dc = saved
    mc, dc = ([value], dc) if which == "model" else (mc, [value])
    assert _restore(dev, None, mc, dc) == (E.GENERAL_FAILURE if closed else INVALID)


# ---- the checks themselves -----------------------------------------------------------------

def test_request_messages_name_the_field(req):
    request = req.copy()
    _set_location(request, "inputs", 1, "offset", 1.5)
    with pytest.raises(checks.InvalidArgument,
                       match=r"^request input 1: location\.offset must be a uint32, got 1\.5$"):
        checks.check_request_fields(request)
    request = req.copy()
    request.outputs[0].dimensions = [2, True]
    with pytest.raises(checks.InvalidArgument,
                       match=r"^request output 0: dimensions\[1\] must be a uint32, got True$"):
        checks.check_request_fields(request)
    with pytest.raises(checks.InvalidArgument, match="^deadline must be None or a uint64"):
        checks.check_execution_args(req.request, MeasureTiming.NO, "soon", None)
    with pytest.raises(checks.InvalidArgument, match="^measure must be a MeasureTiming"):
        checks.check_execution_args(req.request, True, None, None)


def test_huge_values_are_shown_short(req):
    request = req.copy()
    request.inputs[0].dimensions = [10**1000]
    with pytest.raises(checks.InvalidArgument) as info:
        checks.check_request_fields(request)
    assert len(str(info.value)) < 120


def test_slow_path_accepts_what_the_fast_path_does_not_know(req):
    """IntEnum members, tuples and numpy dimensions are valid: the full check accepts them."""
    request = req.copy()
    request.inputs = tuple(request.inputs)
    request.inputs[0].dimensions = (np.int32(2), 2)
    request.pools[1] = MemoryPool.of(req.out)
    checks.check_execution_args(request, 1, 2**64 - 1, 0)
    checks.check_execution_args(request, MeasureTiming.YES, OperandLifeTime.SUBGRAPH, None)


# ---- the fast path never accepts what the full check refuses --------------------------------

_ANY = st.one_of(st.integers(-(2**65), 2**65), st.sampled_from([0, 1, 2**32 - 1, 2**32, -1]),
                 st.floats(allow_nan=True), st.booleans(), st.none(), st.text(max_size=3),
                 st.just(np.int64(3)), st.just(MeasureTiming.YES))
_INTISH = st.one_of(st.integers(0, 2**32 - 1), _ANY)


@st.composite
def _requests(draw):
    def arg():
        loc = DataLocation(draw(_INTISH), draw(_INTISH), draw(_INTISH))
        dims = draw(st.one_of(st.lists(_INTISH, max_size=3), _ANY))
        return RequestArgument(draw(st.one_of(st.booleans(), _ANY)), loc, dims)

    mem = object()
    pools = draw(st.lists(st.one_of(st.just(mem), st.builds(MemoryPool, st.just(mem)),
                                    st.builds(MemoryPool, st.none(), _INTISH), _ANY),
                          max_size=3))
    return Request([arg() for _ in range(draw(st.integers(0, 3)))],
                   [arg() for _ in range(draw(st.integers(0, 3)))], pools)


@settings(max_examples=400, deadline=None)
@given(request=_requests(), measure=_ANY, deadline=_ANY, loop_timeout=_ANY)
def test_fast_path_agrees_with_the_full_check(request, measure, deadline, loop_timeout):
    def full():
        checks.check_request_fields(request)
        checks.check_measure(measure)
        checks.check_deadline(deadline)
        checks.check_loop_timeout(loop_timeout)

    try:
        full()
        ok = True
    except checks.InvalidArgument:
        ok = False
    if checks._execution_args_ok(request, measure, deadline, loop_timeout):
        assert ok
    try:
        checks.check_execution_args(request, measure, deadline, loop_timeout)
        assert ok
    except checks.InvalidArgument:
        assert not ok
