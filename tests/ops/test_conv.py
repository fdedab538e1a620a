"""CONV_2D, DEPTHWISE_CONV_2D, GROUPED_CONV_2D, TRANSPOSE_CONV_2D and FULLY_CONNECTED with
hand-computed expectations."""

from __future__ import annotations

import numpy as np
import pytest

from nnhal.hal.types import OperandLifeTime, OperandType, OperationType
from nnhal.ops.catalog import lookup
from nnhal.ops.conv import explicit_padding
from nnhal.ops.resolver import OpContext, OperandInfo, OpError
from nnhal.ops.testing import omitted, output, run_op, tensor

T = OperandType
O = OperationType
F32 = T.TENSOR_FLOAT32
U8 = T.TENSOR_QUANT8_ASYMM
S8 = T.TENSOR_QUANT8_ASYMM_SIGNED
PC = T.TENSOR_QUANT8_SYMM_PER_CHANNEL


def i32(v: int):
    return tensor(T.INT32, v)


def flag(v: bool):
    return tensor(T.BOOL, v)


def runtime_scalar(t: OperandType, v):
    """A scalar that is a model input, so only known at run time."""
    info = OperandInfo(type=t, shape=(), lifetime=OperandLifeTime.SUBGRAPH_INPUT)
    return info, np.asarray(v, dtype=t.dtype)


X33 = np.arange(1, 10, dtype=np.float32).reshape(1, 3, 3, 1)


def conv_explicit(x, f, b, pads=(0, 0, 0, 0), strides=(1, 1), act=0, *extra, t=F32,
                  scales=((0.0, 0), (0.0, 0), (0.0, 0)), out_shape=None, out_q=(0.0, 0),
                  ftype=None, channel_scales=None, bias_type=None):
    ins = [tensor(t, x, *scales[0]),
           tensor(ftype or t, f, *scales[1], const=True, channel_scales=channel_scales),
           tensor(bias_type or (F32 if t == F32 else T.TENSOR_INT32), b, *scales[2], const=True)]
    ins += [i32(p) for p in pads] + [i32(strides[0]), i32(strides[1]), i32(act)]
    ins += list(extra)
    return ins, [output(t, out_shape, *out_q)]


# ---- CONV_2D -------------------------------------------------------------------------------

def test_conv_valid_explicit():
    ins, outs = conv_explicit(X33, np.ones((1, 2, 2, 1)), [0.0])
    (r,) = run_op(O.CONV_2D, ins, outs)
    assert r.dtype == np.float32
    np.testing.assert_allclose(r.reshape(2, 2), [[12, 16], [24, 28]])


def test_conv_implicit_same_pads_bottom_right():
    ins = [tensor(F32, X33), tensor(F32, np.ones((1, 2, 2, 1)), const=True),
           tensor(F32, [0.5], const=True), i32(1), i32(1), i32(1), i32(0)]
    (r,) = run_op(O.CONV_2D, ins, [output(F32)])
    np.testing.assert_allclose(r.reshape(3, 3), np.array(
        [[12, 16, 9], [24, 28, 15], [15, 17, 9]]) + 0.5)


def test_explicit_padding_same():
    assert explicit_padding(3, 1, 1, 2, 1) == (0, 1)
    assert explicit_padding(224, 2, 1, 3, 1) == (0, 1)
    assert explicit_padding(5, 1, 2, 3, 1) == (2, 2)
    assert explicit_padding(5, 1, 1, 3, 2) == (0, 0)
    # Transpose conv: tail fits the last stride, even when negative.
    assert explicit_padding(4, 2, 1, 1, 1, transpose=True) == (0, -1)


def test_conv_stride_relu6_and_multichannel():
    x = np.array([1, -1, 2, -2, 3, -3, 4, -4], np.float32).reshape(1, 2, 2, 2)
    f = np.array([[1, 0], [0, 1]], np.float32).reshape(2, 1, 1, 2)  # two 1x1 filters
    ins, outs = conv_explicit(x, f, [5.0, 0.0], strides=(2, 2), act=3)
    (r,) = run_op(O.CONV_2D, ins, outs)
    # Only pixel (0, 0) is visited: [1 + 5, -1 + 0] clamped to [0, 6].
    np.testing.assert_allclose(r, np.array([6, 0], np.float32).reshape(1, 1, 1, 2))


