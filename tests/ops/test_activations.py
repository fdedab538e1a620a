"""RELU*, LOGISTIC, TANH, ELU, HARD_SWISH and PRELU against hand-computed values."""

import numpy as np
import pytest

from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.resolver import OpError
from nnhal.ops.testing import omitted, output, run_op, tensor

U8, S8 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED
F32, F16 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16


@pytest.mark.parametrize(("op", "expected"), [
    (O.RELU, [0.0, 0.0, 0.5, 7.0]),
    (O.RELU1, [-1.0, -0.5, 0.5, 1.0]),
    (O.RELU6, [0.0, 0.0, 0.5, 6.0]),
])
def test_relu_float(op, expected):
    (out,) = run_op(op, [tensor(F32, [-3.0, -0.5, 0.5, 7.0])], [output(F32, [4])])
    np.testing.assert_array_equal(out, np.array(expected, np.float32))
    assert out.dtype == np.float32


def test_relu6_float16_keeps_type():
    (out,) = run_op(O.RELU6, [tensor(F16, [[-1.0, 3.5, 9.0]])], [output(F16, [1, 3])])
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, np.array([[0.0, 3.5, 6.0]], np.float16))


def test_relu_quant_clamps_at_zero_point():
    # scale 0.5, zero point 100: real 0 is 100, real 1 is 102, real 6 is 112.
    vals = [0, 99, 100, 101, 110, 200]
    (r,) = run_op(O.RELU, [tensor(U8, vals, 0.5, 100)], [output(U8, [6], 0.5, 100)])
    np.testing.assert_array_equal(r, [100, 100, 100, 101, 110, 200])
    (r1,) = run_op(O.RELU1, [tensor(U8, vals, 0.5, 100)], [output(U8, [6], 0.5, 100)])
    np.testing.assert_array_equal(r1, [98, 99, 100, 101, 102, 102])
    (r6,) = run_op(O.RELU6, [tensor(S8, [-128, 0, 20], 0.5, 0)], [output(S8, [3], 0.5, 0)])
    np.testing.assert_array_equal(r6, [0, 0, 12])


def test_relu1_rounds_half_away_from_zero():
    # 1 / 0.4 is 2.5 in float32, which std::round takes to 3 (banker's rounding gives 2).
    (r,) = run_op(O.RELU1, [tensor(U8, [0, 150], 0.4, 128)], [output(U8, [2], 0.4, 128)])
    np.testing.assert_array_equal(r, [125, 131])


def test_relu_rejects_requantising_output():
    with pytest.raises(OpError):
        run_op(O.RELU, [tensor(U8, [1], 0.5, 0)], [output(U8, [1], 0.25, 0)])


def test_relu_zero_sized():
    (out,) = run_op(O.RELU, [tensor(F32, np.zeros((0, 3)))], [output(F32, [0, 3])])
    assert out.shape == (0, 3)


def test_relu_rank_above_four_rejected():
    with pytest.raises(OpError):
        run_op(O.RELU, [tensor(F32, np.zeros((1, 1, 1, 1, 2)))], [output(F32, [1, 1, 1, 1, 2])])


def test_logistic_float():
    (out,) = run_op(O.LOGISTIC, [tensor(F32, [0.0, 2.0, -2.0])], [output(F32, [3])])
    np.testing.assert_allclose(out, [0.5, 0.880797, 0.119203], rtol=1e-5)


def test_logistic_quant8():
    # Input scale 0.5: reals 0, 0.5, 1, 63.5; output is sigmoid * 256, saturated at 255.
    (out,) = run_op(O.LOGISTIC, [tensor(U8, [0, 1, 2, 127], 0.5, 0)],
                    [output(U8, [4], 1 / 256, 0)])
    np.testing.assert_array_equal(out, [128, 159, 187, 255])


def test_logistic_quant8_signed():
    (out,) = run_op(O.LOGISTIC, [tensor(S8, [-128, 0, 2], 0.5, 0)],
                    [output(S8, [3], 1 / 256, -128)])
    np.testing.assert_array_equal(out, [-128, 0, 59])


def test_logistic_quant_output_params_enforced():
    with pytest.raises(OpError):
        run_op(O.LOGISTIC, [tensor(U8, [0], 0.5, 0)], [output(U8, [1], 1 / 128, 0)])


def test_tanh_quant8():
    # Input scale 0.05, zero point 128: reals 0, 1, -1, 6.35. tanh(1) * 128 = 97.5 -> 97.
    (out,) = run_op(O.TANH, [tensor(U8, [128, 148, 108, 255], 0.05, 128)],
                    [output(U8, [4], 1 / 128, 128)])
    np.testing.assert_array_equal(out, [128, 225, 31, 255])
    (s,) = run_op(O.TANH, [tensor(S8, [0, 20, -20], 0.05, 0)], [output(S8, [3], 1 / 128, 0)])
    np.testing.assert_array_equal(s, [0, 97, -97])


def test_tanh_quant_output_params_enforced():
    with pytest.raises(OpError):
        run_op(O.TANH, [tensor(S8, [0], 0.05, 0)], [output(S8, [1], 1 / 128, 128)])


def test_tanh_float16():
    (out,) = run_op(O.TANH, [tensor(F16, [0.0, 1.0])], [output(F16, [2])])
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float32), [0.0, 0.7616], atol=1e-3)


