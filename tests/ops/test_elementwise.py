"""ABS, EXP, LOG, NEG, RSQRT, SIN, SQRT, FLOOR, POW, MAXIMUM, MINIMUM."""

import numpy as np
import pytest

from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.resolver import OpError
from nnhal.ops.testing import omitted, output, run_op, tensor

F32, F16, I32 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32
U8, S8 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED


@pytest.mark.parametrize(("op", "x", "expected"), [
    (O.ABS, [-2.5, 0.0, 3.0], [2.5, 0.0, 3.0]),
    (O.EXP, [0.0, 1.0, -1.0], [1.0, 2.7182817, 0.36787945]),
    (O.LOG, [1.0, 2.7182817, 0.5], [0.0, 1.0, -0.6931472]),
    (O.NEG, [-2.5, 0.0, 3.0], [2.5, 0.0, -3.0]),
    (O.RSQRT, [4.0, 0.25, 1.0], [0.5, 2.0, 1.0]),
    (O.SIN, [0.0, np.pi / 2, -np.pi / 6], [0.0, 1.0, -0.5]),
    (O.SQRT, [4.0, 0.25, 2.0], [2.0, 0.5, 1.4142135]),
    (O.FLOOR, [-1.5, 0.5, 2.0], [-2.0, 0.0, 2.0]),
])
def test_unary_float(op, x, expected):
    (out,) = run_op(op, [tensor(F32, x)], [output(F32, [3])])
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


def test_unary_float16_keeps_type():
    (out,) = run_op(O.SQRT, [tensor(F16, [[4.0, 9.0]])], [output(F16, [1, 2])])
    assert out.dtype == np.float16 and out.shape == (1, 2)
    np.testing.assert_array_equal(out, np.array([[2.0, 3.0]], np.float16))


def test_abs_and_neg_int32():
    (a,) = run_op(O.ABS, [tensor(I32, [-7, 0, 5])], [output(I32, [3])])
    np.testing.assert_array_equal(a, [7, 0, 5])
    assert a.dtype == np.int32
    (n,) = run_op(O.NEG, [tensor(I32, [-7, 0, 5])], [output(I32, [3])])
    np.testing.assert_array_equal(n, [7, 0, -5])


def test_exp_rejects_int32():
    with pytest.raises(OpError):
        run_op(O.EXP, [tensor(I32, [1])], [output(I32, [1])])


def test_floor_rank_limit():
    with pytest.raises(OpError):
        run_op(O.FLOOR, [tensor(F32, np.zeros((1, 1, 1, 1, 1)))], [output(F32, [1] * 5)])


def test_unary_output_type_must_match():
    with pytest.raises(OpError):
        run_op(O.SIN, [tensor(F32, [1.0])], [output(F16, [1])])


def test_unary_zero_sized():
    (out,) = run_op(O.EXP, [tensor(F32, np.zeros((2, 0)))], [output(F32, [2, 0])])
    assert out.shape == (2, 0)


def test_pow_broadcast():
    base = tensor(F32, [[2.0], [3.0]])         # (2, 1)
    exponent = tensor(F32, [0.0, 1.0, 2.0])    # (3,)
    (out,) = run_op(O.POW, [base, exponent], [output(F32, [2, 3])])
    np.testing.assert_allclose(out, [[1.0, 2.0, 4.0], [1.0, 3.0, 9.0]], rtol=1e-6)


def test_pow_mismatched_types_rejected():
    with pytest.raises(OpError):
        run_op(O.POW, [tensor(F32, [2.0]), tensor(F16, [2.0])], [output(F32, [1])])


def test_maximum_minimum_float_broadcast():
    a = tensor(F32, [[1.0, 5.0], [-3.0, 0.0]])
    b = tensor(F32, [0.5, 2.0])
    (mx,) = run_op(O.MAXIMUM, [a, b], [output(F32, [2, 2])])
    (mn,) = run_op(O.MINIMUM, [a, b], [output(F32, [2, 2])])
    np.testing.assert_array_equal(mx, [[1.0, 5.0], [0.5, 2.0]])
    np.testing.assert_array_equal(mn, [[0.5, 2.0], [-3.0, 0.0]])


def test_maximum_int32():
    (out,) = run_op(O.MAXIMUM, [tensor(I32, [1, -5, 9]), tensor(I32, [3])], [output(I32, [3])])
    np.testing.assert_array_equal(out, [3, 3, 9])
    assert out.dtype == np.int32


def test_maximum_quant_requantises_each_input():
    # a: scale 1, zp 0 -> reals 2, 10; b: scale 0.5, zp 10 -> reals 3, 2.
    # Output scale 2, zp 5: requantised a = 6, 10; b = 6.5 -> 7 (half away), 6.
    a = tensor(U8, [2, 10], 1.0, 0)
    b = tensor(U8, [16, 14], 0.5, 10)
    (mx,) = run_op(O.MAXIMUM, [a, b], [output(U8, [2], 2.0, 5)])
    np.testing.assert_array_equal(mx, [7, 10])
    (mn,) = run_op(O.MINIMUM, [a, b], [output(U8, [2], 2.0, 5)])
    np.testing.assert_array_equal(mn, [6, 6])


def test_minimum_quant_signed_saturates():
    a = tensor(S8, [-128, 127], 1.0, 0)
    b = tensor(S8, [0, 0], 1.0, 0)
    (mn,) = run_op(O.MINIMUM, [a, b], [output(S8, [2], 0.5, 0)])
    np.testing.assert_array_equal(mn, [-128, 0])
    assert mn.dtype == np.int8


def test_binary_not_broadcastable_rejected():
    with pytest.raises(OpError):
        run_op(O.MAXIMUM, [tensor(F32, [1.0, 2.0]), tensor(F32, [1.0, 2.0, 3.0])],
               [output(F32, [3])])


