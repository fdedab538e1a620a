"""RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR: sampling modes, layouts and validation."""

import numpy as np
import pytest

from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.catalog import lookup
from nnhal.ops.resolver import OpContext, OpError
from nnhal.ops.testing import omitted, output, run_op, tensor

U8, S8 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED
F32, F16 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16

IMG = np.array([1.0, 2.0, 3.0, 4.0], np.float32).reshape(1, 2, 2, 1)  # f(y, x) = 1 + 2y + x


def size(w, h):
    return [tensor(T.INT32, w), tensor(T.INT32, h)]


def flags(nchw=False, align=None, half=None):
    out = [tensor(T.BOOL, nchw)]
    if align is not None:
        out.append(tensor(T.BOOL, align))
    if half is not None:
        out.append(tensor(T.BOOL, half))
    return out


def f(ys, xs):
    return 1 + 2 * np.minimum(ys, 1)[:, None] + np.minimum(xs, 1)[None, :]


def test_bilinear_legacy_by_shape_v1_0_arity():
    (out,) = run_op(O.RESIZE_BILINEAR, [tensor(F32, IMG), *size(3, 3)],
                    [output(F32, [1, 3, 3, 1])])
    pos = np.array([0, 2 / 3, 4 / 3])
    np.testing.assert_allclose(out[0, :, :, 0], f(pos, pos), rtol=1e-6)


def test_bilinear_align_corners():
    (out,) = run_op(O.RESIZE_BILINEAR, [tensor(F32, IMG), *size(3, 3), *flags(False, True, False)],
                    [output(F32, [1, 3, 3, 1])])
    pos = np.array([0, 0.5, 1])
    np.testing.assert_allclose(out[0, :, :, 0], f(pos, pos), rtol=1e-6)


def test_bilinear_half_pixel_centers():
    (out,) = run_op(O.RESIZE_BILINEAR, [tensor(F32, IMG), *size(4, 4), *flags(False, False, True)],
                    [output(F32, [1, 4, 4, 1])])
    pos = np.array([0, 0.25, 0.75, 1])  # -0.25 and 1.25 clamp to the edges
    np.testing.assert_allclose(out[0, :, :, 0], f(pos, pos), rtol=1e-6)


def test_bilinear_by_scale_nchw_two_channels():
    img = np.concatenate([IMG, IMG * 10], axis=3).transpose(0, 3, 1, 2)  # (1, 2, 2, 2)
    scale = [tensor(T.FLOAT32, 1.5), tensor(T.FLOAT32, 1.5)]
    (out,) = run_op(O.RESIZE_BILINEAR, [tensor(F32, img), *scale, *flags(True)],
                    [output(F32, [1, 2, 3, 3])])
    pos = np.array([0, 2 / 3, 4 / 3])
    np.testing.assert_allclose(out[0, 0], f(pos, pos), rtol=1e-6)
    np.testing.assert_allclose(out[0, 1], 10 * f(pos, pos), rtol=1e-6)


def test_bilinear_float16_scale():
    scale = [tensor(T.FLOAT16, 2.0), tensor(T.FLOAT16, 1.0)]
    (out,) = run_op(O.RESIZE_BILINEAR, [tensor(F16, IMG), *scale, *flags()],
                    [output(F16, [1, 2, 4, 1])])
    assert out.dtype == np.float16
    np.testing.assert_allclose(out[0, :, :, 0], f(np.array([0, 1]), np.array([0, .5, 1, 1.5])))


def test_bilinear_quant_rounds_half_up():
    x = tensor(U8, [0, 1], 0.5, 0, shape=(1, 1, 2, 1))
    (u,) = run_op(O.RESIZE_BILINEAR, [x, *size(4, 1)], [output(U8, [1, 1, 4, 1], 0.5, 0)])
    np.testing.assert_array_equal(u.ravel(), [0, 1, 1, 1])  # 0, 0.5, 1, 1
    x = tensor(S8, [-128, -127], 0.5, -128, shape=(1, 1, 2, 1))
    (s,) = run_op(O.RESIZE_BILINEAR, [x, *size(4, 1)], [output(S8, [1, 1, 4, 1], 0.5, -128)])
    np.testing.assert_array_equal(s.ravel(), [-128, -127, -127, -127])


def test_nearest_modes():
    x = tensor(F32, IMG)
    (legacy,) = run_op(O.RESIZE_NEAREST_NEIGHBOR, [x, *size(4, 4), *flags()],
                       [output(F32, [1, 4, 4, 1])])
    np.testing.assert_array_equal(legacy[0, :, :, 0], IMG[0, [0, 0, 1, 1]][:, [0, 0, 1, 1], 0])
    (align,) = run_op(O.RESIZE_NEAREST_NEIGHBOR, [x, *size(3, 3), *flags(False, True, False)],
                      [output(F32, [1, 3, 3, 1])])
    # positions 0, 0.5, 1 round half away from zero: 0, 1, 1.
    np.testing.assert_array_equal(align[0, :, :, 0], IMG[0, [0, 1, 1]][:, [0, 1, 1], 0])
    (half,) = run_op(O.RESIZE_NEAREST_NEIGHBOR, [x, *size(3, 1), *flags(False, False, True)],
                     [output(F32, [1, 1, 3, 1])])
    # rows: (0 + 0.5) * 2 = 1; columns: (j + 0.5) * 2/3 = 0.33, 1, 1.67.
    np.testing.assert_array_equal(half[0, 0, :, 0], IMG[0, 1, [0, 1, 1], 0])