def test_conv_nchw_matches_nhwc():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 4, 3)).astype(np.float32)
    f = rng.standard_normal((4, 3, 2, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    ins, outs = conv_explicit(x, f, b, (1, 0, 2, 1), (2, 1), 0, flag(False))
    (nhwc,) = run_op(O.CONV_2D, ins, outs)
    ins, outs = conv_explicit(x.transpose(0, 3, 1, 2), f, b, (1, 0, 2, 1), (2, 1), 0, flag(True))
    (nchw,) = run_op(O.CONV_2D, ins, outs)
    assert nchw.shape == (2, 4, 6, 2)
    # float32 sums in different orders (NHWC may run the native kernel, NCHW numpy's GEMM):
    # a few ulp of the terms apart, so an absolute tolerance for values near zero.
    np.testing.assert_allclose(nchw.transpose(0, 2, 3, 1), nhwc, rtol=1e-6, atol=1e-6)
    # Brute force reference for one output element (pads top=2, left=1, stride h=1, w=2).
    xp = np.pad(x, ((0, 0), (2, 1), (1, 0), (0, 0)))
    ref = (xp[1, 2:5, 2:4, :] * f[3]).sum() + b[3]
    np.testing.assert_allclose(nhwc[1, 2, 1, 3], ref, rtol=1e-5)


def test_conv_dilation():
    x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
    ins, outs = conv_explicit(x, np.ones((1, 2, 2, 1)), [0.0], (0, 0, 0, 0), (1, 1), 0,
                              flag(False), i32(2), i32(2))
    (r,) = run_op(O.CONV_2D, ins, outs)
    xs = x[0, :, :, 0]
    expected = [[xs[i, j] + xs[i, j + 2] + xs[i + 2, j] + xs[i + 2, j + 2] for j in range(2)]
                for i in range(2)]
    np.testing.assert_allclose(r.reshape(2, 2), expected)


def test_conv_zero_batch():
    ins, outs = conv_explicit(np.zeros((0, 3, 3, 1), np.float32), np.ones((2, 2, 2, 1)),
                              [0.0, 1.0])
    (r,) = run_op(O.CONV_2D, ins, outs)
    assert r.shape == (0, 2, 2, 2) and r.dtype == np.float32


def test_conv_float16():
    ins, outs = conv_explicit(X33.astype(np.float16), np.ones((1, 2, 2, 1)), [0.25],
                              t=T.TENSOR_FLOAT16, bias_type=T.TENSOR_FLOAT16)
    (r,) = run_op(O.CONV_2D, ins, outs)
    assert r.dtype == np.float16
    np.testing.assert_allclose(r.reshape(2, 2), [[12.25, 16.25], [24.25, 28.25]])


@pytest.mark.parametrize("bias, act, expected", [
    (8, 0, 32), (10, 0, 33), (4, 0, 31), (10, 3, 22), (-200, 0, 0),
    # 89 * 0.25 = 22.25, but the reference rounds twice (doubling high multiply by 2**30, then
    # a rounding shift by 1): 89 -> 45 -> 23.
    (9, 0, 33)])
def test_conv_quant8_rounding_and_clamping(bias, act, expected):
    # real: x = [1, 2, 3, 4], filter = 1, so acc = 80 (int) and output = (80 + bias) / 4 + 10.
    ins, outs = conv_explicit(np.array([130, 132, 134, 136]).reshape(1, 2, 2, 1),
                              np.full((1, 2, 2, 1), 132), [bias], act=act, t=U8,
                              scales=((0.5, 128), (0.25, 128), (0.125, 0)), out_q=(0.5, 10))
    (r,) = run_op(O.CONV_2D, ins, outs)
    assert r.dtype == np.uint8 and r.reshape(-1).tolist() == [expected]


def test_conv_quant8_signed():
    ins, outs = conv_explicit(np.array([2, 4, 6, 8]).reshape(1, 2, 2, 1),
                              np.full((1, 2, 2, 1), 4), [10], t=S8,
                              scales=((0.5, 0), (0.25, 0), (0.125, 0)), out_q=(0.5, -118))
    (r,) = run_op(O.CONV_2D, ins, outs)
    assert r.dtype == np.int8 and r.reshape(-1).tolist() == [23 - 118]


@pytest.mark.parametrize("t, zp", [(U8, 0), (S8, -128)])
def test_conv_per_channel(t, zp):
    x = np.array([4, -2]) + (128 if t == U8 else 0)
    f = np.array([[2, 4], [4, 4]]).reshape(2, 1, 1, 2)
    ins, outs = conv_explicit(x.reshape(1, 1, 1, 2), f, [4, 8], t=t, ftype=PC,
                              channel_scales=[0.5, 0.25],
                              scales=((0.5, 128 if t == U8 else 0), (0.0, 0), (0.0, 0)),
                              out_q=(0.5, zp))
    (r,) = run_op(O.CONV_2D, ins, outs)
    # ch0: (4*2 - 2*4 + 4) * 0.25 / 0.5 = 2; ch1: (4*4 - 2*4 + 8) * 0.125 / 0.5 = 4.
    assert r.reshape(-1).tolist() == [2 + zp, 4 + zp]


def test_conv_runtime_scalars():
    ins, outs = conv_explicit(X33, np.ones((1, 2, 2, 1)), [0.0])
    ins[7] = runtime_scalar(T.INT32, 1)   # stride width
    ins[9] = runtime_scalar(T.INT32, 1)   # activation RELU
    (r,) = run_op(O.CONV_2D, ins, outs)
    np.testing.assert_allclose(r.reshape(2, 2), [[12, 16], [24, 28]])
    ins[7] = runtime_scalar(T.INT32, 0)
    with pytest.raises(OpError):
        run_op(O.CONV_2D, ins, outs)


def test_conv_prepare_infers_shape():
    ins, outs = conv_explicit(np.zeros((2, 7, 9, 3), np.float32), np.ones((5, 3, 3, 3)),
                              np.zeros(5), (1, 1, 1, 1), (2, 3), 0, flag(True))
    # NCHW: the input [2, 7, 9, 3] is read as C=7, H=9, W=3 -> filter depth mismatch.
    ctx = OpContext(O.CONV_2D, [i for i, _ in ins], outs)
    with pytest.raises(OpError):
        lookup(O.CONV_2D).validate(ctx)
    ins, outs = conv_explicit(np.zeros((2, 7, 9, 3), np.float32), np.ones((5, 3, 3, 3)),
                              np.zeros(5), (1, 1, 1, 1), (2, 3), 0)
    ctx = OpContext(O.CONV_2D, [i for i, _ in ins], outs)
    # out_h = (7 - 3 + 3 + 2) // 3 = 3, out_w = (9 - 3 + 2 + 2) // 2 = 5
    assert lookup(O.CONV_2D).prepare(ctx) == [(2, 3, 5, 5)]
    ctx.inputs[0] = OperandInfo(F32, (0, 7, 0, 3))
    assert lookup(O.CONV_2D).prepare(ctx) == [(0, 3, 0, 5)]


@pytest.mark.parametrize("mutate", [
    lambda ins: ins.pop(),                                       # 9 inputs: bad count
    lambda ins: ins.append(flag(False)) or ins.append(i32(1)),   # one dilation factor only
    lambda ins: ins.__setitem__(7, i32(0)),                      # zero stride
    lambda ins: ins.__setitem__(3, i32(-1)),                     # negative padding
    lambda ins: ins.__setitem__(3, i32(2)),                      # padding >= filter size
    lambda ins: ins.__setitem__(9, i32(7)),                      # bad activation
    lambda ins: ins.__setitem__(0, tensor(F32, np.zeros((3, 3, 1)))),    # rank 3
    lambda ins: ins.__setitem__(1, tensor(F32, np.zeros((1, 2, 2, 2)))),  # depth mismatch
    lambda ins: ins.__setitem__(2, tensor(F32, np.zeros(2))),            # bias size
    lambda ins: ins.__setitem__(2, tensor(T.TENSOR_INT32, [0])),         # bias type
    lambda ins: ins.__setitem__(1, tensor(F32, np.zeros((1, 5, 5, 1)))),  # filter too big
])
def test_conv_rejects(mutate):
    ins, outs = conv_explicit(X33, np.ones((1, 2, 2, 1)), [0.0])
    mutate(ins)
    with pytest.raises(OpError):
        run_op(O.CONV_2D, ins, outs)


def test_conv_quant_rejects_bad_bias_scale_and_channel_dim():
    ins, outs = conv_explicit(np.full((1, 2, 2, 1), 128), np.full((1, 2, 2, 1), 128), [0],
                              t=U8, scales=((0.5, 128), (0.25, 128), (0.2, 0)), out_q=(1.0, 0))
    with pytest.raises(OpError, match="bias scale"):
        run_op(O.CONV_2D, ins, outs)
    ins, outs = conv_explicit(np.full((1, 1, 1, 2), 128), np.ones((2, 1, 1, 2)), [0, 0], t=U8,
                              ftype=PC, channel_scales=[0.5, 0.25],
                              scales=((0.5, 128), (0.0, 0), (0.0, 0)), out_q=(1.0, 0))
    ins[1][0].channel_dim = 3
    with pytest.raises(OpError, match="channelDim"):
        run_op(O.CONV_2D, ins, outs)


# ---- DEPTHWISE_CONV_2D ------------------------------------------------------------------------

def _dw_filter():
    taps = np.arange(1, 5).reshape(2, 2, 1)          # tap (i, j) weight i*2 + j + 1
    return (taps * np.arange(1, 5)).reshape(1, 2, 2, 4).astype(np.float32)  # times (o + 1)


def test_depthwise_multiplier():
    x = np.arange(1, 9, dtype=np.float32).reshape(1, 2, 2, 2)
    ins = [tensor(F32, x), tensor(F32, _dw_filter(), const=True),
           tensor(F32, [0, 0, 0, 1], const=True)]
    ins += [i32(0)] * 4 + [i32(1), i32(1), i32(2), i32(0)]
    (r,) = run_op(O.DEPTHWISE_CONV_2D, ins, [output(F32)])
    # channel k*2+q = (q + 1 + 2k) * sum_taps tap_weight * x[tap, k]; sums are 50 and 60.
    np.testing.assert_allclose(r.reshape(-1), [50, 100, 180, 241])


def test_depthwise_nchw_dilation_matches_bruteforce():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 6, 5, 2)).astype(np.float32)
    f = rng.standard_normal((1, 2, 2, 6)).astype(np.float32)
    ins = [tensor(F32, x.transpose(0, 3, 1, 2)), tensor(F32, f, const=True),
           tensor(F32, np.zeros(6), const=True), i32(1), i32(1), i32(1), i32(3), i32(0),
           flag(True), i32(1), i32(2)]   # SAME, stride 1, multiplier 3, dilation w=1 h=2
    (r,) = run_op(O.DEPTHWISE_CONV_2D, ins, [output(F32)])
    assert r.shape == (1, 6, 6, 5)
    # SAME with effective filter 3x2: pads top 1, bottom 1, left 0, right 1.
    xp = np.pad(x, ((0, 0), (1, 1), (0, 1), (0, 0)))
    i, j, o = 2, 4, 4   # channel 4 reads input channel 1
    ref = sum(xp[0, i + 2 * a, j + b, 1] * f[0, a, b, o] for a in range(2) for b in range(2))
    np.testing.assert_allclose(r[0, o, i, j], ref, rtol=1e-5)


