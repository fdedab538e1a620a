"""Makes the small .tflite files of tests/tflite/test_aidl_ops_models.py with TensorFlow's
own converter: the builtins that map to the operations of AIDL v2 / v3 (BATCH_MATMUL, PACK,
MIRROR_PAD, REVERSE_V2) and int8 RSQRT (feature level 7), as float32 and as full-integer
int8 models. Run from the repository root when the converter changes:

    python tests/tflite/data/make_aidl_ops.py

Each file is a few hundred bytes to a few KB; the script prints the operators each holds, and
refuses to write a file that lacks the builtin it is for."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

HERE = Path(__file__).resolve().parent
F = tf.float32


def _convert(fn, specs: list[tf.TensorSpec], int8: bool, positive: bool = False) -> bytes:
    conv = tf.lite.TFLiteConverter.from_concrete_functions(
        [tf.function(fn).get_concrete_function(*specs)])
    if int8:
        def representative():
            rng = np.random.default_rng(0)
            for _ in range(8):
                lo = 0.05 if positive else -2.0
                yield [rng.uniform(lo, 2.0, s.shape).astype(np.float32) for s in specs]

        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = representative
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
    return conv.convert()


def _bmm(a, b):
    return tf.linalg.matmul(a, b, adjoint_b=True)


def _pack(x, y):
    return tf.stack([x, y, x + y], axis=1)


def _mirror(x):
    pads = [[0, 0], [1, 2], [2, 1], [0, 0]]
    return tf.pad(x, pads, mode="REFLECT"), tf.pad(x, pads, mode="SYMMETRIC")


def _reverse(x):
    return tf.reverse(x, axis=[1]), tf.reverse(x, axis=[-1])


def _rsqrt(x):
    return tf.math.rsqrt(x)


#: file stem -> (function, input specs, int8, positive inputs, the builtin it must hold)
MODELS = {
    "bmm_f32": (_bmm, [tf.TensorSpec((2, 3, 4), F), tf.TensorSpec((2, 5, 4), F)], False,
                False, "BATCH_MATMUL"),
    "bmm_int8": (_bmm, [tf.TensorSpec((2, 3, 4), F), tf.TensorSpec((2, 5, 4), F)], True,
                 False, "BATCH_MATMUL"),
    "pack_f32": (_pack, [tf.TensorSpec((2, 3), F), tf.TensorSpec((2, 3), F)], False, False,
                 "PACK"),
    "pack_int8": (_pack, [tf.TensorSpec((2, 3), F), tf.TensorSpec((2, 3), F)], True, False,
                  "PACK"),
    "mirror_pad_f32": (_mirror, [tf.TensorSpec((1, 4, 5, 2), F)], False, False, "MIRROR_PAD"),
    "mirror_pad_int8": (_mirror, [tf.TensorSpec((1, 4, 5, 2), F)], True, False, "MIRROR_PAD"),
    "reverse_f32": (_reverse, [tf.TensorSpec((2, 3, 4), F)], False, False, "REVERSE_V2"),
    "reverse_int8": (_reverse, [tf.TensorSpec((2, 3, 4), F)], True, False, "REVERSE_V2"),
    "rsqrt_int8": (_rsqrt, [tf.TensorSpec((2, 8), F)], True, True, "RSQRT"),
}


def _operators(data: bytes) -> list[str]:
    sys.path.insert(0, str(HERE.parents[2]))
    from nnhal.tflite import schema
    from nnhal.tflite.import_read import read_model

    return [op.name for op in read_model(schema.load(data))[0].ops]


def main() -> None:
    for stem, (fn, specs, int8, positive, builtin) in MODELS.items():
        data = _convert(fn, specs, int8, positive)
        ops = _operators(data)
        if builtin not in ops:
            raise SystemExit(f"{stem}: the converter wrote {ops}, without {builtin}")
        (HERE / f"{stem}.tflite").write_bytes(data)
        print(f"{stem}.tflite: {len(data)} bytes, {ops}")


if __name__ == "__main__":
    main()
