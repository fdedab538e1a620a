"""AVERAGE_POOL_2D, MAX_POOL_2D and L2_POOL_2D against hand-computed values."""

import math

import numpy as np
import pytest

from nnhal.hal.types import OperandLifeTime
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.catalog import lookup
from nnhal.ops.resolver import OpContext, OperandInfo, OpError
from nnhal.ops.testing import omitted, output, run_op, tensor

U8, S8 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED
F32, F16 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16


def i32(v):
    return tensor(T.INT32, v)


def zeros(shape, t=F32):
    return tensor(t, np.zeros(shape))


def explicit(pads=(0, 0, 0, 0), strides=(1, 1), filt=(2, 2), act=0, nchw=None):
    """Scalar inputs 1..9 (and 10) of the explicit-padding form: l, r, t, b, sw, sh, fw, fh."""
    ins = [i32(p) for p in pads] + [i32(s) for s in strides] + [i32(f) for f in filt] + [i32(act)]
    if nchw is not None:
        ins.append(tensor(T.BOOL, nchw))
    return ins


def implicit(scheme, strides=(1, 1), filt=(2, 2), act=0, nchw=None):
    ins = [i32(scheme)] + [i32(s) for s in strides] + [i32(f) for f in filt] + [i32(act)]
    if nchw is not None:
        ins.append(tensor(T.BOOL, nchw))
    return ins


def test_average_pool_float_valid_windows():
    x = tensor(F32, np.arange(1, 10, dtype=np.float32).reshape(1, 3, 3, 1))
    (out,) = run_op(O.AVERAGE_POOL_2D, [x, *explicit()], [output(F32, [1, 2, 2, 1])])
    np.testing.assert_allclose(out.ravel(), [3.0, 4.0, 6.0, 7.0])
    assert out.dtype == np.float32 and out.shape == (1, 2, 2, 1)


def test_average_pool_same_padding_counts_only_real_pixels():
    # SAME with a 2x2 filter on 2x2 pads one row/column at the end; padding is not averaged.
    x = tensor(F32, [1.0, 2.0, 3.0, 4.0], shape=(1, 2, 2, 1))
    (out,) = run_op(O.AVERAGE_POOL_2D, [x, *implicit(1)], [output(F32, [1, 2, 2, 1])])
    np.testing.assert_allclose(out.ravel(), [2.5, 3.0, 3.5, 4.0])


def test_average_pool_nchw_matches_nhwc():
    vals = np.arange(8, dtype=np.float32)  # two channels
    nhwc = tensor(F32, vals.reshape(1, 2, 2, 2))
    nchw = tensor(F32, vals.reshape(1, 2, 2, 2).transpose(0, 3, 1, 2))
    (a,) = run_op(O.AVERAGE_POOL_2D, [nhwc, *implicit(1, nchw=False)], [output(F32, [1, 2, 2, 2])])
    (b,) = run_op(O.AVERAGE_POOL_2D, [nchw, *implicit(1, nchw=True)], [output(F32, [1, 2, 2, 2])])
    np.testing.assert_allclose(b, a.transpose(0, 3, 1, 2))
    np.testing.assert_allclose(a[0, 0, 0], [3.0, 4.0])  # mean of channel 0: 0,2,4,6


@pytest.mark.parametrize("nchw", [False, True])
def test_average_pool_global_window_is_the_mean_with_activation(nchw):
    # A window over the whole input (MobileNet's last pool): per batch and channel mean,
    # then the fused RELU6 clamp; two batches, so no mixing across batches or channels.
    rng = np.random.default_rng(3)
    shift = np.array([-9.0, -1.0, 0.5, 2.0, 5.0, 12.0])  # means below, inside and above [0, 6]
    x = (rng.standard_normal((2, 5, 4, 6)) + shift).astype(np.float32)
    arg = x.transpose(0, 3, 1, 2) if nchw else x
    out_shape = [2, 6, 1, 1] if nchw else [2, 1, 1, 6]
    (out,) = run_op(O.AVERAGE_POOL_2D, [tensor(F32, arg), *explicit(filt=(4, 5), act=3,
                                                                    nchw=nchw)],
                    [output(F32, out_shape)])
    want = np.clip(x.astype(np.float64).mean(axis=(1, 2)), 0.0, 6.0)
    got = out.reshape(2, 6)
    assert out.dtype == np.float32 and tuple(out.shape) == tuple(out_shape)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert (got > 0).any() and (got < 6).any() and (got == 6).any()


