"""The work bound: each operation estimates its work at prepare (``OperationDef.work``), the
analysis sums it, and a model beyond the device's ``max_work`` is refused at prepare with
RESOURCE_EXHAUSTED_PERSISTENT and one line naming the operation, instead of computing for
minutes (a PAD of a million elements feeding a MAX_POOL_2D 65,536 wide was the case found)."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from nnhal.analysis import MAX_WORK, analyse
from nnhal.conformance import default_specs_dir, iter_cases
from nnhal.conformance.cases import build_model
from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import ErrorStatus, Model, OperandType, OperationType
from nnhal.session.explain import explain_rejection

E = ErrorStatus
T = OperandType
O = OperationType


def prepare(device, model):
    cb = PreparedModelCallback()
    launch = device.prepare_model(model, callback=cb)
    status, pm = cb.wait(30)
    return launch, status, pm


def assert_refused_at_once(device, model) -> None:
    """Refused at prepare for its work (launch and callback), within a second: nothing ran."""
    t0 = time.perf_counter()
    launch, status, pm = prepare(device, model)
    took = time.perf_counter() - t0
    assert launch == status == E.RESOURCE_EXHAUSTED_PERSISTENT and pm is None
    assert took < 1.0, f"refused, but after {took:.2f} s"


def pad_pool_model(pad: int, window: int, op: OperationType = O.MAX_POOL_2D,
                   rows: int = 1) -> Model:
    """[1, rows, 16, 1] padded by ``pad`` columns, then pooled ``window`` wide (stride 1)."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, rows, 16, 1])
    p = b.constant(T.TENSOR_INT32, np.array([[0, 0], [0, 0], [0, pad], [0, 0]], np.int32))
    padded = b.operand(T.TENSOR_FLOAT32, [1, rows, 16 + pad, 1])
    b.operation(O.PAD, [x, p], [padded])
    y = b.output(T.TENSOR_FLOAT32, [1, rows, 16 + pad - window + 1, 1])
    params = [b.scalar(T.INT32, v) for v in (0, 0, 0, 0, 1, 1, window, 1, 0)]
    b.operation(op, [padded, *params], [y])
    return b.build()


