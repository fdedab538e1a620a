"""write_tflite: exported models run in ai-edge-litert (the oracle for anything TFLite) and
agree with the upstream conformance cases and with the reference driver; models it cannot
express are refused naming each operation, and invalid ones with the validation message."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nnhal.conformance.cases import Expected, build_model, iter_cases, values_array
from nnhal.conformance.runner import CaseFailure, compare
from nnhal.conformance.specs import default_specs_dir
from nnhal.drivers.reference import ReferenceDevice
from nnhal.errors import InvalidModelError, NnhalError, UnsupportedModelError
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    Model,
    OperandType,
    OperationType,
    Priority,
    SymmPerChannelQuantParams,
)
from nnhal.tflite.exporter import write_tflite
from nnhal.tflite.model import ImportedModel

litert = pytest.importorskip("ai_edge_litert.interpreter")
T, O = OperandType, OperationType

#: Exported cases whose litert result may differ from the case's expectation, and why.
ALLOW_DISAGREE: dict[str, str] = {
    # The divisor is an input: nothing to refuse up front. TFLite fails the invocation on an
    # int32 division by zero, where the HAL defines a result.
    "div_int32_by_zero": "litert fails DIV int32 by zero at invoke; the HAL defines a result",
}
def _run_litert(data: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    it = litert.Interpreter(model_content=data)
    details = it.get_input_details()
    for d, x in zip(details, inputs):
        if tuple(d["shape"]) != x.shape:
            it.resize_tensor_input(d["index"], list(x.shape))
    it.allocate_tensors()
    for d, x in zip(details, inputs):
        it.set_tensor(d["index"], x.astype(d["dtype"]))
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _runnable_cases(specs: Path) -> Iterator[Any]:
    """Every case of the general mode with a result to compare (all of them: about 18 s)."""
    for case in iter_cases(specs):
        if case.broken or case.expect_failure or case.multinomial_tolerance:
            continue
        main = case.data["model"]["main"]
        if any(not main["operands"][i]["data"] for i in main["inputIndexes"]):
            continue  # an omitted request input: TFLite has no omitted inputs
        yield case


def _check_case(case: Any, data: bytes) -> None:
    main = case.data["model"]["main"]
    inputs = []
    for i in main["inputIndexes"]:
        o = main["operands"][i]
        inputs.append(values_array(T[o["type"]], o["data"], o["dimensions"])
                      .reshape(o["dimensions"]))
    try:
        outputs = _run_litert(data, inputs)
    except RuntimeError as e:
        raise CaseFailure(f"litert: {e}") from None
    for k, (actual, i) in enumerate(zip(outputs, main["outputIndexes"])):
        o = main["operands"][i]
        t = T[o["type"]]
        vals = values_array(t, o["data"], o["dimensions"])
        compare(case, k, Expected(t, list(o["dimensions"]), vals.view(np.bool_) if
                                  t == T.TENSOR_BOOL8 else vals, bool(o.get("isIgnored"))),
                actual)


def test_conformance_cases_agree_with_litert() -> None:
    specs = default_specs_dir()
    if not specs.exists():
        pytest.skip(f"no conformance data at {specs}: the exported-case check is skipped")
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures = []
    for case in _runnable_cases(specs):
        try:
            data = write_tflite(build_model(case.data["model"]))
        except UnsupportedModelError as e:
            assert "#" in str(e) or "inputs" in str(e), str(e)
            outcome = "refused"
        else:
            try:
                _check_case(case, data)
                outcome = "agreed"
            except CaseFailure as e:
                outcome = "disagreed"
                if case.name not in ALLOW_DISAGREE:
                    failures.append(f"{case.file} {case.name}: {e}")
        for op in case.operations:
            counts[op][outcome] += 1
    print("\nper operation: agreed / disagreed / refused")
    for op in sorted(counts):
        c = counts[op]
        print(f"  {op}: {c['agreed']} / {c['disagreed']} / {c['refused']}")
    assert not failures, "\n".join(failures[:20])
    # Every operation with a TFLite builtin was exported and agreed at least once.
    never = sorted(op for op, c in counts.items() if not c["agreed"])
    assert set(never) <= NEVER_EXPORTED, never


#: Operations refused in every case (HAL-only; LSTM ones because every conformance case of
#: theirs omits optional inputs at request time, which a TFLite model cannot:
#: test_lstm_state_agrees_with_reference covers LSTM and UNIDIRECTIONAL_SEQUENCE_LSTM).
NEVER_EXPORTED = {
    "AXIS_ALIGNED_BBOX_TRANSFORM", "BIDIRECTIONAL_SEQUENCE_LSTM", "BOX_WITH_NMS_LIMIT",
    "DETECTION_POSTPROCESSING", "GENERATE_PROPOSALS", "HEATMAP_MAX_KEYPOINT", "LSTM",
    "QUANTIZED_16BIT_LSTM", "QUANTIZED_LSTM", "RANDOM_MULTINOMIAL", "ROI_ALIGN", "ROI_POOLING",
    "UNIDIRECTIONAL_SEQUENCE_LSTM",
}


# ---- refusals ------------------------------------------------------------------------------

def test_unsupported_operation_is_named_with_its_index() -> None:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, 4, 4, 2])
    y = b.operand(T.TENSOR_FLOAT32, [1, 4, 4, 2])
    b.operation(O.RELU, [x], [y])
    boxes = b.input(T.TENSOR_FLOAT32, [1, 4])
    scores, points = b.output(T.TENSOR_FLOAT32, [1, 2]), b.output(T.TENSOR_FLOAT32, [1, 2, 2])
    b.operation(O.HEATMAP_MAX_KEYPOINT, [y, boxes, b.scalar(T.BOOL, False)], [scores, points])
    with pytest.raises(UnsupportedModelError) as e:
        write_tflite(b.build())
    assert e.value.items == [
        "#1 HEATMAP_MAX_KEYPOINT: no TFLite builtin equivalent (a HAL-only operation)"]
    assert "RELU" not in str(e.value)


def test_every_refused_operation_is_listed() -> None:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, 4, 4, 1])
    axis = b.input(T.INT32)
    pooled = b.operand(T.TENSOR_FLOAT32, [1, 7, 7, 1])
    # Padding 3 on each side of a 4x4 window: TFLite's pooling has no such padding.
    b.operation(O.L2_POOL_2D, [x] + [b.scalar(T.INT32, v) for v in
                                          (3, 3, 3, 3, 1, 1, 4, 4, 0)], [pooled])
    relu = b.operand(T.TENSOR_FLOAT32, [1, 7, 7, 1])
    b.operation(O.RELU, [pooled], [relu])
    y = b.output(T.TENSOR_INT32, [1, 7, 1])
    b.operation(O.ARGMAX, [relu, axis], [y])
    with pytest.raises(UnsupportedModelError) as e:
        write_tflite(b.build())
    assert [item.split(":")[0] for item in e.value.items] == ["#0 L2_POOL_2D", "#2 ARGMAX"]
    assert "[3, 3, 3, 3]" in str(e.value) and "not a constant" in str(e.value)


def test_non_constant_parameter_is_refused() -> None:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [2, 3])
    axis = b.input(T.INT32)
    y = b.output(T.TENSOR_FLOAT32, [2, 3])
    b.operation(O.SOFTMAX, [x, b.scalar(T.FLOAT32, 1.0), axis], [y])
    with pytest.raises(UnsupportedModelError, match=r"#0 SOFTMAX: input 2 .* not a constant"):
        write_tflite(b.build())


def test_invalid_model_raises_with_the_validation_message() -> None:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [2])
    y = b.output(T.TENSOR_FLOAT32, [2])
    b.operation(O.ADD, [x, x, b.scalar(T.INT32, 9)], [y])  # 9 is no FuseCode
    with pytest.raises(InvalidModelError) as e:
        write_tflite(b.build())
    assert "ADD" in str(e.value) and str(e.value).count("\n") == 0


# ---- hand-built models against the reference driver ---------------------------------------

def _reference(model: Model, inputs: list[np.ndarray], out_dtypes: list[Any],
               out_shapes: list[list[int]]) -> list[np.ndarray]:
    device = ReferenceDevice()
    try:
        cb = PreparedModelCallback()
        device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM,
                             None, [], [], b"", cb)
        status, prepared = cb.wait(30)
        assert status == ErrorStatus.NONE
        sizes = [int(np.prod(s)) * np.dtype(d).itemsize for d, s in zip(out_dtypes, out_shapes)]
        req = RequestBuilder(inputs, sizes)
        status, shapes, _ = prepared.execute_synchronously(req.request, MeasureTiming.NO)
        assert status == ErrorStatus.NONE
        outs = [req.output(k, d, s) for k, (d, s) in enumerate(zip(out_dtypes, out_shapes))]
        req.close()
        return outs
    finally:
        device.close()


def _conv_model(in_t: T, in_zp: int, per_channel: bool) -> Model:
    rng = np.random.default_rng(1)
    b = ModelBuilder()
    x = b.input(in_t, [1, 5, 5, 3], 0.05, in_zp)
    if per_channel:
        scales = [0.02, 0.04, 0.01, 0.03]
        w = b.constant(T.TENSOR_QUANT8_SYMM_PER_CHANNEL,
                       rng.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8), None, 0.0, 0,
                       SymmPerChannelQuantParams(scales, 0))
        bias = b.constant(T.TENSOR_INT32, rng.integers(-200, 200, 4).astype(np.int32))
    else:
        w_dtype = np.uint8 if in_t == T.TENSOR_QUANT8_ASYMM else np.int8
        w_zp = 120 if in_t == T.TENSOR_QUANT8_ASYMM else 0
        lo, hi = (60, 200) if w_dtype == np.uint8 else (-100, 100)
        w = b.constant(in_t, rng.integers(lo, hi, (4, 3, 3, 3)).astype(w_dtype), None,
                       0.02, w_zp)
        bias = b.constant(T.TENSOR_INT32, rng.integers(-200, 200, 4).astype(np.int32), None,
                          0.05 * 0.02, 0)
    conv = b.operand(in_t, [1, 4, 4, 4], 0.1, in_zp)
    # Explicit padding 1/0/1/0: neither SAME nor VALID, so a PAD goes first.
    b.operation(O.CONV_2D, [x, w, bias] + [b.scalar(T.INT32, v) for v in
                                           (1, 0, 1, 0, 1, 1, 1)], [conv])
    out = b.output(in_t, [1, 2, 2, 4], 0.1, in_zp)
    b.operation(O.MAX_POOL_2D, [conv] + [b.scalar(T.INT32, v) for v in (2, 2, 2, 2, 2, 0)],
                [out])
    return b.build()


@pytest.mark.parametrize(("in_t", "zp", "per_channel"), [
    (T.TENSOR_QUANT8_ASYMM, 128, False), (T.TENSOR_QUANT8_ASYMM, 100, True),
    (T.TENSOR_QUANT8_ASYMM_SIGNED, -3, False), (T.TENSOR_QUANT8_ASYMM_SIGNED, 5, True)])
def test_quantized_conv_agrees_with_reference(in_t: T, zp: int, per_channel: bool) -> None:
    model = _conv_model(in_t, zp, per_channel)
    dtype = in_t.dtype
    x = np.random.default_rng(2).integers(np.iinfo(dtype).min, np.iinfo(dtype).max,
                                          (1, 5, 5, 3)).astype(dtype)
    want = _reference(model, [x], [dtype], [[1, 2, 2, 4]])[0]
    got = _run_litert(write_tflite(model), [x])[0]
    assert got.dtype == dtype and got.shape == (1, 2, 2, 4)
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    assert len(np.unique(want)) > 2  # the model computes something, not a constant


def test_float16_constants_and_io_agree_with_reference() -> None:
    rng = np.random.default_rng(3)
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT16, [2, 6])
    w = b.constant(T.TENSOR_FLOAT16, rng.normal(0, 0.5, (3, 6)).astype(np.float16))
    bias = b.constant(T.TENSOR_FLOAT16, rng.normal(0, 0.5, 3).astype(np.float16))
    fc = b.operand(T.TENSOR_FLOAT16, [2, 3])
    b.operation(O.FULLY_CONNECTED, [x, w, bias, b.scalar(T.INT32, 1)], [fc])
    y = b.output(T.TENSOR_FLOAT16, [2, 3])
    b.operation(O.SOFTMAX, [fc, b.scalar(T.FLOAT16, 1.5)], [y])
    model = b.build()
    data = write_tflite(model, ["features"], ["probs"])
    xs = rng.normal(0, 1, (2, 6)).astype(np.float16)
    want = _reference(model, [xs], [np.float16], [[2, 3]])[0]
    it = litert.Interpreter(model_content=data)
    assert [d["name"] for d in it.get_input_details()] == ["features"]
    assert it.get_input_details()[0]["dtype"] == np.float16
    assert it.get_signature_list()["serving_default"]["outputs"] == ["probs"]
    got = _run_litert(data, [xs])[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=5e-3)
    # The weights stay float16 in the file: 18 + 3 values of 2 bytes, not 4.
    import tflite
    m = tflite.Model.GetRootAsModel(data, 0)
    sizes = sorted(m.Buffers(k).DataLength() for k in range(m.BuffersLength()))
    assert 36 in sizes and 6 in sizes


def test_imported_model_names_and_bad_names() -> None:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [3])
    y = b.output(T.TENSOR_FLOAT32, [3])
    b.operation(O.RELU6, [x], [y])
    imported = ImportedModel(b.build(), ["pixels"], ["clipped"], source="<test>")
    data = write_tflite(imported)
    it = litert.Interpreter(model_content=data)
    assert it.get_signature_list() == {
        "serving_default": {"inputs": ["pixels"], "outputs": ["clipped"]}}
    np.testing.assert_array_equal(
        _run_litert(data, [np.array([-1, 3, 9], np.float32)])[0], [0, 3, 6])
    with pytest.raises(NnhalError, match="2 input names given for 1 model inputs"):
        write_tflite(imported, input_names=["a", "b"])


@pytest.mark.parametrize("t", [T.TENSOR_FLOAT32, T.TENSOR_QUANT8_ASYMM])
def test_average_pool_with_padding_tflite_lacks(t: T) -> None:
    """The HAL averages the real values under each window; TFLite has no such padding, so
    the export rescales a zero-padded VALID average per output position."""
    b = ModelBuilder()
    quant = (0.5, 10) if t == T.TENSOR_QUANT8_ASYMM else (0.0, 0)
    x = b.input(t, [1, 5, 4, 2], *quant)
    y = b.output(t, [1, 3, 3, 2], *quant)
    b.operation(O.AVERAGE_POOL_2D, [x] + [b.scalar(T.INT32, v) for v in
                                          (2, 1, 0, 2, 2, 2, 3, 3, 0)], [y])
    model = b.build()
    xs = (np.random.default_rng(5).uniform(0, 100, (1, 5, 4, 2))).astype(t.dtype)
    want = _reference(model, [xs], [t.dtype], [[1, 3, 3, 2]])[0]
    got = _run_litert(write_tflite(model), [xs])[0]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                               atol=1 if t != T.TENSOR_FLOAT32 else 1e-4, rtol=1e-5)


def test_nchw_and_default_names() -> None:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, 2, 4, 4])  # NCHW
    y = b.output(T.TENSOR_FLOAT32, [1, 8, 2, 2])
    b.operation(O.SPACE_TO_DEPTH, [x, b.scalar(T.INT32, 2), b.scalar(T.BOOL, True)], [y])
    model = b.build()
    data = write_tflite(model)
    xs = np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4)
    want = _reference(model, [xs], [np.float32], [[1, 8, 2, 2]])[0]
    it = litert.Interpreter(model_content=data)
    assert [d["name"] for d in it.get_input_details()] == ["input_0"]
    assert [d["name"] for d in it.get_output_details()] == ["output_0"]
    np.testing.assert_array_equal(_run_litert(data, [xs])[0], want)


@pytest.mark.parametrize("sequence", [False, True])
def test_lstm_state_agrees_with_reference(sequence: bool) -> None:
    """HAL LSTM passes its states in and out; the export keeps them in TFLite's variable
    tensors (set as inputs, copied out after the operator)."""
    rng = np.random.default_rng(4)
    b = ModelBuilder()
    f32 = T.TENSOR_FLOAT32
    x_shape = [1, 3, 2] if sequence else [1, 2]
    x = b.input(f32, x_shape)
    weights = [b.constant(f32, rng.normal(0, 0.5, (4, 2)).astype(np.float32)) for _ in range(4)]
    weights += [b.constant(f32, rng.normal(0, 0.5, (4, 4)).astype(np.float32))
                for _ in range(4)]
    peepholes = [b.omitted(f32, [0]) for _ in range(3)]
    biases = [b.constant(f32, rng.normal(0, 0.1, 4).astype(np.float32)) for _ in range(4)]
    projection = [b.omitted(f32, [0]), b.omitted(f32, [0])]
    h, c = b.input(f32, [1, 4]), b.input(f32, [1, 4])
    params = [b.scalar(T.INT32, 4), b.scalar(T.FLOAT32, 0.0), b.scalar(T.FLOAT32, 0.0)]
    if sequence:
        params.append(b.scalar(T.BOOL, False))  # batch-major
        params += [b.omitted(f32, [0]) for _ in range(4)]  # no layer normalisation
        shapes = [[1, 3, 4], [1, 4], [1, 4]]
        checked, cell = (0, 1, 2), 2
    else:
        shapes = [[1, 16], [1, 4], [1, 4], [1, 4]]
        checked, cell = (1, 2, 3), 2  # output 0 is the scratch buffer: the driver's own
    outs = [b.output(f32, s) for s in shapes]
    op = O.UNIDIRECTIONAL_SEQUENCE_LSTM if sequence else O.LSTM
    b.operation(op, [x, *weights, *peepholes, *biases, *projection, h, c, *params], outs)
    model = b.build()
    feeds = [rng.normal(0, 1, s).astype(np.float32) for s in (x_shape, [1, 4], [1, 4])]
    want = _reference(model, feeds, [np.float32] * len(shapes), shapes)
    got = _run_litert(write_tflite(model), feeds)
    for k in checked:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)
    assert not np.allclose(want[cell], feeds[2])  # the cell state moved
