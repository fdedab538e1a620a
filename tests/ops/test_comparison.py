"""Comparisons, LOGICAL_AND/OR/NOT and SELECT."""

import numpy as np
import pytest

from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.resolver import OpError
from nnhal.ops.testing import omitted, output, run_op, tensor

F32, F16, I32, B8 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32, T.TENSOR_BOOL8
U8, S8 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED


@pytest.mark.parametrize(("op", "expected"), [
    (O.EQUAL, [False, True, False]),
    (O.NOT_EQUAL, [True, False, True]),
    (O.GREATER, [False, False, True]),
    (O.GREATER_EQUAL, [False, True, True]),
    (O.LESS, [True, False, False]),
    (O.LESS_EQUAL, [True, True, False]),
])
def test_compare_float(op, expected):
    (out,) = run_op(op, [tensor(F32, [1.0, 2.0, 3.0]), tensor(F32, [2.0, 2.0, 2.0])],
                    [output(B8, [3])])
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, expected)


def test_compare_broadcast_int32():
    (out,) = run_op(O.GREATER, [tensor(I32, [[1], [5]]), tensor(I32, [0, 3, 6])],
                    [output(B8, [2, 3])])
    np.testing.assert_array_equal(out, [[True, False, False], [True, True, False]])


def test_compare_bool8():
    (out,) = run_op(O.LESS, [tensor(B8, [False, True]), tensor(B8, [True, True])],
                    [output(B8, [2])])
    np.testing.assert_array_equal(out, [True, False])


def test_compare_quant_uses_real_values():
    # a: scale 1, zp 128 -> reals -1, 0, 1;  b: scale 0.5, zp 0 -> reals 0, 0, 0.5.
    a = tensor(U8, [127, 128, 129], 1.0, 128)
    b = tensor(U8, [0, 0, 1], 0.5, 0)
    (eq,) = run_op(O.EQUAL, [a, b], [output(B8, [3])])
    np.testing.assert_array_equal(eq, [False, True, False])
    (gt,) = run_op(O.GREATER, [a, b], [output(B8, [3])])
    np.testing.assert_array_equal(gt, [False, False, True])
    (le,) = run_op(O.LESS_EQUAL, [tensor(S8, [-1, 0], 1.0, 0), tensor(S8, [-2, 2], 0.5, 0)],
                   [output(B8, [2])])
    np.testing.assert_array_equal(le, [True, True])


def test_compare_output_must_be_bool():
    with pytest.raises(OpError):
        run_op(O.EQUAL, [tensor(F32, [1.0]), tensor(F32, [1.0])], [output(F32, [1])])


def test_compare_mixed_types_rejected():
    with pytest.raises(OpError):
        run_op(O.EQUAL, [tensor(F32, [1.0]), tensor(F16, [1.0])], [output(B8, [1])])


def test_logical_and_or_broadcast():
    a = tensor(B8, [[True, False], [True, True]])
    b = tensor(B8, [True, False])
    (land,) = run_op(O.LOGICAL_AND, [a, b], [output(B8, [2, 2])])
    (lor,) = run_op(O.LOGICAL_OR, [a, b], [output(B8, [2, 2])])
    np.testing.assert_array_equal(land, [[True, False], [True, False]])
    np.testing.assert_array_equal(lor, [[True, False], [True, True]])


def test_logical_not():
    (out,) = run_op(O.LOGICAL_NOT, [tensor(B8, [True, False])], [output(B8, [2])])
    np.testing.assert_array_equal(out, [False, True])


def test_logical_rejects_non_bool():
    with pytest.raises(OpError):
        run_op(O.LOGICAL_AND, [tensor(I32, [1]), tensor(I32, [1])], [output(B8, [1])])
    with pytest.raises(OpError):
        run_op(O.LOGICAL_NOT, [tensor(B8, [True])], [output(I32, [1])])


def test_select_float():
    cond = tensor(B8, [True, False, True])
    (out,) = run_op(O.SELECT, [cond, tensor(F32, [1.0, 2.0, 3.0]), tensor(F32, [-1.0, -2.0, -3.0])],
                    [output(F32, [3])])
    np.testing.assert_array_equal(out, [1.0, -2.0, 3.0])


def test_select_quant_requantises_to_output():
    cond = tensor(B8, [True, False])
    x = tensor(U8, [10, 10], 1.0, 0)      # real 10
    y = tensor(U8, [3, 4], 2.0, 0)        # reals 6, 8
    (out,) = run_op(O.SELECT, [cond, x, y], [output(U8, [2], 0.5, 1)])
    np.testing.assert_array_equal(out, [21, 17])


def test_select_shape_mismatch_rejected():
    with pytest.raises(OpError):
        run_op(O.SELECT, [tensor(B8, [True, False]), tensor(F32, [1.0, 2.0, 3.0]),
                          tensor(F32, [1.0, 2.0, 3.0])], [output(F32, [3])])
    with pytest.raises(OpError):
        run_op(O.SELECT, [tensor(B8, [True]), tensor(F32, [1.0]), tensor(I32, [1])],
               [output(F32, [1])])


def test_signatures_name_the_slot():
    with pytest.raises(OpError, match=r"LESS: output 0 \(output\) has type TENSOR_INT32"):
        run_op(O.LESS, [tensor(I32, [1]), tensor(I32, [2])], [output(I32, [1])])
    with pytest.raises(OpError, match=r"SELECT: input 0 \(condition\) has type TENSOR_INT32"):
        run_op(O.SELECT, [tensor(I32, [1]), tensor(F32, [1.0]), tensor(F32, [2.0])],
               [output(F32, [1])])
    with pytest.raises(OpError, match=r"SELECT: input 2 \(input2\) cannot be omitted"):
        run_op(O.SELECT, [tensor(B8, [True]), tensor(F32, [1.0]), omitted(F32)],
               [output(F32, [1])])
    with pytest.raises(OpError, match=r"LOGICAL_OR: input 1 \(input1\) cannot be omitted"):
        run_op(O.LOGICAL_OR, [tensor(B8, [True]), omitted(B8)], [output(B8, [1])])
