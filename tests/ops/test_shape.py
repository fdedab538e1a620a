"""Shape and layout operations: CONCATENATION, DEPTH_TO_SPACE, SPACE_TO_DEPTH, RESHAPE,
BATCH_TO_SPACE_ND, SPACE_TO_BATCH_ND, PAD, PAD_V2, SQUEEZE, TRANSPOSE, EXPAND_DIMS, TILE,
CHANNEL_SHUFFLE, SPLIT, FILL, RANK."""

import numpy as np
import pytest

from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.catalog import check_operation, lookup
from nnhal.ops.resolver import OpContext, OperandInfo, OpError
from nnhal.ops.testing import omitted, output, run_op, tensor

F32, F16, I32, B8 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32, T.TENSOR_BOOL8
U8, S8 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED


def i32(v):
    return tensor(T.INT32, v)


def vec(values, const=True):
    return tensor(I32, values, shape=(len(values),), const=const)


def prepared(op, inputs, outputs):
    """Validate then return the shapes ``prepare`` infers."""
    ctx = OpContext(op_type=op, inputs=[i for i, _ in inputs], outputs=list(outputs))
    d = lookup(op)
    check_operation(d, ctx)
    return d.prepare(ctx)


# ---- CONCATENATION ----------------------------------------------------------------------------

def test_concat_float_negative_axis():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(4, dtype=np.float32).reshape(2, 2) + 10
    (out,) = run_op(O.CONCATENATION, [tensor(F32, a), tensor(F32, b), i32(-1)],
                    [output(F32, [2, 5])])
    np.testing.assert_array_equal(out, np.concatenate([a, b], axis=1))


def test_concat_quant_requantises_different_scales():
    # input0 already matches the output and is copied; input1 (scale 1, zp 0) maps to
    # round(q * 1/0.5) + 10.
    (out,) = run_op(O.CONCATENATION,
                    [tensor(U8, [[10, 255]], 0.5, 10), tensor(U8, [[3, 200]], 1.0, 0), i32(0)],
                    [output(U8, [2, 2], 0.5, 10)])
    np.testing.assert_array_equal(out, [[10, 255], [16, 255]])
    (s,) = run_op(O.CONCATENATION,
                  [tensor(S8, [[-3]], 0.25, -1), tensor(S8, [[5]], 0.5, 1), i32(1)],
                  [output(S8, [1, 2], 0.5, 1)])
    # (-3 + 1) * 0.25 = -0.5 -> round(-1) + 1 = 0, half away from zero.
    np.testing.assert_array_equal(s, [[0, 5]])


def test_concat_zero_sized_input():
    a = np.zeros((0, 2), np.float32)
    b = np.ones((3, 2), np.float32)
    (out,) = run_op(O.CONCATENATION, [tensor(F32, a), tensor(F32, b), i32(0)],
                    [output(F32, [3, 2])])
    np.testing.assert_array_equal(out, b)


def test_concat_rejects_rank_5_and_mismatch():
    x = np.zeros((1, 1, 1, 1, 2), np.float32)
    with pytest.raises(OpError):
        run_op(O.CONCATENATION, [tensor(F32, x), tensor(F32, x), i32(4)],
               [output(F32, [1, 1, 1, 1, 4])])
    with pytest.raises(OpError):
        run_op(O.CONCATENATION, [tensor(F32, np.zeros((2, 2), np.float32)),
                                 tensor(F32, np.zeros((3, 3), np.float32)), i32(0)],
               [output(F32, [5, 2])])
    with pytest.raises(OpError):
        run_op(O.CONCATENATION, [tensor(F32, [1.0]), tensor(F16, [1.0]), i32(0)],
               [output(F32, [2])])


# ---- DEPTH_TO_SPACE / SPACE_TO_DEPTH -----------------------------------------------------------

