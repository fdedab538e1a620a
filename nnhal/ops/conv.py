"""Convolutions and dense layers: CONV_2D, DEPTHWISE_CONV_2D, GROUPED_CONV_2D,
TRANSPOSE_CONV_2D and FULLY_CONNECTED.

Every forward convolution is run as a grouped convolution over NHWC data: CONV_2D is one
group, DEPTHWISE_CONV_2D one group per input channel (engines in :mod:`nnhal.ops.conv_engine`,
writing into the output or a per-thread scratch accumulator). Float models accumulate in
float32, as TFLite and the NNAPI CPU executor do. Quantized models sum exact integers: in
float32 when the bound ``terms * max|input - zp| * max|filter - zp|`` stays below 2**24 (every
partial sum is then an exact float32 integer, in any BLAS order), else in float64 (exact below
2**53). TRANSPOSE_CONV_2D still accumulates in float64 into a fresh array.
Quantized results then go through the reference fixed-point requantisation: the multiplier is
``float32(input_scale * filter_scale) / output_scale`` in double precision, per output channel
for TENSOR_QUANT8_SYMM_PER_CHANNEL filters.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops import native as _native
from nnhal.ops.conv_engine import (
    ConvWeights,
    Requantizer,
    conv_into,
    conv_weights,
    exact_dtype,
    float_epilogue_into,
    padded_input,
    scratch,
)
from nnhal.ops.resolver import (
    OpContext,
    OperandInfo,
    OperationDef,
    OpError,
    Shape,
    elements,
    register,
    visits,
)
from nnhal.ops.signature import V1_0, V1_2, V1_3, Slot, sig, variants

T = OperandType
O = OperationType

PAD_SAME, PAD_VALID = 1, 2
_PER_CHANNEL = T.TENSOR_QUANT8_SYMM_PER_CHANNEL


# ---- signatures ------------------------------------------------------------------------------

_F32, _F16, _I32 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32
_Q8, _Q8S = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED
# T: input and output, F: filter (or weights), B: bias.
_FLOAT32 = {"T": _F32, "F": _F32, "B": _F32}
_FLOAT16 = {"T": _F16, "F": _F16, "B": _F16}
_QUANT8 = {"T": _Q8, "F": _Q8, "B": _I32}
_QUANT8_PC = {"T": _Q8, "F": _PER_CHANNEL, "B": _I32}
_SIGNED = {"T": _Q8S, "F": _Q8S, "B": _I32}
_SIGNED_PC = {"T": _Q8S, "F": _PER_CHANNEL, "B": _I32}
#: CONV_2D and DEPTHWISE_CONV_2D (HAL 1.0 operations).
_CONV_VARIANTS = [*variants(V1_0, _FLOAT32, _QUANT8), *variants(V1_2, _FLOAT16, _QUANT8_PC),
                  *variants(V1_3, _SIGNED, _SIGNED_PC)]
#: GROUPED_CONV_2D and TRANSPOSE_CONV_2D (HAL 1.2 operations).
_CONV_VARIANTS_1_2 = [*variants(V1_2, _FLOAT32, _FLOAT16, _QUANT8, _QUANT8_PC),
                      *variants(V1_3, _SIGNED, _SIGNED_PC)]


def _head(filter_doc: str) -> list[Slot]:
    return [Slot("input", "T", doc="4-D, [batches, height, width, depth_in]"),
            Slot("filter", "F", doc=filter_doc),
            Slot("bias", "B", doc="[depth_out]; INT32 with a quantized input")]


_PADS = [Slot("pad_left", T.INT32), Slot("pad_right", T.INT32), Slot("pad_top", T.INT32),
         Slot("pad_bottom", T.INT32)]
_SCHEME = [Slot("padding_scheme", T.INT32, doc="0 NONE, 1 SAME, 2 VALID")]
_STRIDES = [Slot("stride_w", T.INT32), Slot("stride_h", T.INT32)]
_ACTIVATION = Slot("activation", T.INT32, doc="fused activation (FuseCode)")
_NCHW = Slot("nchw", T.BOOL, doc="NCHW data layout")
#: Trailing layout and dilation inputs of CONV_2D and DEPTHWISE_CONV_2D: absent or omitted
#: means NHWC and no dilation. Dilation factors are given in pairs (checked by validate).
_LAYOUT_DILATION = [
    Slot("nchw", T.BOOL, optional=True, omittable=True, since=V1_2, doc="NCHW data layout"),
    Slot("dilation_w", T.INT32, optional=True, omittable=True, since=V1_2, doc="default 1"),
    Slot("dilation_h", T.INT32, optional=True, omittable=True, since=V1_2, doc="default 1")]
_OIHW = "[depth_out, filter_height, filter_width, depth_in]"
_MULTIPLIER = [Slot("depth_multiplier", T.INT32, doc="depth_out / depth_in")]
_GROUPS = [Slot("groups", T.INT32)]

SIGNATURES = [
    sig(O.CONV_2D, {
        "explicit": [*_head(_OIHW), *_PADS, *_STRIDES, _ACTIVATION, *_LAYOUT_DILATION],
        "implicit": [*_head(_OIHW), *_SCHEME, *_STRIDES, _ACTIVATION, *_LAYOUT_DILATION],
    }, [Slot("output", "T")], _CONV_VARIANTS),
    sig(O.DEPTHWISE_CONV_2D, {
        "explicit": [*_head("[1, filter_height, filter_width, depth_out]"), *_PADS, *_STRIDES,
                     *_MULTIPLIER, _ACTIVATION, *_LAYOUT_DILATION],
        "implicit": [*_head("[1, filter_height, filter_width, depth_out]"), *_SCHEME,
                     *_STRIDES, *_MULTIPLIER, _ACTIVATION, *_LAYOUT_DILATION],
    }, [Slot("output", "T")], _CONV_VARIANTS),
    sig(O.GROUPED_CONV_2D, {
        "explicit": [*_head("[depth_out, filter_height, filter_width, depth_group]"), *_PADS,
                     *_STRIDES, *_GROUPS, _ACTIVATION, _NCHW],
        "implicit": [*_head("[depth_out, filter_height, filter_width, depth_group]"),
                     *_SCHEME, *_STRIDES, *_GROUPS, _ACTIVATION, _NCHW],
    }, [Slot("output", "T")], _CONV_VARIANTS_1_2),
    sig(O.TRANSPOSE_CONV_2D, {
        "explicit": [*_head(_OIHW), *_PADS, *_STRIDES, _ACTIVATION, _NCHW],
        "implicit": [*_head(_OIHW),
                     Slot("output_shape", T.TENSOR_INT32, doc="1-D, 4 elements"),
                     *_SCHEME, *_STRIDES, _ACTIVATION, _NCHW],
    }, [Slot("output", "T")], _CONV_VARIANTS_1_2),
    sig(O.FULLY_CONNECTED, [
        Slot("input", "T", doc="rank 2 to 4, flattened to [batch_size, input_size]"),
        Slot("weights", "F", doc="[num_units, input_size]"),
        Slot("bias", "B", doc="[num_units]; INT32 with a quantized input"),
        _ACTIVATION,
    ], [Slot("output", "T", doc="[batch_size, num_units]")],
        [*variants(V1_0, _FLOAT32, _QUANT8), *variants(V1_2, _FLOAT16),
         *variants(V1_3, _SIGNED)]),
]


# ---- padding and output sizes ---------------------------------------------------------------

def explicit_padding(in_size: int, stride: int, dilation: int, filter_size: int, code: int,
                     transpose: bool = False) -> tuple[int, int]:
    """(head, tail) padding of an implicit padding scheme.

    For TRANSPOSE_CONV_2D ``in_size`` is the requested output size and the tail is made to
    fit the last stride exactly, so it may be negative.
    """
    head = tail = 0
    if code == PAD_SAME:
        effective = (filter_size - 1) * dilation + 1
        out = (in_size + stride - 1) // stride
        needed = (out - 1) * stride + effective - in_size
        if needed > 0:
            head = needed // 2
            tail = needed - head
        if transpose:
            tail = needed - head
    return head, tail


def _cdiv(a: int, b: int) -> int:
    """C integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def conv_out_size(in_size: int, filter_size: int, stride: int, dilation: int, head: int,
                  tail: int) -> int:
    effective = (filter_size - 1) * dilation + 1
    return _cdiv(in_size - effective + stride + head + tail, stride)


