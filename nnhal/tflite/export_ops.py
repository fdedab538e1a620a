"""One converter per HAL operation: its operands become TFLite tensors, its scalar parameters
builtin options. A converter raises :class:`Refuse` (with the reason) for any variant TFLite
cannot compute exactly as the HAL defines it; the exporter names each such operation.

Operand positions follow the HAL 1.3 signatures (``nnhal ops NAME``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tflite
from tflite.Padding import Padding
from tflite.TensorType import TensorType as TT

from nnhal.hal.types import OperandLifeTime, OperandType
from nnhal.ops.registry import OperandInfo
from nnhal.tflite.export_context import OpContext, Refuse
from nnhal.tflite.schema import ACTIVATIONS_BACK, PADDINGS_BACK

T = OperandType
BO = tflite.BuiltinOperator
Converter = Callable[[OpContext], None]
CONVERTERS: dict[str, Converter] = {}

_QUANTIZED = {T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM,
              T.TENSOR_QUANT16_SYMM, T.TENSOR_QUANT16_ASYMM}
_TO_NHWC, _TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def _act(cx: OpContext, j: int) -> int:
    v = cx.scalar(j, 0)
    if v not in ACTIVATIONS_BACK:
        raise Refuse(f"fused activation {v} is not a HAL FuseCode")
    return ACTIVATIONS_BACK[v]


def _simple(code: int, options: str | None = None) -> Converter:
    def convert(cx: OpContext) -> None:
        cx.emit(code, [cx.t(j) for j in range(cx.n)], [cx.o(k) for k in range(len(cx.outs))],
                options)
    return convert


for _name, _code in {
        "ABS": BO.ABS, "EXP": BO.EXP, "LOG": BO.LOG, "NEG": BO.NEG, "SQRT": BO.SQRT,
        "RSQRT": BO.RSQRT, "SIN": BO.SIN, "FLOOR": BO.FLOOR, "LOGISTIC": BO.LOGISTIC,
        "TANH": BO.TANH, "RELU": BO.RELU, "RELU1": BO.RELU_N1_TO_1, "RELU6": BO.RELU6,
        "HARD_SWISH": BO.HARD_SWISH, "LOGICAL_NOT": BO.LOGICAL_NOT,
        "DEQUANTIZE": BO.DEQUANTIZE, "QUANTIZE": BO.QUANTIZE, "CAST": BO.CAST,
        "POW": BO.POW, "LOGICAL_AND": BO.LOGICAL_AND, "LOGICAL_OR": BO.LOGICAL_OR,
        "PRELU": BO.PRELU,
        "TILE": BO.TILE, "SLICE": BO.SLICE, "PAD": BO.PAD, "RANK": BO.RANK,
        "EMBEDDING_LOOKUP": BO.EMBEDDING_LOOKUP, "HASHTABLE_LOOKUP": BO.HASHTABLE_LOOKUP,
        "FILL": BO.FILL}.items():
    CONVERTERS[_name] = _simple(_code)


def _quant_differs(cx: OpContext, inputs: list[int], with_output: bool) -> bool:
    infos = [cx.info(j) for j in inputs] + ([cx.out_info()] if with_output else [])
    return infos[0].type in _QUANTIZED and len({(i.scale, i.zero_point) for i in infos}) > 1


def _dequantized(cx: OpContext, j: int) -> int:
    y = cx.w.new(f"x{len(cx.w.sg.tensors)}", cx.shape(j), TT.FLOAT32)
    cx.emit(BO.DEQUANTIZE, [cx.t(j)], [y])
    return y


def _requantized(cx: OpContext, j: int) -> int:
    """Input ``j`` in the output's quantization (TFLite's QUANTIZE requantizes integers)."""
    info, out = cx.info(j), cx.out_info()
    if (info.scale, info.zero_point) == (out.scale, out.zero_point):
        return cx.t(j)
    y = cx.temp(cx.shape(j), cx.o())
    cx.emit(BO.QUANTIZE, [cx.t(j)], [y])
    return y


def _compare(code: int) -> Converter:
    def convert(cx: OpContext) -> None:
        a, b = cx.t(0), cx.t(1)
        if _quant_differs(cx, [0, 1], False):
            # The HAL compares real values; TFLite would compare the stored integers.
            a, b = _dequantized(cx, 0), _dequantized(cx, 1)
        elif cx.info(0).type == T.TENSOR_BOOL8 and code not in (BO.EQUAL, BO.NOT_EQUAL):
            # TFLite orders numbers only: compare the booleans as 0 / 1.
            a, b = (_cast(cx, x, TT.INT32) for x in (a, b))
        cx.emit(code, [a, b], [cx.o()])
    return convert


def _cast(cx: OpContext, x: int, tt: int) -> int:
    src = cx.w.sg.tensors[x]
    y = cx.w.new(f"x{len(cx.w.sg.tensors)}", src.shape, tt)
    cx.emit(BO.CAST, [x], [y])
    return y


def _same_quant_op(code: int, inputs: list[int]) -> Converter:
    """MAXIMUM, MINIMUM, SELECT: TFLite reads the stored integers, the HAL requantizes each
    input to the output's scale first; so do that with QUANTIZE (within one step)."""
    def convert(cx: OpContext) -> None:
        cx.emit(code, [_requantized(cx, j) if j in inputs else cx.t(j) for j in range(cx.n)],
                [cx.o()])
    return convert


