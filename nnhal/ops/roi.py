"""Region-of-interest operations: ROI_ALIGN, ROI_POOLING and HEATMAP_MAX_KEYPOINT.

Each region is processed with numpy over its output grid and channels (the per-ROI loop is
over boxes only). Coordinates are computed in float32 in the reference's order of operations,
because floor/ceil/round of those coordinates decide which feature-map cells are read.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.detection import (
    BOX_VARIANTS,
    F32,
    check_boxes,
    from_float,
    require_quant,
    scalar,
    to_float,
)
from nnhal.ops.resolver import (
    INTERPRETED_ITERATION,
    OpContext,
    OperandInfo,
    OperationDef,
    OpError,
    Shape,
    elements,
    register,
    visits,
)
from nnhal.ops.signature import Slot, sig

T = OperandType
O = OperationType

# Type variables as in detection.py: "T" feature map, "B" boxes, "S" float parameters.
_ROI_HEAD = [Slot("input", "T", doc="feature map, NHWC or NCHW"),
             Slot("rois", "B", doc="[num_rois, 4] as x1, y1, x2, y2"),
             Slot("batch_index", T.TENSOR_INT32, doc="[num_rois]"),
             Slot("output_height", T.INT32), Slot("output_width", T.INT32),
             Slot("height_ratio", "S", doc="image to feature map"), Slot("width_ratio", "S")]
_NCHW = Slot("nchw", T.BOOL)

ROI_ALIGN_SIGNATURE = sig(
    O.ROI_ALIGN,
    [*_ROI_HEAD, Slot("height_samples", T.INT32, doc="0: adaptive"),
     Slot("width_samples", T.INT32, doc="0: adaptive"), _NCHW],
    [Slot("output", "T")], BOX_VARIANTS, doc="bilinear average pooling of each region")

ROI_POOLING_SIGNATURE = sig(
    O.ROI_POOLING, [*_ROI_HEAD, _NCHW], [Slot("output", "T")], BOX_VARIANTS,
    doc="max pooling of each region")

HEATMAP_MAX_KEYPOINT_SIGNATURE = sig(
    O.HEATMAP_MAX_KEYPOINT,
    [Slot("heatmaps", "T", doc="[num_boxes, size, size, num_keypoints] (NHWC)"),
     Slot("boxes", "B", doc="[num_boxes, 4]"), _NCHW],
    [Slot("scores", "T"), Slot("keypoints", "B", doc="[num_boxes, num_keypoints, 2]")],
    BOX_VARIANTS, doc="sub-pixel heatmap maxima")

SIGNATURES = [ROI_ALIGN_SIGNATURE, ROI_POOLING_SIGNATURE, HEATMAP_MAX_KEYPOINT_SIGNATURE]


def _validate_roi_op(ctx: OpContext, has_sampling: bool) -> None:
    """Shared checks of ROI_ALIGN and ROI_POOLING."""
    if ctx.inputs[0].type in C.QUANT8_TYPES:
        require_quant(ctx, ctx.inputs[1], "input 1")
    for i, r in enumerate((4, 2, 1)):
        ctx.expect_rank(i, r)
    ctx.expect_rank(0, 4, output=True)
    ctx.require_same(ctx.dim(1, 1), 4, "input 1 columns")
    ctx.require_same(ctx.dim(1, 0), ctx.dim(2, 0), "num_rois")
    for i in (3, 4, 5, 6):
        v = ctx.const_float(i)
        ctx.require(v is None or v > 0, f"input {i} must be positive")
    if has_sampling:
        for i in (7, 8):
            v = ctx.const_float(i)
            ctx.require(v is None or v >= 0, f"input {i} must be non-negative")


def _roi_output_shape(ctx: OpContext, layout_index: int):
    inp, roi = ctx.inputs[0], ctx.inputs[1]
    n = 0 if roi.shape is None else roi.shape[0]
    layout = ctx.const(layout_index)
    oh, ow = ctx.const(3), ctx.const(4)
    oh = 0 if oh is None else int(oh)
    ow = 0 if ow is None else int(ow)
    if layout is None or inp.shape is None:
        return [(n, 0, 0, 0)]
    depth = inp.shape[1] if bool(layout) else inp.shape[3]
    return [(n, depth, oh, ow) if bool(layout) else (n, oh, ow, depth)]


def _roi_common(ins, name: str, roi_info: OperandInfo, n_layout: int):
    """Unpack and check the inputs shared by ROI_ALIGN and ROI_POOLING."""
    nchw = bool(np.asarray(ins[n_layout]))
    feat = ins[0]
    if feat.ndim != 4:
        raise OpError(f"{name}: input 0 must be 4-D")
    if nchw:
        feat = np.transpose(feat, (0, 2, 3, 1))
    rois, batches = ins[1], ins[2]
    if rois.ndim != 2 or rois.shape[1] != 4 or batches.shape != (rois.shape[0],):
        raise OpError(f"{name}: inconsistent ROI shapes")
    out_h, out_w = int(np.asarray(ins[3])), int(np.asarray(ins[4]))
    h_stride, w_stride = F32(scalar(ins[5])), F32(scalar(ins[6]))
    if out_h <= 0 or out_w <= 0 or not (h_stride > 0 and w_stride > 0):
        raise OpError(f"{name}: invalid output size or stride")
    if min(feat.shape) <= 0:
        raise OpError(f"{name}: zero-sized feature map")
    b = batches.astype(np.int64)
    if np.any(b < 0) or np.any(b >= feat.shape[0]):
        raise OpError(f"{name}: batch index out of range")
    return nchw, feat, to_float(rois, roi_info), b, out_h, out_w, h_stride, w_stride


def _check_roi_bounds(name: str, r: np.ndarray, w_scale, h_scale, in_h: int, in_w: int) -> None:
    if not (np.all(r >= 0) and r[0] * w_scale <= in_w and r[1] * h_scale <= in_h
            and r[2] * w_scale <= in_w and r[3] * h_scale <= in_h
            and r[0] <= r[2] and r[1] <= r[3]):
        raise OpError(f"{name}: region of interest out of bounds or malformed")


def _finish(out: np.ndarray, nchw: bool) -> np.ndarray:
    return np.transpose(out, (0, 3, 1, 2)) if nchw else out


# ---- ROI_ALIGN ----------------------------------------------------------------------------------

def _regions(ctx: OpContext) -> int:
    """How many regions (rows of the rois input) a ROI operation loops over."""
    shape = ctx.inputs[1].shape
    return shape[0] if shape and shape[0] > 0 else 1


def _bin_spans(ctx: OpContext, layout: int) -> tuple[int, int]:
    """The most feature-map rows and columns one output bin of a region can span."""
    shape = ctx.inputs[0].shape
    nchw = ctx.const(layout)
    out_h, out_w = max(ctx.const_int(3) or 1, 1), max(ctx.const_int(4) or 1, 1)
    if shape is None or len(shape) != 4:
        return 1, 1
    h, w = (shape[2], shape[3]) if nchw is not None and bool(nchw) else (shape[1], shape[2])
    return -(-max(h, 1) // out_h), -(-max(w, 1) // out_w)


@register(O.ROI_ALIGN)
class RoiAlign(OperationDef):
    """Average of bilinear samples on a regular grid inside each output bin."""

    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        """Four taps per sample, samples per bin given, or adaptive (a region spans at most
        the feature map: its size over the bin count, rounded up)."""
        rows, cols = _bin_spans(ctx, 9)
        rows = ctx.const_int(7) or rows
        cols = ctx.const_int(8) or cols
        return visits(ctx, outputs) + 4 * elements(outputs[0]) * max(rows, 1) * max(cols, 1) \
            + INTERPRETED_ITERATION * _regions(ctx)

    def validate(self, ctx: OpContext) -> None:
        _validate_roi_op(ctx, has_sampling=True)

    def prepare(self, ctx: OpContext):
        return _roi_output_shape(ctx, 9)

    def kernel(self, ctx: OpContext):
        inp, roi_i, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        quant = inp.type in C.QUANT8_TYPES
        qmin, qmax = C.qrange(out.type) if quant else (0, 0)

        def run(ins, rt):
            nchw, feat, rois, batches, out_h, out_w, hs, ws = _roi_common(
                ins, "ROI_ALIGN", roi_i, 9)
            h_ratio, w_ratio = int(np.asarray(ins[7])), int(np.asarray(ins[8]))
            if h_ratio < 0 or w_ratio < 0:
                raise OpError("ROI_ALIGN: negative sampling ratio")
            nb, in_h, in_w, depth = feat.shape
            res = np.zeros((rois.shape[0], out_h, out_w, depth),
                           np.int64 if quant else F32)
            h_scale, w_scale = F32(1) / hs, F32(1) / ws
            data = (feat.astype(np.int64) - inp.zero_point) if quant else feat.astype(F32)
            for r in range(rois.shape[0]):
                box = rois[r]
                _check_roi_bounds("ROI_ALIGN", box, w_scale, h_scale, in_h, in_w)
                x0, y0 = box[0] * w_scale, box[1] * h_scale
                x1, y1 = box[2] * w_scale, box[3] * h_scale
                roi_w = max(x1 - x0, F32(1))
                roi_h = max(y1 - y0, F32(1))
                w_step, h_step = F32(roi_w / F32(out_w)), F32(roi_h / F32(out_h))
                sw = w_ratio if w_ratio > 0 else int(np.ceil(w_step))
                sh = h_ratio if h_ratio > 0 else int(np.ceil(h_step))
                n_samples = sw * sh
                w_bin, h_bin = F32(w_step / F32(sw)), F32(h_step / F32(sh))
                xs = _sample_axis(w_step, x0, w_bin, out_w, sw, in_w)
                ys = _sample_axis(h_step, y0, h_bin, out_h, sh, in_h)
                plane = data[batches[r]]
                acc = np.zeros((out_h, out_w, depth), res.dtype)
                for yi in range(sh):
                    ya, yb, dy1 = ys[0][:, yi], ys[1][:, yi], ys[2][:, yi]
                    dy2 = F32(1) - dy1
                    for xi in range(sw):
                        xa, xb, dx1 = xs[0][:, xi], xs[1][:, xi], xs[2][:, xi]
                        dx2 = F32(1) - dx1
                        wts = (np.multiply.outer(dy2, dx2), np.multiply.outer(dy2, dx1),
                               np.multiply.outer(dy1, dx2), np.multiply.outer(dy1, dx1))
                        vals = (plane[np.ix_(ya, xa)], plane[np.ix_(ya, xb)],
                                plane[np.ix_(yb, xa)], plane[np.ix_(yb, xb)])
                        if quant:
                            interp = np.zeros((out_h, out_w, depth), np.int64)
                            for wt, v in zip(wts, vals):
                                wq = C.round_half_away(wt / F32(1.0 / 255.0)).astype(np.int64)
                                interp += wq[..., None] * v
                        else:
                            interp = np.zeros((out_h, out_w, depth), F32)
                            for wt, v in zip(wts, vals):
                                interp += wt[..., None] * v
                        acc += interp
                if quant:
                    real = (F32(inp.scale) * F32(1.0 / 255.0) / F32(out.scale)
                            / F32(n_samples))
                    if not 0 <= real < 1:
                        raise OpError("ROI_ALIGN: output multiplier out of range")
                    m, s = C.quantize_multiplier(float(real))
                    q = C.multiply_by_quantized_multiplier(acc, m, s) + out.zero_point
                    res[r] = np.clip(q, qmin, qmax)
                else:
                    res[r] = acc / F32(n_samples)
            return [_finish(res.astype(out.dtype), nchw)]

        return run


def _sample_axis(step, start, bin_size, n_out: int, n_samp: int, size: int):
    """Sample positions along one axis: (low index, high index, fraction), each [n_out, n_samp]."""
    cell = np.arange(n_out, dtype=F32)[:, None] * step + start
    pos = (cell + bin_size / F32(2)) + bin_size * np.arange(n_samp, dtype=F32)[None, :]
    lo = np.floor(pos).astype(np.int64)
    frac = (pos - lo.astype(F32)).astype(F32)
    edge = lo >= size - 1
    lo = np.where(edge, size - 1, lo)
    hi = np.where(edge, size - 1, lo + 1)
    frac = np.where(edge, F32(0), frac).astype(F32)
    return lo, hi, frac


# ---- ROI_POOLING --------------------------------------------------------------------------------

@register(O.ROI_POOLING)
class RoiPooling(OperationDef):
    """Max over integer-aligned bins of each region."""

    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        """Per region (an interpreted iteration), the reference masks the whole feature map
        once per output row, then the rows it kept once per output column."""
        shape = ctx.inputs[0].shape
        nchw = ctx.const(7)
        per_region = 1
        if shape is not None and len(shape) == 4:
            h, w, depth = ((shape[2], shape[3], shape[1]) if nchw is not None and bool(nchw)
                           else shape[1:])
            out_h, out_w = max(ctx.const_int(3) or 1, 1), max(ctx.const_int(4) or 1, 1)
            per_region = max(depth, 1) * max(w, 1) * out_h * (max(h, 1) + out_w)
        regions = _regions(ctx)
        return visits(ctx, outputs) + regions * (per_region + INTERPRETED_ITERATION)

    def validate(self, ctx: OpContext) -> None:
        _validate_roi_op(ctx, has_sampling=False)
        inp, out = ctx.inputs[0], ctx.outputs[0]
        if inp.type in C.QUANT8_TYPES:
            ctx.require(F32(out.scale) == F32(inp.scale) and out.zero_point == inp.zero_point,
                        "output must have the quantization of input 0")

    def prepare(self, ctx: OpContext):
        return _roi_output_shape(ctx, 7)

    def kernel(self, ctx: OpContext):
        inp, roi_i, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        empty_value = float(inp.zero_point) if inp.type in C.QUANT8_TYPES else 0.0

        def run(ins, rt):
            nchw, feat, rois, batches, out_h, out_w, hs, ws = _roi_common(
                ins, "ROI_POOLING", roi_i, 7)
            nb, in_h, in_w, depth = feat.shape
            res = np.zeros((rois.shape[0], out_h, out_w, depth), np.float64)
            h_scale, w_scale = F32(1) / hs, F32(1) / ws
            hpos, wpos = np.arange(in_h), np.arange(in_w)
            for r in range(rois.shape[0]):
                box = rois[r]
                _check_roi_bounds("ROI_POOLING", box, w_scale, h_scale, in_h, in_w)
                x0 = int(C.round_half_away(box[0] * w_scale))
                y0 = int(C.round_half_away(box[1] * h_scale))
                x1 = int(C.round_half_away(box[2] * w_scale))
                y1 = int(C.round_half_away(box[3] * h_scale))
                w_step = F32(max(x1 - x0 + 1, 1)) / F32(out_w)
                h_step = F32(max(y1 - y0 + 1, 1)) / F32(out_h)
                ws0, we0 = _bin_edges(w_step, x0, out_w, in_w)
                hs0, he0 = _bin_edges(h_step, y0, out_h, in_h)
                hmask = (hpos[None, :] >= hs0[:, None]) & (hpos[None, :] < he0[:, None])
                wmask = (wpos[None, :] >= ws0[:, None]) & (wpos[None, :] < we0[:, None])
                plane = feat[batches[r]].astype(np.float64)
                rows = np.where(hmask[:, :, None, None], plane[None], -np.inf).max(axis=1)
                cells = np.where(wmask[None, :, :, None], rows[:, None], -np.inf).max(axis=2)
                empty = (he0 <= hs0)[:, None] | (we0 <= ws0)[None, :]
                cells[empty] = empty_value
                res[r] = cells
            return [_finish(res.astype(out.dtype), nchw)]

        return run


def _bin_edges(step, start: int, n_out: int, size: int):
    j = np.arange(n_out, dtype=F32)
    lo = np.floor(step * j + F32(start)).astype(np.int64)
    hi = np.ceil(step * (j + F32(1)) + F32(start)).astype(np.int64)
    return np.minimum(lo, size), np.minimum(hi, size)


# ---- HEATMAP_MAX_KEYPOINT -----------------------------------------------------------------------

@register(O.HEATMAP_MAX_KEYPOINT)
class HeatmapMaxKeypoint(OperationDef):
    """Sub-pixel heatmap maxima via a quadratic (Taylor) fit around the best cell."""

    def validate(self, ctx: OpContext) -> None:
        if ctx.inputs[0].type in C.QUANT8_TYPES:
            require_quant(ctx, ctx.inputs[1], "input 1")
            require_quant(ctx, ctx.outputs[1], "output 1")
        ctx.expect_rank(0, 4)
        ctx.expect_rank(1, 2)
        ctx.expect_rank(0, 2, output=True)
        ctx.expect_rank(1, 3, output=True)
        ctx.require_same(ctx.dim(0, 0), ctx.dim(1, 0), "num_boxes")
        ctx.require_same(ctx.dim(1, 1), 4, "input 1 columns")
        size = ctx.dim(0, 2)
        ctx.require(size is None or size >= 2, "heatmap size must be at least 2")
        layout = ctx.const(2)
        if layout is not None:
            ctx.require_same(ctx.dim(0, 3 if bool(layout) else 1), size,
                             "heatmap height and width (must be square)")

    def prepare(self, ctx: OpContext):
        heat = ctx.inputs[0]
        layout = ctx.const(2)
        if heat.shape is None:
            return [(0, 0), (0, 0, 2)]
        k = 0 if layout is None else heat.shape[1 if bool(layout) else 3]
        return [(heat.shape[0], k), (heat.shape[0], k, 2)]

    def kernel(self, ctx: OpContext):
        heat_i, box_i = ctx.inputs[0], ctx.inputs[1]
        outs = ctx.outputs
        tol = F32(1e-3) if heat_i.type == T.TENSOR_FLOAT16 else F32(1e-5)

        def run(ins, rt):
            heat, boxes = ins[0], ins[1]
            if heat.ndim != 4:
                raise OpError("HEATMAP_MAX_KEYPOINT: input 0 must be 4-D")
            if bool(np.asarray(ins[2])):
                heat = np.transpose(heat, (0, 2, 3, 1))
            n, size, size_w, k = heat.shape
            if size != size_w or size < 2 or boxes.shape != (n, 4):
                raise OpError("HEATMAP_MAX_KEYPOINT: inconsistent input shapes")
            hm = to_float(heat, heat_i)
            bx = to_float(boxes, box_i)
            check_boxes(bx, "HEATMAP_MAX_KEYPOINT")
            flat = hm.reshape(n, size * size, k)
            arg = _first_max_index(flat)                       # [n, k]
            best = np.take_along_axis(flat, arg[:, None, :], axis=1)[:, 0, :]
            row, col = arg // size, arg % size
            grid = np.empty((3, 3, n, k), F32)
            bi = np.arange(n)[:, None]
            ki = np.arange(k)[None, :]
            for dh in (-1, 0, 1):
                h = _mirror(row + dh, size)
                for dw in (-1, 0, 1):
                    w = _mirror(col + dw, size)
                    grid[dh + 1, dw + 1] = hm[bi, h, w, ki]
            delta_x, delta_y, score = _solve_delta(grid, best, tol)
            roi_w = bx[:, 2] - bx[:, 0]
            roi_h = bx[:, 3] - bx[:, 1]
            fsize = F32(size)
            wrel = (col.astype(F32) + delta_x + F32(0.5)) / fsize
            hrel = (row.astype(F32) + delta_y + F32(0.5)) / fsize
            kx = wrel * roi_w[:, None] + bx[:, 0][:, None]
            ky = hrel * roi_h[:, None] + bx[:, 1][:, None]
            keypoints = np.stack([kx, ky], axis=-1).astype(F32)
            return [from_float(score, outs[0]), from_float(keypoints, outs[1])]

        return run


def _first_max_index(flat: np.ndarray) -> np.ndarray:
    """Index of the first strict maximum along axis 1 (0 when nothing beats -FLT_MAX)."""
    vals = np.where(np.isnan(flat), -np.inf, flat)
    arg = np.argmax(vals, axis=1)
    best = np.take_along_axis(vals, arg[:, None, :], axis=1)[:, 0, :]
    return np.where(best > -np.finfo(F32).max, arg, 0)


def _mirror(i: np.ndarray, size: int) -> np.ndarray:
    return np.where(i < 0, 1, np.where(i >= size, size - 2, i))


def _solve_delta(g: np.ndarray, best: np.ndarray, tol):
    """Newton step of the 2nd-order Taylor expansion at the grid centre, clipped to 1.5."""
    two, four = F32(2), F32(4)
    with np.errstate(all="ignore"):
        b0 = -(g[1, 2] - g[1, 0]) / two
        b1 = -(g[2, 1] - g[0, 1]) / two
        a00 = g[1, 0] - two * g[1, 1] + g[1, 2]
        a01 = (g[2, 2] - g[2, 0] - g[0, 2] + g[0, 0]) / four
        a11 = g[0, 1] - two * g[1, 1] + g[2, 1]
        cross1 = a00 * a11
        det = cross1 - a01 * a01
        solvable = ~(np.abs(det) < (tol + tol * cross1))
        d0 = (a11 * b0 - a01 * b1) / det
        d1 = (a00 * b1 - a01 * b0) / det
        big = np.maximum(np.abs(d0), np.abs(d1))
        clip = (np.abs(d0) > F32(1.5)) | (np.abs(d1) > F32(1.5))
        scale = np.where(clip, F32(1.5) / big, F32(1)).astype(F32)
        d0 = np.where(clip, d0 * scale, d0)
        d1 = np.where(clip, d1 * scale, d1)
        score = (g[1, 1] - b0 * d0 - b1 * d1
                 + ((a00 * d0 + a01 * d1) * d0 + (a01 * d0 + a11 * d1) * d1) / two)
    d0 = np.where(solvable, d0, F32(0)).astype(F32)
    d1 = np.where(solvable, d1, F32(0)).astype(F32)
    score = np.where(solvable, score, best).astype(F32)
    return d0, d1, score