def test_binary_unknown_rank_accepted_by_prepare():
    from nnhal.ops.catalog import check_operation, lookup
    from nnhal.ops.resolver import OpContext, OperandInfo
    ctx = OpContext(O.MINIMUM, [OperandInfo(F32, None), OperandInfo(F32, (2,))],
                    [OperandInfo(F32, None)])
    definition = lookup(O.MINIMUM)
    check_operation(definition, ctx)
    assert definition.prepare(ctx) == [None]


def test_omitted_operand_rejected():
    # No element-wise input may be omitted (before the signatures, ABS accepted one).
    with pytest.raises(OpError, match=r"ABS: input 0 \(input\) cannot be omitted"):
        run_op(O.ABS, [omitted(F32)], [output(F32, [1])])
    with pytest.raises(OpError, match=r"POW: input 1 \(exponent\) cannot be omitted"):
        run_op(O.POW, [tensor(F32, [1.0]), omitted(F32)], [output(F32, [1])])


def test_binary_input_types_must_agree():
    with pytest.raises(OpError, match=r"MAXIMUM: input 1 \(input1\) has type TENSOR_FLOAT16"):
        run_op(O.MAXIMUM, [tensor(F32, [1.0]), tensor(F16, [1.0])], [output(F32, [1])])
    with pytest.raises(OpError, match=r"ABS: input 0 \(input\) has type TENSOR_QUANT8_ASYMM"):
        run_op(O.ABS, [tensor(U8, [1], 1.0, 0)], [output(U8, [1], 1.0, 0)])


# ---- quantized RSQRT (feature level 7) --------------------------------------------------------

@pytest.mark.parametrize(("x", "in_q", "out_q", "expected"), [
    ([1, 4, 16, 64], (0.25, 0), (0.25, 0), [8, 4, 2, 1]),
    ([16, 64], (0.25, 0), (0.01, 75), [125, 100]),
    ([12, 18, 42], (0.125, 10), (0.25, 0), [8, 4, 2]),
])
def test_rsqrt_quant8_values(x, in_q, out_q, expected):
    for t, shift in ((U8, 0), (S8, -128)):
        data = (np.array(x) + shift).astype(t.dtype)
        (got,) = run_op(O.RSQRT, [tensor(t, data, in_q[0], in_q[1] + shift)],
                        [output(t, [len(x)], out_q[0], out_q[1] + shift)])
        assert got.dtype == t.dtype
        np.testing.assert_array_equal(got.astype(int) - shift, expected)


def test_rsqrt_quant8_zero_and_negative_inputs_saturate_high():
    # 1 / sqrt(0) is infinity and 1 / sqrt(-x) NaN: both end at the largest stored value.
    (got,) = run_op(O.RSQRT, [tensor(S8, np.array([-128, -1, 0], np.int8), 0.5, 0)],
                    [output(S8, [3], 0.5, 0)])
    np.testing.assert_array_equal(got, [127, 127, 127])
    (got,) = run_op(O.RSQRT, [tensor(U8, np.array([0, 9, 10], np.uint8), 1.0, 10)],
                    [output(U8, [3], 1.0, 3)])
    np.testing.assert_array_equal(got, [255, 255, 255])


def test_rsqrt_quant8_rounds_half_away_and_saturates_low():
    # real 4 -> 0.5 -> 0.5 / 1.0 is a tie: rounds to 1 (away from zero), not 0 (to even)
    (got,) = run_op(O.RSQRT, [tensor(U8, np.array([4, 16], np.uint8), 1.0, 0)],
                    [output(U8, [2], 1.0, 0)])
    np.testing.assert_array_equal(got, [1, 0])
    # a large zero point pushes the result past the signed range's bottom
    (got,) = run_op(O.RSQRT, [tensor(S8, np.array([1], np.int8), 1.0, 0)],
                    [output(S8, [1], 0.001, -128)])
    np.testing.assert_array_equal(got, [127])  # 1000 steps above -128: saturated high
    (got,) = run_op(O.RSQRT, [tensor(S8, np.array([127], np.int8), 100.0, 0)],
                    [output(S8, [1], 1.0, -128)])
    np.testing.assert_array_equal(got, [-128])


def test_rsqrt_quant8_zero_sized_and_bad_scale():
    (got,) = run_op(O.RSQRT, [tensor(U8, np.zeros((0, 2), np.uint8), 0.5, 0)],
                    [output(U8, [0, 2], 0.5, 0)])
    assert got.shape == (0, 2)
    with pytest.raises(OpError, match="scale"):
        run_op(O.RSQRT, [tensor(U8, np.array([1], np.uint8), 0.5, 0)],
               [output(U8, [1], 0.0, 0)])


def test_rsqrt_feature_levels():
    from nnhal.core.version import FeatureLevel
    from nnhal.ops.catalog import check_operation, lookup
    from nnhal.ops.resolver import OpContext

    def level(inputs, outputs):
        return check_operation(lookup(O.RSQRT), OpContext(O.RSQRT, [i for i, _ in inputs],
                                                          list(outputs)))

    assert level([tensor(F32, [1.0])], [output(F32, [1])]) == FeatureLevel.V1_2
    for t in (U8, S8):
        assert level([tensor(t, np.array([1], t.dtype), 0.5, 0)],
                     [output(t, [1], 0.5, 0)]) == FeatureLevel.AIDL_V3
    with pytest.raises(OpError):  # quant16 was never added
        level([tensor(T.TENSOR_QUANT16_SYMM, np.array([1], np.int16), 0.5, 0)],
              [output(T.TENSOR_QUANT16_SYMM, [1], 0.5, 0)])
