"""Real Keras models converted by TensorFlow's own converter at test time: MobileNet V1 and V2
(small: alpha 0.25 at 128 px, alpha 0.35 at 96 px, 8 classes, untrained), each as float32 and
as full-integer int8 (the converter's per-channel weights), imported and run on the reference
driver against ai-edge-litert on the same inputs.

The batch is dynamic (None), as Keras leaves it, so V1 carries the SHAPE -> STRIDED_SLICE ->
PACK -> RESHAPE chain the importer folds, and V2's int8 classifier is a FULLY_CONNECTED with
per-channel weights. An untrained network's activations shrink layer by layer (to ~1e-8 at the
logits: constant outputs that would prove nothing), so each BatchNormalization first takes the
statistics of one batch of random images: every layer is normalised and the outputs vary.

Float outputs agree with litert's default kernels within 1e-4 of their range. Int8 outputs are
compared with litert's reference kernels (BUILTIN_REF), which they match within one step (in
fact exactly, every intermediate tensor included, when measured); litert's default optimized
and XNNPACK int8 kernels round some products differently by one step, and an untrained deep
network amplifies those steps layer by layer (to tens of steps at the output, measured), so
against them the comparison would measure litert's rounding, not the import.
"""

from __future__ import annotations

import os
from collections import Counter

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from runner import Reference, max_error, tolerance  # noqa: E402

from nnhal.hal.types import OperandLifeTime, OperandType, OperationType  # noqa: E402
from nnhal.tflite import read_tflite, schema, write_tflite  # noqa: E402
from nnhal.tflite.import_read import read_model  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Statistics for quantized inputs:UserWarning")
tf = pytest.importorskip("tensorflow")
litert_interpreter = pytest.importorskip("ai_edge_litert.interpreter")

#: name -> (Keras constructor, its keyword arguments, input shape without the batch)
KERAS = {
    "mobilenet_v1": ("MobileNet", dict(alpha=0.25), (128, 128, 3)),
    "mobilenet_v2": ("MobileNetV2", dict(alpha=0.35), (96, 96, 3)),
}
CLASSES = 8


def _keras_model(ctor: str, kwargs: dict, shape: tuple[int, ...]):
    model = getattr(tf.keras.applications, ctor)(weights=None, input_shape=shape,
                                                 classes=CLASSES, **kwargs)
    images = np.random.default_rng(1).uniform(-1, 1, (8, *shape)).astype(np.float32)
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            layer.momentum = 0.0
    model(images, training=True)  # moving statistics := this batch's
    return model


def _convert(model, shape: tuple[int, ...], int8: bool) -> bytes:
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    # A frozen concrete function converts several times faster than from_keras_model
    # (which saves a SavedModel first); the batch stays dynamic.
    fn = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec((None, *shape), tf.float32))
    conv = tf.lite.TFLiteConverter.from_concrete_functions(
        [convert_variables_to_constants_v2(fn)])
    if int8:
        def representative():
            rng = np.random.default_rng(0)
            for _ in range(2):
                yield [rng.uniform(-1, 1, (1, *shape)).astype(np.float32)]

        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = representative
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
    return conv.convert()


@pytest.fixture(scope="session")
def keras_tflite(tmp_path_factory) -> dict[str, bytes]:
    """name (mobilenet_v1, mobilenet_v1_int8, ...) -> the converter's .tflite bytes, also
    written to a temporary directory for inspection."""
    tf.keras.utils.set_random_seed(0)
    out_dir = tmp_path_factory.mktemp("keras")
    files = {}
    for name, (ctor, kwargs, shape) in KERAS.items():
        model = _keras_model(ctor, kwargs, shape)
        for int8 in (False, True):
            key = name + ("_int8" if int8 else "")
            files[key] = _convert(model, shape, int8)
            (out_dir / f"{key}.tflite").write_bytes(files[key])
    return files


def _litert(data: bytes, x: np.ndarray, reference_kernels: bool) -> np.ndarray:
    kind = litert_interpreter.OpResolverType
    it = litert_interpreter.Interpreter(
        model_content=data,
        experimental_op_resolver_type=kind.BUILTIN_REF if reference_kernels else kind.AUTO)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"]).copy()


def _ops(data: bytes) -> list[str]:
    return [op.name for op in read_model(schema.load(data))[0].ops]


