"""STRIDED_SLICE, SLICE, GATHER, EMBEDDING_LOOKUP, HASHTABLE_LOOKUP, TOPK_V2."""

import numpy as np
import pytest

from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.catalog import check_operation, lookup
from nnhal.ops.resolver import OpContext, OpError
from nnhal.ops.testing import omitted, output, run_op, tensor

F32, F16, I32 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32
U8, S8 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED


def i32(v):
    return tensor(T.INT32, v)


def vec(values, const=True):
    return tensor(I32, values, shape=(len(values),), const=const)


def strided(x, begin, end, strides, bmask=0, emask=0, shrink=0, t=F32, out_shape=None):
    (y,) = run_op(O.STRIDED_SLICE,
                  [tensor(t, x), vec(begin), vec(end), vec(strides), i32(bmask), i32(emask),
                   i32(shrink)], [output(t, out_shape)])
    return y


# ---- STRIDED_SLICE ----------------------------------------------------------------------------

def test_strided_slice_basic_and_negative_indices():
    x = np.arange(6, dtype=np.float32)
    np.testing.assert_array_equal(strided(x, [1], [5], [2]), [1, 3])
    np.testing.assert_array_equal(strided(x, [-4], [-1], [1]), [2, 3, 4])
    np.testing.assert_array_equal(strided(x, [-1], [-7], [-2]), [5, 3, 1])
    np.testing.assert_array_equal(strided(x, [100], [-100], [-1]), x[::-1])


def test_strided_slice_masks():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(strided(x, [2, 3], [0, 0], [1, 1], bmask=3, emask=3), x)
    np.testing.assert_array_equal(strided(x, [5, 5], [1, 2], [-1, 1], bmask=1), x[:1:-1, 5:2])
    # shrink row 1 (the end value is irrelevant only when it selects one element)
    np.testing.assert_array_equal(strided(x, [1, 0], [2, 4], [1, 1], shrink=1), x[1])
    y = strided(x, [1, 2], [2, 3], [1, 1], shrink=3)
    assert y.shape == (1,) and y[0] == 6


def test_strided_slice_invalid():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(OpError):  # shrink over two elements
        strided(x, [0, 0], [2, 3], [1, 1], shrink=1)
    with pytest.raises(OpError):  # shrink with a negative stride
        strided(x, [1, 0], [0, 3], [-1, 1], shrink=1)
    with pytest.raises(OpError):
        strided(x, [0, 0], [1, 1], [0, 1])
    with pytest.raises(OpError):  # begin must have one value per dimension
        strided(x, [0], [1], [1])


def test_strided_slice_quant_keeps_type():
    y = strided(np.array([[1, 2, 3]], np.int8), [0, 0], [1, 3], [1, 2], t=S8)
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, [[1, 3]])


# ---- SLICE ------------------------------------------------------------------------------------

def test_slice_with_minus_one_size():
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    (y,) = run_op(O.SLICE, [tensor(I32, x), vec([1, 0, 2]), vec([-1, 2, -1])],
                  [output(I32, [1, 2, 2])])
    np.testing.assert_array_equal(y, x[1:, :2, 2:])


def test_slice_zero_sized_and_invalid():
    x = np.zeros((0, 3), np.float32)
    (y,) = run_op(O.SLICE, [tensor(F32, x), vec([0, 1]), vec([-1, 2])], [output(F32, [0, 2])])
    assert y.shape == (0, 2)
    with pytest.raises(OpError):
        run_op(O.SLICE, [tensor(F32, [1.0, 2.0]), vec([1]), vec([2])], [output(F32)])
    with pytest.raises(OpError):
        run_op(O.SLICE, [tensor(F32, [1.0, 2.0]), vec([-1]), vec([1])], [output(F32)])


# ---- GATHER -----------------------------------------------------------------------------------

def test_gather_axis_and_higher_rank_indices():
    x = np.arange(12, dtype=np.float16).reshape(3, 4)
    idx = tensor(I32, [[3, 0], [1, 1]], const=False)
    (y,) = run_op(O.GATHER, [tensor(F16, x), i32(-1), idx], [output(F16, [3, 2, 2])])
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, x[:, [[3, 0], [1, 1]]])
    with pytest.raises(OpError):
        run_op(O.GATHER, [tensor(F16, x), i32(0), tensor(I32, [3])], [output(F16)])
    with pytest.raises(OpError):
        run_op(O.GATHER, [tensor(F16, x), i32(2), tensor(I32, [0])], [output(F16)])


# ---- EMBEDDING_LOOKUP / HASHTABLE_LOOKUP ------------------------------------------------------

def test_embedding_lookup():
    values = np.arange(12, dtype=np.uint8).reshape(3, 2, 2)
    (y,) = run_op(O.EMBEDDING_LOOKUP, [tensor(I32, [2, 0, 2]), tensor(U8, values, 0.5, 1)],
                  [output(U8, [3, 2, 2], 0.5, 1)])
    np.testing.assert_array_equal(y, values[[2, 0, 2]])
    with pytest.raises(OpError):
        run_op(O.EMBEDDING_LOOKUP, [tensor(I32, [3]), tensor(U8, values, 0.5, 1)],
               [output(U8, [1, 2, 2], 0.5, 1)])


