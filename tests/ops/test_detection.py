"""AXIS_ALIGNED_BBOX_TRANSFORM, BOX_WITH_NMS_LIMIT, GENERATE_PROPOSALS,
DETECTION_POSTPROCESSING and RANDOM_MULTINOMIAL."""

import math

import numpy as np
import pytest

from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.resolver import OpError
from nnhal.ops.testing import output, run_op, tensor

F32, F16, I32 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32
U8, S8 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED
Q16A, Q16S = T.TENSOR_QUANT16_ASYMM, T.TENSOR_QUANT16_SYMM


# ---- AXIS_ALIGNED_BBOX_TRANSFORM ----------------------------------------------------------------

LN2 = math.log(2)


def _bbox(t=F32, rois=((0, 0, 10, 10),), deltas=((0, 0, 0, 0, 0.1, 0.2, LN2, 0),),
          batches=(0,), info=((11, 12),), n_classes=2):
    n = len(rois)
    return run_op(O.AXIS_ALIGNED_BBOX_TRANSFORM,
                  [tensor(t, rois, shape=(n, 4)), tensor(t, deltas, shape=(n, 4 * n_classes)),
                   tensor(I32, batches, shape=(n,)), tensor(t, info)],
                  [output(t, [n, 4 * n_classes])])[0]


def test_bbox_transform_identity_and_clipping():
    out = _bbox()
    # Class 0: zero deltas keep the box. Class 1: centre (6, 7), size (20, 10) -> clipped.
    np.testing.assert_allclose(out, [[0, 0, 10, 10, 0, 2, 12, 11]], atol=1e-5)
    assert out.dtype == np.float32


def test_bbox_transform_float16():
    out = _bbox(F16)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float32), [[0, 0, 10, 10, 0, 2, 12, 11]], atol=1e-2)


def test_bbox_transform_quant():
    rois = tensor(Q16A, [[0, 0, 80, 80]], 0.125, 0)          # [0, 0, 10, 10]
    deltas = tensor(S8, [[0, 0, 0, 0, 1, 2, 0, 0]], 0.1, 0)  # dx 0.1, dy 0.2
    info = tensor(Q16A, [[88, 96]], 0.125, 0)                # [11, 12]
    (out,) = run_op(O.AXIS_ALIGNED_BBOX_TRANSFORM,
                    [rois, deltas, tensor(I32, [0]), info], [output(Q16A, [1, 8], 0.125, 0)])
    assert out.dtype == np.uint16
    # Class 1 box: centre (6, 7), size 10 -> [1, 2, 11, 12] clipped to [1, 2, 11, 11].
    np.testing.assert_array_equal(out, [[0, 0, 80, 80, 8, 16, 88, 88]])


def test_bbox_transform_zero_rois():
    out = _bbox(rois=np.zeros((0, 4)), deltas=np.zeros((0, 8)), batches=np.zeros(0))
    assert out.shape == (0, 8)


def test_bbox_transform_rejects_bad_batch_and_box():
    with pytest.raises(OpError):
        _bbox(batches=(1,))
    with pytest.raises(OpError):
        _bbox(rois=((5, 0, 1, 10),))


def test_bbox_transform_rejects_wrong_roi_quantization():
    with pytest.raises(OpError):
        run_op(O.AXIS_ALIGNED_BBOX_TRANSFORM,
               [tensor(Q16A, [[0, 0, 8, 8]], 0.5, 0), tensor(U8, [[0, 0, 0, 0]], 0.1, 0),
                tensor(I32, [0]), tensor(Q16A, [[8, 8]], 0.125, 0)],
               [output(Q16A, [1, 4], 0.125, 0)])


# ---- BOX_WITH_NMS_LIMIT -------------------------------------------------------------------------

BOXES = [[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]]
IOU_AB = 81.0 / 119.0


