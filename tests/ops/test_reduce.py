"""MEAN, REDUCE_ALL/ANY/MAX/MIN/PROD/SUM, ARGMAX, ARGMIN."""

import numpy as np
import pytest

from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.catalog import lookup
from nnhal.ops.resolver import OpContext, OpError
from nnhal.ops.testing import omitted, output, run_op, tensor

F32, F16, I32, B8 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32, T.TENSOR_BOOL8
U8, S8 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED


def i32(v):
    return tensor(T.INT32, v)


def vec(values, const=True):
    return tensor(I32, values, shape=(len(values),), const=const)


def reduce(op, t, x, axes, keep, out=None, scale=0.0, zp=0):
    keep_arg = i32(int(keep)) if op == O.MEAN else tensor(T.BOOL, keep)
    (y,) = run_op(op, [tensor(t, x, scale, zp), vec(axes), keep_arg],
                  [output(t, out, scale, zp)])
    return y


# ---- MEAN -------------------------------------------------------------------------------------

def test_mean_float_repeated_negative_axes():
    x = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
    y = reduce(O.MEAN, F32, x, [1, 0, -3, -3], False, [2])
    np.testing.assert_allclose(y, x.mean(axis=(0, 1)))
    k = reduce(O.MEAN, F32, x, [0, 2], True, [1, 3, 1])
    np.testing.assert_allclose(k, x.mean(axis=(0, 2), keepdims=True))


def test_mean_all_axes_gives_shape_one_and_float16():
    y = reduce(O.MEAN, F16, np.array([[1, 2], [3, 5]], np.float16), [0, 1], False, [1])
    assert y.dtype == np.float16 and y.shape == (1,)
    assert float(y[0]) == pytest.approx(2.75)


def test_mean_quant_truncates_raw_sum():
    # Raw sums: 1 + 2 = 3 -> 3 // 2 = 1; 4 + 6 = 10 -> 5. Scale/zero point are unchanged.
    y = reduce(O.MEAN, U8, np.array([[1, 2], [4, 6]], np.uint8), [1], False, [2], 0.5, 3)
    np.testing.assert_array_equal(y, [1, 5])
    # Signed: -3 / 2 truncates toward zero like C++ integer division.
    s = reduce(O.MEAN, S8, np.array([[-1, -2]], np.int8), [1], True, [1, 1], 0.5, -1)
    np.testing.assert_array_equal(s, [[-1]])


def test_mean_rejects_bad_axis_and_quant_mismatch():
    with pytest.raises(OpError):
        reduce(O.MEAN, F32, np.zeros((2, 2), np.float32), [2], False)
    with pytest.raises(OpError):
        run_op(O.MEAN, [tensor(U8, [[1]], 0.5, 0), vec([0]), i32(0)],
               [output(U8, [1], 0.25, 0)])
    with pytest.raises(OpError):  # keep_dims of MEAN is INT32, not BOOL
        run_op(O.MEAN, [tensor(F32, [[1.0]]), vec([0]), tensor(T.BOOL, False)],
               [output(F32, [1])])


# ---- REDUCE_* ---------------------------------------------------------------------------------

def test_reduce_sum_prod_max_min():
    x = np.array([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]], np.float32)
    np.testing.assert_allclose(reduce(O.REDUCE_SUM, F32, x, [1], False, [2]), [2.0, 3.0])
    np.testing.assert_allclose(reduce(O.REDUCE_PROD, F32, x, [0], True, [1, 3]),
                               [[4.0, -10.0, -18.0]])
    np.testing.assert_array_equal(reduce(O.REDUCE_MAX, F32, x, [-1], False, [2]), [3.0, 5.0])
    np.testing.assert_array_equal(reduce(O.REDUCE_MIN, F32, x, [0, 1], False, [1]), [-6.0])


def test_reduce_max_quant_and_float16():
    q = reduce(O.REDUCE_MAX, S8, np.array([[-100, 7], [3, -128]], np.int8), [0], False, [2],
               0.5, -1)
    assert q.dtype == np.int8
    np.testing.assert_array_equal(q, [3, 7])
    h = reduce(O.REDUCE_SUM, F16, np.array([1.5, 2.25], np.float16), [0], True, [1])
    assert h.dtype == np.float16 and float(h[0]) == 3.75


