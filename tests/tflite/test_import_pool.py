"""The imported model's pool (ModelBuilder.use_source): a file of weights the HAL takes as
they are is the pool's part holding them, each constant at its offset in it; a file whose
weights are widened (float16) is not copied into the pool for nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import OperandLifeTime as L
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.tflite import read_tflite, write_tflite

DATA = Path(__file__).parent / "data"


def _file_with_weights() -> tuple[bytes, list[np.ndarray]]:
    """A .tflite (nnhal's export) of two FULLY_CONNECTED with float32 weights."""
    rng = np.random.default_rng(5)
    ws = [rng.standard_normal((256, 128)).astype(np.float32),
          rng.standard_normal((64, 256)).astype(np.float32)]
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, 128])
    h = b.operand(T.TENSOR_FLOAT32, [1, 256])
    b.operation(O.FULLY_CONNECTED, [x, b.constant(T.TENSOR_FLOAT32, ws[0]),
                                    b.constant(T.TENSOR_FLOAT32, np.zeros(256, np.float32)),
                                    b.scalar(T.INT32, 1)], [h])
    y = b.output(T.TENSOR_FLOAT32, [1, 64])
    b.operation(O.FULLY_CONNECTED, [h, b.constant(T.TENSOR_FLOAT32, ws[1]),
                                    b.constant(T.TENSOR_FLOAT32, np.ones(64, np.float32)),
                                    b.scalar(T.INT32, 0)], [y])
    return write_tflite(b.build()), ws


def test_weights_lie_in_the_pool_where_they_lie_in_the_file():
    data, ws = _file_with_weights()
    model = read_tflite(data).model
    (pool,) = model.pools
    arr = pool.array()
    start = arr.tobytes().find(data)
    assert start >= 0 and start % 64 == 0  # the whole file, once
    found = 0
    for op in model.main.operands:
        if op.lifetime != L.CONSTANT_REFERENCE:
            continue
        loc = op.location
        value = arr[loc.offset:loc.offset + loc.length].tobytes()
        if any(value == w.tobytes() for w in ws):
            found += 1
            assert start <= loc.offset and loc.offset + loc.length <= start + len(data)
            assert data[loc.offset - start:loc.offset - start + loc.length] == value
    assert found == 2
    assert pool.immutable


def test_float16_weights_do_not_bring_the_file():
    data = (DATA / "face_landmark_with_attention.tflite").read_bytes()  # float16 weights
    model = read_tflite(data).model
    (pool,) = model.pools
    assert pool.size < len(data) or data not in pool.array().tobytes()
