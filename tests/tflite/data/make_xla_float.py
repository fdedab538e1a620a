"""Makes ``xla_float.tflite`` for tests/drivers/test_xla.py with TensorFlow's own TFLite
converter (float32): a small MobileNet-like block (CONV_2D with RELU6, DEPTHWISE_CONV_2D,
a pointwise CONV_2D, a residual ADD, HARD_SWISH, AVERAGE_POOL_2D, MEAN, FULLY_CONNECTED and
SOFTMAX; two outputs, the features and the probabilities): the model a relaxed execution in
float16 is checked on against the reference driver.

Run once (``python tests/tflite/data/make_xla_float.py``); the test reads the saved file and
never converts, so CI needs no TensorFlow for it.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

HERE = Path(__file__).resolve().parent
SHAPE = (1, 16, 16, 3)


def _weights() -> dict[str, tf.Tensor]:
    rng = np.random.default_rng(5)

    def w(*shape: int, sd: float = 0.3) -> tf.Tensor:
        return tf.constant(rng.normal(0, sd, shape).astype(np.float32))

    return {"conv": w(3, 3, 3, 16), "conv_b": w(16), "dw": w(3, 3, 16, 1), "dw_b": w(16),
            "pw": w(1, 1, 16, 16, sd=0.2), "pw_b": w(16), "fc": w(16, 10), "fc_b": w(10)}


def _fn(wt: dict[str, tf.Tensor]):
    nn = tf.nn

    @tf.function
    def fn(x):
        a = nn.relu6(nn.conv2d(x, wt["conv"], 2, "SAME") + wt["conv_b"])
        b = nn.relu6(nn.depthwise_conv2d(a, wt["dw"], [1, 1, 1, 1], "SAME") + wt["dw_b"])
        c = nn.conv2d(b, wt["pw"], 1, "VALID") + wt["pw_b"]
        s = a + c
        h = s * nn.relu6(s + 3.0) / 6.0
        p = nn.avg_pool2d(h, 2, 2, "VALID")
        f = tf.reduce_mean(p, axis=[1, 2])
        y = tf.matmul(f, wt["fc"]) + wt["fc_b"]
        return {"features": f, "probabilities": nn.softmax(y * 4.0)}

    return fn


def make() -> bytes:
    fn = _fn(_weights())
    conv = tf.lite.TFLiteConverter.from_concrete_functions(
        [fn.get_concrete_function(tf.TensorSpec(SHAPE, tf.float32))], fn)
    return conv.convert()


if __name__ == "__main__":
    path = HERE / "xla_float.tflite"
    path.write_bytes(make())
    print(path, path.stat().st_size)