def _nms(kernel, nms_thr=0.3, batches=(0, 0, 0), score_thr=0.1, max_det=-1, sigma=0.5,
         iou_thr=0.5, scores=(0.9, 0.8, 0.7)):
    n = len(scores)
    score = np.stack([np.zeros(n), scores], axis=1)
    rois = np.concatenate([np.zeros((n, 4)), np.asarray(BOXES[:n]).reshape(n, 4)], axis=1)
    return run_op(O.BOX_WITH_NMS_LIMIT,
                  [tensor(F32, score), tensor(F32, rois), tensor(I32, batches),
                   tensor(T.FLOAT32, score_thr), tensor(T.INT32, max_det), tensor(T.INT32, kernel),
                   tensor(T.FLOAT32, iou_thr), tensor(T.FLOAT32, sigma),
                   tensor(T.FLOAT32, nms_thr)],
                  [output(F32, [0]), output(F32, [0, 4]), output(I32, [0]), output(I32, [0])])


def test_nms_hard_removes_overlap():
    scores, boxes, classes, batches = _nms(0)
    np.testing.assert_allclose(scores, [0.9, 0.7])
    np.testing.assert_array_equal(boxes, [BOXES[0], BOXES[2]])
    np.testing.assert_array_equal(classes, [1, 1])
    np.testing.assert_array_equal(batches, [0, 0])


def test_nms_linear_decays_score():
    scores, boxes, _, _ = _nms(1, nms_thr=0.2)
    np.testing.assert_allclose(scores, [0.9, 0.7, 0.8 * (1 - IOU_AB)], rtol=1e-5)
    np.testing.assert_array_equal(boxes[2], BOXES[1])
    # Above the NMS score threshold the decayed box is dropped.
    assert _nms(1, nms_thr=0.3)[0].shape == (2,)


def test_nms_gaussian_decays_score():
    scores, _, _, _ = _nms(2, nms_thr=0.2, sigma=0.5)
    np.testing.assert_allclose(scores, [0.9, 0.7, 0.8 * math.exp(-IOU_AB ** 2 / 0.5)], rtol=1e-5)


def test_nms_groups_by_batch_and_limits():
    scores, boxes, _, batches = _nms(0, batches=(0, 0, 3))
    np.testing.assert_array_equal(batches, [0, 3])
    np.testing.assert_allclose(scores, [0.9, 0.7])
    # max_det limits each batch; score threshold is strict.
    scores, _, _, batches = _nms(0, max_det=1, batches=(0, 0, 3), score_thr=0.7)
    np.testing.assert_allclose(scores, [0.9])
    np.testing.assert_array_equal(batches, [0])


def test_nms_zero_rois_and_nothing_selected():
    outs = _nms(0, scores=(), batches=())
    assert [o.shape for o in outs] == [(0,), (0, 4), (0,), (0,)]
    outs = _nms(0, score_thr=0.95)
    assert outs[1].shape == (0, 4) and outs[3].dtype == np.int32


def test_nms_quant_signed_scores():
    score = tensor(S8, [[-128, 52], [-128, 42], [-128, 32]], 0.005, -128)  # 0.9, 0.85, 0.8
    rois = tensor(Q16A, np.concatenate([np.zeros((3, 4)), np.asarray(BOXES) * 8], axis=1),
                  0.125, 0)
    outs = run_op(O.BOX_WITH_NMS_LIMIT,
                  [score, rois, tensor(I32, [0, 0, 0]), tensor(T.FLOAT32, 0.1),
                   tensor(T.INT32, -1), tensor(T.INT32, 0), tensor(T.FLOAT32, 0.5),
                   tensor(T.FLOAT32, 0.5), tensor(T.FLOAT32, 0.3)],
                  [output(S8, [0], 0.005, -128), output(Q16A, [0, 4], 0.125, 0),
                   output(I32, [0]), output(I32, [0])])
    np.testing.assert_array_equal(outs[0], [52, 32])
    assert outs[0].dtype == np.int8
    np.testing.assert_array_equal(outs[1], [[0, 0, 80, 80], [160, 160, 240, 240]])


def test_nms_rejects_bad_kernel_and_single_class():
    with pytest.raises(OpError):
        _nms(3)
    with pytest.raises(OpError):
        run_op(O.BOX_WITH_NMS_LIMIT,
               [tensor(F32, [[0.5]]), tensor(F32, [[0, 0, 1, 1]]), tensor(I32, [0]),
                tensor(T.FLOAT32, 0.1), tensor(T.INT32, -1), tensor(T.INT32, 0),
                tensor(T.FLOAT32, 0.5), tensor(T.FLOAT32, 0.5), tensor(T.FLOAT32, 0.3)],
               [output(F32, [0]), output(F32, [0, 4]), output(I32, [0]), output(I32, [0])])