CONVERTERS.update(
    EQUAL=_compare(BO.EQUAL), NOT_EQUAL=_compare(BO.NOT_EQUAL), GREATER=_compare(BO.GREATER),
    GREATER_EQUAL=_compare(BO.GREATER_EQUAL), LESS=_compare(BO.LESS),
    LESS_EQUAL=_compare(BO.LESS_EQUAL), MAXIMUM=_same_quant_op(BO.MAXIMUM, [0, 1]),
    MINIMUM=_same_quant_op(BO.MINIMUM, [0, 1]), SELECT=_same_quant_op(BO.SELECT, [1, 2]))


def _arith(code: int, options: str) -> Converter:
    def convert(cx: OpContext) -> None:
        cx.emit(code, [cx.t(0), cx.t(1)], [cx.o()], options,
                FusedActivationFunction=_act(cx, 2))
    return convert


CONVERTERS.update(ADD=_arith(BO.ADD, "AddOptions"), SUB=_arith(BO.SUB, "SubOptions"),
                  MUL=_arith(BO.MUL, "MulOptions"), DIV=_arith(BO.DIV, "DivOptions"))


# ---- layout and padding ---------------------------------------------------------------------

class _Io:
    """Input 0 and output 0 in NHWC: for an NCHW operation, TRANSPOSEs around it."""

    def __init__(self, cx: OpContext, layout_input: int) -> None:
        self.cx = cx
        self.nchw = bool(cx.scalar(layout_input, False))
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

    def as_int8(self) -> None:
        """Computes on int8 instead of uint8 (a QUANTIZE each side: the same scale, zero point
        minus 128, so exact), for kernels that take per-channel int8 filters only with int8."""
        cx = self.cx
        xt = self._retyped(self.x)
        cx.emit(BO.QUANTIZE, [self.x], [xt])
        self.x = xt
        yt = self._retyped(self.y)
        self.after.insert(0, (BO.QUANTIZE, [], self.y))
        self.y = yt

    def _retyped(self, t: int) -> int:
        src = self.cx.w.sg.tensors[t]
        new = self.cx.temp(src.shape, t)
        tensor = self.cx.w.sg.tensors[new]
        tensor.type, tensor.zero_points = TT.INT8, [z - 128 for z in src.zero_points or [128]]
        return new

    def finish(self) -> None:
        y = self.y
        for code, perm, out in self.after:
            self.cx.emit(code, [y, self.cx.ints(perm)] if perm else [y], [out])
            y = out


