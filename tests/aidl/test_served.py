"""AidlDevice over the reference driver: every AIDL method, the error conventions, hostile
arguments."""

import random
import threading

import numpy as np
import pytest

from nnhal import aidl as A
from nnhal.aidl import convert as cv
from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.fence import SyncFence
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O

X = np.arange(4, dtype=np.float32)


class Callback(A.IPreparedModelCallback):
    def __init__(self):
        self.done = threading.Event()
        self.calls = []

    def notify(self, status, prepared_model):
        self.calls.append((status, prepared_model))
        self.done.set()

    def wait(self):
        assert self.done.wait(30)
        return self.calls[0]


def add_model(out_dims=(4,)):
    b = ModelBuilder()
    x, y = b.input(T.TENSOR_FLOAT32, [4]), b.input(T.TENSOR_FLOAT32, [4])
    out = b.output(T.TENSOR_FLOAT32, list(out_dims))
    b.operation(O.ADD, [x, y, b.scalar(T.INT32, 0)], [out])
    return b.build()


@pytest.fixture(scope="module")
def served():
    dev = ReferenceDevice()
    yield A.AidlDevice(dev)
    dev.close()


@pytest.fixture(scope="module")
def prepared(served):
    cb = Callback()
    assert served.prepare_model(cv.model_to_aidl(add_model()), 1, 1, -1, [], [], bytes(32),
                                cb) is None
    status, pm = cb.wait()
    assert status == A.ErrorStatus.NONE and isinstance(pm, A.IPreparedModel)
    return pm


def request(nbytes=16):
    rb = RequestBuilder([X, X], [nbytes])
    return rb, cv.request_to_aidl(rb.request)


def test_device_queries(served):
    assert served.get_interface_version() == 4
    assert isinstance(served.get_capabilities(), A.Capabilities)
    assert served.get_type() == A.DeviceType.CPU
    assert isinstance(served.get_version_string(), str)
    # the extensions nnhal ships that the reference driver offers (MediaPipe's operators)
    assert [e.name for e in served.get_supported_extensions()] == \
        list(ReferenceDevice.extensions)
    n = served.get_number_of_cache_files_needed()
    assert isinstance(n, A.NumberOfCacheFiles) and n.num_model_cache >= 1
    assert served.get_supported_operations(cv.model_to_aidl(add_model())) == [True]


def test_bad_model_is_service_specific_invalid_argument(served):
    model = cv.model_to_aidl(add_model())
    model.main.operations[0].inputs[0] = 99
    cb = Callback()
    with pytest.raises(A.ServiceSpecificError) as e:
        served.prepare_model(model, 1, 1, -1, [], [], bytes(32), cb)
    assert e.value.status == A.ErrorStatus.INVALID_ARGUMENT
    assert cb.wait() == (A.ErrorStatus.INVALID_ARGUMENT, None)
    with pytest.raises(A.ServiceSpecificError):
        served.get_supported_operations(model)


def test_sync_with_config_and_timing_in_ns(prepared):
    rb, req = request()
    r = prepared.execute_synchronously(req, True, -1, -1)
    assert r.output_sufficient_size and r.output_shapes[0].dimensions == [4]
    assert r.timing.time_in_driver_ns > 0 and r.timing.time_in_driver_ns % 1000 == 0
    np.testing.assert_array_equal(rb.output(0, np.float32, [4]), 2 * X)
    cfg = A.ExecutionConfig(False, -1, (A.TokenValuePair(1 << 16, b"hint"),))
    r = prepared.execute_synchronously_with_config(req, cfg, -1)
    assert r.output_sufficient_size and r.timing == A.NO_TIMING


def test_output_too_small_is_a_result_not_an_error(served):
    cb = Callback()
    served.prepare_model(cv.model_to_aidl(add_model((0,))), 1, 1, -1, [], [], bytes(32), cb)
    _, pm = cb.wait()
    _, req = request(8)
    r = pm.execute_synchronously(req, False, -1, -1)
    assert r.output_sufficient_size is False
    assert r.output_shapes[0].dimensions == [4] and not r.output_shapes[0].is_sufficient


def test_fenced_and_reusable_execution(prepared):
    rb, req = request()
    fence = SyncFence()
    threading.Timer(0.05, fence.signal).start()
    res = prepared.execute_fenced(req, [fence], True, -1, -1, -1)
    assert isinstance(res, A.FencedExecutionResult)
    if res.sync_fence is not None:
        res.sync_fence.wait(30)
    status, launched, fenced = res.callback.get_execution_info()
    assert status == A.ErrorStatus.NONE and isinstance(launched, A.Timing)
    np.testing.assert_array_equal(rb.output(0, np.float32, [4]), 2 * X)
    res = prepared.execute_fenced_with_config(req, [], A.ExecutionConfig(), -1, -1)
    done(res)
    assert res.callback.get_execution_info()[0] == A.ErrorStatus.NONE
    ex = prepared.create_reusable_execution(req, A.ExecutionConfig(True))
    assert ex.execute_synchronously(-1).output_sufficient_size
    res = ex.execute_fenced([], -1, -1)
    done(res)
    assert res.callback.get_execution_info()[0] == A.ErrorStatus.NONE


def done(res: A.FencedExecutionResult) -> None:
    """Wait for a fenced execution's fence: its info is only final once the fence signals."""
    if res.sync_fence is not None:
        assert res.sync_fence.wait(30)


