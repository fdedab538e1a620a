"""ROI_ALIGN, ROI_POOLING and HEATMAP_MAX_KEYPOINT."""

import numpy as np
import pytest

from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.resolver import OpError
from nnhal.ops.testing import omitted, output, run_op, tensor

F32, F16, I32 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32
U8, S8 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED
Q16A = T.TENSOR_QUANT16_ASYMM

# A 4x4 feature map whose value is 4 * y + x: bilinear samples of it are exact.
RAMP = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)


def _align(feat=RAMP, rois=((0, 0, 4, 4),), batches=(0,), t=F32, nchw=False, ratio=2,
           roi_t=None, roi_scale=0.0, out_q=(0.0, 0), in_q=(0.0, 0), stride=1.0):
    s = T.FLOAT16 if t == F16 else T.FLOAT32
    feat = np.asarray(feat)
    if nchw:
        feat = feat.transpose(0, 3, 1, 2)
    n = len(rois)
    depth = feat.shape[1 if nchw else 3]
    shape = [n, depth, 2, 2] if nchw else [n, 2, 2, depth]
    out = run_op(O.ROI_ALIGN,
                 [tensor(t, feat, *in_q), tensor(roi_t or t, rois, roi_scale, shape=(n, 4)),
                  tensor(I32, batches, shape=(n,)), tensor(T.INT32, 2), tensor(T.INT32, 2),
                  tensor(s, stride), tensor(s, stride), tensor(T.INT32, ratio),
                  tensor(T.INT32, ratio), tensor(T.BOOL, nchw)],
                 [output(t, shape, *out_q)])[0]
    return out.transpose(0, 2, 3, 1) if nchw else out


def test_roi_align_bilinear_average():
    out = _align()
    # Samples at 0.5 and 1.5 (and 2.5, 3.5 -> clamped to 3) along each axis.
    np.testing.assert_allclose(out[0, :, :, 0], [[5.0, 6.75], [12.0, 13.75]], rtol=1e-6)


def test_roi_align_nchw_matches_nhwc_and_float16():
    feat = np.stack([RAMP[..., 0], -RAMP[..., 0]], axis=-1)
    expected = _align(feat)
    np.testing.assert_allclose(_align(feat, nchw=True), expected, rtol=1e-6)
    half = _align(feat.astype(np.float16), t=F16)
    assert half.dtype == np.float16
    np.testing.assert_allclose(half.astype(np.float32), expected, rtol=1e-3)


def test_roi_align_adaptive_sampling_and_stride():
    # Stride 2 maps the ROI [0, 0, 8, 8] onto the whole 4x4 map; ratio 0 -> ceil(2 / 1)... = 2.
    np.testing.assert_allclose(_align(ratio=0, rois=((0, 0, 8, 8),), stride=2.0),
                               _align(), rtol=1e-6)


def test_roi_align_quant():
    feat = RAMP.astype(np.uint8) + 10                       # zero point 10, scale 0.5
    rois = np.asarray([[0, 0, 32, 32]])                     # 0.125 -> [0, 0, 4, 4]
    out = _align(feat, rois, t=U8, roi_t=Q16A, roi_scale=0.125, in_q=(0.5, 10), out_q=(0.125, 0))
    assert out.dtype == np.uint8
    # Real values are half the ramp: 2.5, 3.375, 6, 6.875 -> /0.125.
    np.testing.assert_array_equal(out[0, :, :, 0], [[20, 27], [48, 55]])
    signed = _align((feat.astype(np.int16) - 128).astype(np.int8), rois, t=S8, roi_t=Q16A,
                    roi_scale=0.125, in_q=(0.5, -118), out_q=(0.125, -128))
    np.testing.assert_array_equal(signed[0, :, :, 0].astype(int) + 128, [[20, 27], [48, 55]])


def test_roi_align_zero_rois():
    out = _align(rois=np.zeros((0, 4)), batches=np.zeros(0))
    assert out.shape == (0, 2, 2, 1)


def test_roi_align_rejects_out_of_bounds_roi():
    with pytest.raises(OpError):
        _align(rois=((0, 0, 5, 4),))
    with pytest.raises(OpError):
        _align(batches=(1,))


def test_roi_align_rejects_bad_roi_quantization():
    with pytest.raises(OpError):
        _align(RAMP.astype(np.uint8), [[0, 0, 32, 32]], t=U8, roi_t=Q16A, roi_scale=0.25,
               in_q=(0.5, 0), out_q=(0.5, 0))



def test_roi_align_signature_binds_box_and_parameter_types():
    feat = RAMP.astype(np.float16)
    args = [tensor(F16, feat), tensor(F16, [[0, 0, 4, 4]]), tensor(I32, [0]), tensor(T.INT32, 2),
            tensor(T.INT32, 2), tensor(T.FLOAT32, 1.0), tensor(T.FLOAT16, 1.0),
            tensor(T.INT32, 2), tensor(T.INT32, 2), tensor(T.BOOL, False)]
    with pytest.raises(OpError, match=r"input 5 \(height_ratio\) has type FLOAT32, "
                                      "expected FLOAT16"):
        run_op(O.ROI_ALIGN, args, [output(F16, [1, 2, 2, 1])])
    args[5] = tensor(T.FLOAT16, 1.0)
    args[7] = omitted(T.INT32)
    with pytest.raises(OpError, match=r"input 7 \(height_samples\) cannot be omitted"):
        run_op(O.ROI_ALIGN, args, [output(F16, [1, 2, 2, 1])])


