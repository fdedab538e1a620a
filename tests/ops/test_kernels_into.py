"""kernel_into: writes into the given array what kernel() returns, leaves inputs alone, and
(quantized) matches a float64 reference written here as an oracle, bit for bit."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from nnhal.hal.types import OperandLifeTime, OperandType, OperationType
from nnhal.ops import catalog  # noqa: F401 - registers every operation
from nnhal.ops import common as C
from nnhal.ops.resolver import OpContext, OperandInfo, definitions

T = OperandType
O = OperationType
CONST = OperandLifeTime.CONSTANT_COPY
rng = np.random.default_rng(12)


def scalar(t: OperandType, v) -> OperandInfo:
    return OperandInfo(t, (), lifetime=CONST, value=np.asarray(v, t.dtype))


def tensor(t: OperandType, shape, value=None, scale=0.0, zp=0, **kw) -> OperandInfo:
    lt = CONST if value is not None else OperandLifeTime.TEMPORARY_VARIABLE
    return OperandInfo(t, tuple(shape), scale=scale, zero_point=zp, lifetime=lt, value=value,
                       **kw)


def make_ctx(op: OperationType, inputs, outputs) -> OpContext:
    ctx = OpContext(op, inputs, outputs)
    definitions()[int(op)].validate(ctx)
    return ctx


def run_both(op, ctx, ins):
    """kernel() output, and kernel_into() writing into a NaN/garbage-filled array."""
    d = definitions()[int(op)]
    copies = [None if a is None else np.array(a, copy=True) for a in ins]
    ref = d.kernel(ctx)(ins, None)[0]
    into = d.kernel_into(ctx)
    assert into is not None
    out = np.full(ref.shape, 7, ref.dtype) if ref.dtype.kind in "iu" else \
        np.full(ref.shape, np.nan, ref.dtype)
    target = out
    assert into(ins, [out], None) is None
    assert out is target
    for a, b in zip(ins, copies):
        if a is not None:
            np.testing.assert_array_equal(a, b)  # inputs untouched
    assert out.dtype == ref.dtype and out.shape == ref.shape
    return ref, out


# ---- oracle: a plain float64 grouped convolution over NHWC ----------------------------------

def oracle_conv(x, f, stride, pads, groups, dilation=(1, 1)):
    """x [N,H,W,C] float64, f [cout, kh, kw, C/groups]; pads (top, bottom, left, right)."""
    n, h, w, c = x.shape
    cout, kh, kw, cg = f.shape
    top, bottom, left, right = pads
    xp = np.zeros((n, h + top + bottom, w + left + right, c))
    xp[:, top:top + h, left:left + w] = x
    sh, sw = stride
    dh, dw = dilation
    oh = (h + top + bottom - (kh - 1) * dh - 1) // sh + 1
    ow = (w + left + right - (kw - 1) * dw - 1) // sw + 1
    og = cout // groups
    y = np.zeros((n, oh, ow, cout))
    for o in range(cout):
        g = o // og
        for i in range(kh):
            for j in range(kw):
                win = xp[:, i * dh: i * dh + (oh - 1) * sh + 1: sh,
                         j * dw: j * dw + (ow - 1) * sw + 1: sw, g * cg:(g + 1) * cg]
                y[..., o] += win @ f[o, i, j]
    return y


def oracle_requant(acc, bias, inp_scale, filt_scales, out_scale, out_zp, t, act):
    """Integer accumulator (exact) + bias -> quantized, per-tensor or per-channel."""
    total = np.rint(acc).astype(np.int64) + bias.astype(np.int64)
    mults, shifts = [], []
    for fs in np.atleast_1d(filt_scales):
        prod = float(np.float32(inp_scale) * np.float32(fs))
        m, s = C.quantize_multiplier(prod / float(np.float32(out_scale)))
        mults.append(m)
        shifts.append(s)
    m = np.array(mults, np.int64) if len(mults) > 1 else np.int64(mults[0])
    s = np.array(shifts, np.int64) if len(shifts) > 1 else np.int64(shifts[0])
    r = C.requantize_int32_sum(total, m, s) + out_zp
    lo, hi = C.quant_activation_range(act, out_scale, out_zp, t)
    return np.clip(r, lo, hi).astype(t.dtype)


def conv_inputs(x_info, f_info, b_info, code, stride, act, extra=None):
    ins = [x_info, f_info, b_info, scalar(T.INT32, code), scalar(T.INT32, stride[1]),
           scalar(T.INT32, stride[0])]
    if extra is not None:
        ins.append(scalar(T.INT32, extra))
    ins.append(scalar(T.INT32, act))
    return ins


def values(infos, x):
    return [x] + [i.value for i in infos[1:]]


def same_pads(h, w, k, s):
    def one(size):
        out = (size + s - 1) // s
        need = max(0, (out - 1) * s + k - size)
        return need // 2, need - need // 2
    (t, b), (lft, r) = one(h), one(w)
    return t, b, lft, r


# ---- float32 --------------------------------------------------------------------------------

@pytest.mark.parametrize("hw,cin,cout,k,s,code,act", [
    (9, 3, 8, 3, 2, 1, C.ACT_RELU6),   # patch matrix, padding
    (6, 8, 16, 1, 1, 2, C.ACT_NONE),   # 1x1 stride 1: input is the patch matrix
    (7, 4, 5, 3, 1, 2, C.ACT_RELU),    # valid padding
    (5, 4, 6, 1, 2, 1, C.ACT_RELU1),   # 1x1 stride 2
])
def test_conv2d_float32(hw, cin, cout, k, s, code, act):
    x = rng.standard_normal((2, hw, hw, cin)).astype(np.float32)
    f = rng.standard_normal((cout, k, k, cin)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    infos = conv_inputs(tensor(T.TENSOR_FLOAT32, x.shape), tensor(T.TENSOR_FLOAT32, f.shape, f),
                        tensor(T.TENSOR_FLOAT32, b.shape, b), code, (s, s), act)
    ctx = make_ctx(O.CONV_2D, infos, [tensor(T.TENSOR_FLOAT32, (0, 0, 0, 0))])
    ref, out = run_both(O.CONV_2D, ctx, values(infos, x))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, ref)
    pads = same_pads(hw, hw, k, s) if code == 1 else (0, 0, 0, 0)
    lo, hi = C.float_activation_bounds(act)
    expect = np.clip(oracle_conv(x.astype(np.float64), f.astype(np.float64), (s, s), pads, 1)
                     + b, lo, hi)
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mult,s", [(1, 1), (1, 2), (2, 1)])
def test_depthwise_float32(mult, s):
    c = 6
    x = rng.standard_normal((1, 10, 9, c)).astype(np.float32)
    f = rng.standard_normal((1, 3, 3, c * mult)).astype(np.float32)
    b = rng.standard_normal(c * mult).astype(np.float32)
    infos = conv_inputs(tensor(T.TENSOR_FLOAT32, x.shape), tensor(T.TENSOR_FLOAT32, f.shape, f),
                        tensor(T.TENSOR_FLOAT32, b.shape, b), 1, (s, s), C.ACT_RELU6, mult)
    ctx = make_ctx(O.DEPTHWISE_CONV_2D, infos, [tensor(T.TENSOR_FLOAT32, (0, 0, 0, 0))])
    ref, out = run_both(O.DEPTHWISE_CONV_2D, ctx, values(infos, x))
    np.testing.assert_array_equal(out, ref)
    # depthwise = grouped with one input channel per group: filter [c*mult, 3, 3, 1]
    fo = f.reshape(3, 3, c * mult).transpose(2, 0, 1)[..., None].astype(np.float64)
    expect = np.clip(oracle_conv(x.astype(np.float64), fo, (s, s),
                                 same_pads(10, 9, 3, s), c) + b, 0, 6)
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-5)


def test_grouped_conv_float32_and_nchw():
    g, cg, og = 3, 2, 4
    x = rng.standard_normal((1, 6, 7, g * cg)).astype(np.float32)
    f = rng.standard_normal((g * og, 3, 3, cg)).astype(np.float32)
    b = rng.standard_normal(g * og).astype(np.float32)
    for nchw in (False, True):
        xin = x.transpose(0, 3, 1, 2).copy() if nchw else x
        infos = conv_inputs(tensor(T.TENSOR_FLOAT32, xin.shape),
                            tensor(T.TENSOR_FLOAT32, f.shape, f),
                            tensor(T.TENSOR_FLOAT32, b.shape, b), 1, (1, 2), C.ACT_NONE, g)
        infos.append(scalar(T.BOOL, nchw))
        ctx = make_ctx(O.GROUPED_CONV_2D, infos, [tensor(T.TENSOR_FLOAT32, (0, 0, 0, 0))])
        ref, out = run_both(O.GROUPED_CONV_2D, ctx, values(infos, xin))
        np.testing.assert_array_equal(out, ref)
        top, bottom = same_pads(6, 7, 3, 1)[:2]
        left, right = same_pads(6, 7, 3, 2)[2:]
        expect = oracle_conv(x.astype(np.float64), f.astype(np.float64), (1, 2),
                             (top, bottom, left, right), g) + b
        if nchw:
            expect = expect.transpose(0, 3, 1, 2)
        np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-5)


def test_conv2d_float16_rounds_once():
    x = rng.standard_normal((1, 5, 5, 3)).astype(np.float16)
    f = rng.standard_normal((4, 3, 3, 3)).astype(np.float16)
    b = rng.standard_normal(4).astype(np.float16)
    infos = conv_inputs(tensor(T.TENSOR_FLOAT16, x.shape), tensor(T.TENSOR_FLOAT16, f.shape, f),
                        tensor(T.TENSOR_FLOAT16, b.shape, b), 1, (1, 1), C.ACT_NONE)
    ctx = make_ctx(O.CONV_2D, infos, [tensor(T.TENSOR_FLOAT16, (0, 0, 0, 0))])
    ref, out = run_both(O.CONV_2D, ctx, values(infos, x))
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, ref)
    expect = oracle_conv(x.astype(np.float64), f.astype(np.float64), (1, 1), (1, 1, 1, 1), 1)
    np.testing.assert_allclose(out, (expect + b).astype(np.float16), rtol=2e-3, atol=2e-3)


def test_fully_connected_float32():
    x = rng.standard_normal((3, 2, 5)).astype(np.float32)
    w = rng.standard_normal((7, 10)).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    infos = [tensor(T.TENSOR_FLOAT32, x.shape), tensor(T.TENSOR_FLOAT32, w.shape, w),
             tensor(T.TENSOR_FLOAT32, b.shape, b), scalar(T.INT32, C.ACT_RELU)]
    ctx = make_ctx(O.FULLY_CONNECTED, infos, [tensor(T.TENSOR_FLOAT32, (0, 0))])
    ref, out = run_both(O.FULLY_CONNECTED, ctx, values(infos, x))
    np.testing.assert_array_equal(out, ref)
    expect = np.maximum(x.reshape(3, 10).astype(np.float64) @ w.T.astype(np.float64) + b, 0)
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-5)


def test_into_rejects_a_wrong_output_shape():
    x = rng.standard_normal((1, 4, 4, 2)).astype(np.float32)
    f = rng.standard_normal((3, 1, 1, 2)).astype(np.float32)
    b = np.zeros(3, np.float32)
    infos = conv_inputs(tensor(T.TENSOR_FLOAT32, x.shape), tensor(T.TENSOR_FLOAT32, f.shape, f),
                        tensor(T.TENSOR_FLOAT32, b.shape, b), 2, (1, 1), 0)
    ctx = make_ctx(O.CONV_2D, infos, [tensor(T.TENSOR_FLOAT32, (1, 4, 4, 3))])
    into = definitions()[int(O.CONV_2D)].kernel_into(ctx)
    from nnhal.ops.resolver import OpError
    with pytest.raises(OpError):
        into(values(infos, x), [np.empty((1, 4, 4, 2), np.float32)], None)


def test_concurrent_threads_do_not_share_scratch():
    x = [rng.standard_normal((1, 12, 12, 4)).astype(np.float32) for _ in range(2)]
    f = rng.standard_normal((1, 3, 3, 4)).astype(np.float32)
    b = np.zeros(4, np.float32)
    infos = conv_inputs(tensor(T.TENSOR_FLOAT32, x[0].shape),
                        tensor(T.TENSOR_FLOAT32, f.shape, f),
                        tensor(T.TENSOR_FLOAT32, b.shape, b), 1, (1, 1), 0, 1)
    ctx = make_ctx(O.DEPTHWISE_CONV_2D, infos, [tensor(T.TENSOR_FLOAT32, (0, 0, 0, 0))])
    kern = definitions()[int(O.DEPTHWISE_CONV_2D)].kernel(ctx)
    expect = [kern(values(infos, xi), None)[0] for xi in x]
    bad = []

    def worker(k):
        for _ in range(200):
            r = kern(values(infos, x[k]), None)[0]
            if not np.array_equal(r, expect[k]):
                bad.append(k)

    threads = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


# ---- quantized: bit-exact against the oracle ------------------------------------------------

def _q(t, shape, lo=None, hi=None):
    info = np.iinfo(t.dtype)
    return rng.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1,
                        shape).astype(t.dtype)


@pytest.mark.parametrize("t,per_channel", [(T.TENSOR_QUANT8_ASYMM, False),
                                           (T.TENSOR_QUANT8_ASYMM_SIGNED, True),
                                           (T.TENSOR_QUANT8_ASYMM, True)])
@pytest.mark.parametrize("op", [O.CONV_2D, O.DEPTHWISE_CONV_2D])
def test_quant_conv_bit_exact(t, per_channel, op):
    cin, k, s = 5, 3, 2
    cout = cin if op == O.DEPTHWISE_CONV_2D else 6
    x = _q(t, (2, 9, 8, cin))
    zx = 3 if t == T.TENSOR_QUANT8_ASYMM_SIGNED else 131
    sx, so, zo = 0.05, 0.3, (5 if t == T.TENSOR_QUANT8_ASYMM_SIGNED else 120)
    fshape = (1, k, k, cout) if op == O.DEPTHWISE_CONV_2D else (cout, k, k, cin)
    cdim = 3 if op == O.DEPTHWISE_CONV_2D else 0
    if per_channel:
        f = _q(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, fshape, -127, 127)
        fscales = rng.uniform(0.01, 0.04, cout).astype(np.float32)
        f_info = tensor(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, fshape, f, channel_scales=fscales,
                        channel_dim=cdim)
        fz, fsc = 0, fscales
        bscale = 0.0
    else:
        f = _q(t, fshape)
        fz, fsc = 100, 0.02
        f_info = tensor(t, fshape, f, scale=fsc, zp=fz)
        bscale = float(np.float32(sx) * np.float32(fsc))
    b = rng.integers(-3000, 3000, cout).astype(np.int32)
    infos = conv_inputs(tensor(t, x.shape, scale=sx, zp=zx), f_info,
                        tensor(T.TENSOR_INT32, (cout,), b, scale=bscale), 1, (s, s),
                        C.ACT_RELU6, 1 if op == O.DEPTHWISE_CONV_2D else None)
    ctx = make_ctx(op, infos, [tensor(t, (0, 0, 0, 0), scale=so, zp=zo)])
    ref, out = run_both(op, ctx, values(infos, x))
    np.testing.assert_array_equal(out, ref)
    fr = f.astype(np.float64) - fz
    if op == O.DEPTHWISE_CONV_2D:
        fr = fr.reshape(k, k, cout).transpose(2, 0, 1)[..., None]
    acc = oracle_conv(x.astype(np.float64) - zx, fr, (s, s), same_pads(9, 8, k, s),
                      cin if op == O.DEPTHWISE_CONV_2D else 1)
    np.testing.assert_array_equal(out, oracle_requant(acc, b, sx, fsc, so, zo, t,
                                                      C.ACT_RELU6))


@pytest.mark.parametrize("size", [16, 4096])  # 4096 terms of 255*255 need float64 sums
def test_quant_fully_connected_bit_exact(size):
    t = T.TENSOR_QUANT8_ASYMM
    x = _q(t, (3, size))
    w = np.where(rng.random((4, size)) < 0.5, 0, 255).astype(np.uint8)
    x[:] = np.where(rng.random(x.shape) < 0.5, 0, 255)
    zx, zw, sx, sw, so, zo = 128, 127, 0.5, 0.5, 4000.0, 128
    b = rng.integers(-1000, 1000, 4).astype(np.int32)
    bscale = float(np.float32(sx) * np.float32(sw))
    infos = [tensor(t, x.shape, scale=sx, zp=zx), tensor(t, w.shape, w, scale=sw, zp=zw),
             tensor(T.TENSOR_INT32, (4,), b, scale=bscale), scalar(T.INT32, C.ACT_NONE)]
    ctx = make_ctx(O.FULLY_CONNECTED, infos, [tensor(t, (0, 0), scale=so, zp=zo)])
    ref, out = run_both(O.FULLY_CONNECTED, ctx, values(infos, x))
    np.testing.assert_array_equal(out, ref)
    acc = (x.astype(np.float64) - zx) @ (w.astype(np.float64) - zw).T
    np.testing.assert_array_equal(out, oracle_requant(acc, b, sx, sw, so, zo, t, C.ACT_NONE))


@pytest.mark.parametrize("size", [64, 4096])
def test_quant_fully_connected_large_sums_stay_exact(size):
    """Sums of odd products beyond 2**24 (where float32 spacing exceeds 1): the bias cancels
    the exact sum and the output scale equals the accumulator's, so any rounding of the sum
    shows up in the output."""
    t = T.TENSOR_QUANT8_ASYMM
    x = np.where(rng.random((1, size)) < 0.9, 255, 0).astype(np.uint8)
    w = np.where(rng.random((4, size)) < 0.9, 0, 254).astype(np.uint8)
    zx, zw, sx, sw = 128, 127, 0.5, 0.25
    exact = (x.astype(np.int64) - zx) @ (w.astype(np.int64) - zw).T  # [1, 4]
    offsets = np.array([-40, -3, 0, 57])
    b = (offsets - exact[0]).astype(np.int32)
    so = float(np.float32(sx) * np.float32(sw))
    infos = [tensor(t, x.shape, scale=sx, zp=zx), tensor(t, w.shape, w, scale=sw, zp=zw),
             tensor(T.TENSOR_INT32, (4,), b, scale=so), scalar(T.INT32, C.ACT_NONE)]
    ctx = make_ctx(O.FULLY_CONNECTED, infos, [tensor(t, (0, 0), scale=so, zp=128)])
    ref, out = run_both(O.FULLY_CONNECTED, ctx, values(infos, x))
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(out[0].astype(np.int64), 128 + offsets)


# ---- element-wise float32 ---------------------------------------------------------------------

@pytest.mark.parametrize("op", [O.ADD, O.SUB, O.MUL, O.DIV])
@pytest.mark.parametrize("act", [C.ACT_NONE, C.ACT_RELU, C.ACT_RELU6])
def test_binary_float32(op, act):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32) * 4
    b = rng.standard_normal((3, 1)).astype(np.float32) * 4
    infos = [tensor(T.TENSOR_FLOAT32, a.shape), tensor(T.TENSOR_FLOAT32, b.shape),
             scalar(T.INT32, act)]
    ctx = make_ctx(op, infos, [tensor(T.TENSOR_FLOAT32, (2, 3, 4))])
    ref, out = run_both(op, ctx, [a, b, infos[2].value])
    np.testing.assert_array_equal(out, ref)


def test_binary_into_only_for_float32():
    infos = [tensor(T.TENSOR_INT32, (2,)), tensor(T.TENSOR_INT32, (2,)), scalar(T.INT32, 0)]
    ctx = make_ctx(O.ADD, infos, [tensor(T.TENSOR_INT32, (2,))])
    assert definitions()[int(O.ADD)].kernel_into(ctx) is None


@pytest.mark.parametrize("op", [O.RELU, O.RELU1, O.RELU6])
def test_relu_float32(op):
    x = (rng.standard_normal((2, 5, 3)) * 5).astype(np.float32)
    x[0, 0, 0] = np.nan
    infos = [tensor(T.TENSOR_FLOAT32, x.shape)]
    ctx = make_ctx(op, infos, [tensor(T.TENSOR_FLOAT32, x.shape)])
    ref, out = run_both(op, ctx, [x])
    np.testing.assert_array_equal(out, ref)


# ---- quantized ADD / SUB / MUL through a table --------------------------------------------------

@pytest.mark.parametrize("op", [O.ADD, O.SUB, O.MUL])
@pytest.mark.parametrize("t", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("act", [C.ACT_NONE, C.ACT_RELU, C.ACT_RELU1, C.ACT_RELU6])
def test_quant_binary_table_matches_kernel(op, t, act):
    if op == O.SUB and t == T.TENSOR_QUANT8_ASYMM and act == C.ACT_RELU1:
        act = C.ACT_NONE
    lo, hi = C.qrange(t)
    a = rng.integers(lo, hi + 1, (2, 3, 5)).astype(t.dtype)
    b = rng.integers(lo, hi + 1, (3, 1)).astype(t.dtype)
    a.flat[:2] = lo, hi
    infos = [tensor(t, a.shape, scale=0.07, zp=int(lo) + 100),
             tensor(t, b.shape, scale=0.013, zp=int(lo) + 7), scalar(T.INT32, act)]
    ctx = make_ctx(op, infos, [tensor(t, (2, 3, 5), scale=0.05, zp=int(lo) + 120)])
    ref, out = run_both(op, ctx, [a, b, infos[2].value])
    np.testing.assert_array_equal(out, ref)
    # every pair of input values at once, against the reference arithmetic
    grid = np.arange(256, dtype=np.uint8).view(t.dtype)
    ga, gb = np.repeat(grid, 256).reshape(256, 256), np.tile(grid, 256).reshape(256, 256)
    ref, out = run_both(op, make_ctx(op, [tensor(t, (256, 256), scale=0.07, zp=3),
                                          tensor(t, (256, 256), scale=0.011, zp=-2 - lo),
                                          infos[2]],
                                     [tensor(t, (256, 256), scale=0.09, zp=lo + 9)]),
                        [ga, gb, infos[2].value])
    np.testing.assert_array_equal(out, ref)


# ---- the lean requantisation of the convolutions ---------------------------------------------

def _reference_requant(acc, bias, m, s, zp, lo, hi):
    x = acc.astype(np.int64) + bias.astype(np.int64)
    return np.clip(C.requantize_int32_sum(x, m, s) + zp, lo, hi)


@pytest.mark.parametrize("per_channel", [False, True])
def test_requantize_into_is_bit_exact(per_channel):
    from nnhal.ops.conv_engine import requantize_into
    local = np.random.default_rng(5)
    for _ in range(60):
        cout = int(local.integers(1, 24))
        k = cout if per_channel else 1
        reals = np.exp(local.uniform(np.log(1e-6), np.log(0.99), k))
        reals[: k // 3] = 2.0 ** -local.integers(1, 20, k // 3)  # multiplier exactly 2**30
        pairs = [C.quantize_multiplier(float(r)) for r in reals]
        m = np.array([p[0] for p in pairs]).reshape(-1 if per_channel else ())
        s = np.array([p[1] for p in pairs]).reshape(-1 if per_channel else ())
        shape = (int(local.integers(1, 3)), int(local.integers(1, 9)), cout)
        acc = local.integers(-(1 << 24) + 1, 1 << 24, shape)
        acc = (acc >> int(local.integers(0, 24))).astype(np.float32)  # small sums too: ties
        bias = local.integers(-(1 << 22), 1 << 22, cout).astype(np.int32)
        zp = int(local.integers(-128, 128))
        lo, hi = sorted(int(v) for v in local.integers(-128, 128, 2))
        dst = np.full(shape, 99, np.int8)
        assert requantize_into(acc, bias, m, s, zp, lo, hi, dst)
        np.testing.assert_array_equal(dst, _reference_requant(acc, bias, m, s, zp, lo, hi))


def test_requantize_into_declines_what_it_cannot_do_exactly():
    from nnhal.ops.conv_engine import requantize_into
    acc = np.ones((1, 2, 3), np.float32)
    bias = np.zeros(3, np.int32)
    dst = np.zeros((1, 2, 3), np.int8)
    m, s = C.quantize_multiplier(3.0)  # a left shift
    assert not requantize_into(acc, bias, np.int64(m), np.int64(s), 0, -128, 127, dst)
    m, s = C.quantize_multiplier(0.25)
    assert not requantize_into(acc.astype(np.float64), bias, np.int64(m), np.int64(s), 0,
                               -128, 127, dst)
    big = np.full(3, 2**31 - 2**20, np.int32)  # acc + bias could leave int32
    assert not requantize_into(acc, big, np.int64(m), np.int64(s), 0, -128, 127, dst)
    assert not dst.any()


def _tie_accumulators(local, m, e, bias, zp, lo, hi):
    """Per channel, accumulators at every rounding tie and step edge around the clamp range
    (both signs of the doubled high product), one either side of each, and extremes."""
    cols = []
    for c in range(len(m)):
        mc, ec = int(m[c]), int(e[c])
        h = (1 << (ec - 1)) if ec else 0
        xs = set()
        if mc:
            # z values just outside/inside the clamp, and around zero (the sign correction)
            for z in [*range(lo - zp - 3, lo - zp + 4), *range(hi - zp - 3, hi - zp + 4),
                      *range(-4, 5)]:
                for y in (z * (1 << ec) - h, z * (1 << ec) - h + 1, z * (1 << ec) + h - 1):
                    # the smallest x with floor((x*M + 2**30) / 2**31) == y, and neighbours
                    x0 = -((-(y * (1 << 31) - (1 << 30))) // mc)
                    xs.update((x0 - 1, x0, x0 + 1))
        xs.update((-1, 0, 1, -2, 2))
        acc = np.array(sorted(xs), np.int64) - int(bias[c])
        acc = acc[np.abs(acc) < (1 << 24)]
        extra = local.integers(-(1 << 24) + 1, 1 << 24, 40)
        extra[:4] = (-(1 << 24) + 1, (1 << 24) - 1, 0, -1)
        cols.append(np.concatenate([acc, extra]))
    n = max(len(a) for a in cols)
    out = np.empty((n, len(m)), np.float32)
    for c, a in enumerate(cols):
        out[:, c] = np.resize(a, n)  # repeat to fill: every value stays in its channel
    return out


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("signed", [True, False])
def test_requantizer_float_route_is_bit_exact_at_ties_and_extremes(per_channel, signed):
    from nnhal.ops.conv_engine import Requantizer
    local = np.random.default_rng(17 + per_channel + 2 * signed)
    qmin, qmax = (-128, 127) if signed else (0, 255)
    used = 0
    for trial in range(40):
        cout = int(local.integers(1, 12)) if per_channel else 1
        reals = np.exp(local.uniform(np.log(3e-4), np.log(0.999), cout))
        reals[: cout // 3] = 2.0 ** -local.integers(1, 12, cout // 3)  # multiplier 2**30
        if trial % 5 == 0:
            reals[-1] = float(local.uniform(0.5, 0.999))  # no rounding shift (e = 0)
        pairs = [C.quantize_multiplier(float(r)) for r in reals]
        m = np.array([p[0] for p in pairs])
        s = np.array([p[1] for p in pairs])
        bias = local.integers(-(1 << 20), 1 << 20, cout).astype(np.int32)
        zp = int(local.integers(qmin, qmax + 1))
        act = trial % 3
        lo, hi = [(qmin, qmax), (max(zp, qmin), qmax),
                  sorted(int(v) for v in local.integers(qmin, qmax + 1, 2))][act]
        acc = _tie_accumulators(local, m, -s, bias, zp, lo, hi)
        mm, ss = (m, s) if per_channel else (m.reshape(()), s.reshape(()))
        rq = Requantizer(mm, ss, zp)
        want = _reference_requant(acc, bias, mm, ss, zp, lo, hi)
        bound = int(np.abs(acc).max())
        for dt in (np.float32, np.float64):
            a = acc.astype(dt)
            dst = np.full(acc.shape, 99, np.int8 if signed else np.uint8)
            assert rq.into(a, bias, lo, hi, dst, bound)
            np.testing.assert_array_equal(dst, want, err_msg=f"trial {trial} {dt}")
        used += rq._route(bias, acc.shape[-1], lo, hi) is not None
        # an NCHW output seen as NHWC: any destination layout
        a4 = acc.reshape(1, 1, -1, acc.shape[-1])
        back = np.zeros((1, acc.shape[-1], 1, acc.shape[0]), dst.dtype)
        assert rq.into(a4, bias, lo, hi, back.transpose(0, 2, 3, 1), bound)
        np.testing.assert_array_equal(back.transpose(0, 2, 3, 1)[0, 0], want)
    assert used >= 35  # the float route took (nearly) every case


def test_requantizer_first_rounding_boundary_exactly():
    """Multipliers picked so that x*M + 2**30 lands exactly on, and one below, a multiple of
    2**31 (the doubling high product's rounding boundary); with no shift (e = 0) every such
    step shows in the output."""
    from nnhal.ops.conv_engine import Requantizer
    ms, xs = [], []
    for x in range(-151, 152, 2):  # odd x: invertible modulo 2**31
        inv = pow(x % (1 << 31), -1, 1 << 31)
        for target in ((1 << 30), (1 << 30) - 1):  # x*M == target (mod 2**31)
            m = (target * inv) % (1 << 31)
            if m >= 1 << 30:
                ms.append(m)
                xs.append(x)
    assert len(ms) > 50
    m = np.array(ms, np.int64)
    shift = np.zeros(len(ms), np.int64)
    bias = np.arange(len(ms), dtype=np.int32) % 7 - 3
    acc = (np.array(xs) - bias).astype(np.float32)[None, :]
    acc = np.concatenate([acc, acc - 1, acc + 1])
    for zp, lo, hi, dt in ((3, -128, 127, np.int8), (100, 0, 255, np.uint8)):
        rq = Requantizer(m, shift, zp)
        assert rq._route(bias, len(ms), lo, hi) is not None
        dst = np.zeros(acc.shape, dt)
        assert rq.into(acc, bias, lo, hi, dst)
        np.testing.assert_array_equal(dst, _reference_requant(acc, bias, m, shift, zp, lo, hi))


def test_requantizer_outside_the_float_bound_still_exact():
    from nnhal.ops.conv_engine import Requantizer
    local = np.random.default_rng(3)
    acc = local.integers(-(1 << 23), 1 << 23, (50, 3))
    acc[:10] >>= 12
    acc = acc.astype(np.float32)
    for real, bias in ((2.0 ** -16 * 1.3, 5), (0.01, 1 << 22), (0.3, -(1 << 23))):
        m, s = C.quantize_multiplier(real)
        b = np.array([bias, -bias, 7], np.int32)
        rq = Requantizer(np.int64(m), np.int64(s), -3)
        assert rq._route(b, 3, -128, 127) is None
        dst = np.zeros(acc.shape, np.int8)
        assert rq.into(acc, b, -128, 127, dst)  # the int64 passes
        np.testing.assert_array_equal(dst, _reference_requant(acc, b, m, s, -3, -128, 127))
    m, s = C.quantize_multiplier(3.0)  # a left shift: neither route
    rq = Requantizer(np.int64(m), np.int64(s), 0)
    dst = np.zeros(acc.shape, np.int8)
    assert not rq.into(acc, np.zeros(3, np.int32), -128, 127, dst)
    assert not dst.any()


def test_requantizer_float64_needs_a_bound_inside_int32():
    """The float64 route assumes acc + bias stays in int32 (where the reference's int32
    accumulator does not wrap): without a bound on |acc|, or with one that lets the sum
    leave int32, a float64 accumulator is refused (the caller then runs the wrapping int64
    steps); a float32 one is below 2**24 whatever the bound says."""
    from nnhal.ops.conv_engine import Requantizer
    m, s = C.quantize_multiplier(2.0 ** -8)
    rq = Requantizer(np.int64(m), np.int64(s), 0)
    acc = np.array([[-5.0, 0.0, 7.0]])
    b = np.array([3, 2, 1], np.int32)
    assert rq._route(b, 3, -128, 127) is not None
    dst = np.zeros(acc.shape, np.int8)
    assert not rq.into(acc, b, -128, 127, dst)
    assert not rq.into(acc, b, -128, 127, dst, (1 << 31) - (1 << 22))
    assert not dst.any()
    assert rq.into(acc, b, -128, 127, dst, (1 << 31) - 1 - (1 << 22))
    assert rq.into(acc.astype(np.float32), b, -128, 127, dst, None)


# ---- BLAS thread control ----------------------------------------------------------------------

def test_blas_threads_context_restores_the_count():
    from nnhal.ops import blas
    before = blas.get_threads()
    with blas.blas_threads(1) as previous:
        assert previous == before
        if blas.available():
            assert blas.get_threads() == 1
    assert blas.get_threads() == before
    np.testing.assert_allclose(np.ones((8, 8)) @ np.ones((8, 8)), 8.0)


def test_blas_helpers_are_no_ops_without_a_library(monkeypatch):
    from nnhal.ops import blas
    monkeypatch.setattr(blas, "_searched", True)
    monkeypatch.setattr(blas, "_found", None)
    assert not blas.available()
    assert blas.get_threads() is None and blas.set_threads(1) is None
    with blas.blas_threads(1) as previous:
        assert previous is None


@pytest.mark.parametrize("const_alpha", [True, False])
def test_prelu_float32(const_alpha):
    x = (rng.standard_normal((1, 4, 5, 3)) * 3).astype(np.float32)
    x[0, 0, 0] = [np.nan, np.inf, -np.inf]
    alpha = np.array([[[0.25, 1.5, 0.0]]], np.float32)
    infos = [tensor(T.TENSOR_FLOAT32, x.shape),
             tensor(T.TENSOR_FLOAT32, alpha.shape, alpha if const_alpha else None)]
    ctx = make_ctx(O.PRELU, infos, [tensor(T.TENSOR_FLOAT32, x.shape)])
    ref, out = run_both(O.PRELU, ctx, [x, alpha])
    np.testing.assert_array_equal(out, ref)
    # alpha larger than x: the output takes the broadcast shape
    small = x[:, :1, :1, :]
    infos = [tensor(T.TENSOR_FLOAT32, small.shape), tensor(T.TENSOR_FLOAT32, (1, 4, 5, 3),
                                                           x if const_alpha else None)]
    ctx = make_ctx(O.PRELU, infos, [tensor(T.TENSOR_FLOAT32, (1, 4, 5, 3))])
    ref, out = run_both(O.PRELU, ctx, [small, np.nan_to_num(x)])
    np.testing.assert_array_equal(out, ref)
