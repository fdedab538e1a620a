"""PACK (AIDL v2): every axis and type, one input, empty tensors, run-time axes, invalid
operands, and that the LiteRT driver claims it."""

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
from nnhal.ops.testing import output, run_op, tensor

F32, F16, I32, U8, S8 = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32,
                         T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
QUANT = {U8: (0.5, 4), S8: (0.25, -3)}


def axis(v):
    return tensor(T.INT32, v)


def context(inputs, outputs):
    return OpContext(op_type=O.PACK, inputs=[i for i, _ in inputs], outputs=list(outputs))


def operand(t, value, **kw):
    scale, zp = QUANT.get(t, (0.0, 0))
    return tensor(t, value, scale, zp, **kw)


@pytest.mark.parametrize("t", [F32, F16, I32, U8, S8])
@pytest.mark.parametrize("ax", [0, 1, 2])
def test_every_axis_and_type(t, ax):
    arrays = [(np.arange(6) + 10 * k).astype(t.dtype).reshape(2, 3) for k in range(3)]
    expected = np.stack(arrays, axis=ax)
    scale, zp = QUANT.get(t, (0.0, 0))
    inputs = [axis(ax), *(operand(t, a) for a in arrays)]
    outs = [output(t, expected.shape, scale, zp)]
    assert lookup(O.PACK).prepare(context(inputs, outs)) == [expected.shape]
    (out,) = run_op(O.PACK, inputs, outs)
    assert out.dtype == t.dtype
    np.testing.assert_array_equal(out, expected)


def test_one_input_adds_a_dimension():
    a = np.arange(4, dtype=np.float32)
    (out,) = run_op(O.PACK, [axis(1), tensor(F32, a)], [output(F32, (4, 1))])
    np.testing.assert_array_equal(out, a.reshape(4, 1))


def test_empty_tensors():
    a = np.zeros((0, 3), np.float32)
    (out,) = run_op(O.PACK, [axis(1), tensor(F32, a), tensor(F32, a)], [output(F32, (0, 2, 3))])
    assert out.shape == (0, 2, 3)


def test_axis_given_at_run_time():
    arrays = [np.full((2, 2), k, np.int32) for k in range(3)]
    runtime = OperandInfo(type=T.INT32, shape=())
    inputs = [(runtime, np.array(2, np.int32)), *(tensor(I32, a) for a in arrays)]
    outs = [output(I32, (0, 0, 0))]
    assert lookup(O.PACK).prepare(context(inputs, outs)) == [(0, 0, 0)]
    (out,) = run_op(O.PACK, inputs, outs)
    np.testing.assert_array_equal(out, np.stack(arrays, axis=2))
    inputs[0] = (runtime, np.array(3, np.int32))
    with pytest.raises(OpError, match="axis 3") as e:
        run_op(O.PACK, inputs, outs)
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


def test_kernel_into_writes_each_input_in_its_slice():
    arrays = [np.full((2, 3), k, np.float32) for k in range(4)]
    inputs = [axis(1), *(tensor(F32, a) for a in arrays)]
    ctx = context(inputs, [output(F32, (2, 4, 3))])
    check_operation(lookup(O.PACK), ctx)
    dst = np.full((2, 4, 3), np.nan, np.float32)
    lookup(O.PACK).kernel_into(ctx)([v for _, v in inputs], [dst], None)
    np.testing.assert_array_equal(dst, np.stack(arrays, axis=1))


def test_declared_at_aidl_v2():
    ctx = context([axis(0), tensor(F32, np.zeros(2, np.float32))], [output(F32, (1, 2))])
    assert check_operation(lookup(O.PACK), ctx) == FeatureLevel.AIDL_V2


@pytest.mark.parametrize("ax, shapes, out_shape, message", [
    (-1, [(2, 3), (2, 3)], (2, 3, 2), "axis -1"),           # the range is [0, rank + 1)
    (3, [(2, 3), (2, 3)], (2, 3, 2), "axis 3"),
    (0, [(2, 3), (2, 4)], (2, 2, 3), "dimension 1 differs"),
    (0, [(2, 3), (2, 3, 1)], (2, 2, 3), "same rank"),
    (0, [(), ()], (2,), "rank"),                              # rank 0 tensors
])
def test_invalid_shapes_and_axes(ax, shapes, out_shape, message):
    inputs = [axis(ax), *(tensor(F32, np.zeros(s, np.float32)) for s in shapes)]
    with pytest.raises(OpError, match=message) as e:
        run_op(O.PACK, inputs, [output(F32, out_shape)])
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


@pytest.mark.parametrize("second, out", [((0.5, 5), (0.5, 4)), ((0.25, 4), (0.5, 4)),
                                         ((0.5, 4), (0.5, 5)), ((0.5, 4), (1.0, 4))])
def test_quantization_must_be_shared(second, out):
    a = np.zeros((2,), np.uint8)
    inputs = [axis(0), tensor(U8, a, 0.5, 4), tensor(U8, a, *second)]
    with pytest.raises(OpError, match="scale and zero point") as e:
        run_op(O.PACK, inputs, [output(U8, (2, 2), *out)])
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


def test_types_must_agree():
    with pytest.raises(OpError, match="input 2"):
        run_op(O.PACK, [axis(0), tensor(F32, np.zeros(2, np.float32)),
                        tensor(I32, np.zeros(2, np.int32))], [output(F32, (2, 2))])
    with pytest.raises(OpError, match="TENSOR_BOOL8"):
        run_op(O.PACK, [axis(0), tensor(T.TENSOR_BOOL8, np.zeros(2, bool))],
               [output(T.TENSOR_BOOL8, (1, 2))])


def test_litert_driver_claims_it():
    b = ModelBuilder()
    x, y = b.input(F32, [2, 3]), b.input(F32, [2, 3])
    out = b.output(F32, [2, 2, 3])
    b.operation(O.PACK, [b.scalar(T.INT32, 0), x, y], [out])
    assert supported_operations(analyse(b.build(), own_constants=False)) == [True]