def test_reduce_empty_range_uses_initial_values():
    x = np.zeros((2, 0), np.float16)
    m = reduce(O.REDUCE_MAX, F16, x, [1], False, [2])
    np.testing.assert_array_equal(m, [-65504.0, -65504.0])
    s = reduce(O.REDUCE_SUM, F16, x, [1], False, [2])
    np.testing.assert_array_equal(s, [0.0, 0.0])


def test_reduce_all_any():
    x = np.array([[True, False], [True, True]])
    np.testing.assert_array_equal(reduce(O.REDUCE_ALL, B8, x, [1], False, [2]), [False, True])
    np.testing.assert_array_equal(reduce(O.REDUCE_ANY, B8, x, [0], True, [1, 2]),
                                  [[True, True]])


def test_reduce_type_restrictions():
    with pytest.raises(OpError):  # REDUCE_SUM has no quantized variant
        reduce(O.REDUCE_SUM, U8, np.array([1], np.uint8), [0], False, [1], 1.0, 0)
    with pytest.raises(OpError):
        reduce(O.REDUCE_ALL, F32, np.array([1.0], np.float32), [0], False, [1])
    with pytest.raises(OpError):  # rank above 4
        reduce(O.REDUCE_MAX, F32, np.zeros((1,) * 5, np.float32), [0], False)


def test_reduce_prepare_uses_constant_axes():
    inputs = [tensor(F32, np.zeros((2, 3, 4), np.float32)), vec([-1, 0]),
              tensor(T.BOOL, False)]
    ctx = OpContext(op_type=O.REDUCE_SUM, inputs=[i for i, _ in inputs],
                    outputs=[output(F32)])
    lookup(O.REDUCE_SUM).validate(ctx)
    assert lookup(O.REDUCE_SUM).prepare(ctx) == [(3,)]


# ---- ARGMAX / ARGMIN --------------------------------------------------------------------------

def test_argmax_argmin_first_occurrence():
    x = np.array([[1, 9, 9], [4, 0, 0]], np.int32)
    (a,) = run_op(O.ARGMAX, [tensor(I32, x), i32(1)], [output(I32, [2])])
    np.testing.assert_array_equal(a, [1, 0])
    (b,) = run_op(O.ARGMIN, [tensor(I32, x), i32(-1)], [output(I32, [2])])
    np.testing.assert_array_equal(b, [0, 1])
    (c,) = run_op(O.ARGMAX, [tensor(U8, [3, 200, 5], 0.5, 1), i32(0)], [output(I32, [1])])
    assert c.shape == (1,) and c[0] == 1 and c.dtype == np.int32


def test_argmax_invalid():
    with pytest.raises(OpError):
        run_op(O.ARGMAX, [tensor(F32, [1.0, 2.0]), i32(1)], [output(I32, [1])])
    with pytest.raises(OpError):  # output must be TENSOR_INT32
        run_op(O.ARGMIN, [tensor(F32, [1.0, 2.0]), i32(0)], [output(F32, [1])])
    with pytest.raises(OpError):  # the reduced dimension must be non-empty
        run_op(O.ARGMAX, [tensor(F32, np.zeros((2, 0), np.float32)), i32(1)],
               [output(I32, [2])])


# ---- signatures -------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2])
def test_omitted_axes_or_keep_dims_are_rejected(k):
    ins = [tensor(F32, np.zeros((2, 2), np.float32)), vec([0]), tensor(T.BOOL, False)]
    ins[k] = omitted(ins[k][0].type)
    with pytest.raises(OpError, match="cannot be omitted"):
        run_op(O.REDUCE_MAX, ins, [output(F32)])
    with pytest.raises(OpError, match="cannot be omitted"):
        run_op(O.ARGMAX, [tensor(F32, [1.0, 2.0]), omitted(T.INT32)], [output(I32)])


def test_reduce_signature_types():
    # REDUCE_MAX takes a signed quantized tensor (1.3); REDUCE_ALL only BOOL8.
    y = reduce(O.REDUCE_MAX, S8, np.array([[-1, 5]], np.int8), [1], False, [1], 0.5, 0)
    np.testing.assert_array_equal(y, [5])
    with pytest.raises(OpError, match=r"input 0 \(input\) has type TENSOR_FLOAT32"):
        reduce(O.REDUCE_ALL, F32, np.zeros((2,), np.float32), [0], False)