def test_average_pool_padded_counts_stay_the_same_across_runs():
    # The per-position window sizes are cached: a second run must see the same divisors.
    x = tensor(F32, [1.0, 2.0, 3.0, 4.0], shape=(1, 2, 2, 1))
    for _ in range(2):
        (out,) = run_op(O.AVERAGE_POOL_2D, [x, *implicit(1)], [output(F32, [1, 2, 2, 1])])
        np.testing.assert_allclose(out.ravel(), [2.5, 3.0, 3.5, 4.0])


def test_average_pool_float16_keeps_type():
    x = tensor(F16, [1.0, 2.0, 3.0, 5.0], shape=(1, 2, 2, 1))
    (out,) = run_op(O.AVERAGE_POOL_2D, [x, *explicit()], [output(F16, [1, 1, 1, 1])])
    assert out.dtype == np.float16 and float(out.ravel()[0]) == 2.75


def test_average_pool_quant_rounds_half_away_from_zero():
    (u,) = run_op(O.AVERAGE_POOL_2D,
                  [tensor(U8, [1, 2], 0.5, 0, shape=(1, 1, 2, 1)), *explicit(filt=(2, 1))],
                  [output(U8, [1, 1, 1, 1], 0.5, 0)])
    assert int(u.ravel()[0]) == 2  # 1.5 -> 2
    (s,) = run_op(O.AVERAGE_POOL_2D,
                  [tensor(S8, [-1, -2], 0.5, 0, shape=(1, 1, 2, 1)), *explicit(filt=(2, 1))],
                  [output(S8, [1, 1, 1, 1], 0.5, 0)])
    assert int(s.ravel()[0]) == -2 and s.dtype == np.int8  # -1.5 -> -2


def test_average_pool_quant_relu6_clamps():
    # scale 0.5, zero point 10: real 6 is 22.
    x = tensor(U8, [200, 200, 200, 200], 0.5, 10, shape=(1, 2, 2, 1))
    (out,) = run_op(O.AVERAGE_POOL_2D, [x, *explicit(act=3)], [output(U8, [1, 1, 1, 1], 0.5, 10)])
    assert int(out.ravel()[0]) == 22


def test_max_pool_float_with_relu6_and_stride():
    x = tensor(F32, [-1.0, 7.0, 3.0, 2.0, 0.5, -4.0, 1.0, 9.0], shape=(1, 2, 4, 1))
    (out,) = run_op(O.MAX_POOL_2D, [x, *explicit(strides=(2, 2), act=3)],
                    [output(F32, [1, 1, 2, 1])])
    np.testing.assert_array_equal(out.ravel(), [6.0, 6.0])


def test_max_pool_padding_never_wins():
    x = tensor(F32, [-5.0, -6.0, -7.0, -8.0], shape=(1, 2, 2, 1))
    (out,) = run_op(O.MAX_POOL_2D, [x, *explicit(pads=(1, 1, 1, 1))], [output(F32, [1, 3, 3, 1])])
    np.testing.assert_array_equal(out.reshape(3, 3),
                                  [[-5, -5, -6], [-5, -5, -6], [-7, -7, -8]])


def test_max_pool_quant_relu_clamps_to_zero_point():
    x = tensor(S8, [-20, -15, -30, -12], 0.5, -10, shape=(1, 2, 2, 1))
    (out,) = run_op(O.MAX_POOL_2D, [x, *explicit(act=1)], [output(S8, [1, 1, 1, 1], 0.5, -10)])
    assert int(out.ravel()[0]) == -10


def test_l2_pool_float():
    x = tensor(F32, [3.0, 4.0, 0.0, 0.0], shape=(1, 2, 2, 1))
    (out,) = run_op(O.L2_POOL_2D, [x, *explicit(filt=(2, 1))], [output(F32, [1, 2, 1, 1])])
    np.testing.assert_allclose(out.ravel(), [math.sqrt(12.5), 0.0], rtol=1e-6)


@pytest.mark.parametrize("op", [O.AVERAGE_POOL_2D, O.MAX_POOL_2D, O.L2_POOL_2D])
def test_zero_batches(op):
    x = tensor(F32, np.zeros((0, 2, 2, 1), np.float32))
    (out,) = run_op(op, [x, *explicit()], [output(F32, [0, 1, 1, 1])])
    assert out.shape == (0, 1, 1, 1) and out.dtype == np.float32