def fc_model(batch: int, size: int, units: int, chain: int = 1) -> Model:
    """``chain`` FULLY_CONNECTED layers [batch, size] x [units, size] (units == size when
    chained), each one batch * size * units multiply-adds."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [batch, size])
    act = b.scalar(T.INT32, 0)
    for k in range(chain):
        w = b.constant(T.TENSOR_FLOAT32, np.zeros((units, size), np.float32))
        bias = b.constant(T.TENSOR_FLOAT32, np.zeros(units, np.float32))
        last = k == chain - 1
        y = (b.output if last else b.operand)(T.TENSOR_FLOAT32, [batch, units])
        b.operation(O.FULLY_CONNECTED, [x, w, bias, act], [y])
        x = y
    return b.build()


@pytest.fixture(scope="module")
def device():
    d = ReferenceDevice()
    yield d
    d.close()


@pytest.mark.parametrize("op", [O.MAX_POOL_2D, O.AVERAGE_POOL_2D, O.L2_POOL_2D])
def test_the_pad_and_pool_class_is_refused_at_prepare_quickly(device, op):
    model = pad_pool_model(1_000_000, 200_000, op)  # 1.6e11 window visits
    assert_refused_at_once(device, model)
    # getSupportedOperations follows too_large's precedent: the operation beyond the bound
    # on its own is not claimed (the PAD is).
    assert device.get_supported_operations(model) == (E.NONE, [True, False])
    graph = analyse(model, own_constants=False)
    why = graph.too_much_work
    assert why is not None and "\n" not in why
    assert f"main operation 1 ({op.name})" in why and "NNHAL_MAX_WORK" in why
    assert graph.main.work[1] > 800_000 * 200_000
    assert device.refusals(model)[1] == why  # nnhal info --plan says why
    assert explain_rejection(model, device, E.RESOURCE_EXHAUSTED_PERSISTENT) == \
        f"too much work: {why}"


def test_a_sum_beyond_the_bound_is_refused_though_each_operation_fits():
    # Three layers of 1000 x 1000 x 1000 = 1e9 multiply-adds each, under a bound of 2.5e9.
    model = fc_model(1000, 1000, 1000, chain=3)
    dev = ReferenceDevice(max_work=2_500_000_000)
    try:
        assert dev.get_supported_operations(model) == (E.NONE, [True, True, True])
        launch, status, _ = prepare(dev, model)
        assert launch == status == E.RESOURCE_EXHAUSTED_PERSISTENT
        why = analyse(model, own_constants=False, max_work=dev.max_work).too_much_work
        assert why is not None and why.startswith("one execution needs about 3")
        assert "(the heaviest: main operation" in why and "FULLY_CONNECTED" in why
    finally:
        dev.close()


def test_a_normal_model_is_accepted_and_runs(device):
    model = pad_pool_model(100, 8)
    launch, status, pm = prepare(device, model)
    assert launch == status == E.NONE
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 16, 1)
    req = RequestBuilder([x], [4 * 109])
    status, _, _ = pm.execute_synchronously(req.request)
    assert status == E.NONE
    y = req.output(0, np.float32, (109,))
    padded = np.concatenate([x.reshape(-1), np.zeros(100, np.float32)])
    want = np.lib.stride_tricks.sliding_window_view(padded, 8).max(axis=1)
    np.testing.assert_array_equal(y, want)


def test_nnhal_info_gives_the_estimate():
    from nnhal.tools.info import model_info

    model = fc_model(10, 100, 100)
    assert model_info(model, devices={})["work"] == analyse(model, own_constants=False).work


def test_the_bound_is_configurable(monkeypatch):
    model = fc_model(10, 100, 100)  # 1e5 multiply-adds and some element visits
    work = analyse(model, own_constants=False).work
    assert 100_000 < work < 200_000
    tight = ReferenceDevice(max_work=100_000)
    loose = ReferenceDevice(max_work=work)
    try:
        assert prepare(tight, model)[1] == E.RESOURCE_EXHAUSTED_PERSISTENT
        assert prepare(loose, model)[1] == E.NONE
    finally:
        tight.close()
        loose.close()
    monkeypatch.setenv("NNHAL_MAX_WORK", "1e5")
    env = ReferenceDevice()
    try:
        assert env.max_work == 100_000
        assert prepare(env, model)[1] == E.RESOURCE_EXHAUSTED_PERSISTENT
    finally:
        env.close()
    monkeypatch.setenv("NNHAL_MAX_WORK", "lots")  # unreadable: the default, said once
    assert ReferenceDevice().max_work == MAX_WORK
    assert ReferenceDevice(max_work=1e12).max_work == 10**12
    for bad in (0, -1, 0.5, "1e9", True, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="max_work must be a positive number"):
            ReferenceDevice(max_work=bad)


def _conv(b, x, filt_shape, out_shape, depthwise: bool = False):
    w = b.constant(T.TENSOR_FLOAT32, np.zeros(filt_shape, np.float32))
    bias = b.constant(T.TENSOR_FLOAT32, np.zeros(out_shape[-1], np.float32))
    params = [b.scalar(T.INT32, v) for v in ((1, 1, 1) if not depthwise else (1, 1, 1, 1))]
    y = b.operand(T.TENSOR_FLOAT32, out_shape)
    b.operation(O.DEPTHWISE_CONV_2D if depthwise else O.CONV_2D,
                [x, w, bias, *params, b.scalar(T.INT32, 0)], [y])
    return y


def test_estimates_count_what_the_kernels_multiply():
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, 8, 8, 3])
    c = _conv(b, x, (16, 3, 3, 3), (1, 8, 8, 16))  # SAME, stride 1: 64 * 16 * 27
    d = _conv(b, c, (1, 5, 5, 16), (1, 8, 8, 16), depthwise=True)  # 64 * 16 * 25
    lhs = b.operand(T.TENSOR_FLOAT32, [1, 64, 16])
    b.operation(O.RESHAPE, [d, b.constant(T.TENSOR_INT32, np.array([1, 64, 16], np.int32))],
                [lhs])
    rhs = b.constant(T.TENSOR_FLOAT32, np.zeros((1, 16, 32), np.float32))
    mm = b.operand(T.TENSOR_FLOAT32, [1, 64, 32])  # 64 * 32 * 16
    b.operation(O.BATCH_MATMUL, [lhs, rhs], [mm])
    out = b.output(T.TENSOR_FLOAT32, [1, 64, 32])
    b.operation(O.LOCAL_RESPONSE_NORMALIZATION,  # radius 100 over 32 channels: 32 each
                [mm, b.scalar(T.INT32, 100), *(b.scalar(T.FLOAT32, v) for v in (1, 1, .5))],
                [out])
    work = analyse(b.build(), own_constants=False).main.work
    assert 64 * 16 * 27 < work[0] < 64 * 16 * 27 + 5_000  # and each element visited once
    assert 64 * 16 * 25 < work[1] < 64 * 16 * 25 + 5_000
    assert 64 * 32 * 16 < work[3] < 64 * 32 * 16 + 5_000
    assert 2048 * 32 < work[4] < 2048 * 32 + 5_000


SPECS = default_specs_dir()


@pytest.mark.skipif(not SPECS.exists(), reason=f"conformance data not found at {SPECS}")
def test_every_conformance_model_is_estimated_far_under_the_bound(caplog):
    """Every operation's formula runs on the shapes the upstream cases give (a failing one
    would fall back on the default and log it) and no case comes near the default bound."""
    caplog.set_level(logging.DEBUG, logger="nnhal.analysis")
    heaviest, n = 0, 0
    for case in iter_cases(SPECS):
        if case.error or case.data.get("expectFailure"):
            continue
        try:
            graph = analyse(build_model(case.data["model"]), own_constants=False)
        except Exception:  # noqa: BLE001 - invalid on purpose: not this test's business
            continue
        n += 1
        heaviest = max(heaviest, graph.work)
        assert graph.too_much_work is None, case.name
    assert n > 1000
    assert heaviest * 100 < MAX_WORK
    failed = [r.getMessage() for r in caplog.records if "work estimate failed" in r.getMessage()]
    assert failed == []


def test_the_kept_graph_is_keyed_by_the_bound(device):
    # A model analysed with one bound and prepared on a device with another is analysed
    # again for that device (the kept graph is keyed by both limits).
    model = fc_model(4, 8, 8)
    graph = analyse(model, keep=True)
    assert analyse(model, keep=True) is graph
    assert analyse(model, max_work=graph.work - 1).too_much_work is not None
    launch, status, pm = prepare(device, model)
    assert status == E.NONE
    req = RequestBuilder([np.ones((4, 8), np.float32)], [4 * 32])
    assert pm.execute_synchronously(req.request)[0] == E.NONE


def test_work_known_only_at_run_time_is_bounded_before_the_kernel_runs():
    """The same class with the PAD's size given at run time: the pool's shapes are unknown
    at prepare, so its step checks its estimate from the run-time shapes."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, 1, 16, 1])
    pads = b.input(T.TENSOR_INT32, [4, 2])
    padded = b.operand(T.TENSOR_FLOAT32, [0, 0, 0, 0])
    b.operation(O.PAD, [x, pads], [padded])
    y = b.output(T.TENSOR_FLOAT32, [0, 0, 0, 0])
    params = [b.scalar(T.INT32, v) for v in (0, 0, 0, 0, 1, 1, 65_536, 1, 0)]
    b.operation(O.MAX_POOL_2D, [padded, *params], [y])
    dev = ReferenceDevice(max_work=10**9)
    try:
        _, status, pm = prepare(dev, b.build())
        assert status == E.NONE

        def run(pad: int) -> ErrorStatus:
            req = RequestBuilder([np.ones((1, 1, 16, 1), np.float32),
                                  np.array([[0, 0], [0, 0], [0, pad], [0, 0]], np.int32)],
                                 [4 * (16 + pad)])
            return pm.execute_synchronously(req.request)[0]

        t0 = time.perf_counter()
        assert run(1_000_000) == E.RESOURCE_EXHAUSTED_TRANSIENT
        assert time.perf_counter() - t0 < 1.0
        assert run(65_536) == E.NONE  # 16 outputs of 65,536 each: under the bound
    finally:
        dev.close()