def test_depth_to_space_nhwc_and_inverse():
    x = np.arange(8, dtype=np.float32).reshape(1, 1, 2, 4)
    (y,) = run_op(O.DEPTH_TO_SPACE, [tensor(F32, x), i32(2)], [output(F32, [1, 2, 4, 1])])
    np.testing.assert_array_equal(y.reshape(2, 4), [[0, 1, 4, 5], [2, 3, 6, 7]])
    (z,) = run_op(O.SPACE_TO_DEPTH, [tensor(F32, y), i32(2)], [output(F32, [1, 1, 2, 4])])
    np.testing.assert_array_equal(z, x)


def test_depth_to_space_nchw_matches_nhwc():
    x = np.arange(2 * 2 * 3 * 8, dtype=np.uint8).reshape(2, 2, 3, 8)
    (ref,) = run_op(O.DEPTH_TO_SPACE, [tensor(U8, x, 0.5, 3), i32(2)],
                    [output(U8, [2, 4, 6, 2], 0.5, 3)])
    nchw = np.transpose(x, (0, 3, 1, 2))
    (got,) = run_op(O.DEPTH_TO_SPACE,
                    [tensor(U8, nchw, 0.5, 3), i32(2), tensor(T.BOOL, True)],
                    [output(U8, [2, 2, 4, 6], 0.5, 3)])
    np.testing.assert_array_equal(got, np.transpose(ref, (0, 3, 1, 2)))


def test_space_to_depth_nchw_matches_nhwc():
    x = np.arange(1 * 4 * 6 * 3, dtype=np.float32).reshape(1, 4, 6, 3)
    (ref,) = run_op(O.SPACE_TO_DEPTH, [tensor(F32, x), i32(2)], [output(F32, [1, 2, 3, 12])])
    (got,) = run_op(O.SPACE_TO_DEPTH,
                    [tensor(F32, np.transpose(x, (0, 3, 1, 2))), i32(2), tensor(T.BOOL, True)],
                    [output(F32, [1, 12, 2, 3])])
    np.testing.assert_array_equal(got, np.transpose(ref, (0, 3, 1, 2)))


def test_depth_space_invalid_block():
    x = np.zeros((1, 2, 2, 3), np.float32)
    with pytest.raises(OpError):
        run_op(O.DEPTH_TO_SPACE, [tensor(F32, x), i32(2)], [output(F32, [1, 4, 4, 0])])
    with pytest.raises(OpError):
        run_op(O.SPACE_TO_DEPTH, [tensor(F32, x), i32(0)], [output(F32, [1, 2, 2, 3])])
    with pytest.raises(OpError):
        run_op(O.SPACE_TO_DEPTH, [tensor(F32, np.zeros((1, 3, 3, 1), np.float32)), i32(2)],
               [output(F32, [1, 1, 1, 4])])
    with pytest.raises(OpError):  # quant output must keep the input's parameters
        run_op(O.DEPTH_TO_SPACE, [tensor(U8, np.zeros((1, 1, 1, 4)), 0.5, 0), i32(2)],
               [output(U8, [1, 2, 2, 1], 0.25, 0)])


# ---- RESHAPE ----------------------------------------------------------------------------------

def test_reshape_with_minus_one():
    x = np.arange(12, dtype=np.float16).reshape(3, 4)
    (y,) = run_op(O.RESHAPE, [tensor(F16, x), vec([-1, 6])], [output(F16, [2, 6])])
    assert y.dtype == np.float16 and y.shape == (2, 6)
    np.testing.assert_array_equal(y.ravel(), x.ravel())
    assert prepared(O.RESHAPE, [tensor(F16, x), vec([2, -1, 3])], [output(F16)]) == [(2, 2, 3)]


def test_reshape_runtime_shape_and_errors():
    x = np.arange(6, dtype=np.float32)
    (y,) = run_op(O.RESHAPE, [tensor(F32, x), vec([3, 2], const=False)], [output(F32, [3, 2])])
    assert y.shape == (3, 2)
    for bad in ([-1, -1], [4, 2], [0, -1], [1, 1, 1, 1, 6]):
        with pytest.raises(OpError):
            run_op(O.RESHAPE, [tensor(F32, x), vec(bad)], [output(F32)])


