"""A converter-made 8-bit model read and written again keeps its operators: the HAL forms the
importer gives a requantizing MEAN (a depthwise convolution of ones), a per-channel
FULLY_CONNECTED (RESHAPE, 1x1 CONV_2D, RESHAPE) and an int8 SOFTMAX too finely scaled for the
HAL's integer softmax (DEQUANTIZE, SOFTMAX, QUANTIZE) are written back as those operators
(nnhal/tflite/export_fuse.py), with the file's quantization, and ai-edge-litert gives the
same integers on the re-export as on the file. The chains are left alone where they are not
the operator (an intermediate read elsewhere, a filter that is not 1 / (H * W)).

The models are tiny heads made with TensorFlow's converter here (about a second for all):
conv -> global average pool -> dense -> softmax, with the pool keeping its axes or not and
with logits of ordinary or of tiny scale.
"""

from __future__ import annotations

import os
from collections import Counter

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from runner import Reference, max_error  # noqa: E402

from nnhal.hal.builder import ModelBuilder  # noqa: E402
from nnhal.hal.types import OperandType, OperationType  # noqa: E402
from nnhal.tflite import read_tflite, schema, write_tflite  # noqa: E402
from nnhal.tflite.import_read import read_model  # noqa: E402

litert = pytest.importorskip("ai_edge_litert.interpreter")
T, O = OperandType, OperationType
SHAPE = (1, 6, 6, 4)


def _head(tf, keepdims: bool, tiny: bool) -> bytes:
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    tf.keras.utils.set_random_seed(0)
    x = tf.keras.Input(SHAPE[1:], batch_size=1)
    y = tf.keras.layers.Conv2D(8, 3, activation="relu")(x)
    y = tf.keras.layers.GlobalAveragePooling2D(keepdims=keepdims)(y)
    dense = tf.keras.layers.Dense(5)
    y = dense(y)
    if keepdims:
        y = tf.keras.layers.Reshape((5,))(y)
    model = tf.keras.Model(x, tf.keras.layers.Softmax()(y))
    if tiny:  # logits of scale ~1e-8: the HAL's integer softmax cannot take them
        kernel, bias = dense.get_weights()
        dense.set_weights([kernel * 1e-7, bias * 0])
    fn = tf.function(lambda v: model(v)).get_concrete_function(
        tf.TensorSpec(SHAPE, tf.float32))
    conv = tf.lite.TFLiteConverter.from_concrete_functions(
        [convert_variables_to_constants_v2(fn)])

    def representative():
        rng = np.random.default_rng(0)
        for _ in range(4):
            yield [rng.uniform(-1, 1, SHAPE).astype(np.float32)]

    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = representative
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    return conv.convert()


def _dense_3d(tf, int8: bool) -> bytes:
    """Dense(5, relu) on [1, 4, 6]: a FULLY_CONNECTED with keep_num_dims."""
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    tf.keras.utils.set_random_seed(0)
    x = tf.keras.Input((4, 6), batch_size=1)
    model = tf.keras.Model(x, tf.keras.layers.Dense(5, activation="relu")(x))
    fn = tf.function(lambda v: model(v)).get_concrete_function(
        tf.TensorSpec((1, 4, 6), tf.float32))
    conv = tf.lite.TFLiteConverter.from_concrete_functions(
        [convert_variables_to_constants_v2(fn)])
    if int8:
        def representative():
            rng = np.random.default_rng(0)
            for _ in range(4):
                yield [rng.uniform(-1, 1, (1, 4, 6)).astype(np.float32)]

        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = representative
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
    return conv.convert()


@pytest.mark.parametrize("int8", [False, True], ids=["float32", "int8"])
def test_fully_connected_keeps_num_dims(int8: bool) -> None:
    """The HAL's FULLY_CONNECTED gives [rows, units]; its RESHAPE to the input's leading
    dimensions comes back as keep_num_dims (float32: per-tensor weights; int8: the
    per-channel chain, which keeps them too)."""
    tf = pytest.importorskip("tensorflow")
    data = _dense_3d(tf, int8)
    imported = read_tflite(data)
    hal = Counter(O(op.type).name for op in imported.model.main.operations)
    assert hal["RESHAPE"] >= 1  # what the export has to fold
    again = write_tflite(imported)
    assert _ops(again) == _ops(data) == Counter(FULLY_CONNECTED=1)
    keep = [_tensors(d, "FULLY_CONNECTED")[-1].ShapeAsNumpy().tolist() for d in (data, again)]
    assert keep[0] == keep[1] == [1, 4, 5]
    rng = np.random.default_rng(8)
    xs = [rng.integers(-128, 128, (1, 4, 6)).astype(np.int8) if int8 else
          rng.uniform(-1, 1, (1, 4, 6)).astype(np.float32) for _ in range(4)]
    for w, g in zip(_run(data, xs), _run(again, xs)):
        np.testing.assert_array_equal(g, w)