def _same_pads(size: int, k: int, s: int, d: int) -> tuple[int, int]:
    out = -(-size // s)
    total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
    return total // 2, total - total // 2


def _padding(cx: OpContext, io: _Io, pads: list[int] | None, scheme: int | None,
             k_hw: tuple[int, int], s_hw: tuple[int, int], d_hw: tuple[int, int],
             pad_op: bool) -> int:
    """The TFLite padding for explicit ``pads`` (left, right, top, bottom) or a HAL scheme.
    Explicit padding that is neither SAME nor VALID becomes a PAD (when ``pad_op``)."""
    if pads is None:
        if scheme not in PADDINGS_BACK:
            raise Refuse(f"padding scheme {scheme} is not a HAL padding scheme")
        return PADDINGS_BACK[scheme]
    left, right, top, bottom = pads
    if not any(pads):
        return Padding.VALID
    h, w = io.in_shape[1], io.in_shape[2]
    if _same_pads(h, k_hw[0], s_hw[0], d_hw[0]) == (top, bottom) and \
            _same_pads(w, k_hw[1], s_hw[1], d_hw[1]) == (left, right):
        return Padding.SAME
    if not pad_op:
        raise Refuse(f"explicit padding {pads} is neither SAME nor VALID, and TFLite's "
                     f"pooling would count or compare the padded values")
    if min(pads) < 0:
        raise Refuse(f"negative padding {pads}")
    shape = [io.in_shape[0], h + top + bottom, w + left + right, io.in_shape[3]]
    padded = cx.temp(shape, io.x)
    cx.emit(BO.PAD, [io.x, cx.ints([[0, 0], [top, bottom], [left, right], [0, 0]])],
            [padded])
    io.x = padded
    return Padding.VALID


def _bias(cx: OpContext, j: int, filter_j: int) -> int:
    """The bias tensor; with a per-channel filter, TFLite wants the bias's per-channel scales
    (input scale x filter scale) that the HAL leaves implicit."""
    f = cx.info(filter_j)
    if not cx.present(j) or f.channel_scales is None:
        return cx.t(j)
    t = cx.t(j)
    tensor = cx.w.sg.tensors[t]
    tensor.scales = [float(cx.info(0).scale * s) for s in f.channel_scales]
    tensor.zero_points = [0] * len(tensor.scales)
    tensor.quantized_dimension = 0
    return t


def _filter(cx: OpContext, j: int, io: _Io | None = None) -> int:
    """The filter tensor. An int8 filter with a zero point (QUANT8_ASYMM_SIGNED) is stored
    again without one when the values allow (TFLite's int8 kernels take symmetric filters
    only); a uint8 input with a per-channel filter is computed on int8 (see _Io.as_int8)."""
    f = cx.info(j)
    if f.channel_scales is not None and cx.info(0).type == T.TENSOR_QUANT8_ASYMM:
        if io is None:
            raise Refuse("TFLite takes per-channel int8 weights with int8 inputs only")
        io.as_int8()
    if f.type != T.TENSOR_QUANT8_ASYMM_SIGNED or f.zero_point == 0:
        return cx.t(j)
    if not f.is_const:
        raise Refuse(f"int8 weights with zero point {f.zero_point} that are not constant: "
                     f"TFLite's int8 kernels take symmetric weights only")
    w = np.asarray(f.value, dtype=np.int32) - f.zero_point
    if w.min() < -128 or w.max() > 127:
        raise Refuse(f"int8 weights with zero point {f.zero_point} do not fit int8 once made "
                     f"symmetric, as TFLite's int8 kernels need")
    t = cx.w.constant(w, None, f"w{len(cx.w.sg.tensors)}", TT.INT8)
    tensor = cx.w.sg.tensors[t]
    tensor.scales, tensor.zero_points = [float(f.scale)], [0]
    return t


# ---- convolutions and pools ---------------------------------------------------------------

def _conv_2d(cx: OpContext) -> None:
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
            Padding=padding, StrideW=sw, StrideH=sh, FusedActivationFunction=_act(cx, act),
            DilationWFactor=dw, DilationHFactor=dh)
    io.finish()


def _depthwise(cx: OpContext) -> None:
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
            DepthMultiplier=mult, FusedActivationFunction=_act(cx, act),
            DilationWFactor=dw, DilationHFactor=dh)
    io.finish()


def _pool(code: int) -> Converter:
    def convert(cx: OpContext) -> None:
        if cx.n >= 10:
            pads, scheme = [cx.scalar(k) for k in (1, 2, 3, 4)], None
            sw, sh, fw, fh, act, layout = (*(cx.scalar(k) for k in (5, 6, 7, 8)), 9, 10)
        else:
            pads, scheme = None, cx.scalar(1)
            sw, sh, fw, fh, act, layout = (*(cx.scalar(k) for k in (2, 3, 4, 5)), 6, 7)
        io = _Io(cx, layout)
        padding = _padding(cx, io, pads, scheme, (fh, fw), (sh, sw), (1, 1), False)
        cx.emit(code, [io.x], [io.y], "Pool2DOptions", Padding=padding, StrideW=sw,
                StrideH=sh, FilterWidth=fw, FilterHeight=fh,
                FusedActivationFunction=_act(cx, act))
        io.finish()
    return convert


def _weights(cx: OpContext, f: OperandInfo, value: np.ndarray,
             scales: np.ndarray | None) -> int:
    """A constant filter slice as TFLite takes it (see _filter)."""
    name = f"w{len(cx.w.sg.tensors)}"
    if f.type not in _QUANTIZED and f.type != T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        return cx.w.constant(value, f, name)
    if f.type == T.TENSOR_QUANT8_ASYMM:
        t = cx.w.constant(value, f, name)  # uint8 keeps its zero point
        return t
    zp = f.zero_point if f.type == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
    w = np.asarray(value, dtype=np.int32) - zp
    if w.min() < -128 or w.max() > 127:
        raise Refuse(f"int8 weights with zero point {zp} do not fit int8 once made symmetric, "
                     f"as TFLite's int8 kernels need")
    t = cx.w.constant(w, None, name, TT.INT8)
    tensor = cx.w.sg.tensors[t]
    tensor.scales = [float(v) for v in scales] if scales is not None else [float(f.scale)]
    tensor.zero_points = [0] * len(tensor.scales)
    return t


