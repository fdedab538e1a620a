"""Kernels that bind their constant parameters at prepare (STRIDED_SLICE, SLICE, RESHAPE,
CONCATENATION) and the kernel_into of QUANTIZE / DEQUANTIZE: bit for bit what the run-time
path (parameters given as non-constant inputs, the unbound code) gives, on random data."""

from __future__ import annotations

import numpy as np
import pytest

from nnhal.hal.types import OperandLifeTime, OperandType, OperationType
from nnhal.ops import catalog  # noqa: F401 - registers every operation
from nnhal.ops.resolver import OpContext, OperandInfo, definitions

T = OperandType
O = OperationType
CONST = OperandLifeTime.CONSTANT_COPY
TEMP = OperandLifeTime.TEMPORARY_VARIABLE
rng = np.random.default_rng(8)
Q8S = T.TENSOR_QUANT8_ASYMM_SIGNED


def info(t, shape, value=None, scale=0.0, zp=0, const=True) -> OperandInfo:
    lt = CONST if (const and value is not None) else TEMP
    return OperandInfo(t, tuple(shape), scale=scale, zero_point=zp, lifetime=lt,
                       value=None if lt == TEMP else value)


def three_ways(op, x_info, params, out_info, x):
    """(run-time path, bound kernel, kernel_into) outputs for input x and constant params
    [(type, shape, value)]."""
    d = definitions()[int(op)]
    const_ctx = OpContext(op, [x_info] + [info(t, s, v) for t, s, v in params], [out_info])
    d.validate(const_ctx)
    free_ctx = OpContext(op, [info(x_info.type, x_info.shape, scale=x_info.scale,
                                   zp=x_info.zero_point)]
                         + [info(t, s, v, const=False) for t, s, v in params], [out_info])
    ins = [x] + [np.asarray(v, t.dtype) for t, _, v in params]
    slow = np.asarray(d.kernel(free_ctx)(list(ins), None)[0])
    fast = np.asarray(d.kernel(const_ctx)(list(ins), None)[0])
    into = d.kernel_into(const_ctx)
    got = None
    if into is not None:
        got = np.full(slow.shape, 7, slow.dtype)
        copy = x.copy()
        into(list(ins), [got], None)
        np.testing.assert_array_equal(x, copy)
    return slow, fast, got


def rand8(shape):
    return rng.integers(-128, 128, size=shape, dtype=np.int8)


@pytest.mark.parametrize("shape,begin,end,strides,masks", [
    ((1, 5, 1, 40), [0, 3, 0, 0], [1, 5, 1, 40], [1, 1, 1, 1], (0, 0, 0)),
    ((1, 13, 1, 32), [0, 0, 0, 0], [1, 13, 1, 32], [1, 2, 1, 1], (0, 0, 0)),
    ((2, 7, 3, 5), [1, -1, 0, 4], [2, -8, 3, 0], [1, -2, 1, -1], (0, 0, 1)),
    ((2, 7, 3, 5), [0, 6, 2, 1], [0, 0, 0, 5], [1, -3, -1, 2], (0b0101, 0b1010, 0)),
    ((4, 6), [1, 2], [2, 5], [1, 1], (0, 0, 0b01)),
    ((4, 6), [3, 0], [4, 1], [1, 1], (0, 0, 0b11)),
    ((4, 6), [2, 1], [2, 5], [1, 1], (0, 0, 0)),  # empty
])
def test_strided_slice_bound_matches_runtime(shape, begin, end, strides, masks):
    x = rand8(shape)
    d = definitions()[int(O.STRIDED_SLICE)]
    params = [(T.TENSOR_INT32, (len(shape),), np.array(v, np.int32))
              for v in (begin, end, strides)] + [(T.INT32, (), np.int32(m)) for m in masks]
    x_info = info(Q8S, shape, scale=0.5, zp=3)
    probe = OpContext(O.STRIDED_SLICE, [x_info] + [info(t, s, v) for t, s, v in params],
                      [info(Q8S, (0,), scale=0.5, zp=3)])
    out_shape = d.prepare(probe)[0]
    slow, fast, got = three_ways(O.STRIDED_SLICE, x_info, params,
                                 info(Q8S, out_shape, scale=0.5, zp=3), x)
    assert slow.shape == tuple(out_shape)
    np.testing.assert_array_equal(fast, slow)
    assert got is not None
    np.testing.assert_array_equal(got, slow)


@pytest.mark.parametrize("shape,begin,size", [
    ((1, 9, 1, 64), [0, 0, 0, 32], [1, 9, 1, 32]),
    ((1, 9, 1, 64), [0, 2, 0, 0], [-1, -1, -1, 32]),
    ((3, 4), [1, 4], [2, 0]),
])
def test_slice_bound_matches_runtime(shape, begin, size):
    x = rand8(shape)
    out_shape = tuple(d - b if s == -1 else s for d, b, s in zip(shape, begin, size))
    params = [(T.TENSOR_INT32, (len(shape),), np.array(v, np.int32)) for v in (begin, size)]
    slow, fast, got = three_ways(O.SLICE, info(Q8S, shape, scale=1.0), params,
                                 info(Q8S, out_shape, scale=1.0), x)
    assert slow.shape == out_shape
    np.testing.assert_array_equal(fast, slow)
    np.testing.assert_array_equal(got, slow)