def _pool(feat=RAMP, rois=((0, 0, 3, 3),), t=F32, nchw=False, q=(0.0, 0), roi_t=None,
          roi_scale=0.0, out_q=None):
    s = T.FLOAT16 if t == F16 else T.FLOAT32
    feat = np.asarray(feat)
    if nchw:
        feat = feat.transpose(0, 3, 1, 2)
    n = len(rois)
    depth = feat.shape[1 if nchw else 3]
    shape = [n, depth, 2, 2] if nchw else [n, 2, 2, depth]
    out = run_op(O.ROI_POOLING,
                 [tensor(t, feat, *q), tensor(roi_t or t, rois, roi_scale, shape=(n, 4)),
                  tensor(I32, [0] * n), tensor(T.INT32, 2), tensor(T.INT32, 2),
                  tensor(s, 1.0), tensor(s, 1.0), tensor(T.BOOL, nchw)],
                 [output(t, shape, *(out_q or q))])[0]
    return out.transpose(0, 2, 3, 1) if nchw else out


def test_roi_pooling_max_per_bin():
    np.testing.assert_array_equal(_pool()[0, :, :, 0], [[5, 7], [13, 15]])
    # A one-cell ROI: every bin covers that cell.
    np.testing.assert_array_equal(_pool(rois=((1, 2, 1, 2),))[0, :, :, 0], [[9, 9], [9, 9]])


def test_roi_pooling_nchw_float16_and_quant():
    np.testing.assert_array_equal(_pool(nchw=True)[0, :, :, 0], [[5, 7], [13, 15]])
    half = _pool(RAMP.astype(np.float16), t=F16)
    assert half.dtype == np.float16
    q = _pool(RAMP.astype(np.int8) - 8, [[0, 0, 24, 24]], t=S8, q=(1.0, -8), roi_t=Q16A,
              roi_scale=0.125)
    np.testing.assert_array_equal(q[0, :, :, 0], [[-3, -1], [5, 7]])


def test_roi_pooling_output_quantization_must_match():
    with pytest.raises(OpError):
        _pool(RAMP.astype(np.uint8), [[0, 0, 24, 24]], t=U8, q=(1.0, 0), roi_t=Q16A,
              roi_scale=0.125, out_q=(0.5, 0))


def _heatmap(grid, box=(0, 0, 30, 30), t=F32, nchw=False):
    heat = np.asarray(grid, dtype=np.float32).reshape(1, 3, 3, 1)
    if nchw:
        heat = heat.transpose(0, 3, 1, 2)
    return run_op(O.HEATMAP_MAX_KEYPOINT,
                  [tensor(t, heat), tensor(t, [box]), tensor(T.BOOL, nchw)],
                  [output(t, [1, 1]), output(t, [1, 1, 2])])


def test_heatmap_symmetric_peak():
    score, keypoints = _heatmap([[0, 1, 0], [1, 2, 1], [0, 1, 0]])
    np.testing.assert_allclose(score, [[2.0]])
    np.testing.assert_allclose(keypoints, [[[15.0, 15.0]]])


@pytest.mark.parametrize("nchw", [False, True])
def test_heatmap_subpixel_shift(nchw):
    score, keypoints = _heatmap([[0, 1, 0], [1, 2, 1.5], [0, 1, 0]], nchw=nchw)
    d = 1.0 / 6.0
    np.testing.assert_allclose(score, [[2.0 + 0.25 * d - 0.75 * d * d]], rtol=1e-5)
    np.testing.assert_allclose(keypoints, [[[(1.5 + d) * 10.0, 15.0]]], rtol=1e-5)


def test_heatmap_quant_and_flat_map():
    heat = np.full((1, 3, 3, 1), 100, np.uint8)             # flat: singular Hessian
    score, kp = run_op(O.HEATMAP_MAX_KEYPOINT,
                       [tensor(U8, heat, 0.01, 0), tensor(Q16A, [[0, 0, 240, 240]], 0.125, 0),
                        tensor(T.BOOL, False)],
                       [output(U8, [1, 1], 0.01, 0), output(Q16A, [1, 1, 2], 0.125, 0)])
    np.testing.assert_array_equal(score, [[100]])
    # Max at cell (0, 0) with no correction: (0.5 / 3) * 30 = 5 -> 40 in 0.125 steps.
    np.testing.assert_array_equal(kp, [[[40, 40]]])


def test_heatmap_rejects_small_map_and_bad_box():
    with pytest.raises(OpError):
        run_op(O.HEATMAP_MAX_KEYPOINT,
               [tensor(F32, np.zeros((1, 1, 1, 1))), tensor(F32, [[0, 0, 1, 1]]),
                tensor(T.BOOL, False)], [output(F32, [1, 1]), output(F32, [1, 1, 2])])
    with pytest.raises(OpError):
        _heatmap(np.zeros((3, 3)), box=(10, 0, 5, 5))