def test_depthwise_per_channel_signed():
    x = np.array([4, -2], np.int8).reshape(1, 1, 1, 2)
    f = np.array([3, -5], np.int8).reshape(1, 1, 1, 2)
    ins = [tensor(S8, x, 0.5, 0), tensor(PC, f, const=True, channel_scales=[0.5, 0.25],
                                         channel_dim=3),
           tensor(T.TENSOR_INT32, [2, 0], const=True)]
    ins += [i32(2), i32(1), i32(1), i32(1), i32(0)]
    (r,) = run_op(O.DEPTHWISE_CONV_2D, ins, [output(S8, None, 0.25, 1)])
    # ch0: (12 + 2) * 0.25 / 0.25 = 14; ch1: 10 * 0.125 / 0.25 = 5.
    assert r.reshape(-1).tolist() == [15, 6]


def test_depthwise_rejects_filter_batch_and_multiplier():
    x = np.zeros((1, 3, 3, 2), np.float32)
    base = [tensor(F32, x), tensor(F32, np.zeros((2, 2, 2, 4)), const=True),
            tensor(F32, np.zeros(4), const=True)] + [i32(0)] * 4 + [i32(1), i32(1), i32(2),
                                                                    i32(0)]
    with pytest.raises(OpError):
        run_op(O.DEPTHWISE_CONV_2D, base, [output(F32)])
    base[1] = tensor(F32, np.zeros((1, 2, 2, 4)), const=True)
    base[9] = i32(3)   # 3 * 2 != 4
    with pytest.raises(OpError):
        run_op(O.DEPTHWISE_CONV_2D, base, [output(F32)])


