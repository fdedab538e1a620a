"""Quantized comparisons on the LiteRT driver. The HAL compares real values; TFLite compares
stored values rescaled in fixed point, which ranks them as their real values only for some
scales (below 2/256 neighbours round together, from 1 up the rescale saturates). The export
compares the inputs as they are where that holds, a constant as the stored values that
compare alike, and real values otherwise: every stored value against every other, for every
comparison, must come out as the real values compare. The converter's int8 comparison with a
constant comes back as the three operators of its file (no DEQUANTIZE)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import operator_names

from nnhal.drivers.litert import unavailable
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import Model
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.session import Session
from nnhal.tflite import read_tflite, write_tflite

pytestmark = pytest.mark.skipif(unavailable() is not None,
                                reason=f"LiteRT driver unavailable: {unavailable()}")

DATA = Path(__file__).resolve().parents[1] / "tflite" / "data"
OPS = {O.EQUAL: np.equal, O.NOT_EQUAL: np.not_equal, O.GREATER: np.greater,
       O.GREATER_EQUAL: np.greater_equal, O.LESS: np.less, O.LESS_EQUAL: np.less_equal}
#: Scales on each side of the bounds where TFLite's rescale ranks exactly.
SCALES = [1e-4, 1 / 256, 0.0039, 0.0078125, 0.3, 2.0]


def _real(q: np.ndarray, scale: float, zero: int) -> np.ndarray:
    return (q.astype(np.int32) - zero).astype(np.float32) * np.float32(scale)


def _model(qt: T, scale: float, zero: int, const: np.ndarray,
           const_scale: float, const_zero: int) -> tuple[Model, list[tuple]]:
    """Every comparison of x [256, 1] against: y [1, 256] of x's quantization, z [1, 256] of
    another, the constant [1, C] (on either side); with what each output should be."""
    b = ModelBuilder()
    x = b.input(qt, [256, 1], scale, zero)
    y = b.input(qt, [1, 256], scale, zero)
    z = b.input(qt, [1, 256], const_scale, const_zero)
    c = b.constant(qt, const, [1, len(const)], const_scale, const_zero)
    wants = []
    for op, fn in OPS.items():
        for lhs, rhs, n in ((x, y, 256), (x, z, 256), (x, c, len(const)), (c, x, len(const))):
            shape = [256, n]
            b.operation(op, [lhs, rhs], [b.output(T.TENSOR_BOOL8, shape)])
            wants.append((op, lhs, rhs, fn))
    return b.build(), wants


@pytest.mark.parametrize("qt", [T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_ASYMM])
@pytest.mark.parametrize("scale", SCALES)
def test_quantized_comparisons_compare_real_values(qt: T, scale: float) -> None:
    lo, hi = (-128, 127) if qt == T.TENSOR_QUANT8_ASYMM_SIGNED else (0, 255)
    dtype = np.int8 if lo < 0 else np.uint8
    zero, const_zero = lo + 100, lo + 3
    const_scale = scale * 0.37
    const = np.array([lo, lo + 1, const_zero, lo + 128, lo + 129, hi - 1, hi], dtype)
    model, wants = _model(qt, scale, zero, const, const_scale, const_zero)
    q = np.arange(lo, hi + 1, dtype=dtype)
    feeds = [q.reshape(256, 1), q.reshape(1, 256), q.reshape(1, 256)]
    real = {"x": _real(q, scale, zero).reshape(256, 1),
            "y": _real(q, scale, zero).reshape(1, 256),
            "z": _real(q, const_scale, const_zero).reshape(1, 256),
            "c": _real(const, const_scale, const_zero).reshape(1, -1)}
    s = Session(model, device="litert")
    outs = list(s.run(dict(zip((i.name for i in s.inputs), feeds))).values())
    operand = {0: "x", 1: "y", 2: "z", 3: "c"}
    for (op, lhs, rhs, fn), got in zip(wants, outs):
        a, b = real[operand[lhs]], real[operand[rhs]]
        np.testing.assert_array_equal(got, fn(a, b), err_msg=f"{op.name} {operand[lhs]} "
                                      f"{operand[rhs]} at scale {scale}")


def test_converter_comparison_with_a_constant_comes_back_as_it_was() -> None:
    path = DATA / "select_v2_broadcast_int8.tflite"
    original = operator_names(path.read_bytes())
    again = operator_names(bytes(write_tflite(read_tflite(path))))
    assert "DEQUANTIZE" not in again
    assert sorted(again) == sorted(original)
