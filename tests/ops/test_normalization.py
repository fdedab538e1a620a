"""L2_NORMALIZATION, LOCAL_RESPONSE_NORMALIZATION and INSTANCE_NORMALIZATION."""

import numpy as np
import pytest

from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.normalization import inv_sqrt_multiplier
from nnhal.ops.resolver import OpError
from nnhal.ops.testing import omitted, output, run_op, tensor

U8, S8 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED
F32, F16 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16


# ---- L2_NORMALIZATION ---------------------------------------------------------------------

def test_l2_norm_last_axis_default():
    (out,) = run_op(O.L2_NORMALIZATION, [tensor(F32, [[3.0, 4.0], [0.0, -2.0]])],
                    [output(F32, [2, 2])])
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, -1.0]], rtol=1e-6)


def test_l2_norm_negative_and_first_axis():
    x = tensor(F32, [[3.0, 1.0], [4.0, 0.0]])
    (a,) = run_op(O.L2_NORMALIZATION, [x, tensor(T.INT32, 0)], [output(F32, [2, 2])])
    (b,) = run_op(O.L2_NORMALIZATION, [x, tensor(T.INT32, -2)], [output(F32, [2, 2])])
    np.testing.assert_allclose(a, [[0.6, 1.0], [0.8, 0.0]], rtol=1e-6)
    np.testing.assert_array_equal(a, b)


def test_l2_norm_zeros_give_zeros():
    (out,) = run_op(O.L2_NORMALIZATION, [tensor(F16, [0.0, 0.0, 0.0])], [output(F16, [3])])
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, [0.0, 0.0, 0.0])


def test_l2_norm_quant_uint8_and_int8():
    # diffs 30 and 40 from the zero point: 0.6 and 0.8, i.e. 76.8 and 102.4 in 1/128 steps.
    (u,) = run_op(O.L2_NORMALIZATION, [tensor(U8, [158, 168, 128], 0.1, 128, shape=(1, 3))],
                  [output(U8, [1, 3], 1 / 128, 128)])
    assert np.all(np.abs(u.astype(int) - [128 + 77, 128 + 102, 128]) <= 1)
    (s,) = run_op(O.L2_NORMALIZATION, [tensor(S8, [30, -40], 0.1, 0)],
                  [output(S8, [2], 1 / 128, 0)])
    assert s.dtype == np.int8
    assert np.all(np.abs(s.astype(int) - [77, -102]) <= 1)


def test_l2_norm_quant_all_zero_is_zero():
    (u,) = run_op(O.L2_NORMALIZATION, [tensor(U8, [7, 7], 0.1, 7)], [output(U8, [2], 1 / 128, 128)])
    np.testing.assert_array_equal(u, [128, 128])


def test_inv_sqrt_multiplier_accuracy():
    sq = np.array([2, 25, 1000, 123456, 2**30 + 5])
    mult, shift = inv_sqrt_multiplier(sq)
    approx = mult.astype(np.float64) / 2**31 / 2.0 ** shift
    np.testing.assert_allclose(approx, 1 / np.sqrt(sq), rtol=3e-6)


@pytest.mark.parametrize(("ins", "out"), [
    ([tensor(U8, [1, 2], 0.1, 0)], output(U8, [2], 1 / 256, 128)),      # wrong output scale
    ([tensor(S8, [1, 2], 0.1, 0)], output(S8, [2], 1 / 128, 128)),      # wrong output zero point
    ([tensor(F32, [1.0, 2.0]), tensor(T.INT32, 1)], output(F32, [2])),  # axis out of range
    ([tensor(F32, np.zeros((1, 1, 1, 1, 2)))], output(F32)),            # rank 5
    ([tensor(T.TENSOR_INT32, [1, 2])], output(T.TENSOR_INT32, [2])),    # unsupported type
])
def test_l2_norm_invalid(ins, out):
    with pytest.raises(OpError):
        run_op(O.L2_NORMALIZATION, ins, [out])


# ---- LOCAL_RESPONSE_NORMALIZATION -----------------------------------------------------------

def lrn_params(radius=1, bias=1.0, alpha=1.0, beta=1.0, t=T.FLOAT32):
    return [tensor(T.INT32, radius), tensor(t, bias), tensor(t, alpha), tensor(t, beta)]


def test_lrn_rank1_window():
    # Window sums of squares: 1+4, 1+4+9, 4+9.
    (out,) = run_op(O.LOCAL_RESPONSE_NORMALIZATION, [tensor(F32, [1.0, 2.0, 3.0]), *lrn_params()],
                    [output(F32, [3])])
    np.testing.assert_allclose(out, [1 / 6, 2 / 15, 3 / 14], rtol=1e-6)