@pytest.fixture(scope="module")
def heads() -> dict[tuple[bool, bool], bytes]:
    tf = pytest.importorskip("tensorflow")
    return {(keep, tiny): _head(tf, keep, tiny) for keep in (False, True)
            for tiny in (False, True)}


def _ops(data: bytes) -> Counter:
    return Counter(op.name for op in read_model(schema.load(data))[0].ops)


def _run(data: bytes, xs: list[np.ndarray]) -> list[np.ndarray]:
    it = litert.Interpreter(model_content=data)  # the default: XNNPACK
    it.allocate_tensors()
    i, o = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    out = []
    for x in xs:
        it.set_tensor(i, x)
        it.invoke()
        out.append(it.get_tensor(o).copy())
    return out


def _within_one_step_of_the_hal_form(model, data: bytes, xs: list[np.ndarray],
                                     distinct: int) -> None:
    """The written file on ai-edge-litert within one quantization step of the HAL model on
    the reference driver, over inputs whose results take more than ``distinct`` values (so
    that agreement is not that of a constant)."""
    from nnhal.tflite import ImportedModel

    ref = Reference(ImportedModel(model, ["input_0"], ["output_0"]))
    try:
        want = [ref.run([x])[0] for x in xs]
    finally:
        ref.close()
    got = _run(data, xs)
    assert max(max_error(g, w) for g, w in zip(got, want)) <= 1
    assert len(np.unique(np.concatenate(want))) > distinct


def _tensors(data: bytes, op_name: str) -> list:
    """The input and output tensors (tflite.Tensor) of the file's first ``op_name``."""
    import tflite

    m = tflite.Model.GetRootAsModel(data, 0)
    sg = m.Subgraphs(0)
    for k in range(sg.OperatorsLength()):
        op = sg.Operators(k)
        code = m.OperatorCodes(op.OpcodeIndex())
        if schema.builtin_name(max(code.BuiltinCode(), code.DeprecatedBuiltinCode())) == op_name:
            return [sg.Tensors(i) if i >= 0 else None for i in
                    list(op.InputsAsNumpy()) + list(op.OutputsAsNumpy())]
    raise AssertionError(f"no {op_name}")


def _quant(t) -> tuple:
    """Type, shape and quantization (scales, zero points, quantized dimension)."""
    q = t.Quantization()
    quant = () if q is None or q.ScaleLength() == 0 else (
        tuple(np.round(q.ScaleAsNumpy(), 12)), tuple(q.ZeroPointAsNumpy()),
        q.QuantizedDimension())
    return t.Type(), tuple(t.ShapeAsNumpy()), quant


@pytest.mark.parametrize("keep", [False, True], ids=["mean", "mean_keepdims"])
@pytest.mark.parametrize("tiny", [False, True], ids=["logits", "tiny_logits"])
def test_reexport_keeps_operators_quantization_and_results(heads, keep: bool,
                                                            tiny: bool) -> None:
    data = heads[keep, tiny]
    imported = read_tflite(data)
    hal = Counter(O(op.type).name for op in imported.model.main.operations)
    # The importer did rewrite (else this test proves nothing): MEAN requantizes here.
    assert hal["DEPTHWISE_CONV_2D"] == 1 and "MEAN" not in hal
    assert "FULLY_CONNECTED" not in hal and hal["CONV_2D"] == 2
    assert hal["DEQUANTIZE"] == (1 if tiny else 0)
    again = write_tflite(imported)
    assert _ops(again) == _ops(data) == Counter(
        {"CONV_2D": 1, "MEAN": 1, "FULLY_CONNECTED": 1, "SOFTMAX": 1, **(
            {"RESHAPE": 1} if keep else {})})
    for name in ("MEAN", "FULLY_CONNECTED", "SOFTMAX"):
        before, after = _tensors(data, name), _tensors(again, name)
        assert [t is None for t in before] == [t is None for t in after], name
        assert [_quant(t) for t in before if t is not None] == \
            [_quant(t) for t in after if t is not None], name
    weights = _tensors(again, "FULLY_CONNECTED")[1]
    assert len(weights.Quantization().ScaleAsNumpy()) == 5  # per output channel
    rng = np.random.default_rng(3)
    xs = [rng.integers(-128, 128, SHAPE).astype(np.int8) for _ in range(8)]
    want, got = _run(data, xs), _run(again, xs)
    if tiny:  # logits that close are all alike: softmax gives 1/5 each, as the file does
        assert (np.concatenate(want) == round(256 / 5) - 128).all()
    else:
        assert len(np.unique(np.concatenate(want))) > 2  # the outputs vary
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    ref = Reference(imported)  # the HAL form on the reference: within one step
    try:
        for x, w in zip(xs, want):
            assert max_error(ref.run([x])[0], w) <= 1
    finally:
        ref.close()


