"""ADD, SUB, MUL, DIV: broadcasting, activations, quantized requantisation, int32 semantics."""

import numpy as np
import pytest

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops.common import (
    multiply_by_quantized_multiplier,
    quant_activation_range,
    quantize_multiplier,
    rounding_divide_by_pot,
    srdhm,
)
from nnhal.ops.resolver import OpError
from nnhal.ops.testing import output, run_op, tensor

T = OperandType
O = OperationType


def test_float_broadcast_and_relu6():
    a = tensor(T.TENSOR_FLOAT32, [[1.0, -2.0, 7.0]])            # [1, 3]
    b = tensor(T.TENSOR_FLOAT32, [[1.0], [2.0]])                # [2, 1]
    (out,) = run_op(O.ADD, [a, b, tensor(T.INT32, 3)], [output(T.TENSOR_FLOAT32)])
    assert out.shape == (2, 3)
    np.testing.assert_array_equal(out, [[2.0, 0.0, 6.0], [3.0, 0.0, 6.0]])


def test_zero_sized_broadcast():
    a = tensor(T.TENSOR_FLOAT32, np.zeros((0, 3), np.float32))
    b = tensor(T.TENSOR_FLOAT32, [1.0, 2.0, 3.0])
    (out,) = run_op(O.MUL, [a, b, tensor(T.INT32, 0)], [output(T.TENSOR_FLOAT32)])
    assert out.shape == (0, 3)


def test_incompatible_shapes_rejected():
    a = tensor(T.TENSOR_FLOAT32, [1.0, 2.0, 3.0])
    b = tensor(T.TENSOR_FLOAT32, [1.0, 2.0])
    with pytest.raises(OpError):
        run_op(O.ADD, [a, b, tensor(T.INT32, 0)], [output(T.TENSOR_FLOAT32)])


def test_float16_stays_float16():
    a = tensor(T.TENSOR_FLOAT16, [1.5, 2.25])
    (out,) = run_op(O.SUB, [a, a, tensor(T.INT32, 0)], [output(T.TENSOR_FLOAT16)])
    assert out.dtype == np.float16 and out.tolist() == [0.0, 0.0]


def test_int32_div_floors_and_zero_divisor_gives_zero():
    a = tensor(T.TENSOR_INT32, [7, -7, 5, 3])
    b = tensor(T.TENSOR_INT32, [2, 2, 0, -2])
    (out,) = run_op(O.DIV, [a, b, tensor(T.INT32, 0)], [output(T.TENSOR_INT32)])
    assert out.tolist() == [3, -4, 0, -2]


def test_int32_rejects_fused_activation():
    a = tensor(T.TENSOR_INT32, [1])
    with pytest.raises(OpError):
        run_op(O.ADD, [a, a, tensor(T.INT32, 1)], [output(T.TENSOR_INT32)])


def test_quant8_add_saturates_and_requantises():
    a = tensor(T.TENSOR_QUANT8_ASYMM, [0, 100, 255], 1.0, 0)
    b = tensor(T.TENSOR_QUANT8_ASYMM, [0, 100, 255], 1.0, 0)
    (out,) = run_op(O.ADD, [a, b, tensor(T.INT32, 0)],
                    [output(T.TENSOR_QUANT8_ASYMM, None, 1.0, 0)])
    assert out.tolist() == [0, 200, 255]   # 510 saturates at 255


def test_quant8_signed_sub_and_relu():
    a = tensor(T.TENSOR_QUANT8_ASYMM_SIGNED, [-128, 0, 10], 0.5, -128)   # 0, 64, 69
    b = tensor(T.TENSOR_QUANT8_ASYMM_SIGNED, [0, -128, -128], 0.5, -128)  # 64, 0, 0
    (out,) = run_op(O.SUB, [a, b, tensor(T.INT32, 1)],
                    [output(T.TENSOR_QUANT8_ASYMM_SIGNED, None, 1.0, 0)])
    assert out.tolist() == [0, 64, 69]   # ReLU clamps -64 to 0


def test_quant8_mul_rounds_half_away():
    a = tensor(T.TENSOR_QUANT8_ASYMM, [3, 5], 0.5, 0)   # 1.5, 2.5
    b = tensor(T.TENSOR_QUANT8_ASYMM, [1, 1], 1.0, 0)   # 1, 1
    (out,) = run_op(O.MUL, [a, b, tensor(T.INT32, 0)],
                    [output(T.TENSOR_QUANT8_ASYMM, None, 1.0, 0)])
    assert out.tolist() == [2, 3]


def test_fixed_point_primitives():
    assert quantize_multiplier(0.5) == (1 << 30, 0)
    m, s = quantize_multiplier(0.75)
    assert multiply_by_quantized_multiplier(np.array([100]), m, s).tolist() == [75]
    # The doubling high multiply's negative nudge is 1 - 2**30, so a negative tie goes toward
    # zero (-1.5 -> -1) ...
    assert multiply_by_quantized_multiplier(np.array([-3]), *quantize_multiplier(0.5)).tolist() \
        == [-1]
    # ... while the rounding shift that follows rounds ties away from zero (-1.5 -> -2).
    assert quantize_multiplier(0.25) == (1 << 30, -1)
    assert multiply_by_quantized_multiplier(np.array([-3]), *quantize_multiplier(0.25)).tolist() \
        == [-1]
    assert multiply_by_quantized_multiplier(np.array([-6]), *quantize_multiplier(0.25)).tolist() \
        == [-2]
    assert srdhm(np.array([-(2**31)]), -(2**31)).tolist() == [2**31 - 1]   # the saturating case
    assert rounding_divide_by_pot(np.array([5, -5, 6, -6]), 1).tolist() == [3, -3, 3, -3]


def test_activation_range_rounds_like_upstream():
    # RELU1 with scale 0.4 around 128: +-2.5 steps round away from zero.
    assert quant_activation_range(2, 0.4, 128, T.TENSOR_QUANT8_ASYMM) == (125, 131)
    assert quant_activation_range(1, 1.0, -128, T.TENSOR_QUANT8_ASYMM_SIGNED) == (-128, 127)
