"""nnhal's TFLite builtins extension (org.nnhal.tflite) on the LiteRT driver, where its
operations run as the TFLite builtins they stand for: what the edge sweep
(tests/drivers/test_litert_edges.py) cannot show, failures, fail cleanly on both drivers."""

from __future__ import annotations

import numpy as np
import pytest

from nnhal.drivers.litert import unavailable
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import OperandType as T
from nnhal.session import Session

pytestmark = pytest.mark.skipif(unavailable() is not None,
                                reason=f"LiteRT driver unavailable: {unavailable()}")


@pytest.mark.parametrize("indices", [[[0, 1], [5, 0]], [[-1, 0], [0, 0]]],
                         ids=["past the end", "negative"])
def test_an_extension_gather_nd_out_of_bounds_fails_cleanly_on_both(indices) -> None:
    """org.nnhal.tflite's GATHER_ND runs on LiteRT as TFLite's builtin, which checks its
    indices as the reference does: an index out of bounds fails the execution on both."""
    from nnhal.errors import ExecutionError
    from nnhal.hal.types import ExtensionNameAndPrefix

    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [4, 3])
    i = b.input(T.TENSOR_INT32, [2, 2])
    b.operation(1 << 16 | 11, [x, i], [b.output(T.TENSOR_FLOAT32, [2])])
    model = b.build()
    model.extension_name_to_prefix = [ExtensionNameAndPrefix("org.nnhal.tflite", 1)]
    xs = np.arange(12, dtype=np.float32).reshape(4, 3)
    for device in ("litert", "reference"):
        with Session(model, device=device) as s:
            got = list(s.run([xs, np.array([[0, 1], [3, 2]], np.int32)]).values())[0]
            np.testing.assert_array_equal(got, [1.0, 11.0])
            with pytest.raises(ExecutionError):
                s.run([xs, np.array(indices, np.int32)])