# ---- GROUPED_CONV_2D --------------------------------------------------------------------------

def test_grouped_conv():
    x = np.array([1, 2, 3, 4], np.float32).reshape(1, 1, 1, 4)
    f = np.array([[1, 0], [0, 1], [1, 1], [2, -1]], np.float32).reshape(4, 1, 1, 2)
    ins = [tensor(F32, x), tensor(F32, f, const=True), tensor(F32, [0, 0, 0, 1], const=True),
           i32(2), i32(1), i32(1), i32(2), i32(0), flag(False)]
    (r,) = run_op(O.GROUPED_CONV_2D, ins, [output(F32)])
    np.testing.assert_allclose(r.reshape(-1), [1, 2, 7, 3])


def test_grouped_conv_quant_matches_float():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (2, 4, 5, 6))
    f = rng.integers(0, 256, (4, 2, 3, 3))
    b = rng.integers(-500, 500, 4)
    ins = [tensor(U8, x, 0.5, 100), tensor(U8, f, 0.25, 120, const=True),
           tensor(T.TENSOR_INT32, b, 0.125, const=True),
           i32(1), i32(0), i32(0), i32(0), i32(1), i32(1), i32(2), i32(0), flag(False)]
    (r,) = run_op(O.GROUPED_CONV_2D, ins, [output(U8, None, 16.0, 128)])
    real_x = (x - 100) * 0.5
    real_f = (f - 120) * 0.25
    xp = np.pad(real_x, ((0, 0), (0, 0), (1, 0), (0, 0)))
    ref = np.zeros((2, 3, 4, 4))
    for o in range(4):
        g = o // 2
        for i in range(3):
            for j in range(4):
                ref[:, i, j, o] = (xp[:, i:i + 2, j:j + 3, 3 * g:3 * g + 3] * real_f[o]).sum(
                    axis=(1, 2, 3)) + b[o] * 0.125
    expected = np.clip(np.round(ref / 16.0) + 128, 0, 255)
    assert 0 < (expected == 255).mean() < 0.5 and (expected < 128).any()
    assert np.abs(r.astype(int) - expected).max() <= 1


def test_grouped_conv_rejects_indivisible_groups():
    ins = [tensor(F32, np.zeros((1, 1, 1, 4))), tensor(F32, np.zeros((3, 1, 1, 2)), const=True),
           tensor(F32, np.zeros(3), const=True),
           i32(2), i32(1), i32(1), i32(2), i32(0), flag(False)]
    with pytest.raises(OpError):
        run_op(O.GROUPED_CONV_2D, ins, [output(F32)])


# ---- TRANSPOSE_CONV_2D ------------------------------------------------------------------------

X22 = np.array([1, 2, 3, 4], np.float32).reshape(1, 2, 2, 1)