def test_hashtable_lookup_hits_and_misses():
    keys = tensor(I32, [-5, 0, 7])
    values = tensor(F32, [[1.0, 1.5], [2.0, 2.5], [3.0, 3.5]])
    out, hits = run_op(O.HASHTABLE_LOOKUP, [tensor(I32, [7, 1, -5, 100]), keys, values],
                       [output(F32, [4, 2]), output(U8, [4], 1.0, 0)])
    np.testing.assert_array_equal(out, [[3.0, 3.5], [0, 0], [1.0, 1.5], [0, 0]])
    np.testing.assert_array_equal(hits, [1, 0, 1, 0])
    assert hits.dtype == np.uint8


def test_hashtable_lookup_invalid():
    with pytest.raises(OpError):  # signed quant is not a HASHTABLE_LOOKUP type
        run_op(O.HASHTABLE_LOOKUP, [tensor(I32, [1]), tensor(I32, [1]),
                                    tensor(S8, [[1]], 1.0, 0)],
               [output(S8, [1, 1], 1.0, 0), output(U8, [1], 1.0, 0)])
    with pytest.raises(OpError):  # keys and values rows differ
        run_op(O.HASHTABLE_LOOKUP, [tensor(I32, [1]), tensor(I32, [1, 2]),
                                    tensor(F32, [[1.0]])],
               [output(F32, [1, 1]), output(U8, [1], 1.0, 0)])


# ---- TOPK_V2 ----------------------------------------------------------------------------------

def test_topk_orders_ties_by_larger_index_first():
    x = np.array([[1, 5, 3, 5], [2, 2, 2, 9]], np.int32)
    vals, idx = run_op(O.TOPK_V2, [tensor(I32, x), i32(3)],
                       [output(I32, [2, 3]), output(I32, [2, 3])])
    np.testing.assert_array_equal(vals, [[5, 5, 3], [9, 2, 2]])
    np.testing.assert_array_equal(idx, [[3, 1, 2], [3, 2, 1]])


def test_topk_quant_and_invalid_k():
    vals, idx = run_op(O.TOPK_V2, [tensor(S8, [-3, 4, 0], 0.5, 0), i32(1)],
                       [output(S8, [1], 0.5, 0), output(I32, [1])])
    assert vals.dtype == np.int8 and vals[0] == 4 and idx[0] == 1
    for k in (0, 4):
        with pytest.raises(OpError):
            run_op(O.TOPK_V2, [tensor(F32, [1.0, 2.0, 3.0]), i32(k)],
                   [output(F32), output(I32)])


def test_prepare_strided_slice_shrink_with_runtime_begin():
    x = tensor(F32, np.zeros((2, 3), np.float32))
    inputs = [x, vec([0, 0], const=False), vec([1, 3]), vec([1, 1]), i32(0), i32(0), i32(1)]
    ctx = OpContext(op_type=O.STRIDED_SLICE, inputs=[i for i, _ in inputs],
                    outputs=[output(F32)])
    check_operation(lookup(O.STRIDED_SLICE), ctx)
    assert lookup(O.STRIDED_SLICE).prepare(ctx) == [(0,)]


def test_signatures_name_the_slot():
    x = tensor(F32, np.zeros((2, 3), np.float32))
    with pytest.raises(OpError, match=r"GATHER: input 2 \(indices\) cannot be omitted"):
        run_op(O.GATHER, [x, i32(0), omitted(I32)], [output(F32)])
    with pytest.raises(OpError, match=r"STRIDED_SLICE: input 6 \(shrink_axis_mask\) cannot"):
        run_op(O.STRIDED_SLICE, [x, vec([0, 0]), vec([2, 3]), vec([1, 1]), i32(0), i32(0),
                                 omitted(T.INT32)], [output(F32)])
    with pytest.raises(OpError, match=r"TOPK_V2: output 1 \(indices\) has type TENSOR_FLOAT32"):
        run_op(O.TOPK_V2, [x, i32(1)], [output(F32), output(F32)])
    with pytest.raises(OpError, match=r"HASHTABLE_LOOKUP: output 1 \(hits\) has type"):
        run_op(O.HASHTABLE_LOOKUP, [tensor(I32, [1]), tensor(I32, [1]), tensor(F32, [[1.0]])],
               [output(F32, [1, 1]), output(T.TENSOR_BOOL8, [1])])
    # EMBEDDING_LOOKUP takes float16 values since 1.3.
    (y,) = run_op(O.EMBEDDING_LOOKUP, [tensor(I32, [1]), tensor(F16, [[1.0], [2.0]])],
                  [output(F16, [1, 1])])
    assert y.dtype == np.float16 and y.tolist() == [[2.0]]