def _group_slices(cx: OpContext, j: int, groups: int, per: int,
                  scales: np.ndarray | None) -> list[int]:
    """Input ``j`` (filter or bias) cut into ``groups`` slices along axis 0: constants sliced
    here, a runtime tensor by a SPLIT (each slice with its channels' scales)."""
    info = cx.info(j)
    if info.is_const:
        value = np.asarray(info.value)
        if j == 1:
            return [_weights(cx, info, value[k * per:(k + 1) * per],
                             None if scales is None else scales[k * per:(k + 1) * per])
                    for k in range(groups)]
        out = []
        for k in range(groups):
            t = cx.w.constant(value[k * per:(k + 1) * per], info, f"b{len(cx.w.sg.tensors)}")
            if scales is not None:
                _set_scales(cx, t, scales[k * per:(k + 1) * per])
            out.append(t)
        return out
    if j == 1 and info.type == T.TENSOR_QUANT8_ASYMM_SIGNED and info.zero_point != 0:
        raise Refuse(f"int8 weights with zero point {info.zero_point} that are not constant: "
                     f"TFLite's int8 kernels take symmetric weights only")
    x = cx.t(j)
    shape = cx.shape(j)
    parts = [cx.temp([per] + shape[1:], x) for _ in range(groups)]
    for k, t in enumerate(parts):
        if scales is not None:
            _set_scales(cx, t, scales[k * per:(k + 1) * per])
    cx.emit(BO.SPLIT, [cx.ints(0), x], parts, "SplitOptions", NumSplits=groups)
    return parts


def _set_scales(cx: OpContext, t: int, scales: np.ndarray) -> None:
    tensor = cx.w.sg.tensors[t]
    tensor.scales = [float(v) for v in scales]
    tensor.zero_points = [0] * len(tensor.scales)
    tensor.quantized_dimension = 0