def test_elu():
    (out,) = run_op(O.ELU, [tensor(F32, [-1.0, 0.0, 2.0]), tensor(T.FLOAT32, 2.0)],
                    [output(F32, [3])])
    np.testing.assert_allclose(out, [2.0 * (np.exp(-1.0) - 1.0), 0.0, 2.0], rtol=1e-6)


def test_elu_alpha_type_must_match():
    with pytest.raises(OpError):
        run_op(O.ELU, [tensor(F16, [1.0]), tensor(T.FLOAT32, 1.0)], [output(F16, [1])])


def test_hard_swish_float():
    (out,) = run_op(O.HARD_SWISH, [tensor(F32, [-4.0, -1.0, 0.0, 1.0, 4.0])],
                    [output(F32, [5])])
    np.testing.assert_allclose(out, [0.0, -1.0 / 3.0, 0.0, 2.0 / 3.0, 4.0], rtol=1e-6)


def test_hard_swish_quant_within_one_step():
    # scale 0.1, zero point 128 on both sides: reals -5, -1, 0, 1, 5.
    (out,) = run_op(O.HARD_SWISH, [tensor(U8, [78, 118, 128, 138, 178], 0.1, 128)],
                    [output(U8, [5], 0.1, 128)])
    expected = np.array([128, 125, 128, 135, 178])
    assert np.abs(out.astype(int) - expected).max() <= 1
    assert out[0] == 128 and out[2] == 128


def test_hard_swish_quant_other_output_scale_signed():
    (out,) = run_op(O.HARD_SWISH, [tensor(S8, [0, 40, 127], 0.1, 0)],
                    [output(S8, [3], 0.05, -20)])
    # Reals 0, 4, 12.7 -> 0, 4, 12.7 on scale 0.05 with zero point -20: -20, 60, saturated.
    assert np.abs(out.astype(int) - np.array([-20, 60, 127])).max() <= 1


def test_hard_swish_any_rank():
    (out,) = run_op(O.HARD_SWISH, [tensor(F32, np.ones((1, 1, 1, 1, 2)))],
                    [output(F32, [1, 1, 1, 1, 2])])
    np.testing.assert_allclose(out, np.full((1, 1, 1, 1, 2), 4.0 / 6.0), rtol=1e-6)


def test_prelu_float_broadcast():
    x = np.array([[[-1.0, 2.0], [-3.0, 4.0]]], np.float32)  # (1, 2, 2)
    alpha = np.array([0.5, 0.25], np.float32)                # broadcast over the last axis
    (out,) = run_op(O.PRELU, [tensor(F32, x), tensor(F32, alpha)], [output(F32, [1, 2, 2])])
    np.testing.assert_array_equal(out, [[[-0.5, 2.0], [-1.5, 4.0]]])


def test_prelu_quant():
    # Input scale 0.5 zp 128; alpha scale 0.25 zp 50 (reals 0.5, 1.0 for 52, 54);
    # output scale 0.25 zp 120.
    x = tensor(U8, [120, 136, 124, 130], 0.5, 128, shape=[2, 2])  # reals -4, 4, -2, 1
    alpha = tensor(U8, [52, 54], 0.25, 50)
    (out,) = run_op(O.PRELU, [x, alpha], [output(U8, [2, 2], 0.25, 120)])
    # -4 * 0.5 = -2 -> 112; 4 -> 136; -2 * 0.5 = -1 -> 116; 1 -> 124.
    np.testing.assert_array_equal(out, [[112, 136], [116, 124]])


def test_prelu_incompatible_shapes_rejected():
    with pytest.raises(OpError):
        run_op(O.PRELU, [tensor(F32, np.zeros((2, 3))), tensor(F32, np.zeros((2,)))],
               [output(F32, [2, 3])])


def test_activation_wrong_counts_and_types_rejected():
    with pytest.raises(OpError):
        run_op(O.LOGISTIC, [tensor(F32, [1.0]), tensor(F32, [1.0])], [output(F32, [1])])
    with pytest.raises(OpError):
        run_op(O.RELU, [tensor(T.TENSOR_INT32, [1])], [output(T.TENSOR_INT32, [1])])
    with pytest.raises(OpError):
        run_op(O.RELU, [tensor(F32, [1.0])], [output(F16, [1])])


def test_declared_output_shape_mismatch_rejected():
    with pytest.raises(OpError):
        run_op(O.TANH, [tensor(F32, [1.0, 2.0])], [output(F32, [3])])


@pytest.mark.parametrize(("op", "ins"), [
    (O.RELU, [omitted(F32)]),
    (O.ELU, [tensor(F32, [1.0]), omitted(T.FLOAT32)]),
    (O.PRELU, [tensor(F32, [1.0]), omitted(F32)]),
])
def test_omitted_input_rejected(op, ins):
    with pytest.raises(OpError, match="cannot be omitted"):
        run_op(op, ins, [output(F32)])


def test_signature_scalar_type_follows_tensor_type():
    (out,) = run_op(O.ELU, [tensor(F16, [-1.0, 1.0]), tensor(T.FLOAT16, 1.0)],
                    [output(F16, [2])])
    assert out.dtype == np.float16
    with pytest.raises(OpError, match=r"input 1 \(alpha\) has type FLOAT32"):
        run_op(O.ELU, [tensor(F16, [-1.0, 1.0]), tensor(T.FLOAT32, 1.0)], [output(F16, [2])])