def tconv_explicit(x, f, b, pads, strides, nchw=False):
    return ([tensor(F32, x), tensor(F32, f, const=True), tensor(F32, b, const=True)]
            + [i32(p) for p in pads] + [i32(strides[0]), i32(strides[1]), i32(0), flag(nchw)])


def test_transpose_conv_stride_1_and_2():
    (r,) = run_op(O.TRANSPOSE_CONV_2D, tconv_explicit(X22, np.ones((1, 2, 2, 1)), [0.0],
                                                      (0, 0, 0, 0), (1, 1)), [output(F32)])
    np.testing.assert_allclose(r.reshape(3, 3), [[1, 3, 2], [4, 10, 6], [3, 7, 4]])
    (r,) = run_op(O.TRANSPOSE_CONV_2D, tconv_explicit(X22, np.ones((1, 2, 2, 1)), [1.0],
                                                      (0, 0, 0, 0), (2, 2)), [output(F32)])
    np.testing.assert_allclose(r.reshape(4, 4), np.kron([[1, 2], [3, 4]], np.ones((2, 2))) + 1)


def test_transpose_conv_negative_tail_padding_extends_output():
    (r,) = run_op(O.TRANSPOSE_CONV_2D, tconv_explicit(X22, np.ones((1, 2, 2, 1)), [0.5],
                                                      (0, -1, 0, -1), (2, 2)), [output(F32)])
    expected = np.full((5, 5), 0.5)
    expected[:4, :4] += np.kron([[1, 2], [3, 4]], np.ones((2, 2)))
    np.testing.assert_allclose(r.reshape(5, 5), expected)


def test_transpose_conv_implicit_same_with_output_shape_nchw():
    ins = [tensor(F32, X22.transpose(0, 3, 1, 2)), tensor(F32, np.ones((1, 3, 3, 1)), const=True),
           tensor(F32, [0.0], const=True), tensor(T.TENSOR_INT32, [1, 1, 4, 4], const=True),
           i32(1), i32(2), i32(2), i32(0), flag(True)]
    ctx = OpContext(O.TRANSPOSE_CONV_2D, [i for i, _ in ins], [output(F32)])
    assert lookup(O.TRANSPOSE_CONV_2D).prepare(ctx) == [(1, 1, 4, 4)]
    (r,) = run_op(O.TRANSPOSE_CONV_2D, ins, [output(F32)])
    np.testing.assert_allclose(r.reshape(4, 4), [[1, 1, 3, 2], [1, 1, 3, 2], [4, 4, 10, 6],
                                                 [3, 3, 7, 4]])


def test_transpose_conv_quant_per_channel():
    x = np.array([130, 126], np.uint8).reshape(1, 1, 1, 2)   # real [1, -1]
    f = np.array([[2, 4], [-4, 2]], np.int8).reshape(2, 1, 1, 2)
    ins = [tensor(U8, x, 0.5, 128), tensor(PC, f, const=True, channel_scales=[0.5, 0.25]),
           tensor(T.TENSOR_INT32, [0, 4], const=True)]
    ins += [i32(0)] * 4 + [i32(1), i32(1), i32(0), flag(False)]
    (r,) = run_op(O.TRANSPOSE_CONV_2D, ins, [output(U8, None, 0.25, 50)])
    # ch0: (2*2 - 2*4) * 0.25 = -1.0 real -> -4 steps; ch1: (2*-4 - 2*2 + 4) * 0.125 = -1.0.
    assert r.reshape(-1).tolist() == [46, 46]


def test_transpose_conv_rejects_negative_head_padding():
    ins = tconv_explicit(X22, np.ones((1, 2, 2, 1)), [0.0], (-1, 0, 0, 0), (1, 1))
    with pytest.raises(OpError):
        run_op(O.TRANSPOSE_CONV_2D, ins, [output(F32)])


# ---- FULLY_CONNECTED --------------------------------------------------------------------------

def fc(x, w, b, act=0, t=F32, q=((0.0, 0), (0.0, 0), (0.0, 0)), out_q=(0.0, 0)):
    btype = t if t in (F32, T.TENSOR_FLOAT16) else T.TENSOR_INT32
    return ([tensor(t, x, *q[0]), tensor(t, w, *q[1], const=True),
             tensor(btype, b, *q[2], const=True), i32(act)], [output(t, None, *out_q)])


def test_fully_connected_float_relu():
    ins, outs = fc([[1, 2, 3], [4, 5, 6]], [[1, 0, -1], [2, 1, 0]], [1, -1], act=1)
    (r,) = run_op(O.FULLY_CONNECTED, ins, outs)
    np.testing.assert_allclose(r, [[0, 3], [0, 12]])


def test_fully_connected_flattens_rank4_input():
    x = np.arange(12, dtype=np.float32).reshape(1, 2, 2, 3)
    ins, outs = fc(x, [[1, 1, 1]], [0])
    (r,) = run_op(O.FULLY_CONNECTED, ins, outs)
    assert r.shape == (4, 1)
    np.testing.assert_allclose(r.reshape(-1), [3, 12, 21, 30])