def transpose_conv_out_size(in_size: int, filter_size: int, stride: int, head: int,
                            tail: int) -> int:
    return in_size * stride + filter_size - stride - head - tail


# ---- operand signatures ----------------------------------------------------------------------

@dataclass(frozen=True)
class _Layout:
    """Input index of every parameter in one signature of a convolution (None: absent)."""

    implicit: bool
    pad: tuple[int, ...]  # (code,) or (left, right, top, bottom)
    stride_w: int
    stride_h: int
    act: int
    extra: int | None  # depth multiplier or number of groups
    nchw: int | None
    dil_w: int | None
    dil_h: int | None
    out_shape: int | None  # TRANSPOSE_CONV_2D output shape tensor

    @functools.cached_property
    def params(self) -> tuple[int, ...]:
        """Indexes of every parameter input present (all inputs after the bias)."""
        return tuple(i for i in (*self.pad, self.stride_w, self.stride_h, self.act, self.extra,
                                 self.nchw, self.dil_w, self.dil_h, self.out_shape)
                     if i is not None)


@functools.lru_cache(maxsize=64)  # a handful of signatures; layouts are immutable
def _make_layout(n: int, implicit: bool, has_extra: bool, out_shape: bool = False) -> _Layout:
    i = 3
    oshape = None
    if out_shape:
        oshape, i = i, i + 1
    if implicit:
        pad, i = (i,), i + 1
    else:
        pad, i = (i, i + 1, i + 2, i + 3), i + 4
    sw, sh, i = i, i + 1, i + 2
    extra = None
    if has_extra:
        extra, i = i, i + 1
    act, i = i, i + 1
    nchw = i if n > i else None
    dw, dh = (i + 1, i + 2) if n > i + 2 else (None, None)
    return _Layout(implicit, pad, sw, sh, act, extra, nchw, dw, dh, oshape)


@dataclass
class _Args:
    """Scalar parameters of one convolution; None where not known yet (validate time)."""

    code: int | None = None
    pads: tuple[Any, Any, Any, Any] | None = None  # left, right, top, bottom
    stride: tuple[Any, Any] = (None, None)  # height, width
    dilation: tuple[Any, Any] = (1, 1)
    extra: int | None = None
    act: int | None = None
    nchw: bool | None = False
    out_shape: np.ndarray | None = None


def _resolve(layout: _Layout, values: Sequence[Any]) -> _Args:
    """The parameters from ``values`` (one per input: a value, None when unknown, or
    ``_OMITTED``; see _static_values and _run_values)."""
    def scalar(i: int | None, default: Any = None, cast: Callable = int) -> Any:
        if i is None:
            return default
        v = values[i]
        if v is None:
            return None
        if v is _OMITTED:
            return default
        return cast(v.item() if isinstance(v, np.ndarray) else np.asarray(v).item())

    a = _Args()
    if layout.implicit:
        a.code = scalar(layout.pad[0])
    else:
        a.pads = tuple(scalar(i) for i in layout.pad)  # type: ignore[assignment]
    a.stride = (scalar(layout.stride_h), scalar(layout.stride_w))
    a.dilation = (scalar(layout.dil_h, 1), scalar(layout.dil_w, 1))
    a.extra = scalar(layout.extra)
    a.act = scalar(layout.act)
    a.nchw = scalar(layout.nchw, False, bool)
    if layout.out_shape is not None:
        v = values[layout.out_shape]
        a.out_shape = None if v is None or v is _OMITTED else np.asarray(v)
    return a


def _check_args(a: _Args, transpose: bool = False) -> None:
    """Range checks of the parameters that are known; raises OpError."""
    if a.code is not None and a.code not in (0, PAD_SAME, PAD_VALID):
        raise OpError(f"invalid implicit padding scheme {a.code}")
    # Loops rather than any(generator): a convolution's analysis runs this once.
    if a.pads is not None:
        for p in (a.pads[0], a.pads[2]) if transpose else a.pads:
            if p is not None and p < 0:
                raise OpError(f"negative padding {a.pads}")
    for s in a.stride:
        if s is not None and s <= 0:
            raise OpError(f"strides must be positive, got {a.stride}")
    for d in a.dilation:
        if d is not None and d <= 0:
            raise OpError(f"dilation factors must be positive, got {a.dilation}")
    if a.extra is not None and a.extra <= 0:
        raise OpError(f"depth multiplier / group count must be positive, got {a.extra}")
    if a.act is not None and a.act not in (0, 1, 2, 3):  # an int already: no array made
        C.activation_code(a.act)
    if a.out_shape is not None and a.out_shape.shape != (4,):
        raise OpError("output shape must be a 1-D tensor of 4 elements")


def _known(*values: Any) -> bool:
    return all(v is not None for v in values)


_OMITTED = object()


