"""SOFTMAX (float and fixed-point quantized) and LOG_SOFTMAX."""

import numpy as np
import pytest

from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.fixedpoint import exp_on_negative_values, one_over_one_plus_x
from nnhal.ops.resolver import OpError
from nnhal.ops.testing import omitted, output, run_op, tensor

U8, S8 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED
F32, F16 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16


def ref_softmax(x, beta=1.0, axis=-1):
    z = np.exp((x - x.max(axis=axis, keepdims=True)) * beta)
    return z / z.sum(axis=axis, keepdims=True)


def test_softmax_float_default_axis():
    x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], np.float32)
    (out,) = run_op(O.SOFTMAX, [tensor(F32, x), tensor(T.FLOAT32, 1.0)], [output(F32, [2, 3])])
    np.testing.assert_allclose(out, ref_softmax(x), rtol=1e-6)
    np.testing.assert_allclose(out[1], [1 / 3] * 3, rtol=1e-6)


def test_softmax_float_beta_and_negative_axis():
    x = np.array([[1.0, 2.0], [3.0, 5.0]], np.float32)
    (out,) = run_op(O.SOFTMAX, [tensor(F32, x), tensor(T.FLOAT32, 0.5), tensor(T.INT32, -2)],
                    [output(F32, [2, 2])])
    np.testing.assert_allclose(out, ref_softmax(x, 0.5, axis=0), rtol=1e-6)
    np.testing.assert_allclose(out.sum(axis=0), [1.0, 1.0], rtol=1e-6)


def test_softmax_float16():
    (out,) = run_op(O.SOFTMAX, [tensor(F16, [0.0, 1.0]), tensor(T.FLOAT16, 1.0)],
                    [output(F16, [2])])
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float32), ref_softmax(np.array([0.0, 1.0])),
                               atol=1e-3)


def test_softmax_quant_uniform_and_dominant():
    (u,) = run_op(O.SOFTMAX, [tensor(U8, [[9, 9, 9, 9]], 0.1, 0), tensor(T.FLOAT32, 1.0)],
                  [output(U8, [1, 4], 1 / 256, 0)])
    np.testing.assert_array_equal(u, [[64, 64, 64, 64]])
    (s,) = run_op(O.SOFTMAX, [tensor(S8, [[5, 5, 5, 5]], 0.1, 0), tensor(T.FLOAT32, 1.0)],
                  [output(S8, [1, 4], 1 / 256, -128)])
    np.testing.assert_array_equal(s, [[-64, -64, -64, -64]])
    (d,) = run_op(O.SOFTMAX, [tensor(U8, [0, 255], 1.0, 0), tensor(T.FLOAT32, 1.0)],
                  [output(U8, [2], 1 / 256, 0)])
    np.testing.assert_array_equal(d, [0, 255])  # 1.0 saturates at 255/256


def test_softmax_quant_close_to_float():
    rng = np.random.default_rng(1)
    q = rng.integers(0, 256, size=(3, 4, 5)).astype(np.uint8)
    (out,) = run_op(O.SOFTMAX, [tensor(U8, q, 0.05, 128), tensor(T.FLOAT32, 1.3),
                                tensor(T.INT32, 1)], [output(U8, [3, 4, 5], 1 / 256, 0)])
    expected = ref_softmax((q.astype(np.float64) - 128) * 0.05, 1.3, axis=1) * 256
    assert np.max(np.abs(out - np.clip(np.round(expected), 0, 255))) <= 1


def test_fixed_point_helpers():
    # exp on Q5.26 values and 1/(1+x) on Q0.31 values, against float references.
    a = np.array([0, -(1 << 24), -(1 << 26), -(5 << 26)], np.int64)
    got = exp_on_negative_values(a, 5) / 2**31
    np.testing.assert_allclose(got, np.exp(a / 2**26), atol=1e-6)
    x = np.array([0, 1 << 30, (1 << 31) - 1], np.int64)
    np.testing.assert_allclose(one_over_one_plus_x(x) / 2**31, 1 / (1 + x / 2**31), atol=2e-9)


