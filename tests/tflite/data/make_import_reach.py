"""Makes the small converter-made .tflite files of tests/tflite/test_import_reach.py (issue 27's
reach of the importer), with TensorFlow's own TFLite converter, into this folder:

- ``frame_count.tflite``: SHAPE -> SPLIT_V -> RESHAPE -> FLOOR_DIV / FLOOR_MOD of a signal's
  length (a dynamic batch, so the converter keeps the shape arithmetic), then the frames.
- ``select_v2_broadcast.tflite``: tf.where whose condition and branches broadcast (float).
- ``select_v2_broadcast_int8.tflite``: the same, full-integer int8.
- ``floor_div_mod.tflite``: FLOOR_DIV of float32 and int32 tensors, FLOOR_MOD of int32 ones.
- ``bool_reshape_if.tflite``: a bool reduced, RESHAPEd to a scalar and used by tf.cond (IF).
- ``refused_rfft2d_custom.tflite``: a custom operator (allow_custom_ops), RFFT2D and REAL
  downstream of it, and an unrelated CUMSUM: operators no HAL operation computes, for the
  refusal that names every one.
- ``upsample_repeat.tflite``: Keras' UpSampling2D (nearest), tf.repeat and a tile of a new
  axis after one (each element repeated) of a 4-D tensor, which the converter writes as
  RESHAPE -> TILE -> RESHAPE through 5-D tensors (the HAL's data movement stops at 4-D).
- ``dilated_clip.tflite`` and ``dilated_clip_int8.tflite``: a dilated convolution (the
  converter's SPACE_TO_BATCH_ND -> CONV_2D -> BATCH_TO_SPACE_ND, whose middle shapes it
  writes with a placeholder batch) and a clip to [-1, 1] (RELU_N1_TO_1; int8 with an output
  quantization of its own).
- ``leaky_compare_int8.tflite``: full-integer int8 LeakyReLU (alphas 0.2 and 0.01), the two
  inputs (of their own scales) compared (``x > y`` selecting between the two, ``x <= y``
  cast to float: a bool CAST).

Run once (``python tests/tflite/data/make_import_reach.py [NAME ...]``: only the files named,
when any); the tests read the saved files and never convert, so CI needs no TensorFlow for
them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

HERE = Path(__file__).resolve().parent


def _convert(fn, specs, *, custom: bool = False, int8_data=None) -> bytes:
    concrete = fn.get_concrete_function(*specs)
    conv = tf.lite.TFLiteConverter.from_concrete_functions([concrete], fn)
    if custom:
        conv.allow_custom_ops = True
    if int8_data is not None:
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = int8_data
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
    return conv.convert()


@tf.function
def frame_count(x):
    """Frames of 160 samples of a signal whose length the graph reads from its shape."""
    n = tf.shape(x)
    _, length = tf.split(n, [1, 1])
    length = tf.reshape(length, [])
    frames = length // 160
    rest = tf.math.floormod(length, 160)
    used = x[:, :frames * 160]
    return tf.reshape(used, [-1, frames, 160]), tf.reshape(rest + frames, [1])


@tf.function
def select_v2(x, y):
    return tf.where(x[:, :, :1] > 0.0, x, y)


@tf.function
def floor_div_mod(a, b, i, j):
    # float32 FLOOR_MOD of tensors is refused (no exact HAL form): not in this model
    return a // b, i // j, tf.math.floormod(i, j)


@tf.function
def bool_reshape_if(x):
    flag = tf.reshape(tf.reduce_any(x > 0.5, axis=1, keepdims=True), [])
    return tf.cond(flag, lambda: x * 2.0, lambda: x - 1.0)


@tf.function
def refused(x):
    special = tf.math.special.bessel_i0e(x)  # no builtin: custom 'BesselI0e' (allow_custom_ops)
    spectrum = tf.signal.rfft2d(special)  # RFFT2D downstream of the custom operator
    return tf.math.real(spectrum), tf.math.cumsum(x, axis=1)  # and an unrelated CUMSUM


@tf.function
def upsample_repeat(x):
    up = tf.keras.layers.UpSampling2D(2)(x)
    wide = tf.repeat(x, 3, axis=2)
    tiled = tf.reshape(tf.tile(tf.expand_dims(x, 3), [1, 1, 1, 2, 1]), [1, 4, 10, 3])
    return up, wide, tiled


_DILATED = tf.keras.layers.Conv2D(4, 3, padding="same", dilation_rate=2,
                                  kernel_initializer=tf.keras.initializers.GlorotUniform(7))


@tf.function
def dilated_clip(x):
    y = _DILATED(x)
    return tf.clip_by_value(tf.concat([y, y * 3.0], -1), -1.0, 1.0)


@tf.function
def leaky_compare(x, y):
    a = tf.nn.leaky_relu(x, alpha=0.2)
    b = tf.nn.leaky_relu(y * 3.0, alpha=0.01)
    return tf.where(x > y, a, b), tf.cast(x <= y, tf.float32)


def main() -> int:
    f32, i32 = tf.float32, tf.int32
    files = {
        "frame_count.tflite": _convert(frame_count, [tf.TensorSpec([None, 1000], f32)]),
        "select_v2_broadcast.tflite": _convert(
            select_v2, [tf.TensorSpec([2, 3, 4], f32), tf.TensorSpec([1, 4], f32)]),
        "floor_div_mod.tflite": _convert(
            floor_div_mod, [tf.TensorSpec([2, 5], f32), tf.TensorSpec([5], f32),
                            tf.TensorSpec([2, 5], i32), tf.TensorSpec([1, 5], i32)]),
        "bool_reshape_if.tflite": _convert(bool_reshape_if, [tf.TensorSpec([1, 6], f32)]),
        "refused_rfft2d_custom.tflite": _convert(refused, [tf.TensorSpec([4, 8], f32)],
                                                 custom=True),
    }
    rng = np.random.default_rng(0)

    def samples():
        for _ in range(32):
            yield [rng.uniform(-1, 1, (2, 3, 4)).astype(np.float32),
                   rng.uniform(-1, 1, (1, 4)).astype(np.float32)]

    files["select_v2_broadcast_int8.tflite"] = _convert(
        select_v2, [tf.TensorSpec([2, 3, 4], f32), tf.TensorSpec([1, 4], f32)],
        int8_data=samples)

    def pairs():
        for _ in range(32):
            yield [rng.uniform(-2, 2, (2, 16)).astype(np.float32),
                   rng.uniform(-1, 1, (2, 16)).astype(np.float32)]

    files["leaky_compare_int8.tflite"] = _convert(
        leaky_compare, [tf.TensorSpec([2, 16], f32), tf.TensorSpec([2, 16], f32)],
        int8_data=pairs)
    files["upsample_repeat.tflite"] = _convert(upsample_repeat,
                                               [tf.TensorSpec([1, 4, 5, 3], f32)])
    files["dilated_clip.tflite"] = _convert(dilated_clip,
                                            [tf.TensorSpec([None, 12, 12, 3], f32)])

    def images():
        for _ in range(32):
            yield [rng.uniform(-1, 1, (1, 12, 12, 3)).astype(np.float32)]

    files["dilated_clip_int8.tflite"] = _convert(
        dilated_clip, [tf.TensorSpec([None, 12, 12, 3], f32)], int8_data=images)
    wanted = set(sys.argv[1:])
    for name, data in files.items():
        if wanted and name not in wanted:
            continue
        (HERE / name).write_bytes(data)
        print(f"{name}: {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