def test_nearest_quant_nchw_downscale():
    q = np.arange(16, dtype=np.int8).reshape(1, 1, 4, 4)
    scale = [tensor(T.FLOAT32, 0.5), tensor(T.FLOAT32, 0.5)]
    (out,) = run_op(O.RESIZE_NEAREST_NEIGHBOR, [tensor(S8, q, 0.1, 3), *scale, *flags(True)],
                    [output(S8, [1, 1, 2, 2], 0.1, 3)])
    np.testing.assert_array_equal(out[0, 0], [[0, 2], [8, 10]])
    assert out.dtype == np.int8


@pytest.mark.parametrize("op", [O.RESIZE_BILINEAR, O.RESIZE_NEAREST_NEIGHBOR])
def test_zero_batches(op):
    (out,) = run_op(op, [tensor(F32, np.zeros((0, 2, 2, 3), np.float32)), *size(5, 4), *flags()],
                    [output(F32, [0, 4, 5, 3])])
    assert out.shape == (0, 4, 5, 3)


@pytest.mark.parametrize(("op", "ins", "out"), [
    (O.RESIZE_BILINEAR, [tensor(F32, IMG), *size(3, 3), *flags(False, True, True)], None),
    (O.RESIZE_BILINEAR, [tensor(F32, IMG), *size(0, 3)], None),
    (O.RESIZE_BILINEAR, [tensor(F32, IMG), tensor(T.FLOAT16, 2.0), tensor(T.FLOAT16, 2.0)], None),
    (O.RESIZE_BILINEAR, [tensor(F32, IMG), tensor(T.FLOAT32, 0.1), tensor(T.FLOAT32, 0.1)], None),
    (O.RESIZE_NEAREST_NEIGHBOR, [tensor(F32, IMG), *size(3, 3)], None),  # layout required
    (O.RESIZE_BILINEAR, [tensor(F32, IMG[0]), *size(3, 3)], None),        # rank 3
    (O.RESIZE_BILINEAR, [tensor(U8, [1, 2, 3, 4], 0.5, 0, shape=(1, 2, 2, 1)), *size(3, 3)],
     output(U8, [1, 3, 3, 1], 0.25, 0)),                                   # requantizing
])
def test_invalid(op, ins, out):
    out = out or output(ins[0][0].type)
    with pytest.raises(OpError):
        run_op(op, ins, [out])


def test_omitted_optional_flags_are_false():
    """RESIZE_BILINEAR's layout flag and both 1.3 flags may be omitted; NEAREST_NEIGHBOR's
    layout flag is required (only its two 1.3 flags are optional)."""
    ref = run_op(O.RESIZE_BILINEAR, [tensor(F32, IMG), *size(3, 3)], [output(F32)])[0]
    ins = [tensor(F32, IMG), *size(3, 3), omitted(T.BOOL), omitted(T.BOOL), omitted(T.BOOL)]
    (out,) = run_op(O.RESIZE_BILINEAR, ins, [output(F32, [1, 3, 3, 1])])
    np.testing.assert_array_equal(out, ref)
    ins = [tensor(F32, IMG), tensor(T.FLOAT32, 1.5), tensor(T.FLOAT32, 1.5), *flags(False),
           omitted(T.BOOL), tensor(T.BOOL, True)]
    (out,) = run_op(O.RESIZE_NEAREST_NEIGHBOR, ins, [output(F32, [1, 3, 3, 1])])
    assert out.shape == (1, 3, 3, 1)
    with pytest.raises(OpError, match="cannot be omitted"):
        run_op(O.RESIZE_NEAREST_NEIGHBOR, [tensor(F32, IMG), *size(3, 3), omitted(T.BOOL)],
               [output(F32)])
    with pytest.raises(OpError, match="cannot be omitted"):
        run_op(O.RESIZE_BILINEAR, [tensor(F32, IMG), omitted(T.INT32), tensor(T.INT32, 3)],
               [output(F32)])


def test_prepare_with_omitted_layout_infers_the_shape():
    ins = [tensor(F32, IMG)[0], *(i for i, _ in size(3, 4)), omitted(T.BOOL)[0]]
    ctx = OpContext(O.RESIZE_BILINEAR, ins, [output(F32)])
    assert lookup(O.RESIZE_BILINEAR).prepare(ctx) == [(1, 4, 3, 1)]