def test_reshape_zero_sized():
    x = np.zeros((0, 4), np.float32)
    (y,) = run_op(O.RESHAPE, [tensor(F32, x), vec([2, 0, 2], const=False)],
                  [output(F32, [2, 0, 2])])
    assert y.shape == (2, 0, 2)


# ---- BATCH_TO_SPACE_ND / SPACE_TO_BATCH_ND -----------------------------------------------------

def test_batch_to_space_nhwc():
    x = np.arange(4, dtype=np.float32).reshape(4, 1, 1, 1)
    (y,) = run_op(O.BATCH_TO_SPACE_ND, [tensor(F32, x), vec([2, 2])],
                  [output(F32, [1, 2, 2, 1])])
    np.testing.assert_array_equal(y.reshape(2, 2), [[0, 1], [2, 3]])


def test_space_to_batch_roundtrip_and_quant_padding():
    x = np.arange(1, 7, dtype=np.uint8).reshape(1, 2, 3, 1)
    pads = tensor(I32, [[0, 0], [0, 1]], const=True)
    (y,) = run_op(O.SPACE_TO_BATCH_ND, [tensor(U8, x, 0.5, 9), vec([2, 2]), pads],
                  [output(U8, [4, 1, 2, 1], 0.5, 9)])
    # The padded column holds the zero point (logical zero), not the raw byte 0.
    np.testing.assert_array_equal(y.reshape(4, 2), [[1, 3], [2, 9], [4, 6], [5, 9]])
    (back,) = run_op(O.BATCH_TO_SPACE_ND, [tensor(U8, y, 0.5, 9), vec([2, 2])],
                     [output(U8, [1, 2, 4, 1], 0.5, 9)])
    np.testing.assert_array_equal(back[:, :, :3], x)


def test_space_to_batch_nchw_matches_nhwc():
    x = np.arange(2 * 4 * 4 * 3, dtype=np.float32).reshape(2, 4, 4, 3)
    pads = tensor(I32, [[1, 1], [0, 2]], const=True)
    (ref,) = run_op(O.SPACE_TO_BATCH_ND, [tensor(F32, x), vec([2, 3]), pads],
                    [output(F32, [12, 3, 2, 3])])
    (got,) = run_op(O.SPACE_TO_BATCH_ND,
                    [tensor(F32, np.transpose(x, (0, 3, 1, 2))), vec([2, 3]), pads,
                     tensor(T.BOOL, True)], [output(F32, [12, 3, 3, 2])])
    np.testing.assert_array_equal(got, np.transpose(ref, (0, 3, 1, 2)))


def test_batch_space_invalid():
    x = np.zeros((3, 1, 1, 1), np.float32)
    with pytest.raises(OpError):
        run_op(O.BATCH_TO_SPACE_ND, [tensor(F32, x), vec([2, 2])], [output(F32)])
    with pytest.raises(OpError):
        run_op(O.BATCH_TO_SPACE_ND, [tensor(F32, x), vec([0, 1])], [output(F32)])
    with pytest.raises(OpError):
        run_op(O.SPACE_TO_BATCH_ND, [tensor(F32, x), vec([2, 2]),
                                     tensor(I32, [[0, 0], [0, -1]], const=True)], [output(F32)])


# ---- PAD / PAD_V2 -----------------------------------------------------------------------------

def test_pad_float_and_quant_zero_point():
    (f,) = run_op(O.PAD, [tensor(F32, [1.0, 2.0]), tensor(I32, [[1, 2]], const=True)],
                  [output(F32, [5])])
    np.testing.assert_array_equal(f, [0, 1, 2, 0, 0])
    (q,) = run_op(O.PAD, [tensor(S8, [[5]], 0.1, -7), tensor(I32, [[0, 1], [1, 0]], const=True)],
                  [output(S8, [2, 2], 0.1, -7)])
    np.testing.assert_array_equal(q, [[-7, 5], [-7, -7]])