def test_fully_connected_quant_rounds_half_away_from_zero():
    ins, outs = fc([[130, 124]], [[129, 131]], [4], t=U8,
                   q=((0.5, 128), (0.5, 128), (0.25, 0)), out_q=(1.0, 128))
    (r,) = run_op(O.FULLY_CONNECTED, ins, outs)
    assert r.tolist() == [[126]]   # (2 - 12 + 4) * 0.25 = -1.5 -> -2


def test_fully_connected_signed_and_zero_batch():
    ins, outs = fc(np.zeros((0, 2)), [[1, 3]], [0], t=S8,
                   q=((0.5, 0), (0.5, 0), (0.25, 0)), out_q=(1.0, 0))
    (r,) = run_op(O.FULLY_CONNECTED, ins, outs)
    assert r.shape == (0, 1) and r.dtype == np.int8


def test_fully_connected_rejects():
    ins, outs = fc([[1, 2, 3, 4, 5]], [[1, 0], [0, 1]], [0, 0])   # 5 not a multiple of 2
    with pytest.raises(OpError):
        run_op(O.FULLY_CONNECTED, ins, outs)
    ins, outs = fc([[1, 2]], [[1, 0], [0, 1]], [0, 0, 0])        # bias size
    with pytest.raises(OpError):
        run_op(O.FULLY_CONNECTED, ins, outs)
    ins, outs = fc([1, 2], [[1, 0], [0, 1]], [0, 0])             # rank 1 input
    with pytest.raises(OpError):
        run_op(O.FULLY_CONNECTED, ins, outs)
    ins, outs = fc([[1, 2]], [[1, 0], [0, 1]], [0, 0])
    ins[1] = tensor(T.TENSOR_FLOAT16, [[1, 0], [0, 1]], const=True)   # mixed types
    with pytest.raises(OpError):
        run_op(O.FULLY_CONNECTED, ins, outs)


def test_omitted_optional_layout_defaults_to_nhwc():
    ins, outs = conv_explicit(X33, np.ones((1, 2, 2, 1)), [0.0], (0, 0, 0, 0), (1, 1), 0,
                              omitted(T.BOOL))
    (r,) = run_op(O.CONV_2D, ins, outs)
    np.testing.assert_allclose(r.reshape(2, 2), [[12, 16], [24, 28]])


def _transpose_conv_reference(x, filt, stride, pads, out_hw):
    """Direct scatter, one input pixel and tap at a time (small sizes only)."""
    n, h, w, c = x.shape
    cout, kh, kw, _ = filt.shape
    top, _, left, _ = pads
    out = np.zeros((n, *out_hw, cout))
    for b in range(n):
        for r in range(h):
            for q in range(w):
                for i in range(kh):
                    for j in range(kw):
                        o_r, o_c = r * stride[0] + i - top, q * stride[1] + j - left
                        if 0 <= o_r < out_hw[0] and 0 <= o_c < out_hw[1]:
                            out[b, o_r, o_c] += filt[:, i, j, :] @ x[b, r, q]
    return out


@pytest.mark.parametrize("stride, pads, out_hw", [
    ((1, 1), (0, 0, 0, 0), (4, 5)), ((2, 3), (1, 0, 2, 1), (5, 6)),
    ((3, 2), (-1, 0, 0, -2), (9, 8)),
    ((16_777_218, 2), (0, 0, 0, 0), (5, 4)),  # a huge stride: only the output window is built
])
def test_transpose_conv_engine_matches_direct_scatter(stride, pads, out_hw):
    from nnhal.ops.conv import _transpose_conv
    from nnhal.ops.testing import tensor as make

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4, 2))
    filt = rng.standard_normal((3, 2, 3, 2))
    info, _ = make(OperandType.TENSOR_FLOAT32, filt.astype(np.float32), const=True)
    wts = lookup(OperationType.TRANSPOSE_CONV_2D).weights(filt, info, None)
    got = _transpose_conv(x, wts, stride, pads, out_hw)
    np.testing.assert_allclose(got, _transpose_conv_reference(x, filt, stride, pads, out_hw))


# ---- signatures: omitted and optional inputs --------------------------------------------------

def test_omitted_dilation_defaults_to_one():
    """The layout flag and both dilation factors are omittable (HAL: optional, defaults)."""
    ins, outs = conv_explicit(X33, np.ones((1, 2, 2, 1)), [0.0], (0, 0, 0, 0), (1, 1), 0,
                              flag(False), omitted(T.INT32), omitted(T.INT32))
    (r,) = run_op(O.CONV_2D, ins, outs)
    np.testing.assert_allclose(r.reshape(2, 2), [[12, 16], [24, 28]])
    # Implicit padding, DEPTHWISE_CONV_2D: the same three trailing inputs.
    ins = [tensor(F32, X33), tensor(F32, np.ones((1, 2, 2, 1)), const=True),
           tensor(F32, [0.0], const=True), i32(2), i32(1), i32(1), i32(1), i32(0),
           omitted(T.BOOL), omitted(T.INT32), omitted(T.INT32)]
    (r,) = run_op(O.DEPTHWISE_CONV_2D, ins, [output(F32)])
    np.testing.assert_allclose(r.reshape(2, 2), [[12, 16], [24, 28]])


