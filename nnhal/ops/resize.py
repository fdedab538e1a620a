"""RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR (by output size or by scale factors).

Sampling positions are computed in float32 exactly as the upstream kernels compute them
(TFLite's bilinear interpolation, including ``align_corners`` and ``half_pixel_centers``), so
the pixels chosen and the interpolation weights agree bit for bit. Quantized bilinear
results are interpolated in float on the stored integers and rounded half up, which keeps
uint8 and int8 results exactly 128 apart (as the quantization coupling tests require).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.resolver import OpContext, OperationDef, OpError, Shape, elements, register, visits
from nnhal.ops.signature import V1_0, V1_2, V1_3, Slot, sig, variants

T = OperandType
O = OperationType
f32 = np.float32


def _forms(nchw: Slot) -> dict[str, list[Slot]]:
    """Resizing by output size or by scale factors (the scale form exists since HAL 1.2).

    An absent or omitted align_corners / half_pixel_centers is false.
    """
    tail = [nchw,
            Slot("align_corners", T.BOOL, optional=True, omittable=True, since=V1_3),
            Slot("half_pixel_centers", T.BOOL, optional=True, omittable=True, since=V1_3,
                 doc="not together with align_corners")]
    head = Slot("input", "T", doc="4-D, [batches, height, width, depth]")
    return {
        "by_size": [head, Slot("output_width", T.INT32), Slot("output_height", T.INT32), *tail],
        "by_scale": [head, Slot("width_scale", "S", since=V1_2, doc="output = floor(in * s)"),
                     Slot("height_scale", "S", since=V1_2, doc="output = floor(in * s)"),
                     *tail],
    }


# T: the tensors, S: the scale factors (FLOAT16 only with TENSOR_FLOAT16).
_FLOAT32 = {"T": T.TENSOR_FLOAT32, "S": T.FLOAT32}
_FLOAT16 = {"T": T.TENSOR_FLOAT16, "S": T.FLOAT16}
_QUANT8 = {"T": T.TENSOR_QUANT8_ASYMM, "S": T.FLOAT32}
_SIGNED = {"T": T.TENSOR_QUANT8_ASYMM_SIGNED, "S": T.FLOAT32}
_OUTPUTS = [Slot("output", "T", doc="[batches, new_height, new_width, depth]")]

SIGNATURES = [
    sig(O.RESIZE_BILINEAR, _forms(Slot("nchw", T.BOOL, optional=True, omittable=True,
                                       since=V1_2, doc="NCHW data layout; default false")),
        _OUTPUTS, [*variants(V1_0, _FLOAT32), *variants(V1_2, _FLOAT16, _QUANT8),
                   *variants(V1_3, _SIGNED)]),
    sig(O.RESIZE_NEAREST_NEIGHBOR, _forms(Slot("nchw", T.BOOL, doc="NCHW data layout")),
        _OUTPUTS, [*variants(V1_2, _FLOAT32, _FLOAT16, _QUANT8), *variants(V1_3, _SIGNED)]),
]


def _output_hw(in_h: int, in_w: int, size_type: OperandType, w_param, h_param) -> tuple[int, int]:
    """Output (height, width) from explicit sizes or from float scale factors."""
    if size_type == T.INT32:
        return int(np.asarray(h_param)), int(np.asarray(w_param))
    hs = f32(np.asarray(h_param, dtype=np.float32))
    ws = f32(np.asarray(w_param, dtype=np.float32))
    with np.errstate(all="ignore"):
        h = f32(in_h) * hs
        w = f32(in_w) * ws
    if not (np.isfinite(h) and np.isfinite(w)):
        raise OpError("scale factors must be finite")
    return int(math.floor(h)), int(math.floor(w))


def _resize_scale(in_size: int, out_size: int, align_corners: bool) -> np.float32:
    if align_corners and out_size > 1:
        return f32(in_size - 1) / f32(out_size - 1)
    return f32(in_size) / f32(out_size)


def _bilinear_axis(in_size: int, out_size: int, align: bool, half: bool):
    """Lower/upper source indices and the float32 fractional position along one axis."""
    scale = _resize_scale(in_size, out_size, align)
    pos = np.arange(out_size, dtype=np.float32)
    src = (pos + f32(0.5)) * scale - f32(0.5) if half else pos * scale
    lo = np.maximum(np.floor(src).astype(np.int64), 0)
    hi = np.minimum(np.ceil(src).astype(np.int64), in_size - 1)
    return lo, hi, (src - lo.astype(np.float32)).astype(np.float32)


def _nearest_axis(in_size: int, out_size: int, align: bool, half: bool) -> np.ndarray:
    scale = _resize_scale(in_size, out_size, align)
    pos = np.arange(out_size, dtype=np.float32)
    src = (pos + f32(0.5)) * scale if half else pos * scale
    # roundf rounds half away from zero; src is never negative here.
    idx = np.floor(src + f32(0.5)) if align else np.floor(src)
    idx = np.minimum(idx.astype(np.int64), in_size - 1)
    return np.maximum(idx, 0) if half else idx


def _bilinear(x: np.ndarray, oh: int, ow: int, align: bool, half: bool, dtype) -> np.ndarray:
    _, h, w, _ = x.shape
    y0, y1, dy = _bilinear_axis(h, oh, align, half)
    x0, x1, dx = _bilinear_axis(w, ow, align, half)
    xf = x.astype(np.float32)
    dy = dy[None, :, None, None]
    dx = dx[None, None, :, None]
    one = f32(1)
    rows0, rows1 = xf[:, y0], xf[:, y1]
    r = (rows0[:, :, x0] * (one - dy) * (one - dx)
         + rows1[:, :, x0] * dy * (one - dx)
         + rows0[:, :, x1] * (one - dy) * dx
         + rows1[:, :, x1] * dy * dx)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.floor(r + f32(0.5)), info.min, info.max).astype(dtype)
    return r.astype(dtype)


def _const_flag(ctx: OpContext, index: int) -> bool | None:
    """An optional BOOL input at prepare time: false when absent or omitted, None when only
    known at run time."""
    if not ctx.has_value(index):
        return False
    v = ctx.const(index)
    return None if v is None else bool(v)


class _Resize(OperationDef):
    def validate(self, ctx: OpContext) -> list[Shape] | None:
        t = ctx.inputs[0].type
        st = ctx.inputs[2].type
        ctx.expect_rank(0, 4)
        ctx.expect_rank(0, 4, output=True)
        if t in C.QUANT8_TYPES:
            i, o = ctx.inputs[0], ctx.outputs[0]
            ctx.require(o.scale == i.scale and o.zero_point == i.zero_point,
                        "output scale and zero point must equal the input's")
        align, half = _const_flag(ctx, 4), _const_flag(ctx, 5)
        if align is not None and half is not None:
            ctx.require(not (align and half),
                        "align_corners and half_pixel_centers cannot both be set")
        if st == T.INT32:
            for i in (1, 2):
                v = ctx.const_int(i)
                ctx.require(v is None or v > 0, "output size must be positive")
        return self.prepare(ctx)

    def prepare(self, ctx: OpContext) -> list[Shape] | None:
        shape = ctx.inputs[0].shape
        if shape is None or len(shape) != 4:
            return [None]
        nchw = _const_flag(ctx, 3)
        if nchw is None:
            return [None]
        b, h, w, c = (shape[0], shape[2], shape[3], shape[1]) if nchw else shape
        wp, hp = ctx.const(1), ctx.const(2)
        oh = ow = 0
        st = ctx.inputs[2].type
        if wp is not None and hp is not None and (st == T.INT32 or (h > 0 and w > 0)):
            try:
                oh, ow = _output_hw(h, w, st, wp, hp)
            except OpError as e:
                raise ctx.fail(str(e)) from None
            ctx.require(oh > 0 and ow > 0, "output size must be positive")
        return [(b, c, oh, ow) if nchw else (b, oh, ow, c)]

    def kernel(self, ctx: OpContext):
        dt = ctx.inputs[0].type.dtype
        st = ctx.inputs[2].type
        n = len(ctx.inputs)
        bilinear = self.op_type == O.RESIZE_BILINEAR

        def flag(ins, i):
            return bool(np.asarray(ins[i])) if n > i and ins[i] is not None else False

        def run(ins, rt):
            x = ins[0]
            if x.ndim != 4:
                raise OpError("input must be 4-D")
            nchw, align, half = flag(ins, 3), flag(ins, 4), flag(ins, 5)
            if align and half:
                raise OpError("align_corners and half_pixel_centers cannot both be set")
            if nchw:
                x = x.transpose(0, 2, 3, 1)
            b, h, w, c = x.shape
            if h <= 0 or w <= 0 or c <= 0:
                raise OpError("height, width and depth must be positive")
            oh, ow = _output_hw(h, w, st, ins[1], ins[2])
            if oh <= 0 or ow <= 0:
                raise OpError("output size must be positive")
            if b == 0:
                y = np.zeros((0, oh, ow, c), dtype=dt)
            elif bilinear:
                y = _bilinear(x, oh, ow, align, half, dt)
            else:
                ys = _nearest_axis(h, oh, align, half)
                xs = _nearest_axis(w, ow, align, half)
                y = x[:, ys][:, :, xs]
            if nchw:
                y = y.transpose(0, 3, 1, 2)
            return [np.ascontiguousarray(y, dtype=dt)]

        return run


@register(O.RESIZE_BILINEAR)
class ResizeBilinear(_Resize):
    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        """Each output value blends four input values."""
        return visits(ctx, outputs) + 4 * elements(outputs[0])


@register(O.RESIZE_NEAREST_NEIGHBOR)
class ResizeNearestNeighbor(_Resize):
    pass