@pytest.mark.parametrize("driver", ["litert", "xla"])
def test_the_other_drivers_hold_the_same_bound(driver):
    if driver == "litert":
        from nnhal.drivers.litert import LiteRTDevice as Device
    else:
        from nnhal.drivers.xla import XlaDevice as Device
    dev = Device(max_work=10**9)
    try:
        if dev.engine_unavailable is not None:
            pytest.skip(f"{driver}: {dev.engine_unavailable}")
        # (Not a pool: LiteRT leaves one this heavy to the reference before any bound.)
        model = fc_model(2000, 1000, 1000)  # 2e9 multiply-adds
        assert dev.get_supported_operations(model) == (E.NONE, [False])
        assert "main operation 0 (FULLY_CONNECTED) needs about 2.01e+09" in dev.refusals(model)[0]
        assert_refused_at_once(dev, model)
    finally:
        dev.close()


def _estimate(op: OperationType, inputs: list, outputs: list[tuple[int, ...]]) -> int:
    """``op``'s own estimate for these operands (each a (type, value, const) triple)."""
    from nnhal.ops.catalog import lookup
    from nnhal.ops.resolver import OpContext
    from nnhal.ops.testing import output, tensor

    infos = [tensor(t, v, const=c)[0] for t, v, c in inputs]
    ctx = OpContext(op_type=op, inputs=infos,
                    outputs=[output(T.TENSOR_FLOAT32, s) for s in outputs])
    return lookup(op).work(ctx, outputs)


