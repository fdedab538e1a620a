"""Makes the converter-made .tflite files of tests/tflite/test_import_extensions.py: TFLite
builtins that have no HAL operation and import as operations of nnhal's extension
``org.nnhal.tflite``, with TensorFlow's own TFLite converter, into this folder:

- ``rfft2d_spectrum.tflite``: MUL / ADD (HAL operations), RFFT2D at the input's size and
  RFFT2D cropped and zero-padded (fft_length [4, 32] of an [.., 8, 16] input), COMPLEX_ABS,
  REAL, IMAG, then LOG / SUB (HAL operations) of their float32 results.
- ``gelu_gather_nd.tflite``: GELU (the tanh approximation: the converter lowers the erf form
  to an Erfc it cannot convert) and GATHER_ND of a run-time tensor with constant indices,
  between HAL operations.
- ``rfft2d_complex.tflite``: RFFT2D whose complex64 result is the model's output.
- ``extension_builtins.tflite``: CUMSUM (exclusive, reverse), SIGN, CEIL, ROUND, COS and a
  float32 FLOOR_MOD of two run-time tensors (broadcast).
- ``complex_movement.tflite``: BirdNET's STFT tail (EXPAND_DIMS, RFFT2D, SQUEEZE of the
  complex64 result, CAST to float32: the real part) and RESHAPEs of complex64 before IMAG /
  COMPLEX_ABS (the converter makes no complex64 TRANSPOSE or SLICE builtin: those need
  TF Select; tests build them by hand).
- ``stft_net.tflite``: BirdNET's front end in small, with a dynamic batch ([None, 512]): the
  converter leaves the framing as run-time shape arithmetic (SHAPE, SPLIT_V, RANGE, ...,
  GATHER) and writes every shape below it as a placeholder ([1, 1, ...], -1 in
  shape_signature); then EXPAND_DIMS, RFFT2D, SQUEEZE, CAST, TRANSPOSE, CONV_2D, PAD,
  MAX_POOL_2D, CONCATENATION, MEAN, FULLY_CONNECTED.

Run once (``python tests/tflite/data/make_extension_models.py``); the tests read the saved
files and never convert, so CI needs no TensorFlow for them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

HERE = Path(__file__).resolve().parent


def _convert(fn, specs) -> bytes:
    concrete = fn.get_concrete_function(*specs)
    return tf.lite.TFLiteConverter.from_concrete_functions([concrete], fn).convert()


@tf.function
def spectrum(x):
    y = x * 0.5 + 0.25
    z = tf.signal.rfft2d(y)
    cropped = tf.signal.rfft2d(y, fft_length=[4, 32])
    return (tf.math.log(tf.abs(z) + 1.0), tf.math.real(z) - tf.math.imag(z),
            tf.math.imag(cropped))


@tf.function
def gelu_gather(x):
    y = x * 2.0
    picked = tf.gather_nd(y, [[0, 1], [2, 3], [1, 0]])
    return tf.nn.gelu(y, approximate=True), picked + 1.0


@tf.function
def complex_out(x):
    return tf.signal.rfft2d(x)


@tf.function
def builtins(a, b):
    return (tf.math.cumsum(a, axis=1, exclusive=True, reverse=True), tf.math.sign(a),
            tf.math.ceil(a), tf.math.round(a), tf.math.cos(a), tf.math.floormod(a, b))


@tf.function
def complex_movement(x):
    z = tf.signal.rfft2d(tf.expand_dims(x, 2))           # [3, 4, 1, 9]
    frames = tf.cast(tf.squeeze(z, axis=2), tf.float32)  # the real part, as BirdNET's
    flat = tf.reshape(z, [3, 36])
    return frames * 2.0, tf.math.imag(flat), tf.abs(tf.expand_dims(z, 0))


_W = np.random.default_rng(0).standard_normal((3, 3, 1, 4)).astype(np.float32) * 0.1
_DW = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32) * 0.1


@tf.function
def stft_net(x):
    frames = tf.signal.frame(x, 64, 32)                      # [b, 15, 64]: BirdNET's GATHER
    z = tf.signal.rfft2d(tf.expand_dims(frames * 0.5, 2))    # [b, 15, 1, 33] complex64
    mag = tf.cast(tf.squeeze(z, axis=2), tf.float32)          # the real part
    spec = tf.expand_dims(tf.transpose(mag * mag, [0, 2, 1]), 3)
    y = tf.nn.conv2d(spec, tf.constant(_W), 2, "SAME")
    y = tf.nn.max_pool2d(tf.pad(y, [[0, 0], [1, 1], [0, 0], [0, 0]]), 2, 2, "VALID")
    y = tf.concat([y, y * 2.0], axis=3)
    dense = tf.concat([tf.constant(_DW), tf.constant(_DW)], 0)
    return tf.nn.sigmoid(tf.matmul(tf.reduce_mean(y, axis=[1, 2]), dense))


def main() -> int:
    f32 = tf.float32
    files = {
        "rfft2d_spectrum.tflite": _convert(spectrum, [tf.TensorSpec([2, 8, 16], f32)]),
        "gelu_gather_nd.tflite": _convert(gelu_gather, [tf.TensorSpec([3, 4, 6], f32)]),
        "rfft2d_complex.tflite": _convert(complex_out, [tf.TensorSpec([3, 4, 8], f32)]),
        "extension_builtins.tflite": _convert(
            builtins, [tf.TensorSpec([3, 5], f32), tf.TensorSpec([5], f32)]),
        "complex_movement.tflite": _convert(complex_movement, [tf.TensorSpec([3, 4, 16], f32)]),
        "stft_net.tflite": _convert(stft_net, [tf.TensorSpec([None, 512], f32)]),
    }
    for name, data in files.items():
        (HERE / name).write_bytes(data)
        print(f"{name}: {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
