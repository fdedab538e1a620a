"""Box detection operations: AXIS_ALIGNED_BBOX_TRANSFORM, BOX_WITH_NMS_LIMIT,
GENERATE_PROPOSALS and DETECTION_POSTPROCESSING.

All of them compute in float32 like the NNAPI reference (quantized and float16 operands are
converted on the way in and out). The greedy NMS loops are written to reproduce the reference
selection order exactly, including the order in which discarded boxes are swapped out, because
that order decides ties between equal scores and hence the order of the outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.resolver import (
    INTERPRETED_STEP,
    OpContext,
    OperandInfo,
    OperationDef,
    OpError,
    Shape,
    elements,
    register,
    visits,
)
from nnhal.ops.signature import V1_2, V1_3, Slot, Variant, sig, variants

T = OperandType
O = OperationType

ROI_SCALE = 0.125
F32 = np.float32


# ---- signatures ---------------------------------------------------------------------------------
# "T": the main tensor type; "B": boxes (QUANT16_ASYMM with scale 0.125 for quantized models);
# "S": float parameters (FLOAT16 with TENSOR_FLOAT16, else FLOAT32, as the reference checks).

_F32 = {"T": T.TENSOR_FLOAT32, "B": T.TENSOR_FLOAT32, "S": T.FLOAT32}
_F16 = {"T": T.TENSOR_FLOAT16, "B": T.TENSOR_FLOAT16, "S": T.FLOAT16}
_Q8 = {"T": T.TENSOR_QUANT8_ASYMM, "B": T.TENSOR_QUANT16_ASYMM, "S": T.FLOAT32}
_Q8S = {"T": T.TENSOR_QUANT8_ASYMM_SIGNED, "B": T.TENSOR_QUANT16_ASYMM, "S": T.FLOAT32}
#: Float, then quant8 (1.2), then quant8 signed (1.3): detection and ROI operations share it.
BOX_VARIANTS = [*variants(V1_2, _F32, _F16, _Q8), *variants(V1_3, _Q8S)]
_BATCHES = Slot("batch_index", T.TENSOR_INT32, doc="[num_rois], grouped by batch")

AXIS_ALIGNED_BBOX_TRANSFORM_SIGNATURE = sig(
    O.AXIS_ALIGNED_BBOX_TRANSFORM,
    [Slot("rois", "B", doc="[num_rois, 4] as x1, y1, x2, y2"),
     Slot("deltas", "D", doc="[num_rois, num_classes * 4] as dx, dy, dw, dh"), _BATCHES,
     Slot("image_info", "B", doc="[batches, 2] as height, width")],
    [Slot("output", "B")],
    [*variants(V1_2, {"B": T.TENSOR_FLOAT32, "D": T.TENSOR_FLOAT32},
               {"B": T.TENSOR_FLOAT16, "D": T.TENSOR_FLOAT16},
               {"B": T.TENSOR_QUANT16_ASYMM, "D": T.TENSOR_QUANT8_ASYMM}),
     *variants(V1_3, {"B": T.TENSOR_QUANT16_ASYMM, "D": T.TENSOR_QUANT8_ASYMM_SIGNED})],
    doc="refine boxes with per-class deltas, clipped to the image")

BOX_WITH_NMS_LIMIT_SIGNATURE = sig(
    O.BOX_WITH_NMS_LIMIT,
    [Slot("scores", "T", doc="[num_rois, num_classes]"),
     Slot("rois", "B", doc="[num_rois, num_classes * 4]"), _BATCHES,
     Slot("score_threshold", "S"), Slot("max_detections", T.INT32, doc="negative: unlimited"),
     Slot("nms_kernel", T.INT32, doc="0 hard, 1 linear, 2 gaussian"),
     Slot("iou_threshold", "S"), Slot("sigma", "S"), Slot("nms_score_threshold", "S")],
    [Slot("scores_out", "T"), Slot("rois_out", "B"), Slot("classes_out", T.TENSOR_INT32),
     Slot("batch_index_out", T.TENSOR_INT32)],
    BOX_VARIANTS, doc="per-class soft or hard NMS")

GENERATE_PROPOSALS_SIGNATURE = sig(
    O.GENERATE_PROPOSALS,
    [Slot("scores", "T", doc="[batches, height, width, num_anchors] (NHWC)"),
     Slot("deltas", "T", doc="num_anchors * 4 channels"),
     Slot("anchors", "A", doc="[num_anchors, 4]"), Slot("image_info", "B", doc="[batches, 2]"),
     Slot("height_stride", "S"), Slot("width_stride", "S"),
     Slot("pre_nms_top_n", T.INT32, doc="non-positive: unlimited"),
     Slot("post_nms_top_n", T.INT32, doc="non-positive: unlimited"),
     Slot("iou_threshold", "S"), Slot("min_size", "S"), Slot("nchw", T.BOOL)],
    [Slot("scores_out", "T"), Slot("rois_out", "B"), Slot("batch_index_out", T.TENSOR_INT32)],
    [Variant({**_F32, "A": T.TENSOR_FLOAT32}, V1_2), Variant({**_F16, "A": T.TENSOR_FLOAT16}, V1_2),
     Variant({**_Q8, "A": T.TENSOR_QUANT16_SYMM}, V1_2),
     Variant({**_Q8S, "A": T.TENSOR_QUANT16_SYMM}, V1_3)],
    doc="anchors and deltas to proposals, then hard NMS per image")

DETECTION_POSTPROCESSING_SIGNATURE = sig(
    O.DETECTION_POSTPROCESSING,
    [Slot("scores", "T", doc="[batches, num_anchors, num_classes]"),
     Slot("deltas", "T", doc="[batches, num_anchors, >= 4] as dy, dx, dh, dw"),
     Slot("anchors", "T", doc="[num_anchors, 4] as ctr_y, ctr_x, h, w"),
     Slot("y_scale", "S"), Slot("x_scale", "S"), Slot("h_scale", "S"), Slot("w_scale", "S"),
     Slot("regular_nms", T.BOOL), Slot("max_detections", T.INT32),
     Slot("max_classes_per_detection", T.INT32, doc="fast NMS"),
     Slot("max_detections_per_class", T.INT32, doc="regular NMS"),
     Slot("score_threshold", "S"), Slot("iou_threshold", "S"),
     Slot("background_in_label", T.BOOL)],
    [Slot("scores_out", "T"), Slot("rois_out", "T"), Slot("classes_out", T.TENSOR_INT32),
     Slot("num_detections", T.TENSOR_INT32)],
    variants(V1_2, _F32, _F16), doc="SSD box decoding and NMS")

SIGNATURES = [AXIS_ALIGNED_BBOX_TRANSFORM_SIGNATURE, BOX_WITH_NMS_LIMIT_SIGNATURE,
              GENERATE_PROPOSALS_SIGNATURE, DETECTION_POSTPROCESSING_SIGNATURE]


# ---- shared helpers -------------------------------------------------------------------------



def _rounds(candidates: int, limit: int | None, unlimited_below: int = 0) -> int:
    """How many boxes greedy NMS keeps at most: all candidates, or the limit when one is
    given (a limit below ``unlimited_below`` means none)."""
    if limit is None or limit < unlimited_below:
        return max(candidates, 1)
    return max(min(candidates, limit), 1)

def require_quant(ctx: OpContext, info: OperandInfo, what: str, scale: float = ROI_SCALE,
                  zero_point: int | None = 0) -> None:
    """Check a fixed quantization (the reference compares the scale as a float32)."""
    ctx.require(F32(info.scale) == F32(scale), f"{what} must have scale {scale}")
    if zero_point is not None:
        ctx.require(info.zero_point == zero_point, f"{what} must have zero point {zero_point}")


def scalar(v: object) -> float:
    return float(np.asarray(v))


def to_float(x: np.ndarray, info: OperandInfo) -> np.ndarray:
    """float32 values of a float or quantized tensor (as convertQuantToFloat32)."""
    if info.type in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16):
        return np.asarray(x, dtype=F32)
    return (x.astype(F32) - F32(info.zero_point)) * F32(info.scale)


def from_float(x: np.ndarray, info: OperandInfo) -> np.ndarray:
    """float32 -> the operand's type; quantized values round half away from zero and saturate."""
    if info.type in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16):
        return np.asarray(x, dtype=F32).astype(info.dtype)
    with np.errstate(all="ignore"):
        v = np.asarray(x, dtype=F32) / F32(info.scale) + F32(info.zero_point)
    lo, hi = C.qrange(info.type)
    v = np.nan_to_num(C.round_half_away(v), nan=0.0, posinf=hi, neginf=lo)
    return np.clip(v, lo, hi).astype(info.dtype)