def test_pad_v2_value_types():
    (h,) = run_op(O.PAD_V2, [tensor(F16, [1.0]), tensor(I32, [[1, 0]], const=True),
                             tensor(T.FLOAT16, 2.5)], [output(F16, [2])])
    assert h.dtype == np.float16
    np.testing.assert_array_equal(h, [2.5, 1.0])
    # The INT32 pad value is a raw quantized value.
    (q,) = run_op(O.PAD_V2, [tensor(U8, [7], 0.5, 3), tensor(I32, [[0, 2]], const=True),
                             i32(9)], [output(U8, [3], 0.5, 3)])
    np.testing.assert_array_equal(q, [7, 9, 9])


def test_pad_invalid():
    with pytest.raises(OpError):
        run_op(O.PAD, [tensor(F32, [1.0]), tensor(I32, [[-1, 0]], const=True)], [output(F32)])
    with pytest.raises(OpError):  # paddings must be [rank, 2]
        run_op(O.PAD, [tensor(F32, [[1.0]]), tensor(I32, [[1, 0]], const=True)], [output(F32)])
    with pytest.raises(OpError):  # wrong pad value type
        run_op(O.PAD_V2, [tensor(F32, [1.0]), tensor(I32, [[1, 0]], const=True), i32(0)],
               [output(F32)])
    with pytest.raises(OpError):  # out of the quant8 range
        run_op(O.PAD_V2, [tensor(U8, [1], 1.0, 0), tensor(I32, [[1, 0]], const=True), i32(256)],
               [output(U8, None, 1.0, 0)])


# ---- SQUEEZE / EXPAND_DIMS / TRANSPOSE ---------------------------------------------------------

def test_squeeze_variants():
    x = np.zeros((1, 3, 1, 2), np.float32)
    # The squeeze dims input is optional only as a NO_VALUE operand: the count is always 2.
    with pytest.raises(OpError):
        run_op(O.SQUEEZE, [tensor(F32, x)], [output(F32, [3, 2])])
    (b,) = run_op(O.SQUEEZE, [tensor(F32, x), omitted(I32)], [output(F32, [3, 2])])
    assert b.shape == (3, 2)
    (c,) = run_op(O.SQUEEZE, [tensor(F32, x), vec([-2])], [output(F32, [1, 3, 2])])
    assert c.shape == (1, 3, 2)
    (d,) = run_op(O.SQUEEZE, [tensor(F32, np.zeros((1, 1, 1), np.float32)), omitted(I32)],
                  [output(F32, [1])])
    assert d.shape == (1,)
    with pytest.raises(OpError):
        run_op(O.SQUEEZE, [tensor(F32, x), vec([1])], [output(F32)])
    with pytest.raises(OpError):
        run_op(O.SQUEEZE, [tensor(F32, x), vec([4])], [output(F32)])


def test_expand_dims():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    for axis, shape in ((0, (1, 2, 3)), (-1, (2, 3, 1)), (2, (2, 3, 1)), (-3, (1, 2, 3))):
        (y,) = run_op(O.EXPAND_DIMS, [tensor(I32, x), i32(axis)], [output(I32, shape)])
        assert y.shape == shape
    with pytest.raises(OpError):
        run_op(O.EXPAND_DIMS, [tensor(I32, x), i32(3)], [output(I32)])


def test_transpose_perm_omitted_and_empty_reverse():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (a,) = run_op(O.TRANSPOSE, [tensor(F32, x), omitted(I32)], [output(F32, [4, 3, 2])])
    np.testing.assert_array_equal(a, x.T)
    (b,) = run_op(O.TRANSPOSE, [tensor(F32, x), tensor(I32, np.zeros(0, np.int32))],
                  [output(F32, [4, 3, 2])])
    np.testing.assert_array_equal(b, x.T)
    (c,) = run_op(O.TRANSPOSE, [tensor(F32, x), vec([1, 0, 2])], [output(F32, [3, 2, 4])])
    np.testing.assert_array_equal(c, np.transpose(x, (1, 0, 2)))
    with pytest.raises(OpError):
        run_op(O.TRANSPOSE, [tensor(F32, x), vec([0, 0, 1])], [output(F32)])