def _mean_chain(*, scale_of_ones: float | None = None, also_output: bool = False,
                t: OperandType = T.TENSOR_QUANT8_ASYMM) -> ModelBuilder:
    """x [1, 3, 4, 2] -> DEPTHWISE_CONV_2D of ones (scale 1/12 unless given) -> [1, 1, 1, 2]
    -> RESHAPE [1, 2], quantized unlike x; with ``also_output`` the convolution's result is
    a model output too."""
    zp = 128 if t == T.TENSOR_QUANT8_ASYMM else 0
    b = ModelBuilder()
    x = b.input(t, [1, 3, 4, 2], 0.05, zp + 3)
    ones = np.ones((1, 3, 4, 2), t.dtype) + zp
    f = b.constant(t, ones, None, scale_of_ones or 1 / 12, zp)
    bias = b.constant(T.TENSOR_INT32, np.zeros(2, np.int32), None,
                      0.05 * (scale_of_ones or 1 / 12), 0)
    pooled = (b.output if also_output else b.operand)(t, [1, 1, 1, 2], 0.02, zp - 5)
    b.operation(O.DEPTHWISE_CONV_2D, [x, f, bias] + [b.scalar(T.INT32, v) for v in
                                                     (2, 1, 1, 1, 0)], [pooled])
    y = b.output(t, [1, 2], 0.02, zp - 5)
    b.operation(O.RESHAPE, [pooled, b.constant(T.TENSOR_INT32, np.array([1, 2], np.int32))],
                [y])
    return b