def _grouped_conv(cx: OpContext) -> None:
    """One CONV_2D per group on a SPLIT of the input, CONCATENATION of their outputs: what
    a grouped convolution is, with each group's slice of the constant filter and bias."""
    if cx.n >= 12:
        pads, scheme = [cx.scalar(k) for k in (3, 4, 5, 6)], None
        sw, sh, groups, act, layout = cx.scalar(7), cx.scalar(8), cx.scalar(9), 10, 11
    else:
        pads, scheme = None, cx.scalar(3)
        sw, sh, groups, act, layout = cx.scalar(4), cx.scalar(5), cx.scalar(6), 7, 8
    f = cx.info(1)
    io = _Io(cx, layout)
    if f.channel_scales is not None and cx.info(0).type == T.TENSOR_QUANT8_ASYMM:
        io.as_int8()
    fshape = cx.shape(1)
    kh, kw = fshape[1:3]
    padding = _padding(cx, io, pads, scheme, (kh, kw), (sh, sw), (1, 1), True)
    n, h, w, c = cx.w.sg.tensors[io.x].shape
    parts = [cx.temp([n, h, w, c // groups], io.x) for _ in range(groups)]
    cx.emit(BO.SPLIT, [cx.ints(3), io.x], parts, "SplitOptions", NumSplits=groups)
    per = fshape[0] // groups
    weights = _group_slices(cx, 1, groups, per, f.channel_scales)
    b_scales = None if f.channel_scales is None else f.channel_scales * cx.info(0).scale
    biases = _group_slices(cx, 2, groups, per, b_scales)
    outs = []
    for k in range(groups):
        shape = cx.w.sg.tensors[io.y].shape
        y = cx.temp(shape[:3] + [per], io.y)
        cx.emit(BO.CONV_2D, [parts[k], weights[k], biases[k]], [y], "Conv2DOptions",
                Padding=padding, StrideW=sw, StrideH=sh, FusedActivationFunction=_act(cx, act))
        outs.append(y)
    cx.emit(BO.CONCATENATION, outs, [io.y], "ConcatenationOptions", Axis=3,
            FusedActivationFunction=0)
    io.finish()


def _instance_norm(cx: OpContext) -> None:
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


def _channel_shuffle(cx: OpContext) -> None:
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


def _transpose_conv(cx: OpContext) -> None:
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
            raise Refuse(f"padding scheme {cx.scalar(4)} is not a HAL padding scheme")
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
            FusedActivationFunction=_act(cx, act))
    if crop is not None:
        cx.emit(BO.SLICE, [y, cx.ints([0, crop[0], crop[1], 0]), cx.ints(io.out_shape)],
                [io.y])
    io.finish()


def _fully_connected(cx: OpContext) -> None:
    cx.emit(BO.FULLY_CONNECTED, [cx.t(0), _filter(cx, 1), cx.t(2)], [cx.o()],
            "FullyConnectedOptions", FusedActivationFunction=_act(cx, 3), KeepNumDims=False)


CONVERTERS.update(
    INSTANCE_NORMALIZATION=_instance_norm, CONV_2D=_conv_2d, GROUPED_CONV_2D=_grouped_conv,
    CHANNEL_SHUFFLE=_channel_shuffle,
    DEPTHWISE_CONV_2D=_depthwise, TRANSPOSE_CONV_2D=_transpose_conv,
    AVERAGE_POOL_2D=_pool(BO.AVERAGE_POOL_2D), MAX_POOL_2D=_pool(BO.MAX_POOL_2D),
    L2_POOL_2D=_pool(BO.L2_POOL_2D), FULLY_CONNECTED=_fully_connected)


# ---- along one axis -------------------------------------------------------------------------

def _along_last(cx: OpContext, axis: int, emit: Callable[[int, int], None]) -> None:
    """Runs ``emit(x, y)`` with ``axis`` moved last (a TRANSPOSE swapping it with the last
    axis before and after), for operations TFLite only has along the last axis."""
    shape = cx.shape(0)
    rank = len(shape)
    axis = axis + rank if axis < 0 else axis
    x, y = cx.t(0), cx.o()
    if axis == rank - 1:
        emit(x, y)
        return
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    swapped = [shape[p] for p in perm]
    xt, yt = cx.temp(swapped, x), cx.temp(swapped, y)
    cx.emit(BO.TRANSPOSE, [x, cx.ints(perm)], [xt])
    emit(xt, yt)
    cx.emit(BO.TRANSPOSE, [yt, cx.ints(perm)], [y])


def _softmax(cx: OpContext) -> None:
    beta = float(cx.scalar(1))
    _along_last(cx, cx.scalar(2, -1), lambda x, y: cx.emit(BO.SOFTMAX, [x], [y],
                                                            "SoftmaxOptions", Beta=beta))


def _log_softmax(cx: OpContext) -> None:
    beta = float(cx.scalar(1))

    def emit(x: int, y: int) -> None:
        if beta != 1.0:  # TFLite's LOG_SOFTMAX has no beta: scale the logits first
            scaled = cx.temp(cx.w.sg.tensors[x].shape, x)
            b = cx.w.constant(np.float32(beta), None, f"beta{len(cx.w.sg.tensors)}",
                              TT.FLOAT32)
            cx.emit(BO.MUL, [x, b], [scaled], "MulOptions", FusedActivationFunction=0)
            x = scaled
        cx.emit(BO.LOG_SOFTMAX, [x], [y])

    _along_last(cx, cx.scalar(2, -1), emit)


def _l2_norm(cx: OpContext) -> None:
    _along_last(cx, cx.scalar(1, -1), lambda x, y: cx.emit(
        BO.L2_NORMALIZATION, [x], [y], "L2NormOptions", FusedActivationFunction=0))


def _lrn(cx: OpContext) -> None:
    opts = dict(Radius=int(cx.scalar(1)), Bias=float(cx.scalar(2)),
                Alpha=float(cx.scalar(3)), Beta=float(cx.scalar(4)))

    def emit(x: int, y: int) -> None:
        shape = cx.w.sg.tensors[x].shape
        if len(shape) == 4:
            cx.emit(BO.LOCAL_RESPONSE_NORMALIZATION, [x], [y],
                    "LocalResponseNormalizationOptions", **opts)
            return
        # TFLite's kernel is 4-D only; it normalises along the last axis, so any rank folds.
        flat = [1, 1, int(np.prod(shape[:-1])), shape[-1]]
        xt, yt = cx.temp(flat, x), cx.temp(flat, y)
        cx.emit(BO.RESHAPE, [x, cx.ints(flat)], [xt], "ReshapeOptions", NewShape=flat)
        cx.emit(BO.LOCAL_RESPONSE_NORMALIZATION, [xt], [yt],
                "LocalResponseNormalizationOptions", **opts)
        cx.emit(BO.RESHAPE, [yt, cx.ints(shape)], [y], "ReshapeOptions", NewShape=shape)

    _along_last(cx, cx.scalar(5, -1), emit)


CONVERTERS.update(SOFTMAX=_softmax, LOG_SOFTMAX=_log_softmax, L2_NORMALIZATION=_l2_norm,
                  LOCAL_RESPONSE_NORMALIZATION=_lrn)


# ---- shapes and indexing -------------------------------------------------------------------

def _reshape(cx: OpContext) -> None:
    shape = cx.out_shape()
    cx.emit(BO.RESHAPE, [cx.t(0), cx.ints(shape)], [cx.o()], "ReshapeOptions", NewShape=shape)


def _squeeze(cx: OpContext) -> None:
    if cx.present(1) and not cx.info(1).is_const:
        _reshape(cx)  # the dimensions are a runtime tensor, but the output shape is known
        return
    dims = cx.scalar(1, [])
    cx.emit(BO.SQUEEZE, [cx.t(0)], [cx.o()], "SqueezeOptions", SqueezeDims=list(dims))


def _concatenation(cx: OpContext) -> None:
    out = cx.out_info()
    inputs = []
    for j in range(cx.n - 1):
        x, info = cx.t(j), cx.info(j)
        if info.type == T.TENSOR_QUANT8_ASYMM_SIGNED and \
                (info.scale, info.zero_point) != (out.scale, out.zero_point):
            # XNNPACK refuses int8 inputs quantized unlike the output: requantize first.
            xt = cx.temp(cx.shape(j), cx.o())
            cx.emit(BO.QUANTIZE, [x], [xt])
            x = xt
        inputs.append(x)
    cx.emit(BO.CONCATENATION, inputs, [cx.o()],
            "ConcatenationOptions", Axis=cx.scalar(cx.n - 1), FusedActivationFunction=0)


def _expand_dims(cx: OpContext) -> None:
    cx.emit(BO.EXPAND_DIMS, [cx.t(0), cx.ints(cx.scalar(1))], [cx.o()])


def _transpose(cx: OpContext) -> None:
    perm = cx.t(1) if cx.present(1) else cx.ints(list(range(len(cx.shape(0))))[::-1])
    cx.emit(BO.TRANSPOSE, [cx.t(0), perm], [cx.o()])


def _pad_v2(cx: OpContext) -> None:
    value = cx.w.constant(np.asarray(cx.scalar(2)), cx.info(0), f"pad{len(cx.w.sg.tensors)}")
    cx.emit(BO.PADV2, [cx.t(0), cx.t(1), value], [cx.o()])


def _strided_slice(cx: OpContext) -> None:
    cx.emit(BO.STRIDED_SLICE, [cx.t(k) for k in range(4)], [cx.o()], "StridedSliceOptions",
            BeginMask=cx.scalar(4), EndMask=cx.scalar(5), ShrinkAxisMask=cx.scalar(6))


def _gather(cx: OpContext) -> None:
    cx.emit(BO.GATHER, [cx.t(0), cx.t(2)], [cx.o()], "GatherOptions", Axis=cx.scalar(1))


def _split(cx: OpContext) -> None:
    cx.emit(BO.SPLIT, [cx.ints(cx.scalar(1)), cx.t(0)], [cx.o(k) for k in range(len(cx.outs))],
            "SplitOptions", NumSplits=cx.scalar(2))


def _reduce(code: int) -> Converter:
    def convert(cx: OpContext) -> None:
        cx.emit(code, [cx.t(0), cx.t(1)], [cx.o()], "ReducerOptions",
                KeepDims=bool(cx.scalar(2)))
    return convert


def _arg(code: int, options: str) -> Converter:
    def convert(cx: OpContext) -> None:
        cx.emit(code, [cx.t(0), cx.ints([cx.scalar(1)])], [cx.o()], options,
                OutputType=TT.INT32)
    return convert


def _topk(cx: OpContext) -> None:
    cx.emit(BO.TOPK_V2, [cx.t(0), cx.ints(cx.scalar(1))], [cx.o(0), cx.o(1)])


CONVERTERS.update(
    CONCATENATION=_concatenation, RESHAPE=_reshape, SQUEEZE=_squeeze,
    EXPAND_DIMS=_expand_dims, TRANSPOSE=_transpose,
    PAD_V2=_pad_v2, STRIDED_SLICE=_strided_slice, GATHER=_gather, SPLIT=_split,
    MEAN=_reduce(BO.MEAN), REDUCE_SUM=_reduce(BO.SUM), REDUCE_PROD=_reduce(BO.REDUCE_PROD),
    REDUCE_MAX=_reduce(BO.REDUCE_MAX), REDUCE_MIN=_reduce(BO.REDUCE_MIN),
    REDUCE_ANY=_reduce(BO.REDUCE_ANY), REDUCE_ALL=_reduce(BO.REDUCE_ALL),
    ARGMAX=_arg(BO.ARG_MAX, "ArgMaxOptions"), ARGMIN=_arg(BO.ARG_MIN, "ArgMinOptions"),
    TOPK_V2=_topk)


# ---- space and resizing -----------------------------------------------------------------------

def _block(code: int, options: str) -> Converter:
    def convert(cx: OpContext) -> None:
        io = _Io(cx, 2)
        cx.emit(code, [io.x], [io.y], options, BlockSize=cx.scalar(1))
        io.finish()
    return convert


def _batch_to_space(cx: OpContext) -> None:
    io = _Io(cx, 2)
    cx.emit(BO.BATCH_TO_SPACE_ND, [io.x, cx.t(1), cx.ints([[0, 0], [0, 0]])], [io.y])
    io.finish()


def _space_to_batch(cx: OpContext) -> None:
    io = _Io(cx, 3)
    cx.emit(BO.SPACE_TO_BATCH_ND, [io.x, cx.t(1), cx.t(2)], [io.y])
    io.finish()


def _resize(code: int, options: str) -> Converter:
    def convert(cx: OpContext) -> None:
        io = _Io(cx, 3)
        cx.emit(code, [io.x, cx.ints(io.out_shape[1:3])], [io.y], options,
                AlignCorners=bool(cx.scalar(4, False)),
                HalfPixelCenters=bool(cx.scalar(5, False)))
        io.finish()
    return convert


CONVERTERS.update(
    DEPTH_TO_SPACE=_block(BO.DEPTH_TO_SPACE, "DepthToSpaceOptions"),
    SPACE_TO_DEPTH=_block(BO.SPACE_TO_DEPTH, "SpaceToDepthOptions"),
    BATCH_TO_SPACE_ND=_batch_to_space, SPACE_TO_BATCH_ND=_space_to_batch,
    RESIZE_BILINEAR=_resize(BO.RESIZE_BILINEAR, "ResizeBilinearOptions"),
    RESIZE_NEAREST_NEIGHBOR=_resize(BO.RESIZE_NEAREST_NEIGHBOR,
                                    "ResizeNearestNeighborOptions"))


# ---- the rest ------------------------------------------------------------------------------------

def _elu(cx: OpContext) -> None:
    alpha = float(cx.scalar(1))
    if alpha == 1.0:
        cx.emit(BO.ELU, [cx.t(0)], [cx.o()])
        return
    # TFLite's ELU has alpha 1: max(x, 0) + alpha * min(ELU(x), 0) is the HAL's formula.
    x, shape = cx.t(0), cx.shape(0)
    elu, neg, scaled, pos = (cx.temp(shape, x) for _ in range(4))
    zero = cx.w.constant(np.float32(0), None, f"z{len(cx.w.sg.tensors)}", TT.FLOAT32)
    cx.emit(BO.ELU, [x], [elu])
    cx.emit(BO.MINIMUM, [elu, zero], [neg])
    cx.emit(BO.MUL, [neg, cx.w.constant(np.float32(alpha), None, f"a{len(cx.w.sg.tensors)}",
                                        TT.FLOAT32)], [scaled], "MulOptions",
            FusedActivationFunction=0)
    cx.emit(BO.RELU, [x], [pos])
    cx.emit(BO.ADD, [pos, scaled], [cx.o()], "AddOptions", FusedActivationFunction=0)


#: HAL LSH_PROJECTION type -> TFLite LSHProjectionType (1 is the deprecated sparse hashing).
_LSH = {2: tflite.LSHProjectionType.DENSE, 3: tflite.LSHProjectionType.SPARSE}


def _lsh(cx: OpContext) -> None:
    kind = cx.scalar(3)
    if kind not in _LSH:
        raise Refuse(f"projection type {kind} has no TFLite equivalent")
    inputs = [cx.t(0), cx.t(1)] + ([cx.t(2)] if cx.present(2) else [])
    cx.emit(BO.LSH_PROJECTION, inputs, [cx.o()], "LSHProjectionOptions", Type=_LSH[kind])


def _if(cx: OpContext) -> None:
    then_, else_ = cx.subgraph(1), cx.subgraph(2)
    cx.emit(BO.IF, [cx.t(0)] + [cx.t(j) for j in range(3, cx.n)],
            [cx.o(k) for k in range(len(cx.outs))], "IfOptions",
            ThenSubgraphIndex=then_, ElseSubgraphIndex=else_)


def _while(cx: OpContext) -> None:
    # The HAL body outputs the m outputs and k state-only values; input-only operands follow.
    body_ref = int(np.asarray(cx.info(1).value).reshape(-1)[0])
    carried = len(cx.w.ex.referenced[body_ref].outputs)
    extra = cx.n - 2 - carried  # input-only operands: TFLite's WHILE carries them too
    cond, body = cx.subgraph(0), cx.subgraph(1, extra)
    outs = [cx.o(k) for k in range(len(cx.outs))]
    outs += [cx.temp(cx.shape(j), cx.t(j)) for j in range(2 + len(cx.outs), cx.n)]
    cx.emit(BO.WHILE, [cx.t(j) for j in range(2, cx.n)], outs, "WhileOptions",
            CondSubgraphIndex=cond, BodySubgraphIndex=body)


def _stateful(cx: OpContext) -> None:
    raise Refuse("not exported yet: its 61 operands (four states, auxiliary inputs) are "
                 "not mapped onto TFLite's 48")


def _states(cx: OpContext, inputs: list[int]) -> list[int]:
    """TFLite's recurrent kernels update their state in place (variable tensors); the HAL
    passes it in as an operand. A state that is a model input becomes such a variable."""
    out = []
    for j in inputs:
        if cx.info(j).lifetime != OperandLifeTime.SUBGRAPH_INPUT:
            raise Refuse(f"its state (input {j}) is not a model input, and TFLite keeps the "
                         f"state in a variable tensor")
        t = cx.t(j)
        cx.w.sg.tensors[t].is_variable = True
        out.append(t)
    return out


def _state_out(cx: OpContext, state: int, k: int) -> None:
    """HAL output ``k`` is the state after the operation: a copy of the variable tensor."""
    if k < len(cx.outs):
        shape = cx.out_shape(k)
        cx.emit(BO.RESHAPE, [state, cx.ints(shape)], [cx.o(k)], "ReshapeOptions",
                NewShape=shape)


def _rnn(cx: OpContext) -> None:
    (state,) = _states(cx, [4])
    out = cx.o(1)
    cx.emit(BO.RNN, [cx.t(0), cx.t(1), cx.t(2), cx.t(3), state], [out], "RNNOptions",
            FusedActivationFunction=_act(cx, 5))
    _state_out(cx, state, 0)


def _sequence_rnn(cx: OpContext) -> None:
    (state,) = _states(cx, [4])
    cx.emit(BO.UNIDIRECTIONAL_SEQUENCE_RNN, [cx.t(0), cx.t(1), cx.t(2), cx.t(3), state],
            [cx.o(0)], "SequenceRNNOptions", FusedActivationFunction=_act(cx, 5),
            TimeMajor=bool(cx.scalar(6)))
    _state_out(cx, state, 1)


def _bidirectional_rnn(cx: OpContext) -> None:
    fw, bw = _states(cx, [4, 8])
    merged = bool(cx.scalar(14))
    outputs = 1 if merged else 2
    ins = [cx.t(j) for j in range(4)] + [fw] + [cx.t(j) for j in range(5, 8)] + [bw]
    ins += [cx.t(j) for j in range(9, 12)]
    cx.emit(BO.BIDIRECTIONAL_SEQUENCE_RNN, ins, [cx.o(k) for k in range(outputs)],
            "BidirectionalSequenceRNNOptions", TimeMajor=bool(cx.scalar(13)),
            FusedActivationFunction=_act(cx, 12), MergeOutputs=merged)
    _state_out(cx, fw, outputs)
    _state_out(cx, bw, outputs + 1)


def _svdf(cx: OpContext) -> None:
    (state,) = _states(cx, [4])
    cx.emit(BO.SVDF, [cx.t(0), cx.t(1), cx.t(2), cx.t(3), state], [cx.o(1)], "SVDFOptions",
            Rank=cx.scalar(5), FusedActivationFunction=_act(cx, 6))
    _state_out(cx, state, 0)


def _lstm_act(cx: OpContext, j: int) -> int:
    """The LSTM activation is already TFLite's ActivationFunctionType (4 = tanh), not a
    FuseCode; the HAL's 6 (sigmoid) has no TFLite value."""
    v = cx.scalar(j)
    if v not in (0, 1, 2, 3, 4):
        raise Refuse(f"LSTM activation {v} has no TFLite equivalent")
    return int(v)


def _lstm_inputs(cx: OpContext, norms: int) -> list[int]:
    """The 24 TFLite LSTM inputs: the HAL's first 20 (same order), then the layer norms."""
    out_state, cell_state = _states(cx, [18, 19])
    ins = [cx.t(j) for j in range(18)] + [out_state, cell_state]
    return ins + [cx.t(j) if cx.present(j) else -1 for j in range(norms, norms + 4)]


def _lstm(cx: OpContext) -> None:
    ins = _lstm_inputs(cx, 23)
    cx.emit(BO.LSTM, ins, [cx.o(3)], "LSTMOptions", FusedActivationFunction=_lstm_act(cx, 20),
            CellClip=float(cx.scalar(21)), ProjClip=float(cx.scalar(22)), KernelType=0)
    # The scratch buffer's contents are the driver's own: zeros here.
    cx.emit(BO.FILL, [cx.ints(cx.out_shape(0)), cx.w.constant(np.float32(0), None,
                                                                f"z{len(cx.w.sg.tensors)}",
                                                                TT.FLOAT32)], [cx.o(0)])
    _state_out(cx, ins[18], 1)
    _state_out(cx, ins[19], 2)


def _sequence_lstm(cx: OpContext) -> None:
    ins = _lstm_inputs(cx, 24)
    cx.emit(BO.UNIDIRECTIONAL_SEQUENCE_LSTM, ins, [cx.o(0)],
            "UnidirectionalSequenceLSTMOptions", FusedActivationFunction=_lstm_act(cx, 20),
            CellClip=float(cx.scalar(21)), ProjClip=float(cx.scalar(22)),
            TimeMajor=bool(cx.scalar(23)))
    _state_out(cx, ins[18], 1)
    _state_out(cx, ins[19], 2)


CONVERTERS.update(RNN=_rnn, UNIDIRECTIONAL_SEQUENCE_RNN=_sequence_rnn, SVDF=_svdf,
                  BIDIRECTIONAL_SEQUENCE_RNN=_bidirectional_rnn,
                  LSTM=_lstm, UNIDIRECTIONAL_SEQUENCE_LSTM=_sequence_lstm, ELU=_elu,
                  LSH_PROJECTION=_lsh, IF=_if, WHILE=_while)
for _name in ("BIDIRECTIONAL_SEQUENCE_LSTM",):
    CONVERTERS[_name] = _stateful
