"""The LiteRT driver over the shared execution paths: every path, dynamic shapes, memory
domains, deadlines, timing, concurrency, and reporting itself unavailable."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest
from helpers import add_model, float_inputs

from nnhal.drivers import registry
from nnhal.drivers.litert import unavailable
from nnhal.errors import NnhalError
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.fence import FenceState, SyncFence
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    NO_TIMING,
    BufferDesc,
    BufferRole,
    DataLocation,
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    MemoryPool,
    OperandType,
    OperationType,
    Priority,
    Request,
    RequestArgument,
)
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3
from nnhal.memory import SharedMemory

pytestmark = pytest.mark.skipif(unavailable() is not None,
                                reason=f"LiteRT driver unavailable: {unavailable()}")

E = ErrorStatus
T = OperandType
DIMS = (4, 8)


@pytest.fixture
def device():
    from nnhal.drivers.litert import LiteRTDevice

    dev = LiteRTDevice(threads=1)
    yield dev
    dev.close()


def prepare(device, model, expect=E.NONE):
    cb = PreparedModelCallback()
    launch = device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER,
                                  Priority.MEDIUM, None, [], [], b"", cb)
    status, pm = cb.wait(30)
    assert status == expect, (launch, status)
    return pm


@pytest.fixture
def pm(device):
    return prepare(device, add_model(DIMS))


@pytest.fixture
def rb():
    a, b = float_inputs(5, DIMS)
    builder = RequestBuilder([a, b], [a.nbytes])
    builder.expected = a + b
    yield builder
    builder.close()


def out(rb, shape=DIMS):
    return rb.output(0, np.float32, shape)


def test_registry_names_litert_and_opens_it():
    assert "litert" in registry.device_names()
    assert registry.available()["litert"] is None
    dev = registry.open_device("litert")
    try:
        assert dev.get_version_string()[1].startswith("nnhal-litert")
        assert dev.name == "nnhal-litert"
    finally:
        dev.close()


def test_unavailable_when_the_import_fails(monkeypatch):
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    why = registry.available()["litert"]
    assert why is not None and "ai-edge-litert" in why
    with pytest.raises(NnhalError, match="not available"):
        registry.open_device("litert")


def test_info_prints_the_reason_whole(monkeypatch, capsys, tmp_path):
    from nnhal.cli import main
    from nnhal.tflite import write_tflite

    path = tmp_path / "add.tflite"
    path.write_bytes(write_tflite(add_model(DIMS)))
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    assert main(["info", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "litert: not available" in out and "nnhal[litert]" in out


def test_synchronous_execution_and_timing(pm, rb):
    status, shapes, timing = pm.execute_synchronously(rb.request, MeasureTiming.YES)
    assert status == E.NONE and shapes[0].dimensions == list(DIMS)
    np.testing.assert_allclose(out(rb), rb.expected, rtol=1e-6)
    assert timing.time_on_device >= 0 and timing.time_in_driver >= timing.time_on_device
    assert timing != NO_TIMING
    assert pm.execute_synchronously(rb.request, MeasureTiming.NO)[2] == NO_TIMING


def test_asynchronous_execution(pm, rb):
    cb = ExecutionCallback()
    assert execute_1_3(pm, rb.request, MeasureTiming.NO, None, None, cb) == E.NONE
    status, shapes, _ = cb.wait(30)
    assert status == E.NONE
    np.testing.assert_allclose(out(rb), rb.expected, rtol=1e-6)


def test_burst_runs_and_revalidates(pm, rb):
    status, burst = pm.configure_execution_burst()
    assert status == E.NONE
    for _ in range(3):
        assert burst.execute(rb.request)[0] == E.NONE
    np.testing.assert_allclose(out(rb), rb.expected, rtol=1e-6)
    bad = Request(inputs=rb.request.inputs[:1], outputs=rb.request.outputs,
                  pools=rb.request.pools)
    assert burst.execute(bad)[0] == E.INVALID_ARGUMENT


def test_reusable_execution_sees_new_inputs(pm, rb):
    status, execution = pm.create_reusable_execution(rb.request)
    assert status == E.NONE
    assert execution.compute()[0] == E.NONE
    np.testing.assert_allclose(out(rb), rb.expected, rtol=1e-6)
    a2 = np.full(DIMS, 2.0, np.float32)
    rb.input_memory.write(0, a2.tobytes())  # input 0 sits at offset 0
    b = rb.input_memory.view(rb.request.inputs[1].location.offset, a2.nbytes).view(np.float32)
    assert execution.compute()[0] == E.NONE
    np.testing.assert_allclose(out(rb), a2 + b.reshape(DIMS), rtol=1e-6)


def test_fenced_execution_waits_for_its_fence(pm, rb):
    gate = SyncFence()
    status, fence, callback = pm.execute_fenced(rb.request, [gate], MeasureTiming.YES)
    assert status == E.NONE
    assert fence.wait(0.05) == FenceState.ACTIVE
    gate.signal()
    assert fence.wait(30) == FenceState.SIGNALED
    assert callback.get_execution_info()[0] == E.NONE
    np.testing.assert_allclose(out(rb), rb.expected, rtol=1e-6)


def test_passed_deadline_is_refused(pm, rb):
    past = time.monotonic_ns() - 1
    assert pm.execute_synchronously(rb.request, MeasureTiming.NO, past)[0] == \
        E.MISSED_DEADLINE_PERSISTENT
    cb = ExecutionCallback()
    assert execute_1_3(pm, rb.request, MeasureTiming.NO, past, None, cb) == E.NONE
    assert cb.wait(30)[0] == E.MISSED_DEADLINE_PERSISTENT
    future = time.monotonic_ns() + 60 * 10**9
    assert pm.execute_synchronously(rb.request, MeasureTiming.NO, future)[0] == E.NONE


def dynamic_add():
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, (0, 0))
    y = b.input(T.TENSOR_FLOAT32, (0, 0))
    act = b.scalar(T.INT32, 0)
    o = b.output(T.TENSOR_FLOAT32, (0, 0))
    b.operation(OperationType.ADD, [x, y, act], [o])
    return b.build()


def test_dynamic_shapes_resize_and_report_insufficient_outputs(device):
    model = dynamic_add()
    pm = prepare(device, model)
    for shape in ((2, 3), (5, 7), (2, 3)):
        a, b = float_inputs(1, shape)
        rb = RequestBuilder([a, b], [a.nbytes], model=model)
        try:
            status, shapes, _ = pm.execute_synchronously(rb.request)
            assert status == E.NONE and shapes[0].dimensions == list(shape)
            np.testing.assert_allclose(rb.output(0, np.float32, shape), a + b, rtol=1e-6)
        finally:
            rb.close()
    a, b = float_inputs(2, (3, 4))
    rb = RequestBuilder([a, b], [8], model=model)
    try:
        status, shapes, _ = pm.execute_synchronously(rb.request)
        assert status == E.OUTPUT_INSUFFICIENT_SIZE
        assert shapes[0].dimensions == [3, 4] and not shapes[0].is_sufficient
    finally:
        rb.close()


def test_memory_domain_buffers_in_and_out(device, pm, rb):
    status, buf, token = device.allocate(BufferDesc([]), [pm], [BufferRole(0, 0, 1.0)],
                                         [BufferRole(0, 0, 1.0)])
    assert status == E.NONE and token > 0
    a, b = float_inputs(7, DIMS)
    mem = SharedMemory.from_bytes(a.tobytes())
    assert buf.copy_from(mem, list(DIMS)) == E.NONE
    # input 0 from the device buffer, input 1 and the output in shared memory
    req = Request(inputs=[RequestArgument(False, DataLocation(2, 0, 0), []),
                          rb.request.inputs[1]],
                  outputs=rb.request.outputs,
                  pools=[*rb.request.pools, MemoryPool(token=token)])
    assert pm.execute_synchronously(req)[0] == E.NONE
    b = rb.input_memory.view(rb.request.inputs[1].location.offset, a.nbytes).view(np.float32)
    np.testing.assert_allclose(out(rb), a + b.reshape(DIMS), rtol=1e-6)
    # the output into the device buffer, read back
    req2 = Request(inputs=rb.request.inputs,
                   outputs=[RequestArgument(False, DataLocation(2, 0, 0), [])],
                   pools=[*rb.request.pools, MemoryPool(token=token)])
    assert pm.execute_synchronously(req2)[0] == E.NONE
    back = SharedMemory.ashmem(a.nbytes)
    assert buf.copy_to(back) == E.NONE
    np.testing.assert_allclose(back.array().view(np.float32).reshape(DIMS), rb.expected,
                               rtol=1e-6)
    mem.close()
    back.close()


def test_allocate_refuses_a_reference_prepared_model(device):
    from nnhal.drivers.reference import ReferenceDevice

    ref = ReferenceDevice()
    try:
        other = prepare(ref, add_model(DIMS))
        status, buf, _ = device.allocate(BufferDesc([]), [other], [BufferRole(0, 0, 1.0)], [])
        assert status == E.INVALID_ARGUMENT and buf is None
    finally:
        ref.close()


def test_concurrent_executions_get_their_own_interpreters(pm):
    n, rounds = 4, 20
    errors: list[str] = []
    start = threading.Barrier(n)
    in_use: set[int] = set()
    lock = threading.Lock()
    engines = pm.engines
    take, give = engines.take, engines.give

    def watched_take():
        e = take()
        with lock:
            if id(e) in in_use:
                errors.append("one interpreter lent twice")
            in_use.add(id(e))
        time.sleep(0.001)  # widen the window in which a shared interpreter would show
        return e

    def watched_give(e):
        with lock:
            in_use.discard(id(e))
        give(e)

    engines.take, engines.give = watched_take, watched_give

    def worker(seed: int) -> None:
        a, b = float_inputs(seed, DIMS)
        rb = RequestBuilder([a, b], [a.nbytes])
        try:
            start.wait()
            for _ in range(rounds):
                if pm.execute_synchronously(rb.request)[0] != E.NONE:
                    errors.append("execution failed")
                elif not np.allclose(rb.output(0, np.float32, DIMS), a + b, rtol=1e-6):
                    errors.append("wrong result")
        finally:
            rb.close()

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert 1 <= engines.created <= n


@pytest.mark.parametrize("bad", ["operand", "operation"])
def test_invalid_models_are_refused_as_the_reference_does(device, bad):
    from nnhal.drivers.reference import ReferenceDevice

    model = add_model(DIMS)
    if bad == "operand":
        model.main.operands[0].dimensions = [4, -1]
    else:
        model.main.operations[0].inputs = [0, 1]  # ADD without its activation
    ref = ReferenceDevice()
    try:
        assert device.get_supported_operations(model) == ref.get_supported_operations(model)
        assert device.get_supported_operations(model)[0] == E.INVALID_ARGUMENT
        prepare(device, model, E.INVALID_ARGUMENT)
        prepare(ref, model, E.INVALID_ARGUMENT)
    finally:
        ref.close()


def test_while_is_refused_since_its_loop_timeout_cannot_be_honoured(device):
    from test_qos import infinite_loop_model

    model = infinite_loop_model()
    assert device.get_supported_operations(model) == (E.NONE, [False])
    prepare(device, model, E.INVALID_ARGUMENT)
    assert device.get_supported_operations(add_model(DIMS)) == (E.NONE, [True])



def test_capabilities_prefer_litert_for_float_tensors(device):
    status, caps = device.get_capabilities()
    assert status == E.NONE
    perf = {p.type: p.info for p in caps.operand_performance}
    assert perf[int(T.TENSOR_FLOAT32)].exec_time < 1.0


def test_session_on_litert():
    from nnhal.session import Session

    model = add_model(DIMS)
    a, b = float_inputs(9, DIMS)
    with Session(model, device="litert") as s:
        got = s.run([a, b])
    res = got[0] if isinstance(got, (list, tuple)) else next(iter(got.values()))
    np.testing.assert_allclose(res, a + b, rtol=1e-6)


def test_an_output_reduced_to_one_element_is_reported_in_the_models_shape(device):
    """TFLite reduces [1] over axis 0 to a rank-0 tensor; the HAL model says [1]."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, (1,))
    axes = b.constant(T.TENSOR_INT32, np.array([0], np.int32))
    keep = b.scalar(T.INT32, 0)
    o = b.output(T.TENSOR_FLOAT32, (1,))
    b.operation(OperationType.MEAN, [x, axes, keep], [o])
    model = b.build()
    pm = prepare(device, model)
    rb = RequestBuilder([np.array([3.5], np.float32)], model=model)
    try:
        for value in (3.5, -2.0):  # the second run is the recognised, bound request
            rb.input_memory.write(0, np.array([value], np.float32).tobytes())
            status, shapes, _ = pm.execute_synchronously(rb.request)
            assert status == E.NONE and shapes[0].dimensions == [1]
            assert rb.output(0).tolist() == [value]
    finally:
        rb.close()


@pytest.mark.parametrize("sealed", [False, True])
def test_a_request_run_again_takes_the_direct_way_and_sees_new_inputs(device, sealed):
    model = add_model(DIMS)
    pm = prepare(device, model)
    a, b = float_inputs(7, DIMS)
    rb = RequestBuilder([a, b], [a.nbytes], sealed=sealed)
    try:
        for k in range(3):
            x, y = a + k, b * k
            rb.input_memory.write(0, x.tobytes())
            rb.input_memory.write(a.nbytes, y.tobytes())
            status, shapes, _ = pm.execute_synchronously(rb.request)
            assert status == E.NONE and shapes[0].dimensions == list(DIMS)
            np.testing.assert_allclose(out(rb), x + y, rtol=1e-6)
        bound = pm._recent.bound
        assert bound.direct
        # Memory sealed against shrinking needs no size check at each run.
        assert (bound.watch == ()) == sealed
        # The result's shapes are the caller's to keep: a change does not leak into the next.
        shapes[0].dimensions.append(99)
        assert pm.execute_synchronously(rb.request)[1][0].dimensions == list(DIMS)
    finally:
        rb.close()