def test_lrn_axis_and_exponent():
    x = tensor(F32, [[1.0, 5.0], [2.0, 5.0], [3.0, 5.0]])
    (out,) = run_op(O.LOCAL_RESPONSE_NORMALIZATION,
                    [x, *lrn_params(radius=0, bias=2.0, alpha=0.5, beta=0.5), tensor(T.INT32, 0)],
                    [output(F32, [3, 2])])
    expected = np.array([[1, 5], [2, 5], [3, 5]]) / np.sqrt(2 + 0.5 * np.array(
        [[1, 25], [4, 25], [9, 25]]))
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_lrn_float16():
    (out,) = run_op(O.LOCAL_RESPONSE_NORMALIZATION,
                    [tensor(F16, [1.0, 2.0, 3.0]), *lrn_params(t=T.FLOAT16)], [output(F16, [3])])
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float32), [1 / 6, 2 / 15, 3 / 14], rtol=2e-3)


@pytest.mark.parametrize("params", [
    lrn_params(radius=-1),
    lrn_params(bias=0.0),
    lrn_params(t=T.FLOAT16),      # scalar type must match a float32 tensor
    lrn_params()[:3],             # too few inputs
])
def test_lrn_invalid(params):
    with pytest.raises(OpError):
        run_op(O.LOCAL_RESPONSE_NORMALIZATION, [tensor(F32, [1.0, 2.0]), *params],
               [output(F32, [2])])


# ---- INSTANCE_NORMALIZATION -----------------------------------------------------------------

def inorm_params(gamma=1.0, beta=0.0, eps=0.0, nchw=False, t=T.FLOAT32):
    return [tensor(t, gamma), tensor(t, beta), tensor(t, eps), tensor(T.BOOL, nchw)]


def test_instance_norm_nhwc():
    x = tensor(F32, [1.0, 2.0, 3.0, 4.0], shape=(1, 2, 2, 1))
    (out,) = run_op(O.INSTANCE_NORMALIZATION, [x, *inorm_params(gamma=2.0, beta=1.0)],
                    [output(F32, [1, 2, 2, 1])])
    expected = (np.array([1, 2, 3, 4]) - 2.5) * 2 / np.sqrt(1.25) + 1
    np.testing.assert_allclose(out.ravel(), expected, rtol=1e-6)


def test_instance_norm_nchw_per_channel():
    vals = np.array([[1.0, 2.0, 3.0, 4.0], [10.0, 10.0, 10.0, 10.0]], np.float32)
    x = tensor(F32, vals.reshape(1, 2, 2, 2))
    (out,) = run_op(O.INSTANCE_NORMALIZATION, [x, *inorm_params(eps=1.0, nchw=True)],
                    [output(F32, [1, 2, 2, 2])])
    np.testing.assert_allclose(out[0, 0].ravel(), (vals[0] - 2.5) / np.sqrt(2.25), rtol=1e-6)
    np.testing.assert_allclose(out[0, 1], 0.0)


def test_instance_norm_float16_and_invalid():
    x = tensor(F16, [1.0, 3.0], shape=(1, 1, 2, 1))
    (out,) = run_op(O.INSTANCE_NORMALIZATION, [x, *inorm_params(t=T.FLOAT16)],
                    [output(F16, [1, 1, 2, 1])])
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.ravel().astype(np.float32), [-1.0, 1.0], atol=1e-3)
    with pytest.raises(OpError):  # rank 3
        run_op(O.INSTANCE_NORMALIZATION, [tensor(F32, np.zeros((1, 2, 2))), *inorm_params()],
               [output(F32)])
    with pytest.raises(OpError):  # layout must be BOOL
        run_op(O.INSTANCE_NORMALIZATION,
               [tensor(F32, np.zeros((1, 2, 2, 1))), *inorm_params()[:3], tensor(T.INT32, 0)],
               [output(F32)])


# ---- signatures: omitted inputs ------------------------------------------------------------

def test_omitted_axis_is_the_last_one():
    x = tensor(F32, [[3.0, 4.0], [0.0, -2.0]])
    (out,) = run_op(O.L2_NORMALIZATION, [x, omitted(T.INT32)], [output(F32, [2, 2])])
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, -1.0]], rtol=1e-6)
    params = [tensor(T.INT32, 1), tensor(T.FLOAT32, 1.0), tensor(T.FLOAT32, 1.0),
              tensor(T.FLOAT32, 0.5)]
    (a,) = run_op(O.LOCAL_RESPONSE_NORMALIZATION, [x, *params, omitted(T.INT32)],
                  [output(F32, [2, 2])])
    (b,) = run_op(O.LOCAL_RESPONSE_NORMALIZATION, [x, *params, tensor(T.INT32, -1)],
                  [output(F32, [2, 2])])
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("op, ins", [
    (O.LOCAL_RESPONSE_NORMALIZATION, [tensor(F32, [1.0, 2.0]), omitted(T.INT32),
                                      tensor(T.FLOAT32, 1.0), tensor(T.FLOAT32, 1.0),
                                      tensor(T.FLOAT32, 0.5)]),
    (O.INSTANCE_NORMALIZATION, [tensor(F32, np.zeros((1, 2, 2, 1))), tensor(T.FLOAT32, 1.0),
                                tensor(T.FLOAT32, 0.0), tensor(T.FLOAT32, 1e-3),
                                omitted(T.BOOL)]),
])
def test_omitted_required_input_is_rejected(op, ins):
    with pytest.raises(OpError, match="cannot be omitted"):
        run_op(op, ins, [output(F32)])
