"""MIRROR_PAD and REVERSE (AIDL v3), and RESHAPE of TENSOR_INT32 (AIDL v2): values, the
bounds a padding or an axis must keep (checked at validate when constant, else at run time),
zero-sized tensors, quantized operands moved unchanged, and the feature level each reports."""

import numpy as np
import pytest

from nnhal.core.version import FeatureLevel
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import ErrorStatus, OperandLifeTime
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.catalog import check_operation, lookup
from nnhal.ops.resolver import OpContext, OpError
from nnhal.ops.testing import output, run_op, tensor

F32, F16, I32 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32
U8, S8 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED
REFLECT, SYMMETRIC = 0, 1


def pads(values, const=True):
    return tensor(I32, values, shape=(len(values), 2), const=const)


def mirror(x, p, m, out, *, const=True):
    """MIRROR_PAD of x; paddings and mode constants, or both given at run time."""
    mode_in = tensor(T.INT32, m)
    if not const:
        mode_in[0].lifetime, mode_in[0].value = OperandLifeTime.SUBGRAPH_INPUT, None
    return run_op(O.MIRROR_PAD, [x, pads(p, const), mode_in], [out])[0]


def level(op, inputs, outputs):
    return check_operation(lookup(op), OpContext(op, [i for i, _ in inputs], list(outputs)))


# ---- MIRROR_PAD -----------------------------------------------------------------------------