def test_transpose_zero_sized():
    x = np.zeros((0, 3), np.float32)
    (y,) = run_op(O.TRANSPOSE, [tensor(F32, x), vec([1, 0])], [output(F32, [3, 0])])
    assert y.shape == (3, 0)


# ---- TILE / CHANNEL_SHUFFLE / SPLIT -----------------------------------------------------------

def test_tile():
    (y,) = run_op(O.TILE, [tensor(U8, [[1, 2]], 0.5, 1), vec([2, 2])],
                  [output(U8, [2, 4], 0.5, 1)])
    np.testing.assert_array_equal(y, [[1, 2, 1, 2], [1, 2, 1, 2]])
    with pytest.raises(OpError):
        run_op(O.TILE, [tensor(F32, [1.0]), vec([1, 2])], [output(F32)])


def test_channel_shuffle():
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    (y,) = run_op(O.CHANNEL_SHUFFLE, [tensor(F32, x), i32(2), i32(-1)], [output(F32, [1, 6])])
    np.testing.assert_array_equal(y, [[0, 3, 1, 4, 2, 5]])
    (z,) = run_op(O.CHANNEL_SHUFFLE, [tensor(F32, x.T), i32(3), i32(0)], [output(F32, [6, 1])])
    np.testing.assert_array_equal(z.ravel(), [0, 2, 4, 1, 3, 5])
    with pytest.raises(OpError):
        run_op(O.CHANNEL_SHUFFLE, [tensor(F32, x), i32(4), i32(1)], [output(F32, [1, 6])])


def test_split():
    x = np.arange(12, dtype=np.int32).reshape(2, 6)
    outs = run_op(O.SPLIT, [tensor(I32, x), i32(-1), i32(3)], [output(I32, [2, 2])] * 3)
    assert len(outs) == 3
    np.testing.assert_array_equal(outs[2], [[4, 5], [10, 11]])
    with pytest.raises(OpError):
        run_op(O.SPLIT, [tensor(I32, x), i32(1), i32(4)], [output(I32)] * 4)
    with pytest.raises(OpError):  # num_splits must match the outputs
        run_op(O.SPLIT, [tensor(I32, x), i32(1), i32(2)], [output(I32)] * 3)


# ---- FILL / RANK ------------------------------------------------------------------------------

def test_fill_and_rank():
    (f,) = run_op(O.FILL, [vec([2, 3], const=False), tensor(T.FLOAT16, 1.5)],
                  [output(F16, [2, 3])])
    assert f.dtype == np.float16 and f.shape == (2, 3) and np.all(f == 1.5)
    (i,) = run_op(O.FILL, [vec([4]), i32(-7)], [output(I32, [4])])
    np.testing.assert_array_equal(i, [-7] * 4)
    with pytest.raises(OpError):
        run_op(O.FILL, [vec([2]), tensor(T.FLOAT32, 1.0)], [output(I32, [2])])
    (r,) = run_op(O.RANK, [tensor(B8, np.zeros((2, 1, 3), bool))], [output(T.INT32, [])])
    assert r.shape == () and r.dtype == np.int32 and int(r) == 3


def test_prepare_shapes_with_runtime_parameters():
    x = tensor(F32, np.zeros((2, 3), np.float32))
    assert prepared(O.TILE, [x, vec([2, 1], const=False)], [output(F32)]) == [(0, 0)]
    assert prepared(O.TILE, [x, vec([2, 1])], [output(F32)]) == [(4, 3)]
    runtime_axis = (OperandInfo(type=T.INT32, shape=()), None)
    assert prepared(O.EXPAND_DIMS, [x, runtime_axis], [output(F32)]) == [(0, 0, 0)]
    assert prepared(O.RESHAPE, [x, vec([3, 2], const=False)], [output(F32)]) == [(0, 0)]