def test_nms_parameter_types_follow_the_score_type():
    """Float16 scores take FLOAT16 parameters; quantized scores take QUANT16_ASYMM boxes."""
    f16 = [tensor(F16, [[0.0, 0.9]]), tensor(F16, [[0, 0, 0, 0, 0, 0, 1, 1]]), tensor(I32, [0]),
           tensor(T.FLOAT16, 0.1), tensor(T.INT32, -1), tensor(T.INT32, 0),
           tensor(T.FLOAT16, 0.5), tensor(T.FLOAT16, 0.5), tensor(T.FLOAT16, 0.3)]
    outs = [output(F16), output(F16), output(I32), output(I32)]
    scores, _, _, _ = run_op(O.BOX_WITH_NMS_LIMIT, f16, outs)
    np.testing.assert_allclose(scores.astype(np.float32), [0.9], rtol=1e-3)
    f16[3] = tensor(T.FLOAT32, 0.1)
    with pytest.raises(OpError, match=r"input 3 \(score_threshold\) has type FLOAT32"):
        run_op(O.BOX_WITH_NMS_LIMIT, f16, outs)
    q = [tensor(U8, [[0, 200]], 0.01, 0), tensor(F32, [[0, 0, 0, 0, 0, 0, 1, 1]]),
         *f16[2:]]
    with pytest.raises(OpError, match=r"input 1 \(rois\) has type TENSOR_FLOAT32, expected "
                                      "TENSOR_QUANT16_ASYMM"):
        run_op(O.BOX_WITH_NMS_LIMIT, q, outs)


# ---- GENERATE_PROPOSALS -------------------------------------------------------------------------

def _proposals(nchw=False, pre_n=-1, t=F32, min_size=1.0):
    s = T.FLOAT16 if t == F16 else T.FLOAT32
    scores = np.array([0.5, 0.9]).reshape(1, 1, 2, 1)     # NHWC [1, H=1, W=2, A=1]
    deltas = np.zeros((1, 1, 2, 4))
    if nchw:
        scores, deltas = scores.transpose(0, 3, 1, 2), deltas.transpose(0, 3, 1, 2)
    return run_op(O.GENERATE_PROPOSALS,
                  [tensor(t, scores), tensor(t, deltas), tensor(t, [[0, 0, 4, 4]]),
                   tensor(t, [[10, 10]]), tensor(s, 4.0), tensor(s, 4.0),
                   tensor(T.INT32, pre_n), tensor(T.INT32, -1), tensor(s, 0.5),
                   tensor(s, min_size), tensor(T.BOOL, nchw)],
                  [output(t, [0]), output(t, [0, 4]), output(I32, [0])])


@pytest.mark.parametrize("nchw", [False, True])
def test_generate_proposals_orders_by_score(nchw):
    scores, rois, batches = _proposals(nchw)
    np.testing.assert_allclose(scores, [0.9, 0.5])
    np.testing.assert_allclose(rois, [[4, 0, 8, 4], [0, 0, 4, 4]])
    np.testing.assert_array_equal(batches, [0, 0])


def test_generate_proposals_pre_nms_limit_and_min_size():
    scores, _, _ = _proposals(pre_n=1)
    np.testing.assert_allclose(scores, [0.9])
    scores, rois, batches = _proposals(min_size=5.0)
    assert scores.shape == (0,) and rois.shape == (0, 4) and batches.shape == (0,)


def test_generate_proposals_float16():
    scores, rois, _ = _proposals(t=F16)
    assert scores.dtype == np.float16 and rois.dtype == np.float16
    np.testing.assert_allclose(rois.astype(np.float32), [[4, 0, 8, 4], [0, 0, 4, 4]])


