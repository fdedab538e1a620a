"""BATCH_MATMUL (AIDL v2): shapes, adjoints, every type's arithmetic, empty tensors, invalid
operands, and which of it the LiteRT driver claims (tests/drivers/test_litert_aidl_ops.py
runs what it claims)."""

import numpy as np
import pytest

from nnhal.analysis import analyse
from nnhal.core.version import FeatureLevel
from nnhal.drivers.litert.support import supported_operations
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import ErrorStatus
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.catalog import check_operation, lookup
from nnhal.ops.resolver import OpContext, OperandInfo, OpError
from nnhal.ops.testing import omitted, output, run_op, tensor

F32, F16, I32, S8, U8 = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32,
                         T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_ASYMM)


def flag(v):
    return tensor(T.BOOL, v)


def context(inputs, outputs):
    return OpContext(op_type=O.BATCH_MATMUL, inputs=[i for i, _ in inputs], outputs=list(outputs))


def reference(x, y, adj_x, adj_y):
    return np.matmul(np.swapaxes(x, -1, -2) if adj_x else x,
                     np.swapaxes(y, -1, -2) if adj_y else y)


@pytest.mark.parametrize("adj_x", [False, True])
@pytest.mark.parametrize("adj_y", [False, True])
@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_float32_every_rank_and_adjoint(batch, adj_x, adj_y):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((*batch, *((5, 4) if adj_x else (4, 5)))).astype(np.float32)
    y = rng.standard_normal((*batch, *((6, 5) if adj_y else (5, 6)))).astype(np.float32)
    inputs = [tensor(F32, x), tensor(F32, y), flag(adj_x), flag(adj_y)]
    outs = [output(F32, (*batch, 4, 6))]
    assert lookup(O.BATCH_MATMUL).prepare(context(inputs, outs)) == [(*batch, 4, 6)]
    (out,) = run_op(O.BATCH_MATMUL, inputs, outs)
    assert out.dtype == np.float32 and out.shape == (*batch, 4, 6)
    np.testing.assert_allclose(out, reference(x, y, adj_x, adj_y), rtol=1e-5, atol=1e-5)


def test_flags_absent_or_omitted_default_to_false():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.arange(12, dtype=np.float32).reshape(3, 4)
    expected = x @ y
    (a,) = run_op(O.BATCH_MATMUL, [tensor(F32, x), tensor(F32, y)], [output(F32, (2, 4))])
    (b,) = run_op(O.BATCH_MATMUL, [tensor(F32, x), tensor(F32, y), omitted(T.BOOL),
                                   omitted(T.BOOL)], [output(F32, (2, 4))])
    np.testing.assert_array_equal(a, expected)
    np.testing.assert_array_equal(b, expected)


def test_flags_given_at_run_time():
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    y = np.arange(12, dtype=np.float32).reshape(3, 4)
    runtime = OperandInfo(type=T.BOOL, shape=())
    inputs = [tensor(F32, x), tensor(F32, y), (runtime, np.array(True)), flag(False)]
    outs = [output(F32, (0, 0))]
    assert lookup(O.BATCH_MATMUL).prepare(context(inputs, outs)) == [(0, 4)]
    (out,) = run_op(O.BATCH_MATMUL, inputs, outs)
    np.testing.assert_array_equal(out, x.T @ y)


def test_float16_computes_in_float32_then_rounds():
    x = np.array([[1.0, 1e-3, 1e-3]], np.float16)
    y = np.array([[2048.0], [1.0], [1.0]], np.float16)
    (out,) = run_op(O.BATCH_MATMUL, [tensor(F16, x), tensor(F16, y)], [output(F16, (1, 1))])
    assert out.dtype == np.float16
    expected = (x.astype(np.float32) @ y.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(out, expected)


def test_int32_wraps_like_int32_arithmetic():
    x = np.array([[1 << 20, 1 << 20, 7]], np.int32)
    y = np.array([[1 << 12], [1 << 12], [-3]], np.int32)
    (out,) = run_op(O.BATCH_MATMUL, [tensor(I32, x), tensor(I32, y)], [output(I32, (1, 1))])
    exact = 2 * (1 << 32) - 21
    wrapped = (exact + (1 << 31)) % (1 << 32) - (1 << 31)
    assert out.dtype == np.int32 and int(out[0, 0]) == wrapped == -21


def test_quant8_signed_rounds_half_away_from_zero():
    # Real multiplier 0.5 * 0.5 / 1.0 = 0.25: the accumulator divided by 4, halves away from 0.
    x = np.array([[6, 0], [-6, 0], [2, 0], [-2, 0], [3, 0]], np.int8)  # zero point 0
    y = np.array([[11], [5]], np.int8)  # zero point 10: the centred column is [1, -5]
    (out,) = run_op(O.BATCH_MATMUL, [tensor(S8, x, 0.5, 0), tensor(S8, y, 0.5, 10)],
                    [output(S8, (5, 1), 1.0, 3)])
    # accumulators 6, -6, 2, -2, 3 -> 1.5, -1.5, 0.5, -0.5, 0.75 -> 2, -2, 1, -1, 1; + 3
    assert out.dtype == np.int8
    np.testing.assert_array_equal(out.reshape(-1), [5, 1, 4, 2, 4])


def test_quant8_signed_saturates():
    x = np.full((2, 1, 8), 127, np.int8)
    x[1] = -128
    y = np.full((2, 8, 1), 127, np.int8)
    (out,) = run_op(O.BATCH_MATMUL, [tensor(S8, x, 1.0, 0), tensor(S8, y, 1.0, 0)],
                    [output(S8, (2, 1, 1), 1.0, 0)])
    np.testing.assert_array_equal(out.reshape(-1), [127, -128])


def test_quant8_signed_matches_the_real_product_within_one_step():
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (2, 3, 7), dtype=np.int8)
    y = rng.integers(-128, 128, (2, 7, 4), dtype=np.int8)
    sx, zx, sy, zy, so, zo = 0.05, -3, 0.02, 7, 0.6, 5
    (out,) = run_op(O.BATCH_MATMUL, [tensor(S8, x, sx, zx), tensor(S8, y, sy, zy)],
                    [output(S8, (2, 3, 4), so, zo)])
    real = ((x.astype(np.float64) - zx) * sx) @ ((y.astype(np.float64) - zy) * sy)
    ideal = np.clip(np.round(real / so) + zo, -128, 127)
    assert np.abs(out.astype(np.int64) - ideal).max() <= 1