def test_burst_tokens_hold_and_release(prepared):
    burst = prepared.configure_execution_burst()
    rb, req = request()
    tokens = [7, 8][:len(req.pools)]
    for _ in range(2):
        assert burst.execute_synchronously(req, tokens, False, -1, -1).output_sufficient_size
    assert burst.held_tokens == len(tokens)
    assert burst.canonical.cached_count == len(tokens)
    r = burst.execute_synchronously_with_config(req, [-1] * len(tokens), A.ExecutionConfig(),
                                                -1)
    assert r.output_sufficient_size
    for t in tokens:
        burst.release_memory_resource(t)
    assert burst.held_tokens == 0 and burst.canonical.cached_count == 0
    with pytest.raises(A.ServiceSpecificError):
        burst.execute_synchronously(req, [7], False, -1, -1)  # one token for two pools
    with pytest.raises(A.ServiceSpecificError):
        burst.release_memory_resource(-1)


def test_from_cache_and_with_config(served, tmp_path):
    files = [open(tmp_path / f"c{i}", "w+b") for i in range(2)]  # noqa: SIM115
    token = bytes(range(32))
    cfg = A.PrepareModelConfig(model_cache=[files[0]], data_cache=[files[1]], cache_token=token,
                               compilation_hints=[A.TokenValuePair(5, b"")])
    cb = Callback()
    served.prepare_model_with_config(cv.model_to_aidl(add_model()), cfg, cb)
    assert cb.wait()[0] == A.ErrorStatus.NONE
    cb = Callback()
    served.prepare_model_from_cache(-1, [files[0]], [files[1]], token, cb)
    status, pm = cb.wait()
    assert status == A.ErrorStatus.NONE
    assert pm.execute_synchronously(request()[1], False, -1, -1).output_sufficient_size
    for f in files:
        f.close()


def test_allocate_and_ibuffer_copies(served, prepared):
    db = served.allocate(A.BufferDesc([4]), [A.IPreparedModelParcel(prepared)],
                         [A.BufferRole(0, 0, 1.0)], [])
    assert isinstance(db, A.DeviceBuffer) and db.token > 0
    src = A.SharedMemory.from_bytes(X.tobytes())
    db.buffer.copy_from(src, [4])
    dst = A.SharedMemory.ashmem(16)
    db.buffer.copy_to(dst)
    np.testing.assert_array_equal(dst.array().view(np.float32), X)
    with pytest.raises(A.ServiceSpecificError):
        db.buffer.copy_to(A.SharedMemory.ashmem(4))
    with pytest.raises(A.ServiceSpecificError):
        served.allocate(A.BufferDesc([4]), [A.IPreparedModelParcel(object())],
                        [A.BufferRole(0, 0, 1.0)], [])


JUNK = [None, -2, -1, 0, 1, 2**31, 2**63, 1.5, "x", b"x", [], [None], [-3], True, object(),
        A.RequestMemoryPool(), A.Timing(), A.DataLocation(0, -1, 2, 3)]


def _mutate(rng, value):
    """``value`` with one field somewhere replaced by junk."""
    if rng.random() < 0.15 or not hasattr(value, "__dataclass_fields__") and \
            not isinstance(value, list):
        return rng.choice(JUNK)
    if isinstance(value, list):
        if not value:
            return [rng.choice(JUNK)]
        k = rng.randrange(len(value))
        return value[:k] + [_mutate(rng, value[k])] + value[k + 1:]
    from dataclasses import fields, replace
    f = rng.choice(fields(value))
    return replace(value, **{f.name: _mutate(rng, getattr(value, f.name))})


def test_hostile_arguments_are_service_specific_errors(served, prepared):
    """A seeded loop: every call with one argument (or one field inside it) junk gives
    ServiceSpecificError or a result, never another exception."""
    rng = random.Random(26)
    model = cv.model_to_aidl(add_model())
    burst = prepared.configure_execution_burst()
    rb, req = request()
    calls = [
        (served.prepare_model, [model, 1, 1, -1, [], [], bytes(32), Callback()]),
        (served.prepare_model_with_config, [model, A.PrepareModelConfig(), Callback()]),
        (served.get_supported_operations, [model]),
        (served.allocate, [A.BufferDesc([4]), [A.IPreparedModelParcel(prepared)],
                           [A.BufferRole(0, 0, 1.0)], []]),
        (prepared.execute_synchronously, [req, False, -1, -1]),
        (prepared.execute_synchronously_with_config, [req, A.ExecutionConfig(), -1]),
        (prepared.execute_fenced, [req, [], False, -1, -1, -1]),
        (prepared.create_reusable_execution, [req, A.ExecutionConfig()]),
        (burst.execute_synchronously, [req, [1, 2], False, -1, -1]),
        (burst.release_memory_resource, [3]),
    ]
    errors = 0
    for _ in range(3000):
        fn, args = rng.choice(calls)
        args = list(args)
        k = rng.randrange(len(args))
        args[k] = _mutate(rng, args[k])
        if isinstance(args[-1], Callback):
            args[-1] = Callback()
        try:
            fn(*args)
        except A.ServiceSpecificError as e:
            assert e.status not in (A.ErrorStatus.NONE, A.ErrorStatus.DEAD_OBJECT)
            errors += 1
    assert errors > 1000