def _static_values(ctx: OpContext) -> list[Any]:
    """Per input: its constant value, None when only known at run time, or _OMITTED."""
    return [_OMITTED if info.omitted else (info.value if info.is_const else None)
            for info in ctx.inputs]


def _run_values(omitted: Sequence[bool], ins: Sequence[Any]) -> list[Any]:
    """Per input: its run-time value, or _OMITTED."""
    return [_OMITTED if o else v for o, v in zip(omitted, ins)]


# ---- quantization ----------------------------------------------------------------------------

def scale_product(input_scale: float, filter_scale: float) -> float:
    """input_scale * filter_scale rounded to float32, as the reference computes it."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.float32(input_scale) * np.float32(filter_scale))


def conv_multiplier(input_scale: float, filter_scale: float, output_scale: float) -> float:
    """Real requantisation multiplier: float32 scale product over the output scale, in double."""
    return scale_product(input_scale, filter_scale) / float(np.float32(output_scale))


def conv_multipliers(input_scale: float, filter_scales: Any, output_scale: float
                     ) -> np.ndarray:
    """:func:`conv_multiplier` of each filter scale at once (float64; the same values: the
    products are float32 products either way, the division float64)."""
    with np.errstate(over="ignore", under="ignore"):
        products = np.float32(input_scale) * np.asarray(filter_scales, dtype=np.float32)
    return products.astype(np.float64) / float(np.float32(output_scale))


class ConvRequant:
    """int32 accumulator (+ bias) -> quantized output, per tensor or per output channel."""

    def __init__(self, inp: OperandInfo, filt: OperandInfo, out: OperandInfo):
        if filt.type == _PER_CHANNEL:
            scales = np.asarray(filt.channel_scales, dtype=np.float32)
        else:
            scales = np.asarray([filt.scale], dtype=np.float32)
        pairs = [C.quantize_multiplier(conv_multiplier(inp.scale, float(s), out.scale))
                 for s in scales]
        self.multiplier = np.array([p[0] for p in pairs], dtype=np.int64)
        self.shift = np.array([p[1] for p in pairs], dtype=np.int64)
        if len(pairs) == 1:
            self.multiplier = self.multiplier.reshape(())
            self.shift = self.shift.reshape(())
        self.out = out
        self.fast = Requantizer(self.multiplier, self.shift, out.zero_point)

    def into(self, acc: np.ndarray, bias: np.ndarray, act: int, dst: np.ndarray,
             bound: int | None = None) -> None:
        """Requantise an exact integer-valued accumulator (float32 or float64) plus the int32
        bias into ``dst`` (any layout of the output's shape). ``bound`` is the largest
        magnitude the accumulator can have (None: unknown), which decides whether the fast
        routes, exact only where sum + bias stays in int32, may run."""
        out = self.out
        lo, hi = C.quant_activation_range(act, out.scale, out.zero_point, out.type)
        if self.fast.into(acc, bias, lo, hi, dst, bound):
            return
        total = acc.astype(np.int64)
        total += bias.astype(np.int64)
        r = C.requantize_int32_sum(total, self.multiplier, self.shift)
        r += out.zero_point
        np.clip(r, lo, hi, out=r)
        np.copyto(dst, r, casting="unsafe")

    def __call__(self, total: np.ndarray, act: int) -> np.ndarray:
        """The output of ``total`` (the exact int64 sum plus the bias)."""
        out = self.out
        lo, hi = C.quant_activation_range(act, out.scale, out.zero_point, out.type)
        r = C.requantize_int32_sum(total, self.multiplier, self.shift)
        return np.clip(r + out.zero_point, lo, hi).astype(out.type.dtype)


def _check_quant(ctx: OpContext, channel_dim: int | None) -> None:
    """Quantization rules of a convolution-like operation (the signature fixed the types).

    ``channel_dim`` is where a per-channel filter keeps its output channels.
    """
    if ctx.inputs[0].type in C.FLOAT_TYPES:
        return
    inp, filt, bias, out = ctx.inputs[0], ctx.inputs[1], ctx.inputs[2], ctx.outputs[0]
    per_channel = filt.type == _PER_CHANNEL
    ctx.require(inp.scale > 0 and out.scale > 0, "quantized scales must be positive")
    if per_channel:
        ctx.require(filt.channel_scales is not None, "per-channel filter without scales")
        ctx.require(filt.channel_dim == channel_dim,
                    f"per-channel filter must have channelDim {channel_dim}")
        scales = np.asarray(filt.channel_scales)
        # Every scale positive: the smallest is (NaN fails, as it fails every comparison).
        ctx.require(scales.size == 0 or bool(scales.min() > 0),
                    "per-channel scales must be positive")
        channels = ctx.dim(1, channel_dim) if channel_dim is not None else None
        if channels is not None:
            ctx.require(len(scales) == channels,
                        "per-channel scale count does not match the filter")
        largest = float(scales.max()) if scales.size else None
    else:
        product = scale_product(inp.scale, filt.scale)
        ctx.require(product > 0, "filter scale must be positive")
        ctx.require(abs(product - bias.scale) <= 1e-6 * min(product, bias.scale),
                    "bias scale must equal input_scale * filter_scale")
        largest = float(filt.scale)
    # Every multiplier in range: the largest is, the one of the largest filter scale (each is
    # a float32 product then a division by the same number, both monotonic). An output scale
    # that is 0 in float32 makes them infinite (or NaN): out of range.
    if largest is not None:
        out32 = float(np.float32(out.scale))
        ctx.require(out32 > 0 and scale_product(inp.scale, largest) / out32 < 2.0**31,
                    "requantisation multiplier out of range")


# ---- numeric engines (NHWC, float64) ------------------------------------------------------------

@dataclass
class _Weights:
    """A filter reshaped for the engine that runs it."""

    groups: int
    kh: int
    kw: int
    cout: int
    mat: np.ndarray  # see _prepare_weights


def _tap_rows(n_in: int, stride: int, offset: int, n_out: int) -> tuple[int, int]:
    """Input indices ``r`` (first, last) whose output ``r * stride + offset`` lies in
    ``[0, n_out)``; last < first when there is none."""
    first = max(0, -(offset // stride))  # ceil(-offset / stride), at least 0
    last = min(n_in - 1, (n_out - 1 - offset) // stride)
    return first, last


def _transpose_conv(x: np.ndarray, wts: _Weights, stride: tuple[int, int],
                    pads: tuple[int, int, int, int], out_hw: tuple[int, int]) -> np.ndarray:
    """x: [N, H, W, C] float64, pads (top, bottom, left, right) -> [N, OH, OW, depth_out].

    Each input pixel scatters ``kh * kw`` filter taps into the output; the taps of every pixel
    come from one matrix product, then each tap adds the input rows and columns that land
    inside the output window with a strided slice. Only the output window is ever allocated,
    so the cost does not grow with the stride or the padding.
    """
    n, h, w, c = x.shape
    kh, kw, cout = wts.kh, wts.kw, wts.cout
    sh, sw = stride
    top, _, left, _ = pads
    oh, ow = out_hw
    y = (x.reshape(-1, c) @ wts.mat).reshape(n, h, w, kh, kw, cout)
    out = np.zeros((n, oh, ow, cout))
    for i in range(kh):
        r0, r1 = _tap_rows(h, sh, i - top, oh)
        if r1 < r0:
            continue
        o_r = r0 * sh + i - top
        for j in range(kw):
            c0, c1 = _tap_rows(w, sw, j - left, ow)
            if c1 < c0:
                continue
            o_c = c0 * sw + j - left
            out[:, o_r: o_r + (r1 - r0) * sh + 1: sh, o_c: o_c + (c1 - c0) * sw + 1: sw, :] += \
                y[:, r0: r1 + 1, c0: c1 + 1, i, j]
    return out


# ---- the convolution operations ---------------------------------------------------------------

def _centred_filter(filt: np.ndarray, info: OperandInfo) -> np.ndarray:
    """A filter's values to multiply: floats as float32, quantized values minus their zero
    point as exact integers (int32)."""
    if info.type in C.FLOAT_TYPES:
        return np.asarray(filt, dtype=np.float32)
    zp = 0 if info.type == _PER_CHANNEL else info.zero_point
    return np.asarray(filt, dtype=np.int32) - np.int32(zp)


def input_bound(info: OperandInfo) -> int:
    """Largest magnitude of a quantized input's stored value minus its zero point."""
    lo, hi = C.qrange(info.type)
    return max(info.zero_point - lo, hi - info.zero_point)


def _as_real(x: np.ndarray, info: OperandInfo) -> np.ndarray:
    """Float64 values to accumulate: floats as is, quantized values minus their zero point."""
    if info.type in C.FLOAT_TYPES:
        return x.astype(np.float64)
    zp = 0 if info.type == _PER_CHANNEL else info.zero_point
    return x.astype(np.float64) - zp


def _finish(acc: np.ndarray, bias: np.ndarray, act: int, out: OperandInfo,
            requant: ConvRequant | None) -> np.ndarray:
    """Add the bias, apply the activation and convert to the output type."""
    if requant is None:
        r = acc + bias.astype(np.float64)
        lo, hi = C.float_activation_bounds(act)
        if act != C.ACT_NONE:
            np.clip(r, lo, hi, out=r)
        return r.astype(out.type.dtype)
    total = np.rint(acc).astype(np.int64) + bias.astype(np.int64)
    return requant(total, act)


class _CoreKernels(OperationDef):
    """Both kernels from one bound core: ``_core(ctx)(ins, dst)`` writes into ``dst`` (a new
    array when None) and returns it."""

    def _core(self, ctx: OpContext) -> Callable[[Sequence[Any], np.ndarray | None],
                                                np.ndarray]:  # pragma: no cover
        raise NotImplementedError

    def kernel(self, ctx: OpContext):
        core = self._core(ctx)
        return lambda ins, rt: [core(ins, None)]

    def kernel_into(self, ctx: OpContext):
        core = self._core(ctx)

        def run_into(ins, outs, rt) -> None:
            core(ins, outs[0])

        return run_into


class _ConvBase(_CoreKernels):
    """Shared validate/prepare/kernel of the four convolutions."""

    #: Per-channel filters keep output channels in this dimension.
    channel_dim = 0
    transpose = False

    # -- per-operation hooks --
    def layout(self, ctx: OpContext) -> _Layout:
        raise NotImplementedError

    def filter_geometry(self, fshape: Sequence[int]) -> tuple[int, int, int]:
        """(depth_out, kh, kw) from the filter shape."""
        return fshape[0], fshape[1], fshape[2]

    def check_channels(self, ctx_fail: Callable[[str], OpError], cin: int,
                       fshape: Sequence[int], a: _Args) -> None:
        """Raise when input channels and filter disagree (dims are known and > 0)."""
        if fshape[3] and cin and fshape[3] != cin:
            raise ctx_fail(f"filter depth {fshape[3]} does not match input depth {cin}")

    # -- shared logic --
    def _run_args(self, layout: _Layout, static: _Args | None, omitted: Sequence[bool],
                  requant: Any, ins: Sequence[Any]) -> tuple:
        """What a run needs before computing, each checked against the run's own operands
        (``static``: the parameters when all are constants, else read from ``ins``): the
        parameters, the input in NHWC, batch, output depth, paddings and output size."""
        name = self.op_type.name
        if static is not None:
            a = static
        else:
            a = _resolve(layout, _run_values(omitted, ins))
            _check_args(a, self.transpose)
        x = ins[0]
        if x.ndim != 4 or ins[1].ndim != 4 or ins[2].ndim != 1:
            raise OpError(f"{name}: bad input ranks")
        if a.nchw:
            x = x.transpose(0, 2, 3, 1)
        n, h, w, cin = x.shape
        if h <= 0 or w <= 0 or cin <= 0:
            raise OpError(f"{name}: input dims must be positive, got {ins[0].shape}")
        fshape = ins[1].shape
        self.check_channels(lambda m: OpError(f"{name}: {m}"), cin, fshape, a)
        cout, kh, kw = self.filter_geometry(fshape)
        if min(fshape) <= 0 or ins[2].shape[0] != cout or (
                requant is not None and requant.multiplier.size not in (1, cout)):
            raise OpError(f"{name}: filter/bias shape mismatch")
        geo = self.geometry(a, h, w, kh, kw)
        if geo is None:  # pragma: no cover - every parameter is known at run time
            raise OpError(f"{name}: unknown parameters")
        return a, x, n, cout, *geo

    def _common_validate(self, ctx: OpContext) -> _Layout:
        layout = self.layout(ctx)
        _check_quant(ctx, self.channel_dim)
        for i, r in ((0, 4), (1, 4), (2, 1)):
            ctx.expect_rank(i, r)
        ctx.expect_rank(0, 4, output=True)
        if layout.out_shape is not None:
            ctx.expect_rank(layout.out_shape, 1)
        return layout

    def validate(self, ctx: OpContext) -> None:
        self._validated(ctx)

    def validate_and_prepare(self, ctx: OpContext) -> list[Shape]:
        return [self._validated(ctx)]  # validate infers what prepare would

    def _validated(self, ctx: OpContext) -> tuple[int, ...]:
        """Every rule checked; the inferred output shape (prepare's)."""
        layout = self._common_validate(ctx)
        a = _resolve(layout, _static_values(ctx))
        try:
            _check_args(a, self.transpose)
        except OpError as e:
            raise ctx.fail(str(e)) from None
        return self._infer(ctx, a)

    def _infer(self, ctx: OpContext, a: _Args) -> tuple[int, ...]:
        """Output shape with 0 for unknown dims; raises OpError on inconsistent shapes."""
        ishape = ctx.inputs[0].shape
        fshape = ctx.inputs[1].shape
        bshape = ctx.inputs[2].shape
        cout = kh = kw = 0
        if fshape is not None:
            cout, kh, kw = self.filter_geometry(fshape)
            if bshape is not None and bshape[0] and cout and bshape[0] != cout:
                raise ctx.fail(f"bias has {bshape[0]} elements, expected {cout}")
        elif bshape is not None:
            cout = bshape[0]
        if ishape is None or a.nchw is None:
            return (0, 0, 0, 0) if a.nchw is None else self._order(0, 0, 0, cout, a.nchw)
        n, h, w, cin = (ishape[0], ishape[2], ishape[3], ishape[1]) if a.nchw else ishape
        if fshape is not None:
            try:
                self.check_channels(ctx.fail, cin, fshape, a)
            except OpError as e:
                raise ctx.fail(str(e)) from None
        out_hw = [0, 0]
        for dim, (size, k) in enumerate(((h, kh), (w, kw))):
            if size and k:
                try:
                    r = self.axis(a, dim, size, k)
                except OpError as e:
                    raise ctx.fail(str(e)) from None
                out_hw[dim] = 0 if r is None else r[2]
        return self._order(n, out_hw[0], out_hw[1], cout, a.nchw)

    @staticmethod
    def _order(n: int, h: int, w: int, c: int, nchw: bool) -> tuple[int, ...]:
        return (n, c, h, w) if nchw else (n, h, w, c)

    def geometry(self, a: _Args, h: int, w: int, kh: int, kw: int
                 ) -> tuple[tuple[int, int, int, int], tuple[int, int]] | None:
        """((top, bottom, left, right), (out_h, out_w)), or None if parameters are unknown."""
        rows = self.axis(a, 0, h, kh)
        cols = self.axis(a, 1, w, kw)
        if rows is None or cols is None:
            return None
        return (rows[0], rows[1], cols[0], cols[1]), (rows[2], cols[2])

    def axis(self, a: _Args, dim: int, size: int, k: int) -> tuple[int, int, int] | None:
        """(pad head, pad tail, output size) along height (dim 0) or width (dim 1)."""
        s, d = a.stride[dim], a.dilation[dim]
        if s is None or d is None:
            return None
        if a.pads is not None:
            head, tail = a.pads[2:] if dim == 0 else a.pads[:2]
            if head is None or tail is None:
                return None
        elif a.code is not None:
            head, tail = explicit_padding(size, s, d, k, a.code)
        else:
            return None
        effective = (k - 1) * d + 1
        if not (effective > head and effective > tail):
            raise OpError("padding must be smaller than the (dilated) filter")
        out = conv_out_size(size, k, s, d, head, tail)
        if out <= 0:
            raise OpError(f"empty output (size {out})")
        return head, tail, out

    def prepare(self, ctx: OpContext):
        a = _resolve(self.layout(ctx), _static_values(ctx))
        return [self._infer(ctx, a)]

    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        """Each output value sums :meth:`terms` products."""
        fshape = ctx.inputs[1].shape
        if fshape and len(fshape) == 4:  # unknown dimensions count as 1 (a known filter as is)
            terms = self.terms(fshape if min(fshape) > 0 else tuple(max(d, 1) for d in fshape))
        else:
            terms = 1
        return visits(ctx, outputs) + elements(outputs[0]) * terms

    # -- kernels --
    def terms(self, fshape: Sequence[int]) -> int:
        """Products summed per output value (bounds the exactness of float32 sums)."""
        return int(fshape[1] * fshape[2] * fshape[3])

    def groups(self, a: _Args, fshape: Sequence[int]) -> int:
        return 1

    def layout_filter(self, filt: np.ndarray) -> np.ndarray:
        """The filter as [depth_out, kh, kw, depth_group]."""
        return filt

    def weights(self, filt: np.ndarray, info: OperandInfo, a: _Args,
                inp: OperandInfo) -> ConvWeights:
        """The filter laid out for :func:`conv_into` in the compute dtype it decides."""
        centred = _centred_filter(filt, info)
        bound = None
        if info.type in C.FLOAT_TYPES:
            dtype: type = np.float32
        else:
            terms, largest = self.terms(filt.shape), int(np.abs(centred).max(initial=0))
            dtype = exact_dtype(terms, input_bound(inp), largest)
            bound = terms * input_bound(inp) * largest
        return conv_weights(self.layout_filter(centred), self.groups(a, filt.shape), dtype,
                            bound)

    def native_kernel(self, ctx: OpContext, cached: dict, a: _Args) -> Any:
        """The native float32 kernel of this operation with its constant filter (see
        :mod:`nnhal.ops.native`), or None where it does not apply or is not loaded."""
        return None

    def _native_ok(self, ctx: OpContext, a: _Args) -> bool:
        f32 = OperandType.TENSOR_FLOAT32
        return (ctx.inputs[0].type == f32 and ctx.outputs[0].type == f32
                and ctx.inputs[1].type == f32 and not a.nchw and a.act is not None
                and _native.library() is not None)

    def _core(self, ctx: OpContext) -> Callable[[Sequence[Any], np.ndarray | None], np.ndarray]:
        """The bound convolution: ``core(ins, dst)`` writes into ``dst`` (or a new array when
        None) and returns it."""
        layout = self.layout(ctx)
        inp, filt, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        quant = inp.type not in C.FLOAT_TYPES
        requant = ConvRequant(inp, filt, out) if quant else None
        zp_in = inp.zero_point if quant else 0
        odt = out.type.dtype
        values = _static_values(ctx)
        static = _resolve(layout, values)
        all_const = all(values[i] is not None for i in layout.params)
        omitted = tuple(v is _OMITTED for v in values)
        cache_weights = all_const and values[1] is not None
        cached: dict[str, Any] = {}
        if cache_weights:  # laid out once, at binding; a bad filter is reported at run time
            try:
                _check_args(static, self.transpose)
                cached["w"] = self.weights(np.asarray(values[1]), filt, static, inp)
            except (OpError, ValueError, ZeroDivisionError, TypeError):
                pass
        bias_tiles: dict | None = {} if ctx.const(2) is not None else None
        name = self.op_type.name
        nat = None
        if "w" in cached:  # the filter and every parameter are valid constants
            try:
                nat = self.native_kernel(ctx, cached, static)
            except (OpError, ValueError, TypeError, ZeroDivisionError, OverflowError):
                nat = None

        #: shapes (input, filter, bias) already checked on the native path -> (pads, output
        #: shape): a repeated call skips the Python checks and geometry (constant parameters)
        seen: dict[tuple, tuple] = {}

        def core(ins: Sequence[Any], dst: np.ndarray | None) -> np.ndarray:
            if seen and dst is not None:
                x = ins[0]
                hit = seen.get((x.shape, ins[1].shape, ins[2].shape))
                if hit is not None and dst.shape == hit[1] and nat.accepts(x, ins[2], dst):
                    nat(x, ins[2], dst, static.stride, static.dilation, hit[0])
                    return dst
            a, x, n, cout, pads, (oh, ow) = self._run_args(
                layout, static if all_const else None, omitted, requant, ins)
            shape = self._order(n, oh, ow, cout, bool(a.nchw))
            if dst is None:
                dst = np.empty(shape, odt)
            elif dst.shape != shape:
                raise OpError(f"{name}: output shape {dst.shape}, computed {shape}")
            if n == 0:
                return dst
            if nat is not None and not a.nchw and nat.accepts(x, ins[2], dst):
                nat(x, ins[2], dst, a.stride, a.dilation, pads)
                if all_const and len(seen) < 8:
                    seen[(x.shape, ins[1].shape, ins[2].shape)] = (pads, shape)
                return dst
            wts = cached.get("w")
            if wts is None:
                wts = self.weights(ins[1], filt, a, inp)
                if cache_weights:
                    cached["w"] = wts
            y = dst.transpose(0, 2, 3, 1) if a.nchw else dst
            direct = requant is None and y.dtype == wts.dtype and y.flags.c_contiguous
            acc = y if direct else scratch("acc", (n, oh, ow, cout), wts.dtype)
            conv_into(padded_input(x, pads, wts.dtype, zp_in), wts, a.stride, a.dilation, acc)
            if requant is not None:
                requant.into(acc, ins[2], a.act, y, wts.bound)
            else:
                float_epilogue_into(acc, ins[2], a.act, bias_tiles)
                if acc is not y:
                    np.copyto(y, acc, casting="unsafe")
            return dst

        return core

def _select(ctx: OpContext, implicit_n: int, explicit_n: int, has_extra: bool,
            out_shape: bool = False) -> _Layout:
    """The implicit or explicit padding layout of a convolution given ``n`` inputs.

    ``implicit_n`` and ``explicit_n`` count the inputs each form requires. Where trailing
    optional inputs make the counts overlap (CONV_2D with 10 inputs), the input at
    ``implicit_n`` decides: the implicit form's BOOL layout flag, the explicit form's INT32.
    """
    n = len(ctx.inputs)
    implicit = n < explicit_n or ctx.inputs[implicit_n].type == T.BOOL
    extra = n - (implicit_n if implicit else explicit_n)
    if extra == 2:
        raise ctx.fail("dilation factors for width and height must be given together")
    if extra not in (0, 1, 3):
        raise ctx.fail(f"unsupported number of inputs {n}")
    return _make_layout(n, implicit, has_extra, out_shape)


#: Up to this many input channels a float32 CONV_2D runs the native direct kernel instead of
#: a patch matrix and a GEMM (MobileNet's first layer, 224x224x3 -> 112x112x16).
NATIVE_DIRECT_MAX_C = 8


@register(O.CONV_2D)
class Conv2D(_ConvBase):
    def layout(self, ctx: OpContext) -> _Layout:
        return _select(ctx, 7, 10, has_extra=False)

    def native_kernel(self, ctx: OpContext, cached: dict, a: _Args) -> Any:
        filt = ctx.const(1)
        if filt is None or filt.ndim != 4:
            return None
        if ctx.inputs[0].type not in C.FLOAT_TYPES:
            return _native_q8_conv(ctx, filt, a)
        if filt.shape[3] > NATIVE_DIRECT_MAX_C or not self._native_ok(ctx, a):
            return None
        lo, hi = C.float_activation_bounds(a.act)
        return _native.ConvDirectF32(_native.library(), filt, lo, hi)


#: The native 8-bit CONV_2D (an int8 GEMM, bytes identical to the numpy path): "auto" binds
#: it where the kernels were compiled for AVX-512 VNNI or AVX2 (without either, its plain-C
#: loops are exact but slower than numpy's float32 GEMM), True everywhere the kernels load,
#: False never.
NATIVE_Q8_CONV: bool | str = "auto"


def _native_q8_fc(ctx: OpContext, weights: np.ndarray, act: int) -> Any:
    """An 8-bit FULLY_CONNECTED as the native 1x1 convolution of [batch, 1, 1, input_size]
    (:class:`nnhal.ops.native.ConvQ8`), or None."""
    if NATIVE_Q8_CONV is False:
        return None
    inp, wt, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    q8 = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
    if inp.type not in q8 or out.type != inp.type or wt.type not in q8 \
            or ctx.inputs[2].type != T.TENSOR_INT32 or weights.ndim != 2:
        return None
    lib = _native.library()
    if lib is None or (NATIVE_Q8_CONV == "auto" and not _native.conv_q8_fast(lib)):
        return None
    units, size = weights.shape
    centred = _centred_filter(weights, wt).reshape(units, 1, 1, size)
    rq = ConvRequant(inp, wt, out)
    if not _native.ConvQ8.fits(centred, rq.shift):
        return None
    lo, hi = C.quant_activation_range(act, out.scale, out.zero_point, out.type)
    return _native.ConvQ8(lib, centred, rq.multiplier, rq.shift, inp.zero_point,
                          out.zero_point, lo, hi, inp.type.dtype, out.type.dtype, ctx.const(2))


def _native_q8_conv(ctx: OpContext, filt: np.ndarray, a: _Args) -> Any:
    """The bound :class:`nnhal.ops.native.ConvQ8` of an 8-bit CONV_2D, or None."""
    if NATIVE_Q8_CONV is False:
        return None
    inp, fi, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    q8 = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
    if inp.type not in q8 or out.type != inp.type or fi.type not in (*q8, _PER_CHANNEL) \
            or ctx.inputs[2].type != T.TENSOR_INT32 or a.nchw or a.act is None:
        return None
    lib = _native.library()
    if lib is None or (NATIVE_Q8_CONV == "auto" and not _native.conv_q8_fast(lib)):
        return None
    centred = _centred_filter(filt, fi)
    rq = ConvRequant(inp, fi, out)
    if not _native.ConvQ8.fits(centred, rq.shift):
        return None
    lo, hi = C.quant_activation_range(a.act, out.scale, out.zero_point, out.type)
    return _native.ConvQ8(lib, centred, rq.multiplier, rq.shift, inp.zero_point,
                          out.zero_point, lo, hi, inp.type.dtype, out.type.dtype, ctx.const(2))


@register(O.GROUPED_CONV_2D)
class GroupedConv2D(_ConvBase):
    def layout(self, ctx: OpContext) -> _Layout:
        return _select(ctx, 9, 12, has_extra=True)

    def check_channels(self, ctx_fail, cin, fshape, a) -> None:
        g = a.extra
        if g is None:
            return
        if fshape[3] and cin and fshape[3] * g != cin:
            raise ctx_fail(f"input depth {cin} is not {g} groups of {fshape[3]}")
        if fshape[0] and fshape[0] % g:
            raise ctx_fail(f"output depth {fshape[0]} is not divisible by {g} groups")

    def groups(self, a: _Args, fshape: Sequence[int]) -> int:
        return int(a.extra)


#: The native 8-bit depthwise kernel: bit-exact with the numpy path (tests/ops/test_native.py),
#: requantising by the Requantizer's float64 route in C where the route applies. Measured on
#: MobileNetV2's 17 int8 per-channel RELU6 depthwise layers (benchmarks/bench_q8_depthwise.py,
#: interleaved, load 1.7-2.8): 3.9 ms against 15.3 ms for the numpy path, 2.8-5.8x per layer.
NATIVE_Q8_DEPTHWISE = True


@register(O.DEPTHWISE_CONV_2D)
class DepthwiseConv2D(_ConvBase):
    channel_dim = 3

    def layout(self, ctx: OpContext) -> _Layout:
        return _select(ctx, 8, 11, has_extra=True)

    def filter_geometry(self, fshape):
        return fshape[3], fshape[1], fshape[2]

    def check_channels(self, ctx_fail, cin, fshape, a) -> None:
        if fshape[0] != 1 and fshape[0] != 0:
            raise ctx_fail(f"filter must have shape [1, h, w, depth_out], got {tuple(fshape)}")
        m = a.extra
        if m is not None and cin and fshape[3] and m * cin != fshape[3]:
            raise ctx_fail(f"depth_out {fshape[3]} != {m} * depth_in {cin}")

    def terms(self, fshape: Sequence[int]) -> int:
        return int(fshape[1] * fshape[2])

    def groups(self, a: _Args, fshape: Sequence[int]) -> int:
        return int(fshape[3]) // int(a.extra)

    def native_kernel(self, ctx: OpContext, cached: dict, a: _Args) -> Any:
        filt = ctx.const(1)
        if filt is None or filt.ndim != 4 or filt.shape[0] != 1:
            return None
        if self._native_ok(ctx, a):
            lo, hi = C.float_activation_bounds(a.act)
            return _native.DepthwiseF32(_native.library(), filt, lo, hi)
        if not NATIVE_Q8_DEPTHWISE:
            return None
        inp, fi, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        q8 = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
        if inp.type not in q8 or out.type != inp.type or fi.type not in (*q8, _PER_CHANNEL) \
                or ctx.inputs[2].type != T.TENSOR_INT32 or a.nchw or a.act is None \
                or filt.shape[1] * filt.shape[2] * 255 * 255 + (1 << 22) > C.INT32_MAX \
                or _native.library() is None:
            return None
        rq = ConvRequant(inp, fi, out)
        lo, hi = C.quant_activation_range(a.act, out.scale, out.zero_point, out.type)
        return _native.DepthwiseQ8(_native.library(), _centred_filter(filt, fi), rq.multiplier,
                                   rq.shift, inp.zero_point, out.zero_point, lo, hi,
                                   inp.type.dtype, out.type.dtype, rq.fast, ctx.const(2))

    def layout_filter(self, filt: np.ndarray) -> np.ndarray:
        # [1, kh, kw, depth_out] -> [depth_out, kh, kw, 1]: one group per input channel.
        return filt.transpose(3, 1, 2, 0)


@register(O.TRANSPOSE_CONV_2D)
class TransposeConv2D(_ConvBase):
    transpose = True

    def layout(self, ctx: OpContext) -> _Layout:
        n = len(ctx.inputs)
        if n == 9:
            return _make_layout(n, True, False, out_shape=True)
        if n == 11:
            return _make_layout(n, False, False)
        raise ctx.fail(f"unsupported number of inputs {n}")

    def axis(self, a: _Args, dim: int, size: int, k: int) -> tuple[int, int, int] | None:
        s = a.stride[dim]
        if s is None:
            return None
        if a.pads is not None:
            head, tail = a.pads[2:] if dim == 0 else a.pads[:2]
            if not _known(head, tail):
                return None
        else:
            if a.code is None or a.out_shape is None or a.nchw is None:
                return None
            requested = int(a.out_shape[(2 if a.nchw else 1) + dim])
            head, tail = explicit_padding(requested, s, 1, k, a.code, transpose=True)
        if head < 0:
            raise OpError("negative padding")
        out = transpose_conv_out_size(size, k, s, head, tail)
        if out <= 0:
            raise OpError(f"empty output (size {out})")
        return head, tail, out

    def weights(self, filt: np.ndarray, info: OperandInfo, a: _Args,  # type: ignore[override]
                inp: OperandInfo | None = None) -> _Weights:
        real = _as_real(filt, info)
        cout, kh, kw, cin = real.shape
        mat = real.transpose(3, 1, 2, 0).reshape(cin, kh * kw * cout)
        return _Weights(1, kh, kw, cout, np.ascontiguousarray(mat))

    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        """Each input value scatters into a filter's worth of outputs (kh x kw x depth_out)."""
        fshape = ctx.inputs[1].shape
        spread = elements(fshape[:3]) if fshape and len(fshape) == 4 else 1
        return visits(ctx, outputs) + elements(ctx.inputs[0].shape) * spread

    def compute(self, x, wts, a, pads, out_hw):
        return _transpose_conv(x, wts, a.stride, pads, out_hw)

    def kernel_into(self, ctx: OpContext):
        return None  # float64 scatter-add into a fresh output (see kernel)

    def kernel(self, ctx: OpContext):
        layout = self.layout(ctx)
        inp, filt, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        requant = None if inp.type in C.FLOAT_TYPES else ConvRequant(inp, filt, out)
        values = _static_values(ctx)
        static = _resolve(layout, values)
        all_const = all(values[i] is not None for i in layout.params)
        omitted = tuple(v is _OMITTED for v in values)
        # Constant filters are reshaped once, on the first run.
        cache_weights = all_const and values[1] is not None
        cached: dict[str, Any] = {}

        def run(ins, rt):
            a, x, n, cout, pads, (oh, ow) = self._run_args(
                layout, static if all_const else None, omitted, requant, ins)
            if cache_weights and "w" in cached:
                wts = cached["w"]
            else:
                wts = self.weights(ins[1], filt, a)
                if cache_weights:
                    cached["w"] = wts
            if n == 0:
                res = np.zeros((0, oh, ow, cout), dtype=out.type.dtype)
            else:
                acc = self.compute(_as_real(x, inp), wts, a, pads, (oh, ow))
                res = _finish(acc, ins[2], a.act, out, requant)
            if a.nchw:
                res = res.transpose(0, 3, 1, 2)
            return [np.ascontiguousarray(res)]

        return run


# ---- FULLY_CONNECTED --------------------------------------------------------------------------

@register(O.FULLY_CONNECTED)
class FullyConnected(_CoreKernels):
    def validate(self, ctx: OpContext) -> None:
        self._validated(ctx)

    def validate_and_prepare(self, ctx: OpContext) -> list[Shape]:
        return [self._validated(ctx)]  # validate infers what prepare would

    def _validated(self, ctx: OpContext) -> tuple[int, int]:
        """Every rule checked; the inferred output shape (prepare's)."""
        _check_quant(ctx, None)
        C.check_activation(ctx, 3)
        ctx.expect_rank(0, (2, 3, 4))
        ctx.expect_rank(1, 2)
        ctx.expect_rank(2, 1)
        ctx.expect_rank(0, 2, output=True)
        return self._infer(ctx)

    def _infer(self, ctx: OpContext) -> tuple[int, int]:
        ishape, wshape, bshape = (ctx.inputs[i].shape for i in range(3))
        units = size = 0
        if wshape is not None:
            units, size = wshape
        if bshape is not None and bshape[0]:
            ctx.require(not units or bshape[0] == units,
                        f"bias has {bshape[0]} elements, expected {units}")
            units = units or bshape[0]
        batch = 0
        if ishape is not None and all(ishape) and size:
            total = math.prod(map(int, ishape))
            ctx.require(total % size == 0,
                        f"input of {total} elements is not a multiple of input_size {size}")
            batch = total // size
        elif ishape is not None and size and 0 in ishape:
            # A zero dimension is unknown at prepare time; batch stays unknown.
            batch = 0
        return batch, units

    def prepare(self, ctx: OpContext):
        return [self._infer(ctx)]

    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        """Each output value sums input_size products."""
        wshape = ctx.inputs[1].shape
        size = max(wshape[1], 1) if wshape and len(wshape) == 2 else 1
        return visits(ctx, outputs) + elements(outputs[0]) * size

    def _core(self, ctx: OpContext) -> Callable[[Sequence[Any], np.ndarray | None], np.ndarray]:
        inp, wt, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        requant = None if inp.type in C.FLOAT_TYPES else ConvRequant(inp, wt, out)
        zp_in = 0 if requant is None else inp.zero_point
        odt = out.type.dtype

        def layout(w: np.ndarray) -> tuple[np.ndarray, type, int | None]:
            """[input_size, units] in the compute dtype, that dtype, and the largest
            magnitude of a quantized sum (None for floats)."""
            centred = _centred_filter(w, wt)
            if requant is None:
                return np.ascontiguousarray(centred.T), np.float32, None
            largest = int(np.abs(centred).max(initial=0))
            dtype = exact_dtype(w.shape[1], input_bound(inp), largest)
            return (np.ascontiguousarray(centred.T.astype(dtype)), dtype,
                    w.shape[1] * input_bound(inp) * largest)

        const_w = ctx.const(1)
        static = None if const_w is None or np.ndim(const_w) != 2 else layout(const_w)
        const_act = ctx.const(3)
        nat = None
        if static is not None and requant is not None and const_act is not None:
            try:
                nat = _native_q8_fc(ctx, const_w, C.activation_code(const_act))
            except (OpError, ValueError, TypeError, OverflowError):
                nat = None
        bias_tiles: dict | None = {} if ctx.const(2) is not None else None
        name = self.op_type.name

        def core(ins: Sequence[Any], dst: np.ndarray | None) -> np.ndarray:
            act = C.activation_code(ins[3] if const_act is None else const_act)
            x, w, b = ins[0], ins[1], ins[2]
            if x.ndim < 2 or w.ndim != 2 or b.ndim != 1:
                raise OpError(f"{name}: bad input ranks")
            units, size = w.shape
            if units <= 0 or size <= 0 or b.shape[0] != units:
                raise OpError(f"{name}: weights {w.shape} and bias {b.shape} do not match")
            if x.size % size:
                raise OpError(f"{name}: input of {x.size} elements is not a multiple of {size}")
            batch = x.size // size
            if dst is None:
                dst = np.empty((batch, units), odt)
            elif dst.shape != (batch, units):
                raise OpError(f"{name}: output shape {dst.shape}, computed {(batch, units)}")
            if batch == 0:
                return dst
            if nat is not None and x.flags.c_contiguous and dst.flags.c_contiguous \
                    and w is const_w and units == nat._cout:
                x4, d4 = x.reshape(batch, 1, 1, size), dst.reshape(batch, 1, 1, units)
                if nat.accepts(x4, b, d4):
                    nat(x4, b, d4, (1, 1), (1, 1), (0, 0, 0, 0))
                    return dst
            wm, dtype, bound = static if static is not None else layout(w)
            x2 = x.reshape(batch, size)
            if zp_in or x2.dtype != dtype:
                xc = scratch("pad", (batch, size), dtype)
                np.subtract(x2, dtype(zp_in), out=xc, casting="unsafe")
                x2 = xc
            direct = requant is None and dst.dtype == dtype and dst.flags.c_contiguous
            acc = dst if direct else scratch("acc", (batch, units), dtype)
            np.matmul(x2, wm, out=acc)
            if requant is not None:
                requant.into(acc, b, act, dst, bound)
            else:
                float_epilogue_into(acc, b, act, bias_tiles)
                if acc is not dst:
                    np.copyto(dst, acc, casting="unsafe")
            return dst

        return core