def test_generate_proposals_quant_types_checked():
    args = [tensor(U8, np.zeros((1, 1, 1, 1)), 0.1, 0), tensor(U8, np.zeros((1, 1, 1, 4)), 0.1, 0),
            tensor(Q16S, [[0, 0, 8, 8]], 0.125, 0), tensor(Q16A, [[80, 80]], 0.125, 0),
            tensor(T.FLOAT32, 1.0), tensor(T.FLOAT32, 1.0), tensor(T.INT32, -1),
            tensor(T.INT32, -1), tensor(T.FLOAT32, 0.5), tensor(T.FLOAT32, 0.0),
            tensor(T.BOOL, False)]
    outs = [output(U8, [0], 0.1, 0), output(Q16A, [0, 4], 0.125, 0), output(I32, [0])]
    scores, rois, _ = run_op(O.GENERATE_PROPOSALS, args, outs)
    np.testing.assert_array_equal(rois, [[0, 0, 8, 8]])
    args[3] = tensor(Q16A, [[80, 80]], 0.25, 0)
    with pytest.raises(OpError):
        run_op(O.GENERATE_PROPOSALS, args, outs)


# ---- DETECTION_POSTPROCESSING -------------------------------------------------------------------

def _postprocess(regular, max_det=3, max_cls=1, bg=False):
    scores = [[[0.0, 0.9, 0.3], [0.0, 0.2, 0.8]]]
    anchors = [[5, 5, 10, 10], [50, 50, 10, 10]]
    n_out = max_det if regular else max_det * max_cls
    f = T.FLOAT32
    return run_op(O.DETECTION_POSTPROCESSING,
                  [tensor(F32, scores), tensor(F32, np.zeros((1, 2, 4))), tensor(F32, anchors),
                   tensor(f, 1.0), tensor(f, 1.0), tensor(f, 1.0), tensor(f, 1.0),
                   tensor(T.BOOL, regular), tensor(T.INT32, max_det), tensor(T.INT32, max_cls),
                   tensor(T.INT32, 2), tensor(f, 0.25), tensor(f, 0.5), tensor(T.BOOL, bg)],
                  [output(F32, [1, n_out]), output(F32, [1, n_out, 4]), output(I32, [1, n_out]),
                   output(I32, [1])])


def test_postprocess_regular_nms():
    scores, boxes, classes, num = _postprocess(True)
    np.testing.assert_allclose(scores, [[0.9, 0.8, 0.3]])
    np.testing.assert_allclose(boxes, [[[0, 0, 10, 10], [45, 45, 55, 55], [0, 0, 10, 10]]])
    np.testing.assert_array_equal(classes, [[0, 1, 1]])
    np.testing.assert_array_equal(num, [3])


def test_postprocess_fast_nms_pads_with_zeros():
    scores, boxes, classes, num = _postprocess(False, bg=True)
    np.testing.assert_allclose(scores, [[0.9, 0.8, 0.0]])
    np.testing.assert_allclose(boxes[0, 2], [0, 0, 0, 0])
    np.testing.assert_array_equal(classes, [[1, 2, 0]])
    np.testing.assert_array_equal(num, [2])


def test_postprocess_rejects_nonpositive_max_detections():
    with pytest.raises(OpError):
        _postprocess(True, max_det=0)


# ---- RANDOM_MULTINOMIAL -------------------------------------------------------------------------

def _multinomial(logits, n, seeds=(37, 42), t=F32):
    return run_op(O.RANDOM_MULTINOMIAL, [tensor(t, logits), tensor(T.INT32, n),
                                         tensor(I32, seeds)],
                  [output(I32, [len(logits), n])])[0]


def test_multinomial_distribution_and_determinism():
    out = _multinomial([[0.0, math.log(3.0)], [-100.0, 100.0]], 4000)
    assert out.shape == (2, 4000) and out.dtype == np.int32
    assert abs(np.mean(out[0] == 1) - 0.75) < 0.03
    assert np.all(out[1] == 1)
    np.testing.assert_array_equal(out, _multinomial([[0.0, math.log(3.0)], [-100.0, 100.0]], 4000))


def test_multinomial_float16_and_random_seed():
    out = _multinomial([[-np.inf, 0.0, -np.inf]], 50, seeds=(0, 0), t=F16)
    assert np.all(out == 1)


def test_multinomial_rejects_bad_seed_shape():
    with pytest.raises(OpError):
        run_op(O.RANDOM_MULTINOMIAL, [tensor(F32, [[0.0, 1.0]]), tensor(T.INT32, 3),
                                      tensor(I32, [1, 2, 3])], [output(I32, [1, 3])])