def _run_both(data: bytes, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    imported = read_tflite(data)
    main = imported.model.main
    x_operand = main.operands[main.input_indexes[0]]
    shape = tuple(x_operand.dimensions)
    rng = np.random.default_rng(seed)
    if OperandType(x_operand.type) == OperandType.TENSOR_FLOAT32:
        x = rng.uniform(-1, 1, shape).astype(np.float32)
    else:
        x = rng.integers(-128, 128, shape).astype(np.int8)
    expected = _litert(data, x, reference_kernels=x.dtype == np.int8)
    ref = Reference(imported)
    try:
        got = ref.run([x])[0]
    finally:
        ref.close()
    assert got.shape == expected.shape == (1, CLASSES)
    assert got.dtype == expected.dtype
    return got, expected


@pytest.mark.parametrize("name", ["mobilenet_v1", "mobilenet_v2"])
def test_float_model_agrees_with_litert(keras_tflite: dict[str, bytes], name: str) -> None:
    got, expected = _run_both(keras_tflite[name])
    assert np.ptp(expected) > 1e-3  # the outputs vary: the comparison can fail
    assert max_error(got, expected) <= tolerance(expected)


@pytest.mark.parametrize("name", ["mobilenet_v1_int8", "mobilenet_v2_int8"])
def test_int8_model_agrees_with_litert_within_one_step(keras_tflite: dict[str, bytes],
                                                      name: str) -> None:
    got, expected = _run_both(keras_tflite[name])
    assert len(np.unique(expected)) > 2
    assert max_error(got, expected) <= 1


@pytest.mark.parametrize("name", ["mobilenet_v1", "mobilenet_v1_int8"])
def test_keras_dynamic_batch_chain_folds(keras_tflite: dict[str, bytes], name: str) -> None:
    """Static at import (the allocated shape), as TFLite's NNAPI delegate delegates it."""
    data = keras_tflite[name]
    assert {"SHAPE", "STRIDED_SLICE", "PACK"} <= set(_ops(data))
    main = read_tflite(data).model.main
    assert main.operands[main.input_indexes[0]].dimensions == [1, 128, 128, 3]
    reshapes = [o for o in main.operations if OperationType(o.type) == OperationType.RESHAPE]
    assert reshapes and all(main.operands[o.inputs[1]].lifetime in (
        OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_REFERENCE) for o in reshapes)


def test_per_channel_classifier_is_a_1x1_convolution(keras_tflite: dict[str, bytes]) -> None:
    data = keras_tflite["mobilenet_v2_int8"]
    fc = [op for op in read_model(schema.load(data))[0].ops if op.name == "FULLY_CONNECTED"]
    assert len(fc) == 1
    main = read_tflite(data).model.main
    filters = [main.operands[o.inputs[1]] for o in main.operations
               if OperationType(o.type) == OperationType.CONV_2D]
    assert [f.dimensions[:3] for f in filters if f.dimensions[1:3] == [1, 1]][-1] == [
        CLASSES, 1, 1]
    assert OperandType(filters[-1].type) == OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL


@pytest.mark.parametrize("name", list(KERAS) + [k + "_int8" for k in KERAS])
def test_reexport_keeps_operators_and_litert_results(keras_tflite: dict[str, bytes],
                                                     name: str) -> None:
    """Read and written again, the file has its operators back (V2 int8: MEAN and the
    per-channel FULLY_CONNECTED, not the HAL's depthwise and 1x1 convolutions; V1: less the
    folded SHAPE chain), and litert's default kernels (XNNPACK) give the same results on it
    as on the file: the same integers, or floats within the agreement tolerance."""
    data = keras_tflite[name]
    again = write_tflite(read_tflite(data))
    folded = Counter(SHAPE=1, STRIDED_SLICE=1, PACK=1) if "v1" in name else Counter()
    assert Counter(_ops(again)) == Counter(_ops(data)) - folded
    if name == "mobilenet_v2_int8":
        assert {"MEAN", "FULLY_CONNECTED"} <= set(_ops(again))
    rng = np.random.default_rng(2)
    for _ in range(2):
        shape = (1, *KERAS[name.removesuffix("_int8")][2])
        x = rng.integers(-128, 128, shape).astype(np.int8) if name.endswith("_int8") else \
            rng.uniform(-1, 1, shape).astype(np.float32)
        want, got = _litert(data, x, False), _litert(again, x, False)
        if x.dtype == np.int8:
            np.testing.assert_array_equal(got, want)
        else:
            assert max_error(got, want) <= tolerance(want)