def iou_one_to_many(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one [x1, y1, x2, y2] box with each row of ``boxes``, in float32."""
    with np.errstate(all="ignore"):
        area1 = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        area2 = (box[2] - box[0]) * (box[3] - box[1])
        x1 = np.maximum(boxes[:, 0], box[0])
        x2 = np.minimum(boxes[:, 2], box[2])
        y1 = np.maximum(boxes[:, 1], box[1])
        y2 = np.minimum(boxes[:, 3], box[3])
        w = np.maximum(x2 - x1, F32(0))
        h = np.maximum(y2 - y1, F32(0))
        inter = w * h
        return (inter / (area1 + area2 - inter)).astype(F32)


def greedy_nms(scores: np.ndarray, boxes_of: Callable[[np.ndarray], np.ndarray],
               select: list[int], max_detections: int,
               update: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> list[int]:
    """In-place greedy NMS over ``select`` (indices into ``scores``), as the reference does it.

    Each round moves the best remaining candidate to the front; ``update(iou, idx)`` returns
    which of the remaining candidates ``idx`` to keep (it may lower ``scores`` in place).
    Discarded candidates are swapped with the last live one, exactly like the reference, so
    the order of the survivors (which breaks later ties) is the same.
    """
    sel = list(select)
    start, end = 0, len(sel)
    if max_detections < 0:
        max_detections = end
    count = 0
    while start < end and count < max_detections:
        seg = np.asarray(sel[start:end], dtype=np.int64)
        best = start + _first_argmax(scores[seg])
        sel[start], sel[best] = sel[best], sel[start]
        rest = np.asarray(sel[start + 1:end], dtype=np.int64)
        if rest.size:
            iou = iou_one_to_many(boxes_of(np.asarray([sel[start]]))[0], boxes_of(rest))
            keep = dict(zip(rest.tolist(), update(iou, rest).tolist()))
            i = start + 1
            while i < end:
                if keep[sel[i]]:
                    i += 1
                else:
                    end -= 1
                    sel[i], sel[end] = sel[end], sel[i]
        start += 1
        count += 1
    return sel[:start]


def _first_argmax(values: np.ndarray) -> int:
    """std::max_element with operator<: the first maximum; NaN never compares greater."""
    best = 0
    if np.isnan(values).any():
        for i in range(1, len(values)):
            if values[best] < values[i]:
                best = i
        return best
    return int(np.argmax(values))


def hard_nms(scores: np.ndarray, boxes_of: Callable[[np.ndarray], np.ndarray],
             select: list[int], iou_threshold: float, max_detections: int) -> list[int]:
    thr = F32(iou_threshold)
    return greedy_nms(scores, boxes_of, select, max_detections, lambda iou, idx: ~(iou >= thr))


def sort_by_score(indices: Sequence[int], scores: np.ndarray) -> list[int]:
    """Indices in descending score order (stable, like the reference's small-array sorts)."""
    idx = np.asarray(indices, dtype=np.int64)
    if idx.size == 0:
        return []
    order = np.argsort(-scores[idx].astype(np.float64), kind="stable")
    return idx[order].tolist()


def bbox_transform(rois: np.ndarray, deltas: np.ndarray, image_hw: np.ndarray) -> np.ndarray:
    """Apply [dx, dy, dw, dh] deltas to [x1, y1, x2, y2] boxes and clip to the image.

    ``rois`` is [n, 4], ``deltas`` [n, k, 4], ``image_hw`` [n, 2]; returns [n, k, 4] float32.
    """
    rois = rois.astype(F32, copy=False)
    deltas = deltas.astype(F32, copy=False)
    half = F32(2)
    w = (rois[:, 2] - rois[:, 0])[:, None]
    h = (rois[:, 3] - rois[:, 1])[:, None]
    cx = ((rois[:, 0] + rois[:, 2]) / half)[:, None]
    cy = ((rois[:, 1] + rois[:, 3]) / half)[:, None]
    with np.errstate(all="ignore"):
        nw = np.exp(deltas[..., 2]) * w
        nh = np.exp(deltas[..., 3]) * h
        nx = cx + deltas[..., 0] * w
        ny = cy + deltas[..., 1] * h
        out = np.stack([nx - nw / half, ny - nh / half, nx + nw / half, ny + nh / half], axis=-1)
    img_h = image_hw[:, 0][:, None]
    img_w = image_hw[:, 1][:, None]
    zero = F32(0)
    out[..., 0] = np.minimum(np.maximum(out[..., 0], zero), img_w)
    out[..., 1] = np.minimum(np.maximum(out[..., 1], zero), img_h)
    out[..., 2] = np.minimum(np.maximum(out[..., 2], zero), img_w)
    out[..., 3] = np.minimum(np.maximum(out[..., 3], zero), img_h)
    return out.astype(F32, copy=False)


def check_boxes(boxes: np.ndarray, what: str) -> None:
    """Reject malformed boxes (x2 < x1 or y2 < y1), as the reference does at run time."""
    if boxes.size and not (np.all(boxes[:, 0] <= boxes[:, 2])
                           and np.all(boxes[:, 1] <= boxes[:, 3])):
        raise OpError(f"{what}: invalid box with x2 < x1 or y2 < y1")


# ---- AXIS_ALIGNED_BBOX_TRANSFORM ----------------------------------------------------------------

@register(O.AXIS_ALIGNED_BBOX_TRANSFORM)
class AxisAlignedBboxTransform(OperationDef):
    """Refine boxes with per-class deltas and clip them to the image."""

    def validate(self, ctx: OpContext) -> None:
        if ctx.inputs[0].type == T.TENSOR_QUANT16_ASYMM:
            require_quant(ctx, ctx.inputs[0], "input 0")
            require_quant(ctx, ctx.inputs[3], "input 3")
            require_quant(ctx, ctx.outputs[0], "output 0")
        for i, r in enumerate((2, 2, 1, 2)):
            ctx.expect_rank(i, r)
        ctx.require_same(ctx.dim(0, 1), 4, "input 0 columns")
        d1 = ctx.dim(1, 1)
        ctx.require(d1 is None or d1 % 4 == 0, "input 1 columns must be a multiple of 4")
        ctx.require_same(ctx.dim(3, 1), 2, "input 3 columns")
        ctx.require_same(ctx.dim(0, 0), ctx.dim(1, 0), "num_rois")
        ctx.require_same(ctx.dim(0, 0), ctx.dim(2, 0), "num_rois")

    def prepare(self, ctx: OpContext):
        roi, delta = ctx.inputs[0], ctx.inputs[1]
        n = 0 if roi.shape is None else roi.shape[0]
        k = 0 if delta.shape is None else delta.shape[1]
        return [(n, k)]

    def kernel(self, ctx: OpContext):
        roi_i, delta_i, _, info_i = ctx.inputs
        out = ctx.outputs[0]

        def run(ins, rt):
            roi, delta, batches, info = ins
            n = roi.shape[0]
            if (roi.ndim != 2 or roi.shape[1] != 4 or delta.ndim != 2 or delta.shape[0] != n
                    or delta.shape[1] % 4 or batches.shape != (n,) or info.ndim != 2
                    or info.shape[1] != 2):
                raise OpError("AXIS_ALIGNED_BBOX_TRANSFORM: inconsistent input shapes")
            if delta.shape[1] == 0 or info.shape[0] == 0:
                raise OpError("AXIS_ALIGNED_BBOX_TRANSFORM: zero classes or batches")
            if n == 0:
                return [np.zeros((0, delta.shape[1]), out.dtype)]
            b = batches.astype(np.int64)
            if np.any(b < 0) or np.any(b >= info.shape[0]):
                raise OpError("AXIS_ALIGNED_BBOX_TRANSFORM: batch index out of range")
            rois = to_float(roi, roi_i)
            check_boxes(rois, "AXIS_ALIGNED_BBOX_TRANSFORM")
            res = bbox_transform(rois, to_float(delta, delta_i).reshape(n, -1, 4),
                                 to_float(info, info_i)[b])
            return [from_float(res.reshape(n, -1), out)]

        return run


# ---- BOX_WITH_NMS_LIMIT -------------------------------------------------------------------------

def _soft_kernel(method: int, iou_threshold: float, sigma: float):
    thr, sig = F32(iou_threshold), F32(sigma)
    if method == 0:
        return lambda iou: np.where(iou < thr, F32(1), F32(0)).astype(F32)
    if method == 1:
        return lambda iou: np.where(iou < thr, F32(1), F32(1) - iou).astype(F32)
    if method == 2:
        def gauss(iou):
            with np.errstate(all="ignore"):
                return np.exp(F32(-1) * iou * iou / sig).astype(F32)
        return gauss
    raise OpError(f"BOX_WITH_NMS_LIMIT: unsupported NMS kernel {method}")


@register(O.BOX_WITH_NMS_LIMIT)
class BoxWithNmsLimit(OperationDef):
    """Per-class soft/hard NMS over each batch's boxes; outputs grouped by batch and class."""

    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        """Greedy NMS per class compares each box it keeps (at most max_detections) with
        the rest, in an interpreted loop."""
        shape = ctx.inputs[0].shape
        n = shape[0] if shape and shape[0] > 0 else 1
        classes = elements(shape[1:]) if shape else 1
        return visits(ctx, outputs) + INTERPRETED_STEP * classes * n * _rounds(n, ctx.const_int(4))

    def validate(self, ctx: OpContext) -> None:
        if ctx.inputs[0].type in C.QUANT8_TYPES:
            require_quant(ctx, ctx.inputs[1], "input 1")
            require_quant(ctx, ctx.outputs[1], "output 1")
            ctx.require(F32(ctx.outputs[0].scale) == F32(ctx.inputs[0].scale)
                        and ctx.outputs[0].zero_point == ctx.inputs[0].zero_point,
                        "output 0 must have the quantization of input 0")
        for i, r in enumerate((2, 2, 1)):
            ctx.expect_rank(i, r)
        for i, r in enumerate((1, 2, 1, 1)):
            ctx.expect_rank(i, r, output=True)
        nc = ctx.dim(0, 1)
        if nc is not None:
            ctx.require(nc > 1, "input 0 must have at least 2 classes")
            ctx.require_same(ctx.dim(1, 1), 4 * nc, "input 1 columns (4 * num_classes)")
        ctx.require_same(ctx.dim(0, 0), ctx.dim(1, 0), "num_rois")
        ctx.require_same(ctx.dim(0, 0), ctx.dim(2, 0), "num_rois")
        method = ctx.const_int(5)
        ctx.require(method is None or method in (0, 1, 2), f"unsupported NMS kernel {method}")

    def prepare(self, ctx: OpContext):
        return [(0,), (0, 4), (0,), (0,)]

    def kernel(self, ctx: OpContext):
        score_i, roi_i = ctx.inputs[0], ctx.inputs[1]
        outs = ctx.outputs

        def empty():
            return [np.zeros((0,), outs[0].dtype), np.zeros((0, 4), outs[1].dtype),
                    np.zeros((0,), np.int32), np.zeros((0,), np.int32)]

        def run(ins, rt):
            score, roi, batches = ins[0], ins[1], ins[2]
            n = score.shape[0]
            nc = score.shape[1] if score.ndim == 2 else 0
            if (score.ndim != 2 or roi.shape != (n, 4 * nc) or batches.shape != (n,)):
                raise OpError("BOX_WITH_NMS_LIMIT: inconsistent input shapes")
            if nc < 2:
                raise OpError("BOX_WITH_NMS_LIMIT: need at least 2 classes")
            if n == 0:
                return empty()
            score_thr = scalar(ins[3])
            max_det = int(np.asarray(ins[4]))
            kern = _soft_kernel(int(np.asarray(ins[5])), scalar(ins[6]), scalar(ins[7]))
            nms_thr = F32(scalar(ins[8]))
            scores = to_float(score, score_i).reshape(-1).copy()
            boxes = to_float(roi, roi_i).reshape(-1, 4)
            bvals = batches.astype(np.int64)
            # Consecutive runs of the same batch index form the batches.
            starts = np.flatnonzero(np.r_[True, bvals[1:] != bvals[:-1]])
            ends = np.r_[starts[1:], n]
            picked: list[int] = []
            for s, e in zip(starts.tolist(), ends.tolist()):
                # The reference validates the first (e - s) boxes of the batch's box buffer.
                check_boxes(boxes[s * nc:s * nc + (e - s)], "BOX_WITH_NMS_LIMIT")
                group: list[int] = []

                def soft(iou, idx):
                    scores[idx] = (scores[idx] * kern(iou)).astype(F32)
                    return ~(scores[idx] < nms_thr)

                for c in range(1, nc):
                    cand = s * nc + c + nc * np.arange(e - s)
                    cand = cand[scores[cand] > F32(score_thr)].tolist()
                    group += greedy_nms(scores, lambda i: boxes[i], cand, max_det, soft)
                group = sort_by_score(group, scores)
                if 0 <= max_det < len(group):
                    group = group[:max_det]
                # Then by class, and by descending score within a class.
                picked += _stable_class_score_sort(group, scores, nc)
            if not picked:
                return empty()
            idx = np.asarray(picked, dtype=np.int64)
            out_scores = scores[idx]
            roi_rows = roi.reshape(-1, 4)[idx]
            return [from_float(out_scores, outs[0]), roi_rows.astype(outs[1].dtype),
                    (idx % nc).astype(np.int32), bvals[idx // nc].astype(np.int32)]

        return run


def _stable_class_score_sort(group: list[int], scores: np.ndarray, nc: int) -> list[int]:
    if not group:
        return []
    idx = np.asarray(group, dtype=np.int64)
    order = np.lexsort((-scores[idx].astype(np.float64), idx % nc))
    return idx[order].tolist()


# ---- GENERATE_PROPOSALS -------------------------------------------------------------------------

@register(O.GENERATE_PROPOSALS)
class GenerateProposals(OperationDef):
    """Anchors + deltas -> proposals, top-k pre-filter, size filter, hard NMS per image."""

    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        """Per image, NMS over the proposals the top-k keeps, each one kept (at most
        post_nms_top_n) compared with the rest in an interpreted loop."""
        shape = ctx.inputs[0].shape
        batches = shape[0] if shape and shape[0] > 0 else 1
        per_image = elements(shape[1:]) if shape else 1
        top = ctx.const_int(6)
        if top is not None and top > 0:
            per_image = min(per_image, top)
        rounds = _rounds(per_image, ctx.const_int(7), unlimited_below=1)
        return visits(ctx, outputs) + INTERPRETED_STEP * batches * per_image * rounds

    def validate(self, ctx: OpContext) -> None:
        if ctx.inputs[0].type in C.QUANT8_TYPES:
            require_quant(ctx, ctx.inputs[2], "input 2", zero_point=None)
            require_quant(ctx, ctx.inputs[3], "input 3")
            require_quant(ctx, ctx.outputs[1], "output 1")
            ctx.require(F32(ctx.outputs[0].scale) == F32(ctx.inputs[0].scale)
                        and ctx.outputs[0].zero_point == ctx.inputs[0].zero_point,
                        "output 0 must have the quantization of input 0")
        for i, r in enumerate((4, 4, 2, 2)):
            ctx.expect_rank(i, r)
        for i, r in enumerate((1, 2, 1)):
            ctx.expect_rank(i, r, output=True)
        layout = ctx.const(10)
        if layout is not None:
            ha, wa, aa = (2, 3, 1) if bool(layout) else (1, 2, 3)
            for ax in (0, ha, wa):
                ctx.require_same(ctx.dim(0, ax), ctx.dim(1, ax), "input 0/1 shape")
            na = ctx.dim(0, aa)
            if na is not None:
                ctx.require_same(ctx.dim(1, aa), 4 * na, "input 1 anchor channels")
                ctx.require_same(ctx.dim(2, 0), na, "num_anchors")
            ctx.require_same(ctx.dim(3, 0), ctx.dim(0, 0), "batches")
            ctx.require_same(ctx.dim(2, 1), 4, "input 2 columns")
            ctx.require_same(ctx.dim(3, 1), 2, "input 3 columns")

    def prepare(self, ctx: OpContext):
        return [(0,), (0, 4), (0,)]

    def kernel(self, ctx: OpContext):
        score_i, delta_i, anchor_i, info_i = ctx.inputs[:4]
        outs = ctx.outputs

        def run(ins, rt):
            score, delta, anchors, info = ins[:4]
            h_stride, w_stride = F32(scalar(ins[4])), F32(scalar(ins[5]))
            pre_n, post_n = int(np.asarray(ins[6])), int(np.asarray(ins[7]))
            iou_thr, min_size = scalar(ins[8]), F32(scalar(ins[9]))
            if bool(np.asarray(ins[10])):
                score = np.transpose(score, (0, 2, 3, 1)) if score.ndim == 4 else score
                delta = np.transpose(delta, (0, 2, 3, 1)) if delta.ndim == 4 else delta
            if score.ndim != 4 or delta.ndim != 4:
                raise OpError("GENERATE_PROPOSALS: inputs 0 and 1 must be 4-D")
            nb, hh, ww, na = score.shape
            if (delta.shape != (nb, hh, ww, 4 * na) or anchors.shape != (na, 4)
                    or info.shape != (nb, 2)):
                raise OpError("GENERATE_PROPOSALS: inconsistent input shapes")
            sc = to_float(score, score_i).reshape(nb, -1)
            dl = to_float(delta, delta_i).reshape(nb, -1, 1, 4)
            anc = to_float(anchors, anchor_i)
            img = to_float(info, info_i)
            hs = np.arange(hh, dtype=F32) * h_stride
            ws = np.arange(ww, dtype=F32) * w_stride
            shift = np.zeros((hh, ww, 1, 4), F32)
            shift[..., 0] = shift[..., 2] = ws[None, :, None]
            shift[..., 1] = shift[..., 3] = hs[:, None, None]
            base = (anc[None, None] + shift).reshape(-1, 4)
            check_boxes(base, "GENERATE_PROPOSALS")
            out_s, out_r, out_b = [], [], []
            for b in range(nb):
                boxes = bbox_transform(base, dl[b], np.broadcast_to(img[b], (base.shape[0], 2)))
                boxes = boxes.reshape(-1, 4)
                s = sc[b]
                select = list(range(s.size))
                if 0 < pre_n < len(select):
                    select = sort_by_score(select, s)[:pre_n]
                sel = np.asarray(select, dtype=np.int64)
                if sel.size:
                    bx = boxes[sel]
                    bw = bx[:, 2] - bx[:, 0]
                    bh = bx[:, 3] - bx[:, 1]
                    xc = bx[:, 0] + bw / F32(2)
                    yc = bx[:, 1] + bh / F32(2)
                    ok = (bw > min_size) & (bh > min_size) & (xc < img[b, 1]) & (yc < img[b, 0])
                    sel = sel[ok]
                # Non-positive post_n means unlimited (the spec; the reference keeps 0 for 0).
                limit = post_n if post_n > 0 else -1
                kept = hard_nms(s, lambda i, bx=boxes: bx[i], sel.tolist(), iou_thr, limit)
                out_s.append(s[kept])
                out_r.append(boxes[kept])
                out_b.append(np.full(len(kept), b, np.int32))
            scores = np.concatenate(out_s) if out_s else np.zeros(0, F32)
            rois = np.concatenate(out_r) if out_r else np.zeros((0, 4), F32)
            bidx = np.concatenate(out_b) if out_b else np.zeros(0, np.int32)
            return [from_float(scores, outs[0]), from_float(rois.reshape(-1, 4), outs[1]),
                    bidx.astype(np.int32)]

        return run


# ---- DETECTION_POSTPROCESSING -------------------------------------------------------------------

@register(O.DETECTION_POSTPROCESSING)
class DetectionPostprocessing(OperationDef):
    """SSD-style decoding of anchor deltas followed by regular or fast (single) NMS."""

    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        """NMS over the anchors in an interpreted loop, each kept one compared with the
        rest: per class up to max_detections_per_class (regular), or once up to
        max_detections (fast)."""
        shape = ctx.inputs[0].shape
        if not shape or len(shape) != 3:
            return visits(ctx, outputs)
        batches, anchors, classes = (max(d, 1) for d in shape)
        regular = ctx.const(7)
        regular = regular is None or bool(regular)
        rounds = _rounds(anchors, ctx.const_int(10 if regular else 8))
        passes = classes if regular else 1
        return visits(ctx, outputs) + INTERPRETED_STEP * batches * passes * anchors * rounds

    def validate(self, ctx: OpContext) -> None:
        for i, r in enumerate((3, 3, 2)):
            ctx.expect_rank(i, r)
        for i, r in enumerate((2, 3, 2, 1)):
            ctx.expect_rank(i, r, output=True)
        nc = ctx.dim(0, 2)
        ctx.require(nc is None or nc > 1, "input 0 must have at least 2 classes")
        box = ctx.dim(1, 2)
        ctx.require(box is None or box >= 4, "box encoding length must be at least 4")
        ctx.require_same(ctx.dim(0, 0), ctx.dim(1, 0), "batches")
        ctx.require_same(ctx.dim(0, 1), ctx.dim(1, 1), "num_anchors")
        ctx.require_same(ctx.dim(0, 1), ctx.dim(2, 0), "num_anchors")
        ctx.require_same(ctx.dim(2, 1), 4, "input 2 columns")
        for i in (3, 4, 5, 6):
            v = ctx.const_float(i)
            ctx.require(v is None or v > 0, f"input {i} must be positive")
        for i in (11, 12):
            v = ctx.const_float(i)
            ctx.require(v is None or v >= 0, f"input {i} must be non-negative")
        max_det = ctx.const_int(8)
        ctx.require(max_det is None or max_det > 0, "max_num_detections must be positive")
        regular = ctx.const(7)
        if regular is not None:
            k = 10 if bool(regular) else 9
            v = ctx.const_int(k)
            ctx.require(v is None or v > 0, f"input {k} must be positive")

    def prepare(self, ctx: OpContext):
        score = ctx.inputs[0]
        nb = 0 if score.shape is None else score.shape[0]
        n = self._num_out(ctx.const(7), ctx.const(8), ctx.const(9))
        return [(nb, n), (nb, n, 4), (nb, n), (nb,)]

    @staticmethod
    def _num_out(regular, max_det, max_cls) -> int:
        if regular is None or max_det is None:
            return 0
        if bool(regular):
            return int(max_det)
        return 0 if max_cls is None else int(max_det) * int(max_cls)

    def kernel(self, ctx: OpContext):
        outs = ctx.outputs

        def run(ins, rt):
            score, delta, anchors = (np.asarray(x, dtype=F32) for x in ins[:3])
            sy, sx, sh, sw = (F32(scalar(v)) for v in ins[3:7])
            regular = bool(np.asarray(ins[7]))
            max_det, max_cls, max_per_cls = (int(np.asarray(v)) for v in ins[8:11])
            score_thr, iou_thr = F32(scalar(ins[11])), scalar(ins[12])
            bg_in_label = bool(np.asarray(ins[13]))
            if score.ndim != 3 or delta.ndim != 3 or anchors.ndim != 2:
                raise OpError("DETECTION_POSTPROCESSING: bad input ranks")
            nb, na, nc = score.shape
            if (delta.shape[:2] != (nb, na) or delta.shape[2] < 4 or anchors.shape != (na, 4)
                    or nc < 2):
                raise OpError("DETECTION_POSTPROCESSING: inconsistent input shapes")
            if min(sy, sx, sh, sw) <= 0 or score_thr < 0 or iou_thr < 0 or max_det <= 0:
                raise OpError("DETECTION_POSTPROCESSING: invalid parameter")
            if (regular and max_per_cls <= 0) or (not regular and max_cls <= 0):
                raise OpError("DETECTION_POSTPROCESSING: invalid parameter")
            n_out = max_det if regular else max_det * max_cls
            out_score = np.zeros((nb, n_out), F32)
            out_roi = np.zeros((nb, n_out, 4), F32)
            out_cls = np.zeros((nb, n_out), np.int32)
            out_num = np.zeros((nb,), np.int32)
            label_shift = 0 if bg_in_label else 1
            a = anchors
            with np.errstate(all="ignore"):
                yc = a[:, 0] + a[:, 2] * delta[..., 0] / sy
                xc = a[:, 1] + a[:, 3] * delta[..., 1] / sx
                hh = a[:, 2] * np.exp(delta[..., 2] / sh) * F32(0.5)
                wh = a[:, 3] * np.exp(delta[..., 3] / sw) * F32(0.5)
            decoded = np.stack([yc - hh, xc - wh, yc + hh, xc + wh], axis=-1).astype(F32)
            for b in range(nb):
                boxes = decoded[b]
                sb = score[b].reshape(-1)
                if regular:
                    sel: list[int] = []
                    for c in range(1, nc):
                        cand = c + nc * np.arange(na)
                        cand = cand[sb[cand] > score_thr].tolist()
                        sel += hard_nms(sb, lambda i, bx=boxes: bx[i // nc], cand, iou_thr,
                                        max_per_cls)
                    sel = sort_by_score(sel, sb)[:max_det]
                    k = len(sel)
                    if k:
                        idx = np.asarray(sel, dtype=np.int64)
                        out_score[b, :k] = sb[idx]
                        out_roi[b, :k] = boxes[idx // nc]
                        out_cls[b, :k] = idx % nc - label_shift
                    out_num[b] = k
                else:
                    n_cls = min(nc - 1, max_cls)
                    per = score[b][:, 1:]
                    best = per.max(axis=1)
                    cand = np.flatnonzero(best > score_thr).tolist()
                    sel = hard_nms(best, lambda i, bx=boxes: bx[i], cand, iou_thr, max_det)
                    for j, anchor in enumerate(sel):
                        order = np.argsort(-per[anchor].astype(np.float64), kind="stable")
                        top = order[:n_cls]
                        lo = j * n_cls
                        out_score[b, lo:lo + n_cls] = per[anchor, top]
                        out_roi[b, lo:lo + n_cls] = boxes[anchor]
                        out_cls[b, lo:lo + n_cls] = top + 1 - label_shift
                    out_num[b] = len(sel) * n_cls
            return [out_score.astype(outs[0].dtype), out_roi.astype(outs[1].dtype), out_cls,
                    out_num]

        return run