def test_runtime_scalar_parameters():
    # A stride known only at execution time is read from the inputs.
    stride = OperandInfo(type=T.INT32, shape=(), lifetime=OperandLifeTime.SUBGRAPH_INPUT)
    x = tensor(F32, np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1))
    ins = implicit(2)
    ins[1] = (stride, np.array(2, np.int32))
    ins[2] = (stride, np.array(2, np.int32))
    (out,) = run_op(O.MAX_POOL_2D, [x, *ins], [output(F32, [1, 2, 2, 1])])
    np.testing.assert_array_equal(out.ravel(), [5, 7, 13, 15])


def test_prepare_infers_shape():
    x = OperandInfo(type=F32, shape=(2, 1, 5, 7), lifetime=OperandLifeTime.SUBGRAPH_INPUT)
    ins = [x] + [i for i, _ in implicit(1, strides=(2, 2), filt=(3, 3), nchw=True)]
    ctx = OpContext(op_type=O.AVERAGE_POOL_2D, inputs=ins, outputs=[output(F32)])
    definition = lookup(O.AVERAGE_POOL_2D)
    definition.validate(ctx)
    assert definition.prepare(ctx) == [(2, 1, 3, 4)]


@pytest.mark.parametrize(("op", "inputs"), [
    # padding not smaller than the filter
    (O.AVERAGE_POOL_2D, lambda: [zeros((1, 3, 3, 1)), *explicit(pads=(2, 0, 0, 0))]),
    # zero stride
    (O.MAX_POOL_2D, lambda: [zeros((1, 3, 3, 1)), *explicit(strides=(0, 1))]),
    # unknown padding scheme
    (O.MAX_POOL_2D, lambda: [zeros((1, 3, 3, 1)), *implicit(3)]),
    # quantized L2 pooling does not exist
    (O.L2_POOL_2D, lambda: [tensor(U8, np.zeros((1, 3, 3, 1)), 1.0, 0), *explicit()]),
    # rank 3 input
    (O.AVERAGE_POOL_2D, lambda: [tensor(F32, np.zeros((3, 3, 1))), *explicit()]),
    # wrong number of inputs
    (O.AVERAGE_POOL_2D, lambda: [zeros((1, 3, 3, 1)), *explicit()[:8]]),
    # invalid activation
    (O.AVERAGE_POOL_2D, lambda: [zeros((1, 3, 3, 1)), *explicit(act=7)]),
    # filter larger than the input without padding
    (O.AVERAGE_POOL_2D, lambda: [tensor(F32, np.zeros((1, 1, 1, 1))), *explicit(filt=(3, 3))]),
])
def test_invalid_models_rejected(op, inputs):
    ins = inputs()
    first = ins[0][0]
    with pytest.raises(OpError):
        run_op(op, ins, [output(first.type, None, first.scale, first.zero_point)])


def test_quant_output_params_must_match_input():
    x = tensor(U8, np.zeros((1, 2, 2, 1)), 0.5, 0)
    with pytest.raises(OpError):
        run_op(O.MAX_POOL_2D, [x, *explicit()], [output(U8, [1, 1, 1, 1], 0.25, 0)])


def test_omitted_layout_flag_means_nhwc():
    """The optional layout flag may be omitted (NHWC), at run time and for shape inference."""
    x = tensor(F32, np.arange(1, 10, dtype=np.float32).reshape(1, 3, 3, 1))
    for op in (O.AVERAGE_POOL_2D, O.MAX_POOL_2D, O.L2_POOL_2D):
        (out,) = run_op(op, [x, *explicit(), omitted(T.BOOL)], [output(F32, [1, 2, 2, 1])])
        assert out.shape == (1, 2, 2, 1)
    (out,) = run_op(O.MAX_POOL_2D, [x, *implicit(2), omitted(T.BOOL)], [output(F32)])
    np.testing.assert_array_equal(out.ravel(), [5, 6, 8, 9])
    ins = [x[0], *(i for i, _ in implicit(2)), omitted(T.BOOL)[0]]
    ctx = OpContext(op_type=O.MAX_POOL_2D, inputs=ins, outputs=[output(F32)])
    assert lookup(O.MAX_POOL_2D).prepare(ctx) == [(1, 2, 2, 1)]


@pytest.mark.parametrize("k", range(10))
def test_omitted_parameter_is_rejected(k):
    ins = [zeros((1, 3, 3, 1)), *explicit()]
    ins[k] = omitted(ins[k][0].type)
    with pytest.raises(OpError, match="cannot be omitted"):
        run_op(O.AVERAGE_POOL_2D, ins, [output(F32)])