def _zeros(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


def test_estimates_of_scatter_recurrence_and_nms():
    f, i = T.TENSOR_FLOAT32, T.INT32
    # TRANSPOSE_CONV_2D: each of the 4 x 4 x 8 inputs feeds 3 x 3 x 16 outputs.
    work = _estimate(O.TRANSPOSE_CONV_2D, [
        (f, _zeros(1, 4, 4, 8), False), (f, _zeros(16, 3, 3, 8), True), (f, _zeros(16), True),
        (T.TENSOR_INT32, np.array([1, 8, 8, 16], np.int32), True), (i, 1, True), (i, 2, True),
        (i, 2, True), (i, 0, True), (T.BOOL, False, True)], [(1, 8, 8, 16)])
    assert 128 * 144 < work < 128 * 144 + 5_000
    # RNN: each of 2 rows meets the 400 x 300 weights and the 400 x 400 recurrent ones.
    work = _estimate(O.RNN, [
        (f, _zeros(2, 300), False), (f, _zeros(400, 300), True), (f, _zeros(400, 400), True),
        (f, _zeros(400), True), (f, _zeros(2, 400), False), (i, 0, True)], [(2, 400), (2, 400)])
    assert 2 * (400 * 300 + 400 * 400) < work < 2 * (400 * 700 + 400 * 2) + 300_000
    # BOX_WITH_NMS_LIMIT: in each of 3 classes, each box kept (all 1,000 without a limit,
    # else at most max_detections) is compared with the rest, an interpreted step each.
    from nnhal.ops.resolver import INTERPRETED_STEP

    for max_det, rounds in ((-1, 1000), (10, 10)):
        work = _estimate(O.BOX_WITH_NMS_LIMIT, [
            (f, _zeros(1000, 3), False), (f, _zeros(1000, 12), False),
            (T.TENSOR_INT32, np.zeros(1000, np.int32), False), (T.FLOAT32, 0.1, True),
            (i, max_det, True), (i, 0, True), (T.FLOAT32, 0.5, True), (T.FLOAT32, 0.5, True),
            (T.FLOAT32, 0.1, True)], [(0,), (0, 4), (0,), (0,)])
        expected = INTERPRETED_STEP * 3 * 1000 * rounds
        assert expected <= work < expected + 50_000
    # MAX_POOL_2D (implicit padding): 16 outputs, each a 5 x 7 window.
    work = _estimate(O.MAX_POOL_2D, [
        (f, _zeros(1, 4, 4, 1), False), (i, 1, True), (i, 1, True), (i, 1, True),
        (i, 7, True), (i, 5, True), (i, 0, True)], [(1, 4, 4, 1)])
    assert 16 * 35 < work < 16 * 35 + 100


@pytest.mark.parametrize("driver", ["reference", "litert", "xla"])
def test_a_cache_written_under_a_looser_bound_is_not_restored_under_a_tighter_one(tmp_path,
                                                                                  driver):
    """Devices sharing a key file restore each other's caches; the bound is the restoring
    device's (a cached graph is not analysed again: the reference's plan sums the work as it
    binds, LiteRT's model cache carries the estimate)."""
    key = tmp_path / "key"
    model = fc_model(100, 100, 100)  # 1e6 multiply-adds
    if driver in ("litert", "xla"):
        if driver == "litert":
            from nnhal.drivers.litert import LiteRTDevice

            def make(**kw):
                return LiteRTDevice(cache_key_file=key, private_store=False, **kw)
        else:
            from nnhal.drivers.xla import XlaDevice

            def make(**kw):
                return XlaDevice(cache_key_file=key, **kw)
        loose = make()
        if loose.engine_unavailable is not None:
            loose.close()
            pytest.skip(f"{driver}: {loose.engine_unavailable}")
        tight = make(max_work=100_000)
    else:
        loose = ReferenceDevice(cache_key_file=key)
        tight = ReferenceDevice(cache_key_file=key, max_work=100_000)
    token = bytes(range(32))
    try:
        with open(tmp_path / "model", "w+b") as mc, open(tmp_path / "data", "w+b") as dc:
            cb = PreparedModelCallback()
            assert loose.prepare_model(model, 1, 1, None, [mc], [dc], token, cb) == E.NONE
            assert cb.wait(30)[0] == E.NONE

            def restore(dev):
                cb = PreparedModelCallback()
                dev.prepare_model_from_cache(None, [mc], [dc], token, cb)
                return cb.wait(30)

            assert restore(loose)[0] == E.NONE
            status, pm = restore(tight)
            assert status != E.NONE and pm is None
            assert prepare(tight, model)[1] == E.RESOURCE_EXHAUSTED_PERSISTENT
    finally:
        loose.close()
        tight.close()


def test_a_quadratic_nms_is_refused_at_prepare(device):
    """40,000 boxes of one class (and the background) without a detection limit: the
    reference's greedy loop would compare them pairwise for over a minute; 2,000 run."""
    def nms_model(n: int) -> Model:
        b = ModelBuilder()
        scores = b.input(T.TENSOR_FLOAT32, [n, 2])
        rois = b.input(T.TENSOR_FLOAT32, [n, 8])
        batches = b.input(T.TENSOR_INT32, [n])
        params = [b.scalar(T.FLOAT32, 0.0), b.scalar(T.INT32, -1), b.scalar(T.INT32, 0),
                  b.scalar(T.FLOAT32, 0.5), b.scalar(T.FLOAT32, 0.5), b.scalar(T.FLOAT32, 0.0)]
        outs = [b.output(T.TENSOR_FLOAT32, [0]), b.output(T.TENSOR_FLOAT32, [0, 4]),
                b.output(T.TENSOR_INT32, [0]), b.output(T.TENSOR_INT32, [0])]
        b.operation(O.BOX_WITH_NMS_LIMIT, [scores, rois, batches, *params], outs)
        return b.build()

    assert_refused_at_once(device, nms_model(40_000))
    assert prepare(device, nms_model(2_000))[1] == E.NONE


@pytest.mark.parametrize("op", [O.ROI_ALIGN, O.ROI_POOLING])
def test_a_million_regions_are_refused_at_prepare(device, op):
    """The reference loops over regions in Python (tens of microseconds each): a million
    one-pixel regions of a 4 x 4 map would take a minute; a thousand run."""
    def roi_model(n: int) -> Model:
        b = ModelBuilder()
        feat = b.input(T.TENSOR_FLOAT32, [1, 4, 4, 1])
        rois = b.input(T.TENSOR_FLOAT32, [n, 4])
        batches = b.input(T.TENSOR_INT32, [n])
        params = [b.scalar(T.INT32, 1), b.scalar(T.INT32, 1), b.scalar(T.FLOAT32, 1.0),
                  b.scalar(T.FLOAT32, 1.0)]
        if op == O.ROI_ALIGN:
            params += [b.scalar(T.INT32, 1), b.scalar(T.INT32, 1)]
        out = b.output(T.TENSOR_FLOAT32, [n, 1, 1, 1])
        b.operation(op, [feat, rois, batches, *params, b.scalar(T.BOOL, False)], [out])
        return b.build()

    assert_refused_at_once(device, roi_model(1_000_000))
    assert prepare(device, roi_model(1_000))[1] == E.NONE