# ---- signatures: omitted layout flags, named slots --------------------------------------------

def test_omitted_layout_flag_means_nhwc():
    x = np.arange(8, dtype=np.float32).reshape(1, 1, 2, 4)
    (ref,) = run_op(O.DEPTH_TO_SPACE, [tensor(F32, x), i32(2)], [output(F32, [1, 2, 4, 1])])
    (got,) = run_op(O.DEPTH_TO_SPACE, [tensor(F32, x), i32(2), omitted(T.BOOL)],
                    [output(F32, [1, 2, 4, 1])])
    np.testing.assert_array_equal(got, ref)
    y = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
    (s2b,) = run_op(O.SPACE_TO_BATCH_ND,
                    [tensor(F32, y), vec([2, 2]), tensor(I32, [[0, 0], [0, 0]]),
                     omitted(T.BOOL)], [output(F32, [4, 2, 2, 1])])
    (b2s,) = run_op(O.BATCH_TO_SPACE_ND, [tensor(F32, s2b), vec([2, 2]), omitted(T.BOOL)],
                    [output(F32, [1, 4, 4, 1])])
    np.testing.assert_array_equal(b2s, y)


def test_omitted_required_input_is_named():
    x = np.zeros((1, 2, 2, 4), np.float32)
    with pytest.raises(OpError, match=r"DEPTH_TO_SPACE: input 1 \(block_size\) cannot be omitted"):
        run_op(O.DEPTH_TO_SPACE, [tensor(F32, x), omitted(T.INT32)], [output(F32)])
    with pytest.raises(OpError, match=r"RESHAPE: input 1 \(shape\) cannot be omitted"):
        run_op(O.RESHAPE, [tensor(F32, x), omitted(I32)], [output(F32)])
    with pytest.raises(OpError, match=r"CONCATENATION: input 1 \(inputs\) cannot be omitted"):
        run_op(O.CONCATENATION, [tensor(F32, x), omitted(F32), i32(0)], [output(F32)])


def test_slot_types_follow_the_variant():
    x = np.zeros((2, 2), np.float32)
    pads = tensor(I32, [[1, 1], [0, 0]])
    with pytest.raises(OpError, match=r"PAD_V2: input 2 \(pad_value\) has type INT32"):
        run_op(O.PAD_V2, [tensor(F32, x), pads, i32(0)], [output(F32)])
    (q,) = run_op(O.PAD_V2, [tensor(U8, [[1]], 0.5, 0), tensor(I32, [[1, 0], [0, 0]]), i32(9)],
                  [output(U8, [2, 1], 0.5, 0)])
    np.testing.assert_array_equal(q, [[9], [1]])
    with pytest.raises(OpError, match=r"SPLIT: output 1 \(outputs\) has type TENSOR_FLOAT32"):
        run_op(O.SPLIT, [tensor(I32, [[1, 2]]), i32(1), i32(2)],
               [output(I32, [1, 1]), output(F32, [1, 1])])
    # The value's type picks the variant; the output then disagrees with it.
    with pytest.raises(OpError, match=r"FILL: output 0 \(output\) has type TENSOR_FLOAT32"):
        run_op(O.FILL, [vec([2]), i32(1)], [output(F32, [2])])
    with pytest.raises(OpError, match=r"RANK: output 0 \(rank\) has type TENSOR_INT32"):
        run_op(O.RANK, [tensor(F32, x)], [output(I32, [1])])
    with pytest.raises(OpError, match=r"SPACE_TO_DEPTH: input 2 \(layout\) has type INT32"):
        run_op(O.SPACE_TO_DEPTH, [tensor(F32, np.zeros((1, 2, 2, 1), np.float32)), i32(2),
                                  i32(0)], [output(F32)])
