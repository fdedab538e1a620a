"""Makes ``xla_quant_int8.tflite`` for tests/drivers/test_xla.py with TensorFlow's own TFLite
converter (full-integer int8, per-channel weights, float32 input and output): QUANTIZE,
CONV_2D (fused RELU6), DEPTHWISE_CONV_2D, MAX_POOL_2D and AVERAGE_POOL_2D, ADD, MUL,
CONCATENATION of two branches of different scales (requantised), PAD, RESHAPE,
FULLY_CONNECTED, LOGISTIC and DEQUANTIZE: the quantized lowerings of the XLA driver on a model
the converter made, to compare with the reference driver bit for bit.

Run once (``python tests/tflite/data/make_xla_quant.py``); the test reads the saved file and
never converts, so CI needs no TensorFlow for it.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

HERE = Path(__file__).resolve().parent
SHAPE = (1, 12, 12, 3)


def _weights() -> dict[str, tf.Tensor]:
    rng = np.random.default_rng(3)

    def w(*shape: int, sd: float = 0.4) -> tf.Tensor:
        return tf.constant(rng.normal(0, sd, shape).astype(np.float32))

    return {"conv": w(3, 3, 3, 8), "conv_b": w(8), "dw": w(3, 3, 8, 1), "dw_b": w(8),
            "pw": w(1, 1, 8, 8), "fc": w(144, 5, sd=0.05), "fc_b": w(5)}


def _fn(wt: dict[str, tf.Tensor]):
    nn = tf.nn

    @tf.function
    def fn(x):
        a = nn.relu6(nn.conv2d(x, wt["conv"], 1, "SAME") + wt["conv_b"])
        b = nn.depthwise_conv2d(a, wt["dw"], [1, 2, 2, 1], "SAME") + wt["dw_b"]
        c = nn.conv2d(a, wt["pw"], 2, "VALID")
        s = b + c
        m = s * c
        p = nn.max_pool2d(tf.pad(s, [[0, 0], [1, 1], [1, 1], [0, 0]]), 2, 2, "VALID")
        q = nn.avg_pool2d(m, 2, 2, "SAME")
        cat = tf.concat([p[:, :3, :3, :], q[:, :3, :3, :] * 4.0], axis=3)
        y = tf.matmul(tf.reshape(cat, [1, -1]), wt["fc"]) + wt["fc_b"]
        return tf.math.sigmoid(y)

    return fn


def make() -> bytes:
    fn = _fn(_weights())
    conv = tf.lite.TFLiteConverter.from_concrete_functions(
        [fn.get_concrete_function(tf.TensorSpec(SHAPE, tf.float32))], fn)

    def data():
        rng = np.random.default_rng(0)
        for _ in range(8):
            yield [rng.uniform(-1, 1, SHAPE).astype(np.float32)]

    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = data
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return conv.convert()


if __name__ == "__main__":
    path = HERE / "xla_quant_int8.tflite"
    path.write_bytes(make())
    print(path, path.stat().st_size)