def test_mirror_pad_modes_on_the_definitions_example():
    x = tensor(F32, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(mirror(x, [[0, 2]], REFLECT, output(F32, [5])),
                                  [1, 2, 3, 2, 1])
    np.testing.assert_array_equal(mirror(x, [[0, 2]], SYMMETRIC, output(F32, [5])),
                                  [1, 2, 3, 3, 2])
    np.testing.assert_array_equal(mirror(x, [[2, 0]], REFLECT, output(F32, [5])),
                                  [3, 2, 1, 2, 3])


def test_mirror_pad_two_dimensions_every_type_unchanged():
    a = np.arange(6).reshape(2, 3)
    for t, scale, zp in ((F32, 0.0, 0), (F16, 0.0, 0), (I32, 0.0, 0), (U8, 0.5, 3),
                         (S8, 0.25, -4)):
        got = mirror(tensor(t, a + 1, scale, zp), [[1, 1], [2, 2]], SYMMETRIC,
                     output(t, [4, 7], scale, zp))
        assert got.dtype == t.dtype
        np.testing.assert_array_equal(got, np.pad(a + 1, [(1, 1), (2, 2)], mode="symmetric"))


def test_mirror_pad_bounds_follow_the_mode():
    x = tensor(F32, [[1.0, 2.0]])
    # REFLECT mirrors at most dimension - 1 elements, SYMMETRIC at most the dimension.
    np.testing.assert_array_equal(mirror(x, [[0, 0], [2, 0]], SYMMETRIC, output(F32, [1, 4])),
                                  [[2, 1, 1, 2]])
    np.testing.assert_array_equal(mirror(x, [[0, 0], [1, 1]], REFLECT, output(F32, [1, 4])),
                                  [[2, 1, 2, 1]])
    for p, m in (([[0, 0], [2, 0]], REFLECT), ([[0, 0], [0, 3]], SYMMETRIC),
                 ([[1, 0], [0, 0]], REFLECT), ([[0, -1], [0, 0]], SYMMETRIC)):
        for const in (True, False):  # refused at validate, and at run time when not constant
            with pytest.raises(OpError, match="MIRROR_PAD") as e:
                mirror(x, p, m, output(F32), const=const)
            assert e.value.status == ErrorStatus.INVALID_ARGUMENT
            assert ("REFLECT" if m == REFLECT else "SYMMETRIC") in str(e.value) or \
                ">= 0" in str(e.value)


def test_mirror_pad_rejects_a_bad_mode_paddings_shape_rank_and_quantization():
    x = tensor(F32, [1.0, 2.0, 3.0])
    for const in (True, False):
        with pytest.raises(OpError, match="mode 2"):
            mirror(x, [[1, 1]], 2, output(F32), const=const)
    with pytest.raises(OpError, match=r"\[rank, 2\]"):
        mirror(x, [[1, 1], [0, 0]], REFLECT, output(F32))
    with pytest.raises(OpError, match=r"\[rank, 2\]"):
        run_op(O.MIRROR_PAD, [x, tensor(I32, [1, 1], const=True), tensor(T.INT32, 0)],
               [output(F32)])
    with pytest.raises(OpError, match="rank 0"):
        run_op(O.MIRROR_PAD, [tensor(F32, 1.0, shape=()), tensor(I32, np.zeros((0, 2)),
                                                                 const=True),
                              tensor(T.INT32, 0)], [output(F32)])
    with pytest.raises(OpError, match="scale and zero point"):
        mirror(tensor(U8, [1, 2], 0.5, 3), [[1, 0]], SYMMETRIC, output(U8, [3], 0.5, 4))
    with pytest.raises(OpError, match="type"):  # the signature: output of the input's type
        mirror(x, [[1, 0]], SYMMETRIC, output(I32))


def test_mirror_pad_zero_sized_input():
    x = tensor(F32, np.zeros((0, 2), np.float32))
    got = mirror(x, [[0, 0], [1, 1]], REFLECT, output(F32, [0, 4]))
    assert got.shape == (0, 4) and got.dtype == np.float32
    got = mirror(x, [[0, 0], [2, 0]], SYMMETRIC, output(F32, [0, 4]))
    assert got.shape == (0, 4)
    with pytest.raises(OpError, match="dimension 0"):  # an empty axis has nothing to mirror
        mirror(x, [[1, 0], [0, 0]], SYMMETRIC, output(F32), const=False)


def test_mirror_pad_prepare_infers_the_output_shape():
    x = tensor(F32, np.zeros((2, 3), np.float32))
    ctx = OpContext(O.MIRROR_PAD, [x[0], pads([[1, 0], [2, 2]])[0], tensor(T.INT32, 0)[0]],
                    [output(F32)])
    assert lookup(O.MIRROR_PAD).prepare(ctx) == [(3, 7)]
    ctx.inputs[1] = pads([[1, 0], [2, 2]], const=False)[0]
    assert lookup(O.MIRROR_PAD).prepare(ctx) == [(0, 0)]


# ---- REVERSE --------------------------------------------------------------------------------

def axis(a, const=True):
    return tensor(I32, [a], const=const)


def test_reverse_each_axis_every_type():
    a = np.arange(24).reshape(2, 3, 4)
    for t, scale, zp in ((F32, 0.0, 0), (F16, 0.0, 0), (I32, 0.0, 0), (U8, 0.5, 3),
                         (S8, 0.25, -4)):
        for k in range(3):
            for const in (True, False):
                (got,) = run_op(O.REVERSE, [tensor(t, a, scale, zp), axis(k, const)],
                                [output(t, a.shape, scale, zp)])
                assert got.dtype == t.dtype and got.flags.c_contiguous
                np.testing.assert_array_equal(got, np.flip(a, k))


def test_reverse_zero_sized_and_rank_8():
    (got,) = run_op(O.REVERSE, [tensor(F32, np.zeros((3, 0), np.float32)), axis(0)],
                    [output(F32, [3, 0])])
    assert got.shape == (3, 0)
    a = np.arange(2 ** 8).reshape((2,) * 8)
    (got,) = run_op(O.REVERSE, [tensor(I32, a), axis(7)], [output(I32, a.shape)])
    np.testing.assert_array_equal(got, np.flip(a, 7))
    with pytest.raises(OpError, match="rank 9"):
        run_op(O.REVERSE, [tensor(I32, np.zeros((1,) * 9)), axis(0)], [output(I32)])


def test_reverse_rejects_an_axis_out_of_range_or_not_one_value():
    x = tensor(F32, np.zeros((2, 3), np.float32))
    for a in (-1, 2):
        for const in (True, False):
            with pytest.raises(OpError, match=rf"axis {a} is not in \[0, 2\)") as e:
                run_op(O.REVERSE, [x, axis(a, const)], [output(F32)])
            assert e.value.status == ErrorStatus.INVALID_ARGUMENT
    for const in (True, False):
        with pytest.raises(OpError, match="axis"):
            run_op(O.REVERSE, [x, tensor(I32, [0, 1], const=const)], [output(F32)])
    with pytest.raises(OpError, match="scale and zero point"):
        run_op(O.REVERSE, [tensor(S8, [1, 2], 0.5, 0), axis(0)], [output(S8, [2], 0.5, 1)])


# ---- feature levels -------------------------------------------------------------------------

def test_each_reports_the_feature_level_that_added_it():
    x = tensor(F32, [1.0, 2.0])
    assert level(O.MIRROR_PAD, [x, pads([[1, 1]]), tensor(T.INT32, 0)],
                 [output(F32, [4])]) == FeatureLevel.AIDL_V3
    assert level(O.REVERSE, [x, axis(0)], [output(F32, [2])]) == FeatureLevel.AIDL_V3
    shape = tensor(I32, [2], const=True)
    assert level(O.RESHAPE, [tensor(I32, [1, 2]), shape], [output(I32, [2])]) == \
        FeatureLevel.AIDL_V2
    assert level(O.RESHAPE, [x, shape], [output(F32, [2])]) == FeatureLevel.V1_0


def test_reshape_of_int32():
    (got,) = run_op(O.RESHAPE, [tensor(I32, [[1, 2, 3], [4, 5, 6]]),
                                tensor(I32, [-1], const=True)], [output(I32, [6])])
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [1, 2, 3, 4, 5, 6])


# ---- drivers --------------------------------------------------------------------------------

def _mirror_model():
    b = ModelBuilder()
    x = b.input(F32, [2, 3])
    out = b.output(F32, [4, 3])
    b.operation(O.MIRROR_PAD, [x, b.constant(I32, np.int32([[1, 1], [0, 0]]), [2, 2]),
                               b.scalar(T.INT32, SYMMETRIC)], [out])
    y = b.output(F32, [2, 3])
    b.operation(O.REVERSE, [x, b.constant(I32, np.int32([1]), [1])], [y])
    return b.build()


def test_litert_claims_both():
    support = pytest.importorskip("nnhal.drivers.litert.support")
    from nnhal.analysis import analyse

    graph = analyse(_mirror_model(), own_constants=False)
    assert support.supported_operations(graph) == [True, True]
    assert support.refusal(graph) is None