def test_softmax_zero_sized():
    (out,) = run_op(O.SOFTMAX, [tensor(F32, np.zeros((0, 3), np.float32)),
                                tensor(T.FLOAT32, 1.0)], [output(F32, [0, 3])])
    assert out.shape == (0, 3) and out.dtype == np.float32


@pytest.mark.parametrize(("ins", "out"), [
    ([tensor(F32, [1.0]), tensor(T.FLOAT32, 0.0)], output(F32, [1])),                # beta 0
    ([tensor(F32, [1.0]), tensor(T.FLOAT16, 1.0)], output(F32, [1])),                # beta type
    ([tensor(F32, [1.0]), tensor(T.FLOAT32, 1.0), tensor(T.INT32, 1)], output(F32, [1])),
    ([tensor(F32, np.zeros((1, 1, 1, 1, 2))), tensor(T.FLOAT32, 1.0)], output(F32)),  # rank 5
    ([tensor(U8, [1, 2], 0.1, 0), tensor(T.FLOAT32, 1.0)], output(U8, [2], 1 / 128, 0)),
    ([tensor(S8, [1, 2], 0.1, 0), tensor(T.FLOAT32, 1.0)], output(S8, [2], 1 / 256, 0)),
])
def test_softmax_invalid(ins, out):
    with pytest.raises(OpError):
        run_op(O.SOFTMAX, ins, [out])


def test_log_softmax():
    x = np.array([[1.0, 2.0, 3.0], [-1.0, 0.0, 4.0]], np.float32)
    (out,) = run_op(O.LOG_SOFTMAX, [tensor(F32, x), tensor(T.FLOAT32, 2.0), tensor(T.INT32, -1)],
                    [output(F32, [2, 3])])
    np.testing.assert_allclose(out, np.log(ref_softmax(x.astype(np.float64), 2.0)), rtol=1e-6)
    (col,) = run_op(O.LOG_SOFTMAX, [tensor(F16, x), tensor(T.FLOAT16, 1.0), tensor(T.INT32, 0)],
                    [output(F16, [2, 3])])
    assert col.dtype == np.float16
    np.testing.assert_allclose(col.astype(np.float32), np.log(ref_softmax(x, axis=0)), atol=2e-3)


def test_log_softmax_invalid():
    with pytest.raises(OpError):  # no quantized variant
        run_op(O.LOG_SOFTMAX, [tensor(U8, [1, 2], 0.1, 0), tensor(T.FLOAT32, 1.0),
                               tensor(T.INT32, 0)], [output(U8, [2], 0.1, 0)])
    with pytest.raises(OpError):  # axis is not optional
        run_op(O.LOG_SOFTMAX, [tensor(F32, [1.0, 2.0]), tensor(T.FLOAT32, 1.0)],
               [output(F32, [2])])


def test_omitted_axis():
    """SOFTMAX's axis is optional (omitted: the last one); LOG_SOFTMAX's is required."""
    x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], np.float32)
    (out,) = run_op(O.SOFTMAX, [tensor(F32, x), tensor(T.FLOAT32, 1.0), omitted(T.INT32)],
                    [output(F32, [2, 3])])
    np.testing.assert_allclose(out, ref_softmax(x), rtol=1e-6)
    with pytest.raises(OpError, match="cannot be omitted"):
        run_op(O.LOG_SOFTMAX, [tensor(F32, x), tensor(T.FLOAT32, 1.0), omitted(T.INT32)],
               [output(F32, [2, 3])])
    with pytest.raises(OpError, match="cannot be omitted"):
        run_op(O.SOFTMAX, [tensor(F32, x), omitted(T.FLOAT32)], [output(F32, [2, 3])])
    with pytest.raises(OpError, match=r"input 1 \(beta\) has type FLOAT32"):
        run_op(O.SOFTMAX, [tensor(F16, x), tensor(T.FLOAT32, 1.0)], [output(F16, [2, 3])])