def test_one_dilation_factor_is_rejected_with_a_reason():
    ins, outs = conv_explicit(X33, np.ones((1, 2, 2, 1)), [0.0], (0, 0, 0, 0), (1, 1), 0,
                              flag(False), i32(1))
    with pytest.raises(OpError, match="given together"):
        run_op(O.CONV_2D, ins, outs)


@pytest.mark.parametrize("op, ins", [
    # GROUPED_CONV_2D and TRANSPOSE_CONV_2D have a required layout flag.
    (O.GROUPED_CONV_2D, lambda: [
        tensor(F32, np.zeros((1, 1, 1, 4))), tensor(F32, np.zeros((4, 1, 1, 2)), const=True),
        tensor(F32, np.zeros(4), const=True), i32(2), i32(1), i32(1), i32(2), i32(0),
        omitted(T.BOOL)]),
    (O.TRANSPOSE_CONV_2D, lambda: tconv_explicit(X22, np.ones((1, 2, 2, 1)), [0.0],
                                                 (0, 0, 0, 0), (1, 1))[:-1] + [omitted(T.BOOL)]),
    # An omitted filter, bias or padding is never valid.
    (O.CONV_2D, lambda: [tensor(F32, X33), omitted(F32), tensor(F32, [0.0], const=True),
                         i32(2), i32(1), i32(1), i32(0)]),
    (O.CONV_2D, lambda: conv_explicit(X33, np.ones((1, 2, 2, 1)), [0.0])[0][:3]
     + [omitted(T.INT32)] + [i32(0)] * 3 + [i32(1), i32(1), i32(0)]),
    (O.FULLY_CONNECTED, lambda: fc([[1, 2]], [[1, 0], [0, 1]], [0, 0])[0][:2]
     + [omitted(F32), i32(0)]),
])
def test_omitted_required_input_is_rejected(op, ins):
    with pytest.raises(OpError, match="cannot be omitted"):
        run_op(op, ins(), [output(F32)])


def test_signature_types():
    # A per-channel filter is one of the configurations of CONV_2D, not of FULLY_CONNECTED.
    ins, outs = fc([[130, 124]], [[129, 131]], [4], t=U8,
                   q=((0.5, 128), (0.5, 128), (0.25, 0)), out_q=(1.0, 128))
    ins[1] = tensor(PC, [[1, 3]], const=True, channel_scales=[0.5])
    with pytest.raises(OpError, match=r"input 1 \(weights\)"):
        run_op(O.FULLY_CONNECTED, ins, outs)
    # A float bias with a quantized input.
    ins, outs = conv_explicit(np.full((1, 2, 2, 1), 128), np.full((1, 2, 2, 1), 128), [0.0],
                              t=U8, scales=((0.5, 128), (0.25, 128), (0.125, 0)),
                              out_q=(1.0, 0), bias_type=F32)
    with pytest.raises(OpError, match=r"input 2 \(bias\)"):
        run_op(O.CONV_2D, ins, outs)


@pytest.mark.parametrize("stride,dilation,pads,contiguous", [
    ((1, 1), (1, 1), (1, 1, 1, 1), True),
    ((2, 2), (1, 1), (0, 1, 0, 1), True),
    ((1, 2), (2, 1), (2, 2, 1, 1), True),
    ((1, 1), (2, 3), (0, 0, 0, 0), False),
])
def test_depthwise_contraction_matches_bruteforce(stride, dilation, pads, contiguous):
    from nnhal.ops.conv_engine import conv_into, conv_weights, padded_input

    rng = np.random.default_rng(7)
    c = 5
    x = rng.integers(-20, 20, (2, 9, 11, c)).astype(np.float32)
    if not contiguous:  # an NCHW input seen as NHWC: rows are not (w, c)-contiguous
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1)
    f = rng.integers(-9, 9, (c, 3, 2, 1)).astype(np.float32)
    w = conv_weights(f, c, np.float32)
    xp = padded_input(x, pads, np.float32)
    sh, sw = stride
    dh, dw = dilation
    oh = (xp.shape[1] - (3 - 1) * dh - 1) // sh + 1
    ow = (xp.shape[2] - (2 - 1) * dw - 1) // sw + 1
    out = np.empty((2, oh, ow, c), np.float32)
    conv_into(xp, w, stride, dilation, out)
    want = np.zeros(out.shape, np.float64)
    for i in range(3):
        for j in range(2):
            want += xp[:, i * dh: i * dh + (oh - 1) * sh + 1: sh,
                       j * dw: j * dw + (ow - 1) * sw + 1: sw, :] * f[:, i, j, 0]
    np.testing.assert_array_equal(out, want)  # small integers: exact in float32


