"""Makes ``streaming_f32.tflite`` and ``streaming_int8.tflite``: small streaming models written
by TensorFlow's TFLite converter from a ``tf.Module`` with two ``tf.Variable`` s (a ring of the
last four frames and a decaying sum started at 0.5), which the converter turns into resource
variables (VAR_HANDLE / READ_VARIABLE / ASSIGN_VARIABLE, initialised by a CALL_ONCE subgraph),
as the wake-word models' own files have them. The int8 one is full-integer (its input, output
and state int8). ``tests/test_session_state.py`` streams them against ai-edge-litert.

Run once (``python tests/tflite/data/make_streaming.py``); the tests read the saved files and
never convert, so CI needs no TensorFlow for them.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

HERE = Path(__file__).resolve().parent


class Stream(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(7)
        self.ring = tf.Variable(tf.zeros([1, 4, 8]), name="ring")
        self.total = tf.Variable(tf.fill([1, 8], 0.5), name="total")
        self.w = tf.constant(rng.standard_normal([32, 3]).astype(np.float32) * 0.3)

    @tf.function(input_signature=[tf.TensorSpec([1, 8], tf.float32)])
    def __call__(self, x):
        frames = tf.concat([self.ring[:, 1:], tf.reshape(x, [1, 1, 8])], axis=1)
        self.ring.assign(frames)
        total = self.total * 0.75 + x * 0.25
        self.total.assign(total)
        y = tf.matmul(tf.reshape(frames, [1, 32]), self.w)
        return tf.tanh(y + total[:, :1])


def _convert(int8: bool) -> bytes:
    m = Stream()
    conv = tf.lite.TFLiteConverter.from_concrete_functions(
        [m.__call__.get_concrete_function()], m)
    if int8:
        rng = np.random.default_rng(0)

        def data():
            for _ in range(64):
                yield [rng.uniform(-1, 1, [1, 8]).astype(np.float32)]

        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = data
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
    return conv.convert()


if __name__ == "__main__":
    for name, int8 in (("streaming_f32.tflite", False), ("streaming_int8.tflite", True)):
        (HERE / name).write_bytes(_convert(int8))
        print("wrote", name)
