"""Converters of the image operations: convolutions, pools, normalisations over an image,
space rearrangements and resizing, with NCHW layout and explicit padding turned into what
TFLite has."""

from __future__ import annotations

import numpy as np
import tflite
from tflite.Padding import Padding
from tflite.TensorType import TensorType as TT

from nnhal.hal.types import OperandType
from nnhal.tflite.export_context import Converter, ExportOpContext, Unexportable, fused_act
from nnhal.tflite.export_fb import channel_quant
from nnhal.tflite.schema import PADDINGS_BACK

T = OperandType
BO = tflite.BuiltinOperator
_TO_NHWC, _TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]
NN_CONVERTERS: dict[str, Converter] = {}


# ---- layout and padding ---------------------------------------------------------------------

class _Io:
    """Input 0 and output 0 in NHWC: for an NCHW operation, TRANSPOSEs around it."""

    def __init__(self, cx: ExportOpContext, layout_input: int | None) -> None:
        self.cx = cx
        self.nchw = layout_input is not None and bool(cx.scalar(layout_input, False))
        self.x, self.y = cx.t(0), cx.o()
        self.in_shape, self.out_shape = cx.shape(0), cx.out_shape()
        if self.nchw:
            self.in_shape = [self.in_shape[k] for k in _TO_NHWC]
            self.out_shape = [self.out_shape[k] for k in _TO_NHWC]
            xt = cx.temp(self.in_shape, self.x)
            cx.emit(BO.TRANSPOSE, [self.x, cx.ints(_TO_NHWC)], [xt])
            self.x = xt
            y = cx.temp(self.out_shape, self.y)
            self.after: list[tuple[int, list[int], int]] = [(BO.TRANSPOSE, _TO_NCHW, self.y)]
            self.y = y
        else:
            self.after = []

    def retype(self, tt: int) -> None:
        """Computes on int8 instead of uint8 or the other way (a QUANTIZE each side: the same
        scale, zero point moved by 128, so exact): TFLite's int8 kernels take symmetric
        filters only, and per-channel ones only with int8 inputs."""
        cx = self.cx
        xt = retyped(cx, self.x, tt)
        cx.emit(BO.QUANTIZE, [self.x], [xt])
        self.x = xt
        yt = retyped(cx, self.y, tt)
        self.after.insert(0, (BO.QUANTIZE, [], self.y))
        self.y = yt

    def finish(self) -> None:
        y = self.y
        for code, perm, out in self.after:
            self.cx.emit(code, [y, self.cx.ints(perm)] if perm else [y], [out])
            y = out


def retyped(cx: ExportOpContext, t: int, tt: int) -> int:
    """A new tensor like ``t`` in int8 or uint8 with the same scale (zero point moved)."""
    src = cx.w.sg.tensors[t]
    shift = 128 if tt == TT.UINT8 else -128
    new = cx.temp(src.shape, t)
    tensor = cx.w.sg.tensors[new]
    tensor.type = tt
    tensor.zero_points = [z + shift for z in src.zero_points or [-shift]]
    return new