@pytest.mark.parametrize("t", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
def test_hal_mean_chain_is_a_mean_within_one_step(t: OperandType) -> None:
    model = _mean_chain(t=t).build()
    data = write_tflite(model)
    assert _ops(data) == Counter({"MEAN": 1})
    rng = np.random.default_rng(4)
    info = np.iinfo(t.dtype)
    xs = [rng.integers(info.min, info.max, (1, 3, 4, 2), endpoint=True).astype(t.dtype)
          for _ in range(64)]
    _within_one_step_of_the_hal_form(model, data, xs, 8)


def _fc_chain(*, image_output: bool = False) -> ModelBuilder:
    """x [2, 6] -> RESHAPE [2, 1, 1, 6] -> 1x1 CONV_2D, per-channel int8 filter [3, 1, 1, 6],
    RELU -> [2, 1, 1, 3] -> RESHAPE [2, 3]; with ``image_output`` the reshaped input is a
    model output too."""
    from nnhal.hal.types import SymmPerChannelQuantParams

    t = T.TENSOR_QUANT8_ASYMM_SIGNED
    rng = np.random.default_rng(5)
    b = ModelBuilder()
    x = b.input(t, [2, 6], 0.05, -3)
    image = (b.output if image_output else b.operand)(t, [2, 1, 1, 6], 0.05, -3)
    b.operation(O.RESHAPE, [x, b.constant(T.TENSOR_INT32, np.array([2, 1, 1, 6], np.int32))],
                [image])
    scales = [0.01, 0.02, 0.015]
    w = b.constant(T.TENSOR_QUANT8_SYMM_PER_CHANNEL,
                   rng.integers(-127, 128, (3, 1, 1, 6)).astype(np.int8), None, 0.0, 0,
                   SymmPerChannelQuantParams(scales, 0))
    bias = b.constant(T.TENSOR_INT32, rng.integers(-300, 300, 3).astype(np.int32))
    conv = b.operand(t, [2, 1, 1, 3], 0.04, 7)
    b.operation(O.CONV_2D, [image, w, bias] + [b.scalar(T.INT32, v) for v in (2, 1, 1, 1)],
                [conv])
    y = b.output(t, [2, 3], 0.04, 7)
    b.operation(O.RESHAPE, [conv, b.constant(T.TENSOR_INT32, np.array([2, 3], np.int32))],
                [y])
    return b


def test_hal_per_channel_fc_chain_is_a_fully_connected_within_one_step() -> None:
    model = _fc_chain().build()
    data = write_tflite(model)
    assert _ops(data) == Counter({"FULLY_CONNECTED": 1})
    weights = _tensors(data, "FULLY_CONNECTED")[1]
    assert tuple(weights.ShapeAsNumpy()) == (3, 6)
    assert weights.Quantization().QuantizedDimension() == 0
    assert len(weights.Quantization().ScaleAsNumpy()) == 3
    rng = np.random.default_rng(6)
    xs = [rng.integers(-128, 128, (2, 6)).astype(np.int8) for _ in range(32)]
    _within_one_step_of_the_hal_form(model, data, xs, 8)


@pytest.mark.parametrize("t", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
def test_hal_float_softmax_chain_is_an_8bit_softmax_within_one_step(t: OperandType) -> None:
    zero = -128 if t == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
    b = ModelBuilder()
    x = b.input(t, [3, 7], 0.08, zero + 100)
    real, prob = (b.operand(T.TENSOR_FLOAT32, [3, 7]) for _ in range(2))
    b.operation(O.DEQUANTIZE, [x], [real])
    b.operation(O.SOFTMAX, [real, b.scalar(T.FLOAT32, 0.7)], [prob])
    y = b.output(t, [3, 7], 1 / 256, zero)
    b.operation(O.QUANTIZE, [prob], [y])
    model = b.build()
    data = write_tflite(model)
    assert _ops(data) == Counter({"SOFTMAX": 1})
    rng = np.random.default_rng(7)
    info = np.iinfo(t.dtype)
    xs = [rng.integers(info.min, info.max, (3, 7), endpoint=True).astype(t.dtype)
          for _ in range(32)]
    _within_one_step_of_the_hal_form(model, data, xs, 16)


def test_chains_that_are_not_the_operator_stay() -> None:
    # The pooled result is read again (a model output): MEAN keeps the axes, RESHAPE stays.
    assert _ops(write_tflite(_mean_chain(also_output=True).build())) == Counter(
        {"MEAN": 1, "RESHAPE": 1})
    # Ones at a scale other than 1 / (H * W): a scaled sum, not a mean.
    assert _ops(write_tflite(_mean_chain(scale_of_ones=1 / 6).build())) == Counter(
        {"DEPTHWISE_CONV_2D": 1, "RESHAPE": 1})
    # The 1x1 image is read again: the convolution stays one.
    assert _ops(write_tflite(_fc_chain(image_output=True).build())) == Counter(
        {"CONV_2D": 1, "RESHAPE": 2})


def test_a_chain_whose_operator_is_refused_is_written_operation_by_operation(
        monkeypatch) -> None:
    """A fused operator that breaks a kernel rule leaves nothing behind: the chain's own
    operations are written instead, and the file runs."""
    import dataclasses

    from nnhal.tflite import export_fuse
    from nnhal.tflite.export_context import Unexportable

    real = export_fuse._Finder.mean

    def refused(self, k):
        fusion = real(self, k)

        def convert(cx):
            cx.emit(0, [cx.t(0)], [cx.o()])  # written, then taken back
            raise Unexportable("a kernel rule")
        return None if fusion is None else dataclasses.replace(fusion, convert=convert)

    monkeypatch.setattr(export_fuse._Finder, "mean", refused)
    data = write_tflite(_mean_chain().build())
    assert _ops(data) == Counter({"DEPTHWISE_CONV_2D": 1, "RESHAPE": 1})
    x = np.zeros((1, 3, 4, 2), np.uint8)
    assert _run(data, [x])[0].shape == (1, 2)