@pytest.mark.parametrize("c,groups,stride,dilation", [
    (3, 1, (2, 2), (1, 1)),      # few input channels: the transposed patch matrix
    (7, 1, (1, 2), (2, 1)),
    (12, 1, (2, 2), (1, 1)),     # the general patch path
    (16, 16, (2, 2), (1, 1)),    # strided depthwise, split into column phases
    (32, 32, (1, 3), (1, 1)),
    (64, 64, (2, 2), (1, 1)),    # wider depthwise keeps the general einsum
    (24, 24, (2, 2), (1, 2)),    # width dilation: no phase split
])
def test_conv_engine_paths_match_bruteforce(c, groups, stride, dilation):
    """Each engine path against a direct sum over taps, on small integers (exact in
    float32), with odd sizes so phases and patches have ragged edges."""
    from nnhal.ops.conv_engine import conv_into, conv_weights

    rng = np.random.default_rng(c * 31 + stride[1])
    cout = c if groups > 1 else 5
    cg = c // groups
    kh, kw = 3, 3
    xp = rng.integers(-9, 9, (2, 13, 15, c)).astype(np.float32)
    f = rng.integers(-5, 5, (cout, kh, kw, cg)).astype(np.float32)
    w = conv_weights(f, groups, np.float32)
    sh, sw = stride
    dh, dw = dilation
    oh = (xp.shape[1] - (kh - 1) * dh - 1) // sh + 1
    ow = (xp.shape[2] - (kw - 1) * dw - 1) // sw + 1
    out = np.full((2, oh, ow, cout), np.nan, np.float32)
    conv_into(xp, w, stride, dilation, out)
    want = np.zeros(out.shape, np.float64)
    og = cout // groups
    for o in range(cout):
        g = o // og
        for i in range(kh):
            for j in range(kw):
                win = xp[:, i * dh: i * dh + (oh - 1) * sh + 1: sh,
                         j * dw: j * dw + (ow - 1) * sw + 1: sw, g * cg:(g + 1) * cg]
                want[..., o] += (win * f[o, i, j]).sum(axis=-1)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("code", [0, 1, 2, 3])
@pytest.mark.parametrize("shape", [(1, 112, 112, 16), (2, 5, 7, 3), (1, 1, 1, 1000), (4, 10)])
def test_float_epilogue_into_matches_plain_bias_activation(shape, code):
    from nnhal.ops import common as C
    from nnhal.ops.conv_engine import float_epilogue_into

    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    bias = rng.standard_normal(shape[-1]).astype(np.float32)
    want = x.copy()
    C.bias_activation_into(want, bias, code)
    tiles: dict = {}
    for _ in range(2):  # the second run uses the cached tiled bias
        got = x.copy()
        float_epilogue_into(got, bias, code, tiles)
        np.testing.assert_array_equal(got, want)
    strided = x.copy()[..., ::-1]  # not C-contiguous: the plain route
    want_s = strided.copy()
    C.bias_activation_into(want_s, bias, code)
    float_epilogue_into(strided, bias, code)
    np.testing.assert_array_equal(strided, want_s)


def _q8_conv(filter_scales, *, in_scale=0.5, out_scale=1.0, filter_type=None):
    """A quantized CONV_2D as the analysis gets it: per-channel filter scales (a list), or
    per tensor (a float)."""
    from nnhal.hal.builder import ModelBuilder
    from nnhal.hal.types import SymmPerChannelQuantParams

    T = OperandType
    b = ModelBuilder()
    x = b.input(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 2, 2, 1], in_scale, 0)
    if isinstance(filter_scales, list):
        w = b.constant(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, np.ones((2, 1, 1, 1), np.int8),
                       channel_quant=SymmPerChannelQuantParams(filter_scales, 0))
        bias = b.constant(T.TENSOR_INT32, np.zeros(2, np.int32))
    else:
        w = b.constant(T.TENSOR_QUANT8_ASYMM_SIGNED, np.ones((2, 1, 1, 1), np.int8),
                       scale=filter_scales)
        bias = b.constant(T.TENSOR_INT32, np.zeros(2, np.int32),
                          scale=float(np.float32(in_scale) * np.float32(filter_scales)))
    y = b.output(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 2, 2, 2], out_scale, 0)
    b.operation(OperationType.CONV_2D, [x, w, bias, *(b.scalar(T.INT32, v) for v in
                                                      (0, 0, 0, 0, 1, 1, 0))], [y])
    return b.build()


@pytest.mark.parametrize("model, why", [
    (lambda: _q8_conv([0.5, 1e-46]), "per-channel scales must be positive"),  # 0 in float32
    (lambda: _q8_conv([0.5, 2.0], in_scale=1e30, out_scale=1e-10), "multiplier out of range"),
    (lambda: _q8_conv([0.5, 2.0], out_scale=1e-46), "multiplier out of range"),  # 0 in float32
    (lambda: _q8_conv(0.5, in_scale=1e30, out_scale=1e-10), "multiplier out of range"),
])
def test_quantized_convolution_rules_refuse(model, why):
    from nnhal.analysis import analyse
    from nnhal.validation import ValidationError

    with pytest.raises((OpError, ValidationError), match=why):
        analyse(model())


@pytest.mark.parametrize("model", [
    lambda: _q8_conv([0.5, 2.0]), lambda: _q8_conv([1e-30, 3e5], in_scale=1.0),
    lambda: _q8_conv(0.25),
])
def test_quantized_convolution_rules_accept(model):
    from nnhal.analysis import analyse

    assert analyse(model()).main.supported == (True,)