@pytest.mark.parametrize("t, scale", [(F32, 0.0), (S8, 0.5)])
def test_empty_tensors(t, scale):
    z = 3 if t == S8 else 0
    x = np.zeros((0, 2, 3), t.dtype)
    y = np.zeros((0, 3, 4), t.dtype)
    (out,) = run_op(O.BATCH_MATMUL, [tensor(t, x, scale), tensor(t, y, scale)],
                    [output(t, (0, 2, 4), scale, z)])
    assert out.shape == (0, 2, 4)
    # An empty inner dimension: every sum is empty, so every output is the logical zero.
    (out,) = run_op(O.BATCH_MATMUL, [tensor(t, np.zeros((2, 0), t.dtype), scale),
                                     tensor(t, np.zeros((0, 3), t.dtype), scale)],
                    [output(t, (2, 3), scale, z)])
    np.testing.assert_array_equal(out, np.full((2, 3), z, t.dtype))


def test_kernel_into_writes_the_planned_output():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    y = np.arange(40, dtype=np.float32).reshape(2, 5, 4)
    inputs = [tensor(F32, x), tensor(F32, y), flag(False), flag(True)]
    ctx = context(inputs, [output(F32, (2, 3, 5))])
    check_operation(lookup(O.BATCH_MATMUL), ctx)
    dst = np.full((2, 3, 5), np.nan, np.float32)
    lookup(O.BATCH_MATMUL).kernel_into(ctx)([v for _, v in inputs], [dst], None)
    np.testing.assert_allclose(dst, reference(x, y, False, True))


def test_declared_at_aidl_v2():
    ctx = context([tensor(F32, np.zeros((2, 2), np.float32))] * 2, [output(F32, (2, 2))])
    assert check_operation(lookup(O.BATCH_MATMUL), ctx) == FeatureLevel.AIDL_V2


@pytest.mark.parametrize("x_shape, y_shape, flags, out_shape, message", [
    ((2, 3), (2, 3, 4), (False, False), (2, 4), "rank"),
    ((2,), (2,), (False, False), (1,), "rank"),
    ((1, 1, 1, 2, 3), (1, 1, 1, 3, 4), (False, False), (1, 1, 1, 2, 4), "rank"),
    ((2, 2, 3), (3, 3, 4), (False, False), (2, 2, 4), "batch dimension 0"),
    ((2, 3), (4, 5), (False, False), (2, 5), "inner dimensions"),
    ((2, 3), (4, 3), (True, True), (3, 4), "inner dimensions"),
    ((2, 3), (3, 4), (False, False), (2, 4, 1), "output has rank"),
])
def test_invalid_shapes(x_shape, y_shape, flags, out_shape, message):
    inputs = [tensor(F32, np.zeros(x_shape, np.float32)),
              tensor(F32, np.zeros(y_shape, np.float32)), flag(flags[0]), flag(flags[1])]
    with pytest.raises(OpError, match=message) as e:
        run_op(O.BATCH_MATMUL, inputs, [output(F32, out_shape)])
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


@pytest.mark.parametrize("types, message", [
    ((U8, U8, U8), "TENSOR_QUANT8_ASYMM"),   # not a BATCH_MATMUL type
    ((F32, F16, F32), "input 1"),             # the inputs disagree
    ((F32, F32, I32), "output 0"),            # the output disagrees
])
def test_invalid_types(types, message):
    a, b, o = types
    inputs = [tensor(a, np.zeros((2, 2), a.dtype), 0.5), tensor(b, np.zeros((2, 2), b.dtype), 0.5)]
    with pytest.raises(OpError, match=message) as e:
        run_op(O.BATCH_MATMUL, inputs, [output(o, (2, 2), 0.5)])
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


def test_run_time_shapes_checked():
    unknown = OperandInfo(type=F32, shape=(0, 0))
    inputs = [(unknown, np.zeros((2, 3), np.float32)), (unknown, np.zeros((4, 5), np.float32))]
    with pytest.raises(OpError, match="inner dimensions") as e:
        run_op(O.BATCH_MATMUL, inputs, [output(F32, (0, 0))])
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


def test_litert_driver_claims_it_but_for_int32():
    for t, claimed in ((F32, True), (T.TENSOR_INT32, False)):
        b = ModelBuilder()
        x, y = b.input(t, [2, 3]), b.input(t, [3, 4])
        out = b.output(t, [2, 4])
        b.operation(O.BATCH_MATMUL, [x, y, b.scalar(T.BOOL, False), b.scalar(T.BOOL, False)],
                    [out])
        assert supported_operations(analyse(b.build(), own_constants=False)) == [claimed]