def _same_pads(size: int, k: int, s: int, d: int) -> tuple[int, int]:
    out = -(-size // s)
    total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
    return total // 2, total - total // 2


def _padding(cx: ExportOpContext, io: _Io, pads: list[int] | None, scheme: int | None,
             k_hw: tuple[int, int], s_hw: tuple[int, int], d_hw: tuple[int, int],
             pad_op: bool) -> int:
    """The TFLite padding for explicit ``pads`` (left, right, top, bottom) or a HAL scheme.
    Explicit padding that is neither SAME nor VALID becomes a PAD (when ``pad_op``)."""
    if pads is None:
        if scheme not in PADDINGS_BACK:
            raise Unexportable(f"padding scheme {scheme} is not a HAL padding scheme")
        return PADDINGS_BACK[scheme]
    left, right, top, bottom = pads
    if not any(pads):
        return Padding.VALID
    h, w = io.in_shape[1], io.in_shape[2]
    if _same_pads(h, k_hw[0], s_hw[0], d_hw[0]) == (top, bottom) and \
            _same_pads(w, k_hw[1], s_hw[1], d_hw[1]) == (left, right):
        return Padding.SAME
    if not pad_op:
        raise Unexportable(f"explicit padding {pads} is neither SAME nor VALID, and TFLite's "
                           f"pooling would count or compare the padded values")
    if min(pads) < 0:
        raise Unexportable(f"negative padding {pads}")
    shape = [io.in_shape[0], h + top + bottom, w + left + right, io.in_shape[3]]
    padded = cx.temp(shape, io.x)
    cx.emit(BO.PAD, [io.x, cx.ints([[0, 0], [top, bottom], [left, right], [0, 0]])],
            [padded])
    io.x = padded
    return Padding.VALID


def _bias(cx: ExportOpContext, j: int, filter_j: int) -> int:
    """The bias tensor; with a per-channel filter, TFLite wants the bias's per-channel scales
    (input scale x filter scale) that the HAL leaves implicit."""
    f = cx.info(filter_j)
    if not cx.present(j) or f.channel_scales is None:
        return cx.t(j)
    t = cx.t(j)
    tensor = cx.w.sg.tensors[t]
    scales = np.asarray(f.channel_scales, dtype=np.float32)
    channel_quant(tensor, cx.info(0).scale * scales)  # float32 products
    return t


def _filter(cx: ExportOpContext, j: int, io: _Io) -> int:
    """The filter tensor. A per-channel filter with a uint8 input computes on int8; an int8
    filter with a zero point (QUANT8_ASYMM_SIGNED) is stored again without one when its
    values allow, else the operation computes on uint8, whose kernels take zero points."""
    f = cx.info(j)
    if f.channel_scales is not None and cx.info(0).type == T.TENSOR_QUANT8_ASYMM:
        io.retype(TT.INT8)
    if f.type != T.TENSOR_QUANT8_ASYMM_SIGNED or f.zero_point == 0:
        return cx.t(j)
    if f.is_const:
        w = np.asarray(f.value, dtype=np.int32) - f.zero_point
        if w.min() >= -128 and w.max() <= 127:
            t = cx.w.constant(w, None, f"w{len(cx.w.sg.tensors)}", TT.INT8)
            tensor = cx.w.sg.tensors[t]
            tensor.scales, tensor.zero_points = [float(f.scale)], [0]
            return t
    io.retype(TT.UINT8)
    w8 = retyped(cx, cx.t(j), TT.UINT8)
    cx.emit(BO.QUANTIZE, [cx.t(j)], [w8])
    return w8


# ---- convolutions and pools ---------------------------------------------------------------

def _conv_2d(cx: ExportOpContext) -> None:
    explicit = cx.n >= 10 and cx.info(7).type == T.INT32
    if explicit:
        pads, scheme = [cx.scalar(k) for k in (3, 4, 5, 6)], None
        sw, sh, act, layout, dil = cx.scalar(7), cx.scalar(8), 9, 10, 11
    else:
        pads, scheme = None, cx.scalar(3)
        sw, sh, act, layout, dil = cx.scalar(4), cx.scalar(5), 6, 7, 8
    dw, dh = cx.scalar(dil, 1), cx.scalar(dil + 1, 1)
    io = _Io(cx, layout)
    w = _filter(cx, 1, io)
    kh, kw = cx.shape(1)[1:3]
    padding = _padding(cx, io, pads, scheme, (kh, kw), (sh, sw), (dh, dw), True)
    cx.emit(BO.CONV_2D, [io.x, w, _bias(cx, 2, 1)], [io.y], "Conv2DOptions",
            Padding=padding, StrideW=sw, StrideH=sh, FusedActivationFunction=fused_act(cx, act),
            DilationWFactor=dw, DilationHFactor=dh)
    io.finish()


def _depthwise(cx: ExportOpContext) -> None:
    explicit = cx.n >= 11 and cx.info(8).type == T.INT32
    if explicit:
        pads, scheme = [cx.scalar(k) for k in (3, 4, 5, 6)], None
        sw, sh, mult, act, layout, dil = cx.scalar(7), cx.scalar(8), cx.scalar(9), 10, 11, 12
    else:
        pads, scheme = None, cx.scalar(3)
        sw, sh, mult, act, layout, dil = cx.scalar(4), cx.scalar(5), cx.scalar(6), 7, 8, 9
    dw, dh = cx.scalar(dil, 1), cx.scalar(dil + 1, 1)
    io = _Io(cx, layout)
    w = _filter(cx, 1, io)
    kh, kw = cx.shape(1)[1:3]
    padding = _padding(cx, io, pads, scheme, (kh, kw), (sh, sw), (dh, dw), True)
    cx.emit(BO.DEPTHWISE_CONV_2D, [io.x, w, _bias(cx, 2, 1)], [io.y],
            "DepthwiseConv2DOptions", Padding=padding, StrideW=sw, StrideH=sh,
            DepthMultiplier=mult, FusedActivationFunction=fused_act(cx, act),
            DilationWFactor=dw, DilationHFactor=dh)
    io.finish()


def _pool(code: int) -> Converter:
    def convert(cx: ExportOpContext) -> None:
        if cx.n >= 10:
            pads, scheme = [cx.scalar(k) for k in (1, 2, 3, 4)], None
            sw, sh, fw, fh, act, layout = (*(cx.scalar(k) for k in (5, 6, 7, 8)), 9, 10)
        else:
            pads, scheme = None, cx.scalar(1)
            sw, sh, fw, fh, act, layout = (*(cx.scalar(k) for k in (2, 3, 4, 5)), 6, 7)
        io = _Io(cx, layout)
        try:
            padding = _padding(cx, io, pads, scheme, (fh, fw), (sh, sw), (1, 1), False)
        except Unexportable:
            if code != BO.AVERAGE_POOL_2D or pads is None:
                raise
            _padded_average(cx, io, pads, (fh, fw), (sh, sw), fused_act(cx, act))
        else:
            cx.emit(code, [io.x], [io.y], "Pool2DOptions", Padding=padding, StrideW=sw,
                    StrideH=sh, FilterWidth=fw, FilterHeight=fh,
                    FusedActivationFunction=fused_act(cx, act))
        io.finish()
    return convert


def _padded_average(cx: ExportOpContext, io: _Io, pads: list[int], k: tuple[int, int],
                    s: tuple[int, int], activation: int) -> None:
    """An average pool whose explicit padding TFLite has not: the HAL averages only the real
    values under each window. So: PAD with zeros, VALID average, times (window size / real
    values in that window), a constant per output position; in float (quantized operands
    are dequantized before and quantized after, so within one step)."""
    left, right, top, bottom = pads
    n, h, w, c = io.in_shape
    oh, ow = io.out_shape[1:3]
    f32 = TT.FLOAT32
    x = io.x
    quantized = cx.w.sg.tensors[x].type != f32
    if quantized:
        x = cx.w.new(f"x{len(cx.w.sg.tensors)}", io.in_shape, f32)
        cx.emit(BO.DEQUANTIZE, [io.x], [x])
    padded = cx.w.new(f"x{len(cx.w.sg.tensors)}", [n, h + top + bottom, w + left + right, c],
                      f32)
    cx.emit(BO.PAD, [x, cx.ints([[0, 0], [top, bottom], [left, right], [0, 0]])], [padded])
    pooled = cx.w.new(f"x{len(cx.w.sg.tensors)}", [n, oh, ow, c], f32)
    cx.emit(BO.AVERAGE_POOL_2D, [padded], [pooled], "Pool2DOptions", Padding=Padding.VALID,
            StrideW=s[1], StrideH=s[0], FilterWidth=k[1], FilterHeight=k[0],
            FusedActivationFunction=0)

    def real(out: int, size: int, head: int, stride: int, window: int) -> np.ndarray:
        start = np.arange(out) * stride - head
        return np.minimum(start + window, size) - np.maximum(start, 0)

    counts = np.outer(real(oh, h, top, s[0], k[0]), real(ow, w, left, s[1], k[1]))
    scale = (k[0] * k[1] / np.maximum(counts, 1)).astype(np.float32).reshape(1, oh, ow, 1)
    y = io.y if not quantized else cx.w.new(f"x{len(cx.w.sg.tensors)}", [n, oh, ow, c], f32)
    cx.emit(BO.MUL, [pooled, cx.w.constant(scale, None, f"s{len(cx.w.sg.tensors)}", f32)],
            [y], "MulOptions", FusedActivationFunction=activation)
    if quantized:
        cx.emit(BO.QUANTIZE, [y], [io.y])


def _split0(cx: ExportOpContext, t: int, groups: int, scales: np.ndarray | None) -> list[int]:
    """Tensor ``t`` (a filter or bias) cut into ``groups`` slices along axis 0 by a SPLIT,
    each slice with its channels' scales."""
    shape = cx.w.sg.tensors[t].shape
    per = shape[0] // groups
    parts = [cx.temp([per] + shape[1:], t) for _ in range(groups)]
    if scales is not None:
        for k, part in enumerate(parts):
            _set_scales(cx, part, scales[k * per:(k + 1) * per])
    cx.emit(BO.SPLIT, [cx.ints(0), t], parts, "SplitOptions", NumSplits=groups)
    return parts


def _set_scales(cx: ExportOpContext, t: int, scales: np.ndarray) -> None:
    channel_quant(cx.w.sg.tensors[t], scales)


def _grouped_conv(cx: ExportOpContext) -> None:
    """One CONV_2D per group on a SPLIT of the input, CONCATENATION of their outputs: what
    a grouped convolution is, with each group's slice of the filter and bias."""
    if cx.n >= 12:
        pads, scheme = [cx.scalar(k) for k in (3, 4, 5, 6)], None
        sw, sh, groups, act, layout = cx.scalar(7), cx.scalar(8), cx.scalar(9), 10, 11
    else:
        pads, scheme = None, cx.scalar(3)
        sw, sh, groups, act, layout = cx.scalar(4), cx.scalar(5), cx.scalar(6), 7, 8
    f = cx.info(1)
    io = _Io(cx, layout)
    weights = _filter(cx, 1, io)
    fshape = cx.shape(1)
    kh, kw = fshape[1:3]
    padding = _padding(cx, io, pads, scheme, (kh, kw), (sh, sw), (1, 1), True)
    n, h, w, c = cx.w.sg.tensors[io.x].shape
    parts = [cx.temp([n, h, w, c // groups], io.x) for _ in range(groups)]
    cx.emit(BO.SPLIT, [cx.ints(3), io.x], parts, "SplitOptions", NumSplits=groups)
    per = fshape[0] // groups
    b_scales = None if f.channel_scales is None else f.channel_scales * cx.info(0).scale
    biases = _split0(cx, _bias(cx, 2, 1), groups, b_scales)
    weights = _split0(cx, weights, groups, f.channel_scales)
    outs = []
    for k in range(groups):
        shape = cx.w.sg.tensors[io.y].shape
        y = cx.temp(shape[:3] + [per], io.y)
        cx.emit(BO.CONV_2D, [parts[k], weights[k], biases[k]], [y], "Conv2DOptions",
                Padding=padding, StrideW=sw, StrideH=sh, FusedActivationFunction=fused_act(cx, act))
        outs.append(y)
    cx.emit(BO.CONCATENATION, outs, [io.y], "ConcatenationOptions", Axis=3,
            FusedActivationFunction=0)
    io.finish()


def _instance_norm(cx: ExportOpContext) -> None:
    """gamma * (x - mean) / sqrt(var + epsilon) + beta over each image's height and width,
    the HAL's formula, from MEAN, SQUARED_DIFFERENCE, RSQRT and elementwise builtins."""
    gamma, beta, eps = (float(cx.scalar(j)) for j in (1, 2, 3))
    io = _Io(cx, 4)
    n, h, w, c = io.in_shape
    stat = [n, 1, 1, c]
    f32 = TT.FLOAT32

    def tensor(shape: list[int]) -> int:
        return cx.w.new(f"x{len(cx.w.sg.tensors)}", shape, f32)

    def scalar(v: float) -> int:
        return cx.w.constant(np.float32(v), None, f"s{len(cx.w.sg.tensors)}", f32)

    mean, sq, var, var_eps, inv = tensor(stat), tensor(io.in_shape), tensor(stat), \
        tensor(stat), tensor(stat)
    centred, normed, scaled = tensor(io.in_shape), tensor(io.in_shape), tensor(io.in_shape)
    axes = cx.ints([1, 2])
    cx.emit(BO.MEAN, [io.x, axes], [mean], "ReducerOptions", KeepDims=True)
    cx.emit(BO.SQUARED_DIFFERENCE, [io.x, mean], [sq])
    cx.emit(BO.MEAN, [sq, axes], [var], "ReducerOptions", KeepDims=True)
    cx.emit(BO.ADD, [var, scalar(eps)], [var_eps], "AddOptions", FusedActivationFunction=0)
    cx.emit(BO.RSQRT, [var_eps], [inv])
    cx.emit(BO.SUB, [io.x, mean], [centred], "SubOptions", FusedActivationFunction=0)
    cx.emit(BO.MUL, [centred, inv], [normed], "MulOptions", FusedActivationFunction=0)
    cx.emit(BO.MUL, [normed, scalar(gamma)], [scaled], "MulOptions", FusedActivationFunction=0)
    cx.emit(BO.ADD, [scaled, scalar(beta)], [io.y], "AddOptions", FusedActivationFunction=0)
    io.finish()


def _channel_shuffle(cx: ExportOpContext) -> None:
    """RESHAPE the axis into (groups, size / groups), TRANSPOSE those two, RESHAPE back."""
    shape, groups, axis = cx.shape(0), cx.scalar(1), cx.scalar(2)
    axis = axis + len(shape) if axis < 0 else axis
    split = shape[:axis] + [groups, shape[axis] // groups] + shape[axis + 1:]
    perm = list(range(len(split)))
    perm[axis], perm[axis + 1] = axis + 1, axis
    swapped = [split[p] for p in perm]
    x = cx.t(0)
    a, b = cx.temp(split, x), cx.temp(swapped, x)
    cx.emit(BO.RESHAPE, [x, cx.ints(split)], [a], "ReshapeOptions", NewShape=split)
    cx.emit(BO.TRANSPOSE, [a, cx.ints(perm)], [b])
    cx.emit(BO.RESHAPE, [b, cx.ints(shape)], [cx.o()], "ReshapeOptions", NewShape=shape)


def _transpose_conv(cx: ExportOpContext) -> None:
    crop = None
    if cx.n >= 11:
        left, right, top, bottom = (cx.scalar(k) for k in (3, 4, 5, 6))
        sw, sh, act, layout = cx.scalar(7), cx.scalar(8), 9, 10
        paddings = {Padding.VALID if head == 0 else
                    Padding.SAME if head == (head + tail) // 2 and tail >= head else -1
                    for head, tail in ((top, bottom), (left, right))}
        padding = paddings.pop() if len(paddings) == 1 else -1
        if padding == -1:
            # No TFLite padding gives these: compute the whole (VALID) output, then cut.
            padding, crop = Padding.VALID, (top, left)
    else:
        padding = PADDINGS_BACK.get(cx.scalar(4))
        if padding is None:
            raise Unexportable(f"padding scheme {cx.scalar(4)} is not a HAL padding scheme")
        sw, sh, act, layout = cx.scalar(5), cx.scalar(6), 7, 8
    io = _Io(cx, layout)
    w = _filter(cx, 1, io)
    shape, y = io.out_shape, io.y
    if crop is not None:
        (n, h, wd, _), (kh, kw) = io.in_shape, cx.shape(1)[1:3]
        shape = [n, (h - 1) * sh + kh, (wd - 1) * sw + kw, io.out_shape[3]]
        y = cx.temp(shape, io.y)
    cx.emit(BO.TRANSPOSE_CONV, [cx.ints(shape), w, io.x, _bias(cx, 2, 1)],
            [y], "TransposeConvOptions", Padding=padding, StrideW=sw, StrideH=sh,
            FusedActivationFunction=fused_act(cx, act))
    if crop is not None:
        cx.emit(BO.SLICE, [y, cx.ints([0, crop[0], crop[1], 0]), cx.ints(io.out_shape)],
                [io.y])
    io.finish()


def fully_connected(cx: ExportOpContext, keep_num_dims: bool = False) -> None:
    """FULLY_CONNECTED; with ``keep_num_dims`` its output keeps the input's leading
    dimensions (the HAL's [batch, units] reshaped, which the exporter finds as one chain)."""
    io = _Io(cx, None)
    w = _filter(cx, 1, io)
    cx.emit(BO.FULLY_CONNECTED, [io.x, w, cx.t(2)], [io.y], "FullyConnectedOptions",
            FusedActivationFunction=fused_act(cx, 3), KeepNumDims=keep_num_dims)
    io.finish()


NN_CONVERTERS.update(
    INSTANCE_NORMALIZATION=_instance_norm, CONV_2D=_conv_2d, GROUPED_CONV_2D=_grouped_conv,
    CHANNEL_SHUFFLE=_channel_shuffle,
    DEPTHWISE_CONV_2D=_depthwise, TRANSPOSE_CONV_2D=_transpose_conv,
    AVERAGE_POOL_2D=_pool(BO.AVERAGE_POOL_2D), MAX_POOL_2D=_pool(BO.MAX_POOL_2D),
    L2_POOL_2D=_pool(BO.L2_POOL_2D), FULLY_CONNECTED=fully_connected)


# ---- space and resizing -----------------------------------------------------------------------

def _block(code: int, options: str) -> Converter:
    def convert(cx: ExportOpContext) -> None:
        io = _Io(cx, 2)
        cx.emit(code, [io.x], [io.y], options, BlockSize=cx.scalar(1))
        io.finish()
    return convert


def _batch_to_space(cx: ExportOpContext) -> None:
    io = _Io(cx, 2)
    cx.emit(BO.BATCH_TO_SPACE_ND, [io.x, cx.t(1), cx.ints([[0, 0], [0, 0]])], [io.y])
    io.finish()


def _space_to_batch(cx: ExportOpContext) -> None:
    io = _Io(cx, 3)
    cx.emit(BO.SPACE_TO_BATCH_ND, [io.x, cx.t(1), cx.t(2)], [io.y])
    io.finish()


def _resize(code: int, options: str) -> Converter:
    def convert(cx: ExportOpContext) -> None:
        io = _Io(cx, 3)
        x, y = io.x, io.y
        halve = code == BO.RESIZE_BILINEAR and cx.w.ex.exact_resize and \
            cx.w.sg.tensors[x].type == TT.FLOAT32
        if halve:
            # XNNPACK interpolates as a + (b - a) t, and b - a overflows for finite inputs
            # beyond +-1.7e38: on half the input it cannot, and interpolation is linear, so
            # doubling after gives the same result (scaling by 2 is exact for normal floats).
            x, y = cx.temp(io.in_shape, io.x), cx.temp(io.out_shape, io.y)
            cx.emit(BO.MUL, [io.x, _f32(cx, 0.5)], [x], "MulOptions", FusedActivationFunction=0)
        cx.emit(code, [x, cx.ints(io.out_shape[1:3])], [y], options,
                AlignCorners=bool(cx.scalar(4, False)),
                HalfPixelCenters=bool(cx.scalar(5, False)))
        if halve:
            cx.emit(BO.MUL, [y, _f32(cx, 2.0)], [io.y], "MulOptions", FusedActivationFunction=0)
        io.finish()
    return convert


def _f32(cx: ExportOpContext, v: float) -> int:
    return cx.w.constant(np.float32(v), None, f"s{len(cx.w.sg.tensors)}", TT.FLOAT32)


NN_CONVERTERS.update(
    DEPTH_TO_SPACE=_block(BO.DEPTH_TO_SPACE, "DepthToSpaceOptions"),
    SPACE_TO_DEPTH=_block(BO.SPACE_TO_DEPTH, "SpaceToDepthOptions"),
    BATCH_TO_SPACE_ND=_batch_to_space, SPACE_TO_BATCH_ND=_space_to_batch,
    RESIZE_BILINEAR=_resize(BO.RESIZE_BILINEAR, "ResizeBilinearOptions"),
    RESIZE_NEAREST_NEIGHBOR=_resize(BO.RESIZE_NEAREST_NEIGHBOR,
                                    "ResizeNearestNeighborOptions"))