@pytest.mark.parametrize("shape,target", [((1, 3, 40), (1, 3, 1, 40)),
                                          ((1, 1, 1, 64), (1, -1)), ((2, 6), (-1,))])
def test_reshape_bound_matches_runtime(shape, target):
    x = rand8(shape)
    out_shape = np.empty(shape).reshape(target).shape
    params = [(T.TENSOR_INT32, (len(target),), np.array(target, np.int32))]
    slow, fast, got = three_ways(O.RESHAPE, info(Q8S, shape, scale=1.0), params,
                                 info(Q8S, out_shape, scale=1.0), x)
    assert got is None
    assert fast.shape == slow.shape == out_shape
    np.testing.assert_array_equal(fast, slow)


@pytest.mark.parametrize("requant", [False, True])
@pytest.mark.parametrize("shapes,axis", [([(1, 2, 1, 40), (1, 3, 1, 40)], 1),
                                         ([(1, 1, 1, 32), (1, 1, 1, 32)], -1),
                                         ([(2, 3), (2, 2), (2, 4), (2, 1)], 1)])
def test_concatenation_bound_matches_runtime(shapes, axis, requant):
    d = definitions()[int(O.CONCATENATION)]
    xs = [rand8(s) for s in shapes]
    ins_info = [info(Q8S, s, scale=(0.3 + 0.1 * k) if requant else 0.25,
                     zp=(k - 2) if requant else 1) for k, s in enumerate(shapes)]
    ax = axis % len(shapes[0])
    out_shape = list(shapes[0])
    out_shape[ax] = sum(s[ax] for s in shapes)
    out = info(Q8S, out_shape, scale=0.25, zp=1)
    axis_c = info(T.INT32, (), np.int32(axis))
    const_ctx = OpContext(O.CONCATENATION, ins_info + [axis_c], [out])
    d.validate(const_ctx)
    free_ctx = OpContext(O.CONCATENATION, ins_info + [info(T.INT32, (), None)], [out])
    ins = xs + [np.int32(axis)]
    slow = d.kernel(free_ctx)(list(ins), None)[0]
    fast = d.kernel(const_ctx)(list(ins), None)[0]
    got = np.full(slow.shape, 7, np.int8)
    d.kernel_into(const_ctx)(list(ins), [got], None)
    assert slow.shape == tuple(out_shape)
    np.testing.assert_array_equal(fast, slow)
    np.testing.assert_array_equal(got, slow)


@pytest.mark.parametrize("out_type,scale,zp", [(T.TENSOR_QUANT8_ASYMM, 1 / 256, 0),
                                               (Q8S, 0.0173, -5),
                                               (T.TENSOR_QUANT8_ASYMM, 0.5, 128)])
def test_quantize_into_matches_kernel(out_type, scale, zp):
    d = definitions()[int(O.QUANTIZE)]
    x = (rng.standard_normal((3, 50)) * 3).astype(np.float32)
    # Exact halves, NaN, infinities, huge values, signed zeros.
    special = np.array([0.5, -0.5, 1.5, -1.5, 2.5, np.nan, np.inf, -np.inf, 3e38, -3e38, 0.0,
                        -0.0, 0.49999997, -0.49999997], np.float32) * np.float32(scale)
    special[5:10] = [np.nan, np.inf, -np.inf, 3e38, -3e38]
    x[0, :len(special)] = special
    ctx = OpContext(O.QUANTIZE, [info(T.TENSOR_FLOAT32, x.shape)],
                    [info(out_type, x.shape, scale=scale, zp=zp)])
    d.validate(ctx)
    ref = d.kernel(ctx)([x], None)[0]
    got = np.full(x.shape, 7, out_type.dtype)
    d.kernel_into(ctx)([x], [got], None)
    np.testing.assert_array_equal(got, ref)
    assert got[0, 5] == 0  # NaN


@pytest.mark.parametrize("in_type,scale,zp", [(Q8S, 0.0173, -5), (T.TENSOR_QUANT8_ASYMM, 3e37, 7),
                                              (T.TENSOR_QUANT8_ASYMM, 1 / 256, 0)])
def test_dequantize_into_matches_kernel(in_type, scale, zp):
    d = definitions()[int(O.DEQUANTIZE)]
    lo, hi = (-128, 128) if in_type == Q8S else (0, 256)
    x = rng.integers(lo, hi, size=(2, 3, 40)).astype(in_type.dtype)
    ctx = OpContext(O.DEQUANTIZE, [info(in_type, x.shape, scale=scale, zp=zp)],
                    [info(T.TENSOR_FLOAT32, x.shape)])
    d.validate(ctx)
    ref = d.kernel(ctx)([x], None)[0]
    got = np.full(x.shape, np.nan, np.float32)
    d.kernel_into(ctx)([x], [got], None)
    np.testing.assert_array_equal(got, ref)
